/*
 * bench_util.h — timing, buffers, random fill, statistics and the copy-bandwidth reference for
 * the CPU benchmark (bench_cpu.c). A benchmark may exit: bu_die() prints and exits 1.
 */
#ifndef SN_BENCH_UTIL_H
#define SN_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "syncnorm.h"

#if defined(__GNUC__)
#define BU_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define BU_NORETURN __attribute__((noreturn))
#else
#define BU_PRINTF(a, b)
#define BU_NORETURN
#endif

/* Prints "bench_cpu: <message>" to stderr and exits with status 1. */
BU_NORETURN void bu_die(const char *fmt, ...) BU_PRINTF(1, 2);

/* Exits via bu_die with the call's text, status name and sn_last_error() unless st == SN_OK. */
#define BU_CHECK(call)                                                               \
  do {                                                                               \
    sn_status_t bu_st_ = (call);                                                     \
    if (bu_st_ != SN_OK)                                                             \
      bu_die("%s failed: %s: %s", #call, sn_status_string(bu_st_), sn_last_error()); \
  } while (0)

/* Monotonic wall-clock time in seconds. */
double bu_now(void);

/* `bytes` of memory aligned to 2 MiB (transparent huge pages requested), first touched in
 * parallel by the OpenMP threads so pages are faulted in before any timing. Exits on failure. */
void *bu_alloc(size_t bytes);
/* Frees bu_alloc memory; NULL is a no-op. */
void bu_free(void *p);

/* n elements of `dtype` (f32, bf16 or f16) set to uniform values in [lo, hi), a deterministic function
 * of (seed, index) so every thread count produces the same data. */
void bu_fill(void *p, int64_t n, sn_dtype_t dtype, uint64_t seed, float lo, float hi);
/* n floats set as bu_fill (f32). */
void bu_fill_f32(float *p, int64_t n, uint64_t seed, float lo, float hi);

/* bf16 (upper 16 bits of binary32) ↔ float, round-to-nearest-even. */
float bu_bf16_to_f32(uint16_t h);
uint16_t bu_f32_to_bf16(float f);

/* max_i |a_i − b_i| / max(max_i |b_i|, 1e-30): the norm-wise relative difference of two arrays
 * of `dtype` (f32, bf16 or f16), computed in parallel. NaN anywhere gives +inf. */
double bu_rel_diff(const void *a, const void *b, int64_t n, sn_dtype_t dtype);
double bu_rel_diff_f32(const float *a, const float *b, int64_t n);

/* Quantile q in [0, 1] of v[0..n) (nearest rank after sorting a copy); 0 for n == 0. */
double bu_quantile(const double *v, int n, double q);

/* Memory-system helpers: a copy of `copy_bytes` (source and destination buffers, each thread
 * copying its own contiguous share) as the bandwidth reference, and a read-only sweep of
 * `sweep_bytes` that evicts the caches (leaving clean lines, so the next timed call pays no
 * write-backs of someone else's data). */
typedef struct {
  float *src, *dst, *sweep;
  int64_t n, nsweep; /* floats in src/dst and in sweep */
} bu_mem_t;
void bu_mem_init(bu_mem_t *m, size_t copy_bytes, size_t sweep_bytes);
void bu_mem_free(bu_mem_t *m);
/* Seconds for one parallel copy: glibc memcpy of each thread's share (loop == 0), or a plain
 * vectorised loop with ordinary stores, as a kernel writes (loop == 1). */
double bu_copy_once(const bu_mem_t *m, int loop);
/* Bytes one copy moves: read + write = 2·copy_bytes. */
double bu_copy_bytes(const bu_mem_t *m);
/* Seconds for one parallel sum of the copy's source (copy_bytes read, nothing written): the
 * ceiling of a reduction such as the BatchNorm statistics. */
double bu_read_once(const bu_mem_t *m);
/* Reads the whole sweep buffer in parallel. */
void bu_sweep(const bu_mem_t *m);

/* Copy bandwidth in GB/s (1e9 B/s, read + write bytes), median over `reps` copies of each
 * method, alternating, after one untimed copy of each; and the read bandwidth of bu_read_once
 * (read bytes), timed in the same rotation. */
typedef struct {
  double memcpy_gbs; /* glibc memcpy */
  double loop_gbs;   /* ordinary-store loop */
  double read_gbs;   /* parallel sum, read only */
} bu_copy_t;
bu_copy_t bu_copy_bandwidth(const bu_mem_t *m, int reps);

/* CPU time used by everything else on this machine: /proc/stat's busy and steal time minus this
 * process's own (getrusage), so a row disturbed by other work can be detected and re-run. */
typedef struct {
  double busy_s, steal_s, self_s, wall_s;
} bu_cpu_snap_t;
void bu_cpu_snap(bu_cpu_snap_t *s);
/* Average number of CPUs that others (other processes, or the hypervisor via steal time) kept
 * busy between two snapshots; 0 if /proc/stat is unreadable. */
double bu_others_cpus(const bu_cpu_snap_t *a, const bu_cpu_snap_t *b);
/* Sleeps in 0.5 s steps until others use < `threshold` CPUs over one step, at most `max_s`
 * seconds; returns the seconds waited. */
double bu_wait_idle(double threshold, double max_s);

/* The CPU's model name from /proc/cpuinfo ("unknown CPU" where not found), and /proc/loadavg's
 * line ("?" where unreadable), into buf [len]. */
void bu_cpu_model(char *buf, size_t len);
void bu_loadavg(char *buf, size_t len);

#endif /* SN_BENCH_UTIL_H */
