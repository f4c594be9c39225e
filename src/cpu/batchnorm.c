/*
 * batchnorm.c — BatchNorm (Ioffe and Szegedy 2015; torch.nn.BatchNorm2d) statistics and forward
 * for one rank's batch: shifted per-channel sums, finalize, running statistics, apply, the local
 * training forward and inference; and the reduction and elementwise drivers that the backward
 * (batchnorm_bwd.c) shares. SyncBatchNorm (dist/syncbn.c) all-reduces the sums between steps.
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC), S = H·W. A "row" is one (n, s) position: there are
 * rows = N·S values per channel.
 *
 * Reduction order (sn_batchnorm_stats, sn_batchnorm_bwd_reduce). The rows are cut into fixed
 * chunks that never straddle a sample unless a chunk holds whole samples (see sn__bn_chunks): up
 * to 64 chunks of whole samples, or with fewer samples each sample in a few pieces. In a
 * chunk with rows [b, e) the value of row r goes to lane (r − b) mod SN_LANES of its channel, each
 * lane summing in row order from 0; the lanes are added in lane order, then the chunk partials
 * in chunk order. The order depends on N and S only, so NCHW and NHWC give bitwise identical
 * sums, for any thread count.
 *   NCHW: a task is (chunk, channel): runs of planes, the lanes in registers. With pieces of
 *         samples the tasks go in memory order (sample, channel, piece), so each thread streams
 *         through memory.
 *   NHWC: a task is (chunk, channel tile): whole rows, vectorized across channels, with
 *         SN_LANES rows of per-channel accumulators in per-thread scratch.
 * With S == 1 both layouts are the same memory [N, C] and the NHWC code runs.
 *
 * The reduction kernels (NCHW runs, NHWC rows) are in bn_kernels.h.
 *
 * Elementwise passes (apply, infer, bwd_apply) use the shared f32 maps of norm_kernels.h with
 * per-channel constants computed in fp64; NCHW is parallel over planes (split into pieces when
 * there are few), NHWC over blocks of rows. They never allocate: bf16 is read and written in
 * pairs, f16 goes through stack tiles (the reductions' NCHW runs read bf16 as it is, f16 through
 * tiles), so apply and bwd_apply (which run after the all-reduce in SyncBatchNorm) cannot fail
 * on memory.
 */
#include <math.h>
#include <string.h>

#include "batchnorm.h"
#include "bn_kernels.h"
#include "cpu.h"
#include "norm_kernels.h"

/* ---- reduction driver ------------------------------------------------------------------------- */

/* The shift of channel c's sums: its pivot (statistics; none: 0) or its mean (backward). */
static inline double red_shift(const bn_red_t *op, int64_t c) {
  if (op->kind == RED_BWD) return op->mean[c];
  return op->pivot ? (double)op->pivot[c] : 0.0;
}

/* Elements [off, off+n) of one channel's run into acc, lane of the first element `lane`. */
static void red_span(const bn_red_t *op, double *acc, int64_t off, int64_t n, int lane,
                     double shift, sn_dtype_t dtype) {
  if (dtype == SN_DTYPE_BF16) { /* read as is (bn_kernels.h): the same sums as on f32 tiles */
    if (op->kind == RED_STATS)
      stats_run_bf16(acc, (const uint16_t *)op->a + off, n, lane, shift);
    else
      bwd_run_bf16(acc, (const uint16_t *)op->a + off, (const uint16_t *)op->b + off, n, lane,
                   shift, op->pf_l2);
    return;
  }
  float ta[SN_TILE], tb[SN_TILE];
  for (int64_t i = 0; i < n;) {
    int64_t m = dtype == SN_DTYPE_F32 ? n : sn__min64(SN_TILE, n - i);
    const float *pa = sn__in_row(op->a, off + i, m, dtype, ta);
    if (op->kind == RED_STATS) {
      stats_run(acc, pa, m, lane, shift);
    } else {
      const float *pb = sn__in_row(op->b, off + i, m, dtype, tb);
      bwd_run(acc, pa, pb, m, lane, shift, op->pf_l2);
    }
    lane = (int)((lane + m) & LANE_MASK);
    i += m;
  }
}

/* Rows per reduction chunk at least (so that small batches are not cut into tiny tasks). */
#define RED_MIN_ROWS 128

