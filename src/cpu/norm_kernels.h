/*
 * norm_kernels.h — f32 inner loops shared by batchnorm.c and groupnorm.c: the per-channel
 * affine map of the forward and backward pass, applied to one contiguous run of a channel
 * (NCHW plane) or to blocks of rows of a channel slice (NHWC), plus size validation.
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
 * bf16/f16 forwards with beta take the checked map, which recomputes in fp64 the elements where
 * beta cancels xc·a too deeply for the 1-ulp bound (SN_CANCEL_LOG2_BF16).
 *
 * Loops run over blocks of SN_VB elements held in one GCC vector value (sn__vf): each block is
 * loaded whole, computed, then stored whole. That makes y == x (in place) well defined without
 * restrict, vectorizes at -O2 too, and stores a block with one full-width store (GCC had turned
 * the former local-array blocks into 32-, 16-, 8- and 4-byte stores); the tail is scalar.
 * f16 activations go through f32 stack tiles (sn__to_f32, sn__from_f32); bf16 ones are read
 * and written in pairs (rownorm.h's sn__pair_widen, sn__pair_narrow) with the same bits: NCHW
 * runs by sn__aff_run_bf16 and sn__affbwd_run_bf16, NHWC rows by sn__aff_rows_bf16 and
 * sn__affbwd_rows_bf16 with the tile's constants in pair order (sn__tile_pairs_t), but tiles
 * with a channel mapped in fp64, which keep the f32 tiles.
 */
#ifndef SN_NORM_KERNELS_H
#define SN_NORM_KERNELS_H

#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "rownorm.h"

/* Elements per vector block of the loops below (one AVX-512 register of f32). */
#define SN_VB 16
/* Floats in one per-thread conversion tile for bf16/f16 (8 KiB, on the stack). */
#define SN_TILE 2048
/* Channels per NHWC channel tile: bounds the per-channel scratch (parameters, lanes) so it stays
 * in L1, and guarantees a tile row fits a conversion tile (SN_TILE_C <= SN_TILE). */
#define SN_TILE_C 256
/* Below this many elements a kernel runs on the calling thread only (no parallel region). */
#define SN_PAR_MIN 32768

/* GCC/Clang vector values: SN_VB floats, or SN_VD doubles, operated on as a whole. Every
 * operation is the IEEE operation of each element (-ffp-contract=off; a scalar operand is
 * broadcast), so the results are those of the scalar loops, in registers of whatever width the
 * target clone has (one AVX-512 register, two AVX2, four SSE2). Loaded and stored with memcpy
 * (unaligned); macros rather than functions, since a function taking or returning a 64-byte
 * vector has a target-dependent ABI. */
#define SN_VD 8
typedef float sn__vf __attribute__((vector_size(SN_VB * sizeof(float))));
typedef double sn__vd __attribute__((vector_size(SN_VD * sizeof(double))));
_Static_assert(SN_VD == SN_LANES, "the contiguous-run reductions hold a lane group in one sn__vd");
#define SN_VLOAD(dst, p) memcpy(&(dst), (p), sizeof(dst))
#define SN_VSTORE(p, v) memcpy((p), &(v), sizeof(v))
/* dst (sn__vd) = SN_VD floats from p, widened. */
#define SN_VLOAD_WIDEN(dst, p)                                                                \
  do {                                                                                        \
    const float *p_ = (p);                                                                    \
    (dst) = (sn__vd){(double)p_[0], (double)p_[1], (double)p_[2], (double)p_[3],              \
                     (double)p_[4], (double)p_[5], (double)p_[6], (double)p_[7]};             \
  } while (0)

/* dst (sn__vd) = the SN_VD elements of x from element i, f32 or (bf16) bf16, widened: the same
 * values either way, so the same sums (bf16 runs need no f32 tile). */
#define SN_VLOAD_WIDEN_W(dst, x, i, bf16)                                                     \
  do {                                                                                        \
    if (bf16) {                                                                               \
      const uint16_t *q_ = (const uint16_t *)(x) + (i);                                       \
      (dst) = (sn__vd){(double)sn__bf16_to_f32(q_[0]), (double)sn__bf16_to_f32(q_[1]),        \
                       (double)sn__bf16_to_f32(q_[2]), (double)sn__bf16_to_f32(q_[3]),        \
                       (double)sn__bf16_to_f32(q_[4]), (double)sn__bf16_to_f32(q_[5]),        \
                       (double)sn__bf16_to_f32(q_[6]), (double)sn__bf16_to_f32(q_[7])};       \
    } else {                                                                                  \
      SN_VLOAD_WIDEN(dst, (const float *)(x) + (i));                                          \
    }                                                                                         \
  } while (0)

/* How far ahead the NHWC row reductions prefetch their input: 2 KiB, or one row if rows are
 * longer. The hardware prefetcher restarts at every 4 KiB page; as for the NCHW runs
 * (batchnorm.c, RED_PF_FLOATS), the reductions' add chains leave it behind. */
#define SN_ROW_PF_FLOATS 512

/* Elements from a row to the row `floats` / ld rows (at least one) after it, in a tensor of rows
 * ld elements apart (ld = 1: a contiguous run, `floats` on): how far the prefetches below reach. */
static inline uintptr_t sn__rows_ahead_elems(int64_t ld, int64_t floats) {
  const int64_t ahead = ld >= floats ? 1 : floats / ld;
  return (uintptr_t)(ahead * ld);
}
/* The same distance in bytes of f32 rows. */
static inline uintptr_t sn__rows_ahead_bytes(int64_t ld, int64_t floats) {
  return sn__rows_ahead_elems(ld, floats) * sizeof(float);
}

