/*
 * batchnorm.cuh — what the BatchNorm forward (batchnorm.cu: statistics, finalize, running
 * statistics, apply, training forward, inference) and backward (batchnorm_bwd.cu: backward sums
 * and dx) share on the device: the per-channel reductions, the elementwise maps and the workspace
 * layout. The CPU twins: src/cpu/batchnorm.h, batchnorm.c, batchnorm_bwd.c. Internal, not
 * installed; each file that includes it gets its own copy (an unnamed namespace).
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC); a "row" is one (n, s) position, R = N·S rows per
 * channel. With S == 1 both layouts are the same memory [N, C] and the NHWC kernels run.
 *
 * Reductions (stats, bwd_reduce): deterministic, no atomics. The rows are cut into P chunks of
 * ceil(R/P) rows (P a function of the shape only, bn_parts), each block writes fp64 partials
 * part[p·C + c] into the workspace, then bn_sum_parts adds them per channel in chunk order.
 *   NCHW: grid (channels, P), 256 threads; a block walks the planes of its chunk (contiguous s,
 *         coalesced; 16-byte loads when S % (16/sizeof(T)) == 0 and the tensors are 16-byte
 *         aligned, the chunk's unaligned ends element by element), thread partials added by
 *         sn__block_sum.
 *   NHWC, C % V == 0 (V = 16/sizeof(T)) and 16-byte aligned: grid (tiles of 8·V channels, P),
 *         blocks of 8 channel groups × 32 rows; a thread owns V channels (16-byte loads, V pairs
 *         of fp64 sums) and walks every 32nd row of the chunk; the 32 row partials of a channel
 *         are added in row order through shared memory.
 *   NHWC otherwise: grid (channel tiles of 32, P), blocks of 32 channels × 8 rows; a thread owns
 *         a channel and walks every 8th row of the chunk (a warp reads 32 contiguous channels);
 *         the 8 row partials are added in row order through shared memory.
 *   Every element is widened to fp64 before it is added, whatever the path.
 * Elementwise passes (apply, infer, bwd_apply): per-channel constants in fp64 computed once per
 * thread (not per element), the map in fp64, rounded to the dtype once (each output within 1/2
 * ulp of the fp64 value of the formula; one formula for every element, whichever kernel). NHWC (and
 * S == 1): a thread owns V consecutive channels (16-byte accesses when C % V == 0 and the
 * tensors are aligned, else V = 1) and walks rows; NCHW: a block row per plane (n, c), the
 * channel known per block, 16-byte accesses when S % V == 0 and aligned.
 *
 * Workspace (bn_ws): part1, part2 [P·C] f64 | sum1, sum2 [C] f64 | piv [C] f32 | flag [C] int,
 * each 256-byte aligned; the size depends on (n, c, s, layout) only.
 */
#ifndef SN_CUDA_BATCHNORM_CUH
#define SN_CUDA_BATCHNORM_CUH

#include <math.h>

#include "common.cuh"

