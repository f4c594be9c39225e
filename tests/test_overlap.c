/*
 * test_overlap.c — aliasing between outputs and inputs, for every kernel with activations and
 * for SyncBatchNorm: a partial overlap (an output starting one element into an input) is
 * SN_ERR_INVALID_ARGUMENT with memory untouched; the documented in-place pairs (y == x,
 * dx == dy; sum_out == x or residual in the fused kernels) work; dx == x and, in the fused
 * kernels, y equal to any other buffer are rejected (syncnorm.h: "No other overlap is allowed").
 * test_every_pair goes through every public kernel's buffer list: each output placed over each
 * other buffer of the call, at its start and one element in, is rejected before anything is
 * written, but for the pairs the header allows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncnorm_dist.h"
#include "testutil.h"

enum { ROWS = 3, D = 8, N = 2, C = 4, S = 3, E = 24 }; /* E elements: ROWS·D = N·C·S */
_Static_assert(ROWS * D == E && N * C * S == E, "one element count for every kernel");

/* One arena holding every buffer of a call; a call is checked to leave it bitwise unchanged. */
_Alignas(64) static float arena[12 * E];
static float keep[12 * E];
static const float gamma4[D] = {1, 2, 3, 4, 5, 6, 7, 8}, beta4[D] = {0};
static float mean_r[ROWS], rstd_r[ROWS], gmean[N * 2], grstd[N * 2], rmean[C], rvar[C], rs_r[ROWS];
static float brstd[C];
static double bmean[C], sdy[C], sdyx[C];

static void fill(void) {
  /* positive: valid as any buffer (a running_var; num_batches_tracked's int64 from two) */
  for (int i = 0; i < 12 * E; i++) arena[i] = (float)((i * 37) % 11) + 0.5f;
  for (int r = 0; r < ROWS; r++) mean_r[r] = 0.1f, rstd_r[r] = 0.5f, rs_r[r] = 0.5f;
  for (int k = 0; k < N * 2; k++) gmean[k] = 0.2f, grstd[k] = 0.7f;
  for (int c = 0; c < C; c++) {
    rmean[c] = 0.0f, rvar[c] = 1.0f, brstd[c] = 0.9f;
    bmean[c] = 0.3, sdy[c] = 1.0, sdyx[c] = 2.0;
  }
  memcpy(keep, arena, sizeof arena);
}

/* Expects `want` from the call; for an error, the arena unchanged and a message naming fn. */
static void expect(sn_status_t got, sn_status_t want, const char *fn, const char *what) {
  ck_assert_msg(got == want, "%s %s: got %s, want %s (%s)", fn, what, sn_status_string(got),
                sn_status_string(want), sn_last_error());
  if (want == SN_OK) return;
  ck_assert_msg(memcmp(arena, keep, sizeof arena) == 0, "%s %s: memory written", fn, what);
  const char *msg = sn_last_error();
  ck_assert_msg(strncmp(msg, fn, strlen(fn)) == 0 &&
                    (strstr(msg, "overlap") != NULL || strstr(msg, "same buffer") != NULL),
                "%s %s: message '%s'", fn, what, msg);
}

/* Buffer k of the arena, shifted by `shift` elements (a partial overlap with buffer k). */
static float *at(int k, int shift) { return arena + k * E + shift; }