/* The address `bytes` past element i of p (elements of es bytes), for a prefetch: computed as an
 * integer, as it may lie past the array (a pointer there would be undefined behaviour;
 * prefetches never fault). */
static inline const void *sn__pf_addr(const void *p, int64_t i, uintptr_t es, uintptr_t bytes) {
  return (const void *)((uintptr_t)p + (uintptr_t)i * es + bytes);
}

/* Bytes from a row to the row SN_ROW_PF_FLOATS / ld rows (at least one) after it, in a tensor
 * of rows ld elements of es bytes apart (f32: es = 4; bf16: 2): the distance of the NHWC row
 * reductions' prefetches. Computed once per call, outside the row loop: GCC left the division
 * of sn__rows_ahead_elems in the loop, a 64-bit idiv per row (bench_ab: 0.94-0.98x the time
 * for some NHWC backward reductions at C = 64, 1.00 elsewhere). */
static inline uintptr_t sn__row_pf_ahead(int64_t ld, uintptr_t es) {
  return sn__rows_ahead_elems(ld, SN_ROW_PF_FLOATS) * es;
}

/* Prefetches for reading the first ct elements (es bytes each) of the row `ahead` bytes after
 * `row` (sn__row_pf_ahead): a line per 64 bytes. Prefetches never fault, so rows past the end
 * cost nothing but the hint; their addresses are computed as integers (a pointer past its array
 * would be undefined behaviour). */
static inline __attribute__((always_inline)) void sn__prefetch_at(const void *row,
                                                                  uintptr_t ahead, int64_t ct,
                                                                  uintptr_t es) {
  const uintptr_t q = (uintptr_t)row + ahead;
  for (int64_t c = 0; c < ct; c += (int64_t)(64 / es))
    __builtin_prefetch((const void *)(q + (uintptr_t)c * es), 0);
}

/* Per-channel shifted sums of the rows xr[0..B), in row order: s1[c] += x[c] − k[c],
 * s2[c] += (x[c] − k[c])² (fp64), c < ct, x f32 or (bf16) bf16; the accumulators an sn__vd at a
 * time, loaded once, added the B rows in registers and stored once, whole. B is a constant after
 * inlining: 1 for the BatchNorm NHWC statistics (one lane row per input row), up to
 * GN_ROW_BLOCK (groupnorm.c) for the GroupNorm NHWC one-pass sums. Always inlined, so it
 * vectorizes for the target clone that calls it. */
static inline __attribute__((always_inline)) void sn__shifted_rows_w(
    double *restrict s1, double *restrict s2, const void *const *xr, int B, int64_t ct,
    const double *restrict k, int bf16) {
  int64_t c = 0;
  for (; c + SN_VD <= ct; c += SN_VD) {
    sn__vd v, kc, a1, a2;
    SN_VLOAD(kc, k + c);
    SN_VLOAD(a1, s1 + c);
    SN_VLOAD(a2, s2 + c);
    for (int j = 0; j < B; j++) {
      SN_VLOAD_WIDEN_W(v, xr[j], c, bf16);
      v -= kc;
      a1 += v;
      a2 += v * v;
    }
    SN_VSTORE(s1 + c, a1);
    SN_VSTORE(s2 + c, a2);
  }
  for (; c < ct; c++)
    for (int j = 0; j < B; j++) {
      const double v = (double)sn__load_w(xr[j], bf16, c) - k[c];
      s1[c] += v;
      s2[c] += v * v;
    }
}

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

/* ---- f32 kernels ------------------------------------------------------------------------------ */

/* The nt argument of the f32 maps below: 0 for ordinary stores; SN_NT_STREAM for streaming
 * stores (sn__stream_out: outputs of SN_STREAM_MIN_BYTES or more); with SN_NT_PREFETCH too, the
 * maps also prefetch their inputs SN_MAP_PF_FLOATS ahead (only where they stream: the flags
 * cannot say prefetch without streaming). That is for the passes whose inputs come from memory
 * (batchnorm.c's apply, inference and backward apply; the GroupNorm NHWC forward's map and
 * backward's dx pass where a thread's rows of a sample exceed its L2), not for the maps that
 * follow a reduction over the same data still in the cache (bench_ab, cold, two threads: the
 * fused NCHW BatchNorm forward and backward took 1.08-1.11x the time with it). */
#define SN_NT_STREAM 1
#define SN_NT_PREFETCH 2

/* How far ahead the maps prefetch with SN_NT_PREFETCH (8 KiB; in rows, the row at least that
 * far on, or the next): the hardware prefetcher alone left a map of [32,64,56,56] NHWC f32
 * (cold, two threads) at 1.74-1.77 ms in a standalone loop, 1.42-1.45 ms with this, 1.49-1.66
 * with 2 KiB. In the library (bench_ab, apply and backward apply) 4 and 16 KiB did no better. */
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

/* y[i] = ((x[i] − hi) − lo)·a + b.  y, x: [n]; y may equal x. */
SN_CLONES static inline void sn__aff_run(float *y, const float *x, int64_t n, float hi, float lo,
                                         float a, float b, int nt) {
  int64_t i = 0;
  const uintptr_t pf = sn__map_pf_bytes(1, nt);
  for (const int64_t h = nt ? sn__head64(y, n) : 0; i < h; i++) y[i] = ((x[i] - hi) - lo) * a + b;
  for (; i + SN_VB <= n; i += SN_VB) {
    sn__vf v;
    sn__map_pf(x + i, pf);
    SN_VLOAD(v, x + i);
    v = ((v - hi) - lo) * a + b;
    sn__store64(y + i, &v, nt);
  }
  for (; i < n; i++) y[i] = ((x[i] - hi) - lo) * a + b;
}

