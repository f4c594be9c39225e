/*
 * test_faults_mpi.c — misuse and bad data across 2–4 ranks, where one rank (a minority) is the
 * odd one out: every rank must get the same error, with a message naming its layer, and nothing
 * may be written or mixed anywhere; the communicator stays usable afterwards (a clean step then
 * gives bitwise identical running stats on every rank). test_syncbn_mpi.c's "two_ranks" case
 * covers the 2-rank forms (op/C/order/dtype mismatch, NaN in a forward); this file adds what it
 * lacks. Dead and hung ranks: fault_check.sh (the job must end, so it cannot be checked from
 * inside it).
 *
 * Test cases (CK_RUN_CASE):
 *   disagree   (P ≥ 3) one rank skips a forward, skips a backward, has another C, dtype or
 *              layout, or calls the layers in another order: SN_ERR_MISMATCH on every rank
 *   nonfinite  (P ≥ 2) NaN/+Inf/−Inf in one rank's x (also next to an empty rank) or dy, with
 *              check_finite: SN_ERR_NONFINITE on every rank, outputs and state untouched
 *   own_checks (P ≥ 2) one rank's forward or backward fails its own checks (NULL y, another n
 *              than its forward's, num_batches_tracked < 0): that rank returns the error, the
 *              others SN_ERR_MISMATCH naming it, at once; momentum -0 against 0
 *   timeout    (P ≥ 2) one rank skips a call and never makes another: the others fail with
 *              SN_ERR_TIMEOUT after the timeout, later calls fail at once with SN_ERR_COMM; the
 *              late rank's arrival afterwards cannot touch their memory
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitest.h"

#define FT_C 4     /* channels of the test layers */
#define FT_S 3     /* spatial size */
#define FT_N 2     /* samples per rank */
#define FT_PER (FT_C * FT_S)
#define FT_LEN (FT_N * FT_PER)
/* The poison written into outputs before a failing call: it must still be there after. */
#define FT_POISON (-12345.0f)
/* The timeout case's communicator timeout: short, far above a step on a loaded machine. */
#define FT_TIMEOUT_S 2.0
/* A broken communicator must fail at once: far below the timeout, generous for a loaded host. */
#define FT_BROKEN_FAST_S 0.5

typedef struct {
  sn_syncbn_t *bn;
  sn_syncbn_params_t p;
  float rm[16], rv[16], gw[16], gb[16]; /* snapshot */
  int64_t nbt;
} layer_t;

static void layer_make(layer_t *l, int64_t C, int64_t id, const char *name, sn_dtype_t dtype,
                       sn_layout_t layout, int check_finite) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  cfg.check_consistency = 1;
  cfg.check_finite = check_finite;
  cfg.layer_id = id;
  cfg.dtype = dtype;
  cfg.layout = layout;
  snprintf(cfg.name, sizeof cfg.name, "%s", name);
  memset(l, 0, sizeof *l);
  MT_OK(sn_syncbn_create(&l->bn, &cfg, mt_world));
  MT_OK(sn_syncbn_params(l->bn, &l->p));
}

static void layer_snapshot(layer_t *l) {
  const size_t b = (size_t)l->p.num_features * sizeof(float);
  memcpy(l->rm, l->p.running_mean, b);
  memcpy(l->rv, l->p.running_var, b);
  memcpy(l->gw, l->p.grad_weight, b);
  memcpy(l->gb, l->p.grad_bias, b);
  l->nbt = *l->p.num_batches_tracked;
}

/* Asserts the layer's state equals its snapshot bit for bit. */
static void layer_unchanged(const layer_t *l, const char *what) {
  const size_t b = (size_t)l->p.num_features * sizeof(float);
  char m[160];
  snprintf(m, sizeof m, "rank %d: %s: running_mean", mt_rank, what);
  tu_assert_bitwise(l->rm, l->p.running_mean, b, m);
  snprintf(m, sizeof m, "rank %d: %s: running_var", mt_rank, what);
  tu_assert_bitwise(l->rv, l->p.running_var, b, m);
  snprintf(m, sizeof m, "rank %d: %s: grad_weight", mt_rank, what);
  tu_assert_bitwise(l->gw, l->p.grad_weight, b, m);
  snprintf(m, sizeof m, "rank %d: %s: grad_bias", mt_rank, what);
  tu_assert_bitwise(l->gb, l->p.grad_bias, b, m);
  ck_assert_msg(*l->p.num_batches_tracked == l->nbt, "rank %d: %s: num_batches_tracked %lld -> %lld",
                mt_rank, what, (long long)l->nbt, (long long)*l->p.num_batches_tracked);
}

