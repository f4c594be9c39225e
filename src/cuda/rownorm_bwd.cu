/*
 * rownorm_bwd.cu — the one backward kernel of LayerNorm and RMSNorm, its launcher
 * sn__cuda_rn_bwd (argument checks as the CPU functions', then the launches) and the workspace
 * query sn_cuda_rownorm_bwd_workspace; the entry points are in layernorm_bwd.cu and rmsnorm.cu,
 * the forward in rownorm_fwd.cu. Every tensor is row-major [rows, d]. The CPU twins
 * (src/cpu/layernorm_bwd.c, rmsnorm.c) are the reference.
 *
 * The rows are cut into P = min(rows, RN_BWD_CHUNKS) fixed chunks (P depends on rows only, so the
 * workspace query needs only the shape); block b takes rows [⌊b·rows/P⌋, ⌊(b+1)·rows/P⌋) in order.
 * Per row, with g = dy·gamma and x̂ = (x − mean)·rstd from the saved f32 mean/rstd:
 *   LayerNorm  sums Σx̂, Σg, Σg·x̂ (one block reduction of the three); x̂' = x̂ − Σx̂/d (re-centred
 *              as the CPU code: the f32-rounded mean loses nothing when |mean| ≫ σ),
 *              Σg·x̂' = Σg·x̂ − (Σx̂/d)·Σg, dx = rstd·(g − Σg/d − x̂'·Σ(g·x̂')/d)
 *   RMSNorm    x̂ = x·rstd, dx = rstd·g − x̂·e, e = rstd·Σ(g·x̂)/d
 * The elementwise work is f32: x̂, g and each thread's partial sums in f32, the partials summed
 * over the block in fp64 (fixed order), the row constants (Σx̂/d, Σg/d, ..., e) computed in fp64
 * and rounded to f32, dx in f32 and rounded once to the dtype. A row is computed all
 * in fp64 (sums, dx, and its dgamma/dbeta terms added to the fp64 partials directly), where any
 * thread's |x̂|, |g| or |rstd·g| exceeds 2^40 or is not finite (its partial is made NaN), where a
 * block sum is not finite, where |mean| >= 2^103, or (RMSNorm) where e is outside [2^-100,
 * 2^100] and nonzero: a block-uniform decision from the block sums. A block adds each row's
 * dy·x̂' and dy per column in f32 within runs of 8 rows (counted from its first row), each run
 * then into fp64 partials of its chunk, [P, d] each in the workspace (dgamma's, then dbeta's at
 * sn__cuda_align(P·d·8)); a second kernel sums the P partials of each column in chunk order and
 * writes f32 dgamma/dbeta. No atomics: bitwise the same results from run to run. The workspace
 * is needed only where dgamma or dbeta is non-NULL (it may be NULL otherwise).
 *
 * The row is held in registers (VPT elements per thread, blocks of up to 512 threads: x, dy and
 * the f32 run and fp64 partials of a thread's columns; bf16/f16 at VPT <= 8 and every dtype at
 * VPT <= 4 also fetch the next row's x and dy while working on this one; gamma is re-read per
 * row, as float4 where 16-byte aligned on the vector path) for d <= 8192 (vector loads) or 4096
 * (scalar); longer rows take rn_bwd_big, which reads x and dy twice per row and keeps the
 * partials of its chunk in the workspace (each column read-modified-written by the same thread,
 * in row order).
 */
#include "rownorm.cuh"

namespace {

/* Chunks of rows (blocks) of the backward: enough blocks to fill an H200 (132 SMs) a few times
 * over at 512 threads. */
constexpr int64_t RN_BWD_CHUNKS = 512;
constexpr int kBwdPrefThreads = 512;
constexpr int kBwdMaxThreads = 512;

int64_t rn_chunks(int64_t rows) { return rows < RN_BWD_CHUNKS ? rows : RN_BWD_CHUNKS; }

/* Bytes of one [P, d] fp64 partials array, rounded up to 256 (the dbeta array follows it). */
size_t rn_part_bytes(int64_t rows, int64_t d) {
  return sn__cuda_align((size_t)rn_chunks(rows) * (size_t)d * sizeof(double));
}

/* ---- device side ------------------------------------------------------------------------- */

/* First row of chunk b of p over rows: ⌊b·rows/p⌋ without forming b·rows. */
__device__ __forceinline__ int64_t rn_chunk_start(int64_t b, int64_t rows, int64_t p) {
  return b * (rows / p) + (b * (rows % p)) / p;
}

/* (Σa, Σb, Σc) over the block in a fixed order, as sn__block_sum (every thread gets the same
 * bits; scratch: 96 doubles of shared memory, also usable by sn__block_sum: each call
 * synchronizes the block before it writes scratch). */
__device__ __forceinline__ double3 rn_block_sum3(double a, double b, double c, double *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  a = sn__warp_sum(a);
  b = sn__warp_sum(b);
  c = sn__warp_sum(c);
  __syncthreads(); /* scratch may still be read by a previous call */
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
    scratch[64 + warp] = c;
  }
  __syncthreads();
  a = lane < nwarps ? scratch[lane] : 0.0;
  b = lane < nwarps ? scratch[32 + lane] : 0.0;
  c = lane < nwarps ? scratch[64 + lane] : 0.0;
  return make_double3(sn__warp_sum(a), sn__warp_sum(b), sn__warp_sum(c));
}

