/*
 * test_comm_check_mpi.c — SN_COMM_CHECK=1: every collective on the communicator is compared
 * across the ranks before it is made. Where the last rank makes another call (another count,
 * dtype, function, a layer's all-reduce, an argument its own checks refuse), every rank returns
 * at once (SN_ERR_MISMATCH, or that rank its own error) with a message naming which ranks hold
 * which value, no buffer is touched, and the communicator stays in step: the next collective
 * gives the right sum everywhere. Without the check such calls end the job (MPI_ERR_TRUNCATE on
 * MPI_COMM_WORLD's fatal handler), mix buffers or wait for the timeout, so this file cannot show
 * "before" in-process; test_faults_mpi's timeout case shows the wait.
 *
 * Test cases (CK_RUN_CASE): comm_check (2 ≤ P ≤ 7: the messages list every rank), many
 * (P > 64: the message gives ranges, with no second collective).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitest.h"

/* The communicator's timeout: a check that failed to tell would wait this long. */
#define CC_TIMEOUT_S 20.0
/* Every mismatch must come back well before the timeout (generous for a loaded 2-core host). */
#define CC_FAST_S 10.0
/* Elements of the test buffers. */
#define CC_N 8
/* The poison of a buffer a refused call must leave as it was. */
#define CC_POISON (-777.0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A communicator over MPI_COMM_WORLD with SN_COMM_CHECK set to `value` for its creation on
 * every rank (all) or on rank 0 only (the others have it unset). */
static sn_comm_t *make_comm(const char *value, int all) {
  if (all || mt_rank == 0) ck_assert_int_eq(setenv("SN_COMM_CHECK", value, 1), 0);
  else ck_assert_int_eq(unsetenv("SN_COMM_CHECK"), 0);
  sn_comm_t *c = NULL;
  MT_OK(sn_comm_create_mpi(&c, MPI_COMM_WORLD));
  ck_assert_int_eq(unsetenv("SN_COMM_CHECK"), 0);
  MT_OK(sn_comm_set_timeout(c, CC_TIMEOUT_S));
  return c;
}

static void fill(double *b, double v) {
  for (int i = 0; i < CC_N; i++) b[i] = v;
}

/* The communicator is in step: a sum all-reduce gives Σ (rank + 1) on every rank. */
static void assert_in_step(sn_comm_t *c, const char *after) {
  double b[CC_N];
  fill(b, mt_rank + 1.0);
  const sn_status_t st = sn_comm_allreduce_sum(c, b, CC_N, SN_DTYPE_F64);
  ck_assert_msg(st == SN_OK, "rank %d, after %s: %s (%s)", mt_rank, after, sn_status_string(st),
                sn_last_error());
  const double want = mt_size * (mt_size + 1) / 2.0;
  for (int i = 0; i < CC_N; i++)
    ck_assert_msg(b[i] == want, "rank %d, after %s: b[%d] = %g, want %g", mt_rank, after, i, b[i],
                  want);
}

/* st is `want` (SN_ERR_MISMATCH on the ranks that made the usual call), returned before
 * CC_FAST_S, with each of the NULL-terminated strings after t0 in the message. */
static void assert_told_(sn_status_t st, sn_status_t want, double t0, const char *what, ...) {
  const double took = now_s() - t0;
  ck_assert_msg(st == want, "rank %d, %s: got %s, want %s (%s)", mt_rank, what,
                sn_status_string(st), sn_status_string(want), sn_last_error());
  ck_assert_msg(took < CC_FAST_S, "rank %d, %s: took %.2f s (timeout %.0f s)", mt_rank, what, took,
                CC_TIMEOUT_S);
  va_list ap;
  va_start(ap, what);
  for (const char *s = va_arg(ap, const char *); s != NULL; s = va_arg(ap, const char *))
    ck_assert_msg(strstr(sn_last_error(), s) != NULL, "rank %d, %s: no \"%s\" in: %s", mt_rank,
                  what, s, sn_last_error());
  va_end(ap);
}
#define assert_told(st, want, t0, what, ...) \
  assert_told_((st), (want), (t0), (what), __VA_ARGS__, (const char *)NULL)

