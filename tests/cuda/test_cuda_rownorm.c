/*
 * test_cuda_rownorm.c — the CUDA LayerNorm/RMSNorm kernels (sn_cuda_layernorm_fwd/bwd,
 * sn_cuda_add_layernorm_fwd, sn_cuda_rmsnorm_fwd/bwd, sn_cuda_add_rmsnorm_fwd) against the CPU
 * functions of the same name on the same inputs: every element compared, outputs poisoned
 * (NaN) before each call, f32/bf16/f16, odd sizes (1, 3, 7, 65, 4100, 16385: the scalar and
 * long-row paths), gamma/beta/mean/rstd NULL, in place, unaligned rows, adversarial rows (the
 * issue's example, |mean| ≫ σ, constant rows, values near 6e4, the fused kernels' cancelling
 * sums), bad arguments, the empty batch, bitwise determinism of dgamma/dbeta, and one batch of
 * more than 2^31 elements. SKIPPED (exit 77) without a CUDA device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudatest.h"

static const int64_t ROWS[] = {1, 3, 1000};
/* 4100: bf16/f16 rows not 16-byte multiples (scalar path) beyond the backward's scalar register
 * rows (4096); 16384: the forward's largest register rows (vector); 16385: the long-row
 * kernels, scalar. */
static const int64_t DS[] = {1, 2, 3, 7, 64, 65, 4096, 4100, 16384, 16385};
#define NROWS (int)(sizeof ROWS / sizeof ROWS[0])
#define ND (int)(sizeof DS / sizeof DS[0])
/* rows = 1000 only up to this d: the whole suite stays well under a minute */
#define BIG_ROWS_MAX_D 4096
static const float EPS = 1e-5f;

/* ---- tolerances --------------------------------------------------------------------------- */
/* f32 outputs: |got − ref| ≤ atol + F32_RTOL·|ref|. Both sides are within a few f32 roundings
 * (2^-24 ≈ 6e-8 each) of the exact value, relative to the terms: 1e-5 leaves a wide margin. */
#define F32_RTOL 1e-5
/* f32 forward atol, times max|y| + max|beta|: where beta cancels x̂·gamma the CPU's f32 map errs
 * by ~5 roundings (3e-7) of |x̂·gamma|, not of |y|. */
#define FWD_ATOL 1e-6
/* backward atol, times max|rstd·dy·gamma| over the batch: the CPU computes dx in f32 from terms
 * up to max|x̂|·|rstd·g| (|x̂| ≤ ~5 for these data), a few roundings each; for d = 2 dx cancels
 * to ~eps/var of its terms, so only an absolute bound relative to the terms holds. */
#define BWD_ATOL 1e-5
/* bf16/f16 y: both sides at the forward bound (testutil.h TU_LOWP_SCALE_TOL), so within
 * tu_lowp_pair_ok of each other, with the scale of fwd_scale. bf16/f16 dx: at most HALF_ULPS ulp
 * apart, or atol + that (see check_act). */
#define HALF_ULPS 2.0
/* Saved mean/rstd: both sides round an fp64 value (accurate to ~2^-45) to f32, at most 1 f32
 * ulp apart (1.2e-7); the CPU's RMSNorm rstd of bf16/f16 rows is only accurate to 2^-20.9
 * (f32 blocks, syncnorm.h), so 2e-6. STAT_ATOL: a mean of ~0 whose fp64 values differ in
 * their last bits. */
#define STAT_RTOL 2e-6
#define STAT_ATOL 1e-9
/* dgamma/dbeta, normwise: the CPU's are checked to 2^-19 (1.9e-6) of their fp64 value. */
#define PARAM_RTOL 1e-5
/* The issue's example: the stated values are given to 6 decimals. */
#define EXAMPLE_ATOL 1e-5

enum { OP_LN, OP_ADD_LN, OP_RMS, OP_ADD_RMS };
static const char *const op_name[] = {"layernorm", "add_layernorm", "rmsnorm", "add_rmsnorm"};

/* ---- helpers ------------------------------------------------------------------------------ */

static size_t nbytes(int64_t n, sn_dtype_t dt) { return (size_t)n * (size_t)sn_dtype_size(dt); }

static void *host_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  ck_assert(p != NULL);
  return p;
}

static float *random_f32(int64_t n, double mean, double std, tu_rng_t *rng) {
  float *v = host_alloc((size_t)n * sizeof(float));
  tu_fill_normal(v, n, SN_DTYPE_F32, mean, std, rng);
  return v;
}

static void expect_ok(sn_status_t st, const char *what) {
  ck_assert_msg(st == SN_OK, "%s: %s (%s)", what, sn_status_string(st), sn_last_error());
}

static void expect_status(sn_status_t st, sn_status_t want, const char *what) {
  ck_assert_msg(st == want, "%s: got %s, want %s (%s)", what, sn_status_string(st),
                sn_status_string(want), sn_last_error());
}

static double max_abs_dt(const void *buf, int64_t n, sn_dtype_t dt) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double v = fabs(tu_get(buf, i, dt));
    if (v > m && v <= 1e300) m = v; /* NaN and inf skipped */
  }
  return m;
}

/* |x̂·gamma| + |beta| of each element of x [rows, d] (dt) in fp64, x̂ from the row's two-pass
 * mean and variance (ln) or its mean square (RMSNorm): the scale of the bf16/f16 forward bound.
 * beta may be NULL. Where it is not finite (rows holding NaN or inf) it is 0. Free with free(). */
static double *fwd_scale(const void *x, const float *gamma, const float *beta, int64_t rows,
                         int64_t d, int ln, sn_dtype_t dt) {
  double *sc = host_alloc((size_t)(rows * d) * sizeof(double));
  for (int64_t r = 0; r < rows; r++) {
    double m = 0.0, v = 0.0;
    if (ln) {
      for (int64_t i = 0; i < d; i++) m += tu_get(x, r * d + i, dt);
      m /= (double)d;
    }
    for (int64_t i = 0; i < d; i++) {
      const double e = tu_get(x, r * d + i, dt) - m;
      v += e * e;
    }
    const double rs = 1.0 / sqrt(v / (double)d + EPS);
    for (int64_t i = 0; i < d; i++) {
      const double t = fabs((tu_get(x, r * d + i, dt) - m) * rs * (gamma ? gamma[i] : 1.0)) +
                       fabs(beta ? beta[i] : 0.0);
      sc[r * d + i] = isfinite(t) ? t : 0.0;
    }
  }
  return sc;
}