/* Running stats and num_batches_tracked bitwise identical on every rank. */
static void layer_identical(const layer_t *l, const char *what) {
  int same = 0;
  const int64_t b = l->p.num_features * 4;
  MT_OK(sn_comm_all_identical(mt_world, &same, l->p.running_mean, b));
  ck_assert_msg(same, "%s: running_mean differs across ranks", what);
  MT_OK(sn_comm_all_identical(mt_world, &same, l->p.running_var, b));
  ck_assert_msg(same, "%s: running_var differs across ranks", what);
  MT_OK(sn_comm_all_identical(mt_world, &same, l->p.num_batches_tracked, 8));
  ck_assert_msg(same, "%s: num_batches_tracked differs across ranks", what);
}

static void fill_x(float *x, int64_t len, uint64_t seed) { mt_fill(x, len, SN_DTYPE_F32, seed, 0); }

static void poison(float *y, int64_t len) {
  for (int64_t i = 0; i < len; i++) y[i] = FT_POISON;
}

static void assert_poisoned(const float *y, int64_t len, const char *what) {
  for (int64_t i = 0; i < len; i++)
    ck_assert_msg(y[i] == FT_POISON, "rank %d: %s: output element %lld was written (%g)", mt_rank,
                  what, (long long)i, (double)y[i]);
}

/* Asserts st is SN_ERR_MISMATCH and the message holds each of the strings. */
static void assert_mismatch(sn_status_t st, const char *what, const char *s1, const char *s2) {
  ck_assert_msg(st == SN_ERR_MISMATCH, "rank %d: %s: got %s (%s), want SN_ERR_MISMATCH", mt_rank,
                what, sn_status_string(st), sn_last_error());
  const char *msg = sn_last_error();
  ck_assert_msg(strstr(msg, s1) != NULL, "rank %d: %s: message lacks \"%s\": %s", mt_rank, what, s1,
                msg);
  ck_assert_msg(s2 == NULL || strstr(msg, s2) != NULL, "rank %d: %s: message lacks \"%s\": %s",
                mt_rank, what, s2, msg);
}

/* "<field> differs across ranks (a on ranks 0, 1, ...; b on rank P-1)" ("a on rank 0" for P = 2)
 * into buf: the message's part for a field where rank ODD (the last) alone holds b, most common
 * value first. */
static const char *odd_one_out(char *buf, size_t size, const char *field, const char *a,
                               const char *b) {
  int len = snprintf(buf, size, "%s differs across ranks (%s on rank%s", field, a,
                     mt_size > 2 ? "s" : "");
  for (int r = 0; r < mt_size - 1; r++)
    len += snprintf(buf + len, size - (size_t)len, "%s %d", r ? "," : "", r);
  snprintf(buf + len, size - (size_t)len, "; %s on rank %d)", b, mt_size - 1);
  return buf;
}

/* One good training step (forward + backward) on every rank; then identical stats everywhere. */
static void good_step(layer_t *l, uint64_t seed, const char *what) {
  float x[FT_LEN], y[FT_LEN], dx[FT_LEN], dy[FT_LEN];
  fill_x(x, FT_LEN, seed + (uint64_t)mt_rank);
  fill_x(dy, FT_LEN, seed + 100 + (uint64_t)mt_rank);
  MT_OK(sn_syncbn_forward(l->bn, y, x, FT_N, FT_S, 1));
  MT_OK(sn_syncbn_backward(l->bn, dx, dy, x, FT_N, FT_S));
  layer_identical(l, what);
}

/* The odd rank: the last one, so rank 0 (which prints) is in the majority. */
#define ODD (mt_size - 1)

static double mono_now(void);

/* ---- own checks (P ≥ 2) ----------------------------------------------------------------------- */

/* The own-checks cases' communicator timeout: should a rank wait for one that returned early
 * (the bug these cases catch), it fails with SN_ERR_TIMEOUT after this long instead of hanging
 * for the default 1800 s; far above a step on a loaded machine. */
#define OWN_TIMEOUT_S 20.0

/* A layer on its own communicator with OWN_TIMEOUT_S (comm: out). */
static void own_layer(layer_t *l, sn_comm_t **comm, const char *name, float momentum) {
  MT_OK(sn_comm_create_mpi(comm, MPI_COMM_WORLD));
  MT_OK(sn_comm_set_timeout(*comm, OWN_TIMEOUT_S));
  sn_syncbn_config_t cfg = sn_syncbn_default_config(FT_C);
  cfg.momentum = momentum;
  snprintf(cfg.name, sizeof cfg.name, "%s", name);
  memset(l, 0, sizeof *l);
  MT_OK(sn_syncbn_create(&l->bn, &cfg, *comm));
  MT_OK(sn_syncbn_params(l->bn, &l->p));
}

