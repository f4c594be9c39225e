/*
 * rmsnorm.cu — RMSNorm, the fused residual add + RMSNorm forward and the RMSNorm backward on the
 * device (syncnorm_cuda.h), twins of src/cpu/rmsnorm.c. The kernels, which LayerNorm shares, and
 * their method are in rownorm_fwd.cu and rownorm_bwd.cu; the backward's workspace query
 * (sn_cuda_rownorm_bwd_workspace) is in rownorm_bwd.cu.
 */
#include "rownorm.cuh"

extern "C" sn_status_t sn_cuda_rmsnorm_fwd(void *y, float *rstd, const void *x,
                                           const float *gamma, int64_t rows, int64_t d,
                                           float eps, sn_dtype_t dtype, cudaStream_t stream) {
  const sn__rn_fwd_t a = {y, NULL, NULL, rstd, x, NULL, gamma, NULL, rows, d, eps, dtype, 1, 0};
  return sn__cuda_rn_fwd("sn_cuda_rmsnorm_fwd", a, stream);
}

extern "C" sn_status_t sn_cuda_add_rmsnorm_fwd(void *y, void *sum_out, float *rstd,
                                               const void *x, const void *residual,
                                               const float *gamma, int64_t rows, int64_t d,
                                               float eps, sn_dtype_t dtype,
                                               cudaStream_t stream) {
  const sn__rn_fwd_t a = {y,    sum_out, NULL, rstd,  x, residual, gamma,
                          NULL, rows,    d,    eps,   dtype, 1, 1};
  return sn__cuda_rn_fwd("sn_cuda_add_rmsnorm_fwd", a, stream);
}

extern "C" sn_status_t sn_cuda_rmsnorm_bwd(void *dx, float *dgamma, const void *dy,
                                           const void *x, const float *rstd, const float *gamma,
                                           int64_t rows, int64_t d, sn_dtype_t dtype,
                                           void *workspace, size_t workspace_bytes,
                                           cudaStream_t stream) {
  const sn__rn_bwd_t q = {dx, dgamma, NULL, dy, x, NULL, rstd, gamma, rows, d, dtype, 1};
  return sn__cuda_rn_bwd("sn_cuda_rmsnorm_bwd", q, workspace, workspace_bytes, stream);
}