/* Every element of got (device result, downloaded) against ref (the CPU result), both [n] dt:
 * a NaN reference wants a NaN; f32: |g − r| ≤ atol + F32_RTOL·|r|; bf16/f16 forwards (scale:
 * fwd_scale's, per element): tu_lowp_pair_ok; bf16/f16 backwards (scale NULL): within HALF_ULPS
 * ulp, or |g − r| ≤ atol + HALF_ULPS ulp. */
static void check_act(const void *got, const void *ref, const double *scale, int64_t n,
                      sn_dtype_t dt, double atol, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    const double g = tu_get(got, i, dt), r = tu_get(ref, i, dt);
    if (isnan(r)) {
      TU_CHECK(isnan(g), "%s (%s): element %lld = %.9g, CPU NaN", what, tu_dtype_name[dt],
               (long long)i, g);
      continue;
    }
    if (g == r) continue;
    const double err = fabs(g - r);
    int ok;
    if (dt == SN_DTYPE_F32) {
      ok = err <= atol + F32_RTOL * fabs(r);
    } else if (scale != NULL) {
      ok = tu_lowp_pair_ok(g, r, scale[i], dt);
    } else {
      const double u = tu_ulp_diff(g, r, dt);
      ok = u <= HALF_ULPS || (isfinite(u) && err <= atol + HALF_ULPS * (err / u));
    }
    TU_CHECK(ok, "%s (%s): element %lld = %.9g, CPU %.9g (atol %.3g)", what, tu_dtype_name[dt],
             (long long)i, g, r, atol);
  }
}

static void check_stat(const float *got, const float *ref, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    const double g = got[i], r = ref[i];
    if (g == r) continue;
    if (!isfinite(r)) { /* a row holding NaN or inf: NaN or inf statistics, whichever */
      TU_CHECK(!isfinite(g), "%s row %lld: %.9g, CPU %.9g", what, (long long)i, g, r);
      continue;
    }
    TU_CHECK(fabs(g - r) <= STAT_ATOL + STAT_RTOL * fabs(r), "%s row %lld: %.9g, CPU %.9g",
             what, (long long)i, g, r);
  }
}

static void check_param(const float *got, const float *ref, int64_t n, const char *what) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double e = (double)got[i] - (double)ref[i];
    num += e * e;
    den += (double)ref[i] * (double)ref[i];
  }
  const double rel = sqrt(num) / fmax(sqrt(den), 1e-300);
  ck_assert_msg(rel <= PARAM_RTOL, "%s: normwise relative error %.3e > %.1e", what, rel,
                PARAM_RTOL);
}

static void check_poisoned(const void *dev, size_t bytes, const char *what) {
  unsigned char *h = host_alloc(bytes);
  ct_download(h, dev, bytes);
  for (size_t i = 0; i < bytes; i++)
    TU_CHECK(h[i] == 0xFF, "%s: byte %zu written (0x%02x) by a failing call", what, i, h[i]);
  free(h);
}

/* ---- forward ------------------------------------------------------------------------------ */

/* The CPU or CUDA forward of op: y, sum_out (fused), mean (LayerNorm), rstd, x, res (fused),
 * gamma, beta (LayerNorm). dev: call the CUDA function on stream 0. */
static sn_status_t run_fwd(int op, int dev, void *y, void *sum_out, float *mean, float *rstd,
                           const void *x, const void *res, const float *gamma, const float *beta,
                           int64_t rows, int64_t d, float eps, sn_dtype_t dt) {
  switch (op) {
    case OP_LN:
      return dev ? sn_cuda_layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, d, eps, dt, 0)
                 : sn_layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, d, eps, dt);
    case OP_ADD_LN:
      return dev ? sn_cuda_add_layernorm_fwd(y, sum_out, mean, rstd, x, res, gamma, beta, rows, d,
                                             eps, dt, 0)
                 : sn_add_layernorm_fwd(y, sum_out, mean, rstd, x, res, gamma, beta, rows, d,
                                        eps, dt);
    case OP_RMS:
      return dev ? sn_cuda_rmsnorm_fwd(y, rstd, x, gamma, rows, d, eps, dt, 0)
                 : sn_rmsnorm_fwd(y, rstd, x, gamma, rows, d, eps, dt);
    default:
      return dev ? sn_cuda_add_rmsnorm_fwd(y, sum_out, rstd, x, res, gamma, rows, d, eps, dt, 0)
                 : sn_add_rmsnorm_fwd(y, sum_out, rstd, x, res, gamma, rows, d, eps, dt);
  }
}

typedef struct {
  int gamma, beta, stats; /* pass gamma / beta (LayerNorm) / mean and rstd */
  int in_place;           /* y = x (plain), sum_out = x (fused) */
  int res_in_place;       /* fused: sum_out = residual instead */
  int64_t misalign;       /* device x, y, sum_out, residual start this many elements in */
} fwd_opts_t;

/* One forward case: x (and res, fused) [rows, d] given on the host; the CPU function on host
 * copies is the reference; the CUDA function on uploaded copies, outputs poisoned; every output
 * compared. */
