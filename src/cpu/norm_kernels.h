/*
 * norm_kernels.h — f32 inner loops shared by batchnorm.c and groupnorm.c: the per-channel
 * affine map of the forward and backward pass, applied to one contiguous run of a channel
 * (NCHW plane) or to blocks of rows of a channel slice (NHWC).
 * Not installed. Everything here is static (each including file gets its own target clones).
 *
 * Both maps centre x with an fp64 mean split into two f32, hi = (float)mean and
 * lo = (float)(mean − hi):  xc = (x − hi) − lo.  x − hi is exact whenever x is within a factor
 * of two of the mean (Sterbenz), so |mean| ≫ σ keeps full f32 accuracy in xc.
 *   forward:   y  = xc·a + b                 (a = rstd·gamma, b = beta)
 *   backward:  dx = (dy·a − b) − xc·e        (a, b, e: per-channel constants of the formula)
 * The constants are computed in fp64 (sn__chan_k_set, sn__tile_set); a channel whose centre is
 * 2^103 or more (values near the f32 range, where x − hi itself can overflow) or whose factors
 * f32 cannot hold (subnormal) is mapped in fp64 with the fp64 constants (sn__needs_f64).
 * For bf16/f16 the f32 forward map meets the bound |y − y_exact| ≤ max(1 ulp of y_exact,
 * 2^-16·(|x̂·γ| + |β|)); an element whose f32 value is not finite (xc·a beyond FLT_MAX, which β
 * may bring back into range) is recomputed in fp64 (the guarded map, SN_NONFINITE).
 *
 * Each map (NCHW runs, NHWC rows; forward, backward) is one body for f32 and bf16 activations,
 * over blocks of SN_PAIR values held in two GCC vector values: each block is loaded whole,
 * computed, then stored whole. That makes y == x (in place) well defined without restrict and
 * vectorizes at -O2 too; the tail is scalar. bf16 blocks are read and written in pairs
 * (rownorm.h's sn__block_load, sn__block_store), with the NHWC tile's constants in pair order
 * (sn__tile_pairs_t), and give the bits of the f32 tiles; f16 activations, and bf16 tiles with a
 * channel mapped in fp64, go through f32 stack tiles (sn__to_f32, sn__from_f32).
 */
#ifndef SN_NORM_KERNELS_H
#define SN_NORM_KERNELS_H

#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "norm_vec.h"
#include "rownorm.h"

/* Per-channel constants of one NHWC channel tile (channel c0 + j at index j), each array
 * 64-byte aligned: the rows kernels load a vector of each per 16 elements, and misaligned
 * loads (split cache lines) made NHWC run at half the speed of NCHW on DRAM-sized tensors. */
typedef struct {
  _Alignas(64) float hi[SN_TILE_C];
  _Alignas(64) float lo[SN_TILE_C];
  _Alignas(64) float a[SN_TILE_C];
  _Alignas(64) float b[SN_TILE_C];
  _Alignas(64) float e[SN_TILE_C]; /* backward only */
  /* the same constants in fp64 (sn__tile_set), and whether a channel is mapped in fp64 */
  double m[SN_TILE_C], ad[SN_TILE_C], bd[SN_TILE_C], ed[SN_TILE_C];
  unsigned char f64[SN_TILE_C];
} sn__chan_tile_t;

/* The constants of one channel's map (NCHW runs): as a tile's, for one channel. */
typedef struct {
  float hi, lo, a, b, e;
  int f64;
  double m, ad, bd, ed;
} sn__chan_k_t;

/* hi + lo ≈ m with hi = (float)m, lo = (float)(m − hi): 48 significant bits of an fp64 mean. */
static inline void sn__split_f64(double m, float *hi, float *lo) {
  *hi = (float)m;
  *lo = (float)(m - (double)*hi);
}

static inline int64_t sn__min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- streaming and prefetching of the f32 maps ------------------------------------------- */

/* The nt argument of the f32 maps below: 0 for ordinary stores; SN_NT_STREAM for streaming
 * stores (sn__stream_out); with SN_NT_PREFETCH too, the maps also prefetch their inputs
 * SN_MAP_PF_FLOATS ahead (only where they stream: the flags cannot say prefetch without
 * streaming). That is for the passes whose inputs come from memory (batchnorm.c's apply,
 * inference and backward apply; the GroupNorm NHWC forward's map and backward's dx pass where a
 * thread's rows of a sample exceed its L2), not for the maps that follow a reduction over the
 * same data still in the cache, where it measured slower. */
#define SN_NT_STREAM 1
#define SN_NT_PREFETCH 2

/* How far ahead the maps prefetch with SN_NT_PREFETCH (8 KiB; in rows, the row at least that
 * far on, or the next). */
#define SN_MAP_PF_FLOATS 2048

/* Bytes ahead the maps prefetch in rows ld floats apart (ld = 1 for runs), or 0 when nt lacks
 * SN_NT_PREFETCH. */