START_TEST(test_rownorm_overlaps) {
  const sn_status_t BAD = SN_ERR_INVALID_ARGUMENT;
  const float eps = 1e-5f;
  /* y one element into x; in place is fine */
  fill();
  expect(sn_layernorm_fwd(at(0, 1), NULL, NULL, at(0, 0), gamma4, beta4, ROWS, D, eps, SN_DTYPE_F32),
         BAD, "sn_layernorm_fwd", "y = x + 1");
  fill();
  expect(sn_layernorm_fwd(at(0, 0), NULL, NULL, at(0, 1), gamma4, beta4, ROWS, D, eps, SN_DTYPE_F32),
         BAD, "sn_layernorm_fwd", "x = y + 1");
  fill();
  expect(sn_layernorm_fwd(at(0, 0), NULL, NULL, at(0, 0), gamma4, beta4, ROWS, D, eps, SN_DTYPE_F32),
         SN_OK, "sn_layernorm_fwd", "y == x");
  fill();
  expect(sn_rmsnorm_fwd(at(1, 3), NULL, at(1, 0), gamma4, ROWS, D, eps, SN_DTYPE_BF16), BAD,
         "sn_rmsnorm_fwd", "y = x + 3 (bf16)");
  fill();
  expect(sn_rmsnorm_fwd(at(1, 0), NULL, at(1, 0), gamma4, ROWS, D, eps, SN_DTYPE_F32), SN_OK,
         "sn_rmsnorm_fwd", "y == x");

  /* backward: dx == dy in place; dx over x (equal or partly) and partial dx/dy rejected */
  for (int f = 0; f < 2; f++) {
    const char *fn = f == 0 ? "sn_layernorm_bwd" : "sn_rmsnorm_bwd";
#define BWD(DX, DY, X)                                                                          \
  (f == 0 ? sn_layernorm_bwd(DX, NULL, NULL, DY, X, mean_r, rstd_r, gamma4, ROWS, D, SN_DTYPE_F32) \
          : sn_rmsnorm_bwd(DX, NULL, DY, X, rs_r, gamma4, ROWS, D, SN_DTYPE_F32))
    fill();
    expect(BWD(at(0, 1), at(0, 0), at(2, 0)), BAD, fn, "dx = dy + 1");
    fill();
    expect(BWD(at(2, 0), at(0, 0), at(2, 0)), BAD, fn, "dx == x");
    fill();
    expect(BWD(at(2, 5), at(0, 0), at(2, 0)), BAD, fn, "dx = x + 5");
    fill();
    expect(BWD(at(0, 0), at(0, 0), at(2, 0)), SN_OK, fn, "dx == dy");
#undef BWD
  }

  /* fused: sum_out may equal x or residual; y overlaps nothing */
  for (int f = 0; f < 2; f++) {
    const char *fn = f == 0 ? "sn_add_layernorm_fwd" : "sn_add_rmsnorm_fwd";
#define ADD(Y, SUM, X, RES)                                                                       \
  (f == 0 ? sn_add_layernorm_fwd(Y, SUM, NULL, NULL, X, RES, gamma4, beta4, ROWS, D, eps,        \
                                 SN_DTYPE_F32)                                                    \
          : sn_add_rmsnorm_fwd(Y, SUM, NULL, X, RES, gamma4, ROWS, D, eps, SN_DTYPE_F32))
    fill();
    expect(ADD(at(0, 0), at(1, 0), at(0, 0), at(2, 0)), BAD, fn, "y == x");
    fill();
    expect(ADD(at(2, 0), at(1, 0), at(0, 0), at(2, 0)), BAD, fn, "y == residual");
    fill();
    expect(ADD(at(1, 0), at(1, 0), at(0, 0), at(2, 0)), BAD, fn, "y == sum_out");
    fill();
    expect(ADD(at(3, 0), at(1, 2), at(1, 0), at(2, 0)), BAD, fn, "sum_out = x + 2");
    fill();
    expect(ADD(at(3, 0), at(1, 0), at(0, 7), at(1, 0)), BAD, fn, "x = residual + 7");
    fill();
    expect(ADD(at(3, 0), at(0, 0), at(0, 0), at(2, 0)), SN_OK, fn, "sum_out == x");
    fill();
    expect(ADD(at(3, 0), at(2, 0), at(0, 0), at(2, 0)), SN_OK, fn, "sum_out == residual");
#undef ADD
  }
}
END_TEST