static void fwd_case(int op, sn_dtype_t dt, int64_t rows, int64_t d, const void *x,
                     const void *res, const float *gamma, const float *beta, fwd_opts_t o,
                     const char *what) {
  const int fused = op == OP_ADD_LN || op == OP_ADD_RMS, ln = op == OP_LN || op == OP_ADD_LN;
  const int64_t n = rows * d, mis = o.misalign;
  const size_t ab = nbytes(n, dt), off = nbytes(mis, dt);
  const float *g = o.gamma ? gamma : NULL, *b = o.beta && ln ? beta : NULL;
  /* reference */
  void *y_ref = host_alloc(ab), *sum_ref = fused ? host_alloc(ab) : NULL;
  float *mean_ref = host_alloc((size_t)rows * sizeof(float));
  float *rstd_ref = host_alloc((size_t)rows * sizeof(float));
  expect_ok(run_fwd(op, 0, y_ref, sum_ref, ln ? mean_ref : NULL, rstd_ref, x, res, g, b, rows, d,
                    EPS, dt),
            "CPU reference");
  /* device */
  char *dx_base = ct_alloc_poison(ab + off), *dres_base = fused ? ct_alloc_poison(ab + off) : NULL;
  void *dxp = dx_base + off, *dresp = fused ? dres_base + off : NULL;
  ck_assert(cudaMemcpy(dxp, x, ab, cudaMemcpyHostToDevice) == cudaSuccess);
  if (fused) ck_assert(cudaMemcpy(dresp, res, ab, cudaMemcpyHostToDevice) == cudaSuccess);
  float *dgamma = g ? ct_upload(g, (size_t)d * sizeof(float)) : NULL;
  float *dbeta = b ? ct_upload(b, (size_t)d * sizeof(float)) : NULL;
  float *dmean = o.stats && ln ? ct_alloc_poison((size_t)rows * sizeof(float)) : NULL;
  float *drstd = o.stats ? ct_alloc_poison((size_t)rows * sizeof(float)) : NULL;
  char *dy_base = NULL, *dsum_base = NULL;
  void *dyp, *dsump = NULL;
  if (!fused && o.in_place) {
    dyp = dxp;
  } else {
    dy_base = ct_alloc_poison(ab + off);
    dyp = dy_base + off;
  }
  if (fused) {
    if (o.in_place) dsump = dxp;
    else if (o.res_in_place) dsump = dresp;
    else {
      dsum_base = ct_alloc_poison(ab + off);
      dsump = dsum_base + off;
    }
  }
  expect_ok(run_fwd(op, 1, dyp, dsump, dmean, drstd, dxp, dresp, dgamma, dbeta, rows, d, EPS, dt),
            what);
  void *y_got = host_alloc(ab);
  ct_download(y_got, dyp, ab);
  const double scale = max_abs_dt(y_ref, n, dt) + (b ? max_abs_dt(b, d, SN_DTYPE_F32) : 0.0);
  double *sc = fwd_scale(fused ? sum_ref : x, g, b, rows, d, ln, dt);
  check_act(y_got, y_ref, sc, n, dt, dt == SN_DTYPE_F32 ? FWD_ATOL * scale : 0.0, what);
  free(sc);
  if (fused) {
    void *sum_got = host_alloc(ab);
    ct_download(sum_got, dsump, ab);
    /* exact, and NaN where it is NaN (not bitwise: the NaN's bits may differ) */
    tu_assert_residual_sum(sum_got, x, res, n, dt, what);
    free(sum_got);
  }
  if (o.stats) {
    float *s_got = host_alloc((size_t)rows * sizeof(float));
    if (ln) {
      ct_download(s_got, dmean, (size_t)rows * sizeof(float));
      check_stat(s_got, mean_ref, rows, "mean");
    }
    ct_download(s_got, drstd, (size_t)rows * sizeof(float));
    check_stat(s_got, rstd_ref, rows, "rstd");
    free(s_got);
  }
  free(y_got);
  free(y_ref);
  free(sum_ref);
  free(mean_ref);
  free(rstd_ref);
  ct_free(dx_base);
  ct_free(dres_base);
  ct_free(dy_base);
  ct_free(dsum_base);
  ct_free(dgamma);
  ct_free(dbeta);
  ct_free(dmean);
  ct_free(drstd);
}

/* Random x, residual N(0.5, 2), gamma N(1, 0.5), beta N(0, 1). */
static void fwd_random(int op, sn_dtype_t dt, int64_t rows, int64_t d, fwd_opts_t o,
                       tu_rng_t *rng, const char *what) {
  const int64_t n = rows * d;
  void *x = host_alloc(nbytes(n, dt)), *res = host_alloc(nbytes(n, dt));
  tu_fill_normal(x, n, dt, 0.5, 2.0, rng);
  tu_fill_normal(res, n, dt, 0.5, 2.0, rng);
  float *gamma = random_f32(d, 1.0, 0.5, rng), *beta = random_f32(d, 0.0, 1.0, rng);
  fwd_case(op, dt, rows, d, x, res, gamma, beta, o, what);
  free(x);
  free(res);
  free(gamma);
  free(beta);
}

/* Every op, shape and dtype (_i: the dtype): all arguments given; in rows = 3, also gamma, beta
 * and the statistics NULL with the call in place (plain: y = x; fused: sum_out = x for odd d,
 * = residual for even d), and gamma without beta. */
START_TEST(test_fwd_shapes) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  tu_rng_t rng;
  tu_rng_seed(&rng, 100 + (uint64_t)_i);
  char what[128];
  for (int op = 0; op < 4; op++)
    for (int ri = 0; ri < NROWS; ri++)
      for (int di = 0; di < ND; di++) {
        const int64_t rows = ROWS[ri], d = DS[di];
        if (rows > 3 && d > BIG_ROWS_MAX_D) continue;
        fwd_opts_t o = {1, 1, 1, 0, 0, 0};
        snprintf(what, sizeof what, "%s rows %lld d %lld", op_name[op], (long long)rows,
                 (long long)d);
        fwd_random(op, dt, rows, d, o, &rng, what);
        if (rows == 3) {
          const int fused = op == OP_ADD_LN || op == OP_ADD_RMS;
          fwd_opts_t p = {0, 0, 0, !fused || d % 2 == 1, fused && d % 2 == 0, 0};
          snprintf(what, sizeof what, "%s rows %lld d %lld, no params, in place", op_name[op],
                   (long long)rows, (long long)d);
          fwd_random(op, dt, rows, d, p, &rng, what);
          fwd_opts_t q = {1, 0, 1, 0, 0, 0}; /* gamma without beta */
          fwd_random(op, dt, rows, d, q, &rng, what);
        }
      }
}
END_TEST

/* Rows whose pointers are not 16-byte aligned (one element in) take the scalar path. */
START_TEST(test_fwd_unaligned) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  tu_rng_t rng;
  tu_rng_seed(&rng, 200 + (uint64_t)_i);
  static const int64_t ds[] = {64, 4096};
  for (int op = 0; op < 4; op++)
    for (int k = 0; k < 2; k++) {
      fwd_opts_t o = {1, 1, 1, 0, 0, 1};
      fwd_random(op, dt, 5, ds[k], o, &rng, "unaligned rows");
    }
}
END_TEST

/* The issue's example: LayerNorm of [2000, 2001, 2002, 2003], eps 1e-5 (f32). */
START_TEST(test_issue_example) {
  const float x[4] = {2000.0f, 2001.0f, 2002.0f, 2003.0f};
  const double want[4] = {-1.341635, -0.447212, 0.447212, 1.341635};
  void *dx = ct_upload(x, sizeof x), *dy = ct_alloc_poison(sizeof x);
  expect_ok(sn_cuda_layernorm_fwd(dy, NULL, NULL, dx, NULL, NULL, 1, 4, 1e-5f, SN_DTYPE_F32, 0),
            "example");
  float y[4];
  ct_download(y, dy, sizeof y);
  for (int i = 0; i < 4; i++)
    ck_assert_msg(fabs((double)y[i] - want[i]) <= EXAMPLE_ATOL, "y[%d] = %.7f, want %.6f", i,
                  (double)y[i], want[i]);
  ct_free(dx);
  ct_free(dy);
}
END_TEST