static inline uintptr_t sn__map_pf_bytes(int64_t ld, int nt) {
  return nt & SN_NT_PREFETCH ? sn__rows_ahead_bytes(ld, SN_MAP_PF_FLOATS) : 0;
}

/* Prefetches the line `bytes` after p for reading, when bytes != 0 (the address computed as an
 * integer: a pointer past its array would be undefined; prefetches never fault). */
static inline __attribute__((always_inline)) void sn__map_pf(const float *p, uintptr_t bytes) {
  if (bytes) __builtin_prefetch((const void *)((uintptr_t)p + bytes), 0, 3);
}

/* ---- the constants, and fp64 maps for channels the f32 ones cannot serve ---------------------- */

/* f32 terms that overflow while the output does not give ±inf: dy·a of the backward beyond
 * FLT_MAX brought back by − b (gradients near the f32 range), and xc·a + b of an f32 forward;
 * the guarded map recomputes such forward elements for bf16/f16 outputs.
 * sn__f32_holds (cpu.h) of a constant: a = gamma·rstd for σ near 2^127 with a small gamma, or
 * e = O(rstd²) of the backward beyond σ ≈ 2^63, which even underflows to 0, is not held. */

/* Whether a channel must be mapped in fp64: its centre from SN_CENTRE_F32_MAX on, its low part
 * lo = m − hi not held by an f32 (a mean below ~2^-102, where lo is subnormal: hi + lo does
 * not carry the 48 bits the maps rely on, 128 ulp off at mean 2^-100 + 2^-152), or a factor
 * its f32 rounding does not hold. Only data near the ends of the f32 range gets there; every
 * other channel takes the f32 maps. */
static inline int sn__needs_f64(double m, float hi, double a, double b, double e) {
  return !(fabsf(hi) < SN_CENTRE_F32_MAX) || !sn__f32_holds(m - (double)hi) ||
         !sn__f32_holds(a) || !sn__f32_holds(b) || !sn__f32_holds(e);
}

/* A channel's constants from their fp64 values: the centre m (the mean), and the factors a, b, e
 * of y = (x − m)·a + b, dx = (dy·a − b) − (x − m)·e. */
static inline void sn__chan_k_set(sn__chan_k_t *k, double m, double a, double b, double e) {
  m = sn__nan_canon(m), a = sn__nan_canon(a), b = sn__nan_canon(b), e = sn__nan_canon(e);
  sn__split_f64(m, &k->hi, &k->lo);
  k->a = (float)a, k->b = (float)b, k->e = (float)e;
  k->m = m, k->ad = a, k->bd = b, k->ed = e;
  k->f64 = sn__needs_f64(m, k->hi, a, b, e);
}
/* The same for channel c0 + j of a tile. */
static inline void sn__tile_set(sn__chan_tile_t *p, int64_t j, double m, double a, double b,
                                double e) {
  m = sn__nan_canon(m), a = sn__nan_canon(a), b = sn__nan_canon(b), e = sn__nan_canon(e);
  sn__split_f64(m, &p->hi[j], &p->lo[j]);
  p->a[j] = (float)a, p->b[j] = (float)b, p->e[j] = (float)e;
  p->m[j] = m, p->ad[j] = a, p->bd[j] = b, p->ed[j] = e;
  p->f64[j] = (unsigned char)sn__needs_f64(m, p->hi[j], a, b, e);
}

/* Any of a tile's first ct channels mapped in fp64. */
static inline int sn__tile_any_f64(const sn__chan_tile_t *p, int64_t ct) {
  int any = 0;
  for (int64_t j = 0; j < ct; j++) any |= p->f64[j];
  return any;
}

/* The fp64 maps are kept out of line and out of the hot code (only such data gets there). */
#if defined(__GNUC__)
#define SN_COLD __attribute__((noinline, cold, unused))
#else
#define SN_COLD
#endif

/* y[i] = (float)((x[i] − m)·a + b) in fp64. y may equal x. */
SN_COLD static void sn__aff_run_f64(float *y, const float *x, int64_t n, double m, double a,
                                   double b) {
  for (int64_t i = 0; i < n; i++) y[i] = (float)SN_CHAN_Y((double)x[i], m, 0.0, a, b);
}

/* dx[i] = (float)((dy[i]·a − b) − (x[i] − m)·e) in fp64. dx may equal dy. */
SN_COLD static void sn__affbwd_run_f64(float *dx, const float *dy, const float *x, int64_t n,
                                      double m, double a, double b, double e) {
  for (int64_t i = 0; i < n; i++)
    dx[i] = (float)SN_CHAN_DX((double)dy[i], (double)x[i], m, 0.0, a, b, e);
}

/* Channel j of a tile mapped in fp64 over nr rows: y[r·ld] = (x[r·ld] − m)·a + b with the fp64
 * constants (a column of stride ld). y may equal x. */
