/*
 * batchnorm_bwd.c — BatchNorm backward (torch.nn.BatchNorm2d's gradients) for one rank's batch:
 * the per-channel sums Σdy and Σdy·x̂, dx from them, and the local backward with dgamma and
 * dbeta. SyncBatchNorm (dist/syncbn.c) all-reduces the sums between the two passes. The
 * reduction and elementwise drivers are batchnorm.c's (batchnorm.h): the sums are taken in the
 * same order as the statistics, bitwise the same for NCHW and NHWC and any thread count.
 *
 * Per channel, with k = gamma·rstd and the sums over count = N·S values:
 *   dx = (dy·k − k·Σdy/count) − (x − mean)·k·rstd·(Σdy·x̂)/count,  x̂ = (x − mean)·rstd
 *   dgamma = Σdy·x̂,  dbeta = Σdy.
 */
#include <string.h>

#include "batchnorm.h"
#include "cpu.h"
#include "norm_kernels.h"

/* The arguments of sn_batchnorm_bwd: dx, dy, x [N, C, S] (NCHW); mean, rstd, gamma [C] (gamma
 * NULL: 1); dgamma, dbeta [C] outputs or NULL. */
typedef struct {
  void *dx;
  float *dgamma, *dbeta;
  const void *dy, *x;
  const double *mean;
  const float *rstd, *gamma;
  int64_t N, C, S;
  sn_dtype_t dtype;
} bn_bwd_t;

/* NCHW, a task per block of cb channels: their backward sums (sn__bn_block_sums), dgamma and
 * dbeta, then dx over the block, while x and dy are still in the cache (the sums prefetch into
 * L2 only, pf_l2). Bitwise sn_batchnorm_bwd_reduce then sn_batchnorm_bwd_apply. */
static void bwd_fused_nchw(const bn_bwd_t *b, int64_t cb) {
  const int64_t N = b->N, C = b->C, S = b->S;
  const bn_chunks_t ch = sn__bn_chunks(N, S);
  const bn_red_t red = {RED_BWD, b->dy, b->x, NULL, b->mean, b->rstd, 1};
  const int stream =
      sn__stream_out_from(N * C * S * (int64_t)sn_dtype_size(b->dtype), SN_BN_DX_STREAM_MIN);
#pragma omp parallel if (N * C * S >= SN_PAR_MIN)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t c0 = 0; c0 < C; c0 += cb) {
      const int64_t nc = sn__min64(cb, C - c0);
      double s1[FUSED_MAX_BLOCK], s2[FUSED_MAX_BLOCK];
      sn__bn_block_sums(&red, &ch, C, c0, nc, NULL, b->dtype, s1, s2);
      sn__chan_k_t kc[FUSED_MAX_BLOCK];
      for (int64_t j = 0; j < nc; j++) { /* every input read before dgamma, dbeta are written */
        const int64_t c = c0 + j;
        s2[j] = sn__bn_bwd_scale(s2[j], b->rstd[c]);
        double k4[4];
        sn__bn_bwd_consts(b->mean[c], b->rstd[c], b->gamma ? (double)b->gamma[c] : 1.0, s1[j],
                          s2[j], (double)(N * S), k4);
        sn__chan_k_set(&kc[j], k4[0], k4[1], k4[2], k4[3]);
      }
      for (int64_t j = 0; j < nc; j++) {
        if (b->dgamma) b->dgamma[c0 + j] = (float)sn__nan_canon(s2[j]);
        if (b->dbeta) b->dbeta[c0 + j] = (float)sn__nan_canon(s1[j]);
      }
      for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < nc; j++)
          sn__affbwd_span(b->dx, b->dy, b->x, (n * C + c0 + j) * S, S, &kc[j], b->dtype, stream);
    }
    sn__stream_fence(stream);
  }
}

/* ---- public entry points ---------------------------------------------------------------------- */

