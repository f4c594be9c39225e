/*
 * test_layernorm.c — sn_layernorm_fwd, sn_layernorm_bwd and sn_add_layernorm_fwd against fp64
 * references written here: every shape of the issue in f32, bf16 and f16, with and without
 * gamma/beta; the fp64 analytic gradient against central finite differences; adversarial rows
 * (|mean| ≫ σ, constant rows, bf16/f16 near 6e4); NaN-poisoned outputs; bad input; bitwise
 * determinism over thread counts; in-place calls.
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

/* The gradients are compared with tu_assert_rel_scaled. The LayerNorm gradient projects
 * rstd·g onto the complement of (1, x̂): for d = 2 almost all of it cancels (dx ≈ rstd·g·eps/var)
 * and any f32 computation from the saved f32 rstd errs relative to rstd·g, not to dx. `scale`
 * is ||rstd·g||, the size of the terms; for d ≥ 3 it is within a small factor of ||ref||. */

/* ---- fp64 references ------------------------------------------------------------------------ */

/* LayerNorm forward of x [rows, d] in fp64 (two-pass). scale: |x̂·gamma| + |beta| of each
 * element, the bf16/f16 bound's scale (tu_check_lowp_mixed). scale, mean, rstd may be NULL. */
static void ref_fwd(double *y, double *scale, double *mean, double *rstd, const double *x,
                    const float *gamma, const float *beta, int64_t rows, int64_t d, double eps) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * d;
    double mu = 0.0, var = 0.0;
    for (int64_t i = 0; i < d; i++) mu += xr[i];
    mu /= (double)d;
    for (int64_t i = 0; i < d; i++) var += (xr[i] - mu) * (xr[i] - mu);
    var /= (double)d;
    double rs = 1.0 / sqrt(var + eps);
    for (int64_t i = 0; i < d; i++) {
      const double xg = (xr[i] - mu) * rs * (gamma ? gamma[i] : 1.0), b = beta ? beta[i] : 0.0;
      y[r * d + i] = xg + b;
      if (scale) scale[r * d + i] = fabs(xg) + fabs(b);
    }
    if (mean) mean[r] = mu;
    if (rstd) rstd[r] = rs;
  }
}

/* Analytic LayerNorm gradient in fp64, with the exact statistics of x:
 * dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), dgamma = Σ dy·x̂, dbeta = Σ dy. Returns ||rstd·g||. */
static double ref_bwd(double *dx, double *dgamma, double *dbeta, const double *dy,
                      const double *x, const float *gamma, int64_t rows, int64_t d, double eps) {
  double scale = 0.0;
  double *xh = malloc((size_t)d * sizeof(double));
  ck_assert(xh != NULL);
  for (int64_t i = 0; i < d; i++) dgamma[i] = dbeta[i] = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * d, *dyr = dy + r * d;
    double mu = 0.0, var = 0.0, mg = 0.0, mgx = 0.0;
    for (int64_t i = 0; i < d; i++) mu += xr[i];
    mu /= (double)d;
    for (int64_t i = 0; i < d; i++) var += (xr[i] - mu) * (xr[i] - mu);
    double rs = 1.0 / sqrt(var / (double)d + eps);
    for (int64_t i = 0; i < d; i++) {
      double g = dyr[i] * (gamma ? gamma[i] : 1.0);
      xh[i] = (xr[i] - mu) * rs;
      mg += g;
      mgx += g * xh[i];
      scale += rs * g * rs * g;
      dgamma[i] += dyr[i] * xh[i];
      dbeta[i] += dyr[i];
    }
    mg /= (double)d;
    mgx /= (double)d;
    for (int64_t i = 0; i < d; i++) {
      double g = dyr[i] * (gamma ? gamma[i] : 1.0);
      dx[r * d + i] = rs * (g - mg - xh[i] * mgx);
    }
  }
  free(xh);
  return sqrt(scale);
}

/* sn_layernorm_bwd into poisoned dx [rows, d] (dt) and dgamma, dbeta [d] (f32) from the saved
 * mean/rstd, checked against the analytic fp64 gradient of the (dtype-rounded) inputs. */
static void run_bwd(void *dx, float *dg, float *db, const void *dy, const void *x,
                    const float *mean, const float *rstd, const float *gamma, int64_t rows,
                    int64_t d, sn_dtype_t dt, const char *what) {
  const int64_t n = rows * d;
  tu_poison(dx, n, dt);
  tu_poison_f32(dg, d);
  tu_poison_f32(db, d);
  sn_status_t st = sn_layernorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, rows, d, dt);
  ck_assert_msg(st == SN_OK, "%s: %s", what, sn_last_error());
  double *xd = tu_to_f64(x, n, dt), *dyd = tu_to_f64(dy, n, dt),
      *dxr = malloc((size_t)n * sizeof(double));
  double *dgr = malloc(d * sizeof(double)), *dbr = malloc(d * sizeof(double));
  double scale = ref_bwd(dxr, dgr, dbr, dyd, xd, gamma, rows, d, EPS);
  tu_assert_rel_scaled(dx, dt, dxr, n, scale, bwd_tol(dt), what);
  tu_assert_rel(dg, SN_DTYPE_F32, dgr, d, TU_RTOL_F32_BWD, "dgamma");
  tu_assert_rel(db, SN_DTYPE_F32, dbr, d, TU_RTOL_F32_BWD, "dbeta");
  free(xd), free(dyd), free(dxr), free(dgr), free(dbr);
}

/* ---- forward ------------------------------------------------------------------------------ */

/* Forward cases on one x = mean + std·N(0,1) rounded to dt: for each gamma/beta combination gb
 * in the bit mask `combos` (bit gb: gamma if gb & 1, beta if gb & 2), y, mean, rstd poisoned,
 * then checked element by element against ref_fwd. */
static void check_fwd(int64_t rows, int64_t d, sn_dtype_t dt, int combos, double mu, double sigma,
                      uint64_t seed) {
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  const int64_t n = rows * d;
  void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, mu, sigma, &rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
  float *mean = malloc((size_t)rows * sizeof(float)), *rstd = malloc((size_t)rows * sizeof(float));
  double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double));
  double *sc = malloc((size_t)n * sizeof(double));
  double *mr = malloc((size_t)rows * sizeof(double)), *rr = malloc((size_t)rows * sizeof(double));
  for (int gb = 0; gb < 4; gb++) {
    if (!(combos >> gb & 1)) continue;
    const float *g = gb & 1 ? gamma : NULL, *b = gb & 2 ? beta : NULL;
    char what[160];
    snprintf(what, sizeof what, "layernorm_fwd rows=%lld d=%lld gamma=%d beta=%d mean=%g",
             (long long)rows, (long long)d, g != NULL, b != NULL, mu);
    tu_poison(y, n, dt);
    tu_poison_f32(mean, rows);
    tu_poison_f32(rstd, rows);
    sn_status_t st = sn_layernorm_fwd(y, mean, rstd, x, g, b, rows, d, EPS, dt);
    ck_assert_msg(st == SN_OK, "%s: %s %s", what, sn_status_string(st), sn_last_error());
    ref_fwd(yr, sc, mr, rr, xd, g, b, rows, d, EPS);
    tu_assert_fwd(y, dt, yr, sc, n, what);
    for (int64_t r = 0; r < rows; r++) {
      tu_assert_stat(mean[r], mr[r], 1.0 / rr[r], "mean", r);
      tu_assert_stat(rstd[r], rr[r], 0.0, "rstd", r);
    }
  }
  free(x), free(y), free(gamma), free(beta), free(mean), free(rstd);
  free(xd), free(yr), free(sc), free(mr), free(rr);
}

/* Every rows × d of the issue, one dtype per loop index; all four gamma/beta combinations. */
START_TEST(test_fwd_shapes) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  for (int64_t a = 0; a < NROWS; a++)
    for (int64_t b = 0; b < ND; b++) check_fwd(ROWS[a], DS[b], dt, 0xF, 0.5, 2.0, 100 + 10 * a + b);
}
END_TEST

/* The issue's example: [2000, 2001, 2002, 2003], eps 1e-5, in f32 to 1e-5. f16 represents these
 * integers exactly (bf16 does not: its ulp at 2000 is 8); without gamma and beta its bound is
 * 1 ulp of the exact y. */
START_TEST(test_issue_example) {
  const double expect[4] = {-1.341635, -0.447212, 0.447212, 1.341635};
  for (int k = 0; k < 2; k++) {
    const sn_dtype_t dt = k == 0 ? SN_DTYPE_F32 : SN_DTYPE_F16;
    void *x = tu_alloc(4, dt), *y = tu_alloc(4, dt);
    for (int i = 0; i < 4; i++) tu_set(x, i, 2000.0 + i, dt);
    tu_poison(y, 4, dt);
    float mean = NAN, rstd = NAN;
    ck_assert_int_eq(sn_layernorm_fwd(y, &mean, &rstd, x, NULL, NULL, 1, 4, 1e-5f, dt), SN_OK);
    double ref[4];
    for (int i = 0; i < 4; i++) {
      if (dt == SN_DTYPE_F32)
        ck_assert_msg(fabs(tu_get(y, i, dt) - expect[i]) <= 1e-5, "y[%d] = %.7f, expected %.6f",
                      i, tu_get(y, i, dt), expect[i]);
      ref[i] = (2000.0 + i - 2001.5) / sqrt(1.25 + 1e-5);
    }
    tu_assert_fwd(y, dt, ref, NULL, 4, "issue example"); /* no beta: scale |y| */
    ck_assert(mean == 2001.5f);
    free(x), free(y);
  }
}
END_TEST

