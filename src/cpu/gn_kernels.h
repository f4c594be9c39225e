/*
 * gn_kernels.h — GroupNorm's NHWC column kernels (groupnorm.c, which alone includes this file):
 * per-channel fp64 sums over rows of x (and dy), vectorized across channels, f32 or bf16
 * (widened in registers: the same values, so the same sums as on f32 tiles). Not installed;
 * everything here is static (target clones per including file).
 */
#ifndef SN_GN_KERNELS_H
#define SN_GN_KERNELS_H

#include "cpu.h"
#include "groupnorm.h"
#include "norm_vec.h"
#include "rownorm.h"

/* The column kernels keep SN_VD channels' sums in one sn__vd (norm_vec.h), loaded and
 * stored whole, so that the next row's full-width loads can take them from the store buffer.
 * Each is one inline body with an f32 and a bf16 target-clone wrapper; es is the element size. */
#define GN_ROW(p, r, ld, es) ((const void *)((const char *)(p) + (uintptr_t)((r) * (ld)) * (es)))

/* Column sums of rows: acc[c] += x[r·ld + c] for r < nr, c < ct (fp64). */
SN_INLINE void col_sum_impl(double *restrict acc, const void *x, int64_t nr, int64_t ld,
                            int64_t ct, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4;
  for (int64_t r = 0; r < nr; r++) {
    const void *xr = GN_ROW(x, r, ld, es);
    int64_t c = 0;
    for (; c + SN_VD <= ct; c += SN_VD) {
      sn__vd v, s;
      SN_VLOAD_WIDEN_W(v, xr, c, bf16);
      SN_VLOAD(s, acc + c);
      s += v;
      SN_VSTORE(acc + c, s);
    }
    for (; c < ct; c++) acc[c] += (double)sn__load_w(xr, bf16, c);
  }
}

/* acc[c] += (x[r·ld + c] − m[c])² (fp64). */
SN_INLINE void col_sumsq_impl(double *restrict acc, const void *x, int64_t nr, int64_t ld,
                              int64_t ct, const double *restrict m, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4;
  for (int64_t r = 0; r < nr; r++) {
    const void *xr = GN_ROW(x, r, ld, es);
    int64_t c = 0;
    for (; c + SN_VD <= ct; c += SN_VD) {
      sn__vd v, mc, s;
      SN_VLOAD_WIDEN_W(v, xr, c, bf16);
      SN_VLOAD(mc, m + c);
      SN_VLOAD(s, acc + c);
      v -= mc;
      s += v * v;
      SN_VSTORE(acc + c, s);
    }
    for (; c < ct; c++) {
      double v = (double)sn__load_w(xr, bf16, c) - m[c];
      acc[c] += v * v;
    }
  }
}

/* Rows per block of the one-pass column kernels (col_rows_impl: col_shifted, col_bwd) where a
 * whole row of the inputs (all C channels of x, and of dy in the backward; f16 as its f32 tile)
 * is at most GN_BLOCK_ROW_BYTES: a block's rows are added into each vector of channel sums in
 * registers, in row order (the same bits as a row at a time), so the sums are loaded and stored
 * once per block rather than once per row, which for narrow rows sets the pace. Wider rows, and
 * a narrow last channel tile of wide rows, wait on memory and go a row at a time, which measured
 * faster there. */
#define GN_ROW_BLOCK 8
#define GN_BLOCK_ROW_BYTES 256

/* Rows in a block of the column kernels: GN_ROW_BLOCK for narrow rows (ld elements of es bytes
 * from each of `inputs` tensors, GN_BLOCK_ROW_BYTES in all), else 1. */
static inline int64_t gn_row_block(int64_t ld, uintptr_t es, int64_t inputs) {
  return inputs * ld * (int64_t)es <= GN_BLOCK_ROW_BYTES ? GN_ROW_BLOCK : 1;
}

/* The rows gr[0..B) of dy and xr[0..B) of x in order into the backward sums with d = x − m[c]:
 * sd[c] += d, sg[c] += dy, sgd[c] += dy·d (fp64), c < ct; B a constant after inlining. */
SN_INLINE void bwd_block(double *restrict sd, double *restrict sg, double *restrict sgd,
                         const void *const *gr, const void *const *xr, int B, int64_t ct,
                         const double *restrict m, int bf16) {
  int64_t c = 0;
  for (; c + SN_VD <= ct; c += SN_VD) {
    sn__vd d, g, mc, a1, a2, a3;
    SN_VLOAD(mc, m + c);
    SN_VLOAD(a1, sd + c);
    SN_VLOAD(a2, sg + c);
    SN_VLOAD(a3, sgd + c);
    for (int j = 0; j < B; j++) {
      SN_VLOAD_WIDEN_W(d, xr[j], c, bf16);
      SN_VLOAD_WIDEN_W(g, gr[j], c, bf16);
      d -= mc;
      a1 += d;
      a2 += g;
      a3 += g * d;
    }
    SN_VSTORE(sd + c, a1);
    SN_VSTORE(sg + c, a2);
    SN_VSTORE(sgd + c, a3);
  }
  for (; c < ct; c++)
    for (int j = 0; j < B; j++) {
      const double d = (double)sn__load_w(xr[j], bf16, c) - m[c];
      const double g = (double)sn__load_w(gr[j], bf16, c);
      sd[c] += d;
      sg[c] += g;
      sgd[c] += g * d;
    }
}

/* The one-pass column sums over nr rows of x [nr, ld] (and, with bwd, of dy), first ct
 * channels, the rows in order, by blocks (gn_row_block); a block's prefetches reach as far past
 * the block as a row's past the row. Without bwd the shifted sums s[0][c] += x − m[c],
 * s[1][c] += (x − m[c])² (sn__shifted_rows_w; m: the pivots); with it the backward sums
 * (bwd_block; m: the means) into s[0..2]. bwd is a constant after inlining. */
