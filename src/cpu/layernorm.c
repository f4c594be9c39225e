/*
 * layernorm.c — LayerNorm forward and the fused residual add + LayerNorm forward on the CPU
 * (the backward: layernorm_bwd.c). Every tensor is row-major [rows, d]; one row is normalized
 * over its d elements.
 *
 * Per row, forward:
 *   pass 1  Σt, Σt² with t = x − K, K the mean of the first 32 values (rounded to f32): fp64,
 *           SN_ROW_LANES fixed lanes (rownorm.h); mean = K + Σt/d, var = (Σt² − (Σt)²/d)/d, no
 *           cancellation when |mean| ≫ σ; rows where K is more than σ/2 from the mean: Σx,
 *           then Σ(x − mean)² (two fp64 passes)
 *   pass 2  y = (x − mean)·rstd·gamma + beta
 * The row (4 KB at d = 1024 f32) stays in L1/L2 between passes, so x is read from DRAM once and
 * y written once. Pass 2 runs in f32, with the fp64 mean split into two floats hi + lo:
 * (x − hi) is exact when x is near the mean (Sterbenz), so |mean| ≫ σ loses nothing; the f32
 * map meets the bf16/f16 bound max(1 ulp, 2^-16·(|x̂·gamma| + |beta|)) (ln_map_row). Rows whose
 * mean is 2^103 or more, where x − hi itself can overflow f32 (SN_CENTRE_F32_MAX), or tiny
 * (LN_SPLIT_MIN) are mapped in fp64 (ln_map_f64; the backward's such rows are computed in fp64
 * throughout). Rows longer than SN_LONG_ROW take longrow.c, whose scratch does not grow with d.
 * f16 rows are widened into per-thread f32 scratch rows ([threads, 2, d] floats: x and y,
 * allocated before the parallel region), computed there and narrowed once, round-to-nearest-even.
 * bf16 rows of sn_layernorm_fwd keep no f32 copy (ln_stats_pairs, ln_map_row_pairs): both
 * passes read the row 32 values at a time as the even and odd halves of 16 words
 * (sn__pair_widen, rownorm.h), the map narrows y the same way; the same results as the widened
 * row. Each thread takes one range of rows and computes a row's statistics before it maps the
 * row before (ln_fwd_rows_pairs), so that the end of one overlaps the other. The fused kernel
 * adds x + residual in the first pass (f32; bf16 in pairs, ln_stats_add_pairs; f16 in a pass of
 * its own over L1-sized blocks, sn__residual_sum_row), storing sum_out as it goes, and maps the
 * stored sums in the second (bf16: in pairs, ln_map_row_pairs).
 *
 * Threads: OpenMP over rows (or chunks of rows); the row functions below carry SN_CLONES and no
 * OpenMP pragmas.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "longrow.h"
#include "rownorm.h"

/* The f32 maps hold the fp64 mean as hi + lo (48 bits) only while lo = mean − hi is a normal
 * float: |lo| ≤ 2^-24·|mean| must stay ≥ 2^-126. Below LN_SPLIT_MIN (nonzero) hi + lo can be
 * off by ~2^-150 absolute, a large part of x − mean when the row's values are that small, so
 * such rows are mapped in fp64 (ln_map_f64), as are rows of wide mean (sn__ln_wide_mean), where
 * x − hi itself can overflow f32. */
#define LN_SPLIT_MIN 0x1p-100

/* Whether a row is mapped in fp64 rather than f32 (see LN_SPLIT_MIN). */
static inline int ln_map_in_f64(double mean) {
  return (mean != 0.0 && fabs(mean) < LN_SPLIT_MIN) || sn__ln_wide_mean((float)mean);
}

/* y[i] = (x[i] − mean)·rstd·gamma[i] + beta[i] in fp64, rounded once to f32 (y f32, may equal
 * x) or, with to_bf16, on to bf16. Scalar: only rows of tiny or wide mean get here. */
