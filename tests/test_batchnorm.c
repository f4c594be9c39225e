/*
 * test_batchnorm.c — the BatchNorm building blocks (stats → finalize → apply, infer, bwd_reduce →
 * bwd_apply, and the local backward sn_batchnorm_bwd, checked bitwise against the last two)
 * against fp64 references, finite differences, split batches (what SyncBatchNorm relies on),
 * layouts, thread counts, adversarial data and bad input.
 *
 * Layouts: NCHW = [N, C, S], NHWC = [N, S, C]. References read the activations as doubles from
 * the dtype buffers, so bf16/f16 tests compare against the exact function of the rounded inputs.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "testutil.h"

/* ---- tolerances ---------------------------------------------------------------------------- */
/* f64 batch mean vs the two-pass fp64 reference: both are fp64 sums of <= 1000 values, error
 * about count·2^-53 relative to mean|x|; 1e-12 of (|mean| + σ) leaves a factor 10 of margin. */
#define TOL_MEAN_F64 1e-12
/* var and rstd are f32 outputs of fp64 computations: one rounding (2^-24) plus the fp64 error
 * above; 2 f32 ulp (2.4e-7 relative). */
#define TOL_STAT_F32 2.4e-7
/* fp64 backward sums (Σdy, Σdy·x̂) vs the reference: fp64 sums of <= 1000 terms with the f32
 * rstd in x̂ (the reference uses the same f32 rstd): 1e-12 relative to Σ|terms|. */
#define TOL_SUM_F64 1e-12
/* bf16/f16 backward (dx): tu_rtol_half_bwd (testutil.h). */

static const float EPS = 1e-5f;
static const sn_dtype_t DTYPES[3] = {SN_DTYPE_F32, SN_DTYPE_BF16, SN_DTYPE_F16};
static const sn_layout_t LAYOUTS[2] = {SN_LAYOUT_NCHW, SN_LAYOUT_NHWC};
static const char *const LNAME[2] = {"NCHW", "NHWC"};
/* (N, S) pairs: N·S ∈ {2, 3, 1000}, with N = 1 and S = 1 among them. */
static const int64_t NS[][2] = {{1, 2}, {2, 1}, {3, 1}, {1, 3}, {1, 1000}, {8, 125}, {1000, 1}};
static const int64_t CS[] = {1, 3, 64, 65};

/* ---- small helpers ------------------------------------------------------------------------- */

static void poison_f64(double *p, int64_t n) {
  for (int64_t i = 0; i < n; i++) p[i] = NAN;
}
/* x[n, c, s] = mu_c + sd_c·N(0, 1), rounded to dt; channels get different means and scales. */
static void fill_bn(void *x, int64_t N, int64_t C, int64_t S, sn_layout_t lay, sn_dtype_t dt,
                    double mean, double std, tu_rng_t *r) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t s = 0; s < S; s++) {
        double mu = mean + 0.37 * (double)(c % 7), sd = std * (1.0 + 0.25 * (double)(c % 5));
        tu_set(x, tu_at(lay, n, c, s, C, S), mu + sd * tu_rng_normal(r), dt);
      }
}

/* ---- fp64 references ------------------------------------------------------------------------ */

/* Per-channel two-pass mean and biased variance of x (doubles, layout lay). */
static void ref_stats(double *mean, double *var, const double *x, int64_t N, int64_t C, int64_t S,
                      sn_layout_t lay) {
  const double M = (double)(N * S);
  for (int64_t c = 0; c < C; c++) {
    double s1 = 0.0, s2 = 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) s1 += x[tu_at(lay, n, c, s, C, S)];
    mean[c] = s1 / M;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        double d = x[tu_at(lay, n, c, s, C, S)] - mean[c];
        s2 += d * d;
      }
    var[c] = s2 / M;
  }
}

/* The affine map of one element in fp64: returns x̂·gamma + beta for x̂ = (x − mean)·rstd, and
 * stores |x̂·gamma| + |beta| (the bf16/f16 bound's scale, tu_check_lowp_mixed) at scale. */
static double ref_map(double *scale, double x, double mean, double rstd, double gamma,
                      double beta) {
  const double xg = (x - mean) * rstd * gamma;
  *scale = fabs(xg) + fabs(beta);
  return xg + beta;
}

/* Training forward in fp64: y = (x − mean)/√(var + eps)·gamma + beta (batch statistics); scale
 * (may be NULL) as ref_map's. */
static void ref_train_fwd(double *y, double *scale, const double *x, const double *gamma,
                          const double *beta, int64_t N, int64_t C, int64_t S, sn_layout_t lay,
                          double eps) {
  double *mean = tu_dalloc(C), *var = tu_dalloc(C);
  ref_stats(mean, var, x, N, C, S, lay);
  for (int64_t c = 0; c < C; c++) {
    double rs = 1.0 / sqrt(var[c] + eps), g = gamma ? gamma[c] : 1.0, b = beta ? beta[c] : 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t i = tu_at(lay, n, c, s, C, S);
        double sc;
        y[i] = ref_map(&sc, x[i], mean[c], rs, g, b);
        if (scale) scale[i] = sc;
      }
  }
  free(mean);
  free(var);
}

/* Analytic training backward in fp64 (batch statistics recomputed from x):
 *   dx = gamma·rstd·(dy − mean(dy) − x̂·mean(dy·x̂)),  dgamma = Σ dy·x̂,  dbeta = Σ dy. */
static void ref_train_bwd(double *dx, double *dgamma, double *dbeta, const double *dy,
                          const double *x, const double *gamma, int64_t N, int64_t C, int64_t S,
                          sn_layout_t lay, double eps) {
  double *mean = tu_dalloc(C), *var = tu_dalloc(C);
  const double M = (double)(N * S);
  ref_stats(mean, var, x, N, C, S, lay);
  for (int64_t c = 0; c < C; c++) {
    double rs = 1.0 / sqrt(var[c] + eps), g = gamma ? gamma[c] : 1.0, sg = 0.0, sgx = 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = tu_at(lay, n, c, s, C, S);
        sg += dy[i];
        sgx += dy[i] * (x[i] - mean[c]) * rs;
      }
    if (dgamma) dgamma[c] = sgx;
    if (dbeta) dbeta[c] = sg;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = tu_at(lay, n, c, s, C, S);
        dx[i] = g * rs * (dy[i] - sg / M - (x[i] - mean[c]) * rs * sgx / M);
      }
  }
  free(mean);
  free(var);
}

static double dot(const double *a, const double *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* ---- library pipeline ---------------------------------------------------------------------- */

/* SyncBatchNorm's refinement, as sn_batchnorm_fwd documents it: the channels whose sums around
 * pv lost more than 24 bits, (mean − p)² > 2^24·var, get pv[c] = p + (mean − p) in f32. Returns
 * how many. Written from the documentation, not from the library's code. */
static int64_t refine_oracle(float *pv, const double *sum, const double *sq, int64_t count,
                             int64_t C) {
  int64_t n = 0;
  for (int64_t c = 0; c < C; c++) {
    const double m = sum[c] / (double)count, v = sq[c] / (double)count - m * m;
    if (m != 0.0 && m * m > v * 0x1p24) pv[c] = (float)((double)pv[c] + m), n++;
  }
  return n;
}

/* The local training forward sn_batchnorm_fwd on x into poisoned outputs must be bitwise the
 * building blocks with the refinement: stats around pivot (sum, sq: its sums, given), where
 * any channel needs it the stats again around the refined pivots, finalize, apply. y0, mean0,
 * var0, rstd0: the unrefined pipeline's outputs (the same where nothing is refined). Returns
 * the number of refined channels. */
static int64_t check_fwd_local(const void *y0, const double *mean0, const float *var0,
                               const float *rstd0, const double *sum, const double *sq,
                               const void *x, const float *pivot, const float *gamma,
                               const float *beta, int64_t N, int64_t C, int64_t S,
                               sn_layout_t lay, sn_dtype_t dt) {
  const int64_t T = N * C * S;
  const size_t bytes = (size_t)(T * sn_dtype_size(dt));
  float *pv = tu_falloc(C), *var = tu_falloc(C), *rstd = tu_falloc(C), *var2 = tu_falloc(C),
      *rstd2 = tu_falloc(C);
  double *mean = tu_dalloc(C), *mean2 = tu_dalloc(C), *sum2 = tu_dalloc(C), *sq2 = tu_dalloc(C);
  void *y = tu_alloc(T, dt), *y2 = tu_alloc(T, dt);
  for (int64_t c = 0; c < C; c++) pv[c] = pivot ? pivot[c] : 0.0f;
  const int64_t refined = refine_oracle(pv, sum, sq, N * S, C);
  if (refined > 0) { /* the oracle's second pass */
    ck_assert_int_eq(sn_batchnorm_stats(sum2, sq2, x, pv, N, C, S, lay, dt), SN_OK);
    ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum2, sq2, pv, N * S, C, EPS), SN_OK);
    ck_assert_int_eq(sn_batchnorm_apply(y, x, mean, rstd, gamma, beta, N, C, S, lay, dt), SN_OK);
  } else {
    memcpy(y, y0, bytes);
    memcpy(mean, mean0, (size_t)C * 8);
    memcpy(rstd, rstd0, (size_t)C * 4);
    if (var0) memcpy(var, var0, (size_t)C * 4);
  }
  poison_f64(mean2, C);
  tu_poison_f32(var2, C);
  tu_poison_f32(rstd2, C);
  tu_poison(y2, T, dt);
  const sn_status_t st = sn_batchnorm_fwd(y2, mean2, var0 ? var2 : NULL, rstd2, x, pivot, gamma,
                                          beta, N, C, S, EPS, lay, dt);
  ck_assert_msg(st == SN_OK, "sn_batchnorm_fwd: %s", sn_last_error());
  char what[128];
  snprintf(what, sizeof what, "sn_batchnorm_fwd [%lld,%lld,%lld] %s %s, %lld refined: ",
           (long long)N, (long long)C, (long long)S, LNAME[lay == SN_LAYOUT_NHWC],
           tu_dtype_name[dt], (long long)refined);
  const size_t w = strlen(what);
  snprintf(what + w, sizeof what - w, "y");
  tu_assert_bitwise(y2, y, bytes, what);
  snprintf(what + w, sizeof what - w, "mean");
  tu_assert_bitwise(mean2, mean, (size_t)C * 8, what);
  snprintf(what + w, sizeof what - w, "rstd");
  tu_assert_bitwise(rstd2, rstd, (size_t)C * 4, what);
  if (var0) {
    snprintf(what + w, sizeof what - w, "var");
    tu_assert_bitwise(var2, var, (size_t)C * 4, what);
  } else {
    snprintf(what + w, sizeof what - w, "var NULL untouched");
    for (int64_t c = 0; c < C; c++) TU_CHECK(isnan(var2[c]), "%s", what);
  }
  free(pv), free(var), free(rstd), free(var2), free(rstd2), free(mean), free(mean2), free(sum2);
  free(sq2), free(y), free(y2);
  return refined;
}

/* stats → finalize → apply on one whole batch; every output poisoned first. Then the local
 * forward sn_batchnorm_fwd on the same inputs (check_fwd_local). */
static void lib_train_fwd(void *y, double *mean, float *var, float *rstd, const void *x,
                          const float *pivot, const float *gamma, const float *beta, int64_t N,
                          int64_t C, int64_t S, sn_layout_t lay, sn_dtype_t dt) {
  double *sum = tu_dalloc(C), *sq = tu_dalloc(C);
  poison_f64(sum, C);
  poison_f64(sq, C);
  poison_f64(mean, C);
  if (var) tu_poison_f32(var, C);
  tu_poison_f32(rstd, C);
  tu_poison(y, N * C * S, dt);
  ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, pivot, N, C, S, lay, dt), SN_OK);
  ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum, sq, pivot, N * S, C, EPS), SN_OK);
  ck_assert_int_eq(sn_batchnorm_apply(y, x, mean, rstd, gamma, beta, N, C, S, lay, dt), SN_OK);
  if (y != x) /* in place, x is gone */
    check_fwd_local(y, mean, var, rstd, sum, sq, x, pivot, gamma, beta, N, C, S, lay, dt);
  free(sum);
  free(sq);
}

/* bwd_reduce → bwd_apply with the given forward statistics; outputs poisoned first. Then the
 * local backward sn_batchnorm_bwd on the same inputs, into poisoned outputs: its dx must be
 * bitwise the split one, dgamma and dbeta the f32 roundings of the sums (fused or not). */
static void lib_train_bwd(void *dx, double *sdy, double *sdx, const void *dy, const void *x,
                          const double *mean, const float *rstd, const float *gamma, int64_t N,
                          int64_t C, int64_t S, sn_layout_t lay, sn_dtype_t dt) {
  const int64_t T = N * C * S;
  poison_f64(sdy, C);
  poison_f64(sdx, C);
  tu_poison(dx, T, dt);
  ck_assert_int_eq(sn_batchnorm_bwd_reduce(sdy, sdx, dy, x, mean, rstd, N, C, S, lay, dt), SN_OK);
  ck_assert_int_eq(sn_batchnorm_bwd_apply(dx, dy, x, mean, rstd, gamma, sdy, sdx, N * S, N, C, S,
                                          lay, dt),
                   SN_OK);
  void *dx2 = tu_alloc(T, dt);
  float *dg = tu_falloc(C), *db = tu_falloc(C);
  tu_poison(dx2, T, dt);
  tu_poison_f32(dg, C);
  tu_poison_f32(db, C);
  const sn_status_t st = sn_batchnorm_bwd(dx2, dg, db, dy, x, mean, rstd, gamma, N, C, S, lay, dt);
  if (N * S <= 1) { /* no training forward had such a batch */
    ck_assert_int_eq(st, SN_ERR_INSUFFICIENT_COUNT);
  } else {
    ck_assert_msg(st == SN_OK, "sn_batchnorm_bwd: %s", sn_last_error());
    tu_assert_bitwise(dx2, dx, (size_t)(T * sn_dtype_size(dt)), "sn_batchnorm_bwd dx vs split");
    for (int64_t c = 0; c < C; c++)
      TU_CHECK(memcmp(&dg[c], &(float){(float)sdx[c]}, 4) == 0 &&
                   memcmp(&db[c], &(float){(float)sdy[c]}, 4) == 0,
               "sn_batchnorm_bwd channel %lld: dgamma %.9g dbeta %.9g, sums %.17g %.17g",
               (long long)c, (double)dg[c], (double)db[c], sdx[c], sdy[c]);
  }
  free(dx2), free(dg), free(db);
}

/* Checks mean (f64), var and rstd (f32) of every channel against the fp64 reference of x. */
static void check_stats(const double *mean, const float *var, const float *rstd, const double *xd,
                        int64_t N, int64_t C, int64_t S, sn_layout_t lay, const char *what) {
  double *rm = tu_dalloc(C), *rv = tu_dalloc(C);
  ref_stats(rm, rv, xd, N, C, S, lay);
  for (int64_t c = 0; c < C; c++) {
    double rr = 1.0 / sqrt(rv[c] + (double)EPS);
    ck_assert_msg(fabs(mean[c] - rm[c]) <= TOL_MEAN_F64 * (fabs(rm[c]) + sqrt(rv[c])),
                  "%s: mean[%lld] %.17g vs %.17g", what, (long long)c, mean[c], rm[c]);
    if (var)
      ck_assert_msg(fabs(var[c] - rv[c]) <= TOL_STAT_F32 * rv[c] + 1e-30,
                    "%s: var[%lld] %.9g vs %.17g", what, (long long)c, (double)var[c], rv[c]);
    ck_assert_msg(fabs(rstd[c] - rr) <= TOL_STAT_F32 * rr, "%s: rstd[%lld] %.9g vs %.17g", what,
                  (long long)c, (double)rstd[c], rr);
  }
  free(rm);
  free(rv);
}

/* Training dx vs a reference. dx = γ·rstd·(dy − mean(dy) − x̂·mean(dy·x̂)) subtracts terms of
 * the size of γ·rstd·dy, which an f32 evaluation gets right to a few ulp of those terms, not of
 * their difference: with N·S = 2 the projections remove almost all of dy and dx ≈ 0. So the
 * error is taken relative to max(||ref||, ||γ·rstd·dy||); tol as for any other backward.
 * dx_err: that error over channels [c0, c1) (all n, s), every dx there checked finite. */