/* mean 1e4, σ 1e-2 (f32: the f32 ulp at 1e4 is 1e-3, a tenth of σ): forward and backward. */
START_TEST(test_large_mean) {
  tu_rng_t rng;
  tu_rng_seed(&rng, 300);
  const int64_t rows = 3, d = 4096;
  void *x = host_alloc(nbytes(rows * d, SN_DTYPE_F32));
  tu_fill_normal(x, rows * d, SN_DTYPE_F32, 1e4, 1e-2, &rng);
  float *gamma = random_f32(d, 1.0, 0.5, &rng), *beta = random_f32(d, 0.0, 1.0, &rng);
  for (int op = 0; op < 4; op++) {
    fwd_opts_t o = {1, 1, 1, 0, 0, 0};
    fwd_case(op, SN_DTYPE_F32, rows, d, x, x, gamma, beta, o, "mean 1e4, sigma 1e-2");
  }
  free(x);
  free(gamma);
  free(beta);
}
END_TEST

/* Constant rows: var = 0, y = beta exactly (rounded to the dtype), no NaN. */
START_TEST(test_constant_rows) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  tu_rng_t rng;
  tu_rng_seed(&rng, 400 + (uint64_t)_i);
  const int64_t rows = 3, d = 65, n = rows * d;
  void *x = host_alloc(nbytes(n, dt)), *y = host_alloc(nbytes(n, dt));
  for (int64_t i = 0; i < n; i++) tu_set(x, i, 3.5 * (double)(i / d + 1), dt);
  float *gamma = random_f32(d, 1.0, 0.5, &rng), *beta = random_f32(d, 0.0, 1.0, &rng);
  void *dxp = ct_upload(x, nbytes(n, dt)), *dyp = ct_alloc_poison(nbytes(n, dt));
  float *dg = ct_upload(gamma, (size_t)d * 4), *db = ct_upload(beta, (size_t)d * 4);
  expect_ok(sn_cuda_layernorm_fwd(dyp, NULL, NULL, dxp, dg, db, rows, d, EPS, dt, 0),
            "constant rows");
  ct_download(y, dyp, nbytes(n, dt));
  for (int64_t i = 0; i < n; i++) {
    const double want = tu_round((double)beta[i % d], dt), got = tu_get(y, i, dt);
    TU_CHECK(got == want, "constant rows (%s): y[%lld] = %.9g, want beta %.9g",
             tu_dtype_name[dt], (long long)i, got, want);
  }
  fwd_opts_t o = {1, 1, 1, 0, 0, 0};
  fwd_case(OP_LN, dt, rows, d, x, x, gamma, beta, o, "constant rows vs CPU");
  fwd_case(OP_RMS, dt, rows, d, x, x, gamma, beta, o, "constant rows vs CPU");
  free(x);
  free(y);
  free(gamma);
  free(beta);
  ct_free(dxp);
  ct_free(dyp);
  ct_free(dg);
  ct_free(db);
}
END_TEST

/* bf16/f16 values near 6e4 (the f16 range ends at 65504), and the fused kernels' adversarial
 * rows (tu_fill_add_adversarial: a cancelling sum, a sorted row; rows 2-3, NaN and overflowing
 * sums, are compared for sum_out and for y's NaN wherever the CPU's is NaN). */
START_TEST(test_near_half_max) {
  const sn_dtype_t dt = _i == 0 ? SN_DTYPE_BF16 : SN_DTYPE_F16;
  tu_rng_t rng;
  tu_rng_seed(&rng, 500 + (uint64_t)_i);
  const int64_t rows = 4, d = 1000, n = rows * d;
  void *x = host_alloc(nbytes(n, dt)), *res = host_alloc(nbytes(n, dt));
  for (int64_t i = 0; i < n; i++)
    tu_set(x, i, (i % 2 ? 1 : -1) * (6e4 - 2e3 * tu_rng_uniform(&rng)), dt);
  tu_fill_normal(res, n, dt, 0.0, 1.0, &rng);
  float *gamma = random_f32(d, 1.0, 0.5, &rng), *beta = random_f32(d, 0.0, 1.0, &rng);
  fwd_opts_t o = {1, 1, 1, 0, 0, 0};
  fwd_case(OP_LN, dt, rows, d, x, res, gamma, beta, o, "near 6e4");
  fwd_case(OP_RMS, dt, rows, d, x, res, gamma, beta, o, "near 6e4");
  tu_fill_add_adversarial(x, res, d, dt, &rng);
  fwd_case(OP_ADD_LN, dt, rows, d, x, res, gamma, beta, o, "add adversarial");
  fwd_case(OP_ADD_RMS, dt, rows, d, x, res, gamma, beta, o, "add adversarial");
  free(x);
  free(res);
  free(gamma);
  free(beta);
}
END_TEST

/* beta[i] = −round_f32(x̂·gamma[i]) of row 0 of x [rows, d] (dt), x̂ from its fp64 two-pass
 * statistics: y of row 0 is ~2^-24 of its terms. */
static void cancelling_beta(float *beta, const void *x, const float *gamma, int64_t d,
                            sn_dtype_t dt) {
  double m = 0.0, v = 0.0;
  for (int64_t i = 0; i < d; i++) m += tu_get(x, i, dt);
  m /= (double)d;
  for (int64_t i = 0; i < d; i++) v += (tu_get(x, i, dt) - m) * (tu_get(x, i, dt) - m);
  const double rs = 1.0 / sqrt(v / (double)d + EPS);
  for (int64_t i = 0; i < d; i++) beta[i] = -(float)((tu_get(x, i, dt) - m) * rs * gamma[i]);
}

/* LayerNorm and the fused add-LayerNorm with a beta that cancels x̂·gamma of row 0
 * (cancelling_beta; fused: of x + residual rounded as the kernel rounds it), against the CPU:
 * the short-row, register-row and long-row kernels. _i: the dtype. */
START_TEST(test_beta_cancels) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  static const int64_t ds[] = {7, 300, 4096, 16385};
  tu_rng_t rng;
  tu_rng_seed(&rng, 950 + (uint64_t)_i);
  for (int k = 0; k < 4; k++) {
    const int64_t rows = 3, d = ds[k], n = rows * d;
    void *x = host_alloc(nbytes(n, dt)), *res = host_alloc(nbytes(n, dt));
    void *sum = host_alloc(nbytes(n, dt));
    tu_fill_normal(x, n, dt, 0.5, 2.0, &rng);
    tu_fill_normal(res, n, dt, 0.5, 2.0, &rng);
    float *gamma = random_f32(d, 1.0, 0.5, &rng), *beta = host_alloc((size_t)d * sizeof(float));
    fwd_opts_t o = {1, 1, 1, 0, 0, 0};
    cancelling_beta(beta, x, gamma, d, dt);
    fwd_case(OP_LN, dt, rows, d, x, res, gamma, beta, o, "layernorm, beta cancels");
    for (int64_t i = 0; i < n; i++)
      tu_set(sum, i, (double)((float)tu_get(x, i, dt) + (float)tu_get(res, i, dt)), dt);
    cancelling_beta(beta, sum, gamma, d, dt);
    fwd_case(OP_ADD_LN, dt, rows, d, x, res, gamma, beta, o, "add_layernorm, beta cancels");
    free(x);
    free(res);
    free(sum);
    free(gamma);
    free(beta);
  }
}
END_TEST