static void ln_map_f64(void *y, const float *x, const float *gamma, const float *beta, int64_t d,
                       double mean, double rstd, int to_bf16) {
  for (int64_t i = 0; i < d; i++) {
    const double t = SN_ROW_Y(SN_ROW_XHAT((double)x[i], mean, 0.0, rstd, 1), (double)gamma[i],
                              (double)beta[i], gamma != NULL, beta != NULL);
    if (to_bf16) ((uint16_t *)y)[i] = sn__f32_to_bf16((float)t);
    else ((float *)y)[i] = (float)t;
  }
}

/* What a forward call maps with, set up once after its argument check (ln_fwd_begin). */
typedef struct {
  const sn__rn_fwd_t *a; /* the call: tensors, gamma/beta, d, eps, dtype */
  /* bf16: gamma, beta [d] in pair order (sn__to_pairs), in the two scratch rows after the
   * threads'; NULL where gamma or beta is, and for the other dtypes */
  const float *gs, *bs;
  int pfin; /* gamma and beta NULL or all finite (ln_map_row_pairs) */
  /* √d·max|gamma| + max|beta| (a bound on |x̂·gamma + beta|) beyond the f32 range, or NaN:
   * every row is mapped in fp64 (an f32 x̂·gamma could overflow where y does not) */
  int wide;
  float *scratch;     /* ln_fwd_scratch_rows rows of per_thread floats; NULL for f32 */
  int64_t per_thread; /* floats per scratch row, whole cache lines */
  int threads;        /* the rows' team (sn__team_for) */
} ln_fwd_ctx_t;

/* Whether a row of mean `mean` is mapped in fp64 (ln_map_f64) rather than f32. */
static inline int ln_row_f64(const ln_fwd_ctx_t *c, double mean) {
  return c->wide || ln_map_in_f64(mean);
}

/* stats[0] = mean, stats[1] = rstd (fp64) of one row x [d], f32 or (bf16) bf16, or with res
 * (the fused kernels; NULL for none) of the residual sum x + res, stored into sum_out [d] as it
 * is summed (sum_out may equal x or res): sn__row_stats, bitwise the same for a bf16 row and its
 * widened copy. pf: the rows to prefetch. */
SN_INLINE void ln_row_stats(double stats[2], void *sum_out, const void *x, const void *res,
                            int64_t d, float eps, int bf16, sn__row_pf_t pf) {
  double mean, m2;
  sn__row_stats(&mean, &m2, sum_out, x, res, d, bf16, pf);
  stats[0] = mean;
  stats[1] = 1.0 / sqrt(m2 / (double)d + (double)eps);
}

/* y [d] = ((x − hi) − lo)·s·gamma + beta for one row x [d], f32 or (bf16) bf16, y of x's dtype
 * (may equal x), from its stats (ln_row_stats): mean = hi + lo, s = (float)rstd, in f32
 * (sn__map_row; has_g, has_b constants there, a loop each). The error of the f32 map is ~5 f32
 * roundings (2^-24 each) of x̂·gamma (x − hi, − lo, rstd rounded to f32, · rstd, · gamma) plus
 * one of y: within 2^-16·(|x̂·gamma| + |beta|), the bf16/f16 bound, and a few ulp of f32
 * outputs relative to those terms. Rows ln_row_f64 picks (rare) are mapped in fp64
 * (ln_map_f64; a bf16 row widened into tmp [d] first). c: the call. nt: y streamed (but the
 * rows of ln_map_f64).
 * A bf16 row with a finite mean is finite (an infinite or NaN x makes the sums, hence the mean,
 * non-finite), and then |x − mean|·rstd ≤ √d (to a few ulps in f32); rstd ≤ 1/√eps is finite as
 * a float too, so with gamma and beta finite (c->pfin) no y is NaN (at most ±inf), and y is
 * narrowed without the NaN case (sn__map_row's finite: the same bits). */