static double dx_err(const void *dx, sn_dtype_t dt, const double *ref, const double *dyd,
                     const float *gamma, const float *rstd, int64_t N, int64_t C, int64_t S,
                     sn_layout_t lay, int64_t c0, int64_t c1, const char *what) {
  double num = 0.0, den_ref = 0.0, den_terms = 0.0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = c0; c < c1; c++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t i = tu_at(lay, n, c, s, C, S);
        const double g = tu_get(dx, i, dt), t = (gamma ? gamma[c] : 1.0) * rstd[c] * dyd[i];
        TU_CHECK(isfinite(g), "%s: dx[%lld] = %g", what, (long long)i, g);
        num += (g - ref[i]) * (g - ref[i]), den_ref += ref[i] * ref[i], den_terms += t * t;
      }
  return sqrt(num) / fmax(sqrt(fmax(den_ref, den_terms)), 1e-300);
}
static void assert_dx_tol(const void *dx, sn_dtype_t dt, const double *ref, const double *dyd,
                          const float *gamma, const float *rstd, int64_t N, int64_t C, int64_t S,
                          sn_layout_t lay, double tol, const char *what) {
  const double e = dx_err(dx, dt, ref, dyd, gamma, rstd, N, C, S, lay, 0, C, what);
  ck_assert_msg(e <= tol, "%s (%s): dx error %.3e > %.1e (relative to max(|ref|, |g·rstd·dy|))",
                what, tu_dtype_name[dt], e, tol);
}
/* assert_dx for each channel on its own: where channels' gradients differ by many orders of
 * magnitude a tensor-wide norm would not see the small ones' errors. */
static void assert_dx_each_channel(const void *dx, sn_dtype_t dt, const double *ref,
                                   const double *dyd, const float *gamma, const float *rstd,
                                   int64_t N, int64_t C, int64_t S, sn_layout_t lay, double tol,
                                   const char *what) {
  for (int64_t c = 0; c < C; c++) {
    const double e = dx_err(dx, dt, ref, dyd, gamma, rstd, N, C, S, lay, c, c + 1, what);
    TU_CHECK(e <= tol, "%s (%s): channel %lld dx error %.3e > %.1e", what, tu_dtype_name[dt],
             (long long)c, e, tol);
  }
}
static void assert_dx(const void *dx, sn_dtype_t dt, const double *ref, const double *dyd,
                      const float *gamma, const float *rstd, int64_t N, int64_t C, int64_t S,
                      sn_layout_t lay, const char *what) {
  assert_dx_tol(dx, dt, ref, dyd, gamma, rstd, N, C, S, lay,
                dt == SN_DTYPE_F32 ? TU_RTOL_F32_BWD : tu_rtol_half_bwd(dt), what);
}

/* ---- tests --------------------------------------------------------------------------------- */

/* stats + finalize + apply vs the fp64 reference over the shape grid, both layouts, all dtypes,
 * with and without gamma/beta: every y element, mean, var and rstd. */
START_TEST(test_train_fwd_vs_ref) {
  tu_rng_t r;
  tu_rng_seed(&r, 1);
  for (size_t ins = 0; ins < sizeof NS / sizeof NS[0]; ins++)
    for (size_t ic = 0; ic < sizeof CS / sizeof CS[0]; ic++)
      for (int il = 0; il < 2; il++)
        for (int id = 0; id < 3; id++)
          for (int affine = 0; affine < 2; affine++) {
            const int64_t N = NS[ins][0], S = NS[ins][1], C = CS[ic], T = N * C * S;
            const sn_layout_t lay = LAYOUTS[il];
            const sn_dtype_t dt = DTYPES[id];
            void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
            float *gamma = tu_falloc(C), *beta = tu_falloc(C), *var = tu_falloc(C),
                *rstd = tu_falloc(C);
            double *mean = tu_dalloc(C), *g64 = tu_dalloc(C), *b64 = tu_dalloc(C),
                *yr = tu_dalloc(T), *sc = tu_dalloc(T);
            fill_bn(x, N, C, S, lay, dt, 1.5, 2.0, &r);
            tu_fill_params(gamma, beta, C, &r);
            for (int64_t c = 0; c < C; c++) g64[c] = gamma[c], b64[c] = beta[c];
            double *xd = tu_to_f64(x, T, dt);
            lib_train_fwd(y, mean, var, rstd, x, NULL, affine ? gamma : NULL,
                          affine ? beta : NULL, N, C, S, lay, dt);
            ref_train_fwd(yr, sc, xd, affine ? g64 : NULL, affine ? b64 : NULL, N, C, S, lay,
                          EPS);
            char what[128];
            snprintf(what, sizeof what, "train fwd N=%lld C=%lld S=%lld %s %s affine=%d",
                     (long long)N, (long long)C, (long long)S, LNAME[il], tu_dtype_name[dt], affine);
            check_stats(mean, var, rstd, xd, N, C, S, lay, what);
            tu_assert_fwd(y, dt, yr, sc, T, what);
            free(x), free(y), free(gamma), free(beta), free(var), free(rstd);
            free(mean), free(g64), free(b64), free(yr), free(xd), free(sc);
          }
}
END_TEST

/* The same batch in NCHW and NHWC: stats and backward sums bitwise equal (the reduction order
 * depends on N·S only), y and dx bitwise equal after transposing (the maps are elementwise). */
START_TEST(test_layouts_bitwise) {
  static const int64_t shapes[][3] = {{1, 3, 2}, {3, 65, 1}, {8, 64, 125}, {3, 5, 777},
                                      {2, 300, 70}, {130, 3, 1}, {4, 200, 50}, {3, 128, 90}};
  tu_rng_t r;
  tu_rng_seed(&r, 2);
  for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
    for (int id = 0; id < 3; id++) {
      const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2], T = N * C * S;
      const sn_dtype_t dt = DTYPES[id];
      const size_t bytes = (size_t)(T * sn_dtype_size(dt));
      void *x[2], *dy[2], *y[2], *dx[2], *yt = tu_alloc(T, dt), *dxt = tu_alloc(T, dt);
      double *mean[2], *sdy[2], *sdx[2];
      float *var[2], *rstd[2], *gamma = tu_falloc(C), *beta = tu_falloc(C);
      tu_fill_params(gamma, beta, C, &r);
      for (int l = 0; l < 2; l++) {
        x[l] = tu_alloc(T, dt), dy[l] = tu_alloc(T, dt), y[l] = tu_alloc(T, dt);
        dx[l] = tu_alloc(T, dt);
        mean[l] = tu_dalloc(C), sdy[l] = tu_dalloc(C), sdx[l] = tu_dalloc(C);
        var[l] = tu_falloc(C), rstd[l] = tu_falloc(C);
      }
      fill_bn(x[0], N, C, S, SN_LAYOUT_NCHW, dt, -0.75, 1.5, &r);
      tu_fill_normal(dy[0], T, dt, 0.1, 1.0, &r);
      tu_transpose(x[1], SN_LAYOUT_NHWC, x[0], SN_LAYOUT_NCHW, N, C, S, dt);
      tu_transpose(dy[1], SN_LAYOUT_NHWC, dy[0], SN_LAYOUT_NCHW, N, C, S, dt);
      for (int l = 0; l < 2; l++) {
        lib_train_fwd(y[l], mean[l], var[l], rstd[l], x[l], NULL, gamma, beta, N, C, S,
                      LAYOUTS[l], dt);
      }
      for (int l = 0; l < 2; l++) /* the raw shifted sums themselves (pivot: gamma, any values) */
        ck_assert_int_eq(sn_batchnorm_stats(sdy[l], sdx[l], x[l], gamma, N, C, S, LAYOUTS[l], dt), SN_OK);
      tu_assert_bitwise(sdy[0], sdy[1], (size_t)C * 8, "NCHW vs NHWC stats sum");
      tu_assert_bitwise(sdx[0], sdx[1], (size_t)C * 8, "NCHW vs NHWC stats sumsq");
      for (int l = 0; l < 2; l++)
        lib_train_bwd(dx[l], sdy[l], sdx[l], dy[l], x[l], mean[l], rstd[l], gamma, N, C, S,
                      LAYOUTS[l], dt);
      tu_assert_bitwise(mean[0], mean[1], (size_t)C * 8, "NCHW vs NHWC mean");
      tu_assert_bitwise(var[0], var[1], (size_t)C * 4, "NCHW vs NHWC var");
      tu_assert_bitwise(rstd[0], rstd[1], (size_t)C * 4, "NCHW vs NHWC rstd");
      tu_assert_bitwise(sdy[0], sdy[1], (size_t)C * 8, "NCHW vs NHWC sum_dy");
      tu_assert_bitwise(sdx[0], sdx[1], (size_t)C * 8, "NCHW vs NHWC sum_dy_xhat");
      tu_transpose(yt, SN_LAYOUT_NCHW, y[1], SN_LAYOUT_NHWC, N, C, S, dt);
      tu_transpose(dxt, SN_LAYOUT_NCHW, dx[1], SN_LAYOUT_NHWC, N, C, S, dt);
      tu_assert_bitwise(y[0], yt, bytes, "NCHW vs NHWC y");
      tu_assert_bitwise(dx[0], dxt, bytes, "NCHW vs NHWC dx");
      tu_assert_all_finite(y[0], dt, T, "y");
      tu_assert_all_finite(dx[0], dt, T, "dx");
      for (int l = 0; l < 2; l++) {
        free(x[l]), free(dy[l]), free(y[l]), free(dx[l]), free(mean[l]), free(sdy[l]);
        free(sdx[l]), free(var[l]), free(rstd[l]);
      }
      free(yt), free(dxt), free(gamma), free(beta);
    }
}
END_TEST

/* Inference with running statistics vs the fp64 formula, all shapes, layouts, dtypes. */
START_TEST(test_infer_vs_ref) {
  tu_rng_t r;
  tu_rng_seed(&r, 3);
  for (size_t ins = 0; ins < sizeof NS / sizeof NS[0]; ins++)
    for (size_t ic = 0; ic < sizeof CS / sizeof CS[0]; ic++)
      for (int il = 0; il < 2; il++)
        for (int id = 0; id < 3; id++)
          for (int affine = 0; affine < 2; affine++) {
            const int64_t N = NS[ins][0], S = NS[ins][1], C = CS[ic], T = N * C * S;
            const sn_layout_t lay = LAYOUTS[il];
            const sn_dtype_t dt = DTYPES[id];
            void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
            float *gamma = tu_falloc(C), *beta = tu_falloc(C), *rm = tu_falloc(C),
                *rv = tu_falloc(C);
            double *yr = tu_dalloc(T), *sc = tu_dalloc(T);
            fill_bn(x, N, C, S, lay, dt, 1.0, 3.0, &r);
            tu_fill_params(gamma, beta, C, &r);
            for (int64_t c = 0; c < C; c++) {
              rm[c] = (float)(1.0 + tu_rng_normal(&r));
              rv[c] = (float)(0.25 + 4.0 * tu_rng_uniform(&r));
            }
            for (int64_t n = 0; n < N; n++)
              for (int64_t c = 0; c < C; c++)
                for (int64_t s = 0; s < S; s++) {
                  int64_t i = tu_at(lay, n, c, s, C, S);
                  double g = affine ? gamma[c] : 1.0, b = affine ? beta[c] : 0.0;
                  yr[i] = ref_map(&sc[i], tu_get(x, i, dt), rm[c],
                                  1.0 / sqrt((double)rv[c] + (double)EPS), g, b);
                }
            tu_poison(y, T, dt);
            ck_assert_int_eq(sn_batchnorm_infer(y, x, rm, rv, affine ? gamma : NULL,
                                                affine ? beta : NULL, N, C, S, EPS, lay, dt),
                             SN_OK);
            tu_assert_fwd(y, dt, yr, sc, T, "infer");
            free(x), free(y), free(gamma), free(beta), free(rm), free(rv), free(yr), free(sc);
          }
}
END_TEST

/* A NaN running_var (running statistics of a run that met NaN data) is not an error: its
 * channel's outputs are NaN, the other channels' as the fp64 formula (as PyTorch). */
START_TEST(test_infer_nan_var) {
  tu_rng_t r;
  tu_rng_seed(&r, 31);
  const int64_t N = 2, C = 3, S = 5, T = N * C * S;
  for (int il = 0; il < 2; il++)
    for (int id = 0; id < 3; id++) {
      const sn_layout_t lay = LAYOUTS[il];
      const sn_dtype_t dt = DTYPES[id];
      void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
      float *gamma = tu_falloc(C), *beta = tu_falloc(C), rm[3] = {0.5f, -1.0f, 2.0f};
      const float rv[3] = {1.5f, NAN, 0.25f};
      double *yr = tu_dalloc(T), *sc = tu_dalloc(T);
      fill_bn(x, N, C, S, lay, dt, 1.0, 3.0, &r);
      tu_fill_params(gamma, beta, C, &r);
      for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
          for (int64_t s = 0; s < S; s++) {
            const int64_t i = tu_at(lay, n, c, s, C, S);
            yr[i] = ref_map(&sc[i], tu_get(x, i, dt), rm[c],
                            1.0 / sqrt((double)rv[c] + (double)EPS), gamma[c], beta[c]);
          }
      tu_poison(y, T, dt);
      ck_assert_int_eq(sn_batchnorm_infer(y, x, rm, rv, gamma, beta, N, C, S, EPS, lay, dt),
                       SN_OK);
      for (int64_t n = 0; n < N; n++) /* channel 1 NaN; then set to 0 in y and yr alike */
        for (int64_t s = 0; s < S; s++) {
          const int64_t i = tu_at(lay, n, 1, s, C, S);
          TU_CHECK(isnan(tu_get(y, i, dt)), "y[%lld, 1, %lld] not NaN", (long long)n,
                   (long long)s);
          tu_set(y, i, 0.0, dt), yr[i] = 0.0, sc[i] = 0.0;
        }
      tu_assert_fwd(y, dt, yr, sc, T, "infer with a NaN running_var: the other channels");
      free(x), free(y), free(gamma), free(beta), free(yr), free(sc);
    }
}
END_TEST

/* bf16/f16 outputs where beta cancels x̂·gamma: beta_c = −round_f32(x̂·gamma_c) of one element of
 * each channel, so that y is ~2^-24 of its terms there (and wherever x repeats that value): an
 * f32 map errs by roundings of x̂·gamma, far more than 1 ulp of y. apply against
 * y = (x − mean)·rstd·gamma + beta in fp64 with the statistics it was given (the f32 rstd: the
 * bound is relative to its inputs); the training forward (stats → finalize → apply, and
 * sn_batchnorm_fwd bitwise the same: lib_train_fwd) against the fp64 batch statistics; infer
 * against the fp64 formula of the running statistics. Each element at the mixed bound
 * (tu_check_lowp_mixed), both layouts, C = 3 and 65. */
