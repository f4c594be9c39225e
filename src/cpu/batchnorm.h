/*
 * batchnorm.h — what batchnorm.c (statistics, forward, and the reduction and elementwise drivers
 * both directions use) shares with batchnorm_bwd.c (backward). Not installed.
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC), S = H·W; a "row" is one (n, s) position, so each
 * channel has rows = N·S values.
 */
#ifndef SN_BATCHNORM_H
#define SN_BATCHNORM_H

#include "cpu.h"

/* ---- reductions (sn__bn_reduce; order: batchnorm.c) ------------------------------------------- */

typedef enum { RED_STATS, RED_BWD } bn_red_kind_t;

/* What to sum: RED_STATS: out1 = Σ (a − p_c), out2 = Σ (a − p_c)² with p = pivot (NULL = 0);
 * RED_BWD: out1 = Σ a, out2 = rstd_c·Σ a·(b − mean_c) with a = dy, b = x. */
typedef struct {
  bn_red_kind_t kind;
  const void *a, *b;   /* [N, C, S] or [N, S, C], dtype */
  const float *pivot;  /* [C] or NULL (stats) */
  const double *mean;  /* [C] (bwd) */
  const float *rstd;   /* [C] (bwd) */
  int pf_l2;           /* bwd, NCHW: prefetch into L2 only (bwd_run in bn_kernels.h) */
} bn_red_t;

/* The fixed reduction chunks of N samples of S rows, a function of N and S only (sn__bn_chunks):
 * Kmax = clamp(N·S / RED_MIN_ROWS, 1, SN_RED_CHUNKS); N >= Kmax: Kmax chunks of whole samples;
 * else each sample in P = min(S, ⌈Kmax/N⌉) pieces. */
typedef struct {
  int64_t N, S;
  int64_t per; /* pieces per sample, or 0: chunks of whole samples */
  int64_t K;   /* number of chunks */
} bn_chunks_t;

SN_HIDDEN bn_chunks_t sn__bn_chunks(int64_t N, int64_t S);

/* out1, out2: [C] f64 (=), as described at bn_red_t; rows = N·S > 0. Allocates the chunk
 * partials (and NHWC lane scratch) first, so SN_ERR_ALLOC leaves the outputs untouched. */
SN_HIDDEN sn_status_t sn__bn_reduce(const char *fn, double *out1, double *out2,
                                    const bn_red_t *op, int64_t N, int64_t C, int64_t S,
                                    sn_layout_t layout, sn_dtype_t dtype);

/* Σ dy·x̂ = rstd·Σ dy·(x − mean), for sn__bn_reduce and the fused backward alike: one function,
 * not inlined, so both give the same bits even for NaN operands (which of two NaNs a multiply
 * returns depends on the operand order the compiler picks at each site). */
SN_HIDDEN double sn__bn_bwd_scale(double sum, float rstd);

/* ---- elementwise passes (sn__bn_ew_run) ------------------------------------------------------- */

typedef enum { EW_APPLY, EW_INFER, EW_BWD, EW_BWD_EVAL } bn_ew_kind_t;

/* One elementwise pass: out = map(in) (or map(in, x) for EW_BWD) with per-channel constants. */
typedef struct {
  bn_ew_kind_t kind;
  const double *mean;                 /* [C] f64 batch mean (apply, bwd) */
  const float *rstd;                  /* [C] (apply, bwd, bwd eval) */
  const float *rmean, *rvar;          /* [C] running statistics (infer) */
  const float *gamma, *beta;          /* [C] or NULL */
  const double *sum_dy, *sum_dy_xhat; /* [C] global backward sums (bwd) */
  double eps, count;
} bn_ew_t;

/* out [N, C, S] or [N, S, C] = the map of op over in (and x for EW_BWD). Never allocates. */
SN_HIDDEN void sn__bn_ew_run(const bn_ew_t *op, void *out, const void *in, const void *x,
                             int64_t N, int64_t C, int64_t S, sn_layout_t layout,
                             sn_dtype_t dtype);

/* The backward map's fp64 constants k4 = (m, a, b, e) of one channel (dx = (dy·a − b) −
 * (x − m)·e) from its mean, rstd, gamma g and the global sums over count values. */
SN_HIDDEN void sn__bn_bwd_consts(double mean, float rstd, double g, double sum_dy,
                                 double sum_dy_xhat, double count, double k4[4]);

/* ---- fused NCHW passes ------------------------------------------------------------------------ */

/* Most channels in a fused block (the sums of a block are on the stack). */
#define FUSED_MAX_BLOCK 8

/* Channels per task of a fused NCHW pass over `inputs` tensors (1: x; 2: x and dy), or 0 where
 * the two passes run instead. */
SN_HIDDEN int64_t sn__bn_fused_block(int64_t N, int64_t C, int64_t S, sn_layout_t layout,
                                     sn_dtype_t dtype, int64_t inputs);

/* The two sums of channels [c0, c0 + nc) of an NCHW reduction into s1, s2 [nc] (=), bitwise those
 * of sn__bn_reduce. shift: [nc] the channels' shifts, or NULL for their own (pivot or mean). */
SN_HIDDEN void sn__bn_block_sums(const bn_red_t *op, const bn_chunks_t *ch, int64_t C, int64_t c0,
                                 int64_t nc, const double *shift, sn_dtype_t dtype, double *s1,
                                 double *s2);

#endif /* SN_BATCHNORM_H */