bn_chunks_t sn__bn_chunks(int64_t N, int64_t S) {
  int64_t kmax = N * S / RED_MIN_ROWS;
  kmax = kmax < 1 ? 1 : kmax > SN_RED_CHUNKS ? SN_RED_CHUNKS : kmax;
  bn_chunks_t ch = {N, S, 0, kmax};
  if (N < kmax) {
    const int64_t want = (kmax + N - 1) / N;
    ch.per = want < S ? want : S;
    ch.K = N * ch.per;
  }
  return ch;
}

/* First row of chunk k (k == K gives N·S). */
static int64_t red_begin(const bn_chunks_t *ch, int64_t k) {
  if (ch->per == 0) return sn__chunk_begin(k, ch->N, ch->K) * ch->S;
  const int64_t n = k / ch->per, j = k % ch->per;
  return n * ch->S + sn__chunk_begin(j, ch->S, ch->per);
}

/* The two sums of chunk k of channel c in the NCHW layout, shifted by `shift` (the statistics'
 * pivot, or the backward's mean): its rows, one plane segment at a time, into SN_LANES lanes,
 * then the lanes in lane order. */
static void red_nchw_chunk_at(const bn_red_t *op, const bn_chunks_t *ch, int64_t C, int64_t c,
                              int64_t k, double shift, sn_dtype_t dtype, double out[2]) {
  const int64_t S = ch->S, b = red_begin(ch, k), e = red_begin(ch, k + 1);
  double acc[2 * SN_LANES] = {0};
  for (int64_t r = b; r < e;) {
    const int64_t n = r / S, s0 = r - n * S, len = sn__min64(S - s0, e - r);
    red_span(op, acc, (n * C + c) * S + s0, len, (int)((r - b) & LANE_MASK), shift, dtype);
    r += len;
  }
  double s1 = 0.0, s2 = 0.0;
  for (int l = 0; l < SN_LANES; l++) s1 += acc[l], s2 += acc[SN_LANES + l];
  out[0] = s1, out[1] = s2;
}

/* red_nchw_chunk_at with channel c's own shift (red_shift). */
static void red_nchw_chunk(const bn_red_t *op, const bn_chunks_t *ch, int64_t C, int64_t c,
                           int64_t k, sn_dtype_t dtype, double out[2]) {
  red_nchw_chunk_at(op, ch, C, c, k, red_shift(op, c), dtype, out);
}

/* Chunk partials of the NCHW layout. part: [K][C][2]. */
static void reduce_nchw(const bn_red_t *op, double *part, const bn_chunks_t *ch, int64_t C,
                        sn_dtype_t dtype) {
  const int64_t S = ch->S, K = ch->K, P = ch->per;
#pragma omp parallel for schedule(static) if (ch->N * S * C >= SN_PAR_MIN)
  for (int64_t t = 0; t < K * C; t++) {
    /* task order: (sample, channel, piece) = memory order when chunks are pieces of samples */
    const int64_t k = P ? (t / (C * P)) * P + t % P : t / C, c = P ? (t / P) % C : t % C;
    red_nchw_chunk(op, ch, C, c, k, dtype, part + (k * C + c) * 2);
  }
}

/* Lane stride of the NHWC accumulators: the tile width rounded up to 8 doubles (64 bytes), so
 * every lane row starts on a cache line. */
static int64_t lane_stride(int64_t C) { return (sn__min64(C, SN_TILE_C) + 7) & ~(int64_t)7; }

/* Chunk partials of the NHWC layout. part: [K][C][2]; scratch (64-byte aligned): per thread
 * (2·SN_LANES + 1)·lane_stride(C) doubles. */
