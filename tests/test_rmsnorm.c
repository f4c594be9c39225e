/*
 * test_rmsnorm.c — sn_rmsnorm_fwd, sn_rmsnorm_bwd and sn_add_rmsnorm_fwd against fp64
 * references written here: every shape of the issue in f32, bf16 and f16, with and without
 * gamma; the fp64 analytic gradient against central finite differences; adversarial rows (zero
 * rows, |mean| ≫ σ, bf16/f16 near 6e4); NaN-poisoned outputs; bad input; bitwise determinism
 * over thread counts; in-place calls.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The huge scratch request of the SN_ERR_ALLOC case must come back as NULL under ASan too (the
 * runtime looks this hook up dynamically, hence default visibility). */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static const int64_t ROWS[] = {1, 3, 1000};
static const int64_t DS[] = {1, 2, 3, 7, 64, 65, 4096};
#define NROWS (int64_t)(sizeof ROWS / sizeof ROWS[0])
#define ND (int64_t)(sizeof DS / sizeof DS[0])
static const float EPS = 1e-5f;

/* bf16/f16 dx is rounded once to the dtype: at most half an ulp (2^-9, 2^-12 relative) per
 * element, so normwise at most that; one ulp (2^-8, 2^-11) leaves room for the f32 arithmetic
 * before the rounding. */
#define TOL_BWD_BF16 0x1p-8
#define TOL_BWD_F16 0x1p-11

/* ---- helpers ------------------------------------------------------------------------------ */

static double bwd_tol(sn_dtype_t dt) {
  return dt == SN_DTYPE_F32 ? TU_RTOL_F32_BWD : dt == SN_DTYPE_BF16 ? TOL_BWD_BF16 : TOL_BWD_F16;
}

/* The gradients are compared with tu_assert_rel_scaled. The RMSNorm gradient projects rstd·g
 * onto the complement of x̂ = x·rstd: for d = 1 almost all of it cancels (dx ≈ rstd·g·eps/x²) and
 * any f32 computation from the saved f32 rstd errs relative to rstd·g, not to dx. `scale` is
 * ||rstd·g||, the size of the terms; for d ≥ 2 it is within a small factor of ||ref||. */

/* rstd of bf16/f16 rows: their sum of squares is f32 blocks added in fp64 (< 2^-19.9 relative,
 * sn__row_sumsq_lowp), so rstd errs by < 2^-20.9 before its f32 rounding (2.4 f32 ulps on
 * rows of two alternating values): 2^-20 relative. f32 rows: tu_assert_stat. */
#define TOL_RSTD_LOWP 0x1p-20
static void assert_rstd(float got, double ref, sn_dtype_t dt, int64_t r) {
  if (dt == SN_DTYPE_F32) {
    tu_assert_stat(got, ref, 0.0, "rstd", r);
    return;
  }
  TU_CHECK(fabs((double)got - ref) <= TOL_RSTD_LOWP * fabs(ref), "rstd (%s) row %lld: %.9g, reference %.9g",
           tu_dtype_name[dt], (long long)r, (double)got, ref);
}

/* ---- fp64 references ------------------------------------------------------------------------ */

/* RMSNorm forward of x [rows, d] in fp64. rstd may be NULL. There is no beta: the bf16/f16
 * bound's scale |x̂·gamma| is |y|, which tu_assert_fwd takes for a NULL scale (1 ulp of y). */
static void ref_fwd(double *y, double *rstd, const double *x, const float *gamma, int64_t rows,
                    int64_t d, double eps) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * d;
    double ms = 0.0;
    for (int64_t i = 0; i < d; i++) ms += xr[i] * xr[i];
    double rs = 1.0 / sqrt(ms / (double)d + eps);
    for (int64_t i = 0; i < d; i++) y[r * d + i] = xr[i] * rs * (gamma ? gamma[i] : 1.0);
    if (rstd) rstd[r] = rs;
  }
}

/* Analytic RMSNorm gradient in fp64, with the exact rstd of x:
 * dx = rstd·g − rstd³·x·mean(g·x), dgamma = Σ dy·x·rstd. Returns ||rstd·g||. */
static double ref_bwd(double *dx, double *dgamma, const double *dy, const double *x,
                      const float *gamma, int64_t rows, int64_t d, double eps) {
  double scale = 0.0;
  for (int64_t i = 0; i < d; i++) dgamma[i] = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * d, *dyr = dy + r * d;
    double ms = 0.0, mgx = 0.0;
    for (int64_t i = 0; i < d; i++) ms += xr[i] * xr[i];
    double rs = 1.0 / sqrt(ms / (double)d + eps);
    for (int64_t i = 0; i < d; i++) {
      double g = dyr[i] * (gamma ? gamma[i] : 1.0);
      mgx += g * xr[i];
      scale += rs * g * rs * g;
      dgamma[i] += dyr[i] * xr[i] * rs;
    }
    mgx /= (double)d;
    for (int64_t i = 0; i < d; i++) {
      double g = dyr[i] * (gamma ? gamma[i] : 1.0);
      dx[r * d + i] = rs * g - rs * rs * rs * xr[i] * mgx;
    }
  }
  return sqrt(scale);
}

/* ---- forward ------------------------------------------------------------------------------ */

/* Forward cases on one x = mean + std·N(0,1) rounded to dt, with and without gamma: y and rstd
 * poisoned, then checked element by element against ref_fwd. */
static void check_fwd(int64_t rows, int64_t d, sn_dtype_t dt, double mu, double sigma,
                      uint64_t seed) {
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  const int64_t n = rows * d;
  void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, mu, sigma, &rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *rstd = malloc((size_t)rows * sizeof(float));
  double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double));
  double *rr = malloc((size_t)rows * sizeof(double));
  for (int has_g = 0; has_g < 2; has_g++) {
    const float *g = has_g ? gamma : NULL;
    char what[160];
    snprintf(what, sizeof what, "rmsnorm_fwd rows=%lld d=%lld gamma=%d mean=%g", (long long)rows,
             (long long)d, has_g, mu);
    tu_poison(y, n, dt);
    tu_poison_f32(rstd, rows);
    sn_status_t st = sn_rmsnorm_fwd(y, rstd, x, g, rows, d, EPS, dt);
    ck_assert_msg(st == SN_OK, "%s: %s %s", what, sn_status_string(st), sn_last_error());
    ref_fwd(yr, rr, xd, g, rows, d, EPS);
    tu_assert_fwd(y, dt, yr, NULL, n, what);
    for (int64_t r = 0; r < rows; r++) assert_rstd(rstd[r], rr[r], dt, r);
  }
  free(x), free(y), free(gamma), free(rstd), free(xd), free(yr), free(rr);
}

/* bf16 rows whose sum of squares leaves the range where the f32 blocks of the bf16 statistics
 * hold (sn__row_sumsq_lowp): squares beyond FLT_MAX (σ = 2^100; one value 2^70 among O(1)
 * ones) and squares subnormal in f32 (σ = 2^-74, eps 2^-149 so that they matter). Each row must
 * take the fp64 sum: y within 1 ulp, rstd as assert_rstd; in the fused kernel (a zero
 * residual: its add in the same first pass) bitwise the same. With the fp64 fallback removed
 * the tiny rows are 2 ulp off and the huge ones 0 (rstd = 0 from an infinite sum). */
START_TEST(test_lowp_sum_range) {
  static const double SIGMA[] = {0x1p100, 1.0, 0x1p-74};
  const int64_t rows = 3, d = 1000, n = rows * d;
  const sn_dtype_t dt = SN_DTYPE_BF16;
  for (int k = 0; k < 3; k++) {
    const float eps = k == 2 ? 0x1p-149f : EPS;
    tu_rng_t rng;
    tu_rng_seed(&rng, 1500 + (uint64_t)k);
    void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt), *zero = tu_alloc(n, dt);
    void *sum = tu_alloc(n, dt), *y2 = tu_alloc(n, dt);
    tu_fill_normal(x, n, dt, 0.0, SIGMA[k], &rng);
    if (k == 1) tu_set(x, d + 17, 0x1p70, dt); /* one square beyond FLT_MAX in row 1 */
    for (int64_t i = 0; i < n; i++) tu_set(zero, i, 0.0, dt);
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), rstd[3], rstd2[3];
    double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double)), rr[3];
    char what[96];
    snprintf(what, sizeof what, "rmsnorm_fwd bf16 sigma=%g eps=%g", SIGMA[k], (double)eps);
    tu_poison(y, n, dt);
    ck_assert_int_eq(sn_rmsnorm_fwd(y, rstd, x, gamma, rows, d, eps, dt), SN_OK);
    ref_fwd(yr, rr, xd, gamma, rows, d, (double)eps);
    tu_assert_fwd(y, dt, yr, NULL, n, what);
    for (int64_t r = 0; r < rows; r++) assert_rstd(rstd[r], rr[r], dt, r);
    tu_poison(y2, n, dt);
    ck_assert_int_eq(sn_add_rmsnorm_fwd(y2, sum, rstd2, x, zero, gamma, rows, d, eps, dt), SN_OK);
    tu_assert_bitwise(y2, y, (size_t)(n * 2), "fused y");
    tu_assert_bitwise(rstd2, rstd, sizeof rstd, "fused rstd");
    free(x), free(y), free(zero), free(sum), free(y2), free(gamma), free(xd), free(yr);
  }
}
END_TEST

