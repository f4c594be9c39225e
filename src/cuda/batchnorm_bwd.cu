/*
 * batchnorm_bwd.cu — the BatchNorm backward on the device (syncnorm_cuda.h), twins of
 * src/cpu/batchnorm_bwd.c: the per-channel sums Σdy and Σdy·x̂, dx from them, and the local
 * backward with dgamma and dbeta. The reductions and elementwise maps are in batchnorm.cuh.
 */
#include "batchnorm.cuh"

namespace {

/* dgamma = (float)Σdy·x̂, dbeta = (float)Σdy, either NULL; after the dx pass (they may equal
 * gamma or rstd, which it reads). */
__global__ void bn_param_grads(float *dgamma, float *dbeta, const double *sum_dy,
                               const double *sum_dy_xhat, int64_t C) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    if (dgamma) dgamma[c] = (float)sum_dy_xhat[c];
    if (dbeta) dbeta[c] = (float)sum_dy[c];
  }
}

} /* namespace */

/* ---- public entry points --------------------------------------------------------------------- */

extern "C" sn_status_t sn_cuda_batchnorm_bwd_reduce(double *sum_dy, double *sum_dy_xhat,
                                                    const void *dy, const void *x,
                                                    const double *mean, const float *rstd,
                                                    int64_t n, int64_t c, int64_t s,
                                                    sn_layout_t layout, sn_dtype_t dtype,
                                                    void *workspace, size_t workspace_bytes,
                                                    cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_bwd_reduce";
  int64_t P;
  size_t need = 0; /* written on success; initialized since -O3 sees a path it cannot rule out */
  sn__args_t args;
  sn__bn_call_t call = {};
  call.sum_dy = sum_dy, call.sum_dy_xhat = sum_dy_xhat, call.dy = dy, call.x = x, call.mean = mean,
      call.rstd = rstd, call.n = n, call.c = c, call.s = s, call.layout = layout,
      call.dtype = dtype;
  SN_TRY(sn__bn_bwd_reduce_args(&args, fn, &call));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__args_workspace(&args, workspace, workspace_bytes, need));
  const int64_t rows = args.rows;
  SN_TRY(sn__cuda_pending(fn));
  if (rows == 0) return bn_zero_sums(fn, sum_dy, sum_dy_xhat, c, stream);
  BnWs w = {}; /* set by bn_ws_layout; {} for -O3, which cannot see that P > 0 here */
  bn_ws_layout(P, c, workspace, &w);
  /* Σ dy·x̂ = rstd·Σ dy·(x − mean), rstd applied once per channel as on the CPU */
  const BnRed op = {dy, x, NULL, mean, rstd, NULL, sum_dy, sum_dy_xhat};
  bn_reduce<true>(op, w, n, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_bwd_apply(void *dx, const void *dy, const void *x,
                                                   const double *mean, const float *rstd,
                                                   const float *gamma, const double *sum_dy,
                                                   const double *sum_dy_xhat, int64_t count,
                                                   int64_t n, int64_t c, int64_t s,
                                                   sn_layout_t layout, sn_dtype_t dtype,
                                                   cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_bwd_apply";
  sn__args_t args;
  sn__bn_call_t call = {};
  call.dx = dx, call.dy = dy, call.x = x, call.mean = mean, call.rstd = rstd, call.gamma = gamma,
      call.sum_dy = sum_dy, call.sum_dy_xhat = sum_dy_xhat, call.count = count, call.n = n,
      call.c = c, call.s = s, call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__bn_bwd_apply_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) return SN_OK;
  SN_TRY(sn__cuda_pending(fn));
  const int eval = sum_dy == NULL && sum_dy_xhat == NULL;
  MapArgs m = {};
  m.out = dx, m.in = dy, m.x = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma;
  m.sum_dy = sum_dy, m.sum_dy_xhat = sum_dy_xhat, m.count = (double)count;
  if (eval) bn_map_run<MAP_BWD_EVAL>(m, rows, c, s, layout, dtype, stream);
  else bn_map_run<MAP_BWD>(m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_bwd(void *dx, float *dgamma, float *dbeta,
                                             const void *dy, const void *x, const double *mean,
                                             const float *rstd, const float *gamma, int64_t n,
                                             int64_t c, int64_t s, sn_layout_t layout,
                                             sn_dtype_t dtype, void *workspace,
                                             size_t workspace_bytes, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_bwd";
  int64_t P;
  size_t need = 0; /* written on success; initialized since -O3 sees a path it cannot rule out */
  sn__args_t args;
  sn__bn_call_t call = {};
  call.dx = dx, call.dgamma = dgamma, call.dbeta = dbeta, call.dy = dy, call.x = x,
      call.mean = mean, call.rstd = rstd, call.gamma = gamma, call.n = n, call.c = c, call.s = s,
      call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__bn_bwd_args(&args, fn, &call));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__args_workspace(&args, workspace, workspace_bytes, need));
  SN_TRY(sn__cuda_pending(fn));
  const int64_t rows = args.rows;
  BnWs w = {}; /* set by bn_ws_layout; {} for -O3, which cannot see that P > 0 here */
  bn_ws_layout(P, c, workspace, &w);
  const BnRed op = {dy, x, NULL, mean, rstd, NULL, w.sum1, w.sum2};
  bn_reduce<true>(op, w, n, c, s, layout, dtype, stream);
  MapArgs m = {};
  m.out = dx, m.in = dy, m.x = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma;
  m.sum_dy = w.sum1, m.sum_dy_xhat = w.sum2, m.count = (double)rows;
  bn_map_run<MAP_BWD>(m, rows, c, s, layout, dtype, stream);
  if (dgamma || dbeta) /* after the dx pass, which reads rstd and gamma */
    bn_param_grads<<<sn__cuda_grid(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
        dgamma, dbeta, w.sum1, w.sum2, c);
  return sn__cuda_launched(fn);
}
