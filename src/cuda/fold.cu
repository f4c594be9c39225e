/*
 * fold.cu — the BatchNorm fold into a preceding layer's weights on the device (syncnorm_cuda.h),
 * twin of src/cpu/fold.c: a grid-stride loop over the weights, k in fp64 per element, b by the
 * thread of the channel's first weight.
 */
#include <math.h>

#include "common.cuh"

namespace {

constexpr int kThreads = 256;

/* w[c, :] *= k, b[c] = (b[c] − rm_c)·k + beta_c, k = gamma_c/√(rv_c + eps) in fp64 (rv < 0:
 * NaN); b[c] by the thread of w[c, 0]. */
__global__ void fold_bn(float *w, float *b, const float *gamma, const float *beta,
                        const float *rm, const float *rv, int64_t total, int64_t per_out,
                        double eps) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = i / per_out;
    const double k = rv[c] < 0.0f ? (double)NAN /* also where rv + eps > 0 */
                                  : (gamma ? (double)gamma[c] : 1.0) / sqrt((double)rv[c] + eps);
    w[i] = (float)__dmul_rn((double)w[i], k);
    if (i == c * per_out)
      b[c] = (float)__dadd_rn(__dmul_rn((double)b[c] - (double)rm[c], k),
                              beta ? (double)beta[c] : 0.0);
  }
}

} /* namespace */

extern "C" sn_status_t sn_cuda_fold_batchnorm(float *w, float *b, const float *gamma,
                                              const float *beta, const float *running_mean,
                                              const float *running_var, int64_t c_out,
                                              int64_t per_out, float eps, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_fold_batchnorm";
  sn__args_t args;
  /* running_var < 0 is checked on the device: NaN for that channel (sqrt of a negative) */
  sn__fold_call_t call = {};
  call.w = w, call.b = b, call.gamma = gamma, call.beta = beta, call.running_mean = running_mean,
      call.running_var = running_var, call.c_out = c_out, call.per_out = per_out, call.eps = eps;
  SN_TRY(sn__fold_args(&args, fn, &call));
  const int64_t total = args.rows; /* c_out·per_out weights */
  SN_TRY(sn__cuda_pending(fn));
  fold_bn<<<sn__cuda_grid(total, kThreads, 8192), kThreads, 0, stream>>>(
      w, b, gamma, beta, running_mean, running_var, total, per_out, (double)eps);
  return sn__cuda_launched(fn);
}