/* Rank ODD got `want` from its own checks, the others SN_ERR_MISMATCH naming ODD and that code. */
static void assert_told(sn_status_t st, sn_status_t want, const char *what) {
  if (mt_rank == ODD) {
    ck_assert_msg(st == want, "rank %d: %s: got %s (%s), want %s", mt_rank, what,
                  sn_status_string(st), sn_last_error(), sn_status_string(want));
    ck_assert_msg(strstr(sn_last_error(), "(sent to the other ranks in the consistency check"),
                  "%s: %s", what, sn_last_error());
  } else {
    char want_msg[256];
    assert_mismatch(st, what, "'own' (id ",
                    odd_one_out(want_msg, sizeof want_msg,
                                "the call's own checks (a rank whose arguments or state failed "
                                "them returned that error)",
                                "passed", sn_status_string(want)));
  }
}

/* One rank's forward or backward fails its own checks (a NULL output, another shape for the
 * backward than its forward's, a negative num_batches_tracked): that rank returns the error,
 * every other rank SN_ERR_MISMATCH naming it, at once (not after the communicator's timeout);
 * nothing is written; the failed forward leaves no saved forward on any rank, the failed
 * backward keeps it on every rank; a clean step follows on every rank. */
START_TEST(test_own_checks_told) {
  ck_assert_int_ge(mt_size, 2);
  sn_comm_t *comm = NULL;
  layer_t a;
  own_layer(&a, &comm, "own", 0.1f);
  float x[FT_LEN], y[FT_LEN], dy[FT_LEN], dx[FT_LEN];
  fill_x(x, FT_LEN, 500 + (uint64_t)mt_rank);
  fill_x(dy, FT_LEN, 510 + (uint64_t)mt_rank);
  const double t0 = mono_now();

  /* a NULL y on one rank, after a forward */
  MT_OK(sn_syncbn_forward(a.bn, y, x, FT_N, FT_S, 1));
  layer_snapshot(&a);
  poison(y, FT_LEN);
  sn_status_t st = sn_syncbn_forward(a.bn, mt_rank == ODD ? NULL : y, x, FT_N, FT_S, 1);
  assert_told(st, SN_ERR_NULL_POINTER, "forward with a NULL y on one rank");
  assert_poisoned(y, FT_LEN, "y of the failed forward");
  layer_unchanged(&a, "after the NULL y");
  /* no rank kept the earlier forward (a backward would use the step before): the backward fails
   * on every rank, at once, without a collective */
  poison(dx, FT_LEN);
  st = sn_syncbn_backward(a.bn, dx, dy, x, FT_N, FT_S);
  ck_assert_msg(st == SN_ERR_INVALID_ARGUMENT && strstr(sn_last_error(), "without a successful"),
                "rank %d: got %s (%s)", mt_rank, sn_status_string(st), sn_last_error());
  assert_poisoned(dx, FT_LEN, "dx of the backward after the failed forward");
  good_step(&a, 520, "after the NULL y");

  /* the backward's shape differs from its forward's on one rank */
  MT_OK(sn_syncbn_forward(a.bn, y, x, FT_N, FT_S, 1));
  layer_snapshot(&a);
  poison(dx, FT_LEN);
  st = sn_syncbn_backward(a.bn, dx, dy, x, mt_rank == ODD ? FT_N - 1 : FT_N, FT_S);
  assert_told(st, SN_ERR_INVALID_ARGUMENT, "backward with another n on one rank");
  assert_poisoned(dx, FT_LEN, "dx of the failed backward");
  layer_unchanged(&a, "after the backward's other n");
  /* nothing changed anywhere: repeated with the forward's shape, it succeeds on every rank */
  MT_OK(sn_syncbn_backward(a.bn, dx, dy, x, FT_N, FT_S));
  good_step(&a, 530, "after the backward's other n");

  /* a negative num_batches_tracked written on one rank */
  layer_snapshot(&a);
  if (mt_rank == ODD) *a.p.num_batches_tracked = -5;
  poison(y, FT_LEN);
  st = sn_syncbn_forward(a.bn, y, x, FT_N, FT_S, 1);
  assert_told(st, SN_ERR_INVALID_ARGUMENT, "forward with num_batches_tracked < 0 on one rank");
  assert_poisoned(y, FT_LEN, "y of the forward with num_batches_tracked < 0");
  if (mt_rank == ODD) *a.p.num_batches_tracked = a.nbt;
  layer_unchanged(&a, "after num_batches_tracked < 0");
  good_step(&a, 540, "after num_batches_tracked < 0");

  /* every rank passes a NULL y: each gets its own error, no mismatch */
  st = sn_syncbn_forward(a.bn, NULL, x, FT_N, FT_S, 1);
  ck_assert_msg(st == SN_ERR_NULL_POINTER && !strstr(sn_last_error(), "other ranks"),
                "rank %d: got %s (%s)", mt_rank, sn_status_string(st), sn_last_error());
  good_step(&a, 550, "after a NULL y everywhere");

  const double took = mono_now() - t0;
  ck_assert_msg(took < OWN_TIMEOUT_S, "rank %d: the cases took %.1f s: a rank waited", mt_rank,
                took);
  sn_syncbn_destroy(a.bn);
  sn_comm_destroy(comm);
}
END_TEST