namespace {

constexpr int kRedThreads = 256;       /* NCHW reduction block */
constexpr int kTileC = 32, kTileR = 8; /* NHWC reduction block: 32 channels × 8 rows */
constexpr int kMapThreads = 256;       /* elementwise and per-channel kernels */
constexpr int64_t kTargetBlocks = 1056; /* ~8 blocks per SM of a 132-SM GPU */
constexpr int64_t kMaxParts = 1024;
constexpr int64_t kMaxGrid = 65535;    /* gridDim.x cap; kernels loop beyond it */

/* NaN as the one quiet NaN (positive, payload 0), as the CPU's sn__nan_canon. */
__device__ __forceinline__ double bn_canon(double v) {
  return isnan(v) ? __longlong_as_double(0x7ff8000000000000LL) : v;
}

/* ---- reductions ------------------------------------------------------------------------------ */

/* One reduction: stats: part1 = Σ (a − p_c), part2 = Σ (a − p_c)² (pivot NULL = 0);
 * bwd: part1 = Σ a, part2 = Σ a·(b − mean_c) (a = dy, b = x; rstd applied in bn_sum_parts).
 * flag [C] or NULL: only channels with flag[c] != 0 are summed (the fwd's refinement). */
struct RedArgs {
  const void *a, *b;
  const float *pivot;
  const double *mean;
  const int *flag;
  double *part1, *part2; /* [P·C] */
  int64_t c, s, rows, chunk;
};

template <typename T, bool BWD>
__device__ __forceinline__ void red_elem(const T *a, const T *b, int64_t off, double shift,
                                         double &s1, double &s2) {
  if (BWD) {
    const double dy = (double)sn_io<T>::widen(a[off]);
    s1 += dy;
    s2 += dy * ((double)sn_io<T>::widen(b[off]) - shift);
  } else {
    const double t = (double)sn_io<T>::widen(a[off]) - shift;
    s1 += t;
    s2 += t * t;
  }
}

template <bool BWD>
__device__ __forceinline__ double red_shift(const RedArgs &r, int64_t c) {
  if (BWD) return r.mean[c];
  return r.pivot ? (double)r.pivot[c] : 0.0;
}

/* V consecutive elements of one 16-byte (V > 1) or element-sized (V == 1) access. */
template <typename T, int V>
struct alignas(sizeof(T) * V) MapVec {
  T v[V];
};

constexpr int kVecTileG = 8, kVecRows = 32, kVecUnroll = 4;

template <typename T, bool BWD>
__device__ __forceinline__ void red_val(T av, T bv, double shift, double &s1, double &s2) {
  if (BWD) {
    const double dy = (double)sn_io<T>::widen(av);
    s1 += dy;
    s2 += dy * ((double)sn_io<T>::widen(bv) - shift);
  } else {
    const double t = (double)sn_io<T>::widen(av) - shift;
    s1 += t;
    s2 += t * t;
  }
}

/* grid (channel blocks, P), kRedThreads threads. V > 1: S % V == 0 and 16-byte aligned
 * tensors, the planes read in 16-byte accesses (V = 16/sizeof(T)). */
template <typename T, bool BWD, int V>
__global__ void __launch_bounds__(kRedThreads) bn_reduce_nchw(RedArgs r) {
  typedef MapVec<T, V> Vt;
  __shared__ double scratch[32];
  const T *a = (const T *)r.a, *b = (const T *)r.b;
  const int64_t p = blockIdx.y, r0 = p * r.chunk;
  const int64_t r1 = r0 + r.chunk < r.rows ? r0 + r.chunk : r.rows;
  for (int64_t c = blockIdx.x; c < r.c; c += gridDim.x) {
    if (r.flag && !r.flag[c]) continue; /* the same c for the whole block */
    const double shift = red_shift<BWD>(r, c);
    double s1 = 0.0, s2 = 0.0;
    for (int64_t n = r0 / r.s; n * r.s < r1; n++) { /* the planes of rows [r0, r1) */
      const int64_t lo = r0 - n * r.s > 0 ? r0 - n * r.s : 0;
      const int64_t hi = r1 - n * r.s < r.s ? r1 - n * r.s : r.s;
      const int64_t base = (n * r.c + c) * r.s;
      if (V == 1) {
        for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x)
          red_elem<T, BWD>(a, b, base + k, shift, s1, s2);
        continue;
      }
      /* base % V == 0 (S % V == 0): [lo, vlo) and [vhi, hi) element by element (fewer than V
       * each, threads 0 .. V − 1), [vlo, vhi) in V-element accesses, kVecUnroll in flight */
      int64_t vlo = (lo + V - 1) / V * V, vhi = hi / V * V;
      if (vlo > hi) vlo = hi;
      if (vhi < vlo) vhi = vlo;
      if ((int64_t)threadIdx.x < vlo - lo)
        red_elem<T, BWD>(a, b, base + lo + threadIdx.x, shift, s1, s2);
      if ((int64_t)threadIdx.x < hi - vhi)
        red_elem<T, BWD>(a, b, base + vhi + threadIdx.x, shift, s1, s2);
      const Vt *va = (const Vt *)(a + base + vlo), *vb = BWD ? (const Vt *)(b + base + vlo) : va;
      const int64_t nv = (vhi - vlo) / V;
      for (int64_t k = threadIdx.x; k < nv; k += (int64_t)blockDim.x * kVecUnroll) {
        Vt xa[kVecUnroll], xb[kVecUnroll];
#pragma unroll
        for (int u = 0; u < kVecUnroll; u++) {
          const int64_t kk = k + (int64_t)u * blockDim.x;
          if (kk < nv) {
            xa[u] = va[kk];
            if (BWD) xb[u] = vb[kk];
            else xb[u] = xa[u];
          }
        }
#pragma unroll
        for (int u = 0; u < kVecUnroll; u++) {
          const int64_t kk = k + (int64_t)u * blockDim.x;
          if (kk < nv) {
#pragma unroll
            for (int j = 0; j < V; j++) red_val<T, BWD>(xa[u].v[j], xb[u].v[j], shift, s1, s2);
          }
        }
      }
    }
    s1 = sn__block_sum(s1, scratch);
    s2 = sn__block_sum(s2, scratch);
    if (threadIdx.x == 0) r.part1[p * r.c + c] = s1, r.part2[p * r.c + c] = s2;
  }
}