/* One backward call as the kernels take it (by value): the tensors, the chunks' fp64 partials
 * of dgamma/dbeta (part_g, part_b: [chunks, d], NULL where not wanted), the sizes. */
struct rn_bwd_args {
  void *dx;
  double *part_g, *part_b;
  const void *dy, *x;
  const float *mean, *rstd, *gamma;
  int64_t rows, d;
  bool rms;
};

/* Its fields as the kernels below name them (T: the element type). */
#define RN_BWD_UNPACK(a)                                                                      \
  T *dx = (T *)(a).dx;                                                                        \
  double *part_g = (a).part_g, *part_b = (a).part_b;                                          \
  const T *dy = (const T *)(a).dy, *x = (const T *)(a).x;                                     \
  const float *mean = (a).mean, *rstd = (a).rstd, *gamma = (a).gamma;                         \
  const int64_t rows = (a).rows, d = (a).d;                                                   \
  const bool rms = (a).rms

/* The call a: dx [rows, d] from dy, x [rows, d], mean (LayerNorm; NULL for RMSNorm), rstd
 * [rows] f32, gamma [d] f32 or NULL; part_g, part_b [P, d] fp64 (P = gridDim.x) or NULL: the
 * chunk's Σ dy·x̂' and Σ dy per column (part_b NULL for RMSNorm). dx may equal dy (a thread reads
 * its elements of dy before it stores them; no __restrict__). */
