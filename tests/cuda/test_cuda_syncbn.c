/*
 * test_cuda_syncbn.c — the "nccl" communicator and SyncBatchNorm on device memory, on one GPU
 * (a communicator of one rank: ncclCommInitAll over device 0):
 *  (a) a device_memory layer equals the CPU layer (host memory, comm NULL) over 3 training steps
 *      (forward + backward), an eval forward and its frozen backward: y, dx, running stats, grads,
 *      num_batches_tracked; NCHW and NHWC, f32 and bf16;
 *  (b) a training step captured in a CUDA graph and replayed 3 times equals 3 eager steps of an
 *      identical layer, bitwise (running stats and num_batches_tracked advance per replay);
 *  (c) sn_comm_allreduce_sum on device f32/f64 buffers is the identity on one rank; rank, size,
 *      backend, split; sn_comm_all_identical is SN_ERR_UNSUPPORTED;
 *  (d) sn_syncbn_collective_count as the CPU path counts (a communicator of one rank: none);
 *  (e) errors: device_memory with a host communicator, NULL arguments, check_finite; a device
 *      layer's checkpoint round trip;
 *  (f) with the internal test hook sn__syncbn_test_force_sync (the layer behaves as on more than
 *      one rank: its forward and backward all-reduce, identities on one rank; linked against
 *      syncnorm_static, where the hidden symbol is visible): (a) against a CPU layer on a "self"
 *      communicator of one rank, check_consistency on and off, and sn_syncbn_collective_count up
 *      by exactly 1 per forward and backward (2 with check_consistency: the consistency
 *      all-reduce); (b) with check_consistency off; a capture with check_consistency on returns
 *      SN_ERR_UNSUPPORTED and leaves the communicator usable.
 * Check runs without fork here: CUDA and NCCL do not survive a fork after initialization.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudatest.h"
#include "syncnorm_nccl.h"

/* The internal test hook (dist/syncbn_internal.h; hidden, in the static library). */
void sn__syncbn_test_force_sync(sn_syncbn_t *bn, int on);

/* f32 outputs and state: CUDA vs CPU differ by a few f32 roundings of the terms (syncnorm_cuda.h),
 * relative to max(|ref|, 1) */
#define RTOL_F32 1e-5
/* bf16 dx: within 2 ulp of each other. bf16 y: both at the forward bound (testutil.h
 * TU_LOWP_SCALE_TOL), so within tu_lowp_pair_ok of each other, with the scale of fwd_scale. */
#define ULPS_BF16 2.0

static ncclComm_t g_nccl;
static cudaStream_t g_stream;
static sn_comm_t *g_comm;

enum { N = 3, C = 5, S = 7, STEPS = 3 };

static void cuda_ok(cudaError_t err, const char *what) {
  ck_assert_msg(err == cudaSuccess, "%s: %s", what, cudaGetErrorName(err));
}

static sn_syncbn_t *make_layer(sn_layout_t layout, sn_dtype_t dtype, int device, sn_comm_t *comm,
                               int check_consistency) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  cfg.layout = layout, cfg.dtype = dtype, cfg.device_memory = device;
  cfg.check_consistency = check_consistency;
  sn_syncbn_t *bn = NULL;
  ck_assert_msg(sn_syncbn_create(&bn, &cfg, comm) == SN_OK, "create: %s", sn_last_error());
  return bn;
}

/* A device layer's [C] f32 state array into host memory. */
static void get_f32(float *out, const float *dev) {
  cuda_ok(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize");
  ct_download(out, dev, C * sizeof(float));
}

/* |x̂·weight| + |bias| of each element of x [N, C, S] (layout, dtype) in fp64, x̂ from the
 * batch's two-pass statistics (training) or p's running ones; weight and bias p's (host): the
 * scale of the bf16 forward bound. */
static void fwd_scale(double *sc, const void *x, sn_layout_t layout, sn_dtype_t dtype,
                      const sn_syncbn_params_t *p, int training) {
  const double eps = sn_syncbn_default_config(C).eps;
  for (int64_t c = 0; c < C; c++) {
    double m = 0.0, v = 0.0;
    if (training) {
      for (int64_t n = 0; n < N; n++)
        for (int64_t s = 0; s < S; s++) m += tu_get(x, tu_at(layout, n, c, s, C, S), dtype);
      m /= (double)(N * S);
      for (int64_t n = 0; n < N; n++)
        for (int64_t s = 0; s < S; s++) {
          const double e = tu_get(x, tu_at(layout, n, c, s, C, S), dtype) - m;
          v += e * e;
        }
      v /= (double)(N * S);
    } else {
      m = p->running_mean[c], v = p->running_var[c];
    }
    const double rs = 1.0 / sqrt(v + eps);
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t i = tu_at(layout, n, c, s, C, S);
        sc[i] = fabs((tu_get(x, i, dtype) - m) * rs * p->weight[c]) + fabs(p->bias[c]);
      }
  }
}