/* grid (channel tiles, P), block (kTileC, kTileR). */
template <typename T, bool BWD>
__global__ void __launch_bounds__(kTileC *kTileR) bn_reduce_nhwc(RedArgs r) {
  __shared__ double sh1[kTileR][kTileC], sh2[kTileR][kTileC];
  const T *a = (const T *)r.a, *b = (const T *)r.b;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t p = blockIdx.y, r0 = p * r.chunk;
  const int64_t r1 = r0 + r.chunk < r.rows ? r0 + r.chunk : r.rows;
  for (int64_t c0 = (int64_t)blockIdx.x * kTileC; c0 < r.c; c0 += (int64_t)gridDim.x * kTileC) {
    const int64_t c = c0 + tx;
    const bool live = c < r.c && (r.flag == nullptr || r.flag[c] != 0);
    if (!__syncthreads_or(live)) continue; /* block-uniform */
    double s1 = 0.0, s2 = 0.0;
    if (live) {
      const double shift = red_shift<BWD>(r, c);
      for (int64_t row = r0 + ty; row < r1; row += kTileR)
        red_elem<T, BWD>(a, b, row * r.c + c, shift, s1, s2);
    }
    sh1[ty][tx] = s1, sh2[ty][tx] = s2;
    __syncthreads();
    if (ty == 0 && live) {
      double t1 = 0.0, t2 = 0.0;
      for (int j = 0; j < kTileR; j++) t1 += sh1[j][tx], t2 += sh2[j][tx];
      r.part1[p * r.c + c] = t1, r.part2[p * r.c + c] = t2;
    }
    __syncthreads(); /* sh read before the next tile writes it */
  }
}

/* NHWC with C % V == 0 and 16-byte aligned tensors (V = 16/sizeof(T)): grid (tiles of
 * kVecTileG groups of V channels, P), block (kVecTileG, kVecRows). Thread (tx, ty) owns group
 * g = tile·kVecTileG + tx (channels g·V .. g·V + V − 1, V pairs of fp64 sums) and walks the rows
 * r0 + ty, r0 + ty + kVecRows, ... of its chunk in order (kVecUnroll 16-byte loads in flight);
 * a warp reads 4 rows × 128 contiguous bytes. The kVecRows row sums of a channel are then added
 * in ty order through shared memory by one thread per channel. */
