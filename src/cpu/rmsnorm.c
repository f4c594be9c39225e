/*
 * rmsnorm.c — RMSNorm forward and backward, and the fused residual add + RMSNorm forward, on the
 * CPU. Every tensor is row-major [rows, d]; one row is normalized over its d elements.
 *
 * Per row, forward:
 *   pass 1  rstd = 1/√(Σx²/d + eps)           fp64, SN_ROW_LANES fixed lanes (no overflow);
 *                                              bf16/f16 rows: f32 blocks of 16 squares per lane
 *                                              added in fp64 (sn__row_sumsq_lowp)
 *   pass 2  y = (x·rstd)·gamma                 f32: a product has no cancellation, so the f32
 *                                              map is within a few f32 ulps elementwise
 * The row stays in L1/L2 between the passes: x is read from DRAM once and y written once. Pass 1
 * prefetches the next input row and this row's output (as LayerNorm's: the memory fetches
 * them while the passes run in cache).
 * f16 rows are widened into per-thread f32 scratch rows ([threads, d] floats, allocated before
 * the parallel region), computed there and narrowed once, round-to-nearest-even. bf16 rows take
 * a path with the same results and no f32 row (rms_fwd_rows_bf16): each pass widens x in
 * registers, 32 values at a time as even and odd halves of 16 words (sn__pair_widen: a shift
 * and a mask instead of shuffles), the second narrowing y the same way. The fused kernel adds
 * x + residual in the first pass (f32 and bf16; f16 in a pass of its own over L1-sized
 * blocks, sn__residual_sum_row), storing sum_out as it goes.
 *
 * Backward, per row, with g = dy·gamma and the saved f32 rstd s:
 *   pass A  Σg·x                               fp64
 *   pass B  x̂ = x·s, e = s²·Σg·x/d (= s·mean(g·x̂)), dx = s·g − x̂·e,  dgamma partial += dy·x̂
 * x̂ is O(1) (|x̂| ≤ √d) and e of the size of the terms s·g, so no f32 factor or intermediate
 * leaves the f32 range unless dx's own terms do: b = s³·mean(g·x), the factor of x in the same
 * gradient written as s·g − b·x, is subnormal from an RMS of ~2^63 on and overflows for a
 * subnormal eps; s·(g − x̂·mean(g·x̂)) overflows in the parentheses for g near FLT_MAX.
 * Rows whose sum or e is not held by an f32 (g beyond FLT_MAX, inf/NaN in the row, dx
 * terms at the ends of the range) are computed in fp64 (rms_bwd_row_f64).
 * dgamma = Σ_rows dy·x·rstd is summed per fixed chunk of rows (cpu.h), in f32 over runs of
 * SN_PART_ROWS rows added in fp64 (rownorm_bwd.h), and the chunk partials are added in chunk order
 * (the shared driver, rownorm_bwd.c): bitwise the same for any thread count.
 * bf16 rows run both passes on x and dy read in pairs, as the forward (rms_bwd_pairs: no f32
 * copies of the rows, dx narrowed as it is stored, the f32 dgamma partials in pair order), and
 * are bitwise the f32 backward on the widened rows; rows it declines (the fp64 cases above)
 * take the widened rows. f16 rows are widened into per-thread f32 rows.
 *
 * Threads: OpenMP over rows (or chunks of rows); the row functions below carry SN_CLONES and no
 * OpenMP pragmas.
 */
#include <math.h>
#include <string.h>

#include "longrow.h"
#include "rownorm_bwd.h"