/* ---- backward ----------------------------------------------------------------------------- */

typedef struct {
  int gamma, dgamma, dbeta, in_place;
} bwd_opts_t;

static sn_status_t run_bwd(int rms, int dev, void *dx, float *dgamma, float *dbeta,
                           const void *dy, const void *x, const float *mean, const float *rstd,
                           const float *gamma, int64_t rows, int64_t d, sn_dtype_t dt, void *ws,
                           size_t ws_bytes) {
  if (rms)
    return dev ? sn_cuda_rmsnorm_bwd(dx, dgamma, dy, x, rstd, gamma, rows, d, dt, ws, ws_bytes, 0)
               : sn_rmsnorm_bwd(dx, dgamma, dy, x, rstd, gamma, rows, d, dt);
  return dev ? sn_cuda_layernorm_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, dt, ws,
                                     ws_bytes, 0)
             : sn_layernorm_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, dt);
}

/* One backward case on x, dy [rows, d] (host): mean/rstd from the CPU forward; CPU backward as
 * the reference; the CUDA backward twice (the second into fresh poisoned outputs: dgamma and
 * dbeta must be bitwise the same). */
static void bwd_case(int rms, sn_dtype_t dt, int64_t rows, int64_t d, const void *x,
                     const void *dy, const float *gamma_in, bwd_opts_t o, const char *what) {
  const int64_t n = rows * d;
  const size_t ab = nbytes(n, dt), pb = (size_t)d * sizeof(float), rb = (size_t)rows * 4;
  const float *gamma = o.gamma ? gamma_in : NULL;
  float *mean = host_alloc(rb), *rstd = host_alloc(rb);
  void *ytmp = host_alloc(ab);
  expect_ok(rms ? sn_rmsnorm_fwd(ytmp, rstd, x, NULL, rows, d, EPS, dt)
                : sn_layernorm_fwd(ytmp, mean, rstd, x, NULL, NULL, rows, d, EPS, dt),
            "CPU forward");
  free(ytmp);
  void *dx_ref = host_alloc(ab);
  float *dg_ref = host_alloc(pb), *db_ref = host_alloc(pb);
  expect_ok(run_bwd(rms, 0, dx_ref, o.dgamma ? dg_ref : NULL, o.dbeta && !rms ? db_ref : NULL, dy,
                    x, mean, rstd, gamma, rows, d, dt, NULL, 0),
            "CPU reference");
  /* scale of the terms: max |rstd·dy·gamma| */
  double scale = 0.0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < d; i++) {
      const double t = fabs((double)rstd[r] * tu_get(dy, r * d + i, dt) *
                            (gamma != NULL ? (double)gamma[i] : 1.0));
      if (t > scale && t <= 1e300) scale = t;
    }

  void *dxp = ct_upload(x, ab), *ddy = NULL;
  float *dmean = rms ? NULL : ct_upload(mean, rb), *drstd = ct_upload(rstd, rb);
  float *dgam = gamma != NULL ? ct_upload(gamma, pb) : NULL;
  size_t ws_bytes = 0;
  expect_ok(sn_cuda_rownorm_bwd_workspace(&ws_bytes, rows, d), "workspace query");
  const int params = o.dgamma || (o.dbeta && !rms);
  void *ws = params ? ct_alloc_poison(ws_bytes) : NULL;
  void *dx_got = host_alloc(ab);
  float *dg_got[2], *db_got[2];
  for (int run = 0; run < 2; run++) {
    ddy = ct_upload(dy, ab);
    void *ddx = o.in_place ? ddy : ct_alloc_poison(ab);
    float *ddg = o.dgamma ? ct_alloc_poison(pb) : NULL;
    float *ddb = o.dbeta && !rms ? ct_alloc_poison(pb) : NULL;
    expect_ok(run_bwd(rms, 1, ddx, ddg, ddb, ddy, dxp, dmean, drstd, dgam, rows, d, dt, ws,
                      ws_bytes),
              what);
    ct_download(dx_got, ddx, ab);
    check_act(dx_got, dx_ref, NULL, n, dt, BWD_ATOL * scale, what);
    dg_got[run] = host_alloc(pb);
    db_got[run] = host_alloc(pb);
    if (ddg != NULL) {
      ct_download(dg_got[run], ddg, pb);
      check_param(dg_got[run], dg_ref, d, "dgamma");
    }
    if (ddb != NULL) {
      ct_download(db_got[run], ddb, pb);
      check_param(db_got[run], db_ref, d, "dbeta");
    }
    if (run == 1) {
      if (ddg != NULL) tu_assert_bitwise(dg_got[0], dg_got[1], pb, "dgamma run to run");
      if (ddb != NULL) tu_assert_bitwise(db_got[0], db_got[1], pb, "dbeta run to run");
    }
    if (ddx != ddy) ct_free(ddx);
    ct_free(ddy);
    ct_free(ddg);
    ct_free(ddb);
  }
  for (int run = 0; run < 2; run++) {
    free(dg_got[run]);
    free(db_got[run]);
  }
  free(dx_got);
  free(mean);
  free(rstd);
  free(dx_ref);
  free(dg_ref);
  free(db_ref);
  ct_free(dxp);
  ct_free(dmean);
  ct_free(drstd);
  ct_free(dgam);
  ct_free(ws);
}

static void bwd_random(int rms, sn_dtype_t dt, int64_t rows, int64_t d, bwd_opts_t o,
                       tu_rng_t *rng, const char *what) {
  const int64_t n = rows * d;
  void *x = host_alloc(nbytes(n, dt)), *dy = host_alloc(nbytes(n, dt));
  tu_fill_normal(x, n, dt, 0.5, 2.0, rng);
  tu_fill_normal(dy, n, dt, 0.0, 1.0, rng);
  float *gamma = random_f32(d, 1.0, 0.5, rng);
  bwd_case(rms, dt, rows, d, x, dy, gamma, o, what);
  free(x);
  free(dy);
  free(gamma);
}

/* Every shape and dtype: gamma, dgamma, dbeta given; rows = 3: gamma NULL, only dbeta (RMSNorm:
 * dgamma), dx = dy; rows = 1: no parameter gradients (workspace NULL). */