template <typename T, bool BWD, int V>
__global__ void __launch_bounds__(kVecTileG *kVecRows) bn_reduce_nhwc_vec(RedArgs r) {
  typedef MapVec<T, V> Vt;
  __shared__ double sh1[kVecRows][kVecTileG * V], sh2[kVecRows][kVecTileG * V];
  const Vt *a = (const Vt *)r.a, *b = (const Vt *)r.b;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kVecTileG + tx;
  const int64_t G = r.c / V;
  const int64_t p = blockIdx.y, r0 = p * r.chunk;
  const int64_t r1 = r0 + r.chunk < r.rows ? r0 + r.chunk : r.rows;
  for (int64_t t0 = (int64_t)blockIdx.x * kVecTileG; t0 < G;
       t0 += (int64_t)gridDim.x * kVecTileG) {
    const int64_t g = t0 + tx;
    bool live = false;
    double shift[V], s1[V], s2[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
      s1[j] = 0.0, s2[j] = 0.0, shift[j] = 0.0;
      if (g < G) {
        const int64_t c = g * V + j;
        if (r.flag == nullptr || r.flag[c] != 0) live = true;
        shift[j] = red_shift<BWD>(r, c);
      }
    }
    if (!__syncthreads_or(live)) continue; /* block-uniform */
    if (live) {
      for (int64_t row = r0 + ty; row < r1; row += (int64_t)kVecRows * kVecUnroll) {
        Vt va[kVecUnroll], vb[kVecUnroll];
#pragma unroll
        for (int u = 0; u < kVecUnroll; u++) {
          const int64_t rr = row + (int64_t)u * kVecRows;
          if (rr < r1) {
            va[u] = a[rr * G + g];
            if (BWD) vb[u] = b[rr * G + g];
            else vb[u] = va[u];
          }
        }
#pragma unroll
        for (int u = 0; u < kVecUnroll; u++) {
          const int64_t rr = row + (int64_t)u * kVecRows;
          if (rr < r1) {
#pragma unroll
            for (int j = 0; j < V; j++)
              red_val<T, BWD>(va[u].v[j], vb[u].v[j], shift[j], s1[j], s2[j]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < V; j++) sh1[ty][tx * V + j] = s1[j], sh2[ty][tx * V + j] = s2[j];
    __syncthreads();
    if (tid < kVecTileG * V) {
      const int64_t c = t0 * V + tid; /* group t0 + tid/V, channel tid%V of it */
      if (c < r.c && (r.flag == nullptr || r.flag[c] != 0)) {
        double t1 = 0.0, t2 = 0.0;
        for (int j = 0; j < kVecRows; j++) t1 += sh1[j][tid], t2 += sh2[j][tid];
        r.part1[p * r.c + c] = t1, r.part2[p * r.c + c] = t2;
      }
    }
    __syncthreads(); /* sh read before the next tile writes it */
  }
}

/* out1[c] = Σ_p part1[p·C + c], out2[c] = Σ_p part2[p·C + c] (· rstd[c] where rstd is given),
 * chunk order, for one channel. */
__device__ __forceinline__ void sum_parts_c(double *out1, double *out2, const double *part1,
                                            const double *part2, int64_t P, int64_t C,
                                            const float *rstd, int64_t c) {
  double s1 = 0.0, s2 = 0.0;
  for (int64_t p = 0; p < P; p++) s1 += part1[p * C + c], s2 += part2[p * C + c];
  out1[c] = bn_canon(s1);
  out2[c] = bn_canon(rstd ? __dmul_rn(s2, (double)rstd[c]) : s2);
}

/* sum_parts_c for every channel; only flagged channels where flag is given. */
__global__ void bn_sum_parts(double *out1, double *out2, const double *part1, const double *part2,
                             int64_t P, int64_t C, const float *rstd, const int *flag) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    if (flag && !flag[c]) continue;
    sum_parts_c(out1, out2, part1, part2, P, C, rstd, c);
  }
}

/* ---- elementwise maps ------------------------------------------------------------------------ */

enum { MAP_APPLY, MAP_INFER, MAP_BWD, MAP_BWD_EVAL };

struct MapArgs {
  void *out;
  const void *in, *x;             /* in: x (apply, infer) or dy (bwd); x: bwd only */
  const double *mean;             /* apply, bwd */
  const float *rstd;              /* apply, bwd, bwd eval */
  const float *rmean, *rvar;      /* infer */
  const float *gamma, *beta;      /* or NULL */
  const double *sum_dy, *sum_dy_xhat;
  double eps, count;
  int64_t rows, c, s; /* rows = N·S > 0 */
};

/* apply:    y = (x − mean)·(gamma·rstd) + beta
 * infer:    y = (x − running_mean)·(gamma/√(running_var + eps)) + beta (running_var < 0: NaN)
 * bwd:      k = gamma·rstd: dx = (dy·k − k·Σdy/count) − (x − mean)·(k·rstd·Σdy·x̂/count)
 * bwd eval: dx = dy·(gamma·rstd)
 * (the constants of the CPU's ew_consts), all in fp64, rounded to T once. The per-channel
 * constants are computed once per thread and channel (map_consts), the per-element part in
 * map_elem: the same fp64 operations in the same order for every element. */
template <int KIND>
__device__ __forceinline__ void map_consts(const MapArgs &m, int64_t c, double *k) {
  const double g = m.gamma ? (double)m.gamma[c] : 1.0;
  if (KIND == MAP_APPLY) {
    k[0] = m.mean[c];
    k[1] = g * (double)m.rstd[c];
    k[2] = m.beta ? (double)m.beta[c] : 0.0;
    k[3] = 0.0;
  } else if (KIND == MAP_INFER) {
    k[0] = (double)m.rmean[c];
    /* running_var < 0 (the CPU's SN_ERR_INVALID_ARGUMENT): NaN, also where rvar + eps > 0 */
    const float rv = m.rvar[c];
    k[1] = rv < 0.0f ? (double)NAN : g / sqrt((double)rv + m.eps);
    k[2] = m.beta ? (double)m.beta[c] : 0.0;
    k[3] = 0.0;
  } else if (KIND == MAP_BWD) {
    const double kk = g * (double)m.rstd[c];
    k[0] = kk;
    k[1] = kk * (m.sum_dy[c] / m.count);
    k[2] = kk * (double)m.rstd[c] * (m.sum_dy_xhat[c] / m.count);
    k[3] = m.mean[c];
  } else {
    k[0] = g * (double)m.rstd[c];
    k[1] = k[2] = k[3] = 0.0;
  }
}

template <typename T, int KIND>
__device__ __forceinline__ T map_elem(const double *k, T in, T xv) {
  const double v = (double)sn_io<T>::widen(in);
  double y;
  if (KIND == MAP_APPLY || KIND == MAP_INFER) {
    y = (v - k[0]) * k[1] + k[2];
  } else if (KIND == MAP_BWD) {
    y = (v * k[0] - k[1]) - ((double)sn_io<T>::widen(xv) - k[3]) * k[2];
  } else {
    y = v * k[0];
  }
  return sn_io<T>::narrow_d(y);
}

constexpr int kMapUnrollNchw = 2;
/* NHWC accesses per thread in flight: 4 of one tensor, 2 of each of bwd's two */
template <int KIND> constexpr int map_unroll_nhwc() { return KIND == MAP_BWD ? 2 : 4; }

/* NHWC (and S == 1): the row of C channels is G = C/V groups of V channels. Thread (tx, ty)
 * owns group gi = blockIdx.x·blockDim.x + tx (its V channels' constants in registers) and walks
 * the rows ty + blockDim.y·(blockIdx.y + gridDim.y·j); consecutive threads of a block read
 * consecutive groups (and rows when blockDim.x == G): coalesced. Each element once, by one
 * thread, which reads it before it writes it (in place is safe). */
template <typename T, int KIND, int V>
__global__ void __launch_bounds__(kMapThreads, 2) bn_map_nhwc(MapArgs m) {
  constexpr int kMapUnrollNhwc = map_unroll_nhwc<KIND>();
  typedef MapVec<T, V> Vt;
  constexpr bool kX = KIND == MAP_BWD;
  const Vt *in = (const Vt *)m.in, *xs = (const Vt *)m.x;
  Vt *out = (Vt *)m.out;
  const int64_t G = m.c / V, rows = m.rows;
  const int64_t step = (int64_t)gridDim.y * blockDim.y;
  for (int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < G;
       gi += (int64_t)gridDim.x * blockDim.x) {
    double k[V][4];
#pragma unroll
    for (int j = 0; j < V; j++) map_consts<KIND>(m, gi * V + j, k[j]);
    for (int64_t r0 = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r0 < rows;
         r0 += step * kMapUnrollNhwc) {
      Vt a[kMapUnrollNhwc], b[kMapUnrollNhwc];
#pragma unroll
      for (int u = 0; u < kMapUnrollNhwc; u++) {
        const int64_t r = r0 + u * step;
        if (r < rows) {
          a[u] = in[r * G + gi];
          if (kX) b[u] = xs[r * G + gi];
          else b[u] = a[u];
        }
      }
#pragma unroll
      for (int u = 0; u < kMapUnrollNhwc; u++) {
        const int64_t r = r0 + u * step;
        if (r < rows) {
          Vt o;
#pragma unroll
          for (int j = 0; j < V; j++) o.v[j] = map_elem<T, KIND>(k[j], a[u].v[j], b[u].v[j]);
          out[r * G + gi] = o;
        }
      }
    }
  }
}

/* NCHW (S > 1): plane p = n·C + c (blockIdx.y + gridDim.y·j) of S/V accesses of V elements,
 * walked by the blocks blockIdx.x; the channel is the plane's, one division per block and plane.
 * Each element once, by one thread, read before it is written. */
template <typename T, int KIND, int V>
__global__ void __launch_bounds__(kMapThreads) bn_map_nchw(MapArgs m) {
  typedef MapVec<T, V> Vt;
  constexpr bool kX = KIND == MAP_BWD;
  const Vt *in = (const Vt *)m.in, *xs = (const Vt *)m.x;
  Vt *out = (Vt *)m.out;
  const int64_t nv = m.s / V, planes = m.rows / m.s * m.c;
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t pl = blockIdx.y; pl < planes; pl += gridDim.y) {
    double k[4];
    map_consts<KIND>(m, pl % m.c, k);
    const int64_t base = pl * nv;
    for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < nv;
         i0 += step * kMapUnrollNchw) {
      Vt a[kMapUnrollNchw], b[kMapUnrollNchw];
#pragma unroll
      for (int u = 0; u < kMapUnrollNchw; u++) {
        const int64_t i = i0 + u * step;
        if (i < nv) {
          a[u] = in[base + i];
          if (kX) b[u] = xs[base + i];
          else b[u] = a[u];
        }
      }
#pragma unroll
      for (int u = 0; u < kMapUnrollNchw; u++) {
        const int64_t i = i0 + u * step;
        if (i < nv) {
          Vt o;
#pragma unroll
          for (int j = 0; j < V; j++) o.v[j] = map_elem<T, KIND>(k, a[u].v[j], b[u].v[j]);
          out[base + i] = o;
        }
      }
    }
  }
}

