/*
 * rownorm.cuh — what the LayerNorm/RMSNorm forward (rownorm_fwd.cu) and backward
 * (rownorm_bwd.cu) kernels share: the vector-path alignment test and the per-thread slice of a
 * row held in registers (the argument checks are the CPU functions', src/args.h); and the
 * launchers the entry points (layernorm.cu, layernorm_bwd.cu, rmsnorm.cu) call. Internal, not
 * installed.
 */
#ifndef SN_CUDA_ROWNORM_CUH
#define SN_CUDA_ROWNORM_CUH

#include "common.cuh"

namespace {

/* NULL or 16-byte aligned (the vector path's loads and stores). */
inline bool rn_aligned16(const void *p) { return p == NULL || ((uintptr_t)p & 15u) == 0; }

/* ---- device side ------------------------------------------------------------------------- */

template <typename T, int W> struct alignas(16) rn_vec {
  T v[W];
};

/* The VPT elements of a row one thread holds: VEC, chunks of
 * W = 16/sizeof(T) elements at column (c·blockDim + t)·W; scalar, column j·blockDim + t.
 * Elements past d read 0. int columns: the register paths hold at most 16384 elements. */
template <typename T, int VPT, bool VEC> struct rn_row {
  static constexpr int W = VEC ? (int)(16 / sizeof(T)) : 1;
  static_assert(VPT % W == 0, "a thread holds whole chunks");
  static constexpr int C = VPT / W;

  static __device__ __forceinline__ int col(int j) {
    return ((j / W) * (int)blockDim.x + (int)threadIdx.x) * W + j % W;
  }
  static __device__ __forceinline__ void load(float (&v)[VPT], const T *row, int64_t d) {
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i = (c * (int)blockDim.x + (int)threadIdx.x) * W;
      if constexpr (VEC) {
        if (i < d) {
          const rn_vec<T, W> t = *reinterpret_cast<const rn_vec<T, W> *>(row + i);
#pragma unroll
          for (int k = 0; k < W; k++) v[c * W + k] = sn_io<T>::widen(t.v[k]);
        } else {
#pragma unroll
          for (int k = 0; k < W; k++) v[c * W + k] = 0.0f;
        }
      } else {
        v[c] = i < d ? sn_io<T>::widen(row[i]) : 0.0f;
      }
    }
  }
  /* The same elements unconverted (0 past d): a row fetched ahead of its use. */
  static __device__ __forceinline__ void load_raw(T (&v)[VPT], const T *row, int64_t d) {
    const T zero = sn_io<T>::narrow(0.0f);
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i = (c * (int)blockDim.x + (int)threadIdx.x) * W;
      if constexpr (VEC) {
        if (i < d) {
          const rn_vec<T, W> t = *reinterpret_cast<const rn_vec<T, W> *>(row + i);
#pragma unroll
          for (int k = 0; k < W; k++) v[c * W + k] = t.v[k];
        } else {
#pragma unroll
          for (int k = 0; k < W; k++) v[c * W + k] = zero;
        }
      } else {
        v[c] = i < d ? row[i] : zero;
      }
    }
  }
  static __device__ __forceinline__ void store(T *row, const T (&o)[VPT], int64_t d) {
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i = (c * (int)blockDim.x + (int)threadIdx.x) * W;
      if (i >= d) continue;
      if constexpr (VEC) {
        rn_vec<T, W> t;
#pragma unroll
        for (int k = 0; k < W; k++) t.v[k] = o[c * W + k];
        *reinterpret_cast<rn_vec<T, W> *>(row + i) = t;
      } else {
        row[i] = o[c];
      }
    }
  }
};

}  // namespace

/* One LayerNorm or RMSNorm forward call as its entry point (layernorm.cu, rmsnorm.cu)
 * receives it. */
struct rn_fwd_args {
  void *y, *sum_out;
  float *mean, *rstd;
  const void *x, *res;
  const float *gamma, *beta;
  int64_t rows, d;
  float eps;
  bool rms, fused; /* RMSNorm; the fused residual add (sum_out, res are checked) */
};

/* Validates a as the CPU function fn and launches (rownorm_fwd.cu); res/sum_out NULL for the
 * plain kernels. */
sn_status_t sn__cuda_rn_fwd(const char *fn, const rn_fwd_args &a, sn_dtype_t dtype,
                            cudaStream_t stream);

/* One LayerNorm or RMSNorm backward call as its entry point receives it. */
struct rn_bwd_call {
  void *dx;
  float *dgamma, *dbeta; /* dbeta NULL for RMSNorm */
  const void *dy, *x;
  const float *mean, *rstd, *gamma; /* mean NULL (and not checked) for RMSNorm */
  int64_t rows, d;
  sn_dtype_t dtype;
  void *workspace;
  size_t workspace_bytes;
  bool rms;
};

/* Validates q as the CPU function fn and launches (rownorm_bwd.cu). */
sn_status_t sn__cuda_rn_bwd(const char *fn, const rn_bwd_call &q, cudaStream_t stream);

#endif /* SN_CUDA_ROWNORM_CUH */
