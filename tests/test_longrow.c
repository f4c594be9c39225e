/*
 * test_longrow.c — LayerNorm and RMSNorm (forwards, fused residual adds, backwards) over rows
 * longer than SN_LONG_ROW (65536), which take the kernels of src/cpu/longrow.c.
 *
 * Checked against fp64 references computed here: mean and rstd within TU_RTOL_STATS relative
 * (also for |mean| ≫ σ), f32 outputs normwise, bf16/f16 outputs at the project's mixed bound
 * (tu_check_lowp_mixed), the residual sums as stored, dx/dgamma/dbeta against the analytic fp64
 * gradient, that gradient against central finite differences at a few coordinates; in place
 * (y == x, dx == dy, sum_out == x), poisoned outputs all written, bitwise the same results with
 * 1 and 3 threads.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const float EPS = 1e-5f;
/* Rows just over the limit (a last block of 1 element) and one of several blocks and a tail. */
static const int64_t DS[] = {65537, 7 * 4096 * 3 + 123};
static const int64_t ROWS[] = {1, 3};
/* mean, rstd: fp64 statistics rounded to f32 once, so within 2^-24 relative; 1e-6 is the
 * project's promise for the statistics. */
#define TU_RTOL_STATS 1e-6

typedef struct {
  int64_t rows, d;
  sn_dtype_t dt;
  double mu; /* the data's mean (σ = 1) */
  int affine, fused, rms;
} cfg_t;

/* fp64 reference forward of row values v [d] (as the kernel sees them): y, scale, mean, rstd. */
static void ref_fwd(const cfg_t *c, const double *v, const float *g, const float *b, double *y,
                    double *scale, double *mean, double *rstd) {
  const int64_t d = c->d;
  double s = 0.0, m = 0.0, q = 0.0;
  if (!c->rms) {
    for (int64_t i = 0; i < d; i++) s += v[i];
    m = s / (double)d;
  }
  for (int64_t i = 0; i < d; i++) q += (v[i] - m) * (v[i] - m);
  const double rs = 1.0 / sqrt(q / (double)d + (double)EPS);
  for (int64_t i = 0; i < d; i++) {
    const double p = (v[i] - m) * rs * (c->affine ? (double)g[i] : 1.0);
    const double bb = c->affine && !c->rms ? (double)b[i] : 0.0;
    y[i] = p + bb;
    scale[i] = fabs(p) + fabs(bb);
  }
  *mean = m, *rstd = rs;
}

/* One forward configuration, run with 1 and 3 threads, in place where the call allows it. */
static void run_fwd(const cfg_t *c, uint64_t seed) {
  const int64_t n = c->rows * c->d, d = c->d;
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  void *x = tu_alloc(n, c->dt), *res = tu_alloc(n, c->dt), *y = tu_alloc(n, c->dt);
  void *x0 = tu_alloc(n, c->dt), *y1 = tu_alloc(n, c->dt), *s1 = tu_alloc(n, c->dt);
  float *g = tu_falloc(d), *b = tu_falloc(d), *mean = tu_falloc(c->rows), *rstd = tu_falloc(c->rows);
  double *v = tu_dalloc(d), *ref = tu_dalloc(d), *scale = tu_dalloc(d);
  tu_fill_normal(x, n, c->dt, c->mu, 1.0, &r);
  tu_fill_normal(res, n, c->dt, 0.0, 1.0, &r);
  tu_fill_params(g, b, d, &r);
  const size_t bytes = (size_t)n * (size_t)sn_dtype_size(c->dt);
  memcpy(x0, x, bytes);
  const float *gp = c->affine ? g : NULL, *bp = c->affine && !c->rms ? b : NULL;
  for (int threads = 1; threads <= 3; threads += 2) {
    omp_set_num_threads(threads);
    memcpy(x, x0, bytes);
    tu_poison(y, n, c->dt);
    tu_poison_f32(mean, c->rows), tu_poison_f32(rstd, c->rows);
    sn_status_t st;
    void *out = c->fused ? y : x; /* the plain forwards in place */
    if (c->fused && c->rms) st = sn_add_rmsnorm_fwd(y, x, rstd, x, res, gp, c->rows, d, EPS, c->dt);
    else if (c->fused) st = sn_add_layernorm_fwd(y, x, mean, rstd, x, res, gp, bp, c->rows, d, EPS, c->dt);
    else if (c->rms) st = sn_rmsnorm_fwd(x, rstd, x, gp, c->rows, d, EPS, c->dt);
    else st = sn_layernorm_fwd(x, mean, rstd, x, gp, bp, c->rows, d, EPS, c->dt);
    ck_assert_msg(st == SN_OK, "%s", sn_last_error());
    if (c->fused) tu_assert_residual_sum(x, x0, res, n, c->dt, "residual sum (sum_out == x)");
    for (int64_t row = 0; row < c->rows; row++) {
      for (int64_t i = 0; i < d; i++) v[i] = tu_get(c->fused ? x : x0, row * d + i, c->dt);
      double m, rs;
      ref_fwd(c, v, g, b, ref, scale, &m, &rs);
      tu_assert_fwd((const char *)out + row * d * sn_dtype_size(c->dt), c->dt, ref, scale, d,
                    "y");
      TU_CHECK(fabs(rstd[row] - rs) <= TU_RTOL_STATS * rs, "row %lld rstd %.9g, fp64 %.9g",
               (long long)row, (double)rstd[row], rs);
      if (!c->rms)
        TU_CHECK(fabs(mean[row] - m) <= TU_RTOL_STATS * fabs(m) + 1e-12,
                 "row %lld mean %.9g, fp64 %.9g", (long long)row, (double)mean[row], m);
    }
    if (threads == 1) {
      memcpy(y1, out, bytes);
      memcpy(s1, x, bytes);
    } else {
      tu_assert_bitwise(y1, out, bytes, "y, 1 vs 3 threads");
      if (c->fused) tu_assert_bitwise(s1, x, bytes, "sum_out, 1 vs 3 threads");
    }
  }
  free(x), free(res), free(y), free(x0), free(y1), free(s1);
  free(g), free(b), free(mean), free(rstd), free(v), free(ref), free(scale);
}

