/*
 * layernorm_bwd.cu — the LayerNorm backward on the device (syncnorm_cuda.h), twin of
 * src/cpu/layernorm_bwd.c. The kernel, which RMSNorm shares, its method and the workspace query
 * (sn_cuda_rownorm_bwd_workspace) are in rownorm_bwd.cu.
 */
#include "rownorm.cuh"

extern "C" sn_status_t sn_cuda_layernorm_bwd(void *dx, float *dgamma, float *dbeta,
                                             const void *dy, const void *x, const float *mean,
                                             const float *rstd, const float *gamma, int64_t rows,
                                             int64_t d, sn_dtype_t dtype, void *workspace,
                                             size_t workspace_bytes, cudaStream_t stream) {
  const sn__rn_bwd_t q = {dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, dtype, 0};
  return sn__cuda_rn_bwd("sn_cuda_layernorm_bwd", q, workspace, workspace_bytes, stream);
}