static void reduce_nhwc(const bn_red_t *op, double *part, double *scratch, int nt,
                        const bn_chunks_t *ch, int64_t C, sn_dtype_t dtype) {
  const int64_t rows = ch->N * ch->S, K = ch->K;
  const int64_t ls = lane_stride(C), tiles = (C + SN_TILE_C - 1) / SN_TILE_C;
#pragma omp parallel num_threads(nt) if (rows * C >= SN_PAR_MIN)
  {
    double *l1 = scratch + (int64_t)sn__thread_num() * (2 * SN_LANES + 1) * ls;
    double *l2 = l1 + SN_LANES * ls, *shift = l2 + SN_LANES * ls; /* [8][ls], [8][ls], [ls] */
    float ta[SN_TILE], tb[SN_TILE];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < K * tiles; t++) {
      const int64_t k = t / tiles, c0 = (t % tiles) * SN_TILE_C, ct = sn__min64(SN_TILE_C, C - c0);
      const int64_t b = red_begin(ch, k), e = red_begin(ch, k + 1);
      memset(l1, 0, (size_t)(2 * SN_LANES * ls) * sizeof(double)); /* l1 and l2 */
      for (int64_t j = 0; j < ct; j++) shift[j] = red_shift(op, c0 + j);
      /* grouped kernels from 128 channels on: faster than the row kernels there, slower at 64 */
      const int grouped = ls >= 128;
      if (dtype == SN_DTYPE_BF16) { /* the rows as they are (bn_kernels.h), as f32 in one block */
        const int64_t ng = grouped ? (e - b) / GROUP_ROWS : 0, done = ng * GROUP_ROWS;
        const uint16_t *pa = (const uint16_t *)op->a + b * C + c0;
        const int rest = e - b > done; /* rows after the groups (no pointer past the end) */
        if (op->kind == RED_STATS) {
          if (ng) stats_groups_bf16(l1, l2, ls, pa, ng, C, ct, shift);
          if (rest) stats_rows_bf16(l1, l2, ls, pa + done * C, e - b - done, C, ct, shift, 0);
        } else {
          const uint16_t *pb = (const uint16_t *)op->b + b * C + c0;
          if (ng) bwd_groups_bf16(l1, l2, ls, pa, pb, ng, C, ct, shift);
          if (rest)
            bwd_rows_bf16(l1, l2, ls, pa + done * C, pb + done * C, e - b - done, C, ct, shift, 0);
        }
      } else {
        int64_t per = sn__rows_per_block(e - b, C, ct, dtype);
        if (per > GROUP_ROWS && per < e - b) per -= per % GROUP_ROWS; /* blocks of whole groups */
        int lane = 0;
        for (int64_t r = b; r < e; r += per) {
          const int64_t nr = sn__min64(per, e - r), off = r * C + c0, span = (nr - 1) * C + ct;
          const int64_t ng = grouped && lane == 0 ? nr / GROUP_ROWS : 0, done = ng * GROUP_ROWS;
          const float *pa = sn__in_row(op->a, off, span, dtype, ta);
          if (op->kind == RED_STATS) {
            if (ng) stats_groups(l1, l2, ls, pa, ng, C, ct, shift);
            lane = stats_rows(l1, l2, ls, pa + done * C, nr - done, C, ct, shift, lane);
          } else {
            const float *pb = sn__in_row(op->b, off, span, dtype, tb);
            if (ng) bwd_groups(l1, l2, ls, pa, pb, ng, C, ct, shift);
            lane = bwd_rows(l1, l2, ls, pa + done * C, pb + done * C, nr - done, C, ct, shift,
                            lane);
          }
        }
      }
      for (int64_t j = 0; j < ct; j++) { /* lanes in lane order, as in reduce_nchw */
        double s1 = 0.0, s2 = 0.0;
        for (int l = 0; l < SN_LANES; l++) s1 += l1[l * ls + j], s2 += l2[l * ls + j];
        part[(k * C + c0 + j) * 2 + 0] = s1;
        part[(k * C + c0 + j) * 2 + 1] = s2;
      }
    }
  }
}

__attribute__((noinline)) double sn__bn_bwd_scale(double sum, float rstd) {
  return sum * (double)rstd;
}

sn_status_t sn__bn_reduce(const char *fn, double *out1, double *out2, const bn_red_t *op,
                          int64_t N, int64_t C, int64_t S, sn_layout_t layout, sn_dtype_t dtype) {
  const bn_chunks_t ch = sn__bn_chunks(N, S);
  const int64_t K = ch.K;
  const int nt = sn__max_threads();
  const int nhwc = layout == SN_LAYOUT_NHWC || S == 1;
  sn_status_t st;
  double *part = sn__alloc(fn, K, 2 * C, (int64_t)sizeof(double), &st), *scratch = NULL;
  if (part == NULL) return st;
  if (nhwc) {
    scratch = sn__alloc(fn, nt, (2 * SN_LANES + 1) * lane_stride(C), (int64_t)sizeof(double), &st);
    if (scratch == NULL) {
      sn__free(part);
      return st;
    }
    reduce_nhwc(op, part, scratch, nt, &ch, C, dtype);
  } else {
    reduce_nchw(op, part, &ch, C, dtype);
  }
#pragma omp parallel for schedule(static) if (C * K >= SN_PAR_MIN)
  for (int64_t c = 0; c < C; c++) { /* chunk partials in chunk order */
    double s1 = 0.0, s2 = 0.0;
    for (int64_t k = 0; k < K; k++) s1 += part[(k * C + c) * 2 + 0], s2 += part[(k * C + c) * 2 + 1];
    out1[c] = sn__nan_canon(s1); /* NaN sums as one NaN, as the fused passes' (sn__nan_canon) */
    out2[c] = sn__nan_canon(op->kind == RED_BWD ? sn__bn_bwd_scale(s2, op->rstd[c]) : s2);
  }
  sn__free(scratch);
  sn__free(part);
  return SN_OK;
}

