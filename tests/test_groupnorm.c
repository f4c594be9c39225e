/*
 * test_groupnorm.c — sn_groupnorm_fwd / sn_groupnorm_bwd against fp64 references and finite
 * differences, G ∈ {1, C/2, C} (and divisors of 65), NCHW and NHWC, f32/bf16/f16, adversarial
 * data, bad input, in-place use and thread counts.
 *
 * Layouts: NCHW = [N, C, S], NHWC = [N, S, C]; group g holds channels [g·C/G, (g+1)·C/G).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "testutil.h"

/* ---- tolerances ---------------------------------------------------------------------------- */
/* mean, rstd: f32 outputs of fp64 two-pass statistics: one rounding (2^-24) + 1 ulp margin. */
#define TOL_STAT_F32 2.4e-7
/* dgamma, dbeta: fp64 sums rounded to f32 once, computed with the f32 saved mean/rstd (the
 * re-centring removes the mean's rounding; rstd's 2^-24 remains): 1e-6 of Σ|terms|. */
#define TOL_DPARAM 1e-6
/* bf16/f16 dx: tu_rtol_half_bwd (testutil.h). */

static const float EPS = 1e-5f;
static const sn_dtype_t DTYPES[3] = {SN_DTYPE_F32, SN_DTYPE_BF16, SN_DTYPE_F16};
static const sn_layout_t LAYOUTS[2] = {SN_LAYOUT_NCHW, SN_LAYOUT_NHWC};
static const char *const LNAME[2] = {"NCHW", "NHWC"};
/* (C, G): G ∈ {1, C/2, C} for even C, and 65 = 5·13 with 1, 5, 65 groups. */
static const int64_t CG[][2] = {{2, 1}, {2, 2}, {6, 1}, {6, 3}, {6, 6}, {64, 1}, {64, 32},
                                {64, 64}, {65, 1}, {65, 5}, {65, 65}};

/* ---- helpers ------------------------------------------------------------------------------- */

/* x[n, c, s] = mu_{n,c} + sd_c·N(0, 1): samples and channels get different means. */
static void fill_gn(void *x, int64_t N, int64_t C, int64_t S, sn_layout_t lay, sn_dtype_t dt,
                    double mean, double std, tu_rng_t *r) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t s = 0; s < S; s++) {
        double mu = mean + 0.3 * (double)(c % 4) - 0.2 * (double)n, sd = std * (1.0 + 0.2 * (double)(c % 3));
        tu_set(x, tu_at(lay, n, c, s, C, S), mu + sd * tu_rng_normal(r), dt);
      }
}

/* ---- fp64 references ------------------------------------------------------------------------ */

/* Forward: per (n, g) two-pass mean and biased variance; mean, rstd: [N, G]; scale: |x̂·gamma| +
 * |beta| of each element, the bf16/f16 bound's scale (tu_check_lowp_mixed). scale, mean, rstd
 * may be NULL. */
static void ref_fwd(double *y, double *scale, double *mean, double *rstd, const double *x,
                    const float *gamma, const float *beta, int64_t N, int64_t C, int64_t S,
                    int64_t G, sn_layout_t lay, double eps) {
  const int64_t Cg = C / G;
  const double L = (double)(Cg * S);
  for (int64_t n = 0; n < N; n++)
    for (int64_t g = 0; g < G; g++) {
      double m = 0.0, v = 0.0;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
        for (int64_t s = 0; s < S; s++) m += x[tu_at(lay, n, c, s, C, S)];
      m /= L;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
        for (int64_t s = 0; s < S; s++) {
          double d = x[tu_at(lay, n, c, s, C, S)] - m;
          v += d * d;
        }
      const double rs = 1.0 / sqrt(v / L + eps);
      if (mean) mean[n * G + g] = m;
      if (rstd) rstd[n * G + g] = rs;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
        for (int64_t s = 0; s < S; s++) {
          const int64_t i = tu_at(lay, n, c, s, C, S);
          const double xg = (x[i] - m) * rs * (gamma ? gamma[c] : 1.0), b = beta ? beta[c] : 0.0;
          y[i] = xg + b;
          if (scale) scale[i] = fabs(xg) + fabs(b);
        }
    }
}

/* Analytic backward with g = dy·gamma:  dx = rstd·(g − mean(g) − x̂·mean(g·x̂)),
 * dgamma_c = Σ_{n,s} dy·x̂, dbeta_c = Σ_{n,s} dy (exact fp64 statistics). */
static void ref_bwd(double *dx, double *dgamma, double *dbeta, const double *dy, const double *x,
                    const float *gamma, int64_t N, int64_t C, int64_t S, int64_t G,
                    sn_layout_t lay, double eps) {
  const int64_t Cg = C / G;
  const double L = (double)(Cg * S);
  double *mean = tu_dalloc(N * G), *rstd = tu_dalloc(N * G), *y = tu_dalloc(N * C * S);
  ref_fwd(y, NULL, mean, rstd, x, NULL, NULL, N, C, S, G, lay, eps);
  for (int64_t c = 0; c < C; c++) dgamma[c] = 0.0, dbeta[c] = 0.0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t g = 0; g < G; g++) {
      const double m = mean[n * G + g], rs = rstd[n * G + g];
      double mg = 0.0, mgx = 0.0;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
        for (int64_t s = 0; s < S; s++) {
          int64_t i = tu_at(lay, n, c, s, C, S);
          double gi = dy[i] * (gamma ? gamma[c] : 1.0), xh = (x[i] - m) * rs;
          mg += gi, mgx += gi * xh;
          dgamma[c] += dy[i] * xh, dbeta[c] += dy[i];
        }
      mg /= L, mgx /= L;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; c++)
        for (int64_t s = 0; s < S; s++) {
          int64_t i = tu_at(lay, n, c, s, C, S);
          double gi = dy[i] * (gamma ? gamma[c] : 1.0), xh = (x[i] - m) * rs;
          dx[i] = rs * (gi - mg - xh * mgx);
        }
    }
  free(mean), free(rstd), free(y);
}

/* dx vs a reference, error relative to max(||ref||, ||rstd·g||): dx subtracts terms of the size
 * of rstd·g, which f32 gets right to a few ulp of the terms, not of the (possibly tiny)
 * difference (a group of 2 values has almost nothing left after the two projections).
 * dx_err: that error over samples [n0, n1) and channels [c0, c1), every dx there checked
 * finite. */
static double dx_err(const void *dx, sn_dtype_t dt, const double *ref, const double *dyd,
                     const float *gamma, const double *rstd, int64_t C, int64_t S, int64_t G,
                     sn_layout_t lay, int64_t n0, int64_t n1, int64_t c0, int64_t c1,
                     const char *what) {
  double num = 0.0, dr = 0.0, dt2 = 0.0;
  for (int64_t n = n0; n < n1; n++)
    for (int64_t c = c0; c < c1; c++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t i = tu_at(lay, n, c, s, C, S);
        const double v = tu_get(dx, i, dt), t = rstd[n * G + c / (C / G)] * (gamma ? gamma[c] : 1.0) * dyd[i];
        TU_CHECK(isfinite(v), "%s: dx[%lld] = %g", what, (long long)i, v);
        num += (v - ref[i]) * (v - ref[i]), dr += ref[i] * ref[i], dt2 += t * t;
      }
  return sqrt(num) / fmax(sqrt(fmax(dr, dt2)), 1e-300);
}
static void assert_dx(const void *dx, sn_dtype_t dt, const double *ref, const double *dyd,
                      const float *gamma, const double *rstd, int64_t N, int64_t C, int64_t S,
                      int64_t G, sn_layout_t lay, double tol, const char *what) {
  const double e = dx_err(dx, dt, ref, dyd, gamma, rstd, C, S, G, lay, 0, N, 0, C, what);
  ck_assert_msg(e <= tol, "%s (%s): dx error %.3e > %.1e", what, tu_dtype_name[dt], e, tol);
}

/* assert_dx for each (n, group) on its own: where groups' gradients differ by many orders of
 * magnitude a tensor-wide norm would not see the small ones' errors. */
static void assert_dx_each_group(const void *dx, sn_dtype_t dt, const double *ref,
                                 const double *dyd, const float *gamma, const double *rstd,
                                 int64_t N, int64_t C, int64_t S, int64_t G, sn_layout_t lay,
                                 double tol, const char *what) {
  const int64_t Cg = C / G;
  for (int64_t n = 0; n < N; n++)
    for (int64_t g = 0; g < G; g++) {
      const double e =
          dx_err(dx, dt, ref, dyd, gamma, rstd, C, S, G, lay, n, n + 1, g * Cg, (g + 1) * Cg, what);
      TU_CHECK(e <= tol, "%s (%s): n %lld group %lld dx error %.3e > %.1e", what,
               tu_dtype_name[dt], (long long)n, (long long)g, e, tol);
    }
}