/* Rows of a channel slice: y[r·ld + c] = ((x[r·ld + c] − hi[c]) − lo[c])·a[c] + b[c].
 * y, x: [nr, ld] (first ct <= SN_TILE_C channels of each row used); p: constants, of channel c
 * at index j0 + c. y may equal x. */
SN_CLONES static inline void sn__aff_rows(float *y, const float *x, int64_t nr, int64_t ld,
                                          int64_t ct, const sn__chan_tile_t *p, int64_t j0,
                                          int nt) {
  const float *hi = p->hi + j0, *lo = p->lo + j0, *a = p->a + j0, *b = p->b + j0;
  const uintptr_t pf = sn__map_pf_bytes(ld, nt);
  for (int64_t r = 0; r < nr; r++) {
    float *yr = y + r * ld;
    const float *xr = x + r * ld;
    int64_t c = 0;
    for (const int64_t hd = nt ? sn__head64(yr, ct) : 0; c < hd; c++)
      yr[c] = ((xr[c] - hi[c]) - lo[c]) * a[c] + b[c];
    for (; c + SN_VB <= ct; c += SN_VB) {
      sn__vf v, h, l, va, vb;
      sn__map_pf(xr + c, pf);
      SN_VLOAD(v, xr + c);
      SN_VLOAD(h, hi + c);
      SN_VLOAD(l, lo + c);
      SN_VLOAD(va, a + c);
      SN_VLOAD(vb, b + c);
      v = ((v - h) - l) * va + vb;
      sn__store64(yr + c, &v, nt);
    }
    for (; c < ct; c++) yr[c] = ((xr[c] - hi[c]) - lo[c]) * a[c] + b[c];
  }
}

/* dx[i] = (dy[i]·a − b) − ((x[i] − hi) − lo)·e.  dx, dy, x: [n]; dx may equal dy. */
SN_CLONES static inline void sn__affbwd_run(float *dx, const float *dy, const float *x, int64_t n,
                                            float hi, float lo, float a, float b, float e,
                                            int nt) {
  int64_t i = 0;
  const uintptr_t pf = sn__map_pf_bytes(1, nt);
  for (const int64_t h = nt ? sn__head64(dx, n) : 0; i < h; i++)
    dx[i] = (dy[i] * a - b) - ((x[i] - hi) - lo) * e;
  for (; i + SN_VB <= n; i += SN_VB) {
    sn__vf g, v;
    sn__map_pf(dy + i, pf);
    sn__map_pf(x + i, pf);
    SN_VLOAD(g, dy + i);
    SN_VLOAD(v, x + i);
    g = (g * a - b) - ((v - hi) - lo) * e;
    sn__store64(dx + i, &g, nt);
  }
  for (; i < n; i++) dx[i] = (dy[i] * a - b) - ((x[i] - hi) - lo) * e;
}

/* Rows of a channel slice of the backward map with constants p (hi, lo, a, b, e; channel c at
 * index j0 + c). dx, dy, x: [nr, ld]; dx may equal dy. */
SN_CLONES static inline void sn__affbwd_rows(float *dx, const float *dy, const float *x,
                                             int64_t nr, int64_t ld, int64_t ct,
                                             const sn__chan_tile_t *p, int64_t j0, int nt) {
  const float *hi = p->hi + j0, *lo = p->lo + j0, *a = p->a + j0, *b = p->b + j0;
  const float *e = p->e + j0;
  const uintptr_t pf = sn__map_pf_bytes(ld, nt);
  for (int64_t r = 0; r < nr; r++) {
    float *dxr = dx + r * ld;
    const float *dyr = dy + r * ld, *xr = x + r * ld;
    int64_t c = 0;
    for (const int64_t hd = nt ? sn__head64(dxr, ct) : 0; c < hd; c++)
      dxr[c] = (dyr[c] * a[c] - b[c]) - ((xr[c] - hi[c]) - lo[c]) * e[c];
    for (; c + SN_VB <= ct; c += SN_VB) {
      sn__vf g, v, h, l, va, vb, ve;
      sn__map_pf(dyr + c, pf);
      sn__map_pf(xr + c, pf);
      SN_VLOAD(g, dyr + c);
      SN_VLOAD(v, xr + c);
      SN_VLOAD(h, hi + c);
      SN_VLOAD(l, lo + c);
      SN_VLOAD(va, a + c);
      SN_VLOAD(vb, b + c);
      SN_VLOAD(ve, e + c);
      g = (g * va - vb) - ((v - h) - l) * ve;
      sn__store64(dxr + c, &g, nt);
    }
    for (; c < ct; c++) dxr[c] = (dyr[c] * a[c] - b[c]) - ((xr[c] - hi[c]) - lo[c]) * e[c];
  }
}

/* ---- the constants, and fp64 maps for channels the f32 ones cannot serve ---------------------- */

/* Not covered: f32 terms that overflow while the output does not, such as dy·a of
 * the backward beyond FLT_MAX brought back by − b (gradients near the f32 range), give ±inf; the
 * checked map recomputes them for bf16/f16 forwards with beta only.
 *
 * A centre from SN_CENTRE_F32_MAX (cpu.h) on can make x − hi overflow f32. */

