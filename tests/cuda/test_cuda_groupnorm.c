/*
 * test_cuda_groupnorm.c — the CUDA GroupNorm forward and backward and the BatchNorm fold
 * (src/cuda/groupnorm.cu, groupnorm_bwd.cu, fold.cu) against the CPU functions of the same name
 * on the same inputs: layouts,
 * dtypes, G ∈ {1, C/2, C}, odd sizes, a large batch, empty batches, determinism and bad
 * arguments. Device outputs are poisoned (NaN bytes) first.
 *
 * Layouts: NCHW = [N, C, S], NHWC = [N, S, C].
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudatest.h"

/* ---- tolerances ---------------------------------------------------------------------------- */
/* mean, rstd [N, G] f32: roundings of fp64 statistics that agree to ~1e-13 (two-pass on the GPU,
 * shifted one-pass or two-pass on the CPU, sums of <= 1e5 values): 1 f32 ulp each side plus
 * margin, of |mean| + σ for the mean (a mean near 0 has no relative accuracy) and of rstd. */
#define TOL_STAT_F32 1e-6
/* f32 activations (y, dx): the CPU's within a few f32 roundings of the size of their terms
 * (|x̂·gamma| + |beta|; rstd·(|g| + |mean(g)| + |x̂·mean(g·x̂)|) backward), the GPU's within one
 * rounding of an fp64 value: 1e-6 of the terms (~16 ulps) plus 4 ulps of the result. */
#define ATOL_TERMS_F32 1e-6
#define RTOL_F32 (4.0 * 0x1p-24)
/* bf16/f16 dx: at most 2 ulp apart (or within the f32 term error above where the terms
 * cancel). bf16/f16 y: both sides at the forward bound (testutil.h TU_LOWP_SCALE_TOL), so within
 * tu_lowp_pair_ok of each other (cmp_y). */
#define ULPS_HALF_PAIR 2.0
/* dgamma, dbeta: f32 roundings of fp64 sums over samples of per-sample fp64 terms, agreeing to
 * ~1e-13 of Σ|terms|: 1 ulp each side of the result plus 1e-12 of Σ|terms|. */
#define TOL_PGRAD_REL 2.4e-7
#define TOL_PGRAD_SUM 1e-12
/* fold: both sides compute the same fp64 expression (no contraction) rounded once to f32: equal,
 * allowing 1 ulp. */
#define TOL_FOLD_REL 0x1p-24

static const float EPS = 1e-5f;
static const sn_dtype_t DTYPES[3] = {SN_DTYPE_F32, SN_DTYPE_BF16, SN_DTYPE_F16};
static const sn_layout_t LAYOUTS[2] = {SN_LAYOUT_NCHW, SN_LAYOUT_NHWC};
static const char *const LNAME[2] = {"NCHW", "NHWC"};
/* (N, S): N·S ∈ {2, 3, 1000}. */
static const int64_t NS[][2] = {{1, 2}, {2, 1}, {1, 3}, {3, 1}, {8, 125}, {1000, 1}};
static const int64_t CS[] = {1, 3, 64, 65, 96};

/* ---- helpers ------------------------------------------------------------------------------- */

static int64_t chan(sn_layout_t lay, int64_t i, int64_t C, int64_t S) {
  return lay == SN_LAYOUT_NCHW ? (i / S) % C : i % C;
}
static int64_t sample(sn_layout_t lay, int64_t i, int64_t C, int64_t S) {
  (void)lay;
  return i / (C * S);
}
static size_t abytes(int64_t n, sn_dtype_t dt) { return (size_t)n * (size_t)sn_dtype_size(dt); }

static void assert_poisoned(const void *dev, size_t bytes, const char *what) {
  unsigned char *h = malloc(bytes ? bytes : 1);
  ck_assert_ptr_nonnull(h);
  ct_download(h, dev, bytes);
  for (size_t i = 0; i < bytes; i++)
    TU_CHECK(h[i] == 0xFF, "%s: byte %zu written (0x%02x) by a failing call", what, i, h[i]);
  free(h);
}

