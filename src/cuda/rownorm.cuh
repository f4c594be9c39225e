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

/* ---- host side: the register-path launch shared by the forward and backward ------------- */

/* Values per thread of the register path for rows of d elements: the smallest power of two from
 * min_vpt (the vector width, or 1) whose block, rounded up to whole warps, is within
 * pref_threads, else max_vpt; *threads: that block's size. */
inline int rn_pick_vpt(int64_t d, int min_vpt, int max_vpt, int pref_threads, int *threads) {
  int vpt = min_vpt;
  for (;; vpt *= 2) {
    *threads = (int)(((d + vpt - 1) / vpt + 31) / 32 * 32);
    if (*threads <= pref_threads || vpt == max_vpt) return vpt;
  }
}

/* Launches L::go<VPT, VEC>(a, threads, grid, st) for the vpt of rn_pick_vpt (1 to 16; 16 only
 * with vec). L: rn_fwd_launch<T> or rn_bwd_launch<T>, whose go skips a VPT that is not a whole
 * number of vectors. */
template <typename L, typename A>
void rn_launch_vpt(const A &a, int vpt, bool vec, int threads, unsigned grid, cudaStream_t st) {
#define SN_RN_PICK(V)                                                  \
  (vec ? L::template go<V, true>(a, threads, grid, st)                 \
       : L::template go<V, false>(a, threads, grid, st))
  switch (vpt) {
    case 1: SN_RN_PICK(1); break;
    case 2: SN_RN_PICK(2); break;
    case 4: SN_RN_PICK(4); break;
    case 8: SN_RN_PICK(8); break;
    default: L::template go<16, true>(a, threads, grid, st); break; /* vec only */
  }
#undef SN_RN_PICK
}

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

/* Validates the LayerNorm or RMSNorm forward call a (src/args.h, as the CPU twins receive it)
 * as the CPU function fn and launches (rownorm_fwd.cu); res/sum_out NULL for the plain
 * kernels. */
sn_status_t sn__cuda_rn_fwd(const char *fn, const sn__rn_fwd_t &a, cudaStream_t stream);

/* The same for a backward call q with its workspace (rownorm_bwd.cu). */
sn_status_t sn__cuda_rn_bwd(const char *fn, const sn__rn_bwd_t &q, void *workspace,
                            size_t workspace_bytes, cudaStream_t stream);

#endif /* SN_CUDA_ROWNORM_CUH */