/* sn__f32_holds (cpu.h) of a constant: a = gamma·rstd for σ near 2^127 with a small gamma, or
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
  for (int64_t i = 0; i < n; i++) y[i] = (float)(((double)x[i] - m) * a + b);
}

/* dx[i] = (float)((dy[i]·a − b) − (x[i] − m)·e) in fp64. dx may equal dy. */
SN_COLD static void sn__affbwd_run_f64(float *dx, const float *dy, const float *x, int64_t n,
                                      double m, double a, double b, double e) {
  for (int64_t i = 0; i < n; i++) dx[i] = (float)(((double)dy[i] * a - b) - ((double)x[i] - m) * e);
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

/* The backward map of one channel's bf16 run (dx may equal dy): sn__affbwd_span's f32 values
 * narrowed as sn__from_f32, with dy and x read in pairs (sn__pair_widen) and dx narrowed the
 * same way instead of through f32 tiles: the same bits. */
SN_CLONES SN_UNUSED static void sn__affbwd_run_bf16(uint16_t *dx, const uint16_t *dy,
                                                    const uint16_t *x, int64_t n, float hi,
                                                    float lo, float a, float b, float e) {
  int64_t i = 0;
  for (; i + SN_PAIR <= n; i += SN_PAIR) {
    sn__pf ge, go, ve, vo;
    sn__pair_widen(&ge, &go, dy + i);
    sn__pair_widen(&ve, &vo, x + i);
    ge = (ge * a - b) - ((ve - hi) - lo) * e;
    go = (go * a - b) - ((vo - hi) - lo) * e;
    sn__pair_narrow(dx + i, &ge, &go, 0);
  }
  for (; i < n; i++)
    dx[i] = sn__f32_to_bf16((sn__bf16_to_f32(dy[i]) * a - b) -
                            ((sn__bf16_to_f32(x[i]) - hi) - lo) * e);
}

/* sn__aff_run_bf16, below the checked map's definitions. */
SN_CLONES SN_UNUSED static void sn__aff_run_bf16(uint16_t *y, const uint16_t *x, int64_t n,
                                                 float hi, float lo, float a, float b, float thr,
                                                 double md, double ad, int chk);

/* sn__aff_span_from_f32, below the checked map's definitions. */
static inline void sn__aff_span_from_f32(void *y, int64_t off, const float *xf, int64_t n,
                                         const sn__chan_k_t *k, sn_dtype_t dtype, int chk);

/* ---- any activation dtype: f32 in place, bf16/f16 through stack tiles ------------------------ */

/* Elements [off, off+n) of one channel's run: y = ((x − hi) − lo)·a + b (k->f64: in fp64).
 * y may equal x. */
static inline void sn__aff_span(void *y, const void *x, int64_t off, int64_t n,
                                const sn__chan_k_t *k, sn_dtype_t dtype, int nt) {
  if (dtype == SN_DTYPE_F32) {
    if (k->f64) sn__aff_run_f64((float *)y + off, (const float *)x + off, n, k->m, k->ad, k->bd);
    else sn__aff_run((float *)y + off, (const float *)x + off, n, k->hi, k->lo, k->a, k->b, nt);
    return;
  }
  if (dtype == SN_DTYPE_BF16 && !k->f64) { /* in pairs, no tile: bitwise the same */
    sn__aff_run_bf16((uint16_t *)y + off, (const uint16_t *)x + off, n, k->hi, k->lo, k->a,
                     k->b, 0.0f, 0.0, 0.0, 0);
    return;
  }
  float t[SN_TILE];
  for (int64_t i = 0; i < n; i += SN_TILE) {
    const int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(t, x, off + i, m, dtype);
    sn__aff_span_from_f32(y, off + i, t, m, k, dtype, 0);
  }
}

/* Backward over elements [off, off+n) of one channel's run. dx may equal dy. */
static inline void sn__affbwd_span(void *dx, const void *dy, const void *x, int64_t off, int64_t n,
                                   const sn__chan_k_t *k, sn_dtype_t dtype, int nt) {
  if (dtype == SN_DTYPE_F32) {
    float *o = (float *)dx + off;
    const float *g = (const float *)dy + off, *v = (const float *)x + off;
    if (k->f64) sn__affbwd_run_f64(o, g, v, n, k->m, k->ad, k->bd, k->ed);
    else sn__affbwd_run(o, g, v, n, k->hi, k->lo, k->a, k->b, k->e, nt);
    return;
  }
  if (dtype == SN_DTYPE_BF16 && !k->f64) { /* in pairs, no tiles: bitwise the same */
    sn__affbwd_run_bf16((uint16_t *)dx + off, (const uint16_t *)dy + off,
                        (const uint16_t *)x + off, n, k->hi, k->lo, k->a, k->b, k->e);
    return;
  }
  float tg[SN_TILE], tx[SN_TILE];
  for (int64_t i = 0; i < n; i += SN_TILE) {
    int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(tg, dy, off + i, m, dtype);
    sn__to_f32(tx, x, off + i, m, dtype);
    if (k->f64) sn__affbwd_run_f64(tg, tg, tx, m, k->m, k->ad, k->bd, k->ed);
    else sn__affbwd_run(tg, tg, tx, m, k->hi, k->lo, k->a, k->b, k->e, 0);
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


/* ---- checked forward map for bf16/f16 outputs ------------------------------------------------ */

/* With beta, y = p + b (p = xc·a) can cancel to any depth, while a bf16/f16 output must round to
 * within 1 ulp of the exactly rounded value. The f32 p carries 4 roundings (x − hi, − lo, a
 * rounded to f32, · a): |p̂ − p| < 2^-22·|p|, and v = p̂ + b one more, 2^-24·|v|. b is the
 * channel's constant, so the test is on v alone: where |v| ≥ thr = 2^-k·|b|,
 * |p| ≤ |v| + |b| ≤ (1 + 2^k)·|v| and the error is < (2^-22·(1 + 2^k) + 2^-24)·|v|: for bf16
 * (k = SN_CANCEL_LOG2_BF16 = 10) < 2^-11.9·|v|, for f16 (k = 8) < 2^-13.9·|v|, under a quarter
 * of half an ulp of the output (2^-9·|v|, normal f16 2^-12·|v|), so v narrows to within 1 ulp.
 * Any other element (|v| < thr, or v not finite) is recomputed in fp64 from the exact
 * constants: the fp64 mean md and ad = gamma·rstd in fp64, y = (x − md)·ad + b, good to the
 * accuracy of md and ad and of the recomputation's own two fp64 roundings (2^-52·|p|):
 * BatchNorm's md and ad are its inputs, so its bound holds down to about |y| = 2^-44·|p|;
 * GroupNorm's are its fp64 statistics, whose mean errs by ~2^-53·|mean| (f16 data can hold
 * |mean|/σ ~ 2^11), so down to about |y| = 2^-30·|p| (deeper: 4-15 ulp for f16 at 2^-34 to
 * 2^-36; 63 ulp for BatchNorm at 2^-52).
 * With gamma and beta unrelated about 2^-9 (bf16) of the elements are recomputed. (A subnormal thr rounds by at most 2^-150, far below the outputs' resolution.)
 * LayerNorm's check (layernorm.c, ln_map_beta) is the same bound with |p| tested directly, its
 * beta being per element. */
#define SN_CANCEL_LOG2_BF16 10
#define SN_CANCEL_LOG2_F16 8

/* thr of a channel with beta b (see above). */
static inline float sn__cancel_thr(float b, sn_dtype_t dtype) {
  return ldexpf(fabsf(b), dtype == SN_DTYPE_BF16 ? -SN_CANCEL_LOG2_BF16 : -SN_CANCEL_LOG2_F16);
}

/* Elements per block of the checked map: the f32 map runs over a block with one flag; a block
 * where some element fails is gone over again, each failing element recomputed in fp64. Which
 * elements are recomputed depends on each element's values only, never on where the blocks
 * start: the same bits for NCHW and NHWC and for any thread count (the NCHW planes are cut
 * into pieces by thread count). */
#define SN_CHK_BLOCK 128

/* Whether an element v of the checked map fails: not thr ≤ |v| ≤ FLT_MAX (NaN fails). */
#define SN_CHK_FAILS(v, thr) ((int)!(fabsf(v) >= (thr)) | (int)!(fabsf(v) <= FLT_MAX))

/* One block of m ≤ SN_CHK_BLOCK elements of the checked map into y [m] (f32, not aliasing x):
 * v = ((x − hi) − lo)·a + b in f32, or (float)((x − md)·ad + b) in fp64 where v fails
 * (SN_CHK_FAILS). Always inlined into its target clone caller. */
static inline __attribute__((always_inline)) void sn__aff_chk_block(
    float *restrict y, const float *restrict x, int64_t m, float hi, float lo, float a, float b,
    float thr, double md, double ad) {
  int bad = 0;
  for (int64_t k = 0; k < m; k++) {
    const float v = ((x[k] - hi) - lo) * a + b;
    y[k] = v;
    bad |= SN_CHK_FAILS(v, thr);
  }
  if (bad)
    for (int64_t k = 0; k < m; k++) {
      const float v = y[k], e = (float)(((double)x[k] - md) * ad + (double)b);
      y[k] = SN_CHK_FAILS(v, thr) ? e : v;
    }
}

/* The checked map of one channel's run x [n] into y [n] (f32, not aliasing). */
SN_CLONES static inline void sn__aff_run_chk(float *restrict y, const float *restrict x, int64_t n,
                                             float hi, float lo, float a, float b, float thr,
                                             double md, double ad) {
  int64_t i = 0;
  for (; i + SN_CHK_BLOCK <= n; i += SN_CHK_BLOCK) /* a constant trip count to vectorize */
    sn__aff_chk_block(y + i, x + i, SN_CHK_BLOCK, hi, lo, a, b, thr, md, ad);
  if (i < n) sn__aff_chk_block(y + i, x + i, n - i, hi, lo, a, b, thr, md, ad);
}

/* The checked map of rows of a channel slice: y, x [nr, ld] (not aliasing), ct channels of p
 * and thr (channel c at index j0 + c), each row's slice in blocks of SN_CHK_BLOCK channels. */
SN_CLONES static inline void sn__aff_rows_chk(float *restrict y, const float *restrict x,
                                              int64_t nr, int64_t ld, int64_t ct,
                                              const sn__chan_tile_t *p, const float *thr,
                                              int64_t j0) {
  for (int64_t r = 0; r < nr; r++)
    for (int64_t c0 = 0; c0 < ct; c0 += SN_CHK_BLOCK) {
      const int64_t m = sn__min64(SN_CHK_BLOCK, ct - c0), k0 = j0 + c0;
      const float *hi = p->hi + k0, *lo = p->lo + k0, *a = p->a + k0, *b = p->b + k0;
      const float *th = thr + k0;
      const double *md = p->m + k0, *ad = p->ad + k0;
      float *restrict yr = y + r * ld + c0;
      const float *restrict xr = x + r * ld + c0;
      int bad = 0;
      for (int64_t c = 0; c < m; c++) {
        const float v = ((xr[c] - hi[c]) - lo[c]) * a[c] + b[c];
        yr[c] = v;
        bad |= SN_CHK_FAILS(v, th[c]);
      }
      if (bad)
        for (int64_t c = 0; c < m; c++) {
          const float v = yr[c], e = (float)(((double)xr[c] - md[c]) * ad[c] + (double)b[c]);
          yr[c] = SN_CHK_FAILS(v, th[c]) ? e : v;
        }
    }
}

/* The forward map of one bf16 value xb with its channel's constants, as sn__aff_run and, with
 * chk, the checked map compute it (SN_CHK_FAILS against thr: (float)((x − md)·ad + b) in fp64),
 * narrowed as sn__from_f32: the element-by-element path of the bf16 maps below. */
static inline uint16_t sn__aff_val_bf16(uint16_t xb, float hi, float lo, float a, float b,
                                        float thr, double md, double ad, int chk) {
  const float xv = sn__bf16_to_f32(xb);
  float v = ((xv - hi) - lo) * a + b;
  if (chk && SN_CHK_FAILS(v, thr)) v = (float)(((double)xv - md) * ad + (double)b);
  return sn__f32_to_bf16(v);
}

/* Whether any of the 32 values e, o of the checked bf16 maps may fail SN_CHK_FAILS: |v| below
 * its lane's lim (the bits of max(thr, FLT_MIN), which order as the values) or above FLT_MAX
 * (NaN included), on the bits of |v| (see sn__aff_run_bf16). */
SN_INLINE int sn__pair_chk_flag(const sn__pf *e, const sn__pf *o, const sn__pi *lime,
                                const sn__pi *limo) {
  const sn__pi ue = (sn__pi)*e & 0x7fffffff, uo = (sn__pi)*o & 0x7fffffff;
  const sn__pi neg = (ue - *lime) | (uo - *limo) | (0x7f7fffff - ue) | (0x7f7fffff - uo);
  return sn__any_sign(&neg);
}

/* One channel's bf16 run x [n] into y [n] (bf16; y may equal x): v = ((x − hi) − lo)·a + b in
 * f32 narrowed as sn__from_f32, and with chk the checked map's failing elements (SN_CHK_FAILS
 * against thr) recomputed as (float)((x − md)·ad + b) in fp64: bitwise sn__aff_span and
 * sn__aff_span_chk through f32 tiles, without the tiles. The run is read 32 values at a time
 * in pairs (sn__pair_widen) and narrowed the same way. With chk, a block of 32 is first tested
 * on the bits of |v|, which order as the values: below max(thr, FLT_MIN) or above FLT_MAX (NaN
 * included) flags it, and a flagged block is gone over element by element with SN_CHK_FAILS
 * itself, so the choice of each element is the float test's in any floating-point mode (under
 * DAZ a subnormal v compares as 0; such a v, or a zero one, only costs the slower pass). */
SN_CLONES SN_UNUSED static void sn__aff_run_bf16(uint16_t *y, const uint16_t *x, int64_t n,
                                                 float hi, float lo, float a, float b, float thr,
                                                 double md, double ad, int chk) {
  const float tmin = thr > FLT_MIN ? thr : FLT_MIN;
  int32_t lim1;
  memcpy(&lim1, &tmin, sizeof lim1);
  const sn__pi lim = (sn__pi){0} + lim1;
  int64_t i = 0;
  for (; i + SN_PAIR <= n; i += SN_PAIR) {
    sn__pf e, o;
    sn__pair_widen(&e, &o, x + i);
    e = ((e - hi) - lo) * a + b;
    o = ((o - hi) - lo) * a + b;
    if (!chk) {
      sn__pair_narrow(y + i, &e, &o, 0);
    } else if (!sn__pair_chk_flag(&e, &o, &lim, &lim)) { /* every v normal, >= thr, finite */
      sn__pair_narrow_finite(y + i, &e, &o, 0);
    } else {
      for (int64_t k = i; k < i + SN_PAIR; k++)
        y[k] = sn__aff_val_bf16(x[k], hi, lo, a, b, thr, md, ad, 1);
    }
  }
  for (; i < n; i++) y[i] = sn__aff_val_bf16(x[i], hi, lo, a, b, thr, md, ad, chk);
}

/* ---- bf16 NHWC rows in pairs ------------------------------------------------------------- */

/* A tile's f32 constants in pair order over its ct channels (sn__to_pairs: each full block of 32
 * channels its even ones, then its odd ones; the tail as is), and for the checked map
 * max(thr, FLT_MIN) likewise: what bf16 rows read in pairs take (sn__tile_pairs_set). */
typedef struct {
  _Alignas(64) float hi[SN_TILE_C];
  _Alignas(64) float lo[SN_TILE_C];
  _Alignas(64) float a[SN_TILE_C];
  _Alignas(64) float b[SN_TILE_C];
  _Alignas(64) float e[SN_TILE_C];   /* backward only */
  _Alignas(64) float lim[SN_TILE_C]; /* checked forward only */
} sn__tile_pairs_t;

/* q from the first ct channels of p; thr: [ct] the checked map's thresholds, or NULL; bwd: e. */
static inline void sn__tile_pairs_set(sn__tile_pairs_t *q, const sn__chan_tile_t *p, int64_t ct,
                                      const float *thr, int bwd) {
  sn__to_pairs(q->hi, p->hi, ct);
  sn__to_pairs(q->lo, p->lo, ct);
  sn__to_pairs(q->a, p->a, ct);
  sn__to_pairs(q->b, p->b, ct);
  if (bwd) sn__to_pairs(q->e, p->e, ct);
  if (thr != NULL) {
    float t[SN_TILE_C];
    for (int64_t j = 0; j < ct; j++) t[j] = thr[j] > FLT_MIN ? thr[j] : FLT_MIN;
    sn__to_pairs(q->lim, t, ct);
  }
}

/* Channel k of a bf16 row element xb, the forward map as sn__aff_rows / sn__aff_rows_chk
 * compute it (thr NULL: unchecked), narrowed as sn__from_f32. */
static inline uint16_t sn__aff_elem_bf16(uint16_t xb, const sn__chan_tile_t *p, const float *thr,
                                         int64_t k) {
  return sn__aff_val_bf16(xb, p->hi[k], p->lo[k], p->a[k], p->b[k], thr != NULL ? thr[k] : 0.0f,
                          p->m[k], p->ad[k], thr != NULL);
}

/* The forward map of bf16 rows y, x [nr, ld] (first ct channels of each row; y may equal x)
 * with the tile's constants p (q: in pair order), bitwise sn__aff_rowspan / sn__aff_rowspan_chk
 * through f32 tiles (thr [ct]: checked, as sn__aff_run_bf16; NULL: not), each row read and
 * written in pairs. */
SN_CLONES SN_UNUSED static void sn__aff_rows_bf16(uint16_t *y, const uint16_t *x, int64_t nr,
                                                  int64_t ld, int64_t ct,
                                                  const sn__chan_tile_t *p,
                                                  const sn__tile_pairs_t *q, const float *thr) {
  for (int64_t r = 0; r < nr; r++) {
    uint16_t *yr = y + r * ld;
    const uint16_t *xr = x + r * ld;
    int64_t j = 0;
    for (; j + SN_PAIR <= ct; j += SN_PAIR) {
      sn__pf e, o, he, ho, le, lo, ae, ao, be, bo;
      sn__pair_widen(&e, &o, xr + j);
      sn__pair_load(&he, &ho, q->hi + j);
      sn__pair_load(&le, &lo, q->lo + j);
      sn__pair_load(&ae, &ao, q->a + j);
      sn__pair_load(&be, &bo, q->b + j);
      e = ((e - he) - le) * ae + be;
      o = ((o - ho) - lo) * ao + bo;
      if (thr == NULL) {
        sn__pair_narrow(yr + j, &e, &o, 0);
        continue;
      }
      sn__pf me, mo; /* max(thr, FLT_MIN): its bits, as sn__aff_run_bf16's lim */
      sn__pair_load(&me, &mo, q->lim + j);
      const sn__pi lime = (sn__pi)me, limo = (sn__pi)mo;
      if (!sn__pair_chk_flag(&e, &o, &lime, &limo))
        sn__pair_narrow_finite(yr + j, &e, &o, 0);
      else
        for (int64_t k = j; k < j + SN_PAIR; k++) yr[k] = sn__aff_elem_bf16(xr[k], p, thr, k);
    }
    for (; j < ct; j++) yr[j] = sn__aff_elem_bf16(xr[j], p, thr, j);
  }
}

/* The backward map of bf16 rows dx, dy, x [nr, ld] (dx may equal dy) likewise, bitwise
 * sn__affbwd_rowspan through f32 tiles. */
SN_CLONES SN_UNUSED static void sn__affbwd_rows_bf16(uint16_t *dx, const uint16_t *dy,
                                                     const uint16_t *x, int64_t nr, int64_t ld,
                                                     int64_t ct, const sn__chan_tile_t *p,
                                                     const sn__tile_pairs_t *q) {
  for (int64_t r = 0; r < nr; r++) {
    uint16_t *dxr = dx + r * ld;
    const uint16_t *dyr = dy + r * ld, *xr = x + r * ld;
    int64_t j = 0;
    for (; j + SN_PAIR <= ct; j += SN_PAIR) {
      sn__pf ge, go, ve, vo, he, ho, le, lo, ae, ao, be, bo, ee, eo;
      sn__pair_widen(&ge, &go, dyr + j);
      sn__pair_widen(&ve, &vo, xr + j);
      sn__pair_load(&he, &ho, q->hi + j);
      sn__pair_load(&le, &lo, q->lo + j);
      sn__pair_load(&ae, &ao, q->a + j);
      sn__pair_load(&be, &bo, q->b + j);
      sn__pair_load(&ee, &eo, q->e + j);
      ge = (ge * ae - be) - ((ve - he) - le) * ee;
      go = (go * ao - bo) - ((vo - ho) - lo) * eo;
      sn__pair_narrow(dxr + j, &ge, &go, 0);
    }
    for (; j < ct; j++)
      dxr[j] = sn__f32_to_bf16((sn__bf16_to_f32(dyr[j]) * p->a[j] - p->b[j]) -
                               ((sn__bf16_to_f32(xr[j]) - p->hi[j]) - p->lo[j]) * p->e[j]);
  }
}

/* sn__aff_span for bf16/f16 outputs, checked (see SN_CANCEL_LOG2_BF16; the fp64 values from
 * k->m and k->ad). A channel mapped in fp64 (k->f64) is so whole. y may equal x. */
static inline void sn__aff_span_chk(void *y, const void *x, int64_t off, int64_t n,
                                    const sn__chan_k_t *k, sn_dtype_t dtype) {
  if (k->f64) {
    sn__aff_span(y, x, off, n, k, dtype, 0);
    return;
  }
  if (dtype == SN_DTYPE_BF16) {
    sn__aff_run_bf16((uint16_t *)y + off, (const uint16_t *)x + off, n, k->hi, k->lo, k->a,
                     k->b, sn__cancel_thr(k->b, dtype), k->m, k->ad, 1);
    return;
  }
  float t[SN_TILE];
  for (int64_t i = 0; i < n; i += SN_TILE) {
    const int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(t, x, off + i, m, dtype);
    sn__aff_span_from_f32(y, off + i, t, m, k, dtype, 1);
  }
}

/* The forward map of one channel's run [off, off + n) of x into a bf16/f16 y from the run
 * already widened, xf [n] f32, through one f32 tile for y: the tile step of sn__aff_span
 * (chk = 0) and of sn__aff_span_chk (chk = 1), and the GroupNorm f16 groups widened once. */
static inline void sn__aff_span_from_f32(void *y, int64_t off, const float *xf, int64_t n,
                                         const sn__chan_k_t *k, sn_dtype_t dtype, int chk) {
  const float thr = chk ? sn__cancel_thr(k->b, dtype) : 0.0f;
  float t[SN_TILE];
  for (int64_t i = 0; i < n; i += SN_TILE) {
    const int64_t m = sn__min64(SN_TILE, n - i);
    if (k->f64) sn__aff_run_f64(t, xf + i, m, k->m, k->ad, k->bd);
    else if (chk) sn__aff_run_chk(t, xf + i, m, k->hi, k->lo, k->a, k->b, thr, k->m, k->ad);
    else sn__aff_run(t, xf + i, m, k->hi, k->lo, k->a, k->b, 0);
    sn__from_f32(y, off + i, t, m, dtype);
  }
}

/* sn__aff_rowspan for bf16/f16 outputs, checked (a tile with channels mapped in fp64: those
 * channels so, run by run, the others checked). */
static inline void sn__aff_rowspan_chk(void *y, const void *x, int64_t r0, int64_t r1, int64_t ld,
                                       int64_t c0, int64_t ct, const sn__chan_tile_t *p,
                                       sn_dtype_t dtype) {
  float tx[SN_TILE], ty[SN_TILE], thr[SN_TILE_C];
  for (int64_t j = 0; j < ct; j++) thr[j] = sn__cancel_thr(p->b[j], dtype);
  const int wide = sn__tile_any_f64(p, ct);
  if (dtype == SN_DTYPE_BF16 && !wide) { /* in pairs, no tiles: the same bits */
    sn__tile_pairs_t q;
    sn__tile_pairs_set(&q, p, ct, thr, 0);
    sn__aff_rows_bf16((uint16_t *)y + r0 * ld + c0, (const uint16_t *)x + r0 * ld + c0, r1 - r0,
                      ld, ct, p, &q, thr);
    return;
  }
  int64_t per = sn__rows_per_block(r1 - r0, ld, ct, dtype);
  for (int64_t r = r0; r < r1; r += per) {
    int64_t nr = sn__min64(per, r1 - r), off = r * ld + c0, span = (nr - 1) * ld + ct;
    sn__to_f32(tx, x, off, span, dtype);
    for (int64_t j = 0, e; j < ct; j = e) {
      e = wide ? sn__f64_run_end(p, j, ct) : ct;
      if (!p->f64[j] || !wide) sn__aff_rows_chk(ty + j, tx + j, nr, ld, e - j, p, thr, j);
      else
        for (int64_t k = j; k < e; k++) sn__aff_col_f64(ty + k, tx + k, nr, ld, p, k);
    }
    sn__from_f32(y, off, ty, span, dtype);
  }
}

/* ---- rows of any dtype (NHWC): f32 in place, bf16 in pairs, f16 through stack tiles ---- */

/* Rows [r0, r1) × channels [c0, c0+ct) of y, x: [rows, ld]; p: the tile's constants;
 * ct <= SN_TILE_C. y may equal x. */
static inline void sn__aff_rowspan(void *y, const void *x, int64_t r0, int64_t r1, int64_t ld,
                                   int64_t c0, int64_t ct, const sn__chan_tile_t *p,
                                   sn_dtype_t dtype, int nt) {
  nt = dtype == SN_DTYPE_F32 ? nt : 0; /* bf16/f16 rows go through the stack tile */
  const int wide = sn__tile_any_f64(p, ct);
  if (dtype == SN_DTYPE_BF16 && !wide) { /* in pairs, no tile: the same bits */
    sn__tile_pairs_t q;
    sn__tile_pairs_set(&q, p, ct, NULL, 0);
    sn__aff_rows_bf16((uint16_t *)y + r0 * ld + c0, (const uint16_t *)x + r0 * ld + c0, r1 - r0,
                      ld, ct, p, &q, NULL);
    return;
  }
  float t[SN_TILE];
  int64_t per = sn__rows_per_block(r1 - r0, ld, ct, dtype);
  for (int64_t r = r0; r < r1; r += per) {
    int64_t nr = sn__min64(per, r1 - r), off = r * ld + c0, span = (nr - 1) * ld + ct;
    const float *xb = sn__in_row(x, off, span, dtype, t);
    float *yb = sn__out_row(y, off, dtype, t);
    for (int64_t j = 0, e; j < ct; j = e) { /* one run if no channel is mapped in fp64 */
      e = wide ? sn__f64_run_end(p, j, ct) : ct;
      if (!p->f64[j] || !wide) sn__aff_rows(yb + j, xb + j, nr, ld, e - j, p, j, nt);
      else
        for (int64_t k = j; k < e; k++) sn__aff_col_f64(yb + k, xb + k, nr, ld, p, k);
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
    sn__tile_pairs_set(&q, p, ct, NULL, 1);
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