/* x = mu_c + sd_c·N(0, 1) by channel, rounded to dt. */
static void fill_x(void *x, int64_t N, int64_t C, int64_t S, sn_layout_t lay, sn_dtype_t dt,
                   tu_rng_t *r) {
  for (int64_t i = 0; i < N * C * S; i++) {
    const int64_t c = chan(lay, i, C, S);
    tu_set(x, i, 0.3 * (double)(c % 5) - 0.4 + (1.0 + 0.2 * (double)(c % 3)) * tu_rng_normal(r),
           dt);
  }
}

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

/* ---- forward and backward against the CPU -------------------------------------------------- */

/* beta[c] = −round_f32(x̂·gamma[c]) of element (0, c, c % S) of x [N, C, S], x̂ from the fp64
 * two-pass statistics of its group: y there is ~2^-24 of its terms. */
static void cancelling_beta(float *beta, const void *x, const float *gamma, int64_t C, int64_t S,
                            int64_t G, sn_layout_t lay, sn_dtype_t dt) {
  const int64_t Cg = C / G;
  for (int64_t g = 0; g < G; g++) {
    double m = 0.0, v = 0.0;
    for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
      for (int64_t s = 0; s < S; s++) m += tu_get(x, tu_at(lay, 0, c, s, C, S), dt);
    m /= (double)(Cg * S);
    for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
      for (int64_t s = 0; s < S; s++) {
        const double e = tu_get(x, tu_at(lay, 0, c, s, C, S), dt) - m;
        v += e * e;
      }
    const double rs = 1.0 / sqrt(v / (double)(Cg * S) + (double)EPS);
    for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
      beta[c] = -(float)((tu_get(x, tu_at(lay, 0, c, c % S, C, S), dt) - m) * rs * gamma[c]);
  }
}