START_TEST(test_bwd_shapes) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  tu_rng_t rng;
  tu_rng_seed(&rng, 600 + (uint64_t)_i);
  char what[128];
  for (int rms = 0; rms < 2; rms++)
    for (int ri = 0; ri < NROWS; ri++)
      for (int di = 0; di < ND; di++) {
        const int64_t rows = ROWS[ri], d = DS[di];
        if (rows > 3 && d > BIG_ROWS_MAX_D) continue;
        snprintf(what, sizeof what, "%s bwd rows %lld d %lld", rms ? "rmsnorm" : "layernorm",
                 (long long)rows, (long long)d);
        bwd_opts_t o = {1, 1, 1, 0};
        bwd_random(rms, dt, rows, d, o, &rng, what);
        if (rows == 3) {
          bwd_opts_t p = {0, rms, 1, 1};
          bwd_random(rms, dt, rows, d, p, &rng, what);
        }
        if (rows == 1) {
          bwd_opts_t q = {1, 0, 0, 0};
          bwd_random(rms, dt, rows, d, q, &rng, what);
        }
      }
}
END_TEST

/* Backward at mean 1e4, σ 1e-2 (f32): the saved f32 mean is off by up to a twentieth of σ; the
 * re-centred x̂ loses nothing. Also 700 rows: chunks of one and two rows. */
START_TEST(test_bwd_large_mean) {
  tu_rng_t rng;
  tu_rng_seed(&rng, 700);
  const int64_t rows = 700, d = 96;
  void *x = host_alloc(nbytes(rows * d, SN_DTYPE_F32));
  void *dy = host_alloc(nbytes(rows * d, SN_DTYPE_F32));
  tu_fill_normal(x, rows * d, SN_DTYPE_F32, 1e4, 1e-2, &rng);
  tu_fill_normal(dy, rows * d, SN_DTYPE_F32, 0.0, 1.0, &rng);
  float *gamma = random_f32(d, 1.0, 0.5, &rng);
  bwd_opts_t o = {1, 1, 1, 0};
  bwd_case(0, SN_DTYPE_F32, rows, d, x, dy, gamma, o, "layernorm bwd mean 1e4");
  bwd_case(1, SN_DTYPE_F32, rows, d, x, dy, gamma, o, "rmsnorm bwd mean 1e4");
  free(x);
  free(dy);
  free(gamma);
}
END_TEST

/* Backward rows whose pointers are not 16-byte aligned: dy one element into its buffer. */
START_TEST(test_bwd_unaligned) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  tu_rng_t rng;
  tu_rng_seed(&rng, 800 + (uint64_t)_i);
  const int64_t rows = 5, d = 64, n = rows * d;
  void *x = host_alloc(nbytes(n, dt)), *dy = host_alloc(nbytes(n, dt));
  tu_fill_normal(x, n, dt, 0.5, 2.0, &rng);
  tu_fill_normal(dy, n, dt, 0.0, 1.0, &rng);
  float *mean = host_alloc((size_t)rows * 4), *rstd = host_alloc((size_t)rows * 4);
  void *tmp = host_alloc(nbytes(n, dt)), *dx_ref = host_alloc(nbytes(n, dt));
  expect_ok(sn_layernorm_fwd(tmp, mean, rstd, x, NULL, NULL, rows, d, EPS, dt), "CPU fwd");
  float dg_ref[64], db_ref[64], dg[64], db[64];
  expect_ok(sn_layernorm_bwd(dx_ref, dg_ref, db_ref, dy, x, mean, rstd, NULL, rows, d, dt),
            "CPU bwd");
  const size_t ab = nbytes(n, dt), e = nbytes(1, dt);
  char *ddy = ct_alloc_poison(ab + e), *ddx = ct_alloc_poison(ab + e);
  ck_assert(cudaMemcpy(ddy + e, dy, ab, cudaMemcpyHostToDevice) == cudaSuccess);
  void *dxp = ct_upload(x, ab);
  float *dmean = ct_upload(mean, (size_t)rows * 4), *drstd = ct_upload(rstd, (size_t)rows * 4);
  float *ddg = ct_alloc_poison(sizeof dg), *ddb = ct_alloc_poison(sizeof db);
  size_t wsb = 0;
  expect_ok(sn_cuda_rownorm_bwd_workspace(&wsb, rows, d), "workspace");
  void *ws = ct_alloc_poison(wsb);
  expect_ok(sn_cuda_layernorm_bwd(ddx + e, ddg, ddb, ddy + e, dxp, dmean, drstd, NULL, rows, d,
                                  dt, ws, wsb, 0),
            "unaligned bwd");
  ct_download(tmp, ddx + e, ab);
  double scale = 0.0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(rstd[i / d] * tu_get(dy, i, dt)));
  check_act(tmp, dx_ref, NULL, n, dt, BWD_ATOL * scale, "unaligned bwd dx");
  ct_download(dg, ddg, sizeof dg);
  ct_download(db, ddb, sizeof db);
  check_param(dg, dg_ref, d, "unaligned dgamma");
  check_param(db, db_ref, d, "unaligned dbeta");
  free(x);
  free(dy);
  free(mean);
  free(rstd);
  free(tmp);
  free(dx_ref);
  ct_free(ddy);
  ct_free(ddx);
  ct_free(dxp);
  ct_free(dmean);
  ct_free(drstd);
  ct_free(ddg);
  ct_free(ddb);
  ct_free(ws);
}
END_TEST

/* ---- errors and the empty batch ------------------------------------------------------------ */