START_TEST(test_beta_cancels) {
  const int64_t N = 4, S = 250;
  static const int64_t CC[] = {3, 65};
  tu_rng_t r;
  tu_rng_seed(&r, 43);
  for (size_t ic = 0; ic < 2; ic++)
    for (int il = 0; il < 2; il++)
      for (int id = 1; id < 3; id++) {
        const int64_t C = CC[ic], T = N * C * S;
        const sn_layout_t lay = LAYOUTS[il];
        const sn_dtype_t dt = DTYPES[id];
        void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
        float *gamma = tu_falloc(C), *beta = tu_falloc(C), *rstd = tu_falloc(C), *rm = tu_falloc(C);
        float *rv = tu_falloc(C), *rstd2 = tu_falloc(C);
        double *mean = tu_dalloc(C), *mean2 = tu_dalloc(C), *yr = tu_dalloc(T), *sc = tu_dalloc(T);
        double *g64 = tu_dalloc(C), *b64 = tu_dalloc(C);
        fill_bn(x, N, C, S, lay, dt, 0.5, 2.0, &r);
        tu_fill_params(gamma, beta, C, &r);
        double *xd = tu_to_f64(x, T, dt);
        char what[96];
        snprintf(what, sizeof what, "beta cancels C=%lld %s %s", (long long)C, LNAME[il],
                 tu_dtype_name[dt]);
        lib_train_fwd(y, mean, NULL, rstd, x, NULL, gamma, beta, N, C, S, lay, dt);
        for (int64_t c = 0; c < C; c++) {
          const int64_t i = tu_at(lay, 1, c, 5 * c + 2, C, S);
          beta[c] = -(float)((xd[i] - mean[c]) * (double)rstd[c] * gamma[c]);
        }
        for (int64_t n = 0; n < N; n++)
          for (int64_t c = 0; c < C; c++)
            for (int64_t ss = 0; ss < S; ss++) {
              const int64_t i = tu_at(lay, n, c, ss, C, S);
              yr[i] = ref_map(&sc[i], xd[i], mean[c], (double)rstd[c], gamma[c], beta[c]);
            }
        tu_poison(y, T, dt);
        ck_assert_int_eq(sn_batchnorm_apply(y, x, mean, rstd, gamma, beta, N, C, S, lay, dt),
                         SN_OK);
        tu_assert_fwd(y, dt, yr, sc, T, what);
        for (int64_t c = 0; c < C; c++) g64[c] = gamma[c], b64[c] = beta[c];
        lib_train_fwd(y, mean2, NULL, rstd2, x, NULL, gamma, beta, N, C, S, lay, dt);
        ref_train_fwd(yr, sc, xd, g64, b64, N, C, S, lay, EPS);
        tu_assert_fwd(y, dt, yr, sc, T, what);
        for (int64_t c = 0; c < C; c++) { /* running statistics near the batch's */
          rm[c] = (float)mean[c];
          rv[c] = (float)(1.0 / ((double)rstd[c] * rstd[c]));
          const int64_t i = tu_at(lay, 2, c, 3 * c + 1, C, S);
          beta[c] = -(float)((xd[i] - rm[c]) / sqrt((double)rv[c] + (double)EPS) * gamma[c]);
        }
        for (int64_t n = 0; n < N; n++)
          for (int64_t c = 0; c < C; c++)
            for (int64_t ss = 0; ss < S; ss++) {
              const int64_t i = tu_at(lay, n, c, ss, C, S);
              yr[i] = ref_map(&sc[i], xd[i], rm[c], 1.0 / sqrt((double)rv[c] + (double)EPS),
                              gamma[c], beta[c]);
            }
        tu_poison(y, T, dt);
        ck_assert_int_eq(sn_batchnorm_infer(y, x, rm, rv, gamma, beta, N, C, S, EPS, lay, dt),
                         SN_OK);
        tu_assert_fwd(y, dt, yr, sc, T, what);
        free(x), free(y), free(gamma), free(beta), free(rstd), free(rm), free(rv), free(rstd2);
        free(mean), free(mean2), free(yr), free(sc), free(g64), free(b64), free(xd);
      }
}
END_TEST

/* A mean so small that lo = mean − (float)mean is a subnormal f32 (mean 2^-100 + 2^-152): the
 * maps' two-float mean loses its low part and x − mean its value (128 ulp off in f32: 0 for
 * −2^-78), so such a channel is mapped in fp64. apply against the formula in fp64 with the given
 * statistics, f32 (normwise bound) and bf16 (the mixed bound), with and without beta, both layouts; the
 * other channels ordinary. */
START_TEST(test_tiny_mean) {
  const int64_t N = 2, C = 3, S = 40, T = N * C * S;
  tu_rng_t r;
  tu_rng_seed(&r, 47);
  for (int il = 0; il < 2; il++)
    for (int id = 0; id < 2; id++)
      for (int with_b = 0; with_b < 2; with_b++) {
        const sn_layout_t lay = LAYOUTS[il];
        const sn_dtype_t dt = DTYPES[id];
        void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
        float *gamma = tu_falloc(C), *beta = tu_falloc(C), rstd[3];
        double mean[3], *yr = tu_dalloc(T), *sc = tu_dalloc(T);
        fill_bn(x, N, C, S, lay, dt, 0.0, 1.0, &r);
        tu_fill_params(gamma, beta, C, &r);
        mean[0] = 0x1p-100 + 0x1p-152, rstd[0] = 0x1p74f;
        mean[1] = 0.37, rstd[1] = 0.8f;
        mean[2] = 0x1p-130 + 0x1p-160, rstd[2] = 0x1p82f; /* hi itself subnormal */
        beta[0] = with_b ? 0x1p-76f : 0.0f;
        for (int64_t n = 0; n < N; n++)
          for (int64_t ss = 0; ss < S; ss++) { /* channels 0, 2: a few ulps of 2^-100 around */
            tu_set(x, tu_at(lay, n, 0, ss, C, S), 0x1p-100 * (1.0 + 0x1p-23 * (double)(ss % 5 - 2)),
                dt);
            tu_set(x, tu_at(lay, n, 2, ss, C, S), 0x1p-130 + 0x1p-149 * (double)(ss % 7), dt);
          }
        double *xd = tu_to_f64(x, T, dt);
        for (int64_t n = 0; n < N; n++)
          for (int64_t c = 0; c < C; c++)
            for (int64_t ss = 0; ss < S; ss++) {
              const int64_t i = tu_at(lay, n, c, ss, C, S);
              yr[i] = ref_map(&sc[i], xd[i], mean[c], (double)rstd[c], gamma[c],
                              with_b ? beta[c] : 0.0);
            }
        char what[96];
        snprintf(what, sizeof what, "tiny mean %s %s beta=%d", LNAME[il], tu_dtype_name[dt],
                 with_b);
        tu_poison(y, T, dt);
        ck_assert_int_eq(sn_batchnorm_apply(y, x, mean, rstd, gamma, with_b ? beta : NULL, N, C,
                                            S, lay, dt),
                         SN_OK);
        if (dt == SN_DTYPE_F32) { /* per channel: the channels' outputs differ in size */
          for (int64_t c = 0; c < C; c++) {
            double num = 0.0, den = 0.0;
            for (int64_t n = 0; n < N; n++)
              for (int64_t ss = 0; ss < S; ss++) {
                const int64_t i = tu_at(lay, n, c, ss, C, S);
                const double e = tu_get(y, i, dt) - yr[i];
                num += e * e, den += yr[i] * yr[i];
              }
            ck_assert_msg(sqrt(num) <= TU_RTOL_F32_FWD * sqrt(den), "%s: channel %lld %.3e", what,
                          (long long)c, sqrt(num) / sqrt(den));
          }
        } else {
          tu_assert_fwd(y, dt, yr, sc, T, what);
        }
        free(x), free(y), free(gamma), free(beta), free(yr), free(xd), free(sc);
      }
}
END_TEST

/* bf16 y with beta where the f32 product x̂·gamma overflows but y = x̂·gamma + beta is finite:
 * the map must recompute those elements in fp64 (an f32 value that is not finite is redone).
 * mean 0, rstd 1,
 * gamma 4 and x ~ 1e38: x·4 ~ 4e38 > FLT_MAX, beta −3e38, y ~ 1e38. Every other element is
 * ordinary (small x); runs of S = 1, 31, 32, 33, 100 (whole pair blocks and tails). Each y at
 * the forward bound against the fp64 formula (tu_assert_fwd), and both layouts the same bits. */
START_TEST(test_apply_overflow_cancelled) {
  static const int64_t SS[] = {1, 31, 32, 33, 100};
  const sn_dtype_t dt = SN_DTYPE_BF16;
  for (size_t is = 0; is < sizeof SS / sizeof SS[0]; is++) {
    const int64_t N = 2, C = 3, S = SS[is], T = N * C * S;
    double mean[3] = {0.0, 0.0, 0.0}, *yr = tu_dalloc(T), *sc = tu_dalloc(T);
    float rstd[3] = {1.0f, 1.0f, 1.0f}, gamma[3] = {4.0f, 4.0f, 1.0f};
    float beta[3] = {-3e38f, -2.5e38f, 0.5f};
    void *x = tu_alloc(T, dt), *y[2] = {tu_alloc(T, dt), tu_alloc(T, dt)}, *xt = tu_alloc(T, dt);
    void *yt = tu_alloc(T, dt);
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t ss = 0; ss < S; ss++) {
          const double v = (ss + n) % 2 == 0 && c < 2 ? 1e38 * (1.0 + 0.002 * (double)ss) : 0.25 * (double)ss;
          tu_set(x, tu_at(SN_LAYOUT_NCHW, n, c, ss, C, S), v, dt);
        }
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t ss = 0; ss < S; ss++) {
          const int64_t i = tu_at(SN_LAYOUT_NCHW, n, c, ss, C, S);
          yr[i] = ref_map(&sc[i], tu_get(x, i, dt), 0.0, 1.0, gamma[c], beta[c]);
        }
    tu_transpose(xt, SN_LAYOUT_NHWC, x, SN_LAYOUT_NCHW, N, C, S, dt);
    for (int l = 0; l < 2; l++) tu_poison(y[l], T, dt);
    ck_assert_int_eq(sn_batchnorm_apply(y[0], x, mean, rstd, gamma, beta, N, C, S,
                                        SN_LAYOUT_NCHW, dt), SN_OK);
    ck_assert_int_eq(sn_batchnorm_apply(y[1], xt, mean, rstd, gamma, beta, N, C, S,
                                        SN_LAYOUT_NHWC, dt), SN_OK);
    tu_assert_fwd(y[0], dt, yr, sc, T, "bf16 y where x̂·gamma overflows f32 and beta cancels it");
    tu_transpose(yt, SN_LAYOUT_NCHW, y[1], SN_LAYOUT_NHWC, N, C, S, dt);
    tu_assert_bitwise(y[0], yt, (size_t)(T * sn_dtype_size(dt)), "NCHW vs NHWC y");
    free(yr), free(sc), free(x), free(y[0]), free(y[1]), free(xt), free(yt);
  }
}
END_TEST

/* Channels of values of both signs near the f32 range (tu_fill_near_max; a channel's mean is
 * beyond 2^103): x − mean exceeds FLT_MAX for some elements although y is O(1) (x − mean taken
 * in f32 would give ±inf in y and NaN in dx). Training forward and backward and inference
 * (running_mean 1e38 and running_var FLT_MAX/2: y ~ 1e19, finite), f32 and bf16, both layouts,
 * C = 3 and 65 (NHWC tiles with and without such channels: every other channel is ordinary;
 * C = 300: two tiles), and the other layout bitwise the same (the ordinary channels of a tile
 * must not change with the fp64 ones beside them). var (~1e76) overflows its f32 output to
 * +inf, as the f32 value of a variance that large must; it is not checked. rstd (~2^-127) is a
 * subnormal f32; every fourth channel has gamma 2^-16, so that gamma·rstd is a subnormal f32
 * with a few bits left (1e5 ulp off in f32: the map must take it in fp64). dy is scaled by
 * 2^100 so that dx is a normal number. */
START_TEST(test_near_f32_max) {
  static const int64_t NSS[][2] = {{8, 125}, {1, 3}};
  static const int64_t CC[] = {3, 65, 300};
  tu_rng_t r;
  tu_rng_seed(&r, 41);
  for (size_t ins = 0; ins < 2; ins++)
    for (size_t ic = 0; ic < 3; ic++)
      for (int il = 0; il < 2; il++)
        for (int id = 0; id < 2; id++) {
          const int64_t N = NSS[ins][0], S = NSS[ins][1], C = CC[ic], T = N * C * S;
          const sn_layout_t lay = LAYOUTS[il];
          const sn_dtype_t dt = DTYPES[id];
          void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dy = tu_alloc(T, dt);
          void *dx = tu_alloc(T, dt);
          float *gamma = tu_falloc(C), *beta = tu_falloc(C), *var = tu_falloc(C),
              *rstd = tu_falloc(C);
          float *rm = tu_falloc(C), *rv = tu_falloc(C);
          double *mean = tu_dalloc(C), *g64 = tu_dalloc(C), *b64 = tu_dalloc(C), *yr = tu_dalloc(T);
          double *sc = tu_dalloc(T);
          double *sdy = tu_dalloc(C), *sdx = tu_dalloc(C), *dxr = tu_dalloc(T), *dgr = tu_dalloc(C);
          double *dbr = tu_dalloc(C);
          fill_bn(x, N, C, S, lay, dt, 0.0, 1.0, &r);
          for (int64_t n = 0; n < N; n++) /* even channels near the f32 range */
            for (int64_t c = 0; c < C; c += 2)
              for (int64_t ss = 0; ss < S; ss++) {
                float v;
                tu_fill_near_max(&v, 1, SN_DTYPE_F32, 0.75, &r);
                tu_set(x, tu_at(lay, n, c, ss, C, S), (double)v, dt);
              }
          tu_fill_normal(dy, T, dt, 0.0, 0x1p100, &r);
          tu_fill_params(gamma, beta, C, &r);
          for (int64_t c = 0; c < C; c += 4) gamma[c] = 0x1p-16f; /* gamma·rstd subnormal */
          for (int64_t c = 0; c < C; c++) g64[c] = gamma[c], b64[c] = beta[c];
          double *xd = tu_to_f64(x, T, dt), *dyd = tu_to_f64(dy, T, dt);
          char what[128];
          snprintf(what, sizeof what, "near FLT_MAX N=%lld C=%lld S=%lld %s %s", (long long)N,
                   (long long)C, (long long)S, LNAME[il], tu_dtype_name[dt]);
          lib_train_fwd(y, mean, var, rstd, x, NULL, gamma, beta, N, C, S, lay, dt);
          ref_train_fwd(yr, sc, xd, g64, b64, N, C, S, lay, EPS);
          tu_assert_fwd(y, dt, yr, sc, T, what);
          lib_train_bwd(dx, sdy, sdx, dy, x, mean, rstd, gamma, N, C, S, lay, dt);
          ref_train_bwd(dxr, dgr, dbr, dyd, xd, g64, N, C, S, lay, EPS);
          assert_dx_each_channel(dx, dt, dxr, dyd, gamma, rstd, N, C, S, lay,
                                 dt == SN_DTYPE_F32 ? TU_RTOL_F32_BWD : tu_rtol_half_bwd(dt),
                                 what);
          { /* the other layout, same statistics: bitwise the same y and dx (the channels
             * mapped in fp64 share NHWC tiles with ordinary ones when C > 2) */
            const sn_layout_t other = LAYOUTS[1 - il];
            void *x2 = tu_alloc(T, dt), *dy2 = tu_alloc(T, dt), *o2 = tu_alloc(T, dt);
            void *o1 = tu_alloc(T, dt);
            tu_transpose(x2, other, x, lay, N, C, S, dt);
            tu_transpose(dy2, other, dy, lay, N, C, S, dt);
            ck_assert_int_eq(
                sn_batchnorm_apply(o2, x2, mean, rstd, gamma, beta, N, C, S, other, dt), SN_OK);
            tu_transpose(o1, lay, o2, other, N, C, S, dt);
            tu_assert_bitwise(o1, y, (size_t)(T * sn_dtype_size(dt)), "apply, other layout");
            ck_assert_int_eq(sn_batchnorm_bwd_apply(o2, dy2, x2, mean, rstd, gamma, sdy, sdx,
                                                    N * S, N, C, S, other, dt),
                             SN_OK);
            tu_transpose(o1, lay, o2, other, N, C, S, dt);
            tu_assert_bitwise(o1, dx, (size_t)(T * sn_dtype_size(dt)), "bwd_apply, other layout");
            free(x2), free(dy2), free(o2), free(o1);
          }
          for (int64_t c = 0; c < C; c++) {
            rm[c] = c % 2 == 0 ? 1e38f : 0.5f;
            rv[c] = c % 2 == 0 ? FLT_MAX / 2 : 2.0f;
          }
          for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++)
              for (int64_t ss = 0; ss < S; ss++) {
                const int64_t i = tu_at(lay, n, c, ss, C, S);
                yr[i] = ref_map(&sc[i], xd[i], rm[c], 1.0 / sqrt((double)rv[c] + (double)EPS),
                                gamma[c], beta[c]);
              }
          tu_poison(y, T, dt);
          ck_assert_int_eq(sn_batchnorm_infer(y, x, rm, rv, gamma, beta, N, C, S, EPS, lay, dt),
                           SN_OK);
          tu_assert_fwd(y, dt, yr, sc, T, what);
          free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(var), free(rstd);
          free(rm), free(rv), free(mean), free(g64), free(b64), free(yr), free(sdy), free(sdx);
          free(dxr), free(dgr), free(dbr), free(xd), free(dyd), free(sc);
        }
}
END_TEST