/* with_params: 0 no gamma and beta, 1 random ones, 2 a random gamma and cancelling_beta. */
static void gn_case(int64_t N, int64_t C, int64_t S, int64_t G, sn_layout_t lay, sn_dtype_t dt,
                    int with_params, uint64_t seed) {
  char what[160];
  snprintf(what, sizeof what, "gn [%lld, %lld, %lld] G %lld %s %s", (long long)N, (long long)C,
           (long long)S, (long long)G, LNAME[lay], tu_dtype_name[dt]);
  const int64_t T = N * C * S, NG = N * G, Cg = C / G;
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  void *x = tu_alloc(T, dt), *dyv = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dx = tu_alloc(T, dt);
  void *got = tu_alloc(T, dt);
  float *gamma = tu_falloc(C), *beta = tu_falloc(C), *mean = tu_falloc(NG), *rstd = tu_falloc(NG);
  float *dg = tu_falloc(C), *db = tu_falloc(C);
  fill_x(x, N, C, S, lay, dt, &r);
  tu_fill_normal(dyv, T, dt, 0.1, 1.0, &r);
  for (int64_t c = 0; c < C; c++)
    gamma[c] = (float)(0.5 + tu_rng_uniform(&r)), beta[c] = (float)(tu_rng_uniform(&r) - 0.5);
  if (with_params == 2) cancelling_beta(beta, x, gamma, C, S, G, lay, dt);
  const float *hg = with_params ? gamma : NULL, *hb = with_params ? beta : NULL;
  ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, hg, hb, N, C, S, G, EPS, lay, dt), SN_OK);
  ck_assert_int_eq(sn_groupnorm_bwd(dx, dg, db, dyv, x, mean, rstd, hg, N, C, S, G, lay, dt),
                   SN_OK);
  /* GPU */
  size_t wsb;
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&wsb, N, C), SN_OK);
  void *ws = ct_alloc_poison(wsb);
  void *d_x = ct_upload(x, abytes(T, dt)), *d_dy = ct_upload(dyv, abytes(T, dt));
  float *d_g = ct_upload(gamma, (size_t)C * 4), *d_b = ct_upload(beta, (size_t)C * 4);
  float *d_m = ct_upload(mean, (size_t)NG * 4), *d_r = ct_upload(rstd, (size_t)NG * 4);
  const float *dhg = with_params ? d_g : NULL, *dhb = with_params ? d_b : NULL;
  void *g_y = ct_alloc_poison(abytes(T, dt)), *g_dx = ct_alloc_poison(abytes(T, dt));
  float *g_m = ct_alloc_poison((size_t)NG * 4), *g_r = ct_alloc_poison((size_t)NG * 4);
  float *g_dg = ct_alloc_poison((size_t)C * 4), *g_db = ct_alloc_poison((size_t)C * 4);
  float *g_dg2 = ct_alloc_poison((size_t)C * 4), *g_db2 = ct_alloc_poison((size_t)C * 4);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(g_y, g_m, g_r, d_x, dhg, dhb, N, C, S, G, EPS, lay, dt,
                                         0),
                   SN_OK);
  /* the backward from the CPU's statistics, so both sides see the same inputs */
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(g_dx, g_dg, g_db, d_dy, d_x, d_m, d_r, dhg, N, C, S, G,
                                         lay, dt, ws, wsb, 0),
                   SN_OK);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(g_dx, g_dg2, g_db2, d_dy, d_x, d_m, d_r, dhg, N, C, S, G,
                                         lay, dt, ws, wsb, 0),
                   SN_OK);
  float *hm = tu_falloc(NG), *hr = tu_falloc(NG), *hdg = tu_falloc(C), *hdb = tu_falloc(C);
  float *hdg2 = tu_falloc(C), *hdb2 = tu_falloc(C);
  ct_download(hm, g_m, (size_t)NG * 4), ct_download(hr, g_r, (size_t)NG * 4);
  ct_download(hdg, g_dg, (size_t)C * 4), ct_download(hdb, g_db, (size_t)C * 4);
  ct_download(hdg2, g_dg2, (size_t)C * 4), ct_download(hdb2, g_db2, (size_t)C * 4);
  tu_assert_bitwise(hdg, hdg2, (size_t)C * 4, what); /* deterministic */
  tu_assert_bitwise(hdb, hdb2, (size_t)C * 4, what);
  for (int64_t t = 0; t < NG; t++) {
    TU_CHECK(fabs((double)hm[t] - (double)mean[t]) <=
                 TOL_STAT_F32 * (fabs((double)mean[t]) + 1.0 / (double)rstd[t]),
             "%s: mean[%lld] %.9g vs CPU %.9g", what, (long long)t, (double)hm[t],
             (double)mean[t]);
    TU_CHECK(fabs((double)hr[t] - (double)rstd[t]) <= TOL_STAT_F32 * (double)rstd[t],
             "%s: rstd[%lld] %.9g vs CPU %.9g", what, (long long)t, (double)hr[t],
             (double)rstd[t]);
  }
  /* y: terms |x̂·gamma| + |beta| */
  double *terms = tu_dalloc(T);
  for (int64_t i = 0; i < T; i++) {
    const int64_t c = chan(lay, i, C, S), t = sample(lay, i, C, S) * G + c / Cg;
    terms[i] = fabs((tu_get(x, i, dt) - mean[t]) * (double)rstd[t] * (hg ? hg[c] : 1.0)) +
               fabs(hb ? hb[c] : 0.0);
  }
  ct_download(got, g_y, abytes(T, dt));
  cmp_y(got, y, terms, T, dt, "gn fwd y");
  /* dx: terms rstd·(|g| + |mean(g)| + |x̂·mean(g·x̂)|) per group, g = dy·gamma */
  double *mg = tu_dalloc(NG), *mgx = tu_dalloc(NG), *sdy = tu_dalloc(C), *sdyx = tu_dalloc(C);
  for (int64_t t = 0; t < NG; t++) mg[t] = 0.0, mgx[t] = 0.0;
  for (int64_t c = 0; c < C; c++) sdy[c] = 0.0, sdyx[c] = 0.0;
  for (int64_t i = 0; i < T; i++) {
    const int64_t c = chan(lay, i, C, S), t = sample(lay, i, C, S) * G + c / Cg;
    const double d = tu_get(dyv, i, dt), xh = (tu_get(x, i, dt) - mean[t]) * (double)rstd[t];
    const double gi = d * (hg ? hg[c] : 1.0);
    mg[t] += gi / (double)(Cg * S), mgx[t] += gi * xh / (double)(Cg * S);
    sdy[c] += fabs(d), sdyx[c] += fabs(d * xh);
  }
  for (int64_t i = 0; i < T; i++) {
    const int64_t c = chan(lay, i, C, S), t = sample(lay, i, C, S) * G + c / Cg;
    const double xh = (tu_get(x, i, dt) - mean[t]) * (double)rstd[t];
    terms[i] = (double)rstd[t] * (fabs(tu_get(dyv, i, dt) * (hg ? hg[c] : 1.0)) + fabs(mg[t]) +
                                  fabs(xh * mgx[t]));
  }
  ct_download(got, g_dx, abytes(T, dt));
  cmp_act(got, dx, terms, T, dt, "gn bwd dx");
  for (int64_t c = 0; c < C; c++) {
    TU_CHECK(fabs((double)hdg[c] - (double)dg[c]) <=
                 TOL_PGRAD_REL * fabs((double)dg[c]) + TOL_PGRAD_SUM * sdyx[c],
             "%s: dgamma[%lld] %.9g vs CPU %.9g", what, (long long)c, (double)hdg[c],
             (double)dg[c]);
    TU_CHECK(fabs((double)hdb[c] - (double)db[c]) <=
                 TOL_PGRAD_REL * fabs((double)db[c]) + TOL_PGRAD_SUM * sdy[c],
             "%s: dbeta[%lld] %.9g vs CPU %.9g", what, (long long)c, (double)hdb[c],
             (double)db[c]);
  }
  /* in place (dx = dy) without dgamma/dbeta (no workspace needed): the same dx */
  void *g_io = ct_upload(dyv, abytes(T, dt)), *io = tu_alloc(T, dt);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(g_io, NULL, NULL, g_io, d_x, d_m, d_r, dhg, N, C, S, G,
                                         lay, dt, NULL, 0, 0),
                   SN_OK);
  ct_download(io, g_io, abytes(T, dt));
  tu_assert_bitwise(io, got, abytes(T, dt), "gn bwd in place");
  free(io), ct_free(g_io);
  free(terms), free(mg), free(mgx), free(sdy), free(sdyx);
  free(hm), free(hr), free(hdg), free(hdb), free(hdg2), free(hdb2);
  ct_free(ws), ct_free(d_x), ct_free(d_dy), ct_free(d_g), ct_free(d_b), ct_free(d_m);
  ct_free(d_r), ct_free(g_y), ct_free(g_dx), ct_free(g_m), ct_free(g_r), ct_free(g_dg);
  ct_free(g_db), ct_free(g_dg2), ct_free(g_db2);
  free(x), free(dyv), free(y), free(dx), free(got);
  free(gamma), free(beta), free(mean), free(rstd), free(dg), free(db);
}