/* momentum 0 and -0 are the same momentum: no mismatch reported. */
START_TEST(test_momentum_negative_zero) {
  sn_comm_t *comm = NULL;
  layer_t a;
  own_layer(&a, &comm, "own", mt_rank == ODD ? -0.0f : 0.0f);
  good_step(&a, 570, "momentum -0 on one rank, 0 on the others");
  sn_syncbn_destroy(a.bn);
  sn_comm_destroy(comm);
}
END_TEST

/* ---- disagree (P ≥ 3) ------------------------------------------------------------------------- */

/* Rank ODD skips layer A's forward and calls B's: everyone's first collective compares A with B.
 * Every rank gets SN_ERR_MISMATCH on "layer id", naming the layer it called. */
START_TEST(test_skip_forward) {
  ck_assert_int_ge(mt_size, 3);
  layer_t a, b;
  layer_make(&a, FT_C, 0, "stem.bn", SN_DTYPE_F32, SN_LAYOUT_NCHW, 0);
  layer_make(&b, FT_C, 1, "head.bn", SN_DTYPE_F32, SN_LAYOUT_NCHW, 0);
  good_step(&a, 10, "A before");
  good_step(&b, 20, "B before");
  layer_snapshot(&a), layer_snapshot(&b);
  float x[FT_LEN], y[FT_LEN];
  fill_x(x, FT_LEN, 30 + (uint64_t)mt_rank);
  poison(y, FT_LEN);
  char want[256];
  odd_one_out(want, sizeof want, "layer id", "0", "1");
  if (mt_rank == ODD) {
    assert_mismatch(sn_syncbn_forward(b.bn, y, x, FT_N, FT_S, 1), "skipped A, called B",
                    "'head.bn' (id 1)", want);
  } else {
    assert_mismatch(sn_syncbn_forward(a.bn, y, x, FT_N, FT_S, 1), "called A, one rank skipped it",
                    "'stem.bn' (id 0)", want);
  }
  assert_poisoned(y, FT_LEN, "mismatched forward");
  layer_unchanged(&a, "A after the mismatch"), layer_unchanged(&b, "B after the mismatch");
  /* the communicator stays in step: the next good steps work and agree everywhere */
  good_step(&a, 40, "A after");
  good_step(&b, 50, "B after");
  sn_syncbn_destroy(a.bn), sn_syncbn_destroy(b.bn);
}
END_TEST

/* Rank ODD skips the backward and starts the next step's forward of the same layer: the
 * "operation" field differs; every rank gets SN_ERR_MISMATCH naming the layer. */
START_TEST(test_skip_backward) {
  ck_assert_int_ge(mt_size, 3);
  layer_t a;
  layer_make(&a, FT_C, 3, "block1.bn2", SN_DTYPE_F32, SN_LAYOUT_NCHW, 0);
  float x[FT_LEN], y[FT_LEN], dy[FT_LEN], dx[FT_LEN];
  fill_x(x, FT_LEN, 60 + (uint64_t)mt_rank);
  fill_x(dy, FT_LEN, 70 + (uint64_t)mt_rank);
  MT_OK(sn_syncbn_forward(a.bn, y, x, FT_N, FT_S, 1));
  layer_snapshot(&a);
  poison(dx, FT_LEN);
  poison(y, FT_LEN);
  sn_status_t st = mt_rank == ODD ? sn_syncbn_forward(a.bn, y, x, FT_N, FT_S, 1)
                                  : sn_syncbn_backward(a.bn, dx, dy, x, FT_N, FT_S);
  char want[256];
  assert_mismatch(st, "backward skipped on one rank", "'block1.bn2' (id 3)",
                  odd_one_out(want, sizeof want, "operation", "backward", "forward"));
  ck_assert_msg(strstr(sn_last_error(), mt_rank == ODD ? "forward" : "backward"), "%s",
                sn_last_error());
  assert_poisoned(dx, FT_LEN, "dx of the mismatched backward");
  assert_poisoned(y, FT_LEN, "y of the mismatched forward");
  layer_unchanged(&a, "after the skipped backward");
  good_step(&a, 80, "after");
  sn_syncbn_destroy(a.bn);
}
END_TEST

/* One rank of P has another C, dtype or layout for the same layer: SN_ERR_MISMATCH everywhere,
 * naming the field. */
