/*
 * groupnorm.c — GroupNorm (Wu and He 2018; torch.nn.GroupNorm), forward and backward.
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC), S = H·W; G groups of Cg = C/G consecutive
 * channels; group (n, g) holds L = Cg·S values. mean, rstd: [N, G] f32.
 *
 * Forward statistics are fp64, one pass of sums shifted by a pivot k (Σ(x − k), Σ(x − k)², see
 * SN_SHIFT_RHO_MAX in rownorm.h), or two passes (mean = Σx/L, then var = Σ(x − mean)²/L) where
 * k lies too far from the mean.
 *   NCHW: a group is one contiguous run of L values. Tasks are the N·G groups; each does its
 *         reductions (f32: one shifted pass, k the mean of the group's first 32 values,
 *         SN_ROW_LANES fixed lanes, prefetching the next group and this group's output; bf16:
 *         the same pass reading the group in pairs, rownorm.h, bitwise the f32 pass on the
 *         widened group; f16: the f32 pass on the group widened once into per-thread scratch,
 *         which the map then reads, for groups of up to GN_F16_WIDE_MAX values, two passes over
 *         converted tiles for larger ones) and writes its Cg output planes while the group is
 *         in cache.
 *   NHWC: a group is strided inside each row. Tasks are the N samples; per-channel column sums
 *         over the S rows (vectorized across channels, fp64), shifted by each channel's mean
 *         over the sample's first 128 rows, give each channel's mean and M2, combined into
 *         groups in channel order (gn_nhwc_stats); then the sample's rows are normalized. The
 *         sums are taken over GN_PIECES fixed pieces of rows, added in piece order, so that a
 *         batch of fewer samples than threads, or a sample larger than a core's L2 (but not
 *         than the team's), can be shared by the whole team with the same bits.
 * The normalization is norm_kernels.h's f32 map y = ((x − hi) − lo)·a + b; for bf16/f16 outputs
 * with beta its checked variant (SN_CANCEL_LOG2_BF16), which recomputes in fp64 the elements
 * where beta cancels x̂·gamma too deeply for the 1-ulp bound.
 * Backward, per group, with d = x − mean_saved (mean_saved the f32 mean from the forward):
 *   one pass gathers per channel Σd, Σdy and Σdy·d (fp64); μ_d = Σd/L re-centres
 *   x̂ = (d − μ_d)·rstd, so a rounded saved mean costs nothing; with g = dy·gamma_c,
 *   mean(g) = Σ_c gamma_c·Σdy / L and mean(g·x̂) = rstd·(Σ_c gamma_c·Σdy·d − μ_d·Σ_c gamma_c·Σdy)/L;
 *   a second pass writes dx = rstd·(g − mean(g) − x̂·mean(g·x̂)).
 *   dgamma_c = Σ_n rstd·(Σdy·d − μ_d·Σdy) and dbeta_c = Σ_n Σdy are summed over n in order.
 * Each group is computed in a fixed order (NHWC: over fixed pieces of rows, whichever threads
 * sum them), and dgamma/dbeta by channel in n order: results are bitwise identical for any
 * thread count. Parallelism is over groups (NCHW), or over samples or pieces of a sample (NHWC:
 * the backward shares a sample between the threads only when there are fewer samples than
 * threads; the forward also when a sample exceeds a core's L2 and its share per thread does
 * not). "Threads" there are those that can run at once (sn__concurrent_threads): with more
 * OpenMP threads than processors, a batch that has a sample per processor is not shared, as
 * each barrier of a shared sample would wait for descheduled threads (8 threads on 2 cores,
 * [4,64,56,56]: 0.78x / 0.88x the time, forward / backward).
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "norm_kernels.h"
#include "rownorm.h"

/* ---- kernels ---------------------------------------------------------------------------------- */

/* How far ahead (in floats, 2 KiB) run_bwd prefetches dy and x: as batchnorm.c's NCHW runs. */
#define GN_PF_FLOATS 512

/* The column sums below keep SN_VD channels' sums in one sn__vd (norm_kernels.h), loaded and
 * stored whole (as batchnorm.c's NHWC row kernels: the auto-vectorized local-array version
 * stored them in pieces the next row's loads could not forward). */

/* The column kernels below read rows of x (and dy) that are f32 or, with bf16, bf16 (widened in
 * registers: the same values, so the same sums as on f32 tiles); es is the element size. Each
 * is one inline body with an f32 and a bf16 target-clone wrapper. */
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
 * once per block rather than once per row. For narrow rows those loads and stores, two or three
 * of each per 8 channels per row, set the pace: the GroupNorm NHWC forward took 0.80-0.89x the
 * time at C = 32 and 64, the backward 0.80-0.92x at C = 32 and (bf16) 64 (bench_ab, cold, 2
 * threads). Wider rows keep a row at a time, also in a narrow last channel tile: there the pass
 * waits on memory, and blocks of 8 rows read side by side took 1.02-1.08x (forward, C = 256
 * f32; backward, C = 64 f32). */
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

/* The column reductions of rows_reduce (kind as there) over nr rows of x (and dy), f32 or
 * (bf16) bf16, from the tile's first channel: acc, m and x (dy) at that channel, the sums of
 * kinds 2 and 3 C doubles apart. */
static void col_reduce(int kind, double *acc, int64_t C, const void *dy, const void *x,
                       const double *m, int64_t nr, int64_t ct, int bf16) {
  if (kind == 0) (bf16 ? col_sum_bf16 : col_sum)(acc, x, nr, C, ct);
  else if (kind == 1) (bf16 ? col_sumsq_bf16 : col_sumsq)(acc, x, nr, C, ct, m);
  else if (kind == 3) (bf16 ? col_shifted_bf16 : col_shifted)(acc, acc + C, x, nr, C, ct, m);
  else (bf16 ? col_bwd_bf16 : col_bwd)(acc, acc + C, acc + 2 * C, dy, x, nr, C, ct, m);
}