/* |mean| ≫ σ: mean 1e4, σ 1e-2 in f32 must meet the f32 normwise bound (forward and backward).
 * bf16/f16 cannot hold σ 1e-2 at 1e4; they get mean/σ = 1000 and 50 on their own grid. */
START_TEST(test_large_mean) {
  for (int64_t b = 0; b < ND; b++) {
    check_fwd(3, DS[b], SN_DTYPE_F32, 0xF, 1e4, 1e-2, 300 + b);
    check_fwd(3, DS[b], SN_DTYPE_F32, 0x9, -1e4, 1e-2, 310 + b);
    check_fwd(3, DS[b], SN_DTYPE_F16, 0x9, 2000.0, 2.0, 320 + b);
    check_fwd(3, DS[b], SN_DTYPE_BF16, 0x9, 1e4, 200.0, 330 + b);
  }
}
END_TEST

/* bf16: sn_layernorm_fwd reads its rows in pairs and keeps no f32 copy (layernorm.c); the fused
 * kernel with a zero residual runs the other code, on widened rows. y (a NaN for a NaN),
 * mean and rstd (where given) must be bitwise the fused kernel's. */
static void assert_bf16_as_fused(const void *y, const float *mean, const float *rstd,
                                 const void *x, const float *g, const float *b, int64_t rows,
                                 int64_t d, float eps, const char *what) {
  const int64_t n = rows * d;
  const sn_dtype_t dt = SN_DTYPE_BF16;
  void *zero = tu_alloc(n, dt), *sum = tu_alloc(n, dt), *y2 = tu_alloc(n, dt);
  float *m2 = malloc((size_t)rows * sizeof(float)), *r2 = malloc((size_t)rows * sizeof(float));
  for (int64_t i = 0; i < n; i++) tu_set(zero, i, 0.0, dt);
  tu_poison(y2, n, dt);
  ck_assert_int_eq(sn_add_layernorm_fwd(y2, sum, m2, r2, x, zero, g, b, rows, d, eps, dt), SN_OK);
  for (int64_t i = 0; i < n; i++) {
    const uint16_t u = ((const uint16_t *)y)[i], v = ((const uint16_t *)y2)[i];
    const int nan_u = (u & 0x7fffu) > 0x7f80u, nan_v = (v & 0x7fffu) > 0x7f80u;
    TU_CHECK(nan_v ? nan_u : u == v, "%s: bf16 y[%lld] = 0x%04x, the fused kernel's 0x%04x",
             what, (long long)i, u, v);
  }
  if (mean != NULL) tu_assert_bitwise(mean, m2, (size_t)rows * sizeof(float), what);
  if (rstd != NULL) tu_assert_bitwise(rstd, r2, (size_t)rows * sizeof(float), what);
  free(zero), free(sum), free(y2), free(m2), free(r2);
}

/* Cancelling beta for x [rows, d] (row 0 used): beta[i] = −(x̂·gamma)[i]·(1 + δ) with δ from
 * exactly 0 to 2^-6, so y of row 0 is 0 or many binades below its terms (~2^-24 of them at
 * δ = 0: beta is x̂·gamma rounded to f32). xd: x in fp64; yr: scratch [rows·d]. */
static void cancelling_beta(float *beta, double *yr, const double *xd, const float *gamma,
                            int64_t rows, int64_t d) {
  static const double DELTA[] = {0.0, 0x1p-6, -0x1p-9, 0x1p-12, -0x1p-15, 0x1p-20, 1e-7};
  ref_fwd(yr, NULL, NULL, NULL, xd, gamma, NULL, rows, d, EPS); /* row 0: x̂·gamma */
  for (int64_t i = 0; i < d; i++)
    beta[i] = (float)(-yr[i] * (1.0 + DELTA[i % (int64_t)(sizeof DELTA / sizeof DELTA[0])]));
}

/* sn_layernorm_fwd with a beta that cancels x̂·gamma in row 0 (cancelling_beta): y's error there
 * is rstd's relative error times |x̂·gamma|, far above y itself. f32: the normwise bound (which
 * the tiny y cannot move); bf16/f16: the mixed bound, 2^-16 of |x̂·gamma| + |beta| where that is
 * more than 1 ulp of y (tu_check_lowp_mixed). Rows 1 and 2 see the same beta as ordinary data.
 * lead, unless NaN, is added to the first min(d, 32) elements of row 0 (those the one-pass
 * statistics take their pivot from). */
static void check_cancel(int64_t d, sn_dtype_t dt, double lead, uint64_t seed) {
  const int64_t rows = 3, n = rows * d;
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, 0.5, 2.0, &rng);
  if (!isnan(lead))
    for (int64_t i = 0; i < d && i < 32; i++) tu_set(x, i, tu_get(x, i, dt) + lead, dt);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = malloc((size_t)d * sizeof(float));
  float mean[3], rstd[3];
  double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double)), mr[3], rr[3];
  double *sc = malloc((size_t)n * sizeof(double));
  cancelling_beta(beta, yr, xd, gamma, rows, d);
  tu_poison(y, n, dt);
  ck_assert_int_eq(sn_layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, d, EPS, dt), SN_OK);
  ref_fwd(yr, sc, mr, rr, xd, gamma, beta, rows, d, EPS);
  char what[96];
  snprintf(what, sizeof what, "layernorm_fwd beta cancels, d=%lld, lead=%g", (long long)d, lead);
  tu_assert_fwd(y, dt, yr, sc, n, what);
  for (int64_t r = 0; r < rows; r++) {
    tu_assert_stat(mean[r], mr[r], 1.0 / rr[r], "mean", r);
    tu_assert_stat(rstd[r], rr[r], 0.0, "rstd", r);
  }
  if (dt == SN_DTYPE_BF16) assert_bf16_as_fused(y, mean, rstd, x, gamma, beta, rows, d, EPS, what);
  free(x), free(y), free(gamma), free(beta), free(xd), free(yr), free(sc);
}

/* sn_add_layernorm_fwd with a beta that cancels x̂·gamma of row 0 of x + residual
 * (cancelling_beta on the rounded sum): sum_out exact, y at the forward bound against the fp64
 * LayerNorm of sum_out (bf16/f16: the mixed bound). */
static void check_add_cancel(int64_t d, sn_dtype_t dt, uint64_t seed) {
  const int64_t rows = 3, n = rows * d;
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  void *x = tu_alloc(n, dt), *res = tu_alloc(n, dt), *sum = tu_alloc(n, dt), *y = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, 0.3, 1.0, &rng);
  tu_fill_normal(res, n, dt, -0.1, 2.0, &rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = malloc((size_t)d * sizeof(float));
  double *sref = malloc((size_t)n * sizeof(double)), *yr = malloc((size_t)n * sizeof(double));
  double *sc = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++)
    sref[i] = tu_round((float)tu_get(x, i, dt) + (float)tu_get(res, i, dt), dt);
  cancelling_beta(beta, yr, sref, gamma, rows, d);
  char what[96];
  snprintf(what, sizeof what, "add_layernorm_fwd beta cancels, d=%lld", (long long)d);
  tu_poison(sum, n, dt);
  tu_poison(y, n, dt);
  ck_assert_int_eq(sn_add_layernorm_fwd(y, sum, NULL, NULL, x, res, gamma, beta, rows, d, EPS, dt),
                   SN_OK);
  tu_assert_residual_sum(sum, x, res, n, dt, what);
  ref_fwd(yr, sc, NULL, NULL, sref, gamma, beta, rows, d, EPS);
  tu_assert_fwd(y, dt, yr, sc, n, what);
  free(x), free(res), free(sum), free(y), free(gamma), free(beta), free(sref), free(yr), free(sc);
}

START_TEST(test_beta_cancels) {
  static const int64_t D[] = {7, 65, 300, 4096}; /* 300: two map blocks of 128 and a tail */
  for (int k = 0; k < 4; k++) {
    check_cancel(D[k], (sn_dtype_t)_i, NAN, 700 + (uint64_t)k);
    check_add_cancel(D[k], (sn_dtype_t)_i, 710 + (uint64_t)k);
  }
}
END_TEST

/* The one-pass statistics (pivot K = the mean of the row's first 32 values) cancel by
 * ρ = (mean − K)²/var; rows with ρ > SN_SHIFT_RHO_MAX (1/4) take the two fp64 passes. Both paths
 * under the 2^24-deep cancellation of test_beta_cancels (check_cancel): row 0's first 32 values
 * 2^8 σ out in a row of 2^16 (ρ ≈ 2^11: the fallback), leads of 0.4σ and 0.6σ (ρ ≈ 0.16 and
 * 0.36: both sides of the threshold), and a short row (its pivot is its mean). With a pivot
 * averaged over 32 values ρ cannot exceed d/32; the fallback keeps every row's variance within
 * 1.25 bits of the two passes (rownorm.h), where the one-pass error would grow with ρ. */
START_TEST(test_shift_fallback) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  check_cancel(65536, dt, 2.0 * 256.0, 760);
  check_cancel(4096, dt, 2.0 * 0.4, 761);
  check_cancel(4096, dt, -2.0 * 0.6, 762);
  check_cancel(7, dt, 1e4, 763);
}
END_TEST

