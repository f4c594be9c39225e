/*
 * bn_kernels.h — the BatchNorm reduction kernels of batchnorm.c (f32 in, fp64 lanes): the NCHW
 * runs of one channel (stats_run, bwd_run; bf16 runs too, widened in registers) and the NHWC
 * rows vectorized across channels (stats_rows, bwd_rows and their grouped forms). The order of every sum is described at the
 * top of batchnorm.c, which alone includes this file. Not installed; everything here is static
 * (target clones per including file).
 */
#ifndef SN_BN_KERNELS_H
#define SN_BN_KERNELS_H

#include "cpu.h"
#include "norm_vec.h"

#define LANE_MASK (SN_LANES - 1)
_Static_assert((SN_LANES & (SN_LANES - 1)) == 0, "SN_LANES must be a power of two");

/* ---- reduction kernels (f32 in, fp64 lanes) --------------------------------------------------- */

/* How far ahead (in floats) the NCHW runs prefetch their input: 2 KiB. The lanes' add chains
 * bound these loops to a few elements per cycle, so the hardware prefetcher alone (which
 * restarts at every 4 KiB page) left the reductions at ~70 % of the read bandwidth. */
#define RED_PF_FLOATS 512

/* The address RED_PF_FLOATS·4 bytes (2 KiB) past element i of x (element size es). */
#define RED_PF_AT(x, i, es) sn__pf_addr((x), (i), (es), RED_PF_FLOATS * 4)

/* NCHW run of one channel, x: [n] f32 or (bf16) bf16, continuing the chunk's lanes; `lane` is
 * the lane of x[0]. acc: [2][SN_LANES]:  acc[0][l] += x − p,  acc[1][l] += (x − p)². */
SN_INLINE void stats_run_impl(double *acc, const void *x, int64_t n, int lane, double p,
                              int bf16) {
  const uintptr_t es = bf16 ? 2 : 4;
  int64_t i = 0;
  for (; i < n && lane != 0; i++, lane = (lane + 1) & LANE_MASK) { /* up to lane 0 */
    double v = (double)sn__load_w(x, bf16, i) - p;
    acc[lane] += v;
    acc[SN_LANES + lane] += v * v;
  }
  if (i + SN_LANES <= n) { /* whole lane groups, accumulators in registers */
    sn__vd s1, s2, v;
    SN_VLOAD(s1, acc);
    SN_VLOAD(s2, acc + SN_LANES);
    for (; i + 2 * SN_LANES <= n; i += 2 * SN_LANES) { /* one cache line per step (f32) */
      __builtin_prefetch(RED_PF_AT(x, i, es), 0);
      for (int h = 0; h < 2; h++) {
        SN_VLOAD_WIDEN_W(v, x, i + h * SN_LANES, bf16);
        v -= p;
        s1 += v;
        s2 += v * v;
      }
    }
    for (; i + SN_LANES <= n; i += SN_LANES) {
      SN_VLOAD_WIDEN_W(v, x, i, bf16);
      v -= p;
      s1 += v;
      s2 += v * v;
    }
    SN_VSTORE(acc, s1);
    SN_VSTORE(acc + SN_LANES, s2);
  }
  for (int k = 0; i < n; i++, k++) { /* tail, starting at lane 0 */
    double v = (double)sn__load_w(x, bf16, i) - p;
    acc[k] += v;
    acc[SN_LANES + k] += v * v;
  }
}
SN_CLONES static void stats_run(double *acc, const float *x, int64_t n, int lane, double p) {
  stats_run_impl(acc, x, n, lane, p, 0);
}
SN_CLONES static void stats_run_bf16(double *acc, const uint16_t *x, int64_t n, int lane,
                                     double p) {
  stats_run_impl(acc, x, n, lane, p, 1);
}

/* NCHW run of the backward sums, dy, x: [n] f32 or (bf16) bf16:  acc[0][l] += dy,
 * acc[1][l] += dy·(x − m).
 * pf_l2: prefetch into L2 only (SN_PF_READ, prefetcht1) rather than into L1 too (prefetcht0):
 * set by the fused backward, which reads the run again from L2 for dx and is faster so; the sums
 * alone (sn_batchnorm_bwd_reduce), read once, are faster with prefetcht0. */
