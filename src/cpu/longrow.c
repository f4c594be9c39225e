/*
 * longrow.c — LayerNorm and RMSNorm over rows longer than SN_LONG_ROW (longrow.h), with scratch
 * that does not grow with d. A row is cut into fixed blocks of LR_BLOCK elements; bf16/f16
 * blocks are widened into per-thread f32 blocks, f32 blocks are read in place.
 *
 * Forward, per row (all in fp64; f32 outputs are rounded once, bf16/f16 from that f32):
 *   pass 1  Σx per block (RMSNorm: Σx²); with a residual, the block's sum x + res is computed
 *           in f32, stored into sum_out (rounded to the dtype) and summed as stored
 *   pass 2  Σ(x − mean)² per block, mean = Σx/d (LayerNorm only: two passes, no cancellation)
 *   map     y = (x − mean)·rstd·gamma + beta   (RMSNorm: y = x·rstd·gamma)
 * Backward, per row, with the saved f32 mean m and rstd s, x̂ = (x − m)·s and g = dy·gamma:
 *   pass A  Σx̂, Σg, Σg·x̂ per block (RMSNorm: Σg·x)
 *   pass B  over column blocks, every row in order: dx = s·((g − mean(g)) − x̂'·mean(g·x̂')),
 *           x̂' = x̂ − mean(x̂) (RMSNorm: dx = s·g − x·s·e, e = s²·Σg·x/d); dgamma += dy·x̂',
 *           dbeta += dy in fp64 per column, stored once
 * The block partials of a row are added in block order, and pass B sums dgamma over the rows in
 * row order: the same bits for any thread count. Scratch: fp64 partials per block of every row
 * (forward 1, backward 3: under 1/500 of an f32 input) and per row (2, 3), and per thread 2
 * f32 blocks (forward, bf16/f16) or 3 f32 and 2 fp64 blocks (backward). Outputs are never
 * streamed (SN_STREAM_MIN_BYTES).
 * Threads: OpenMP over (row, block) pairs in the passes over rows, over column blocks in pass B.
 */
#include "longrow.h"

#include <math.h>

#include "rownorm.h"

/* Elements per block: a few f32 and fp64 blocks per thread stay in L1/L2. */
#define LR_BLOCK 4096
/* Fixed accumulator lanes of the fp64 block sums (the order never depends on vector width). */
#define LR_LANES 8

static int64_t lr_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* Σ v[k], Σ v[k]·w[k], Σ w[k] over a block in fp64 lanes: the backward's pass A terms, where
 * v = x̂ and w = g (LayerNorm), or v = x, w = g (RMSNorm: only Σv·w is used). */
SN_CLONES static void lr_bwd_sums(double out[3], const float *x, const float *dy,
                                  const float *gamma, int64_t m, double mean, double s, int rms) {
  double a0[LR_LANES] = {0}, a1[LR_LANES] = {0}, a2[LR_LANES] = {0};
  for (int64_t k = 0; k < m; k++) {
    const double v = rms ? (double)x[k] : SN_LN_XHAT((double)x[k], mean, s);
    const double g = (double)dy[k] * (gamma != NULL ? (double)gamma[k] : 1.0);
    a0[k % LR_LANES] += v;
    a1[k % LR_LANES] += v * g;
    a2[k % LR_LANES] += g;
  }
  out[0] = out[1] = out[2] = 0.0;
  for (int l = 0; l < LR_LANES; l++) out[0] += a0[l], out[1] += a1[l], out[2] += a2[l];
}

/* The f32 view of block [off, off + m) of the residual sum x + res, stored into sum_out as
 * rounded to the dtype (f32: in place in sum_out; else in t, sn__residual_sum_row). */
static const float *lr_sum_block(const sn__rn_fwd_t *a, int64_t off, int64_t m, float *t) {
  if (a->dtype != SN_DTYPE_F32)
    return sn__residual_sum_row(a->sum_out, a->x, a->res, t, off, m, a->dtype);
  float *s = (float *)a->sum_out + off;
  sn__add_row(s, (const float *)a->x + off, (const float *)a->res + off, m);
  return s;
}

/* The forward map of one block: out[k] = (v[k] − mean)·rstd·gamma[k] + beta[k] in fp64. */
SN_CLONES static void lr_map(float *out, const float *v, const float *gamma, const float *beta,
                             int64_t m, double mean, double rstd) {
  for (int64_t k = 0; k < m; k++) {
    out[k] = (float)SN_ROW_Y(SN_ROW_XHAT((double)v[k], mean, 0.0, rstd, 1), (double)gamma[k],
                             (double)beta[k], gamma != NULL, beta != NULL);
  }
}