/* The library's mean/rstd [N, G] vs the reference. */
static void check_stats(const float *mean, const float *rstd, const double *rm, const double *rr,
                        int64_t NG, const char *what) {
  for (int64_t i = 0; i < NG; i++) {
    TU_CHECK(fabs(mean[i] - rm[i]) <= TOL_STAT_F32 * (fabs(rm[i]) + 1.0 / rr[i]),
             "%s: mean[%lld] %.9g vs %.17g", what, (long long)i, (double)mean[i], rm[i]);
    TU_CHECK(fabs(rstd[i] - rr[i]) <= TOL_STAT_F32 * rr[i], "%s: rstd[%lld] %.9g vs %.17g", what,
             (long long)i, (double)rstd[i], rr[i]);
  }
}

/* dgamma/dbeta (f32) vs the reference, per channel relative to Σ|terms| (recomputed here). */
static void check_dparams(const float *dg, const float *db, const double *rg, const double *rb,
                          const double *dyd, const double *xd, int64_t N, int64_t C, int64_t S,
                          int64_t G, sn_layout_t lay, const char *what) {
  double *rm = tu_dalloc(N * G), *rr = tu_dalloc(N * G), *y = tu_dalloc(N * C * S);
  ref_fwd(y, NULL, rm, rr, xd, NULL, NULL, N, C, S, G, lay, EPS);
  for (int64_t c = 0; c < C; c++) {
    double ag = 0.0, ab = 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = tu_at(lay, n, c, s, C, S);
        ag += fabs(dyd[i] * (xd[i] - rm[n * G + c / (C / G)]) * rr[n * G + c / (C / G)]);
        ab += fabs(dyd[i]);
      }
    TU_CHECK(fabs(dg[c] - rg[c]) <= TOL_DPARAM * ag + 1e-30, "%s: dgamma[%lld] %.9g vs %.17g",
             what, (long long)c, (double)dg[c], rg[c]);
    TU_CHECK(fabs(db[c] - rb[c]) <= TOL_DPARAM * ab + 1e-30, "%s: dbeta[%lld] %.9g vs %.17g",
             what, (long long)c, (double)db[c], rb[c]);
  }
  free(rm), free(rr), free(y);
}

/* ---- tests --------------------------------------------------------------------------------- */

/* Forward and backward vs the fp64 references over N ∈ {1, 3}, S ∈ {1, 3, 250}, the (C, G)
 * grid, both layouts, all dtypes, with and without gamma/beta; every output element checked. */
START_TEST(test_fwd_bwd_vs_ref) {
  static const int64_t NS[][2] = {{1, 1}, {1, 3}, {3, 250}, {3, 1}};
  tu_rng_t r;
  tu_rng_seed(&r, 21);
  for (size_t ins = 0; ins < sizeof NS / sizeof NS[0]; ins++)
    for (size_t icg = 0; icg < sizeof CG / sizeof CG[0]; icg++)
      for (int il = 0; il < 2; il++)
        for (int id = 0; id < 3; id++)
          for (int affine = 0; affine < 2; affine++) {
            const int64_t N = NS[ins][0], S = NS[ins][1], C = CG[icg][0], G = CG[icg][1];
            const int64_t T = N * C * S;
            const sn_layout_t lay = LAYOUTS[il];
            const sn_dtype_t dt = DTYPES[id];
            void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *dx = tu_alloc(T, dt);
            float *gamma = tu_falloc(C), *beta = tu_falloc(C), *mean = tu_falloc(N * G),
                *rstd = tu_falloc(N * G);
            float *dg = tu_falloc(C), *db = tu_falloc(C);
            double *yr = tu_dalloc(T), *rm = tu_dalloc(N * G), *rr = tu_dalloc(N * G),
                *dxr = tu_dalloc(T);
            double *rg = tu_dalloc(C), *rb = tu_dalloc(C), *sc = tu_dalloc(T);
            fill_gn(x, N, C, S, lay, dt, 1.0, 1.5, &r);
            tu_fill_normal(dy, T, dt, 0.2, 1.0, &r);
            tu_fill_params(gamma, beta, C, &r);
            const float *gm = affine ? gamma : NULL, *bt = affine ? beta : NULL;
            double *xd = tu_to_f64(x, T, dt), *dyd = tu_to_f64(dy, T, dt);
            char what[128];
            snprintf(what, sizeof what, "N=%lld C=%lld S=%lld G=%lld %s %s affine=%d",
                     (long long)N, (long long)C, (long long)S, (long long)G, LNAME[il],
                     tu_dtype_name[dt], affine);
            tu_poison(y, T, dt), tu_poison_f32(mean, N * G), tu_poison_f32(rstd, N * G);
            ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, gm, bt, N, C, S, G, EPS, lay, dt), SN_OK);
            ref_fwd(yr, sc, rm, rr, xd, gm, bt, N, C, S, G, lay, EPS);
            check_stats(mean, rstd, rm, rr, N * G, what);
            tu_assert_fwd(y, dt, yr, sc, T, what);
            tu_poison(dx, T, dt), tu_poison_f32(dg, C), tu_poison_f32(db, C);
            ck_assert_int_eq(sn_groupnorm_bwd(dx, dg, db, dy, x, mean, rstd, gm, N, C, S, G, lay, dt), SN_OK);
            ref_bwd(dxr, rg, rb, dyd, xd, gm, N, C, S, G, lay, EPS);
            assert_dx(dx, dt, dxr, dyd, gm, rr, N, C, S, G, lay,
                      dt == SN_DTYPE_F32 ? TU_RTOL_F32_BWD : tu_rtol_half_bwd(dt), what);
            check_dparams(dg, db, rg, rb, dyd, xd, N, C, S, G, lay, what);
            free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(mean), free(rstd);
            free(dg), free(db), free(yr), free(rm), free(rr), free(dxr), free(rg), free(rb);
            free(xd), free(dyd), free(sc);
          }
}
END_TEST

/* The analytic fp64 gradient vs central finite differences of the fp64 forward (loss = Σ y·w)
 * for dx, dgamma and dbeta; and the library's f32 dx, dgamma, dbeta vs the same differences. */
START_TEST(test_bwd_vs_fd) {
  static const int64_t shapes[][4] = {{1, 2, 1, 1}, {2, 4, 3, 2}, {1, 6, 2, 3}, {2, 6, 5, 6},
                                      {3, 4, 4, 1}};
  tu_rng_t r;
  tu_rng_seed(&r, 22);
  for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
    for (int il = 0; il < 2; il++) {
      const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2], G = shapes[is][3];
      const int64_t T = N * C * S;
      const sn_layout_t lay = LAYOUTS[il];
      float *x = tu_falloc(T), *w = tu_falloc(T), *dx = tu_falloc(T), *y = tu_falloc(T),
          *gamma = tu_falloc(C);
      float *beta = tu_falloc(C), *mean = tu_falloc(N * G), *rstd = tu_falloc(N * G),
          *dg = tu_falloc(C);
      float *db = tu_falloc(C);
      double *xd = tu_dalloc(T), *wd = tu_dalloc(T), *yp = tu_dalloc(T), *ym = tu_dalloc(T),
          *fd = tu_dalloc(T);
      double *dxr = tu_dalloc(T), *rg = tu_dalloc(C), *rb = tu_dalloc(C), *fg = tu_dalloc(C),
          *fb = tu_dalloc(C);
      double *rr = tu_dalloc(N * G);
      fill_gn(x, N, C, S, lay, SN_DTYPE_F32, 0.5, 1.0, &r);
      tu_fill_normal(w, T, SN_DTYPE_F32, 0.0, 1.0, &r);
      tu_fill_params(gamma, beta, C, &r);
      for (int64_t i = 0; i < T; i++) xd[i] = x[i], wd[i] = w[i];
      const double h = 1e-6;
      for (int64_t i = 0; i < T; i++) {
        double keep = xd[i], lp = 0.0, lm = 0.0;
        xd[i] = keep + h, ref_fwd(yp, NULL, NULL, NULL, xd, gamma, beta, N, C, S, G, lay, EPS);
        xd[i] = keep - h, ref_fwd(ym, NULL, NULL, NULL, xd, gamma, beta, N, C, S, G, lay, EPS);
        xd[i] = keep;
        for (int64_t j = 0; j < T; j++) lp += yp[j] * wd[j], lm += ym[j] * wd[j];
        fd[i] = (lp - lm) / (2 * h);
      }
      for (int64_t c = 0; c < C; c++) { /* dgamma, dbeta: perturb one parameter */
        for (int which = 0; which < 2; which++) {
          float *p = which ? beta : gamma, keep = p[c];
          double lp = 0.0, lm = 0.0;
          /* f32 parameters: perturb by an exactly representable step */
          const float hp = 0x1p-12f;
          p[c] = keep + hp, ref_fwd(yp, NULL, NULL, NULL, xd, gamma, beta, N, C, S, G, lay, EPS);
          p[c] = keep - hp, ref_fwd(ym, NULL, NULL, NULL, xd, gamma, beta, N, C, S, G, lay, EPS);
          p[c] = keep;
          for (int64_t j = 0; j < T; j++) lp += yp[j] * wd[j], lm += ym[j] * wd[j];
          (which ? fb : fg)[c] = (lp - lm) / (2.0 * (double)hp); /* y is linear in gamma, beta */
        }
      }
      ref_bwd(dxr, rg, rb, wd, xd, gamma, N, C, S, G, lay, EPS);
      ref_fwd(yp, NULL, NULL, rr, xd, gamma, beta, N, C, S, G, lay, EPS);
      assert_dx(dxr, SN_DTYPE_F64, fd, wd, gamma, rr, N, C, S, G, lay, TU_RTOL_FD, "analytic dx vs FD");
      tu_assert_rel(rg, SN_DTYPE_F64, fg, C, TU_RTOL_FD, "analytic dgamma vs FD");
      tu_assert_rel(rb, SN_DTYPE_F64, fb, C, TU_RTOL_FD, "analytic dbeta vs FD");
      ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, gamma, beta, N, C, S, G, EPS, lay, SN_DTYPE_F32), SN_OK);
      tu_poison_f32(dx, T), tu_poison_f32(dg, C), tu_poison_f32(db, C);
      ck_assert_int_eq(sn_groupnorm_bwd(dx, dg, db, w, x, mean, rstd, gamma, N, C, S, G, lay, SN_DTYPE_F32), SN_OK);
      assert_dx(dx, SN_DTYPE_F32, fd, wd, gamma, rr, N, C, S, G, lay, TU_RTOL_F32_BWD, "library dx vs FD");
      tu_assert_rel(dg, SN_DTYPE_F32, fg, C, TU_RTOL_F32_BWD, "library dgamma vs FD");
      tu_assert_rel(db, SN_DTYPE_F32, fb, C, TU_RTOL_F32_BWD, "library dbeta vs FD");
      free(x), free(w), free(dx), free(y), free(gamma), free(beta), free(mean), free(rstd);
      free(dg), free(db), free(xd), free(wd), free(yp), free(ym), free(fd), free(dxr), free(rg);
      free(rb), free(fg), free(fb), free(rr);
    }
}
END_TEST