/* Every rows × d of the issue, one dtype per loop index. */
START_TEST(test_fwd_shapes) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  for (int64_t a = 0; a < NROWS; a++)
    for (int64_t b = 0; b < ND; b++) check_fwd(ROWS[a], DS[b], dt, 0.5, 2.0, 100 + 10 * a + b);
}
END_TEST

/* |mean| ≫ σ (no cancellation in RMSNorm, but the rows are nearly constant) and mean 0, σ tiny:
 * within the forward bound. */
START_TEST(test_large_mean) {
  for (int64_t b = 0; b < ND; b++) {
    check_fwd(3, DS[b], SN_DTYPE_F32, 1e4, 1e-2, 300 + b);
    check_fwd(3, DS[b], SN_DTYPE_F32, 0.0, 1e-3, 310 + b);
    check_fwd(3, DS[b], SN_DTYPE_BF16, -1e4, 200.0, 320 + b);
    check_fwd(3, DS[b], SN_DTYPE_F16, 2000.0, 2.0, 330 + b);
  }
}
END_TEST

/* All-zero rows: y == 0 exactly, rstd == 1/√eps, no NaN; the backward stays finite and matches
 * the analytic gradient. Constant non-zero rows follow the reference. */
START_TEST(test_constant_rows) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  const double vals[] = {0.0, -3.5, 1e4, 0.0, 65504.0};
  const int64_t rows = 5, d = 65, n = rows * d;
  tu_rng_t rng;
  tu_rng_seed(&rng, 7);
  void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < d; i++) tu_set(x, r * d + i, vals[r], dt);
  tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), rstd[5], dgamma[65];
  tu_poison(y, n, dt);
  tu_poison_f32(rstd, rows);
  ck_assert_int_eq(sn_rmsnorm_fwd(y, rstd, x, gamma, rows, d, EPS, dt), SN_OK);
  double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double));
  ref_fwd(yr, NULL, xd, gamma, rows, d, EPS);
  tu_assert_fwd(y, dt, yr, NULL, n, "constant rows");
  for (int64_t r = 0; r < rows; r += 3) { /* the zero rows */
    TU_CHECK(rstd[r] == (float)(1.0 / sqrt((double)EPS)), "zero row %lld: rstd %g", (long long)r,
          (double)rstd[r]);
    for (int64_t i = 0; i < d; i++)
      TU_CHECK(tu_get(y, r * d + i, dt) == 0.0, "zero row %lld: y[%lld] = %g", (long long)r,
            (long long)i, tu_get(y, r * d + i, dt));
  }
  tu_poison(dx, n, dt);
  tu_poison_f32(dgamma, d);
  ck_assert_int_eq(sn_rmsnorm_bwd(dx, dgamma, dy, x, rstd, gamma, rows, d, dt), SN_OK);
  double *dyd = tu_to_f64(dy, n, dt), *dxr = malloc((size_t)n * sizeof(double)), dgr[65];
  double scale = ref_bwd(dxr, dgr, dyd, xd, gamma, rows, d, EPS);
  tu_assert_rel_scaled(dx, dt, dxr, n, scale, bwd_tol(dt), "constant rows dx");
  tu_assert_rel(dgamma, SN_DTYPE_F32, dgr, d, TU_RTOL_F32_BWD, "constant rows dgamma");
  free(x), free(y), free(dy), free(dx), free(gamma), free(xd), free(yr), free(dyd), free(dxr);
}
END_TEST

/* bf16/f16 inputs near 6e4: Σx² ≈ 3.6e9·d overflows f16 and would lose bf16 precision; finite,
 * correct outputs. Row 0: 6e4 ± 2000; row 1: ±6e4 alternating; row 2: all near 65504. */
START_TEST(test_near_half_max) {
  const sn_dtype_t dt = _i == 0 ? SN_DTYPE_BF16 : SN_DTYPE_F16;
  const int64_t rows = 3, d = 4096, n = rows * d;
  tu_rng_t rng;
  tu_rng_seed(&rng, 11);
  void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt);
  for (int64_t i = 0; i < d; i++) {
    tu_set(x, i, fmin(60000.0 + 2000.0 * tu_rng_normal(&rng), 65504.0), dt);
    tu_set(x, d + i, (i % 2 ? 1 : -1) * fmin(60000.0 + 500.0 * tu_rng_normal(&rng), 65504.0), dt);
    tu_set(x, 2 * d + i, 65504.0 - 64.0 * (double)tu_rng_int(&rng, 0, 8), dt);
  }
  tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), rstd[3], *dgamma = malloc(d * sizeof(float));
  tu_poison(y, n, dt);
  ck_assert_int_eq(sn_rmsnorm_fwd(y, rstd, x, gamma, rows, d, EPS, dt), SN_OK);
  double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double));
  ref_fwd(yr, NULL, xd, gamma, rows, d, EPS);
  tu_assert_fwd(y, dt, yr, NULL, n, "near 6e4 forward");

  tu_poison(dx, n, dt);
  tu_poison_f32(dgamma, d);
  ck_assert_int_eq(sn_rmsnorm_bwd(dx, dgamma, dy, x, rstd, gamma, rows, d, dt), SN_OK);
  double *dyd = tu_to_f64(dy, n, dt), *dxr = malloc((size_t)n * sizeof(double));
  double *dgr = malloc(d * sizeof(double));
  double scale = ref_bwd(dxr, dgr, dyd, xd, gamma, rows, d, EPS);
  tu_assert_rel_scaled(dx, dt, dxr, n, scale, bwd_tol(dt), "near 6e4 dx");
  tu_assert_rel(dgamma, SN_DTYPE_F32, dgr, d, TU_RTOL_F32_BWD, "near 6e4 dgamma");
  free(x), free(y), free(dy), free(dx), free(gamma), free(dgamma);
  free(xd), free(yr), free(dyd), free(dxr), free(dgr);
}
END_TEST

/* ---- the bf16 forward, bitwise ------------------------------------------------------------ */

/* Models of what the bf16 forward is documented to compute (rmsnorm.c, rownorm.h), written
 * here element by element in the plain order: the kernel reads 32 values at a time as even and
 * odd halves, and its elementwise map (gamma in pairs) and its f32 blocks of squares must come
 * out as in element order. (The order in which its fp64 lanes meet is seldom visible in an f32
 * rstd: sums of a few f32 values are exact in fp64.) */
static float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint16_t f32_to_bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static int bf16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

/* Σ x² of a bf16 row as documented at sn__row_sumsq_lowp: element i in fp64 lane i % 32, each
 * lane adding blocks of 16 squares in f32; the lanes added pairwise (16, 8, 4, 2 apart, then
 * the last two); a total outside [d·2^-120, 2^127] (or NaN) recomputed with fp64 squares in the
 * same lanes. */
static double model_sumsq_bf16(const uint16_t *x, int64_t d) {
  enum { LANES = 32, BLOCK = 16 };
  double acc[LANES] = {0};
  int64_t i = 0;
  while (i + LANES <= d) {
    const int64_t end = d - i > LANES * BLOCK ? i + LANES * BLOCK : d;
    float b[LANES] = {0};
    for (; i + LANES <= end; i += LANES)
      for (int k = 0; k < LANES; k++) {
        const float v = bf16_bits_to_f32(x[i + k]), sq = v * v;
        b[k] = b[k] + sq;
      }
    for (int k = 0; k < LANES; k++) acc[k] += (double)b[k];
  }
  for (int k = 0; i < d; i++, k++) acc[k] += (double)bf16_bits_to_f32(x[i]) * bf16_bits_to_f32(x[i]);
  double t[LANES];
  memcpy(t, acc, sizeof t);
  for (int w = LANES / 2; w >= 2; w /= 2)
    for (int k = 0; k < w; k++) t[k] += t[k + w];
  const double total = t[0] + t[1];
  if (total >= (double)d * 0x1p-120 && total <= 0x1p127) return total;
  memset(acc, 0, sizeof acc);
  for (int64_t j = 0; j < d; j++) {
    const double v = bf16_bits_to_f32(x[j]);
    acc[j % LANES] += v * v;
  }
  for (int w = LANES / 2; w >= 2; w /= 2)
    for (int k = 0; k < w; k++) acc[k] += acc[k + w];
  return acc[0] + acc[1];
}

