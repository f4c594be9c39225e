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
 * (x − hi) is exact when x is near the mean (Sterbenz), so |mean| ≫ σ loses nothing; for
 * bf16/f16 outputs with beta, blocks where beta cancels x̂·gamma too deeply for the 1-ulp bound
 * are recomputed in fp64 (ln_map_beta), and so is every block of a row whose mean is 2^103 or
 * more, where x − hi itself can overflow f32 (SN_CENTRE_F32_MAX; the backward's such rows are
 * computed in fp64 throughout).
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

#include "rownorm.h"

/* y[i] = ((x[i] − hi) − lo)·s·gamma[i] + beta[i] in f32; mean = hi + lo, s = (float)rstd.
 * has_g and has_b are constants after inlining (sn__map_f32). nt: y streamed. Its error is
 * ~5 f32 roundings (2^-24 each) of t·gamma (x − hi, − lo, rstd rounded to f32, · rstd,
 * · gamma) plus one of y: relative to y without beta, and far inside the 1-ulp bound of any
 * output dtype then (rows whose mean is below LN_SPLIT_MIN excepted: they take ln_map_beta).
 * With beta, t·gamma + beta can cancel: fine for f32 outputs (1e-6 normwise), not for the
 * 1-ulp bound of bf16/f16 outputs, which use ln_map_beta. */
SN_INLINE void ln_map_f32(float *y, const float *x, const float *gamma, const float *beta,
                          int64_t d, double mean, double rstd, int has_g, int has_b, int nt) {
  const float hi = (float)mean, lo = (float)(mean - (double)hi), s = (float)rstd;
  sn__map_f32(y, x, gamma, beta, d, hi, lo, s, has_g, has_b, 1, nt);
}

/* bf16/f16 outputs with beta: y = p + beta[i], p = x̂·gamma, must round to within 1 ulp of the
 * exactly rounded output, but beta can cancel p to any depth. The f32 p carries ~5 roundings
 * (x − hi, − lo, rstd to f32, · rstd, · gamma): |p̂ − p| < 2^-21·|p|, and y one more, 2^-24·|y|.
 * Where |p| ≤ LN_CANCEL_LIM·|y| that is < (2^-21·LN_CANCEL_LIM + 2^-24)·|y|: below half an ulp
 * of the output (2^-9·|y| for bf16, 2^-12·|y| for normal f16), so the f32 value narrows to
 * within 1 ulp. Blocks of LN_MAP_BLOCK elements are computed in f32; a block with any element
 * beyond the limit or not finite (p·gamma may overflow f32 where p·gamma + beta does not) is
 * recomputed in fp64. With gamma and beta unrelated about 2^-10 (bf16) of the elements are
 * beyond the limit, so a few per cent of the blocks take the recomputation. Its error is that
 * of the fp64 mean and rstd (rownorm.h: about 2^-45 of |p| at d = 4096), so it holds the 1-ulp
 * bound for cancellations down to about |y| = 2^-35·|p|; deeper ones (beta = −round_f32(x̂·gamma)
 * reaches ~2^-24·7/d·|p| at the worst element of a row) can miss it at large d: at d = 65536,
 * up to hundreds of ulp with the two-pass statistics on two-valued rows, and up to ~20 ulp
 * with the one-pass ones on heavy-tailed rows with |mean| ≪ σ (3 with two passes). */
#define LN_MAP_BLOCK 128
/* bf16: 2^-21·2^10 + 2^-24 < 2^-10, a quarter of the half ulp; f16: 2^-21·2^8 + 2^-24 < 2^-12. */
#define LN_CANCEL_LIM_BF16 0x1p10f
#define LN_CANCEL_LIM_F16 0x1p8f

/* The f32 maps hold the fp64 mean as hi + lo (48 bits) only while lo = mean − hi is a normal
 * float: |lo| ≤ 2^-24·|mean| must stay ≥ 2^-126. Below LN_SPLIT_MIN (nonzero) hi + lo can be
 * off by ~2^-150 absolute, a large part of x − mean when the row's values are that small, so
 * such rows take the checked map with limit 0: every block in fp64 (not only those with a
 * nonzero f32 term: below 2^-150 hi and lo are both 0, and a block of zeros would map to
 * y = 0 where y = −mean·rstd, a normal float). Rows of wide mean take it too. */