/* _i: dtype · 2 + layout; G ∈ {1, C/2 (C even), C}. */
START_TEST(test_gn_vs_cpu) {
  const sn_dtype_t dt = DTYPES[_i / 2];
  const sn_layout_t lay = LAYOUTS[_i % 2];
  uint64_t seed = 100 + (uint64_t)_i * 1000;
  for (size_t k = 0; k < sizeof NS / sizeof NS[0]; k++)
    for (size_t j = 0; j < sizeof CS / sizeof CS[0]; j++) {
      const int64_t C = CS[j];
      gn_case(NS[k][0], C, NS[k][1], 1, lay, dt, C != 3, seed++);
      if (C % 2 == 0) gn_case(NS[k][0], C, NS[k][1], C / 2, lay, dt, 1, seed++);
      if (C > 1) gn_case(NS[k][0], C, NS[k][1], C, lay, dt, C != 65, seed++);
    }
}
END_TEST

/* bf16/f16 with a beta that cancels x̂·gamma (gn_case with_params 2). _i: dtype · 2 + layout,
 * from 2. */
START_TEST(test_gn_beta_cancels) {
  const sn_dtype_t dt = DTYPES[_i / 2];
  const sn_layout_t lay = LAYOUTS[_i % 2];
  gn_case(3, 8, 25, 4, lay, dt, 2, 800 + (uint64_t)_i);
  gn_case(2, 65, 7, 5, lay, dt, 2, 810 + (uint64_t)_i);
}
END_TEST

