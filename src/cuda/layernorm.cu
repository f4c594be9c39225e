/*
 * layernorm.cu — LayerNorm and the fused residual add + LayerNorm forwards on the device
 * (syncnorm_cuda.h), twins of src/cpu/layernorm.c. The kernel, which RMSNorm shares, and its
 * method (statistics, the f32 map and its fp64 fallbacks) are in rownorm_fwd.cu; the backward
 * is layernorm_bwd.cu.
 */
#include "rownorm.cuh"

extern "C" sn_status_t sn_cuda_layernorm_fwd(void *y, float *mean, float *rstd, const void *x,
                                             const float *gamma, const float *beta, int64_t rows,
                                             int64_t d, float eps, sn_dtype_t dtype,
                                             cudaStream_t stream) {
  const sn__rn_fwd_t a = {y, NULL, mean, rstd, x, NULL, gamma, beta, rows, d, eps, dtype, 0, 0};
  return sn__cuda_rn_fwd("sn_cuda_layernorm_fwd", a, stream);
}

extern "C" sn_status_t sn_cuda_add_layernorm_fwd(void *y, void *sum_out, float *mean,
                                                 float *rstd, const void *x,
                                                 const void *residual, const float *gamma,
                                                 const float *beta, int64_t rows, int64_t d,
                                                 float eps, sn_dtype_t dtype,
                                                 cudaStream_t stream) {
  const sn__rn_fwd_t a = {y,    sum_out, mean, rstd,  x, residual, gamma,
                          beta, rows,    d,    eps,   dtype, 0, 1};
  return sn__cuda_rn_fwd("sn_cuda_add_layernorm_fwd", a, stream);
}