START_TEST(test_one_rank_differs) {
  ck_assert_int_ge(mt_size, 3);
  static const struct {
    const char *field, *usual, *other; /* the field and its values */
    int64_t C;
    sn_dtype_t dtype;
    sn_layout_t layout;
  } odd[] = {
      {"C (num_features)", "4", "5", FT_C + 1, SN_DTYPE_F32, SN_LAYOUT_NCHW},
      {"dtype", "f32", "f16", FT_C, SN_DTYPE_F16, SN_LAYOUT_NCHW},
      {"layout", "NCHW", "NHWC", FT_C, SN_DTYPE_F32, SN_LAYOUT_NHWC},
  };
  for (int k = 0; k < 3; k++) {
    char want[256];
    odd_one_out(want, sizeof want, odd[k].field, odd[k].usual, odd[k].other);
    layer_t l;
    const int me = mt_rank == ODD;
    layer_make(&l, me ? odd[k].C : FT_C, 10 + k, "fc.bn", me ? odd[k].dtype : SN_DTYPE_F32,
               me ? odd[k].layout : SN_LAYOUT_NCHW, 0);
    layer_snapshot(&l);
    const int64_t C = l.p.num_features, len = FT_N * C * FT_S;
    float x[FT_N * (FT_C + 1) * FT_S], y[FT_N * (FT_C + 1) * FT_S];
    uint16_t xh[FT_N * (FT_C + 1) * FT_S], yh[FT_N * (FT_C + 1) * FT_S];
    fill_x(x, len, 90 + (uint64_t)k);
    for (int64_t i = 0; i < len; i++) tu_set(xh, i, x[i], SN_DTYPE_F16), yh[i] = 0xBEEF;
    poison(y, len);
    const int half = me && odd[k].dtype == SN_DTYPE_F16;
    char idname[32];
    snprintf(idname, sizeof idname, "'fc.bn' (id %d)", 10 + k);
    assert_mismatch(sn_syncbn_forward(l.bn, half ? (void *)yh : (void *)y,
                                      half ? (void *)xh : (void *)x, FT_N, FT_S, 1),
                    odd[k].field, want, idname);
    if (half) {
      for (int64_t i = 0; i < len; i++) ck_assert_msg(yh[i] == 0xBEEF, "f16 y written");
    } else {
      assert_poisoned(y, len, odd[k].field);
    }
    layer_unchanged(&l, odd[k].field);
    sn_syncbn_destroy(l.bn);
  }
}
END_TEST

/* Rank ODD calls B then A, the others A then B: both calls mismatch on every rank and neither
 * layer's statistics change anywhere (no rank normalized with another layer's sums). */
START_TEST(test_order_swapped_on_one_rank) {
  ck_assert_int_ge(mt_size, 3);
  layer_t a, b;
  layer_make(&a, FT_C, 20, "bn_a", SN_DTYPE_F32, SN_LAYOUT_NCHW, 0);
  layer_make(&b, FT_C, 21, "bn_b", SN_DTYPE_F32, SN_LAYOUT_NCHW, 0);
  layer_snapshot(&a), layer_snapshot(&b);
  float x[FT_LEN], y[FT_LEN];
  fill_x(x, FT_LEN, 110 + (uint64_t)mt_rank);
  layer_t *first = mt_rank == ODD ? &b : &a, *second = mt_rank == ODD ? &a : &b;
  poison(y, FT_LEN);
  char want[256];
  assert_mismatch(sn_syncbn_forward(first->bn, y, x, FT_N, FT_S, 1), "first call",
                  mt_rank == ODD ? "'bn_b' (id 21)" : "'bn_a' (id 20)",
                  odd_one_out(want, sizeof want, "layer id", "20", "21"));
  assert_mismatch(sn_syncbn_forward(second->bn, y, x, FT_N, FT_S, 1), "second call",
                  mt_rank == ODD ? "'bn_a' (id 20)" : "'bn_b' (id 21)",
                  odd_one_out(want, sizeof want, "layer id", "21", "20"));
  assert_poisoned(y, FT_LEN, "swapped order");
  layer_unchanged(&a, "A"), layer_unchanged(&b, "B");
  good_step(&a, 120, "A after");
  good_step(&b, 130, "B after");
  sn_syncbn_destroy(a.bn), sn_syncbn_destroy(b.bn);
}
END_TEST

/* ---- nonfinite (P ≥ 2) ------------------------------------------------------------------------ */

/* A non-finite value in rank `bad`'s x (forward): SN_ERR_NONFINITE on every rank, y untouched,
 * running stats and num_batches_tracked unchanged everywhere; rank 0 may hold an empty batch. */