static void assert_untouched(const double *b, const char *what) {
  for (int i = 0; i < CC_N; i++)
    ck_assert_msg(b[i] == CC_POISON, "rank %d, %s: b[%d] = %g was written", mt_rank, what, i,
                  b[i]);
}

/* "on ranks 0, 1" (P − 1 ranks) or "on rank 0" (P = 2): where the usual value is held. */
static void others(char *out, size_t size) {
  int len = snprintf(out, size, "on rank%s 0", mt_size > 2 ? "s" : "");
  for (int r = 1; r < mt_size - 1; r++) len += snprintf(out + len, size - (size_t)len, ", %d", r);
}

START_TEST(test_mismatches_detected) {
  sn_comm_t *c = make_comm("1", 1);
  const int odd = mt_rank == mt_size - 1; /* the last rank makes the other call */
  char usual[64], want[320];
  others(usual, sizeof usual);
  double b[CC_N];
  float f[2 * CC_N];

  /* another count */
  fill(b, CC_POISON);
  double t0 = now_s();
  sn_status_t st = sn_comm_allreduce_sum(c, b, odd ? CC_N - 3 : CC_N, SN_DTYPE_F64);
  snprintf(want, sizeof want, "count differs across ranks (%d %s; %d on rank %d)", CC_N, usual,
           CC_N - 3, mt_size - 1);
  assert_told(st, SN_ERR_MISMATCH, t0, "count", want, "sn_comm_allreduce_sum");
  assert_untouched(b, "count");
  assert_in_step(c, "count");

  /* another dtype of the same bytes (f32 × 16 against f64 × 8: a silent mix without the check) */
  fill(b, CC_POISON);
  for (int i = 0; i < 2 * CC_N; i++) f[i] = (float)CC_POISON;
  t0 = now_s();
  st = odd ? sn_comm_allreduce_sum(c, f, 2 * CC_N, SN_DTYPE_F32)
           : sn_comm_allreduce_sum(c, b, CC_N, SN_DTYPE_F64);
  snprintf(want, sizeof want, "element type differs across ranks (f64 %s; f32 on rank %d)", usual,
           mt_size - 1);
  assert_told(st, SN_ERR_MISMATCH, t0, "dtype", want);
  assert_untouched(b, "dtype");
  for (int i = 0; i < 2 * CC_N; i++) ck_assert(f[i] == (float)CC_POISON);
  assert_in_step(c, "dtype");

  /* a rank that has nothing to send (count 0) still meets the others' check */
  fill(b, CC_POISON);
  t0 = now_s();
  st = sn_comm_allreduce_sum(c, odd ? NULL : b, odd ? 0 : CC_N, SN_DTYPE_F64);
  snprintf(want, sizeof want, "(%d %s; 0 on rank %d)", CC_N, usual, mt_size - 1);
  assert_told(st, SN_ERR_MISMATCH, t0, "count 0", want);
  assert_untouched(b, "count 0");
  assert_in_step(c, "count 0");

  /* another function */
  fill(b, CC_POISON);
  int same = -1;
  t0 = now_s();
  st = odd ? sn_comm_all_identical(c, &same, b, sizeof b)
           : sn_comm_allreduce_sum(c, b, CC_N, SN_DTYPE_F64);
  snprintf(want, sizeof want,
           "function differs across ranks (sn_comm_allreduce_sum %s; sn_comm_all_identical on "
           "rank %d)", usual, mt_size - 1);
  assert_told(st, SN_ERR_MISMATCH, t0, "function", want);
  assert_untouched(b, "function");
  ck_assert_int_eq(same, -1);
  assert_in_step(c, "function");

  /* a split against an all-reduce: no sub-communicator made anywhere */
  sn_comm_t *sub = (sn_comm_t *)0x1;
  fill(b, CC_POISON);
  t0 = now_s();
  st = odd ? sn_comm_split(c, &sub, 0, mt_rank) : sn_comm_allreduce_sum(c, b, CC_N, SN_DTYPE_F64);
  assert_told(st, SN_ERR_MISMATCH, t0, "split", "sn_comm_split on rank");
  ck_assert_ptr_eq(sub, (sn_comm_t *)0x1);
  assert_untouched(b, "split");
  assert_in_step(c, "split");

  /* a checked split passes the check on to the sub-communicator */
  MT_OK(sn_comm_split(c, &sub, 0, mt_rank));
  ck_assert_ptr_nonnull(sub);
  fill(b, CC_POISON);
  t0 = now_s();
  st = sn_comm_allreduce_sum(sub, b, odd ? CC_N - 1 : CC_N, SN_DTYPE_F64);
  assert_told(st, SN_ERR_MISMATCH, t0, "split's sub", "count differs");
  assert_untouched(b, "split's sub");
  assert_in_step(sub, "split's sub");
  sn_comm_destroy(sub);
  sn_comm_destroy(c);
}
END_TEST