/* ------------------------------------------------------------------------------------------ */
/* forward                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* y [d] = (x·rstd)·gamma in f32 for one row x [d], f32 or (bf16) bf16, y of x's dtype (may equal
 * x): sn__map_row, gamma NULL or gb (gamma for f32, in pairs for bf16, sn__to_pairs). nt: y
 * streamed. gfin (bf16): gamma NULL or all finite. Where the row's sum of squares was finite too
 * (rstd finite and > 0: the row is finite), no y is NaN: |x·rstd| <= √d·(1 + 2^-19) (x² is at
 * most the sum of squares, whose f32 blocks err by < 2^-19.9, sn__row_sumsq_lowp) and gamma
 * finite make y finite or ±inf, so a bf16 y is narrowed without sn__f32_to_bf16's NaN case (the
 * same bits, sn__map_row's finite). */
SN_INLINE void rms_map_row(void *y, const void *x, const float *gamma, const float *gb, int64_t d,
                           double rstd, int gfin, int bf16, int nt) {
  const sn__row_map_t m = {gb, gamma, NULL, NULL, 0.0f, 0.0f, (float)rstd};
  if (bf16 && gfin && rstd > 0.0 && isfinite(rstd)) {
    if (gamma != NULL) sn__map_row(y, x, d, &m, bf16, 1, 0, 0, nt, 1);
    else sn__map_row(y, x, d, &m, bf16, 0, 0, 0, nt, 1);
  } else {
    if (gamma != NULL) sn__map_row(y, x, d, &m, bf16, 1, 0, 0, nt, 0);
    else sn__map_row(y, x, d, &m, bf16, 0, 0, 0, nt, 0);
  }
}

/* One row of the call a (its gamma, d, eps; bf16/f16 rows computed in f32): x [d] f32 → y [d]
 * f32 (y may equal x); returns rstd in fp64. With res [d] (the fused kernel, f32 rows only; NULL
 * for none) the row normalized is the residual sum x + res, written into sum_out [d] by the
 * first pass (sum_out may equal x or res; y may not overlap them). next, out: the rows of a's
 * dtype the first pass prefetches (sn__row_pf_t; NULL for none). nt: y streamed. */
SN_CLONES static double rms_fwd_row(float *y, const float *x, const float *res, float *sum_out,
                                    const sn__rn_fwd_t *a, const char *next, char *out, int nt) {
  const float *gamma = a->gamma;
  const int64_t d = a->d;
  const float eps = a->eps;
  const int esize = (int)sn_dtype_size(a->dtype), lowp = a->dtype != SN_DTYPE_F32;
  const sn__row_pf_t pf = {next, NULL, out, esize};
  double ss;
  if (lowp) {
    ss = sn__row_sumsq_lowp(NULL, x, NULL, d, 0, pf);
  } else {
    ss = sn__row_sumsq_w(sum_out, x, res, 0, d, 0.0, pf);
    if (res != NULL) x = sum_out; /* the map reads the stored sums, cache-hot */
  }
  const double rstd = 1.0 / sqrt(ss / (double)d + (double)eps);
  rms_map_row(y, x, gamma, gamma, d, rstd, 0, 0, nt);
  return rstd;
}

/* One bf16 row, bitwise as rms_fwd_row on the widened row (the f16 path), in two passes with
 * no f32 copy of the row: rms_rstd_bf16 sums the squares as x is widened in registers
 * (sn__row_sumsq_lowp; x read from memory once), then rms_map_bf16 widens x, now cache-hot,
 * again and maps it, narrowing y as it is stored (sn__map_row; y written once). With res [d]
 * (the fused kernel; NULL for none) the row normalized is the residual sum, rounded to bf16
 * into sum_out [d] by the first pass and read back by the second: bitwise the generic path
 * (sn__residual_sum_row, then this row on sum_out). gs: gamma in pairs (sn__to_pairs), NULL
 * with gamma NULL. next: the next input row to prefetch, out: this row of y (NULL: none; not
 * when y is streamed). rms_fwd_rows_bf16 runs them a row apart. */