/* y (bf16 rows [rows, d]) and rstd bitwise the model from the normalized rows xs: rstd =
 * (float)(1/√(Σx²/d + eps)), y[i] = bf16((x[i]·rstd)·gamma[i]) in f32; a NaN expected must be
 * a NaN (its payload depends on operand order). */
static void assert_bf16_model(const uint16_t *y, const float *rstd, const uint16_t *xs,
                              const float *gamma, int64_t rows, int64_t d, float eps,
                              const char *what) {
  for (int64_t r = 0; r < rows; r++) {
    const float s = (float)(1.0 / sqrt(model_sumsq_bf16(xs + r * d, d) / (double)d + (double)eps));
    TU_CHECK(memcmp(&s, &rstd[r], sizeof s) == 0, "%s: rstd[%lld] = %a, want %a", what,
             (long long)r, (double)rstd[r], (double)s);
    for (int64_t i = 0; i < d; i++) {
      float t = bf16_bits_to_f32(xs[r * d + i]) * s;
      if (gamma != NULL) t = t * gamma[i];
      const uint16_t want = f32_to_bf16_rne(t), got = y[r * d + i];
      TU_CHECK(bf16_is_nan(want) ? bf16_is_nan(got) : got == want,
               "%s: y[%lld][%lld] = 0x%04x, want 0x%04x", what, (long long)r, (long long)i,
               got, want);
    }
  }
}

/* The bf16 forward and fused forward against the models above, for d around the 32-value pair
 * blocks and the 512-value f32 blocks (tails of every length class), with and without gamma, in
 * place; rows: random, with subnormal and signed-zero values and exact ties of the rounding, a
 * NaN, an inf, values whose squares leave the f32 range (the fp64 recomputation). */
START_TEST(test_bf16_bitwise) {
  static const int64_t D[] = {1, 5, 31, 32, 33, 63, 64, 100, 511, 512, 543, 1024, 1057, 4096};
  const int64_t rows = 6;
  for (size_t k = 0; k < sizeof D / sizeof D[0]; k++) {
    const int64_t d = D[k], n = rows * d;
    tu_rng_t rng;
    tu_rng_seed(&rng, 2100 + (uint64_t)k);
    uint16_t *x = tu_alloc(n, SN_DTYPE_BF16), *res = tu_alloc(n, SN_DTYPE_BF16);
    uint16_t *y = tu_alloc(n, SN_DTYPE_BF16), *sum = tu_alloc(n, SN_DTYPE_BF16);
    uint16_t *buf = tu_alloc(n, SN_DTYPE_BF16);
    tu_fill_normal(x, n, SN_DTYPE_BF16, 0.2, 1.5, &rng);
    tu_fill_normal(res, n, SN_DTYPE_BF16, -0.3, 1.0, &rng);
    for (int64_t i = 0; i < d; i += 3) x[i] = (uint16_t)(0x0001u + (uint16_t)(i % 50)); /* subnormal */
    x[d - 1] = 0x8000u;                                                 /* -0 */
    x[2 * d + d / 2] = 0x7f81u;                                         /* signaling NaN */
    x[3 * d + d / 3] = 0xff80u;                                         /* -inf */
    for (int64_t i = 0; i < d; i++) x[4 * d + i] = (uint16_t)(0x6f80u + (uint16_t)(i % 7)); /* ~2^96 */
    for (int64_t i = 0; i < d; i++) x[5 * d + i] = (uint16_t)(0x0f80u + (uint16_t)(i % 5)); /* ~2^-96 */
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), rs[6], rs2[6];
    for (int g = 0; g < 2; g++) {
      const float *gm = g ? gamma : NULL;
      char what[96];
      snprintf(what, sizeof what, "rmsnorm_fwd bf16 d=%lld gamma=%d", (long long)d, g);
      tu_poison(y, n, SN_DTYPE_BF16);
      ck_assert_int_eq(sn_rmsnorm_fwd(y, rs, x, gm, rows, d, EPS, SN_DTYPE_BF16), SN_OK);
      assert_bf16_model(y, rs, x, gm, rows, d, EPS, what);
      memcpy(buf, x, (size_t)n * 2); /* in place: the same bits */
      ck_assert_int_eq(sn_rmsnorm_fwd(buf, rs2, buf, gm, rows, d, EPS, SN_DTYPE_BF16), SN_OK);
      tu_assert_bitwise(buf, y, (size_t)n * 2, what);
      tu_assert_bitwise(rs2, rs, sizeof rs, what);
      snprintf(what, sizeof what, "add_rmsnorm_fwd bf16 d=%lld gamma=%d", (long long)d, g);
      tu_poison(y, n, SN_DTYPE_BF16);
      tu_poison(sum, n, SN_DTYPE_BF16);
      ck_assert_int_eq(
          sn_add_rmsnorm_fwd(y, sum, rs, x, res, gm, rows, d, EPS, SN_DTYPE_BF16), SN_OK);
      tu_assert_residual_sum(sum, x, res, n, SN_DTYPE_BF16, what);
      assert_bf16_model(y, rs, sum, gm, rows, d, EPS, what);
    }
    free(x), free(res), free(y), free(sum), free(buf), free(gamma);
  }
}
END_TEST

/* ---- fused residual add --------------------------------------------------------------------- */

/* sum_out == round_dtype(x + residual) with the add in f32; y == RMSNorm(sum_out) within the
 * forward bound; (y, rstd) bitwise equal to sn_rmsnorm_fwd on sum_out; sum_out == x and
 * sum_out == residual give the same bits. */
static void check_add(int64_t rows, int64_t d, sn_dtype_t dt, int has_g, uint64_t seed) {
  char what[160];
  snprintf(what, sizeof what, "add_rmsnorm_fwd rows=%lld d=%lld gamma=%d", (long long)rows,
           (long long)d, has_g);
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  const int64_t n = rows * d;
  const size_t bytes = (size_t)n * (size_t)sn_dtype_size(dt);
  void *x = tu_alloc(n, dt), *res = tu_alloc(n, dt), *sum = tu_alloc(n, dt), *y = tu_alloc(n, dt);
  void *y2 = tu_alloc(n, dt), *buf = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, 0.3, 1.0, &rng);
  tu_fill_normal(res, n, dt, -0.1, 2.0, &rng);
  float *gamma = has_g ? tu_random_f32(d, 1.0, 0.5, &rng) : NULL;
  float *rs = malloc(rows * sizeof(float)), *rs2 = malloc(rows * sizeof(float));
  tu_poison(sum, n, dt);
  tu_poison(y, n, dt);
  tu_poison_f32(rs, rows);
  sn_status_t st = sn_add_rmsnorm_fwd(y, sum, rs, x, res, gamma, rows, d, EPS, dt);
  ck_assert_msg(st == SN_OK, "%s: %s", what, sn_last_error());

  double *sref = malloc((size_t)n * sizeof(double)), *yr = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++) {
    float s = (float)tu_get(x, i, dt) + (float)tu_get(res, i, dt);
    sref[i] = tu_round(s, dt);
    TU_CHECK(tu_get(sum, i, dt) == sref[i], "%s: sum_out[%lld] = %.9g, want %.9g", what,
          (long long)i, tu_get(sum, i, dt), sref[i]);
  }
  ref_fwd(yr, NULL, sref, gamma, rows, d, EPS);
  tu_assert_fwd(y, dt, yr, NULL, n, what);

  /* the unfused forward on sum_out gives the same bits */
  tu_poison(y2, n, dt);
  ck_assert_int_eq(sn_rmsnorm_fwd(y2, rs2, sum, gamma, rows, d, EPS, dt), SN_OK);
  tu_assert_bitwise(y, y2, bytes, "fused y vs sn_rmsnorm_fwd(sum_out)");
  tu_assert_bitwise(rs, rs2, rows * sizeof(float), "fused rstd");

  /* sum_out aliasing x, then residual */
  for (int alias = 0; alias < 2; alias++) {
    memcpy(buf, alias == 0 ? x : res, bytes);
    tu_poison(y2, n, dt);
    st = alias == 0 ? sn_add_rmsnorm_fwd(y2, buf, rs2, buf, res, gamma, rows, d, EPS, dt)
                    : sn_add_rmsnorm_fwd(y2, buf, rs2, x, buf, gamma, rows, d, EPS, dt);
    ck_assert_int_eq(st, SN_OK);
    tu_assert_bitwise(buf, sum, bytes, alias == 0 ? "sum_out == x" : "sum_out == residual");
    tu_assert_bitwise(y2, y, bytes, "aliased sum_out: y");
    tu_assert_bitwise(rs2, rs, rows * sizeof(float), "aliased sum_out: rstd");
  }
  free(x), free(res), free(sum), free(y), free(y2), free(buf), free(gamma);
  free(rs), free(rs2), free(sref), free(yr);
}