/* Element by element: f32 |got − ref| ≤ tol·max(|ref|, 1); bf16 y (scale: fwd_scale's)
 * tu_lowp_pair_ok; bf16 dx (scale NULL) ≤ ULPS_BF16 ulp. */
static void assert_close(const void *got, const void *ref, const double *scale, int64_t n,
                         sn_dtype_t dtype, const char *what, int step) {
  for (int64_t i = 0; i < n; i++) {
    const double a = tu_get(got, i, dtype), b = tu_get(ref, i, dtype);
    const int ok = dtype == SN_DTYPE_F32 ? fabs(a - b) <= RTOL_F32 * fmax(fabs(b), 1.0)
                   : scale != NULL       ? tu_lowp_pair_ok(a, b, scale[i], dtype)
                                         : tu_ulp_diff(a, b, dtype) <= ULPS_BF16;
    TU_CHECK(ok, "%s[%lld] step %d (%s): device %.9g, CPU %.9g", what, (long long)i, step,
             tu_dtype_name[dtype], a, b);
  }
}

/* The state arrays of a device layer (dp) against a CPU layer's (hp). */
static void assert_state(const sn_syncbn_params_t *dp, const sn_syncbn_params_t *hp, int step) {
  float got[C];
  const float *dev[4] = {dp->running_mean, dp->running_var, dp->grad_weight, dp->grad_bias};
  const float *host[4] = {hp->running_mean, hp->running_var, hp->grad_weight, hp->grad_bias};
  const char *name[4] = {"running_mean", "running_var", "grad_weight", "grad_bias"};
  for (int k = 0; k < 4; k++) {
    get_f32(got, dev[k]);
    assert_close(got, host[k], NULL, C, SN_DTYPE_F32, name[k], step);
  }
  int64_t nbt = -1;
  ct_download(&nbt, dp->num_batches_tracked, sizeof nbt);
  ck_assert_int_eq(nbt, *hp->num_batches_tracked);
}

/* The collectives of bn so far. */
static int64_t collectives(const sn_syncbn_t *bn) {
  int64_t n = -1;
  ck_assert_int_eq(sn_syncbn_collective_count(bn, &n), SN_OK);
  return n;
}

/* A device layer (gpu) against a CPU layer (cpu) over STEPS training steps, an eval forward and
 * its frozen backward; per (training) forward and backward the device layer's collective count
 * goes up by exactly per_call (-1: not checked), nothing in eval. */