/* One contiguous run, f32 or (bf16) bf16 widened in registers, SN_LANES lanes per sum (lane k
 * gets elements i ≡ k mod SN_LANES): acc[0][k] += d, acc[1][k] += dy, acc[2][k] += dy·d with
 * d = x − m. */
SN_INLINE void run_bwd_impl(double *acc, const void *dy, const void *x, int64_t n, double m,
                            int bf16) {
  const uintptr_t es = bf16 ? 2 : 4, ahead = GN_PF_FLOATS * 4; /* prefetch 2 KiB ahead */
  sn__vd s1, s2, s3, d, g; /* lane k in element k, as the scalar tail below */
  SN_VLOAD(s1, acc);
  SN_VLOAD(s2, acc + SN_LANES);
  SN_VLOAD(s3, acc + 2 * SN_LANES);
  int64_t i = 0;
  for (; i + 2 * SN_LANES <= n; i += 2 * SN_LANES) { /* one cache line of each per step (f32) */
    __builtin_prefetch(sn__pf_addr(dy, i, es, ahead), 0);
    __builtin_prefetch(sn__pf_addr(x, i, es, ahead), 0);
    for (int h = 0; h < 2; h++) {
      SN_VLOAD_WIDEN_W(d, x, i + h * SN_LANES, bf16);
      SN_VLOAD_WIDEN_W(g, dy, i + h * SN_LANES, bf16);
      d -= m;
      s1 += d;
      s2 += g;
      s3 += g * d;
    }
  }
  for (; i + SN_LANES <= n; i += SN_LANES) {
    SN_VLOAD_WIDEN_W(d, x, i, bf16);
    SN_VLOAD_WIDEN_W(g, dy, i, bf16);
    d -= m;
    s1 += d;
    s2 += g;
    s3 += g * d;
  }
  SN_VSTORE(acc, s1);
  SN_VSTORE(acc + SN_LANES, s2);
  SN_VSTORE(acc + 2 * SN_LANES, s3);
  for (int k = 0; i < n; i++, k++) {
    double dd = (double)sn__load_w(x, bf16, i) - m, gg = (double)sn__load_w(dy, bf16, i);
    acc[k] += dd;
    acc[SN_LANES + k] += gg;
    acc[2 * SN_LANES + k] += gg * dd;
  }
}
SN_CLONES static void run_bwd(double *acc, const float *dy, const float *x, int64_t n, double m) {
  run_bwd_impl(acc, dy, x, n, m, 0);
}
SN_CLONES static void run_bwd_bf16(double *acc, const uint16_t *dy, const uint16_t *x, int64_t n,
                                   double m) {
  run_bwd_impl(acc, dy, x, n, m, 1);
}

/* ---- contiguous runs of any dtype (NCHW) ------------------------------------------------------ */

/* Σ x over elements [off, off+n) in fp64 (fixed lanes; bf16/f16 tile by tile, in order). */
static double span_sum(const void *x, int64_t off, int64_t n, sn_dtype_t dtype) {
  if (dtype == SN_DTYPE_F32) return sn__sum_f64((const float *)x + off, n);
  float t[SN_TILE];
  double s = 0.0;
  for (int64_t i = 0; i < n; i += SN_TILE) {
    int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(t, x, off + i, m, dtype);
    s += sn__sum_f64(t, m);
  }
  return s;
}

/* Σ (x − shift)² over elements [off, off+n) in fp64. */
static double span_sumsq(const void *x, int64_t off, int64_t n, double shift, sn_dtype_t dtype) {
  if (dtype == SN_DTYPE_F32) return sn__sumsq_shifted_f64((const float *)x + off, n, shift);
  float t[SN_TILE];
  double s = 0.0;
  for (int64_t i = 0; i < n; i += SN_TILE) {
    int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(t, x, off + i, m, dtype);
    s += sn__sumsq_shifted_f64(t, m, shift);
  }
  return s;
}

/* out[0..2] = Σ d, Σ dy, Σ dy·d over elements [off, off+n), d = x − m. */
static void span_bwd(double out[3], const void *dy, const void *x, int64_t off, int64_t n,
                     double m, sn_dtype_t dtype) {
  double acc[3 * SN_LANES] = {0};
  if (dtype == SN_DTYPE_F32) {
    run_bwd(acc, (const float *)dy + off, (const float *)x + off, n, m);
  } else if (dtype == SN_DTYPE_BF16) { /* as is: the same sums as on f32 tiles */
    run_bwd_bf16(acc, (const uint16_t *)dy + off, (const uint16_t *)x + off, n, m);
  } else {
    float tg[SN_TILE], tx[SN_TILE]; /* SN_TILE is a multiple of SN_LANES: lanes line up */
    for (int64_t i = 0; i < n; i += SN_TILE) {
      int64_t len = sn__min64(SN_TILE, n - i);
      sn__to_f32(tg, dy, off + i, len, dtype);
      sn__to_f32(tx, x, off + i, len, dtype);
      run_bwd(acc, tg, tx, len, m);
    }
  }
  for (int q = 0; q < 3; q++) {
    double s = 0.0;
    for (int k = 0; k < SN_LANES; k++) s += acc[q * SN_LANES + k];
    out[q] = s;
  }
}

/* ---- rows of any dtype (NHWC) ----------------------------------------------------------------- */