/* Adversarial: mean 1e4 with σ 1e-2 (the f32 saved mean is off by up to 5e-4 = 5% of σ; the
 * backward re-centres), the same with an outlier first in each group, constant groups (y == beta exactly, finite dx), bf16/f16 near 6e4. */
START_TEST(test_adversarial) {
  tu_rng_t r;
  tu_rng_seed(&r, 23);
  const int64_t N = 2, C = 6, S = 200, G = 3, T = N * C * S;
  for (int il = 0; il < 2; il++) {
    const sn_layout_t lay = LAYOUTS[il];
    float *x = tu_falloc(T), *y = tu_falloc(T), *dy = tu_falloc(T), *dx = tu_falloc(T),
        *gamma = tu_falloc(C);
    float *beta = tu_falloc(C), *mean = tu_falloc(N * G), *rstd = tu_falloc(N * G),
        *dg = tu_falloc(C);
    float *db = tu_falloc(C);
    double *yr = tu_dalloc(T), *dxr = tu_dalloc(T), *rm = tu_dalloc(N * G), *rr = tu_dalloc(N * G);
    double *rg = tu_dalloc(C), *rb = tu_dalloc(C);
    tu_fill_params(gamma, beta, C, &r);
    for (int64_t i = 0; i < T; i++) x[i] = (float)(1e4 + 1e-2 * tu_rng_normal(&r));
    tu_fill_normal(dy, T, SN_DTYPE_F32, 0.0, 1.0, &r);
    double *xd = tu_to_f64(x, T, SN_DTYPE_F32), *dyd = tu_to_f64(dy, T, SN_DTYPE_F32);
    ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, gamma, beta, N, C, S, G, EPS, lay, SN_DTYPE_F32), SN_OK);
    ref_fwd(yr, NULL, rm, rr, xd, gamma, beta, N, C, S, G, lay, EPS);
    check_stats(mean, rstd, rm, rr, N * G, "mean 1e4 sigma 1e-2");
    tu_assert_fwd(y, SN_DTYPE_F32, yr, NULL, T, "mean 1e4 sigma 1e-2: y");
    ck_assert_int_eq(sn_groupnorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, N, C, S, G, lay, SN_DTYPE_F32), SN_OK);
    ref_bwd(dxr, rg, rb, dyd, xd, gamma, N, C, S, G, lay, EPS);
    assert_dx(dx, SN_DTYPE_F32, dxr, dyd, gamma, rr, N, C, S, G, lay, TU_RTOL_F32_BWD, "mean 1e4 sigma 1e-2");
    check_dparams(dg, db, rg, rb, dyd, xd, N, C, S, G, lay, "mean 1e4 sigma 1e-2");
    /* each group's first element 10 (10^3 σ) above the rest: it moves the pivot of the
     * one-pass statistics (the mean of the group's first 32 values, NCHW, or of each channel's
     * first 128 rows, NHWC) far from the mean; such groups (samples) take the two-pass
     * fallback (where that matters: test_shift_fallback) */
    for (int64_t nn = 0; nn < N; nn++)
      for (int64_t g = 0; g < G; g++) {
        /* first element of the group (NCHW) */
        const int64_t i = tu_at(lay, nn, g * (C / G), 0, C, S);
        x[i] = (float)(1e4 + 10.0);
        xd[i] = (double)x[i];
      }
    ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, gamma, beta, N, C, S, G, EPS, lay, SN_DTYPE_F32), SN_OK);
    ref_fwd(yr, NULL, rm, rr, xd, gamma, beta, N, C, S, G, lay, EPS);
    check_stats(mean, rstd, rm, rr, N * G, "first element an outlier");
    tu_assert_fwd(y, SN_DTYPE_F32, yr, NULL, T, "first element an outlier: y");
    /* constant groups */
    for (int64_t i = 0; i < T; i++) x[i] = -3.5f;
    ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, gamma, beta, N, C, S, G, EPS, lay, SN_DTYPE_F32), SN_OK);
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t s = 0; s < S; s++)
          TU_CHECK(y[tu_at(lay, n, c, s, C, S)] == beta[c], "constant group: y != beta");
    ck_assert_int_eq(sn_groupnorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, N, C, S, G, lay, SN_DTYPE_F32), SN_OK);
    tu_assert_all_finite(dx, SN_DTYPE_F32, T, "constant group dx");
    tu_assert_all_finite(dg, SN_DTYPE_F32, C, "constant group dgamma");
    /* bf16/f16 near 6e4 */
    for (int id = 1; id < 3; id++) {
      const sn_dtype_t dt = DTYPES[id];
      void *xh = tu_alloc(T, dt), *yh = tu_alloc(T, dt), *dyh = tu_alloc(T, dt), *dxh = tu_alloc(T, dt);
      fill_gn(xh, N, C, S, lay, dt, 6e4, 1500.0, &r);
      tu_fill_normal(dyh, T, dt, 6e4, 1000.0, &r);
      for (int64_t i = 0; i < T; i++) {
        if (fabs(tu_get(xh, i, dt)) > 65504.0) tu_set(xh, i, 65504.0, dt);
        if (fabs(tu_get(dyh, i, dt)) > 65504.0) tu_set(dyh, i, 65504.0, dt);
      }
      double *xhd = tu_to_f64(xh, T, dt), *dyhd = tu_to_f64(dyh, T, dt), *sc = tu_dalloc(T);
      ck_assert_int_eq(sn_groupnorm_fwd(yh, mean, rstd, xh, gamma, beta, N, C, S, G, EPS, lay, dt), SN_OK);
      ref_fwd(yr, sc, rm, rr, xhd, gamma, beta, N, C, S, G, lay, EPS);
      check_stats(mean, rstd, rm, rr, N * G, "near 6e4");
      tu_assert_fwd(yh, dt, yr, sc, T, "near 6e4: y");
      ck_assert_int_eq(sn_groupnorm_bwd(dxh, dg, db, dyh, xh, mean, rstd, gamma, N, C, S, G, lay, dt), SN_OK);
      ref_bwd(dxr, rg, rb, dyhd, xhd, gamma, N, C, S, G, lay, EPS);
      assert_dx(dxh, dt, dxr, dyhd, gamma, rr, N, C, S, G, lay, tu_rtol_half_bwd(dt), "near 6e4");
      check_dparams(dg, db, rg, rb, dyhd, xhd, N, C, S, G, lay, "near 6e4");
      free(xh), free(yh), free(dyh), free(dxh), free(xhd), free(dyhd), free(sc);
    }
    free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(mean), free(rstd);
    free(dg), free(db), free(yr), free(dxr), free(rm), free(rr), free(rg), free(rb), free(xd);
    free(dyd);
  }
}
END_TEST