/* bwd_reduce + bwd_apply vs the analytic fp64 gradient over the shape grid: the sums (= dbeta,
 * dgamma) in fp64 and every dx element. */
START_TEST(test_train_bwd_vs_analytic) {
  tu_rng_t r;
  tu_rng_seed(&r, 4);
  for (size_t ins = 0; ins < sizeof NS / sizeof NS[0]; ins++)
    for (size_t ic = 0; ic < sizeof CS / sizeof CS[0]; ic++)
      for (int il = 0; il < 2; il++)
        for (int id = 0; id < 3; id++)
          for (int affine = 0; affine < 2; affine++) {
            const int64_t N = NS[ins][0], S = NS[ins][1], C = CS[ic], T = N * C * S;
            const sn_layout_t lay = LAYOUTS[il];
            const sn_dtype_t dt = DTYPES[id];
            void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dy = tu_alloc(T, dt);
            void *dx = tu_alloc(T, dt);
            float *gamma = tu_falloc(C), *beta = tu_falloc(C), *rstd = tu_falloc(C);
            double *mean = tu_dalloc(C), *sdy = tu_dalloc(C), *sdx = tu_dalloc(C),
                *g64 = tu_dalloc(C);
            double *dxr = tu_dalloc(T), *dgr = tu_dalloc(C), *dbr = tu_dalloc(C);
            fill_bn(x, N, C, S, lay, dt, -2.0, 0.5, &r);
            tu_fill_normal(dy, T, dt, 0.3, 1.0, &r);
            tu_fill_params(gamma, beta, C, &r);
            for (int64_t c = 0; c < C; c++) g64[c] = affine ? gamma[c] : 1.0;
            lib_train_fwd(y, mean, NULL, rstd, x, NULL, gamma, beta, N, C, S, lay, dt);
            lib_train_bwd(dx, sdy, sdx, dy, x, mean, rstd, affine ? gamma : NULL, N, C, S, lay, dt);
            double *xd = tu_to_f64(x, T, dt), *dyd = tu_to_f64(dy, T, dt);
            ref_train_bwd(dxr, dgr, dbr, dyd, xd, g64, N, C, S, lay, EPS);
            for (int64_t c = 0; c < C; c++) { /* sums with the library's own f32 rstd */
              double e1 = 0.0, e2 = 0.0, a1 = 0.0, a2 = 0.0;
              for (int64_t n = 0; n < N; n++)
                for (int64_t s = 0; s < S; s++) {
                  int64_t i = tu_at(lay, n, c, s, C, S);
                  double xh = (xd[i] - mean[c]) * rstd[c];
                  e1 += dyd[i], a1 += fabs(dyd[i]);
                  e2 += dyd[i] * xh, a2 += fabs(dyd[i] * xh);
                }
              ck_assert_msg(fabs(sdy[c] - e1) <= TOL_SUM_F64 * a1, "sum_dy[%lld] %.17g vs %.17g",
                            (long long)c, sdy[c], e1);
              ck_assert_msg(fabs(sdx[c] - e2) <= TOL_SUM_F64 * a2 + 1e-300,
                            "sum_dy_xhat[%lld] %.17g vs %.17g", (long long)c, sdx[c], e2);
              /* and against the exact dgamma (fp64 rstd): only the f32 rounding of rstd differs */
              ck_assert_msg(fabs(sdx[c] - dgr[c]) <= TOL_STAT_F32 * a2 + 1e-300,
                            "dgamma[%lld] %.17g vs %.17g", (long long)c, sdx[c], dgr[c]);
            }
            assert_dx(dx, dt, dxr, dyd, affine ? gamma : NULL, rstd, N, C, S, lay, "train bwd");
            free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(rstd);
            free(mean), free(sdy), free(sdx), free(g64), free(dxr), free(dgr), free(dbr);
            free(xd), free(dyd);
          }
}
END_TEST

/* The analytic fp64 gradient (dx, dgamma, dbeta) vs central finite differences of the fp64
 * training forward with loss = Σ y·w; and the library's f32 dx vs the same differences. */
START_TEST(test_train_bwd_vs_fd) {
  static const int64_t shapes[][3] = {{1, 2, 2}, {2, 3, 1}, {1, 1, 3}, {3, 2, 4}, {4, 3, 5}};
  tu_rng_t r;
  tu_rng_seed(&r, 5);
  for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
    for (int il = 0; il < 2; il++) {
      const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2], T = N * C * S;
      const sn_layout_t lay = LAYOUTS[il];
      float *x = tu_falloc(T), *w = tu_falloc(T), *dx = tu_falloc(T), *y = tu_falloc(T),
          *rstd = tu_falloc(C);
      float *gamma = tu_falloc(C), *beta = tu_falloc(C);
      double *xd = tu_dalloc(T), *wd = tu_dalloc(T), *yp = tu_dalloc(T), *ym = tu_dalloc(T),
          *dxr = tu_dalloc(T);
      double *fd = tu_dalloc(T), *g64 = tu_dalloc(C), *b64 = tu_dalloc(C), *dgr = tu_dalloc(C);
      double *dbr = tu_dalloc(C), *mean = tu_dalloc(C), *sdy = tu_dalloc(C), *sdx = tu_dalloc(C);
      fill_bn(x, N, C, S, lay, SN_DTYPE_F32, 0.5, 1.0, &r);
      tu_fill_normal(w, T, SN_DTYPE_F32, 0.0, 1.0, &r);
      tu_fill_params(gamma, beta, C, &r);
      for (int64_t i = 0; i < T; i++) xd[i] = x[i], wd[i] = w[i];
      for (int64_t c = 0; c < C; c++) g64[c] = gamma[c], b64[c] = beta[c];
      ref_train_bwd(dxr, dgr, dbr, wd, xd, g64, N, C, S, lay, EPS);
      const double h = 1e-6; /* x, gamma, beta are O(1) */
      for (int64_t i = 0; i < T; i++) {
        double keep = xd[i];
        xd[i] = keep + h;
        ref_train_fwd(yp, NULL, xd, g64, b64, N, C, S, lay, EPS);
        xd[i] = keep - h;
        ref_train_fwd(ym, NULL, xd, g64, b64, N, C, S, lay, EPS);
        xd[i] = keep;
        fd[i] = (dot(yp, wd, T) - dot(ym, wd, T)) / (2 * h);
      }
      lib_train_fwd(y, mean, NULL, rstd, x, NULL, gamma, beta, N, C, S, lay, SN_DTYPE_F32);
      assert_dx_tol(dxr, SN_DTYPE_F64, fd, wd, gamma, rstd, N, C, S, lay, TU_RTOL_FD,
                    "analytic dx vs finite differences");
      for (int pass = 0; pass < 2; pass++) { /* dgamma, then dbeta */
        double *p = pass == 0 ? g64 : b64, *an = pass == 0 ? dgr : dbr, *fdp = tu_dalloc(C);
        for (int64_t c = 0; c < C; c++) {
          double keep = p[c];
          p[c] = keep + h;
          ref_train_fwd(yp, NULL, xd, g64, b64, N, C, S, lay, EPS);
          p[c] = keep - h;
          ref_train_fwd(ym, NULL, xd, g64, b64, N, C, S, lay, EPS);
          p[c] = keep;
          fdp[c] = (dot(yp, wd, T) - dot(ym, wd, T)) / (2 * h);
        }
        tu_assert_rel(an, SN_DTYPE_F64, fdp, C, TU_RTOL_FD,
                      pass == 0 ? "analytic dgamma vs FD" : "analytic dbeta vs FD");
        free(fdp);
      }
      lib_train_bwd(dx, sdy, sdx, w, x, mean, rstd, gamma, N, C, S, lay, SN_DTYPE_F32);
      assert_dx(dx, SN_DTYPE_F32, fd, wd, gamma, rstd, N, C, S, lay, "library dx vs FD");
      tu_assert_rel(sdx, SN_DTYPE_F64, dgr, C, TU_RTOL_F32_BWD, "library sum_dy_xhat vs dgamma");
      tu_assert_rel(sdy, SN_DTYPE_F64, dbr, C, 1e-15, "library sum_dy vs dbeta");
      free(x), free(w), free(dx), free(y), free(rstd), free(gamma), free(beta), free(xd);
      free(wd), free(yp), free(ym), free(dxr), free(fd), free(g64), free(b64), free(dgr);
      free(dbr), free(mean), free(sdy), free(sdx);
    }
}
END_TEST

/* Eval mode (sum_dy = sum_dy_xhat = NULL): dx vs finite differences of the fp64 inference
 * forward, all dtypes and layouts. */
START_TEST(test_eval_bwd_vs_fd) {
  tu_rng_t r;
  tu_rng_seed(&r, 6);
  const int64_t N = 3, C = 5, S = 7, T = N * C * S;
  for (int il = 0; il < 2; il++)
    for (int id = 0; id < 3; id++) {
      const sn_layout_t lay = LAYOUTS[il];
      const sn_dtype_t dt = DTYPES[id];
      void *x = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *dx = tu_alloc(T, dt);
      float *gamma = tu_falloc(C), *beta = tu_falloc(C), *rm = tu_falloc(C), *rv = tu_falloc(C);
      float *rstd = tu_falloc(C);
      double *mean = tu_dalloc(C), *xd = tu_dalloc(T), *fd = tu_dalloc(T);
      fill_bn(x, N, C, S, lay, dt, 0.0, 1.0, &r);
      tu_fill_normal(dy, T, dt, 0.0, 1.0, &r);
      tu_fill_params(gamma, beta, C, &r);
      for (int64_t c = 0; c < C; c++) {
        rm[c] = (float)tu_rng_normal(&r);
        rv[c] = (float)(0.5 + tu_rng_uniform(&r));
        mean[c] = rm[c];
        rstd[c] = (float)(1.0 / sqrt((double)rv[c] + (double)EPS));
      }
      for (int64_t i = 0; i < T; i++) xd[i] = tu_get(x, i, dt);
      /* L(x) = Σ y·dy with y the fp64 inference forward; it is linear, so h = 1e-3 is exact
       * up to rounding. */
      const double h = 1e-3;
      for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
          for (int64_t s = 0; s < S; s++) {
            int64_t i = tu_at(lay, n, c, s, C, S);
            double k = gamma[c] / sqrt((double)rv[c] + (double)EPS);
            double yp = (xd[i] + h - rm[c]) * k + beta[c], ym = (xd[i] - h - rm[c]) * k + beta[c];
            fd[i] = (yp - ym) * tu_get(dy, i, dt) / (2 * h);
          }
      tu_poison(dx, T, dt);
      ck_assert_int_eq(sn_batchnorm_bwd_apply(dx, dy, x, mean, rstd, gamma, NULL, NULL, 0, N, C, S,
                                              lay, dt),
                       SN_OK);
      if (dt == SN_DTYPE_F32)
        tu_assert_rel(dx, dt, fd, T, TU_RTOL_F32_BWD, "eval bwd dx vs FD");
      else
        tu_assert_rel(dx, dt, fd, T, tu_rtol_half_bwd(dt), "eval bwd dx vs FD");
      free(x), free(dy), free(dx), free(gamma), free(beta), free(rm), free(rv), free(rstd);
      free(mean), free(xd), free(fd);
    }
}
END_TEST

/* Pivots 0, the channel mean and a far value give the same statistics within the documented
 * bound: |Δvar| ≤ count·2^-53·(var + (mean − p)²) (fp64 sums) + one f32 rounding. */
START_TEST(test_pivots) {
  tu_rng_t r;
  tu_rng_seed(&r, 7);
  const int64_t N = 4, C = 6, S = 250, T = N * C * S, M = N * S;
  for (int il = 0; il < 2; il++) {
    const sn_layout_t lay = LAYOUTS[il];
    float *x = tu_falloc(T), *var = tu_falloc(C), *rstd = tu_falloc(C), *piv = tu_falloc(C);
    double *mean = tu_dalloc(C), *rm = tu_dalloc(C), *rv = tu_dalloc(C), *sum = tu_dalloc(C);
    double *sq = tu_dalloc(C);
    fill_bn(x, N, C, S, lay, SN_DTYPE_F32, 3.0, 2.0, &r);
    double *xd = tu_to_f64(x, T, SN_DTYPE_F32);
    ref_stats(rm, rv, xd, N, C, S, lay);
    for (int kind = 0; kind < 3; kind++) {
      for (int64_t c = 0; c < C; c++)
        piv[c] = kind == 0 ? 0.0f : kind == 1 ? (float)rm[c] : (float)(rm[c] + 1000.0);
      poison_f64(sum, C), poison_f64(sq, C), poison_f64(mean, C);
      tu_poison_f32(var, C), tu_poison_f32(rstd, C);
      ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, piv, N, C, S, lay, SN_DTYPE_F32), SN_OK);
      ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum, sq, piv, M, C, EPS), SN_OK);
      for (int64_t c = 0; c < C; c++) {
        double off = rm[c] - piv[c], u = 0x1p-53 * (double)M;
        double bv = u * (rv[c] + off * off) + 0x1p-24 * rv[c];
        double bm = u * (fabs(rm[c]) + fabs(off) + sqrt(rv[c]));
        ck_assert_msg(fabs(var[c] - rv[c]) <= bv, "pivot kind %d: var[%lld] %.9g vs %.17g (bound %.3g)",
                      kind, (long long)c, (double)var[c], rv[c], bv);
        ck_assert_msg(fabs(mean[c] - rm[c]) <= bm, "pivot kind %d: mean[%lld] %.17g vs %.17g",
                      kind, (long long)c, mean[c], rm[c]);
        ck_assert(isfinite(rstd[c]));
      }
    }
    free(x), free(var), free(rstd), free(piv), free(mean), free(rm), free(rv), free(sum);
    free(sq), free(xd);
  }
}
END_TEST

/* Pivots nowhere near the data: 8e6 + {−0.5, 0, 0.5} (σ = 0.41) with pivots 1e22, 1e24,
 * ±3e38 and +inf; a constant channel (4751940608, σ = 0) with pivot −1.5e23; bf16 −2^37.6
 * constant with pivot −2^95. The first sums hold nothing of the data, so a pivot refined from
 * them alone would be a rounding residue and the variance 11 % off (constant channels: var 0.25
 * instead of 0; an infinite pivot: NaN statistics). sn_batchnorm_fwd (fused NCHW, unfused
 * NHWC) must give the fp64 statistics: mean to 2^-40 of |mean|, var to 2^-20 of itself plus
 * 2^-40·mean², rstd and y following. */