/* Column reductions over rows [r0, r1) of an [rows, C] activation, channel tile by channel tile:
 * kind 0: acc[c] += x; kind 1: acc[c] += (x − m[c])²; kind 2: col_bwd into acc, acc+C, acc+2C;
 * kind 3: acc[c] += x − m[c], acc[C + c] += (x − m[c])² (col_shifted).
 * acc: [C] (kind 0, 1), [2][C] (kind 3) or [3][C] (kind 2), accumulated (+=). */
static void rows_reduce(int kind, double *acc, const void *dy, const void *x, const double *m,
                        int64_t r0, int64_t r1, int64_t C, sn_dtype_t dtype) {
  float tg[SN_TILE], tx[SN_TILE];
  for (int64_t c0 = 0; c0 < C; c0 += SN_TILE_C) {
    const int64_t ct = sn__min64(SN_TILE_C, C - c0), off0 = r0 * C + c0;
    const double *mc = m != NULL ? m + c0 : NULL;
    if (dtype == SN_DTYPE_BF16) { /* the rows as they are: one call, no f32 tile */
      col_reduce(kind, acc + c0, C, kind == 2 ? (const uint16_t *)dy + off0 : NULL,
                 (const uint16_t *)x + off0, mc, r1 - r0, ct, 1);
      continue;
    }
    const int64_t per = sn__rows_per_block(r1 - r0, C, ct, dtype);
    for (int64_t r = r0; r < r1; r += per) {
      const int64_t nr = sn__min64(per, r1 - r), off = r * C + c0, span = (nr - 1) * C + ct;
      const float *xb = sn__in_row(x, off, span, dtype, tx);
      const float *gb = kind == 2 ? sn__in_row(dy, off, span, dtype, tg) : NULL;
      col_reduce(kind, acc + c0, C, gb, xb, mc, nr, ct, 0);
    }
  }
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Mean and rstd of one f32 NCHW group x [L]: one pass of sums shifted by the mean of its first
 * values, SN_ROW_LANES fp64 lanes, or two passes where that pivot is too far from the mean
 * (sn__row_shifted_sums, sn__row_stats in rownorm.h), prefetching the next group `next` (NULL
 * for none) for reading and this group's output `out` for writing as it goes. */
SN_CLONES static void gn_group_stats_f32(double *mu, double *rs, const float *x, int64_t L,
                                         double eps, const char *next, char *out) {
  const double K = sn__row_pivot(x, NULL, 0, L);
  double sums[2], m2;
  sn__row_shifted_sums(sums, NULL, NULL, x, NULL, 0, L, K, next, out, 4);
  sn__row_stats(mu, &m2, x, L, K, sums);
  *rs = 1.0 / sqrt(m2 / (double)L + eps);
}

/* gn_group_stats_f32 of one bf16 NCHW group x [L], read in pairs (sn__row_shifted_sums_bf16):
 * bitwise the same as on the group widened to f32; next and out as there (bf16). */
SN_CLONES static void gn_group_stats_bf16(double *mu, double *rs, const uint16_t *x, int64_t L,
                                          double eps, const char *next, char *out) {
  double m2;
  sn__row_stats_bf16(mu, &m2, NULL, x, NULL, L, next, NULL, out);
  *rs = 1.0 / sqrt(m2 / (double)L + eps);
}

/* f16 NCHW groups of up to GN_F16_WIDE_MAX values are widened once into a per-thread f32 row
 * (gn_fwd_nchw's wide), whose statistics are then the f32 groups' (one shifted pass; the same
 * bits as f32 on the widened x) and which the map reads (sn__aff_span_from_f32): x is widened
 * once instead of three times (two passes of sums and the map over f32 tiles), which larger
 * groups still take. 2^18 floats: 1 MiB a thread. */
#define GN_F16_WIDE_MAX ((int64_t)1 << 18)

/* wide: f16 with groups of at most GN_F16_WIDE_MAX values, a thread's f32 row of wide_stride
 * floats each; NULL otherwise. */
static void gn_fwd_nchw(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                        const float *beta, int64_t N, int64_t C, int64_t S, int64_t G, double eps,
                        sn_dtype_t dtype, float *wide, int64_t wide_stride) {
  const int64_t Cg = C / G, L = Cg * S;
  const int stream = sn__stream_out(N * C * S * (int64_t)sn_dtype_size(dtype));
#pragma omp parallel if (N * C * S >= SN_PAR_MIN)
  {
    float *wf = wide != NULL ? wide + (int64_t)sn__thread_num() * wide_stride : NULL; /* [L] */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N * G; t++) {
      const int64_t n = t / G, g = t % G, off = (n * C + g * Cg) * S;
      double mu, rs;
      if (dtype == SN_DTYPE_F32) {
        const char *next = t + 1 < N * G ? (const char *)((const float *)x + off + L) : NULL;
        gn_group_stats_f32(&mu, &rs, (const float *)x + off, L, eps, next,
                           stream ? NULL : (char *)((float *)y + off)); /* streamed: no RFO */
      } else if (dtype == SN_DTYPE_BF16) {
        const char *next = t + 1 < N * G ? (const char *)((const uint16_t *)x + off + L) : NULL;
        gn_group_stats_bf16(&mu, &rs, (const uint16_t *)x + off, L, eps, next,
                            (char *)((uint16_t *)y + off)); /* bf16 maps never stream */
      } else if (wf != NULL) {
        sn__to_f32(wf, x, off, L, dtype);
        gn_group_stats_f32(&mu, &rs, wf, L, eps, NULL, NULL);
      } else {
        mu = span_sum(x, off, L, dtype) / (double)L;
        rs = 1.0 / sqrt(span_sumsq(x, off, L, mu, dtype) / (double)L + eps);
      }
      if (mean) mean[t] = (float)sn__nan_canon(mu);
      if (rstd) rstd[t] = (float)sn__nan_canon(rs);
      for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
        sn__chan_k_t k;
        sn__chan_k_set(&k, mu, rs * (gamma ? (double)gamma[ch] : 1.0), beta ? beta[ch] : 0.0, 0.0);
        if (wf != NULL) /* with beta the checked map, as below */
          sn__aff_span_from_f32(y, (n * C + ch) * S, wf + (ch - g * Cg) * S, S, &k, dtype,
                                beta != NULL);
        else if (beta != NULL && dtype != SN_DTYPE_F32) /* beta may cancel: the checked map */
          sn__aff_span_chk(y, x, (n * C + ch) * S, S, &k, dtype);
        else
          sn__aff_span(y, x, (n * C + ch) * S, S, &k, dtype, stream);
      }
    }
    sn__stream_fence(stream);
  }
}