SN_CLONES static double rms_rstd_bf16(const uint16_t *x, const uint16_t *res, uint16_t *sum_out,
                                      int64_t d, float eps, const char *next, char *out) {
  const double ss = sn__row_sumsq_lowp(sum_out, x, res, d, 1, (sn__row_pf_t){next, NULL, out, 2});
  return 1.0 / sqrt(ss / (double)d + (double)eps);
}
/* The map of that row (rms_map_row) from its rstd: xm [d] (x or sum_out), y [d] bf16. */
SN_CLONES static void rms_map_bf16(uint16_t *y, const uint16_t *xm, const float *gamma,
                                   const float *gs, int64_t d, double rstd, int gfin, int nt) {
  rms_map_row(y, xm, gamma, gs, d, rstd, gfin, 1, nt);
}

/* Rows [r0, r1) of a bf16 sn_rmsnorm_fwd or (res, sum_out non-NULL) sn_add_rmsnorm_fwd (the
 * whole [rows, d] tensors; rstd [rows] or NULL), software-pipelined as LayerNorm's bf16 rows
 * (ln_fwd_rows_pairs): the squares of row r + 1 are summed before row r is mapped, so the
 * serial end of one (lane totals, division, square root) overlaps the other's vector work. Row
 * by row the same calls, hence the same bits. In place (y == x, or sum_out == x or res), row
 * r + 1 is read before row r is written, and the map of row r + 1 comes after (rows do not
 * overlap). nt: y streamed where its row starts a 64-byte line (whole lines of pairs), and
 * fenced at the end. */
static void rms_fwd_rows_bf16(const sn__rn_fwd_t *a, const float *gs, int gfin, int64_t r0,
                              int64_t r1, int nt) {
  uint16_t *y = a->y, *sum_out = a->sum_out;
  float *rstd = a->rstd;
  const uint16_t *x = a->x, *res = a->res;
  const float *gamma = a->gamma;
  const int64_t rows = a->rows, d = a->d;
  const float eps = a->eps;
/* whether row q of y is streamed */
#define RMS_NT_ROW(q) (nt && sn__aligned64(y + (q) * d))
/* row q's rstd, prefetching row q + 1 of x and row q of y (not when y is streamed) */
#define RMS_RSTD_ROW(q)                                                                      \
  rms_rstd_bf16(x + (q) * d, res != NULL ? res + (q) * d : NULL,                             \
                sum_out != NULL ? sum_out + (q) * d : NULL, d, eps,                          \
                (q) + 1 < rows ? (const char *)(x + ((q) + 1) * d) : NULL,                   \
                RMS_NT_ROW(q) ? NULL : (char *)(y + (q) * d))
  /* step q sums row q and maps row q − 1: one call site each, so that in builds where they
   * are inlined every row runs the same code (a NaN's sign could differ between copies) */
  const uint16_t *xm = res != NULL ? sum_out : x; /* the rows mapped */
  double prev = 0.0;
  for (int64_t q = r0; q <= r1; q++) {
    const double cur = q < r1 ? RMS_RSTD_ROW(q) : 0.0;
    if (q > r0) {
      rms_map_bf16(y + (q - 1) * d, xm + (q - 1) * d, gamma, gs, d, prev, gfin,
                   RMS_NT_ROW(q - 1));
      if (rstd != NULL) rstd[q - 1] = (float)prev;
    }
    prev = cur;
  }
  sn__stream_fence(nt);
#undef RMS_RSTD_ROW
#undef RMS_NT_ROW
}

/* The bf16 rows of sn_rmsnorm_fwd (res, sum_out NULL) or sn_add_rmsnorm_fwd: each thread one
 * range of consecutive rows (rms_fwd_rows_bf16), as schedule(static) would give it. */
static void rms_fwd_bf16(const sn__rn_fwd_t *a, const float *gs, int nt) {
  const int64_t rows = a->rows, threads = sn__max_threads();
  const int64_t ranges = rows < threads ? rows : threads;
  const int gfin = sn__gamma_finite(a->gamma, a->d); /* rms_map_bf16 */
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < ranges; k++)
    rms_fwd_rows_bf16(a, gs, gfin, sn__chunk_begin(k, rows, ranges),
                      sn__chunk_begin(k + 1, rows, ranges), nt);
}

