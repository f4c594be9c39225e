/*
 * layernorm_bwd.c — LayerNorm backward on the CPU (the forward: layernorm.c). Every tensor is
 * row-major [rows, d]; one row is normalized over its d elements.
 *
 * Per row, with g = dy·gamma and x̂ = (x − mean)·rstd from the saved f32 mean/rstd:
 *   pass A  Σx̂, Σg, Σg·x̂                     fp64 (bf16/f16: f32 blocks added in fp64)
 *   pass B  x̂' = x̂ − mean(x̂) (re-centred), dx = rstd·(g − mean(g) − x̂'·mean(g·x̂'))
 * dgamma = Σ_rows dy·x̂', dbeta = Σ_rows dy, summed per fixed chunk of rows in a fixed order by
 * the driver both row-norm backwards share (rownorm_bwd.c): bitwise the same for any thread
 * count. This file holds the rows (ln_bwd_store).
 * f32 and bf16 rows run one body (ln_bwd_row_impl); bf16 rows read x and dy in pairs in both
 * passes (no f32 rows, dx narrowed as it is stored, the f32 partials in pair order), and rows
 * whose sums are not finite are computed in fp64 on the widened rows (ln_bwd_row_f64). f16 rows
 * are widened into per-thread f32 rows.
 *
 * Threads: OpenMP over rows (or chunks of rows); the row functions below carry SN_CLONES and no
 * OpenMP pragmas.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "rownorm_bwd.h"

/* Pass A for element i: x̂ = (x − m)·s and g = dy·gamma in f32, added to the lane sums. */
SN_INLINE void ln_bwd_acc(double *a_xh, double *a_g, double *a_gxh, float x, float dy,
                          const float *gamma, int64_t i, float m, float s, int has_g) {
  const float xh = SN_LN_XHAT(x, m, s);
  const float g = has_g ? dy * gamma[i] : dy;
  *a_xh += (double)xh;
  *a_g += (double)g;
  *a_gxh += (double)g * (double)xh;
}

/* Elements per f32 block of the lowp pass A: 16 per lane, so a block's f32 lane sums err by
 * < 2^-20 of Σ|terms|. For bf16/f16 dx (checked to 2^-8 / 2^-11 normwise) that is nothing; the
 * re-centring c = Σx̂/d it moves by < 2^-20·max|x̂| enters dgamma (checked to 2^-19 relative)
 * only through Σ_rows dy·c, whose terms have random signs. */
#define LN_BWD_BLOCK 256

/* Lanes of pass A's sums: a pair block's two halves go through them in turn. */
#define LN_LANES SN_ROW_LANES3
_Static_assert(2 * LN_LANES == SN_PAIR, "a block of SN_PAIR is two steps of the lanes");

/* Pass A of one row, dy and x [d] f32 or (bf16) bf16: sum[0..2] = Σx̂, Σg, Σg·x̂ in fp64 lanes
 * (lowp: in f32 lanes over blocks of LN_BWD_BLOCK elements, each block then added into the fp64
 * lanes); big[0] = max|dy|, big[1] = max|dy|·max|x̂|, big[2] = max|x̂| (fp64; NaN inputs are
 * skipped: they make the sums NaN). Blocks of SN_PAIR (sn__block_load_arr: an f32 block in order,
 * a bf16 one its even elements, then its odd ones), each half of 16 into the LN_LANES lanes in
 * turn, then the tail element by element, lane i % LN_LANES; gamma in the block order of the
 * dtype (row->gs for bf16). pf: the streams to prefetch, a block at a time (NULL: none). */