/* ---- elementwise driver ------------------------------------------------------------------------ */

void sn__bn_bwd_consts(double mean, float rstd, double g, double sum_dy, double sum_dy_xhat,
                       double count, double k4[4]) {
  const double k = g * (double)rstd;
  k4[0] = mean;
  k4[1] = k;
  k4[2] = k * (sum_dy / count);
  k4[3] = k * (double)rstd * (sum_dy_xhat / count);
}

/* The fp64 constants (m, a, b, e) of channel c for the maps of norm_kernels.h
 * (y = (x − m)·a + b, dx = (dy·a − b) − (x − m)·e; sn__chan_k_set rounds them for the f32 maps):
 *   apply:    m = mean, a = gamma·rstd, b = beta
 *   infer:    m = running_mean, a = gamma/√(running_var + eps), b = beta
 *   bwd:      k = gamma·rstd: a = k, b = k·Σdy/count, e = k·rstd·Σdy·x̂/count, m = mean
 *   bwd eval: dx = dy·gamma·rstd, run as the forward map of dy with m = b = 0. */
static void ew_consts(const bn_ew_t *op, int64_t c, double k4[4]) {
  const double g = op->gamma ? (double)op->gamma[c] : 1.0;
  double m = 0.0, a = 0.0, b = 0.0, e = 0.0;
  switch (op->kind) {
    case EW_APPLY:
      m = op->mean[c];
      a = g * (double)op->rstd[c];
      b = op->beta ? op->beta[c] : 0.0;
      break;
    case EW_INFER:
      m = op->rmean[c];
      a = g / sqrt((double)op->rvar[c] + op->eps);
      b = op->beta ? op->beta[c] : 0.0;
      break;
    case EW_BWD:
      sn__bn_bwd_consts(op->mean[c], op->rstd[c], g, op->sum_dy[c], op->sum_dy_xhat[c], op->count, k4);
      return;
    case EW_BWD_EVAL:
      a = g * (double)op->rstd[c];
      break;
  }
  k4[0] = m, k4[1] = a, k4[2] = b, k4[3] = e;
}

/* The maps' nt for an elementwise pass of op writing out_bytes: streamed and, as its inputs
 * come from memory, prefetched (SN_NT_PREFETCH), or neither. The training backward's dx streams
 * by default from SN_BN_DX_STREAM_MIN (cpu.h). */
static int ew_stream(const bn_ew_t *op, int64_t out_bytes) {
  const int64_t dflt = op->kind == EW_BWD ? SN_BN_DX_STREAM_MIN : INT64_MAX;
  return sn__stream_out_from(out_bytes, dflt) ? SN_NT_STREAM | SN_NT_PREFETCH : 0;
}

/* NCHW: tasks are planes (n, c), cut into pieces when there are fewer than 4 per thread (any
 * split gives the same bits: the map is elementwise). */
static void ew_nchw(const bn_ew_t *op, void *out, const void *in, const void *x, int64_t N,
                    int64_t C, int64_t S, sn_dtype_t dtype) {
  const int64_t planes = N * C, want = 4 * (int64_t)sn__max_threads();
  int64_t pieces = 1;
  if (planes < want) {
    const int64_t most = S / 4096 > 1 ? S / 4096 : 1; /* pieces of at least 4096 elements */
    pieces = sn__min64((want + planes - 1) / planes, most);
  }
  const int stream = ew_stream(op, planes * S * (int64_t)sn_dtype_size(dtype));
#pragma omp parallel if (planes * S >= SN_PAR_MIN)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < planes * pieces; t++) {
      const int64_t plane = t / pieces, piece = t % pieces;
      const int64_t b = sn__chunk_begin(piece, S, pieces);
      const int64_t e = sn__chunk_begin(piece + 1, S, pieces);
      double k4[4];
      sn__chan_k_t k;
      ew_consts(op, plane % C, k4);
      sn__chan_k_set(&k, k4[0], k4[1], k4[2], k4[3]);
      if (op->kind == EW_BWD) sn__affbwd_span(out, in, x, plane * S + b, e - b, &k, dtype, stream);
      else sn__aff_span(out, in, plane * S + b, e - b, &k, dtype, stream);
    }
    sn__stream_fence(stream);
  }
}

