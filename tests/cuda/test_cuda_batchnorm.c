/*
 * test_cuda_batchnorm.c — the CUDA BatchNorm building blocks (src/cuda/batchnorm.cu,
 * batchnorm_bwd.cu) against the
 * CPU functions of the same name on the same inputs: stats, finalize, apply, fwd (with its
 * pivot refinement), infer, update_running, bwd_reduce, bwd_apply, bwd; layouts, dtypes, odd
 * sizes, adversarial channels, empty batches, determinism and bad arguments. Device outputs are
 * poisoned (NaN bytes) first, so an element a kernel misses fails the comparison.
 *
 * Layouts: NCHW = [N, C, S], NHWC = [N, S, C].
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudatest.h"

/* ---- tolerances ---------------------------------------------------------------------------- */
/* f64 sums (Σ(x − p), Σ(x − p)², Σdy, Σdy·x̂) vs the CPU's: both fp64 sums of the same terms in
 * different orders, each within count·2^-53 of Σ|terms| (count <= 1000 here, ~1e-13); 1e-12 of
 * Σ|terms| leaves a margin of 10. */
#define TOL_SUM_F64 1e-12
/* f64 mean vs the CPU's: mean = p + sum/count, the sums' error above divided by count: within
 * 1e-12 of |mean| + σ + |mean − p|. */
#define TOL_MEAN_F64 1e-12
/* var and rstd (f32 roundings of fp64 values that differ by ~1e-13 relative): 1 ulp of f32 each
 * side plus margin. */
#define TOL_STAT_F32 1e-6
/* f32 activations (y, dx): the CPU's are within a few f32 roundings of the size of the terms
 * (|x̂·gamma| + |beta| forward, |gamma·rstd|·(|dy| + |Σdy|/count + |x̂·Σdy·x̂|/count) backward),
 * the GPU's within one rounding of an fp64 value: 1e-6 of the terms (~16 f32 ulps) plus 4 ulps
 * of the result. */
#define ATOL_TERMS_F32 1e-6
#define RTOL_F32 (4.0 * 0x1p-24)
/* bf16/f16 dx: at most 2 ulp apart (or within the f32 term error above where the terms
 * cancel). bf16/f16 y: both sides at the forward bound (testutil.h TU_LOWP_SCALE_TOL), so within
 * tu_lowp_pair_ok of each other (cmp_y). */
#define ULPS_HALF_PAIR 2.0

static const float EPS = 1e-5f;
static const sn_dtype_t DTYPES[3] = {SN_DTYPE_F32, SN_DTYPE_BF16, SN_DTYPE_F16};
static const sn_layout_t LAYOUTS[2] = {SN_LAYOUT_NCHW, SN_LAYOUT_NHWC};
static const char *const LNAME[2] = {"NCHW", "NHWC"};
/* (N, S): N·S ∈ {2, 3, 1000}, with N = 1 and S = 1 among them. */
static const int64_t NS[][2] = {{1, 2}, {2, 1}, {1, 3}, {3, 1}, {8, 125}, {1000, 1}};
static const int64_t CS[] = {1, 3, 64, 65, 96};

/* ---- helpers ------------------------------------------------------------------------------- */

static int64_t chan(sn_layout_t lay, int64_t i, int64_t C, int64_t S) {
  return lay == SN_LAYOUT_NCHW ? (i / S) % C : i % C;
}
static size_t abytes(int64_t n, sn_dtype_t dt) { return (size_t)n * (size_t)sn_dtype_size(dt); }

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
/* Asserts every byte of the device buffer is still the 0xFF poison (an error wrote nothing). */
static void assert_poisoned(const void *dev, size_t bytes, const char *what) {
  unsigned char *h = malloc(bytes ? bytes : 1);
  ck_assert_ptr_nonnull(h);
  ct_download(h, dev, bytes);
  for (size_t i = 0; i < bytes; i++)
    TU_CHECK(h[i] == 0xFF, "%s: byte %zu written (0x%02x) by a failing call", what, i, h[i]);
  free(h);
}

/* Per-channel f64 values: |got − ref| <= tol·scale[c] (scale >= |ref|). */
static void cmp_f64(const double *got, const double *ref, const double *scale, int64_t C,
                    double tol, const char *what) {
  for (int64_t c = 0; c < C; c++)
    TU_CHECK(fabs(got[c] - ref[c]) <= tol * scale[c], "%s: channel %lld: %.17g vs CPU %.17g",
             what, (long long)c, got[c], ref[c]);
}
/* Per-channel f32 statistics: relative tol (a zero reference must be matched exactly). */
static void cmp_f32_rel(const float *got, const float *ref, int64_t C, double tol,
                        const char *what) {
  for (int64_t c = 0; c < C; c++)
    TU_CHECK(fabs((double)got[c] - (double)ref[c]) <= tol * fabs((double)ref[c]),
             "%s: channel %lld: %.9g vs CPU %.9g", what, (long long)c, (double)got[c],
             (double)ref[c]);
}
/* Activations against the CPU's, terms[i] the size of element i's terms (see the tolerances). */
static void cmp_act(const void *got, const void *ref, const double *terms, int64_t n,
                    sn_dtype_t dt, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    const double a = tu_get(got, i, dt), b = tu_get(ref, i, dt), d = fabs(a - b);
    int ok = d <= ATOL_TERMS_F32 * terms[i] + RTOL_F32 * fabs(b);
    if (dt != SN_DTYPE_F32) ok = ok || tu_ulp_diff(a, b, dt) <= ULPS_HALF_PAIR;
    TU_CHECK(ok && !isnan(a), "%s (%s): element %lld = %.9g, CPU %.9g (terms %.3g)", what,
             tu_dtype_name[dt], (long long)i, a, b, terms[i]);
  }
}
/* y against the CPU's, terms[i] = |x̂·gamma| + |beta| of element i: f32 as cmp_act; bf16/f16
 * within tu_lowp_pair_ok of each other, with terms as the scale. */
static void cmp_y(const void *got, const void *ref, const double *terms, int64_t n,
                  sn_dtype_t dt, const char *what) {
  if (dt == SN_DTYPE_F32) {
    cmp_act(got, ref, terms, n, dt, what);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    const double a = tu_get(got, i, dt), b = tu_get(ref, i, dt);
    TU_CHECK(!isnan(a) && tu_lowp_pair_ok(a, b, terms[i], dt),
             "%s (%s): element %lld = %.9g, CPU %.9g (scale %.3g)", what, tu_dtype_name[dt],
             (long long)i, a, b, terms[i]);
  }
}
/* Forward terms |x̂·gamma| + |beta| with the given per-channel mean and rstd. */
static void fwd_terms(double *t, const void *x, const double *mean, const float *rstd,
                      const float *gamma, const float *beta, int64_t N, int64_t C, int64_t S,
                      sn_layout_t lay, sn_dtype_t dt) {
  for (int64_t i = 0; i < N * C * S; i++) {
    const int64_t c = chan(lay, i, C, S);
    const double g = gamma ? gamma[c] : 1.0, b = beta ? beta[c] : 0.0;
    t[i] = fabs((tu_get(x, i, dt) - mean[c]) * (double)rstd[c] * g) + fabs(b);
  }
}
/* Σ|x − p| per channel (the scale of Σ(x − p)), p NULL = 0. */
static void abs_sums(double *out, const void *x, const float *p, int64_t N, int64_t C, int64_t S,
                     sn_layout_t lay, sn_dtype_t dt) {
  for (int64_t c = 0; c < C; c++) out[c] = 0.0;
  for (int64_t i = 0; i < N * C * S; i++) {
    const int64_t c = chan(lay, i, C, S);
    out[c] += fabs(tu_get(x, i, dt) - (p ? (double)p[c] : 0.0));
  }
}