START_TEST(test_add_fwd) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  for (int64_t a = 0; a < NROWS; a++)
    for (int64_t b = 0; b < ND; b++)
      check_add(ROWS[a], DS[b], dt, (a + b) % 2 == 0, 500 + 10 * a + b);
}
END_TEST

/* The fused kernel's first pass (the add, its rounding to the dtype, the row sums, all in one
 * pass for f32 and bf16) on rows that take every branch after it: a sum that cancels |x| ≫ σ
 * (row 0), a sorted row, whose first values are not typical of it (row 1: the two-pass
 * statistics where the one-pass ones would cancel), a NaN in the residual (row 2) and sums
 * beyond the dtype's range (row 3): tu_fill_add_adversarial. For d ∈ {1, 33, 1000}:
 * sum_out == round_dtype(x + residual) (NaN where that is NaN), and the outputs bitwise those
 * of the unfused forward on sum_out. */
START_TEST(test_add_adversarial) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  static const int64_t D[] = {1, 33, 1000};
  for (int k = 0; k < 3; k++) {
    const int64_t rows = 4, d = D[k], n = rows * d;
    const size_t bytes = (size_t)n * (size_t)sn_dtype_size(dt);
    tu_rng_t rng;
    tu_rng_seed(&rng, 1700 + (uint64_t)k);
    void *x = tu_alloc(n, dt), *res = tu_alloc(n, dt), *sum = tu_alloc(n, dt);
    void *y = tu_alloc(n, dt), *y2 = tu_alloc(n, dt);
    tu_fill_add_adversarial(x, res, d, dt, &rng);
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng);
    float r[4], r2[4];
    for (int gb = 0; gb < 2; gb++) {
      const float *g = gb & 1 ? gamma : NULL;
      char what[128];
      snprintf(what, sizeof what, "add_rmsnorm_fwd %s d=%lld gamma=%d", tu_dtype_name[dt],
               (long long)d, g != NULL);
      tu_poison(sum, n, dt);
      tu_poison(y, n, dt);
      ck_assert_int_eq(sn_add_rmsnorm_fwd(y, sum, r, x, res, g, rows, d, EPS, dt), SN_OK);
      tu_assert_residual_sum(sum, x, res, n, dt, what);
      tu_poison(y2, n, dt);
      ck_assert_int_eq(sn_rmsnorm_fwd(y2, r2, sum, g, rows, d, EPS, dt), SN_OK);
      tu_assert_bitwise(y, y2, bytes, what);
      tu_assert_bitwise(r, r2, sizeof r, what);
    }
    free(x), free(res), free(sum), free(y), free(y2), free(gamma);
  }
}
END_TEST

/* ---- backward ------------------------------------------------------------------------------- */

/* Backward cases on one (x, dy), with and without gamma: rstd from sn_rmsnorm_fwd; dx, dgamma
 * poisoned, then checked against the analytic fp64 gradient of the (dtype-rounded) inputs. Also:
 * dgamma NULL leaves dx's bits unchanged. */
static void check_bwd(int64_t rows, int64_t d, sn_dtype_t dt, double mu, double sigma,
                      uint64_t seed) {
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  const int64_t n = rows * d;
  const size_t bytes = (size_t)n * (size_t)sn_dtype_size(dt);
  void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt), *dx2 = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, mu, sigma, &rng);
  tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *rstd = malloc(rows * sizeof(float));
  float *dg = malloc(d * sizeof(float));
  double *xd = tu_to_f64(x, n, dt), *dyd = tu_to_f64(dy, n, dt),
      *dxr = malloc((size_t)n * sizeof(double));
  double *dgr = malloc(d * sizeof(double));
  for (int has_g = 0; has_g < 2; has_g++) {
    const float *g = has_g ? gamma : NULL;
    char what[160];
    snprintf(what, sizeof what, "rmsnorm_bwd rows=%lld d=%lld gamma=%d mean=%g",
             (long long)rows, (long long)d, has_g, mu);
    ck_assert_int_eq(sn_rmsnorm_fwd(dx, rstd, x, g, rows, d, EPS, dt), SN_OK);
    tu_poison(dx, n, dt);
    tu_poison_f32(dg, d);
    sn_status_t st = sn_rmsnorm_bwd(dx, dg, dy, x, rstd, g, rows, d, dt);
    ck_assert_msg(st == SN_OK, "%s: %s", what, sn_last_error());
    double scale = ref_bwd(dxr, dgr, dyd, xd, g, rows, d, EPS);
    tu_assert_rel_scaled(dx, dt, dxr, n, scale, bwd_tol(dt), what);
    tu_assert_rel(dg, SN_DTYPE_F32, dgr, d, TU_RTOL_F32_BWD, "dgamma");

    tu_poison(dx2, n, dt);
    ck_assert_int_eq(sn_rmsnorm_bwd(dx2, NULL, dy, x, rstd, g, rows, d, dt), SN_OK);
    tu_assert_bitwise(dx2, dx, bytes, "dx with dgamma NULL");
  }
  free(x), free(dy), free(dx), free(dx2), free(gamma), free(rstd), free(dg);
  free(xd), free(dyd), free(dxr), free(dgr);
}

START_TEST(test_bwd_shapes) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  for (int64_t a = 0; a < NROWS; a++)
    for (int64_t b = 0; b < ND; b++) check_bwd(ROWS[a], DS[b], dt, 0.5, 2.0, 700 + 10 * a + b);
}
END_TEST

/* The bf16 backward is the f32 backward on the widened rows, dx rounded to bf16 (rmsnorm.c:
 * one row body for both): dx and dgamma bitwise those of sn_rmsnorm_bwd in f32 on the same
 * values (a NaN expected must be a NaN), for d around the 32-value pair blocks, with and
 * without gamma and dgamma, in place, on rows of every kind that leave the f32 blocks or the
 * f32 partials, between ordinary rows of the same run of SN_PART_ROWS partials: dy near FLT_MAX
 * (g·x beyond it: fp64 row), dgamma terms below the f32 partials' range (x subnormal, rstd
 * large), beyond it (dy and x 2^62), a NaN, an inf; and with a gamma holding a NaN whose
 * payload bits are all set, which every row must keep as NaN (the bf16 blocks narrow dx without
 * the NaN case, as such rows never reach them). */