SN_COLD static void sn__aff_col_f64(float *y, const float *x, int64_t nr, int64_t ld,
                                   const sn__chan_tile_t *p, int64_t j) {
  for (int64_t r = 0; r < nr; r++) sn__aff_run_f64(y + r * ld, x + r * ld, 1, p->m[j], p->ad[j], p->bd[j]);
}
/* The backward map likewise. dx may equal dy. */
SN_COLD static void sn__affbwd_col_f64(float *dx, const float *dy, const float *x, int64_t nr,
                                      int64_t ld, const sn__chan_tile_t *p, int64_t j) {
  for (int64_t r = 0; r < nr; r++)
    sn__affbwd_run_f64(dx + r * ld, dy + r * ld, x + r * ld, 1, p->m[j], p->ad[j], p->bd[j],
                       p->ed[j]);
}

/* The end of the run of channels from j on that share p->f64[j] (within ct). A tile with
 * channels mapped in fp64 is gone over run by run: the vector kernels for the others, with the
 * same bits as on a tile without any. */
static inline int64_t sn__f64_run_end(const sn__chan_tile_t *p, int64_t j, int64_t ct) {
  int64_t e = j + 1;
  while (e < ct && p->f64[e] == p->f64[j]) e++;
  return e;
}

/* ---- guarded forward map for bf16/f16 outputs ------------------------------------------------ */

/* Whether an f32 value of the forward map is recomputed in fp64: not finite (NaN included). */
#define SN_NONFINITE(v) (!(fabsf(v) <= FLT_MAX))

/* Elements per block of the guarded map: the f32 map runs over a block with one flag; a block
 * with a non-finite value is gone over again. Which elements are recomputed depends on each
 * element's value only, so NCHW and NHWC and any thread count give the same bits. */
#define SN_GUARD_BLOCK 128

/* One block of m ≤ SN_GUARD_BLOCK elements of the guarded map into y [m] (f32, not aliasing x):
 * v = ((x − hi) − lo)·a + b in f32, or (float)((x − md)·ad + bd) in fp64 where v is not finite.
 * Always inlined into its target clone caller. */
static inline __attribute__((always_inline)) void sn__aff_block_guarded(
    float *restrict y, const float *restrict x, int64_t m, float hi, float lo, float a, float b,
    double md, double ad, double bd) {
  int bad = 0;
  for (int64_t k = 0; k < m; k++) {
    const float v = SN_CHAN_Y(x[k], hi, lo, a, b);
    y[k] = v;
    bad |= SN_NONFINITE(v);
  }
  if (bad)
    for (int64_t k = 0; k < m; k++)
      if (SN_NONFINITE(y[k])) y[k] = (float)SN_CHAN_Y((double)x[k], md, 0.0, ad, bd);
}

/* The guarded map of one channel's run x [n] into y [n] (f32, not aliasing). */
SN_CLONES static inline void sn__aff_run_guarded(float *restrict y, const float *restrict x,
                                                 int64_t n, const sn__chan_k_t *k) {
  int64_t i = 0;
  for (; i + SN_GUARD_BLOCK <= n; i += SN_GUARD_BLOCK) /* a constant trip count to vectorize */
    sn__aff_block_guarded(y + i, x + i, SN_GUARD_BLOCK, k->hi, k->lo, k->a, k->b, k->m, k->ad,
                          k->bd);
  if (i < n)
    sn__aff_block_guarded(y + i, x + i, n - i, k->hi, k->lo, k->a, k->b, k->m, k->ad, k->bd);
}

/* The guarded map of rows of a channel slice: y, x [nr, ld] (not aliasing), ct channels of p
 * (channel c at index j0 + c), each row's slice in blocks of SN_GUARD_BLOCK channels. */
SN_CLONES static inline void sn__aff_rows_guarded(float *restrict y, const float *restrict x,
                                                  int64_t nr, int64_t ld, int64_t ct,
                                                  const sn__chan_tile_t *p, int64_t j0) {
  for (int64_t r = 0; r < nr; r++)
    for (int64_t c0 = 0; c0 < ct; c0 += SN_GUARD_BLOCK) {
      const int64_t m = sn__min64(SN_GUARD_BLOCK, ct - c0), k0 = j0 + c0;
      const float *hi = p->hi + k0, *lo = p->lo + k0, *a = p->a + k0, *b = p->b + k0;
      const double *md = p->m + k0, *ad = p->ad + k0, *bd = p->bd + k0;
      float *restrict yr = y + r * ld + c0;
      const float *restrict xr = x + r * ld + c0;
      int bad = 0;
      for (int64_t c = 0; c < m; c++) {
        const float v = SN_CHAN_Y(xr[c], hi[c], lo[c], a[c], b[c]);
        yr[c] = v;
        bad |= SN_NONFINITE(v);
      }
      if (bad)
        for (int64_t c = 0; c < m; c++)
          if (SN_NONFINITE(yr[c])) yr[c] = (float)SN_CHAN_Y((double)xr[c], md[c], 0.0, ad[c], bd[c]);
    }
}