SN_INLINE void ln_map_row(void *y, const double stats[2], const void *x, float *tmp,
                          const ln_fwd_ctx_t *c, int bf16, int nt) {
  const double mean = stats[0], rstd = stats[1];
  const float *gamma = c->a->gamma, *beta = c->a->beta;
  const int64_t d = c->a->d;
  if (ln_row_f64(c, mean)) {
    if (bf16) sn__to_f32(tmp, x, 0, d, SN_DTYPE_BF16);
    ln_map_f64(y, bf16 ? tmp : (const float *)x, gamma, beta, d, mean, rstd, bf16);
    return;
  }
  const float hi = (float)mean;
  const sn__row_map_t m = {bf16 ? c->gs : gamma, gamma, bf16 ? c->bs : beta, beta, hi,
                           (float)(mean - (double)hi), (float)rstd};
  const int fin = bf16 && c->pfin && isfinite(mean) && isfinite(rstd), g = gamma != NULL;
  if (beta != NULL) {
    if (g && fin) sn__map_row(y, x, d, &m, bf16, 1, 1, 1, nt, 1);
    else if (g) sn__map_row(y, x, d, &m, bf16, 1, 1, 1, nt, 0);
    else if (fin) sn__map_row(y, x, d, &m, bf16, 0, 1, 1, nt, 1);
    else sn__map_row(y, x, d, &m, bf16, 0, 1, 1, nt, 0);
  } else {
    if (g && fin) sn__map_row(y, x, d, &m, bf16, 1, 0, 1, nt, 1);
    else if (g) sn__map_row(y, x, d, &m, bf16, 1, 0, 1, nt, 0);
    else if (fin) sn__map_row(y, x, d, &m, bf16, 0, 0, 1, nt, 1);
    else sn__map_row(y, x, d, &m, bf16, 0, 0, 1, nt, 0);
  }
}

/* One f32 row: x [d] → y [d]; stats[0] = mean, stats[1] = rstd (fp64). y may equal x. With res
 * [d] (the fused kernel; NULL for none) the row normalized is the residual sum x + res, written
 * into sum_out [d] by the first pass (sum_out may equal x or res; y may not overlap them), which
 * the map then reads, cache-hot. c: the call. next, out: the rows to prefetch (sn__row_pf_t).
 * nt: y streamed. */
SN_CLONES static void ln_fwd_row(float *y, double *stats, const float *x, const float *res,
                                 float *sum_out, const ln_fwd_ctx_t *c, const char *next,
                                 char *out, int nt) {
  const int esize = (int)sn_dtype_size(c->a->dtype);
  ln_row_stats(stats, sum_out, x, res, c->a->d, c->a->eps, 0,
               (sn__row_pf_t){next, NULL, out, esize});
  ln_map_row(y, stats, res != NULL ? sum_out : x, NULL, c, 0, nt);
}

/* ---- bf16 rows in pairs (sn_layernorm_fwd) ------------------------------------------------ */

/* The same two steps for one bf16 row, as functions of their own (ln_fwd_rows_pairs runs them a
 * row apart), with no f32 copy of the row: x is widened in registers in pairs in both. The
 * statistics of x [d], or with res of the residual sum rounded to bf16 and stored into sum_out
 * [d]; next, next_res: the next rows of x and res to prefetch, out: this row of y (NULL: none). */
SN_CLONES static void ln_stats_pairs(double stats[2], const uint16_t *x, int64_t d, float eps,
                                     const char *next, char *out) {
  ln_row_stats(stats, NULL, x, NULL, d, eps, 1, (sn__row_pf_t){next, NULL, out, 2});
}
SN_CLONES static void ln_stats_add_pairs(double stats[2], uint16_t *sum_out, const uint16_t *x,
                                         const uint16_t *res, int64_t d, float eps,
                                         const char *next, const char *next_res, char *out) {
  ln_row_stats(stats, sum_out, x, res, d, eps, 1, (sn__row_pf_t){next, next_res, out, 2});
}
/* The map of the row from its stats into y [d] (may equal x); tmp: d floats for the rows of
 * ln_map_f64. */
SN_CLONES static void ln_map_row_pairs(uint16_t *y, const double stats[2], const uint16_t *x,
                                       float *tmp, const ln_fwd_ctx_t *c, int nt) {
  ln_map_row(y, stats, x, tmp, c, 1, nt);
}

