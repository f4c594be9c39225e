/*
 * syncbn_host.c — SyncBatchNorm's kernels on host memory (sn_syncbn_mem_t, syncbn_internal.h):
 * the CPU BatchNorm steps of syncnorm.h on the layer's host arrays. syncbn.c calls them in its
 * control flow; the all-reduces and checks are there.
 *
 * Forward sums are shifted by a pivot p (fp64 Σ(x−p), Σ(x−p)²: Chan, Golub & LeVeque 1983), the
 * previous synchronized batch mean, identical on every rank; two hashes of it ride in the
 * all-reduce (pivot_slots), so ranks that summed around different pivots (a checkpoint loaded on
 * some ranks only) are seen and all redo the sums around 0. Where p was so far off that fp64
 * lost more than 24 bits, every rank sees it in the same reduced sums and the sums are redone
 * around the mean (refine, sn__bn_refine_pivots). With nothing to all-reduce, local_forward and
 * local_backward are sn_batchnorm_fwd / sn_batchnorm_bwd (fused where a channel fits in L2), with
 * the same bits as the separate steps.
 */
#include <math.h>
#include <string.h>

#include "syncbn_internal.h"

static double *host_red(const sn_syncbn_t *bn) { return bn->red; }

static void host_params(const sn_syncbn_t *bn, sn_syncbn_params_t *p) {
  p->weight = bn->weight, p->bias = bn->bias;
  p->grad_weight = bn->grad_weight, p->grad_bias = bn->grad_bias;
  p->running_mean = bn->running_mean, p->running_var = bn->running_var;
  p->num_batches_tracked =
      bn->cfg.track_running_stats ? (int64_t *)&bn->num_batches_tracked : NULL;
  p->num_features = bn->C;
}

static void host_spans(const sn_syncbn_t *bn, sn__dev_span_t span[3]) {
  (void)bn;
  for (int i = 0; i < 3; i++) span[i] = (sn__dev_span_t){NULL, 0};
}

static sn_status_t host_nothing(sn_syncbn_t *bn) {
  (void)bn;
  return SN_OK;
}

static sn_status_t host_prepare(sn_syncbn_t *bn, const char *fn, int forward, int update,
                                int64_t n, int64_t s) {
  (void)n, (void)s;
  if (!forward) return SN_OK;
  if (update && bn->num_batches_tracked < 0) /* written through sn_syncbn_params */
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: %s: num_batches_tracked must be >= 0, got %lld",
                    fn, bn->label, (long long)bn->num_batches_tracked);
  /* A batch with NaN/Inf (check_finite off) or a checkpoint's non-finite running_mean leaves a
   * non-finite pivot, which would make the sums of every later batch NaN: restart such channels
   * from 0. The pivot is identical on every rank, so every rank resets the same channels. */
  for (int64_t c = 0; c < bn->C; c++)
    if (!isfinite(bn->pivot[c])) bn->pivot[c] = 0.0f;
  return SN_OK;
}

static sn_status_t host_sums(sn_syncbn_t *bn, const char *fn, const void *x, int64_t n,
                             int64_t s, int refined) {
  (void)fn;
  const int64_t C = bn->C;
  const float *pivot = refined ? bn->tmp : bn->pivot;
  SN_TRY(sn_batchnorm_stats(bn->red, bn->red + C, x, pivot, n, C, s, bn->cfg.layout,
                            bn->cfg.dtype));
  bn->red[2 * C] = (double)(n * s);
  sn__syncbn_pivot_slots(bn->red + 2 * C + 1, pivot, C);
  return SN_OK;
}

static void host_reset_pivot(sn_syncbn_t *bn) {
  for (int64_t c = 0; c < bn->C; c++) bn->pivot[c] = 0.0f;
}

static sn_status_t host_global_count(sn_syncbn_t *bn, const char *fn, int64_t *count) {
  (void)fn;
  *count = (int64_t)bn->red[2 * bn->C];
  return SN_OK;
}

/* The pivots to sum around again, per channel, as often as sn__bn_refine asks (once where the
 * pivot was the previous batch's mean of data that moved; up to three times where it was
 * nowhere near); every rank decides alike (the same sums). */
static int host_refine(sn_syncbn_t *bn, int64_t count, int round, int refined) {
  return sn__bn_refine_pivots(bn->tmp, bn->red, bn->red + bn->C, refined ? bn->tmp : bn->pivot,
                              bn->C, (double)count, round);
}

static sn_status_t host_finalize(sn_syncbn_t *bn, const char *fn, int64_t count, int refined) {
  (void)fn;
  const int64_t C = bn->C;
  return sn_batchnorm_finalize(bn->mean, bn->var, bn->rstd, bn->red, bn->red + C,
                               refined ? bn->tmp : bn->pivot, count, C, bn->cfg.eps);
}

static sn_status_t host_apply(sn_syncbn_t *bn, const char *fn, void *y, const void *x, int64_t n,
                              int64_t s) {
  (void)fn;
  return sn_batchnorm_apply(y, x, bn->mean, bn->rstd, bn->weight, bn->bias, n, bn->C, s,
                            bn->cfg.layout, bn->cfg.dtype);
}

static sn_status_t host_update(sn_syncbn_t *bn, const char *fn, int64_t count, int update,
                               int set_pivot) {
  (void)fn;
  if (update) /* cannot fail: count != 1 and momentum were checked */
    SN_TRY(sn_batchnorm_update_running(bn->running_mean, bn->running_var,
                                       &bn->num_batches_tracked, bn->mean, bn->var, count, bn->C,
                                       bn->cfg.momentum));
  if (set_pivot && count > 0)
    for (int64_t c = 0; c < bn->C; c++) bn->pivot[c] = (float)bn->mean[c];
  return SN_OK;
}