#define LN_SPLIT_MIN 0x1p-100

static inline int ln_tiny_mean(double mean) { return mean != 0.0 && fabs(mean) < LN_SPLIT_MIN; }

/* One block of m ≤ LN_MAP_BLOCK elements of the checked map into yb [m] (f32, not aliasing x).
 * has_b == 0 (no beta: only for tiny means, with lim 0) reads no beta. Returns whether the block
 * was recomputed in fp64: if not, every value in yb is finite. */
SN_INLINE int ln_map_beta_block(float *yb, const float *x, const float *gamma,
                                 const float *beta, int64_t m, double mean, double rstd, float hi,
                                 float lo, float s, float lim, int has_g, int has_b) {
  int bad = lim == 0.0f; /* limit 0: every block in fp64 (LN_SPLIT_MIN) */
  for (int64_t k = 0; k < m; k++) {
    float p = ((x[k] - hi) - lo) * s;
    if (has_g) p = p * gamma[k];
    const float v = has_b ? p + beta[k] : p, av = fabsf(v);
    yb[k] = v;
    bad |= (int)!(fabsf(p) <= lim * av) | (int)!(av <= FLT_MAX); /* NaN and ±inf are bad */
  }
  if (bad)
    for (int64_t k = 0; k < m; k++) {
      double t = ((double)x[k] - mean) * rstd;
      if (has_g) t = t * (double)gamma[k];
      yb[k] = (float)(has_b ? t + (double)beta[k] : t);
    }
  return bad;
}

/* The checked map of a whole row into y [d]: f32 (may equal x; the f16 path)
 * or, with to_bf16, bf16 narrowed block by block as it is stored (the same f32 values and the
 * same rounding as the f32 row followed by sn__from_f32, without the f32 output row). */
SN_INLINE void ln_map_beta(void *y, const float *x, const float *gamma, const float *beta,
                           int64_t d, double mean, double rstd, float lim, int has_g, int has_b,
                           int to_bf16) {
  const float hi = (float)mean, lo = (float)(mean - (double)hi), s = (float)rstd;
  float yb[LN_MAP_BLOCK];
  for (int64_t i = 0; i < d; i += LN_MAP_BLOCK) {
    const int64_t m = d - i < LN_MAP_BLOCK ? d - i : LN_MAP_BLOCK;
    int redone;
    if (m == LN_MAP_BLOCK) /* a constant trip count for the vectorizer */
      redone = ln_map_beta_block(yb, x + i, has_g ? gamma + i : NULL, has_b ? beta + i : NULL,
                                 LN_MAP_BLOCK, mean, rstd, hi, lo, s, lim, has_g, has_b);
    else
      redone = ln_map_beta_block(yb, x + i, has_g ? gamma + i : NULL, has_b ? beta + i : NULL,
                                 m, mean, rstd, hi, lo, s, lim, has_g, has_b);
    if (to_bf16 && !redone) /* all finite: the rounding without the NaN case */
      for (int64_t k = 0; k < m; k++) ((uint16_t *)y)[i + k] = sn__f32_to_bf16_finite(yb[k]);
    else if (to_bf16)
      for (int64_t k = 0; k < m; k++) ((uint16_t *)y)[i + k] = sn__f32_to_bf16(yb[k]);
    else
      memcpy((float *)y + i, yb, (size_t)m * sizeof(float));
  }
}

/* The limit of the checked map for a row (ln_map_beta), or a negative value where the plain f32
 * map (ln_map_f32) is exact enough: f32 outputs, and bf16/f16 without beta, unless the mean is
 * tiny or wide (then limit 0: fp64). */
static inline float ln_check_lim(double mean, int has_b, sn_dtype_t dtype) {
  if (ln_tiny_mean(mean) || sn__ln_wide_mean((float)mean)) return 0.0f;
  if (!has_b || dtype == SN_DTYPE_F32) return -1.0f;
  return dtype == SN_DTYPE_BF16 ? LN_CANCEL_LIM_BF16 : LN_CANCEL_LIM_F16;
}