/* ---- host side ------------------------------------------------------------------------------- */

int bn_nhwc(int64_t s, sn_layout_t layout) { return layout == SN_LAYOUT_NHWC || s == 1; }

/* The number of row chunks P of the reductions: enough blocks to fill the GPU
 * (kTargetBlocks), not fewer than ~1024 (NCHW) or 64 (NHWC, per channel) rows per chunk, at
 * most kMaxParts. A function of the shape only. 0 for an empty batch. */
int64_t bn_parts(int64_t n, int64_t c, int64_t s, sn_layout_t layout) {
  const int64_t rows = n * s;
  if (rows == 0) return 0;
  const int nhwc = bn_nhwc(s, layout);
  const int64_t blocks_c = nhwc ? (c + kTileC - 1) / kTileC : c;
  const int64_t min_rows = nhwc ? 64 : 1024;
  int64_t p = (kTargetBlocks + blocks_c - 1) / blocks_c;
  const int64_t lim = (rows + min_rows - 1) / min_rows;
  if (p > lim) p = lim;
  if (p > kMaxParts) p = kMaxParts;
  return p < 1 ? 1 : p;
}

/* The workspace carved into its arrays. */
struct BnWs {
  double *part1, *part2, *sum1, *sum2;
  float *piv;
  int *flag;
};

