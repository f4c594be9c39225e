/*
 * common.cuh — what every CUDA kernel file shares: dtype loads and stores, the host-side launch
 * check, block reductions in fp64. Internal, not installed.
 */
#ifndef SN_CUDA_COMMON_CUH
#define SN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../args.h"
#include "../internal.h"
}
#include "syncnorm_cuda.h"

/* ---- host side ----------------------------------------------------------------------------- */

/* SN_ERR_CUDA naming fn and the CUDA error of the last launch, or SN_OK. Clears a non-sticky
 * launch error (cudaGetLastError) so it is not reported again by a later call. */
sn_status_t sn__cuda_launched(const char *fn);
/* SN_OK unless a CUDA error is pending (cudaPeekAtLastError) before an entry point enqueues
 * anything: then SN_ERR_CUDA saying so, the error left for the program, so that the check after
 * the launches (sn__cuda_launched) reports only the call's own. */
extern "C" sn_status_t sn__cuda_pending(const char *fn);
/* SN_ERR_CUDA with fn and err's name, or SN_OK for cudaSuccess. */
sn_status_t sn__cuda_status(const char *fn, cudaError_t err);
/* Rounds bytes up to a multiple of 256 (each array carved from a workspace starts aligned). */
static inline size_t sn__cuda_align(size_t bytes) { return (bytes + 255u) & ~(size_t)255u; }
/* Blocks of `threads` for `work` items, at least 1 and at most cap (the kernels loop beyond). */
static inline unsigned sn__cuda_grid(int64_t work, int threads, int64_t cap) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return (unsigned)(b < cap ? b : cap);
}

/* ---- device side: dtype traits ------------------------------------------------------------- */

/* Widening load and rounding (round-to-nearest-even) store of one activation element. */
template <typename T> struct sn_io;
template <> struct sn_io<float> {
  static __device__ __forceinline__ float load(const float *p) { return *p; }
  static __device__ __forceinline__ float widen(float v) { return v; }
  static __device__ __forceinline__ float narrow(float v) { return v; }
  static __device__ __forceinline__ float narrow_d(double v) { return (float)v; }
};
template <> struct sn_io<__nv_bfloat16> {
  static __device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 narrow(float v) { return __float2bfloat16_rn(v); }
  /* fp64 → bf16 through f32 could round twice; __double2bfloat16 rounds once. */
  static __device__ __forceinline__ __nv_bfloat16 narrow_d(double v) { return __double2bfloat16(v); }
};
template <> struct sn_io<__half> {
  static __device__ __forceinline__ float widen(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half narrow(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ __half narrow_d(double v) { return __double2half(v); }
};

/* Dispatches on an sn_dtype_t (already validated) to a templated launcher: F<T>::run(args...). */
#define SN_CUDA_DISPATCH(dtype, LAUNCH)                        \
  do {                                                         \
    switch (dtype) {                                           \
      case SN_DTYPE_F32: { typedef float T; LAUNCH; } break;   \
      case SN_DTYPE_BF16: { typedef __nv_bfloat16 T; LAUNCH; } break; \
      default: { typedef __half T; LAUNCH; } break;            \
    }                                                          \
  } while (0)

/* ---- device side: reductions ---------------------------------------------------------------- */

__device__ __forceinline__ double sn__warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), in a fixed order (the same
 * bits for the same inputs and block size); every thread gets the result. scratch: 32 doubles of
 * shared memory; the call synchronizes the block twice. */
__device__ __forceinline__ double sn__block_sum(double v, double *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = sn__warp_sum(v);
  __syncthreads(); /* scratch may still be read by a previous call */
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0;
  return sn__warp_sum(v);
}

#endif /* SN_CUDA_COMMON_CUH */
