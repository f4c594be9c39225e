/*
 * batchnorm.cu — the BatchNorm building blocks on the device (syncnorm_cuda.h), twins of
 * src/cpu/batchnorm.c: shifted per-channel sums, finalize, update_running, apply, the training
 * forward, inference, backward sums and dx.
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC); a "row" is one (n, s) position, R = N·S rows per
 * channel. With S == 1 both layouts are the same memory [N, C] and the NHWC kernels run.
 *
 * Reductions (stats, bwd_reduce): deterministic, no atomics. The rows are cut into P chunks of
 * ceil(R/P) rows (P a function of the shape only, bn_parts), each block writes fp64 partials
 * part[p·C + c] into the workspace, then bn_sum_parts adds them per channel in chunk order.
 *   NCHW: grid (channels, P), 256 threads; a block walks the planes of its chunk (contiguous s,
 *         coalesced), thread partials added by sn__block_sum.
 *   NHWC: grid (channel tiles of 32, P), blocks of 32 channels × 8 rows; a thread owns a channel
 *         and walks every 8th row of the chunk (a warp reads 32 contiguous channels); the 8 row
 *         partials are added in row order through shared memory.
 * Elementwise passes (apply, infer, bwd_apply): a flat grid-stride loop, the channel of element
 * i from its index, per-channel constants in fp64 and the map in fp64, rounded to the dtype once
 * (each output within 1/2 ulp of the fp64 value of the formula).
 *
 * Workspace (bn_ws): part1, part2 [P·C] f64 | sum1, sum2 [C] f64 | piv [C] f32 | flag [C] int,
 * each 256-byte aligned; the size depends on (n, c, s, layout) only.
 */
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

/* grid (channel blocks, P), kRedThreads threads. */
template <typename T, bool BWD>
__global__ void __launch_bounds__(kRedThreads) bn_reduce_nchw(RedArgs r) {
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
      for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x)
        red_elem<T, BWD>(a, b, base + k, shift, s1, s2);
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

/* out1[c] = Σ_p part1[p·C + c], out2[c] = Σ_p part2[p·C + c] (· rstd[c] where rstd is given),
 * chunk order; only flagged channels where flag is given. */
__global__ void bn_sum_parts(double *out1, double *out2, const double *part1, const double *part2,
                             int64_t P, int64_t C, const float *rstd, const int *flag) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    if (flag && !flag[c]) continue;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t p = 0; p < P; p++) s1 += part1[p * C + c], s2 += part2[p * C + c];
    out1[c] = bn_canon(s1);
    out2[c] = bn_canon(rstd ? __dmul_rn(s2, (double)rstd[c]) : s2);
  }
}

/* sn__bn_refine on the device, for refinement `round` (1..SN_BN_REFINE_ROUNDS): piv [C] gets each
 * channel's pivot (round 1: from pivot, NULL = 0; later rounds: piv itself), flag[c] whether it
 * was refined (its sums must be redone around piv[c]). A channel not refined in one round has the
 * same sums and pivot in the next, so it is not refined then either, as on the CPU. */
__global__ void bn_refine(float *piv, int *flag, const double *sum, const double *sumsq,
                          const float *pivot, double count, int64_t C, int round) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    float p = round == 1 ? (pivot ? pivot[c] : 0.0f) : piv[c];
    int f = 0;
    if (!isfinite(p)) {
      p = 0.0f, f = 1;
    } else {
      const double m = sum[c] / count, v = __dsub_rn(sumsq[c] / count, __dmul_rn(m, m));
      if (round <= SN_BN_REFINE_ROUNDS && m != 0.0 &&
          __dmul_rn(m, m) > __dmul_rn(v, SN_BN_REFINE_RATIO)) {
        p = round != 2 ? (float)((double)p + m) : p != 0.0f ? 0.0f : (float)m;
        f = 1;
      }
    }
    piv[c] = p, flag[c] = f;
  }
}