/* Row r of the call a from its f32 view xr: writes y row r and rstd[r] when given. tmp: this
 * thread's d floats of scratch for bf16/f16 (the row is computed there; it may be xr), NULL
 * for f32. f32 only: res, sum_out, the rows of the fused kernel (rms_fwd_row; NULL for none).
 * next: the next input row, to prefetch (NULL for none). nt: stream y (f32 only). */
static void rms_fwd_store(const sn__rn_fwd_t *a, const float *xr, const float *res,
                          float *sum_out, float *tmp, int64_t r, const char *next, int nt) {
  const sn_dtype_t dtype = a->dtype;
  const int64_t d = a->d, off = r * d, esize = sn_dtype_size(dtype);
  float *yr = sn__out_row(a->y, off, dtype, tmp);
  nt = nt && dtype == SN_DTYPE_F32; /* f16 rows are computed in tmp */
  const double rs =
      rms_fwd_row(yr, xr, res, sum_out, a, next, nt ? NULL : (char *)a->y + off * esize, nt);
  sn__out_done(a->y, off, d, dtype, tmp);
  if (a->rstd != NULL) a->rstd[r] = (float)rs;
}

/* sn_rmsnorm_fwd (a->fused 0: res, sum_out NULL) and sn_add_rmsnorm_fwd (a->fused 1; a NULL
 * res or sum_out is then the caller's error, which the check reports). */
static sn_status_t rms_fwd(const char *fn, const sn__rn_fwd_t *a) {
  void *sum_out = a->sum_out;
  const void *x = a->x, *residual = a->res;
  const float *gamma = a->gamma;
  const int64_t rows = a->rows, d = a->d;
  const sn_dtype_t dtype = a->dtype;
  const int fused = a->fused;
  int64_t n;
  SN_TRY(sn__rownorm_fwd_check(fn, a, &n));
  if (n == 0) return SN_OK;
  if (sn__long_row(d)) return sn__long_rows_fwd(fn, a);

  /* scratch: [threads, row_stride] f32 rows (d rounded up to whole lines) for f16 (the x row,
   * or the widened sum row; y is computed there); for bf16 one row, gamma in pairs
   * (sn__map_row); f32 works on x and y directly */
  const int64_t esize = sn_dtype_size(dtype);
  sn_status_t st = SN_OK;
  const int64_t row_stride = sn__line_stride(d, sizeof(float)); /* per thread */
  const int team = sn__team_for(rows); /* the f16 rows' threads */
  float *scratch = NULL;
  if (dtype != SN_DTYPE_F32 &&
      (scratch = sn__alloc(fn, dtype == SN_DTYPE_BF16 ? 1 : team, row_stride,
                           sizeof(float), &st)) == NULL)
    return st;
  /* after the scratch (its failure tests pass sizes no buffer has), before any write */
  st = sn__rownorm_fwd_spans(fn, a);
  if (st != SN_OK) {
    sn__free(scratch);
    return st;
  }

  const float *gs = NULL; /* bf16: gamma in pairs (sn__map_row), in the scratch */
  if (dtype == SN_DTYPE_BF16 && gamma != NULL) {
    sn__to_pairs(scratch, gamma, d);
    gs = scratch;
  }

  const int stream = sn__stream_out(n * esize); /* y (sum_out, read back at once, is not) */
  if (dtype == SN_DTYPE_BF16) { /* pipelined rows, a range per thread (fused: the add first) */
    rms_fwd_bf16(a, gs, stream);
  } else {
#pragma omp parallel num_threads(team)
    {
      float *tmp = scratch != NULL ? scratch + (int64_t)sn__thread_num() * row_stride : NULL;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; r++) {
        const int64_t off = r * d;
        const char *next = r + 1 < rows ? (const char *)x + (off + d) * esize : NULL;
        if (!fused) {
          const float *xr = sn__in_row(x, off, d, dtype, tmp); /* x row r as f32 [d] */
          rms_fwd_store(a, xr, NULL, NULL, tmp, r, next, stream);
        } else if (dtype == SN_DTYPE_F32) { /* the add in the first pass (rms_fwd_row) */
          rms_fwd_store(a, (const float *)x + off, (const float *)residual + off,
                        (float *)sum_out + off, NULL, r, next, stream);
        } else {
          const float *sr = sn__residual_sum_row(sum_out, x, residual, tmp, off, d, dtype);
          rms_fwd_store(a, sr, NULL, NULL, tmp, r, NULL, 0);
        }
      }
      sn__stream_fence(stream);
    }
  }
  sn__free(scratch);
  return SN_OK;
}

