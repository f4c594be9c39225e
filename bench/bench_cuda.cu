/*
 * bench_cuda.cu — the CUDA kernels' effective bandwidth against the device's own copy bandwidth,
 * measured in the same run (issue #5's benchmark).
 *
 *   bench_cuda [--reps R] [--quick] [--filter TEXT]
 *
 * Copy ceiling: cudaMemcpyAsync device-to-device of 2 GiB, counting bytes read + written.
 * Each kernel: CUDA events around one launch, median of R launches after 3 warm-ups, inputs
 * random (never all zeros) and larger than the L2. Bytes counted as each input read once and
 * each output written once (BatchNorm training forward: 2 reads + 1 write, its two passes over
 * x; its backward: 4 reads + 1 write, dy and x read for the sums and again for dx, as
 * bench_cpu counts them). Prints one table line per kernel:
 *   kernel  shape  layout  dtype  ms  GB/s  %-of-copy
 * --quick: small shapes and 5 reps (a smoke run). --filter keeps the lines whose
 * "kernel shape layout dtype" contains TEXT.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "syncnorm_cuda.h"

#define CK(call)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "bench_cuda: %s: %s (line %d)\n", #call, cudaGetErrorString(e_), \
              __LINE__);                                                              \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)
#define SN(call)                                                                        \
  do {                                                                                  \
    sn_status_t s_ = (call);                                                            \
    if (s_ != SN_OK) {                                                                  \
      fprintf(stderr, "bench_cuda: %s: %s: %s\n", #call, sn_status_string(s_), sn_last_error()); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

/* Uniform values in [lo, hi) from a hash of the index, written as dtype. */
__global__ void fill_kernel(void *p, int64_t n, int dtype, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = lo + (hi - lo) * (float)(z >> 40) * (1.0f / 16777216.0f);
    if (dtype == SN_DTYPE_F32) ((float *)p)[i] = u;
    else if (dtype == SN_DTYPE_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(u);
    else ((__half *)p)[i] = __float2half_rn(u);
  }
}

static void *dalloc(size_t bytes) {
  void *p = NULL;
  CK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}

static void fill(void *p, int64_t n, sn_dtype_t dt, uint64_t seed, float lo, float hi) {
  fill_kernel<<<1024, 256>>>(p, n, (int)dt, seed, lo, hi);
  CK(cudaGetLastError());
}

static const char *dname(sn_dtype_t d) {
  return d == SN_DTYPE_F32 ? "f32" : d == SN_DTYPE_BF16 ? "bf16" : "f16";
}

struct Opts {
  int reps = 50;
  int quick = 0;
  const char *filter = NULL;
};

/* Median milliseconds of reps launches of fn (after 3 warm-ups), each timed with events. */
template <typename F> static double time_ms(const Opts &o, F fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) fn();
  std::vector<float> t;
  for (int i = 0; i < o.reps; i++) {
    CK(cudaEventRecord(a, 0));
    fn();
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static double g_copy_gbs = 0;

static int wanted(const Opts &o, const char *line) {
  return o.filter == NULL || strstr(line, o.filter) != NULL;
}

static void report(const char *kernel, const char *shape, const char *layout, sn_dtype_t dt,
                   double ms, double bytes) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  printf("%-24s %-18s %-5s %-5s %9.4f %9.1f %7.1f%%\n", kernel, shape, layout, dname(dt), ms, gbs,
         100.0 * gbs / g_copy_gbs);
  fflush(stdout);
}

static void bench_copy(const Opts &o) {
  const size_t bytes = o.quick ? ((size_t)256 << 20) : ((size_t)2 << 30);
  void *a = dalloc(bytes), *b = dalloc(bytes);
  fill(a, (int64_t)(bytes / 4), SN_DTYPE_F32, 1, -1, 1);
  const double ms =
      time_ms(o, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0)); });
  g_copy_gbs = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
  printf("copy (cudaMemcpy D2D, %zu MiB, read + write): %.4f ms, %.1f GB/s\n", bytes >> 20, ms,
         g_copy_gbs);
  printf("%-24s %-18s %-5s %-5s %9s %9s %8s\n", "kernel", "shape", "lay", "dtype", "ms", "GB/s",
         "%copy");
  CK(cudaFree(a));
  CK(cudaFree(b));
}