template <typename T, int VPT, bool VEC>
__global__ void __launch_bounds__(kBwdMaxThreads, 1)
    rn_bwd_kernel(const rn_bwd_args a, bool gvec) {
  RN_BWD_UNPACK(a);
  typedef rn_row<T, VPT, VEC> R;
  __shared__ double scratch[96];
  const double dd = (double)d;
  const int64_t p = gridDim.x, b = blockIdx.x;
  const int64_t r0 = rn_chunk_start(b, rows, p), r1 = rn_chunk_start(b + 1, rows, p);
  float rg[VPT], rb[VPT]; /* the f32 sums of the current run of rows */
  double ag[VPT], ab[VPT];
#pragma unroll
  for (int j = 0; j < VPT; j++) {
    ag[j] = 0.0;
    ab[j] = 0.0;
    rg[j] = 0.0f;
    rb[j] = 0.0f;
  }
  /* PF: x and dy of the next row are fetched while the block works on this one (dx == dy: row
   * r + 1 of dy is read before its dx is stored, by the same thread); only for bf16/f16 rows
   * of up to 8 per thread and rows of up to 4 (registers: more would spill) */
  constexpr bool PF = (sizeof(T) == 2 && VPT <= 8) || VPT <= 4;
  T px[VPT], pd[VPT];
  if (PF && r0 < r1) {
    R::load_raw(px, x + r0 * d, d);
    R::load_raw(pd, dy + r0 * d, d);
  }
  for (int64_t r = r0; r < r1; r++) {
    const int64_t off = r * d;
    if (!PF) {
      R::load_raw(px, x + off, d);
      R::load_raw(pd, dy + off, d);
    }
    float xv[VPT], dv[VPT];
#pragma unroll
    for (int j = 0; j < VPT; j++) {
      xv[j] = sn_io<T>::widen(px[j]);
      dv[j] = sn_io<T>::widen(pd[j]);
    }
    if (PF && r + 1 < r1) {
      R::load_raw(px, x + off + d, d);
      R::load_raw(pd, dy + off + d, d);
    }
    /* gamma of the thread's columns, 1 past d (read per row, from L1: fewer registers) */
    float gm[VPT];
#pragma unroll
    for (int c = 0; c < R::C; c++) {
      const int i0 = (c * (int)blockDim.x + (int)threadIdx.x) * R::W;
      bool done = false;
      if (gamma == nullptr || i0 >= d) {
#pragma unroll
        for (int k = 0; k < R::W; k++) gm[c * R::W + k] = 1.0f;
        done = true;
      }
      if constexpr (VEC) {
        if (!done && gvec) {
#pragma unroll
          for (int k = 0; k < R::W; k += 4) {
            const float4 q = *reinterpret_cast<const float4 *>(gamma + i0 + k);
            gm[c * R::W + k] = q.x;
            gm[c * R::W + k + 1] = q.y;
            gm[c * R::W + k + 2] = q.z;
            gm[c * R::W + k + 3] = q.w;
          }
          done = true;
        }
      }
      if (!done) {
#pragma unroll
        for (int k = 0; k < R::W; k++) gm[c * R::W + k] = gamma[i0 + k];
      }
    }
    const float mf = rms ? 0.0f : mean[r], sf = rstd[r];
    const double m = (double)mf, s = (double)sf;
    /* the per-thread sums in f32 (x̂ = (x − mean)·rstd, g = dy·gamma; x̂ is 0 past d, as g),
     * summed over the block in fp64. A thread whose terms are near the f32 range (|x̂|, |g| or
     * |rstd·g| beyond 2^40, or not finite) makes its sum NaN: the row is then computed in fp64
     * (block-uniform: decided from the block sums). Within those bounds every f32 term of dx
     * stays below 2^123. */
    float fx = 0.0f, fg = 0.0f, fgx = 0.0f;
    bool bad = false;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
      const float xh = R::col(j) < d ? (xv[j] - mf) * sf : 0.0f, g = dv[j] * gm[j];
      bad = bad | !(fabsf(xh) <= 0x1p40f) | !(fabsf(g) <= 0x1p40f) | !(fabsf(sf * g) <= 0x1p40f);
      fx += xh;
      fg += g;
      fgx = fmaf(g, xh, fgx);
    }
    const double pgx = bad ? (double)NAN : (double)fgx;
    double c = 0.0, mg = 0.0, mgx = 0.0, e = 0.0;
    bool fast;
    if (!rms) {
      const double3 S = rn_block_sum3((double)fx, (double)fg, pgx, scratch);
      c = S.x / dd;
      mg = S.y / dd;
      mgx = (S.z - c * S.y) / dd;
      fast = isfinite(S.x) && isfinite(S.y) && isfinite(S.z) && fabsf(mf) < 0x1p103f;
    } else {
      const double S = sn__block_sum(pgx, scratch);
      e = s * (S / dd);
      /* e subnormal in f32 (or beyond 2^100): fp64 */
      fast = isfinite(S) && (e == 0.0 || (fabs(e) >= 0x1p-100 && fabs(e) <= 0x1p100));
    }
    T o[VPT];
    if (fast) { /* f32; the parameter sums in f32 within runs of rows */
      const float cf = (float)c, mgf = (float)mg, mgxf = (float)mgx, ef = (float)e;
#pragma unroll
      for (int j = 0; j < VPT; j++) {
        const float g = dv[j] * gm[j];
        float xh, of;
        if (!rms) {
          xh = (xv[j] - mf) * sf - cf;
          of = sf * (g - mgf - xh * mgxf);
        } else {
          xh = xv[j] * sf;
          of = sf * g - xh * ef;
        }
        o[j] = sn_io<T>::narrow(of);
        rg[j] = fmaf(dv[j], xh, rg[j]); /* columns past d: never stored */
        rb[j] += dv[j];
      }
    } else { /* block-uniform: the fp64 method throughout, the parameter sums in fp64 */
      double sx = 0.0, sg = 0.0, sgx = 0.0;
#pragma unroll
      for (int j = 0; j < VPT; j++) {
        if (R::col(j) >= d) continue;
        const double xh = ((double)xv[j] - m) * s, g = (double)dv[j] * (double)gm[j];
        sx += xh;
        sg += g;
        sgx += g * xh;
      }
      if (!rms) {
        const double3 S = rn_block_sum3(sx, sg, sgx, scratch);
        c = S.x / dd;
        mg = S.y / dd;
        mgx = (S.z - c * S.y) / dd;
      } else {
        e = s * (sn__block_sum(sgx, scratch) / dd);
      }
#pragma unroll
      for (int j = 0; j < VPT; j++) {
        const double g = (double)dv[j] * (double)gm[j];
        const double xh = !rms ? ((double)xv[j] - m) * s - c : (double)xv[j] * s;
        o[j] = sn_io<T>::narrow_d(!rms ? s * (g - mg - xh * mgx) : s * g - xh * e);
        ag[j] += (double)dv[j] * xh; /* columns past d: never stored */
        ab[j] += (double)dv[j];
      }
    }
    R::store(dx + off, o, d);
    if (((r - r0) & 7) == 7 || r + 1 == r1) { /* end of a run of 8 rows: into fp64 */
#pragma unroll
      for (int j = 0; j < VPT; j++) {
        ag[j] += (double)rg[j];
        ab[j] += (double)rb[j];
        rg[j] = 0.0f;
        rb[j] = 0.0f;
      }
    }
  }
  if (part_g != nullptr) {
#pragma unroll
    for (int j = 0; j < VPT; j++) {
      const int i = R::col(j);
      if (i >= d) continue;
      part_g[b * d + i] = ag[j];
      if (part_b != nullptr) part_b[b * d + i] = ab[j];
    }
  }
}