sn_status_t sn_rmsnorm_fwd(void *y, float *rstd, const void *x, const float *gamma,
                           int64_t rows, int64_t d, float eps, sn_dtype_t dtype) {
  const sn__rn_fwd_t a = {y, NULL, NULL, rstd, x, NULL, gamma, NULL, rows, d, eps, dtype, 1, 0};
  return rms_fwd("sn_rmsnorm_fwd", &a);
}

sn_status_t sn_add_rmsnorm_fwd(void *y, void *sum_out, float *rstd, const void *x,
                               const void *residual, const float *gamma, int64_t rows,
                               int64_t d, float eps, sn_dtype_t dtype) {
  const sn__rn_fwd_t a = {y,    sum_out, NULL, rstd,  x, residual, gamma,
                          NULL, rows,    d,    eps,   dtype, 1, 1};
  return rms_fwd("sn_add_rmsnorm_fwd", &a);
}

/* ------------------------------------------------------------------------------------------ */
/* backward                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* g = dy·gamma in f32 (has_g constant after inlining). */
SN_INLINE float rms_g(float dy, const float *gamma, int64_t i, int has_g) {
  return has_g ? dy * gamma[i] : dy;
}

/* One row of the backward in fp64 throughout, for rows rms_bwd_row_impl cannot map in f32: g =
 * dy·gamma and the sum Σg·x exact or fp64, dx = s·g − x̂·e rounded once to f32; with dgp64
 * the dgamma terms dy·x̂ go to the chunk's fp64 partial. dx may equal dy. Scalar: only rows with
 * values near the ends of the f32 range, or inf/NaN, get here. */
static void rms_bwd_row_f64(float *dx, double *dgp64, const float *dy, const float *x,
                            const float *gamma, int64_t d, float s) {
  double sum = 0.0;
  for (int64_t i = 0; i < d; i++)
    sum += (double)dy[i] * (gamma != NULL ? (double)gamma[i] : 1.0) * (double)x[i];
  const double sd = (double)s, e = sd * sd * (sum / (double)d);
  for (int64_t i = 0; i < d; i++) {
    const double dyi = (double)dy[i], xh = SN_RMS_XHAT((double)x[i], sd);
    const double g = dyi * (gamma != NULL ? (double)gamma[i] : 1.0);
    if (dgp64 != NULL) dgp64[i] += dyi * xh;
    dx[i] = (float)SN_RMS_DX(g, xh, sd, e);
  }
}

/* Bounds on a row's dgamma terms |dy·x̂| ≤ max|dy|·max|x|·s for the f32 partials
 * (SN_PART_ROWS): above SN_PART_F32_MAX they could overflow them; below RMS_PART_F32_MIN some
 * are subnormal in f32 and lose bits (x near the subnormal range with eps dominating rstd: up
 * to 4e-6 relative in dgamma). Such rows add their terms, exact in fp64, into the
 * chunk's fp64 partial dgp64 instead; the choice depends on the row's data only. */
#define RMS_PART_F32_MIN 0x1p-100