START_TEST(test_far_pivot) {
  static const float PIVOTS[] = {1e22f, 1e24f, 3e38f, -3e38f, INFINITY};
  enum { C = 3, N = 2, S = 150, T = N * C * S };
  for (int idt = 0; idt < 2; idt++)
    for (int il = 0; il < 2; il++)
      for (size_t k = 0; k < sizeof PIVOTS / sizeof PIVOTS[0]; k++) {
        const sn_dtype_t dt = idt == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
        const sn_layout_t lay = LAYOUTS[il];
        void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
        float piv[C], var[C], rstd[C], beta[C] = {0.5f, 0.5f, 0.5f};
        double mean[C], rm[C], rv[C];
        for (int64_t n = 0; n < N; n++)
          for (int64_t sp = 0; sp < S; sp++) {
            const int64_t i = n * S + sp;
            /* bf16 spacing at 8e6 is 2^16: the spread there is 2^16 too */
            const double spread = dt == SN_DTYPE_F32 ? 0.5 : 65536.0;
            tu_set(x, tu_at(lay, n, 0, sp, C, S), 8e6 + spread * (double)(i % 3 - 1), dt);
            tu_set(x, tu_at(lay, n, 1, sp, C, S), dt == SN_DTYPE_F32 ? 4751940608.0 : -0x1.8p37,
                dt);
            tu_set(x, tu_at(lay, n, 2, sp, C, S), -8e6 - spread * (double)(i % 3 - 1), dt);
          }
        piv[0] = PIVOTS[k];
        piv[1] = dt == SN_DTYPE_F32 ? -1.51115727e23f : -0x1p95f;
        piv[2] = -PIVOTS[k];
        double *xd = tu_to_f64(x, T, dt);
        ref_stats(rm, rv, xd, N, C, S, lay);
        poison_f64(mean, C), tu_poison_f32(var, C), tu_poison_f32(rstd, C), tu_poison(y, T, dt);
        const sn_status_t st = sn_batchnorm_fwd(y, mean, var, rstd, x, piv, NULL, beta, N, C, S,
                                                EPS, lay, dt);
        ck_assert_msg(st == SN_OK, "%s", sn_last_error());
        for (int64_t c = 0; c < C; c++) {
          const double want_rstd = 1.0 / sqrt(rv[c] + (double)EPS);
          TU_CHECK(fabs(mean[c] - rm[c]) <= 0x1p-40 * fabs(rm[c]),
                   "%s %s pivot %g channel %lld: mean %.17g, want %.17g", tu_dtype_name[dt],
                   LNAME[il], (double)piv[c], (long long)c, mean[c], rm[c]);
          TU_CHECK(fabs(var[c] - rv[c]) <= 0x1p-20 * rv[c] + 0x1p-40 * rm[c] * rm[c] * 0x1p-40,
                   "%s %s pivot %g channel %lld: var %.9g, want %.17g", tu_dtype_name[dt],
                   LNAME[il], (double)piv[c], (long long)c, (double)var[c], rv[c]);
          TU_CHECK(fabs(rstd[c] - want_rstd) <= 0x1p-20 * want_rstd,
                   "%s %s pivot %g channel %lld: rstd %.9g, want %.17g", tu_dtype_name[dt],
                   LNAME[il], (double)piv[c], (long long)c, (double)rstd[c], want_rstd);
        }
        double *yr = tu_dalloc(T), *sc = tu_dalloc(T);
        for (int64_t n = 0; n < N; n++)
          for (int64_t c = 0; c < C; c++)
            for (int64_t sp = 0; sp < S; sp++) {
              const int64_t i = tu_at(lay, n, c, sp, C, S);
              yr[i] = ref_map(&sc[i], xd[i], rm[c], 1.0 / sqrt(rv[c] + (double)EPS), 1.0,
                              (double)beta[c]);
            }
        tu_assert_fwd(y, dt, yr, sc, T, "sn_batchnorm_fwd, a pivot far from the data");
        free(x), free(y), free(xd), free(yr), free(sc);
      }
}
END_TEST

/* A batch split into parts [3 samples] + [0] + [1] + [rest]: summing the parts' stats and
 * backward sums equals the whole batch bit for bit with small-integer inputs (every partial sum
 * exact), and so do finalize and dx. This is what SyncBatchNorm relies on. The backward uses a
 * dyadic mean so that Σ dy·(x − mean) is exact too (rstd·Q is exact: 24 × few bits). */
START_TEST(test_split_batch_bitwise) {
  static const int64_t shapes[][3] = {{9, 3, 5}, {12, 65, 1}, {6, 4, 37}};
  tu_rng_t r;
  tu_rng_seed(&r, 8);
  for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
    for (int il = 0; il < 2; il++)
      for (int id = 0; id < 3; id++) {
        const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2], T = N * C * S;
        const int64_t parts[4] = {3, 0, 1, N - 4};
        const sn_layout_t lay = LAYOUTS[il];
        const sn_dtype_t dt = DTYPES[id];
        const int64_t es = sn_dtype_size(dt);
        void *x = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *dx1 = tu_alloc(T, dt);
        void *dx2 = tu_alloc(T, dt);
        float *piv = tu_falloc(C), *rstd1 = tu_falloc(C), *rstd2 = tu_falloc(C),
            *var1 = tu_falloc(C);
        float *var2 = tu_falloc(C), *gamma = tu_falloc(C), *beta = tu_falloc(C);
        double *sum = tu_dalloc(C), *sq = tu_dalloc(C), *ps = tu_dalloc(C), *pq = tu_dalloc(C);
        double *tot_s = tu_dalloc(C), *tot_q = tu_dalloc(C), *mean1 = tu_dalloc(C),
            *mean2 = tu_dalloc(C);
        double *dmean = tu_dalloc(C);
        for (int64_t i = 0; i < T; i++) {
          tu_set(x, i, (double)tu_rng_int(&r, -8, 8), dt);
          tu_set(dy, i, (double)tu_rng_int(&r, -4, 4), dt);
        }
        tu_fill_params(gamma, beta, C, &r);
        for (int64_t c = 0; c < C; c++) piv[c] = (float)(c % 3), dmean[c] = 0.25 * (double)(c % 5) - 0.5;
        /* forward: whole vs Σ parts */
        ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, piv, N, C, S, lay, dt), SN_OK);
        for (int64_t c = 0; c < C; c++) tot_s[c] = 0.0, tot_q[c] = 0.0;
        int64_t n0 = 0;
        for (int p = 0; p < 4; p++) {
          const void *xp = parts[p] ? (const char *)x + n0 * C * S * es : NULL;
          poison_f64(ps, C), poison_f64(pq, C);
          ck_assert_int_eq(sn_batchnorm_stats(ps, pq, xp, piv, parts[p], C, S, lay, dt), SN_OK);
          for (int64_t c = 0; c < C; c++) tot_s[c] += ps[c], tot_q[c] += pq[c];
          n0 += parts[p];
        }
        tu_assert_bitwise(sum, tot_s, (size_t)C * 8, "split: sum");
        tu_assert_bitwise(sq, tot_q, (size_t)C * 8, "split: sumsq");
        ck_assert_int_eq(sn_batchnorm_finalize(mean1, var1, rstd1, sum, sq, piv, N * S, C, EPS), SN_OK);
        ck_assert_int_eq(sn_batchnorm_finalize(mean2, var2, rstd2, tot_s, tot_q, piv, N * S, C, EPS), SN_OK);
        tu_assert_bitwise(mean1, mean2, (size_t)C * 8, "split: mean");
        tu_assert_bitwise(var1, var2, (size_t)C * 4, "split: var");
        tu_assert_bitwise(rstd1, rstd2, (size_t)C * 4, "split: rstd");
        /* backward: whole vs Σ parts, then dx per part with the summed sums vs whole dx */
        ck_assert_int_eq(sn_batchnorm_bwd_reduce(sum, sq, dy, x, dmean, rstd1, N, C, S, lay, dt), SN_OK);
        for (int64_t c = 0; c < C; c++) tot_s[c] = 0.0, tot_q[c] = 0.0;
        n0 = 0;
        for (int p = 0; p < 4; p++) {
          const int64_t off = n0 * C * S * es;
          const void *xp = parts[p] ? (const char *)x + off : NULL;
          const void *dyp = parts[p] ? (const char *)dy + off : NULL;
          poison_f64(ps, C), poison_f64(pq, C);
          ck_assert_int_eq(sn_batchnorm_bwd_reduce(ps, pq, dyp, xp, dmean, rstd1, parts[p], C, S, lay, dt), SN_OK);
          for (int64_t c = 0; c < C; c++) tot_s[c] += ps[c], tot_q[c] += pq[c];
          n0 += parts[p];
        }
        tu_assert_bitwise(sum, tot_s, (size_t)C * 8, "split: sum_dy");
        tu_assert_bitwise(sq, tot_q, (size_t)C * 8, "split: sum_dy_xhat");
        tu_poison(dx1, T, dt), tu_poison(dx2, T, dt);
        ck_assert_int_eq(sn_batchnorm_bwd_apply(dx1, dy, x, dmean, rstd1, gamma, sum, sq, N * S, N, C, S, lay, dt), SN_OK);
        n0 = 0;
        for (int p = 0; p < 4; p++) {
          const int64_t off = n0 * C * S * es;
          ck_assert_int_eq(sn_batchnorm_bwd_apply(parts[p] ? (char *)dx2 + off : NULL,
                                                  parts[p] ? (const char *)dy + off : NULL,
                                                  parts[p] ? (const char *)x + off : NULL, dmean,
                                                  rstd1, gamma, tot_s, tot_q, N * S, parts[p], C,
                                                  S, lay, dt),
                           SN_OK);
          n0 += parts[p];
        }
        tu_assert_bitwise(dx1, dx2, (size_t)(T * es), "split: dx");
        tu_assert_all_finite(dx2, dt, T, "split: dx");
        free(x), free(dy), free(dx1), free(dx2), free(piv), free(rstd1), free(rstd2);
        free(var1), free(var2), free(gamma), free(beta), free(sum), free(sq), free(ps);
        free(pq), free(tot_s), free(tot_q), free(mean1), free(mean2), free(dmean);
      }
}
END_TEST

/* An empty local batch (n = 0 or s = 0, x NULL) is valid: stats and bwd_reduce write zeros,
 * apply/infer/bwd_apply write nothing. */
