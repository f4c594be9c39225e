/*
 * groupnorm.h — what groupnorm.c (the NHWC sums by pieces of a sample, and the forward) shares
 * with groupnorm_bwd.c (backward). Not installed.
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC), S = H·W; G groups of Cg = C/G consecutive
 * channels.
 */
#ifndef SN_GROUPNORM_H
#define SN_GROUPNORM_H

#include "cpu.h"
#include "norm_kernels.h"

/* Per-thread scratch of n doubles, rounded up to whole cache lines (8 doubles). */
static inline int64_t gn_per_thread(int64_t n) {
  return sn__line_stride(n, (int64_t)sizeof(double));
}

/* The NHWC sums of a sample are taken in pieces: its S rows are cut into gn_pieces(S) runs of
 * consecutive rows, each summed from zero, and the pieces' sums are added in piece order. The
 * pieces depend on S only, so the bits do not depend on which thread sums which piece: a sample
 * too large for one core's L2 (or a batch of fewer samples than threads) can be shared by the
 * whole team, each thread summing and then mapping its own pieces while they are in its L2. */
#define GN_PIECES 8

static inline int64_t gn_pieces(int64_t S) { return S < GN_PIECES ? S : GN_PIECES; }

/* First row, from the sample's start, of piece p of the P pieces of S rows (p = P: S). */
static inline int64_t gn_piece_row(int64_t S, int64_t P, int64_t p) {
  return p * (S / P) + sn__min64(p, S % P);
}

/* The NHWC passes give each thread a scratch block of O(C) doubles (the per-channel sums of the
 * sample it works on). The blocks together stay within GN_SCRATCH_MAX bytes, or one block where
 * a single one is larger: with more channels than that allows, fewer threads run the call (the
 * bits do not depend on the thread count), so the scratch does not grow with threads × C. */
#define GN_SCRATCH_MAX ((int64_t)64 << 20)

/* The threads an NHWC pass runs with, of sn__max_threads(), for blocks of `block` doubles each;
 * *bt: those of them that can run at once (sn__concurrent_threads), <= the result. */
static inline int gn_nhwc_threads(int64_t block, int *bt) {
  const int64_t fit = GN_SCRATCH_MAX / (block * (int64_t)sizeof(double));
  const int max = sn__max_threads(), ct = sn__concurrent_threads();
  const int nt = fit < 1 ? 1 : fit < max ? (int)fit : max;
  *bt = ct < nt ? ct : nt;
  return nt;
}

/* The most rows of a sample that one thread of a team of T sums and maps when the team shares
 * it: its pieces [t·P/T, (t+1)·P/T) of the P = gn_pieces(S), at most ⌈P/T⌉ (one where T > P,
 * and then T − P threads have none), each of at most ⌈S/P⌉ rows. */
static inline int64_t gn_share_rows(int64_t S, int64_t T) {
  const int64_t P = gn_pieces(S);
  return (P + T - 1) / T * ((S + P - 1) / P);
}

/* The nt flags of an NHWC map pass (the forward's y, the backward's dx), called inside the
 * parallel region: stream0 (sn__stream_out of the whole output), with SN_NT_PREFETCH added
 * where the `inputs` tensors (1: x; 2: x and dy) of this thread's rows of a sample (S rows, or
 * gn_share_rows when the team shares the sample) exceed its L2: the pass then reads them from
 * memory a second time (after the sums), so it prefetches them, as the BatchNorm maps do. */
static inline int gn_map_nt(int stream0, int shared, int64_t S, int64_t C, int64_t es,
                            int64_t inputs) {
  const int64_t rows = shared ? gn_share_rows(S, sn__team_size()) : S;
  return stream0 && inputs * rows * C * es > sn__l2_bytes() ? stream0 | SN_NT_PREFETCH : stream0;
}

/* The column sums of NHWC rows, per channel (fp64; m: [C] per-channel shifts or means):
 *   GN_SUM_X:       acc[c] += x                                             acc [C]
 *   GN_SUM_SQ:      acc[c] += (x − m[c])²                                   acc [C]
 *   GN_SUM_BWD:     d = x − m[c]: acc[c] += d, acc[C + c] += dy,
 *                   acc[2C + c] += dy·d                                     acc [3][C]
 *   GN_SUM_SHIFTED: acc[c] += x − m[c], acc[C + c] += (x − m[c])²           acc [2][C] */
typedef enum { GN_SUM_X, GN_SUM_SQ, GN_SUM_BWD, GN_SUM_SHIFTED } gn_sum_kind_t;

/* One sample of an NHWC activation as the sums by pieces see it. */
typedef struct {
  const void *x, *dy; /* [N, S, C] dtype; dy for GN_SUM_BWD only */
  int64_t S, C;
  sn_dtype_t dtype;
  int64_t r0;     /* the sample's first row (n·S) */
  int64_t p0, p1; /* the pieces [p0, p1) this thread sums */
  /* shared: the team's piece sums [gn_pieces(S)][width], every thread of the team calling with
   * its own pieces; else this thread's [width] */
  double *part;
  int shared;
} gn_sample_t;

/* acc [width] (=) = the sums of `kind` over all the sample's rows, piece by piece in piece
 * order. With sm->shared every thread of the team calls it (a barrier inside) and all get the
 * same acc. */
SN_HIDDEN void sn__gn_sample_sums(const gn_sample_t *sm, gn_sum_kind_t kind, double *acc,
                                  int64_t width, const double *m);

#endif /* SN_GROUPNORM_H */
