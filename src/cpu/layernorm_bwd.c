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
 * bf16 rows read x and dy in pairs in both passes (ln_bwd_pairs: no f32 rows, dx narrowed as it
 * is stored, pass A's lanes and the f32 partials in pair order); rows whose sums are not finite
 * or whose terms could overflow the f32 partials are computed in fp64 (ln_bwd_row_f64). f16
 * rows are widened into per-thread f32 rows.
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

/* Pass A of one row: sum[0..2] = Σx̂, Σg, Σg·x̂ in fp64 lanes (lowp: in f32 lanes over blocks
 * of LN_BWD_BLOCK elements, each block then added into the fp64 lanes); big[0] = max|dy|,
 * big[1] = max|dy|·max|x̂|, big[2] = max|x̂| (fp64; NaN inputs are skipped: they make the
 * partials NaN in f32 as in fp64). One line of each prefetched stream per L elements. */
SN_INLINE void ln_bwd_sums(double sum[3], double big[3], const float *dy, const float *x,
                           const sn__bwd_row_t *row, const sn__bwd_prefetch_t *pf, int has_g,
                           int lowp) {
  enum { L = SN_ROW_LANES3 };
  const float *gamma = row->gamma;
  const int64_t d = row->d;
  const float m = row->m, s = row->s;
  double a_xh[L] = {0}, a_g[L] = {0}, a_gxh[L] = {0};
  float mdy[L] = {0}, mxh[L] = {0};
  int64_t i = 0;
  while (i + L <= d) {
    const int64_t end = lowp && d - i > LN_BWD_BLOCK ? i + LN_BWD_BLOCK : d;
    float b_xh[L] = {0}, b_g[L] = {0}, b_gxh[L] = {0};
    for (; i + L <= end; i += L) {
      if (pf != NULL && pf->x != NULL) SN_PF_ROW_READ(pf->x + i * pf->esize);
      if (pf != NULL && pf->dy != NULL) SN_PF_ROW_READ(pf->dy + i * pf->esize);
      if (pf != NULL && pf->dx != NULL) __builtin_prefetch(pf->dx + i * pf->esize, 1);
      if (lowp)
        for (int k = 0; k < L; k++) {
          const float xh = SN_LN_XHAT(x[i + k], m, s);
          const float g = has_g ? dy[i + k] * gamma[i + k] : dy[i + k];
          b_xh[k] += xh;
          b_g[k] += g;
          b_gxh[k] += g * xh;
          mdy[k] = sn__max_abs(mdy[k], dy[i + k]);
          mxh[k] = sn__max_abs(mxh[k], xh);
        }
      else
        for (int k = 0; k < L; k++) {
          ln_bwd_acc(&a_xh[k], &a_g[k], &a_gxh[k], x[i + k], dy[i + k], gamma, i + k, m, s,
                     has_g);
          mdy[k] = sn__max_abs(mdy[k], dy[i + k]);
          mxh[k] = sn__max_abs(mxh[k], SN_LN_XHAT(x[i + k], m, s));
        }
    }
    if (lowp)
      for (int k = 0; k < L; k++) {
        a_xh[k] += (double)b_xh[k];
        a_g[k] += (double)b_g[k];
        a_gxh[k] += (double)b_gxh[k];
      }
  }
  for (int k = 0; k < L && i < d; i++, k++) {
    mdy[k] = sn__max_abs(mdy[k], dy[i]);
    mxh[k] = sn__max_abs(mxh[k], SN_LN_XHAT(x[i], m, s));
    ln_bwd_acc(&a_xh[k], &a_g[k], &a_gxh[k], x[i], dy[i], gamma, i, m, s, has_g);
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

/* One row of the backward, all f32 [d]: dx (may equal dy) from dy, x, the saved mean m and
 * rstd s. Returns 1, having written nothing, for a row whose dx intermediates could leave the
 * f32 range (ln_dx_f32_ok; gmax = max|gamma|, 1 without gamma): the caller computes it in
 * fp64. With has_part, dgp[i] += dy·x̂' and dbp[i] += dy into the f32 partials (SN_PART_ROWS),
 * or, for a row whose terms could overflow them (max|dy| or 2·max|dy|·max|x̂| beyond
 * SN_PART_F32_MAX, infinities included), into the chunk's fp64 partials dgp64/dbp64 directly,
 * as the f32 sums would lose them. lowp (bf16/f16 rows): pass A's sums in f32 blocks
 * (LN_BWD_BLOCK), in fp64 again where those came out non-finite. */
SN_INLINE int ln_bwd_row_impl(float *dx, const sn__bwd_part_t *part, const float *dy,
                              const float *x, const sn__bwd_row_t *row, int has_g, int has_part,
                              int lowp) {
  float *dgp = part->g32, *dbp = part->b32;
  double *dgp64 = part->g64, *dbp64 = part->b64;
  const float *gamma = row->gamma;
  const int64_t d = row->d;
  const float m = row->m, s = row->s;
  const sn__bwd_prefetch_t *pf = row->pf;
  double sum[3], big[3];
  ln_bwd_sums(sum, big, dy, x, row, pf, has_g, lowp);
  if (lowp && !(isfinite(sum[0]) && isfinite(sum[1]) && isfinite(sum[2])))
    ln_bwd_sums(sum, big, dy, x, row, NULL, has_g, 0);
  if (!ln_dx_f32_ok((double)row->gmax, big[0], big[2])) return 1;
  const double sum_xh = sum[0], sum_g = sum[1], sum_gxh = sum[2];

  /* x̂' = x̂ − c has mean 0 even when the saved f32 mean is off by up to half an ulp of a large
   * mean; Σg·x̂' = Σg·x̂ − c·Σg */
  const double c = sum_xh / (double)d;
  const float cf = (float)c, mg = (float)(sum_g / (double)d);
  const float mgx = (float)((sum_gxh - c * sum_g) / (double)d);

  /* pass B: dx = s·((g − mean(g)) − x̂'·mean(g·x̂')); dy[i] is read before dx[i] is written.
   * |x̂'| ≤ |x̂| + |c| ≤ 2·max|x̂|, so the terms are at most max|dy| and 2·max|dy|·max|x̂|. */
  const int part64 = has_part && !(big[0] <= SN_PART_F32_MAX && 2.0 * big[1] <= SN_PART_F32_MAX);
  if (part64) {
    SN_IVDEP
    for (int64_t j = 0; j < d; j++) {
      const float dyj = dy[j];
      const float xh = SN_LN_XHAT_C(x[j], m, s, cf);
      const float g = has_g ? dyj * gamma[j] : dyj;
      dgp64[j] += (double)dyj * (double)xh;
      dbp64[j] += (double)dyj;
      dx[j] = SN_LN_DX(g, xh, s, mg, mgx);
    }
    return 0;
  }
#define LN_DX_EL(j)                                                                           \
  do {                                                                                        \
    const float dyj_ = dy[j], xh_ = SN_LN_XHAT_C(x[j], m, s, cf);                             \
    const float g_ = has_g ? dyj_ * gamma[j] : dyj_;                                          \
    if (has_part) {                                                                           \
      dgp[j] += dyj_ * xh_;                                                                   \
      dbp[j] += dyj_;                                                                         \
    }                                                                                         \
    dx[j] = SN_LN_DX(g_, xh_, s, mg, mgx);                                                    \
  } while (0)
  int64_t j = 0;
  if (pf->nt) { /* ordinary stores up to a 64-byte line, then vectors of 16 through sn__store64 */
    for (const int64_t h = sn__head64(dx, d); j < h; j++) LN_DX_EL(j);
    for (; j + 16 <= d; j += 16) {
      sn__pf vdy, xh, g, w;
      memcpy(&vdy, dy + j, sizeof vdy);
      memcpy(&xh, x + j, sizeof xh);
      xh = SN_LN_XHAT_C(xh, m, s, cf);
      g = vdy;
      if (has_g) memcpy(&w, gamma + j, sizeof w), g = vdy * w;
      if (has_part) {
        memcpy(&w, dgp + j, sizeof w), w = w + vdy * xh, memcpy(dgp + j, &w, sizeof w);
        memcpy(&w, dbp + j, sizeof w), w = w + vdy, memcpy(dbp + j, &w, sizeof w);
      }
      w = SN_LN_DX(g, xh, s, mg, mgx);
      sn__store64(dx + j, &w, 1);
    }
  }
  SN_IVDEP
  for (; j < d; j++) LN_DX_EL(j);
#undef LN_DX_EL
  return 0;
}

SN_CLONES static int ln_bwd_row(float *dx, const sn__bwd_part_t *part, const float *dy,
                                const float *x, const sn__bwd_row_t *row, int lowp) {
  const int g = row->gamma != NULL, p = part->g32 != NULL;
#define LN_BWD_ROW(G, P, LOWP) ln_bwd_row_impl(dx, part, dy, x, row, G, P, LOWP)
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

/* ---- bf16 rows in pairs (sn_layernorm_bwd) ------------------------------------------------ */

/* One bf16 row of the backward with no f32 copies of its rows: both passes read x and dy in
 * pairs (sn__pair_widen), the second narrows dx the same way (dx may equal dy: each block is
 * loaded before it is stored). The arithmetic of ln_bwd_row_impl with lowp, in lanes of their
 * own: element i of a block of SN_PAIR goes to lane i (evens first), the f32 lane sums over
 * blocks of LN_BWD_BLOCK added into fp64 lanes, then in a fixed order (the thread count never
 * matters; the lanes differ from the widened rows', so the low bits of a row's sums can). gs:
 * gamma in pairs (sn__to_pairs), gamma as is for the tail. With has_part, dgq, dbq [d]: the
 * f32 partials of dgamma and dbeta in pair order (sn__flush_pairs puts them back in order).
 * Returns 0 when done; 1, having written nothing, for a row whose sums are not finite, whose
 * terms could overflow the f32 partials (ln_bwd_row_impl's part64) or whose dx intermediates
 * could leave the f32 range (ln_dx_f32_ok, gmax = max|gamma|): the caller computes it in fp64
 * (ln_bwd_row_f64 on the widened rows, with the fp64 partials). */
SN_INLINE int ln_bwd_pairs_impl(uint16_t *dx, const sn__bwd_part_t *part, const uint16_t *dy,
                                const uint16_t *x, const sn__bwd_row_t *row, int has_g,
                                int has_part) {
  enum { H = SN_PAIR / 2 };
  float *dgq = part->g32, *dbq = part->b32;
  const float *gs = row->gs, *gamma = row->gamma;
  const int64_t d = row->d;
  const float m = row->m, s = row->s;
  const double gmax = (double)row->gmax;
  const sn__bwd_prefetch_t *pf = row->pf;
  /* pass A: Σx̂, Σg, Σg·x̂ (e: lanes of the even elements, o: of the odd ones), and max|dy|,
   * max|x| on the bf16 bits (nonnegative values order as their bits) */
  double a_xh[2][H] = {{0}}, a_g[2][H] = {{0}}, a_gxh[2][H] = {{0}};
  uint16_t mdy[SN_PAIR] = {0}, mx[SN_PAIR] = {0};
  int64_t i = 0;
  while (i + SN_PAIR <= d) {
    const int64_t end = d - i > LN_BWD_BLOCK ? i + LN_BWD_BLOCK : d;
    sn__pf bxe = {0}, bxo = {0}, bge = {0}, bgo = {0}, bpe = {0}, bpo = {0};
    for (; i + SN_PAIR <= end; i += SN_PAIR) {
      sn__pair_prefetch(pf, i);
      sn__pf xe, xo, ge, go;
      sn__pair_widen(&xe, &xo, x + i);
      sn__pair_widen(&ge, &go, dy + i);
      xe = SN_LN_XHAT(xe, m, s);
      xo = SN_LN_XHAT(xo, m, s);
      sn__pair_absmax(mdy, dy + i);
      sn__pair_absmax(mx, x + i);
      if (has_g) {
        sn__pf pe, po;
        sn__pair_load(&pe, &po, gs + i);
        ge = ge * pe;
        go = go * po;
      }
      bxe += xe;
      bxo += xo;
      bge += ge;
      bgo += go;
      bpe += ge * xe;
      bpo += go * xo;
    }
    SN_ADD16_F64(a_xh[0], bxe);
    SN_ADD16_F64(a_xh[1], bxo);
    SN_ADD16_F64(a_g[0], bge);
    SN_ADD16_F64(a_g[1], bgo);
    SN_ADD16_F64(a_gxh[0], bpe);
    SN_ADD16_F64(a_gxh[1], bpo);
  }
  for (int k = 0; i < d; i++, k++) { /* the tail, < SN_PAIR elements: lane k as a pair block's */
    const float dyi = sn__bf16_to_f32(dy[i]), xi = sn__bf16_to_f32(x[i]);
    const uint16_t ay = dy[i] & 0x7fffu, ax = x[i] & 0x7fffu;
    mdy[k] = ay > mdy[k] ? ay : mdy[k];
    mx[k] = ax > mx[k] ? ax : mx[k];
    ln_bwd_acc(&a_xh[k & 1][k / 2], &a_g[k & 1][k / 2], &a_gxh[k & 1][k / 2], xi, dyi, gamma, i,
               m, s, has_g);
  }
  double sum[3], acc[3][SN_ROW_LANES];
  sn__pair_lanes(acc[0], a_xh[0], a_xh[1]);
  sn__pair_lanes(acc[1], a_g[0], a_g[1]);
  sn__pair_lanes(acc[2], a_gxh[0], a_gxh[1]);
  for (int j = 0; j < 3; j++) sum[j] = sn__lanes_total(acc[j]);
  if (!(isfinite(sum[0]) && isfinite(sum[1]) && isfinite(sum[2]))) return 1;
  /* The bound of ln_bwd_row_impl's part64 with max|x̂| ≤ (max|x| + |m|)·|s| (raised by 2^-20
   * for the f32 roundings of x̂): a row it declines that ln_bwd_row_impl would have mapped in
   * f32 (|m| ≫ σ near 2^60 and beyond) costs only time. */
  const double big0 = (double)sn__pair_absmax_total(mdy);
  const double xmax = ((double)sn__pair_absmax_total(mx) + fabs((double)m)) * fabs((double)s) *
                      (1.0 + 0x1p-20); /* ≥ max|x̂| */
  if (has_part && !(big0 <= SN_PART_F32_MAX && 2.0 * big0 * xmax <= SN_PART_F32_MAX)) return 1;
  if (!ln_dx_f32_ok(gmax, big0, xmax)) return 1;
  const double c = sum[0] / (double)d; /* as ln_bwd_row_impl */
  const float cf = (float)c, mg = (float)(sum[1] / (double)d);
  const float mgx = (float)((sum[2] - c * sum[1]) / (double)d);

  /* pass B */
  for (i = 0; i + SN_PAIR <= d; i += SN_PAIR) {
    sn__pf xe, xo, ye, yo;
    sn__pair_widen(&xe, &xo, x + i);
    sn__pair_widen(&ye, &yo, dy + i);
    xe = SN_LN_XHAT_C(xe, m, s, cf);
    xo = SN_LN_XHAT_C(xo, m, s, cf);
    if (has_part) {
      sn__pf pe, po;
      sn__pair_load(&pe, &po, dgq + i);
      pe += ye * xe;
      po += yo * xo;
      sn__pair_store(dgq + i, &pe, &po);
      sn__pair_load(&pe, &po, dbq + i);
      pe += ye;
      po += yo;
      sn__pair_store(dbq + i, &pe, &po);
    }
    if (has_g) {
      sn__pf pe, po;
      sn__pair_load(&pe, &po, gs + i);
      ye = ye * pe;
      yo = yo * po;
    }
    ye = SN_LN_DX(ye, xe, s, mg, mgx);
    yo = SN_LN_DX(yo, xo, s, mg, mgx);
    /* No dx here is NaN, so it is narrowed without sn__f32_to_bf16's NaN case (the same bits):
     * a NaN or infinite dy, x, gamma, m or s, or an x − m beyond the f32 range, made pass A's
     * sums (which compute the same (x − m)·s) or bounds non-finite and sent the row to fp64;
     * ln_dx_f32_ok keeps (g − mean(g)) − x̂'·mean(g·x̂') finite, and s times it is finite or
     * ±inf. Without the NaN case the kernel takes 0.89-0.94x the time (bench_ab, in L2 and
     * cold). */
    sn__pair_narrow_finite(dx + i, &ye, &yo, pf->nt);
  }
  for (; i < d; i++) {
    const float dyi = sn__bf16_to_f32(dy[i]);
    const float xh = SN_LN_XHAT_C(sn__bf16_to_f32(x[i]), m, s, cf);
    const float g = has_g ? dyi * gamma[i] : dyi;
    if (has_part) {
      dgq[i] += dyi * xh;
      dbq[i] += dyi;
    }
    dx[i] = sn__f32_to_bf16(SN_LN_DX(g, xh, s, mg, mgx));
  }
  return 0;
}

SN_CLONES static int ln_bwd_pairs(uint16_t *dx, const sn__bwd_part_t *part, const uint16_t *dy,
                                  const uint16_t *x, const sn__bwd_row_t *row) {
  const int g = row->gamma != NULL, p = part->g32 != NULL;
#define LN_BWD_PAIRS(G, P) ln_bwd_pairs_impl(dx, part, dy, x, row, G, P)
  if (g && p) return LN_BWD_PAIRS(1, 1);
  if (g) return LN_BWD_PAIRS(1, 0);
  if (p) return LN_BWD_PAIRS(0, 1);
  return LN_BWD_PAIRS(0, 0);
#undef LN_BWD_PAIRS
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