/* x̂·gamma beyond the f32 range while x̂·gamma + beta is not: an f32 map would give ±inf there,
 * so a call whose √d·max|gamma| + max|beta| exceeds 2^127 is mapped in fp64 (bf16 shares f32's
 * range). A row of zeros with a one at every fifth element has x̂ ≈ −0.5 at the zeros and 2 at
 * the ones; gamma = 3e38 makes the ones' x̂·gamma 6e38, beta = −3e38 brings them back. d = 5 is
 * a tail only; 640 and 645 have whole blocks of the bf16 pair path. */
START_TEST(test_map_overflow) {
  const int64_t ds[] = {5, 640, 645};
  const sn_dtype_t dt = SN_DTYPE_BF16;
  for (size_t t = 0; t < sizeof ds / sizeof ds[0]; t++) {
    const int64_t d = ds[t];
    void *x = tu_alloc(d, dt), *y = tu_alloc(d, dt);
    float *gamma = malloc((size_t)d * sizeof *gamma), *beta = malloc((size_t)d * sizeof *beta);
    ck_assert(gamma != NULL && beta != NULL);
    float mean, rstd;
    for (int64_t i = 0; i < d; i++) {
      const int one = i % 5 == 4;
      tu_set(x, i, one ? 1.0 : 0.0, dt);
      gamma[i] = 3e38f;
      beta[i] = one ? -3e38f : 0.0f;
    }
    tu_poison(y, d, dt);
    ck_assert_int_eq(sn_layernorm_fwd(y, &mean, &rstd, x, gamma, beta, 1, d, EPS, dt), SN_OK);
    double *xd = tu_to_f64(x, d, dt), *yr = malloc((size_t)d * sizeof *yr);
    double *sc = malloc((size_t)d * sizeof *sc);
    ck_assert(yr != NULL && sc != NULL);
    ref_fwd(yr, sc, NULL, NULL, xd, gamma, beta, 1, d, EPS);
    ck_assert(isfinite(yr[4]) && fabs(yr[4]) > 1e38);
    tu_assert_fwd(y, dt, yr, sc, d, "layernorm_fwd x̂·gamma overflows f32, y does not");
    assert_bf16_as_fused(y, &mean, &rstd, x, gamma, beta, 1, d, EPS, "map overflow");
    free(x), free(y), free(xd), free(yr), free(sc), free(gamma), free(beta);
  }
}
END_TEST

/* Rows of values of both signs near the f32 range (tu_fill_near_max): x − mean exceeds FLT_MAX
 * for some elements although y and dx are O(1) and O(rstd) (x − mean taken in f32 would give
 * y = ±inf and dx NaN). f32 and bf16 (f16 cannot hold such values), every gamma/beta
 * combination, d from 2 to 4096. rstd (~2^-127) is a subnormal f32: one rounding of it errs by
 * up to 2^-150 absolute, which its check allows; the backward starts from that saved rstd
 * (2^-22 relative), inside its tolerances; dy is scaled by 2^100 so that dx is a normal number
 * (bf16 subnormals near 2^-128 would keep only a few bits). */
START_TEST(test_near_f32_max) {
  static const int64_t dims[] = {2, 3, 7, 65, 4096};
  const int64_t rows = 3;
  for (int id = 0; id < 2; id++)
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
      const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
      const int64_t d = dims[k], n = rows * d;
      tu_rng_t rng;
      tu_rng_seed(&rng, 1300 + 10 * (uint64_t)id + k);
      void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt);
      tu_fill_near_max(x, n, dt, 0.75, &rng);
      tu_fill_normal(dy, n, dt, 0.0, 0x1p100, &rng); /* dx ~ rstd·dy: normal, not subnormal */
      float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
      float *dg = malloc((size_t)d * sizeof(float)), *db = malloc((size_t)d * sizeof(float));
      float mean[3], rstd[3];
      double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double)), mr[3], rr[3];
      double *sc = malloc((size_t)n * sizeof(double));
      for (int gb = 0; gb < 4; gb++) {
        const float *g = gb & 1 ? gamma : NULL, *b = gb & 2 ? beta : NULL;
        char what[128];
        snprintf(what, sizeof what, "layernorm near FLT_MAX d=%lld gamma=%d beta=%d",
                 (long long)d, g != NULL, b != NULL);
        tu_poison(y, n, dt);
        tu_poison_f32(mean, rows);
        tu_poison_f32(rstd, rows);
        ck_assert_int_eq(sn_layernorm_fwd(y, mean, rstd, x, g, b, rows, d, EPS, dt), SN_OK);
        ref_fwd(yr, sc, mr, rr, xd, g, b, rows, d, EPS);
        tu_assert_fwd(y, dt, yr, sc, n, what);
        for (int64_t r = 0; r < rows; r++) {
          tu_assert_stat(mean[r], mr[r], 1.0 / rr[r], "mean", r);
          TU_CHECK(fabs((double)rstd[r] - rr[r]) <= 0x1p-24 * rr[r] + 0x1p-150,
                   "%s: rstd row %lld %.9g vs %.17g", what, (long long)r, (double)rstd[r], rr[r]);
        }
        if (dt == SN_DTYPE_BF16) assert_bf16_as_fused(y, mean, rstd, x, g, b, rows, d, EPS, what);
        run_bwd(dx, dg, db, dy, x, mean, rstd, g, rows, d, dt, what);
      }
      free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(dg), free(db);
      free(xd), free(yr), free(sc);
    }
}
END_TEST

/* Non-finite inputs propagate as in PyTorch: a row holding a NaN or an infinity normalizes to
 * NaN throughout (its mean or x − mean is NaN), the other rows are unaffected. f32 and bf16
 * (bf16 rows whose statistics, gamma and beta are finite are narrowed without the NaN case of
 * the rounding: the NaN rows must still narrow to NaN, not to ±inf), every gamma/beta
 * combination. */
START_TEST(test_nonfinite_rows) {
  const int64_t rows = 3, d = 200, n = rows * d;
  for (int id = 0; id < 2; id++)
    for (int gb = 0; gb < 4; gb++) {
      const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
      tu_rng_t rng;
      tu_rng_seed(&rng, 1400 + 4 * (uint64_t)id + (uint64_t)gb);
      void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt);
      tu_fill_normal(x, n, dt, 0.5, 2.0, &rng);
      tu_set(x, 5, NAN, dt);
      tu_set(x, d + 150, INFINITY, dt);
      float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
      const float *g = gb & 1 ? gamma : NULL, *b = gb & 2 ? beta : NULL;
      tu_poison(y, n, dt);
      ck_assert_int_eq(sn_layernorm_fwd(y, NULL, NULL, x, g, b, rows, d, EPS, dt), SN_OK);
      for (int64_t i = 0; i < 2 * d; i++)
        TU_CHECK(isnan(tu_get(y, i, dt)), "%s gamma=%d beta=%d: y[%lld] = %g, not NaN",
                 tu_dtype_name[dt], g != NULL, b != NULL, (long long)i, tu_get(y, i, dt));
      double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double));
      double *sc = malloc((size_t)d * sizeof(double));
      ref_fwd(yr, sc, NULL, NULL, xd + 2 * d, g, b, 1, d, EPS);
      tu_assert_fwd((char *)y + 2 * d * sn_dtype_size(dt), dt, yr, sc, d,
                    "finite row beside NaN rows");
      if (dt == SN_DTYPE_BF16) assert_bf16_as_fused(y, NULL, NULL, x, g, b, rows, d, EPS, "NaN rows");
      free(x), free(y), free(gamma), free(beta), free(xd), free(yr), free(sc);
    }
}
END_TEST

/* bf16 rows whose statistics, gamma and beta are finite are narrowed without the NaN case of
 * the rounding; a NaN gamma must still give NaN y. gamma holds NaNs whose low 16 bits are set
 * (0x7fffffff, 0xffffffff: rounded as a number, such a NaN carries into the sign bit and gives
 * ±0) in the pair blocks and the tail of each row (d = 2·32 + 3); every other y must be bitwise
 * that of the same call with those gamma finite. Without and with beta, plain and fused (with a
 * zero residual). */
START_TEST(test_bf16_nan_gamma) {
  enum { R = 5, D = 67 };
  tu_rng_t rng;
  tu_rng_seed(&rng, 1450);
  uint16_t x[R * D], zero[R * D] = {0}, y[2][R * D], sum[R * D];
  float gamma[2][D], beta[D];
  tu_fill_normal(x, R * D, SN_DTYPE_BF16, 0.5, 1.0, &rng);
  tu_fill_normal(beta, D, SN_DTYPE_F32, 0.0, 1.0, &rng);
  for (int j = 0; j < D; j++) gamma[0][j] = gamma[1][j] = 0.75f + 0.01f * (float)j;
  static const uint32_t nan_bits[3] = {0x7fffffffu, 0xffffffffu, 0x7fffffffu};
  static const int nan_at[3] = {3, 40, 66};
  for (int k = 0; k < 3; k++) memcpy(&gamma[1][nan_at[k]], &nan_bits[k], 4);
  for (int v = 0; v < 4; v++) {
    const float *b = v & 1 ? beta : NULL;
    const int fused = v >= 2;
    for (int g = 0; g < 2; g++) {
      memset(y[g], 0xA5, sizeof y[g]);
      if (fused)
        ck_assert_int_eq(sn_add_layernorm_fwd(y[g], sum, NULL, NULL, x, zero, gamma[g], b, R, D,
                                              EPS, SN_DTYPE_BF16),
                         SN_OK);
      else
        ck_assert_int_eq(
            sn_layernorm_fwd(y[g], NULL, NULL, x, gamma[g], b, R, D, EPS, SN_DTYPE_BF16), SN_OK);
    }
    for (int i = 0; i < R * D; i++) {
      const int j = i % D;
      if (j == 3 || j == 40 || j == 66)
        ck_assert_msg(isnan(tu_get(y[1], i, SN_DTYPE_BF16)),
                      "fused=%d beta=%d: row %d col %d: y bits %04x for a NaN gamma", fused,
                      b != NULL, i / D, j, (unsigned)y[1][i]);
      else
        ck_assert_msg(y[1][i] == y[0][i], "fused=%d beta=%d: row %d col %d: y %04x, with finite "
                      "gamma %04x", fused, b != NULL, i / D, j, (unsigned)y[1][i],
                      (unsigned)y[0][i]);
    }
  }
}
END_TEST