SN_INLINE void ln_bwd_sums(double sum[3], double big[3], const void *dy, const void *x,
                           const sn__bwd_row_t *row, const sn__bwd_prefetch_t *pf, int has_g,
                           int lowp, int bf16) {
  enum { L = LN_LANES };
  const float *gamma = row->gamma, *gb = bf16 ? row->gs : row->gamma;
  const int64_t d = row->d;
  const float m = row->m, s = row->s;
  double a_xh[L] = {0}, a_g[L] = {0}, a_gxh[L] = {0};
  float mdy[L] = {0}, mxh[L] = {0};
  int64_t i = 0;
  while (i + SN_PAIR <= d) {
    const int64_t end = lowp && d - i > LN_BWD_BLOCK ? i + LN_BWD_BLOCK : d;
    float b_xh[L] = {0}, b_g[L] = {0}, b_gxh[L] = {0};
    for (; i + SN_PAIR <= end; i += SN_PAIR) {
      if (pf != NULL) sn__bwd_prefetch_block(pf, i);
      float xw[SN_PAIR], dw[SN_PAIR];
      const float *xv, *dv, *gv = has_g ? gb + i : NULL; /* gv: gamma's block */
      sn__bwd_block_vals(&xv, &dv, xw, dw, x, dy, i, bf16);
      for (int h = 0; h < SN_PAIR; h += L)
        for (int k = 0; k < L; k++) {
          const float xh = SN_LN_XHAT(xv[h + k], m, s);
          const float g = has_g ? dv[h + k] * gv[h + k] : dv[h + k];
          if (lowp) {
            b_xh[k] += xh;
            b_g[k] += g;
            b_gxh[k] += g * xh;
          } else {
            a_xh[k] += (double)xh;
            a_g[k] += (double)g;
            a_gxh[k] += (double)g * (double)xh;
          }
          mdy[k] = sn__max_abs(mdy[k], dv[h + k]);
          mxh[k] = sn__max_abs(mxh[k], xh);
        }
    }
    if (lowp)
      for (int k = 0; k < L; k++) {
        a_xh[k] += (double)b_xh[k];
        a_g[k] += (double)b_g[k];
        a_gxh[k] += (double)b_gxh[k];
      }
  }
  for (int k = 0; i < d; i++, k = (k + 1) % L) {
    const float xi = sn__load_w(x, bf16, i), dyi = sn__load_w(dy, bf16, i);
    mdy[k] = sn__max_abs(mdy[k], dyi);
    mxh[k] = sn__max_abs(mxh[k], SN_LN_XHAT(xi, m, s));
    ln_bwd_acc(&a_xh[k], &a_g[k], &a_gxh[k], xi, dyi, gamma, i, m, s, has_g);
  }
  sum[0] = sn__lanes_total_n(a_xh, L);
  sum[1] = sn__lanes_total_n(a_g, L);
  sum[2] = sn__lanes_total_n(a_gxh, L);
  float ma = 0.0f, mb = 0.0f;
  for (int k = 0; k < L; k++) ma = sn__max_abs(ma, mdy[k]), mb = sn__max_abs(mb, mxh[k]);
  big[0] = (double)ma;
  big[1] = (double)ma * (double)mb;
  big[2] = (double)mb;
}

/* Bound on the f32 intermediates of the backward's dx = s·((g − mean(g)) − x̂'·mean(g·x̂')):
 * with G = max|dy|·max|gamma| and X = max|x̂|, |g − mean(g)| ≤ 2G, |x̂'| ≤ 2X and
 * |x̂'·mean(g·x̂')| ≤ 4G·X² (|mean(g·x̂')| ≤ 2G·X). A row where G·(2 + 4X²) or X exceeds it is
 * computed in fp64 (ln_bwd_row_f64): in f32, dy near 3e38 or a large gamma would give dx = inf
 * where dx itself is finite, and dy = 0 with saved statistics that put x̂ near FLT_MAX would
 * give dx = NaN where it is 0 (x̂' overflows, and inf·mean(g·x̂') = inf·0).
 * Half of 2^127 leaves room for the roundings. */
#define LN_DX_F32_MAX 0x1p126

static inline int ln_dx_f32_ok(double gmax, double max_dy, double max_xh) {
  return max_dy * gmax * (2.0 + 4.0 * max_xh * max_xh) <= LN_DX_F32_MAX && /* false for NaN */
         max_xh <= LN_DX_F32_MAX;
}

