/*
 * rownorm_fwd.cu — the one forward kernel of LayerNorm, RMSNorm and the fused residual add
 * forms, and its launcher sn__cuda_rn_fwd (argument checks as the CPU functions', then the launch); the
 * entry points are in layernorm.cu and rmsnorm.cu, the backward in rownorm_bwd.cu. Every tensor
 * is row-major [rows, d]; one row is normalized over its d elements. The CPU twins
 * (src/cpu/layernorm.c, rmsnorm.c) are the reference.
 *
 * One thread block per row (grid-stride over rows). The row is held on chip, in registers: each
 * thread holds VPT elements (VPT in {1, 2, 4, 8, 16}, a template parameter; the smallest whose
 * block stays within 512 threads, else the largest) of a block of up to 1024 threads, so the row
 * is read from memory once (rn_fwd_kernel) for d <= 16384 (vector path) or 8192 (scalar path:
 * VPT <= 8, since 16 spills at 1024 threads). Where every row pointer is 16-byte aligned (base
 * pointers aligned and d·sizeof(T) % 16 == 0) a thread's elements are 16-byte chunks loaded and
 * stored as one vector; otherwise element j of thread t is column j·blockDim + t (coalesced
 * scalar accesses). Longer rows take rn_fwd_big, 1024 threads striding over the row, which reads
 * it from global memory in each pass (L2 keeps it between passes).
 *
 * Per row (LayerNorm): pass 1 sums each thread's values in f32 with TwoSum compensation (its
 * partial exact to ~2^-44), the partials in fp64 (block sum): mean = Σx/d. Pass 2
 * sums (x − mean)² in fp64 (one f32→f64 conversion and two fp64 operations per element; the
 * statistics stay accurate to fp64 rounding, which the per-element fallback below relies on);
 * rstd = 1/√(var + eps) in fp64; mean, rstd are stored rounded to f32. y is mapped in f32 with
 * the mean as two floats, m = f32(mean), c = f32(mean − m): y = ((x − m) − c)·(rstd_f32·gamma)
 * + beta (one FMA), rounded once to the dtype: that errs by at most ~4 f32 roundings of
 * |x̂·gamma| + |c·rstd·gamma| plus one of |y|. A bf16 (f16) element whose |y| is below 2^-10
 * (2^-7) of those terms (beta cancels x̂·gamma), whose rstd·gamma is below 2^-100, or whose f32
 * y is not finite, is recomputed in fp64 from the fp64 mean and rstd, ((x − mean)·rstd·gamma +
 * beta), and rounded once, so every bf16/f16 output is within a fraction of an ulp (before its
 * rounding) of the exact value; f32 outputs are not checked for cancellation (as the CPU).
 * A row whose mean is not finite or is 2^103 or more takes an all-fp64 path (a
 * block-uniform decision: every thread holds the same block sums): two fp64 passes over the
 * held values and every element in fp64, rounded once.
 * RMSNorm: Σx² per thread in f32 FMA runs of 4 squares added in fp64 (a thread with a run
 * outside [2^-60, f32 max] sums its squares in fp64), block-summed; rstd = 1/√(Σx²/d + eps) in
 * fp64; y = (x·rstd_f32)·gamma in f32 (as the CPU), in fp64 for a non-finite f32 y, and the whole
 * row in fp64 where Σx² is not finite. gamma/beta are read as float4 where 16-byte aligned (vector
 * path). Block sums run in a fixed order and every branch depends only on the data:
 * deterministic (the same bits run to run).
 * The fused kernels round sum_out = x + residual (added in f32) to the dtype and normalize the
 * rounded values, as the CPU functions do.
 */
#include "rownorm.cuh"

