/*
 * test_overlap.c — aliasing between outputs and inputs, for every kernel with activations and
 * for SyncBatchNorm: a partial overlap (an output starting one element into an input) is
 * SN_ERR_INVALID_ARGUMENT with memory untouched; the documented in-place pairs (y == x,
 * dx == dy; sum_out == x or residual in the fused kernels) work; dx == x and, in the fused
 * kernels, y equal to any other buffer are rejected (syncnorm.h: "No other overlap is allowed").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncnorm_dist.h"
#include "testutil.h"

enum { ROWS = 3, D = 8, N = 2, C = 4, S = 3, E = 24 }; /* E elements: ROWS·D = N·C·S */
_Static_assert(ROWS * D == E && N * C * S == E, "one element count for every kernel");

/* One arena holding every buffer of a call; a call is checked to leave it bitwise unchanged. */
static float arena[8 * E];
static float keep[8 * E];
static const float gamma4[D] = {1, 2, 3, 4, 5, 6, 7, 8}, beta4[D] = {0};
static float mean_r[ROWS], rstd_r[ROWS], gmean[N * 2], grstd[N * 2], rmean[C], rvar[C], rs_r[ROWS];
static float brstd[C];
static double bmean[C], sdy[C], sdyx[C];

static void fill(void) {
  for (int i = 0; i < 8 * E; i++) arena[i] = (float)((i * 37) % 11) - 5.0f;
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
  sn_syncbn_destroy(bn);
}
END_TEST

int main(void) {
  Suite *s = suite_create("overlap");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_rownorm_overlaps);
  tcase_add_test(tc, test_channel_overlaps);
  tcase_add_test(tc, test_syncbn_overlaps);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