START_TEST(test_bwd_bf16_is_f32) {
  static const int64_t D[] = {1, 31, 32, 33, 64, 100, 1057};
  const int64_t rows = 24;
  for (size_t k = 0; k < sizeof D / sizeof D[0]; k++) {
    const int64_t d = D[k], n = rows * d;
    tu_rng_t rng;
    tu_rng_seed(&rng, 2300 + (uint64_t)k);
    uint16_t *x = tu_alloc(n, SN_DTYPE_BF16), *dy = tu_alloc(n, SN_DTYPE_BF16);
    uint16_t *dx = tu_alloc(n, SN_DTYPE_BF16), *buf = tu_alloc(n, SN_DTYPE_BF16);
    float *xf = tu_alloc(n, SN_DTYPE_F32), *dyf = tu_alloc(n, SN_DTYPE_F32);
    float *dxf = tu_alloc(n, SN_DTYPE_F32), *rstd = malloc(rows * sizeof(float));
    float *dg = malloc((size_t)d * sizeof(float)), *dgf = malloc((size_t)d * sizeof(float));
    tu_fill_normal(x, n, SN_DTYPE_BF16, 0.1, 1.0, &rng);
    tu_fill_normal(dy, n, SN_DTYPE_BF16, 0.0, 1.0, &rng);
    for (int64_t r = 0; r < rows; r++) rstd[r] = (float)(0.5 + tu_rng_uniform(&rng));
    dy[3 * d] = 0x7f7fu;                                    /* row 3: dy = FLT_MAX-ish */
    for (int64_t i = 0; i < d; i++) x[5 * d + i] = 0x0003u; /* row 5: subnormal x */
    rstd[5] = 0x1p60f;
    x[9 * d] = 0x5e80u; /* row 9: x and dy 2^62 in different columns: terms to 2^124 */
    dy[9 * d + (d > 1)] = 0x5e80u;
    rstd[9] = 1.0f;
    dy[12 * d + d / 2] = 0x7fc1u;                           /* row 12: NaN */
    x[17 * d + d - 1] = 0xff80u;                            /* row 17: -inf */
    for (int64_t i = 0; i < n; i++) {
      xf[i] = (float)tu_get(x, i, SN_DTYPE_BF16);
      dyf[i] = (float)tu_get(dy, i, SN_DTYPE_BF16);
    }
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *gnan = tu_random_f32(d, 1.0, 0.5, &rng);
    const uint32_t nan_bits = 0x7fffffffu; /* rounded as a number: −0 (see test_bf16_nan_gamma) */
    memcpy(&gnan[d / 2], &nan_bits, sizeof nan_bits);
    for (int v = 0; v < 6; v++) { /* v 4, 5: gamma with a NaN (every dx NaN), 5 with dgamma */
      const float *g = v >= 4 ? gnan : v & 1 ? gamma : NULL;
      const int part = (v & 2) != 0 || v == 5;
      float *dgo = part ? dg : NULL, *dgfo = part ? dgf : NULL;
      char what[96];
      snprintf(what, sizeof what, "rmsnorm_bwd bf16 vs f32 d=%lld gamma=%d dgamma=%d",
               (long long)d, g != NULL, dgo != NULL);
      tu_poison(dx, n, SN_DTYPE_BF16);
      tu_poison_f32(dg, d);
      ck_assert_int_eq(sn_rmsnorm_bwd(dx, dgo, dy, x, rstd, g, rows, d, SN_DTYPE_BF16), SN_OK);
      ck_assert_int_eq(sn_rmsnorm_bwd(dxf, dgfo, dyf, xf, rstd, g, rows, d, SN_DTYPE_F32), SN_OK);
      for (int64_t i = 0; i < n; i++) {
        const uint16_t want = f32_to_bf16_rne(dxf[i]);
        TU_CHECK(bf16_is_nan(want) ? bf16_is_nan(dx[i]) : dx[i] == want,
                 "%s: dx[%lld] = 0x%04x, want 0x%04x", what, (long long)i, dx[i], want);
      }
      if (dgo != NULL)
        for (int64_t j = 0; j < d; j++)
          TU_CHECK(isnan(dgf[j]) ? isnan(dg[j]) : memcmp(&dg[j], &dgf[j], 4) == 0,
                   "%s: dgamma[%lld] = %a, want %a", what, (long long)j, (double)dg[j],
                   (double)dgf[j]);
      /* in place (dx == dy), the same dgamma request (which NaN a NaN row carries may differ
       * between the kernels with and without dgamma): the same bits */
      memcpy(buf, dy, (size_t)n * 2);
      ck_assert_int_eq(sn_rmsnorm_bwd(buf, dgo, buf, x, rstd, g, rows, d, SN_DTYPE_BF16), SN_OK);
      tu_assert_bitwise(buf, dx, (size_t)n * 2, what);
    }
    free(x), free(dy), free(dx), free(buf), free(xf), free(dyf), free(dxf), free(rstd);
    free(dg), free(dgf), free(gamma), free(gnan);
  }
}
END_TEST

/* Gradients near FLT_MAX that cancel: rows 0-3 (one reduction chunk of 256 rows) have
 * dy[:, 0] = +3e38, +3e38, −3e38, −3e38, the rest small. The f32 partials of dgamma would
 * overflow to inf at the second row; such rows must go to the fp64 partial, and dgamma and dx
 * match the fp64 reference. x rows [1, −1]. */
START_TEST(test_bwd_huge_dy) {
  const int64_t rows = 256, d = 2, n = rows * d;
  for (int id = 0; id < 2; id++) {
    const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
    tu_rng_t rng;
    tu_rng_seed(&rng, 950 + (uint64_t)id);
    void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt);
    tu_fill_huge_dy(x, dy, rows, dt, &rng);
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), rstd[256], dg[2];
    double *xd = tu_to_f64(x, n, dt), *dyd = tu_to_f64(dy, n, dt),
        *dxr = malloc((size_t)n * sizeof(double));
    double dgr[2];
    ck_assert_int_eq(sn_rmsnorm_fwd(dx, rstd, x, NULL, rows, d, EPS, dt), SN_OK);
    tu_poison(dx, n, dt);
    tu_poison_f32(dg, d);
    ck_assert_int_eq(sn_rmsnorm_bwd(dx, dg, dy, x, rstd, gamma, rows, d, dt), SN_OK);
    double scale = ref_bwd(dxr, dgr, dyd, xd, gamma, rows, d, EPS);
    tu_assert_rel_scaled(dx, dt, dxr, n, scale, bwd_tol(dt), "rmsnorm_bwd, dy near FLT_MAX");
    tu_assert_rel(dg, SN_DTYPE_F32, dgr, d, TU_RTOL_F32_BWD, "dgamma, dy near FLT_MAX");
    free(x), free(dy), free(dx), free(gamma), free(xd), free(dyd), free(dxr);
  }
}
END_TEST

/* Forward (for rstd) and backward on the given x, dy [rows, d] (dt), gamma and eps: dx and
 * dgamma poisoned, then against the fp64 analytic gradient (ref_bwd); with_dg 0: dgamma NULL
 * (for data whose dgamma is beyond the f32 range). */
static void check_bwd_case_dg(const void *x, const void *dy, const float *gamma, int64_t rows,
                              int64_t d, sn_dtype_t dt, float eps, int with_dg, const char *what) {
  const int64_t n = rows * d;
  void *dx = tu_alloc(n, dt);
  float *rstd = malloc((size_t)rows * sizeof(float)), *dg = malloc((size_t)d * sizeof(float));
  double *xd = tu_to_f64(x, n, dt), *dyd = tu_to_f64(dy, n, dt);
  double *dxr = malloc((size_t)n * sizeof(double)), *dgr = malloc((size_t)d * sizeof(double));
  ck_assert(rstd != NULL && dg != NULL && dxr != NULL && dgr != NULL);
  ck_assert_int_eq(sn_rmsnorm_fwd(dx, rstd, x, gamma, rows, d, eps, dt), SN_OK);
  tu_poison(dx, n, dt);
  tu_poison_f32(dg, d);
  sn_status_t st = sn_rmsnorm_bwd(dx, with_dg ? dg : NULL, dy, x, rstd, gamma, rows, d, dt);
  ck_assert_msg(st == SN_OK, "%s: %s", what, sn_last_error());
  double scale = ref_bwd(dxr, dgr, dyd, xd, gamma, rows, d, (double)eps);
  tu_assert_rel_scaled(dx, dt, dxr, n, scale, bwd_tol(dt), what);
  if (with_dg) tu_assert_rel(dg, SN_DTYPE_F32, dgr, d, TU_RTOL_F32_BWD, what);
  free(dx), free(rstd), free(dg), free(xd), free(dyd), free(dxr), free(dgr);
}
static void check_bwd_case(const void *x, const void *dy, const float *gamma, int64_t rows,
                           int64_t d, sn_dtype_t dt, float eps, const char *what) {
  check_bwd_case_dg(x, dy, gamma, rows, d, dt, eps, 1, what);
}

/* Rows whose RMS is near either end of the f32 range, f32 and bf16. From an RMS of ~1e21 on,
 * the map's factor rstd³·mean(g·x) in f32 is subnormal, then 0: the projection onto x̂ would be
 * lost and dx off by 14 %. At 1e-40 (subnormal x, eps dominating rstd) the f32 products dy·x of
 * the dgamma partials are subnormal: 4e-6 relative error in dgamma. */
START_TEST(test_bwd_extreme_scale) {
  static const double SIGMA[] = {1e-40, 1e-30, 1e21, 1e25, 1e30, 1e37};
  static const int64_t D[] = {64, 77};
  for (int id = 0; id < 2; id++) {
    const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
    for (size_t a = 0; a < sizeof SIGMA / sizeof SIGMA[0]; a++)
      for (size_t b = 0; b < 2; b++) {
        const int64_t rows = 4, d = D[b], n = rows * d;
        tu_rng_t rng;
        tu_rng_seed(&rng, 1000 + 10 * a + b);
        void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
        tu_fill_normal(x, n, dt, 0.0, SIGMA[a], &rng);
        tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
        float *gamma = tu_random_f32(d, 1.0, 0.5, &rng);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm_bwd sigma=%g d=%lld", SIGMA[a], (long long)d);
        check_bwd_case(x, dy, gamma, rows, d, dt, EPS, what);
        free(x), free(dy), free(gamma);
      }
  }
}
END_TEST