namespace {

/* Threads per block preferred for the register path: the smallest VPT keeping the block within
 * this many threads is taken (more threads only where d needs them). */
constexpr int kFwdPrefThreads = 512;
constexpr int kFwdMaxThreads = 1024;
/* Grid cap: blocks beyond it loop over rows. */
constexpr int64_t kMaxGrid = (int64_t)1 << 20;

/* ---- device side ------------------------------------------------------------------------- */

/* The f32 map's threshold for bf16/f16 outputs: an element is mapped in fp64 where
 * |y| < thr·(|u·s| + |c·s|) (beta cancels x̂·gamma, so the f32 map's error, at most ~10 f32
 * roundings of those terms, could exceed a quarter of an output ulp); 0 for f32 outputs. */
template <typename T> __device__ __forceinline__ float rn_thr() { return 0.0f; }
template <> __device__ __forceinline__ float rn_thr<__nv_bfloat16>() { return 0x1p-10f; }
template <> __device__ __forceinline__ float rn_thr<__half>() { return 0x1p-7f; }

constexpr float kF32Max = 0x1.fffffep127f;

/* s + e += v, the rounding error of each f32 addition kept in e (Knuth's TwoSum; no
 * multiplications, so nothing is contracted into an FMA). */
__device__ __forceinline__ void rn_two_sum(float &s, float &e, float v) {
  const float t = s + v, z = t - s;
  e += (s - (t - z)) + (v - z);
  s = t;
}

/* The W parameters (gamma or beta) of columns i..i+W-1 (all < d), dflt where src is NULL; vec:
 * src + i is 16-byte aligned (W a multiple of 4), loaded as float4s. */
template <int W>
__device__ __forceinline__ void rn_params(float (&p)[W], const float *src, int i, bool vec,
                                          float dflt) {
  if (src == nullptr) {
#pragma unroll
    for (int k = 0; k < W; k++) p[k] = dflt;
    return;
  }
  if constexpr (W % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int k = 0; k < W; k += 4) {
        const float4 q = *reinterpret_cast<const float4 *>(src + i + k);
        p[k] = q.x;
        p[k + 1] = q.y;
        p[k + 2] = q.z;
        p[k + 3] = q.w;
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < W; k++) p[k] = src[i + k];
}

/* The fp64 map of one element: ((x − mean)·rstd·gamma + beta), rounded once by the caller. */
__device__ __forceinline__ double rn_map_d(float x, double mu, double rs, float g, float b) {
  double t = ((double)x - mu) * rs;
  t *= (double)g;
  t += (double)b;
  return t;
}

/* The call's tensors and sizes as the kernels below name them (a: the sn__rn_fwd_t, passed by
 * value; T: the element type). */
#define RN_FWD_UNPACK(a)                                                                      \
  T *y = (T *)(a).y, *sum_out = (T *)(a).sum_out;                                             \
  float *mean_out = (a).mean, *rstd_out = (a).rstd;                                           \
  const T *x = (const T *)(a).x, *res = (const T *)(a).res;                                   \
  const float *gamma = (a).gamma, *beta = (a).beta;                                           \
  const int64_t rows = (a).rows, d = (a).d;                                                   \
  const float eps = (a).eps;                                                                  \
  const bool rms = (a).rms != 0

/* The call a: y [rows, d] = norm(x) (res == NULL) or norm(sum_out = round(x + res)); mean
 * (LayerNorm only), rstd [rows] f32 or NULL; gamma, beta [d] f32 or NULL (beta NULL for
 * RMSNorm). rms: RMSNorm.
 * pvec: gamma and beta (where given) 16-byte aligned (used by the vector path only).
 * y may equal x (plain); sum_out may equal x or res (each thread reads its elements of both
 * before it stores them). No __restrict__: those pointers may alias. */
template <typename T, int VPT, bool VEC>
__global__ void __launch_bounds__(kFwdMaxThreads)
    rn_fwd_kernel(const sn__rn_fwd_t a, bool pvec) {
  RN_FWD_UNPACK(a);
  typedef rn_row<T, VPT, VEC> R;
  constexpr int W = R::W, C = R::C, Q = VPT < 4 ? VPT : 4; /* Q: RMSNorm's f32 squares per run */
  __shared__ double scratch[32];
  const double dd = (double)d;
  const float thr = rn_thr<T>();
  const bool pv = VEC && pvec;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * d;
    float v[VPT];
    R::load(v, x + off, d);
    if (res != nullptr) {
      float w[VPT];
      R::load(w, res + off, d);
      T s[VPT];
#pragma unroll
      for (int j = 0; j < VPT; j++) {
        s[j] = sn_io<T>::narrow(v[j] + w[j]);
        v[j] = sn_io<T>::widen(s[j]); /* normalize the rounded sum */
      }
      R::store(sum_out + off, s, d);
    }
    /* fast: the row is mapped in f32 (block-uniform: decided from block sums) */
    double mu = 0.0, rs;
    float m = 0.0f, cf = 0.0f;
    bool fast;
    if (!rms) {
      /* pass 1: Σx, compensated in f32 per thread (0 past d) */
      float s = 0.0f, e = 0.0f;
#pragma unroll
      for (int j = 0; j < VPT; j++) rn_two_sum(s, e, v[j]);
      const double mu1 = sn__block_sum((double)s + (double)e, scratch) / dd;
      /* pass 2 in fp64 around the pass-1 mean (accurate to fp64 rounding: the per-element fp64
       * fallback below needs statistics that exact) */
      double q = 0.0;
#pragma unroll
      for (int j = 0; j < VPT; j++) {
        const double t = (double)v[j] - mu1;
        if (R::col(j) < d) q += t * t;
      }
      mu = mu1;
      rs = 1.0 / sqrt(sn__block_sum(q, scratch) / dd + (double)eps);
      m = (float)mu; /* mean = m + c as two floats, |c| <= 2^-24·|mean| */
      cf = (float)(mu - (double)m);
      /* f32 only where the mean is finite and far from the f32 range (NaN fails) */
      fast = fabs(mu) < 0x1p103;
      if (!fast) { /* two-pass fp64 statistics of the held row */
        double s2 = 0.0;
#pragma unroll
        for (int j = 0; j < VPT; j++) s2 += (double)v[j]; /* 0 past d */
        mu = sn__block_sum(s2, scratch) / dd;
        double q3 = 0.0;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
          const double t = (double)v[j] - mu;
          if (R::col(j) < d) q3 += t * t;
        }
        rs = 1.0 / sqrt(sn__block_sum(q3, scratch) / dd + (double)eps);
      }
    } else {
      /* Σx² in f32 runs of Q squares (0 past d), each run added in fp64; a thread whose run
       * leaves [2^-60, f32 max] (underflowing or overflowing squares, NaN) sums in fp64 */
      double q = 0.0;
      bool ok = true;
#pragma unroll
      for (int j0 = 0; j0 < VPT; j0 += Q) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < Q; k++) acc = fmaf(v[j0 + k], v[j0 + k], acc);
        ok = ok & (acc >= 0x1p-60f) & (acc <= kF32Max);
        q += (double)acc;
      }
      if (!ok) {
        q = 0.0;
#pragma unroll
        for (int j = 0; j < VPT; j++) q += (double)v[j] * (double)v[j]; /* 0 past d */
      }
      const double S = sn__block_sum(q, scratch);
      rs = 1.0 / sqrt(S / dd + (double)eps);
      fast = isfinite(S);
    }
    if (threadIdx.x == 0) {
      if (mean_out != nullptr) mean_out[r] = (float)mu;
      if (rstd_out != nullptr) rstd_out[r] = (float)rs;
    }
    const float rf = (float)rs;
    T o[VPT];
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i0 = (c * (int)blockDim.x + (int)threadIdx.x) * W;
      float gv[W], bv[W];
      if (i0 < d) { /* a chunk is wholly in the row or wholly out */
        rn_params<W>(gv, gamma, i0, pv, 1.0f);
        rn_params<W>(bv, beta, i0, pv, 0.0f);
      } else {
#pragma unroll
        for (int k = 0; k < W; k++) {
          gv[k] = 1.0f;
          bv[k] = 0.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < W; k++) {
        const int j = c * W + k;
        const float g = gv[k], b = bv[k], sg = rf * g;
        float yv;
        bool slow = !fast;
        if (!rms) {
          /* y = (x − m − c)·(rstd·gamma) + beta; fp64 where beta cancels (bf16/f16), where
           * rstd·gamma is tiny (bf16/f16) and where y is not finite */
          const float u = (v[j] - m) - cf, a = u * sg;
          yv = fmaf(u, sg, b);
          slow = slow || !(fabsf(yv) <= kF32Max) ||
                 (thr > 0.0f &&
                  !(fabsf(yv) >= thr * (fabsf(a) + fabsf(cf * sg)) && fabsf(sg) >= 0x1p-100f));
        } else {
          yv = (v[j] * rf) * g; /* y = (x·rstd)·gamma, as the CPU */
          slow = slow || !(fabsf(yv) <= kF32Max);
        }
        o[j] = slow ? sn_io<T>::narrow_d(rn_map_d(v[j], mu, rs, g, b)) : sn_io<T>::narrow(yv);
      }
    }
    R::store(y + off, o, d);
  }
}