/* NHWC (and S == 1): for each channel tile every thread builds the constants, then the rows are
 * shared out in blocks of about 16K elements. */
static void ew_nhwc(const bn_ew_t *op, void *out, const void *in, const void *x, int64_t rows,
                    int64_t C, sn_dtype_t dtype) {
  const int64_t rb = sn__min64(C, SN_TILE_C) >= 16384 ? 1 : 16384 / sn__min64(C, SN_TILE_C);
  const int64_t blocks = (rows + rb - 1) / rb;
  const int stream = ew_stream(op, rows * C * (int64_t)sn_dtype_size(dtype));
#pragma omp parallel if (rows * C >= SN_PAR_MIN)
  {
    sn__chan_tile_t p;
    for (int64_t c0 = 0; c0 < C; c0 += SN_TILE_C) {
      const int64_t ct = sn__min64(SN_TILE_C, C - c0);
      for (int64_t j = 0; j < ct; j++) {
        double k4[4];
        ew_consts(op, c0 + j, k4);
        sn__tile_set(&p, j, k4[0], k4[1], k4[2], k4[3]);
      }
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t r0 = blk * rb, r1 = sn__min64(rows, r0 + rb);
        if (op->kind == EW_BWD)
          sn__affbwd_rowspan(out, in, x, r0, r1, C, c0, ct, &p, dtype, stream);
        else
          sn__aff_rowspan(out, in, r0, r1, C, c0, ct, &p, dtype, stream);
      }
    }
    sn__stream_fence(stream);
  }
}

void sn__bn_ew_run(const bn_ew_t *op, void *out, const void *in, const void *x, int64_t N,
                   int64_t C, int64_t S, sn_layout_t layout, sn_dtype_t dtype) {
  if (layout == SN_LAYOUT_NHWC || S == 1)
    ew_nhwc(op, out, in, x, N * S, C, dtype);
  else
    ew_nchw(op, out, in, x, N, C, S, dtype);
}

/* ---- fused NCHW passes ----------------------------------------------------------------------- */

/* Bytes of one sample's run of a block of channels that the fused passes aim for (fewer where
 * FUSED_MAX_BLOCK planes are shorter, or the block would not fit in L2): a single 28×28 f32 plane
 * is a 3 KiB run, too short for the hardware prefetcher. */
#define FUSED_RUN_BYTES 12288

/* NHWC (and S == 1) never fuses; NCHW fuses where all the inputs fit in the threads' L2s and one
 * channel's in a core's L2, so that the map reads them again from there (cpu.h), and where the
 * blocks share evenly enough between the threads. */
int64_t sn__bn_fused_block(int64_t N, int64_t C, int64_t S, sn_layout_t layout, sn_dtype_t dtype,
                           int64_t inputs) {
  if (layout == SN_LAYOUT_NHWC || S == 1) return 0;
  const int64_t nt = sn__max_threads(), es = sn_dtype_size(dtype), l2 = sn__l2_bytes();
  const int64_t chan = inputs * N * S * es; /* the inputs of one channel */
  if (chan > l2 || chan > l2 * nt / C) return 0;
  int64_t cb = (FUSED_RUN_BYTES + S * es - 1) / (S * es);
  cb = sn__min64(sn__min64(cb, FUSED_MAX_BLOCK), l2 / chan);
  const int64_t tasks = (C + cb - 1) / cb;
  if (tasks % nt != 0 && tasks < 4 * nt) return 0;
  return cb;
}

/* Chunk by chunk, the block's channels one after another, so where a chunk is one sample the
 * block's part of it is one run; each chunk's lanes, then the chunks in chunk order, as
 * sn__bn_reduce adds them. */