/* A subnormal eps (legal: any finite eps > 0) with rows tiny enough for it to matter: rstd is
 * ~2^74, and rstd³·mean(g·x) overflows f32 (taken in f32, dx = ±inf). */
START_TEST(test_bwd_subnormal_eps) {
  static const float EPSS[] = {0x1p-149f, 1e-40f};
  static const double SIGMA[] = {1e-23, 1e-21};
  for (int k = 0; k < 2; k++) {
    const int64_t rows = 3, d = 16, n = rows * d;
    tu_rng_t rng;
    tu_rng_seed(&rng, 1100 + (uint64_t)k);
    float *x = tu_random_f32(n, 0.0, SIGMA[k], &rng), *dy = tu_random_f32(n, 0.0, 1.0, &rng);
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng);
    check_bwd_case(x, dy, gamma, rows, d, SN_DTYPE_F32, EPSS[k], "rmsnorm_bwd subnormal eps");
    free(x), free(dy), free(gamma);
  }
}
END_TEST

/* dy·gamma beyond FLT_MAX (dy ~ 1e30, gamma 1e10) while dx = rstd·(…) is finite (~1e37, x ~
 * 1e3): an f32 g would make the row's sum ±inf − inf, a NaN row. */
START_TEST(test_bwd_g_overflow) {
  for (int id = 0; id < 2; id++) {
    const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
    const int64_t rows = 3, d = 16, n = rows * d;
    tu_rng_t rng;
    tu_rng_seed(&rng, 1200 + (uint64_t)id);
    void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
    tu_fill_normal(x, n, dt, 0.0, 1e3, &rng);
    tu_fill_normal(dy, n, dt, 0.0, 1e30, &rng);
    float gamma[16];
    for (int64_t i = 0; i < d; i++) gamma[i] = 1e10f;
    check_bwd_case(x, dy, gamma, rows, d, dt, EPS, "rmsnorm_bwd dy*gamma beyond FLT_MAX");
    free(x), free(dy);
  }
  /* g within f32 but near FLT_MAX, a small rstd: dx ~ 1e28 is finite, but g − x̂·mean(g·x̂)
   * is not (formed before scaling by rstd, it gives −inf);
   * dgamma = Σ dy·x̂ is beyond FLT_MAX here, so not asked for */
  const float x2[2] = {2e10f, 1e10f}, dy2[2] = {3e38f, -3e38f};
  check_bwd_case_dg(x2, dy2, NULL, 1, 2, SN_DTYPE_F32, EPS, 0, "rmsnorm_bwd g near FLT_MAX, d 2");
  float x100[100], dy100[100];
  for (int i = 0; i < 100; i++) x100[i] = i == 0 ? 5e10f : 0.87e10f, dy100[i] = 1e38f;
  check_bwd_case_dg(x100, dy100, NULL, 1, 100, SN_DTYPE_F32, EPS, 0, "rmsnorm_bwd g near FLT_MAX");
}
END_TEST

/* The term rstd·g beyond FLT_MAX while dx = rstd·g − x̂·e is finite: x ≈ 0.5 (rstd ≈ 2, x̂ ≈ 1),
 * g ≈ 3e38 on half of the row and 0 on the other, so rstd·g ≈ 6e38 and dx ≈ ±3e38. An f32 map
 * would give ±inf for the first half, although the sum and e fit in f32: a range check of those
 * two alone misses it, and the docstring's "rows whose terms are near either end of the range
 * are computed in fp64" covers the map's terms too. One row with dgamma (its terms
 * dy·x̂ ≈ 3e38 are finite), three rows without (their sum is not). */
START_TEST(test_bwd_term_overflow) {
  static const int64_t D[] = {2, 4, 37, 64};
  for (int id = 0; id < 2; id++)
    for (size_t b = 0; b < sizeof D / sizeof D[0]; b++)
      for (int rows = 1; rows <= 3; rows += 2) {
        const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
        const int64_t d = D[b], n = rows * d;
        tu_rng_t rng;
        tu_rng_seed(&rng, 1300 + (uint64_t)(id * 100) + b * 10 + (uint64_t)rows);
        void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
        for (int64_t i = 0; i < n; i++) {
          tu_set(x, i, 0.5 * (1.0 + 0.01 * tu_rng_uniform(&rng)), dt);
          tu_set(dy, i, i % d < d / 2 ? 3e38 * (0.9 + 0.1 * tu_rng_uniform(&rng)) : 0.0, dt);
        }
        float gamma[64];
        for (int64_t i = 0; i < d; i++) gamma[i] = 1.0f;
        check_bwd_case_dg(x, dy, NULL, rows, d, dt, EPS, rows == 1, "rmsnorm_bwd rstd*g > FLT_MAX");
        check_bwd_case_dg(x, dy, gamma, rows, d, dt, EPS, rows == 1,
                          "rmsnorm_bwd rstd*g > FLT_MAX, gamma");
        free(x), free(dy);
      }
}
END_TEST

START_TEST(test_bwd_large_mean) {
  for (int64_t b = 0; b < ND; b++) {
    check_bwd(3, DS[b], SN_DTYPE_F32, 1e4, 1e-2, 800 + b);
    check_bwd(3, DS[b], SN_DTYPE_F16, 2000.0, 2.0, 820 + b);
  }
}
END_TEST

/* The fp64 analytic gradient (ref_bwd) against central differences of ref_fwd, for the loss
 * L = Σ y·w with random w: dx and dgamma. Step h = 1e-6 for x (O(1)); gamma is f32, so its
 * steps are exactly representable ones near 2^-20·|gamma|. */
static double loss(const double *x, const float *gamma, const double *w, int64_t rows, int64_t d,
                   double *ybuf) {
  ref_fwd(ybuf, NULL, x, gamma, rows, d, EPS);
  double l = 0.0;
  for (int64_t i = 0; i < rows * d; i++) l += ybuf[i] * w[i];
  return l;
}

static void check_fd(int64_t rows, int64_t d, uint64_t seed) {
  const double h = 1e-6;
  const int64_t n = rows * d, step = d > 100 ? d / 37 : 1; /* sample large rows */
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  double *x = malloc(n * sizeof(double)), *w = malloc(n * sizeof(double));
  double *ybuf = malloc(n * sizeof(double)), *dx = malloc(n * sizeof(double));
  double *dg = malloc(d * sizeof(double)), *rstd = malloc(rows * sizeof(double));
  for (int64_t i = 0; i < n; i++) x[i] = 0.5 + 2.0 * tu_rng_normal(&rng);
  for (int64_t i = 0; i < n; i++) w[i] = tu_rng_normal(&rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng);
  ref_bwd(dx, dg, w, x, gamma, rows, d, EPS);
  ref_fwd(ybuf, rstd, x, gamma, rows, d, EPS);

  /* dx: error relative to max(||dx||, ||rstd·g||) over the sampled elements */
  double num = 0.0, den = 0.0, scale = 0.0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < d; i += step) { /* only row r depends on x[r, i] */
      double *xr = x + r * d, keep = xr[i];
      xr[i] = keep + h;
      double lp = loss(xr, gamma, w + r * d, 1, d, ybuf);
      xr[i] = keep - h;
      double lm = loss(xr, gamma, w + r * d, 1, d, ybuf);
      xr[i] = keep;
      double fd = (lp - lm) / (2.0 * h), e = fd - dx[r * d + i];
      double sg = rstd[r] * w[r * d + i] * gamma[i];
      num += e * e;
      den += dx[r * d + i] * dx[r * d + i];
      scale += sg * sg;
    }
  double err = sqrt(num) / fmax(fmax(sqrt(den), sqrt(scale)), 1e-300);
  ck_assert_msg(err <= TU_RTOL_FD, "FD dx rows=%lld d=%lld: %.3e", (long long)rows, (long long)d,
                err);

  num = den = 0.0;
  for (int64_t i = 0; i < d; i += step) {
    float keep = gamma[i];
    double hh = ldexp(1.0, -20) * fmax(1.0, fabs(keep));
    gamma[i] = (float)(keep + hh);
    double dp = (double)gamma[i] - keep, lp = loss(x, gamma, w, rows, d, ybuf);
    gamma[i] = (float)(keep - hh);
    double dm = keep - (double)gamma[i], lm = loss(x, gamma, w, rows, d, ybuf);
    gamma[i] = keep;
    double fd = (lp - lm) / (dp + dm), e = fd - dg[i];
    num += e * e;
    den += dg[i] * dg[i];
  }
  err = sqrt(num) / fmax(sqrt(den), 1e-300);
  ck_assert_msg(err <= TU_RTOL_FD, "FD dgamma rows=%lld d=%lld: %.3e", (long long)rows,
                (long long)d, err);
  free(x), free(w), free(ybuf), free(dx), free(dg), free(rstd), free(gamma);
}