static void device_vs_cpu(sn_syncbn_t *cpu, sn_syncbn_t *gpu, sn_layout_t layout,
                          sn_dtype_t dtype, uint64_t seed, int per_call) {
  const int64_t total = (int64_t)N * C * S;
  const size_t bytes = (size_t)total * sn_dtype_size(dtype);
  sn_syncbn_params_t hp, dp;
  ck_assert_int_eq(sn_syncbn_params(cpu, &hp), SN_OK);
  ck_assert_int_eq(sn_syncbn_params(gpu, &dp), SN_OK);
  void *x = tu_alloc(total, dtype), *dy = tu_alloc(total, dtype);
  void *y = tu_alloc(total, dtype), *dx = tu_alloc(total, dtype);
  void *got = tu_alloc(total, dtype);
  double *sc = tu_dalloc(total);
  void *dx_d = ct_alloc_poison(bytes), *y_d = ct_alloc_poison(bytes);
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  for (int step = 0; step < STEPS; step++) {
    tu_fill_normal(x, total, dtype, 0.5 + step, 2.0, &r); /* the mean moves between steps */
    tu_fill_normal(dy, total, dtype, 0.0, 1.0, &r);
    void *x_d = ct_upload(x, bytes), *dy_d = ct_upload(dy, bytes);
    ck_assert_int_eq(sn_syncbn_forward(cpu, y, x, N, S, 1), SN_OK);
    const int64_t c0 = collectives(gpu);
    ck_assert_msg(sn_syncbn_forward(gpu, y_d, x_d, N, S, 1) == SN_OK, "%s", sn_last_error());
    const int64_t c1 = collectives(gpu);
    ck_assert_int_eq(sn_syncbn_backward(cpu, dx, dy, x, N, S), SN_OK);
    ck_assert_msg(sn_syncbn_backward(gpu, dx_d, dy_d, x_d, N, S) == SN_OK, "%s", sn_last_error());
    const int64_t c2 = collectives(gpu);
    if (per_call >= 0) {
      ck_assert_int_eq(c1 - c0, per_call);
      ck_assert_int_eq(c2 - c1, per_call);
    }
    cuda_ok(cudaStreamSynchronize(g_stream), "step");
    ct_download(got, y_d, bytes);
    fwd_scale(sc, x, layout, dtype, &hp, 1);
    assert_close(got, y, sc, total, dtype, "y", step);
    ct_download(got, dx_d, bytes);
    assert_close(got, dx, NULL, total, dtype, "dx", step);
    assert_state(&dp, &hp, step);
    ct_free(x_d), ct_free(dy_d);
  }
  /* eval forward from the running statistics */
  tu_fill_normal(x, total, dtype, 1.0, 3.0, &r);
  void *x_d = ct_upload(x, bytes);
  const int64_t c0 = collectives(gpu);
  ck_assert_int_eq(sn_syncbn_forward(cpu, y, x, N, S, 0), SN_OK);
  ck_assert_msg(sn_syncbn_forward(gpu, y_d, x_d, N, S, 0) == SN_OK, "%s", sn_last_error());
  cuda_ok(cudaStreamSynchronize(g_stream), "eval");
  ct_download(got, y_d, bytes);
  fwd_scale(sc, x, layout, dtype, &hp, 0);
  assert_close(got, y, sc, total, dtype, "eval y", STEPS);
  /* and the frozen backward after it: dx = γ·dy/√(running_var + eps), local grads */
  tu_fill_normal(dy, total, dtype, 0.0, 1.0, &r);
  void *dy_d = ct_upload(dy, bytes);
  ck_assert_int_eq(sn_syncbn_backward(cpu, dx, dy, x, N, S), SN_OK);
  ck_assert_msg(sn_syncbn_backward(gpu, dx_d, dy_d, x_d, N, S) == SN_OK, "%s", sn_last_error());
  cuda_ok(cudaStreamSynchronize(g_stream), "frozen backward");
  ct_download(got, dx_d, bytes);
  assert_close(got, dx, NULL, total, dtype, "frozen dx", STEPS);
  assert_state(&dp, &hp, STEPS);
  if (per_call >= 0) ck_assert_int_eq(collectives(gpu), c0); /* eval: none */
  ct_free(dy_d), ct_free(x_d), ct_free(dx_d), ct_free(y_d);
  free(x), free(dy), free(y), free(dx), free(got), free(sc);
}

/* (a) device layer == CPU layer; _i: layout (bit 0), dtype (bit 1: bf16). */
START_TEST(test_device_equals_cpu) {
  const sn_layout_t layout = (_i & 1) ? SN_LAYOUT_NHWC : SN_LAYOUT_NCHW;
  const sn_dtype_t dtype = (_i & 2) ? SN_DTYPE_BF16 : SN_DTYPE_F32;
  sn_syncbn_t *cpu = make_layer(layout, dtype, 0, NULL, 1);
  sn_syncbn_t *gpu = make_layer(layout, dtype, 1, g_comm, 1);
  device_vs_cpu(cpu, gpu, layout, dtype, 1234 + (uint64_t)_i, 0); /* one rank: no collective */
  sn_syncbn_destroy(gpu);
  sn_syncbn_destroy(cpu);
}
END_TEST

/* (f) a forced-sync device layer (the synchronized path on one rank) == a CPU layer on a "self"
 * communicator of one rank (the sums of one rank are the global sums); _i: check_consistency
 * (bit 0), layout (bit 1). Its own nccl handle over g_nccl: the hook flags the communicator. */
