/*
 * norm_vec.h — what the BatchNorm and GroupNorm kernels (norm_kernels.h, bn_kernels.h,
 * gn_kernels.h) build on: block and tile sizes, GCC vector values and their widening loads,
 * prefetch distances, and the per-channel shifted sums of NHWC rows. Not installed; everything
 * here is static inline.
 */
#ifndef SN_NORM_VEC_H
#define SN_NORM_VEC_H

#include <stdint.h>
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
 * longer (the hardware prefetcher restarts at every 4 KiB page and falls behind the reductions'
 * add chains). */
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
 * reductions' prefetches, computed once per call, outside the row loop (a division). */
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

#endif /* SN_NORM_VEC_H */