START_TEST(test_fd) {
  for (int64_t a = 0; a < 2; a++) /* rows 1 and 3: the formulas, not the sizes */
    for (int64_t b = 0; b < ND; b++) check_fd(ROWS[a], DS[b], 900 + 10 * a + b);
}
END_TEST

/* ---- bad input, empty batch ------------------------------------------------------------------ */

enum { BR = 3, BD = 8, BN = BR * BD };
static float bx[BN], bdy[BN], bg[BD], brs[BR];
static struct { float y[BN], sum[BN], dx[BN], rstd[BR], dg[BD]; } bout;

/* Fill every output with a byte pattern / assert that every output still holds it. */
static void pattern(void) { memset(&bout, 0xA5, sizeof bout); }
static void assert_untouched(const char *what) {
  const unsigned char *p = (const unsigned char *)&bout;
  for (size_t i = 0; i < sizeof bout; i++)
    TU_CHECK(p[i] == 0xA5, "%s: output byte %zu written", what, i);
}

static void expect(sn_status_t got, sn_status_t want, const char *fn, const char *what) {
  ck_assert_msg(got == want, "%s: got %s, want %s (%s)", what, sn_status_string(got),
                sn_status_string(want), sn_last_error());
  const char *msg = sn_last_error();
  size_t len = strlen(fn);
  ck_assert_msg(strncmp(msg, fn, len) == 0 && msg[len] == ':', "%s: message '%s' does not name %s",
                what, msg, fn);
  assert_untouched(what);
}

typedef struct {
  void *y, *sum, *dx;
  const void *x, *res, *dy;
  float *rstd;
  const float *srstd;
  int64_t rows, d;
  float eps;
  sn_dtype_t dt;
} args_t;

static args_t good(void) {
  args_t a = {bout.y, bout.sum, bout.dx, bx, bdy, bdy, bout.rstd, brs, BR, BD, 1e-5f, SN_DTYPE_F32};
  return a;
}

/* bf16 rows whose y is finite are narrowed without the NaN case of the rounding; a NaN gamma
 * must still give NaN y. gamma holds NaNs whose low 16 bits are set (0x7fffffff, 0xffffffff:
 * rounded as a number, such a NaN carries into the sign bit and gives ±0) in the vector body
 * and the tail of each row; every other y must be bitwise that of the same call with those
 * gamma finite (a column's gamma changes only its column). Plain and fused forwards. */
START_TEST(test_bf16_nan_gamma) {
  enum { R = 5, D = 67 };
  tu_rng_t r;
  tu_rng_seed(&r, 77);
  uint16_t x[R * D], res[R * D], y[2][R * D], sum[R * D];
  float gamma[2][D], rs[R];
  tu_fill_normal(x, R * D, SN_DTYPE_BF16, 0.5, 1.0, &r);
  tu_fill_normal(res, R * D, SN_DTYPE_BF16, 0.0, 1.0, &r);
  for (int j = 0; j < D; j++) gamma[0][j] = gamma[1][j] = 0.75f + 0.01f * (float)j;
  static const uint32_t nan_bits[3] = {0x7fffffffu, 0xffffffffu, 0x7fffffffu};
  static const int nan_at[3] = {3, 40, 66}; /* vector body, body, tail (D = 2·32 + 3) */
  for (int k = 0; k < 3; k++) memcpy(&gamma[1][nan_at[k]], &nan_bits[k], 4);
  for (int fused = 0; fused < 2; fused++) {
    for (int g = 0; g < 2; g++) {
      memset(y[g], 0xA5, sizeof y[g]);
      if (fused)
        ck_assert_int_eq(sn_add_rmsnorm_fwd(y[g], sum, rs, x, res, gamma[g], R, D, EPS,
                                            SN_DTYPE_BF16), SN_OK);
      else
        ck_assert_int_eq(sn_rmsnorm_fwd(y[g], rs, x, gamma[g], R, D, EPS, SN_DTYPE_BF16), SN_OK);
    }
    for (int i = 0; i < R * D; i++) {
      const int j = i % D;
      if (j == 3 || j == 40 || j == 66)
        ck_assert_msg(isnan(tu_get(y[1], i, SN_DTYPE_BF16)),
                      "%s: row %d col %d: y bits %04x for a NaN gamma", fused ? "fused" : "plain",
                      i / D, j, (unsigned)y[1][i]);
      else
        ck_assert_msg(y[1][i] == y[0][i], "%s: row %d col %d: y %04x, with finite gamma %04x",
                      fused ? "fused" : "plain", i / D, j, (unsigned)y[1][i], (unsigned)y[0][i]);
    }
  }
}
END_TEST

/* Calls function f (0 fwd, 1 fused, 2 bwd) with a. */
static sn_status_t call(int f, args_t a) {
  if (f == 0) return sn_rmsnorm_fwd(a.y, a.rstd, a.x, bg, a.rows, a.d, a.eps, a.dt);
  if (f == 1)
    return sn_add_rmsnorm_fwd(a.y, a.sum, a.rstd, a.x, a.res, bg, a.rows, a.d, a.eps, a.dt);
  return sn_rmsnorm_bwd(a.dx, bout.dg, a.dy, a.x, a.srstd, bg, a.rows, a.d, a.dt);
}