START_TEST(test_channel_overlaps) {
  const sn_status_t BAD = SN_ERR_INVALID_ARGUMENT;
  for (int l = 0; l < 2; l++) {
    const sn_layout_t lay = l == 0 ? SN_LAYOUT_NCHW : SN_LAYOUT_NHWC;
    fill();
    expect(sn_batchnorm_apply(at(0, 1), at(0, 0), bmean, brstd, gamma4, beta4, N, C, S, lay,
                              SN_DTYPE_F32),
           BAD, "sn_batchnorm_apply", "y = x + 1");
    fill();
    expect(sn_batchnorm_infer(at(0, 0), at(0, 2), rmean, rvar, gamma4, beta4, N, C, S, 1e-5f, lay,
                              SN_DTYPE_F16),
           BAD, "sn_batchnorm_infer", "x = y + 2 (f16)");
    fill();
    expect(sn_batchnorm_bwd_apply(at(1, 0), at(0, 0), at(1, 0), bmean, brstd, gamma4, sdy, sdyx,
                                  N * S, N, C, S, lay, SN_DTYPE_F32),
           BAD, "sn_batchnorm_bwd_apply", "dx == x");
    fill();
    expect(sn_batchnorm_bwd_apply(at(0, 4), at(0, 0), at(1, 0), bmean, brstd, gamma4, sdy, sdyx,
                                  N * S, N, C, S, lay, SN_DTYPE_F32),
           BAD, "sn_batchnorm_bwd_apply", "dx = dy + 4");
    fill();
    expect(sn_batchnorm_bwd_apply(at(0, 0), at(0, 0), at(1, 0), bmean, brstd, gamma4, sdy, sdyx,
                                  N * S, N, C, S, lay, SN_DTYPE_F32),
           SN_OK, "sn_batchnorm_bwd_apply", "dx == dy");
    fill();
    expect(sn_groupnorm_fwd(at(0, 1), NULL, NULL, at(0, 0), gamma4, beta4, N, C, S, 2, 1e-5f, lay,
                            SN_DTYPE_F32),
           BAD, "sn_groupnorm_fwd", "y = x + 1");
    fill();
    expect(sn_groupnorm_fwd(at(0, 0), NULL, NULL, at(0, 0), gamma4, beta4, N, C, S, 2, 1e-5f, lay,
                            SN_DTYPE_F32),
           SN_OK, "sn_groupnorm_fwd", "y == x");
    fill();
    expect(sn_groupnorm_bwd(at(1, 0), NULL, NULL, at(0, 0), at(1, 0), gmean, grstd, gamma4, N, C,
                            S, 2, lay, SN_DTYPE_F32),
           BAD, "sn_groupnorm_bwd", "dx == x");
    fill();
    expect(sn_groupnorm_bwd(at(0, 0), NULL, NULL, at(0, 0), at(1, 0), gmean, grstd, gamma4, N, C,
                            S, 2, lay, SN_DTYPE_F32),
           SN_OK, "sn_groupnorm_bwd", "dx == dy");
  }
}
END_TEST

/* ---- every output over every other buffer, kernel by kernel ------------------------------ */

enum { G = 2, PER = 6, NB_MAX = 9 }; /* groups; fold's per_out (C·PER = E) */
_Static_assert(C * PER == E, "fold's w fills one slot");

/* One buffer of a kernel: its name, bytes, whether the kernel writes it, the buffers it may
 * equal (bit j: buffer j; the header's in-place pairs) and its element size (the alignment a
 * moved output keeps). */
typedef struct {
  const char *name;
  int bytes;
  int out;
  unsigned may_equal;
  int es;
} buf_t;
typedef struct {
  const char *fn;
  int nb;
  buf_t b[NB_MAX];
  sn_status_t (*call)(void *const *p);
} kern_t;

#define AB (E * 4) /* an f32 activation [ROWS, D] or [N, C, S] */
#define F32C (C * 4)
#define F64C (C * 8)
static const float EPS = 1e-5f;