/* Per-thread scratch of n doubles, rounded up to whole cache lines (8 doubles). */
static int64_t per_thread(int64_t n) { return sn__line_stride(n, (int64_t)sizeof(double)); }

/* Rows the NHWC pivots average: a sample falls back to two passes when any of its C channels
 * has ρ > SN_SHIFT_RHO_MAX; with the mean of m shuffled rows as pivot, ρ ~ χ²(1)/m, so each
 * channel does with probability P(χ²(1) > m/4): 0.5 % at m = 32 (a quarter of 64-channel
 * samples), 1e-8 at m = 128. */
#define GN_PIVOT_ROWS 128

/* The NHWC sums of a sample are taken in pieces: its S rows are cut into gn_pieces(S) runs of
 * consecutive rows, each summed from zero, and the pieces' sums are added in piece order. The
 * pieces depend on S only, so the bits do not depend on which thread sums which piece: a sample
 * too large for one core's L2 (or a batch of fewer samples than threads) is shared by the
 * whole team, each thread summing and then normalizing its own pieces while they are in its
 * L2 (gn_fwd_nhwc). */
#define GN_PIECES 8

static int64_t gn_pieces(int64_t S) { return S < GN_PIECES ? S : GN_PIECES; }

/* First row, from the sample's start, of piece p of the P pieces of S rows (p = P: S). */
static int64_t gn_piece_row(int64_t S, int64_t P, int64_t p) {
  return p * (S / P) + sn__min64(p, S % P);
}

/* rows_reduce of `kind` over pieces [p0, p1) of the sample whose rows start at r0, each piece
 * summed from zero. shared: piece p into part[p·width, (p+1)·width) (overwritten), for
 * gn_piece_total once the team is done; otherwise acc [width] = Σ_p piece p in piece order (as
 * gn_piece_total adds them), piece by piece through part [width], which stays in L1. */
static void gn_piece_reduce(int kind, double *acc, double *part, int64_t width, const void *dy,
                            const void *x, const double *m, int64_t r0, int64_t S, int64_t p0,
                            int64_t p1, int64_t C, sn_dtype_t dtype, int shared) {
  const int64_t P = gn_pieces(S);
  if (!shared) memset(acc, 0, (size_t)width * sizeof(double));
  for (int64_t p = p0; p < p1; p++) {
    double *piece = shared ? part + p * width : part;
    memset(piece, 0, (size_t)width * sizeof(double));
    rows_reduce(kind, piece, dy, x, m, r0 + gn_piece_row(S, P, p),
                r0 + gn_piece_row(S, P, p + 1), C, dtype);
    if (!shared)
      for (int64_t i = 0; i < width; i++) acc[i] += piece[i];
  }
}

/* acc [width] = Σ_p part[p·width + i] over the sample's pieces, in piece order, once the whole
 * team has summed its pieces (gn_piece_reduce with shared). */
static void gn_piece_total(double *acc, const double *part, int64_t width, int64_t S) {
#pragma omp barrier
  memset(acc, 0, (size_t)width * sizeof(double));
  for (int64_t p = 0; p < gn_pieces(S); p++)
    for (int64_t i = 0; i < width; i++) acc[i] += part[p * width + i];
}

/* The sums of `kind` over the sample's rows into acc [width], by pieces (gn_piece_reduce; dy
 * for kind 2 only). */
static void gn_sample_sums(int kind, double *acc, double *part, int64_t width, const void *dy,
                           const void *x, const double *m, int64_t r0, int64_t S, int64_t p0,
                           int64_t p1, int64_t C, sn_dtype_t dtype, int shared) {
  gn_piece_reduce(kind, acc, part, width, dy, x, m, r0, S, p0, p1, C, dtype, shared);
  if (shared) gn_piece_total(acc, part, width, S);
}

/* The NHWC group statistics of the sample whose S rows (of C channels) start at row r0, into
 * gm, gr [G]: one pass of per-channel sums shifted by a pivot k[c], the channel's mean over the
 * sample's first GN_PIVOT_ROWS rows rounded to f32 (col_shifted), giving each channel's mean
 * μ_c = k_c + A_c/S and M2_c = B_c − A_c²/S (A, B: the shifted sums), combined per group without
 * cancellation (Chan et al.): M2_g = Σ_c M2_c + S·(μ_c − μ_g)², μ_g the mean of the μ_c. A
 * channel whose pivot lies more than σ_c/2 from its mean (ρ above SN_SHIFT_RHO_MAX, see
 * rownorm.h), or with anything not finite, sends the sample to the two passes: Σx, then
 * Σ(x − μ_g)². Sums by pieces (GN_PIECES): this thread sums pieces [p0, p1); with `shared`
 * the team's threads call it together, each with its own pieces, into part (the team's,
 * [gn_pieces(S)][2][C]), and all get the same gm, gr (every thread adds all pieces); otherwise
 * part is this thread's [2][C]. col: [2][C], k: [C], this thread's. */