/* ln_map_beta with has_g, has_b as constants. */
SN_INLINE void ln_map_checked(void *y, const float *x, const float *gamma, const float *beta,
                              int64_t d, double mean, double rstd, float lim, int to_bf16) {
  const int g = gamma != NULL, b = beta != NULL;
  if (g && b) ln_map_beta(y, x, gamma, beta, d, mean, rstd, lim, 1, 1, to_bf16);
  else if (g) ln_map_beta(y, x, gamma, beta, d, mean, rstd, lim, 1, 0, to_bf16);
  else if (b) ln_map_beta(y, x, gamma, beta, d, mean, rstd, lim, 0, 1, to_bf16);
  else ln_map_beta(y, x, gamma, beta, d, mean, rstd, lim, 0, 0, to_bf16);
}

/* One row: x [d] f32 → y [d] f32; stats[0] = mean, stats[1] = rstd (fp64). y may equal x.
 * With res [d] (the fused kernel; NULL for none) the row normalized is the residual sum
 * x + res, written into sum_out [d] by the first pass (sum_out may equal x or res; y may not
 * overlap them). next, out, esize: the rows to prefetch (sn__row_shifted_sums). nt: y streamed
 * where the plain f32 map writes it (ln_map_f32). */
SN_CLONES static void ln_fwd_row(float *y, double *stats, const float *x, const float *res,
                                 float *sum_out, const float *gamma, const float *beta,
                                 int64_t d, float eps, sn_dtype_t dtype, const char *next,
                                 char *out, int esize, int nt) {
  const double K = sn__row_pivot(x, res, 0, d);
  double sums[2], mean, m2;
  if (res != NULL) {
    sn__row_shifted_sums(sums, NULL, sum_out, x, res, 0, d, K, next, out, esize);
    x = sum_out; /* the maps read the stored sums, cache-hot */
  } else {
    sn__row_shifted_sums(sums, NULL, NULL, x, NULL, 0, d, K, next, out, esize);
  }
  sn__row_stats(&mean, &m2, x, d, K, sums);
  const double rstd = 1.0 / sqrt(m2 / (double)d + (double)eps);
  stats[0] = mean;
  stats[1] = rstd;
  const int g = gamma != NULL, b = beta != NULL;
  const float lim = ln_check_lim(mean, b, dtype);
  if (lim >= 0.0f) {
    ln_map_checked(y, x, gamma, beta, d, mean, rstd, lim, 0);
  } else if (!b) {
    if (g) ln_map_f32(y, x, gamma, beta, d, mean, rstd, 1, 0, nt);
    else ln_map_f32(y, x, gamma, beta, d, mean, rstd, 0, 0, nt);
  } else {
    if (g) ln_map_f32(y, x, gamma, beta, d, mean, rstd, 1, 1, nt);
    else ln_map_f32(y, x, gamma, beta, d, mean, rstd, 0, 1, nt);
  }
}

/* ---- bf16 rows in pairs (sn_layernorm_fwd) ------------------------------------------------ */

/* Pair blocks per block of the checked map. */
#define LN_PAIRS_PER_BLOCK (LN_MAP_BLOCK / SN_PAIR)
_Static_assert(LN_MAP_BLOCK % SN_PAIR == 0, "a checked block is whole pair blocks");

/* ln_map_beta of a bf16 row xb [d] into bf16 y [d] with beta (has_b = 1), bitwise: the same
 * blocks of LN_MAP_BLOCK, the same f32 values and check, a block beyond the limit recomputed in
 * fp64 element by element from xb; the full blocks read in pairs (sn__pair_widen), gs and bs
 * gamma and beta in pairs (sn__to_pairs); a last partial block widened into a stack block
 * and mapped by ln_map_beta_block. y may equal xb (a block is read whole before it is stored).
 * nt: the full blocks streamed where aligned (sn__pair_join). */