/* rn_bwd_kernel for rows longer than the register path holds: x and dy read from global memory
 * in both passes; the partials accumulate in part_g/part_b (row b of each, this block's own),
 * each column by the same thread in row order. */
template <typename T>
__global__ void __launch_bounds__(kBwdMaxThreads)
    rn_bwd_big(const rn_bwd_args a) {
  RN_BWD_UNPACK(a);
  __shared__ double scratch[32];
  const double dd = (double)d;
  const int64_t p = gridDim.x, b = blockIdx.x;
  const int64_t r0 = rn_chunk_start(b, rows, p), r1 = rn_chunk_start(b + 1, rows, p);
  double *pg = part_g != nullptr ? part_g + b * d : nullptr;
  double *pb = part_b != nullptr ? part_b + b * d : nullptr;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    if (pg != nullptr) pg[i] = 0.0;
    if (pb != nullptr) pb[i] = 0.0;
  }
  for (int64_t r = r0; r < r1; r++) {
    const int64_t off = r * d;
    const double m = rms ? 0.0 : (double)mean[r], s = (double)rstd[r];
    double sx = 0.0, sg = 0.0, sgx = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const double xh = ((double)sn_io<T>::widen(x[off + i]) - m) * s;
      const double g =
          (double)sn_io<T>::widen(dy[off + i]) * (gamma != nullptr ? (double)gamma[i] : 1.0);
      sx += xh;
      sg += g;
      sgx += g * xh;
    }
    sgx = sn__block_sum(sgx, scratch);
    double c = 0.0, mg = 0.0, mgx = 0.0, e = 0.0;
    if (!rms) {
      sx = sn__block_sum(sx, scratch);
      sg = sn__block_sum(sg, scratch);
      c = sx / dd;
      mg = sg / dd;
      mgx = (sgx - c * sg) / dd;
    } else {
      e = s * (sgx / dd);
    }
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const double dyv = (double)sn_io<T>::widen(dy[off + i]);
      const double g = dyv * (gamma != nullptr ? (double)gamma[i] : 1.0);
      const double xv = (double)sn_io<T>::widen(x[off + i]);
      double xh, out;
      if (!rms) {
        xh = (xv - m) * s - c;
        out = s * (g - mg - xh * mgx);
      } else {
        xh = xv * s;
        out = s * g - xh * e;
      }
      dx[off + i] = sn_io<T>::narrow_d(out);
      if (pg != nullptr) pg[i] += dyv * xh;
      if (pb != nullptr) pb[i] += dyv;
    }
  }
}

/* dgamma[i] = Σ_b part_g[b, i], dbeta[i] = Σ_b part_b[b, i] over the p chunks in order (each
 * output NULL: skipped). */
__global__ void rn_bwd_finalize(float *dgamma, float *dbeta, const double *part_g,
                                const double *part_b, int64_t p, int64_t d) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d;
       i += (int64_t)gridDim.x * blockDim.x) {
    if (dgamma != nullptr) {
      double s = 0.0;
      for (int64_t b = 0; b < p; b++) s += part_g[b * d + i];
      dgamma[i] = (float)s;
    }
    if (dbeta != nullptr) {
      double s = 0.0;
      for (int64_t b = 0; b < p; b++) s += part_b[b * d + i];
      dbeta[i] = (float)s;
    }
  }
}