/* One row of the backward: dx (may equal dy: each element or block is read before it is
 * written) from dy, x [d], all f32 or (bf16) bf16, the saved mean m and rstd s. Returns 1,
 * having written nothing, for a row whose dx intermediates could leave the f32 range
 * (ln_dx_f32_ok; gmax = max|gamma|, 1 without gamma), and for a bf16 row whose sums are not
 * finite: the caller computes it in fp64 (ln_bwd_row_f64, on the widened rows). With has_part,
 * dgp[i] += dy·x̂' and dbp[i] += dy into the f32 partials (SN_PART_ROWS; for bf16 rows in pair
 * order, sn__flush_pairs), or, for a row whose terms could overflow them (max|dy| or
 * 2·max|dy|·max|x̂| beyond SN_PART_F32_MAX, infinities included), into the chunk's fp64 partials
 * dgp64/dbp64 directly, as the f32 sums would lose them. lowp (bf16/f16 rows): pass A's sums in
 * f32 blocks (LN_BWD_BLOCK), in fp64 again where those came out non-finite (f16 rows widened).
 * Pass B in blocks of SN_PAIR where the rows are bf16 or dx streams (sn__block_load, gamma and
 * the partials in block order), else element by element, a loop GCC vectorizes; a bf16 dx is
 * narrowed as sn__f32_to_bf16. */
SN_INLINE int ln_bwd_row_impl(void *dx, const sn__bwd_part_t *part, const void *dy,
                              const void *x, const sn__bwd_row_t *row, int has_g, int has_part,
                              int lowp, int bf16) {
  float *dgp = part->g32, *dbp = part->b32;
  double *dgp64 = part->g64, *dbp64 = part->b64;
  const float *gamma = row->gamma, *gb = bf16 ? row->gs : row->gamma;
  const int64_t d = row->d;
  const float m = row->m, s = row->s;
  const sn__bwd_prefetch_t *pf = row->pf;
  double sum[3], big[3];
  ln_bwd_sums(sum, big, dy, x, row, pf, has_g, lowp, bf16);
  if (lowp && !(isfinite(sum[0]) && isfinite(sum[1]) && isfinite(sum[2]))) {
    if (bf16) return 1;
    ln_bwd_sums(sum, big, dy, x, row, NULL, has_g, 0, 0);
  }
  if (!ln_dx_f32_ok((double)row->gmax, big[0], big[2])) return 1;
  const double sum_xh = sum[0], sum_g = sum[1], sum_gxh = sum[2];

  /* x̂' = x̂ − c has mean 0 even when the saved f32 mean is off by up to half an ulp of a large
   * mean; Σg·x̂' = Σg·x̂ − c·Σg */
  const double c = sum_xh / (double)d;
  const float cf = (float)c, mg = (float)(sum_g / (double)d);
  const float mgx = (float)((sum_gxh - c * sum_g) / (double)d);

  /* pass B: dx = s·((g − mean(g)) − x̂'·mean(g·x̂')). |x̂'| ≤ |x̂| + |c| ≤ 2·max|x̂|, so the terms
   * are at most max|dy| and 2·max|dy|·max|x̂|. */
  const int part64 = has_part && !(big[0] <= SN_PART_F32_MAX && 2.0 * big[1] <= SN_PART_F32_MAX);
  if (part64) {
    SN_IVDEP
    for (int64_t j = 0; j < d; j++) {
      const float dyj = sn__load_w(dy, bf16, j);
      const float xh = SN_LN_XHAT_C(sn__load_w(x, bf16, j), m, s, cf);
      const float g = has_g ? dyj * gamma[j] : dyj;
      dgp64[j] += (double)dyj * (double)xh;
      dbp64[j] += (double)dyj;
      sn__store_w(dx, bf16, j, SN_LN_DX(g, xh, s, mg, mgx));
    }
    return 0;
  }
#define LN_DX_EL(j)                                                                           \
  do {                                                                                        \
    const float dyj_ = sn__load_w(dy, bf16, j);                                               \
    const float xh_ = SN_LN_XHAT_C(sn__load_w(x, bf16, j), m, s, cf);                         \
    const float g_ = has_g ? dyj_ * gamma[j] : dyj_;                                          \
    if (has_part) {                                                                           \
      dgp[j] += dyj_ * xh_;                                                                   \
      dbp[j] += dyj_;                                                                         \
    }                                                                                         \
    sn__store_w(dx, bf16, j, SN_LN_DX(g_, xh_, s, mg, mgx));                                  \
  } while (0)
  const int nt = pf->nt;
  int64_t j = 0;
  if (nt && !bf16) /* ordinary stores up to a 64-byte line, then streamed blocks */
    for (const int64_t h = sn__head64(dx, d); j < h; j++) LN_DX_EL(j);
  for (; (bf16 || nt) && j + SN_PAIR <= d; j += SN_PAIR) {
    sn__pf xe, xo, ye, yo, pe, po;
    sn__block_load(&xe, &xo, x, j, bf16);
    sn__block_load(&ye, &yo, dy, j, bf16);
    xe = SN_LN_XHAT_C(xe, m, s, cf);
    xo = SN_LN_XHAT_C(xo, m, s, cf);
    if (has_part) {
      sn__pair_load(&pe, &po, dgp + j);
      pe += ye * xe;
      po += yo * xo;
      sn__pair_store(dgp + j, &pe, &po);
      sn__pair_load(&pe, &po, dbp + j);
      pe += ye;
      po += yo;
      sn__pair_store(dbp + j, &pe, &po);
    }
    if (has_g) {
      sn__pair_load(&pe, &po, gb + j);
      ye = ye * pe;
      yo = yo * po;
    }
    ye = SN_LN_DX(ye, xe, s, mg, mgx);
    yo = SN_LN_DX(yo, xo, s, mg, mgx);
    /* No dx of a bf16 row here is NaN, so it is narrowed without sn__f32_to_bf16's NaN case
     * (the same bits): a NaN or infinite dy, x, gamma, m or s, or an x − m beyond the f32
     * range, made pass A's sums (which compute the same (x − m)·s) non-finite and sent the row
     * to fp64; ln_dx_f32_ok keeps (g − mean(g)) − x̂'·mean(g·x̂') finite, and s times it is
     * finite or ±inf. */
    sn__block_store(dx, j, &ye, &yo, bf16, nt, 1);
  }
  SN_IVDEP
  for (; j < d; j++) LN_DX_EL(j);
#undef LN_DX_EL
  return 0;
}