START_TEST(test_forced_sync_equals_cpu) {
  const int check = _i & 1;
  const sn_layout_t layout = (_i & 2) ? SN_LAYOUT_NHWC : SN_LAYOUT_NCHW;
  sn_comm_t *self = NULL, *fc = NULL;
  ck_assert_int_eq(sn_comm_create_self(&self), SN_OK);
  ck_assert_msg(sn_comm_create_nccl(&fc, g_nccl, g_stream) == SN_OK, "%s", sn_last_error());
  sn_syncbn_t *cpu = make_layer(layout, SN_DTYPE_F32, 0, self, check);
  sn_syncbn_t *gpu = make_layer(layout, SN_DTYPE_F32, 1, fc, check);
  sn__syncbn_test_force_sync(gpu, 1);
  /* per call: its all-reduce, and with check_consistency the consistency all-reduce */
  device_vs_cpu(cpu, gpu, layout, SN_DTYPE_F32, 4321 + (uint64_t)_i, check ? 2 : 1);
  sn_syncbn_destroy(gpu);
  sn_syncbn_destroy(cpu);
  sn_comm_destroy(fc);
  sn_comm_destroy(self);
}
END_TEST

/* One training step (forward + backward) of a device layer on the given device buffers. */
static void step(sn_syncbn_t *bn, void *y, void *dx, const void *x, const void *dy) {
  ck_assert_msg(sn_syncbn_forward(bn, y, x, N, S, 1) == SN_OK, "%s", sn_last_error());
  ck_assert_msg(sn_syncbn_backward(bn, dx, dy, x, N, S) == SN_OK, "%s", sn_last_error());
}

/* Graph capture and replay == eager steps, on comm (force: the test hook on both layers; then
 * the captured step holds exactly one all-reduce per forward and backward). */
static void graph_vs_eager(sn_comm_t *comm, int force) {
  const int64_t total = (int64_t)N * C * S;
  const size_t bytes = (size_t)total * sizeof(float);
  sn_syncbn_t *a = make_layer(SN_LAYOUT_NCHW, SN_DTYPE_F32, 1, comm, 0);
  sn_syncbn_t *b = make_layer(SN_LAYOUT_NCHW, SN_DTYPE_F32, 1, comm, 0);
  sn__syncbn_test_force_sync(a, force);
  sn__syncbn_test_force_sync(b, force);
  float *x = tu_alloc(total, SN_DTYPE_F32), *dy = tu_alloc(total, SN_DTYPE_F32);
  tu_rng_t r;
  tu_rng_seed(&r, 99);
  tu_fill_normal(x, total, SN_DTYPE_F32, 3.0, 2.0, &r);
  tu_fill_normal(dy, total, SN_DTYPE_F32, 0.0, 1.0, &r);
  void *x_d = ct_upload(x, bytes), *dy_d = ct_upload(dy, bytes);
  void *ya = ct_alloc_poison(bytes), *dxa = ct_alloc_poison(bytes);
  void *yb = ct_alloc_poison(bytes), *dxb = ct_alloc_poison(bytes);
  step(a, ya, dxa, x_d, dy_d); /* warm-up: the workspace is allocated here */
  cuda_ok(cudaStreamSynchronize(g_stream), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const int64_t before = collectives(a);
  cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal), "BeginCapture");
  /* no assertion inside the capture: a failing one (no fork) would leave the stream capturing
   * and every later test failing with it; statuses are checked once the capture has ended */
  char msg[512] = "";
  sn_status_t st = sn_syncbn_forward(a, ya, x_d, N, S, 1);
  if (st == SN_OK) st = sn_syncbn_backward(a, dxa, dy_d, x_d, N, S);
  if (st != SN_OK) snprintf(msg, sizeof msg, "%s", sn_last_error());
  const cudaError_t end = cudaStreamEndCapture(g_stream, &graph);
  ck_assert_msg(st == SN_OK, "captured step: %s (%s)", sn_status_string(st), msg);
  cuda_ok(end, "EndCapture");
  ck_assert_int_eq(collectives(a) - before, force ? 2 : 0); /* one NCCL all-reduce each */
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "GraphInstantiate");
  for (int i = 0; i < STEPS; i++) cuda_ok(cudaGraphLaunch(exec, g_stream), "GraphLaunch");
  cuda_ok(cudaStreamSynchronize(g_stream), "replays");
  for (int i = 0; i < 1 + STEPS; i++) step(b, yb, dxb, x_d, dy_d); /* warm-up + 3 eager */
  cuda_ok(cudaStreamSynchronize(g_stream), "eager");
  float *ha = malloc(bytes), *hb = malloc(bytes);
  ct_download(ha, ya, bytes), ct_download(hb, yb, bytes);
  tu_assert_bitwise(ha, hb, bytes, "y (graph vs eager)");
  ct_download(ha, dxa, bytes), ct_download(hb, dxb, bytes);
  tu_assert_bitwise(ha, hb, bytes, "dx (graph vs eager)");
  sn_syncbn_params_t pa, pb;
  ck_assert_int_eq(sn_syncbn_params(a, &pa), SN_OK);
  ck_assert_int_eq(sn_syncbn_params(b, &pb), SN_OK);
  const float *da[4] = {pa.running_mean, pa.running_var, pa.grad_weight, pa.grad_bias};
  const float *db[4] = {pb.running_mean, pb.running_var, pb.grad_weight, pb.grad_bias};
  for (int k = 0; k < 4; k++) {
    float sa[C], sb[C];
    ct_download(sa, da[k], sizeof sa), ct_download(sb, db[k], sizeof sb);
    tu_assert_bitwise(sa, sb, sizeof sa, "state (graph vs eager)");
  }
  int64_t na = -1, nb = -1;
  ct_download(&na, pa.num_batches_tracked, sizeof na);
  ct_download(&nb, pb.num_batches_tracked, sizeof nb);
  ck_assert_int_eq(na, 1 + STEPS); /* the warm-up and one per replay */
  ck_assert_int_eq(nb, 1 + STEPS);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  free(ha), free(hb), free(x), free(dy);
  ct_free(x_d), ct_free(dy_d), ct_free(ya), ct_free(dxa), ct_free(yb), ct_free(dxb);
  sn_syncbn_destroy(a);
  sn_syncbn_destroy(b);
}