/* Whether a row's dx can be mapped in f32: its terms s·g and x̂·e, and x̂ = x·s, bounded with the
 * row's max|dy|, max|x| (mdy, mx) and max|gamma| over the call (gmax; 1 without gamma) by
 * |s|·mdy·gmax + |s|·mx·|e| and |s|·mx, stay below RMS_TERM_F32_MAX, so that no f32 product or
 * difference of the map overflows. Otherwise a term beyond FLT_MAX would make dx ±inf where
 * the difference is finite (x ≈ 0.5, g ≈ 3e38 on half of the row: s·g ≈ 6e38, dx ≈ ±3e38;
 * test_bwd_term_overflow), so such rows go to rms_bwd_row_f64. False for NaN bounds. The
 * decision depends on the row's data and gamma only, and is the same for bf16 rows. */
#define RMS_TERM_F32_MAX 0x1p127
static inline int rms_terms_f32(double sd, float mdy, float mx, float gmax, double ed) {
  const double s = fabs(sd), xh = s * (double)mx;
  return s * (double)mdy * (double)gmax + xh * fabs(ed) <= RMS_TERM_F32_MAX &&
         xh <= RMS_TERM_F32_MAX;
}

/* One row of the backward: dx (may equal dy: each element or block is read before it is
 * written) from dy, x [d], all f32 or (bf16) bf16, and the saved rstd s. With has_part, dgp[i]
 * += dy·x̂ into the f32 partial of dgamma (for bf16 rows in pair order, sn__flush_pairs), or into
 * the chunk's fp64 partial dgp64 for a row outside the f32 partials' range (RMS_PART_F32_MIN,
 * SN_PART_F32_MAX). Returns 1, having written nothing, for a row whose Σg·x is not finite, whose
 * e is not held by an f32, or whose terms may leave the f32 range (rms_terms_f32; gmax =
 * max|gamma| over the call, 1 without): the caller computes it with rms_bwd_row_f64 (on the
 * widened rows). Pass A: blocks of SN_PAIR (sn__block_load_arr), element i in fp64 lane
 * i % SN_ROW_LANES (a bf16 block's lanes, its even elements first, put back in element order),
 * so a bf16 row gives the bits of its widened f32 copy; pass B in blocks where the rows are bf16
 * or dx streams (gamma and the partial in block order), else element by element, a loop GCC
 * vectorizes. */