/* ln_bwd_row_impl of f32 rows (lowp: an f16 row widened) and of bf16 rows, each with its
 * has_g, has_part and lowp constants. */
SN_CLONES static int ln_bwd_row(float *dx, const sn__bwd_part_t *part, const float *dy,
                                const float *x, const sn__bwd_row_t *row, int lowp) {
  const int g = row->gamma != NULL, p = part->g32 != NULL;
#define LN_BWD_ROW(G, P, LOWP) ln_bwd_row_impl(dx, part, dy, x, row, G, P, LOWP, 0)
  if (lowp) {
    if (g && p) return LN_BWD_ROW(1, 1, 1);
    if (g) return LN_BWD_ROW(1, 0, 1);
    if (p) return LN_BWD_ROW(0, 1, 1);
    return LN_BWD_ROW(0, 0, 1);
  }
  if (g && p) return LN_BWD_ROW(1, 1, 0);
  if (g) return LN_BWD_ROW(1, 0, 0);
  if (p) return LN_BWD_ROW(0, 1, 0);
  return LN_BWD_ROW(0, 0, 0);
#undef LN_BWD_ROW
}
SN_CLONES static int ln_bwd_pairs(uint16_t *dx, const sn__bwd_part_t *part, const uint16_t *dy,
                                  const uint16_t *x, const sn__bwd_row_t *row) {
  const int g = row->gamma != NULL, p = part->g32 != NULL;
#define LN_BWD_PAIRS(G, P) ln_bwd_row_impl(dx, part, dy, x, row, G, P, 1, 1)
  if (g && p) return LN_BWD_PAIRS(1, 1);
  if (g) return LN_BWD_PAIRS(1, 0);
  if (p) return LN_BWD_PAIRS(0, 1);
  return LN_BWD_PAIRS(0, 0);
#undef LN_BWD_PAIRS
}

