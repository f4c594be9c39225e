/*
 * bench_util.c — see bench_util.h.
 */
#include "bench_util.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define BU_ALIGN ((size_t)2 << 20)

void bu_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_cpu: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

double bu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *bu_alloc(size_t bytes) {
  size_t rounded = (bytes + BU_ALIGN - 1) / BU_ALIGN * BU_ALIGN;
  if (rounded == 0) rounded = BU_ALIGN;
  void *p = aligned_alloc(BU_ALIGN, rounded);
  if (!p) bu_die("out of memory allocating %.1f MiB", (double)rounded / (1 << 20));
#ifdef MADV_HUGEPAGE
  (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint: failure only costs TLB misses */
#endif
  /* First touch in parallel, in the same static split the kernels' row loops use. */
  char *c = p;
  int64_t pages = (int64_t)(rounded / 4096);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pages; i++) memset(c + i * 4096, 0, 4096);
  return p;
}

void bu_free(void *p) { free(p); }

/* splitmix64: a fast, well-mixed hash of (seed, index). */
static inline uint64_t bu_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline float bu_uniform(uint64_t seed, int64_t i, float lo, float hi) {
  uint64_t r = bu_mix(seed * 0x632BE59BD9B4E019ull + (uint64_t)i);
  float u = (float)(r >> 40) * (1.0f / 16777216.0f); /* 24 random bits: [0, 1) */
  return lo + (hi - lo) * u;
}

float bu_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t bu_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

void bu_fill_f32(float *p, int64_t n, uint64_t seed, float lo, float hi) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) p[i] = bu_uniform(seed, i, lo, hi);
}

void bu_fill(void *p, int64_t n, sn_dtype_t dtype, uint64_t seed, float lo, float hi) {
  if (dtype == SN_DTYPE_F32) {
    bu_fill_f32(p, n, seed, lo, hi);
  } else if (dtype == SN_DTYPE_BF16) {
    uint16_t *h = p;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) h[i] = bu_f32_to_bf16(bu_uniform(seed, i, lo, hi));
  } else if (dtype == SN_DTYPE_F16) {
    uint16_t *h = p;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
      const _Float16 v = (_Float16)bu_uniform(seed, i, lo, hi); /* round to nearest even */
      memcpy(&h[i], &v, sizeof v);
    }
  } else {
    bu_die("bu_fill: unsupported dtype %d", (int)dtype);
  }
}

static inline double bu_get(const void *p, int64_t i, sn_dtype_t dtype) {
  if (dtype == SN_DTYPE_F16) {
    _Float16 v;
    memcpy(&v, (const uint16_t *)p + i, sizeof v);
    return (double)v;
  }
  return dtype == SN_DTYPE_F32 ? (double)((const float *)p)[i]
                               : (double)bu_bf16_to_f32(((const uint16_t *)p)[i]);
}

double bu_rel_diff(const void *a, const void *b, int64_t n, sn_dtype_t dtype) {
  double max_diff = 0.0, max_ref = 0.0;
  int nan = 0;
#pragma omp parallel for schedule(static) reduction(max : max_diff, max_ref) reduction(| : nan)
  for (int64_t i = 0; i < n; i++) {
    double x = bu_get(a, i, dtype), y = bu_get(b, i, dtype);
    if (isnan(x) || isnan(y)) nan = 1;
    double d = fabs(x - y), r = fabs(y);
    if (d > max_diff) max_diff = d;
    if (r > max_ref) max_ref = r;
  }
  if (nan) return INFINITY;
  return max_diff / (max_ref > 1e-30 ? max_ref : 1e-30);
}

double bu_rel_diff_f32(const float *a, const float *b, int64_t n) {
  return bu_rel_diff(a, b, n, SN_DTYPE_F32);
}

static int bu_cmp_double(const void *pa, const void *pb) {
  double a = *(const double *)pa, b = *(const double *)pb;
  return (a > b) - (a < b);
}