static sn_status_t k_ln_fwd(void *const *p) {
  return sn_layernorm_fwd(p[0], p[1], p[2], p[3], p[4], p[5], ROWS, D, EPS, SN_DTYPE_F32);
}
static sn_status_t k_add_ln(void *const *p) {
  return sn_add_layernorm_fwd(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], ROWS, D, EPS,
                              SN_DTYPE_F32);
}
static sn_status_t k_rms_fwd(void *const *p) {
  return sn_rmsnorm_fwd(p[0], p[1], p[2], p[3], ROWS, D, EPS, SN_DTYPE_F32);
}
static sn_status_t k_add_rms(void *const *p) {
  return sn_add_rmsnorm_fwd(p[0], p[1], p[2], p[3], p[4], p[5], ROWS, D, EPS, SN_DTYPE_F32);
}
static sn_status_t k_ln_bwd(void *const *p) {
  return sn_layernorm_bwd(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], ROWS, D, SN_DTYPE_F32);
}
static sn_status_t k_rms_bwd(void *const *p) {
  return sn_rmsnorm_bwd(p[0], p[1], p[2], p[3], p[4], p[5], ROWS, D, SN_DTYPE_F32);
}
static sn_status_t k_bn_stats(void *const *p) {
  return sn_batchnorm_stats(p[0], p[1], p[2], p[3], N, C, S, SN_LAYOUT_NCHW, SN_DTYPE_F32);
}
static sn_status_t k_bn_finalize(void *const *p) {
  return sn_batchnorm_finalize(p[0], p[1], p[2], p[3], p[4], p[5], N * S, C, EPS);
}
static sn_status_t k_bn_running(void *const *p) {
  return sn_batchnorm_update_running(p[0], p[1], p[2], p[3], p[4], N * S, C, 0.1f);
}
static sn_status_t k_bn_apply(void *const *p) {
  return sn_batchnorm_apply(p[0], p[1], p[2], p[3], p[4], p[5], N, C, S, SN_LAYOUT_NHWC,
                            SN_DTYPE_F32);
}
static sn_status_t k_bn_fwd(void *const *p) {
  return sn_batchnorm_fwd(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], N, C, S, EPS,
                          SN_LAYOUT_NCHW, SN_DTYPE_F32);
}
static sn_status_t k_bn_infer(void *const *p) {
  return sn_batchnorm_infer(p[0], p[1], p[2], p[3], p[4], p[5], N, C, S, EPS, SN_LAYOUT_NCHW,
                            SN_DTYPE_F32);
}
static sn_status_t k_bn_bwd_reduce(void *const *p) {
  return sn_batchnorm_bwd_reduce(p[0], p[1], p[2], p[3], p[4], p[5], N, C, S, SN_LAYOUT_NHWC,
                                 SN_DTYPE_F32);
}
static sn_status_t k_bn_bwd_apply(void *const *p) {
  return sn_batchnorm_bwd_apply(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], N * S, N, C, S,
                                SN_LAYOUT_NCHW, SN_DTYPE_F32);
}
static sn_status_t k_bn_bwd(void *const *p) {
  return sn_batchnorm_bwd(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], N, C, S,
                          SN_LAYOUT_NCHW, SN_DTYPE_F32);
}
static sn_status_t k_gn_fwd(void *const *p) {
  return sn_groupnorm_fwd(p[0], p[1], p[2], p[3], p[4], p[5], N, C, S, G, EPS, SN_LAYOUT_NHWC,
                          SN_DTYPE_F32);
}
static sn_status_t k_gn_bwd(void *const *p) {
  return sn_groupnorm_bwd(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], N, C, S, G,
                          SN_LAYOUT_NCHW, SN_DTYPE_F32);
}
static sn_status_t k_fold(void *const *p) {
  return sn_fold_batchnorm(p[0], p[1], p[2], p[3], p[4], p[5], C, PER, EPS);
}

