/*
 * batchnorm.cu — the BatchNorm statistics and forward on the device (syncnorm_cuda.h), twins of
 * src/cpu/batchnorm.c: shifted per-channel sums, finalize, update_running, apply, the training
 * forward and inference, and the workspace query. The reductions, elementwise maps and workspace
 * layout they share with the backward (batchnorm_bwd.cu) are in batchnorm.cuh.
 */
#include "batchnorm.cuh"

namespace {

/* sn__bn_refine on the device for channel c, for refinement `round` (1..SN_BN_REFINE_ROUNDS):
 * piv [C] gets each channel's pivot (round 1: from pivot, NULL = 0; later rounds: piv itself),
 * flag[c] whether it was refined (its sums must be redone around piv[c]). A channel not refined
 * in one round has the same sums and pivot in the next, so it is not refined then either, as on
 * the CPU. */
__device__ __forceinline__ void refine_c(float *piv, int *flag, const double *sum,
                                         const double *sumsq, const float *pivot, double count,
                                         int round, int64_t c) {
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

/* finalize_channel of the CPU code, for channel c. */
__device__ __forceinline__ void finalize_c(double *mean, float *var, float *rstd,
                                           const double *sum, const double *sumsq,
                                           const float *pivot, double inv, float eps, int64_t c) {
  const double p = pivot ? (double)pivot[c] : 0.0;
  const double d = __dmul_rn(sum[c], inv);                             /* mean − pivot */
  double v = __dsub_rn(__dmul_rn(sumsq[c], inv), __dmul_rn(d, d));     /* biased variance */
  if (v < 0.0) v = 0.0;
  mean[c] = bn_canon(__dadd_rn(p, d));
  if (var) var[c] = (float)bn_canon(v);
  rstd[c] = (float)bn_canon(1.0 / sqrt(__dadd_rn(v, (double)eps)));
}

__global__ void bn_finalize(double *mean, float *var, float *rstd, const double *sum,
                            const double *sumsq, const float *pivot, double inv, float eps,
                            int64_t C) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x)
    finalize_c(mean, var, rstd, sum, sumsq, pivot, inv, eps, c);
}

/* One step of the training forward, per channel, by one thread: the sums of the reduction just
 * done (bn_sum_parts: every channel at round 1, the flagged ones after), then what the forward
 * does next with them: refine_c for `round` <= SN_BN_REFINE_ROUNDS (flag is read before refine_c
 * rewrites it), finalize_c around piv after the last round. The launches of bn_sum_parts then
 * bn_refine (or bn_finalize) of a launch sequence each, fused: the same operations per channel. */
struct FwdStep {
  double *sum1, *sum2;
  const double *part1, *part2;
  float *piv;
  int *flag;
  const float *pivot;
  double *mean;
  float *var, *rstd;
  double count, inv;
  float eps;
  int round;
  int64_t P, C;
};

__global__ void bn_fwd_step(FwdStep f) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < f.C;
       c += (int64_t)gridDim.x * blockDim.x) {
    if (f.round == 1 || f.flag[c]) sum_parts_c(f.sum1, f.sum2, f.part1, f.part2, f.P, f.C, NULL, c);
    if (f.round <= SN_BN_REFINE_ROUNDS)
      refine_c(f.piv, f.flag, f.sum1, f.sum2, f.pivot, f.count, f.round, c);
    else
      finalize_c(f.mean, f.var, f.rstd, f.sum1, f.sum2, f.piv, f.inv, f.eps, c);
  }
}

/* The running statistics with factor f (momentum, or 1/(num_batches_tracked + 1) read before
 * bn_count_batch increments it: a separate, later kernel, so no thread reads the new value). A
 * negative counter (the CPU's SN_ERR_INVALID_ARGUMENT, whatever the momentum) gives NaN running
 * statistics. nbt may be NULL unless cumulative. */
__global__ void bn_update_running(float *rm, float *rv, const int64_t *nbt, const double *mean,
                                  const float *var, double momentum, int cumulative,
                                  double unbias, int64_t C) {
  const int64_t old = nbt != NULL ? *nbt : 0;
  double f = momentum;
  if (cumulative) f = 1.0 / (double)(old < INT64_MAX ? old + 1 : old);
  if (old < 0) f = __longlong_as_double(0x7ff8000000000000LL);
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

} /* namespace */