double bu_quantile(const double *v, int n, double q) {
  if (n <= 0) return 0.0;
  double *s = malloc((size_t)n * sizeof *s);
  if (!s) bu_die("out of memory");
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, bu_cmp_double);
  int k = (int)floor(q * (n - 1) + 0.5);
  double r = s[k < 0 ? 0 : (k >= n ? n - 1 : k)];
  free(s);
  return r;
}

/* Each thread copies its contiguous share [lo, hi) of n floats. */
static void bu_share(int64_t n, int64_t *lo, int64_t *hi) {
  int t = omp_get_thread_num(), nt = omp_get_num_threads();
  /* 4 KiB granularity so shares start on page (and cache-line) boundaries. */
  int64_t blocks = (n + 1023) / 1024;
  int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
  *lo = b0 * 1024 < n ? b0 * 1024 : n;
  *hi = b1 * 1024 < n ? b1 * 1024 : n;
}

static void bu_copy_memcpy(float *dst, const float *src, int64_t n) {
#pragma omp parallel
  {
    int64_t lo, hi;
    bu_share(n, &lo, &hi);
    if (hi > lo) memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof *dst);
  }
}

/* GCC would turn this loop back into a memcpy call (-ftree-loop-distribute-patterns). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static void
bu_copy_loop(float *restrict dst, const float *restrict src, int64_t n) {
#pragma omp parallel
  {
    int64_t lo, hi;
    bu_share(n, &lo, &hi);
#pragma omp simd
    for (int64_t i = lo; i < hi; i++) dst[i] = src[i];
  }
}

void bu_mem_init(bu_mem_t *m, size_t copy_bytes, size_t sweep_bytes) {
  m->n = (int64_t)(copy_bytes / sizeof(float));
  m->nsweep = (int64_t)(sweep_bytes / sizeof(float));
  m->src = bu_alloc((size_t)m->n * sizeof(float));
  m->dst = bu_alloc((size_t)m->n * sizeof(float));
  m->sweep = bu_alloc((size_t)m->nsweep * sizeof(float));
  bu_fill_f32(m->src, m->n, 12345, -1.0f, 1.0f);
  bu_fill_f32(m->sweep, m->nsweep, 54321, -1.0f, 1.0f);
}

void bu_mem_free(bu_mem_t *m) {
  bu_free(m->src);
  bu_free(m->dst);
  bu_free(m->sweep);
  m->src = m->dst = m->sweep = NULL;
}

double bu_copy_once(const bu_mem_t *m, int loop) {
  double t0 = bu_now();
  if (loop)
    bu_copy_loop(m->dst, m->src, m->n);
  else
    bu_copy_memcpy(m->dst, m->src, m->n);
  return bu_now() - t0;
}

double bu_copy_bytes(const bu_mem_t *m) { return 2.0 * (double)m->n * sizeof(float); }

/* Sink for bu_read_once's sum, so the reads cannot be optimised away. */
static volatile float bu_read_sink;

/* Independent lanes of bu_read_once's sum: enough vector accumulators that the adds' latency
 * never limits it. */
#define BU_READ_LANES 64
/* The widest vectors the CPU has, as the library's kernels pick them (its SN_CLONES): on the
 * Intel host of docs/BENCHMARKS.md a 2-thread sum in SSE2 code read 15 GB/s, in AVX-512 22. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define BU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define BU_CLONES
#endif

/* Σ p[0 .. blocks·BU_READ_LANES) in BU_READ_LANES lanes. */
BU_CLONES static float bu_sum_blocks(const float *p, int64_t blocks) {
  float acc[BU_READ_LANES] = {0};
  for (int64_t i = 0; i < blocks * BU_READ_LANES; i += BU_READ_LANES)
    for (int k = 0; k < BU_READ_LANES; k++) acc[k] += p[i + k];
  float s = 0.0f;
  for (int k = 0; k < BU_READ_LANES; k++) s += acc[k];
  return s;
}