sn_status_t sn_batchnorm_bwd_reduce(double *sum_dy, double *sum_dy_xhat, const void *dy,
                                    const void *x, const double *mean, const float *rstd,
                                    int64_t n, int64_t c, int64_t s, sn_layout_t layout,
                                    sn_dtype_t dtype) {
  static const char fn[] = "sn_batchnorm_bwd_reduce";
  sn__args_t args;
  const sn__bn_call_t call = {.sum_dy = sum_dy, .sum_dy_xhat = sum_dy_xhat, .dy = dy, .x = x,
                              .mean = mean, .rstd = rstd, .n = n, .c = c, .s = s, .layout = layout,
                              .dtype = dtype};
  SN_TRY(sn__bn_bwd_reduce_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) {
    for (int64_t ch = 0; ch < c; ch++) sum_dy[ch] = 0.0, sum_dy_xhat[ch] = 0.0;
    return SN_OK;
  }
  /* Σ dy·x̂ = rstd·Σ dy·(x − mean): one multiply per channel instead of per element. */
  const bn_red_t op = {RED_BWD, dy, x, NULL, mean, rstd, 0};
  return sn__bn_reduce(fn, sum_dy, sum_dy_xhat, &op, n, c, s, layout, dtype);
}

sn_status_t sn_batchnorm_bwd_apply(void *dx, const void *dy, const void *x, const double *mean,
                                   const float *rstd, const float *gamma, const double *sum_dy,
                                   const double *sum_dy_xhat, int64_t count, int64_t n, int64_t c,
                                   int64_t s, sn_layout_t layout, sn_dtype_t dtype) {
  static const char fn[] = "sn_batchnorm_bwd_apply";
  sn__args_t args;
  const sn__bn_call_t call = {.dx = dx, .dy = dy, .x = x, .mean = mean, .rstd = rstd,
                              .gamma = gamma, .sum_dy = sum_dy, .sum_dy_xhat = sum_dy_xhat,
                              .count = count, .n = n, .c = c, .s = s, .layout = layout,
                              .dtype = dtype};
  SN_TRY(sn__bn_bwd_apply_args(&args, fn, &call));
  if (args.rows == 0) return SN_OK;
  const int eval = sum_dy == NULL && sum_dy_xhat == NULL;
  const bn_ew_t op = {.kind = eval ? EW_BWD_EVAL : EW_BWD, .mean = mean, .rstd = rstd,
                   .gamma = gamma, .sum_dy = sum_dy, .sum_dy_xhat = sum_dy_xhat,
                   .count = (double)count};
  sn__bn_ew_run(&op, dx, dy, x, n, c, s, layout, dtype);
  return SN_OK;
}

sn_status_t sn_batchnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                             const double *mean, const float *rstd, const float *gamma, int64_t n,
                             int64_t c, int64_t s, sn_layout_t layout, sn_dtype_t dtype) {
  static const char fn[] = "sn_batchnorm_bwd";
  sn__args_t args;
  const sn__bn_call_t call = {.dx = dx, .dgamma = dgamma, .dbeta = dbeta, .dy = dy, .x = x,
                              .mean = mean, .rstd = rstd, .gamma = gamma, .n = n, .c = c, .s = s,
                              .layout = layout, .dtype = dtype};
  SN_TRY(sn__bn_bwd_args(&args, fn, &call));
  const int64_t rows = args.rows;
  const int64_t cb = sn__bn_fused_block(n, c, s, layout, dtype, 2);
  if (cb > 0) {
    const bn_bwd_t b = {dx, dgamma, dbeta, dy, x, mean, rstd, gamma, n, c, s, dtype};
    bwd_fused_nchw(&b, cb);
    return SN_OK;
  }
  /* the two passes of SyncBatchNorm with nothing to all-reduce between them */
  sn_status_t st;
  double *sums = sn__alloc(fn, 2, c, (int64_t)sizeof(double), &st); /* Σdy, Σdy·x̂ */
  if (sums == NULL) return st;
  const bn_red_t red = {RED_BWD, dy, x, NULL, mean, rstd, 0};
  st = sn__bn_reduce(fn, sums, sums + c, &red, n, c, s, layout, dtype);
  if (st == SN_OK) {
    const bn_ew_t op = {.kind = EW_BWD, .mean = mean, .rstd = rstd, .gamma = gamma,
                     .sum_dy = sums, .sum_dy_xhat = sums + c, .count = (double)rows};
    sn__bn_ew_run(&op, dx, dy, x, n, c, s, layout, dtype);
    for (int64_t ch = 0; ch < c; ch++) {
      if (dgamma) dgamma[ch] = (float)sums[c + ch]; /* sn__bn_reduce's: NaN as NAN */
      if (dbeta) dbeta[ch] = (float)sums[ch];
    }
  }
  sn__free(sums);
  return st;
}