/* Rows [r0, r1) of a bf16 sn_layernorm_fwd (x, y: the whole [rows, d] tensors; mean, rstd:
 * [rows] or NULL), software-pipelined: the statistics of row r + 1 are computed before row r is
 * mapped, so the serial end of one (the lane totals, the division and the square root) overlaps
 * the other's vector work instead of stalling it. Row by row the same calls, hence the same
 * bits; with y == x, row r + 1 is read before row r is written, and the map of row r + 1 reads
 * it after (rows do not overlap). nt: y streamed, and fenced at the end (sn__stream_fence). */
static void ln_fwd_rows_pairs(uint16_t *y, float *mean, float *rstd, const uint16_t *x,
                              float *tmp, const ln_fwd_ctx_t *c, int64_t r0, int64_t r1,
                              int64_t rows, int nt) {
  const int64_t d = c->a->d;
  const float eps = c->a->eps;
/* whether row q of y is streamed: its pair blocks are whole 64-byte lines */
#define LN_NT_ROW(q) (nt && sn__aligned64(y + (q) * d))
/* row q's stats, prefetching row q + 1 of x and row q of y (not when y is streamed) */
#define LN_STATS_ROW(st, q)                                                                   \
  ln_stats_pairs(st, x + (q) * d, d, eps,                                                     \
                 (q) + 1 < rows ? (const char *)(x + ((q) + 1) * d) : NULL,                   \
                 LN_NT_ROW(q) ? NULL : (char *)(y + (q) * d))
  /* step q computes row q's statistics and maps row q − 1: one call site each, so that where
   * they are inlined (builds without target_clones) every row runs the same code, whichever
   * row starts a thread's range (a NaN's sign could differ between two copies) */
  double prev[2] = {0, 0};
  for (int64_t q = r0; q <= r1; q++) {
    double cur[2] = {0, 0};
    if (q < r1) LN_STATS_ROW(cur, q);
    if (q > r0) {
      const int64_t r = q - 1;
      ln_map_row_pairs(y + r * d, prev, x + r * d, tmp, c, LN_NT_ROW(r));
      if (mean != NULL) mean[r] = (float)prev[0];
      if (rstd != NULL) rstd[r] = (float)prev[1];
    }
    prev[0] = cur[0], prev[1] = cur[1];
  }
  sn__stream_fence(nt);
#undef LN_STATS_ROW
#undef LN_NT_ROW
}

/* Row r of the call c->a from its f32 view xr: writes y row r and mean[r], rstd[r] when given.
 * ytmp: d floats of this thread's scratch where a bf16/f16 row is computed (not xr), NULL for
 * f32. f32 only: res, sum_out, the rows of the fused kernel (ln_fwd_row; NULL for none). next:
 * the next input row, to prefetch (NULL for none). nt: stream y (f32 only). */
static void ln_fwd_store(const float *xr, const float *res, float *sum_out, float *ytmp,
                         const ln_fwd_ctx_t *c, int64_t r, const char *next, int nt) {
  void *y = c->a->y;
  float *mean = c->a->mean, *rstd = c->a->rstd;
  const sn_dtype_t dtype = c->a->dtype;
  const int64_t d = c->a->d, off = r * d, esize = sn_dtype_size(dtype);
  double stats[2];
  float *yr = sn__out_row(y, off, dtype, ytmp);
  nt = nt && dtype == SN_DTYPE_F32; /* f16 rows are computed in ytmp */
  char *out = nt ? NULL : (char *)y + off * esize; /* to prefetch for writing, unless streamed */
  ln_fwd_row(yr, stats, xr, res, sum_out, c, next, out, nt);
  sn__out_done(y, off, d, dtype, ytmp);
  if (mean != NULL) mean[r] = (float)stats[0];
  if (rstd != NULL) rstd[r] = (float)stats[1];
}

/* f32 scratch per thread of the forwards: bf16 rows of tiny or wide mean are widened into d
 * floats (ln_map_row_pairs), f16 rows into d and computed in d more (ln_fwd_store); f32 needs none. */