/* [32, 64, 56, 56], G = 32 and 1 (one group of 200704 values per sample). */
START_TEST(test_gn_big) {
  const sn_layout_t lay = LAYOUTS[_i % 2];
  const sn_dtype_t dt = _i < 2 ? SN_DTYPE_F32 : SN_DTYPE_F16;
  gn_case(32, 64, 56 * 56, 32, lay, dt, 1, 300 + (uint64_t)_i);
  if (_i < 2) gn_case(4, 64, 56 * 56, 1, lay, dt, 1, 310 + (uint64_t)_i);
}
END_TEST

/* ---- empty batches and bad arguments -------------------------------------------------------- */

START_TEST(test_gn_empty) {
  enum { C = 6, G = 3 };
  for (int l = 0; l < 2; l++) {
    float *m = ct_alloc_poison(3 * G * 4), *dg = ct_alloc_poison(C * 4);
    float *db = ct_alloc_poison(C * 4);
    /* S = 0: nothing to normalize, mean/rstd untouched, dgamma/dbeta zero */
    ck_assert_int_eq(sn_cuda_groupnorm_fwd(NULL, m, NULL, NULL, NULL, NULL, 3, C, 0, G, EPS,
                                           LAYOUTS[l], SN_DTYPE_F32, 0),
                     SN_OK);
    ck_assert_int_eq(sn_cuda_groupnorm_bwd(NULL, dg, db, NULL, NULL, NULL, NULL, NULL, 3, C, 0, G,
                                           LAYOUTS[l], SN_DTYPE_BF16, NULL, 0, 0),
                     SN_OK);
    float h[C];
    ct_download(h, dg, sizeof h);
    for (int c = 0; c < C; c++) ck_assert(h[c] == 0.0f);
    ct_download(h, db, sizeof h);
    for (int c = 0; c < C; c++) ck_assert(h[c] == 0.0f);
    assert_poisoned(m, 3 * G * 4, "gn fwd mean of an empty batch");
    ct_free(m), ct_free(dg), ct_free(db);
  }
  size_t b = 1;
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&b, 0, C), SN_OK);
  ck_assert_uint_eq(b, 0);
}
END_TEST