/* The guarded map of one bf16 value xb with its channel's constants, narrowed as sn__from_f32:
 * the element-by-element path of the bf16 pair maps below. */
static inline uint16_t sn__aff_val_bf16(uint16_t xb, float hi, float lo, float a, float b,
                                        double md, double ad, double bd) {
  const float xv = sn__bf16_to_f32(xb);
  float v = SN_CHAN_Y(xv, hi, lo, a, b);
  if (SN_NONFINITE(v)) v = (float)SN_CHAN_Y((double)xv, md, 0.0, ad, bd);
  return sn__f32_to_bf16(v);
}

/* Whether any of the 32 values e, o is not finite, on the bits of |v| (above FLT_MAX's, which
 * order as the values): the test of the bf16 pair maps, the same as SN_NONFINITE's. */
SN_INLINE int sn__pair_nonfinite(const sn__pf *e, const sn__pf *o) {
  const sn__pi ue = (sn__pi)*e & 0x7fffffff, uo = (sn__pi)*o & 0x7fffffff;
  const sn__pi neg = (0x7f7fffff - ue) | (0x7f7fffff - uo);
  return sn__any_sign(&neg);
}

/* ---- NCHW runs: the maps of f32 and bf16 activations, one body each ------------------------ */

/* Each map below is one always-inline body over blocks of SN_PAIR values (rownorm.h's
 * sn__block_load, sn__block_store: f32 in order, bf16 read and written in pairs as the even and
 * odd halves of 16 words, which keeps the lanes permuted but a map is element by element), then
 * element by element; bf16 and nt are constants in each SN_CLONES wrapper. The f32 outputs are
 * the plain map; the bf16 ones the guarded map narrowed as sn__from_f32 (forward: a block with a
 * non-finite f32 value is gone over element by element, sn__aff_val_bf16), bitwise the f16 path
 * through f32 tiles. nt (f32 only): streamed stores, the elements before the first 64-byte line
 * one at a time (sn__head64); with SN_NT_PREFETCH also the inputs prefetched (sn__map_pf). */

/* y [n] = ((x − hi) − lo)·a + b with one channel's constants k, x and y f32 or (bf16) bf16; y
 * may equal x. */
SN_INLINE void sn__aff_run_impl(void *y, const void *x, int64_t n, const sn__chan_k_t *k,
                                int bf16, int nt) {
  const float hi = k->hi, lo = k->lo, a = k->a, b = k->b;
  const uintptr_t pf = sn__map_pf_bytes(1, nt);
#define SN_AFF_EL(i)                                                                          \
  do {                                                                                        \
    if (bf16)                                                                                 \
      ((uint16_t *)y)[i] =                                                                    \
          sn__aff_val_bf16(((const uint16_t *)x)[i], hi, lo, a, b, k->m, k->ad, k->bd);      \
    else                                                                                      \
      ((float *)y)[i] = SN_CHAN_Y(((const float *)x)[i], hi, lo, a, b);                       \
  } while (0)
  int64_t i = 0;
  for (const int64_t h = nt && !bf16 ? sn__head64(y, n) : 0; i < h; i++) SN_AFF_EL(i);
  for (; i + SN_PAIR <= n; i += SN_PAIR) {
    if (!bf16) sn__map_pf((const float *)x + i, pf), sn__map_pf((const float *)x + i + 16, pf);
    sn__pf e, o;
    sn__block_load(&e, &o, x, i, bf16);
    e = SN_CHAN_Y(e, hi, lo, a, b);
    o = SN_CHAN_Y(o, hi, lo, a, b);
    if (bf16 && sn__pair_nonfinite(&e, &o))
      for (int64_t j = i; j < i + SN_PAIR; j++) SN_AFF_EL(j);
    else
      sn__block_store(y, i, &e, &o, bf16, nt, 1);
  }
  for (; i < n; i++) SN_AFF_EL(i);
#undef SN_AFF_EL
}
SN_CLONES SN_UNUSED static void sn__aff_run(float *y, const float *x, int64_t n,
                                            const sn__chan_k_t *k, int nt) {
  sn__aff_run_impl(y, x, n, k, 0, nt);
}
SN_CLONES SN_UNUSED static void sn__aff_run_bf16(uint16_t *y, const uint16_t *x, int64_t n,
                                                 const sn__chan_k_t *k) {
  sn__aff_run_impl(y, x, n, k, 1, 0);
}

/* dx [n] = (dy·a − b) − ((x − hi) − lo)·e with one channel's constants k, all f32 or (bf16)
 * bf16; dx may equal dy. */