/* Bytes of the workspace for P parts and C channels (0 when P == 0); sets *w from base where
 * base is not NULL. The caller checked P·C and C against overflow (bn_ws_bytes). */
size_t bn_ws_layout(int64_t P, int64_t C, void *base, BnWs *w) {
  if (P == 0) return 0;
  const size_t part = sn__cuda_align((size_t)(P * C) * 8), sum = sn__cuda_align((size_t)C * 8);
  const size_t f4 = sn__cuda_align((size_t)C * 4);
  if (base && w) {
    char *b = (char *)base;
    w->part1 = (double *)b;
    w->part2 = (double *)(b + part);
    w->sum1 = (double *)(b + 2 * part);
    w->sum2 = (double *)(b + 2 * part + sum);
    w->piv = (float *)(b + 2 * part + 2 * sum);
    w->flag = (int *)(b + 2 * part + 2 * sum + f4);
  }
  return 2 * part + 2 * sum + 2 * f4;
}

/* The workspace bytes of a valid shape (sn__check_ncs done), SN_ERR_OVERFLOW where they are not
 * addressable. */
sn_status_t bn_ws_bytes(const char *fn, int64_t n, int64_t c, int64_t s, sn_layout_t layout,
                        int64_t *parts, size_t *bytes) {
  const int64_t P = bn_parts(n, c, s, layout);
  int64_t pc;
  SN_TRY(sn__mul(fn, &pc, P, c));
  if (pc > INT64_MAX / 64 || c > INT64_MAX / 64)
    return sn__fail(SN_ERR_OVERFLOW, "%s: the workspace of %lld channels overflows", fn,
                    (long long)c);
  *parts = P;
  *bytes = bn_ws_layout(P, c, NULL, NULL);
  return SN_OK;
}