/* (b) graph capture and replay == eager steps (one rank: no collective). */
START_TEST(test_graph_capture) { graph_vs_eager(g_comm, 0); }
END_TEST

/* (f) the same with the test hook: the captured step holds the NCCL all-reduces. */
START_TEST(test_graph_capture_forced_sync) {
  sn_comm_t *fc = NULL;
  ck_assert_msg(sn_comm_create_nccl(&fc, g_nccl, g_stream) == SN_OK, "%s", sn_last_error());
  graph_vs_eager(fc, 1);
  sn_comm_destroy(fc);
}
END_TEST

/* (f) a capture with check_consistency on (host waits): SN_ERR_UNSUPPORTED before anything is
 * enqueued, the communicator not broken: eager steps work after it. */
START_TEST(test_capture_with_check_unsupported) {
  const int64_t total = (int64_t)N * C * S;
  const size_t bytes = (size_t)total * sizeof(float);
  sn_comm_t *fc = NULL;
  ck_assert_msg(sn_comm_create_nccl(&fc, g_nccl, g_stream) == SN_OK, "%s", sn_last_error());
  sn_syncbn_t *a = make_layer(SN_LAYOUT_NCHW, SN_DTYPE_F32, 1, fc, 1);
  sn__syncbn_test_force_sync(a, 1);
  float *x = tu_alloc(total, SN_DTYPE_F32);
  tu_rng_t r;
  tu_rng_seed(&r, 17);
  tu_fill_normal(x, total, SN_DTYPE_F32, 1.0, 2.0, &r);
  void *x_d = ct_upload(x, bytes), *y_d = ct_alloc_poison(bytes), *dx_d = ct_alloc_poison(bytes);
  step(a, y_d, dx_d, x_d, x_d); /* warm-up */
  cuda_ok(cudaStreamSynchronize(g_stream), "warm-up");
  cudaGraph_t graph = NULL;
  cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal), "BeginCapture");
  const sn_status_t st = sn_syncbn_forward(a, y_d, x_d, N, S, 1);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", sn_last_error());
  const cudaError_t end = cudaStreamEndCapture(g_stream, &graph);
  if (graph != NULL) cudaGraphDestroy(graph);
  ck_assert_msg(st == SN_ERR_UNSUPPORTED, "capture with check_consistency: %s (%s)",
                sn_status_string(st), msg);
  ck_assert_msg(strstr(msg, "captured") != NULL, "%s", msg);
  cuda_ok(end, "EndCapture (the library enqueued nothing, so the capture stays valid)");
  step(a, y_d, dx_d, x_d, x_d); /* the communicator is not broken */
  cuda_ok(cudaStreamSynchronize(g_stream), "after the capture");
  int size = 0;
  ck_assert_int_eq(sn_comm_size(fc, &size), SN_OK);
  free(x);
  ct_free(x_d), ct_free(y_d), ct_free(dx_d);
  sn_syncbn_destroy(a);
  sn_comm_destroy(fc);
}
END_TEST