START_TEST(test_bad_input) {
  const int64_t rows = 2, d = 8, n = rows * d;
  const size_t ab = (size_t)n * 4;
  float hx[16];
  for (int i = 0; i < 16; i++) hx[i] = (float)i;
  void *x = ct_upload(hx, ab), *y = ct_alloc_poison(ab), *s = ct_alloc_poison(ab);
  float *st = ct_alloc_poison((size_t)rows * 4);
  const sn_dtype_t f = SN_DTYPE_F32;
  /* NULL x: nothing written */
  expect_status(sn_cuda_layernorm_fwd(y, st, st + 1, NULL, NULL, NULL, rows, d, EPS, f, 0),
                SN_ERR_NULL_POINTER, "ln NULL x");
  expect_status(sn_cuda_add_layernorm_fwd(y, s, NULL, NULL, NULL, x, NULL, NULL, rows, d, EPS, f,
                                          0),
                SN_ERR_NULL_POINTER, "add ln NULL x");
  expect_status(sn_cuda_rmsnorm_fwd(y, NULL, NULL, NULL, rows, d, EPS, f, 0), SN_ERR_NULL_POINTER,
                "rms NULL x");
  expect_status(sn_cuda_add_rmsnorm_fwd(y, s, NULL, x, NULL, NULL, rows, d, EPS, f, 0),
                SN_ERR_NULL_POINTER, "add rms NULL residual");
  expect_status(sn_cuda_layernorm_fwd(NULL, NULL, NULL, x, NULL, NULL, rows, d, EPS, f, 0),
                SN_ERR_NULL_POINTER, "ln NULL y");
  /* sizes, eps, dtype */
  expect_status(sn_cuda_layernorm_fwd(y, NULL, NULL, x, NULL, NULL, rows, 0, EPS, f, 0),
                SN_ERR_INVALID_SIZE, "d = 0");
  expect_status(sn_cuda_layernorm_fwd(y, NULL, NULL, x, NULL, NULL, -1, d, EPS, f, 0),
                SN_ERR_INVALID_SIZE, "rows = -1");
  expect_status(sn_cuda_layernorm_fwd(y, NULL, NULL, x, NULL, NULL, INT64_MAX / 2, d, EPS, f, 0),
                SN_ERR_OVERFLOW, "rows·d overflows");
  expect_status(sn_cuda_layernorm_fwd(y, NULL, NULL, x, NULL, NULL, rows, d, 0.0f, f, 0),
                SN_ERR_INVALID_EPS, "eps = 0");
  expect_status(sn_cuda_rmsnorm_fwd(y, NULL, x, NULL, rows, d, NAN, f, 0), SN_ERR_INVALID_EPS,
                "eps NaN");
  expect_status(sn_cuda_layernorm_fwd(y, NULL, NULL, x, NULL, NULL, rows, d, EPS, SN_DTYPE_F64, 0),
                SN_ERR_INVALID_DTYPE, "f64");
  expect_status(sn_cuda_rmsnorm_fwd(y, NULL, x, NULL, rows, d, EPS, (sn_dtype_t)77, 0),
                SN_ERR_INVALID_DTYPE, "dtype 77");
  /* overlap: y one element into x; fused y = x */
  expect_status(sn_cuda_layernorm_fwd((float *)x + 1, NULL, NULL, x, NULL, NULL, rows, d, EPS, f,
                                      0),
                SN_ERR_INVALID_ARGUMENT, "y overlaps x partly");
  expect_status(sn_cuda_add_layernorm_fwd(x, s, NULL, NULL, x, y, NULL, NULL, rows, d, EPS, f, 0),
                SN_ERR_INVALID_ARGUMENT, "fused y = x");
  check_poisoned(y, ab, "y");
  check_poisoned(s, ab, "sum_out");
  check_poisoned(st, (size_t)rows * 4, "mean/rstd");

  /* backward */
  float *dg = ct_alloc_poison((size_t)d * 4), *db = ct_alloc_poison((size_t)d * 4);
  float *mr = ct_upload(hx, (size_t)rows * 4);
  size_t wsb = 0;
  expect_ok(sn_cuda_rownorm_bwd_workspace(&wsb, rows, d), "workspace");
  ck_assert(wsb >= (size_t)(2 * rows * d * 8) && wsb % 256 == 0);
  void *ws = ct_alloc_poison(wsb);
  expect_status(sn_cuda_layernorm_bwd(y, dg, db, NULL, x, mr, mr, NULL, rows, d, f, ws, wsb, 0),
                SN_ERR_NULL_POINTER, "bwd NULL dy");
  expect_status(sn_cuda_layernorm_bwd(y, dg, db, x, x, NULL, mr, NULL, rows, d, f, ws, wsb, 0),
                SN_ERR_NULL_POINTER, "bwd NULL mean");
  expect_status(sn_cuda_rmsnorm_bwd(y, dg, x, x, NULL, NULL, rows, d, f, ws, wsb, 0),
                SN_ERR_NULL_POINTER, "rms bwd NULL rstd");
  expect_status(sn_cuda_layernorm_bwd(y, dg, db, x, x, mr, mr, NULL, rows, 0, f, ws, wsb, 0),
                SN_ERR_INVALID_SIZE, "bwd d = 0");
  expect_status(sn_cuda_layernorm_bwd(y, dg, db, x, x, mr, mr, NULL, rows, d, SN_DTYPE_F64, ws,
                                      wsb, 0),
                SN_ERR_INVALID_DTYPE, "bwd f64");
  expect_status(sn_cuda_layernorm_bwd(y, dg, db, x, x, mr, mr, NULL, rows, d, f, ws, wsb - 1, 0),
                SN_ERR_INVALID_ARGUMENT, "workspace too small");
  expect_status(sn_cuda_rmsnorm_bwd(y, dg, x, x, mr, NULL, rows, d, f, NULL, wsb, 0),
                SN_ERR_INVALID_ARGUMENT, "workspace NULL");
  expect_status(sn_cuda_layernorm_bwd(y, dg, db, x, x, mr, mr, NULL, rows, d, f, ws, wsb - 1, 0),
                SN_ERR_INVALID_ARGUMENT, "workspace too small");
  expect_status(sn_cuda_layernorm_bwd((float *)x + 1, dg, db, x, x, mr, mr, NULL, rows, d, f, ws,
                                      wsb, 0),
                SN_ERR_INVALID_ARGUMENT, "dx overlaps x");
  check_poisoned(y, ab, "dx");
  check_poisoned(dg, (size_t)d * 4, "dgamma");
  check_poisoned(db, (size_t)d * 4, "dbeta");
  /* the workspace query */
  expect_status(sn_cuda_rownorm_bwd_workspace(NULL, rows, d), SN_ERR_NULL_POINTER, "query NULL");
  expect_status(sn_cuda_rownorm_bwd_workspace(&wsb, -1, d), SN_ERR_INVALID_SIZE, "query rows");
  expect_status(sn_cuda_rownorm_bwd_workspace(&wsb, rows, 0), SN_ERR_INVALID_SIZE, "query d");
  expect_status(sn_cuda_rownorm_bwd_workspace(&wsb, INT64_MAX / 4, 4), SN_ERR_OVERFLOW,
                "query overflow");
  expect_ok(sn_cuda_rownorm_bwd_workspace(&wsb, 0, d), "query rows = 0");
  ck_assert_uint_eq(wsb, 0);
  ct_free(x);
  ct_free(y);
  ct_free(s);
  ct_free(st);
  ct_free(dg);
  ct_free(db);
  ct_free(mr);
  ct_free(ws);
}
END_TEST