/* bf16/f16 outputs where beta cancels x̂·gamma: beta_c = −round_f32(x̂·gamma_c) of one element of
 * each channel (sample 0), so that element's y is ~2^-24 of its terms, and every other element
 * of the same value cancels as deeply: an f32 map errs there by roundings of x̂·gamma, not of y.
 * Each element at the mixed bound (tu_check_lowp_mixed: 1 ulp of y, or 2^-16 of |x̂·gamma| +
 * |beta| where that is more), both layouts, N·S large enough that NHWC uses whole-row tiles;
 * gamma random. */
START_TEST(test_beta_cancels) {
  const int64_t N = 2, C = 8, G = 4, S = 300, T = N * C * S;
  tu_rng_t r;
  tu_rng_seed(&r, 31);
  for (int il = 0; il < 2; il++)
    for (int id = 1; id < 3; id++) {
      const sn_layout_t lay = LAYOUTS[il];
      const sn_dtype_t dt = DTYPES[id];
      void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
      float *gamma = tu_falloc(C), *beta = tu_falloc(C);
      double *yr = tu_dalloc(T), *rm = tu_dalloc(N * G), *rr = tu_dalloc(N * G);
      double *sc = tu_dalloc(T);
      fill_gn(x, N, C, S, lay, dt, 0.5, 2.0, &r);
      tu_fill_params(gamma, beta, C, &r);
      double *xd = tu_to_f64(x, T, dt);
      ref_fwd(yr, NULL, rm, rr, xd, NULL, NULL, N, C, S, G, lay, EPS); /* x̂ */
      for (int64_t c = 0; c < C; c++)
        beta[c] = -(float)(yr[tu_at(lay, 0, c, 7 * c + 3, C, S)] * gamma[c]);
      ref_fwd(yr, sc, rm, rr, xd, gamma, beta, N, C, S, G, lay, EPS);
      char what[96];
      snprintf(what, sizeof what, "beta cancels %s %s", LNAME[il], tu_dtype_name[dt]);
      tu_poison(y, T, dt);
      ck_assert_int_eq(sn_groupnorm_fwd(y, NULL, NULL, x, gamma, beta, N, C, S, G, EPS, lay, dt),
                       SN_OK);
      tu_assert_fwd(y, dt, yr, sc, T, what);
      free(x), free(y), free(gamma), free(beta), free(yr), free(rm), free(rr), free(xd), free(sc);
    }
}
END_TEST

/* Groups of values of both signs near the f32 range (tu_fill_near_max; the group mean is beyond
 * 2^103): x − mean exceeds FLT_MAX for some elements although y is O(1). The first group of
 * each sample is such a group, the others ordinary (NHWC tiles mixing both). Forward and
 * backward, f32 and bf16, both layouts. rstd (~2^-127) is a subnormal f32: the backward starts
 * from it (2^-22 relative, inside TOL_DPARAM and the dx bounds), and channel 0's gamma 2^-16
 * makes gamma·rstd a subnormal f32 with a few bits left (taken in f32 it would err by 1e5 ulp);
 * dy is scaled by 2^100 so that dx is a normal number; dx is checked group by group (the groups'
 * gradients differ by 2^127). */
START_TEST(test_near_f32_max) {
  static const int64_t NSS[][2] = {{2, 200}, {1, 3}};
  const int64_t C = 6, G = 3;
  tu_rng_t r;
  tu_rng_seed(&r, 29);
  for (size_t ins = 0; ins < 2; ins++)
    for (int il = 0; il < 2; il++)
      for (int id = 0; id < 2; id++) {
        const int64_t N = NSS[ins][0], S = NSS[ins][1], T = N * C * S;
        const sn_layout_t lay = LAYOUTS[il];
        const sn_dtype_t dt = DTYPES[id];
        void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dy = tu_alloc(T, dt);
        void *dx = tu_alloc(T, dt);
        float *gamma = tu_falloc(C), *beta = tu_falloc(C), *mean = tu_falloc(N * G),
            *rstd = tu_falloc(N * G);
        float *dg = tu_falloc(C), *db = tu_falloc(C);
        double *yr = tu_dalloc(T), *rm = tu_dalloc(N * G), *rr = tu_dalloc(N * G),
            *dxr = tu_dalloc(T);
        double *rg = tu_dalloc(C), *rb = tu_dalloc(C);
        fill_gn(x, N, C, S, lay, dt, 1.0, 1.5, &r);
        for (int64_t n = 0; n < N; n++)
          for (int64_t c = 0; c < C / G; c++) /* group 0 */
            for (int64_t ss = 0; ss < S; ss++) {
              float v;
              tu_fill_near_max(&v, 1, SN_DTYPE_F32, 0.75, &r);
              tu_set(x, tu_at(lay, n, c, ss, C, S), (double)v, dt);
            }
        tu_fill_normal(dy, T, dt, 0.0, 0x1p100, &r);
        tu_fill_params(gamma, beta, C, &r);
        gamma[0] = 0x1p-16f; /* gamma·rstd a subnormal f32 in group 0 */
        double *xd = tu_to_f64(x, T, dt), *dyd = tu_to_f64(dy, T, dt);
        char what[128];
        snprintf(what, sizeof what, "near FLT_MAX N=%lld S=%lld %s %s", (long long)N,
                 (long long)S, LNAME[il], tu_dtype_name[dt]);
        tu_poison(y, T, dt);
        ck_assert_int_eq(
            sn_groupnorm_fwd(y, mean, rstd, x, gamma, beta, N, C, S, G, EPS, lay, dt), SN_OK);
        double *sc = tu_dalloc(T);
        ref_fwd(yr, sc, rm, rr, xd, gamma, beta, N, C, S, G, lay, EPS);
        tu_assert_fwd(y, dt, yr, sc, T, what);
        free(sc);
        tu_poison(dx, T, dt), tu_poison_f32(dg, C), tu_poison_f32(db, C);
        ck_assert_int_eq(
            sn_groupnorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, N, C, S, G, lay, dt), SN_OK);
        ref_bwd(dxr, rg, rb, dyd, xd, gamma, N, C, S, G, lay, EPS);
        assert_dx_each_group(dx, dt, dxr, dyd, gamma, rr, N, C, S, G, lay,
                             dt == SN_DTYPE_F32 ? TU_RTOL_F32_BWD : tu_rtol_half_bwd(dt), what);
        check_dparams(dg, db, rg, rb, dyd, xd, N, C, S, G, lay, what);
        free(x), free(y), free(dy), free(dx), free(gamma), free(beta), free(mean), free(rstd);
        free(dg), free(db), free(yr), free(rm), free(rr), free(dxr), free(rg), free(rb);
        free(xd), free(dyd);
      }
}
END_TEST

/* A channel whose factor gamma·rstd leaves the f32 range is mapped in fp64, in every dtype and
 * layout (f16 NCHW: from its widened group, sn__aff_span_from_f32): group 0 of each sample is
 * constant (var 0, rstd = 1/sqrt(eps)) and gamma[0] = 3e38, so gamma·rstd ≈ 9.5e40 while
 * x − mean = 0 and y = beta exactly (the f32 map would give 0·inf = NaN); channel 1 of the group
 * takes a gamma of 2^-140 (a subnormal f32 factor); group 1 is ordinary. Without and with beta
 * (with it too, a bf16/f16 value that is not finite in f32 is recomputed in fp64). y against the
 * fp64 reference at the forward bound, all finite. */
START_TEST(test_wide_factor_channels) {
  const int64_t N = 3, C = 4, G = 2, S = 300, T = N * C * S;
  tu_rng_t r;
  tu_rng_seed(&r, 47);
  for (int il = 0; il < 2; il++)
    for (int id = 0; id < 6; id++) { /* dtype id % 3; beta from id = 3 */
      const sn_layout_t lay = LAYOUTS[il];
      const sn_dtype_t dt = DTYPES[id % 3];
      void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
      float *gamma = tu_falloc(C), *beta = tu_falloc(C), *mean = tu_falloc(N * G),
          *rstd = tu_falloc(N * G);
      double *yr = tu_dalloc(T), *rm = tu_dalloc(N * G), *rr = tu_dalloc(N * G);
      fill_gn(x, N, C, S, lay, dt, 1.0, 1.5, &r);
      for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C / G; c++)
          for (int64_t ss = 0; ss < S; ss++) tu_set(x, tu_at(lay, n, c, ss, C, S), 1.5, dt);
      tu_fill_params(gamma, beta, C, &r);
      gamma[0] = 3e38f, gamma[1] = 0x1p-140f;
      double *xd = tu_to_f64(x, T, dt);
      char what[96];
      const float *b = id >= 3 ? beta : NULL;
      snprintf(what, sizeof what, "wide factors %s %s%s", LNAME[il], tu_dtype_name[dt],
               b ? " beta" : "");
      tu_poison(y, T, dt);
      ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, gamma, b, N, C, S, G, EPS, lay, dt),
                       SN_OK);
      double *sc = tu_dalloc(T);
      ref_fwd(yr, sc, rm, rr, xd, gamma, b, N, C, S, G, lay, EPS);
      tu_assert_fwd(y, dt, yr, sc, T, what);
      free(sc);
      free(x), free(y), free(gamma), free(beta), free(mean), free(rstd), free(yr), free(rm);
      free(rr), free(xd);
    }
}
END_TEST