SN_INLINE void ln_map_beta_pairs(uint16_t *y, const uint16_t *xb, const float *gs,
                                 const float *bs, const float *gamma, const float *beta,
                                 int64_t d, double mean, double rstd, float lim, int has_g,
                                 int nt) {
  const float hi = (float)mean, lo = (float)(mean - (double)hi), s = (float)rstd;
  int64_t i = 0;
  for (; i + LN_MAP_BLOCK <= d; i += LN_MAP_BLOCK) {
    sn__pf ve[LN_PAIRS_PER_BLOCK], vo[LN_PAIRS_PER_BLOCK];
    sn__pi neg = {0}; /* sign bits: some |p| > lim·|v| or |v| > FLT_MAX */
    for (int q = 0; q < LN_PAIRS_PER_BLOCK; q++) {
      const int64_t j = i + q * SN_PAIR;
      sn__pf e, o, pe, po;
      sn__pair_widen(&e, &o, xb + j);
      e = ((e - hi) - lo) * s;
      o = ((o - hi) - lo) * s;
      if (has_g) {
        sn__pair_load(&pe, &po, gs + j);
        e = e * pe;
        o = o * po;
      }
      sn__pair_load(&pe, &po, bs + j);
      ve[q] = e + pe;
      vo[q] = o + po;
      /* !(|p| <= lim·|v|) | !(|v| <= FLT_MAX), as ln_map_beta_block (NaN and ±inf are bad),
       * on the bits of the absolute values, which order as the values: a NaN |p| has bits
       * above any number's; lim·|v| is NaN only where v is, which the second test takes.
       * (Under DAZ without FTZ, a subnormal |p| counts as itself here, as 0 in the float
       * test: its block is recomputed in fp64, which the bound allows.)
       * |p| > lim·|v| where bits(lim·|v|) − bits(|p|) is negative (no overflow: both bits
       * below 2^31), |v| > FLT_MAX where 0x7f7fffff − bits(|v|) is: their sign bits or-ed over
       * the block and tested once (sn__any_sign). Subtractions and ors stay vector operations
       * in every clone; a comparison per vector costs three instructions (mask, vector, count),
       * and in target_clones functions GCC 12 scalarizes float and unsigned comparisons. */
      const sn__pi ue = (sn__pi)ve[q] & 0x7fffffff, uo = (sn__pi)vo[q] & 0x7fffffff;
      const sn__pi pe_ = (sn__pi)e & 0x7fffffff, po_ = (sn__pi)o & 0x7fffffff;
      neg |= ((sn__pi)(lim * (sn__pf)ue) - pe_) | ((sn__pi)(lim * (sn__pf)uo) - po_) |
             (0x7f7fffff - ue) | (0x7f7fffff - uo);
    }
    const int any = sn__any_sign(&neg);
    if (!any) { /* all finite: the rounding without the NaN case */
      for (int q = 0; q < LN_PAIRS_PER_BLOCK; q++)
        sn__pair_narrow_finite(y + i + q * SN_PAIR, &ve[q], &vo[q], nt);
      continue;
    }
    for (int64_t k = i; k < i + LN_MAP_BLOCK; k++) {
      double t = ((double)sn__bf16_to_f32(xb[k]) - mean) * rstd;
      if (has_g) t = t * (double)gamma[k];
      y[k] = sn__f32_to_bf16((float)(t + (double)beta[k]));
    }
  }
  if (i < d) {
    const int64_t m = d - i;
    float xt[LN_MAP_BLOCK], yb[LN_MAP_BLOCK];
    for (int64_t k = 0; k < m; k++) xt[k] = sn__bf16_to_f32(xb[i + k]);
    const int redone = ln_map_beta_block(yb, xt, has_g ? gamma + i : NULL, beta + i, m, mean,
                                         rstd, hi, lo, s, lim, has_g, 1);
    for (int64_t k = 0; k < m; k++)
      y[i + k] = redone ? sn__f32_to_bf16(yb[k]) : sn__f32_to_bf16_finite(yb[k]);
  }
}

/* The statistics of one bf16 row x [d] of sn_layernorm_fwd, bitwise ln_fwd_row's on the
 * widened row, with no f32 copy of the row: stats[0] = mean, stats[1] = rstd (fp64), from the
 * shifted sums with x widened in registers in pairs (sn__row_stats_bf16; the two-pass
 * fallback also reads the bf16 row). With res (sn_add_layernorm_fwd; NULL: none) of the
 * residual sum x + res, rounded to bf16 and stored into sum_out [d] as it is summed. next,
 * next_res: the next rows of x and res to prefetch, out: this row of y (NULL: none). Always
 * inlined into ln_stats_pairs and ln_stats_add_pairs, which fix res. */