START_TEST(test_bad_input) {
  static const char *const fns[] = {"sn_rmsnorm_fwd", "sn_add_rmsnorm_fwd", "sn_rmsnorm_bwd"};
  for (int i = 0; i < BN; i++) bx[i] = bdy[i] = (float)i;
  for (int i = 0; i < BD; i++) bg[i] = 1.0f;
  for (int i = 0; i < BR; i++) brs[i] = 1.0f;
  for (int f = 0; f < 3; f++) {
    const char *fn = fns[f];
    args_t a;
#define CASE(field, value, want) \
  a = good();                    \
  a.field = value;               \
  pattern();                     \
  expect(call(f, a), want, fn, #field " = " #value);
    CASE(x, NULL, SN_ERR_NULL_POINTER);
    CASE(rows, -1, SN_ERR_INVALID_SIZE);
    CASE(d, 0, SN_ERR_INVALID_SIZE);
    CASE(d, -5, SN_ERR_INVALID_SIZE);
    CASE(rows, INT64_MAX / 4, SN_ERR_OVERFLOW);
    CASE(dt, SN_DTYPE_F64, SN_ERR_INVALID_DTYPE);
    CASE(dt, (sn_dtype_t)99, SN_ERR_INVALID_DTYPE);
    CASE(dt, (sn_dtype_t)-1, SN_ERR_INVALID_DTYPE);
    if (f < 2) {
      CASE(y, NULL, SN_ERR_NULL_POINTER);
      CASE(eps, 0.0f, SN_ERR_INVALID_EPS);
      CASE(eps, -1e-5f, SN_ERR_INVALID_EPS);
      CASE(eps, NAN, SN_ERR_INVALID_EPS);
      CASE(eps, INFINITY, SN_ERR_INVALID_EPS);
    }
    if (f == 1) {
      CASE(sum, NULL, SN_ERR_NULL_POINTER);
      CASE(res, NULL, SN_ERR_NULL_POINTER);
    }
    if (f == 2) {
      CASE(dx, NULL, SN_ERR_NULL_POINTER);
      CASE(dy, NULL, SN_ERR_NULL_POINTER);
      CASE(srstd, NULL, SN_ERR_NULL_POINTER);
      /* per-row statistics, like activations, may be NULL in an empty batch (syncnorm.h) */
      a = good(), a.rows = 0, a.srstd = NULL;
      ck_assert_msg(call(f, a) == SN_OK, "%s: rows = 0, rstd NULL: %s", fn, sn_last_error());
    }
    /* a zero-sized batch still has its other arguments validated */
    a = good(), a.rows = 0, a.d = 0, pattern();
    expect(call(f, a), SN_ERR_INVALID_SIZE, fn, "rows = 0, d = 0");
    /* and d beyond int64 byte counts, though rows·d = 0 (dgamma, dbeta have d elements) */
    a = good(), a.rows = 0, a.d = INT64_MAX / 4, pattern();
    expect(call(f, a), SN_ERR_OVERFLOW, fn, "rows = 0, d = INT64_MAX / 4");
    /* scratch that cannot be allocated (2^50 bytes and more, beyond any address space):
     * SN_ERR_ALLOC before anything is read or written; the tiny buffers are never touched */
    omp_set_num_threads(2);
    a = good(), a.rows = 1, a.d = (int64_t)1 << (f == 2 ? 56 : 58), a.dt = SN_DTYPE_BF16;
    pattern();
    expect(call(f, a), SN_ERR_ALLOC, fn, "scratch allocation fails");
    /* rows longer than SN_LONG_ROW take scratch independent of d and of the thread count
     * (longrow.c): for one f16 row of 2^53 with three threads, fp64 partials per block of 4096
     * elements, at most d/128 bytes, far below the input's 2·d */
    omp_set_num_threads(3);
    a = good(), a.rows = 1, a.d = (int64_t)1 << 53, a.dt = SN_DTYPE_F16;
    pattern();
    expect(call(f, a), SN_ERR_ALLOC, fn, "one row's scratch");
    tu_assert_scratch_below(a.d / 128, fn);
#undef CASE
  }
}
END_TEST

/* rows == 0: SN_OK, nothing written, activation pointers may be NULL. */
START_TEST(test_empty_batch) {
  pattern();
  ck_assert_int_eq(sn_rmsnorm_fwd(NULL, bout.rstd, NULL, bg, 0, BD, EPS, SN_DTYPE_F32), SN_OK);
  ck_assert_int_eq(sn_rmsnorm_fwd(bout.y, bout.rstd, bx, NULL, 0, BD, EPS, SN_DTYPE_BF16), SN_OK);
  ck_assert_int_eq(sn_add_rmsnorm_fwd(NULL, NULL, bout.rstd, NULL, NULL, bg, 0, BD, EPS,
                                      SN_DTYPE_F16), SN_OK);
  assert_untouched("rows == 0");
  /* backward: an empty batch contributes a zero dgamma, and writes nothing else */
  ck_assert_int_eq(sn_rmsnorm_bwd(NULL, bout.dg, NULL, NULL, brs, bg, 0, BD, SN_DTYPE_F32), SN_OK);
  for (int i = 0; i < BD; i++) {
    TU_CHECK(bout.dg[i] == 0.0f, "rows == 0: dgamma[%d] not zeroed", i);
    memset(&bout.dg[i], 0xA5, 4); /* back to the pattern */
  }
  assert_untouched("rows == 0 backward");
}
END_TEST

/* ---- threads, in place ---------------------------------------------------------------------- */

/* fwd, fused and bwd outputs (incl. dgamma) are bitwise the same for 1, 2 and 3 threads;
 * rows = 1000 gives 64 uneven chunks, rows = 37 one chunk per row. */
START_TEST(test_threads) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  const int64_t shapes[2][2] = {{1000, 65}, {37, 4096}};
  for (int s = 0; s < 2; s++) {
    const int64_t rows = shapes[s][0], d = shapes[s][1], n = rows * d;
    const size_t bytes = (size_t)n * (size_t)sn_dtype_size(dt);
    tu_rng_t rng;
    tu_rng_seed(&rng, 1234 + s);
    void *x = tu_alloc(n, dt), *res = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
    tu_fill_normal(x, n, dt, 1.0, 3.0, &rng);
    tu_fill_normal(res, n, dt, 0.0, 1.0, &rng);
    tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng);
    void *out[3][4];   /* per thread count: y, sum, y_fused, dx */
    float *stat[3][2]; /* rstd, dgamma */
    for (int t = 0; t < 3; t++) {
      omp_set_num_threads(t + 1);
      for (int k = 0; k < 4; k++) out[t][k] = tu_alloc(n, dt), tu_poison(out[t][k], n, dt);
      for (int k = 0; k < 2; k++) {
        int64_t len = k == 0 ? rows : d;
        stat[t][k] = malloc((size_t)len * sizeof(float));
        tu_poison_f32(stat[t][k], len);
      }
      ck_assert_int_eq(sn_rmsnorm_fwd(out[t][0], stat[t][0], x, gamma, rows, d, EPS, dt), SN_OK);
      ck_assert_int_eq(sn_add_rmsnorm_fwd(out[t][2], out[t][1], NULL, x, res, gamma, rows, d, EPS,
                                          dt), SN_OK);
      ck_assert_int_eq(sn_rmsnorm_bwd(out[t][3], stat[t][1], dy, x, stat[t][0], gamma, rows, d,
                                      dt), SN_OK);
      tu_assert_all_finite(out[t][3], dt, n, "dx");
      if (t == 0) continue;
      for (int k = 0; k < 4; k++) tu_assert_bitwise(out[t][k], out[0][k], bytes, "threads: tensor");
      for (int k = 0; k < 2; k++)
        tu_assert_bitwise(stat[t][k], stat[0][k], (k == 0 ? rows : d) * sizeof(float),
                       "threads: stat");
    }
    omp_set_num_threads(2);
    for (int t = 0; t < 3; t++) {
      for (int k = 0; k < 4; k++) free(out[t][k]);
      free(stat[t][0]), free(stat[t][1]);
    }
    free(x), free(res), free(dy), free(gamma);
  }
}
END_TEST

/* y == x and dx == dy give the same bits as separate buffers. */
START_TEST(test_in_place) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  for (int64_t b = 0; b < ND; b++) {
    const int64_t rows = 3, d = DS[b], n = rows * d;
    const size_t bytes = (size_t)n * (size_t)sn_dtype_size(dt);
    tu_rng_t rng;
    tu_rng_seed(&rng, 77 + b);
    void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt), *buf = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
    void *dx = tu_alloc(n, dt);
    tu_fill_normal(x, n, dt, -1.0, 2.0, &rng);
    tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), rs[3], rs2[3];
    float *dg = malloc(d * 4), *dg2 = malloc(d * 4);
    ck_assert_int_eq(sn_rmsnorm_fwd(y, rs, x, gamma, rows, d, EPS, dt), SN_OK);
    memcpy(buf, x, bytes);
    ck_assert_int_eq(sn_rmsnorm_fwd(buf, rs2, buf, gamma, rows, d, EPS, dt), SN_OK);
    tu_assert_bitwise(buf, y, bytes, "in-place forward y");
    tu_assert_bitwise(rs2, rs, sizeof rs, "in-place forward rstd");

    ck_assert_int_eq(sn_rmsnorm_bwd(dx, dg, dy, x, rs, gamma, rows, d, dt), SN_OK);
    memcpy(buf, dy, bytes);
    ck_assert_int_eq(sn_rmsnorm_bwd(buf, dg2, buf, x, rs, gamma, rows, d, dt), SN_OK);
    tu_assert_bitwise(buf, dx, bytes, "in-place backward dx");
    tu_assert_bitwise(dg2, dg, d * 4, "in-place backward dgamma");
    free(x), free(y), free(buf), free(dy), free(dx), free(gamma), free(dg), free(dg2);
  }
}
END_TEST

int main(void) {
  omp_set_num_threads(2);
  Suite *s = suite_create("rmsnorm");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_fwd_shapes, 0, 3);
  tcase_add_test(tc, test_lowp_sum_range);
  tcase_add_test(tc, test_bf16_bitwise);
  tcase_add_test(tc, test_large_mean);
  tcase_add_loop_test(tc, test_constant_rows, 0, 3);
  tcase_add_loop_test(tc, test_near_half_max, 0, 2);
  tcase_add_loop_test(tc, test_add_fwd, 0, 3);
  tcase_add_loop_test(tc, test_add_adversarial, 0, 3);
  tcase_add_loop_test(tc, test_bwd_shapes, 0, 3);
  tcase_add_test(tc, test_bwd_large_mean);
  tcase_add_test(tc, test_bwd_huge_dy);
  tcase_add_test(tc, test_bwd_bf16_is_f32);
  tcase_add_test(tc, test_bwd_extreme_scale);
  tcase_add_test(tc, test_bwd_subnormal_eps);
  tcase_add_test(tc, test_bwd_g_overflow);
  tcase_add_test(tc, test_bwd_term_overflow);
  tcase_add_test(tc, test_fd);
  tcase_add_test(tc, test_bf16_nan_gamma);
  tcase_add_test(tc, test_bad_input);
  tcase_add_test(tc, test_empty_batch);
  tcase_add_loop_test(tc, test_threads, 0, 3);
  tcase_add_loop_test(tc, test_in_place, 0, 3);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