static int64_t ln_fwd_scratch(int64_t d, sn_dtype_t dtype) {
  return dtype == SN_DTYPE_F32 ? 0 : dtype == SN_DTYPE_BF16 ? d : 2 * d;
}

/* Rows of per_thread floats of the forwards' scratch: one per thread, and for bf16 two more
 * for gamma and beta in pairs (ln_fwd_begin). */
static int64_t ln_fwd_scratch_rows(int threads, sn_dtype_t dtype) {
  return threads + (dtype == SN_DTYPE_BF16 ? 2 : 0);
}

/* Sets c up for the call a: allocates the scratch, checks the buffers' overlap, and for bf16
 * writes gamma and beta in pairs. On an error nothing is left allocated and nothing written. */
static sn_status_t ln_fwd_begin(ln_fwd_ctx_t *c, const char *fn, const sn__rn_fwd_t *a) {
  const float *gamma = a->gamma, *beta = a->beta;
  const int64_t rows = a->rows, d = a->d;
  const sn_dtype_t dtype = a->dtype;
  sn_status_t st = SN_OK;
  *c = (ln_fwd_ctx_t){a, NULL, NULL, 0, 0, NULL,
                      sn__line_stride(ln_fwd_scratch(d, dtype), (int64_t)sizeof(float)),
                      sn__team_for(rows)};
  if (c->per_thread > 0 &&
      (c->scratch = sn__alloc(fn, ln_fwd_scratch_rows(c->threads, dtype), c->per_thread,
                              sizeof(float), &st)) == NULL)
    return st;
  st = sn__rownorm_fwd_spans(fn, a);
  if (st != SN_OK) {
    sn__free(c->scratch);
    return st;
  }
  float gmax = gamma != NULL ? 0.0f : 1.0f, bmax = 0.0f;
  for (int64_t i = 0; gamma != NULL && i < d; i++) gmax = fmaxf(gmax, fabsf(gamma[i]));
  for (int64_t i = 0; beta != NULL && i < d; i++) bmax = fmaxf(bmax, fabsf(beta[i]));
  c->pfin = sn__gamma_finite(gamma, d) && sn__gamma_finite(beta, d);
  /* |x̂| ≤ √d (in f32 to a few ulps, hence the margin) */
  c->wide = !c->pfin ||
            !(sqrt((double)d) * (double)gmax * (1.0 + 0x1p-8) + (double)bmax <= 0x1p127);
  if (dtype != SN_DTYPE_BF16) return SN_OK;
  float *pairs = c->scratch + (int64_t)c->threads * c->per_thread;
  if (gamma != NULL) sn__to_pairs(pairs, gamma, d), c->gs = pairs;
  if (beta != NULL) sn__to_pairs(pairs + c->per_thread, beta, d), c->bs = pairs + c->per_thread;
  return SN_OK;
}

sn_status_t sn_layernorm_fwd(void *y, float *mean, float *rstd, const void *x,
                             const float *gamma, const float *beta, int64_t rows, int64_t d,
                             float eps, sn_dtype_t dtype) {
  static const char fn[] = "sn_layernorm_fwd";
  const sn__rn_fwd_t a = {y, NULL, mean, rstd, x, NULL, gamma, beta, rows, d, eps, dtype, 0, 0};
  int64_t n;
  SN_TRY(sn__rownorm_fwd_check(fn, &a, &n));
  if (n == 0) return SN_OK;
  if (sn__long_row(d)) return sn__long_rows_fwd(fn, &a);

  /* scratch, per thread: f16 2·d f32 (the x row, then the y row), bf16 d f32 (a row of tiny
   * or wide mean, widened); f32 works on x and y directly */
  ln_fwd_ctx_t c;
  SN_TRY(ln_fwd_begin(&c, fn, &a));
  const int64_t esize = sn_dtype_size(dtype), per_thread = c.per_thread;
  const int threads = c.threads;
  float *scratch = c.scratch;

  /* each thread one range of consecutive rows, as schedule(static) over the rows: the bf16
   * rows pipeline their statistics a row ahead within it (ln_fwd_rows_pairs) */
  const int64_t ranges = rows < threads ? rows : threads;
  const int stream = sn__stream_out(n * esize);
#pragma omp parallel num_threads(threads)
  {
    float *tmp = scratch != NULL ? scratch + (int64_t)sn__thread_num() * per_thread : NULL;
#pragma omp for schedule(static)
    for (int64_t k = 0; k < ranges; k++) {
      const int64_t r0 = sn__chunk_begin(k, rows, ranges);
      const int64_t r1 = sn__chunk_begin(k + 1, rows, ranges);
      if (dtype == SN_DTYPE_BF16) {
        ln_fwd_rows_pairs(y, mean, rstd, x, tmp, &c, r0, r1, rows, stream);
        continue;
      }
      for (int64_t r = r0; r < r1; r++) {
        const char *next = r + 1 < rows ? (const char *)x + (r + 1) * d * esize : NULL;
        const float *xr = sn__in_row(x, r * d, d, dtype, tmp); /* x row r as f32 [d] */
        ln_fwd_store(xr, NULL, NULL, tmp != NULL ? tmp + d : NULL, &c, r, next, stream);
      }
      sn__stream_fence(stream);
    }
  }
  sn__free(scratch);
  return SN_OK;
}