START_TEST(test_fwd) {
  const sn_dtype_t dts[] = {SN_DTYPE_F32, SN_DTYPE_BF16, SN_DTYPE_F16};
  uint64_t seed = 1;
  for (int di = 0; di < 2; di++)
    for (int ri = 0; ri < 2; ri++)
      for (int t = 0; t < 3; t++)
        for (int k = 0; k < 8; k++) { /* rms, fused, affine */
          const double mu = dts[t] == SN_DTYPE_F16 ? 100.0 : 1000.0; /* |mean| ≫ σ; f16 holds 100 */
          cfg_t c = {ROWS[ri], DS[di], dts[t], (k & 1) ? 0.3 : mu, (k >> 2) & 1, (k >> 1) & 1,
                     k & 1};
          run_fwd(&c, seed++);
        }
}
END_TEST

/* fp64 loss L = Σ w·y of one row x [d] (LayerNorm or RMSNorm), for finite differences. */
static double loss(const cfg_t *c, const double *x, const float *g, const float *b,
                   const double *w) {
  double *y = tu_dalloc(c->d), *scale = tu_dalloc(c->d), m, rs, l = 0.0;
  ref_fwd(c, x, g, b, y, scale, &m, &rs);
  for (int64_t i = 0; i < c->d; i++) l += w[i] * y[i];
  free(y), free(scale);
  return l;
}

/* One backward configuration: dx (in place over dy), dgamma, dbeta against the fp64 gradient at
 * the saved statistics, with 1 and 3 threads bitwise alike; for f32 one row, the fp64 gradient
 * against finite differences of the fp64 forward. */