static sn_status_t host_local_forward(sn_syncbn_t *bn, const char *fn, void *y, const void *x,
                                      int64_t n, int64_t s) {
  (void)fn;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  return sn_batchnorm_fwd(y, bn->mean, bn->var, bn->rstd, x, bn->pivot, bn->weight, bn->bias, n,
                          bn->C, s, cfg->eps, cfg->layout, cfg->dtype);
}

static sn_status_t host_eval(sn_syncbn_t *bn, const char *fn, void *y, const void *x, int64_t n,
                             int64_t s) {
  const sn_syncbn_config_t *cfg = &bn->cfg;
  /* the running statistics can be bad (a negative running_var written through
   * sn_syncbn_params): the message names the caller and the layer before the kernel's */
  const sn_status_t st = sn_batchnorm_infer(y, x, bn->running_mean, bn->running_var, bn->weight,
                                            bn->bias, n, bn->C, s, cfg->eps, cfg->layout,
                                            cfg->dtype);
  if (st != SN_OK) return sn__fail_prefix(st, "%s (%s)", fn, bn->label);
  for (int64_t c = 0; c < bn->C; c++) {
    bn->mean[c] = bn->running_mean[c];
    bn->rstd[c] = (float)(1.0 / sqrt((double)bn->running_var[c] + (double)cfg->eps));
  }
  return SN_OK;
}

static sn_status_t host_bwd_sums(sn_syncbn_t *bn, const char *fn, const void *dy, const void *x,
                                 int64_t n, int64_t s) {
  (void)fn;
  const int64_t C = bn->C;
  SN_TRY(sn_batchnorm_bwd_reduce(bn->red, bn->red + C, dy, x, bn->mean, bn->rstd, n, C, s,
                                 bn->cfg.layout, bn->cfg.dtype));
  memcpy(bn->local, bn->red, (size_t)(2 * C) * sizeof(double));
  return SN_OK;
}

static sn_status_t host_bwd_apply(sn_syncbn_t *bn, const char *fn, void *dx, const void *dy,
                                  const void *x, int64_t n, int64_t s, int batch_stats) {
  (void)fn;
  const int64_t C = bn->C;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  if (batch_stats)
    SN_TRY(sn_batchnorm_bwd_apply(dx, dy, x, bn->mean, bn->rstd, bn->weight, bn->red, bn->red + C,
                                  bn->saved.count, n, C, s, cfg->layout, cfg->dtype));
  else /* frozen BatchNorm: statistics are constants, dx = γ·rstd·dy */
    SN_TRY(sn_batchnorm_bwd_apply(dx, dy, x, bn->mean, bn->rstd, bn->weight, NULL, NULL, 0, n, C,
                                  s, cfg->layout, cfg->dtype));
  if (cfg->affine)
    for (int64_t c = 0; c < C; c++) {
      bn->grad_bias[c] = (float)bn->local[c];
      bn->grad_weight[c] = (float)bn->local[C + c];
    }
  return SN_OK;
}

/* bitwise the two passes above, grad_weight and grad_bias the same roundings of the same sums */
static sn_status_t host_local_backward(sn_syncbn_t *bn, const char *fn, void *dx, const void *dy,
                                       const void *x, int64_t n, int64_t s) {
  (void)fn;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  return sn_batchnorm_bwd(dx, cfg->affine ? bn->grad_weight : NULL,
                          cfg->affine ? bn->grad_bias : NULL, dy, x, bn->mean, bn->rstd,
                          bn->weight, n, bn->C, s, cfg->layout, cfg->dtype);
}

static sn_status_t host_zero_grads(sn_syncbn_t *bn, const char *fn) {
  (void)fn;
  if (bn->cfg.affine)
    for (int64_t c = 0; c < bn->C; c++) bn->grad_weight[c] = bn->grad_bias[c] = 0.0f;
  return SN_OK;
}

static sn_status_t host_batch_stats(sn_syncbn_t *bn, const char *fn, double *mean, double *var) {
  (void)fn;
  for (int64_t c = 0; c < bn->C; c++) {
    if (mean != NULL) mean[c] = bn->mean[c];
    if (var != NULL) var[c] = bn->var[c];
  }
  return SN_OK;
}

static sn_status_t host_saved_count(sn_syncbn_t *bn, const char *fn, int64_t *count) {
  (void)fn;
  *count = bn->saved.count; /* the host always knows it */
  return SN_OK;
}

const sn_syncbn_mem_t sn__syncbn_host_mem = {
    .name = "host",
    .pivot_slots = SN_PIVOT_SLOTS,
    .check_finite = 1,
    .usable = NULL,
    .create = NULL,
    .destroy = NULL,
    .params = host_params,
    .spans = host_spans,
    .to_host = host_nothing,
    .from_host = host_nothing,
    .reduce_buf = host_red,
    .prepare = host_prepare,
    .sums = host_sums,
    .reset_pivot = host_reset_pivot,
    .global_count = host_global_count,
    .refine = host_refine,
    .finalize = host_finalize,
    .apply = host_apply,
    .update = host_update,
    .local_forward = host_local_forward,
    .eval = host_eval,
    .bwd_sums = host_bwd_sums,
    .bwd_apply = host_bwd_apply,
    .local_backward = host_local_backward,
    .zero_grads = host_zero_grads,
    .batch_stats = host_batch_stats,
    .saved_count = host_saved_count,
    .fill_nan = NULL, /* MPI's and the callback's collectives wait at most the timeout */
};