/* The one-pass statistics' fallback on a large group: 2^21 values (N = 1, C = 2, G = 1,
 * S = 2^20), constant but for 32 values at 1.7 that pull the pivots (NCHW: the mean of the
 * group's first 32 values; NHWC: of each channel's first 128 rows) far off the mean (ρ ≈ 2^15
 * and 2^13), so both layouts take the two passes; statistics to TOL_STAT_F32 and y to the f32
 * bound. (The one-pass sums alone, fallback off,
 * also met these bounds here: the test covers the fallback path, the error analysis in rownorm.h
 * says why it is there.) */
START_TEST(test_shift_fallback) {
  const int64_t N = 1, C = 2, G = 1, S = (int64_t)1 << 20, T = N * C * S;
  tu_rng_t r;
  tu_rng_seed(&r, 31);
  float *x = tu_falloc(T), *y = tu_falloc(T), *mean = tu_falloc(N * G), *rstd = tu_falloc(N * G);
  double *yr = tu_dalloc(T), *rm = tu_dalloc(N * G), *rr = tu_dalloc(N * G);
  for (int il = 0; il < 2; il++) {
    const sn_layout_t lay = LAYOUTS[il];
    for (int64_t c = 0; c < C; c++)
      for (int64_t s = 0; s < S; s++)
        x[tu_at(lay, 0, c, s, C, S)] =
            s < 32 ? (float)(1.7 + 1e-3 * tu_rng_normal(&r)) : 1.0009765625f;
    double *xd = tu_to_f64(x, T, SN_DTYPE_F32);
    ref_fwd(yr, NULL, rm, rr, xd, NULL, NULL, N, C, S, G, lay, EPS);
    const int saved = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) { /* NHWC, N = 1: the team shares the sample */
      omp_set_num_threads(threads);
      tu_poison_f32(y, T);
      ck_assert_int_eq(sn_groupnorm_fwd(y, mean, rstd, x, NULL, NULL, N, C, S, G, EPS, lay,
                                        SN_DTYPE_F32), SN_OK);
      check_stats(mean, rstd, rm, rr, N * G, LNAME[il]);
      tu_assert_fwd(y, SN_DTYPE_F32, yr, NULL, T, LNAME[il]);
    }
    omp_set_num_threads(saved);
    free(xd);
  }
  free(x), free(y), free(mean), free(rstd), free(yr), free(rm), free(rr);
}
END_TEST

/* NCHW bf16 groups take the f32 path's one-pass shifted sums, reading the group in pairs
 * (rownorm.h), and f16 groups of up to 2^18 values the same sums on the group widened once:
 * mean and rstd bitwise those of the f32 kernel on the widened x, and y without beta bitwise its
 * y rounded to the dtype (the same f32 map). Groups of every length modulo the 32-value pair
 * block, and groups whose first 32 values are far from the rest, which take the two-pass
 * fallback (as test_shift_fallback in f32), on one thread and on a team. (For finite f16 data
 * the two fp64 passes that f16 took before agree with these statistics to the last f32 bit, so
 * this checks the promise, not which sums ran.) Loop index: 0 bf16, 1 f16. */
static const sn_dtype_t lowp_dtypes[] = {SN_DTYPE_BF16, SN_DTYPE_F16};