static void run_bwd(const cfg_t *c, uint64_t seed) {
  const int64_t n = c->rows * c->d, d = c->d;
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  void *x = tu_alloc(n, c->dt), *dy = tu_alloc(n, c->dt), *dy0 = tu_alloc(n, c->dt);
  void *dx1 = tu_alloc(n, c->dt);
  float *g = tu_falloc(d), *b = tu_falloc(d), *mean = tu_falloc(c->rows), *rstd = tu_falloc(c->rows);
  float *dg = tu_falloc(d), *db = tu_falloc(d), *dg1 = tu_falloc(d), *db1 = tu_falloc(d);
  double *rdx = tu_dalloc(n), *rdg = tu_dalloc(d), *rdb = tu_dalloc(d);
  tu_fill_normal(x, n, c->dt, c->mu, 1.0, &r);
  tu_fill_normal(dy, n, c->dt, 0.0, 1.0, &r);
  tu_fill_params(g, b, d, &r);
  const size_t bytes = (size_t)n * (size_t)sn_dtype_size(c->dt);
  memcpy(dy0, dy, bytes);
  /* the statistics the forward saves, f32 */
  for (int64_t row = 0; row < c->rows; row++) {
    double s = 0.0, q = 0.0, m = 0.0;
    if (!c->rms) {
      for (int64_t i = 0; i < d; i++) s += tu_get(x, row * d + i, c->dt);
      m = s / (double)d;
    }
    for (int64_t i = 0; i < d; i++) {
      const double t = tu_get(x, row * d + i, c->dt) - m;
      q += t * t;
    }
    mean[row] = (float)m, rstd[row] = (float)(1.0 / sqrt(q / (double)d + (double)EPS));
  }
  /* fp64 gradient at the saved statistics */
  memset(rdg, 0, (size_t)d * sizeof *rdg), memset(rdb, 0, (size_t)d * sizeof *rdb);
  for (int64_t row = 0; row < c->rows; row++) {
    const double m = c->rms ? 0.0 : mean[row], s = rstd[row];
    double sxh = 0.0, sg = 0.0, sgxh = 0.0;
    for (int64_t i = 0; i < d; i++) {
      const double xh = (tu_get(x, row * d + i, c->dt) - m) * s;
      const double gi = tu_get(dy0, row * d + i, c->dt) * (c->affine ? g[i] : 1.0);
      sxh += xh, sg += gi, sgxh += gi * xh;
    }
    const double cx = c->rms ? 0.0 : sxh / (double)d, mg = c->rms ? 0.0 : sg / (double)d;
    const double mgx = (sgxh - cx * sg) / (double)d;
    for (int64_t i = 0; i < d; i++) {
      const double dyi = tu_get(dy0, row * d + i, c->dt);
      const double xh = (tu_get(x, row * d + i, c->dt) - m) * s - cx;
      const double gi = dyi * (c->affine ? g[i] : 1.0);
      rdx[row * d + i] = s * ((gi - mg) - xh * mgx);
      rdg[i] += dyi * xh, rdb[i] += dyi;
    }
  }
  for (int threads = 1; threads <= 3; threads += 2) {
    omp_set_num_threads(threads);
    memcpy(dy, dy0, bytes);
    tu_poison_f32(dg, d), tu_poison_f32(db, d);
    const float *gp = c->affine ? g : NULL;
    sn_status_t st = c->rms ? sn_rmsnorm_bwd(dy, dg, dy, x, rstd, gp, c->rows, d, c->dt)
                            : sn_layernorm_bwd(dy, dg, db, dy, x, mean, rstd, gp, c->rows, d, c->dt);
    ck_assert_msg(st == SN_OK, "%s", sn_last_error());
    if (c->dt == SN_DTYPE_F32) {
      tu_assert_rel(dy, c->dt, rdx, n, TU_RTOL_F32_BWD, "dx (dx == dy)");
    } else { /* fp64 rounded once to f32, then to the dtype: within 1 ulp */
      tu_check_lowp_mixed(dy, c->dt, rdx, NULL, n, "dx (dx == dy)");
    }
    tu_assert_rel(dg, SN_DTYPE_F32, rdg, d, TU_RTOL_F32_BWD, "dgamma");
    if (!c->rms) tu_assert_rel(db, SN_DTYPE_F32, rdb, d, TU_RTOL_F32_BWD, "dbeta");
    if (threads == 1) {
      memcpy(dx1, dy, bytes), memcpy(dg1, dg, (size_t)d * 4), memcpy(db1, db, (size_t)d * 4);
    } else {
      tu_assert_bitwise(dx1, dy, bytes, "dx, 1 vs 3 threads");
      tu_assert_bitwise(dg1, dg, (size_t)d * 4, "dgamma, 1 vs 3 threads");
      if (!c->rms) tu_assert_bitwise(db1, db, (size_t)d * 4, "dbeta, 1 vs 3 threads");
    }
  }
  if (c->dt == SN_DTYPE_F32 && c->rows == 1) { /* dL/dx_i of L = Σ dy·y, by central differences */
    double *xv = tu_dalloc(d), *w = tu_dalloc(d);
    for (int64_t i = 0; i < d; i++) xv[i] = tu_get(x, i, c->dt), w[i] = tu_get(dy0, i, c->dt);
    const int64_t at[] = {0, d / 2, d - 1};
    for (int k = 0; k < 3; k++) {
      const int64_t i = at[k];
      const double h = 1e-6 * (fabs(xv[i]) + 1.0), x0 = xv[i];
      xv[i] = x0 + h;
      const double lp = loss(c, xv, g, b, w);
      xv[i] = x0 - h;
      const double lm = loss(c, xv, g, b, w);
      xv[i] = x0;
      const double fd = (lp - lm) / (2 * h);
      /* the analytic gradient uses the f32 statistics: their 2^-24 relative error, times the
       * few terms of dx, besides the differences' own error */
      TU_CHECK(fabs(fd - rdx[i]) <= 1e-4 * (fabs(fd) + 1e-3),
               "finite difference at %lld: %.9g, analytic %.9g", (long long)i, fd, rdx[i]);
    }
    free(xv), free(w);
  }
  free(x), free(dy), free(dy0), free(dx1), free(g), free(b), free(mean), free(rstd);
  free(dg), free(db), free(dg1), free(db1), free(rdx), free(rdg), free(rdb);
}