template <typename T> struct rn_bwd_launch {
  static constexpr int W = (int)(16 / sizeof(T));

  template <int VPT, bool VEC> static void go(const rn_bwd_args &a, int threads, unsigned grid,
                                               cudaStream_t st) {
    if constexpr (VPT % (VEC ? W : 1) == 0)
      rn_bwd_kernel<T, VPT, VEC><<<grid, threads, 0, st>>>(a, rn_aligned16(a.gamma));
  }
  static void run(const rn_bwd_args &a, cudaStream_t st) {
    const unsigned grid = (unsigned)rn_chunks(a.rows);
    const bool vec = (a.d * (int64_t)sizeof(T)) % 16 == 0 && rn_aligned16(a.dx) &&
                     rn_aligned16(a.dy) && rn_aligned16(a.x);
    /* scalar rows hold at most 8 per thread, vector rows 16 (registers: ptxas -v) */
    const int max_vpt = vec ? 16 : 8;
    if (a.d > (int64_t)max_vpt * kBwdMaxThreads) {
      rn_bwd_big<T><<<grid, kBwdMaxThreads, 0, st>>>(a);
      return;
    }
    int threads = 0;
    const int vpt = rn_pick_vpt(a.d, vec ? W : 1, max_vpt, kBwdPrefThreads, &threads);
    rn_launch_vpt<rn_bwd_launch<T>>(a, vpt, vec, threads, grid, st);
  }
};

}  // namespace

sn_status_t sn__cuda_rn_bwd(const char *fn, const sn__rn_bwd_t &q, void *workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
  int64_t n;
  SN_TRY(sn__rownorm_bwd_check(fn, &q, &n));
  /* the call's buffers as the CPU function checks them, then (below) the workspace against them,
   * as the BatchNorm and GroupNorm kernels order their checks */
  SN_TRY(sn__rownorm_bwd_spans(fn, &q, NULL, 0));
  if (n == 0) { /* empty batch: the parameter gradients are zero, nothing else is written */
    SN_TRY(sn__cuda_pending(fn));
    const size_t bytes = (size_t)q.d * sizeof(float);
    if (q.dgamma != NULL)
      SN_TRY(sn__cuda_status(fn, cudaMemsetAsync(q.dgamma, 0, bytes, stream)));
    if (q.dbeta != NULL) SN_TRY(sn__cuda_status(fn, cudaMemsetAsync(q.dbeta, 0, bytes, stream)));
    return SN_OK;
  }
  const bool params = q.dgamma != NULL || q.dbeta != NULL;
  const size_t part = rn_part_bytes(q.rows, q.d);
  const size_t need = params ? 2 * part : 0; /* = sn_cuda_rownorm_bwd_workspace's */
  SN_TRY(sn__check_workspace(fn, workspace, workspace_bytes, need));
  if (params) SN_TRY(sn__rownorm_bwd_spans(fn, &q, workspace, (int64_t)need));
  double *part_g = params ? (double *)workspace : NULL;
  double *part_b = params && !q.rms ? (double *)((char *)workspace + part) : NULL;
  const rn_bwd_args a = {q.dx,   part_g,  part_b, q.dy, q.x, q.rms ? NULL : q.mean,
                         q.rstd, q.gamma, q.rows, q.d,  q.rms != 0};
  SN_TRY(sn__cuda_pending(fn));
  SN_CUDA_DISPATCH(q.dtype, rn_bwd_launch<T>::run(a, stream));
  if (params) {
    const int threads = 256;
    const int64_t blocks = (q.d + threads - 1) / threads;
    rn_bwd_finalize<<<(unsigned)(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(
        q.dgamma, q.dbeta, part_g, part_b, rn_chunks(q.rows), q.d);
  }
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_rownorm_bwd_workspace(size_t *bytes, int64_t rows, int64_t d) {
  static const char fn[] = "sn_cuda_rownorm_bwd_workspace";
  SN_TRY(sn__check_ptr(fn, "bytes", bytes));
  SN_TRY(sn__check_size(fn, "rows", rows, 0));
  SN_TRY(sn__check_size(fn, "d", d, 1));
  SN_TRY(sn__check_elems(fn, "d", d));
  int64_t n;
  SN_TRY(sn__mul(fn, &n, rows, d));
  /* P·d ≤ rows·d ≤ INT64_MAX/8 (sn__mul): P·d·8 fits; two such arrays, each rounded up to 256,
   * need a check against SIZE_MAX */
  const int64_t pd = rn_chunks(rows) * d;
  if ((uint64_t)pd > (SIZE_MAX / 2 - 256) / sizeof(double))
    return sn__fail(SN_ERR_OVERFLOW, "%s: workspace for %lld x %lld overflows size_t", fn,
                    (long long)rows, (long long)d);
  *bytes = rows == 0 ? 0 : 2 * rn_part_bytes(rows, d);
  return SN_OK;
}