static void gn_nhwc_stats(double *gm, double *gr, double *col, double *k, double *part,
                          const void *x, int64_t r0, int64_t S, int64_t C, int64_t G, double eps,
                          sn_dtype_t dtype, int64_t p0, int64_t p1, int shared) {
  const int64_t Cg = C / G, L = Cg * S;
  const int64_t pr = sn__min64(S, GN_PIVOT_ROWS); /* k = the mean of the first pr rows, as f32 */
  memset(k, 0, (size_t)C * sizeof(double));
  rows_reduce(0, k, NULL, x, NULL, r0, r0 + pr, C, dtype); /* each channel's rows in order */
  for (int64_t ch = 0; ch < C; ch++) k[ch] = (double)(float)(k[ch] / (double)pr);
  gn_sample_sums(3, col, part, 2 * C, NULL, x, k, r0, S, p0, p1, C, dtype, shared);
  int ok = 1;
  for (int64_t ch = 0; ch < C; ch++) { /* col[ch] = μ_c, col[C + ch] = M2_c */
    const double a = col[ch], m2 = col[C + ch] - a * a / (double)S;
    ok &= a * a <= SN_SHIFT_RHO_MAX * (double)S * m2; /* false for NaN */
    col[ch] = k[ch] + a / (double)S;
    col[C + ch] = m2;
  }
  if (ok) {
    for (int64_t g = 0; g < G; g++) {
      double mu = 0.0, m2 = 0.0;
      for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) mu += col[ch];
      mu /= (double)Cg;
      for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
        const double dm = col[ch] - mu;
        m2 += col[C + ch] + (double)S * dm * dm;
      }
      gm[g] = mu;
      gr[g] = 1.0 / sqrt(m2 / (double)L + eps);
    }
    return;
  }
  /* every thread of a team decides alike (the same totals); part is rewritten only once all
   * have read it */
  if (shared) {
#pragma omp barrier
  }
  gn_sample_sums(0, col, part, C, NULL, x, NULL, r0, S, p0, p1, C, dtype, shared);
  for (int64_t g = 0; g < G; g++) {
    double s = 0.0;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) s += col[ch];
    gm[g] = s / (double)L;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) k[ch] = gm[g];
  }
  if (shared) {
#pragma omp barrier
  }
  gn_sample_sums(1, col, part, C, NULL, x, k, r0, S, p0, p1, C, dtype, shared);
  for (int64_t g = 0; g < G; g++) {
    double s = 0.0;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) s += col[ch];
    gr[g] = 1.0 / sqrt(s / (double)L + eps);
  }
}

/* y for sample rows [r0, r1) (of the sample starting at row n·S) from its group statistics. */
static void gn_nhwc_map(void *y, const void *x, const float *gamma, const float *beta,
                        const double *gm, const double *gr, int64_t r0, int64_t r1, int64_t C,
                        int64_t G, sn_dtype_t dtype, int stream) {
  const int64_t Cg = C / G;
  const int checked = beta != NULL && dtype != SN_DTYPE_F32; /* beta may cancel */
  sn__chan_tile_t p;
  for (int64_t c0 = 0; c0 < C; c0 += SN_TILE_C) {
    const int64_t ct = sn__min64(SN_TILE_C, C - c0);
    for (int64_t j = 0; j < ct; j++) {
      const int64_t ch = c0 + j, g = ch / Cg;
      sn__tile_set(&p, j, gm[g], gr[g] * (gamma ? (double)gamma[ch] : 1.0), beta ? beta[ch] : 0.0,
                   0.0);
    }
    if (checked) sn__aff_rowspan_chk(y, x, r0, r1, C, c0, ct, &p, dtype);
    else sn__aff_rowspan(y, x, r0, r1, C, c0, ct, &p, dtype, stream);
  }
}

/* Scratch doubles of one thread: col [2][C], k [C], gm, gr [G], part [2][C]. */
static int64_t gn_fwd_nhwc_scratch(int64_t C, int64_t G) { return per_thread(5 * C + 2 * G); }

/* The most rows of a sample that one thread of a team of T sums and maps when the team shares
 * it: its pieces [t·P/T, (t+1)·P/T) of the P = gn_pieces(S), at most ⌈P/T⌉ (one where T > P,
 * and then T − P threads have none), each of at most ⌈S/P⌉ rows. */
static int64_t gn_share_rows(int64_t S, int64_t T) {
  const int64_t P = gn_pieces(S);
  return (P + T - 1) / T * ((S + P - 1) / P);
}

/* Whether the NHWC forward shares each sample between the threads: fewer samples than nt (the
 * threads that can run at once), or a sample larger than a core's L2 whose share per thread
 * (gn_share_rows) fits it, so that the team reads the sample from memory once, and that has a
 * piece for each thread (nt <= GN_PIECES; else some would idle at every barrier). Where the
 * share is larger too, the map reads it again from L3 or memory either way, and the team's
 * barrier per sample costs more than it saves: [256,256,56,56] f32 (3.2 MB samples, 1 MiB L2
 * per core), two threads, 0.90-0.93x the time with each thread taking whole samples (bench_ab,
 * cold). */