/* finalize_channel of the CPU code, per channel. */
__global__ void bn_finalize(double *mean, float *var, float *rstd, const double *sum,
                            const double *sumsq, const float *pivot, double inv, float eps,
                            int64_t C) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    const double p = pivot ? (double)pivot[c] : 0.0;
    const double d = __dmul_rn(sum[c], inv);                             /* mean − pivot */
    double v = __dsub_rn(__dmul_rn(sumsq[c], inv), __dmul_rn(d, d));     /* biased variance */
    if (v < 0.0) v = 0.0;
    mean[c] = bn_canon(__dadd_rn(p, d));
    if (var) var[c] = (float)bn_canon(v);
    rstd[c] = (float)bn_canon(1.0 / sqrt(__dadd_rn(v, (double)eps)));
  }
}

/* The running statistics with factor f (momentum, or 1/(num_batches_tracked + 1) read before
 * bn_count_batch increments it: a separate, later kernel, so no thread reads the new value). A
 * negative counter (the CPU's SN_ERR_INVALID_ARGUMENT) gives NaN running statistics. */
__global__ void bn_update_running(float *rm, float *rv, const int64_t *nbt, const double *mean,
                                  const float *var, double momentum, int cumulative,
                                  double unbias, int64_t C) {
  double f = momentum;
  if (cumulative) {
    const int64_t old = *nbt;
    const int64_t now = old < INT64_MAX ? old + 1 : old;
    f = old < 0 ? __longlong_as_double(0x7ff8000000000000LL) : 1.0 / (double)now;
  }
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    rm[c] = (float)((1.0 - f) * (double)rm[c] + f * mean[c]);
    rv[c] = (float)((1.0 - f) * (double)rv[c] + f * (double)var[c] * unbias);
  }
}

/* num_batches_tracked += 1, saturating; a negative counter is left as it is. One thread. */
__global__ void bn_count_batch(int64_t *nbt) {
  const int64_t old = *nbt;
  if (old >= 0 && old < INT64_MAX) *nbt = old + 1;
}

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
  int64_t total, c, s;
  int nhwc;
};

/* apply:    y = (x − mean)·(gamma·rstd) + beta
 * infer:    y = (x − running_mean)·(gamma/√(running_var + eps)) + beta (running_var < 0: NaN)
 * bwd:      k = gamma·rstd: dx = (dy·k − k·Σdy/count) − (x − mean)·(k·rstd·Σdy·x̂/count)
 * bwd eval: dx = dy·(gamma·rstd)
 * (the constants of the CPU's ew_consts), all in fp64, rounded to T once. */
template <typename T, int KIND>
__global__ void __launch_bounds__(kMapThreads) bn_map(MapArgs m) {
  T *out = (T *)m.out;
  const T *in = (const T *)m.in, *x = (const T *)m.x;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m.total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = m.nhwc ? i % m.c : (i / m.s) % m.c;
    const double g = m.gamma ? (double)m.gamma[c] : 1.0;
    const double v = (double)sn_io<T>::widen(in[i]);
    double y;
    if (KIND == MAP_APPLY) {
      y = (v - m.mean[c]) * (g * (double)m.rstd[c]) + (m.beta ? (double)m.beta[c] : 0.0);
    } else if (KIND == MAP_INFER) {
      const double a = g / sqrt((double)m.rvar[c] + m.eps);
      y = (v - (double)m.rmean[c]) * a + (m.beta ? (double)m.beta[c] : 0.0);
    } else if (KIND == MAP_BWD) {
      const double k = g * (double)m.rstd[c];
      const double b = k * (m.sum_dy[c] / m.count);
      const double e = k * (double)m.rstd[c] * (m.sum_dy_xhat[c] / m.count);
      y = (v * k - b) - ((double)sn_io<T>::widen(x[i]) - m.mean[c]) * e;
    } else {
      y = v * (g * (double)m.rstd[c]);
    }
    out[i] = sn_io<T>::narrow_d(y);
  }
}

/* ---- host side ------------------------------------------------------------------------------- */

unsigned grid_for(int64_t work, int threads, int64_t cap) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return (unsigned)(b < cap ? b : cap);
}