SN_INLINE int rms_bwd_row_impl(void *dx, const sn__bwd_part_t *part, const void *dy,
                               const void *x, const sn__bwd_row_t *row, int has_g, int has_part,
                               int bf16) {
  float *dgp = part->g32;
  double *dgp64 = part->g64;
  const float *gamma = row->gamma, *gb = bf16 ? row->gs : row->gamma;
  const float gmax = row->gmax, s = row->s;
  const int64_t d = row->d;
  const sn__bwd_prefetch_t *pf = row->pf;
  /* pass A: Σ g·x in fp64 lanes (the product of two floats is exact in fp64), and max|dy|,
   * max|x| */
  double ab[SN_PAIR] = {0}; /* a block's lanes: e's 16, then o's */
  float mdy[SN_PAIR] = {0}, mx[SN_PAIR] = {0};
  int64_t i = 0;
  for (; i + SN_PAIR <= d; i += SN_PAIR) {
    sn__bwd_prefetch_block(pf, i);
    float xw[SN_PAIR], dw[SN_PAIR];
    const float *xv, *dv, *gv = has_g ? gb + i : NULL; /* gv: gamma's block */
    sn__bwd_block_vals(&xv, &dv, xw, dw, x, dy, i, bf16);
    for (int k = 0; k < SN_PAIR; k++) {
      ab[k] += (double)(has_g ? dv[k] * gv[k] : dv[k]) * (double)xv[k];
      mdy[k] = sn__max_abs(mdy[k], dv[k]), mx[k] = sn__max_abs(mx[k], xv[k]);
    }
  }
  double acc[SN_ROW_LANES];
  if (bf16) sn__pair_lanes(acc, ab, ab + SN_PAIR / 2);
  else memcpy(acc, ab, sizeof acc);
  float a = 0.0f, bx = 0.0f; /* max|dy|, max|x| */
  for (int k = 0; k < SN_PAIR; k++) a = sn__max_abs(a, mdy[k]), bx = sn__max_abs(bx, mx[k]);
  for (int k = 0; k < SN_ROW_LANES && i < d; i++, k++) {
    const float dyi = sn__load_w(dy, bf16, i), xi = sn__load_w(x, bf16, i);
    acc[k] += (double)rms_g(dyi, gamma, i, has_g) * (double)xi;
    a = sn__max_abs(a, dyi), bx = sn__max_abs(bx, xi);
  }
  const double sum = sn__lanes_total(acc), sd = (double)s, ed = sd * sd * (sum / (double)d);
  /* f32 g beyond FLT_MAX, inf/NaN in the row, e or a term beyond the f32 range */
  if (!isfinite(sum) || !sn__f32_holds(ed) || !rms_terms_f32(sd, a, bx, gmax, ed)) return 1;
  /* max|dy|·max|x|·s, bounding the dgamma terms */
  const double term = has_part ? (double)a * (double)bx * fabs(sd) : 0.0;
  const float e = (float)ed;

  /* pass B */
  if (has_part && !(term >= RMS_PART_F32_MIN && term <= SN_PART_F32_MAX) && term != 0.0) {
    SN_IVDEP
    for (int64_t j = 0; j < d; j++) {
      const float dyj = sn__load_w(dy, bf16, j), xj = sn__load_w(x, bf16, j);
      dgp64[j] += (double)dyj * SN_RMS_XHAT((double)xj, sd);
      sn__store_w(dx, bf16, j, SN_RMS_DX(rms_g(dyj, gamma, j, has_g), SN_RMS_XHAT(xj, s), s, e));
    }
    return 0;
  }
#define RMS_DX_EL(j)                                                                          \
  do {                                                                                        \
    const float dyj_ = sn__load_w(dy, bf16, j), xh_ = SN_RMS_XHAT(sn__load_w(x, bf16, j), s); \
    if (has_part) dgp[j] += dyj_ * xh_;                                                       \
    sn__store_w(dx, bf16, j, SN_RMS_DX(rms_g(dyj_, gamma, j, has_g), xh_, s, e));             \
  } while (0)
  const int nt = pf->nt;
  int64_t j = 0;
  if (nt && !bf16) /* ordinary stores up to a 64-byte line, then streamed blocks */
    for (const int64_t h = sn__head64(dx, d); j < h; j++) RMS_DX_EL(j);
  for (; (bf16 || nt) && j + SN_PAIR <= d; j += SN_PAIR) {
    sn__pf xe, xo, ye, yo, pe, po;
    sn__block_load(&xe, &xo, x, j, bf16);
    sn__block_load(&ye, &yo, dy, j, bf16);
    xe = SN_RMS_XHAT(xe, s);
    xo = SN_RMS_XHAT(xo, s);
    if (has_part) {
      sn__pair_load(&pe, &po, dgp + j);
      pe += ye * xe;
      po += yo * xo;
      sn__pair_store(dgp + j, &pe, &po);
    }
    if (has_g) {
      sn__pair_load(&pe, &po, gb + j);
      ye = ye * pe;
      yo = yo * po;
    }
    ye = SN_RMS_DX(ye, xe, s, e);
    yo = SN_RMS_DX(yo, xo, s, e);
    /* No dx here is NaN (a row with a NaN or infinite input, or terms beyond the f32 range,
     * left after pass A: rms_terms_f32), so a bf16 dx is narrowed without sn__f32_to_bf16's
     * NaN case, with the same bits. */
    sn__block_store(dx, j, &ye, &yo, bf16, nt, 1);
  }
  SN_IVDEP
  for (; j < d; j++) RMS_DX_EL(j);
#undef RMS_DX_EL
  return 0;
}