static void forward_nonfinite(float bad_value, int bad, int empty_rank0, uint64_t seed) {
  layer_t l;
  layer_make(&l, FT_C, 30, "bn_nf", SN_DTYPE_F32, SN_LAYOUT_NCHW, 1);
  good_step(&l, seed, "before"); /* non-trivial running stats to protect */
  layer_snapshot(&l);
  float x[FT_LEN], y[FT_LEN];
  fill_x(x, FT_LEN, seed + 1 + (uint64_t)mt_rank);
  if (mt_rank == bad) x[FT_LEN - 2] = bad_value;
  poison(y, FT_LEN);
  const int64_t n = empty_rank0 && mt_rank == 0 ? 0 : FT_N;
  sn_status_t st = sn_syncbn_forward(l.bn, n ? y : NULL, n ? x : NULL, n, FT_S, 1);
  ck_assert_msg(st == SN_ERR_NONFINITE, "rank %d: x[%d] = %g: got %s (%s)", mt_rank, bad,
                (double)bad_value, sn_status_string(st), sn_last_error());
  ck_assert_msg(strstr(sn_last_error(), "'bn_nf' (id 30)") && strstr(sn_last_error(), "NaN or Inf"),
                "%s", sn_last_error());
  assert_poisoned(y, FT_LEN, "y after a non-finite input");
  layer_unchanged(&l, "after a non-finite x");
  layer_identical(&l, "after a non-finite x");
  good_step(&l, seed + 2, "after"); /* the next clean step works everywhere */
  sn_syncbn_destroy(l.bn);
}

START_TEST(test_forward_nonfinite) {
  forward_nonfinite(NAN, mt_size - 1, 0, 200);
  forward_nonfinite(INFINITY, mt_size > 2 ? 1 : 0, 0, 210);
  forward_nonfinite(-INFINITY, mt_size - 1, 1, 220); /* rank 0 empty, Inf on the last rank */
}
END_TEST

/* A non-finite value in rank `bad`'s dy (backward) after a good forward: SN_ERR_NONFINITE on
 * every rank, dx untouched, dγ/dβ unchanged, running stats as the forward left them. The bad
 * rank's message says "this rank", the others' "another rank". */
static void backward_nonfinite(float bad_value, int bad, uint64_t seed) {
  layer_t l;
  layer_make(&l, FT_C, 31, "bn_nf_bwd", SN_DTYPE_F32, SN_LAYOUT_NHWC, 1);
  good_step(&l, seed, "before");
  float x[FT_LEN], y[FT_LEN], dy[FT_LEN], dx[FT_LEN];
  fill_x(x, FT_LEN, seed + 1 + (uint64_t)mt_rank);
  fill_x(dy, FT_LEN, seed + 2 + (uint64_t)mt_rank);
  MT_OK(sn_syncbn_forward(l.bn, y, x, FT_N, FT_S, 1));
  layer_snapshot(&l);
  if (mt_rank == bad) dy[3] = bad_value;
  poison(dx, FT_LEN);
  sn_status_t st = sn_syncbn_backward(l.bn, dx, dy, x, FT_N, FT_S);
  ck_assert_msg(st == SN_ERR_NONFINITE, "rank %d: dy[3] = %g on rank %d: got %s (%s)", mt_rank,
                (double)bad_value, bad, sn_status_string(st), sn_last_error());
  ck_assert_msg(strstr(sn_last_error(), "'bn_nf_bwd' (id 31)") &&
                    strstr(sn_last_error(), mt_rank == bad ? "on this rank" : "on another rank"),
                "rank %d: %s", mt_rank, sn_last_error());
  assert_poisoned(dx, FT_LEN, "dx after a non-finite dy");
  layer_unchanged(&l, "after a non-finite dy");
  layer_identical(&l, "after a non-finite dy");
  good_step(&l, seed + 3, "after");
  sn_syncbn_destroy(l.bn);
}

START_TEST(test_backward_nonfinite) {
  backward_nonfinite(NAN, mt_size - 1, 300);
  backward_nonfinite(INFINITY, 0, 310);
  backward_nonfinite(-INFINITY, mt_size > 2 ? 2 : 1, 320);
}
END_TEST