START_TEST(test_empty_batch) {
  const int64_t C = 5;
  double sum[5], sq[5], mean[5] = {0, 1, 2, 3, 4};
  float rstd[5] = {1, 1, 1, 1, 1}, rv[5] = {1, 1, 1, 1, 1}, rm[5] = {0};
  float y[4];
  /* e = 2: n = 0 with s beyond int64 byte counts (INT64_MAX/4), valid since nothing of size s
   * exists in an empty batch (only c sizes arrays) */
  for (int e = 0; e < 3; e++) {
    const int64_t n = e == 1 ? 3 : 0, s = e == 0 ? 4 : e == 2 ? INT64_MAX / 4 : 0;
    poison_f64(sum, C), poison_f64(sq, C);
    ck_assert_int_eq(sn_batchnorm_stats(sum, sq, NULL, NULL, n, C, s, SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
    for (int c = 0; c < C; c++) ck_assert_msg(sum[c] == 0.0 && sq[c] == 0.0, "empty batch: sums not zero");
    poison_f64(sum, C), poison_f64(sq, C);
    ck_assert_int_eq(sn_batchnorm_bwd_reduce(sum, sq, NULL, NULL, mean, rstd, n, C, s, SN_LAYOUT_NHWC, SN_DTYPE_BF16), SN_OK);
    for (int c = 0; c < C; c++) ck_assert_msg(sum[c] == 0.0 && sq[c] == 0.0, "empty batch: sums not zero");
    tu_poison_f32(y, 4);
    ck_assert_int_eq(sn_batchnorm_apply(NULL, NULL, mean, rstd, NULL, NULL, n, C, s, SN_LAYOUT_NCHW, SN_DTYPE_F16), SN_OK);
    ck_assert_int_eq(sn_batchnorm_infer(NULL, NULL, rm, rv, NULL, NULL, n, C, s, EPS, SN_LAYOUT_NHWC, SN_DTYPE_F32), SN_OK);
    ck_assert_int_eq(sn_batchnorm_bwd_apply(NULL, NULL, NULL, mean, rstd, NULL, sum, sq, 10, n, C, s, SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
    ck_assert_int_eq(sn_batchnorm_bwd_apply(NULL, NULL, NULL, mean, rstd, NULL, NULL, NULL, 0, n, C, s, SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
    for (int i = 0; i < 4; i++) ck_assert(isnan(y[i]));
  }
}
END_TEST

/* finalize with count 0 or 1 (or negative) is SN_ERR_INSUFFICIENT_COUNT and writes nothing. */
START_TEST(test_finalize_count) {
  const int64_t C = 3;
  const double sum[3] = {1, 2, 3}, sq[3] = {4, 5, 6};
  const int64_t counts[3] = {0, 1, -5};
  for (int i = 0; i < 3; i++) {
    double mean[3];
    float var[3], rstd[3];
    poison_f64(mean, C), tu_poison_f32(var, C), tu_poison_f32(rstd, C);
    double m0[3];
    float v0[3], r0[3];
    memcpy(m0, mean, sizeof m0), memcpy(v0, var, sizeof v0), memcpy(r0, rstd, sizeof r0);
    ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum, sq, NULL, counts[i], C, EPS),
                     SN_ERR_INSUFFICIENT_COUNT);
    ck_assert_msg(strncmp(sn_last_error(), "sn_batchnorm_finalize", 21) == 0, "%s", sn_last_error());
    ck_assert_msg(strstr(sn_last_error(), "more than 1 value per channel") != NULL, "%s", sn_last_error());
    tu_assert_bitwise(mean, m0, sizeof m0, "finalize mean untouched");
    tu_assert_bitwise(var, v0, sizeof v0, "finalize var untouched");
    tu_assert_bitwise(rstd, r0, sizeof r0, "finalize rstd untouched");
  }
  double mean[3];
  float rstd[3];
  ck_assert_int_eq(sn_batchnorm_finalize(mean, NULL, rstd, sum, sq, NULL, 2, C, EPS), SN_OK);
}
END_TEST

/* Relative tolerance of one running-statistics step: the new value is one f32 rounding (2^-24)
 * of an fp64 expression of f32 inputs (a few 2^-53), against a long double reference. */
#define TOL_RUNNING 0x1p-23

/* sn_batchnorm_update_running: PyTorch's update (momentum 0.1 and None) over batches of several
 * counts, each step against a long double reference from the previous state; an empty batch
 * only counts (and moves the cumulative factor, as in PyTorch); count 1, a bad momentum, a bad
 * size or a missing num_batches_tracked write nothing; num_batches_tracked saturates. */
START_TEST(test_update_running) {
  enum { C = 5, STEPS = 7 };
  tu_rng_t rng;
  tu_rng_seed(&rng, 4242);
  for (int mode = 0; mode < 2; mode++) {
    const float momentum = mode == 0 ? 0.1f : SN_MOMENTUM_CUMULATIVE;
    float rm[C], rv[C];
    for (int c = 0; c < C; c++) rm[c] = 0.0f, rv[c] = 1.0f;
    int64_t nbt = 0;
    for (int step = 0; step < STEPS; step++) {
      const int64_t count = step == 2 ? 0 : 2 + 7 * step;
      double mean[C];
      float var[C], rm0[C], rv0[C];
      for (int c = 0; c < C; c++) {
        mean[c] = 3.0 + tu_rng_normal(&rng);
        var[c] = (float)(0.5 + fabs(tu_rng_normal(&rng)));
      }
      memcpy(rm0, rm, sizeof rm), memcpy(rv0, rv, sizeof rv);
      ck_assert_int_eq(sn_batchnorm_update_running(rm, rv, &nbt, mean, var, count, C, momentum),
                       SN_OK);
      ck_assert_int_eq(nbt, step + 1); /* every batch counts, the empty one too */
      if (count == 0) {
        tu_assert_bitwise(rm, rm0, sizeof rm, "empty batch: running_mean untouched");
        tu_assert_bitwise(rv, rv0, sizeof rv, "empty batch: running_var untouched");
        continue;
      }
      const long double f = mode == 0 ? (long double)0.1f : 1.0L / (long double)(step + 1);
      for (int c = 0; c < C; c++) {
        const long double em = (1 - f) * rm0[c] + f * mean[c];
        const long double ev = (1 - f) * rv0[c] + f * var[c] * (long double)count / (count - 1);
        ck_assert_msg(fabsl(rm[c] - em) <= TOL_RUNNING * fabsl(em) &&
                          fabsl(rv[c] - ev) <= TOL_RUNNING * fabsl(ev),
                      "momentum %g step %d channel %d: %.9g %.9g, reference %.9Lg %.9Lg",
                      (double)momentum, step, c, (double)rm[c], (double)rv[c], em, ev);
      }
    }
  }
  /* errors write nothing */
  float rm[2] = {1, 2}, rv[2] = {3, 4}, var[2] = {1, 1};
  const double mean[2] = {0, 0};
  int64_t nbt = 5;
  static const struct { int64_t count, c; float momentum; int null_nbt; sn_status_t want; } bad[] = {
      {1, 2, 0.1f, 0, SN_ERR_INSUFFICIENT_COUNT}, {-1, 2, 0.1f, 0, SN_ERR_INVALID_SIZE},
      {4, 0, 0.1f, 0, SN_ERR_INVALID_SIZE},       {4, 2, 1.5f, 0, SN_ERR_INVALID_ARGUMENT},
      {4, 2, NAN, 0, SN_ERR_INVALID_ARGUMENT},    {4, 2, -0.5f, 0, SN_ERR_INVALID_ARGUMENT},
      {4, 2, SN_MOMENTUM_CUMULATIVE, 1, SN_ERR_NULL_POINTER}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const sn_status_t st = sn_batchnorm_update_running(rm, rv, bad[i].null_nbt ? NULL : &nbt, mean,
                                                       var, bad[i].count, bad[i].c, bad[i].momentum);
    ck_assert_msg(st == bad[i].want, "case %zu: %s (%s)", i, sn_status_string(st), sn_last_error());
    ck_assert_msg(strncmp(sn_last_error(), "sn_batchnorm_update_running", 27) == 0, "%s",
                  sn_last_error());
    ck_assert(rm[0] == 1 && rm[1] == 2 && rv[0] == 3 && rv[1] == 4 && nbt == 5);
  }
  nbt = -3; /* a negative count (a bad checkpoint): refused, nothing written */
  ck_assert_int_eq(sn_batchnorm_update_running(rm, rv, &nbt, mean, var, 4, 2, 0.1f),
                   SN_ERR_INVALID_ARGUMENT);
  ck_assert(rm[0] == 1 && rm[1] == 2 && rv[0] == 3 && rv[1] == 4 && nbt == -3);
  nbt = 5;
  ck_assert_int_eq(sn_batchnorm_update_running(rm, rv, NULL, mean, var, 4, 2, 0.1f), SN_OK);
  ck_assert_int_eq(sn_batchnorm_update_running(NULL, NULL, &nbt, NULL, NULL, 0, 2, 0.1f), SN_OK);
  ck_assert_int_eq(nbt, 6);
  nbt = INT64_MAX;
  ck_assert_int_eq(sn_batchnorm_update_running(rm, rv, &nbt, mean, var, 4, 2, 0.1f), SN_OK);
  ck_assert(nbt == INT64_MAX);
}
END_TEST

/* ---- bad input: each case returns its code, names the function and writes nothing ----------- */

enum { BT = 24, BC = 3 }; /* N = 2, C = 3, S = 4 */
typedef struct {
  float y[BT], dx[BT], var[BC], rstd[BC], dg[BC], db[BC];
  double sum[BC], sq[BC], mean[BC];
} outs_t;

static void check_bad(sn_status_t got, sn_status_t want, const char *fn, const outs_t *o,
                      const outs_t *o0, const char *what) {
  ck_assert_msg(got == want, "%s: got %s, want %s (%s)", what, sn_status_string(got),
                sn_status_string(want), sn_last_error());
  ck_assert_msg(strncmp(sn_last_error(), fn, strlen(fn)) == 0, "%s: message '%s' does not start with %s",
                what, sn_last_error(), fn);
  tu_assert_bitwise(o, o0, sizeof *o, what);
}

START_TEST(test_bad_inputs) {
  float x[BT], dy[BT], g[BC] = {1, 1, 1}, rs[BC] = {1, 1, 1}, rv[BC] = {1, 1, 1}, rm[BC] = {0};
  double m[BC] = {0}, sd[BC] = {0}, sx[BC] = {0};
  for (int i = 0; i < BT; i++) x[i] = (float)i, dy[i] = 1.0f;
  outs_t o, o0;
  memset(&o, 0xA5, sizeof o); /* a NaN-like pattern in every output */
  memcpy(&o0, &o, sizeof o);
  const sn_layout_t L = SN_LAYOUT_NCHW, BADL = (sn_layout_t)7;
  const sn_dtype_t D = SN_DTYPE_F32, F64 = SN_DTYPE_F64, BADD = (sn_dtype_t)9;
  const int64_t big = (int64_t)1 << 22; /* big³ = 2^66 elements */
  const char *fs = "sn_batchnorm_stats", *ff = "sn_batchnorm_finalize", *fa = "sn_batchnorm_apply";
  const char *fi = "sn_batchnorm_infer", *fr = "sn_batchnorm_bwd_reduce", *fb = "sn_batchnorm_bwd_apply";
  /* stats */
  check_bad(sn_batchnorm_stats(NULL, o.sq, x, NULL, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fs, &o, &o0, "stats sum NULL");
  check_bad(sn_batchnorm_stats(o.sum, NULL, x, NULL, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fs, &o, &o0, "stats sumsq NULL");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, NULL, NULL, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fs, &o, &o0, "stats x NULL");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, x, NULL, 2, 0, 4, L, D), SN_ERR_INVALID_SIZE, fs, &o, &o0, "stats c 0");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, x, NULL, -1, 3, 4, L, D), SN_ERR_INVALID_SIZE, fs, &o, &o0, "stats n -1");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, x, NULL, 2, 3, -4, L, D), SN_ERR_INVALID_SIZE, fs, &o, &o0, "stats s -4");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, x, NULL, big, big, big, L, D), SN_ERR_OVERFLOW, fs, &o, &o0, "stats overflow");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, x, NULL, 2, 3, 4, BADL, D), SN_ERR_INVALID_LAYOUT, fs, &o, &o0, "stats layout");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, x, NULL, 2, 3, 4, L, F64), SN_ERR_INVALID_DTYPE, fs, &o, &o0, "stats f64");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, x, NULL, 2, 3, 4, L, BADD), SN_ERR_INVALID_DTYPE, fs, &o, &o0, "stats dtype");
  check_bad(sn_batchnorm_stats(o.sum, o.sq, NULL, NULL, 0, 0, 4, L, D), SN_ERR_INVALID_SIZE, fs, &o, &o0, "stats empty, c 0");
  /* an empty batch with c beyond int64 byte counts: the c-element sums are not written */
  check_bad(sn_batchnorm_stats(o.sum, o.sq, NULL, NULL, 0, INT64_MAX / 4, 4, L, D), SN_ERR_OVERFLOW, fs, &o, &o0, "stats empty, c huge");
  /* finalize */
  check_bad(sn_batchnorm_finalize(NULL, o.var, o.rstd, sd, sx, NULL, 8, 3, EPS), SN_ERR_NULL_POINTER, ff, &o, &o0, "finalize mean NULL");
  check_bad(sn_batchnorm_finalize(o.mean, o.var, NULL, sd, sx, NULL, 8, 3, EPS), SN_ERR_NULL_POINTER, ff, &o, &o0, "finalize rstd NULL");
  check_bad(sn_batchnorm_finalize(o.mean, o.var, o.rstd, NULL, sx, NULL, 8, 3, EPS), SN_ERR_NULL_POINTER, ff, &o, &o0, "finalize sum NULL");
  check_bad(sn_batchnorm_finalize(o.mean, o.var, o.rstd, sd, NULL, NULL, 8, 3, EPS), SN_ERR_NULL_POINTER, ff, &o, &o0, "finalize sumsq NULL");
  check_bad(sn_batchnorm_finalize(o.mean, o.var, o.rstd, sd, sx, NULL, 8, 0, EPS), SN_ERR_INVALID_SIZE, ff, &o, &o0, "finalize c 0");
  const float bad_eps[4] = {0.0f, -1e-5f, NAN, INFINITY};
  for (int i = 0; i < 4; i++) {
    check_bad(sn_batchnorm_finalize(o.mean, o.var, o.rstd, sd, sx, NULL, 8, 3, bad_eps[i]), SN_ERR_INVALID_EPS, ff, &o, &o0, "finalize eps");
    check_bad(sn_batchnorm_infer(o.y, x, rm, rv, g, g, 2, 3, 4, bad_eps[i], L, D), SN_ERR_INVALID_EPS, fi, &o, &o0, "infer eps");
  }
  /* apply */
  check_bad(sn_batchnorm_apply(NULL, x, m, rs, g, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fa, &o, &o0, "apply y NULL");
  check_bad(sn_batchnorm_apply(o.y, NULL, m, rs, g, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fa, &o, &o0, "apply x NULL");
  check_bad(sn_batchnorm_apply(o.y, x, NULL, rs, g, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fa, &o, &o0, "apply mean NULL");
  check_bad(sn_batchnorm_apply(o.y, x, m, NULL, g, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fa, &o, &o0, "apply rstd NULL");
  check_bad(sn_batchnorm_apply(o.y, x, m, rs, g, g, 2, -3, 4, L, D), SN_ERR_INVALID_SIZE, fa, &o, &o0, "apply c -3");
  check_bad(sn_batchnorm_apply(o.y, x, m, rs, g, g, big, big, big, L, D), SN_ERR_OVERFLOW, fa, &o, &o0, "apply overflow");
  check_bad(sn_batchnorm_apply(o.y, x, m, rs, g, g, 2, 3, 4, BADL, D), SN_ERR_INVALID_LAYOUT, fa, &o, &o0, "apply layout");
  check_bad(sn_batchnorm_apply(o.y, x, m, rs, g, g, 2, 3, 4, L, F64), SN_ERR_INVALID_DTYPE, fa, &o, &o0, "apply f64");
  /* infer */
  check_bad(sn_batchnorm_infer(o.y, x, NULL, rv, g, g, 2, 3, 4, EPS, L, D), SN_ERR_NULL_POINTER, fi, &o, &o0, "infer running_mean NULL");
  check_bad(sn_batchnorm_infer(o.y, x, rm, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_NULL_POINTER, fi, &o, &o0, "infer running_var NULL");
  {
    const float rv_neg[3] = {1.0f, 1.0f, -2.0f};
    check_bad(sn_batchnorm_infer(o.y, x, rm, rv_neg, g, g, 2, 3, 4, EPS, L, D), SN_ERR_INVALID_ARGUMENT, fi, &o, &o0, "infer running_var < 0");
  }
  check_bad(sn_batchnorm_infer(NULL, x, rm, rv, g, g, 2, 3, 4, EPS, L, D), SN_ERR_NULL_POINTER, fi, &o, &o0, "infer y NULL");
  check_bad(sn_batchnorm_infer(o.y, x, rm, rv, g, g, 2, 3, 4, EPS, BADL, D), SN_ERR_INVALID_LAYOUT, fi, &o, &o0, "infer layout");
  check_bad(sn_batchnorm_infer(o.y, x, rm, rv, g, g, 2, 3, 4, EPS, L, BADD), SN_ERR_INVALID_DTYPE, fi, &o, &o0, "infer dtype");
  check_bad(sn_batchnorm_infer(o.y, x, rm, rv, g, g, 2, 3, -1, EPS, L, D), SN_ERR_INVALID_SIZE, fi, &o, &o0, "infer s -1");
  /* bwd_reduce */
  check_bad(sn_batchnorm_bwd_reduce(NULL, o.sq, dy, x, m, rs, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fr, &o, &o0, "bwd_reduce sum_dy NULL");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, NULL, dy, x, m, rs, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fr, &o, &o0, "bwd_reduce sum_dy_xhat NULL");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, NULL, x, m, rs, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fr, &o, &o0, "bwd_reduce dy NULL");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, dy, NULL, m, rs, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fr, &o, &o0, "bwd_reduce x NULL");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, dy, x, NULL, rs, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fr, &o, &o0, "bwd_reduce mean NULL");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, dy, x, m, NULL, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fr, &o, &o0, "bwd_reduce rstd NULL");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, dy, x, m, rs, 2, 0, 4, L, D), SN_ERR_INVALID_SIZE, fr, &o, &o0, "bwd_reduce c 0");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, dy, x, m, rs, big, big, big, L, D), SN_ERR_OVERFLOW, fr, &o, &o0, "bwd_reduce overflow");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, NULL, NULL, m, rs, 0, INT64_MAX / 4, 4, L, D), SN_ERR_OVERFLOW, fr, &o, &o0, "bwd_reduce empty, c huge");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, dy, x, m, rs, 2, 3, 4, BADL, D), SN_ERR_INVALID_LAYOUT, fr, &o, &o0, "bwd_reduce layout");
  check_bad(sn_batchnorm_bwd_reduce(o.sum, o.sq, dy, x, m, rs, 2, 3, 4, L, F64), SN_ERR_INVALID_DTYPE, fr, &o, &o0, "bwd_reduce f64");
  /* bwd_apply */
  check_bad(sn_batchnorm_bwd_apply(NULL, dy, x, m, rs, g, sd, sx, 8, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd_apply dx NULL");
  check_bad(sn_batchnorm_bwd_apply(o.dx, NULL, x, m, rs, g, sd, sx, 8, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd_apply dy NULL");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, NULL, m, rs, g, sd, sx, 8, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd_apply x NULL");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, NULL, rs, g, sd, sx, 8, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd_apply mean NULL");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, NULL, g, sd, sx, 8, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd_apply rstd NULL");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, NULL, sx, 8, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd_apply only sum_dy NULL");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, sd, NULL, 8, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd_apply only sum_dy_xhat NULL");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, sd, sx, 0, 2, 3, 4, L, D), SN_ERR_INSUFFICIENT_COUNT, fb, &o, &o0, "bwd_apply count 0");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, sd, sx, -8, 2, 3, 4, L, D), SN_ERR_INSUFFICIENT_COUNT, fb, &o, &o0, "bwd_apply count -8");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, sd, sx, 1, 2, 3, 4, L, D), SN_ERR_INSUFFICIENT_COUNT, fb, &o, &o0, "bwd_apply count 1");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, sd, sx, 8, 2, 0, 4, L, D), SN_ERR_INVALID_SIZE, fb, &o, &o0, "bwd_apply c 0");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, sd, sx, 8, big, big, big, L, D), SN_ERR_OVERFLOW, fb, &o, &o0, "bwd_apply overflow");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, sd, sx, 8, 2, 3, 4, BADL, D), SN_ERR_INVALID_LAYOUT, fb, &o, &o0, "bwd_apply layout");
  check_bad(sn_batchnorm_bwd_apply(o.dx, dy, x, m, rs, g, NULL, NULL, 0, 2, 3, 4, L, F64), SN_ERR_INVALID_DTYPE, fb, &o, &o0, "bwd_apply eval f64");
  /* the local forward */
  const char *fw = "sn_batchnorm_fwd";
  check_bad(sn_batchnorm_fwd(NULL, o.mean, o.var, o.rstd, x, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_NULL_POINTER, fw, &o, &o0, "fwd y NULL");
  check_bad(sn_batchnorm_fwd(o.y, NULL, o.var, o.rstd, x, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_NULL_POINTER, fw, &o, &o0, "fwd mean NULL");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, NULL, x, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_NULL_POINTER, fw, &o, &o0, "fwd rstd NULL");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, NULL, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_NULL_POINTER, fw, &o, &o0, "fwd x NULL");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 2, 0, 4, EPS, L, D), SN_ERR_INVALID_SIZE, fw, &o, &o0, "fwd c 0");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 2, 3, -4, EPS, L, D), SN_ERR_INVALID_SIZE, fw, &o, &o0, "fwd s -4");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, big, big, big, EPS, L, D), SN_ERR_OVERFLOW, fw, &o, &o0, "fwd overflow");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 2, 3, 4, EPS, BADL, D), SN_ERR_INVALID_LAYOUT, fw, &o, &o0, "fwd layout");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 2, 3, 4, EPS, L, F64), SN_ERR_INVALID_DTYPE, fw, &o, &o0, "fwd f64");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 2, 3, 4, EPS, L, BADD), SN_ERR_INVALID_DTYPE, fw, &o, &o0, "fwd dtype");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 1, 3, 1, EPS, L, D), SN_ERR_INSUFFICIENT_COUNT, fw, &o, &o0, "fwd count 1");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 0, 3, 4, EPS, L, D), SN_ERR_INSUFFICIENT_COUNT, fw, &o, &o0, "fwd count 0");
  check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, NULL, NULL, g, g, 2, 3, 0, EPS, L, D), SN_ERR_INSUFFICIENT_COUNT, fw, &o, &o0, "fwd empty");
  for (int i = 0; i < 4; i++)
    check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, o.rstd, x, NULL, g, g, 2, 3, 4, bad_eps[i], L, D), SN_ERR_INVALID_EPS, fw, &o, &o0, "fwd eps");
  {
    float buf[2 * BT];
    memcpy(buf, x, sizeof x);
    check_bad(sn_batchnorm_fwd(buf + 1, o.mean, o.var, o.rstd, buf, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_INVALID_ARGUMENT, fw, &o, &o0, "fwd y overlaps x");
    tu_assert_bitwise(buf, x, sizeof x, "fwd y overlaps x: x untouched");
  }
  { /* the [C] outputs against each other and the [C] inputs: the same, or partly */
    _Alignas(8) float pool[4 * BC];
    const float g0[BC] = {1, 1, 1};
    double mpool[2 * BC];
    float *in = pool + BC; /* the input; pool[0, BC) is the first half of a mean at pool */
    memcpy(in, g0, sizeof g0);
    for (int which = 0; which < 3; which++) { /* over pivot / gamma / beta */
      const float *p = which == 0 ? in : NULL, *gg = which == 1 ? in : NULL;
      const float *bb = which == 2 ? in : NULL;
      check_bad(sn_batchnorm_fwd(o.y, o.mean, o.var, in, x, p, gg, bb, 2, 3, 4, EPS, L, D), SN_ERR_INVALID_ARGUMENT, fw, &o, &o0, "fwd rstd over an input");
      check_bad(sn_batchnorm_fwd(o.y, o.mean, in + 1, o.rstd, x, p, gg, bb, 2, 3, 4, EPS, L, D), SN_ERR_INVALID_ARGUMENT, fw, &o, &o0, "fwd var partly over an input");
      check_bad(sn_batchnorm_fwd(o.y, (double *)(void *)pool, o.var, o.rstd, x, p, gg, bb, 2, 3, 4, EPS, L, D), SN_ERR_INVALID_ARGUMENT, fw, &o, &o0, "fwd mean's second half over an input");
      tu_assert_bitwise(in, g0, sizeof g0, "fwd [C] overlap: input untouched");
    }
    check_bad(sn_batchnorm_fwd(o.y, mpool, o.var, (float *)(void *)(mpool + 1), x, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_INVALID_ARGUMENT, fw, &o, &o0, "fwd rstd inside mean");
    check_bad(sn_batchnorm_fwd(o.y, o.mean, o.rstd, o.rstd, x, NULL, g, g, 2, 3, 4, EPS, L, D), SN_ERR_INVALID_ARGUMENT, fw, &o, &o0, "fwd var == rstd");
    /* adjacent [C] arrays are fine */
    float adj[3 * BC];
    memcpy(adj, g0, sizeof g0);
    double madj[BC];
    ck_assert_int_eq(sn_batchnorm_fwd(o.y, madj, adj + BC, adj + 2 * BC, x, NULL, adj, NULL, 2, 3, 4, EPS, L, D), SN_OK);
    memset(&o, 0xA5, sizeof o); /* poisoned again for the checks below */
  }
  /* the local backward */
  const char *fl = "sn_batchnorm_bwd";
  check_bad(sn_batchnorm_bwd(NULL, o.dg, o.db, dy, x, m, rs, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fl, &o, &o0, "bwd dx NULL");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, NULL, x, m, rs, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fl, &o, &o0, "bwd dy NULL");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, NULL, m, rs, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fl, &o, &o0, "bwd x NULL");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, NULL, rs, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fl, &o, &o0, "bwd mean NULL");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, NULL, g, 2, 3, 4, L, D), SN_ERR_NULL_POINTER, fl, &o, &o0, "bwd rstd NULL");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 0, 4, L, D), SN_ERR_INVALID_SIZE, fl, &o, &o0, "bwd c 0");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, -2, 3, 4, L, D), SN_ERR_INVALID_SIZE, fl, &o, &o0, "bwd n -2");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, big, big, big, L, D), SN_ERR_OVERFLOW, fl, &o, &o0, "bwd overflow");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 3, 4, BADL, D), SN_ERR_INVALID_LAYOUT, fl, &o, &o0, "bwd layout");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 3, 4, L, F64), SN_ERR_INVALID_DTYPE, fl, &o, &o0, "bwd f64");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 3, 4, L, BADD), SN_ERR_INVALID_DTYPE, fl, &o, &o0, "bwd dtype");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 1, 3, 1, L, D), SN_ERR_INSUFFICIENT_COUNT, fl, &o, &o0, "bwd count 1");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 0, 3, 4, L, D), SN_ERR_INSUFFICIENT_COUNT, fl, &o, &o0, "bwd count 0");
  check_bad(sn_batchnorm_bwd(o.dx, o.dg, o.db, NULL, NULL, m, rs, g, 2, 3, 0, L, D), SN_ERR_INSUFFICIENT_COUNT, fl, &o, &o0, "bwd empty");
  {
    float buf[2 * BT];
    memcpy(buf, dy, sizeof dy);
    check_bad(sn_batchnorm_bwd(buf + 1, o.dg, o.db, buf, x, m, rs, g, 2, 3, 4, L, D), SN_ERR_INVALID_ARGUMENT, fl, &o, &o0, "bwd dx overlaps dy");
    memcpy(buf, x, sizeof x);
    check_bad(sn_batchnorm_bwd(buf, o.dg, o.db, dy, buf, m, rs, g, 2, 3, 4, L, D), SN_ERR_INVALID_ARGUMENT, fl, &o, &o0, "bwd dx == x");
    tu_assert_bitwise(buf, x, sizeof x, "bwd dx == x: x untouched");
  }
}
END_TEST