template <typename T, bool BWD>
void launch_reduce_parts(const RedArgs &r, int nhwc, int64_t P, cudaStream_t stream) {
  constexpr int V = 16 / (int)sizeof(T);
  const uintptr_t al = (uintptr_t)r.a | (BWD ? (uintptr_t)r.b : 0);
  if (nhwc && r.c % V == 0 && (al & 15u) == 0) {
    const int64_t tiles = (r.c / V + kVecTileG - 1) / kVecTileG;
    const dim3 grid((unsigned)(tiles < kMaxGrid ? tiles : kMaxGrid), (unsigned)P);
    bn_reduce_nhwc_vec<T, BWD, V><<<grid, dim3(kVecTileG, kVecRows), 0, stream>>>(r);
  } else if (nhwc) {
    const int64_t tiles = (r.c + kTileC - 1) / kTileC;
    const dim3 grid((unsigned)(tiles < kMaxGrid ? tiles : kMaxGrid), (unsigned)P);
    bn_reduce_nhwc<T, BWD><<<grid, dim3(kTileC, kTileR), 0, stream>>>(r);
  } else {
    const dim3 grid((unsigned)(r.c < kMaxGrid ? r.c : kMaxGrid), (unsigned)P);
    if (r.s % V == 0 && (al & 15u) == 0)
      bn_reduce_nchw<T, BWD, V><<<grid, kRedThreads, 0, stream>>>(r);
    else
      bn_reduce_nchw<T, BWD, 1><<<grid, kRedThreads, 0, stream>>>(r);
  }
}

/* What bn_reduce sums (RedArgs; the sums of BWD or of the statistics) and where the per-channel
 * totals go. */
struct BnRed {
  const void *a, *b;   /* statistics: a = x, b NULL; BWD: a = dy, b = x */
  const float *pivot;  /* statistics: [C] or NULL (0) */
  const double *mean;  /* BWD: [C] */
  const float *rstd;   /* BWD: [C], applied to out2 per channel */
  const int *flag;     /* [C] or NULL: only the channels with flag[c] != 0 are summed */
  double *out1, *out2; /* [C] f64 */
};

/* The partial sums then their per-channel totals into op.out1, op.out2; parts_only: the partials
 * only (the caller adds them). rows > 0. */
template <bool BWD>
void bn_reduce(const BnRed &op, const BnWs &w, int64_t n, int64_t c, int64_t s,
               sn_layout_t layout, sn_dtype_t dtype, cudaStream_t stream, bool parts_only = false) {
  const int64_t P = bn_parts(n, c, s, layout), rows = n * s;
  const RedArgs r = {op.a, op.b, op.pivot, op.mean, op.flag, w.part1, w.part2,
                     c,    s,    rows,     (rows + P - 1) / P};
  const int nhwc = bn_nhwc(s, layout);
  SN_CUDA_DISPATCH(dtype, (launch_reduce_parts<T, BWD>(r, nhwc, P, stream)));
  if (parts_only) return; /* the caller adds the parts (bn_fwd_step) */
  bn_sum_parts<<<sn__cuda_grid(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
      op.out1, op.out2, w.part1, w.part2, P, c, op.rstd, op.flag);
}

