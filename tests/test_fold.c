/*
 * test_fold.c — sn_fold_batchnorm: a conv written as a matmul over patches, followed by an
 * inference BatchNorm, equals the folded matmul; the folded values are the fp64 formula rounded
 * once; NULL gamma/beta; bad input leaves w and b untouched.
 *
 * Conv as matmul: patches P: [P, per_out] (im2col rows), w: [c_out, per_out], b: [c_out],
 *   z[p, c] = Σ_i P[p, i]·w[c, i] + b[c],  BN_eval(z)[p, c] = (z − μ_c)/√(σ²_c + eps)·γ_c + β_c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The folded w', b' are each one f32 rounding (≤ 2^-24 relative) of the exact fp64 values, so
 * the folded matmul (in fp64) differs from the fp64 conv+BN by at most 2^-24·(Σ|P·w'| + |b'|)
 * per output, plus fp64 rounding; 2^-23 gives a factor 2 of margin. The bound is per element
 * (no cancellation loophole). */
#define FOLD_REL_BOUND 0x1p-23

static const float EPS = 1e-5f;

/* Forward of the folded layer and of conv + BN in fp64, checked per output element. */
static void check_fold(int64_t P, int64_t c_out, int64_t per_out, int use_gamma, int use_beta,
                       tu_rng_t *r) {
  float *patches = tu_alloc(P * per_out, SN_DTYPE_F32), *w = tu_alloc(c_out * per_out, SN_DTYPE_F32);
  float *b = tu_alloc(c_out, SN_DTYPE_F32), *w0 = tu_alloc(c_out * per_out, SN_DTYPE_F32);
  float *b0 = tu_alloc(c_out, SN_DTYPE_F32), *gamma = tu_alloc(c_out, SN_DTYPE_F32);
  float *beta = tu_alloc(c_out, SN_DTYPE_F32), *rm = tu_alloc(c_out, SN_DTYPE_F32);
  float *rv = tu_alloc(c_out, SN_DTYPE_F32);
  tu_fill_normal(patches, P * per_out, SN_DTYPE_F32, 0.5, 1.0, r);
  tu_fill_normal(w, c_out * per_out, SN_DTYPE_F32, 0.0, 0.3, r);
  tu_fill_normal(b, c_out, SN_DTYPE_F32, 0.1, 0.5, r);
  for (int64_t c = 0; c < c_out; c++) {
    gamma[c] = (float)(0.5 + tu_rng_uniform(r));
    beta[c] = (float)(tu_rng_uniform(r) - 0.5);
    rm[c] = (float)tu_rng_normal(r);
    rv[c] = (float)(0.01 + 3.0 * tu_rng_uniform(r));
  }
  memcpy(w0, w, (size_t)(c_out * per_out) * 4);
  memcpy(b0, b, (size_t)c_out * 4);
  const float *gm = use_gamma ? gamma : NULL, *bt = use_beta ? beta : NULL;
  ck_assert_int_eq(sn_fold_batchnorm(w, b, gm, bt, rm, rv, c_out, per_out, EPS), SN_OK);
  for (int64_t c = 0; c < c_out; c++) {
    /* the folded values are the fp64 formula rounded once */
    const double k = (gm ? gm[c] : 1.0) / sqrt((double)rv[c] + (double)EPS);
    for (int64_t i = 0; i < per_out; i++)
      TU_CHECK(w[c * per_out + i] == (float)((double)w0[c * per_out + i] * k),
               "w'[%lld, %lld] = %.9g, want %.9g", (long long)c, (long long)i,
               (double)w[c * per_out + i], (double)(float)((double)w0[c * per_out + i] * k));
    const double bf = ((double)b0[c] - rm[c]) * k + (bt ? bt[c] : 0.0);
    TU_CHECK(b[c] == (float)bf, "b'[%lld] = %.9g, want %.9g", (long long)c, (double)b[c], bf);
    /* conv + BN_eval vs the folded conv, every output of this channel */
    for (int64_t p = 0; p < P; p++) {
      double z = b0[c], zf = b[c], mag = fabs(b[c]);
      for (int64_t i = 0; i < per_out; i++) {
        z += (double)patches[p * per_out + i] * w0[c * per_out + i];
        zf += (double)patches[p * per_out + i] * w[c * per_out + i];
        mag += fabs((double)patches[p * per_out + i] * w[c * per_out + i]);
      }
      const double bn = (z - rm[c]) / sqrt((double)rv[c] + (double)EPS) * (gm ? gm[c] : 1.0) +
                        (bt ? bt[c] : 0.0);
      TU_CHECK(fabs(zf - bn) <= FOLD_REL_BOUND * mag + 1e-300,
               "P=%lld c_out=%lld per_out=%lld: out[%lld, %lld] folded %.17g vs conv+BN %.17g",
               (long long)P, (long long)c_out, (long long)per_out, (long long)p, (long long)c, zf, bn);
    }
  }
  ck_assert(1);
  free(patches), free(w), free(b), free(w0), free(b0), free(gamma), free(beta), free(rm), free(rv);
}

/* Conv (3×3 over 7 input channels: per_out 63), linear (per_out 1, 65), many channels. */
START_TEST(test_fold_equals_conv_bn) {
  static const int64_t shapes[][3] = {{50, 16, 63}, {10, 1, 1}, {7, 65, 65}, {3, 300, 27},
                                      {5, 2, 4096}};
  tu_rng_t r;
  tu_rng_seed(&r, 31);
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int g = 0; g < 2; g++)
      for (int b = 0; b < 2; b++) check_fold(shapes[i][0], shapes[i][1], shapes[i][2], g, b, &r);
}
END_TEST