void sn__bn_block_sums(const bn_red_t *op, const bn_chunks_t *ch, int64_t C, int64_t c0,
                       int64_t nc, const double *shift, sn_dtype_t dtype, double *s1, double *s2) {
  for (int64_t j = 0; j < nc; j++) s1[j] = 0.0, s2[j] = 0.0;
  for (int64_t k = 0; k < ch->K; k++)
    for (int64_t j = 0; j < nc; j++) {
      double part[2];
      red_nchw_chunk_at(op, ch, C, c0 + j, k, shift ? shift[j] : red_shift(op, c0 + j), dtype,
                        part);
      s1[j] += part[0], s2[j] += part[1];
    }
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Channel c's statistics from its shifted sums over count values, p its pivot, into mean[c],
 * var[c] (unless var is NULL) and rstd[c]: mean = p + d, var = sumsq/count − d² (biased,
 * clamped at 0), rstd = 1/√(var + eps), with d = sum/count (inv = 1/count):
 * sn_batchnorm_finalize's formula, and the fused forward's. */
static void finalize_channel(double sum, double sumsq, double p, double inv, float eps, int64_t c,
                             double *mean, float *var, float *rstd) {
  const double d = sum * inv;      /* mean − pivot */
  double v = sumsq * inv - d * d;  /* biased variance; fp64 cancellation only */
  if (v < 0.0) v = 0.0;            /* rounding can leave a tiny negative */
  mean[c] = sn__nan_canon(p + d); /* NaN statistics as one NaN (sn__nan_canon) */
  if (var) var[c] = (float)sn__nan_canon(v);
  rstd[c] = (float)sn__nan_canon(1.0 / sqrt(v + (double)eps));
}

int sn__bn_refine(double sum, double sumsq, double count, float pivot, int round,
                  float *refined) {
  if (!isfinite(pivot)) { /* finite data summed around it gives inf/NaN sums: around 0 */
    *refined = 0.0f;
    return 1;
  }
  const double m = sum / count, v = sumsq / count - m * m;
  if (round > SN_BN_REFINE_ROUNDS || !(m != 0.0 && m * m > v * SN_BN_REFINE_RATIO))
    return 0; /* NaN sums: no */
  *refined = round != 2 ? (float)((double)pivot + m) : pivot != 0.0f ? 0.0f : (float)m;
  return 1;
}

int sn__bn_refine_pivots(float *out, const double *sum, const double *sumsq, const float *pivot,
                         int64_t c, double count, int round) {
  int any = 0;
  for (int64_t ch = 0; ch < c; ch++) {
    out[ch] = pivot ? pivot[ch] : 0.0f;
    any |= sn__bn_refine(sum[ch], sumsq[ch], count, out[ch], round, &out[ch]);
  }
  return any;
}

/* The arguments of sn_batchnorm_fwd: x, y [N, C, S] (NCHW); pivot, gamma, beta [C] or NULL;
 * mean, var, rstd [C] outputs. */
typedef struct {
  void *y;
  double *mean;
  float *var, *rstd;
  const void *x;
  const float *pivot, *gamma, *beta;
  int64_t N, C, S;
  float eps;
  sn_dtype_t dtype;
} bn_fwd_t;

/* NCHW, a task per block of cb channels: their shifted sums (sn__bn_block_sums), the channels
 * whose sums lost too much to cancellation summed again around their refined pivot
 * (sn__bn_refine), the statistics (finalize_channel), then y over the block, while x is still in
 * the cache. Bitwise sn_batchnorm_fwd's unfused path. */
static void fwd_fused_nchw(const bn_fwd_t *f, int64_t cb) {
  const int64_t N = f->N, C = f->C, S = f->S;
  const float *pv = f->pivot;
  const bn_chunks_t ch = sn__bn_chunks(N, S);
  const bn_red_t red = {RED_STATS, f->x, NULL, pv, NULL, NULL, 0};
  const double count = (double)(N * S), inv = 1.0 / count;
  const int stream = sn__stream_out(N * C * S * (int64_t)sn_dtype_size(f->dtype));
#pragma omp parallel if (N * C * S >= SN_PAR_MIN)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t c0 = 0; c0 < C; c0 += cb) {
      const int64_t nc = sn__min64(cb, C - c0);
      double s1[FUSED_MAX_BLOCK], s2[FUSED_MAX_BLOCK], p[FUSED_MAX_BLOCK];
      sn__bn_block_sums(&red, &ch, C, c0, nc, NULL, f->dtype, s1, s2);
      for (int64_t j = 0; j < nc; j++) {
        float rp = pv ? pv[c0 + j] : 0.0f;
        p[j] = (double)rp;
        for (int round = 1; sn__bn_refine(s1[j], s2[j], count, rp, round, &rp); round++) {
          p[j] = (double)rp; /* this channel summed again around it */
          sn__bn_block_sums(&red, &ch, C, c0 + j, 1, &p[j], f->dtype, &s1[j], &s2[j]);
        }
      }
      sn__chan_k_t kc[FUSED_MAX_BLOCK];
      for (int64_t j = 0; j < nc; j++) {
        const int64_t c = c0 + j;
        finalize_channel(s1[j], s2[j], p[j], inv, f->eps, c, f->mean, f->var, f->rstd);
        const double g = f->gamma ? (double)f->gamma[c] : 1.0;
        const double b = f->beta ? (double)f->beta[c] : 0.0;
        sn__chan_k_set(&kc[j], f->mean[c], g * (double)f->rstd[c], b, 0.0); /* ew_consts' apply */
      }
      for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < nc; j++)
          sn__aff_span(f->y, f->x, (n * C + c0 + j) * S, S, &kc[j], f->dtype, stream);
    }
    sn__stream_fence(stream);
  }
}

