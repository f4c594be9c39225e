/*
 * groupnorm_bwd.cu — the GroupNorm backward on the device (syncnorm_cuda.h), twin of
 * src/cpu/groupnorm_bwd.c (layout and addressing: groupnorm.cuh). One block per (n, g): per
 * channel of the group Σdy, Σdy·d, Σd (d = x − mean, fp64; in NHWC with Cg a divisor of 256 one
 * pass over the rows, each thread owning one channel, else one strided pass per channel), the
 * CPU's re-centred formula (μ_d = Σd/L), then dx in fp64; the per-sample dgamma/dbeta terms go
 * to the workspace [2][N·C] f64 and gn_param_grads adds them over the samples in order
 * (deterministic).
 */
#include "groupnorm.cuh"

namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads) gn_bwd(GnArgs a) {
  __shared__ double scratch[32];
  __shared__ double sh[3][kThreads], tot[3][kThreads];
  const T *dy = (const T *)a.in, *x = (const T *)a.x;
  T *dx = (T *)a.out;
  const int64_t cg = a.c / a.g, L = cg * a.s, NC = a.n * a.c;
  for (int64_t t = blockIdx.x; t < a.n * a.g; t += gridDim.x) {
    const int64_t n = t / a.g, g = t - n * a.g;
    const double m = (double)a.mean[t], rs = (double)a.rstd[t];
    double A = 0.0, B = 0.0, D = 0.0; /* Σd, Σ gamma·Σdy, Σ gamma·Σdy·d over the group */
    if (a.nhwc && kThreads % cg == 0) {
      /* pass 1, NHWC with Cg | kThreads: one pass over the group's rows, thread i owns channel
       * i % Cg and the rows i/Cg + j·(kThreads/Cg); the kThreads/Cg thread sums of a channel
       * are added in thread order, then the channels in order as below */
      const int tid = threadIdx.x, jc = tid % (int)cg;
      const int64_t ch = g * cg + jc, rstep = kThreads / cg;
      double sd = 0.0, sdy = 0.0, sdyd = 0.0;
      for (int64_t row = tid / (int)cg; row < a.s; row += rstep) {
        const int64_t off = (n * a.s + row) * a.c + ch;
        const double v = (double)sn_io<T>::widen(dy[off]);
        const double d = (double)sn_io<T>::widen(x[off]) - m;
        sd += d, sdy += v, sdyd += v * d;
      }
      __syncthreads(); /* the previous group's reads of sh and tot are done */
      sh[0][tid] = sd, sh[1][tid] = sdy, sh[2][tid] = sdyd;
      __syncthreads();
      if (tid < cg) {
        double t0 = 0.0, t1 = 0.0, t2 = 0.0;
        for (int i = tid; i < kThreads; i += (int)cg)
          t0 += sh[0][i], t1 += sh[1][i], t2 += sh[2][i];
        tot[0][tid] = t0, tot[1][tid] = t1, tot[2][tid] = t2;
      }
      __syncthreads(); /* also: every read of pass 1 is done before pass 2 writes */
      for (int64_t j = 0; j < cg; j++) {
        const double gm = a.gamma ? (double)a.gamma[g * cg + j] : 1.0;
        A += tot[0][j], B += gm * tot[1][j], D += gm * tot[2][j];
      }
      if (a.wq && tid == 0)
        for (int64_t j = 0; j < cg; j++)
          a.wq[n * a.c + g * cg + j] = tot[2][j], a.wq[NC + n * a.c + g * cg + j] = tot[1][j];
    } else {
      for (int64_t j = 0; j < cg; j++) { /* pass 1: per-channel sums */
        const int64_t ch = g * cg + j;
        double sd = 0.0, sdy = 0.0, sdyd = 0.0;
        for (int64_t k = threadIdx.x; k < a.s; k += blockDim.x) {
          const int64_t off = a.nhwc ? (n * a.s + k) * a.c + ch : (n * a.c + ch) * a.s + k;
          const double v = (double)sn_io<T>::widen(dy[off]);
          const double d = (double)sn_io<T>::widen(x[off]) - m;
          sd += d, sdy += v, sdyd += v * d;
        }
        sd = sn__block_sum(sd, scratch);
        sdy = sn__block_sum(sdy, scratch);
        sdyd = sn__block_sum(sdyd, scratch);
        const double gm = a.gamma ? (double)a.gamma[ch] : 1.0;
        A += sd, B += gm * sdy, D += gm * sdyd;
        if (a.wq && threadIdx.x == 0) a.wq[n * a.c + ch] = sdyd, a.wq[NC + n * a.c + ch] = sdy;
      }
    }
    const double mu_d = A / (double)L, mg = B / (double)L, mgx = rs * (D - mu_d * B) / (double)L;
    if (a.wq && threadIdx.x == 0) /* Σdy·x̂ = rs·(Σdy·d − mu_d·Σdy): the dgamma terms */
      for (int64_t j = 0; j < cg; j++) {
        const int64_t i = n * a.c + g * cg + j;
        a.wq[i] = rs * (a.wq[i] - mu_d * a.wq[NC + i]);
      }
    /* pass 2 (every read of pass 1 is done: the block sums above synchronized): dx = (dy·a − b)
     * − (x − m')·e with the CPU's constants a = rs·gamma, b = rs·mg, e = rs²·mgx, m' = m + mu_d */
    const double m2 = m + mu_d, b = rs * mg, e = rs * rs * mgx;
    if (a.nhwc && kThreads % cg == 0) { /* as pass 1: thread i's channel i % Cg, its rows */
      const int jc = (int)(threadIdx.x % cg);
      const int64_t base = n * a.s * a.c + g * cg + jc, rstep = kThreads / cg;
      const double ka = rs * (a.gamma ? (double)a.gamma[g * cg + jc] : 1.0);
      for (int64_t row = threadIdx.x / cg; row < a.s; row += rstep) {
        const int64_t off = base + row * a.c;
        const double v = (double)sn_io<T>::widen(dy[off]), xv = (double)sn_io<T>::widen(x[off]);
        dx[off] = sn_io<T>::narrow_d((v * ka - b) - (xv - m2) * e);
      }
      continue;
    }
    for (int64_t k = threadIdx.x; k < L; k += blockDim.x) {
      int64_t ch;
      const int64_t off = gn_off(a, n, g, k, &ch);
      const double ka = rs * (a.gamma ? (double)a.gamma[ch] : 1.0);
      const double v = (double)sn_io<T>::widen(dy[off]), xv = (double)sn_io<T>::widen(x[off]);
      dx[off] = sn_io<T>::narrow_d((v * ka - b) - (xv - m2) * e);
    }
  }
}