/* ---- timeout (P ≥ 2) -------------------------------------------------------------------------- */

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A communicator of MPI_COMM_WORLD with timeout FT_TIMEOUT_S and without the call check
 * (SN_COMM_CHECK=1 in the environment would add a collective before each call's, which a late
 * call could not complete against the others' abandoned one: it would time out itself). */
static sn_comm_t *comm_unchecked(void) {
  const char *outer = getenv("SN_COMM_CHECK");
  char saved[64] = "";
  if (outer != NULL) snprintf(saved, sizeof saved, "%s", outer);
  ck_assert_int_eq(unsetenv("SN_COMM_CHECK"), 0);
  sn_comm_t *comm = NULL;
  MT_OK(sn_comm_create_mpi(&comm, MPI_COMM_WORLD));
  if (outer != NULL) ck_assert_int_eq(setenv("SN_COMM_CHECK", saved, 1), 0);
  MT_OK(sn_comm_set_timeout(comm, FT_TIMEOUT_S));
  return comm;
}

/* SN_ERR_TIMEOUT from `what` after at least FT_TIMEOUT_S and well before CTest's limit. */
static void assert_timed_out(sn_status_t st, double waited, const char *what) {
  ck_assert_msg(st == SN_ERR_TIMEOUT, "rank %d: %s got %s (%s)", mt_rank, what,
                sn_status_string(st), sn_last_error());
  ck_assert_msg(waited >= FT_TIMEOUT_S && waited < FT_TIMEOUT_S + 10.0,
                "rank %d: %s: SN_ERR_TIMEOUT after %.3f s, timeout %.1f s", mt_rank, what,
                waited, FT_TIMEOUT_S);
}

/* The last rank skips a forward (it waits on MPI_COMM_WORLD instead): the others get
 * SN_ERR_TIMEOUT after FT_TIMEOUT_S, and at once SN_ERR_COMM on the next call (the communicator
 * is broken). Then the late rank makes its call: it completes the abandoned all-reduce, whose
 * result lands in the staging buffer the others abandoned — their state must stay untouched
 * (under ASan this also shows that buffer was not freed). The job then ends normally. */
START_TEST(test_skipped_call_times_out) {
  sn_comm_t *comm = comm_unchecked();
  sn_syncbn_config_t cfg = sn_syncbn_default_config(FT_C);
  cfg.check_consistency = 0; /* the late call then completes the abandoned one and returns */
  snprintf(cfg.name, sizeof cfg.name, "bn_late");
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, comm));
  sn_syncbn_params_t p;
  MT_OK(sn_syncbn_params(bn, &p));
  float x[FT_LEN], y[FT_LEN], rm[FT_C], rv[FT_C];
  fill_x(x, FT_LEN, 400 + (uint64_t)mt_rank);
  memcpy(rm, p.running_mean, sizeof rm);
  memcpy(rv, p.running_var, sizeof rv);
  const int late = mt_size - 1;
  if (mt_rank != late) {
    poison(y, FT_LEN);
    const double t0 = mono_now();
    sn_status_t st = sn_syncbn_forward(bn, y, x, FT_N, FT_S, 1);
    const double waited = mono_now() - t0;
    assert_timed_out(st, waited, "sn_syncbn_forward");
    ck_assert_msg(strstr(sn_last_error(), "waited 2.0 s for the other ranks"), "%s", sn_last_error());
    /* the message names the call and the layer, not only the MPI call under them */
    ck_assert_msg(strstr(sn_last_error(), "sn_syncbn_forward (layer 'bn_late'"), "%s",
                  sn_last_error());
    const double t1 = mono_now();
    st = sn_syncbn_forward(bn, y, x, FT_N, FT_S, 1);
    const double again = mono_now() - t1;
    ck_assert_msg(st == SN_ERR_COMM && strstr(sn_last_error(), "broken"), "rank %d: got %s (%s)",
                  mt_rank, sn_status_string(st), sn_last_error());
    ck_assert_msg(again < FT_BROKEN_FAST_S, "a broken communicator took %.3f s to fail", again);
    int64_t one = 1;
    ck_assert_int_eq(sn_comm_allreduce_sum(comm, &one, 1, SN_DTYPE_F64), SN_ERR_COMM);
    assert_poisoned(y, FT_LEN, "y after the timeout");
    printf("rank %d: SN_ERR_TIMEOUT after %.3f s (timeout %.1f s); next call SN_ERR_COMM after "
           "%.6f s\n", mt_rank, waited, FT_TIMEOUT_S, again);
  }
  MPI_Barrier(MPI_COMM_WORLD); /* the late rank waits here while the others time out */
  if (mt_rank == late) MT_OK(sn_syncbn_forward(bn, y, x, FT_N, FT_S, 1)); /* completes theirs */
  MPI_Barrier(MPI_COMM_WORLD);
  if (mt_rank != late) {
    tu_assert_bitwise(rm, p.running_mean, sizeof rm, "running_mean after the late arrival");
    tu_assert_bitwise(rv, p.running_var, sizeof rv, "running_var after the late arrival");
    ck_assert_int_eq(*p.num_batches_tracked, 0);
  }
  sn_syncbn_destroy(bn);
  sn_comm_destroy(comm); /* broken ones keep their duplicate and staging buffer (by design) */
}
END_TEST

/* The last rank calls sn_comm_split only after the others timed out in it: it must time out
 * too, not complete their abandoned barrier and then wait for ever in MPI_Comm_split, which they
 * never enter. */