/* One row of the backward in fp64 throughout, for a saved mean beyond SN_CENTRE_F32_MAX, where
 * the f32 x − m of ln_bwd_row can overflow: x̂ = (x − m)·s, the sums Σx̂, Σg, Σg·x̂ (one fp64
 * accumulator each), dx = s·((g − mean(g)) − x̂'·mean(g·x̂')) rounded once to f32; with dgp64
 * (then dbp64 too) the parameter terms dy·x̂', dy go to the chunk's fp64 partials. dx may equal
 * dy. Scalar: only data near the f32 range gets here. */
static void ln_bwd_row_f64(float *dx, double *dgp64, double *dbp64, const float *dy,
                           const float *x, const float *gamma, int64_t d, float m, float s) {
  double sum_xh = 0.0, sum_g = 0.0, sum_gxh = 0.0;
  for (int64_t i = 0; i < d; i++) {
    const double xh = SN_LN_XHAT((double)x[i], m, s), g = (double)dy[i] * (gamma ? gamma[i] : 1.0f);
    sum_xh += xh;
    sum_g += g;
    sum_gxh += g * xh;
  }
  const double c = sum_xh / (double)d, mg = sum_g / (double)d;
  const double mgx = (sum_gxh - c * sum_g) / (double)d;
  for (int64_t i = 0; i < d; i++) {
    const double dyi = dy[i], xh = SN_LN_XHAT_C((double)x[i], m, s, c);
    const double g = dyi * (gamma ? gamma[i] : 1.0f);
    if (dgp64 != NULL) {
      dgp64[i] += dyi * xh;
      dbp64[i] += dyi;
    }
    dx[i] = (float)SN_LN_DX(g, xh, s, mg, mgx);
  }
}

/* Row r of the call c. tmp: this thread's [2, d] f32 scratch for bf16/f16 (x widened into
 * tmp[0, d), dy into tmp[d, 2d) where dx is then computed and narrowed from), NULL for f32.
 * part: where the row adds its dgamma/dbeta terms. bf16 rows take ln_bwd_pairs (c->gs: gamma in
 * pairs; part's f32 partials then in pair order), and the widened rows in fp64 where it
 * declines or the mean is wide; other rows ln_bwd_row, or ln_bwd_row_f64 where that declines or
 * the mean is wide. */
static void ln_bwd_store(const sn__bwd_call_t *c, const sn__bwd_part_t *part, int64_t r,
                         float *tmp) {
  const sn__rn_bwd_t *a = c->a;
  const int64_t d = a->d, off = r * d;
  const sn_dtype_t dtype = a->dtype;
  sn__bwd_prefetch_t pf;
  sn__bwd_row_t row;
  sn__bwd_row_setup(&pf, &row, c, r);
  int f64 = sn__ln_wide_mean(row.m);
  if (dtype == SN_DTYPE_BF16 && !f64) {
    if (ln_bwd_pairs((uint16_t *)a->dx + off, part, (const uint16_t *)a->dy + off,
                     (const uint16_t *)a->x + off, &row) == 0)
      return;
    f64 = 1;
  }
  const float *xr, *dyr;
  float *dxr;
  sn__bwd_views(a, r, tmp, &xr, &dyr, &dxr);
  if (f64 || ln_bwd_row(dxr, part, dyr, xr, &row, dtype != SN_DTYPE_F32) != 0)
    ln_bwd_row_f64(dxr, part->g64, part->b64, dyr, xr, a->gamma, d, row.m, row.s);
  sn__bwd_views_done(a, r, tmp);
}

sn_status_t sn_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy,
                             const void *x, const float *mean, const float *rstd,
                             const float *gamma, int64_t rows, int64_t d, sn_dtype_t dtype) {
  static const char fn[] = "sn_layernorm_bwd";
  const sn__rn_bwd_t a = {dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, dtype, 0};
  return sn__rownorm_bwd_run(fn, &a, ln_bwd_store);
}