SN_INLINE void bwd_run_impl(double *acc, const void *dy, const void *x, int64_t n, int lane,
                            double m, int pf_l2, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4;
  int64_t i = 0;
  for (; i < n && lane != 0; i++, lane = (lane + 1) & LANE_MASK) {
    double g = (double)sn__load_w(dy, bf16, i);
    acc[lane] += g;
    acc[SN_LANES + lane] += g * ((double)sn__load_w(x, bf16, i) - m);
  }
  if (i + SN_LANES <= n) { /* whole lane groups, accumulators in registers */
    sn__vd s1, s2, g, v;
    SN_VLOAD(s1, acc);
    SN_VLOAD(s2, acc + SN_LANES);
    for (; i + 2 * SN_LANES <= n; i += 2 * SN_LANES) { /* one cache line of each per step */
      if (pf_l2) {
        SN_PF_READ(RED_PF_AT(dy, i, es));
        SN_PF_READ(RED_PF_AT(x, i, es));
      } else {
        __builtin_prefetch(RED_PF_AT(dy, i, es), 0);
        __builtin_prefetch(RED_PF_AT(x, i, es), 0);
      }
      for (int h = 0; h < 2; h++) {
        SN_VLOAD_WIDEN_W(g, dy, i + h * SN_LANES, bf16);
        SN_VLOAD_WIDEN_W(v, x, i + h * SN_LANES, bf16);
        s1 += g;
        s2 += g * (v - m);
      }
    }
    for (; i + SN_LANES <= n; i += SN_LANES) {
      SN_VLOAD_WIDEN_W(g, dy, i, bf16);
      SN_VLOAD_WIDEN_W(v, x, i, bf16);
      s1 += g;
      s2 += g * (v - m);
    }
    SN_VSTORE(acc, s1);
    SN_VSTORE(acc + SN_LANES, s2);
  }
  for (int k = 0; i < n; i++, k++) {
    double g = (double)sn__load_w(dy, bf16, i);
    acc[k] += g;
    acc[SN_LANES + k] += g * ((double)sn__load_w(x, bf16, i) - m);
  }
}
SN_CLONES static void bwd_run(double *acc, const float *dy, const float *x, int64_t n, int lane,
                              double m, int pf_l2) {
  bwd_run_impl(acc, dy, x, n, lane, m, pf_l2, 0);
}
SN_CLONES static void bwd_run_bf16(double *acc, const uint16_t *dy, const uint16_t *x, int64_t n,
                                   int lane, double m, int pf_l2) {
  bwd_run_impl(acc, dy, x, n, lane, m, pf_l2, 1);
}

/* The NHWC row kernels hold 8 channels' accumulators as one sn__vd (norm_vec.h), loaded and
 * stored whole, so that the next full-width loads of that lane row (8 rows later) can take them
 * from the store buffer. */
/* NHWC rows, x: [nr, ld] f32 or (bf16) bf16, first ct channels; row r goes to lane
 * (lane + r) mod SN_LANES. l1, l2: [SN_LANES][ls] accumulators (ls >= ct); p: [ct] shifts.
 * Returns the next row's lane. */
SN_INLINE int stats_rows_impl(double *restrict l1, double *restrict l2, int64_t ls,
                              const void *x, int64_t nr, int64_t ld, int64_t ct,
                              const double *restrict p, int lane, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4, ahead = sn__row_pf_ahead(ld, es);
  for (int64_t r = 0; r < nr; r++, lane = (lane + 1) & LANE_MASK) {
    const void *xr[1] = {(const char *)x + (uintptr_t)(r * ld) * es};
    sn__prefetch_at(xr[0], ahead, ct, es);
    sn__shifted_rows_w(l1 + lane * ls, l2 + lane * ls, xr, 1, ct, p, bf16);
  }
  return lane;
}
SN_CLONES static int stats_rows(double *restrict l1, double *restrict l2, int64_t ls,
                                const float *x, int64_t nr, int64_t ld, int64_t ct,
                                const double *restrict p, int lane) {
  return stats_rows_impl(l1, l2, ls, x, nr, ld, ct, p, lane, 0);
}
SN_CLONES static int stats_rows_bf16(double *restrict l1, double *restrict l2, int64_t ls,
                                     const uint16_t *x, int64_t nr, int64_t ld, int64_t ct,
                                     const double *restrict p, int lane) {
  return stats_rows_impl(l1, l2, ls, x, nr, ld, ct, p, lane, 1);
}