static int gn_fwd_split(int64_t N, int64_t C, int64_t S, sn_dtype_t dtype, int nt) {
  const int64_t es = sn_dtype_size(dtype), l2 = sn__l2_bytes();
  if (nt <= 1) return 0;
  if (N < nt) return 1;
  return S * C * es > l2 && nt <= gn_pieces(S) && gn_share_rows(S, nt) * C * es <= l2;
}

/* Sample n of the NHWC forward: its statistics (this thread's pieces [p0, p1) into part, added
 * by the team when shared; mean and rstd written when `writer`), then y over the rows of pieces
 * [p0, p1). w: this thread's block (gn_fwd_nhwc_scratch). */
static void gn_fwd_sample(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                          const float *beta, int64_t n, int64_t C, int64_t S, int64_t G,
                          double eps, sn_dtype_t dtype, double *w, double *part, int64_t p0,
                          int64_t p1, int shared, int writer, int stream) {
  const int64_t P = gn_pieces(S), r0 = n * S;
  double *col = w, *k = col + 2 * C, *gm = k + C, *gr = gm + G; /* [2][C], [C], [G], [G] */
  gn_nhwc_stats(gm, gr, col, k, part, x, r0, S, C, G, eps, dtype, p0, p1, shared);
  if (writer)
    for (int64_t g = 0; g < G; g++) {
      if (mean) mean[n * G + g] = (float)sn__nan_canon(gm[g]);
      if (rstd) rstd[n * G + g] = (float)sn__nan_canon(gr[g]);
    }
  gn_nhwc_map(y, x, gamma, beta, gm, gr, r0 + gn_piece_row(S, P, p0), r0 + gn_piece_row(S, P, p1),
              C, G, dtype, stream);
}

/* The nt flags of an NHWC map pass (the forward's y, the backward's dx), called inside the
 * parallel region: stream0 (sn__stream_out of the whole output), with SN_NT_PREFETCH added
 * where the `inputs` tensors (1: x; 2: x and dy) of this thread's rows of a sample — S rows, or
 * gn_share_rows when the team shares the sample — exceed its L2. The pass then reads them from
 * memory a second time (after the sums), so it prefetches them, as the BatchNorm maps do; only
 * where it streams (SN_NT_PREFETCH needs SN_NT_STREAM). A sample per thread is the case of one
 * thread, or of one processor per MPI rank. */
static int gn_map_nt(int stream0, int shared, int64_t S, int64_t C, int64_t es, int64_t inputs) {
  const int64_t rows = shared ? gn_share_rows(S, sn__team_size()) : S;
  return stream0 && inputs * rows * C * es > sn__l2_bytes() ? stream0 | SN_NT_PREFETCH : stream0;
}

/* scratch: nt·gn_fwd_nhwc_scratch(C, G) doubles, a block per thread; team (when
 * gn_fwd_split): [2][GN_PIECES][2][C] doubles, the team's part buffers, one per sample parity,
 * so that a thread may sum the next sample's pieces while another still adds this one's. A
 * shared sample is read from memory once, where a sample per thread larger than L2 is read
 * twice (sums, then map); otherwise each thread takes whole samples. The same bits either way
 * (pieces). */
static void gn_fwd_nhwc(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                        const float *beta, int64_t N, int64_t C, int64_t S, int64_t G, double eps,
                        sn_dtype_t dtype, double *scratch, double *team, int nt) {
  const int64_t P = gn_pieces(S), block = gn_fwd_nhwc_scratch(C, G);
  const int64_t es = sn_dtype_size(dtype);
  const int stream0 = sn__stream_out(N * C * S * es);
#pragma omp parallel num_threads(nt) if (N * C * S >= SN_PAR_MIN)
  {
    double *w = scratch + (int64_t)sn__thread_num() * block, *own = w + 3 * C + 2 * G;
    const int stream = gn_map_nt(stream0, team != NULL, S, C, es, 1);
    if (team == NULL) {
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; n++)
        gn_fwd_sample(y, mean, rstd, x, gamma, beta, n, C, S, G, eps, dtype, w, own, 0, P, 0, 1,
                      stream);
    } else {
      const int64_t T = sn__team_size(), t = sn__thread_num();
      for (int64_t n = 0; n < N; n++)
        gn_fwd_sample(y, mean, rstd, x, gamma, beta, n, C, S, G, eps, dtype, w,
                      team + (n & 1) * GN_PIECES * 2 * C, t * P / T, (t + 1) * P / T, 1, t == 0,
                      stream);
    }
    sn__stream_fence(stream);
  }
}

sn_status_t sn_groupnorm_fwd(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                             const float *beta, int64_t n, int64_t c, int64_t s, int64_t groups,
                             float eps, sn_layout_t layout, sn_dtype_t dtype) {
  static const char fn[] = "sn_groupnorm_fwd";
  sn__args_t args;
  SN_TRY(sn__gn_fwd_args(&args, fn, y, mean, rstd, x, gamma, beta, n, c, s, groups, eps, layout,
                         dtype));
  const int64_t rows = args.rows;
  if (rows == 0) return SN_OK;
  if (layout == SN_LAYOUT_NCHW) {
    const int64_t L = c / groups * s, stride = sn__line_stride(L, (int64_t)sizeof(float));
    float *wide = NULL;
    sn_status_t st;
    if (dtype == SN_DTYPE_F16 && L <= GN_F16_WIDE_MAX &&
        (wide = sn__alloc(fn, sn__max_threads(), stride, (int64_t)sizeof(float), &st)) == NULL)
      return st;
    gn_fwd_nchw(y, mean, rstd, x, gamma, beta, n, c, s, groups, (double)eps, dtype, wide, stride);
    sn__free(wide);
    return SN_OK;
  }
  const int nt = sn__max_threads(), bt = sn__concurrent_threads(); /* bt <= nt */
  sn_status_t st;
  double *scratch = sn__alloc(fn, nt, gn_fwd_nhwc_scratch(c, groups), (int64_t)sizeof(double), &st);
  if (scratch == NULL) return st;
  double *team = NULL;
  if (gn_fwd_split(n, c, s, dtype, bt) &&
      (team = sn__alloc(fn, 2 * GN_PIECES * 2, c, (int64_t)sizeof(double), &st)) == NULL) {
    sn__free(scratch);
    return st;
  }
  gn_fwd_nhwc(y, mean, rstd, x, gamma, beta, n, c, s, groups, (double)eps, dtype, scratch, team,
              nt);
  sn__free(team);
  sn__free(scratch);
  return SN_OK;
}