SN_INLINE void sn__affbwd_run_impl(void *dx, const void *dy, const void *x, int64_t n,
                                   const sn__chan_k_t *k, int bf16, int nt) {
  const float hi = k->hi, lo = k->lo, a = k->a, b = k->b, e = k->e;
  const uintptr_t pf = sn__map_pf_bytes(1, nt);
#define SN_AFFBWD_EL(i)                                                                       \
  sn__store_w(dx, bf16, i,                                                                    \
              SN_CHAN_DX(sn__load_w(dy, bf16, i), sn__load_w(x, bf16, i), hi, lo, a, b, e))
  int64_t i = 0;
  for (const int64_t h = nt && !bf16 ? sn__head64(dx, n) : 0; i < h; i++) SN_AFFBWD_EL(i);
  for (; i + SN_PAIR <= n; i += SN_PAIR) {
    if (!bf16)
      for (int h = 0; h < SN_PAIR; h += 16)
        sn__map_pf((const float *)dy + i + h, pf), sn__map_pf((const float *)x + i + h, pf);
    sn__pf ge, go, ve, vo;
    sn__block_load(&ge, &go, dy, i, bf16);
    sn__block_load(&ve, &vo, x, i, bf16);
    ge = SN_CHAN_DX(ge, ve, hi, lo, a, b, e);
    go = SN_CHAN_DX(go, vo, hi, lo, a, b, e);
    sn__block_store(dx, i, &ge, &go, bf16, nt, 0);
  }
  for (; i < n; i++) SN_AFFBWD_EL(i);
#undef SN_AFFBWD_EL
}
SN_CLONES SN_UNUSED static void sn__affbwd_run(float *dx, const float *dy, const float *x,
                                               int64_t n, const sn__chan_k_t *k, int nt) {
  sn__affbwd_run_impl(dx, dy, x, n, k, 0, nt);
}
SN_CLONES SN_UNUSED static void sn__affbwd_run_bf16(uint16_t *dx, const uint16_t *dy,
                                                    const uint16_t *x, int64_t n,
                                                    const sn__chan_k_t *k) {
  sn__affbwd_run_impl(dx, dy, x, n, k, 1, 0);
}

/* ---- any activation dtype: f32 in place, bf16 in pairs, f16 through stack tiles ------------- */

/* The forward map of one channel's run [off, off + n) of x into a bf16/f16 y from the run
 * already widened, xf [n] f32, through one f32 tile for y (guarded; k->f64: in fp64): the tile
 * step of sn__aff_span, and the GroupNorm f16 groups widened once. */
static inline void sn__aff_span_from_f32(void *y, int64_t off, const float *xf, int64_t n,
                                         const sn__chan_k_t *k, sn_dtype_t dtype) {
  float t[SN_TILE];
  for (int64_t i = 0; i < n; i += SN_TILE) {
    const int64_t m = sn__min64(SN_TILE, n - i);
    if (k->f64) sn__aff_run_f64(t, xf + i, m, k->m, k->ad, k->bd);
    else sn__aff_run_guarded(t, xf + i, m, k);
    sn__from_f32(y, off + i, t, m, dtype);
  }
}

/* Elements [off, off+n) of one channel's run: y = ((x − hi) − lo)·a + b (k->f64: in fp64;
 * bf16/f16: guarded). y may equal x. */
static inline void sn__aff_span(void *y, const void *x, int64_t off, int64_t n,
                                const sn__chan_k_t *k, sn_dtype_t dtype, int nt) {
  if (dtype == SN_DTYPE_F32) {
    if (k->f64) sn__aff_run_f64((float *)y + off, (const float *)x + off, n, k->m, k->ad, k->bd);
    else sn__aff_run((float *)y + off, (const float *)x + off, n, k, nt);
    return;
  }
  if (dtype == SN_DTYPE_BF16 && !k->f64) { /* in pairs, no tile: bitwise the same */
    sn__aff_run_bf16((uint16_t *)y + off, (const uint16_t *)x + off, n, k);
    return;
  }
  float t[SN_TILE];
  for (int64_t i = 0; i < n; i += SN_TILE) {
    const int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(t, x, off + i, m, dtype);
    sn__aff_span_from_f32(y, off + i, t, m, k, dtype);
  }
}

/* Backward over elements [off, off+n) of one channel's run. dx may equal dy. */
static inline void sn__affbwd_span(void *dx, const void *dy, const void *x, int64_t off, int64_t n,
                                   const sn__chan_k_t *k, sn_dtype_t dtype, int nt) {
  if (dtype == SN_DTYPE_F32) {
    float *o = (float *)dx + off;
    const float *g = (const float *)dy + off, *v = (const float *)x + off;
    if (k->f64) sn__affbwd_run_f64(o, g, v, n, k->m, k->ad, k->bd, k->ed);
    else sn__affbwd_run(o, g, v, n, k, nt);
    return;
  }
  if (dtype == SN_DTYPE_BF16 && !k->f64) { /* in pairs, no tiles: bitwise the same */
    sn__affbwd_run_bf16((uint16_t *)dx + off, (const uint16_t *)dy + off,
                        (const uint16_t *)x + off, n, k);
    return;
  }
  float tg[SN_TILE], tx[SN_TILE];
  for (int64_t i = 0; i < n; i += SN_TILE) {
    int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(tg, dy, off + i, m, dtype);
    sn__to_f32(tx, x, off + i, m, dtype);
    if (k->f64) sn__affbwd_run_f64(tg, tg, tx, m, k->m, k->ad, k->bd, k->ed);
    else sn__affbwd_run(tg, tg, tx, m, k, 0);
    sn__from_f32(dx, off + i, tg, m, dtype);
  }
}