/* A rank whose own checks refuse the call still makes the check: it returns its own error, the
 * others SN_ERR_MISMATCH naming it, at once; where every rank refuses alike, each returns its
 * own error. */
START_TEST(test_own_errors_told) {
  sn_comm_t *c = make_comm("1", 1);
  const int odd = mt_rank == mt_size - 1;
  char usual[64], want[320];
  others(usual, sizeof usual);
  double b[CC_N];
  fill(b, CC_POISON);
  double t0 = now_s();
  sn_status_t st = sn_comm_allreduce_sum(c, odd ? NULL : b, CC_N, SN_DTYPE_F64);
  if (odd) {
    assert_told(st, SN_ERR_NULL_POINTER, t0, "NULL buf (own)", "sn_comm_allreduce_sum: buf");
  } else {
    snprintf(want, sizeof want, "own checks (a rank whose arguments failed them returned that "
             "error) differs across ranks (passed %s; SN_ERR_NULL_POINTER on rank %d)",
             usual, mt_size - 1);
    assert_told(st, SN_ERR_MISMATCH, t0, "NULL buf (others)", want);
  }
  assert_untouched(b, "NULL buf");
  assert_in_step(c, "NULL buf");

  /* an unknown dtype and a count beyond one collective on the odd rank */
  fill(b, CC_POISON);
  t0 = now_s();
  st = sn_comm_allreduce_sum(c, b, CC_N, odd ? (sn_dtype_t)77 : SN_DTYPE_F64);
  assert_told(st, odd ? SN_ERR_INVALID_DTYPE : SN_ERR_MISMATCH, t0, "dtype 77",
              odd ? "got 77" : "SN_ERR_INVALID_DTYPE on rank");
  assert_untouched(b, "dtype 77");
  t0 = now_s();
  st = sn_comm_allreduce_sum(c, b, odd ? (int64_t)1 << 40 : CC_N, SN_DTYPE_F64);
  assert_told(st, odd ? SN_ERR_OVERFLOW : SN_ERR_MISMATCH, t0, "count 2^40",
              odd ? "exceeds" : "SN_ERR_OVERFLOW on rank");
  assert_untouched(b, "count 2^40");
  assert_in_step(c, "own errors");

  /* sn_comm_all_identical with no place for its answer still joins the check (returning before
   * it, that rank would leave the others' check to meet its next call) */
  int same = -1;
  t0 = now_s();
  st = sn_comm_all_identical(c, odd ? NULL : &same, b, sizeof b);
  assert_told(st, odd ? SN_ERR_NULL_POINTER : SN_ERR_MISMATCH, t0, "identical NULL",
              odd ? "identical" : "SN_ERR_NULL_POINTER on rank");
  ck_assert_int_eq(same, -1);
  assert_in_step(c, "identical NULL");

  /* every rank refuses alike: each its own error, not a mismatch */
  t0 = now_s();
  st = sn_comm_allreduce_sum(c, b, -1, SN_DTYPE_F64);
  assert_told(st, SN_ERR_INVALID_SIZE, t0, "count -1 everywhere", "count");
  assert_untouched(b, "count -1 everywhere");
  assert_in_step(c, "count -1 everywhere");
  sn_comm_destroy(c);
}
END_TEST

/* A 2-channel layer on c (check_consistency as given), x [2, 2, 3] filled per rank, y poisoned
 * with −1. */