#define IN(name, bytes) {name, bytes, 0, 0u, 4}
#define OUT(name, bytes, eq) {name, bytes, 1, eq, 4}
#define OUT8(name, bytes) {name, bytes, 1, 0u, 8} /* f64 or int64 elements */
static const kern_t kernels[] = {
    {"sn_layernorm_fwd", 6,
     {OUT("y", AB, 1u << 3), OUT("mean", ROWS * 4, 0), OUT("rstd", ROWS * 4, 0), IN("x", AB),
      IN("gamma", D * 4), IN("beta", D * 4)},
     k_ln_fwd},
    {"sn_add_layernorm_fwd", 8,
     {OUT("y", AB, 0), OUT("sum_out", AB, 1u << 4 | 1u << 5), OUT("mean", ROWS * 4, 0),
      OUT("rstd", ROWS * 4, 0), IN("x", AB), IN("residual", AB), IN("gamma", D * 4),
      IN("beta", D * 4)},
     k_add_ln},
    {"sn_rmsnorm_fwd", 4,
     {OUT("y", AB, 1u << 2), OUT("rstd", ROWS * 4, 0), IN("x", AB), IN("gamma", D * 4)},
     k_rms_fwd},
    {"sn_add_rmsnorm_fwd", 6,
     {OUT("y", AB, 0), OUT("sum_out", AB, 1u << 3 | 1u << 4), OUT("rstd", ROWS * 4, 0),
      IN("x", AB), IN("residual", AB), IN("gamma", D * 4)},
     k_add_rms},
    {"sn_layernorm_bwd", 8,
     {OUT("dx", AB, 1u << 3), OUT("dgamma", D * 4, 0), OUT("dbeta", D * 4, 0), IN("dy", AB),
      IN("x", AB), IN("mean", ROWS * 4), IN("rstd", ROWS * 4), IN("gamma", D * 4)},
     k_ln_bwd},
    {"sn_rmsnorm_bwd", 6,
     {OUT("dx", AB, 1u << 2), OUT("dgamma", D * 4, 0), IN("dy", AB), IN("x", AB),
      IN("rstd", ROWS * 4), IN("gamma", D * 4)},
     k_rms_bwd},
    {"sn_batchnorm_stats", 4,
     {OUT8("sum", F64C), OUT8("sumsq", F64C), IN("x", AB), IN("pivot", F32C)},
     k_bn_stats},
    {"sn_batchnorm_finalize", 6,
     {OUT8("mean", F64C), OUT("var", F32C, 0), OUT("rstd", F32C, 0), IN("sum", F64C),
      IN("sumsq", F64C), IN("pivot", F32C)},
     k_bn_finalize},
    {"sn_batchnorm_update_running", 5,
     {OUT("running_mean", F32C, 0), OUT("running_var", F32C, 0), OUT8("num_batches_tracked", 8),
      IN("mean", F64C), IN("var", F32C)},
     k_bn_running},
    {"sn_batchnorm_apply", 6,
     {OUT("y", AB, 1u << 1), IN("x", AB), IN("mean", F64C), IN("rstd", F32C), IN("gamma", F32C),
      IN("beta", F32C)},
     k_bn_apply},
    {"sn_batchnorm_fwd", 8,
     {OUT("y", AB, 1u << 4), OUT8("mean", F64C), OUT("var", F32C, 0), OUT("rstd", F32C, 0),
      IN("x", AB), IN("pivot", F32C), IN("gamma", F32C), IN("beta", F32C)},
     k_bn_fwd},
    {"sn_batchnorm_infer", 6,
     {OUT("y", AB, 1u << 1), IN("x", AB), IN("running_mean", F32C), IN("running_var", F32C),
      IN("gamma", F32C), IN("beta", F32C)},
     k_bn_infer},
    {"sn_batchnorm_bwd_reduce", 6,
     {OUT8("sum_dy", F64C), OUT8("sum_dy_xhat", F64C), IN("dy", AB), IN("x", AB),
      IN("mean", F64C), IN("rstd", F32C)},
     k_bn_bwd_reduce},
    {"sn_batchnorm_bwd_apply", 8,
     {OUT("dx", AB, 1u << 1), IN("dy", AB), IN("x", AB), IN("mean", F64C), IN("rstd", F32C),
      IN("gamma", F32C), IN("sum_dy", F64C), IN("sum_dy_xhat", F64C)},
     k_bn_bwd_apply},
    /* the header: every input is read before dgamma and dbeta are written over gamma or rstd */
    {"sn_batchnorm_bwd", 8,
     {OUT("dx", AB, 1u << 3), OUT("dgamma", F32C, 1u << 6 | 1u << 7),
      OUT("dbeta", F32C, 1u << 6 | 1u << 7), IN("dy", AB), IN("x", AB), IN("mean", F64C),
      IN("rstd", F32C), IN("gamma", F32C)},
     k_bn_bwd},
    {"sn_groupnorm_fwd", 6,
     {OUT("y", AB, 1u << 3), OUT("mean", N * G * 4, 0), OUT("rstd", N * G * 4, 0), IN("x", AB),
      IN("gamma", F32C), IN("beta", F32C)},
     k_gn_fwd},
    {"sn_groupnorm_bwd", 8,
     {OUT("dx", AB, 1u << 3), OUT("dgamma", F32C, 0), OUT("dbeta", F32C, 0), IN("dy", AB),
      IN("x", AB), IN("mean", N * G * 4), IN("rstd", N * G * 4), IN("gamma", F32C)},
     k_gn_bwd},
    {"sn_fold_batchnorm", 6,
     {OUT("w", AB, 0), OUT("b", F32C, 0), IN("gamma", F32C), IN("beta", F32C),
      IN("running_mean", F32C), IN("running_var", F32C)},
     k_fold},
};
#undef IN
#undef OUT
#undef OUT8

/* Buffer m of a call lives in slot m + 1 of the arena, apart from the others (a slot is E
 * floats, the largest buffer); slot 0 and the slots after the last leave room for an output
 * moved before or past another buffer. Each output i is placed over each other buffer j four
 * ways: at its start, one element in, its first element over j's last, and its last element
 * over j's first. The last two catch a span the library sizes too small (an f64 array counted
 * as f32, [N] for [N, G]), which the first two cannot. Every placement overlaps j; it is allowed
 * only at j's start, as the same length, for a pair the table allows. */