/* ---- public entry points ---------------------------------------------------------------------- */

sn_status_t sn_batchnorm_stats(double *sum, double *sumsq, const void *x, const float *pivot,
                               int64_t n, int64_t c, int64_t s, sn_layout_t layout,
                               sn_dtype_t dtype) {
  static const char fn[] = "sn_batchnorm_stats";
  sn__args_t args;
  const sn__bn_call_t call = {.sum = sum, .sumsq = sumsq, .x = x, .pivot = pivot, .n = n, .c = c,
                              .s = s, .layout = layout, .dtype = dtype};
  SN_TRY(sn__bn_stats_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) { /* an empty local batch contributes zero sums */
    for (int64_t ch = 0; ch < c; ch++) sum[ch] = 0.0, sumsq[ch] = 0.0;
    return SN_OK;
  }
  const bn_red_t op = {RED_STATS, x, NULL, pivot, NULL, NULL, 0};
  return sn__bn_reduce(fn, sum, sumsq, &op, n, c, s, layout, dtype);
}

sn_status_t sn_batchnorm_finalize(double *mean, float *var, float *rstd, const double *sum,
                                  const double *sumsq, const float *pivot, int64_t count,
                                  int64_t c, float eps) {
  static const char fn[] = "sn_batchnorm_finalize";
  sn__args_t args;
  const sn__bn_call_t call = {.mean = mean, .var = var, .rstd = rstd, .sum = sum, .sumsq = sumsq,
                              .pivot = pivot, .count = count, .c = c, .eps = eps};
  SN_TRY(sn__bn_finalize_args(&args, fn, &call));
  const double inv = 1.0 / (double)count;
  for (int64_t ch = 0; ch < c; ch++)
    finalize_channel(sum[ch], sumsq[ch], pivot ? (double)pivot[ch] : 0.0, inv, eps, ch, mean, var,
                     rstd);
  return SN_OK;
}

sn_status_t sn_batchnorm_update_running(float *running_mean, float *running_var,
                                        int64_t *num_batches_tracked, const double *mean,
                                        const float *var, int64_t count, int64_t c,
                                        float momentum) {
  static const char fn[] = "sn_batchnorm_update_running";
  sn__args_t args;
  const sn__bn_call_t call = {.running_mean = running_mean, .running_var = running_var,
                              .num_batches_tracked = num_batches_tracked, .mean = mean, .var = var,
                              .count = count, .c = c, .momentum = momentum};
  SN_TRY(sn__bn_update_running_args(&args, fn, &call));
  if (num_batches_tracked != NULL && *num_batches_tracked < 0) /* 1/0 or a negative factor */
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: num_batches_tracked must be >= 0, got %lld", fn,
                    (long long)*num_batches_tracked);
  const int cumulative = momentum == SN_MOMENTUM_CUMULATIVE;
  /* saturates: a checkpoint can hold any int64 (INT64_MAX + 1 would be undefined behaviour) */
  if (num_batches_tracked != NULL && *num_batches_tracked < INT64_MAX) *num_batches_tracked += 1;
  if (count == 0) return SN_OK; /* an empty batch is counted, nothing else */
  const double f = cumulative ? 1.0 / (double)*num_batches_tracked : (double)momentum;
  const double unbias = (double)count / (double)(count - 1);
  for (int64_t ch = 0; ch < c; ch++) {
    running_mean[ch] = (float)((1.0 - f) * running_mean[ch] + f * mean[ch]);
    running_var[ch] = (float)((1.0 - f) * running_var[ch] + f * (double)var[ch] * unbias);
  }
  return SN_OK;
}