SN_INLINE void ln_stats_impl(double stats[2], uint16_t *sum_out, const uint16_t *x,
                             const uint16_t *res, int64_t d, float eps, const char *next,
                             const char *next_res, char *out) {
  double mean, m2;
  sn__row_stats_bf16(&mean, &m2, sum_out, x, res, d, next, next_res, out);
  stats[0] = mean;
  stats[1] = 1.0 / sqrt(m2 / (double)d + (double)eps);
}
SN_CLONES static void ln_stats_pairs(double stats[2], const uint16_t *x, int64_t d, float eps,
                                     const char *next, char *out) {
  ln_stats_impl(stats, NULL, x, NULL, d, eps, next, NULL, out);
}
SN_CLONES static void ln_stats_add_pairs(double stats[2], uint16_t *sum_out, const uint16_t *x,
                                         const uint16_t *res, int64_t d, float eps,
                                         const char *next, const char *next_res, char *out) {
  ln_stats_impl(stats, sum_out, x, res, d, eps, next, next_res, out);
}

/* The map of that row into y [d] (bf16) from its stats (ln_stats_pairs), bitwise ln_fwd_row's
 * on the widened row narrowed as sn__from_f32: in pairs, checked where beta is given
 * (ln_map_beta_pairs). Rows whose mean is tiny or wide (the checked map with limit 0 and
 * possibly no beta: rare) are widened into tmp [d] and mapped by ln_map_checked. gs, bs: gamma
 * and beta in pairs (sn__to_pairs; NULL where those are); gfin: gamma NULL or all finite
 * (ln_fwd_begin). y may equal x. nt: y streamed (but the rare rows ln_map_checked maps). */
SN_CLONES static void ln_map_row_pairs(uint16_t *y, const double stats[2], const uint16_t *x,
                                       float *tmp, const float *gamma, const float *beta,
                                       const float *gs, const float *bs, int64_t d, int gfin,
                                       int nt) {
  const double mean = stats[0], rstd = stats[1];
  const float lim = ln_check_lim(mean, beta != NULL, SN_DTYPE_BF16); /* as ln_fwd_row's */
  if (lim == 0.0f) {
    for (int64_t i = 0; i < d; i++) tmp[i] = sn__bf16_to_f32(x[i]);
    ln_map_checked(y, tmp, gamma, beta, d, mean, rstd, lim, 1);
  } else if (lim > 0.0f) {
    if (gamma != NULL) ln_map_beta_pairs(y, x, gs, bs, gamma, beta, d, mean, rstd, lim, 1, nt);
    else ln_map_beta_pairs(y, x, gs, bs, gamma, beta, d, mean, rstd, lim, 0, nt);
  } else {
    /* No beta: y = x̂·gamma. A finite mean means a finite row (an infinite or NaN x makes the
     * sums, hence the mean, non-finite), and then |x − mean|·rstd ≤ √d (to a few ulps in f32);
     * rstd ≤ 1/√eps is finite as a float too, so with gamma finite no y is NaN, and y is
     * narrowed without the NaN case (sn__map_pairs's finite: the same bits). */
    const float hi = (float)mean, lo = (float)(mean - (double)hi), s = (float)rstd;
    const int fin = gfin && isfinite(mean) && isfinite(rstd);
    if (gamma != NULL && fin) sn__map_pairs(y, x, gs, gamma, d, hi, lo, s, 1, 1, nt, 1);
    else if (gamma != NULL) sn__map_pairs(y, x, gs, gamma, d, hi, lo, s, 1, 1, nt, 0);
    else if (fin) sn__map_pairs(y, x, gs, gamma, d, hi, lo, s, 0, 1, nt, 1);
    else sn__map_pairs(y, x, gs, gamma, d, hi, lo, s, 0, 1, nt, 0);
  }
}

/* Rows [r0, r1) of a bf16 sn_layernorm_fwd (x, y: the whole [rows, d] tensors; mean, rstd:
 * [rows] or NULL), software-pipelined: the statistics of row r + 1 are computed before row r is
 * mapped, so the serial end of one (the lane totals, the division and the square root) overlaps
 * the other's vector work instead of stalling it. Row by row the same calls, hence the same
 * bits; with y == x, row r + 1 is read before row r is written, and the map of row r + 1 reads
 * it after (rows do not overlap). nt: y streamed, and fenced at the end (sn__stream_fence). */