SN_INLINE void col_rows_impl(double *restrict s0, double *restrict s1, double *restrict s2,
                             const void *dy, const void *x, int64_t nr, int64_t ld, int64_t ct,
                             const double *restrict m, int bwd, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4, ahead = sn__row_pf_ahead(ld, es);
  const uintptr_t ahead_b = ahead + (uintptr_t)(GN_ROW_BLOCK - 1) * (uintptr_t)ld * es;
  const void *gr[GN_ROW_BLOCK], *xr[GN_ROW_BLOCK];
  int64_t r = 0;
  if (gn_row_block(ld, es, bwd ? 2 : 1) > 1)
    for (; r + GN_ROW_BLOCK <= nr; r += GN_ROW_BLOCK) {
      for (int j = 0; j < GN_ROW_BLOCK; j++) {
        xr[j] = GN_ROW(x, r + j, ld, es);
        sn__prefetch_at(xr[j], ahead_b, ct, es);
        if (bwd) {
          gr[j] = GN_ROW(dy, r + j, ld, es);
          sn__prefetch_at(gr[j], ahead_b, ct, es);
        }
      }
      if (bwd) bwd_block(s0, s1, s2, gr, xr, GN_ROW_BLOCK, ct, m, bf16);
      else sn__shifted_rows_w(s0, s1, xr, GN_ROW_BLOCK, ct, m, bf16);
    }
  for (; r < nr; r++) {
    xr[0] = GN_ROW(x, r, ld, es);
    sn__prefetch_at(xr[0], ahead, ct, es);
    if (bwd) {
      gr[0] = GN_ROW(dy, r, ld, es);
      sn__prefetch_at(gr[0], ahead, ct, es);
      bwd_block(s0, s1, s2, gr, xr, 1, ct, m, bf16);
    } else {
      sn__shifted_rows_w(s0, s1, xr, 1, ct, m, bf16);
    }
  }
}

/* Each column kernel as an f32 and a bf16 target-clone function. */
#define GN_COL_CLONES(name, impl, params, args)                                               \
  SN_CLONES static void name params { impl args; }
GN_COL_CLONES(col_sum, col_sum_impl, (double *restrict acc, const void *x, int64_t nr, int64_t ld, int64_t ct),
              (acc, x, nr, ld, ct, 0))
GN_COL_CLONES(col_sum_bf16, col_sum_impl,
              (double *restrict acc, const void *x, int64_t nr, int64_t ld, int64_t ct),
              (acc, x, nr, ld, ct, 1))
GN_COL_CLONES(col_sumsq, col_sumsq_impl,
              (double *restrict acc, const void *x, int64_t nr, int64_t ld, int64_t ct,
               const double *restrict m),
              (acc, x, nr, ld, ct, m, 0))
GN_COL_CLONES(col_sumsq_bf16, col_sumsq_impl,
              (double *restrict acc, const void *x, int64_t nr, int64_t ld, int64_t ct,
               const double *restrict m),
              (acc, x, nr, ld, ct, m, 1))
/* Shifted column sums in one pass: s1[c] += x − k[c], s2[c] += (x − k[c])² (fp64). */
GN_COL_CLONES(col_shifted, col_rows_impl,
              (double *restrict s1, double *restrict s2, const void *x, int64_t nr, int64_t ld,
               int64_t ct, const double *restrict k),
              (s1, s2, NULL, NULL, x, nr, ld, ct, k, 0, 0))
GN_COL_CLONES(col_shifted_bf16, col_rows_impl,
              (double *restrict s1, double *restrict s2, const void *x, int64_t nr, int64_t ld,
               int64_t ct, const double *restrict k),
              (s1, s2, NULL, NULL, x, nr, ld, ct, k, 0, 1))
/* Backward column sums with d = x − m[c]: sd[c] += d, sg[c] += dy, sgd[c] += dy·d (fp64). */
GN_COL_CLONES(col_bwd, col_rows_impl,
              (double *restrict sd, double *restrict sg, double *restrict sgd, const void *dy,
               const void *x, int64_t nr, int64_t ld, int64_t ct, const double *restrict m),
              (sd, sg, sgd, dy, x, nr, ld, ct, m, 1, 0))
GN_COL_CLONES(col_bwd_bf16, col_rows_impl,
              (double *restrict sd, double *restrict sg, double *restrict sgd, const void *dy,
               const void *x, int64_t nr, int64_t ld, int64_t ct, const double *restrict m),
              (sd, sg, sgd, dy, x, nr, ld, ct, m, 1, 1))

/* The column sums of `kind` (groupnorm.h) over nr rows of x (and dy), f32 or (bf16) bf16, from
 * a channel tile's first channel: acc, m and x (dy) at that channel, the rows C apart, the
 * second and third sums C doubles after the first. */
static void col_reduce(gn_sum_kind_t kind, double *acc, int64_t C, const void *dy, const void *x,
                       const double *m, int64_t nr, int64_t ct, int bf16) {
  switch (kind) {
    case GN_SUM_X: (bf16 ? col_sum_bf16 : col_sum)(acc, x, nr, C, ct); break;
    case GN_SUM_SQ: (bf16 ? col_sumsq_bf16 : col_sumsq)(acc, x, nr, C, ct, m); break;
    case GN_SUM_SHIFTED:
      (bf16 ? col_shifted_bf16 : col_shifted)(acc, acc + C, x, nr, C, ct, m);
      break;
    case GN_SUM_BWD:
      (bf16 ? col_bwd_bf16 : col_bwd)(acc, acc + C, acc + 2 * C, dy, x, nr, C, ct, m);
      break;
  }
}

#endif /* SN_GN_KERNELS_H */
