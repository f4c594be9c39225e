/*
 * syncbn_device.h — SyncBatchNorm's device-memory path (cfg.device_memory = 1, CUDA builds
 * only): syncbn_device.c (C: buffers, the order of the launches, the all-reduce) and its small
 * kernels in syncbn_cuda.cu. syncbn.c keeps the control flow (argument checks, consistency
 * checks, the saved forward) and calls these under #if SN_HAVE_CUDA. Not installed.
 *
 * On the device, per layer: weight, bias, grad_weight, grad_bias, running_mean, running_var,
 * pivot, var, rstd [C] f32; red [2C + 1] f64 (Σ(x−p) | Σ(x−p)² | count, or Σdy | Σdy·x̂),
 * local [2C] f64 (this rank's backward sums), mean [C] f64, count [1] f64 (the last forward's
 * global count), num_batches_tracked [1] int64, and the BatchNorm workspace. The host keeps
 * its arrays (syncbn.c) as a mirror, filled by sn__syncbn_dev_download for the consistency
 * check's hash and the checkpoint functions.
 */
#ifndef SN_SYNCBN_DEVICE_H
#define SN_SYNCBN_DEVICE_H

#include <cuda_runtime_api.h>

#include "syncbn_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- syncbn_device.c ------------------------------------------------------------------------ */

/* sn_syncbn_forward and sn_syncbn_backward of a device_memory layer, after their argument
 * checks (syncbn.c): the consistency check, the steps below, the saved forward. */
SN_HIDDEN sn_status_t sn__syncbn_dev_forward(sn_syncbn_t *bn, const char *fn, void *y,
                                             const void *x, int64_t n, int64_t s, int training);
SN_HIDDEN sn_status_t sn__syncbn_dev_backward_call(sn_syncbn_t *bn, const char *fn, void *dx,
                                                   const void *dy, const void *x, int64_t n,
                                                   int64_t s);

/* SN_OK where a CUDA device is present, else SN_ERR_UNSUPPORTED naming fn (a CUDA build run
 * without a GPU or driver). */
SN_HIDDEN sn_status_t sn__syncbn_dev_usable(const char *fn);
/* Allocates bn->dev (on the current CUDA device, which must be the communicator's: else
 * SN_ERR_INVALID_ARGUMENT) and uploads the host arrays' initial values on a private stream,
 * waited for (not the communicator's stream). */
SN_HIDDEN sn_status_t sn__syncbn_dev_create(sn_syncbn_t *bn);
SN_HIDDEN void sn__syncbn_dev_destroy(sn_syncbn_t *bn);
/* The layer's device f32 block, f64 block and workspace (check_call's overlap check). */
SN_HIDDEN void sn__syncbn_dev_spans(const sn_syncbn_t *bn, sn__dev_span_t span[3]);
/* Device pointers into the layer's state (sn_syncbn_params). */
SN_HIDDEN void sn__syncbn_dev_params(const sn_syncbn_t *bn, sn_syncbn_params_t *p);
/* Device state → host mirror (weight, bias, running stats, num_batches_tracked); waits for the
 * stream (under the communicator's timeout where there is one). */
SN_HIDDEN sn_status_t sn__syncbn_dev_download(sn_syncbn_t *bn);
/* Host mirror → device (weight, bias, running stats, num_batches_tracked) after waiting for the
 * layer's stream (under the timeout); the pivot is set to 0 (host and device: never seeded from
 * rank-local values, so every rank's pivot is 0 until the first synchronized mean); synchronous. */
SN_HIDDEN sn_status_t sn__syncbn_dev_upload(sn_syncbn_t *bn);
/* Eval forward from the running statistics (infer), and the frozen backward's mean, rstd. */
SN_HIDDEN sn_status_t sn__syncbn_dev_infer(sn_syncbn_t *bn, const char *fn, void *y,
                                           const void *x, int64_t n, int64_t s);