/* ---- backward --------------------------------------------------------------------------------- */

/* wq: [2][N·C] (dgamma terms, dbeta terms) or NULL. */
static void gn_bwd_nchw(void *dx, double *wq, const void *dy, const void *x, const float *mean,
                        const float *rstd, const float *gamma, int64_t N, int64_t C, int64_t S,
                        int64_t G, sn_dtype_t dtype) {
  const int64_t Cg = C / G, L = Cg * S;
  const int stream = sn__stream_out(N * C * S * (int64_t)sn_dtype_size(dtype));
#pragma omp parallel if (N * C * S >= SN_PAR_MIN)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N * G; t++) {
      const int64_t n = t / G, ch0 = (t % G) * Cg;
      const double m = (double)mean[t], rs = (double)rstd[t];
      double A = 0.0, B = 0.0, D = 0.0; /* Σd, Σ gamma·Σdy, Σ gamma·Σdy·d over the group */
      for (int64_t ch = ch0; ch < ch0 + Cg; ch++) { /* pass 1: sums, plane by plane */
        double sum3[3];
        span_bwd(sum3, dy, x, (n * C + ch) * S, S, m, dtype);
        const double gm = gamma ? (double)gamma[ch] : 1.0;
        A += sum3[0];
        B += gm * sum3[1];
        D += gm * sum3[2];
        if (wq) wq[n * C + ch] = sum3[2], wq[N * C + n * C + ch] = sum3[1];
      }
      const double mu_d = A / (double)L, mg = B / (double)L, mgx = rs * (D - mu_d * B) / (double)L;
      for (int64_t ch = ch0; ch < ch0 + Cg; ch++) { /* pass 2: dx, and the dgamma terms */
        if (wq) wq[n * C + ch] = rs * (wq[n * C + ch] - mu_d * wq[N * C + n * C + ch]);
        sn__chan_k_t k;
        sn__chan_k_set(&k, m + mu_d, rs * (gamma ? (double)gamma[ch] : 1.0), rs * mg,
                       rs * rs * mgx);
        sn__affbwd_span(dx, dy, x, (n * C + ch) * S, S, &k, dtype, stream);
      }
    }
    sn__stream_fence(stream);
  }
}

/* Scratch doubles of one thread: col [3][C], shift [C], mu_d, mg, mgx [G], part [3][C]. */
static int64_t gn_bwd_nhwc_scratch(int64_t C, int64_t G) { return per_thread(7 * C + 3 * G); }

/* Whether the NHWC backward shares each sample between the threads: fewer samples than nt (the
 * threads that can run at once). Unlike the forward (gn_fwd_split), a sample larger than L2
 * stays with one thread, its dx pass prefetching x and dy (gn_bwd_nhwc); sharing it is
 * untried (the forward gains 4-6 % from it where a thread's share fits its L2, and loses 7-10 %
 * where it does not, docs/BENCHMARKS.md). */
static int gn_bwd_split(int64_t N, int nt) { return nt > 1 && N < nt; }

/* Sample n of the NHWC backward: its sums by pieces (this thread's [p0, p1) into part, added by
 * the team when shared), the group constants, wq's terms when `writer`, and dx over the rows of
 * pieces [p0, p1). w: this thread's block (gn_bwd_nhwc_scratch). */
static void gn_bwd_sample(void *dx, double *wq, const void *dy, const void *x, const float *mean,
                          const float *rstd, const float *gamma, int64_t n, int64_t N, int64_t C,
                          int64_t S, int64_t G, sn_dtype_t dtype, double *w, double *part,
                          int64_t p0, int64_t p1, int shared, int writer, int stream) {
  const int64_t Cg = C / G, L = Cg * S, P = gn_pieces(S), r0 = n * S;
  double *col = w, *shift = col + 3 * C;                   /* [3][C]; [C] the group's saved mean */
  double *mu_d = shift + C, *mg = mu_d + G, *mgx = mg + G; /* [G] each */
  for (int64_t ch = 0; ch < C; ch++) shift[ch] = (double)mean[n * G + ch / Cg];
  /* Σd, Σdy, Σdy·d per channel */
  gn_sample_sums(2, col, part, 3 * C, dy, x, shift, r0, S, p0, p1, C, dtype, shared);
  for (int64_t g = 0; g < G; g++) {
    const double rs = (double)rstd[n * G + g];
    double A = 0.0, B = 0.0, D = 0.0;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
      const double gm = gamma ? (double)gamma[ch] : 1.0;
      A += col[ch];
      B += gm * col[C + ch];
      D += gm * col[2 * C + ch];
    }
    mu_d[g] = A / (double)L;
    mg[g] = B / (double)L;
    mgx[g] = rs * (D - mu_d[g] * B) / (double)L;
  }
  if (wq && writer)
    for (int64_t ch = 0; ch < C; ch++) {
      const int64_t g = ch / Cg;
      wq[n * C + ch] = (double)rstd[n * G + g] * (col[2 * C + ch] - mu_d[g] * col[C + ch]);
      wq[N * C + n * C + ch] = col[C + ch];
    }
  sn__chan_tile_t p;
  for (int64_t c0 = 0; c0 < C; c0 += SN_TILE_C) { /* pass 2: dx */
    const int64_t ct = sn__min64(SN_TILE_C, C - c0);
    for (int64_t j = 0; j < ct; j++) {
      const int64_t ch = c0 + j, g = ch / Cg;
      const double rs = (double)rstd[n * G + g];
      sn__tile_set(&p, j, shift[ch] + mu_d[g], rs * (gamma ? (double)gamma[ch] : 1.0), rs * mg[g],
                   rs * rs * mgx[g]);
    }
    sn__affbwd_rowspan(dx, dy, x, r0 + gn_piece_row(S, P, p0), r0 + gn_piece_row(S, P, p1), C,
                       c0, ct, &p, dtype, stream);
  }
}