/* A large fold (parallel path) equals the sequential formula bit for bit (checked above per
 * element) and a zero bias with mean 0, var 1 − eps, gamma 1, beta 0 leaves w unchanged. */
START_TEST(test_fold_identity_and_large) {
  tu_rng_t r;
  tu_rng_seed(&r, 32);
  check_fold(2, 512, 1152, 1, 1, &r); /* 589824 weights: parallel */
  const int64_t c_out = 4, per_out = 9;
  float w[36], w0[36], b[4] = {0, 0, 0, 0}, rm[4] = {0, 0, 0, 0}, rv[4];
  for (int i = 0; i < 36; i++) w[i] = w0[i] = (float)(i - 17) * 0.25f;
  for (int c = 0; c < 4; c++) rv[c] = 1.0f; /* k = 1/√(1 + eps): not 1, so compare to formula */
  ck_assert_int_eq(sn_fold_batchnorm(w, b, NULL, NULL, rm, rv, c_out, per_out, EPS), SN_OK);
  const double k = 1.0 / sqrt(1.0 + (double)EPS);
  for (int i = 0; i < 36; i++) ck_assert(w[i] == (float)((double)w0[i] * k));
  for (int c = 0; c < 4; c++) ck_assert(b[c] == 0.0f);
}
END_TEST

typedef struct {
  float w[12], b[3];
} outs_t;

/* A NaN running_var (running statistics of a run that met NaN data) is not an error: that
 * channel's w and b become NaN, the other channels are folded as usual (as PyTorch). */
START_TEST(test_fold_nan_var) {
  float w[3 * 2] = {1, 2, 3, 4, 5, 6}, b[3] = {1, 1, 1};
  const float rm[3] = {0, 0, 0}, rv[3] = {1, NAN, 3};
  ck_assert_int_eq(sn_fold_batchnorm(w, b, NULL, NULL, rm, rv, 3, 2, EPS), SN_OK);
  for (int c = 0; c < 3; c++) {
    const double k = 1.0 / sqrt((double)rv[c] + (double)EPS);
    for (int i = 0; i < 2; i++) {
      const double want = (double)(2 * c + i + 1) * k;
      const float got = w[2 * c + i];
      TU_CHECK(c == 1 ? isnan(got) : fabs(got - want) <= FOLD_REL_BOUND * fabs(want),
               "w[%d, %d] = %g, want %g", c, i, (double)got, want);
    }
    TU_CHECK(c == 1 ? isnan(b[c]) : fabs(b[c] - k) <= FOLD_REL_BOUND * k, "b[%d] = %g, want %g", c,
             (double)b[c], k);
  }
}
END_TEST

START_TEST(test_fold_bad_inputs) {
  float g[3] = {1, 1, 1}, rm[3] = {0, 0, 0}, rv[3] = {1, 1, 1}, rv_neg[3] = {1, -1e-5f, 1};
  outs_t o, o0;
  memset(&o, 0xA5, sizeof o);
  memcpy(&o0, &o, sizeof o);
  const int64_t big = (int64_t)1 << 32;
  struct {
    sn_status_t st;
    float *w, *b;
    const float *rm, *rv;
    int64_t c_out, per_out;
    float eps;
    const char *what;
  } cases[] = {
      {SN_ERR_NULL_POINTER, NULL, o.b, rm, rv, 3, 4, EPS, "w NULL"},
      {SN_ERR_NULL_POINTER, o.w, NULL, rm, rv, 3, 4, EPS, "b NULL"},
      {SN_ERR_NULL_POINTER, o.w, o.b, NULL, rv, 3, 4, EPS, "running_mean NULL"},
      {SN_ERR_NULL_POINTER, o.w, o.b, rm, NULL, 3, 4, EPS, "running_var NULL"},
      {SN_ERR_INVALID_SIZE, o.w, o.b, rm, rv, 0, 4, EPS, "c_out 0"},
      {SN_ERR_INVALID_SIZE, o.w, o.b, rm, rv, -3, 4, EPS, "c_out -3"},
      {SN_ERR_INVALID_SIZE, o.w, o.b, rm, rv, 3, 0, EPS, "per_out 0"},
      {SN_ERR_OVERFLOW, o.w, o.b, rm, rv, big, big, EPS, "overflow"},
      {SN_ERR_INVALID_EPS, o.w, o.b, rm, rv, 3, 4, 0.0f, "eps 0"},
      {SN_ERR_INVALID_EPS, o.w, o.b, rm, rv, 3, 4, -1e-3f, "eps < 0"},
      {SN_ERR_INVALID_EPS, o.w, o.b, rm, rv, 3, 4, NAN, "eps NaN"},
      {SN_ERR_INVALID_EPS, o.w, o.b, rm, rv, 3, 4, INFINITY, "eps Inf"},
      {SN_ERR_INVALID_ARGUMENT, o.w, o.b, rm, rv_neg, 3, 4, EPS, "running_var < 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sn_status_t st = sn_fold_batchnorm(cases[i].w, cases[i].b, g, g, cases[i].rm, cases[i].rv,
                                       cases[i].c_out, cases[i].per_out, cases[i].eps);
    ck_assert_msg(st == cases[i].st, "%s: got %s, want %s", cases[i].what, sn_status_string(st),
                  sn_status_string(cases[i].st));
    ck_assert_msg(strncmp(sn_last_error(), "sn_fold_batchnorm", 17) == 0, "%s: message '%s'",
                  cases[i].what, sn_last_error());
    tu_assert_bitwise(&o, &o0, sizeof o, cases[i].what);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("fold");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_fold_equals_conv_bn);
  tcase_add_test(tc, test_fold_identity_and_large);
  tcase_add_test(tc, test_fold_bad_inputs);
  tcase_add_test(tc, test_fold_nan_var);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