/* A mean so small that mean − (float)mean is below the normal f32 range (an f32 map with the
 * two-float mean errs by 6 ulp here), so such rows are mapped in fp64: x = [2^-133, 0, ..., 0],
 * eps 1e-12 as BERT's, so x − mean matters at 2^-133. Every gamma/beta combination (beta = 0,
 * so y is x̂·gamma with no cancellation), bf16 and f32, each through sn_layernorm_fwd and the
 * fused kernel (with a zero residual). Then means below 2^-150, where (float)mean is 0 and an
 * f32 map would give whole blocks of zeros y = 0 instead of −mean·rstd: [63·2^-149, 0, ...] at
 * d = 129 and 256 with eps 2^-149, and [2^-133, 0, ...] at d = 140000. */
START_TEST(test_tiny_mean) {
  static const struct {
    int64_t d;
    double x0;
    float eps;
  } CASES[] = {{4000, 0x1p-133, 1e-12f}, {129, 63 * 0x1p-149, 0x1p-149f},
               {256, 63 * 0x1p-149, 0x1p-149f}, {140000, 0x1p-133, 1e-12f}};
  for (int id = 0; id < 8; id++) {
    const sn_dtype_t dt = id % 2 == 0 ? SN_DTYPE_BF16 : SN_DTYPE_F32;
    const int64_t d = CASES[id / 2].d;
    const float eps = CASES[id / 2].eps;
    void *x = tu_alloc(d, dt), *y = tu_alloc(d, dt);
    void *zero = tu_alloc(d, dt), *sum = tu_alloc(d, dt);
    float *gamma = malloc((size_t)d * sizeof(float)), *beta = malloc((size_t)d * sizeof(float));
    for (int64_t i = 0; i < d; i++) {
      tu_set(x, i, i == 0 ? CASES[id / 2].x0 : 0.0, dt);
      tu_set(zero, i, 0.0, dt);
      gamma[i] = 1.0f;
      beta[i] = 0.0f;
    }
    double *xd = tu_to_f64(x, d, dt), *yr = malloc((size_t)d * sizeof(double));
    double *sc = malloc((size_t)d * sizeof(double));
    for (int gb = 0; gb < 4; gb++) {
      const float *g = gb & 1 ? gamma : NULL, *b = gb & 2 ? beta : NULL;
      float mean, rstd;
      ref_fwd(yr, sc, NULL, NULL, xd, g, b, 1, d, eps);
      char what[96];
      snprintf(what, sizeof what, "tiny mean, d %lld, gamma=%d beta=%d", (long long)d, g != NULL,
               b != NULL);
      tu_poison(y, d, dt);
      ck_assert_int_eq(sn_layernorm_fwd(y, &mean, &rstd, x, g, b, 1, d, eps, dt), SN_OK);
      tu_assert_fwd(y, dt, yr, sc, d, what);
      if (dt == SN_DTYPE_BF16) assert_bf16_as_fused(y, &mean, &rstd, x, g, b, 1, d, eps, what);
      tu_poison(y, d, dt);
      ck_assert_int_eq(sn_add_layernorm_fwd(y, sum, &mean, &rstd, x, zero, g, b, 1, d, eps, dt),
                       SN_OK);
      tu_assert_fwd(y, dt, yr, sc, d, what);
    }
    free(x), free(y), free(zero), free(sum), free(gamma), free(beta), free(xd), free(yr);
    free(sc);
  }
}
END_TEST

/* bf16 rows take their own two-pass path (widen + sums in one pass, narrowing in the map), in
 * sn_layernorm_fwd and, with the add in its first pass, in the fused kernel. Against the f32
 * path on the widened rows (other code, the same values): mean and rstd bitwise equal, and y
 * without beta bitwise the f32 y rounded to bf16 (both plain f32 maps; y with beta is checked
 * against the fp64 reference elsewhere). With a zero residual the fused kernel's y, mean and
 * rstd are bitwise sn_layernorm_fwd's. Every gamma/beta combination. */
START_TEST(test_bf16_path_matches_generic) {
  static const int64_t D[] = {1, 7, 31, 32, 33, 65, 127, 128, 129, 300, 4096};
  for (int k = 0; k < (int)(sizeof D / sizeof D[0]); k++)
    for (int gb = 0; gb < 4; gb++) {
      const int64_t rows = 5, d = D[k], n = rows * d;
      const sn_dtype_t dt = SN_DTYPE_BF16;
      tu_rng_t rng;
      tu_rng_seed(&rng, 800 + (uint64_t)(4 * k + gb));
      void *x = tu_alloc(n, dt), *zero = tu_alloc(n, dt), *sum = tu_alloc(n, dt);
      void *y1 = tu_alloc(n, dt), *y2 = tu_alloc(n, dt);
      float *xf = malloc((size_t)n * sizeof(float)), *yf = malloc((size_t)n * sizeof(float));
      tu_fill_normal(x, n, dt, 3.0, 2.0, &rng);
      for (int64_t i = 0; i < n; i++) tu_set(zero, i, 0.0, dt), xf[i] = (float)tu_get(x, i, dt);
      float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
      const float *g = gb & 1 ? gamma : NULL, *b = gb & 2 ? beta : NULL;
      float m1[5], r1[5], m2[5], r2[5], mf[5], rf[5];
      tu_poison(y1, n, dt);
      tu_poison(y2, n, dt);
      ck_assert_int_eq(sn_layernorm_fwd(y1, m1, r1, x, g, b, rows, d, EPS, dt), SN_OK);
      ck_assert_int_eq(sn_layernorm_fwd(yf, mf, rf, xf, g, b, rows, d, EPS, SN_DTYPE_F32), SN_OK);
      tu_assert_bitwise(m1, mf, sizeof m1, "bf16 layernorm mean vs f32 on the widened rows");
      tu_assert_bitwise(r1, rf, sizeof r1, "bf16 layernorm rstd vs f32 on the widened rows");
      if (b == NULL)
        for (int64_t i = 0; i < n; i++)
          TU_CHECK(tu_get(y1, i, dt) == tu_round(yf[i], dt),
                   "d=%lld gamma=%d: bf16 y[%lld] = %.9g, f32 y rounded %.9g", (long long)d,
                   g != NULL, (long long)i, tu_get(y1, i, dt), tu_round(yf[i], dt));
      ck_assert_int_eq(sn_add_layernorm_fwd(y2, sum, m2, r2, x, zero, g, b, rows, d, EPS, dt),
                       SN_OK);
      tu_assert_bitwise(y1, y2, (size_t)n * 2, "bf16 layernorm y vs the fused kernel's");
      tu_assert_bitwise(m1, m2, sizeof m1, "bf16 layernorm mean vs the fused kernel's");
      tu_assert_bitwise(r1, r2, sizeof r1, "bf16 layernorm rstd vs the fused kernel's");
      free(x), free(zero), free(sum), free(y1), free(y2), free(xf), free(yf), free(gamma);
      free(beta);
    }
}
END_TEST

/* Constant rows: variance 0, so y == beta exactly (0 without beta), mean == the value, rstd ==
 * 1/√eps, no NaN; the backward stays finite and matches the analytic gradient. */
START_TEST(test_constant_rows) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  const double vals[] = {0.0, -3.5, 1e4, 0.1, 65504.0};
  const int64_t rows = 5, d = 65, n = rows * d;
  tu_rng_t rng;
  tu_rng_seed(&rng, 7);
  void *x = tu_alloc(n, dt), *y = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < d; i++) tu_set(x, r * d + i, vals[r], dt);
  tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
  float mean[5], rstd[5], dgamma[65], dbeta[65];
  for (int with_beta = 0; with_beta < 2; with_beta++) {
    tu_poison(y, n, dt);
    tu_poison_f32(mean, rows);
    tu_poison_f32(rstd, rows);
    ck_assert_int_eq(sn_layernorm_fwd(y, mean, rstd, x, gamma, with_beta ? beta : NULL, rows, d,
                                      EPS, dt), SN_OK);
    for (int64_t r = 0; r < rows; r++) {
      TU_CHECK(mean[r] == (float)tu_get(x, r * d, dt), "constant row %lld: mean %g", (long long)r,
            (double)mean[r]);
      TU_CHECK(rstd[r] == (float)(1.0 / sqrt((double)EPS)), "constant row %lld: rstd %g", (long long)r,
            (double)rstd[r]);
      for (int64_t i = 0; i < d; i++) {
        double want = with_beta ? tu_round(beta[i], dt) : 0.0;
        TU_CHECK(tu_get(y, r * d + i, dt) == want, "row %lld: y[%lld] = %g, want %g",
                      (long long)r, (long long)i, tu_get(y, r * d + i, dt), want);
      }
    }
  }
  run_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, dt, "constant rows backward");
  free(x), free(y), free(dy), free(dx), free(gamma), free(beta);
}
END_TEST