/* Rows per call for rows [r, r+R) × channels [c0, c0+ct) of an [rows, ld] activation: all of
 * them for f32 (the memory is used directly); for bf16/f16 as many whole rows as fit a tile when
 * the slice is the whole row (then the block is contiguous), else one row. Needs ct <= SN_TILE. */
static inline int64_t sn__rows_per_block(int64_t rows, int64_t ld, int64_t ct, sn_dtype_t dtype) {
  if (dtype == SN_DTYPE_F32) return rows > 0 ? rows : 1;
  if (ct == ld) return SN_TILE / ld > 0 ? SN_TILE / ld : 1;
  return 1;
}


/* ---- NHWC rows: the tile constants in pair order, the maps of f32 and bf16 rows ---------- */

/* A tile's f32 constants in pair order over its ct channels (sn__to_pairs: each full block of 32
 * channels its even ones, then its odd ones; the tail as is): what bf16 rows read in pairs take
 * (sn__tile_pairs_set). */
typedef struct {
  _Alignas(64) float hi[SN_TILE_C];
  _Alignas(64) float lo[SN_TILE_C];
  _Alignas(64) float a[SN_TILE_C];
  _Alignas(64) float b[SN_TILE_C];
  _Alignas(64) float e[SN_TILE_C]; /* backward only */
} sn__tile_pairs_t;

/* q from the first ct channels of p; bwd: e too. */
static inline void sn__tile_pairs_set(sn__tile_pairs_t *q, const sn__chan_tile_t *p, int64_t ct,
                                      int bwd) {
  sn__to_pairs(q->hi, p->hi, ct);
  sn__to_pairs(q->lo, p->lo, ct);
  sn__to_pairs(q->a, p->a, ct);
  sn__to_pairs(q->b, p->b, ct);
  if (bwd) sn__to_pairs(q->e, p->e, ct);
}

/* A tile's f32 constants as the block loops read them: from the slice's first channel on, in
 * element order (f32 rows: sn__chan_tile_t's arrays from j0) or in pair order (bf16 rows:
 * sn__tile_pairs_t's). */
typedef struct {
  const float *hi, *lo, *a, *b, *e;
} sn__tile_blk_t;

/* Rows of a channel slice: y[r·ld + c] = ((x[r·ld + c] − hi) − lo)·a + b with channel c's
 * constants (p's, at index j0 + c; q: the same in block order), y and x [nr, ld] f32 or (bf16)
 * bf16, the first ct <= SN_TILE_C channels of each row; y may equal x. */
SN_INLINE void sn__aff_rows_impl(void *y, const void *x, int64_t nr, int64_t ld, int64_t ct,
                                 const sn__chan_tile_t *p, int64_t j0, const sn__tile_blk_t *q,
                                 int bf16, int nt) {
  const uintptr_t pf = sn__map_pf_bytes(ld, nt);
  const int64_t es = bf16 ? 2 : 4;
#define SN_AFF_EL(c)                                                                          \
  do {                                                                                        \
    const int64_t k_ = j0 + (c);                                                              \
    if (bf16)                                                                                 \
      ((uint16_t *)yr)[c] = sn__aff_val_bf16(((const uint16_t *)xr)[c], p->hi[k_], p->lo[k_], \
                                             p->a[k_], p->b[k_], p->m[k_], p->ad[k_],         \
                                             p->bd[k_]);                                      \
    else                                                                                      \
      ((float *)yr)[c] = SN_CHAN_Y(((const float *)xr)[c], p->hi[k_], p->lo[k_], p->a[k_],   \
                                   p->b[k_]);                                                 \
  } while (0)
  for (int64_t r = 0; r < nr; r++) {
    void *yr = (char *)y + r * ld * es;
    const void *xr = (const char *)x + r * ld * es;
    int64_t c = 0;
    for (const int64_t hd = nt && !bf16 ? sn__head64(yr, ct) : 0; c < hd; c++) SN_AFF_EL(c);
    for (; c + SN_PAIR <= ct; c += SN_PAIR) {
      if (!bf16)
        sn__map_pf((const float *)xr + c, pf), sn__map_pf((const float *)xr + c + 16, pf);
      sn__pf e, o, he, ho, le, lo, ae, ao, be, bo;
      sn__block_load(&e, &o, xr, c, bf16);
      sn__pair_load(&he, &ho, q->hi + c);
      sn__pair_load(&le, &lo, q->lo + c);
      sn__pair_load(&ae, &ao, q->a + c);
      sn__pair_load(&be, &bo, q->b + c);
      e = SN_CHAN_Y(e, he, le, ae, be);
      o = SN_CHAN_Y(o, ho, lo, ao, bo);
      if (bf16 && sn__pair_nonfinite(&e, &o))
        for (int64_t k = c; k < c + SN_PAIR; k++) SN_AFF_EL(k);
      else
        sn__block_store(yr, c, &e, &o, bf16, nt, 1);
    }
    for (; c < ct; c++) SN_AFF_EL(c);
  }
#undef SN_AFF_EL
}
SN_CLONES SN_UNUSED static void sn__aff_rows(float *y, const float *x, int64_t nr, int64_t ld,
                                             int64_t ct, const sn__chan_tile_t *p, int64_t j0,
                                             int nt) {
  const sn__tile_blk_t q = {p->hi + j0, p->lo + j0, p->a + j0, p->b + j0, p->e + j0};
  sn__aff_rows_impl(y, x, nr, ld, ct, p, j0, &q, 0, nt);
}
SN_CLONES SN_UNUSED static void sn__aff_rows_bf16(uint16_t *y, const uint16_t *x, int64_t nr,
                                                  int64_t ld, int64_t ct,
                                                  const sn__chan_tile_t *p,
                                                  const sn__tile_pairs_t *qp) {
  const sn__tile_blk_t q = {qp->hi, qp->lo, qp->a, qp->b, qp->e};
  sn__aff_rows_impl(y, x, nr, ld, ct, p, 0, &q, 1, 0);
}

