/*
 * syncbn_cuda.cu — the small kernels of SyncBatchNorm's device path (syncbn_device.h): the
 * statistics, running statistics and pivot from the all-reduced sums, read from device memory
 * so that no host round trip is needed and a step can be captured in a CUDA graph. Per-channel
 * work is tiny (C values): one block of threads, channels strided over it. The formulas are the
 * CPU ones (src/cpu/batchnorm.c: finalize_channel, sn_batchnorm_update_running).
 */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "../src/internal.h"
}
#include "syncbn_device.h"

#define SN_BN_THREADS 256

/* SN_ERR_CUDA naming fn where the launch failed. */
static sn_status_t launched(const char *fn) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return SN_OK;
  return sn__fail(SN_ERR_CUDA, "%s: CUDA error %s (%s)", fn, cudaGetErrorName(err),
                  cudaGetErrorString(err));
}

__global__ void count_kernel(double *red, int64_t c, double count) {
  if (count == 0.0)
    for (int64_t i = threadIdx.x; i < 2 * c; i += blockDim.x) red[i] = 0.0;
  if (threadIdx.x == 0) red[2 * c] = count;
}

extern "C" sn_status_t sn__syncbn_cuda_count(double *red, int64_t c, int64_t count,
                                             cudaStream_t stream) {
  count_kernel<<<1, SN_BN_THREADS, 0, stream>>>(red, c, (double)count);
  return launched("sn_syncbn (count kernel)");
}

__global__ void finalize_kernel(double *mean, float *var, float *rstd, double *count_out,
                                const double *red, const float *pivot, int64_t c, float eps) {
  const double N = red[2 * c];
  if (threadIdx.x == 0) *count_out = N;
  if (N == 0.0) return; /* an empty global batch: nothing to normalize */
  if (N == 1.0) {       /* no variance: the host returns SN_ERR_INSUFFICIENT_COUNT where it can
                           read the count (not during graph capture) */
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      mean[i] = (double)NAN;
      var[i] = NAN, rstd[i] = NAN;
    }
    return;
  }
  const double inv = 1.0 / N;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    const double d = red[i] * inv;       /* mean − pivot */
    double v = red[c + i] * inv - d * d; /* biased variance */
    if (v < 0.0) v = 0.0;
    mean[i] = (double)pivot[i] + d;
    var[i] = (float)v;
    rstd[i] = (float)(1.0 / sqrt(v + (double)eps));
  }
}

extern "C" sn_status_t sn__syncbn_cuda_finalize(double *mean, float *var, float *rstd,
                                                double *count_out, const double *red,
                                                const float *pivot, int64_t c, float eps,
                                                cudaStream_t stream) {
  finalize_kernel<<<1, SN_BN_THREADS, 0, stream>>>(mean, var, rstd, count_out, red, pivot, c,
                                                   eps);
  return launched("sn_syncbn (finalize kernel)");
}

__global__ void update_kernel(float *pivot, float *running_mean, float *running_var,
                              int64_t *nbt, const double *mean, const float *var,
                              const double *count, int64_t c, float momentum, int update,
                              int set_pivot) {
  const double N = *count;
  /* read by every thread before the write; a negative count (written through sn_syncbn_params)
   * is taken as 0, where the host memory's prepare returns SN_ERR_INVALID_ARGUMENT */
  const int64_t tracked = nbt != NULL && *nbt > 0 ? *nbt : 0;
  __syncthreads();
  if (threadIdx.x == 0 && update && N != 1.0 && nbt != NULL && tracked < INT64_MAX)
    *nbt = tracked + 1;
  if (N == 0.0 || N == 1.0) return; /* empty: counted only; one value: nothing (see finalize) */
  const int cumulative = momentum == SN_MOMENTUM_CUMULATIVE;
  const double f = cumulative ? 1.0 / (double)(tracked < INT64_MAX ? tracked + 1 : tracked)
                              : (double)momentum;
  const double unbias = N / (N - 1.0);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    const double m = mean[i];
    if (update) {
      running_mean[i] = (float)((1.0 - f) * (double)running_mean[i] + f * m);
      running_var[i] = (float)((1.0 - f) * (double)running_var[i] + f * (double)var[i] * unbias);
    }
    if (set_pivot) {
      const float q = (float)m;
      pivot[i] = isfinite(q) ? q : 0.0f;
    }
  }
}

extern "C" sn_status_t sn__syncbn_cuda_update(float *pivot, float *running_mean,
                                              float *running_var, int64_t *num_batches_tracked,
                                              const double *mean, const float *var,
                                              const double *count, int64_t c, float momentum,
                                              int update, int set_pivot, cudaStream_t stream) {
  update_kernel<<<1, SN_BN_THREADS, 0, stream>>>(pivot, running_mean, running_var,
                                                 num_batches_tracked, mean, var, count, c,
                                                 momentum, update, set_pivot);
  return launched("sn_syncbn (running statistics kernel)");
}

__global__ void eval_stats_kernel(double *mean, float *rstd, const float *running_mean,
                                  const float *running_var, int64_t c, float eps) {
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    mean[i] = (double)running_mean[i];
    /* running_var < 0: NaN outputs (the CPU's error), also where running_var + eps > 0 */
    rstd[i] = running_var[i] < 0.0f ? NAN
                                    : (float)(1.0 / sqrt((double)running_var[i] + (double)eps));
  }
}

extern "C" sn_status_t sn__syncbn_cuda_eval_stats(double *mean, float *rstd,
                                                  const float *running_mean,
                                                  const float *running_var, int64_t c, float eps,
                                                  cudaStream_t stream) {
  eval_stats_kernel<<<1, SN_BN_THREADS, 0, stream>>>(mean, rstd, running_mean, running_var, c,
                                                     eps);
  return launched("sn_syncbn (eval statistics kernel)");
}

__global__ void bwd_local_kernel(float *gw, float *gb, double *red, const double *local,
                                 int64_t c, int empty) {
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    const double sdy = empty ? 0.0 : local[i], sdyx = empty ? 0.0 : local[c + i];
    red[i] = sdy, red[c + i] = sdyx;
    if (gb != NULL) gb[i] = (float)sdy;
    if (gw != NULL) gw[i] = (float)sdyx;
  }
}

extern "C" sn_status_t sn__syncbn_cuda_bwd_local(float *grad_weight, float *grad_bias,
                                                 double *red, const double *local, int64_t c,
                                                 int64_t local_count, cudaStream_t stream) {
  bwd_local_kernel<<<1, SN_BN_THREADS, 0, stream>>>(grad_weight, grad_bias, red, local, c,
                                                    local_count == 0);
  return launched("sn_syncbn (backward sums kernel)");
}

__global__ void bwd_scale_kernel(double *red, const double *count, int64_t c) {
  for (int64_t i = threadIdx.x; i < 2 * c; i += blockDim.x) red[i] = (red[i] * 2.0) / *count;
}

extern "C" sn_status_t sn__syncbn_cuda_bwd_scale(double *red, const double *count, int64_t c,
                                                 cudaStream_t stream) {
  bwd_scale_kernel<<<1, SN_BN_THREADS, 0, stream>>>(red, count, c);
  return launched("sn_syncbn (backward scale kernel)");
}