static void *ws_alloc(int64_t N, int64_t C, int64_t S, sn_layout_t lay, size_t *bytes) {
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(bytes, N, C, S, lay), SN_OK);
  return ct_alloc_poison(*bytes);
}

/* ---- forward: stats → finalize → apply, fwd, determinism ------------------------------------ */

static void fwd_case(int64_t N, int64_t C, int64_t S, sn_layout_t lay, sn_dtype_t dt,
                     int with_pivot, int with_params, uint64_t seed) {
  char what[160];
  snprintf(what, sizeof what, "fwd [%lld, %lld, %lld] %s %s pivot %d", (long long)N,
           (long long)C, (long long)S, LNAME[lay], tu_dtype_name[dt], with_pivot);
  const int64_t T = N * C * S, count = N * S;
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *y2 = tu_alloc(T, dt), *yg = tu_alloc(T, dt);
  float *gamma = tu_falloc(C), *beta = tu_falloc(C), *pivot = tu_falloc(C);
  fill_bn(x, N, C, S, lay, dt, 0.0, 1.0, &r);
  tu_fill_params(gamma, beta, C, &r);
  for (int64_t c = 0; c < C; c++) pivot[c] = (float)(0.37 * (double)(c % 7) + 0.3);
  const float *hp = with_pivot ? pivot : NULL;
  const float *hg = with_params ? gamma : NULL, *hb = with_params ? beta : NULL;
  /* CPU */
  double *sum = tu_dalloc(C), *sq = tu_dalloc(C), *mean = tu_dalloc(C), *mean2 = tu_dalloc(C);
  float *var = tu_falloc(C), *rstd = tu_falloc(C), *var2 = tu_falloc(C), *rstd2 = tu_falloc(C);
  ck_assert_int_eq(sn_batchnorm_stats(sum, sq, x, hp, N, C, S, lay, dt), SN_OK);
  ck_assert_int_eq(sn_batchnorm_finalize(mean, var, rstd, sum, sq, hp, count, C, EPS), SN_OK);
  ck_assert_int_eq(sn_batchnorm_apply(y, x, mean, rstd, hg, hb, N, C, S, lay, dt), SN_OK);
  ck_assert_int_eq(sn_batchnorm_fwd(y2, mean2, var2, rstd2, x, hp, hg, hb, N, C, S, EPS, lay, dt),
                   SN_OK);
  /* GPU */
  size_t wsb;
  void *ws = ws_alloc(N, C, S, lay, &wsb);
  void *dx = ct_upload(x, abytes(T, dt));
  float *dg = ct_upload(gamma, (size_t)C * 4), *db = ct_upload(beta, (size_t)C * 4);
  float *dp = ct_upload(pivot, (size_t)C * 4);
  const float *dhp = with_pivot ? dp : NULL;
  const float *dhg = with_params ? dg : NULL, *dhb = with_params ? db : NULL;
  double *dsum = ct_alloc_poison((size_t)C * 8), *dsq = ct_alloc_poison((size_t)C * 8);
  double *dsum2 = ct_alloc_poison((size_t)C * 8), *dsq2 = ct_alloc_poison((size_t)C * 8);
  double *dmean = ct_alloc_poison((size_t)C * 8), *dmean2 = ct_alloc_poison((size_t)C * 8);
  float *dvar = ct_alloc_poison((size_t)C * 4), *drstd = ct_alloc_poison((size_t)C * 4);
  float *dvar2 = ct_alloc_poison((size_t)C * 4), *drstd2 = ct_alloc_poison((size_t)C * 4);
  void *dy = ct_alloc_poison(abytes(T, dt)), *dy2 = ct_alloc_poison(abytes(T, dt));
  ck_assert_int_eq(sn_cuda_batchnorm_stats(dsum, dsq, dx, dhp, N, C, S, lay, dt, ws, wsb, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(dsum2, dsq2, dx, dhp, N, C, S, lay, dt, ws, wsb, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_finalize(dmean, dvar, drstd, dsum, dsq, dhp, count, C, EPS,
                                              0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_apply(dy, dx, dmean, drstd, dhg, dhb, N, C, S, lay, dt, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_fwd(dy2, dmean2, dvar2, drstd2, dx, dhp, dhg, dhb, N, C, S,
                                         EPS, lay, dt, ws, wsb, 0),
                   SN_OK);
  double *gsum = tu_dalloc(C), *gsq = tu_dalloc(C), *gsum2 = tu_dalloc(C), *gsq2 = tu_dalloc(C);
  double *gmean = tu_dalloc(C), *gmean2 = tu_dalloc(C), *scale = tu_dalloc(C);
  float *gvar = tu_falloc(C), *grstd = tu_falloc(C), *gvar2 = tu_falloc(C), *grstd2 = tu_falloc(C);
  ct_download(gsum, dsum, (size_t)C * 8), ct_download(gsq, dsq, (size_t)C * 8);
  ct_download(gsum2, dsum2, (size_t)C * 8), ct_download(gsq2, dsq2, (size_t)C * 8);
  ct_download(gmean, dmean, (size_t)C * 8), ct_download(gmean2, dmean2, (size_t)C * 8);
  ct_download(gvar, dvar, (size_t)C * 4), ct_download(grstd, drstd, (size_t)C * 4);
  ct_download(gvar2, dvar2, (size_t)C * 4), ct_download(grstd2, drstd2, (size_t)C * 4);
  /* determinism: the same call twice gives the same bits */
  tu_assert_bitwise(gsum, gsum2, (size_t)C * 8, what);
  tu_assert_bitwise(gsq, gsq2, (size_t)C * 8, what);
  /* sums */
  abs_sums(scale, x, hp, N, C, S, lay, dt);
  cmp_f64(gsum, sum, scale, C, TOL_SUM_F64, "stats sum");
  for (int64_t c = 0; c < C; c++) scale[c] = sq[c];
  cmp_f64(gsq, sq, scale, C, TOL_SUM_F64, "stats sumsq");
  /* statistics */
  for (int64_t c = 0; c < C; c++)
    scale[c] = fabs(mean[c]) + sqrt((double)var[c]) + fabs(mean[c] - (hp ? hp[c] : 0.0));
  cmp_f64(gmean, mean, scale, C, TOL_MEAN_F64, "finalize mean");
  cmp_f32_rel(gvar, var, C, TOL_STAT_F32, "finalize var");
  cmp_f32_rel(grstd, rstd, C, TOL_STAT_F32, "finalize rstd");
  cmp_f64(gmean2, mean2, scale, C, TOL_MEAN_F64, "fwd mean");
  cmp_f32_rel(gvar2, var2, C, TOL_STAT_F32, "fwd var");
  cmp_f32_rel(grstd2, rstd2, C, TOL_STAT_F32, "fwd rstd");
  /* outputs */
  double *terms = tu_dalloc(T);
  fwd_terms(terms, x, mean, rstd, hg, hb, N, C, S, lay, dt);
  ct_download(yg, dy, abytes(T, dt));
  cmp_y(yg, y, terms, T, dt, "apply y");
  ct_download(yg, dy2, abytes(T, dt));
  cmp_y(yg, y2, terms, T, dt, "fwd y");
  /* where no channel needs a refinement (sn__bn_refine's test on the GPU's sums; a channel of
   * 2 or 3 equal bf16 values can), fwd is bitwise the chain stats → finalize → apply */
  int refined = 0;
  for (int64_t c = 0; c < C; c++) {
    const double m = gsum[c] / (double)count, v = gsq[c] / (double)count - m * m;
    refined |= m != 0.0 && m * m > v * 16777216.0;
  }
  if (!refined) {
    tu_assert_bitwise(gmean, gmean2, (size_t)C * 8, "fwd mean == chain");
    tu_assert_bitwise(grstd, grstd2, (size_t)C * 4, "fwd rstd == chain");
    void *ychain = tu_alloc(T, dt);
    ct_download(ychain, dy, abytes(T, dt));
    tu_assert_bitwise(ychain, yg, abytes(T, dt), "fwd y == chain");
    free(ychain);
  }
  free(terms);
  free(gsum), free(gsq), free(gsum2), free(gsq2), free(gmean), free(gmean2), free(scale);
  free(gvar), free(grstd), free(gvar2), free(grstd2);
  ct_free(ws), ct_free(dx), ct_free(dg), ct_free(db), ct_free(dp);
  ct_free(dsum), ct_free(dsq), ct_free(dsum2), ct_free(dsq2), ct_free(dmean), ct_free(dmean2);
  ct_free(dvar), ct_free(drstd), ct_free(dvar2), ct_free(drstd2), ct_free(dy), ct_free(dy2);
  free(sum), free(sq), free(mean), free(mean2), free(var), free(rstd), free(var2), free(rstd2);
  free(x), free(y), free(y2), free(yg), free(gamma), free(beta), free(pivot);
}

/* _i: dtype · 2 + layout. */
START_TEST(test_fwd_vs_cpu) {
  const sn_dtype_t dt = DTYPES[_i / 2];
  const sn_layout_t lay = LAYOUTS[_i % 2];
  uint64_t seed = 100 + (uint64_t)_i * 1000;
  for (size_t k = 0; k < sizeof NS / sizeof NS[0]; k++)
    for (size_t j = 0; j < sizeof CS / sizeof CS[0]; j++, seed++)
      fwd_case(NS[k][0], CS[j], NS[k][1], lay, dt, (int)(seed % 2), CS[j] != 3, seed);
}
END_TEST

/* ---- backward: bwd_reduce, bwd_apply (train and eval), bwd --------------------------------- */

static void bwd_case(int64_t N, int64_t C, int64_t S, sn_layout_t lay, sn_dtype_t dt,
                     int with_gamma, uint64_t seed) {
  char what[160];
  snprintf(what, sizeof what, "bwd [%lld, %lld, %lld] %s %s", (long long)N, (long long)C,
           (long long)S, LNAME[lay], tu_dtype_name[dt]);
  const int64_t T = N * C * S, count = N * S;
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  void *x = tu_alloc(T, dt), *dyv = tu_alloc(T, dt), *y = tu_alloc(T, dt);
  void *dxc = tu_alloc(T, dt), *dxe = tu_alloc(T, dt), *dxb = tu_alloc(T, dt);
  void *got = tu_alloc(T, dt);
  float *gamma = tu_falloc(C), *beta = tu_falloc(C), *var = tu_falloc(C), *rstd = tu_falloc(C);
  float *dgc = tu_falloc(C), *dbc = tu_falloc(C);
  double *mean = tu_dalloc(C), *sdy = tu_dalloc(C), *sdx = tu_dalloc(C);
  fill_bn(x, N, C, S, lay, dt, 0.5, 2.0, &r);
  tu_fill_normal(dyv, T, dt, 0.1, 1.0, &r);
  tu_fill_params(gamma, beta, C, &r);
  const float *hg = with_gamma ? gamma : NULL;
  ck_assert_int_eq(sn_batchnorm_fwd(y, mean, var, rstd, x, NULL, hg, NULL, N, C, S, EPS, lay, dt),
                   SN_OK);
  ck_assert_int_eq(sn_batchnorm_bwd_reduce(sdy, sdx, dyv, x, mean, rstd, N, C, S, lay, dt), SN_OK);
  ck_assert_int_eq(sn_batchnorm_bwd_apply(dxc, dyv, x, mean, rstd, hg, sdy, sdx, count, N, C, S,
                                          lay, dt),
                   SN_OK);
  ck_assert_int_eq(sn_batchnorm_bwd_apply(dxe, dyv, x, mean, rstd, hg, NULL, NULL, 0, N, C, S,
                                          lay, dt),
                   SN_OK);
  ck_assert_int_eq(sn_batchnorm_bwd(dxb, dgc, dbc, dyv, x, mean, rstd, hg, N, C, S, lay, dt),
                   SN_OK);
  /* GPU, with the CPU's mean and rstd (and sums for bwd_apply) as inputs */
  size_t wsb;
  void *ws = ws_alloc(N, C, S, lay, &wsb);
  void *d_x = ct_upload(x, abytes(T, dt)), *d_dy = ct_upload(dyv, abytes(T, dt));
  double *d_mean = ct_upload(mean, (size_t)C * 8), *d_sdy = ct_upload(sdy, (size_t)C * 8);
  double *d_sdx = ct_upload(sdx, (size_t)C * 8);
  float *d_rstd = ct_upload(rstd, (size_t)C * 4), *d_g = ct_upload(gamma, (size_t)C * 4);
  const float *dhg = with_gamma ? d_g : NULL;
  double *g_sdy = ct_alloc_poison((size_t)C * 8), *g_sdx = ct_alloc_poison((size_t)C * 8);
  double *g_sdy2 = ct_alloc_poison((size_t)C * 8), *g_sdx2 = ct_alloc_poison((size_t)C * 8);
  float *g_dg = ct_alloc_poison((size_t)C * 4), *g_db = ct_alloc_poison((size_t)C * 4);
  void *g_dxc = ct_alloc_poison(abytes(T, dt)), *g_dxe = ct_alloc_poison(abytes(T, dt));
  void *g_dxb = ct_alloc_poison(abytes(T, dt)), *g_dxg = ct_alloc_poison(abytes(T, dt));
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_reduce(g_sdy, g_sdx, d_dy, d_x, d_mean, d_rstd, N, C, S,
                                                lay, dt, ws, wsb, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_reduce(g_sdy2, g_sdx2, d_dy, d_x, d_mean, d_rstd, N, C,
                                                S, lay, dt, ws, wsb, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_apply(g_dxc, d_dy, d_x, d_mean, d_rstd, dhg, d_sdy,
                                               d_sdx, count, N, C, S, lay, dt, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_apply(g_dxe, d_dy, d_x, d_mean, d_rstd, dhg, NULL, NULL,
                                               0, N, C, S, lay, dt, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd(g_dxb, g_dg, g_db, d_dy, d_x, d_mean, d_rstd, dhg, N, C,
                                         S, lay, dt, ws, wsb, 0),
                   SN_OK);
  /* the chain with the GPU's own sums: bwd must be bitwise it */
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_apply(g_dxg, d_dy, d_x, d_mean, d_rstd, dhg, g_sdy,
                                               g_sdx, count, N, C, S, lay, dt, 0),
                   SN_OK);
  double *hsdy = tu_dalloc(C), *hsdx = tu_dalloc(C), *hsdy2 = tu_dalloc(C), *hsdx2 = tu_dalloc(C);
  double *scale = tu_dalloc(C), *terms = tu_dalloc(T);
  float *hdg = tu_falloc(C), *hdb = tu_falloc(C);
  ct_download(hsdy, g_sdy, (size_t)C * 8), ct_download(hsdx, g_sdx, (size_t)C * 8);
  ct_download(hsdy2, g_sdy2, (size_t)C * 8), ct_download(hsdx2, g_sdx2, (size_t)C * 8);
  ct_download(hdg, g_dg, (size_t)C * 4), ct_download(hdb, g_db, (size_t)C * 4);
  tu_assert_bitwise(hsdy, hsdy2, (size_t)C * 8, what);
  tu_assert_bitwise(hsdx, hsdx2, (size_t)C * 8, what);
  /* sums: scales Σ|dy| and Σ|dy·x̂| */
  double *s2 = tu_dalloc(C);
  for (int64_t c = 0; c < C; c++) scale[c] = 0.0, s2[c] = 0.0;
  for (int64_t i = 0; i < T; i++) {
    const int64_t c = chan(lay, i, C, S);
    const double d = tu_get(dyv, i, dt);
    scale[c] += fabs(d);
    s2[c] += fabs(d * (tu_get(x, i, dt) - mean[c]) * (double)rstd[c]);
  }
  cmp_f64(hsdy, sdy, scale, C, TOL_SUM_F64, "bwd_reduce sum_dy");
  cmp_f64(hsdx, sdx, s2, C, TOL_SUM_F64, "bwd_reduce sum_dy_xhat");
  /* dgamma, dbeta: f32 roundings of sums that agree to 1e-12 of their scale */
  for (int64_t c = 0; c < C; c++) {
    TU_CHECK(fabs((double)hdg[c] - (double)dgc[c]) <=
                 TOL_STAT_F32 * fabs((double)dgc[c]) + TOL_SUM_F64 * s2[c],
             "bwd dgamma %lld: %.9g vs CPU %.9g", (long long)c, (double)hdg[c], (double)dgc[c]);
    TU_CHECK(fabs((double)hdb[c] - (double)dbc[c]) <=
                 TOL_STAT_F32 * fabs((double)dbc[c]) + TOL_SUM_F64 * scale[c],
             "bwd dbeta %lld: %.9g vs CPU %.9g", (long long)c, (double)hdb[c], (double)dbc[c]);
    TU_CHECK(hdg[c] == (float)hsdx[c] && hdb[c] == (float)hsdy[c],
             "bwd dgamma/dbeta %lld are not the rounded bwd_reduce sums", (long long)c);
  }
  /* dx: terms |gamma·rstd|·(|dy| + |Σdy|/count + |x̂·Σdy·x̂|/count) */
  for (int64_t i = 0; i < T; i++) {
    const int64_t c = chan(lay, i, C, S);
    const double k = fabs((with_gamma ? (double)gamma[c] : 1.0) * (double)rstd[c]);
    const double xh = (tu_get(x, i, dt) - mean[c]) * (double)rstd[c];
    terms[i] = k * (fabs(tu_get(dyv, i, dt)) + fabs(sdy[c]) / (double)count +
                    fabs(xh * sdx[c]) / (double)count);
  }
  ct_download(got, g_dxc, abytes(T, dt));
  cmp_act(got, dxc, terms, T, dt, "bwd_apply dx");
  ct_download(got, g_dxb, abytes(T, dt));
  cmp_act(got, dxb, terms, T, dt, "bwd dx");
  void *chain = tu_alloc(T, dt);
  ct_download(chain, g_dxg, abytes(T, dt));
  tu_assert_bitwise(got, chain, abytes(T, dt), "bwd dx == bwd_reduce → bwd_apply");
  free(chain);
  for (int64_t i = 0; i < T; i++) {
    const int64_t c = chan(lay, i, C, S);
    terms[i] = fabs((with_gamma ? (double)gamma[c] : 1.0) * (double)rstd[c] * tu_get(dyv, i, dt));
  }
  ct_download(got, g_dxe, abytes(T, dt));
  cmp_act(got, dxe, terms, T, dt, "bwd_apply eval dx");
  free(s2), free(hsdy), free(hsdx), free(hsdy2), free(hsdx2), free(scale), free(terms);
  free(hdg), free(hdb);
  ct_free(ws), ct_free(d_x), ct_free(d_dy), ct_free(d_mean), ct_free(d_sdy), ct_free(d_sdx);
  ct_free(d_rstd), ct_free(d_g), ct_free(g_sdy), ct_free(g_sdx), ct_free(g_sdy2), ct_free(g_sdx2);
  ct_free(g_dg), ct_free(g_db), ct_free(g_dxc), ct_free(g_dxe), ct_free(g_dxb), ct_free(g_dxg);
  free(x), free(dyv), free(y), free(dxc), free(dxe), free(dxb), free(got);
  free(gamma), free(beta), free(var), free(rstd), free(dgc), free(dbc);
  free(mean), free(sdy), free(sdx);
}

START_TEST(test_bwd_vs_cpu) {
  const sn_dtype_t dt = DTYPES[_i / 2];
  const sn_layout_t lay = LAYOUTS[_i % 2];
  uint64_t seed = 200 + (uint64_t)_i * 1000;
  for (size_t k = 0; k < sizeof NS / sizeof NS[0]; k++)
    for (size_t j = 0; j < sizeof CS / sizeof CS[0]; j++, seed++)
      bwd_case(NS[k][0], CS[j], NS[k][1], lay, dt, CS[j] != 3, seed);
}
END_TEST

/* A large batch [32, 64, 56, 56]: many chunks per channel (NCHW) and many rows (NHWC). */
START_TEST(test_big) {
  const sn_layout_t lay = LAYOUTS[_i % 2];
  const sn_dtype_t dt = _i < 2 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
  fwd_case(32, 64, 56 * 56, lay, dt, 0, 1, 300 + (uint64_t)_i);
  bwd_case(32, 64, 56 * 56, lay, dt, 1, 310 + (uint64_t)_i);
}
END_TEST

/* ---- adversarial channels: the fwd's refinement ------------------------------------------- */

/* [4, 3, 250]: channel 0 mean 1e4, σ 1e-2 (sums around pivot 0 or −5e3 lose everything to
 * cancellation: the fwd must re-sum around its refined pivot, as the CPU), channel 1 constant,
 * channel 2 N(0.5, 1). fwd against the CPU's sn_batchnorm_fwd. */
START_TEST(test_adversarial) {
  enum { N = 4, C = 3, S = 250, T = N * C * S };
  for (int d = 0; d < 3; d++)
    for (int l = 0; l < 2; l++)
      for (int pv = 0; pv < 2; pv++) {
        const sn_dtype_t dt = DTYPES[d];
        const sn_layout_t lay = LAYOUTS[l];
        tu_rng_t r;
        tu_rng_seed(&r, 400 + (uint64_t)(d * 4 + l * 2 + pv));
        void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *got = tu_alloc(T, dt);
        for (int64_t n = 0; n < N; n++)
          for (int64_t s = 0; s < S; s++) {
            tu_set(x, tu_at(lay, n, 0, s, C, S), 1e4 + 1e-2 * tu_rng_normal(&r), dt);
            tu_set(x, tu_at(lay, n, 1, s, C, S), 3.25, dt);
            tu_set(x, tu_at(lay, n, 2, s, C, S), 0.5 + tu_rng_normal(&r), dt);
          }
        float gamma[C] = {1.5f, 0.75f, 1.0f}, beta[C] = {0.25f, -0.5f, 0.0f};
        float pivot[C] = {-5e3f, -5e3f, -5e3f}, var[C], rstd[C], gvar[C], grstd[C];
        double mean[C], gmean[C], scale[C];
        const float *hp = pv ? pivot : NULL;
        ck_assert_int_eq(sn_batchnorm_fwd(y, mean, var, rstd, x, hp, gamma, beta, N, C, S, EPS,
                                          lay, dt),
                         SN_OK);
        size_t wsb;
        void *ws = ws_alloc(N, C, S, lay, &wsb);
        void *dx = ct_upload(x, abytes(T, dt)), *dy = ct_alloc_poison(abytes(T, dt));
        float *dg = ct_upload(gamma, sizeof gamma), *db = ct_upload(beta, sizeof beta);
        float *dp = ct_upload(pivot, sizeof pivot);
        double *dmean = ct_alloc_poison(sizeof mean);
        float *dvar = ct_alloc_poison(sizeof var), *drstd = ct_alloc_poison(sizeof rstd);
        ck_assert_int_eq(sn_cuda_batchnorm_fwd(dy, dmean, dvar, drstd, dx, pv ? dp : NULL, dg, db,
                                               N, C, S, EPS, lay, dt, ws, wsb, 0),
                         SN_OK);
        ct_download(gmean, dmean, sizeof gmean), ct_download(gvar, dvar, sizeof gvar);
        ct_download(grstd, drstd, sizeof grstd), ct_download(got, dy, abytes(T, dt));
        for (int c = 0; c < C; c++) scale[c] = fabs(mean[c]) + sqrt((double)var[c]);
        cmp_f64(gmean, mean, scale, C, TOL_MEAN_F64, "adversarial mean");
        cmp_f32_rel(gvar, var, C, TOL_STAT_F32, "adversarial var");
        cmp_f32_rel(grstd, rstd, C, TOL_STAT_F32, "adversarial rstd");
        double *terms = tu_dalloc(T);
        fwd_terms(terms, x, mean, rstd, gamma, beta, N, C, S, lay, dt);
        cmp_y(got, y, terms, T, dt, "adversarial y");
        free(terms);
        ct_free(ws), ct_free(dx), ct_free(dy), ct_free(dg), ct_free(db), ct_free(dp);
        ct_free(dmean), ct_free(dvar), ct_free(drstd);
        free(x), free(y), free(got);
      }
}
END_TEST

/* ---- inference ----------------------------------------------------------------------------- */

/* infer vs the CPU; then a negative running_var gives that channel NaN outputs (the CPU's
 * SN_ERR_INVALID_ARGUMENT is a device-side NaN here) and the others the same values. */
START_TEST(test_infer) {
  const sn_dtype_t dt = DTYPES[_i / 2];
  const sn_layout_t lay = LAYOUTS[_i % 2];
  enum { N = 5, C = 65, S = 7, T = N * C * S };
  tu_rng_t r;
  tu_rng_seed(&r, 500 + (uint64_t)_i);
  void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *got = tu_alloc(T, dt);
  float gamma[C], beta[C], rm[C], rv[C], rs[C];
  double m64[C];
  fill_bn(x, N, C, S, lay, dt, 0.2, 1.5, &r);
  tu_fill_params(gamma, beta, C, &r);
  for (int c = 0; c < C; c++) {
    rm[c] = (float)(0.37 * (c % 7) + 0.1 * tu_rng_normal(&r));
    rv[c] = (float)(0.5 + tu_rng_uniform(&r));
    m64[c] = rm[c];
    rs[c] = (float)(1.0 / sqrt((double)rv[c] + (double)EPS));
  }
  ck_assert_int_eq(sn_batchnorm_infer(y, x, rm, rv, gamma, beta, N, C, S, EPS, lay, dt), SN_OK);
  void *dx = ct_upload(x, abytes(T, dt)), *dy = ct_alloc_poison(abytes(T, dt));
  float *dg = ct_upload(gamma, sizeof gamma), *db = ct_upload(beta, sizeof beta);
  float *drm = ct_upload(rm, sizeof rm), *drv = ct_upload(rv, sizeof rv);
  ck_assert_int_eq(sn_cuda_batchnorm_infer(dy, dx, drm, drv, dg, db, N, C, S, EPS, lay, dt, 0),
                   SN_OK);
  ct_download(got, dy, abytes(T, dt));
  double *terms = tu_dalloc(T);
  fwd_terms(terms, x, m64, rs, gamma, beta, N, C, S, lay, dt);
  cmp_y(got, y, terms, T, dt, "infer y");
  void *first = tu_alloc(T, dt);
  memcpy(first, got, abytes(T, dt));
  /* channels 4 and 5 negative (5 by less than eps, so that rv + eps > 0): NaN there, the other
   * channels bitwise the first call's (in place: y = x) */
  rv[4] = -1.0f, rv[5] = -0.25f * EPS;
  ct_free(drv);
  drv = ct_upload(rv, sizeof rv);
  ck_assert_int_eq(sn_cuda_batchnorm_infer(dx, dx, drm, drv, dg, db, N, C, S, EPS, lay, dt, 0),
                   SN_OK);
  ct_download(got, dx, abytes(T, dt));
  for (int64_t i = 0; i < T; i++) {
    const int64_t c = chan(lay, i, C, S);
    const double a = tu_get(got, i, dt);
    if (c == 4 || c == 5) TU_CHECK(isnan(a), "infer: element %lld of a negative-var channel %.9g",
                         (long long)i, a);
    else TU_CHECK(a == tu_get(first, i, dt), "infer in place: element %lld = %.9g, was %.9g",
                  (long long)i, a, tu_get(first, i, dt));
  }
  free(terms), free(first);
  ct_free(dx), ct_free(dy), ct_free(dg), ct_free(db), ct_free(drm), ct_free(drv);
  free(x), free(y), free(got);
}
END_TEST

/* ---- beta cancelling x̂·gamma --------------------------------------------------------------- */

/* beta[c] = −round_f32(x̂·gamma[c]) of element (1, c, c % S) of x [N, C, S] (N ≥ 2), x̂ from mean
 * and rs (per channel, fp64): y there is ~2^-24 of its terms. */
static void cancelling_beta(float *beta, const void *x, const double *mean, const double *rs,
                            const float *gamma, int64_t C, int64_t S, sn_layout_t lay,
                            sn_dtype_t dt) {
  for (int64_t c = 0; c < C; c++)
    beta[c] = -(float)((tu_get(x, tu_at(lay, 1, c, c % S, C, S), dt) - mean[c]) * rs[c] *
                       gamma[c]);
}

/* The training forward (sn_cuda_batchnorm_fwd) and infer with a beta that cancels x̂·gamma
 * (cancelling_beta, from the fp64 batch statistics and from the running ones), against the CPU's:
 * cmp_y. _i: dtype index (1 bf16, 2 f16) · 2 + layout, from 2. */
START_TEST(test_beta_cancels) {
  const sn_dtype_t dt = DTYPES[_i / 2];
  const sn_layout_t lay = LAYOUTS[_i % 2];
  enum { N = 4, C = 65, S = 7, T = N * C * S };
  tu_rng_t r;
  tu_rng_seed(&r, 700 + (uint64_t)_i);
  void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *got = tu_alloc(T, dt);
  float gamma[C], beta[C], var[C], rstd[C], rm[C], rv[C];
  double mean[C], m64[C], rs64[C], *terms = tu_dalloc(T);
  fill_bn(x, N, C, S, lay, dt, 0.5, 2.0, &r);
  tu_fill_params(gamma, beta, C, &r);
  for (int64_t c = 0; c < C; c++) { /* fp64 two-pass batch statistics */
    double m = 0.0, v = 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) m += tu_get(x, tu_at(lay, n, c, s, C, S), dt);
    m /= (double)(N * S);
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        const double e = tu_get(x, tu_at(lay, n, c, s, C, S), dt) - m;
        v += e * e;
      }
    m64[c] = m, rs64[c] = 1.0 / sqrt(v / (double)(N * S) + (double)EPS);
  }
  cancelling_beta(beta, x, m64, rs64, gamma, C, S, lay, dt);
  ck_assert_int_eq(sn_batchnorm_fwd(y, mean, var, rstd, x, NULL, gamma, beta, N, C, S, EPS, lay,
                                    dt),
                   SN_OK);
  size_t wsb;
  void *ws = ws_alloc(N, C, S, lay, &wsb);
  void *dx = ct_upload(x, abytes(T, dt)), *dy = ct_alloc_poison(abytes(T, dt));
  float *dg = ct_upload(gamma, sizeof gamma), *db = ct_upload(beta, sizeof beta);
  double *dmean = ct_alloc_poison(sizeof mean);
  float *dvar = ct_alloc_poison(sizeof var), *drstd = ct_alloc_poison(sizeof rstd);
  ck_assert_int_eq(sn_cuda_batchnorm_fwd(dy, dmean, dvar, drstd, dx, NULL, dg, db, N, C, S, EPS,
                                         lay, dt, ws, wsb, 0),
                   SN_OK);
  ct_download(got, dy, abytes(T, dt));
  fwd_terms(terms, x, mean, rstd, gamma, beta, N, C, S, lay, dt);
  cmp_y(got, y, terms, T, dt, "fwd y, beta cancels");
  /* infer: running statistics near the batch's, beta cancelling with them */
  for (int64_t c = 0; c < C; c++) {
    rm[c] = (float)(m64[c] + 0.01), rv[c] = var[c] * 1.25f;
    m64[c] = rm[c], rs64[c] = 1.0 / sqrt((double)rv[c] + (double)EPS);
    rstd[c] = (float)rs64[c];
  }
  cancelling_beta(beta, x, m64, rs64, gamma, C, S, lay, dt);
  ck_assert_int_eq(sn_batchnorm_infer(y, x, rm, rv, gamma, beta, N, C, S, EPS, lay, dt), SN_OK);
  float *drm = ct_upload(rm, sizeof rm), *drv = ct_upload(rv, sizeof rv);
  ct_free(db);
  db = ct_upload(beta, sizeof beta);
  ck_assert_int_eq(sn_cuda_batchnorm_infer(dy, dx, drm, drv, dg, db, N, C, S, EPS, lay, dt, 0),
                   SN_OK);
  ct_download(got, dy, abytes(T, dt));
  fwd_terms(terms, x, m64, rstd, gamma, beta, N, C, S, lay, dt);
  cmp_y(got, y, terms, T, dt, "infer y, beta cancels");
  ct_free(ws), ct_free(dx), ct_free(dy), ct_free(dg), ct_free(db), ct_free(dmean);
  ct_free(dvar), ct_free(drstd), ct_free(drm), ct_free(drv);
  free(x), free(y), free(got), free(terms);
}
END_TEST

/* ---- update_running ------------------------------------------------------------------------ */

START_TEST(test_update_running) {
  enum { C = 65 };
  const int64_t count = 1000;
  tu_rng_t r;
  tu_rng_seed(&r, 600);
  float rm[C], rv[C], var[C], grm[C], grv[C];
  double mean[C];
  for (int c = 0; c < C; c++) {
    rm[c] = (float)tu_rng_normal(&r), rv[c] = (float)(0.5 + tu_rng_uniform(&r));
    mean[c] = tu_rng_normal(&r), var[c] = (float)(0.2 + tu_rng_uniform(&r));
  }
  const float moms[2] = {0.1f, SN_MOMENTUM_CUMULATIVE};
  for (int k = 0; k < 2; k++) {
    float hrm[C], hrv[C];
    memcpy(hrm, rm, sizeof rm), memcpy(hrv, rv, sizeof rv);
    int64_t nbt = 5, gnbt = -1;
    float *drm = ct_upload(rm, sizeof rm), *drv = ct_upload(rv, sizeof rv);
    float *dvar = ct_upload(var, sizeof var);
    double *dmean = ct_upload(mean, sizeof mean);
    int64_t *dnbt = ct_upload(&nbt, sizeof nbt);
    for (int step = 0; step < 2; step++) {
      ck_assert_int_eq(sn_batchnorm_update_running(hrm, hrv, &nbt, mean, var, count, C, moms[k]),
                       SN_OK);
      ck_assert_int_eq(sn_cuda_batchnorm_update_running(drm, drv, dnbt, dmean, dvar, count, C,
                                                        moms[k], 0),
                       SN_OK);
    }
    ct_download(grm, drm, sizeof grm), ct_download(grv, drv, sizeof grv);
    ct_download(&gnbt, dnbt, sizeof gnbt);
    ck_assert_int_eq(gnbt, 7);
    ck_assert_int_eq(nbt, 7);
    /* the same fp64 formula rounded to f32 (an fma may move the fp64 value, and so the f32
     * result, by an ulp in each of the two steps) */
    cmp_f32_rel(grm, hrm, C, 4.0 * 0x1p-24, "running_mean");
    cmp_f32_rel(grv, hrv, C, 4.0 * 0x1p-24, "running_var");
    /* count 0: only the counter moves */
    ck_assert_int_eq(sn_cuda_batchnorm_update_running(drm, drv, dnbt, dmean, dvar, 0, C, moms[k],
                                                      0),
                     SN_OK);
    float grm2[C];
    ct_download(grm2, drm, sizeof grm2), ct_download(&gnbt, dnbt, sizeof gnbt);
    ck_assert_int_eq(gnbt, 8);
    tu_assert_bitwise(grm2, grm, sizeof grm, "update_running count 0");
    /* count 1 */
    ck_assert_int_eq(sn_cuda_batchnorm_update_running(drm, drv, dnbt, dmean, dvar, 1, C, moms[k],
                                                      0),
                     SN_ERR_INSUFFICIENT_COUNT);
    /* a negative counter (the CPU's SN_ERR_INVALID_ARGUMENT), whatever the momentum: NaN
     * running statistics, the counter left as it is */
    const int64_t neg = -3;
    ct_free(dnbt);
    dnbt = ct_upload(&neg, sizeof neg);
    ck_assert_int_eq(sn_cuda_batchnorm_update_running(drm, drv, dnbt, dmean, dvar, count, C,
                                                      moms[k], 0),
                     SN_OK);
    ct_download(grm2, drm, sizeof grm2), ct_download(grv, drv, sizeof grv);
    ct_download(&gnbt, dnbt, sizeof gnbt);
    ck_assert_int_eq(gnbt, neg);
    for (int c = 0; c < C; c++)
      TU_CHECK(isnan(grm2[c]) && isnan(grv[c]), "negative counter, momentum %g: channel %d %g %g",
               (double)moms[k], c, (double)grm2[c], (double)grv[c]);
    ct_free(drm), ct_free(drv), ct_free(dvar), ct_free(dmean), ct_free(dnbt);
  }
  /* cumulative without a counter, a bad momentum */
  ck_assert_int_eq(sn_cuda_batchnorm_update_running(grm, grv, NULL, mean, var, count, C,
                                                    SN_MOMENTUM_CUMULATIVE, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_update_running(grm, grv, NULL, mean, var, count, C, 1.5f, 0),
                   SN_ERR_INVALID_ARGUMENT);
}
END_TEST

/* ---- empty batches ------------------------------------------------------------------------- */

START_TEST(test_empty) {
  enum { C = 5 };
  const int64_t shapes[2][2] = {{0, 7}, {3, 0}};
  for (int k = 0; k < 2; k++)
    for (int l = 0; l < 2; l++) {
      const int64_t N = shapes[k][0], S = shapes[k][1];
      size_t wsb = 1;
      ck_assert_int_eq(sn_cuda_batchnorm_workspace(&wsb, N, C, S, LAYOUTS[l]), SN_OK);
      ck_assert_uint_eq(wsb, 0);
      double *ds = ct_alloc_poison(C * 8), *dq = ct_alloc_poison(C * 8);
      double h1[C], h2[C];
      ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, dq, NULL, NULL, N, C, S, LAYOUTS[l],
                                               SN_DTYPE_F32, NULL, 0, 0),
                       SN_OK);
      ct_download(h1, ds, sizeof h1), ct_download(h2, dq, sizeof h2);
      for (int c = 0; c < C; c++) ck_assert(h1[c] == 0.0 && h2[c] == 0.0);
      double *dm = ct_alloc_poison(C * 8);
      float *dr = ct_alloc_poison(C * 4);
      ct_free(ds), ct_free(dq);
      ds = ct_alloc_poison(C * 8), dq = ct_alloc_poison(C * 8);
      ck_assert_int_eq(sn_cuda_batchnorm_bwd_reduce(ds, dq, NULL, NULL, dm, dr, N, C, S,
                                                    LAYOUTS[l], SN_DTYPE_BF16, NULL, 0, 0),
                       SN_OK);
      ct_download(h1, ds, sizeof h1), ct_download(h2, dq, sizeof h2);
      for (int c = 0; c < C; c++) ck_assert(h1[c] == 0.0 && h2[c] == 0.0);
      ck_assert_int_eq(sn_cuda_batchnorm_apply(NULL, NULL, dm, dr, NULL, NULL, N, C, S,
                                               LAYOUTS[l], SN_DTYPE_F16, 0),
                       SN_OK);
      ck_assert_int_eq(sn_cuda_batchnorm_fwd(NULL, dm, NULL, dr, NULL, NULL, NULL, NULL, N, C, S,
                                             EPS, LAYOUTS[l], SN_DTYPE_F32, NULL, 0, 0),
                       SN_ERR_INSUFFICIENT_COUNT);
      ct_free(ds), ct_free(dq), ct_free(dm), ct_free(dr);
    }
}
END_TEST

/* ---- bad arguments: the CPU's codes, nothing written --------------------------------------- */

START_TEST(test_errors) {
  enum { N = 2, C = 3, S = 4, T = N * C * S };
  tu_rng_t r;
  tu_rng_seed(&r, 700);
  float hx[T];
  for (int i = 0; i < T; i++) hx[i] = (float)tu_rng_normal(&r);
  const sn_layout_t L = SN_LAYOUT_NCHW;
  const sn_dtype_t D = SN_DTYPE_F32;
  size_t wsb;
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&wsb, N, C, S, L), SN_OK);
  ck_assert_uint_gt(wsb, 0);
  void *ws = ct_alloc_poison(wsb);
  float *dx = ct_upload(hx, sizeof hx), *dy = ct_alloc_poison(sizeof hx);
  double *ds = ct_alloc_poison(C * 8), *dq = ct_alloc_poison(C * 8), *dm = ct_alloc_poison(C * 8);
  float *dv = ct_alloc_poison(C * 4), *dr = ct_alloc_poison(C * 4);
  /* workspace query */
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(NULL, N, C, S, L), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&wsb, N, 0, S, L), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&wsb, N, C, S, (sn_layout_t)7),
                   SN_ERR_INVALID_LAYOUT);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&wsb, INT64_MAX / 2, C, S, L), SN_ERR_OVERFLOW);
  /* stats */
  ck_assert_int_eq(sn_cuda_batchnorm_stats(NULL, dq, dx, NULL, N, C, S, L, D, ws, wsb, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, dq, NULL, NULL, N, C, S, L, D, ws, wsb, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, dq, dx, NULL, N, 0, S, L, D, ws, wsb, 0),
                   SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, dq, dx, NULL, N, C, S, (sn_layout_t)2, D, ws, wsb,
                                           0),
                   SN_ERR_INVALID_LAYOUT);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, dq, dx, NULL, N, C, S, L, SN_DTYPE_F64, ws, wsb,
                                           0),
                   SN_ERR_INVALID_DTYPE);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, dq, dx, NULL, N, C, S, L, D, ws, wsb - 1, 0),
                   SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, dq, dx, NULL, N, C, S, L, D, NULL, wsb, 0),
                   SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_cuda_batchnorm_stats(ds, ds + 1, dx, NULL, N, C, S, L, D, ws, wsb, 0),
                   SN_ERR_INVALID_ARGUMENT);
  assert_poisoned(ds, C * 8, "stats sum after errors");
  assert_poisoned(dq, C * 8, "stats sumsq after errors");
  /* finalize: count <= 1, eps */
  ck_assert_int_eq(sn_cuda_batchnorm_finalize(dm, dv, dr, ds, dq, NULL, 1, C, EPS, 0),
                   SN_ERR_INSUFFICIENT_COUNT);
  ck_assert_int_eq(sn_cuda_batchnorm_finalize(dm, dv, dr, ds, dq, NULL, 8, C, 0.0f, 0),
                   SN_ERR_INVALID_EPS);
  ck_assert_int_eq(sn_cuda_batchnorm_finalize(NULL, dv, dr, ds, dq, NULL, 8, C, EPS, 0),
                   SN_ERR_NULL_POINTER);
  /* fwd */
  ck_assert_int_eq(sn_cuda_batchnorm_fwd(dy, dm, dv, dr, dx, NULL, NULL, NULL, 1, C, 1, EPS, L, D,
                                         ws, wsb, 0),
                   SN_ERR_INSUFFICIENT_COUNT);
  ck_assert_int_eq(sn_cuda_batchnorm_fwd(dy, dm, dv, dr, NULL, NULL, NULL, NULL, N, C, S, EPS, L,
                                         D, ws, wsb, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_fwd(dy, dm, dv, dr, dx, NULL, NULL, NULL, N, C, S, EPS, L, D,
                                         ws, wsb / 2, 0),
                   SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_cuda_batchnorm_fwd((float *)dx + 1, dm, dv, dr, dx, NULL, NULL, NULL, N, C,
                                         S, EPS, L, D, ws, wsb, 0),
                   SN_ERR_INVALID_ARGUMENT); /* y one element into x */
  ck_assert_int_eq(sn_cuda_batchnorm_fwd(dy, dm, dv, dr, dx, NULL, NULL, NULL, N, C, S, EPS,
                                         (sn_layout_t)-1, D, ws, wsb, 0),
                   SN_ERR_INVALID_LAYOUT);
  assert_poisoned(dy, sizeof hx, "fwd y after errors");
  assert_poisoned(dm, C * 8, "fwd mean after errors");
  assert_poisoned(dv, C * 4, "fwd var after errors");
  assert_poisoned(dr, C * 4, "fwd rstd after errors");
  /* apply, infer, bwd_reduce, bwd_apply, bwd */
  ck_assert_int_eq(sn_cuda_batchnorm_apply(dy, dx, NULL, dr, NULL, NULL, N, C, S, L, D, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_infer(dy, dx, dv, NULL, NULL, NULL, N, C, S, EPS, L, D, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_infer(dy, dx, dv, dr, NULL, NULL, N, C, S, -1.0f, L, D, 0),
                   SN_ERR_INVALID_EPS);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_reduce(ds, dq, dx, NULL, dm, dr, N, C, S, L, D, ws, wsb,
                                                0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_reduce(ds, dq, dx, dx, dm, dr, N, C, S, L, D, ws, 8, 0),
                   SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_apply(dy, dx, dx, dm, dr, NULL, ds, NULL, 8, N, C, S, L,
                                                D, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd_apply(dy, dx, dx, dm, dr, NULL, ds, dq, 1, N, C, S, L, D,
                                                0),
                   SN_ERR_INSUFFICIENT_COUNT);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd(dy, dv, dv, dx, dx, dm, dr, NULL, N, C, S, L, D, ws, wsb,
                                         0),
                   SN_ERR_INVALID_ARGUMENT); /* dgamma == dbeta */
  ck_assert_int_eq(sn_cuda_batchnorm_bwd(dy, NULL, NULL, dx, dx, dm, dr, NULL, 1, C, 1, L, D, ws,
                                         wsb, 0),
                   SN_ERR_INSUFFICIENT_COUNT);
  ck_assert_int_eq(sn_cuda_batchnorm_bwd(dy, NULL, NULL, dx, dx, dm, dr, NULL, N, C, S, L, D, ws,
                                         0, 0),
                   SN_ERR_INVALID_ARGUMENT);
  assert_poisoned(dy, sizeof hx, "y/dx after errors");
  assert_poisoned(ds, C * 8, "sums after errors");
  assert_poisoned(dv, C * 4, "dgamma after errors");
  ct_free(ws), ct_free(dx), ct_free(dy), ct_free(ds), ct_free(dq), ct_free(dm), ct_free(dv);
  ct_free(dr);
}
END_TEST

int main(void) {
  if (ct_no_device("test_cuda_batchnorm")) return CT_SKIP_CODE;
  Suite *s = suite_create("cuda_batchnorm");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_fwd_vs_cpu, 0, 6);
  tcase_add_loop_test(tc, test_bwd_vs_cpu, 0, 6);
  tcase_add_loop_test(tc, test_big, 0, 4);
  tcase_add_test(tc, test_adversarial);
  tcase_add_loop_test(tc, test_infer, 0, 6);
  tcase_add_loop_test(tc, test_beta_cancels, 2, 6);
  tcase_add_test(tc, test_update_running);
  tcase_add_test(tc, test_empty);
  tcase_add_test(tc, test_errors);
  suite_add_tcase(s, tc);
  return ct_run_suite(s);
}