/* rn_fwd_kernel for rows longer than the register path holds: the row is read from global
 * memory in each pass (fused: pass 1 stores sum_out, the later passes read it back). Each
 * thread touches the same columns in every pass, so in-place aliasing is safe as in
 * rn_fwd_kernel. */
template <typename T>
__global__ void __launch_bounds__(kFwdMaxThreads)
    rn_fwd_big(const sn__rn_fwd_t a) {
  RN_FWD_UNPACK(a);
  __shared__ double scratch[32];
  const double dd = (double)d;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * d;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      float v = sn_io<T>::widen(x[off + i]);
      if (res != nullptr) {
        const T sv = sn_io<T>::narrow(v + sn_io<T>::widen(res[off + i]));
        sum_out[off + i] = sv;
        v = sn_io<T>::widen(sv);
      }
      s += rms ? (double)v * (double)v : (double)v;
    }
    const T *src = res != nullptr ? sum_out + off : x + off;
    s = sn__block_sum(s, scratch) / dd;
    double mu = 0.0, rs;
    if (!rms) {
      mu = s;
      double q = 0.0;
      for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        const double t = (double)sn_io<T>::widen(src[i]) - mu;
        q += t * t;
      }
      rs = 1.0 / sqrt(sn__block_sum(q, scratch) / dd + (double)eps);
    } else {
      rs = 1.0 / sqrt(s + (double)eps);
    }
    if (threadIdx.x == 0) {
      if (mean_out != nullptr) mean_out[r] = (float)mu;
      if (rstd_out != nullptr) rstd_out[r] = (float)rs;
    }
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      double t = ((double)sn_io<T>::widen(src[i]) - mu) * rs;
      if (gamma != nullptr) t *= (double)gamma[i];
      if (beta != nullptr) t += (double)beta[i];
      y[off + i] = sn_io<T>::narrow_d(t);
    }
  }
}