static sn_syncbn_t *make_layer(sn_comm_t *c, int check_consistency, const char *name, float *x,
                               float *y) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  cfg.check_consistency = check_consistency;
  snprintf(cfg.name, sizeof cfg.name, "%s", name);
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, c));
  for (int i = 0; i < 12; i++) x[i] = (float)(i % 5) + 0.25f * (float)mt_rank, y[i] = -1.0f;
  return bn;
}

/* After a refused forward of make_layer's layer: y still poisoned, no batch counted; then a
 * forward on every rank works and leaves the same running mean everywhere (in step). */
static void assert_layer_refused_then_in_step(sn_syncbn_t *bn, sn_comm_t *c, const float *x,
                                              float *y) {
  for (int i = 0; i < 12; i++) ck_assert(y[i] == -1.0f);
  sn_syncbn_params_t p;
  MT_OK(sn_syncbn_params(bn, &p));
  ck_assert_int_eq(*p.num_batches_tracked, 0);
  MT_OK(sn_syncbn_forward(bn, y, x, 2, 3, 1));
  int same = 0;
  MT_OK(sn_comm_all_identical(c, &same, p.running_mean, 2 * sizeof(float)));
  ck_assert_int_eq(same, 1);
}

/* A layer's all-reduces are checked too: a SyncBatchNorm forward on all ranks but the last,
 * which calls sn_comm_allreduce_sum on the same communicator, fails everywhere at once with
 * nothing written, and the next steps agree. */
START_TEST(test_layer_against_raw_call) {
  sn_comm_t *c = make_comm("1", 1);
  const int odd = mt_rank == mt_size - 1;
  float x[2 * 2 * 3], y[2 * 2 * 3];
  sn_syncbn_t *bn = make_layer(c, 1, "bn_checked", x, y);
  double b[CC_N];
  fill(b, CC_POISON);
  double t0 = now_s();
  sn_status_t st = odd ? sn_comm_allreduce_sum(c, b, CC_N, SN_DTYPE_F64)
                       : sn_syncbn_forward(bn, y, x, 2, 3, 1);
  assert_told(st, SN_ERR_MISMATCH, t0, "layer against raw", "a layer's all-reduce",
              "sn_comm_allreduce_sum on rank");
  assert_untouched(b, "layer against raw");
  assert_layer_refused_then_in_step(bn, c, x, y);
  sn_syncbn_destroy(bn);
  sn_comm_destroy(c);
}
END_TEST

/* A layer without check_consistency has no consistency all-reduce to tell its own errors in:
 * with the call check on, a rank whose forward fails its checks (x NULL) tells the others in
 * the call check of their first all-reduce (returning alone, it would leave the others' check
 * to meet its next call). */
START_TEST(test_layer_unchecked_own_error) {
  sn_comm_t *c = make_comm("1", 1);
  const int odd = mt_rank == mt_size - 1;
  float x[2 * 2 * 3], y[2 * 2 * 3];
  sn_syncbn_t *bn = make_layer(c, 0, "bn_unchecked", x, y);
  double t0 = now_s();
  sn_status_t st = sn_syncbn_forward(bn, y, odd ? NULL : x, 2, 3, 1);
  assert_told(st, odd ? SN_ERR_NULL_POINTER : SN_ERR_MISMATCH, t0, "unchecked layer, x NULL",
              odd ? "sent to the other ranks in the call check"
                  : "own checks (a rank whose arguments failed them returned that error) differs "
                    "across ranks (passed");
  ck_assert_msg(odd || strstr(sn_last_error(), "count differs") == NULL, "%s", sn_last_error());
  assert_layer_refused_then_in_step(bn, c, x, y);
  assert_in_step(c, "unchecked layer");
  sn_syncbn_destroy(bn);
  sn_comm_destroy(c);
}
END_TEST

/* SN_COMM_CHECK's values: "1" on any rank turns the check on for all (a rank checking alone
 * would make collectives the others do not); "0" and unset are off; anything else fails the
 * creation on every rank. */