/* bf16/f16 inputs near 6e4 (x² ≈ 3.6e9 would overflow f16 arithmetic): finite, correct
 * outputs. Row 0: 6e4 ± 2000; row 1: ±6e4 alternating with noise; row 2: all near 65504. */
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
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
  float mean[3], rstd[3], *dgamma = malloc(d * sizeof(float)), *dbeta = malloc(d * sizeof(float));
  tu_poison(y, n, dt);
  ck_assert_int_eq(sn_layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, d, EPS, dt), SN_OK);
  double *xd = tu_to_f64(x, n, dt), *yr = malloc((size_t)n * sizeof(double));
  double *sc = malloc((size_t)n * sizeof(double));
  ref_fwd(yr, sc, NULL, NULL, xd, gamma, beta, rows, d, EPS);
  tu_assert_fwd(y, dt, yr, sc, n, "near 6e4 forward");

  run_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, dt, "near 6e4 backward");
  free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(dgamma), free(dbeta);
  free(xd), free(yr), free(sc);
}
END_TEST

/* ---- fused residual add --------------------------------------------------------------------- */

/* sum_out == round_dtype(x + residual) with the add in f32; y == LayerNorm(sum_out) within the
 * forward bound; (y, mean, rstd) bitwise equal to sn_layernorm_fwd on sum_out; sum_out == x and
 * sum_out == residual give the same bits. */
static void check_add(int64_t rows, int64_t d, sn_dtype_t dt, int has_g, int has_b, uint64_t seed) {
  char what[160];
  snprintf(what, sizeof what, "add_layernorm_fwd rows=%lld d=%lld gamma=%d beta=%d",
           (long long)rows, (long long)d, has_g, has_b);
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  const int64_t n = rows * d;
  const size_t bytes = (size_t)n * (size_t)sn_dtype_size(dt);
  void *x = tu_alloc(n, dt), *res = tu_alloc(n, dt), *sum = tu_alloc(n, dt), *y = tu_alloc(n, dt);
  void *y2 = tu_alloc(n, dt), *buf = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, 0.3, 1.0, &rng);
  tu_fill_normal(res, n, dt, -0.1, 2.0, &rng);
  float *gamma = has_g ? tu_random_f32(d, 1.0, 0.5, &rng) : NULL;
  float *beta = has_b ? tu_random_f32(d, 0.0, 1.0, &rng) : NULL;
  float *m = malloc(rows * sizeof(float)), *rs = malloc(rows * sizeof(float));
  float *m2 = malloc(rows * sizeof(float)), *rs2 = malloc(rows * sizeof(float));
  tu_poison(sum, n, dt);
  tu_poison(y, n, dt);
  tu_poison_f32(m, rows);
  tu_poison_f32(rs, rows);
  sn_status_t st = sn_add_layernorm_fwd(y, sum, m, rs, x, res, gamma, beta, rows, d, EPS, dt);
  ck_assert_msg(st == SN_OK, "%s: %s", what, sn_last_error());

  double *sref = malloc((size_t)n * sizeof(double)), *yr = malloc((size_t)n * sizeof(double));
  double *sc = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++) {
    float s = (float)tu_get(x, i, dt) + (float)tu_get(res, i, dt);
    sref[i] = tu_round(s, dt);
    TU_CHECK(tu_get(sum, i, dt) == sref[i], "%s: sum_out[%lld] = %.9g, want %.9g", what,
                  (long long)i, tu_get(sum, i, dt), sref[i]);
  }
  ref_fwd(yr, sc, NULL, NULL, sref, gamma, beta, rows, d, EPS);
  tu_assert_fwd(y, dt, yr, sc, n, what);

  /* the unfused forward on sum_out gives the same bits */
  tu_poison(y2, n, dt);
  ck_assert_int_eq(sn_layernorm_fwd(y2, m2, rs2, sum, gamma, beta, rows, d, EPS, dt), SN_OK);
  tu_assert_bitwise(y, y2, bytes, "fused y vs sn_layernorm_fwd(sum_out)");
  tu_assert_bitwise(m, m2, rows * sizeof(float), "fused mean");
  tu_assert_bitwise(rs, rs2, rows * sizeof(float), "fused rstd");

  /* sum_out aliasing x, then residual */
  for (int alias = 0; alias < 2; alias++) {
    memcpy(buf, alias == 0 ? x : res, bytes);
    tu_poison(y2, n, dt);
    const void *xa = alias == 0 ? buf : x, *ra = alias == 0 ? res : buf;
    st = sn_add_layernorm_fwd(y2, buf, m2, rs2, xa, ra, gamma, beta, rows, d, EPS, dt);
    ck_assert_int_eq(st, SN_OK);
    tu_assert_bitwise(buf, sum, bytes, alias == 0 ? "sum_out == x" : "sum_out == residual");
    tu_assert_bitwise(y2, y, bytes, "aliased sum_out: y");
    tu_assert_bitwise(m2, m, rows * sizeof(float), "aliased sum_out: mean");
  }
  free(x), free(res), free(sum), free(y), free(y2), free(buf), free(gamma), free(beta);
  free(m), free(rs), free(m2), free(rs2), free(sref), free(yr), free(sc);
}

START_TEST(test_add_fwd) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  for (int64_t a = 0; a < NROWS; a++)
    for (int64_t b = 0; b < ND; b++)
      check_add(ROWS[a], DS[b], dt, (a + b) % 2 == 0, (a + b) % 3 != 0, 500 + 10 * a + b);
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
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
    float m[4], r[4], m2[4], r2[4];
    for (int gb = 0; gb < 4; gb++) {
      const float *g = gb & 1 ? gamma : NULL, *b = gb & 2 ? beta : NULL;
      char what[128];
      snprintf(what, sizeof what, "add_layernorm_fwd %s d=%lld gamma=%d beta=%d",
               tu_dtype_name[dt], (long long)d, g != NULL, b != NULL);
      tu_poison(sum, n, dt);
      tu_poison(y, n, dt);
      ck_assert_int_eq(sn_add_layernorm_fwd(y, sum, m, r, x, res, g, b, rows, d, EPS, dt), SN_OK);
      tu_assert_residual_sum(sum, x, res, n, dt, what);
      tu_poison(y2, n, dt);
      ck_assert_int_eq(sn_layernorm_fwd(y2, m2, r2, sum, g, b, rows, d, EPS, dt), SN_OK);
      tu_assert_bitwise(y, y2, bytes, what);
      tu_assert_bitwise(m, m2, sizeof m, what);
      tu_assert_bitwise(r, r2, sizeof r, what);
    }
    free(x), free(res), free(sum), free(y), free(y2), free(gamma), free(beta);
  }
}
END_TEST

/* ---- backward ------------------------------------------------------------------------------- */

/* One backward case: mean/rstd from sn_layernorm_fwd, then run_bwd. Also: dgamma or dbeta NULL
 * changes none of the other outputs' bits. */
static void check_bwd(int64_t rows, int64_t d, sn_dtype_t dt, int has_g, double mu, double sigma,
                      uint64_t seed) {
  char what[160];
  snprintf(what, sizeof what, "layernorm_bwd rows=%lld d=%lld gamma=%d mean=%g", (long long)rows,
           (long long)d, has_g, mu);
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  const int64_t n = rows * d;
  const size_t bytes = (size_t)n * (size_t)sn_dtype_size(dt);
  void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt), *dx2 = tu_alloc(n, dt);
  tu_fill_normal(x, n, dt, mu, sigma, &rng);
  tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
  float *gamma = has_g ? tu_random_f32(d, 1.0, 0.5, &rng) : NULL;
  float *mean = malloc(rows * sizeof(float)), *rstd = malloc(rows * sizeof(float));
  float *dg = malloc(d * sizeof(float)), *db = malloc(d * sizeof(float));
  float *dg2 = malloc(d * sizeof(float)), *db2 = malloc(d * sizeof(float));
  ck_assert_int_eq(sn_layernorm_fwd(dx, mean, rstd, x, gamma, NULL, rows, d, EPS, dt), SN_OK);
  run_bwd(dx, dg, db, dy, x, mean, rstd, gamma, rows, d, dt, what);

  /* dgamma only, dbeta only, neither: same bits for what is computed */
  for (int mask = 0; mask < 3; mask++) {
    tu_poison(dx2, n, dt);
    tu_poison_f32(dg2, d);
    tu_poison_f32(db2, d);
    ck_assert_int_eq(sn_layernorm_bwd(dx2, mask == 0 ? dg2 : NULL, mask == 1 ? db2 : NULL, dy, x,
                                      mean, rstd, gamma, rows, d, dt), SN_OK);
    tu_assert_bitwise(dx2, dx, bytes, "dx with dgamma/dbeta NULL");
    if (mask == 0) tu_assert_bitwise(dg2, dg, d * sizeof(float), "dgamma alone");
    if (mask == 1) tu_assert_bitwise(db2, db, d * sizeof(float), "dbeta alone");
    for (int64_t j = 0; j < d; j++) { /* an output passed as NULL was not written elsewhere */
      TU_CHECK(mask == 0 || isnan(dg2[j]), "dgamma[%lld] written, NULL passed", (long long)j);
      TU_CHECK(mask == 1 || isnan(db2[j]), "dbeta[%lld] written, NULL passed", (long long)j);
    }
  }
  free(x), free(dy), free(dx), free(dx2), free(gamma), free(mean), free(rstd);
  free(dg), free(db), free(dg2), free(db2);
}