enum { PLACEMENTS = 4 };
START_TEST(test_every_pair) {
  const int nk = (int)(sizeof kernels / sizeof kernels[0]);
  int rejected = 0, allowed = 0;
  for (int k = 0; k < nk; k++) {
    const kern_t *kn = &kernels[k];
    void *p[NB_MAX];
    for (int i = 0; i < kn->nb; i++) {
      ck_assert_int_le(kn->b[i].bytes, E * 4);
      p[i] = at(i + 1, 0);
    }
    fill();
    expect(kn->call(p), SN_OK, kn->fn, "every buffer apart");
    for (int i = 0; i < kn->nb; i++) {
      const buf_t *bi = &kn->b[i];
      if (!bi->out) continue;
      for (int j = 0; j < kn->nb; j++) {
        if (j == i) continue;
        const buf_t *bj = &kn->b[j];
        const char *pj = (const char *)at(j + 1, 0);
        const char *place[PLACEMENTS] = {pj, pj + bi->es, pj + bj->bytes - bi->es,
                                         pj - bi->bytes + bi->es};
        static const char *const how[PLACEMENTS] = {"at", "one element into",
                                                    "first element over the last of",
                                                    "last element over the first of"};
        for (int w = 0; w < PLACEMENTS; w++) {
          const char *pi = place[w];
          ck_assert(pi < pj + bj->bytes && pj < pi + bi->bytes);   /* they overlap */
          ck_assert((uintptr_t)pi % (uintptr_t)bi->es == 0);       /* and i stays aligned */
          const int ok = pi == pj && bi->bytes == bj->bytes &&
                         (((bi->may_equal >> j) | (bj->may_equal >> i)) & 1u);
          char what[128];
          snprintf(what, sizeof what, "%s %s %s", bi->name, how[w], bj->name);
          for (int m = 0; m < kn->nb; m++) p[m] = at(m + 1, 0);
          p[i] = (void *)pi;
          fill();
          expect(kn->call(p), ok ? SN_OK : SN_ERR_INVALID_ARGUMENT, kn->fn, what);
          ok ? allowed++ : rejected++;
        }
      }
    }
  }
  /* the loops ran: 4 placements per (output, other buffer), 250 such pairs; 19 allowed pairs
   * in the table */
  ck_assert_int_eq(rejected + allowed, PLACEMENTS * 250);
  ck_assert_int_eq(allowed, 19);
}
END_TEST

/* An empty batch writes only the [C]/[d] arrays, which are still checked. */
START_TEST(test_empty_batch_overlaps) {
  const sn_status_t BAD = SN_ERR_INVALID_ARGUMENT;
  fill();
  expect(sn_layernorm_bwd(NULL, at(0, 0), at(0, 2), NULL, NULL, NULL, NULL, gamma4, 0, D,
                          SN_DTYPE_F32),
         BAD, "sn_layernorm_bwd", "empty: dbeta two into dgamma");
  fill();
  expect(sn_rmsnorm_bwd(NULL, at(0, 0), NULL, NULL, NULL, at(0, 0), 0, D, SN_DTYPE_F32), BAD,
         "sn_rmsnorm_bwd", "empty: dgamma == gamma");
  fill();
  expect(sn_groupnorm_bwd(NULL, at(0, 0), at(0, 0), NULL, NULL, NULL, NULL, NULL, 0, C, S, G,
                          SN_LAYOUT_NCHW, SN_DTYPE_F32),
         BAD, "sn_groupnorm_bwd", "empty: dgamma == dbeta");
  fill();
  expect(sn_batchnorm_stats((double *)at(0, 0), (double *)at(0, 4), NULL, NULL, 0, C, S,
                            SN_LAYOUT_NCHW, SN_DTYPE_F32),
         BAD, "sn_batchnorm_stats", "empty: sumsq half into sum");
  fill();
  expect(sn_batchnorm_bwd_reduce((double *)at(0, 0), (double *)at(1, 0), NULL, NULL,
                                 (double *)at(1, 0), brstd, N, C, 0, SN_LAYOUT_NCHW,
                                 SN_DTYPE_F32),
         BAD, "sn_batchnorm_bwd_reduce", "empty: sum_dy_xhat == mean");
  /* count 0 writes only num_batches_tracked, which must not land in the [C] arrays */
  fill();
  expect(sn_batchnorm_update_running(at(0, 0), at(1, 0), (int64_t *)(void *)at(1, 2), bmean,
                                     brstd, 0, C, 0.1f),
         BAD, "sn_batchnorm_update_running", "count 0: num_batches_tracked in running_var");
  /* N > 0, S == 0: dgamma over the [N, G] mean, as any other array */
  fill();
  expect(sn_groupnorm_bwd(NULL, at(0, 0), NULL, NULL, NULL, at(0, 0), grstd, NULL, N, C, 0, G,
                          SN_LAYOUT_NHWC, SN_DTYPE_F32),
         BAD, "sn_groupnorm_bwd", "S == 0: dgamma == mean");
  fill();
  expect(sn_groupnorm_fwd(NULL, at(0, 0), at(0, 1), NULL, NULL, NULL, N, C, 0, G, 1e-5f,
                          SN_LAYOUT_NCHW, SN_DTYPE_F32),
         BAD, "sn_groupnorm_fwd", "S == 0: rstd one into mean");
  fill();
  expect(sn_layernorm_bwd(NULL, at(0, 0), at(1, 0), NULL, NULL, NULL, NULL, gamma4, 0, D,
                          SN_DTYPE_F32),
         SN_OK, "sn_layernorm_bwd", "empty: apart");
}
END_TEST