/* Local shifted sums and count into red, then (synced) the one all-reduce of 2C + 1 f64. */
SN_HIDDEN sn_status_t sn__syncbn_dev_sums(sn_syncbn_t *bn, const char *fn, const void *x,
                                          int64_t n, int64_t s, int synced);
/* The global count of the last sums, read back to the host (waits for the stream). */
SN_HIDDEN sn_status_t sn__syncbn_dev_read_count(sn_syncbn_t *bn, int64_t *count);
/* Statistics from red (count from the device), running stats (update), next pivot
 * (set_pivot), then y. */
SN_HIDDEN sn_status_t sn__syncbn_dev_finish(sn_syncbn_t *bn, const char *fn, void *y,
                                            const void *x, int64_t n, int64_t s, int update,
                                            int set_pivot);
/* Backward: local sums, grads (=), (batch_stats && synced) the one all-reduce of 2C f64, dx. */
SN_HIDDEN sn_status_t sn__syncbn_dev_backward(sn_syncbn_t *bn, const char *fn, void *dx,
                                              const void *dy, const void *x, int64_t n,
                                              int64_t s, int batch_stats, int synced);
/* Zero grad_weight, grad_bias (an empty global batch's backward). */
SN_HIDDEN sn_status_t sn__syncbn_dev_zero_grads(sn_syncbn_t *bn, const char *fn);

/* ---- syncbn_cuda.cu: the kernels (one launch each, no allocation, graph-capturable) -------- */

/* red[2c] = count (the local n·s, as a double); where count == 0 also red[0 .. 2c) = 0 (the
 * stats kernel is not called for an empty local batch). */
SN_HIDDEN sn_status_t sn__syncbn_cuda_count(double *red, int64_t c, int64_t count,
                                            cudaStream_t stream);
/* From red [2c + 1] (sums around pivot, global count N = red[2c]): *count_out = N, and for
 * N > 1 mean [c] f64, var [c] f32 (biased), rstd [c] f32 as sn_batchnorm_finalize; with update,
 * num_batches_tracked += 1 (N == 0 too; saturating; a negative one, written through
 * sn_syncbn_params, is taken as 0) and running_mean/var as
 * sn_batchnorm_update_running (unbiased by N/(N−1)); with set_pivot, pivot = (float)mean (0 where
 * not finite). N == 1: mean, var, rstd NaN, nothing else written. One block. */
SN_HIDDEN sn_status_t sn__syncbn_cuda_finalize(double *mean, float *var, float *rstd,
                                               float *pivot, float *running_mean,
                                               float *running_var, int64_t *num_batches_tracked,
                                               double *count_out, const double *red, int64_t c,
                                               float eps, float momentum, int update,
                                               int set_pivot, cudaStream_t stream);
/* mean = running_mean (f64), rstd = 1/√(running_var + eps) (the frozen backward's constants). */
SN_HIDDEN sn_status_t sn__syncbn_cuda_eval_stats(double *mean, float *rstd,
                                                 const float *running_mean,
                                                 const float *running_var, int64_t c, float eps,
                                                 cudaStream_t stream);
/* grad_bias = (float)local[0..c), grad_weight = (float)local[c..2c) (NULL: not written), red =
 * local [2c]; where local_count == 0 (no bwd_reduce ran) all of them 0. */
SN_HIDDEN sn_status_t sn__syncbn_cuda_bwd_local(float *grad_weight, float *grad_bias,
                                                double *red, const double *local, int64_t c,
                                                int64_t local_count, cudaStream_t stream);
/* red [2c] *= 2 / *count: sums over the device-held global count N rescaled so that
 * sn_cuda_batchnorm_bwd_apply with count 2 divides them by N (×2 and ÷2 are exact). */
SN_HIDDEN sn_status_t sn__syncbn_cuda_bwd_scale(double *red, const double *count, int64_t c,
                                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* SN_SYNCBN_DEVICE_H */