/* scratch: nt·gn_bwd_nhwc_scratch(C, G) doubles, a block per thread; team: NULL, or (a batch of
 * fewer samples than threads) [2][GN_PIECES][3][C] doubles, the team's part buffers by sample
 * parity. With team each sample is shared by the team, each thread summing and then mapping a
 * fixed range of its rows; otherwise each thread takes whole samples. The same bits either way
 * (the sums by pieces). */
static void gn_bwd_nhwc(void *dx, double *wq, const void *dy, const void *x, const float *mean,
                        const float *rstd, const float *gamma, int64_t N, int64_t C, int64_t S,
                        int64_t G, sn_dtype_t dtype, double *scratch, double *team, int nt) {
  const int64_t P = gn_pieces(S), block = gn_bwd_nhwc_scratch(C, G);
  const int64_t es = sn_dtype_size(dtype);
  const int stream0 = sn__stream_out(N * C * S * es);
#pragma omp parallel num_threads(nt) if (N * C * S >= SN_PAR_MIN)
  {
    double *w = scratch + (int64_t)sn__thread_num() * block, *own = w + 4 * C + 3 * G;
    const int stream = gn_map_nt(stream0, team != NULL, S, C, es, 2);
    if (team == NULL) {
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; n++)
        gn_bwd_sample(dx, wq, dy, x, mean, rstd, gamma, n, N, C, S, G, dtype, w, own, 0, P, 0, 1,
                      stream);
    } else {
      const int64_t T = sn__team_size(), t = sn__thread_num();
      for (int64_t n = 0; n < N; n++)
        gn_bwd_sample(dx, wq, dy, x, mean, rstd, gamma, n, N, C, S, G, dtype, w,
                      team + (n & 1) * GN_PIECES * 3 * C, t * P / T, (t + 1) * P / T, 1, t == 0,
                      stream);
    }
    sn__stream_fence(stream);
  }
}

sn_status_t sn_groupnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                             const float *mean, const float *rstd, const float *gamma, int64_t n,
                             int64_t c, int64_t s, int64_t groups, sn_layout_t layout,
                             sn_dtype_t dtype) {
  static const char fn[] = "sn_groupnorm_bwd";
  sn__args_t args;
  SN_TRY(sn__gn_bwd_args(&args, fn, dx, dgamma, dbeta, dy, x, mean, rstd, gamma, n, c, s, groups,
                         layout, dtype));
  const int64_t rows = args.rows;
  if (rows == 0) { /* empty batch: the parameter gradients are zero, nothing else is written */
    if (dgamma != NULL) memset(dgamma, 0, (size_t)c * sizeof *dgamma);
    if (dbeta != NULL) memset(dbeta, 0, (size_t)c * sizeof *dbeta);
    return SN_OK;
  }
  const int nt = sn__max_threads(), bt = sn__concurrent_threads(); /* bt <= nt */
  sn_status_t st = SN_OK;
  double *wq = NULL, *scratch = NULL, *team = NULL;
  if (dgamma || dbeta) {
    wq = sn__alloc(fn, 2, n * c, (int64_t)sizeof(double), &st); /* [2][N·C] */
    if (wq == NULL) return st;
  }
  if (layout == SN_LAYOUT_NHWC) {
    scratch = sn__alloc(fn, nt, gn_bwd_nhwc_scratch(c, groups), (int64_t)sizeof(double), &st);
    if (scratch == NULL ||
        (gn_bwd_split(n, bt) &&
         (team = sn__alloc(fn, 2 * GN_PIECES * 3, c, (int64_t)sizeof(double), &st)) == NULL)) {
      sn__free(scratch);
      sn__free(wq);
      return st;
    }
    gn_bwd_nhwc(dx, wq, dy, x, mean, rstd, gamma, n, c, s, groups, dtype, scratch, team, nt);
  } else {
    gn_bwd_nchw(dx, wq, dy, x, mean, rstd, gamma, n, c, s, groups, dtype);
  }
  if (wq) {
#pragma omp parallel for schedule(static) if (n * c >= SN_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) { /* over samples in order */
      double dg = 0.0, db = 0.0;
      for (int64_t i = 0; i < n; i++) dg += wq[i * c + ch], db += wq[n * c + i * c + ch];
      if (dgamma) dgamma[ch] = (float)sn__nan_canon(dg);
      if (dbeta) dbeta[ch] = (float)sn__nan_canon(db);
    }
  }
  sn__free(team);
  sn__free(scratch);
  sn__free(wq);
  return SN_OK;
}