START_TEST(test_bwd_shapes) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  for (int64_t a = 0; a < NROWS; a++)
    for (int64_t b = 0; b < ND; b++)
      for (int g = 0; g < 2; g++) check_bwd(ROWS[a], DS[b], dt, g, 0.5, 2.0, 700 + 10 * a + b);
}
END_TEST

/* Gradients near FLT_MAX that cancel: rows 0-3 (one reduction chunk of 256 rows) have
 * dy[:, 0] = +3e38, +3e38, −3e38, −3e38, the rest small. The f32 partials of dgamma/dbeta would
 * overflow to inf at the second row; such rows must go to the fp64 partials, and dgamma, dbeta
 * and dx match the fp64 reference. x rows [1, −1]: x̂ = ±1. */
START_TEST(test_bwd_huge_dy) {
  const int64_t rows = 256, d = 2, n = rows * d;
  for (int id = 0; id < 2; id++) {
    const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
    tu_rng_t rng;
    tu_rng_seed(&rng, 950 + (uint64_t)id);
    void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt);
    tu_fill_huge_dy(x, dy, rows, dt, &rng);
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), mean[256], rstd[256], dg[2], db[2];
    ck_assert_int_eq(sn_layernorm_fwd(dx, mean, rstd, x, NULL, NULL, rows, d, EPS, dt), SN_OK);
    run_bwd(dx, dg, db, dy, x, mean, rstd, gamma, rows, d, dt, "layernorm_bwd, dy near FLT_MAX");
    free(x), free(dy), free(dx), free(gamma);
  }
  /* bf16 rows sum Σg in f32 lanes: dy[0] = dy[16] = 3e38 overflow them (one lane of the
   * widened rows' sums), and the row must be computed from fp64 sums (else mean(g) = inf and dx
   * is not finite). With dgamma such a row's terms decline the f32 partials anyway; without,
   * dy[32] = 3e38 too (one lane with dy[0] in the bf16 kernel's pair sums; dgamma[32] would be
   * beyond FLT_MAX). */
  const int64_t r2 = 3, d2 = 64, n2 = r2 * d2;
  tu_rng_t rng;
  tu_rng_seed(&rng, 960);
  void *x = tu_alloc(n2, SN_DTYPE_BF16), *dy = tu_alloc(n2, SN_DTYPE_BF16);
  void *dx = tu_alloc(n2, SN_DTYPE_BF16);
  tu_fill_normal(x, n2, SN_DTYPE_BF16, 0.5, 2.0, &rng);
  tu_fill_normal(dy, n2, SN_DTYPE_BF16, 0.0, 1.0, &rng);
  tu_set(dy, 0, 3e38, SN_DTYPE_BF16);
  tu_set(dy, 16, 3e38, SN_DTYPE_BF16);
  float *gamma = tu_random_f32(d2, 1.0, 0.1, &rng), mean[3], rstd[3];
  float *dg = malloc((size_t)d2 * sizeof(float)), *db = malloc((size_t)d2 * sizeof(float));
  ck_assert_int_eq(sn_layernorm_fwd(dx, mean, rstd, x, NULL, NULL, r2, d2, EPS, SN_DTYPE_BF16),
                   SN_OK);
  run_bwd(dx, dg, db, dy, x, mean, rstd, gamma, r2, d2, SN_DTYPE_BF16,
          "layernorm_bwd bf16, f32 row sums overflow");
  tu_set(dy, 32, 3e38, SN_DTYPE_BF16);
  tu_poison(dx, n2, SN_DTYPE_BF16);
  ck_assert_int_eq(
      sn_layernorm_bwd(dx, NULL, NULL, dy, x, mean, rstd, gamma, r2, d2, SN_DTYPE_BF16), SN_OK);
  double *xd = tu_to_f64(x, n2, SN_DTYPE_BF16), *dyd = tu_to_f64(dy, n2, SN_DTYPE_BF16);
  double *dxr = malloc((size_t)n2 * sizeof(double)), dgr[64], dbr[64];
  const double scale = ref_bwd(dxr, dgr, dbr, dyd, xd, gamma, r2, d2, EPS);
  tu_assert_rel_scaled(dx, SN_DTYPE_BF16, dxr, n2, scale, bwd_tol(SN_DTYPE_BF16),
                    "layernorm_bwd bf16, f32 row sums overflow, no dgamma");
  free(x), free(dy), free(dx), free(gamma), free(dg), free(db), free(xd), free(dyd), free(dxr);
}
END_TEST

/* dx whose f32 intermediates leave the range while dx does not (computed from them, dx would
 * be inf in every dtype): (1) dy = ±2.3e38 with x = [1e30, −1e30, 0, 0] (rstd ~1e-30,
 * dx ~2e8), where g − mean(g) = 3.45e38 overflows (dgamma, 3.25e38, does not); (2) dy = ±1e36
 * with gamma = 300, where g alone is beyond FLT_MAX (dx ~2e38). f32 and bf16 (f16 holds neither),
 * with and without dgamma/dbeta: dx against the fp64 reference, relative to ‖rstd·dy·gamma‖ as
 * everywhere (and dgamma, dbeta where asked, to the f32 bound). Such rows are computed in fp64
 * (ln_dx_f32_ok). */
START_TEST(test_bwd_dx_range) {
  static const double X[2][4] = {{1e30, -1e30, 0.0, 0.0}, {1.0, -1.0, 0.0, 0.0}};
  static const double DY[2][4] = {{2.3e38, -2.3e38, -2.3e38, -2.3e38},
                                  {1e36, -1e36, -1e36, -1e36}};
  const int64_t rows = 1, d = 4;
  for (int id = 0; id < 2; id++)
    for (int c = 0; c < 2; c++) {
      const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
      void *x = tu_alloc(d, dt), *dy = tu_alloc(d, dt), *dx = tu_alloc(d, dt);
      float gamma[4], mean, rstd, dg[4], db[4];
      for (int64_t i = 0; i < d; i++) {
        tu_set(x, i, X[c][i], dt);
        tu_set(dy, i, DY[c][i], dt);
        gamma[i] = c == 0 ? 1.0f : 300.0f;
      }
      ck_assert_int_eq(sn_layernorm_fwd(dx, &mean, &rstd, x, NULL, NULL, rows, d, EPS, dt), SN_OK);
      char what[96];
      snprintf(what, sizeof what, "layernorm_bwd dx range case %d (%s)", c, tu_dtype_name[dt]);
      run_bwd(dx, dg, db, dy, x, &mean, &rstd, gamma, rows, d, dt, what);
      tu_poison(dx, d, dt);
      ck_assert_int_eq(sn_layernorm_bwd(dx, NULL, NULL, dy, x, &mean, &rstd, gamma, rows, d, dt),
                       SN_OK);
      double *xd = tu_to_f64(x, d, dt), *dyd = tu_to_f64(dy, d, dt), dxr[4], dgr[4], dbr[4];
      const double scale = ref_bwd(dxr, dgr, dbr, dyd, xd, gamma, rows, d, EPS);
      tu_assert_rel_scaled(dx, dt, dxr, d, scale, bwd_tol(dt), what);
      free(x), free(dy), free(dx), free(xd), free(dyd);
    }
}
END_TEST

/* Saved statistics that leave x̂ = (x − mean)·rstd near FLT_MAX while dy·gamma is 0 or tiny
 * (mean 0, rstd 1 for x = [FLT_MAX, −FLT_MAX, ...], which no forward gives but the API takes):
 * the bound on dx's intermediates must not pass them because dy is small, since the re-centred
 * x̂ − mean(x̂) overflows f32 and dx would come out NaN or inf where it is 0 or tiny. dx
 * against the gradient in fp64 with the saved mean and rstd; f32 and bf16, dy 0 and dy = the
 * least subnormal, with and without dgamma/dbeta (those are NaN-free and match too). */
START_TEST(test_bwd_saved_xhat_huge) {
  enum { D = 32 };
  for (int id = 0; id < 2; id++)
    for (int c = 0; c < 4; c++) {
      const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
      const double big = dt == SN_DTYPE_F32 ? (double)FLT_MAX : 0x1.feP127; /* bf16's largest */
      const double tiny = c & 1 ? (dt == SN_DTYPE_F32 ? 0x1p-149 : 0x1p-133) : 0.0;
      void *x = tu_alloc(D, dt), *dy = tu_alloc(D, dt), *dx = tu_alloc(D, dt);
      for (int64_t i = 0; i < D; i++) {
        tu_set(x, i, i == 0 ? big : -big, dt);
        tu_set(dy, i, tiny, dt);
      }
      const float mean = 0.0f, rstd = 1.0f;
      float dg[D], db[D];
      float *dgo = c & 2 ? dg : NULL, *dbo = c & 2 ? db : NULL;
      char what[96];
      snprintf(what, sizeof what, "layernorm_bwd %s, saved x̂ near FLT_MAX, dy %g, dgamma=%d",
               tu_dtype_name[dt], tiny, dgo != NULL);
      tu_poison(dx, D, dt);
      ck_assert_int_eq(sn_layernorm_bwd(dx, dgo, dbo, dy, x, &mean, &rstd, NULL, 1, D, dt), SN_OK);
      /* the gradient with these statistics: x̂ = x, x̂' = x̂ − mean(x̂), dx = g − mean(g) −
       * x̂'·mean(g·x̂'), dgamma = dy·x̂', dbeta = dy (rstd 1, gamma 1), in fp64 */
      double xh[D], c0 = 0.0, mg = 0.0, mgx = 0.0;
      for (int i = 0; i < D; i++) c0 += tu_get(x, i, dt) / D;
      for (int i = 0; i < D; i++) {
        xh[i] = tu_get(x, i, dt) - c0;
        mg += tiny / D;
        mgx += tiny * xh[i] / D;
      }
      for (int i = 0; i < D; i++) {
        const double want = tiny - mg - xh[i] * mgx, got = tu_get(dx, i, dt);
        TU_CHECK(isfinite(got) && fabs(got - want) <= 0x1p-8 * fabs(want) + 0x1p-149,
                 "%s: dx[%d] = %g, want %g", what, i, got, want);
        if (dgo != NULL) {
          const double wg = tiny * xh[i];
          TU_CHECK(fabs((double)dg[i] - wg) <= 0x1p-20 * fabs(wg) + 0x1p-149 && db[i] == (float)tiny,
                   "%s: dgamma[%d] = %g (want %g), dbeta %g", what, i, (double)dg[i], wg,
                   (double)db[i]);
        }
      }
      free(x), free(dy), free(dx);
    }
}
END_TEST

