/*
 * rownorm.h — helpers shared by the row normalizations (layernorm*.c, rmsnorm.c): argument
 * validation, fixed-lane fp64 row sums (the one-pass statistics and the sums of squares with
 * optional software prefetching and the fused kernels' residual add; bf16/f16 sums of squares in
 * f32 blocks), bf16 narrowing, the f16 residual add and the chunk partials of dgamma/dbeta. Not
 * installed; all static.
 *
 * The row sums are inlined into each SN_CLONES variant of the row functions that call them
 * (AVX-512, AVX2, baseline); their lane count is fixed, so every variant adds in the same order
 * and gives the same bits.
 */
#ifndef SN_ROWNORM_H
#define SN_ROWNORM_H

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "formulas.h"

#if defined(__GNUC__)
#define SN_INLINE static inline __attribute__((always_inline))
/* the cloned (not inline) helpers below: not every including file uses each */
#define SN_UNUSED __attribute__((unused))
#else
#define SN_INLINE static inline
#define SN_UNUSED
#endif

/* The element loops of the row functions read element i of one row and write element i of
 * another, which may be the same memory (y == x, dx == dy): there is no dependence between
 * iterations. Saying so keeps those loops vectorized without a runtime overlap test, which
 * would send exactly the in-place case down the scalar path. */
#if defined(__clang__)
#define SN_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define SN_IVDEP _Pragma("GCC ivdep")
#else
#define SN_IVDEP
#endif

/* fp64 accumulator lanes of the row sums: four AVX-512 or eight AVX2 registers, so a row's
 * additions are independent chains (one 8-lane accumulator is bound by the add latency, ~4
 * cycles per 8 elements, slower than L1 feeds it). Fixed, so the order of the sum never depends
 * on the vector width of the clone. */
#define SN_ROW_LANES 32

/* Lanes of each sum where three run side by side (the LayerNorm backward): 3 × 16 doubles still
 * fit the AVX2 register file. */
#define SN_ROW_LANES3 16

/* Σ acc[k] over `lanes` (16 or 32) lanes by pairwise halving: lane k += lane k + w for
 * w = lanes/2, ..., 1. A fixed order, and a few vector steps instead of a dependency chain of
 * `lanes` additions (the steps are spelled out so each is a constant-trip loop). Overwrites acc. */
SN_INLINE double sn__lanes_total_n(double *acc, int lanes) {
  if (lanes >= 32)
    for (int k = 0; k < 16; k++) acc[k] += acc[k + 16];
  for (int k = 0; k < 8; k++) acc[k] += acc[k + 8];
  for (int k = 0; k < 4; k++) acc[k] += acc[k + 4];
  for (int k = 0; k < 2; k++) acc[k] += acc[k + 2];
  return acc[0] + acc[1];
}
SN_INLINE double sn__lanes_total(double *acc) { return sn__lanes_total_n(acc, SN_ROW_LANES); }


/* bf16 ↔ f32 inside the row loops (bitwise as convert.c's runs): widening is a shift; narrowing
 * rounds to nearest even, NaN stays a quiet NaN, written without branches so the loops that
 * use it stay vectorized. */