template <typename T> struct rn_fwd_launch {
  static constexpr int W = (int)(16 / sizeof(T));

  template <int VPT, bool VEC>
  static void go(const sn__rn_fwd_t &a, int threads, unsigned grid, cudaStream_t st) {
    if constexpr (VPT % (VEC ? W : 1) == 0)
      rn_fwd_kernel<T, VPT, VEC><<<grid, threads, 0, st>>>(
          a, rn_aligned16(a.gamma) && rn_aligned16(a.beta));
  }
  static void run(const sn__rn_fwd_t &a, cudaStream_t st) {
    const unsigned grid = (unsigned)(a.rows < kMaxGrid ? a.rows : kMaxGrid);
    const bool vec = (a.d * (int64_t)sizeof(T)) % 16 == 0 && rn_aligned16(a.y) &&
                     rn_aligned16(a.sum_out) && rn_aligned16(a.x) && rn_aligned16(a.res);
    /* scalar rows hold at most 8 per thread: 16 spilled registers at 1024 threads (ptxas -v) */
    const int max_vpt = vec ? 16 : 8;
    if (a.d > (int64_t)max_vpt * kFwdMaxThreads) {
      rn_fwd_big<T><<<grid, kFwdMaxThreads, 0, st>>>(a);
      return;
    }
    /* at most max_vpt·kFwdMaxThreads elements here, so at most 1024 threads */
    int threads = 0;
    const int vpt = rn_pick_vpt(a.d, vec ? W : 1, max_vpt, kFwdPrefThreads, &threads);
    rn_launch_vpt<rn_fwd_launch<T>>(a, vpt, vec, threads, grid, st);
  }
};

}  // namespace

sn_status_t sn__cuda_rn_fwd(const char *fn, const sn__rn_fwd_t &a, cudaStream_t stream) {
  int64_t n;
  SN_TRY(sn__rownorm_fwd_check(fn, &a, &n));
  if (n == 0) return SN_OK;
  SN_TRY(sn__rownorm_fwd_spans(fn, &a));
  SN_TRY(sn__cuda_pending(fn));
  SN_CUDA_DISPATCH(a.dtype, rn_fwd_launch<T>::run(a, stream));
  return sn__cuda_launched(fn);
}