/* Non-finite inputs of the backward propagate as in PyTorch: a row with a NaN dy (row 0), an
 * infinite dy (row 1) or an infinite x (row 2, whose saved mean is then inf) has no finite dx,
 * and dgamma/dbeta carry them (dgamma NaN throughout from row 2's x̂; dbeta NaN and +inf in the
 * two columns of rows 0 and 1); row 3 matches the fp64 gradient. f32 and bf16, d = 200 (six pair
 * blocks of the bf16 rows and a tail), with and without gamma and dgamma/dbeta; then a gamma
 * with a NaN (all payload bits set), which leaves no dx finite. The bf16 pair path narrows dx
 * without the NaN case, on the grounds that such rows never reach it. */
START_TEST(test_bwd_nonfinite_rows) {
  const int64_t rows = 4, d = 200, n = rows * d;
  for (int id = 0; id < 2; id++)
    for (int v = 0; v < 4; v++) {
      const sn_dtype_t dt = id == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
      tu_rng_t rng;
      tu_rng_seed(&rng, 1700 + 4 * (uint64_t)id + (uint64_t)v);
      void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt), *dx = tu_alloc(n, dt);
      tu_fill_normal(x, n, dt, 0.5, 2.0, &rng);
      tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
      tu_set(dy, 5, NAN, dt);
      tu_set(dy, d + 150, INFINITY, dt);
      tu_set(x, 2 * d + 40, INFINITY, dt);
      float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), mean[4], rstd[4];
      float *dg = malloc((size_t)d * sizeof(float)), *db = malloc((size_t)d * sizeof(float));
      const float *g = v & 1 ? gamma : NULL;
      float *dgo = v & 2 ? dg : NULL, *dbo = v & 2 ? db : NULL;
      char what[96];
      snprintf(what, sizeof what, "layernorm_bwd %s gamma=%d dgamma=%d, non-finite rows",
               tu_dtype_name[dt], g != NULL, dgo != NULL);
      ck_assert_int_eq(sn_layernorm_fwd(dx, mean, rstd, x, NULL, NULL, rows, d, EPS, dt), SN_OK);
      tu_poison(dx, n, dt);
      tu_poison_f32(dg, d);
      tu_poison_f32(db, d);
      ck_assert_int_eq(sn_layernorm_bwd(dx, dgo, dbo, dy, x, mean, rstd, g, rows, d, dt), SN_OK);
      for (int64_t i = 0; i < 3 * d; i++)
        TU_CHECK(!isfinite(tu_get(dx, i, dt)), "%s: dx[%lld] = %g, finite", what, (long long)i,
                 tu_get(dx, i, dt));
      double *xd = tu_to_f64(x, n, dt), *dyd = tu_to_f64(dy, n, dt), *dxr = malloc((size_t)d * 8);
      double *dgr = malloc((size_t)d * 8), *dbr = malloc((size_t)d * 8);
      const double scale = ref_bwd(dxr, dgr, dbr, dyd + 3 * d, xd + 3 * d, g, 1, d, EPS);
      tu_assert_rel_scaled((char *)dx + 3 * d * sn_dtype_size(dt), dt, dxr, d, scale, bwd_tol(dt),
                        what);
      if (dgo != NULL)
        for (int64_t j = 0; j < d; j++) {
          TU_CHECK(isnan(dg[j]), "%s: dgamma[%lld] = %g, not NaN", what, (long long)j,
                   (double)dg[j]);
          double want = 0.0;
          for (int64_t r = 0; r < rows; r++) want += dyd[r * d + j];
          TU_CHECK(j == 5 ? isnan(db[j])
                          : j == 150 ? db[j] == INFINITY
                                     : fabs(db[j] - want) <= TU_RTOL_F32_BWD * (fabs(want) + 1.0),
                   "%s: dbeta[%lld] = %g, want %g", what, (long long)j, (double)db[j], want);
        }
      /* gamma NaN with every payload bit set: every row's Σg is NaN, and every dx must be NaN
       * (rounded without the NaN case, 0x7fffffff would become −0) */
      const uint32_t nan_bits = 0x7fffffffu;
      memcpy(&gamma[17], &nan_bits, sizeof nan_bits);
      tu_poison(dx, n, dt);
      ck_assert_int_eq(sn_layernorm_bwd(dx, dgo, dbo, dy, x, mean, rstd, gamma, rows, d, dt),
                       SN_OK);
      for (int64_t i = 0; i < n; i++)
        TU_CHECK(isnan(tu_get(dx, i, dt)), "%s, gamma NaN: dx[%lld] = %g, not NaN", what,
                 (long long)i, tu_get(dx, i, dt));
      free(x), free(dy), free(dx), free(gamma), free(dg), free(db), free(xd), free(dyd);
      free(dxr), free(dgr), free(dbr);
    }
}
END_TEST

/* The backward's re-centred x̂ keeps |mean| ≫ σ exact although the saved mean is f32. */
START_TEST(test_bwd_large_mean) {
  for (int64_t b = 0; b < ND; b++) {
    check_bwd(3, DS[b], SN_DTYPE_F32, 1, 1e4, 1e-2, 800 + b);
    check_bwd(1000, DS[b] > 1000 ? 256 : DS[b], SN_DTYPE_F32, 0, -1e4, 1e-2, 810 + b);
    check_bwd(3, DS[b], SN_DTYPE_F16, 1, 2000.0, 2.0, 820 + b);
  }
}
END_TEST

/* The fp64 analytic gradient (ref_bwd) against central differences of ref_fwd, for the loss
 * L = Σ y·w with random w: dx, dgamma, dbeta. Step h = 1e-6 (x, gamma, beta are O(1)). */
static double loss(const double *x, const float *gamma, const float *beta, const double *w,
                   int64_t rows, int64_t d, double *ybuf) {
  ref_fwd(ybuf, NULL, NULL, NULL, x, gamma, beta, rows, d, EPS);
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
  double *dg = malloc(d * sizeof(double)), *db = malloc(d * sizeof(double));
  for (int64_t i = 0; i < n; i++) x[i] = 0.5 + 2.0 * tu_rng_normal(&rng);
  for (int64_t i = 0; i < n; i++) w[i] = tu_rng_normal(&rng);
  float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
  double *rstd = malloc(rows * sizeof(double));
  ref_bwd(dx, dg, db, w, x, gamma, rows, d, EPS);
  ref_fwd(ybuf, NULL, NULL, rstd, x, gamma, beta, rows, d, EPS);

  /* dx: error relative to max(||dx||, ||rstd·g||) over the sampled elements (see
   * assert_rel_scaled) */
  double num = 0.0, den = 0.0, scale = 0.0, num_p = 0.0, den_p = 0.0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < d; i += step) { /* only row r depends on x[r, i] */
      double *xr = x + r * d, keep = xr[i];
      xr[i] = keep + h;
      double lp = loss(xr, gamma, beta, w + r * d, 1, d, ybuf);
      xr[i] = keep - h;
      double lm = loss(xr, gamma, beta, w + r * d, 1, d, ybuf);
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

  for (int which = 0; which < 2; which++) { /* gamma, then beta */
    float *p = which == 0 ? gamma : beta;
    const double *an = which == 0 ? dg : db;
    for (int64_t i = 0; i < d; i += step) {
      float keep = p[i];
      /* gamma/beta are f32: perturb by an exactly representable step around them */
      double hh = ldexp(1.0, -20) * fmax(1.0, fabs(keep));
      p[i] = (float)(keep + hh);
      double dp = (double)p[i] - keep, lp = loss(x, gamma, beta, w, rows, d, ybuf);
      p[i] = (float)(keep - hh);
      double dm = keep - (double)p[i], lm = loss(x, gamma, beta, w, rows, d, ybuf);
      p[i] = keep;
      double fd = (lp - lm) / (dp + dm), e = fd - an[i];
      num_p += e * e;
      den_p += an[i] * an[i];
    }
    double errp = sqrt(num_p) / fmax(sqrt(den_p), 1e-300);
    ck_assert_msg(errp <= TU_RTOL_FD, "FD d%s rows=%lld d=%lld: %.3e", which ? "beta" : "gamma",
                  (long long)rows, (long long)d, errp);
    num_p = den_p = 0.0;
  }
  free(x), free(w), free(ybuf), free(dx), free(dg), free(db), free(gamma), free(beta), free(rstd);
}

START_TEST(test_fd) {
  for (int64_t a = 0; a < 2; a++) /* rows 1 and 3: the formulas, not the sizes */
    for (int64_t b = 0; b < ND; b++) check_fd(ROWS[a], DS[b], 900 + 10 * a + b);
}
END_TEST