START_TEST(test_gn_errors) {
  enum { N = 2, C = 4, S = 3, G = 2, T = N * C * S };
  tu_rng_t r;
  tu_rng_seed(&r, 700);
  float hx[T];
  for (int i = 0; i < T; i++) hx[i] = (float)tu_rng_normal(&r);
  const sn_layout_t L = SN_LAYOUT_NHWC;
  const sn_dtype_t D = SN_DTYPE_F32;
  size_t wsb;
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&wsb, N, C), SN_OK);
  ck_assert_uint_ge(wsb, 2 * N * C * 8);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(NULL, N, C), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&wsb, N, 0), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&wsb, -1, C), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&wsb, INT64_MAX / 2, C), SN_ERR_OVERFLOW);
  void *ws = ct_alloc_poison(wsb);
  float *dx = ct_upload(hx, sizeof hx), *dy = ct_alloc_poison(sizeof hx);
  float *m = ct_alloc_poison(N * G * 4), *rs = ct_alloc_poison(N * G * 4);
  float *dg = ct_alloc_poison(C * 4), *db = ct_alloc_poison(C * 4);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(NULL, m, rs, dx, NULL, NULL, N, C, S, G, EPS, L, D, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, rs, NULL, NULL, NULL, N, C, S, G, EPS, L, D, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, rs, dx, NULL, NULL, N, 0, S, G, EPS, L, D, 0),
                   SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, rs, dx, NULL, NULL, N, C, S, 3, EPS, L, D, 0),
                   SN_ERR_INVALID_GROUPS);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, rs, dx, NULL, NULL, N, C, S, 0, EPS, L, D, 0),
                   SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, rs, dx, NULL, NULL, N, C, S, G, 0.0f, L, D, 0),
                   SN_ERR_INVALID_EPS);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, rs, dx, NULL, NULL, N, C, S, G, EPS,
                                         (sn_layout_t)5, D, 0),
                   SN_ERR_INVALID_LAYOUT);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, rs, dx, NULL, NULL, N, C, S, G, EPS, L,
                                         (sn_dtype_t)9, 0),
                   SN_ERR_INVALID_DTYPE);
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dy, m, m, dx, NULL, NULL, N, C, S, G, EPS, L, D, 0),
                   SN_ERR_INVALID_ARGUMENT); /* mean == rstd */
  ck_assert_int_eq(sn_cuda_groupnorm_fwd(dx + 1, m, rs, dx, NULL, NULL, N, C, S, G, EPS, L, D, 0),
                   SN_ERR_INVALID_ARGUMENT); /* y one element into x */
  assert_poisoned(dy, sizeof hx, "gn fwd y after errors");
  assert_poisoned(m, N * G * 4, "gn fwd mean after errors");
  assert_poisoned(rs, N * G * 4, "gn fwd rstd after errors");
  /* bwd (mean/rstd: any readable [N, G]; the calls fail before reading them) */
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(dy, dg, db, dx, dx, NULL, rs, NULL, N, C, S, G, L, D, ws,
                                         wsb, 0),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(dy, dg, db, dx, dx, m, rs, NULL, N, C, S, 3, L, D, ws,
                                         wsb, 0),
                   SN_ERR_INVALID_GROUPS);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(dy, dg, db, dx, dx, m, rs, NULL, N, C, S, G, L, D, ws,
                                         wsb - 1, 0),
                   SN_ERR_INVALID_ARGUMENT); /* workspace too small */
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(dy, dg, db, dx, dx, m, rs, NULL, N, C, S, G, L, D, NULL,
                                         wsb, 0),
                   SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(dy, dg, dg, dx, dx, m, rs, NULL, N, C, S, G, L, D, ws,
                                         wsb, 0),
                   SN_ERR_INVALID_ARGUMENT); /* dgamma == dbeta */
  ck_assert_int_eq(sn_cuda_groupnorm_bwd(dy, dg, db, dx, dx, m, rs, NULL, N, C, S, G,
                                         (sn_layout_t)-3, D, ws, wsb, 0),
                   SN_ERR_INVALID_LAYOUT);
  assert_poisoned(dy, sizeof hx, "gn bwd dx after errors");
  assert_poisoned(dg, C * 4, "gn bwd dgamma after errors");
  assert_poisoned(db, C * 4, "gn bwd dbeta after errors");
  ct_free(ws), ct_free(dx), ct_free(dy), ct_free(m), ct_free(rs), ct_free(dg), ct_free(db);
}
END_TEST

/* ---- fold ----------------------------------------------------------------------------------- */