START_TEST(test_bwd) {
  const sn_dtype_t dts[] = {SN_DTYPE_F32, SN_DTYPE_BF16, SN_DTYPE_F16};
  uint64_t seed = 100;
  for (int di = 0; di < 2; di++)
    for (int ri = 0; ri < 2; ri++)
      for (int t = 0; t < 3; t++)
        for (int k = 0; k < 4; k++) { /* rms, affine */
          cfg_t c = {ROWS[ri], DS[di], dts[t], (k & 1) ? 0.3 : 100.0, (k >> 1) & 1, 0, k & 1};
          run_bwd(&c, seed++);
        }
}
END_TEST

/* Extra memory of one row of 2^26 + 37 elements: an f32 LayerNorm backward (dx == dy, dgamma,
 * dbeta) and a bf16 LayerNorm forward in place without gamma and beta each raise the peak by
 * less than PEAK_FRACTION of their input (the row kernels kept up to ~40 bytes per element). */
#define PEAK_FRACTION (1.0 / 16)
START_TEST(test_scratch_peak) {
  const int64_t d = ((int64_t)1 << 26) + 37;
  omp_set_num_threads(2);
  tu_rng_t r;
  tu_rng_seed(&r, 7);
  float *x = tu_falloc(d), *dy = tu_falloc(d), *dg = tu_falloc(d), *db = tu_falloc(d);
  float mean, rstd;
  tu_fill_normal(x, d, SN_DTYPE_F32, 3.0, 1.0, &r);
  tu_fill_normal(dy, d, SN_DTYPE_F32, 0.0, 1.0, &r);
  tu_poison_f32(dg, d), tu_poison_f32(db, d);
  sn_status_t st = sn_layernorm_fwd(dg, &mean, &rstd, x, NULL, NULL, 1, d, EPS, SN_DTYPE_F32);
  ck_assert_msg(st == SN_OK, "%s", sn_last_error()); /* the statistics (y into dg, unused) */
  tu_poison_f32(dg, d);
  double before = tu_peak_bytes();
  st = sn_layernorm_bwd(dy, dg, db, dy, x, &mean, &rstd, NULL, 1, d, SN_DTYPE_F32);
  ck_assert_msg(st == SN_OK, "%s", sn_last_error());
  double grew = tu_peak_bytes() - before, input = 2.0 * (double)d * sizeof(float);
  TU_CHECK(grew < PEAK_FRACTION * input, "f32 backward: peak grew by %.0f bytes, input %.0f",
           grew, input);
  tu_assert_all_finite(dy, SN_DTYPE_F32, d, "dx");
  tu_assert_all_finite(dg, SN_DTYPE_F32, d, "dgamma");
  free(dy), free(dg), free(db);
  uint16_t *xb = tu_alloc(d, SN_DTYPE_BF16);
  tu_fill_normal(xb, d, SN_DTYPE_BF16, 3.0, 1.0, &r);
  before = tu_peak_bytes();
  st = sn_layernorm_fwd(xb, &mean, &rstd, xb, NULL, NULL, 1, d, EPS, SN_DTYPE_BF16);
  ck_assert_msg(st == SN_OK, "%s", sn_last_error());
  grew = tu_peak_bytes() - before, input = (double)d * sizeof(uint16_t);
  TU_CHECK(grew < PEAK_FRACTION * input, "bf16 forward: peak grew by %.0f bytes, input %.0f",
           grew, input);
  TU_CHECK(fabs(mean - 3.0) < 0.01 && fabs(rstd - 1.0) < 0.01, "mean %g rstd %g", (double)mean,
           (double)rstd);
  tu_assert_all_finite(xb, SN_DTYPE_BF16, d, "y");
  free(x), free(xb);
}
END_TEST

int main(void) {
  Suite *s = suite_create("longrow");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_fwd);
  tcase_add_test(tc, test_bwd);
  tcase_add_test(tc, test_scratch_peak);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