static void ln_fwd_rows_pairs(uint16_t *y, float *mean, float *rstd, const uint16_t *x,
                              float *tmp, const float *gamma, const float *beta, const float *gs,
                              const float *bs, int gfin, int64_t r0, int64_t r1, int64_t rows,
                              int64_t d, float eps, int nt) {
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
      ln_map_row_pairs(y + r * d, prev, x + r * d, tmp, gamma, beta, gs, bs, d, gfin,
                       LN_NT_ROW(r));
      if (mean != NULL) mean[r] = (float)prev[0];
      if (rstd != NULL) rstd[r] = (float)prev[1];
    }
    prev[0] = cur[0], prev[1] = cur[1];
  }
  sn__stream_fence(nt);
#undef LN_STATS_ROW
#undef LN_NT_ROW
}

/* Row r of the forward from its f32 view xr: writes y row r and mean[r], rstd[r] when given.
 * ytmp: d floats of this thread's scratch where a bf16/f16 row is computed (not xr), NULL for
 * f32. f32 only: res, sum_out, the rows of the fused kernel (ln_fwd_row; NULL for none). next:
 * the next input row, to prefetch (NULL for none). nt: stream y (f32 only). */
static void ln_fwd_store(void *y, float *mean, float *rstd, const float *xr, const float *res,
                         float *sum_out, float *ytmp, const float *gamma, const float *beta,
                         int64_t r, int64_t d, float eps, sn_dtype_t dtype, const char *next,
                         int nt) {
  const int64_t off = r * d, esize = sn_dtype_size(dtype);
  double stats[2];
  float *yr = sn__out_row(y, off, dtype, ytmp);
  nt = nt && dtype == SN_DTYPE_F32; /* f16 rows are computed in ytmp */
  char *out = nt ? NULL : (char *)y + off * esize; /* to prefetch for writing, unless streamed */
  ln_fwd_row(yr, stats, xr, res, sum_out, gamma, beta, d, eps, dtype, next, out, (int)esize, nt);
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

/* What both forwards set up after their argument check: the scratch, allocated before the
 * overlap check (its failure tests pass sizes no buffer has) and freed with sn__free. */
typedef struct {
  float *scratch;     /* ln_fwd_scratch_rows rows of per_thread floats; NULL for f32 */
  int64_t per_thread; /* floats per scratch row, whole cache lines */
  int threads;        /* the rows' team (sn__team_for) */
  /* bf16: gamma, beta [d] in pair order (sn__to_pairs), in the two scratch rows after the
   * threads'; NULL where gamma or beta is, and for the other dtypes */
  const float *gs, *bs;
  int gfin; /* bf16: gamma NULL or all finite (ln_map_row_pairs' gfin) */
} ln_fwd_ctx_t;

/* Allocates the scratch, checks the buffers' overlap (sum_out, residual NULL in the plain
 * forward), and for bf16 writes gamma and beta in pairs. On an error nothing is left allocated
 * and nothing written. */
static sn_status_t ln_fwd_begin(ln_fwd_ctx_t *c, const char *fn, const void *y,
                                const void *sum_out, const float *mean, const float *rstd,
                                const void *x, const void *residual, const float *gamma,
                                const float *beta, int64_t rows, int64_t d, sn_dtype_t dtype) {
  sn_status_t st = SN_OK;
  *c = (ln_fwd_ctx_t){NULL, sn__line_stride(ln_fwd_scratch(d, dtype), (int64_t)sizeof(float)),
                      sn__team_for(rows), NULL, NULL, 0};
  if (c->per_thread > 0 &&
      (c->scratch = sn__alloc(fn, ln_fwd_scratch_rows(c->threads, dtype), c->per_thread,
                              sizeof(float), &st)) == NULL)
    return st;
  st = sn__rownorm_fwd_spans(fn, y, sum_out, mean, rstd, x, residual, gamma, beta, rows, d,
                             sn_dtype_size(dtype));
  if (st != SN_OK) {
    sn__free(c->scratch);
    return st;
  }
  if (dtype != SN_DTYPE_BF16) return SN_OK;
  float *pairs = c->scratch + (int64_t)c->threads * c->per_thread;
  if (gamma != NULL) sn__to_pairs(pairs, gamma, d), c->gs = pairs;
  if (beta != NULL) sn__to_pairs(pairs + c->per_thread, beta, d), c->bs = pairs + c->per_thread;
  c->gfin = sn__gamma_finite(gamma, d);
  return SN_OK;
}

sn_status_t sn_layernorm_fwd(void *y, float *mean, float *rstd, const void *x,
                             const float *gamma, const float *beta, int64_t rows, int64_t d,
                             float eps, sn_dtype_t dtype) {
  static const char fn[] = "sn_layernorm_fwd";
  int64_t n;
  SN_TRY(sn__rownorm_fwd_check(fn, y, NULL, x, NULL, 0, rows, d, eps, dtype, &n));
  if (n == 0) return SN_OK;

  /* scratch, per thread: f16 2·d f32 (the x row, then the y row), bf16 d f32 (a row of tiny
   * or wide mean, widened); f32 works on x and y directly */
  ln_fwd_ctx_t c;
  SN_TRY(ln_fwd_begin(&c, fn, y, NULL, mean, rstd, x, NULL, gamma, beta, rows, d, dtype));
  const int64_t esize = sn_dtype_size(dtype), per_thread = c.per_thread;
  const int threads = c.threads;
  float *scratch = c.scratch;

  /* each thread one range of consecutive rows, as schedule(static) over the rows: the bf16
   * rows pipeline their statistics a row ahead within it (ln_fwd_rows_pairs) */
  const int64_t ranges = rows < threads ? rows : threads;
  const int stream = dtype == SN_DTYPE_BF16 ? sn__stream_out_ln_bf16(n * esize)
                                            : sn__stream_out(n * esize);
#pragma omp parallel num_threads(threads)
  {
    float *tmp = scratch != NULL ? scratch + (int64_t)sn__thread_num() * per_thread : NULL;
#pragma omp for schedule(static)
    for (int64_t k = 0; k < ranges; k++) {
      const int64_t r0 = sn__chunk_begin(k, rows, ranges);
      const int64_t r1 = sn__chunk_begin(k + 1, rows, ranges);
      if (dtype == SN_DTYPE_BF16) {
        ln_fwd_rows_pairs(y, mean, rstd, x, tmp, gamma, beta, c.gs, c.bs, c.gfin, r0, r1, rows, d,
                          eps, stream);
        continue;
      }
      for (int64_t r = r0; r < r1; r++) {
        const char *next = r + 1 < rows ? (const char *)x + (r + 1) * d * esize : NULL;
        const float *xr = sn__in_row(x, r * d, d, dtype, tmp); /* x row r as f32 [d] */
        ln_fwd_store(y, mean, rstd, xr, NULL, NULL, tmp != NULL ? tmp + d : NULL, gamma, beta,
                     r, d, eps, dtype, next, stream);
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
  int64_t n;
  SN_TRY(sn__rownorm_fwd_check(fn, y, sum_out, x, residual, 1, rows, d, eps, dtype, &n));
  if (n == 0) return SN_OK;

  /* scratch, per thread: f16 2·d f32 (the sum row, then the y row), bf16 d f32 (a sum row of
   * tiny or wide mean, widened) */
  ln_fwd_ctx_t c;
  SN_TRY(ln_fwd_begin(&c, fn, y, sum_out, mean, rstd, x, residual, gamma, beta, rows, d,
                      dtype));
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
        ln_map_row_pairs((uint16_t *)y + off, stats, (uint16_t *)sum_out + off, tmp, gamma,
                         beta, c.gs, c.bs, d, c.gfin, 0);
        if (mean != NULL) mean[r] = (float)stats[0];
        if (rstd != NULL) rstd[r] = (float)stats[1];
      } else if (dtype == SN_DTYPE_F32) { /* likewise (ln_fwd_row) */
        ln_fwd_store(y, mean, rstd, (const float *)x + off, (const float *)residual + off,
                     (float *)sum_out + off, NULL, gamma, beta, r, d, eps, dtype, next, stream);
      } else {
        const float *sr = sn__residual_sum_row(sum_out, x, residual, tmp, off, d, dtype);
        /* y is computed over the residual row, no longer needed */
        ln_fwd_store(y, mean, rstd, sr, NULL, NULL, tmp + d, gamma, beta, r, d, eps, dtype,
                     NULL, 0);
      }
    }
    sn__stream_fence(stream);
  }
  sn__free(scratch);
  return SN_OK;
}