/* The backward map of rows of a channel slice likewise: dx[r·ld + c] = (dy·a − b) − ((x − hi)
 * − lo)·e with channel c's constants (el: in element order, q: in block order), dx, dy, x
 * [nr, ld] f32 or (bf16) bf16; dx may equal dy. */
SN_INLINE void sn__affbwd_rows_impl(void *dx, const void *dy, const void *x, int64_t nr,
                                    int64_t ld, int64_t ct, const sn__tile_blk_t *el,
                                    const sn__tile_blk_t *q, int bf16, int nt) {
  const uintptr_t pf = sn__map_pf_bytes(ld, nt);
  const int64_t es = bf16 ? 2 : 4;
#define SN_AFFBWD_EL(c)                                                                       \
  sn__store_w(dxr, bf16, c,                                                                   \
              SN_CHAN_DX(sn__load_w(dyr, bf16, c), sn__load_w(xr, bf16, c), el->hi[c],        \
                         el->lo[c], el->a[c], el->b[c], el->e[c]))
  for (int64_t r = 0; r < nr; r++) {
    void *dxr = (char *)dx + r * ld * es;
    const void *dyr = (const char *)dy + r * ld * es, *xr = (const char *)x + r * ld * es;
    int64_t c = 0;
    for (const int64_t hd = nt && !bf16 ? sn__head64(dxr, ct) : 0; c < hd; c++) SN_AFFBWD_EL(c);
    for (; c + SN_PAIR <= ct; c += SN_PAIR) {
      if (!bf16)
        for (int h = 0; h < SN_PAIR; h += 16)
          sn__map_pf((const float *)dyr + c + h, pf), sn__map_pf((const float *)xr + c + h, pf);
      sn__pf ge, go, ve, vo, he, ho, le, lo, ae, ao, be, bo, ee, eo;
      sn__block_load(&ge, &go, dyr, c, bf16);
      sn__block_load(&ve, &vo, xr, c, bf16);
      sn__pair_load(&he, &ho, q->hi + c);
      sn__pair_load(&le, &lo, q->lo + c);
      sn__pair_load(&ae, &ao, q->a + c);
      sn__pair_load(&be, &bo, q->b + c);
      sn__pair_load(&ee, &eo, q->e + c);
      ge = SN_CHAN_DX(ge, ve, he, le, ae, be, ee);
      go = SN_CHAN_DX(go, vo, ho, lo, ao, bo, eo);
      sn__block_store(dxr, c, &ge, &go, bf16, nt, 0);
    }
    for (; c < ct; c++) SN_AFFBWD_EL(c);
  }
#undef SN_AFFBWD_EL
}
SN_CLONES SN_UNUSED static void sn__affbwd_rows(float *dx, const float *dy, const float *x,
                                                int64_t nr, int64_t ld, int64_t ct,
                                                const sn__chan_tile_t *p, int64_t j0, int nt) {
  const sn__tile_blk_t q = {p->hi + j0, p->lo + j0, p->a + j0, p->b + j0, p->e + j0};
  sn__affbwd_rows_impl(dx, dy, x, nr, ld, ct, &q, &q, 0, nt);
}
SN_CLONES SN_UNUSED static void sn__affbwd_rows_bf16(uint16_t *dx, const uint16_t *dy,
                                                     const uint16_t *x, int64_t nr, int64_t ld,
                                                     int64_t ct, const sn__chan_tile_t *p,
                                                     const sn__tile_pairs_t *qp) {
  const sn__tile_blk_t el = {p->hi, p->lo, p->a, p->b, p->e};
  const sn__tile_blk_t q = {qp->hi, qp->lo, qp->a, qp->b, qp->e};
  sn__affbwd_rows_impl(dx, dy, x, nr, ld, ct, &el, &q, 1, 0);
}