/* SyncBatchNorm checks before any collective or state change: num_batches_tracked stays. */
START_TEST(test_syncbn_overlaps) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  sn_syncbn_t *bn = NULL;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_OK);
  fill();
  expect(sn_syncbn_forward(bn, at(0, 1), at(0, 0), N, S, 1), SN_ERR_INVALID_ARGUMENT,
         "sn_syncbn_forward", "y = x + 1");
  ck_assert_int_eq(*p.num_batches_tracked, 0);
  fill();
  expect(sn_syncbn_forward(bn, at(1, 0), at(0, 0), N, S, 1), SN_OK, "sn_syncbn_forward", "apart");
  fill();
  expect(sn_syncbn_backward(bn, at(0, 0), at(2, 0), at(0, 0), N, S), SN_ERR_INVALID_ARGUMENT,
         "sn_syncbn_backward", "dx == x");
  fill();
  expect(sn_syncbn_backward(bn, at(2, 3), at(2, 0), at(0, 0), N, S), SN_ERR_INVALID_ARGUMENT,
         "sn_syncbn_backward", "dx = dy + 3");
  fill();
  expect(sn_syncbn_backward(bn, at(2, 0), at(2, 0), at(0, 0), N, S), SN_OK, "sn_syncbn_backward",
         "dx == dy");
  /* the layer's own arrays (sn_syncbn_params hands them out), which a step writes */
  int64_t before = 0;
  ck_assert_int_eq(sn_syncbn_collective_count(bn, &before), SN_OK);
  const float w0 = p.weight[0], rm0 = p.running_mean[0];
  fill();
  expect(sn_syncbn_forward(bn, p.weight, at(0, 0), 2, 1, 1), SN_ERR_INVALID_ARGUMENT,
         "sn_syncbn_forward", "y over weight and the rest of the layer's arrays");
  fill();
  expect(sn_syncbn_forward(bn, at(1, 0), p.running_var, 2, 1, 1), SN_ERR_INVALID_ARGUMENT,
         "sn_syncbn_forward", "x over running_var");
  fill();
  expect(sn_syncbn_backward(bn, p.grad_bias, at(2, 0), at(0, 0), 2, 1), SN_ERR_INVALID_ARGUMENT,
         "sn_syncbn_backward", "dx over grad_bias");
  int64_t after = 0;
  ck_assert_int_eq(sn_syncbn_collective_count(bn, &after), SN_OK);
  ck_assert_int_eq(after, before);
  ck_assert_int_eq(*p.num_batches_tracked, 1);
  ck_assert(p.weight[0] == w0 && p.running_mean[0] == rm0);
  sn_syncbn_destroy(bn);
}
END_TEST

int main(void) {
  Suite *s = suite_create("overlap");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_rownorm_overlaps);
  tcase_add_test(tc, test_channel_overlaps);
  tcase_add_test(tc, test_syncbn_overlaps);
  tcase_add_test(tc, test_every_pair);
  tcase_add_test(tc, test_empty_batch_overlaps);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
