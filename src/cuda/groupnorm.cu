/*
 * groupnorm.cu — the GroupNorm forward on the device (syncnorm_cuda.h), twin of
 * src/cpu/groupnorm.c (layout and addressing: groupnorm.cuh). One block per (n, g): two fp64
 * passes over x in global memory (Σx, then Σ(x − mean)²), then
 * y = (x − mean)·(rstd·gamma_c) + beta_c in fp64, rounded to the dtype once.
 */
#include "groupnorm.cuh"

namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads) gn_fwd(GnArgs a) {
  __shared__ double scratch[32];
  const T *x = (const T *)a.in;
  T *y = (T *)a.out;
  const int64_t cg = a.c / a.g, L = cg * a.s;
  for (int64_t t = blockIdx.x; t < a.n * a.g; t += gridDim.x) {
    const int64_t n = t / a.g, g = t - n * a.g;
    if (a.nhwc && kThreads % cg == 0) {
      /* NHWC with Cg | kThreads: thread i owns channel i % Cg of the group and the rows
       * i/Cg + j·(kThreads/Cg): no division per element, the channel's constants in registers */
      const int jc = (int)(threadIdx.x % cg);
      const int64_t row0 = threadIdx.x / cg, rstep = kThreads / cg;
      const int64_t base = n * a.s * a.c + g * cg + jc; /* + row·C */
      double s1 = 0.0;
      for (int64_t row = row0; row < a.s; row += rstep)
        s1 += (double)sn_io<T>::widen(x[base + row * a.c]);
      const double mean = sn__block_sum(s1, scratch) / (double)L;
      double s2 = 0.0;
      for (int64_t row = row0; row < a.s; row += rstep) {
        const double d = (double)sn_io<T>::widen(x[base + row * a.c]) - mean;
        s2 += d * d;
      }
      const double rs = 1.0 / sqrt(sn__block_sum(s2, scratch) / (double)L + a.eps);
      if (threadIdx.x == 0) {
        if (a.mean_out) a.mean_out[t] = (float)gn_canon(mean);
        if (a.rstd_out) a.rstd_out[t] = (float)gn_canon(rs);
      }
      const int64_t ch = g * cg + jc;
      const double gm = a.gamma ? (double)a.gamma[ch] : 1.0;
      const double b = a.beta ? (double)a.beta[ch] : 0.0;
      for (int64_t row = row0; row < a.s; row += rstep) {
        const int64_t off = base + row * a.c;
        y[off] = sn_io<T>::narrow_d(((double)sn_io<T>::widen(x[off]) - mean) * (rs * gm) + b);
      }
      continue;
    }
    int64_t ch;
    double s1 = 0.0;
    for (int64_t k = threadIdx.x; k < L; k += blockDim.x)
      s1 += (double)sn_io<T>::widen(x[gn_off(a, n, g, k, &ch)]);
    const double mean = sn__block_sum(s1, scratch) / (double)L;
    double s2 = 0.0;
    for (int64_t k = threadIdx.x; k < L; k += blockDim.x) {
      const double d = (double)sn_io<T>::widen(x[gn_off(a, n, g, k, &ch)]) - mean;
      s2 += d * d;
    }
    const double rs = 1.0 / sqrt(sn__block_sum(s2, scratch) / (double)L + a.eps);
    if (threadIdx.x == 0) {
      if (a.mean_out) a.mean_out[t] = (float)gn_canon(mean);
      if (a.rstd_out) a.rstd_out[t] = (float)gn_canon(rs);
    }
    for (int64_t k = threadIdx.x; k < L; k += blockDim.x) {
      const int64_t off = gn_off(a, n, g, k, &ch);
      const double gm = a.gamma ? (double)a.gamma[ch] : 1.0;
      const double b = a.beta ? (double)a.beta[ch] : 0.0;
      y[off] = sn_io<T>::narrow_d(((double)sn_io<T>::widen(x[off]) - mean) * (rs * gm) + b);
    }
  }
}

template <typename T> void launch_gn_fwd(const GnArgs &a, cudaStream_t stream) {
  gn_fwd<T><<<gn_grid(a), kThreads, 0, stream>>>(a);
}

} /* namespace */

extern "C" sn_status_t sn_cuda_groupnorm_fwd(void *y, float *mean, float *rstd, const void *x,
                                             const float *gamma, const float *beta, int64_t n,
                                             int64_t c, int64_t s, int64_t groups, float eps,
                                             sn_layout_t layout, sn_dtype_t dtype,
                                             cudaStream_t stream) {
  static const char fn[] = "sn_cuda_groupnorm_fwd";
  sn__args_t args;
  sn__gn_call_t call = {};
  call.y = y, call.mean = mean, call.rstd = rstd, call.x = x, call.gamma = gamma, call.beta = beta,
      call.n = n, call.c = c, call.s = s, call.groups = groups, call.eps = eps,
      call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__gn_fwd_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) return SN_OK;
  SN_TRY(sn__cuda_pending(fn));
  GnArgs a = {};
  a.out = y, a.in = x, a.mean_out = mean, a.rstd_out = rstd, a.gamma = gamma, a.beta = beta;
  a.eps = (double)eps, a.n = n, a.c = c, a.s = s, a.g = groups;
  a.nhwc = layout == SN_LAYOUT_NHWC;
  SN_CUDA_DISPATCH(dtype, launch_gn_fwd<T>(a, stream));
  return sn__cuda_launched(fn);
}