/* sn__check_ncs of the CPU code (src/cpu/norm_kernels.h, a C header this file does not include). */
sn_status_t check_ncs(const char *fn, int64_t n, int64_t c, int64_t s, int64_t *rows) {
  int64_t nc, total;
  SN_TRY(sn__check_size(fn, "c", c, 1));
  SN_TRY(sn__check_size(fn, "n", n, 0));
  SN_TRY(sn__check_size(fn, "s", s, 0));
  SN_TRY(sn__check_elems(fn, "c", c));
  SN_TRY(sn__mul(fn, &nc, n, c));
  SN_TRY(sn__mul(fn, &total, nc, s));
  *rows = n * s;
  return SN_OK;
}

sn_status_t check_train_count(const char *fn, int64_t count) {
  if (count > 1) return SN_OK;
  return sn__fail(SN_ERR_INSUFFICIENT_COUNT,
                  "%s: expected more than 1 value per channel when training, got count %lld", fn,
                  (long long)count);
}

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

/* The workspace bytes of a valid shape (check_ncs done), SN_ERR_OVERFLOW where they are not
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
  if (nhwc) {
    const int64_t tiles = (r.c + kTileC - 1) / kTileC;
    const dim3 grid((unsigned)(tiles < kMaxGrid ? tiles : kMaxGrid), (unsigned)P);
    bn_reduce_nhwc<T, BWD><<<grid, dim3(kTileC, kTileR), 0, stream>>>(r);
  } else {
    const dim3 grid((unsigned)(r.c < kMaxGrid ? r.c : kMaxGrid), (unsigned)P);
    bn_reduce_nchw<T, BWD><<<grid, kRedThreads, 0, stream>>>(r);
  }
}

/* The partial sums then their per-channel totals into out1, out2 (rstd: bwd; flag: only the
 * flagged channels). rows > 0. */
void bn_reduce(bool bwd, const void *a, const void *b, const float *pivot, const double *mean,
               const float *rstd, const int *flag, double *out1, double *out2, const BnWs &w,
               int64_t n, int64_t c, int64_t s, sn_layout_t layout, sn_dtype_t dtype,
               cudaStream_t stream) {
  const int64_t P = bn_parts(n, c, s, layout), rows = n * s;
  const RedArgs r = {a, b, pivot, mean, flag, w.part1, w.part2, c, s, rows, (rows + P - 1) / P};
  const int nhwc = bn_nhwc(s, layout);
  if (bwd) SN_CUDA_DISPATCH(dtype, (launch_reduce_parts<T, true>(r, nhwc, P, stream)));
  else SN_CUDA_DISPATCH(dtype, (launch_reduce_parts<T, false>(r, nhwc, P, stream)));
  bn_sum_parts<<<grid_for(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
      out1, out2, w.part1, w.part2, P, c, rstd, flag);
}

template <typename T>
void launch_map(int kind, const MapArgs &m, cudaStream_t stream) {
  const unsigned grid = grid_for(m.total, kMapThreads, 8192);
  switch (kind) {
    case MAP_APPLY: bn_map<T, MAP_APPLY><<<grid, kMapThreads, 0, stream>>>(m); break;
    case MAP_INFER: bn_map<T, MAP_INFER><<<grid, kMapThreads, 0, stream>>>(m); break;
    case MAP_BWD: bn_map<T, MAP_BWD><<<grid, kMapThreads, 0, stream>>>(m); break;
    default: bn_map<T, MAP_BWD_EVAL><<<grid, kMapThreads, 0, stream>>>(m); break;
  }
}

void bn_map_run(int kind, MapArgs m, int64_t rows, int64_t c, int64_t s, sn_layout_t layout,
                sn_dtype_t dtype, cudaStream_t stream) {
  m.total = rows * c, m.c = c, m.s = s, m.nhwc = layout == SN_LAYOUT_NHWC;
  SN_CUDA_DISPATCH(dtype, launch_map<T>(kind, m, stream));
}