/* (c) the communicator on one rank. */
START_TEST(test_comm_identity) {
  int rank = -1, size = -1;
  ck_assert_int_eq(sn_comm_rank(g_comm, &rank), SN_OK);
  ck_assert_int_eq(sn_comm_size(g_comm, &size), SN_OK);
  ck_assert_int_eq(rank, 0);
  ck_assert_int_eq(size, 1);
  ck_assert_str_eq(sn_comm_backend(g_comm), "nccl");
  const float f[3] = {1.0f, 2.5f, -3.0f};
  const double d[3] = {1e300, -0.125, 7.0};
  float gf[3];
  double gd[3];
  float *fd = ct_upload(f, sizeof f);
  double *dd = ct_upload(d, sizeof d);
  ck_assert_msg(sn_comm_allreduce_sum(g_comm, fd, 3, SN_DTYPE_F32) == SN_OK, "%s", sn_last_error());
  ck_assert_msg(sn_comm_allreduce_sum(g_comm, dd, 3, SN_DTYPE_F64) == SN_OK, "%s", sn_last_error());
  cuda_ok(cudaStreamSynchronize(g_stream), "allreduce");
  ct_download(gf, fd, sizeof gf), ct_download(gd, dd, sizeof gd);
  tu_assert_bitwise(gf, f, sizeof f, "f32 all-reduce of one rank");
  tu_assert_bitwise(gd, d, sizeof d, "f64 all-reduce of one rank");
  ck_assert_int_eq(sn_comm_allreduce_sum(g_comm, fd, 3, SN_DTYPE_BF16), SN_ERR_INVALID_DTYPE);
  int same = -1;
  ck_assert_int_eq(sn_comm_all_identical(g_comm, &same, f, sizeof f), SN_ERR_UNSUPPORTED);
  sn_comm_t *sub = NULL;
  ck_assert_msg(sn_comm_split(g_comm, &sub, 0, 0) == SN_OK, "%s", sn_last_error());
  ck_assert_ptr_nonnull(sub);
  ck_assert_str_eq(sn_comm_backend(sub), "nccl");
  ck_assert_msg(sn_comm_allreduce_sum(sub, fd, 3, SN_DTYPE_F32) == SN_OK, "%s", sn_last_error());
  cuda_ok(cudaStreamSynchronize(g_stream), "allreduce on the split");
  sn_comm_destroy(sub); /* owns its ncclComm_t */
  ct_free(fd), ct_free(dd);
}
END_TEST

/* (d) collectives as the CPU path counts them: on one rank, none; the same for a "self" comm. */
START_TEST(test_collective_count) {
  const int64_t total = (int64_t)N * C * S;
  const size_t bytes = (size_t)total * sizeof(float);
  sn_comm_t *self = NULL;
  ck_assert_int_eq(sn_comm_create_self(&self), SN_OK);
  sn_syncbn_t *gpu = make_layer(SN_LAYOUT_NCHW, SN_DTYPE_F32, 1, g_comm, 0);
  sn_syncbn_t *cpu = make_layer(SN_LAYOUT_NCHW, SN_DTYPE_F32, 0, self, 0);
  float *x = tu_alloc(total, SN_DTYPE_F32), *y = tu_alloc(total, SN_DTYPE_F32);
  float *dx = tu_alloc(total, SN_DTYPE_F32);
  tu_rng_t r;
  tu_rng_seed(&r, 5);
  tu_fill_normal(x, total, SN_DTYPE_F32, 0.0, 1.0, &r);
  void *x_d = ct_upload(x, bytes), *y_d = ct_alloc_poison(bytes), *dx_d = ct_alloc_poison(bytes);
  for (int i = 0; i < 2; i++) {
    int64_t before_g = -1, after_g = -1, before_c = -1, after_c = -1;
    ck_assert_int_eq(sn_syncbn_collective_count(gpu, &before_g), SN_OK);
    ck_assert_int_eq(sn_syncbn_collective_count(cpu, &before_c), SN_OK);
    step(gpu, y_d, dx_d, x_d, x_d);
    ck_assert_int_eq(sn_syncbn_forward(cpu, y, x, N, S, 1), SN_OK);
    ck_assert_int_eq(sn_syncbn_backward(cpu, dx, x, x, N, S), SN_OK);
    ck_assert_int_eq(sn_syncbn_collective_count(gpu, &after_g), SN_OK);
    ck_assert_int_eq(sn_syncbn_collective_count(cpu, &after_c), SN_OK);
    ck_assert_int_eq(after_g - before_g, after_c - before_c);
    ck_assert_int_eq(after_g - before_g, 0); /* one rank: nothing to all-reduce */
  }
  cuda_ok(cudaStreamSynchronize(g_stream), "steps");
  ck_assert_int_eq(sn_syncbn_collective_count(gpu, NULL), SN_ERR_NULL_POINTER);
  free(x), free(y), free(dx);
  ct_free(x_d), ct_free(y_d), ct_free(dx_d);
  sn_syncbn_destroy(gpu);
  sn_syncbn_destroy(cpu);
  sn_comm_destroy(self);
}
END_TEST