START_TEST(test_lowp_nchw_matches_f32) {
  static const int64_t shapes[][4] = {{3, 4, 1, 1},  {3, 4, 1, 4},  {2, 6, 7, 3},
                                      {2, 4, 49, 2}, {1, 8, 50, 1}, {2, 64, 33, 32},
                                      {4, 8, 2050, 4}}; /* the last: 16 groups, on the team */
  const sn_dtype_t dt = lowp_dtypes[_i];
  for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
    for (int fall = 0; fall < 2; fall++) {
      const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2],
                    G = shapes[is][3], T = N * C * S, L = C / G * S;
      tu_rng_t r;
      tu_rng_seed(&r, 60 + 2 * (uint64_t)is + (uint64_t)fall + 100 * (uint64_t)_i);
      void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
      float *xf = tu_falloc(T), *yf = tu_falloc(T), *gamma = tu_falloc(C), *beta = tu_falloc(C);
      float m1[64], r1[64], mf[64], rf[64];
      fill_gn(x, N, C, S, SN_LAYOUT_NCHW, dt, 3.0, 2.0, &r);
      if (fall) /* each group's first 32 values 40σ above the rest: the pivot is far off */
        for (int64_t t = 0; t < N * G; t++)
          for (int64_t i = 0; i < L && i < 32; i++) tu_set(x, t * L + i, 80.0, dt);
      for (int64_t i = 0; i < T; i++) xf[i] = (float)tu_get(x, i, dt);
      tu_fill_params(gamma, beta, C, &r);
      tu_poison(y, T, dt);
      ck_assert_int_eq(sn_groupnorm_fwd(y, m1, r1, x, gamma, NULL, N, C, S, G, EPS,
                                        SN_LAYOUT_NCHW, dt), SN_OK);
      ck_assert_int_eq(sn_groupnorm_fwd(yf, mf, rf, xf, gamma, NULL, N, C, S, G, EPS,
                                        SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
      tu_assert_bitwise(m1, mf, (size_t)(N * G) * sizeof(float), "lowp mean vs f32 widened");
      tu_assert_bitwise(r1, rf, (size_t)(N * G) * sizeof(float), "lowp rstd vs f32 widened");
      for (int64_t i = 0; i < T; i++)
        TU_CHECK(tu_get(y, i, dt) == tu_round(yf[i], dt),
                 "dtype %d shape %zu fallback %d: y[%lld] = %.9g, f32 y rounded %.9g", (int)dt,
                 is, fall, (long long)i, tu_get(y, i, dt), tu_round(yf[i], dt));
      free(x), free(y), free(xf), free(yf), free(gamma), free(beta);
    }
}
END_TEST

/* f16 NCHW groups of exactly 2^18 values (the largest widened into scratch) and of more (the two
 * passes over f32 tiles): mean and rstd within TOL_STAT_F32 of the f32 kernel's (each an fp64
 * value rounded once; bitwise at 2^18, as the widened path promises), y (with beta) at the
 * forward bound against the fp64 reference. */
START_TEST(test_f16_nchw_large_group) {
  static const int64_t sizes[][4] = {{1, 2, 131072, 1}, {1, 3, 100003, 1}}; /* L = 2^18, > */
  const sn_dtype_t dt = SN_DTYPE_F16;
  for (size_t is = 0; is < sizeof sizes / sizeof sizes[0]; is++) {
    const int64_t N = sizes[is][0], C = sizes[is][1], S = sizes[is][2], G = sizes[is][3];
    const int64_t T = N * C * S;
    tu_rng_t r;
    tu_rng_seed(&r, 91 + (uint64_t)is);
    void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt);
    float *xf = tu_falloc(T), *yf = tu_falloc(T), *gamma = tu_falloc(C), *beta = tu_falloc(C), m1,
        r1, mf, rf;
    fill_gn(x, N, C, S, SN_LAYOUT_NCHW, dt, 3.0, 2.0, &r);
    for (int64_t i = 0; i < T; i++) xf[i] = (float)tu_get(x, i, dt);
    tu_fill_params(gamma, beta, C, &r);
    tu_poison(y, T, dt);
    ck_assert_int_eq(sn_groupnorm_fwd(y, &m1, &r1, x, gamma, beta, N, C, S, G, EPS,
                                      SN_LAYOUT_NCHW, dt), SN_OK);
    ck_assert_int_eq(sn_groupnorm_fwd(yf, &mf, &rf, xf, gamma, beta, N, C, S, G, EPS,
                                      SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
    TU_CHECK(fabs((double)m1 - mf) <= TOL_STAT_F32 * (fabs((double)mf) + 1.0 / rf),
             "size %zu: mean %.9g vs %.9g", is, (double)m1, (double)mf);
    TU_CHECK(fabs((double)r1 - rf) <= TOL_STAT_F32 * rf, "size %zu: rstd %.9g vs %.9g", is,
             (double)r1, (double)rf);
    if (C / G * S <= ((int64_t)1 << 18)) {
      tu_assert_bitwise(&m1, &mf, sizeof m1, "widened f16 group: mean vs f32");
      tu_assert_bitwise(&r1, &rf, sizeof r1, "widened f16 group: rstd vs f32");
    }
    double *xd = tu_to_f64(x, T, dt), *yr = tu_dalloc(T), *sc = tu_dalloc(T);
    ref_fwd(yr, sc, NULL, NULL, xd, gamma, beta, N, C, S, G, SN_LAYOUT_NCHW, EPS);
    tu_assert_fwd(y, dt, yr, sc, T, is == 0 ? "f16 group of 2^18: y" : "f16 group beyond 2^18: y");
    free(x), free(y), free(xf), free(yf), free(gamma), free(beta), free(xd), free(yr), free(sc);
  }
}
END_TEST

/* NHWC column sums add each channel's rows in row order, also where narrow rows are summed in
 * blocks of 8 in registers (groupnorm.c, GN_ROW_BLOCK): rows 200, 201, 202 (one block) of
 * channels 0 (in the vector part of the 9 channels) and 8 (the scalar tail) hold 2^60, -2^60 and
 * 100, every other value is 0. In row order the fp64 sum is exactly 100 (2^60 - 2^60 first);
 * any other order within the block adds 100 to ±2^60 first and loses it (ulp 256). So those
 * channels' means are 100/S and the others' 0, and the group mean is their mean in channel order
 * (gn_nhwc_stats); with the same pattern in dy and x = 0 the backward's dbeta is 100 at channels
 * 0 and 8, 0 elsewhere. f32 and bf16 (both blocked at C = 9); one thread. */
START_TEST(test_nhwc_row_order) {
  static const sn_dtype_t dtypes[] = {SN_DTYPE_F32, SN_DTYPE_BF16};
  const sn_dtype_t dt = dtypes[_i];
  enum { C = 9 };
  const int64_t N = 1, G = 1, S = 1000, T = N * C * S, hot[2] = {0, C - 1};
  void *x = tu_alloc(T, dt), *y = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *dx = tu_alloc(T, dt);
  float mean, rstd, dg[C], db[C];
  for (int64_t i = 0; i < T; i++) tu_set(x, i, 0.0, dt), tu_set(dy, i, 0.0, dt);
  const double pattern[3] = {0x1p60, -0x1p60, 100.0};
  for (int h = 0; h < 2; h++)
    for (int k = 0; k < 3; k++) tu_set(x, (200 + k) * C + hot[h], pattern[k], dt);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  tu_poison(y, T, dt);
  ck_assert_int_eq(sn_groupnorm_fwd(y, &mean, &rstd, x, NULL, NULL, N, C, S, G, EPS,
                                    SN_LAYOUT_NHWC, dt), SN_OK);
  double want = 0.0; /* the channel means added in channel order, as gn_nhwc_stats */
  for (int64_t ch = 0; ch < C; ch++) want += ch == hot[0] || ch == hot[1] ? 100.0 / (double)S : 0.0;
  want /= (double)C;
  TU_CHECK(mean == (float)want, "dtype %d: mean %.9g, the rows in order give %.9g", (int)dt,
           (double)mean, want);
  for (int64_t i = 0; i < T; i++) tu_set(x, i, 0.0, dt);
  for (int h = 0; h < 2; h++)
    for (int k = 0; k < 3; k++) tu_set(dy, (200 + k) * C + hot[h], pattern[k], dt);
  tu_poison(dx, T, dt);
  ck_assert_int_eq(sn_groupnorm_bwd(dx, dg, db, dy, x, &mean, &rstd, NULL, N, C, S, G,
                                    SN_LAYOUT_NHWC, dt), SN_OK);
  omp_set_num_threads(saved);
  for (int64_t ch = 0; ch < C; ch++)
    TU_CHECK(db[ch] == (ch == hot[0] || ch == hot[1] ? 100.0f : 0.0f),
             "dtype %d: dbeta[%lld] = %.9g, in row order %g", (int)dt, (long long)ch,
             (double)db[ch], ch == hot[0] || ch == hot[1] ? 100.0 : 0.0);
  free(x), free(y), free(dy), free(dx);
}
END_TEST

/* NHWC sums a sample in fixed pieces of rows and adds the pieces in order, whichever thread
 * summed which (a team shares the sample when it has fewer samples than threads), forward and
 * backward. Here the order shows (channel 0 below); 1, 2 and 3 threads must give the same bits
 * in y, mean, rstd, dx, dgamma and dbeta. The batch is below SN_PAR_MIN, so the shared path runs
 * on a team of one: this checks its order against the per-sample path's; the thread and
 * fallback tests run shared samples on real teams. */
START_TEST(test_nhwc_pieces_threads) {
  const int64_t N = 1, C = 2, G = 1, S = 4099, T = N * C * S;
  tu_rng_t r;
  tu_rng_seed(&r, 33);
  float *x = tu_falloc(T), *dy = tu_falloc(T), *y[3], *mean[3], *rstd[3], *dx[3], *dg[3], *db[3];
  tu_fill_normal(dy, T, SN_DTYPE_F32, 0.0, 1.0, &r);
  /* channel 0: zeros (its pivot, the mean of its first 128 rows, is 0), 2^60 in row 200 (piece
   * 0 of 8), -2^60 in row 1600 (piece 3), and 100 once in each piece: in fp64 (ulp 256 at 2^60)
   * the pieces added forward give 528, backward 768 */
  static const int64_t small_rows[8] = {300, 600, 1100, 1601, 2100, 2600, 3100, 3600};
  for (int64_t s = 0; s < S; s++)
    x[s * C] = 0.0f, x[s * C + 1] = (float)(0.5 + tu_rng_normal(&r));
  x[200 * C] = 0x1p60f, x[1600 * C] = -0x1p60f;
  for (int k = 0; k < 8; k++) x[small_rows[k] * C] = 100.0f;
  const int saved = omp_get_max_threads();
  for (int t = 0; t < 3; t++) {
    omp_set_num_threads(t + 1);
    y[t] = tu_falloc(T), mean[t] = tu_falloc(N * G), rstd[t] = tu_falloc(N * G);
    dx[t] = tu_falloc(T), dg[t] = tu_falloc(C), db[t] = tu_falloc(C);
    tu_poison_f32(y[t], T), tu_poison_f32(dx[t], T);
    ck_assert_int_eq(sn_groupnorm_fwd(y[t], mean[t], rstd[t], x, NULL, NULL, N, C, S, G, EPS,
                                      SN_LAYOUT_NHWC, SN_DTYPE_F32), SN_OK);
    /* the backward from the 1-thread statistics, so that only its own sums can differ */
    ck_assert_int_eq(sn_groupnorm_bwd(dx[t], dg[t], db[t], dy, x, mean[0], rstd[0], NULL, N, C, S,
                                      G, SN_LAYOUT_NHWC, SN_DTYPE_F32), SN_OK);
    tu_assert_all_finite(y[t], SN_DTYPE_F32, T, "pieces: y");
    tu_assert_all_finite(dx[t], SN_DTYPE_F32, T, "pieces: dx");
    if (t == 0) continue;
    tu_assert_bitwise(mean[t], mean[0], sizeof(float), "pieces, threads: mean");
    tu_assert_bitwise(rstd[t], rstd[0], sizeof(float), "pieces, threads: rstd");
    tu_assert_bitwise(y[t], y[0], (size_t)T * sizeof(float), "pieces, threads: y");
    tu_assert_bitwise(dx[t], dx[0], (size_t)T * sizeof(float), "pieces, threads: dx");
    tu_assert_bitwise(dg[t], dg[0], (size_t)C * sizeof(float), "pieces, threads: dgamma");
    tu_assert_bitwise(db[t], db[0], (size_t)C * sizeof(float), "pieces, threads: dbeta");
  }
  omp_set_num_threads(saved);
  for (int t = 0; t < 3; t++)
    free(y[t]), free(mean[t]), free(rstd[t]), free(dx[t]), free(dg[t]), free(db[t]);
  free(x), free(dy);
}
END_TEST

/* GroupNorm statistics, dgamma and dbeta that are NaN are the one NaN NAN (sign and payload 0),
 * and every output is the same for 1, 2 and 3 threads. One NHWC sample is shared by a team of
 * threads when there are fewer samples than threads, whose piece totals are compiled apart from
 * the one-thread path's (this gave a group's rstd −NaN on 1 thread and +NaN on more, without
 * the canonical NaN). x: group 0 (channels 0, 1) holds +NaN and −NaN in rows of different
 * pieces, group 1 (channels 2, 3) only −NaN, group 2 is finite; dy: −NaN in channel 5. So mean
 * and rstd are NaN in groups 0 and 1, dgamma in channels 0-3 and 5, dbeta in channel 5.
 * _i: dtype · 2 + layout. */
START_TEST(test_nan_outputs_one_nan) {
  const sn_dtype_t dt = (sn_dtype_t)(_i / 2);
  const sn_layout_t lay = LAYOUTS[_i % 2];
  enum { N = 1, C = 6, G = 3, S = 300, T = N * C * S };
  tu_rng_t r;
  tu_rng_seed(&r, 1800 + (uint64_t)_i);
  void *x = tu_alloc(T, dt), *dy = tu_alloc(T, dt), *y[3], *dx[3];
  tu_fill_normal(x, T, dt, 1.0, 2.0, &r);
  tu_fill_normal(dy, T, dt, 0.0, 1.0, &r);
  static const int64_t rows[6] = {5, 60, 101, 150, 222, 290}; /* in different pieces */
  for (int k = 0; k < 6; k++) {
    tu_set_special(x, tu_at(lay, 0, k % 2, rows[k], C, S), dt, k % 3 == 0 ? 0 : 1);
    tu_set_special(x, tu_at(lay, 0, 2 + k % 2, rows[k] + 1, C, S), dt, 1);
  }
  tu_set_special(dy, tu_at(lay, 0, 5, 77, C, S), dt, 1);
  float gamma[C], mean[3][G], rstd[3][G], dg[3][C], db[3][C];
  for (int c = 0; c < C; c++) gamma[c] = 1.0f + 0.25f * (float)c;
  const int saved = omp_get_max_threads();
  for (int t = 0; t < 3; t++) {
    omp_set_num_threads(t + 1);
    y[t] = tu_alloc(T, dt), dx[t] = tu_alloc(T, dt);
    memset(y[t], 0xff, (size_t)(T * sn_dtype_size(dt))), memset(dx[t], 0xff, (size_t)(T * sn_dtype_size(dt)));
    memset(mean[t], 0xff, sizeof mean[t]), memset(rstd[t], 0xff, sizeof rstd[t]);
    memset(dg[t], 0xff, sizeof dg[t]), memset(db[t], 0xff, sizeof db[t]);
    ck_assert_int_eq(sn_groupnorm_fwd(y[t], mean[t], rstd[t], x, gamma, NULL, N, C, S, G, EPS, lay,
                                      dt), SN_OK);
    ck_assert_int_eq(sn_groupnorm_bwd(dx[t], dg[t], db[t], dy, x, mean[t], rstd[t], gamma, N, C, S,
                                      G, lay, dt), SN_OK);
    for (int g = 0; g < G; g++)
      ck_assert_msg(tu_one_nan_f32(mean[t][g], g < 2) && tu_one_nan_f32(rstd[t][g], g < 2),
                    "%s, %d threads, group %d: mean %g rstd %g", LNAME[_i % 2], t + 1, g,
                    (double)mean[t][g], (double)rstd[t][g]);
    for (int c = 0; c < C; c++)
      ck_assert_msg(tu_one_nan_f32(dg[t][c], c < 4 || c == 5) && tu_one_nan_f32(db[t][c], c == 5),
                    "%s, %d threads, channel %d: dgamma %g dbeta %g", LNAME[_i % 2], t + 1, c,
                    (double)dg[t][c], (double)db[t][c]);
    if (t == 0) continue;
    tu_assert_bitwise(y[t], y[0], (size_t)(T * sn_dtype_size(dt)), "NaN data, threads: y");
    tu_assert_bitwise(dx[t], dx[0], (size_t)(T * sn_dtype_size(dt)), "NaN data, threads: dx");
  }
  omp_set_num_threads(saved);
  for (int t = 0; t < 3; t++) free(y[t]), free(dx[t]);
  free(x), free(dy);
}
END_TEST

/* NCHW and NHWC of the same batch agree (within the f32 tolerance: the reductions run in a
 * different order, so not bitwise); in place equals out of place bitwise; 1, 2, 3 threads give
 * identical bits. Shapes large enough for the parallel path. */
START_TEST(test_layouts_inplace_threads) {
  /* {1, 300, 150, 1}: fewer samples than threads; {2, 64, 9000, 8}, {2, 64, 3000, 8}: samples
   * above a core's L2 whose share per thread fits it (gn_fwd_split), which NHWC shares between
   * the threads: 2.3 MB f32 where L2 is 2 MiB, 1.15 MB bf16/f16 where it is 1 MiB, 768 KB f32
   * where it is 512 KiB; the other dtypes take a sample per thread there */
  static const int64_t shapes[][4] = {{4, 64, 300, 32}, {3, 65, 97, 5}, {1, 300, 150, 1},
                                      {9, 8, 1000, 4}, {2, 64, 9000, 8}, {2, 64, 3000, 8}};
  tu_rng_t r;
  tu_rng_seed(&r, 24);
  for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
    for (int id = 0; id < 3; id++) {
      const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2], G = shapes[is][3];
      const int64_t T = N * C * S;
      const sn_dtype_t dt = DTYPES[id];
      const size_t bytes = (size_t)(T * sn_dtype_size(dt));
      void *x[2], *dy[2], *y[2][3], *dx[2][3], *buf = tu_alloc(T, dt), *tr = tu_alloc(T, dt);
      float *mean[2][3], *rstd[2][3], *dg[2][3], *db[2][3], *gamma = tu_falloc(C),
          *beta = tu_falloc(C);
      tu_fill_params(gamma, beta, C, &r);
      for (int l = 0; l < 2; l++) x[l] = tu_alloc(T, dt), dy[l] = tu_alloc(T, dt);
      fill_gn(x[0], N, C, S, SN_LAYOUT_NCHW, dt, 0.5, 2.0, &r);
      tu_fill_normal(dy[0], T, dt, 0.0, 1.0, &r);
      tu_transpose(x[1], SN_LAYOUT_NHWC, x[0], SN_LAYOUT_NCHW, N, C, S, dt);
      tu_transpose(dy[1], SN_LAYOUT_NHWC, dy[0], SN_LAYOUT_NCHW, N, C, S, dt);
      for (int l = 0; l < 2; l++) {
        const int saved = omp_get_max_threads();
        for (int t = 0; t < 3; t++) {
          omp_set_num_threads(t + 1);
          y[l][t] = tu_alloc(T, dt), dx[l][t] = tu_alloc(T, dt);
          mean[l][t] = tu_falloc(N * G), rstd[l][t] = tu_falloc(N * G);
          dg[l][t] = tu_falloc(C), db[l][t] = tu_falloc(C);
          tu_poison(y[l][t], T, dt), tu_poison(dx[l][t], T, dt);
          ck_assert_int_eq(sn_groupnorm_fwd(y[l][t], mean[l][t], rstd[l][t], x[l], gamma, beta, N, C, S, G, EPS, LAYOUTS[l], dt), SN_OK);
          ck_assert_int_eq(sn_groupnorm_bwd(dx[l][t], dg[l][t], db[l][t], dy[l], x[l], mean[l][t], rstd[l][t], gamma, N, C, S, G, LAYOUTS[l], dt), SN_OK);
          if (t == 0) continue;
          tu_assert_bitwise(y[l][t], y[l][0], bytes, "threads: y");
          tu_assert_bitwise(dx[l][t], dx[l][0], bytes, "threads: dx");
          tu_assert_bitwise(mean[l][t], mean[l][0], (size_t)(N * G) * 4, "threads: mean");
          tu_assert_bitwise(rstd[l][t], rstd[l][0], (size_t)(N * G) * 4, "threads: rstd");
          tu_assert_bitwise(dg[l][t], dg[l][0], (size_t)C * 4, "threads: dgamma");
          tu_assert_bitwise(db[l][t], db[l][0], (size_t)C * 4, "threads: dbeta");
        }
        omp_set_num_threads(saved);
        memcpy(buf, x[l], bytes); /* in place */
        ck_assert_int_eq(sn_groupnorm_fwd(buf, NULL, NULL, buf, gamma, beta, N, C, S, G, EPS, LAYOUTS[l], dt), SN_OK);
        tu_assert_bitwise(buf, y[l][0], bytes, "in-place fwd");
        memcpy(buf, dy[l], bytes);
        ck_assert_int_eq(sn_groupnorm_bwd(buf, NULL, NULL, buf, x[l], mean[l][0], rstd[l][0], gamma, N, C, S, G, LAYOUTS[l], dt), SN_OK);
        tu_assert_bitwise(buf, dx[l][0], bytes, "in-place bwd");
      }
      /* NHWC result transposed vs NCHW: normwise within twice the forward/backward tolerance */
      double *ref = tu_to_f64(y[0][0], T, dt);
      tu_transpose(tr, SN_LAYOUT_NCHW, y[1][0], SN_LAYOUT_NHWC, N, C, S, dt);
      tu_assert_rel(tr, dt, ref, T, dt == SN_DTYPE_F32 ? 2 * TU_RTOL_F32_FWD : tu_rtol_half_bwd(dt),
          "NHWC vs NCHW y");
      free(ref);
      ref = tu_to_f64(dx[0][0], T, dt);
      tu_transpose(tr, SN_LAYOUT_NCHW, dx[1][0], SN_LAYOUT_NHWC, N, C, S, dt);
      tu_assert_rel(tr, dt, ref, T, dt == SN_DTYPE_F32 ? 2 * TU_RTOL_F32_BWD : tu_rtol_half_bwd(dt),
          "NHWC vs NCHW dx");
      free(ref);
      for (int l = 0; l < 2; l++) {
        for (int t = 0; t < 3; t++)
          free(y[l][t]), free(dx[l][t]), free(mean[l][t]), free(rstd[l][t]), free(dg[l][t]), free(db[l][t]);
        free(x[l]), free(dy[l]);
      }
      free(buf), free(tr), free(gamma), free(beta);
    }
}
END_TEST

/* Empty batches (n = 0 or s = 0, NULL activations) are SN_OK and write nothing but zero
 * parameter gradients (the gradient of an empty batch). */
START_TEST(test_empty_batch) {
  float mean[6], rstd[6], dg[4], db[4];
  tu_poison_f32(mean, 6), tu_poison_f32(rstd, 6), tu_poison_f32(dg, 4), tu_poison_f32(db, 4);
  ck_assert_int_eq(sn_groupnorm_fwd(NULL, mean, rstd, NULL, NULL, NULL, 0, 4, 9, 2, EPS, SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
  ck_assert_int_eq(sn_groupnorm_fwd(NULL, mean, rstd, NULL, NULL, NULL, 3, 4, 0, 2, EPS, SN_LAYOUT_NHWC, SN_DTYPE_BF16), SN_OK);
  ck_assert_int_eq(sn_groupnorm_bwd(NULL, dg, db, NULL, NULL, NULL, NULL, NULL, 0, 4, 9, 2, SN_LAYOUT_NHWC, SN_DTYPE_F16), SN_OK);
  ck_assert_int_eq(sn_groupnorm_bwd(NULL, dg, db, NULL, NULL, NULL, NULL, NULL, 3, 4, 0, 2, SN_LAYOUT_NCHW, SN_DTYPE_F32), SN_OK);
  for (int i = 0; i < 6; i++) ck_assert_msg(isnan(mean[i]) && isnan(rstd[i]), "empty batch wrote mean/rstd");
  for (int i = 0; i < 4; i++) ck_assert_msg(dg[i] == 0.0f && db[i] == 0.0f, "empty batch: dgamma/dbeta not zeroed");
}
END_TEST

/* Each bad input returns its code, a message naming the function, and writes nothing. */
typedef struct {
  float y[24], dx[24], mean[4], rstd[4], dg[4], db[4];
} outs_t;

static void check_bad(sn_status_t got, sn_status_t want, const char *fn, const outs_t *o,
                      const outs_t *o0, const char *what) {
  ck_assert_msg(got == want, "%s: got %s, want %s (%s)", what, sn_status_string(got),
                sn_status_string(want), sn_last_error());
  ck_assert_msg(strncmp(sn_last_error(), fn, strlen(fn)) == 0, "%s: message '%s'", what, sn_last_error());
  tu_assert_bitwise(o, o0, sizeof *o, what);
}

START_TEST(test_bad_inputs) {
  float x[24], dy[24], g[4] = {1, 1, 1, 1}, m[4] = {0}, rs[4] = {1, 1, 1, 1};
  for (int i = 0; i < 24; i++) x[i] = (float)i, dy[i] = 1.0f;
  outs_t o, o0;
  memset(&o, 0xA5, sizeof o);
  memcpy(&o0, &o, sizeof o);
  const sn_layout_t L = SN_LAYOUT_NHWC, BADL = (sn_layout_t)-1;
  const sn_dtype_t D = SN_DTYPE_BF16, F64 = SN_DTYPE_F64;
  const int64_t big = (int64_t)1 << 22;
  const char *ff = "sn_groupnorm_fwd", *fb = "sn_groupnorm_bwd";
  /* N = 2, C = 4, S = 3, G = 2 */
  check_bad(sn_groupnorm_fwd(NULL, o.mean, o.rstd, x, g, g, 2, 4, 3, 2, EPS, L, D), SN_ERR_NULL_POINTER, ff, &o, &o0, "fwd y NULL");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, NULL, g, g, 2, 4, 3, 2, EPS, L, D), SN_ERR_NULL_POINTER, ff, &o, &o0, "fwd x NULL");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 0, 3, 2, EPS, L, D), SN_ERR_INVALID_SIZE, ff, &o, &o0, "fwd c 0");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, -2, 4, 3, 2, EPS, L, D), SN_ERR_INVALID_SIZE, ff, &o, &o0, "fwd n -2");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, -3, 2, EPS, L, D), SN_ERR_INVALID_SIZE, ff, &o, &o0, "fwd s -3");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, 3, 0, EPS, L, D), SN_ERR_INVALID_SIZE, ff, &o, &o0, "fwd groups 0");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, 3, -2, EPS, L, D), SN_ERR_INVALID_SIZE, ff, &o, &o0, "fwd groups -2");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, 3, 3, EPS, L, D), SN_ERR_INVALID_GROUPS, ff, &o, &o0, "fwd c % groups");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, 3, 8, EPS, L, D), SN_ERR_INVALID_GROUPS, ff, &o, &o0, "fwd groups > c");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, big, big, big, 1, EPS, L, D), SN_ERR_OVERFLOW, ff, &o, &o0, "fwd overflow");
  const float bad_eps[4] = {0.0f, -1.0f, NAN, -INFINITY};
  for (int i = 0; i < 4; i++)
    check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, 3, 2, bad_eps[i], L, D), SN_ERR_INVALID_EPS, ff, &o, &o0, "fwd eps");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, 3, 2, EPS, BADL, D), SN_ERR_INVALID_LAYOUT, ff, &o, &o0, "fwd layout");
  check_bad(sn_groupnorm_fwd(o.y, o.mean, o.rstd, x, g, g, 2, 4, 3, 2, EPS, L, F64), SN_ERR_INVALID_DTYPE, ff, &o, &o0, "fwd f64");
  check_bad(sn_groupnorm_fwd(NULL, o.mean, o.rstd, NULL, g, g, 0, 4, 3, 3, EPS, L, D), SN_ERR_INVALID_GROUPS, ff, &o, &o0, "fwd empty, c % groups");
  check_bad(sn_groupnorm_bwd(NULL, o.dg, o.db, dy, x, m, rs, g, 2, 4, 3, 2, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd dx NULL");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, NULL, x, m, rs, g, 2, 4, 3, 2, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd dy NULL");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, NULL, m, rs, g, 2, 4, 3, 2, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd x NULL");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, NULL, rs, g, 2, 4, 3, 2, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd mean NULL");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, m, NULL, g, 2, 4, 3, 2, L, D), SN_ERR_NULL_POINTER, fb, &o, &o0, "bwd rstd NULL");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 4, 3, 0, L, D), SN_ERR_INVALID_SIZE, fb, &o, &o0, "bwd groups 0");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 4, 3, 3, L, D), SN_ERR_INVALID_GROUPS, fb, &o, &o0, "bwd c % groups");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, -4, 3, 2, L, D), SN_ERR_INVALID_SIZE, fb, &o, &o0, "bwd c -4");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, big, big, big, 1, L, D), SN_ERR_OVERFLOW, fb, &o, &o0, "bwd overflow");
  /* an empty batch with c beyond int64 byte counts: dgamma, dbeta (c elements) not written */
  check_bad(sn_groupnorm_bwd(NULL, o.dg, o.db, NULL, NULL, NULL, NULL, g, 0, INT64_MAX / 4, 3, 1, L, D), SN_ERR_OVERFLOW, fb, &o, &o0, "bwd empty, c huge");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 4, 3, 2, BADL, D), SN_ERR_INVALID_LAYOUT, fb, &o, &o0, "bwd layout");
  check_bad(sn_groupnorm_bwd(o.dx, o.dg, o.db, dy, x, m, rs, g, 2, 4, 3, 2, L, (sn_dtype_t)4), SN_ERR_INVALID_DTYPE, fb, &o, &o0, "bwd dtype");
}
END_TEST

int main(void) {
  Suite *s = suite_create("groupnorm");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_fwd_bwd_vs_ref);
  tcase_add_test(tc, test_bwd_vs_fd);
  tcase_add_test(tc, test_adversarial);
  tcase_add_test(tc, test_near_f32_max);
  tcase_add_test(tc, test_wide_factor_channels);
  tcase_add_test(tc, test_beta_cancels);
  tcase_add_test(tc, test_shift_fallback);
  tcase_add_loop_test(tc, test_lowp_nchw_matches_f32, 0, 2);
  tcase_add_test(tc, test_f16_nchw_large_group);
  tcase_add_loop_test(tc, test_nhwc_row_order, 0, 2);
  tcase_add_test(tc, test_nhwc_pieces_threads);
  tcase_add_loop_test(tc, test_nan_outputs_one_nan, 0, 6);
  tcase_add_test(tc, test_layouts_inplace_threads);
  tcase_add_test(tc, test_empty_batch);
  tcase_add_test(tc, test_bad_inputs);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