/* ---- public entry points --------------------------------------------------------------------- */

extern "C" sn_status_t sn_cuda_batchnorm_workspace(size_t *bytes, int64_t n, int64_t c, int64_t s,
                                                   sn_layout_t layout) {
  static const char fn[] = "sn_cuda_batchnorm_workspace";
  int64_t rows, P;
  size_t need = 0; /* written on success; initialized since -O3 sees a path it cannot rule out */
  SN_TRY(sn__check_ptr(fn, "bytes", bytes));
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
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
  int64_t P;
  size_t need = 0; /* written on success; initialized since -O3 sees a path it cannot rule out */
  sn__args_t args;
  sn__bn_call_t call = {};
  call.sum = sum, call.sumsq = sumsq, call.x = x, call.pivot = pivot, call.n = n, call.c = c,
      call.s = s, call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__bn_stats_args(&args, fn, &call));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__args_workspace(&args, workspace, workspace_bytes, need));
  const int64_t rows = args.rows;
  SN_TRY(sn__cuda_pending(fn));
  if (rows == 0) return bn_zero_sums(fn, sum, sumsq, c, stream);
  BnWs w = {}; /* set by bn_ws_layout; {} for -O3, which cannot see that P > 0 here */
  bn_ws_layout(P, c, workspace, &w);
  const BnRed op = {x, NULL, pivot, NULL, NULL, NULL, sum, sumsq};
  bn_reduce<false>(op, w, n, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_finalize(double *mean, float *var, float *rstd,
                                                  const double *sum, const double *sumsq,
                                                  const float *pivot, int64_t count, int64_t c,
                                                  float eps, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_finalize";
  sn__args_t args;
  sn__bn_call_t call = {};
  call.mean = mean, call.var = var, call.rstd = rstd, call.sum = sum, call.sumsq = sumsq,
      call.pivot = pivot, call.count = count, call.c = c, call.eps = eps;
  SN_TRY(sn__bn_finalize_args(&args, fn, &call));
  SN_TRY(sn__cuda_pending(fn));
  bn_finalize<<<sn__cuda_grid(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
      mean, var, rstd, sum, sumsq, pivot, 1.0 / (double)count, eps, c);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_update_running(float *running_mean, float *running_var,
                                                        int64_t *num_batches_tracked,
                                                        const double *mean, const float *var,
                                                        int64_t count, int64_t c, float momentum,
                                                        cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_update_running";
  sn__args_t args;
  /* the CPU's num_batches_tracked < 0 check needs the device value: see bn_update_running */
  sn__bn_call_t call = {};
  call.running_mean = running_mean, call.running_var = running_var,
      call.num_batches_tracked = num_batches_tracked, call.mean = mean, call.var = var,
      call.count = count, call.c = c, call.momentum = momentum;
  SN_TRY(sn__bn_update_running_args(&args, fn, &call));
  SN_TRY(sn__cuda_pending(fn));
  const int cumulative = momentum == SN_MOMENTUM_CUMULATIVE;
  if (count > 1) {
    const double unbias = (double)count / (double)(count - 1);
    bn_update_running<<<sn__cuda_grid(c, kMapThreads, 4096), kMapThreads, 0, stream>>>(
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
  sn__args_t args;
  sn__bn_call_t call = {};
  call.y = y, call.x = x, call.mean = mean, call.rstd = rstd, call.gamma = gamma, call.beta = beta,
      call.n = n, call.c = c, call.s = s, call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__bn_apply_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) return SN_OK;
  SN_TRY(sn__cuda_pending(fn));
  MapArgs m = {};
  m.out = y, m.in = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma, m.beta = beta;
  bn_map_run<MAP_APPLY>(m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

/* stats around the pivot; SN_BN_REFINE_ROUNDS rounds of refinement, each a fixed launch sequence
 * (refine_c marks the channels whose sums lost too much to cancellation and sets their new pivot;
 * the reduction re-sums only those; blocks of the others return at once), so the host decides
 * nothing and the call can be captured in a graph; finalize; apply. Each reduction's partials are
 * added by bn_fwd_step, which also refines (or, after the last round, finalizes): 9 launches.
 * The same rounds and pivots as the CPU's sn_batchnorm_fwd (sn__bn_refine), with the sums in
 * batchnorm.cuh's order. */
extern "C" sn_status_t sn_cuda_batchnorm_fwd(void *y, double *mean, float *var, float *rstd,
                                             const void *x, const float *pivot,
                                             const float *gamma, const float *beta, int64_t n,
                                             int64_t c, int64_t s, float eps, sn_layout_t layout,
                                             sn_dtype_t dtype, void *workspace,
                                             size_t workspace_bytes, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_fwd";
  int64_t P;
  size_t need = 0; /* written on success; initialized since -O3 sees a path it cannot rule out */
  sn__args_t args;
  sn__bn_call_t call = {};
  call.y = y, call.mean = mean, call.var = var, call.rstd = rstd, call.x = x, call.pivot = pivot,
      call.gamma = gamma, call.beta = beta, call.n = n, call.c = c, call.s = s, call.eps = eps,
      call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__bn_fwd_args(&args, fn, &call));
  SN_TRY(bn_ws_bytes(fn, n, c, s, layout, &P, &need));
  SN_TRY(sn__args_workspace(&args, workspace, workspace_bytes, need));
  SN_TRY(sn__cuda_pending(fn));
  const int64_t rows = args.rows;
  BnWs w = {}; /* set by bn_ws_layout; {} for -O3, which cannot see that P > 0 here */
  bn_ws_layout(P, c, workspace, &w);
  const unsigned cg = sn__cuda_grid(c, kMapThreads, 4096);
  FwdStep f = {};
  f.sum1 = w.sum1, f.sum2 = w.sum2, f.part1 = w.part1, f.part2 = w.part2, f.piv = w.piv;
  f.flag = w.flag, f.pivot = pivot, f.mean = mean, f.var = var, f.rstd = rstd;
  f.count = (double)rows, f.inv = 1.0 / (double)rows, f.eps = eps, f.P = P, f.C = c;
  /* round r: the sums of reduction r − 1 (around pivot, then around piv for the flagged
   * channels), then refinement r, or finalize after the last round */
  for (int round = 1; round <= SN_BN_REFINE_ROUNDS + 1; round++) {
    const BnRed op = {x, NULL, round == 1 ? pivot : w.piv, NULL, NULL,
                      round == 1 ? NULL : w.flag, w.sum1, w.sum2};
    bn_reduce<false>(op, w, n, c, s, layout, dtype, stream, true);
    f.round = round;
    bn_fwd_step<<<cg, kMapThreads, 0, stream>>>(f);
  }
  MapArgs m = {};
  m.out = y, m.in = x, m.mean = mean, m.rstd = rstd, m.gamma = gamma, m.beta = beta;
  bn_map_run<MAP_APPLY>(m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}

extern "C" sn_status_t sn_cuda_batchnorm_infer(void *y, const void *x, const float *running_mean,
                                               const float *running_var, const float *gamma,
                                               const float *beta, int64_t n, int64_t c,
                                               int64_t s, float eps, sn_layout_t layout,
                                               sn_dtype_t dtype, cudaStream_t stream) {
  static const char fn[] = "sn_cuda_batchnorm_infer";
  sn__args_t args;
  /* running_var < 0 is checked on the device: NaN outputs (sqrt of a negative) */
  sn__bn_call_t call = {};
  call.y = y, call.x = x, call.running_mean = running_mean, call.running_var = running_var,
      call.gamma = gamma, call.beta = beta, call.n = n, call.c = c, call.s = s, call.eps = eps,
      call.layout = layout, call.dtype = dtype;
  SN_TRY(sn__bn_infer_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) return SN_OK;
  SN_TRY(sn__cuda_pending(fn));
  MapArgs m = {};
  m.out = y, m.in = x, m.rmean = running_mean, m.rvar = running_var, m.gamma = gamma;
  m.beta = beta, m.eps = (double)eps;
  bn_map_run<MAP_INFER>(m, rows, c, s, layout, dtype, stream);
  return sn__cuda_launched(fn);
}