START_TEST(test_late_split_times_out) {
  sn_comm_t *comm = comm_unchecked();
  const int late = mt_size - 1;
  sn_comm_t *sub = NULL;
  if (mt_rank != late) {
    const double t0 = mono_now();
    const sn_status_t st = sn_comm_split(comm, &sub, 0, mt_rank);
    assert_timed_out(st, mono_now() - t0, "sn_comm_split");
  }
  MPI_Barrier(MPI_COMM_WORLD); /* the late rank waits here while the others time out */
  if (mt_rank == late) {
    const double t0 = mono_now();
    const sn_status_t st = sn_comm_split(comm, &sub, 0, mt_rank);
    assert_timed_out(st, mono_now() - t0, "the late sn_comm_split");
  }
  ck_assert_ptr_null(sub);
  ck_assert_msg(strstr(sn_last_error(), "sn_comm_split"), "%s", sn_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  sn_comm_destroy(comm);
}
END_TEST

/* The last rank calls sn_comm_create_mpi only after the others timed out in it (SN_COMM_TIMEOUT_S
 * = 2): all get SN_ERR_TIMEOUT instead of waiting for ever in the creation's collectives (its
 * agreement and dup were blocking before). The late rank completes the others' abandoned
 * agreement and times out in the barrier they never post. On a communicator of its own
 * (`base`), which keeps those operations pending and is never used or freed again. */
START_TEST(test_late_create_times_out) {
  MPI_Comm base;
  ck_assert_int_eq(MPI_Comm_dup(MPI_COMM_WORLD, &base), MPI_SUCCESS);
  const char *outer = getenv("SN_COMM_TIMEOUT_S");
  char saved[64] = "";
  if (outer != NULL) snprintf(saved, sizeof saved, "%s", outer);
  ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", "2", 1), 0);
  const int late = mt_size - 1;
  sn_comm_t *comm = NULL;
  if (mt_rank != late) {
    const double t0 = mono_now();
    const sn_status_t st = sn_comm_create_mpi(&comm, base);
    assert_timed_out(st, mono_now() - t0, "sn_comm_create_mpi");
    ck_assert_msg(strstr(sn_last_error(), "MPI_Iallreduce"), "%s", sn_last_error());
  }
  MPI_Barrier(MPI_COMM_WORLD); /* the late rank waits here while the others time out */
  if (mt_rank == late) {
    const double t0 = mono_now();
    const sn_status_t st = sn_comm_create_mpi(&comm, base);
    assert_timed_out(st, mono_now() - t0, "the late sn_comm_create_mpi");
    ck_assert_msg(strstr(sn_last_error(), "MPI_Ibarrier"), "%s", sn_last_error());
  }
  ck_assert_ptr_null(comm);
  ck_assert_msg(strstr(sn_last_error(), "nothing was created"), "%s", sn_last_error());
  /* no rank left a dup pending: in Open MPI a pending MPI_Comm_idup holds up every later
   * communicator creation in its process, even over MPI_COMM_SELF (a late rank that posted the
   * dup the others never did would hang here) */
  const double t1 = mono_now();
  MT_OK(sn_comm_create_mpi(&comm, MPI_COMM_SELF));
  ck_assert_msg(mono_now() - t1 < 10.0, "rank %d: a local creation took %.3f s", mt_rank,
                mono_now() - t1);
  sn_comm_destroy(comm);
  if (outer != NULL) ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", saved, 1), 0);
  else ck_assert_int_eq(unsetenv("SN_COMM_TIMEOUT_S"), 0);
  MPI_Barrier(MPI_COMM_WORLD);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("faults_mpi");
  TCase *dis = tcase_create("disagree");
  tcase_set_timeout(dis, 120);
  tcase_add_test(dis, test_skip_forward);
  tcase_add_test(dis, test_skip_backward);
  tcase_add_test(dis, test_one_rank_differs);
  tcase_add_test(dis, test_order_swapped_on_one_rank);
  suite_add_tcase(s, dis);
  TCase *nf = tcase_create("nonfinite");
  tcase_set_timeout(nf, 120);
  tcase_add_test(nf, test_forward_nonfinite);
  tcase_add_test(nf, test_backward_nonfinite);
  suite_add_tcase(s, nf);
  TCase *own = tcase_create("own_checks");
  tcase_set_timeout(own, 120);
  tcase_add_test(own, test_own_checks_told);
  tcase_add_test(own, test_momentum_negative_zero);
  suite_add_tcase(s, own);
  TCase *to = tcase_create("timeout");
  tcase_set_timeout(to, 120);
  tcase_add_test(to, test_skipped_call_times_out);
  tcase_add_test(to, test_late_split_times_out);
  tcase_add_test(to, test_late_create_times_out);
  suite_add_tcase(s, to);
  return s;
}

int main(int argc, char **argv) { return mt_main(argc, argv, make_suite); }