START_TEST(test_env_values) {
  const char *outer = getenv("SN_COMM_CHECK"); /* restored at the end */
  char saved[64] = "";
  if (outer != NULL) snprintf(saved, sizeof saved, "%s", outer);
  /* only rank 0 asks for it: on everywhere (the last rank's other count is caught) */
  sn_comm_t *c = make_comm("1", 0);
  const int odd = mt_rank == mt_size - 1;
  double b[CC_N];
  fill(b, CC_POISON);
  const double t0 = now_s();
  const sn_status_t st = sn_comm_allreduce_sum(c, b, odd ? 1 : CC_N, SN_DTYPE_F64);
  assert_told(st, SN_ERR_MISMATCH, t0, "check from rank 0", "count differs");
  assert_untouched(b, "check from rank 0");
  assert_in_step(c, "check from rank 0");
  sn_comm_destroy(c);
  /* "0" is off: a matching call works (a mismatching one would not be caught) */
  c = make_comm("0", 1);
  assert_in_step(c, "SN_COMM_CHECK=0");
  sn_comm_destroy(c);
  /* a bad value on every rank, then on the last only: every rank fails, none waits in the dup */
  static const char *const bad[] = {"yes", "2", "on", " 1", "true"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (int only_last = 0; only_last < 2; only_last++) {
      const int mine = !only_last || mt_rank == mt_size - 1;
      if (mine) ck_assert_int_eq(setenv("SN_COMM_CHECK", bad[i], 1), 0);
      else ck_assert_int_eq(unsetenv("SN_COMM_CHECK"), 0);
      c = (sn_comm_t *)0x1;
      ck_assert_int_eq(sn_comm_create_mpi(&c, MPI_COMM_WORLD), SN_ERR_INVALID_ARGUMENT);
      ck_assert_ptr_eq(c, (sn_comm_t *)0x1);
      ck_assert_msg(strstr(sn_last_error(), mine ? "SN_COMM_CHECK='" : "SN_COMM_CHECK is "
                                                                       "neither 0 nor 1 on rank"),
                    "'%s': %s", bad[i], sn_last_error());
    }
  }
  if (outer != NULL) ck_assert_int_eq(setenv("SN_COMM_CHECK", saved, 1), 0);
  else ck_assert_int_eq(unsetenv("SN_COMM_CHECK"), 0);
}
END_TEST

/* Beyond SN_MSG_TABLE_RANKS (64) ranks a mismatch is told by each field's range. */
START_TEST(test_many_ranks_ranges) {
  ck_assert_msg(mt_size > 64, "the many case needs more than 64 ranks, got %d", mt_size);
  sn_comm_t *c = make_comm("1", 1);
  const int odd = mt_rank == mt_size - 1;
  double b[CC_N];
  fill(b, CC_POISON);
  double t0 = now_s();
  sn_status_t st = sn_comm_allreduce_sum(c, b, odd ? CC_N - 3 : CC_N, SN_DTYPE_F64);
  assert_told(st, SN_ERR_MISMATCH, t0, "count (many)", "count differs across ranks (5..8)");
  assert_untouched(b, "count (many)");
  assert_in_step(c, "count (many)");
  t0 = now_s();
  st = sn_comm_allreduce_sum(c, odd ? NULL : b, CC_N, SN_DTYPE_F64);
  assert_told(st, odd ? SN_ERR_NULL_POINTER : SN_ERR_MISMATCH, t0, "NULL buf (many)",
              odd ? "buf" : "(passed..SN_ERR_NULL_POINTER)");
  assert_untouched(b, "NULL buf (many)");
  assert_in_step(c, "NULL buf (many)");
  sn_comm_destroy(c);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("comm_check_mpi");
  TCase *tc = tcase_create("comm_check");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_mismatches_detected);
  tcase_add_test(tc, test_own_errors_told);
  tcase_add_test(tc, test_layer_against_raw_call);
  tcase_add_test(tc, test_layer_unchecked_own_error);
  tcase_add_test(tc, test_env_values);
  suite_add_tcase(s, tc);
  TCase *many = tcase_create("many");
  tcase_set_timeout(many, 240);
  tcase_add_test(many, test_many_ranks_ranges);
  suite_add_tcase(s, many);
  return s;
}

int main(int argc, char **argv) { return mt_main(argc, argv, make_suite); }