/* rms_bwd_row_impl of f32 rows (bf16: 0; an f16 row widened) and of bf16 rows (1), each with
 * its has_g and has_part constants. */
#define RMS_BWD_DISPATCH(BF16)                                                                \
  do {                                                                                        \
    const int g_ = row->gamma != NULL, p_ = part->g32 != NULL;                                \
    if (g_ && p_) return rms_bwd_row_impl(dx, part, dy, x, row, 1, 1, BF16);                  \
    if (g_) return rms_bwd_row_impl(dx, part, dy, x, row, 1, 0, BF16);                        \
    if (p_) return rms_bwd_row_impl(dx, part, dy, x, row, 0, 1, BF16);                        \
    return rms_bwd_row_impl(dx, part, dy, x, row, 0, 0, BF16);                                \
  } while (0)
SN_CLONES static int rms_bwd_row(float *dx, const sn__bwd_part_t *part, const float *dy,
                                 const float *x, const sn__bwd_row_t *row) {
  RMS_BWD_DISPATCH(0);
}
SN_CLONES static int rms_bwd_pairs(uint16_t *dx, const sn__bwd_part_t *part, const uint16_t *dy,
                                   const uint16_t *x, const sn__bwd_row_t *row) {
  RMS_BWD_DISPATCH(1);
}
#undef RMS_BWD_DISPATCH

/* Row r of the call c. tmp: this thread's [2, d] f32 scratch for bf16/f16 (x widened into
 * tmp[0, d), dy into tmp[d, 2d) where dx is then computed and narrowed from), NULL for f32.
 * part: where the row adds its dgamma terms. bf16 rows take rms_bwd_pairs (c->gs: gamma in
 * pairs; part's f32 partial then in pair order), other rows rms_bwd_row; a row they decline is
 * computed in fp64 (rms_bwd_row_f64, on the widened rows). */
static void rms_bwd_store(const sn__bwd_call_t *c, const sn__bwd_part_t *part, int64_t r,
                          float *tmp) {
  const sn__rn_bwd_t *a = c->a;
  const int64_t d = a->d, off = r * d;
  const sn_dtype_t dtype = a->dtype;
  sn__bwd_prefetch_t pf;
  sn__bwd_row_t row;
  const int nt = sn__bwd_row_setup(&pf, &row, c, r);
  if (dtype == SN_DTYPE_BF16 &&
      rms_bwd_pairs((uint16_t *)a->dx + off, part, (const uint16_t *)a->dy + off,
                    (const uint16_t *)a->x + off, &row) == 0)
    return;
  const float *xr, *dyr;
  float *dxr;
  sn__bwd_views(a, r, tmp, &xr, &dyr, &dxr);
  pf.nt = nt && dtype == SN_DTYPE_F32; /* a bf16 row declined by the pairs is computed in tmp */
  if (dtype == SN_DTYPE_BF16 || rms_bwd_row(dxr, part, dyr, xr, &row) != 0)
    rms_bwd_row_f64(dxr, part->g32 != NULL ? part->g64 : NULL, dyr, xr, a->gamma, d, row.s);
  sn__bwd_views_done(a, r, tmp);
}

sn_status_t sn_rmsnorm_bwd(void *dx, float *dgamma, const void *dy, const void *x,
                           const float *rstd, const float *gamma, int64_t rows, int64_t d,
                           sn_dtype_t dtype) {
  static const char fn[] = "sn_rmsnorm_bwd";
  const sn__rn_bwd_t a = {dx, dgamma, NULL, dy, x, NULL, rstd, gamma, rows, d, dtype, 1};
  return sn__rownorm_bwd_run(fn, &a, rms_bwd_store);
}