/* (e) errors, and a device layer's checkpoint. */
START_TEST(test_errors_and_state) {
  sn_comm_t *self = NULL, *c = NULL;
  ck_assert_int_eq(sn_comm_create_self(&self), SN_OK);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  sn_syncbn_t *bn = NULL;
  cfg.device_memory = 1;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, self), SN_ERR_UNSUPPORTED); /* host comm */
  ck_assert_ptr_null(bn);
  cfg.check_finite = 1;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, g_comm), SN_ERR_UNSUPPORTED);
  cfg.check_finite = 0, cfg.device_memory = 2;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, g_comm), SN_ERR_INVALID_ARGUMENT);
  cfg.device_memory = 0; /* an nccl comm needs device memory */
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, g_comm), SN_ERR_UNSUPPORTED);
  ck_assert_int_eq(sn_comm_create_nccl(NULL, g_nccl, g_stream), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_comm_create_nccl(&c, NULL, g_stream), SN_ERR_NULL_POINTER);
  ck_assert_ptr_null(c);
  ck_assert_int_eq(sn_comm_allreduce_sum(NULL, NULL, 0, SN_DTYPE_F32), SN_ERR_NULL_POINTER);
  sn_comm_destroy(self);

  /* a device layer without a communicator (stream 0); its state through a checkpoint */
  cfg.device_memory = 1;
  sn_syncbn_t *a = NULL, *b = NULL;
  ck_assert_int_eq(sn_syncbn_create(&a, &cfg, NULL), SN_OK);
  ck_assert_int_eq(sn_syncbn_create(&b, &cfg, NULL), SN_OK);
  const int64_t total = (int64_t)N * C * S;
  float *x = tu_alloc(total, SN_DTYPE_F32);
  tu_rng_t r;
  tu_rng_seed(&r, 7);
  tu_fill_normal(x, total, SN_DTYPE_F32, 2.0, 1.0, &r);
  void *x_d = ct_upload(x, (size_t)total * 4), *y_d = ct_alloc_poison((size_t)total * 4);
  ck_assert_msg(sn_syncbn_forward(a, y_d, x_d, N, S, 1) == SN_OK, "%s", sn_last_error());
  ck_assert_int_eq(sn_syncbn_forward(a, y_d, x_d, 1, 1, 1), SN_ERR_INSUFFICIENT_COUNT);
  /* a synchronized global count of 1, check_consistency off: the same error as on the host
   * (the count is read back), y and the running statistics untouched */
  {
    sn_syncbn_config_t sc = cfg;
    sc.check_consistency = 0;
    sn_syncbn_t *one = NULL;
    ck_assert_int_eq(sn_syncbn_create(&one, &sc, g_comm), SN_OK);
    sn__syncbn_test_force_sync(one, 1);
    void *y1 = ct_alloc_poison((size_t)C * 4);
    unsigned char before[C * 4], after[C * 4];
    ct_download(before, y1, sizeof before);
    ck_assert_int_eq(sn_syncbn_forward(one, y1, x_d, 1, 1, 1), SN_ERR_INSUFFICIENT_COUNT);
    ck_assert_msg(strstr(sn_last_error(), "global count of 1") != NULL, "%s", sn_last_error());
    ct_download(after, y1, sizeof after);
    tu_assert_bitwise(before, after, sizeof before, "y after a global count of 1");
    sn_syncbn_params_t po;
    ck_assert_int_eq(sn_syncbn_params(one, &po), SN_OK);
    float rm[C];
    int64_t nbt = -1;
    ct_download(rm, po.running_mean, sizeof rm), ct_download(&nbt, po.num_batches_tracked, 8);
    for (int k = 0; k < C; k++) ck_assert_float_eq(rm[k], 0.0f);
    ck_assert_int_eq(nbt, 0);
    sn__syncbn_test_force_sync(one, 0);
    ct_free(y1);
    sn_syncbn_destroy(one);
  }
  char path[64];
  snprintf(path, sizeof path, "/tmp/test_cuda_syncbn.%d.safetensors", (int)getpid());
  sn_syncbn_t *layers[1] = {a};
  const char *prefixes[1] = {"bn"};
  ck_assert_msg(sn_syncbn_save(path, layers, prefixes, 1) == SN_OK, "%s", sn_last_error());
  layers[0] = b;
  ck_assert_msg(sn_syncbn_load(path, layers, prefixes, 1) == SN_OK, "%s", sn_last_error());
  unlink(path);
  sn_syncbn_params_t pa, pb;
  ck_assert_int_eq(sn_syncbn_params(a, &pa), SN_OK);
  ck_assert_int_eq(sn_syncbn_params(b, &pb), SN_OK);
  float ma[C], mb[C];
  ct_download(ma, pa.running_mean, sizeof ma), ct_download(mb, pb.running_mean, sizeof mb);
  tu_assert_bitwise(ma, mb, sizeof ma, "running_mean after a checkpoint");
  ck_assert_float_ne(ma[0], 0.0f);
  int64_t nb = -1;
  ct_download(&nb, pb.num_batches_tracked, sizeof nb);
  ck_assert_int_eq(nb, 1);
  /* a CUDA error the program left pending (a failed cudaMalloc records one): the step says so
   * before enqueueing anything, and leaves it; once cleared, the step runs */
  {
    void *huge = NULL;
    ck_assert_int_ne(cudaMalloc(&huge, (size_t)1 << 62), cudaSuccess);
    ck_assert_int_eq(sn_syncbn_forward(a, y_d, x_d, N, S, 1), SN_ERR_CUDA);
    ck_assert_msg(strstr(sn_last_error(), "pending before this call") != NULL, "%s",
                  sn_last_error());
    ck_assert_int_ne(cudaPeekAtLastError(), cudaSuccess); /* left for the program */
    (void)cudaGetLastError();
    ck_assert_msg(sn_syncbn_forward(a, y_d, x_d, N, S, 1) == SN_OK, "%s", sn_last_error());
  }
  /* another device current than the communicator's (two GPUs or more): refused before
   * anything is enqueued; with one GPU there is no other device to make current */
  int devices = 0;
  ck_assert_int_eq(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices >= 2) {
    sn_syncbn_t *on_comm = NULL;
    sn_syncbn_config_t oc = cfg;
    ck_assert_int_eq(sn_syncbn_create(&on_comm, &oc, g_comm), SN_OK);
    ck_assert_int_eq(cudaSetDevice(1), cudaSuccess);
    ck_assert_int_eq(sn_syncbn_forward(on_comm, y_d, x_d, N, S, 1), SN_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(sn_last_error(), "current CUDA device is 1") != NULL, "%s",
                  sn_last_error());
    ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
    sn_syncbn_destroy(on_comm);
  } else {
    printf("test_cuda_syncbn: one GPU: the wrong-device case needs two, not run\n");
  }
  free(x);
  ct_free(x_d), ct_free(y_d);
  sn_syncbn_destroy(a);
  sn_syncbn_destroy(b);
}
END_TEST