static void bench_rows(const Opts &o, int64_t rows, int64_t d, sn_dtype_t dt) {
  const int64_t n = rows * d, es = sn_dtype_size(dt);
  char shape[64];
  snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)rows, (long long)d);
  void *x = dalloc(n * es), *r = dalloc(n * es), *y = dalloc(n * es), *s = dalloc(n * es);
  void *dy = dalloc(n * es), *dx = dalloc(n * es);
  float *gamma = (float *)dalloc(d * 4), *beta = (float *)dalloc(d * 4);
  float *mean = (float *)dalloc(rows * 4), *rstd = (float *)dalloc(rows * 4);
  float *dg = (float *)dalloc(d * 4), *db = (float *)dalloc(d * 4);
  size_t wsb = 0;
  SN(sn_cuda_rownorm_bwd_workspace(&wsb, rows, d));
  void *ws = dalloc(wsb);
  fill(x, n, dt, 2, -3, 5);
  fill(r, n, dt, 3, -1, 1);
  fill(dy, n, dt, 4, -1, 1);
  fill(gamma, d, SN_DTYPE_F32, 5, 0.5f, 1.5f);
  fill(beta, d, SN_DTYPE_F32, 6, -0.5f, 0.5f);
  const double B = (double)n * (double)es;
  char line[160];
  snprintf(line, sizeof line, "layernorm_fwd %s - %s", shape, dname(dt));
  if (wanted(o, line)) {
    const float eps = 1e-5f;
    report("layernorm_fwd", shape, "-", dt, time_ms(o, [&] {
             SN(sn_cuda_layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, d, eps, dt, 0));
           }), 2 * B);
  }
  snprintf(line, sizeof line, "layernorm_bwd %s - %s", shape, dname(dt));
  if (wanted(o, line)) {
    SN(sn_cuda_layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, d, 1e-5f, dt, 0));
    report("layernorm_bwd", shape, "-", dt, time_ms(o, [&] {
             SN(sn_cuda_layernorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, rows, d, dt, ws, wsb,
                                      0));
           }), 3 * B);
  }
  snprintf(line, sizeof line, "rmsnorm_fwd %s - %s", shape, dname(dt));
  if (wanted(o, line))
    report("rmsnorm_fwd", shape, "-", dt, time_ms(o, [&] {
             SN(sn_cuda_rmsnorm_fwd(y, rstd, x, gamma, rows, d, 1e-5f, dt, 0));
           }), 2 * B);
  snprintf(line, sizeof line, "rmsnorm_bwd %s - %s", shape, dname(dt));
  if (wanted(o, line)) {
    SN(sn_cuda_rmsnorm_fwd(y, rstd, x, gamma, rows, d, 1e-5f, dt, 0));
    report("rmsnorm_bwd", shape, "-", dt, time_ms(o, [&] {
             SN(sn_cuda_rmsnorm_bwd(dx, dg, dy, x, rstd, gamma, rows, d, dt, ws, wsb, 0));
           }), 3 * B);
  }
  snprintf(line, sizeof line, "add_rmsnorm_fwd %s - %s", shape, dname(dt));
  if (wanted(o, line))
    report("add_rmsnorm_fwd", shape, "-", dt, time_ms(o, [&] {
             SN(sn_cuda_add_rmsnorm_fwd(y, s, rstd, x, r, gamma, rows, d, 1e-5f, dt, 0));
           }), 4 * B);
  snprintf(line, sizeof line, "add_layernorm_fwd %s - %s", shape, dname(dt));
  if (wanted(o, line))
    report("add_layernorm_fwd", shape, "-", dt, time_ms(o, [&] {
             SN(sn_cuda_add_layernorm_fwd(y, s, mean, rstd, x, r, gamma, beta, rows, d, 1e-5f,
                                          dt, 0));
           }), 4 * B);
  void *ptrs[] = {x, r, y, s, dy, dx, gamma, beta, mean, rstd, dg, db, ws};
  for (void *p : ptrs) CK(cudaFree(p));
}