/* Adversarial data: |mean| ≫ σ (1e4 and 1e-2) with a pivot from the previous batch and with two
 * passes of stats (pivot 0, then the mean); constant channels (y == beta exactly, dx finite);
 * bf16/f16 inputs near 6e4 (no overflow anywhere). */
START_TEST(test_adversarial) {
  tu_rng_t r;
  tu_rng_seed(&r, 9);
  const int64_t N = 4, C = 3, S = 250, T = N * C * S;
  for (int il = 0; il < 2; il++) {
    const sn_layout_t lay = LAYOUTS[il];
    /* mean 1e4, σ 1e-2 (f32: about 10 ulp of spread, the reference uses the same values) */
    float *x = tu_falloc(T), *y = tu_falloc(T), *dy = tu_falloc(T), *dx = tu_falloc(T),
        *rstd = tu_falloc(C);
    float *piv = tu_falloc(C), *gamma = tu_falloc(C), *beta = tu_falloc(C);
    double *mean = tu_dalloc(C), *sum = tu_dalloc(C), *sq = tu_dalloc(C), *yr = tu_dalloc(T),
        *dxr = tu_dalloc(T);
    double *g64 = tu_dalloc(C), *b64 = tu_dalloc(C);
    tu_fill_params(gamma, beta, C, &r);
    for (int64_t c = 0; c < C; c++) g64[c] = gamma[c], b64[c] = beta[c];
    for (int64_t i = 0; i < T; i++) x[i] = (float)(1e4 + 1e-2 * tu_rng_normal(&r));
    tu_fill_normal(dy, T, SN_DTYPE_F32, 0.0, 1.0, &r);
    double *xd = tu_to_f64(x, T, SN_DTYPE_F32), *dyd = tu_to_f64(dy, T, SN_DTYPE_F32);
    ref_train_fwd(yr, NULL, xd, g64, b64, N, C, S, lay, EPS);
    ref_train_bwd(dxr, NULL, NULL, dyd, xd, g64, N, C, S, lay, EPS);
    for (int way = 0; way < 2; way++) {
      if (way == 0) { /* pivot = last batch's mean (here: the mean plus 3σ) */
        for (int64_t c = 0; c < C; c++) piv[c] = (float)(1e4 + 3e-2);
      } else { /* two passes: stats with pivot 0 gives a rough mean, used as the pivot */
        ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, NULL, N, C, S, lay, SN_DTYPE_F32), SN_OK);
        for (int64_t c = 0; c < C; c++) piv[c] = (float)(sum[c] / (double)(N * S));
      }
      lib_train_fwd(y, mean, NULL, rstd, x, piv, gamma, beta, N, C, S, lay, SN_DTYPE_F32);
      check_stats(mean, NULL, rstd, xd, N, C, S, lay, "mean 1e4 sigma 1e-2");
      tu_assert_fwd(y, SN_DTYPE_F32, yr, NULL, T, "mean 1e4 sigma 1e-2: y");
      double *sdy = tu_dalloc(C), *sdx = tu_dalloc(C);
      lib_train_bwd(dx, sdy, sdx, dy, x, mean, rstd, gamma, N, C, S, lay, SN_DTYPE_F32);
      assert_dx(dx, SN_DTYPE_F32, dxr, dyd, gamma, rstd, N, C, S, lay, "mean 1e4 sigma 1e-2");
      free(sdy), free(sdx);
    }
    /* constant channels: var 0, y == beta exactly, dx finite */
    for (int64_t i = 0; i < T; i++) x[i] = 7.25f;
    lib_train_fwd(y, mean, NULL, rstd, x, NULL, gamma, beta, N, C, S, lay, SN_DTYPE_F32);
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t s = 0; s < S; s++)
          TU_CHECK(y[tu_at(lay, n, c, s, C, S)] == beta[c], "constant channel: y != beta");
    double *sdy = tu_dalloc(C), *sdx = tu_dalloc(C);
    lib_train_bwd(dx, sdy, sdx, dy, x, mean, rstd, gamma, N, C, S, lay, SN_DTYPE_F32);
    tu_assert_all_finite(dx, SN_DTYPE_F32, T, "constant channel dx");
    free(sdy), free(sdx);
    /* bf16/f16 near 6e4 (f16 max 65504) */
    for (int id = 1; id < 3; id++) {
      const sn_dtype_t dt = DTYPES[id];
      void *xh = tu_alloc(T, dt), *yh = tu_alloc(T, dt), *dyh = tu_alloc(T, dt), *dxh = tu_alloc(T, dt);
      fill_bn(xh, N, C, S, lay, dt, 6e4, 1500.0, &r);
      for (int64_t i = 0; i < T; i++)
        if (fabs(tu_get(xh, i, dt)) > 65504.0) tu_set(xh, i, 65504.0, dt);
      tu_fill_normal(dyh, T, dt, 6e4, 1000.0, &r);
      for (int64_t i = 0; i < T; i++)
        if (fabs(tu_get(dyh, i, dt)) > 65504.0) tu_set(dyh, i, 65504.0, dt);
      double *xhd = tu_to_f64(xh, T, dt), *sc = tu_dalloc(T);
      lib_train_fwd(yh, mean, NULL, rstd, xh, NULL, gamma, beta, N, C, S, lay, dt);
      check_stats(mean, NULL, rstd, xhd, N, C, S, lay, "near 6e4");
      ref_train_fwd(yr, sc, xhd, g64, b64, N, C, S, lay, EPS);
      tu_assert_fwd(yh, dt, yr, sc, T, "near 6e4: y");
      double *sdy2 = tu_dalloc(C), *sdx2 = tu_dalloc(C), *dyhd = tu_to_f64(dyh, T, dt);
      lib_train_bwd(dxh, sdy2, sdx2, dyh, xh, mean, rstd, gamma, N, C, S, lay, dt);
      ref_train_bwd(dxr, NULL, NULL, dyhd, xhd, g64, N, C, S, lay, EPS);
      assert_dx(dxh, dt, dxr, dyhd, gamma, rstd, N, C, S, lay, "near 6e4");
      float *rm = tu_falloc(C), *rv = tu_falloc(C); /* inference with running stats of that size */
      for (int64_t c = 0; c < C; c++) rm[c] = 6e4f, rv[c] = 2.25e6f;
      for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
          for (int64_t s = 0; s < S; s++) {
            const int64_t i = tu_at(lay, n, c, s, C, S);
            yr[i] = ref_map(&sc[i], xhd[i], rm[c], 1.0 / sqrt((double)rv[c] + (double)EPS),
                            gamma[c], beta[c]);
          }
      tu_poison(yh, T, dt);
      ck_assert_int_eq(sn_batchnorm_infer(yh, xh, rm, rv, gamma, beta, N, C, S, EPS, lay, dt), SN_OK);
      tu_assert_fwd(yh, dt, yr, sc, T, "near 6e4: infer");
      free(rm), free(rv);
      free(xh), free(yh), free(dyh), free(dxh), free(xhd), free(sdy2), free(sdx2), free(dyhd);
      free(sc);
    }
    free(x), free(y), free(dy), free(dx), free(rstd), free(piv), free(gamma), free(beta);
    free(mean), free(sum), free(sq), free(yr), free(dxr), free(g64), free(b64), free(xd), free(dyd);
  }
}
END_TEST

/* In place (y == x, dx == dy) gives the same bits as out of place. */
START_TEST(test_in_place) {
  tu_rng_t r;
  tu_rng_seed(&r, 10);
  const int64_t N = 3, C = 65, S = 37, T = N * C * S;
  for (int il = 0; il < 2; il++)
    for (int id = 0; id < 3; id++) {
      const sn_layout_t lay = LAYOUTS[il];
      const sn_dtype_t dt = DTYPES[id];
      const size_t bytes = (size_t)(T * sn_dtype_size(dt));
      void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *dx = tu_alloc(T, dt);
      void *buf = tu_alloc(T, dt);
      float *rstd = tu_falloc(C), *gamma = tu_falloc(C), *beta = tu_falloc(C), *rv = tu_falloc(C);
      double *mean = tu_dalloc(C), *sdy = tu_dalloc(C), *sdx = tu_dalloc(C);
      fill_bn(x, N, C, S, lay, dt, 1.0, 2.0, &r);
      tu_fill_normal(dy, T, dt, 0.0, 1.0, &r);
      tu_fill_params(gamma, beta, C, &r);
      for (int64_t c = 0; c < C; c++) rv[c] = 1.5f;
      lib_train_fwd(y, mean, NULL, rstd, x, NULL, gamma, beta, N, C, S, lay, dt);
      memcpy(buf, x, bytes);
      ck_assert_int_eq(sn_batchnorm_apply(buf, buf, mean, rstd, gamma, beta, N, C, S, lay, dt), SN_OK);
      tu_assert_bitwise(buf, y, bytes, "apply in place");
      ck_assert_int_eq(sn_batchnorm_infer(y, x, rstd, rv, gamma, beta, N, C, S, EPS, lay, dt), SN_OK);
      memcpy(buf, x, bytes);
      ck_assert_int_eq(sn_batchnorm_infer(buf, buf, rstd, rv, gamma, beta, N, C, S, EPS, lay, dt), SN_OK);
      tu_assert_bitwise(buf, y, bytes, "infer in place");
      lib_train_bwd(dx, sdy, sdx, dy, x, mean, rstd, gamma, N, C, S, lay, dt);
      memcpy(buf, dy, bytes);
      ck_assert_int_eq(sn_batchnorm_bwd_apply(buf, buf, x, mean, rstd, gamma, sdy, sdx, N * S, N, C, S, lay, dt), SN_OK);
      tu_assert_bitwise(buf, dx, bytes, "bwd_apply in place");
      memcpy(buf, dy, bytes); /* the local backward in place, without dgamma and dbeta */
      ck_assert_int_eq(sn_batchnorm_bwd(buf, NULL, NULL, buf, x, mean, rstd, gamma, N, C, S, lay, dt), SN_OK);
      tu_assert_bitwise(buf, dx, bytes, "sn_batchnorm_bwd in place");
      free(x), free(y), free(dy), free(dx), free(buf), free(rstd), free(gamma), free(beta), free(rv);
      free(mean), free(sdy), free(sdx);
    }
}
END_TEST

/* 1, 2 and 3 threads give bitwise identical sums, statistics, y and dx (shapes big enough for
 * the parallel path, chunks crossing planes, C above one channel tile). */
START_TEST(test_threads_bitwise) {
  /* the last: a channel's x and dy (8 MiB) beyond any L2, so sn_batchnorm_bwd does not fuse */
  static const int64_t shapes[][3] = {{5, 65, 301}, {7, 300, 19}, {2, 3, 20000}, {4000, 17, 1},
                                      {5, 160, 97}, {2, 2, 524289}};
  tu_rng_t r;
  tu_rng_seed(&r, 11);
  const int saved = omp_get_max_threads();
  for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
    for (int il = 0; il < 2; il++)
      for (int id = 0; id < 3; id += 2) {
        const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2], T = N * C * S;
        const sn_layout_t lay = LAYOUTS[il];
        const sn_dtype_t dt = DTYPES[id];
        const size_t bytes = (size_t)(T * sn_dtype_size(dt));
        void *x = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *y[3], *dx[3];
        float *gamma = tu_falloc(C), *beta = tu_falloc(C), *rstd[3];
        double *mean[3], *sdy[3], *sdx[3];
        fill_bn(x, N, C, S, lay, dt, 2.0, 1.0, &r);
        tu_fill_normal(dy, T, dt, 0.0, 1.0, &r);
        tu_fill_params(gamma, beta, C, &r);
        for (int t = 0; t < 3; t++) {
          y[t] = tu_alloc(T, dt), dx[t] = tu_alloc(T, dt), rstd[t] = tu_falloc(C);
          mean[t] = tu_dalloc(C), sdy[t] = tu_dalloc(C), sdx[t] = tu_dalloc(C);
          omp_set_num_threads(t + 1);
          lib_train_fwd(y[t], mean[t], NULL, rstd[t], x, NULL, gamma, beta, N, C, S, lay, dt);
          lib_train_bwd(dx[t], sdy[t], sdx[t], dy, x, mean[t], rstd[t], gamma, N, C, S, lay, dt);
        }
        omp_set_num_threads(saved);
        for (int t = 1; t < 3; t++) {
          tu_assert_bitwise(mean[t], mean[0], (size_t)C * 8, "threads: mean");
          tu_assert_bitwise(rstd[t], rstd[0], (size_t)C * 4, "threads: rstd");
          tu_assert_bitwise(sdy[t], sdy[0], (size_t)C * 8, "threads: sum_dy");
          tu_assert_bitwise(sdx[t], sdx[0], (size_t)C * 8, "threads: sum_dy_xhat");
          tu_assert_bitwise(y[t], y[0], bytes, "threads: y");
          tu_assert_bitwise(dx[t], dx[0], bytes, "threads: dx");
        }
        tu_assert_all_finite(y[0], dt, T, "threads: y");
        tu_assert_all_finite(dx[0], dt, T, "threads: dx");
        for (int t = 0; t < 3; t++)
          free(y[t]), free(dx[t]), free(rstd[t]), free(mean[t]), free(sdy[t]), free(sdx[t]);
        free(x), free(dy), free(gamma), free(beta);
      }
}
END_TEST