/* ---- rows of any dtype (NHWC): f32 in place, bf16 in pairs, f16 through stack tiles ------- */

/* The forward map of rows [r0, r1) × channels [c0, c0+ct) of y, x: [rows, ld]; p: the tile's
 * constants; ct <= SN_TILE_C (bf16/f16: guarded). y may equal x. nt: f32 only. */
static inline void sn__aff_rowspan(void *y, const void *x, int64_t r0, int64_t r1, int64_t ld,
                                   int64_t c0, int64_t ct, const sn__chan_tile_t *p,
                                   sn_dtype_t dtype, int nt) {
  const int wide = sn__tile_any_f64(p, ct);
  if (dtype == SN_DTYPE_BF16 && !wide) { /* in pairs, no tile: the same bits */
    sn__tile_pairs_t q;
    sn__tile_pairs_set(&q, p, ct, 0);
    sn__aff_rows_bf16((uint16_t *)y + r0 * ld + c0, (const uint16_t *)x + r0 * ld + c0, r1 - r0,
                      ld, ct, p, &q);
    return;
  }
  float tx[SN_TILE], ty[SN_TILE];
  const int64_t per = sn__rows_per_block(r1 - r0, ld, ct, dtype);
  for (int64_t r = r0; r < r1; r += per) {
    const int64_t nr = sn__min64(per, r1 - r), off = r * ld + c0, span = (nr - 1) * ld + ct;
    const float *xb = sn__in_row(x, off, span, dtype, tx);
    float *yb = sn__out_row(y, off, dtype, ty); /* bf16/f16: ty, apart from tx (guarded) */
    for (int64_t j = 0, e; j < ct; j = e) { /* one run if no channel is mapped in fp64 */
      e = wide ? sn__f64_run_end(p, j, ct) : ct;
      if (wide && p->f64[j])
        for (int64_t k = j; k < e; k++) sn__aff_col_f64(yb + k, xb + k, nr, ld, p, k);
      else if (dtype == SN_DTYPE_F32)
        sn__aff_rows(yb + j, xb + j, nr, ld, e - j, p, j, nt);
      else
        sn__aff_rows_guarded(yb + j, xb + j, nr, ld, e - j, p, j);
    }
    sn__out_done(y, off, span, dtype, yb);
  }
}

/* Backward over rows [r0, r1) × channels [c0, c0+ct) with the tile's constants p.
 * dx may equal dy. */
static inline void sn__affbwd_rowspan(void *dx, const void *dy, const void *x, int64_t r0,
                                      int64_t r1, int64_t ld, int64_t c0, int64_t ct,
                                      const sn__chan_tile_t *p, sn_dtype_t dtype, int nt) {
  nt = dtype == SN_DTYPE_F32 ? nt : 0; /* bf16/f16 rows go through the stack tiles */
  const int wide = sn__tile_any_f64(p, ct);
  if (dtype == SN_DTYPE_BF16 && !wide) { /* in pairs, no tiles: the same bits */
    sn__tile_pairs_t q;
    sn__tile_pairs_set(&q, p, ct, 1);
    const int64_t off = r0 * ld + c0;
    sn__affbwd_rows_bf16((uint16_t *)dx + off, (const uint16_t *)dy + off,
                         (const uint16_t *)x + off, r1 - r0, ld, ct, p, &q);
    return;
  }
  float tg[SN_TILE], tx[SN_TILE];
  int64_t per = sn__rows_per_block(r1 - r0, ld, ct, dtype);
  for (int64_t r = r0; r < r1; r += per) {
    int64_t nr = sn__min64(per, r1 - r), off = r * ld + c0, span = (nr - 1) * ld + ct;
    const float *gb = sn__in_row(dy, off, span, dtype, tg);
    const float *xb = sn__in_row(x, off, span, dtype, tx);
    float *ob = sn__out_row(dx, off, dtype, tg);
    for (int64_t j = 0, e; j < ct; j = e) {
      e = wide ? sn__f64_run_end(p, j, ct) : ct;
      if (!p->f64[j] || !wide) sn__affbwd_rows(ob + j, gb + j, xb + j, nr, ld, e - j, p, j, nt);
      else
        for (int64_t k = j; k < e; k++) sn__affbwd_col_f64(ob + k, gb + k, xb + k, nr, ld, p, k);
    }
    sn__out_done(dx, off, span, dtype, ob);
  }
}

#endif /* SN_NORM_KERNELS_H */