START_TEST(test_fold) {
  const int64_t shapes[3][2] = {{1, 1}, {5, 27}, {64, 576}};
  for (int k = 0; k < 3; k++)
    for (int params = 0; params < 2; params++) {
      const int64_t co = shapes[k][0], per = shapes[k][1], W = co * per;
      tu_rng_t r;
      tu_rng_seed(&r, 800 + (uint64_t)(k * 2 + params));
      float *w = tu_falloc(W), *b = tu_falloc(co), *gamma = tu_falloc(co), *beta = tu_falloc(co);
      float *rm = tu_falloc(co), *rv = tu_falloc(co), *gw = tu_falloc(W), *gb = tu_falloc(co);
      for (int64_t i = 0; i < W; i++) w[i] = (float)tu_rng_normal(&r);
      for (int64_t c = 0; c < co; c++) {
        b[c] = (float)tu_rng_normal(&r), gamma[c] = (float)(0.5 + tu_rng_uniform(&r));
        beta[c] = (float)(tu_rng_uniform(&r) - 0.5), rm[c] = (float)tu_rng_normal(&r);
        rv[c] = (float)(0.1 + tu_rng_uniform(&r));
      }
      float *dw = ct_upload(w, (size_t)W * 4), *db = ct_upload(b, (size_t)co * 4);
      float *dg = ct_upload(gamma, (size_t)co * 4), *dbe = ct_upload(beta, (size_t)co * 4);
      float *drm = ct_upload(rm, (size_t)co * 4), *drv = ct_upload(rv, (size_t)co * 4);
      ck_assert_int_eq(sn_cuda_fold_batchnorm(dw, db, params ? dg : NULL, params ? dbe : NULL,
                                              drm, drv, co, per, EPS, 0),
                       SN_OK);
      ck_assert_int_eq(sn_fold_batchnorm(w, b, params ? gamma : NULL, params ? beta : NULL, rm,
                                         rv, co, per, EPS),
                       SN_OK);
      ct_download(gw, dw, (size_t)W * 4), ct_download(gb, db, (size_t)co * 4);
      for (int64_t i = 0; i < W; i++)
        TU_CHECK(fabs((double)gw[i] - (double)w[i]) <= TOL_FOLD_REL * fabs((double)w[i]),
                 "fold w[%lld] %.9g vs CPU %.9g", (long long)i, (double)gw[i], (double)w[i]);
      for (int64_t c = 0; c < co; c++)
        TU_CHECK(fabs((double)gb[c] - (double)b[c]) <= TOL_FOLD_REL * fabs((double)b[c]),
                 "fold b[%lld] %.9g vs CPU %.9g", (long long)c, (double)gb[c], (double)b[c]);
      /* a negative running_var: that channel NaN on the device (the CPU's error), also when it
       * is above −eps */
      if (co > 1) {
        rv[1] = -0.25f * EPS;
        ct_free(drv);
        drv = ct_upload(rv, (size_t)co * 4);
        ck_assert_int_eq(sn_cuda_fold_batchnorm(dw, db, dg, dbe, drm, drv, co, per, EPS, 0),
                         SN_OK);
        ct_download(gw, dw, (size_t)W * 4), ct_download(gb, db, (size_t)co * 4);
        for (int64_t i = 0; i < W; i++)
          TU_CHECK(!!isnan(gw[i]) == (i / per == 1), "fold w[%lld] %.9g with running_var[1] < 0",
                   (long long)i, (double)gw[i]);
        ck_assert(isnan(gb[1]) && !isnan(gb[0]));
      }
      /* errors: nothing written */
      float *pw = ct_alloc_poison((size_t)W * 4);
      ck_assert_int_eq(sn_cuda_fold_batchnorm(pw, NULL, dg, dbe, drm, drv, co, per, EPS, 0),
                       SN_ERR_NULL_POINTER);
      ck_assert_int_eq(sn_cuda_fold_batchnorm(pw, db, dg, dbe, drm, drv, co, 0, EPS, 0),
                       SN_ERR_INVALID_SIZE);
      ck_assert_int_eq(sn_cuda_fold_batchnorm(pw, db, dg, dbe, drm, drv, co, per, -1.0f, 0),
                       SN_ERR_INVALID_EPS);
      ck_assert_int_eq(sn_cuda_fold_batchnorm(pw, pw, dg, dbe, drm, drv, co, per, EPS, 0),
                       SN_ERR_INVALID_ARGUMENT); /* b over w */
      assert_poisoned(pw, (size_t)W * 4, "fold w after errors");
      ct_free(pw), ct_free(dw), ct_free(db), ct_free(dg), ct_free(dbe), ct_free(drm), ct_free(drv);
      free(w), free(b), free(gamma), free(beta), free(rm), free(rv), free(gw), free(gb);
    }
}
END_TEST

int main(void) {
  if (ct_no_device("test_cuda_groupnorm")) return CT_SKIP_CODE;
  Suite *s = suite_create("cuda_groupnorm");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_gn_vs_cpu, 0, 6);
  tcase_add_loop_test(tc, test_gn_beta_cancels, 2, 6);
  tcase_add_loop_test(tc, test_gn_big, 0, 4);
  tcase_add_test(tc, test_gn_empty);
  tcase_add_test(tc, test_gn_errors);
  tcase_add_test(tc, test_fold);
  suite_add_tcase(s, tc);
  return ct_run_suite(s);
}