/* Zeros into [C] f64 sums (an empty batch), as cudaMemsetAsync. */
sn_status_t bn_zero_sums(const char *fn, double *a, double *b, int64_t c, cudaStream_t stream) {
  SN_TRY(sn__cuda_status(fn, cudaMemsetAsync(a, 0, (size_t)c * 8, stream)));
  return sn__cuda_status(fn, cudaMemsetAsync(b, 0, (size_t)c * 8, stream));
}

} /* namespace */

/* ---- public entry points --------------------------------------------------------------------- */

extern "C" sn_status_t sn_cuda_batchnorm_workspace(size_t *bytes, int64_t n, int64_t c, int64_t s,
                                                   sn_layout_t layout) {
  static const char fn[] = "sn_cuda_batchnorm_workspace";
  int64_t rows, P;
  size_t need;
  SN_TRY(sn__check_ptr(fn, "bytes", bytes));
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  *bytes = need;
  return SN_OK;
}

extern "C" sn_status_t sn_cuda_batchnorm_stats(double *sum, double *sumsq, const void *x,
                                               const float *pivot, int64_t n, int64_t c,
                                               int64_t s, sn_layout_t layout, sn_dtype_t dtype,
                                               void *workspace, size_t workspace_bytes,
                                               cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_stats";
  int64_t rows, P;
  size_t need;
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "sum", sum));
  SN_TRY(sn__check_ptr(fn, "sumsq", sumsq));
  if (rows > 0) SN_TRY(sn__check_ptr(fn, "x", x));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__cuda_check_workspace(fn, workspace, workspace_bytes, need));
  const sn__span_t spans[] = {SN_SPAN_OUT("sum", sum, c * 8, 0u),
                              SN_SPAN_OUT("sumsq", sumsq, c * 8, 0u),
                              SN_SPAN_IN("x", x, rows * c * sn_dtype_size(dtype)),
                              SN_SPAN_IN("pivot", pivot, c * 4),
                              SN_SPAN_OUT("workspace", workspace, (int64_t)need, 0u)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  if (rows == 0) return bn_zero_sums(fn, sum, sumsq, c, stream);
  BnWs w;
  bn_ws_layout(P, c, workspace, &w);
  bn_reduce(false, x, NULL, pivot, NULL, NULL, NULL, sum, sumsq, w, n, c, s, layout, dtype,
            stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_finalize(double *mean, float *var, float *rstd,
                                                  const double *sum, const double *sumsq,
                                                  const float *pivot, int64_t count, int64_t c,
                                                  float eps, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_finalize";
  SN_TRY(sn__check_size(fn, "c", c, 1));
  SN_TRY(sn__check_elems(fn, "c", c));
  SN_TRY(check_train_count(fn, count));
  SN_TRY(sn__check_eps(fn, eps));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  SN_TRY(sn__check_ptr(fn, "sum", sum));
  SN_TRY(sn__check_ptr(fn, "sumsq", sumsq));
  const sn__span_t spans[] = {SN_SPAN_OUT("mean", mean, c * 8, 0u),
                              SN_SPAN_OUT("var", var, c * 4, 0u),
                              SN_SPAN_OUT("rstd", rstd, c * 4, 0u),
                              SN_SPAN_IN("sum", sum, c * 8),
                              SN_SPAN_IN("sumsq", sumsq, c * 8),
                              SN_SPAN_IN("pivot", pivot, c * 4)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  bn_finalize<<<grid_for(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
      mean, var, rstd, sum, sumsq, pivot, 1.0 / (double)count, eps, c);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_update_running(float *running_mean, float *running_var,
                                                        int64_t *num_batches_tracked,
                                                        const double *mean, const float *var,
                                                        int64_t count, int64_t c, float momentum,
                                                        cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_update_running";
  SN_TRY(sn__check_size(fn, "c", c, 1));
  SN_TRY(sn__check_elems(fn, "c", c));
  SN_TRY(sn__check_size(fn, "count", count, 0));
  SN_TRY(sn__check_momentum(fn, momentum));
  const int cumulative = momentum == SN_MOMENTUM_CUMULATIVE;
  if (cumulative) SN_TRY(sn__check_ptr(fn, "num_batches_tracked", num_batches_tracked));
  /* the CPU's num_batches_tracked < 0 check needs the device value: see bn_update_running */
  if (count == 1) return check_train_count(fn, count);
  if (count > 1) {
    SN_TRY(sn__check_ptr(fn, "running_mean", running_mean));
    SN_TRY(sn__check_ptr(fn, "running_var", running_var));
    SN_TRY(sn__check_ptr(fn, "mean", mean));
    SN_TRY(sn__check_ptr(fn, "var", var));
  }
  const int64_t cb = c * 4;
  const sn__span_t spans[] = {SN_SPAN_OUT("running_mean", running_mean, cb, 0u),
                              SN_SPAN_OUT("running_var", running_var, cb, 0u),
                              SN_SPAN_OUT("num_batches_tracked", num_batches_tracked, 8, 0u),
                              SN_SPAN_IN("mean", mean, 2 * cb),
                              SN_SPAN_IN("var", var, cb)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  if (count > 1) {
    const double unbias = (double)count / (double)(count - 1);
    bn_update_running<<<grid_for(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
        running_mean, running_var, num_batches_tracked, mean, var, (double)momentum, cumulative,
        unbias, c);
  }
  /* after the update, which read the old count (stream order) */
  if (num_batches_tracked != NULL) bn_count_batch<<<1, 1, 0, stream>>>(num_batches_tracked);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_apply(void *y, const void *x, const double *mean,
                                               const float *rstd, const float *gamma,
                                               const float *beta, int64_t n, int64_t c,
                                               int64_t s, sn_layout_t layout, sn_dtype_t dtype,
                                               cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_apply";
  int64_t rows;
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  if (rows == 0) return SN_OK;
  SN_TRY(sn__check_ptr(fn, "y", y));
  SN_TRY(sn__check_ptr(fn, "x", x));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("y", y, ab, 1u << 1), SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("mean", mean, c * 8),  SN_SPAN_IN("rstd", rstd, c * 4),
                              SN_SPAN_IN("gamma", gamma, c * 4), SN_SPAN_IN("beta", beta, c * 4)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  MapArgs m = {};
  m.out = y, m.in = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma, m.beta = beta;
  bn_map_run(MAP_APPLY, m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

/* stats around the pivot; SN_BN_REFINE_ROUNDS rounds of refinement, each a fixed launch sequence
 * (bn_refine marks the channels whose sums lost too much to cancellation and sets their new pivot;
 * the reduction re-sums only those; blocks of the others return at once), so the host decides
 * nothing and the call can be captured in a graph; finalize; apply. The same rounds and pivots as
 * the CPU's sn_batchnorm_fwd (sn__bn_refine), with the sums in this file's order. */
extern "C" sn_status_t sn_cuda_batchnorm_fwd(void *y, double *mean, float *var, float *rstd,
                                             const void *x, const float *pivot,
                                             const float *gamma, const float *beta, int64_t n,
                                             int64_t c, int64_t s, float eps, sn_layout_t layout,
                                             sn_dtype_t dtype, void *workspace,
                                             size_t workspace_bytes, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_fwd";
  int64_t rows, P;
  size_t need;
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(check_train_count(fn, rows));
  SN_TRY(sn__check_eps(fn, eps));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  SN_TRY(sn__check_ptr(fn, "y", y));
  SN_TRY(sn__check_ptr(fn, "x", x));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__cuda_check_workspace(fn, workspace, workspace_bytes, need));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {
      SN_SPAN_OUT("y", y, ab, 1u << 4),     SN_SPAN_OUT("mean", mean, c * 8, 0u),
      SN_SPAN_OUT("var", var, c * 4, 0u),   SN_SPAN_OUT("rstd", rstd, c * 4, 0u),
      SN_SPAN_IN("x", x, ab),               SN_SPAN_IN("pivot", pivot, c * 4),
      SN_SPAN_IN("gamma", gamma, c * 4),    SN_SPAN_IN("beta", beta, c * 4),
      SN_SPAN_OUT("workspace", workspace, (int64_t)need, 0u)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  BnWs w;
  bn_ws_layout(P, c, workspace, &w);
  const unsigned cg = grid_for(c, kMapThreads, 4096);
  bn_reduce(false, x, NULL, pivot, NULL, NULL, NULL, w.sum1, w.sum2, w, n, c, s, layout, dtype,
            stream);
  for (int round = 1; round <= SN_BN_REFINE_ROUNDS; round++) {
    bn_refine<<<cg, kMapThreads, 0, stream>>>(w.piv, w.flag, w.sum1, w.sum2, pivot,
                                              (double)rows, c, round);
    bn_reduce(false, x, NULL, w.piv, NULL, NULL, w.flag, w.sum1, w.sum2, w, n, c, s, layout,
              dtype, stream);
  }
  bn_finalize<<<cg, kMapThreads, 0, stream>>>(mean, var, rstd, w.sum1, w.sum2, w.piv,
                                              1.0 / (double)rows, eps, c);
  MapArgs m = {};
  m.out = y, m.in = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma, m.beta = beta;
  bn_map_run(MAP_APPLY, m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_infer(void *y, const void *x, const float *running_mean,
                                               const float *running_var, const float *gamma,
                                               const float *beta, int64_t n, int64_t c,
                                               int64_t s, float eps, sn_layout_t layout,
                                               sn_dtype_t dtype, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_infer";
  int64_t rows;
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_eps(fn, eps));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "running_mean", running_mean));
  SN_TRY(sn__check_ptr(fn, "running_var", running_var));
  if (rows == 0) return SN_OK;
  SN_TRY(sn__check_ptr(fn, "y", y));
  SN_TRY(sn__check_ptr(fn, "x", x));
  /* running_var < 0 is checked on the device: NaN outputs (sqrt of a negative) */
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("y", y, ab, 1u << 1),
                              SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("running_mean", running_mean, c * 4),
                              SN_SPAN_IN("running_var", running_var, c * 4),
                              SN_SPAN_IN("gamma", gamma, c * 4),
                              SN_SPAN_IN("beta", beta, c * 4)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  MapArgs m = {};
  m.out = y, m.in = x, m.rmean = running_mean, m.rvar = running_var, m.gamma = gamma;
  m.beta = beta, m.eps = (double)eps;
  bn_map_run(MAP_INFER, m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_bwd_reduce(double *sum_dy, double *sum_dy_xhat,
                                                    const void *dy, const void *x,
                                                    const double *mean, const float *rstd,
                                                    int64_t n, int64_t c, int64_t s,
                                                    sn_layout_t layout, sn_dtype_t dtype,
                                                    void *workspace, size_t workspace_bytes,
                                                    cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_bwd_reduce";
  int64_t rows, P;
  size_t need;
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "sum_dy", sum_dy));
  SN_TRY(sn__check_ptr(fn, "sum_dy_xhat", sum_dy_xhat));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  if (rows > 0) {
    SN_TRY(sn__check_ptr(fn, "dy", dy));
    SN_TRY(sn__check_ptr(fn, "x", x));
  }
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__cuda_check_workspace(fn, workspace, workspace_bytes, need));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("sum_dy", sum_dy, c * 8, 0u),
                              SN_SPAN_OUT("sum_dy_xhat", sum_dy_xhat, c * 8, 0u),
                              SN_SPAN_IN("dy", dy, ab),
                              SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("mean", mean, c * 8),
                              SN_SPAN_IN("rstd", rstd, c * 4),
                              SN_SPAN_OUT("workspace", workspace, (int64_t)need, 0u)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  if (rows == 0) return bn_zero_sums(fn, sum_dy, sum_dy_xhat, c, stream);
  BnWs w;
  bn_ws_layout(P, c, workspace, &w);
  /* Σ dy·x̂ = rstd·Σ dy·(x − mean), rstd applied once per channel as on the CPU */
  bn_reduce(true, dy, x, NULL, mean, rstd, NULL, sum_dy, sum_dy_xhat, w, n, c, s, layout, dtype,
            stream);
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
  int64_t rows;
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  const int eval = sum_dy == NULL && sum_dy_xhat == NULL;
  if (!eval) {
    SN_TRY(sn__check_ptr(fn, "sum_dy", sum_dy));
    SN_TRY(sn__check_ptr(fn, "sum_dy_xhat", sum_dy_xhat));
    SN_TRY(check_train_count(fn, count));
  }
  if (rows == 0) return SN_OK;
  SN_TRY(sn__check_ptr(fn, "dx", dx));
  SN_TRY(sn__check_ptr(fn, "dy", dy));
  SN_TRY(sn__check_ptr(fn, "x", x));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {
      SN_SPAN_OUT("dx", dx, ab, 1u << 1),      SN_SPAN_IN("dy", dy, ab),
      SN_SPAN_IN("x", x, ab),                  SN_SPAN_IN("mean", mean, c * 8),
      SN_SPAN_IN("rstd", rstd, c * 4),         SN_SPAN_IN("gamma", gamma, c * 4),
      SN_SPAN_IN("sum_dy", sum_dy, c * 8),     SN_SPAN_IN("sum_dy_xhat", sum_dy_xhat, c * 8)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  MapArgs m = {};
  m.out = dx, m.in = dy, m.x = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma;
  m.sum_dy = sum_dy, m.sum_dy_xhat = sum_dy_xhat, m.count = (double)count;
  bn_map_run(eval ? MAP_BWD_EVAL : MAP_BWD, m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_bwd(void *dx, float *dgamma, float *dbeta,
                                             const void *dy, const void *x, const double *mean,
                                             const float *rstd, const float *gamma, int64_t n,
                                             int64_t c, int64_t s, sn_layout_t layout,
                                             sn_dtype_t dtype, void *workspace,
                                             size_t workspace_bytes, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_bwd";
  int64_t rows, P;
  size_t need;
  SN_TRY(check_ncs(fn, n, c, s, &rows));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(check_train_count(fn, rows));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  SN_TRY(sn__check_ptr(fn, "dx", dx));
  SN_TRY(sn__check_ptr(fn, "dy", dy));
  SN_TRY(sn__check_ptr(fn, "x", x));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__cuda_check_workspace(fn, workspace, workspace_bytes, need));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const unsigned over_params = 1u << 6 | 1u << 7; /* rstd, gamma */
  const sn__span_t spans[] = {
      SN_SPAN_OUT("dx", dx, ab, 1u << 3),
      SN_SPAN_OUT("dgamma", dgamma, c * 4, over_params),
      SN_SPAN_OUT("dbeta", dbeta, c * 4, over_params),
      SN_SPAN_IN("dy", dy, ab),
      SN_SPAN_IN("x", x, ab),
      SN_SPAN_IN("mean", mean, c * 8),
      SN_SPAN_IN("rstd", rstd, c * 4),
      SN_SPAN_IN("gamma", gamma, c * 4),
      SN_SPAN_OUT("workspace", workspace, (int64_t)need, 0u)};
  SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  BnWs w;
  bn_ws_layout(P, c, workspace, &w);
  bn_reduce(true, dy, x, NULL, mean, rstd, NULL, w.sum1, w.sum2, w, n, c, s, layout, dtype,
            stream);
  MapArgs m = {};
  m.out = dx, m.in = dy, m.x = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma;
  m.sum_dy = w.sum1, m.sum_dy_xhat = w.sum2, m.count = (double)rows;
  bn_map_run(MAP_BWD, m, rows, c, s, layout, dtype, stream);
  if (dgamma || dbeta) /* after the dx pass, which reads rstd and gamma */
    bn_param_grads<<<grid_for(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
        dgamma, dbeta, w.sum1, w.sum2, c);
  return sn__cuda_launched(fn);
}