/* sn_batchnorm_bwd with dgamma written over gamma, or dbeta over rstd (inputs read before the
 * outputs are written, as by the two passes), and with NaN sums times a NaN rstd (the two paths
 * scale the sum in one place, so even the NaN's sign matches): the split's bits, with 1 thread
 * (fused) and 2 (C = 6 on 2 threads: not fused). */
START_TEST(test_bwd_aliasing_and_nan) {
  enum { N = 4, C = 6, S = 50, T = N * C * S };
  tu_rng_t r;
  tu_rng_seed(&r, 13);
  float x[T], dy[T], dx[T], dx2[T], gamma[C], rstd[C], var[C], buf[C], other[C];
  double mean[C], sum[C], sq[C], sdy[C], sdx[C];
  tu_fill_normal(x, T, SN_DTYPE_F32, 1.0, 2.0, &r);
  tu_fill_normal(dy, T, SN_DTYPE_F32, 0.0, 1.0, &r);
  for (int c = 0; c < C; c++) gamma[c] = 1.0f + 0.25f * (float)c;
  ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, NULL, N, C, S, SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
  ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum, sq, NULL, N * S, C, EPS), SN_OK);
  const int saved = omp_get_max_threads();
  for (int nan = 0; nan < 2; nan++)
    for (int threads = 1; threads <= 2; threads++) {
      omp_set_num_threads(threads);
      if (nan) { /* NaN sums in channel 0, times a negative NaN rstd */
        dy[3] = NAN;
        uint32_t neg_nan = 0xffc00000u;
        memcpy(&rstd[0], &neg_nan, 4);
      }
      lib_train_bwd(dx, sdy, sdx, dy, x, mean, rstd, gamma, N, C, S, SN_LAYOUT_NCHW, SN_DTYPE_F32);
      for (int alias = 0; alias < 2; alias++) {
        /* alias 0: dgamma over (a copy of) gamma; 1: dbeta over (a copy of) rstd */
        memcpy(buf, alias ? rstd : gamma, sizeof buf);
        tu_poison(dx2, T, SN_DTYPE_F32);
        tu_poison_f32(other, C);
        const sn_status_t st =
            alias ? sn_batchnorm_bwd(dx2, other, buf, dy, x, mean, buf, gamma, N, C, S,
                                     SN_LAYOUT_NCHW, SN_DTYPE_F32)
                  : sn_batchnorm_bwd(dx2, buf, other, dy, x, mean, rstd, buf, N, C, S,
                                     SN_LAYOUT_NCHW, SN_DTYPE_F32);
        ck_assert_int_eq(st, SN_OK);
        tu_assert_bitwise(dx2, dx, sizeof dx, alias ? "dbeta over rstd: dx" : "dgamma over gamma: dx");
        for (int c = 0; c < C; c++) {
          const float g = (float)sdx[c], b = (float)sdy[c];
          ck_assert_msg(memcmp(alias ? &other[c] : &buf[c], &g, 4) == 0 &&
                            memcmp(alias ? &buf[c] : &other[c], &b, 4) == 0,
                        "alias %d nan %d threads %d channel %d: dgamma %g dbeta %g", alias, nan,
                        threads, c, (double)(alias ? other[c] : buf[c]),
                        (double)(alias ? buf[c] : other[c]));
        }
      }
    }
  omp_set_num_threads(saved);
}
END_TEST

/* Every per-channel output of BatchNorm that is NaN is the one NaN NAN (sign and payload 0):
 * sums, statistics, backward sums, dgamma and dbeta, through the building blocks and the fused
 * and unfused sn_batchnorm_fwd/sn_batchnorm_bwd (1 and 3 threads; which of them runs depends on
 * the thread count, and two copies of a sum may pick different NaNs of NaN + NaN, which the
 * thread-count rule then would not hold). x: channel 0 holds only −NaN, channel 1 +NaN and
 * −NaN, channel 2 +Inf and −Inf (Inf − Inf is x86's negative default NaN); dy: −NaN in channel
 * 3. So the statistics are NaN in channels 0-2 (but Σx² of channel 2, +Inf), Σdy (dbeta) in
 * channel 3, Σdy·x̂ (dgamma) in 0-3. Outputs are poisoned with a negative NaN pattern first.
 * _i: dtype · 2 + layout. */
START_TEST(test_nan_outputs_one_nan) {
  const sn_dtype_t dt = (sn_dtype_t)(_i / 2);
  const sn_layout_t lay = (sn_layout_t)(_i % 2);
  enum { N = 3, C = 5, S = 40, T = N * C * S };
  tu_rng_t r;
  tu_rng_seed(&r, 1700 + (uint64_t)_i);
  void *x = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dx = tu_alloc(T, dt);
  tu_fill_normal(x, T, dt, 1.0, 2.0, &r);
  tu_fill_normal(dy, T, dt, 0.0, 1.0, &r);
  tu_set_special(x, tu_at(lay, 1, 0, 7, C, S), dt, 1);
  tu_set_special(x, tu_at(lay, 2, 0, 30, C, S), dt, 1);
  tu_set_special(x, tu_at(lay, 0, 1, 3, C, S), dt, 0);
  tu_set_special(x, tu_at(lay, 2, 1, 9, C, S), dt, 1);
  tu_set_special(x, tu_at(lay, 0, 2, 0, C, S), dt, 2);
  tu_set_special(x, tu_at(lay, 1, 2, 39, C, S), dt, 3);
  tu_set_special(dy, tu_at(lay, 1, 3, 11, C, S), dt, 1);
  float gamma[C], beta[C], var[C], rstd[C], dg[C], db[C];
  double sum[C], sq[C], mean[C], sdy[C], sdx[C];
  for (int c = 0; c < C; c++) gamma[c] = 1.0f + 0.25f * (float)c, beta[c] = 0.5f - 0.1f * (float)c;
  const int saved = omp_get_max_threads();
  for (int threads = 1; threads <= 3; threads += 2) {
    omp_set_num_threads(threads);
    for (int fused = 0; fused < 2; fused++) {
      memset(sum, 0xff, sizeof sum), memset(sq, 0xff, sizeof sq), memset(mean, 0xff, sizeof mean);
      memset(var, 0xff, sizeof var), memset(rstd, 0xff, sizeof rstd);
      memset(sdy, 0xff, sizeof sdy), memset(sdx, 0xff, sizeof sdx);
      memset(dg, 0xff, sizeof dg), memset(db, 0xff, sizeof db);
      if (fused) {
        ck_assert_int_eq(sn_batchnorm_fwd(y, mean, var, rstd, x, NULL, gamma, beta, N, C, S, EPS,
                                          lay, dt),
                         SN_OK);
        ck_assert_int_eq(sn_batchnorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, N, C, S, lay, dt),
                         SN_OK);
      } else {
        ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, NULL, N, C, S, lay, dt), SN_OK);
        ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum, sq, NULL, N * S, C, EPS),
                         SN_OK);
        ck_assert_int_eq(sn_batchnorm_bwd_reduce(sdy, sdx, dy, x, mean, rstd, N, C, S, lay, dt),
                         SN_OK);
      }
      for (int c = 0; c < C; c++) {
        const int xn = c < 3, dn = c == 3, dxn = c < 4; /* NaN in: x's sums, Σdy, Σdy·x̂ */
        const char *how = fused ? "sn_batchnorm_fwd/bwd" : "building blocks";
        ck_assert_msg(tu_one_nan_f64(mean[c], xn) && tu_one_nan_f32(var[c], xn) &&
                          tu_one_nan_f32(rstd[c], xn),
                      "%s, %d threads, channel %d: mean %g var %g rstd %g", how, threads, c,
                      mean[c], (double)var[c], (double)rstd[c]);
        if (fused)
          ck_assert_msg(tu_one_nan_f32(dg[c], dxn) && tu_one_nan_f32(db[c], dn),
                        "%s, %d threads, channel %d: dgamma %g dbeta %g", how, threads, c,
                        (double)dg[c], (double)db[c]);
        else
          ck_assert_msg(tu_one_nan_f64(sum[c], xn) && (c == 2 ? sq[c] == INFINITY : tu_one_nan_f64(sq[c], xn)) &&
                            tu_one_nan_f64(sdy[c], dn) && tu_one_nan_f64(sdx[c], dxn),
                        "%s, %d threads, channel %d: sums %g %g, backward sums %g %g", how,
                        threads, c, sum[c], sq[c], sdy[c], sdx[c]);
      }
    }
  }
  omp_set_num_threads(saved);
  free(x), free(dy), free(y), free(dx);
}
END_TEST

/* The local training forward sn_batchnorm_fwd: bitwise the building blocks with SyncBatchNorm's
 * refinement (check_fwd_local), fused (NCHW, planes > 1, channels in L2) and not (NHWC, S == 1,
 * 5 channels on 2 threads), on 1, 2 and 3 threads; channels alternating |mean| ≫ σ (refined
 * around pivot 0: must be, and then match the fp64 statistics) and ordinary ones; pivots 0
 * (NULL), the batch means (nothing refined) and 1000 off; var NULL; in place; f32, bf16, f16. */
START_TEST(test_fwd_local) {
  static const int64_t shapes[][3] = {{4, 16, 250}, {3, 5, 37}, {64, 6, 1}, {2, 3, 3136}};
  tu_rng_t r;
  tu_rng_seed(&r, 23);
  const int saved = omp_get_max_threads();
  for (int threads = 1; threads <= 3; threads++)
    for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
      for (int il = 0; il < 2; il++)
        for (int id = 0; id < 3; id++) {
          omp_set_num_threads(threads);
          const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2], T = N * C * S;
          const sn_layout_t lay = LAYOUTS[il];
          const sn_dtype_t dt = DTYPES[id];
          const size_t bytes = (size_t)(T * sn_dtype_size(dt));
          /* the huge means: far beyond σ in every dtype (bf16 rounds such a channel constant) */
          const double big = dt == SN_DTYPE_F32 ? 1e4 : 2000.0;
          void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *y0 = tu_alloc(T, dt);
          float *gamma = tu_falloc(C), *beta = tu_falloc(C), *var = tu_falloc(C),
              *rstd = tu_falloc(C);
          float *piv = tu_falloc(C);
          double *mean = tu_dalloc(C), *sum = tu_dalloc(C), *sq = tu_dalloc(C), *rm = tu_dalloc(C);
          double *rv = tu_dalloc(C);
          for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++)
              for (int64_t k = 0; k < S; k++) {
                const double v = c % 2 == 0 ? big + 1e-2 * tu_rng_normal(&r)
                                            : 1.0 + 2.0 * tu_rng_normal(&r);
                tu_set(x, tu_at(lay, n, c, k, C, S), v, dt);
              }
          tu_fill_params(gamma, beta, C, &r);
          double *xd = tu_to_f64(x, T, dt);
          ref_stats(rm, rv, xd, N, C, S, lay);
          char what[128];
          for (int kind = 0; kind < 3; kind++) {
            for (int64_t c = 0; c < C; c++)
              piv[c] = kind == 1 ? (float)rm[c] : kind == 2 ? (float)(rm[c] + 1000.0) : 0.0f;
            const float *pivot = kind == 0 ? NULL : piv;
            const int affine = kind != 1;
            snprintf(what, sizeof what, "[%lld,%lld,%lld] %s %s pivot kind %d, %d threads",
                     (long long)N, (long long)C, (long long)S, LNAME[il], tu_dtype_name[dt],
                     kind, threads);
            poison_f64(mean, C);
            tu_poison_f32(var, C);
            tu_poison_f32(rstd, C);
            tu_poison(y0, T, dt);
            ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, pivot, N, C, S, lay, dt), SN_OK);
            ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum, sq, pivot, N * S, C, EPS),
                             SN_OK);
            ck_assert_int_eq(sn_batchnorm_apply(y0, x, mean, rstd, affine ? gamma : NULL,
                                                affine ? beta : NULL, N, C, S, lay, dt),
                             SN_OK);
            const int64_t refined =
                check_fwd_local(y0, mean, kind == 2 ? NULL : var, rstd, sum, sq, x, pivot,
                                affine ? gamma : NULL, affine ? beta : NULL, N, C, S, lay, dt);
            /* pivot 0: every huge-mean channel; the means: none; 1000 off: the σ = 1e-2 ones */
            if (kind == 1) ck_assert_msg(refined == 0, "%s: %lld refined", what, (long long)refined);
            else ck_assert_msg(refined >= 1, "%s: nothing refined", what);
            /* its statistics against the fp64 ones (the refined channels included) */
            ck_assert_int_eq(sn_batchnorm_fwd(y, mean, var, rstd, x, pivot, affine ? gamma : NULL,
                                              affine ? beta : NULL, N, C, S, EPS, lay, dt),
                             SN_OK);
            check_stats(mean, var, rstd, xd, N, C, S, lay, what);
            /* in place: the same bits */
            void *buf = tu_alloc(T, dt);
            memcpy(buf, x, bytes);
            ck_assert_int_eq(sn_batchnorm_fwd(buf, mean, var, rstd, buf, pivot,
                                              affine ? gamma : NULL, affine ? beta : NULL, N, C, S,
                                              EPS, lay, dt),
                             SN_OK);
            tu_assert_bitwise(buf, y, bytes, what);
            free(buf);
          }
          free(x), free(y), free(y0), free(gamma), free(beta), free(var), free(rstd), free(piv);
          free(mean), free(sum), free(sq), free(rm), free(rv), free(xd);
        }
  omp_set_num_threads(saved);
}
END_TEST

int main(void) {
  Suite *s = suite_create("batchnorm");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_train_fwd_vs_ref);
  tcase_add_test(tc, test_layouts_bitwise);
  tcase_add_test(tc, test_infer_vs_ref);
  tcase_add_test(tc, test_infer_nan_var);
  tcase_add_test(tc, test_train_bwd_vs_analytic);
  tcase_add_test(tc, test_train_bwd_vs_fd);
  tcase_add_test(tc, test_eval_bwd_vs_fd);
  tcase_add_test(tc, test_pivots);
  tcase_add_test(tc, test_far_pivot);
  tcase_add_test(tc, test_split_batch_bitwise);
  tcase_add_test(tc, test_empty_batch);
  tcase_add_test(tc, test_finalize_count);
  tcase_add_test(tc, test_update_running);
  tcase_add_test(tc, test_bad_inputs);
  tcase_add_test(tc, test_adversarial);
  tcase_add_test(tc, test_near_f32_max);
  tcase_add_test(tc, test_apply_overflow_cancelled);
  tcase_add_test(tc, test_beta_cancels);
  tcase_add_test(tc, test_tiny_mean);
  tcase_add_test(tc, test_in_place);
  tcase_add_test(tc, test_threads_bitwise);
  tcase_add_test(tc, test_bwd_aliasing_and_nan);
  tcase_add_loop_test(tc, test_nan_outputs_one_nan, 0, 6);
  tcase_add_test(tc, test_fwd_local);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