sn_status_t sn_add_layernorm_fwd(void *y, void *sum_out, float *mean, float *rstd,
                                 const void *x, const void *residual, const float *gamma,
                                 const float *beta, int64_t rows, int64_t d, float eps,
                                 sn_dtype_t dtype) {
  static const char fn[] = "sn_add_layernorm_fwd";
  const sn__rn_fwd_t a = {y,    sum_out, mean, rstd, x,     residual, gamma,
                          beta, rows,    d,    eps,  dtype, 0,        1};
  int64_t n;
  SN_TRY(sn__rownorm_fwd_check(fn, &a, &n));
  if (n == 0) return SN_OK;
  if (sn__long_row(d)) return sn__long_rows_fwd(fn, &a);

  /* scratch, per thread: f16 2·d f32 (the sum row, then the y row), bf16 d f32 (a sum row of
   * tiny or wide mean, widened) */
  ln_fwd_ctx_t c;
  SN_TRY(ln_fwd_begin(&c, fn, &a));
  const int64_t esize = sn_dtype_size(dtype), per_thread = c.per_thread;
  const int threads = c.threads;
  float *scratch = c.scratch;

  const int stream = dtype == SN_DTYPE_F32 && sn__stream_out(n * esize); /* y of f32 rows */
#pragma omp parallel num_threads(threads)
  {
    float *tmp = scratch != NULL ? scratch + (int64_t)sn__thread_num() * per_thread : NULL;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      const int64_t off = r * d;
      const char *next = r + 1 < rows ? (const char *)x + (off + d) * esize : NULL;
      if (dtype == SN_DTYPE_BF16) { /* the add fused into the first pass, both in pairs */
        double stats[2];
        const char *next_res =
            r + 1 < rows ? (const char *)residual + (off + d) * esize : NULL;
        ln_stats_add_pairs(stats, (uint16_t *)sum_out + off, (const uint16_t *)x + off,
                           (const uint16_t *)residual + off, d, eps, next, next_res,
                           (char *)((uint16_t *)y + off));
        ln_map_row_pairs((uint16_t *)y + off, stats, (uint16_t *)sum_out + off, tmp, &c, 0);
        if (mean != NULL) mean[r] = (float)stats[0];
        if (rstd != NULL) rstd[r] = (float)stats[1];
      } else if (dtype == SN_DTYPE_F32) { /* likewise (ln_fwd_row) */
        ln_fwd_store((const float *)x + off, (const float *)residual + off,
                     (float *)sum_out + off, NULL, &c, r, next, stream);
      } else {
        const float *sr = sn__residual_sum_row(sum_out, x, residual, tmp, off, d, dtype);
        /* y is computed over the residual row, no longer needed */
        ln_fwd_store(sr, NULL, NULL, tmp + d, &c, r, NULL, 0);
      }
    }
    sn__stream_fence(stream);
  }
  sn__free(scratch);
  return SN_OK;
}