sn_status_t sn__long_rows_fwd(const char *fn, const sn__rn_fwd_t *a) {
  const int64_t d = a->d, rows = a->rows, nb = (d + LR_BLOCK - 1) / LR_BLOCK, items = rows * nb;
  const int threads = sn__team_for(items);
  const int64_t per_thread = a->dtype == SN_DTYPE_F32 ? 0 : 2 * LR_BLOCK;
  sn_status_t st = SN_OK;
  double *part = NULL, *stats = NULL;
  float *scratch = NULL;
  if ((part = sn__alloc(fn, items, 1, sizeof(double), &st)) == NULL ||
      (stats = sn__alloc(fn, rows, 2, sizeof(double), &st)) == NULL ||
      (per_thread > 0 &&
       (scratch = sn__alloc(fn, threads, per_thread, sizeof(float), &st)) == NULL) ||
      (st = sn__rownorm_fwd_spans(fn, a)) != SN_OK) {
    sn__free(part), sn__free(stats), sn__free(scratch);
    return st;
  }
  const int fused = a->res != NULL;
  const void *src = fused ? a->sum_out : a->x; /* what passes 2 and map read */
#pragma omp parallel num_threads(threads)
  {
    float *t = scratch != NULL ? scratch + (int64_t)sn__thread_num() * per_thread : NULL;
    float *t2 = t != NULL ? t + LR_BLOCK : NULL;
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) { /* pass 1 */
      const int64_t r = it / nb, b = it % nb, off = r * d + b * LR_BLOCK;
      const int64_t m = lr_min(LR_BLOCK, d - b * LR_BLOCK);
      const float *v =
          fused ? lr_sum_block(a, off, m, t) : sn__in_row(a->x, off, m, a->dtype, t);
      part[it] = a->rms ? sn__sumsq_shifted_f64(v, m, 0.0) : sn__sum_f64(v, m);
    }
#pragma omp single
    for (int64_t r = 0; r < rows; r++) {
      double s = 0.0;
      for (int64_t b = 0; b < nb; b++) s += part[r * nb + b];
      stats[2 * r] = a->rms ? 0.0 : s / (double)d;
      stats[2 * r + 1] = a->rms ? 1.0 / sqrt(s / (double)d + (double)a->eps) : 0.0;
    }
    if (!a->rms) {
#pragma omp for schedule(static)
      for (int64_t it = 0; it < items; it++) { /* pass 2 */
        const int64_t r = it / nb, b = it % nb, off = r * d + b * LR_BLOCK;
        const int64_t m = lr_min(LR_BLOCK, d - b * LR_BLOCK);
        part[it] = sn__sumsq_shifted_f64(sn__in_row(src, off, m, a->dtype, t), m, stats[2 * r]);
      }
#pragma omp single
      for (int64_t r = 0; r < rows; r++) {
        double s = 0.0;
        for (int64_t b = 0; b < nb; b++) s += part[r * nb + b];
        stats[2 * r + 1] = 1.0 / sqrt(s / (double)d + (double)a->eps);
      }
    }
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) { /* map */
      const int64_t r = it / nb, b = it % nb, j = b * LR_BLOCK, off = r * d + j;
      const int64_t m = lr_min(LR_BLOCK, d - j);
      const float *v = sn__in_row(src, off, m, a->dtype, t);
      float *out = sn__out_row(a->y, off, a->dtype, t2);
      lr_map(out, v, a->gamma != NULL ? a->gamma + j : NULL,
             a->beta != NULL ? a->beta + j : NULL, m, stats[2 * r], stats[2 * r + 1]);
      sn__out_done(a->y, off, m, a->dtype, t2);
    }
  }
  for (int64_t r = 0; r < rows; r++) {
    if (a->mean != NULL) a->mean[r] = (float)stats[2 * r];
    if (a->rstd != NULL) a->rstd[r] = (float)stats[2 * r + 1];
  }
  sn__free(part), sn__free(stats), sn__free(scratch);
  return SN_OK;
}

/* Pass B of one row's block: dx, and the dgamma/dbeta terms added into dg, db (NULL: none). */
SN_CLONES static void lr_bwd_block(float *dx, double *dg, double *db, const float *x,
                                   const float *dy, const float *gamma, int64_t m, double mean,
                                   double s, const double c[3], int rms) {
  for (int64_t k = 0; k < m; k++) {
    const double dyk = (double)dy[k], g = dyk * (gamma != NULL ? (double)gamma[k] : 1.0);
    double xh, v;
    if (rms) {
      xh = SN_RMS_XHAT((double)x[k], s);
      v = SN_RMS_DX(g, xh, s, c[0]);
    } else {
      xh = SN_LN_XHAT_C((double)x[k], mean, s, c[0]);
      v = SN_LN_DX(g, xh, s, c[1], c[2]);
    }
    if (dg != NULL) dg[k] += dyk * xh;
    if (db != NULL) db[k] += dyk;
    dx[k] = (float)v;
  }
}