/* NHWC rows of the backward sums: l1 += dy, l2 += dy·(x − m); m: [ct] means. */
SN_INLINE int bwd_rows_impl(double *restrict l1, double *restrict l2, int64_t ls,
                            const void *dy, const void *x, int64_t nr, int64_t ld, int64_t ct,
                            const double *restrict m, int lane, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4, ahead = sn__row_pf_ahead(ld, es);
  for (int64_t r = 0; r < nr; r++, lane = (lane + 1) & LANE_MASK) {
    double *s1 = l1 + lane * ls, *s2 = l2 + lane * ls;
    const void *gr = (const char *)dy + (uintptr_t)(r * ld) * es;
    const void *xr = (const char *)x + (uintptr_t)(r * ld) * es;
    sn__prefetch_at(gr, ahead, ct, es);
    sn__prefetch_at(xr, ahead, ct, es);
    int64_t c = 0;
    for (; c + SN_VD <= ct; c += SN_VD) {
      sn__vd g, v, mc, a1, a2;
      SN_VLOAD_WIDEN_W(g, gr, c, bf16);
      SN_VLOAD_WIDEN_W(v, xr, c, bf16);
      SN_VLOAD(mc, m + c);
      SN_VLOAD(a1, s1 + c);
      SN_VLOAD(a2, s2 + c);
      a1 += g;
      a2 += g * (v - mc);
      SN_VSTORE(s1 + c, a1);
      SN_VSTORE(s2 + c, a2);
    }
    for (; c < ct; c++) {
      double g = (double)sn__load_w(gr, bf16, c);
      s1[c] += g;
      s2[c] += g * ((double)sn__load_w(xr, bf16, c) - m[c]);
    }
  }
  return lane;
}
SN_CLONES static int bwd_rows(double *restrict l1, double *restrict l2, int64_t ls,
                              const float *dy, const float *x, int64_t nr, int64_t ld, int64_t ct,
                              const double *restrict m, int lane) {
  return bwd_rows_impl(l1, l2, ls, dy, x, nr, ld, ct, m, lane, 0);
}
SN_CLONES static int bwd_rows_bf16(double *restrict l1, double *restrict l2, int64_t ls,
                                   const uint16_t *dy, const uint16_t *x, int64_t nr, int64_t ld,
                                   int64_t ct, const double *restrict m, int lane) {
  return bwd_rows_impl(l1, l2, ls, dy, x, nr, ld, ct, m, lane, 1);
}

/* The NHWC kernels above load and store a lane row of accumulators for every input row; with a
 * wide channel tile the [2][SN_LANES][ls] accumulators (32 KiB for 256 channels) do not stay in
 * L1 next to the streamed rows. The grouped kernels below take GROUP_ROWS rows at a time,
 * starting at lane 0: lane l gets rows l, l + 8, ..., l + 8·(GROUP_K − 1) of the group in that
 * order, so the sums and their order are those of stats_rows/bwd_rows, with one load and store
 * of each accumulator (an sn__vd of 8 channels) per GROUP_K rows (8 measured faster than 4 and
 * 16). Each lane walks its GROUP_K rows with one pointer per input advanced by `step` (SN_LANES
 * rows), which keeps the pointers in registers. */
#define GROUP_K 8
#define GROUP_ROWS (GROUP_K * SN_LANES)

/* ng groups of GROUP_ROWS rows of x: [ng·GROUP_ROWS, ld], f32 or (bf16) bf16, first ct
 * channels (as stats_rows). */