int main(void) {
  if (ct_no_device("test_cuda_syncbn")) return CT_SKIP_CODE;
  if (ncclCommInitAll(&g_nccl, 1, NULL) != ncclSuccess ||
      cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
      sn_comm_create_nccl(&g_comm, g_nccl, g_stream) != SN_OK) {
    fprintf(stderr, "test_cuda_syncbn: setup failed: %s\n", sn_last_error());
    return EXIT_FAILURE;
  }
  Suite *s = suite_create("cuda_syncbn");
  TCase *tc = tcase_create("nccl");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_device_equals_cpu, 0, 4);
  tcase_add_test(tc, test_graph_capture);
  tcase_add_loop_test(tc, test_forced_sync_equals_cpu, 0, 4);
  tcase_add_test(tc, test_graph_capture_forced_sync);
  tcase_add_test(tc, test_capture_with_check_unsupported);
  tcase_add_test(tc, test_comm_identity);
  tcase_add_test(tc, test_collective_count);
  tcase_add_test(tc, test_errors_and_state);
  suite_add_tcase(s, tc);
  const int rc = ct_run_suite(s); /* no fork: CUDA and NCCL do not survive one */
  sn_comm_destroy(g_comm);
  ncclCommDestroy(g_nccl);
  cudaStreamDestroy(g_stream);
  return rc;
}