sn_status_t sn__long_rows_bwd(const char *fn, const sn__rn_bwd_t *a) {
  const int64_t d = a->d, rows = a->rows, nb = (d + LR_BLOCK - 1) / LR_BLOCK, items = rows * nb;
  const int threads = sn__team_for(items);
  /* per thread: dg, db [LR_BLOCK] fp64, then x, dy, dx [LR_BLOCK] f32 */
  const int64_t per_thread = 7 * LR_BLOCK; /* in floats: 2·2 + 3 blocks */
  sn_status_t st = SN_OK;
  double *part = NULL, *coef = NULL;
  float *scratch = NULL;
  if ((part = sn__alloc(fn, items, 3, sizeof(double), &st)) == NULL ||
      (coef = sn__alloc(fn, rows, 3, sizeof(double), &st)) == NULL ||
      (scratch = sn__alloc(fn, threads, per_thread, sizeof(float), &st)) == NULL ||
      (st = sn__rownorm_bwd_spans(fn, a, NULL, 0)) != SN_OK) {
    sn__free(part), sn__free(coef), sn__free(scratch);
    return st;
  }
  const sn_dtype_t dt = a->dtype;
#pragma omp parallel num_threads(threads)
  {
    float *base = scratch + (int64_t)sn__thread_num() * per_thread;
    double *dg = (double *)base, *db = dg + LR_BLOCK;
    float *tx = base + 4 * LR_BLOCK, *tdy = tx + LR_BLOCK, *tdx = tdy + LR_BLOCK;
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) { /* pass A */
      const int64_t r = it / nb, j = (it % nb) * LR_BLOCK, off = r * d + j;
      const int64_t m = lr_min(LR_BLOCK, d - j);
      lr_bwd_sums(part + 3 * it, sn__in_row(a->x, off, m, dt, tx),
                  sn__in_row(a->dy, off, m, dt, tdy), a->gamma != NULL ? a->gamma + j : NULL, m,
                  a->rms ? 0.0 : (double)a->mean[r], (double)a->rstd[r], a->rms);
    }
#pragma omp single
    for (int64_t r = 0; r < rows; r++) {
      double sv = 0.0, svg = 0.0, sg = 0.0;
      for (int64_t b = 0; b < nb; b++) {
        const double *p = part + 3 * (r * nb + b);
        sv += p[0], svg += p[1], sg += p[2];
      }
      double *c = coef + 3 * r;
      if (a->rms) { /* e = s²·Σg·x/d */
        const double s = (double)a->rstd[r];
        c[0] = s * s * (svg / (double)d), c[1] = c[2] = 0.0;
      } else { /* mean(x̂), mean(g), mean(g·x̂') */
        c[0] = sv / (double)d, c[1] = sg / (double)d;
        c[2] = (svg - c[0] * sg) / (double)d;
      }
    }
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; b++) { /* pass B: a column block, every row in order */
      const int64_t j = b * LR_BLOCK, m = lr_min(LR_BLOCK, d - j);
      double *g = a->dgamma != NULL ? dg : NULL, *e = a->dbeta != NULL ? db : NULL;
      for (int64_t k = 0; k < m; k++) dg[k] = db[k] = 0.0;
      for (int64_t r = 0; r < rows; r++) {
        const int64_t off = r * d + j;
        const float *xv = sn__in_row(a->x, off, m, dt, tx);
        const float *dyv = sn__in_row(a->dy, off, m, dt, tdy);
        float *out = sn__out_row(a->dx, off, dt, tdx);
        lr_bwd_block(out, g, e, xv, dyv, a->gamma != NULL ? a->gamma + j : NULL, m,
                     a->rms ? 0.0 : (double)a->mean[r], (double)a->rstd[r], coef + 3 * r,
                     a->rms);
        sn__out_done(a->dx, off, m, dt, tdx);
      }
      for (int64_t k = 0; k < m; k++) {
        if (a->dgamma != NULL) a->dgamma[j + k] = (float)dg[k];
        if (a->dbeta != NULL) a->dbeta[j + k] = (float)db[k];
      }
    }
  }
  sn__free(part), sn__free(coef), sn__free(scratch);
  return SN_OK;
}