SN_INLINE float sn__bf16_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
SN_INLINE uint16_t sn__f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t nan = (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x0040u;
  return (uint16_t)(nan ? quiet : rounded);
}
/* sn__f32_to_bf16 of a finite f (±inf too): the same bits, without the NaN case. */
SN_INLINE uint16_t sn__f32_to_bf16_finite(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---- bf16 rows in pairs: widening and narrowing without shuffles -------------------------- */
/* 32 bf16 values loaded as 16 u32 words hold element 2j in the low half of word j and element
 * 2j + 1 in the high half, so one shift or one mask widens each half to f32 in place: the even
 * elements of a block of 32 (e) and the odd ones (o), 16 each, with no cross-lane shuffle (the
 * vpmovzxwd / vpermt2w of a widening or narrowing in element order). Narrowing joins the two
 * rounded halves the same way. Elementwise these are sn__bf16_to_f32 and sn__f32_to_bf16, so
 * the values are the same; a loop that keeps e and o apart permutes its lanes, which the sums
 * below undo (element i still goes to lane i % SN_ROW_LANES). GCC vector values as
 * norm_kernels.h's; pointers in, since a 64-byte vector argument has a target-dependent ABI. */
typedef uint32_t sn__pu __attribute__((vector_size(64)));
typedef float sn__pf __attribute__((vector_size(64)));
typedef int32_t sn__pi __attribute__((vector_size(64)));
#define SN_PAIR 32 /* bf16 elements per pair block: SN_ROW_LANES, so the lanes map one to one */
_Static_assert(SN_PAIR == SN_ROW_LANES, "a pair block is one step of the row lanes");

/* Element 2j of a pair block lies in the low half of word j on a little-endian machine (the
 * x86-64 this is measured on), in the high half on a big-endian one (untested). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define SN_PAIR_EVEN_LOW 0
#else
#define SN_PAIR_EVEN_LOW 1
#endif

/* e, o = the even and odd elements of the 32 bf16 values at p, as f32. */
SN_INLINE void sn__pair_widen(sn__pf *e, sn__pf *o, const uint16_t *p) {
  sn__pu w;
  memcpy(&w, p, sizeof w);
  const sn__pu lo = w << 16, hi = w & 0xffff0000u;
  *e = (sn__pf)(SN_PAIR_EVEN_LOW ? lo : hi);
  *o = (sn__pf)(SN_PAIR_EVEN_LOW ? hi : lo);
}

/* The 32 bf16 values at p from re, ro: the even and odd elements' bf16 bits in the high half
 * of each word (the low halves are ignored). nt: streamed where p is 64-byte aligned
 * (sn__store64). */
SN_INLINE void sn__pair_join(uint16_t *p, const sn__pu *re, const sn__pu *ro, int nt) {
  const sn__pu w = SN_PAIR_EVEN_LOW ? (*ro & 0xffff0000u) | (*re >> 16)
                                    : (*re & 0xffff0000u) | (*ro >> 16);
  sn__store64(p, &w, nt);
}

/* r = the bf16 bits of f (sn__f32_to_bf16 of each element) in the high half of each word. */
SN_INLINE void sn__pair_round(sn__pu *r, const sn__pf *f) {
  const sn__pu u = (sn__pu)*f;
  const sn__pu rounded = u + 0x7fffu + ((u >> 16) & 1u), quiet = u | 0x00400000u;
  const sn__pu nan = (sn__pu)((sn__pi)(u & 0x7fffffffu) > 0x7f800000);
  *r = (rounded & ~nan) | (quiet & nan);
}

/* The 32 bf16 values at p = e (even elements) and o (odd ones) narrowed as sn__f32_to_bf16. */
SN_INLINE void sn__pair_narrow(uint16_t *p, const sn__pf *e, const sn__pf *o, int nt) {
  sn__pu re, ro;
  sn__pair_round(&re, e);
  sn__pair_round(&ro, o);
  sn__pair_join(p, &re, &ro, nt);
}

/* The 32 bf16 values at p = e and o narrowed as sn__f32_to_bf16_finite: for values known to be
 * finite (no NaN case in the rounding). */
SN_INLINE void sn__pair_narrow_finite(uint16_t *p, const sn__pf *e, const sn__pf *o, int nt) {
  sn__pu re = (sn__pu)*e, ro = (sn__pu)*o;
  re = re + 0x7fffu + ((re >> 16) & 1u);
  ro = ro + 0x7fffu + ((ro >> 16) & 1u);
  sn__pair_join(p, &re, &ro, nt);
}

/* Whether any of the 16 int32 lanes of v is negative: its eight 64-bit words or-ed (a
 * reduction GCC 12 keeps short; its loops over the lanes of a vector value became 16 extracts). */
SN_INLINE int sn__any_sign(const sn__pi *v) {
  uint64_t w[8], m = 0;
  memcpy(w, v, sizeof w);
  for (int k = 0; k < 8; k++) m |= w[k];
  return (m & 0x8000000080000000u) != 0;
}

/* e, o = q[0..15] and q[16..31]: a block of an f32 row, or of an array in pair order (each full
 * block of SN_PAIR: its even elements, then its odd ones; sn__to_pairs); sn__pair_store writes
 * them back. */
SN_INLINE void sn__pair_load(sn__pf *e, sn__pf *o, const float *q) {
  memcpy(e, q, sizeof *e);
  memcpy(o, q + SN_PAIR / 2, sizeof *o);
}
SN_INLINE void sn__pair_store(float *q, const sn__pf *e, const sn__pf *o) {
  memcpy(q, e, sizeof *e);
  memcpy(q + SN_PAIR / 2, o, sizeof *o);
}

/* Whether gamma [d] is NULL or all finite: the bf16 forwards then narrow the y of finite rows
 * without the NaN case (rmsnorm.c's rms_map_bf16, layernorm.c's ln_map_row_pairs). */
SN_UNUSED static int sn__gamma_finite(const float *gamma, int64_t d) {
  int fin = 1;
  for (int64_t i = 0; gamma != NULL && i < d; i++) fin &= isfinite(gamma[i]) != 0;
  return fin;
}

/* dst [d] = src [d] (gamma, beta) in pair order for the kernels that read bf16 rows in pairs;
 * the tail after the last full block as is. */
SN_UNUSED static void sn__to_pairs(float *dst, const float *src, int64_t d) {
  int64_t i = 0;
  for (; i + SN_PAIR <= d; i += SN_PAIR)
    for (int m = 0; m < SN_PAIR / 2; m++) {
      dst[i + m] = src[i + 2 * m];
      dst[i + SN_PAIR / 2 + m] = src[i + 2 * m + 1];
    }
  for (; i < d; i++) dst[i] = src[i];
}

/* Element i of a row that is f32, or with widen bf16, as f32. */
SN_INLINE float sn__load_w(const void *src, int widen, int64_t i) {
  return widen ? sn__bf16_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
}
/* Element i of a row that is f32, or with narrow bf16, = v (bf16: rounded as sn__f32_to_bf16). */
SN_INLINE void sn__store_w(void *dst, int narrow, int64_t i, float v) {
  if (narrow) ((uint16_t *)dst)[i] = sn__f32_to_bf16(v);
  else ((float *)dst)[i] = v;
}

/* The 32 values of a row from element i, a block of the row functions below: e, o = elements
 * i..i+15 and i+16..i+31 of an f32 row (in order), or with bf16 the even and odd ones of a bf16
 * row (sn__pair_widen). Every function that reads rows a block at a time works on e and o the
 * same way for both dtypes; only this load, the store below and the order of the lanes at the
 * end differ. */
SN_INLINE void sn__block_load(sn__pf *e, sn__pf *o, const void *x, int64_t i, int bf16) {
  if (bf16) sn__pair_widen(e, o, (const uint16_t *)x + i);
  else sn__pair_load(e, o, (const float *)x + i);
}

/* v [SN_PAIR] = the block of x at element i as sn__block_load gives it (e's 16, then o's): for
 * loops that go over a block's values one by one, in the form GCC vectorizes. */
SN_INLINE void sn__block_load_arr(float *v, const void *x, int64_t i, int bf16) {
  if (!bf16) {
    memcpy(v, (const float *)x + i, SN_PAIR * sizeof *v);
    return;
  }
  sn__pf e, o;
  sn__pair_widen(&e, &o, (const uint16_t *)x + i);
  memcpy(v, &e, sizeof e);
  memcpy(v + SN_PAIR / 2, &o, sizeof o);
}

/* The block at element i of y = e, o as sn__block_load reads them: f32, or with bf16 narrowed as
 * sn__f32_to_bf16 (finite: as sn__f32_to_bf16_finite, for values known not to be NaN). nt:
 * streamed where the 64 bytes at each store start a line (sn__store64). */
SN_INLINE void sn__block_store(void *y, int64_t i, const sn__pf *e, const sn__pf *o, int bf16,
                               int nt, int finite) {
  if (!bf16) {
    sn__store64((float *)y + i, e, nt);
    sn__store64((float *)y + i + SN_PAIR / 2, o, nt);
  } else if (finite) {
    sn__pair_narrow_finite((uint16_t *)y + i, e, o, nt);
  } else {
    sn__pair_narrow((uint16_t *)y + i, e, o, nt);
  }
}

/* What sn__map_row maps with: gamma and beta as given (NULL where not given) and in the block
 * order of the row's dtype (gb, bb: as given for f32 rows, in pair order for bf16 ones,
 * sn__to_pairs); mean = hi + lo; scale s. */
typedef struct {
  const float *gb, *gamma, *bb, *beta;
  float hi, lo, s;
} sn__row_map_t;

/* y [d] = t·gamma + beta in f32, t = ((x − hi) − lo)·s (centre: LayerNorm, mean = hi + lo) or
 * x·s (RMSNorm), for a row x [d] that is f32 or (bf16) bf16, y of x's dtype (bf16: narrowed as
 * sn__f32_to_bf16, or with finite as sn__f32_to_bf16_finite: the caller knows no y is NaN; the
 * same bits for every non-NaN value). bf16, has_g, has_b, centre, finite: constants after
 * inlining, each combination its own vector loop. bf16 rows and streamed f32 rows go in blocks of
 * SN_PAIR (sn__block_load), then element by element; other f32 rows element by element, a loop
 * GCC vectorizes as well as the blocks. The same operations, the same bits as the widened row
 * mapped in f32. y may equal x (each block is loaded before it is stored). nt: y streamed; an
 * f32 row first maps the elements before its first 64-byte line one at a time (sn__head64), a
 * bf16 row, whose pair blocks are fixed by the element index, streams only where it starts a
 * line. */
SN_INLINE void sn__map_row(void *y, const void *x, int64_t d, const sn__row_map_t *m, int bf16,
                           int has_g, int has_b, int centre, int nt, int finite) {
  const float hi = m->hi, lo = m->lo, s = m->s;
#define SN_MAP_EL(i)                                                                          \
  do {                                                                                        \
    const float t_ = SN_ROW_Y(SN_ROW_XHAT(sn__load_w(x, bf16, i), hi, lo, s, centre),         \
                              m->gamma[i], m->beta[i], has_g, has_b);                         \
    if (!bf16) ((float *)y)[i] = t_;                                                          \
    else ((uint16_t *)y)[i] = finite ? sn__f32_to_bf16_finite(t_) : sn__f32_to_bf16(t_);     \
  } while (0)
  int64_t i = 0;
  if (nt && !bf16)
    for (const int64_t h = sn__head64(y, d); i < h; i++) SN_MAP_EL(i);
  for (; (bf16 || nt) && i + SN_PAIR <= d; i += SN_PAIR) {
    sn__pf e, o, ge = {0}, go = {0}, be = {0}, bo = {0};
    sn__block_load(&e, &o, x, i, bf16);
    if (has_g) sn__pair_load(&ge, &go, m->gb + i);
    if (has_b) sn__pair_load(&be, &bo, m->bb + i);
    e = SN_ROW_Y(SN_ROW_XHAT(e, hi, lo, s, centre), ge, be, has_g, has_b);
    o = SN_ROW_Y(SN_ROW_XHAT(o, hi, lo, s, centre), go, bo, has_g, has_b);
    sn__block_store(y, i, &e, &o, bf16, nt, finite);
  }
  SN_IVDEP
  for (; i < d; i++) SN_MAP_EL(i);
#undef SN_MAP_EL
}

/* A software prefetch of a line of the next row's input, for reading, into L2 only
 * (SN_PF_READ, cpu.h): the row arrives while this one is worked on, without evicting this row
 * from L1. */
#define SN_PF_ROW_READ(p) SN_PF_READ(p)

/* acc [SN_ROW_LANES] = fp64 lanes kept in pair order put back in element order: lane 2m is
 * e[m] (the even elements' lane m), lane 2m + 1 is o[m]. */
SN_INLINE void sn__pair_lanes(double *acc, const double *e, const double *o) {
  for (int m = 0; m < SN_PAIR / 2; m++) acc[2 * m] = e[m], acc[2 * m + 1] = o[m];
}

/* Σ x[i] in fp64; element i goes to lane i % SN_ROW_LANES. x is f32 [n] or, with widen, bf16
 * [n] (the same values, the same sum). */
SN_INLINE double sn__row_sum_w(const void *x, int widen, int64_t n) {
  double acc[SN_ROW_LANES] = {0};
  int64_t i = 0;
  for (; i + SN_ROW_LANES <= n; i += SN_ROW_LANES)
    for (int k = 0; k < SN_ROW_LANES; k++) acc[k] += (double)sn__load_w(x, widen, i + k);
  for (int k = 0; k < SN_ROW_LANES && i < n; i++, k++) acc[k] += (double)sn__load_w(x, widen, i);
  return sn__lanes_total(acc);
}
SN_INLINE double sn__row_sum(const float *x, int64_t n) { return sn__row_sum_w(x, 0, n); }

/* Element i of the row a first pass reads, as f32: src[i] (f32, or with widen bf16), or, with
 * res (the fused kernels' residual row, the dtype of src), the residual sum
 * round_dtype(src[i] + res[i]) with the add in f32 (bitwise sn__residual_sum_row's value), which
 * is also stored into sum_out[i] unless sum_out is NULL. Element i reads and writes index i
 * only, so sum_out may equal src or res. */
SN_INLINE float sn__row_in(void *sum_out, const void *src, const void *res, int widen,
                           int64_t i) {
  float v = sn__load_w(src, widen, i);
  if (res != NULL) {
    v += sn__load_w(res, widen, i);
    if (widen) {
      const uint16_t h = sn__f32_to_bf16(v);
      if (sum_out != NULL) ((uint16_t *)sum_out)[i] = h;
      v = sn__bf16_to_f32(h);
    } else if (sum_out != NULL) {
      ((float *)sum_out)[i] = v;
    }
  }
  return v;
}

/* e, o (the block of x at element i, sn__block_load) become the residual sums x + res, the add
 * in f32 and rounded to the dtype as sn__row_in rounds them, which are stored into sum_out's
 * block at i (sum_out may equal x or res: the blocks are loaded first). */
SN_INLINE void sn__block_add_res(sn__pf *e, sn__pf *o, void *sum_out, const void *res, int64_t i,
                                 int bf16) {
  sn__pf re, ro;
  sn__block_load(&re, &ro, res, i, bf16);
  *e += re;
  *o += ro;
  if (!bf16) {
    sn__pair_store((float *)sum_out + i, e, o);
    return;
  }
  sn__pu qe, qo; /* the sums rounded to bf16 (bits in the high half), widened back below */
  sn__pair_round(&qe, e);
  sn__pair_round(&qo, o);
  sn__pair_join((uint16_t *)sum_out + i, &qe, &qo, 0);
  *e = (sn__pf)(qe & 0xffff0000u);
  *o = (sn__pf)(qo & 0xffff0000u);
}

/* The rows a first pass prefetches, a block at a time, as it sums one row: next, the next input
 * row, and next_res, the next residual row (the fused kernels), for reading; out, this row's
 * output, for writing; esize bytes per element; NULL for none. The memory system then fetches
 * them while this row is in its cache-bound passes instead of stalling the passes that touch
 * them. Prefetches never fault. */
typedef struct {
  const char *next, *next_res;
  char *out;
  int esize;
} sn__row_pf_t;
#define SN_NO_PF ((sn__row_pf_t){NULL, NULL, NULL, 0})

/* The prefetches of pf for the step of SN_ROW_LANES elements from element i: two lines of next
 * and of out, one of next_res (as the bf16 rows' blocks, its 64 bytes). */
SN_INLINE void sn__row_prefetch(sn__row_pf_t pf, int64_t i) {
  const int64_t o = i * pf.esize;
  if (pf.next != NULL) {
    SN_PF_ROW_READ(pf.next + o);
    SN_PF_ROW_READ(pf.next + o + 64);
  }
  if (pf.next_res != NULL) SN_PF_ROW_READ(pf.next_res + o);
  if (pf.out != NULL) {
    __builtin_prefetch(pf.out + o, 1);
    __builtin_prefetch(pf.out + o + 64, 1);
  }
}

/* The one-pass row statistics (sn__row_shifted_sums, sn__row_stats) sum t = x − K and t² in
 * fp64 for a pivot K near the mean, taken from the data: the mean of the row's first
 * SN_PIVOT_N values, rounded to f32 (sn__row_pivot). t is then exact in fp64 (two floats within
 * 2^29 of each other; else one rounding, 2^-53·|t|), and
 *   mean = K + S1/n,   M2 = Σ(x − mean)² = S2 − S1²/n,   S1 = Σt, S2 = Σt²,
 * where the subtraction cancels: S2 = M2·(1 + ρ) with ρ = (mean − K)²/var. Each of the fixed
 * lanes adds n/32 terms, so with ε = 2^-53·(n/32 + 6) the computed S2 errs by ε·S2 and S1 by
 * ε·Σ|t|, and M2 by about ε·(1 + ρ + 2·√(ρ(1 + ρ)))·M2 (the two passes: about ε·M2), the mean by
 * ε·√(1 + ρ)·σ. Rows with ρ above SN_SHIFT_RHO_MAX (K more than σ/2 from the mean; below it
 * the cancellation factor is at most 2.4) or with anything not finite take the two fp64 passes
 * instead (sn__row_sum, then sn__row_sumsq around the mean). The two passes' mean errs in
 * proportion to |mean| rather than σ, so where |mean| ≪ σ and the values are heavy-tailed the
 * one-pass statistics measure 2-3 bits less accurate (lognormal rows of 65536):
 * invisible in every output but bf16/f16 under a beta that cancels x̂·gamma deeper than the
 * bound stated at ln_map_beta (layernorm.c). With K the mean of 32 values of a
 * shuffled row, ρ > 1/4 needs those 32 to sit 2.8 of their standard errors off: about 0.5 % of
 * normal rows; a row whose first values are not typical of it (sorted, a block of outliers
 * first) takes the two passes. One pass over the row instead of two, and one conversion per
 * element instead of two. */
#define SN_SHIFT_RHO_MAX 0.25
/* Values the pivot K of the one-pass statistics averages (the first ones of the row). */
#define SN_PIVOT_N 32
_Static_assert(SN_PIVOT_N == 32, "sn__row_pivot adds its values with sn__lanes_total_n");

/* The pivot of the one-pass statistics of x [n] (f32, or with widen bf16; with res, of the
 * residual sum x + res as sn__row_in): the fp64 mean of its first min(n, SN_PIVOT_N) values,
 * rounded to f32 (so that x − K is exact in fp64), in fp64. The same value for a bf16 row and for
 * its widened f32 copy, and for a residual sum and the row that holds it. */
SN_INLINE double sn__row_pivot(const void *x, const void *res, int widen, int64_t n) {
  const int64_t m = n < SN_PIVOT_N ? n : SN_PIVOT_N;
  double acc[SN_PIVOT_N] = {0}; /* one value per lane, added pairwise: a few vector steps */
  for (int64_t i = 0; i < m; i++)
    acc[i] = (double)sn__row_in(NULL, x, res, widen, i);
  return (double)(float)(sn__lanes_total_n(acc, SN_PIVOT_N) / (double)m);
}

/* a[k] += t, b[k] += t² with t = (double)v[k] − K for the 32 floats of the vectors e and o
 * (e's 16, then o's): through an array, in the loop form GCC 12 vectorizes to one vcvtps2pd per
 * 8 (its __builtin_convertvector takes two and a shuffle; two such loops of 16, one per vector,
 * left the second partly in scalar code in the x86-64-v4 clone: 1.4x the time of the LayerNorm
 * bf16 forward, bench_ab). */
#define SN_SHIFTED32(a, b, e, o, K)                                                           \
  do {                                                                                        \
    float vb_[32];                                                                            \
    memcpy(vb_, &(e), sizeof vb_ / 2);                                                        \
    memcpy(vb_ + 16, &(o), sizeof vb_ / 2);                                                   \
    for (int k_ = 0; k_ < 32; k_++) {                                                         \
      const double t_ = (double)vb_[k_] - (K);                                                \
      (a)[k_] += t_;                                                                          \
      (b)[k_] += t_ * t_;                                                                     \
    }                                                                                         \
  } while (0)

/* a, b [SN_ROW_LANES] = the lanes ap, bp [SN_PAIR] of SN_SHIFTED32 (e's 16, then o's) in element
 * order: as they are for f32 blocks; for bf16 pair blocks lane 2m is ap[m], lane 2m + 1 is
 * ap[SN_PAIR / 2 + m]. Both in one loop: two calls of sn__pair_lanes made GCC 12 compile the
 * LayerNorm bf16 forward's statistics 2x slower (bench_ab, in cache and cold). */
SN_INLINE void sn__block_lanes2(double *a, double *b, const double *ap, const double *bp,
                                int bf16) {
  if (!bf16) {
    memcpy(a, ap, SN_ROW_LANES * sizeof *a);
    memcpy(b, bp, SN_ROW_LANES * sizeof *b);
    return;
  }
  for (int m = 0; m < SN_PAIR / 2; m++) {
    a[2 * m] = ap[m], a[2 * m + 1] = ap[SN_PAIR / 2 + m];
    b[2 * m] = bp[m], b[2 * m + 1] = bp[SN_PAIR / 2 + m];
  }
}

/* s[0] = Σ(x[i] − K), s[1] = Σ(x[i] − K)² in fp64 of a row x [n] that is f32 or (bf16) bf16,
 * element i into lane i % SN_ROW_LANES, lanes added as sn__row_sum: blocks of SN_PAIR
 * (sn__block_load; a bf16 block's lanes put back in element order at the end), then element by
 * element. The same values, hence the same sums, for a bf16 row and its widened f32 copy; s[1]
 * with K = 0 is bitwise sn__row_sumsq_w's Σx² (squares of f32 values never overflow in fp64).
 * With res (the fused kernels; NULL for none) x is the residual sum x + res, stored into sum_out
 * [n] as it goes (sn__block_add_res, sn__row_in): the same sums as on sum_out. pf: the rows to
 * prefetch. */
SN_INLINE void sn__row_shifted_sums(double s[2], void *sum_out, const void *x, const void *res,
                                    int64_t n, double K, int bf16, sn__row_pf_t pf) {
  double ap[SN_PAIR] = {0}, bp[SN_PAIR] = {0}; /* a block's e lanes, then its o lanes */
  int64_t i = 0;
  for (; i + SN_PAIR <= n; i += SN_PAIR) {
    sn__row_prefetch(pf, i);
    sn__pf e, o;
    sn__block_load(&e, &o, x, i, bf16);
    if (res != NULL) sn__block_add_res(&e, &o, sum_out, res, i, bf16);
    SN_SHIFTED32(ap, bp, e, o, K);
  }
  double a[SN_ROW_LANES], b[SN_ROW_LANES];
  sn__block_lanes2(a, b, ap, bp, bf16);
  for (int k = 0; k < SN_ROW_LANES && i < n; i++, k++) {
    const double t = (double)sn__row_in(sum_out, x, res, bf16, i) - K;
    a[k] += t;
    b[k] += t * t;
  }
  s[0] = sn__lanes_total(a);
  s[1] = sn__lanes_total(b);
}

/* Σ (x[i] − shift)² in fp64, lanes as sn__row_sum (squares of f32, hence bf16/f16, values
 * never overflow in fp64). src is f32 [n] or, with widen, bf16 [n]; with res, x is the residual
 * sum stored into sum_out as sn__row_shifted_sums'. pf: the rows to prefetch. */
SN_INLINE double sn__row_sumsq_w(void *sum_out, const void *src, const void *res, int widen,
                                 int64_t n, double shift, sn__row_pf_t pf) {
  double acc[SN_ROW_LANES] = {0};
  int64_t i = 0;
  for (; i + SN_ROW_LANES <= n; i += SN_ROW_LANES) {
    sn__row_prefetch(pf, i);
    SN_IVDEP
    for (int k = 0; k < SN_ROW_LANES; k++) {
      const double v = (double)sn__row_in(sum_out, src, res, widen, i + k) - shift;
      acc[k] += v * v;
    }
  }
  for (int k = 0; k < SN_ROW_LANES && i < n; i++, k++) {
    const double v = (double)sn__row_in(sum_out, src, res, widen, i) - shift;
    acc[k] += v * v;
  }
  return sn__lanes_total(acc);
}

/* Rows of lanes per f32 block of sn__row_sumsq_lowp: each lane adds 16 squares in f32. */
#define SN_SUMSQ_F32_ROWS 16

/* Σ x[i]² for the rows of bf16/f16 tensors (RMSNorm): x [n] bf16 (bf16) or f32 (an f16 row
 * widened), with res and sum_out as sn__row_shifted_sums, pf the rows to prefetch. Each lane adds
 * SN_SUMSQ_F32_ROWS squares in f32 (blocks of SN_PAIR, sn__block_load), then those block sums in
 * fp64 lanes (a bf16 block's lanes in element order; the lanes and order of sn__row_sum).
 * Nonnegative terms: the f32 squares and sums err by < 17·2^-24 < 2^-19.9 of the total, so rstd
 * by < 2^-20.9, far inside the 1-ulp bound of bf16/f16 outputs (2^-9, 2^-12) that RMSNorm's
 * product y = x·rstd·gamma has no cancellation to amplify; half the vector work of fp64 lanes.
 * Squares that overflow f32 (|x| > 2^64) or underflow it (the total below 2^-120 per element,
 * where a square's rounding to a subnormal would be more than 2^-30 of it) send the row to the
 * fp64 sum (sn__row_sumsq_w). The same bits from a bf16 row and from its widened f32 copy. */
SN_INLINE double sn__row_sumsq_lowp(void *sum_out, const void *x, const void *res, int64_t n,
                                   int bf16, sn__row_pf_t pf) {
  double acc[SN_ROW_LANES] = {0};
  int64_t i = 0;
  while (i + SN_PAIR <= n) {
    const int64_t end = n - i > SN_PAIR * SN_SUMSQ_F32_ROWS ? i + SN_PAIR * SN_SUMSQ_F32_ROWS : n;
    sn__pf be = {0}, bo = {0}, e, o;
    for (; i + SN_PAIR <= end; i += SN_PAIR) {
      sn__row_prefetch(pf, i);
      sn__block_load(&e, &o, x, i, bf16);
      if (res != NULL) sn__block_add_res(&e, &o, sum_out, res, i, bf16);
      be += e * e;
      bo += o * o;
    }
    for (int j = 0; j < SN_PAIR / 2; j++) { /* lanes in element order */
      acc[bf16 ? 2 * j : j] += (double)be[j];
      acc[bf16 ? 2 * j + 1 : SN_PAIR / 2 + j] += (double)bo[j];
    }
  }
  for (int k = 0; k < SN_ROW_LANES && i < n; i++, k++) {
    const float v = sn__row_in(sum_out, x, res, bf16, i);
    acc[k] += (double)v * (double)v;
  }
  const double total = sn__lanes_total(acc);
  if (total >= (double)n * 0x1p-120 && total <= 0x1p127) return total; /* NaN: recomputed */
  return sn__row_sumsq_w(NULL, res != NULL ? sum_out : x, NULL, bf16, n, 0.0, SN_NO_PF);
}

/* Σ (x[i] − shift)² of an f32 row (sn__row_sumsq_w without widening or prefetching). */
SN_INLINE double sn__row_sumsq(const float *x, int64_t n, double shift) {
  return sn__row_sumsq_w(NULL, x, NULL, 0, n, shift, SN_NO_PF);
}

/* mean and M2 = Σ(x − mean)² of the row x [n] (f32, or with widen bf16) from its shifted sums
 * s (shift K; see SN_SHIFT_RHO_MAX), or from two fp64 passes over x where those cancel too much
 * or are not finite. */
SN_INLINE void sn__row_stats_w(double *mean, double *m2, const void *x, int widen, int64_t n,
                               double K, const double s[2]) {
  const double m2s = s[1] - s[0] * s[0] / (double)n;
  if (s[0] * s[0] <= SN_SHIFT_RHO_MAX * (double)n * m2s) { /* false for NaN */
    *mean = K + s[0] / (double)n;
    *m2 = m2s;
  } else {
    *mean = sn__row_sum_w(x, widen, n) / (double)n;
    *m2 = sn__row_sumsq_w(NULL, x, NULL, widen, n, *mean, SN_NO_PF);
  }
}

/* mean and M2 = Σ(x − mean)² (fp64) of the row x [n], f32 or (bf16) bf16, or with res of its
 * residual sum stored into sum_out (as sn__row_shifted_sums, the same arguments): the pivot of
 * its first values (sn__row_pivot), the shifted sums, and the two fp64 passes where those cancel
 * (sn__row_stats_w). Bitwise the same for a bf16 row and its widened copy. The statistics step
 * of the LayerNorm rows and the GroupNorm NCHW groups. */
SN_INLINE void sn__row_stats(double *mean, double *m2, void *sum_out, const void *x,
                             const void *res, int64_t n, int bf16, sn__row_pf_t pf) {
  const double K = sn__row_pivot(x, res, bf16, n);
  double sums[2];
  sn__row_shifted_sums(sums, sum_out, x, res, n, K, bf16, pf);
  sn__row_stats_w(mean, m2, res != NULL ? sum_out : x, bf16, n, K, sums);
}

/* s[i] = x[i] + r[i] in f32, one rounding; s may equal x or r. Cloned per ISA (each including
 * file gets its own copy; both use it). */
SN_CLONES SN_UNUSED static void sn__add_row(float *s, const float *x, const float *r, int64_t n) {
  SN_IVDEP
  for (int64_t i = 0; i < n; i++) s[i] = x[i] + r[i];
}

/* Elements per block of sn__residual_sum_row: the residual block (1 KiB) and the block of the
 * sum row stay in L1 between its steps. */
#define SN_RESIDUAL_BLOCK 256

/* The residual add of the fused kernels for row elements [off, off + d) of a bf16/f16 row, in a
 * pass of its own (the f16 rows; f32 and bf16 add in their first pass, sn__row_in): writes
 * sum_out = round_dtype(x + residual) (the add in f32, one rounding) and returns the rounded sum
 * as f32 [d] to normalize, so the norm sees exactly the values stored. Computed in tmp [d], the
 * returned row, block by block (SN_RESIDUAL_BLOCK): x widened into tmp, the residual into a
 * stack block, their sum narrowed into sum_out and widened back into tmp while the block is in
 * L1, so memory sees x, residual and sum_out once each. sum_out may equal x or residual (each
 * block is read before it is written). */
static inline const float *sn__residual_sum_row(void *sum_out, const void *x,
                                                const void *residual, float *tmp, int64_t off,
                                                int64_t d, sn_dtype_t dtype) {
  float rb[SN_RESIDUAL_BLOCK];
  for (int64_t i = 0; i < d; i += SN_RESIDUAL_BLOCK) {
    const int64_t m = d - i < SN_RESIDUAL_BLOCK ? d - i : SN_RESIDUAL_BLOCK;
    sn__to_f32(tmp + i, x, off + i, m, dtype);
    sn__to_f32(rb, residual, off + i, m, dtype);
    sn__add_row(tmp + i, tmp + i, rb, m);
    sn__from_f32(sum_out, off + i, tmp + i, m, dtype);
    sn__to_f32(tmp + i, sum_out, off + i, m, dtype); /* normalize the rounded values */
  }
  return tmp;
}

/* x − mean of an f32 map cannot overflow while |mean| (rounded to f32) < SN_CENTRE_F32_MAX
 * (cpu.h): rows with a larger mean can hold values of both signs near FLT_MAX, whose difference
 * is beyond the f32 range although the output is not. The LayerNorm forward maps such rows with
 * the checked map at limit 0 (every block with a nonzero term in fp64, layernorm.c), the
 * backward computes them in fp64 (ln_bwd_row_f64, layernorm_bwd.c). */
static inline int sn__ln_wide_mean(float mean) { return fabsf(mean) >= SN_CENTRE_F32_MAX; }

#endif /* SN_ROWNORM_H */