/* One map kernel of layout and vector width V. */
template <typename T, int KIND, int V>
void launch_map_kind(const MapArgs &m, int nhwc, cudaStream_t stream) {
  if (nhwc) {
    /* blockDim.x: the groups (up to kMapThreads), blockDim.y: rows, ~kMapThreads threads */
    const int64_t G = m.c / V;
    const int bx = G < kMapThreads ? (int)G : kMapThreads, by = kMapThreads / bx;
    const int64_t gx64 = (G + bx - 1) / bx;
    const unsigned gx = (unsigned)(gx64 < kMaxGrid ? gx64 : kMaxGrid);
    constexpr int kMapUnrollNhwc = map_unroll_nhwc<KIND>();
    int64_t gy = (m.rows + (int64_t)by * kMapUnrollNhwc - 1) / ((int64_t)by * kMapUnrollNhwc);
    int64_t gy_cap = 2048 / (int64_t)gx;
    if (gy_cap < 1) gy_cap = 1;
    if (gy > gy_cap) gy = gy_cap;
    if (gy > kMaxGrid) gy = kMaxGrid;
    bn_map_nhwc<T, KIND, V><<<dim3(gx, (unsigned)gy), dim3((unsigned)bx, (unsigned)by), 0,
                              stream>>>(m);
  } else {
    /* threads: enough for a plane at kMapUnrollNchw accesses each, 32..kMapThreads */
    const int64_t nv = m.s / V, planes = m.rows / m.s * m.c;
    int64_t nt = (nv + kMapUnrollNchw - 1) / kMapUnrollNchw;
    nt = (nt + 31) / 32 * 32;
    if (nt > kMapThreads) nt = kMapThreads;
    int64_t gx = (nv + nt * kMapUnrollNchw - 1) / (nt * kMapUnrollNchw);
    if (gx > 4096) gx = 4096;
    const int64_t gy = planes < kMaxGrid ? planes : kMaxGrid;
    bn_map_nchw<T, KIND, V><<<dim3((unsigned)gx, (unsigned)gy), (unsigned)nt, 0, stream>>>(m);
  }
}

template <typename T, int KIND>
void launch_map_v(const MapArgs &m, int nhwc, cudaStream_t stream) {
  constexpr int V = 16 / (int)sizeof(T);
  const uintptr_t al = (uintptr_t)m.out | (uintptr_t)m.in | (KIND == MAP_BWD ? (uintptr_t)m.x : 0);
  const bool vec = (al & 15u) == 0 && (nhwc ? m.c : m.s) % V == 0;
  if (vec) launch_map_kind<T, KIND, V>(m, nhwc, stream);
  else launch_map_kind<T, KIND, 1>(m, nhwc, stream);
}

/* The map KIND over rows > 0. S == 1 runs the NHWC kernels (the same memory in both layouts). */
template <int KIND>
void bn_map_run(MapArgs m, int64_t rows, int64_t c, int64_t s, sn_layout_t layout,
                sn_dtype_t dtype, cudaStream_t stream) {
  m.rows = rows, m.c = c, m.s = s;
  SN_CUDA_DISPATCH(dtype, (launch_map_v<T, KIND>(m, bn_nhwc(s, layout), stream)));
}

/* Zeros into [C] f64 sums (an empty batch), as cudaMemsetAsync. */
sn_status_t bn_zero_sums(const char *fn, double *a, double *b, int64_t c, cudaStream_t stream) {
  SN_TRY(sn__cuda_status(fn, cudaMemsetAsync(a, 0, (size_t)c * 8, stream)));
  return sn__cuda_status(fn, cudaMemsetAsync(b, 0, (size_t)c * 8, stream));
}

} /* namespace */

#endif /* SN_CUDA_BATCHNORM_CUH */