/* dgamma[c] = Σ_n wq[n·C + c], dbeta[c] = Σ_n wq[N·C + n·C + c], samples in order. */
__global__ void gn_param_grads(float *dgamma, float *dbeta, const double *wq, int64_t N,
                               int64_t C) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    double dg = 0.0, db = 0.0;
    for (int64_t i = 0; i < N; i++) dg += wq[i * C + c], db += wq[N * C + i * C + c];
    if (dgamma) dgamma[c] = (float)gn_canon(dg);
    if (dbeta) dbeta[c] = (float)gn_canon(db);
  }
}

/* Bytes of the backward's workspace for [N, C] (0 when n == 0): [2][N·C] f64. */
sn_status_t gn_ws_bytes(const char *fn, int64_t n, int64_t c, size_t *bytes) {
  int64_t nc;
  SN_TRY(sn__mul(fn, &nc, n, c));
  if (nc > INT64_MAX / 32)
    return sn__fail(SN_ERR_OVERFLOW, "%s: the workspace of [%lld, %lld] overflows", fn,
                    (long long)n, (long long)c);
  *bytes = 2 * sn__cuda_align((size_t)nc * 8);
  return SN_OK;
}

template <typename T> void launch_gn_bwd(const GnArgs &a, cudaStream_t stream) {
  gn_bwd<T><<<gn_grid(a), kThreads, 0, stream>>>(a);
}

} /* namespace */

extern "C" sn_status_t sn_cuda_groupnorm_bwd_workspace(size_t *bytes, int64_t n, int64_t c) {
  static const char fn[] = "sn_cuda_groupnorm_bwd_workspace";
  size_t need = 0; /* written on success; initialized since -O3 sees a path it cannot rule out */
  SN_TRY(sn__check_ptr(fn, "bytes", bytes));
  SN_TRY(sn__check_size(fn, "c", c, 1));
  SN_TRY(sn__check_size(fn, "n", n, 0));
  SN_TRY(sn__check_elems(fn, "c", c));
  SN_TRY(gn_ws_bytes(fn, n, c, &need));
  *bytes = need;
  return SN_OK;
}

/* The workspace is needed (and checked) only where dgamma or dbeta is asked for and the batch is
 * not empty. */
extern "C" sn_status_t sn_cuda_groupnorm_bwd(void *dx, float *dgamma, float *dbeta,
                                             const void *dy, const void *x, const float *mean,
                                             const float *rstd, const float *gamma, int64_t n,
                                             int64_t c, int64_t s, int64_t groups,
                                             sn_layout_t layout, sn_dtype_t dtype,
                                             void *workspace, size_t workspace_bytes,
                                             cudaStream_t stream) {
  static const char fn[] = "sn_cuda_groupnorm_bwd";
  size_t need = 0;
  sn__args_t args;
  sn__gn_call_t call = {};
  call.dx = dx, call.dgamma = dgamma, call.dbeta = dbeta, call.dy = dy, call.x = x,
      call.mean = mean, call.rstd = rstd, call.gamma = gamma, call.n = n, call.c = c, call.s = s,
      call.groups = groups, call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__gn_bwd_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows > 0 && (dgamma || dbeta)) {
    SN_TRY(gn_ws_bytes(fn, n, c, &need));
    SN_TRY(sn__args_workspace(&args, workspace, workspace_bytes, need));
  }
  SN_TRY(sn__cuda_pending(fn));
  if (rows == 0) { /* empty batch: zero parameter gradients, nothing else written */
    if (dgamma) SN_TRY(sn__cuda_status(fn, cudaMemsetAsync(dgamma, 0, (size_t)c * 4, stream)));
    if (dbeta) SN_TRY(sn__cuda_status(fn, cudaMemsetAsync(dbeta, 0, (size_t)c * 4, stream)));
    return SN_OK;
  }
  GnArgs a = {};
  a.out = dx, a.in = dy, a.x = x, a.mean = mean, a.rstd = rstd, a.gamma = gamma;
  a.wq = need > 0 ? (double *)workspace : NULL;
  a.n = n, a.c = c, a.s = s, a.g = groups, a.nhwc = layout == SN_LAYOUT_NHWC;
  SN_CUDA_DISPATCH(dtype, launch_gn_bwd<T>(a, stream));
  if (a.wq) {
    /* the dbeta terms start at N·C, as the kernel indexes them (not at the aligned half) */
    gn_param_grads<<<sn__cuda_grid(c, kThreads, 4096), kThreads, 0, stream>>>(dgamma, dbeta,
                                                                             a.wq, n, c);
  }
  return sn__cuda_launched(fn);
}