/* rows = 0: the forwards write nothing; the backwards write dgamma/dbeta as zeros. */
START_TEST(test_empty_batch) {
  const int64_t d = 33;
  float *y = ct_alloc_poison(64), *dg = ct_alloc_poison((size_t)d * 4);
  float *db = ct_alloc_poison((size_t)d * 4);
  expect_ok(sn_cuda_layernorm_fwd(y, NULL, NULL, NULL, NULL, NULL, 0, d, EPS, SN_DTYPE_BF16, 0),
            "fwd rows = 0");
  expect_ok(sn_cuda_add_rmsnorm_fwd(y, NULL, NULL, NULL, NULL, NULL, 0, d, EPS, SN_DTYPE_F16, 0),
            "add rms rows = 0");
  check_poisoned(y, 64, "y of an empty batch");
  expect_ok(sn_cuda_layernorm_bwd(NULL, dg, db, NULL, NULL, NULL, NULL, NULL, 0, d, SN_DTYPE_F32,
                                  NULL, 0, 0),
            "ln bwd rows = 0");
  float h[33];
  ct_download(h, dg, sizeof h);
  for (int i = 0; i < d; i++) ck_assert_msg(h[i] == 0.0f && !signbit(h[i]), "dgamma[%d]", i);
  ct_download(h, db, sizeof h);
  for (int i = 0; i < d; i++) ck_assert_msg(h[i] == 0.0f && !signbit(h[i]), "dbeta[%d]", i);
  ck_assert(cudaMemset(dg, 0xFF, (size_t)d * 4) == cudaSuccess);
  expect_ok(sn_cuda_rmsnorm_bwd(NULL, dg, NULL, NULL, NULL, NULL, 0, d, SN_DTYPE_BF16, NULL, 0, 0),
            "rms bwd rows = 0");
  ct_download(h, dg, sizeof h);
  for (int i = 0; i < d; i++) ck_assert_msg(h[i] == 0.0f, "rms dgamma[%d]", i);
  ct_free(y);
  ct_free(dg);
  ct_free(db);
}
END_TEST

/* ---- more than 2^31 elements --------------------------------------------------------------- */

/* LayerNorm forward, bf16, rows·d = 131073·16384 > 2^31 (4 GiB each for x and y): the first and
 * last 4 rows random (the rest a constant fill), compared with the CPU function on those rows.
 * Skipped (with a note) where the device lacks the memory. */
START_TEST(test_huge_batch) {
  const sn_dtype_t dt = SN_DTYPE_BF16;
  const int64_t rows = 131073, d = 16384, n = rows * d, k = 4;
  const size_t ab = nbytes(n, dt), kb = nbytes(k * d, dt);
  void *x = NULL, *y = NULL;
  float *mean = NULL, *rstd = NULL;
  if (cudaMalloc(&x, ab) != cudaSuccess || cudaMalloc(&y, ab) != cudaSuccess ||
      cudaMalloc((void **)&mean, (size_t)rows * 4) != cudaSuccess ||
      cudaMalloc((void **)&rstd, (size_t)rows * 4) != cudaSuccess) {
    printf("NOTE: test_huge_batch skipped: cudaMalloc of 2 x %zu bytes failed (%s)\n", ab,
           cudaGetErrorString(cudaGetLastError()));
    ct_free(x);
    ct_free(y);
    ct_free(mean);
    ct_free(rstd);
    return;
  }
  tu_rng_t rng;
  tu_rng_seed(&rng, 900);
  ck_assert(cudaMemset(x, 0x3F, ab) == cudaSuccess); /* bf16 0x3f3f = 0.746 */
  ck_assert(cudaMemset(y, 0xFF, ab) == cudaSuccess);
  void *hx = host_alloc(2 * kb), *hy = host_alloc(2 * kb), *ref = host_alloc(2 * kb);
  tu_fill_normal(hx, 2 * k * d, dt, 0.5, 2.0, &rng);
  float *gamma = random_f32(d, 1.0, 0.5, &rng), *beta = random_f32(d, 0.0, 1.0, &rng);
  float *dg = ct_upload(gamma, (size_t)d * 4), *db = ct_upload(beta, (size_t)d * 4);
  const size_t last = nbytes((rows - k) * d, dt);
  ck_assert(cudaMemcpy(x, hx, kb, cudaMemcpyHostToDevice) == cudaSuccess);
  ck_assert(cudaMemcpy((char *)x + last, (char *)hx + kb, kb, cudaMemcpyHostToDevice) ==
            cudaSuccess);
  expect_ok(sn_cuda_layernorm_fwd(y, mean, rstd, x, dg, db, rows, d, EPS, dt, 0), "huge batch");
  ct_download(hy, y, kb);
  ct_download((char *)hy + kb, (char *)y + last, kb);
  float mref[8], rref[8], mgot[8], rgot[8];
  expect_ok(sn_layernorm_fwd(ref, mref, rref, hx, gamma, beta, 2 * k, d, EPS, dt), "CPU");
  double *sc = fwd_scale(hx, gamma, beta, 2 * k, d, 1, dt);
  check_act(hy, ref, sc, 2 * k * d, dt, 0.0, "huge batch y (first and last 4 rows)");
  free(sc);
  ct_download(mgot, mean, 16);
  ct_download(mgot + 4, mean + rows - k, 16);
  ct_download(rgot, rstd, 16);
  ct_download(rgot + 4, rstd + rows - k, 16);
  check_stat(mgot, mref, 8, "huge batch mean");
  check_stat(rgot, rref, 8, "huge batch rstd");
  free(hx);
  free(hy);
  free(ref);
  free(gamma);
  free(beta);
  ct_free(dg);
  ct_free(db);
  ct_free(x);
  ct_free(y);
  ct_free(mean);
  ct_free(rstd);
}
END_TEST

int main(void) {
  if (ct_no_device("test_cuda_rownorm")) return CT_SKIP_CODE;
  Suite *s = suite_create("cuda_rownorm");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_fwd_shapes, 0, 3);
  tcase_add_loop_test(tc, test_fwd_unaligned, 0, 3);
  tcase_add_test(tc, test_issue_example);
  tcase_add_test(tc, test_large_mean);
  tcase_add_loop_test(tc, test_constant_rows, 0, 3);
  tcase_add_loop_test(tc, test_near_half_max, 0, 2);
  tcase_add_loop_test(tc, test_beta_cancels, 0, 3);
  tcase_add_loop_test(tc, test_bwd_shapes, 0, 3);
  tcase_add_test(tc, test_bwd_large_mean);
  tcase_add_loop_test(tc, test_bwd_unaligned, 0, 3);
  tcase_add_test(tc, test_bad_input);
  tcase_add_test(tc, test_empty_batch);
  tcase_add_test(tc, test_huge_batch);
  suite_add_tcase(s, tc);
  return ct_run_suite(s);
}