/* ---- bad input, empty batch ------------------------------------------------------------------ */

enum { BR = 3, BD = 8, BN = BR * BD };
static float bx[BN], bdy[BN], bg[BD], bm[BR], brs[BR];
static struct { float y[BN], sum[BN], dx[BN], mean[BR], rstd[BR], dg[BD], db[BD]; } bout;

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
  float *mean, *rstd;
  const float *smean, *srstd;
  int64_t rows, d;
  float eps;
  sn_dtype_t dt;
} args_t;

static args_t good(void) {
  args_t a = {bout.y, bout.sum, bout.dx, bx, bdy, bdy, bout.mean, bout.rstd, bm, brs, BR, BD, 1e-5f,
              SN_DTYPE_F32};
  return a;
}

/* Calls function f (0 fwd, 1 fused, 2 bwd) with a. */
static sn_status_t call(int f, args_t a) {
  if (f == 0) return sn_layernorm_fwd(a.y, a.mean, a.rstd, a.x, bg, bg, a.rows, a.d, a.eps, a.dt);
  if (f == 1)
    return sn_add_layernorm_fwd(a.y, a.sum, a.mean, a.rstd, a.x, a.res, bg, bg, a.rows, a.d, a.eps,
                                a.dt);
  return sn_layernorm_bwd(a.dx, bout.dg, bout.db, a.dy, a.x, a.smean, a.srstd, bg, a.rows, a.d,
                          a.dt);
}

START_TEST(test_bad_input) {
  static const char *const fns[] = {"sn_layernorm_fwd", "sn_add_layernorm_fwd", "sn_layernorm_bwd"};
  for (int i = 0; i < BN; i++) bx[i] = bdy[i] = (float)i;
  for (int i = 0; i < BD; i++) bg[i] = 1.0f;
  for (int i = 0; i < BR; i++) bm[i] = 1.0f, brs[i] = 1.0f;
  for (int f = 0; f < 3; f++) {
    const char *fn = fns[f];
    args_t a;
#define CASE(field, value, want)          \
  a = good();                            \
  a.field = value;                       \
  pattern();                             \
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
      CASE(smean, NULL, SN_ERR_NULL_POINTER);
      CASE(srstd, NULL, SN_ERR_NULL_POINTER);
      /* per-row statistics, like activations, may be NULL in an empty batch (syncnorm.h) */
      a = good(), a.rows = 0, a.smean = NULL, a.srstd = NULL;
      ck_assert_msg(call(f, a) == SN_OK, "%s: rows = 0, mean/rstd NULL: %s", fn, sn_last_error());
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
  ck_assert_int_eq(sn_layernorm_fwd(NULL, bout.mean, bout.rstd, NULL, bg, bg, 0, BD, EPS,
                                    SN_DTYPE_F32), SN_OK);
  ck_assert_int_eq(sn_layernorm_fwd(bout.y, bout.mean, bout.rstd, bx, NULL, NULL, 0, BD, EPS,
                                    SN_DTYPE_BF16), SN_OK);
  ck_assert_int_eq(sn_add_layernorm_fwd(NULL, NULL, bout.mean, bout.rstd, NULL, NULL, bg, bg, 0, BD,
                                        EPS, SN_DTYPE_F16), SN_OK);
  assert_untouched("rows == 0");
  /* backward: an empty batch contributes zero parameter gradients, and writes nothing else */
  ck_assert_int_eq(sn_layernorm_bwd(NULL, bout.dg, bout.db, NULL, NULL, bm, brs, bg, 0, BD,
                                    SN_DTYPE_F32), SN_OK);
  for (int i = 0; i < BD; i++) {
    TU_CHECK(bout.dg[i] == 0.0f && bout.db[i] == 0.0f, "rows == 0: dgamma/dbeta[%d] not zeroed", i);
    memset(&bout.dg[i], 0xA5, 4), memset(&bout.db[i], 0xA5, 4); /* back to the pattern */
  }
  assert_untouched("rows == 0 backward");
}
END_TEST

/* ---- threads, in place ---------------------------------------------------------------------- */

/* fwd, fused and bwd outputs (incl. dgamma/dbeta) are bitwise the same for 1, 2 and 3 threads;
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
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
    void *out[3][4];  /* per thread count: y, sum, y_fused, dx */
    float *stat[3][4]; /* mean, rstd, dgamma, dbeta */
    for (int t = 0; t < 3; t++) {
      omp_set_num_threads(t + 1);
      for (int k = 0; k < 4; k++) out[t][k] = tu_alloc(n, dt), tu_poison(out[t][k], n, dt);
      for (int k = 0; k < 4; k++) {
        int64_t len = k < 2 ? rows : d;
        stat[t][k] = malloc((size_t)len * sizeof(float));
        tu_poison_f32(stat[t][k], len);
      }
      ck_assert_int_eq(sn_layernorm_fwd(out[t][0], stat[t][0], stat[t][1], x, gamma, beta, rows,
                                        d, EPS, dt), SN_OK);
      ck_assert_int_eq(sn_add_layernorm_fwd(out[t][2], out[t][1], NULL, NULL, x, res, gamma, beta,
                                            rows, d, EPS, dt), SN_OK);
      ck_assert_int_eq(sn_layernorm_bwd(out[t][3], stat[t][2], stat[t][3], dy, x, stat[t][0],
                                        stat[t][1], gamma, rows, d, dt), SN_OK);
      tu_assert_all_finite(out[t][3], dt, n, "dx");
      if (t == 0) continue;
      for (int k = 0; k < 4; k++) tu_assert_bitwise(out[t][k], out[0][k], bytes, "threads: tensor");
      for (int k = 0; k < 4; k++)
        tu_assert_bitwise(stat[t][k], stat[0][k], (k < 2 ? rows : d) * sizeof(float), "threads: stat");
    }
    omp_set_num_threads(2);
    for (int t = 0; t < 3; t++)
      for (int k = 0; k < 4; k++) free(out[t][k]), free(stat[t][k]);
    free(x), free(res), free(dy), free(gamma), free(beta);
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
    float *gamma = tu_random_f32(d, 1.0, 0.5, &rng), *beta = tu_random_f32(d, 0.0, 1.0, &rng);
    float m[3], rs[3], m2[3], rs2[3], *dg = malloc(d * 4), *db = malloc(d * 4);
    float *dg2 = malloc(d * 4), *db2 = malloc(d * 4);
    ck_assert_int_eq(sn_layernorm_fwd(y, m, rs, x, gamma, beta, rows, d, EPS, dt), SN_OK);
    memcpy(buf, x, bytes);
    ck_assert_int_eq(sn_layernorm_fwd(buf, m2, rs2, buf, gamma, beta, rows, d, EPS, dt), SN_OK);
    tu_assert_bitwise(buf, y, bytes, "in-place forward y");
    tu_assert_bitwise(m2, m, sizeof m, "in-place forward mean");
    tu_assert_bitwise(rs2, rs, sizeof rs, "in-place forward rstd");

    ck_assert_int_eq(sn_layernorm_bwd(dx, dg, db, dy, x, m, rs, gamma, rows, d, dt), SN_OK);
    memcpy(buf, dy, bytes);
    ck_assert_int_eq(sn_layernorm_bwd(buf, dg2, db2, buf, x, m, rs, gamma, rows, d, dt), SN_OK);
    tu_assert_bitwise(buf, dx, bytes, "in-place backward dx");
    tu_assert_bitwise(dg2, dg, d * 4, "in-place backward dgamma");
    tu_assert_bitwise(db2, db, d * 4, "in-place backward dbeta");
    free(x), free(y), free(buf), free(dy), free(dx), free(gamma), free(beta);
    free(dg), free(db), free(dg2), free(db2);
  }
}
END_TEST

int main(void) {
  omp_set_num_threads(2);
  Suite *s = suite_create("layernorm");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_fwd_shapes, 0, 3);
  tcase_add_test(tc, test_issue_example);
  tcase_add_test(tc, test_large_mean);
  tcase_add_loop_test(tc, test_beta_cancels, 0, 3);
  tcase_add_loop_test(tc, test_shift_fallback, 0, 3);
  tcase_add_test(tc, test_map_overflow);
  tcase_add_test(tc, test_tiny_mean);
  tcase_add_test(tc, test_near_f32_max);
  tcase_add_test(tc, test_nonfinite_rows);
  tcase_add_test(tc, test_bf16_nan_gamma);
  tcase_add_test(tc, test_bf16_path_matches_generic);
  tcase_add_loop_test(tc, test_constant_rows, 0, 3);
  tcase_add_loop_test(tc, test_near_half_max, 0, 2);
  tcase_add_loop_test(tc, test_add_fwd, 0, 3);
  tcase_add_loop_test(tc, test_add_adversarial, 0, 3);
  tcase_add_loop_test(tc, test_bwd_shapes, 0, 3);
  tcase_add_test(tc, test_bwd_large_mean);
  tcase_add_test(tc, test_bwd_huge_dy);
  tcase_add_test(tc, test_bwd_dx_range);
  tcase_add_test(tc, test_bwd_nonfinite_rows);
  tcase_add_test(tc, test_bwd_saved_xhat_huge);
  tcase_add_test(tc, test_fd);
  tcase_add_test(tc, test_bad_input);
  tcase_add_test(tc, test_empty_batch);
  tcase_add_loop_test(tc, test_threads, 0, 3);
  tcase_add_loop_test(tc, test_in_place, 0, 3);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
