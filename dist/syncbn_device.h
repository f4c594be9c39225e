/*
 * syncbn_device.h — the small kernels of SyncBatchNorm's device-memory table (syncbn_cuda.cu),
 * called by syncbn_device.c. One launch each, one block, no allocation, graph-capturable. Part
 * of libsyncnorm_cuda. Not installed.
 */
#ifndef SN_SYNCBN_DEVICE_H
#define SN_SYNCBN_DEVICE_H

#include <cuda_runtime_api.h>

#include "syncbn_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* src/cuda/common.cu: SN_OK, or SN_ERR_CUDA naming fn where a CUDA error of the program is
 * pending (left pending). */
SN_HIDDEN sn_status_t sn__cuda_pending(const char *fn);

/* red[2c] = count (the local n·s, as a double); where count == 0 also red[0 .. 2c) = 0 (the
 * stats kernel is not called for an empty local batch). */
SN_HIDDEN sn_status_t sn__syncbn_cuda_count(double *red, int64_t c, int64_t count,
                                            cudaStream_t stream);
/* From red [2c + 1] (sums around pivot, global count N = red[2c]): *count_out = N, and for
 * N > 1 mean [c] f64, var [c] f32 (biased), rstd [c] f32 as sn_batchnorm_finalize. N == 1:
 * mean, var, rstd NaN. */
SN_HIDDEN sn_status_t sn__syncbn_cuda_finalize(double *mean, float *var, float *rstd,
                                               double *count_out, const double *red,
                                               const float *pivot, int64_t c, float eps,
                                               cudaStream_t stream);
/* With N = *count: with update, num_batches_tracked += 1 (N == 0 too, not N == 1; saturating; a
 * negative one is taken as 0) and, for N > 1, running_mean/var as sn_batchnorm_update_running
 * (unbiased by N/(N−1)); with set_pivot and N > 1, pivot = (float)mean (0 where not finite). */
SN_HIDDEN sn_status_t sn__syncbn_cuda_update(float *pivot, float *running_mean,
                                             float *running_var, int64_t *num_batches_tracked,
                                             const double *mean, const float *var,
                                             const double *count, int64_t c, float momentum,
                                             int update, int set_pivot, cudaStream_t stream);
/* mean = running_mean (f64), rstd = 1/√(running_var + eps) (the frozen backward's constants;
 * NaN where running_var < 0). */
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