double bu_read_once(const bu_mem_t *m) {
  const int64_t blocks = m->n / BU_READ_LANES;
  float s = 0.0f;
  double t0 = bu_now();
#pragma omp parallel reduction(+ : s)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    s += bu_sum_blocks(m->src + b0 * BU_READ_LANES, b1 - b0);
  }
  const double t = bu_now() - t0;
  bu_read_sink = s;
  return t;
}

/* Sink for bu_sweep's sum, so the reads cannot be optimised away. */
static volatile float bu_sweep_sink;

void bu_sweep(const bu_mem_t *m) {
  const float *p = m->sweep;
  float s = 0.0f;
  /* One float per 64-byte line is enough to pull every line in. */
#pragma omp parallel for schedule(static) reduction(+ : s)
  for (int64_t i = 0; i < m->nsweep; i += 16) s += p[i];
  bu_sweep_sink = s;
}

bu_copy_t bu_copy_bandwidth(const bu_mem_t *m, int reps) {
  if (reps < 1) reps = 1;
  double *tm = malloc((size_t)reps * sizeof *tm), *tl = malloc((size_t)reps * sizeof *tl);
  double *tr = malloc((size_t)reps * sizeof *tr);
  if (!tm || !tl || !tr) bu_die("out of memory");
  (void)bu_copy_once(m, 0);
  (void)bu_copy_once(m, 1);
  (void)bu_read_once(m);
  /* Alternate the methods so slow drifts in machine load hit them alike. */
  for (int r = 0; r < reps; r++) {
    tm[r] = bu_copy_once(m, 0);
    tl[r] = bu_copy_once(m, 1);
    tr[r] = bu_read_once(m);
  }
  bu_copy_t c;
  c.memcpy_gbs = bu_copy_bytes(m) / bu_quantile(tm, reps, 0.5) * 1e-9;
  c.loop_gbs = bu_copy_bytes(m) / bu_quantile(tl, reps, 0.5) * 1e-9;
  c.read_gbs = bu_copy_bytes(m) / 2.0 / bu_quantile(tr, reps, 0.5) * 1e-9;
  free(tm);
  free(tl);
  free(tr);
  return c;
}

void bu_cpu_snap(bu_cpu_snap_t *s) {
  s->busy_s = s->steal_s = 0.0;
  FILE *f = fopen("/proc/stat", "r");
  if (f) {
    unsigned long long v[8] = {0}; /* user nice system idle iowait irq softirq steal */
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7]) == 8) {
      double hz = (double)sysconf(_SC_CLK_TCK);
      s->busy_s = (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / hz;
      s->steal_s = (double)v[7] / hz;
    }
    fclose(f);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  s->self_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
              (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
  s->wall_s = bu_now();
}

double bu_others_cpus(const bu_cpu_snap_t *a, const bu_cpu_snap_t *b) {
  double wall = b->wall_s - a->wall_s;
  if (wall <= 0.0 || b->busy_s == 0.0) return 0.0;
  double others = (b->busy_s - a->busy_s) - (b->self_s - a->self_s) + (b->steal_s - a->steal_s);
  return others > 0.0 ? others / wall : 0.0;
}

double bu_wait_idle(double threshold, double max_s) {
  double t0 = bu_now();
  for (;;) {
    bu_cpu_snap_t a, b;
    bu_cpu_snap(&a);
    struct timespec ts = {0, 500000000L};
    nanosleep(&ts, NULL);
    bu_cpu_snap(&b);
    double waited = bu_now() - t0;
    if (bu_others_cpus(&a, &b) < threshold || waited >= max_s) return waited;
  }
}

void bu_cpu_model(char *buf, size_t len) {
  snprintf(buf, len, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      char *v = strchr(line, ':');
      if (v) {
        v += 1 + strspn(v + 1, " \t");
        v[strcspn(v, "\n")] = '\0';
        snprintf(buf, len, "%s", v);
      }
      break;
    }
  }
  fclose(f);
}

void bu_loadavg(char *buf, size_t len) {
  snprintf(buf, len, "?");
  FILE *f = fopen("/proc/loadavg", "r");
  if (!f) return;
  if (fgets(buf, (int)len, f)) buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
}