static void bench_bn(const Opts &o, int64_t N, int64_t C, int64_t S, sn_layout_t lay,
                     sn_dtype_t dt) {
  const int64_t n = N * C * S, es = sn_dtype_size(dt);
  const char *ln = lay == SN_LAYOUT_NCHW ? "NCHW" : "NHWC";
  char shape[64];
  const int64_t H = (int64_t)llround(sqrt((double)S));
  snprintf(shape, sizeof shape, "[%lld,%lld,%lld,%lld]", (long long)N, (long long)C,
           (long long)H, (long long)(S / H));
  void *x = dalloc(n * es), *y = dalloc(n * es), *dy = dalloc(n * es), *dx = dalloc(n * es);
  double *mean = (double *)dalloc(C * 8);
  float *var = (float *)dalloc(C * 4), *rstd = (float *)dalloc(C * 4);
  float *gamma = (float *)dalloc(C * 4), *beta = (float *)dalloc(C * 4);
  float *dg = (float *)dalloc(C * 4), *db = (float *)dalloc(C * 4);
  float *gmean = (float *)dalloc(N * 32 * 4), *grstd = (float *)dalloc(N * 32 * 4);
  size_t wsb = 0, gwsb = 0;
  SN(sn_cuda_batchnorm_workspace(&wsb, N, C, S, lay));
  SN(sn_cuda_groupnorm_bwd_workspace(&gwsb, N, C));
  void *ws = dalloc(std::max(wsb, gwsb));
  fill(x, n, dt, 7, -2, 4);
  fill(dy, n, dt, 8, -1, 1);
  fill(gamma, C, SN_DTYPE_F32, 9, 0.5f, 1.5f);
  fill(beta, C, SN_DTYPE_F32, 10, -0.5f, 0.5f);
  const double B = (double)n * (double)es;
  char line[160];
  snprintf(line, sizeof line, "batchnorm_fwd %s %s %s", shape, ln, dname(dt));
  if (wanted(o, line))
    report("batchnorm_fwd", shape, ln, dt, time_ms(o, [&] {
             SN(sn_cuda_batchnorm_fwd(y, mean, var, rstd, x, NULL, gamma, beta, N, C, S, 1e-5f,
                                      lay, dt, ws, wsb, 0));
           }), 3 * B);
  snprintf(line, sizeof line, "batchnorm_bwd %s %s %s", shape, ln, dname(dt));
  if (wanted(o, line)) {
    SN(sn_cuda_batchnorm_fwd(y, mean, var, rstd, x, NULL, gamma, beta, N, C, S, 1e-5f, lay, dt,
                             ws, wsb, 0));
    report("batchnorm_bwd", shape, ln, dt, time_ms(o, [&] {
             SN(sn_cuda_batchnorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, N, C, S, lay, dt, ws,
                                      wsb, 0));
           }), 5 * B);
  }
  snprintf(line, sizeof line, "batchnorm_infer %s %s %s", shape, ln, dname(dt));
  if (wanted(o, line))
    report("batchnorm_infer", shape, ln, dt, time_ms(o, [&] {
             SN(sn_cuda_batchnorm_infer(y, x, gamma, var, gamma, beta, N, C, S, 1e-5f, lay, dt,
                                        0));
           }), 2 * B);
  if (C % 32 == 0) {
    snprintf(line, sizeof line, "groupnorm_fwd %s %s %s", shape, ln, dname(dt));
    if (wanted(o, line))
      report("groupnorm_fwd(32)", shape, ln, dt, time_ms(o, [&] {
               SN(sn_cuda_groupnorm_fwd(y, gmean, grstd, x, gamma, beta, N, C, S, 32, 1e-5f, lay,
                                        dt, 0));
             }), 2 * B);
    snprintf(line, sizeof line, "groupnorm_bwd %s %s %s", shape, ln, dname(dt));
    if (wanted(o, line)) {
      SN(sn_cuda_groupnorm_fwd(y, gmean, grstd, x, gamma, beta, N, C, S, 32, 1e-5f, lay, dt, 0));
      report("groupnorm_bwd(32)", shape, ln, dt, time_ms(o, [&] {
               SN(sn_cuda_groupnorm_bwd(dx, dg, db, dy, x, gmean, grstd, gamma, N, C, S, 32, lay,
                                        dt, ws, gwsb, 0));
             }), 3 * B);
    }
  }
  void *ptrs[] = {x, y, dy, dx, mean, var, rstd, gamma, beta, dg, db, gmean, grstd, ws};
  for (void *p : ptrs) CK(cudaFree(p));
}

int main(int argc, char **argv) {
  Opts o;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) o.quick = 1;
    else if (!strcmp(argv[i], "--filter") && i + 1 < argc) o.filter = argv[++i];
    else {
      fprintf(stderr, "usage: bench_cuda [--reps R] [--quick] [--filter TEXT]\n");
      return 2;
    }
  }
  if (o.reps < 1) o.reps = 1;
  if (o.quick && o.reps > 5) o.reps = 5;
  int count = 0;
  SN(sn_cuda_device_count(&count));
  if (count == 0) {
    printf("bench_cuda: no CUDA device, nothing measured\n");
    return 77; /* not measured: what a test reports as SKIPPED */
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, L2 %d MiB, %.1f GiB\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize >> 20, (double)prop.totalGlobalMem / (1 << 30));
  bench_copy(o);
  const sn_dtype_t dts[] = {SN_DTYPE_BF16, SN_DTYPE_F32};
  for (sn_dtype_t dt : dts) bench_rows(o, o.quick ? 4096 : 65536, o.quick ? 1024 : 4096, dt);
  const sn_layout_t lays[] = {SN_LAYOUT_NHWC, SN_LAYOUT_NCHW};
  for (sn_layout_t l : lays)
    bench_bn(o, o.quick ? 8 : 64, 256, o.quick ? 28 * 28 : 56 * 56, l, SN_DTYPE_BF16);
  return 0;
}