sn_status_t sn_batchnorm_apply(void *y, const void *x, const double *mean, const float *rstd,
                               const float *gamma, const float *beta, int64_t n, int64_t c,
                               int64_t s, sn_layout_t layout, sn_dtype_t dtype) {
  static const char fn[] = "sn_batchnorm_apply";
  sn__args_t args;
  const sn__bn_call_t call = {.y = y, .x = x, .mean = mean, .rstd = rstd, .gamma = gamma,
                              .beta = beta, .n = n, .c = c, .s = s, .layout = layout,
                              .dtype = dtype};
  SN_TRY(sn__bn_apply_args(&args, fn, &call));
  if (args.rows == 0) return SN_OK;
  const bn_ew_t op = {.kind = EW_APPLY, .mean = mean, .rstd = rstd, .gamma = gamma, .beta = beta};
  sn__bn_ew_run(&op, y, x, NULL, n, c, s, layout, dtype);
  return SN_OK;
}

sn_status_t sn_batchnorm_fwd(void *y, double *mean, float *var, float *rstd, const void *x,
                             const float *pivot, const float *gamma, const float *beta,
                             int64_t n, int64_t c, int64_t s, float eps, sn_layout_t layout,
                             sn_dtype_t dtype) {
  static const char fn[] = "sn_batchnorm_fwd";
  sn__args_t args;
  const sn__bn_call_t call = {.y = y, .mean = mean, .var = var, .rstd = rstd, .x = x,
                              .pivot = pivot, .gamma = gamma, .beta = beta, .n = n, .c = c, .s = s,
                              .eps = eps, .layout = layout, .dtype = dtype};
  SN_TRY(sn__bn_fwd_args(&args, fn, &call));
  const int64_t rows = args.rows;
  const int64_t cb = sn__bn_fused_block(n, c, s, layout, dtype, 1);
  if (cb > 0) {
    const bn_fwd_t f = {y, mean, var, rstd, x, pivot, gamma, beta, n, c, s, eps, dtype};
    fwd_fused_nchw(&f, cb);
    return SN_OK;
  }
  /* stats, the refinement, finalize and apply: SyncBatchNorm's steps with no all-reduce */
  sn_status_t st;
  double *sums = sn__alloc(fn, 2, c, (int64_t)sizeof(double), &st); /* Σ(x − p), Σ(x − p)² */
  float *pv = sums ? sn__alloc(fn, 1, c, (int64_t)sizeof(float), &st) : NULL;
  if (pv == NULL) {
    sn__free(sums);
    return st;
  }
  const bn_red_t first = {RED_STATS, x, NULL, pivot, NULL, NULL, 0};
  const bn_red_t again = {RED_STATS, x, NULL, pv, NULL, NULL, 0}; /* around the refined pivots */
  st = sn__bn_reduce(fn, sums, sums + c, &first, n, c, s, layout, dtype);
  for (int round = 1; st == SN_OK && sn__bn_refine_pivots(pv, sums, sums + c,
                                                          round == 1 ? pivot : pv, c,
                                                          (double)rows, round);
       round++)
    st = sn__bn_reduce(fn, sums, sums + c, &again, n, c, s, layout, dtype);
  /* cannot fail: count > 1, eps and the pointers were checked */
  if (st == SN_OK) st = sn_batchnorm_finalize(mean, var, rstd, sums, sums + c, pv, rows, c, eps);
  if (st == SN_OK) {
    const bn_ew_t op = {.kind = EW_APPLY, .mean = mean, .rstd = rstd, .gamma = gamma, .beta = beta};
    sn__bn_ew_run(&op, y, x, NULL, n, c, s, layout, dtype);
  }
  sn__free(pv);
  sn__free(sums);
  return st;
}

sn_status_t sn_batchnorm_infer(void *y, const void *x, const float *running_mean,
                               const float *running_var, const float *gamma, const float *beta,
                               int64_t n, int64_t c, int64_t s, float eps, sn_layout_t layout,
                               sn_dtype_t dtype) {
  static const char fn[] = "sn_batchnorm_infer";
  sn__args_t args;
  const sn__bn_call_t call = {.y = y, .x = x, .running_mean = running_mean,
                              .running_var = running_var, .gamma = gamma, .beta = beta, .n = n,
                              .c = c, .s = s, .eps = eps, .layout = layout, .dtype = dtype};
  SN_TRY(sn__bn_infer_args(&args, fn, &call));
  if (args.rows == 0) return SN_OK;
  SN_TRY(sn__check_running_var(fn, running_var, c));
  const bn_ew_t op = {.kind = EW_INFER, .rmean = running_mean, .rvar = running_var,
                   .gamma = gamma, .beta = beta, .eps = (double)eps};
  sn__bn_ew_run(&op, y, x, NULL, n, c, s, layout, dtype);
  return SN_OK;
}