SN_INLINE void stats_groups_impl(double *restrict l1, double *restrict l2, int64_t ls,
                                 const void *x, int64_t ng, int64_t ld, int64_t ct,
                                 const double *restrict p, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4, step = (uintptr_t)(SN_LANES * ld) * es; /* lane's next row */
  for (int64_t gi = 0; gi < ng; gi++) {
    const int64_t xg = gi * GROUP_ROWS * ld; /* the group's first element */
    for (int lane = 0; lane < SN_LANES; lane++) {
      double *s1 = l1 + lane * ls, *s2 = l2 + lane * ls;
      int64_t c = 0;
      for (; c + SN_VD <= ct; c += SN_VD) {
        sn__vd a1, a2, pc, v;
        SN_VLOAD(a1, s1 + c);
        SN_VLOAD(a2, s2 + c);
        SN_VLOAD(pc, p + c);
        const char *xp = (const char *)x + (uintptr_t)(xg + lane * ld + c) * es;
#pragma GCC unroll 8
        for (int m = 0; m < GROUP_K; m++, xp += step) {
          SN_VLOAD_WIDEN_W(v, xp, 0, bf16);
          v -= pc;
          a1 += v;
          a2 += v * v;
        }
        SN_VSTORE(s1 + c, a1);
        SN_VSTORE(s2 + c, a2);
      }
      for (; c < ct; c++) {
        double a1 = s1[c], a2 = s2[c];
        for (int m = 0; m < GROUP_K; m++) {
          double v = (double)sn__load_w(x, bf16, xg + (m * SN_LANES + lane) * ld + c) - p[c];
          a1 += v;
          a2 += v * v;
        }
        s1[c] = a1, s2[c] = a2;
      }
    }
  }
}
SN_CLONES static void stats_groups(double *restrict l1, double *restrict l2, int64_t ls,
                                   const float *x, int64_t ng, int64_t ld, int64_t ct,
                                   const double *restrict p) {
  stats_groups_impl(l1, l2, ls, x, ng, ld, ct, p, 0);
}
SN_CLONES static void stats_groups_bf16(double *restrict l1, double *restrict l2, int64_t ls,
                                        const uint16_t *x, int64_t ng, int64_t ld, int64_t ct,
                                        const double *restrict p) {
  stats_groups_impl(l1, l2, ls, x, ng, ld, ct, p, 1);
}

/* ng groups of GROUP_ROWS rows of the backward sums (as bwd_rows). */
SN_INLINE void bwd_groups_impl(double *restrict l1, double *restrict l2, int64_t ls,
                               const void *dy, const void *x, int64_t ng, int64_t ld, int64_t ct,
                               const double *restrict m, int bf16) {
  const uintptr_t es = bf16 ? 2 : 4, step = (uintptr_t)(SN_LANES * ld) * es; /* lane's next row */
  for (int64_t gi = 0; gi < ng; gi++) {
    const int64_t g0 = gi * GROUP_ROWS * ld; /* the group's first element */
    for (int lane = 0; lane < SN_LANES; lane++) {
      double *s1 = l1 + lane * ls, *s2 = l2 + lane * ls;
      int64_t c = 0;
      for (; c + SN_VD <= ct; c += SN_VD) {
        sn__vd a1, a2, mc, g, v;
        SN_VLOAD(a1, s1 + c);
        SN_VLOAD(a2, s2 + c);
        SN_VLOAD(mc, m + c);
        const uintptr_t o = (uintptr_t)(g0 + lane * ld + c) * es;
        const char *gp = (const char *)dy + o, *xp = (const char *)x + o;
#pragma GCC unroll 8
        for (int j = 0; j < GROUP_K; j++, gp += step, xp += step) {
          SN_VLOAD_WIDEN_W(g, gp, 0, bf16);
          SN_VLOAD_WIDEN_W(v, xp, 0, bf16);
          a1 += g;
          a2 += g * (v - mc);
        }
        SN_VSTORE(s1 + c, a1);
        SN_VSTORE(s2 + c, a2);
      }
      for (; c < ct; c++) {
        double a1 = s1[c], a2 = s2[c];
        for (int j = 0; j < GROUP_K; j++) {
          const int64_t o = g0 + (j * SN_LANES + lane) * ld + c;
          double g = (double)sn__load_w(dy, bf16, o);
          a1 += g;
          a2 += g * ((double)sn__load_w(x, bf16, o) - m[c]);
        }
        s1[c] = a1, s2[c] = a2;
      }
    }
  }
}
SN_CLONES static void bwd_groups(double *restrict l1, double *restrict l2, int64_t ls,
                                 const float *dy, const float *x, int64_t ng, int64_t ld,
                                 int64_t ct, const double *restrict m) {
  bwd_groups_impl(l1, l2, ls, dy, x, ng, ld, ct, m, 0);
}
SN_CLONES static void bwd_groups_bf16(double *restrict l1, double *restrict l2, int64_t ls,
                                      const uint16_t *dy, const uint16_t *x, int64_t ng,
                                      int64_t ld, int64_t ct, const double *restrict m) {
  bwd_groups_impl(l1, l2, ls, dy, x, ng, ld, ct, m, 1);
}

#endif /* SN_BN_KERNELS_H */
