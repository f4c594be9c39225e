/*
 * cpu.h — helpers shared by the CPU kernels: dtype conversion of contiguous runs, per-thread
 * scratch rows, fixed reduction chunks and the target_clones attribute for hot loops.
 * Not installed.
 */
#ifndef SN_CPU_H
#define SN_CPU_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../args.h"
#include "../internal.h"

/* Hot row functions are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time
 * (GCC ifunc). -ffp-contract=off and fixed accumulator lanes keep every variant bit-identical. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(SN_NO_CLONES)
#define SN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SN_CLONES
#endif

/* x − hi rounds to at most FLT_MAX for every finite f32 x while |hi| < SN_CENTRE_F32_MAX:
 * |x − hi| < (2^128 − 2^104) + 2^103 = 2^128 − 2^103, the midpoint between FLT_MAX and 2^128, so
 * it rounds down; − lo (|lo| ≤ 2^-24·|hi|) keeps it below. From 2^103 on, values of opposite
 * signs near FLT_MAX give ±inf in f32 where (x − mean)·a is finite: the f32 maps of LayerNorm
 * (layernorm.c) and of BatchNorm/GroupNorm (norm_kernels.h) go to fp64 for such a centre. */
#define SN_CENTRE_F32_MAX 0x1p103f

/* Accumulator lanes of every fp64 row reduction: fixed so the sum order never depends on the
 * vector width the compiler picks. */
#define SN_LANES 8

/* Hardware policy: one rule for every x86-64 CPU (measurements: docs/BENCHMARKS.md).
 *  - Streaming (non-temporal) stores: off by default but in the BatchNorm backward, whose dx
 *    streams from SN_BN_DX_STREAM_MIN bytes. They save the read-for-ownership of each output
 *    line, but made the other kernels slower in some rows of the hosts measured.
 *    SN_STREAM_MIN_BYTES=N (a byte count, read once per process by sn__stream_out_from) streams
 *    every output of at least N bytes, in every kernel but the long rows of longrow.c, in place
 *    of those defaults. Only
 *    whole 64-byte lines are streamed, with the values an ordinary store writes, so the bits
 *    are the same either way: the f32 loops store a head up to the first line boundary
 *    ordinarily (sn__head64), bf16 rows, read in pair blocks, stream where they start on a line
 *    (sn__aligned64).
 *  - The row kernels' prefetches of the next row, and the fused BatchNorm backward's of its
 *    sums' inputs, go into L2 only (SN_PF_READ, prefetcht1): faster there than prefetcht0.
 *  - BatchNorm NCHW fuses the sums and the map (batchnorm.c, fused_block) only where the inputs
 *    fit in the threads' L2s; beyond that the two passes are faster. Both give the same bits. */
/* Whether a kernel call writing out_bytes of output streams its stores: from
 * SN_STREAM_MIN_BYTES where it is set, else from default_min bytes (INT64_MAX: never). */
SN_HIDDEN int sn__stream_out_from(int64_t out_bytes, int64_t default_min);
/* The same for the kernels that do not stream by default. */
static inline int sn__stream_out(int64_t out_bytes) {
  return sn__stream_out_from(out_bytes, INT64_MAX);
}

/* The BatchNorm backward's f32 dx (sn_batchnorm_bwd, sn_batchnorm_bwd_apply in training mode)
 * streams from this size: 0.87-0.93x the time at 100 MB and more in both layouts, 0.89-0.98x
 * (NCHW) and 0.98-1.04x (NHWC) at 26 MB (docs/BENCHMARKS.md, the streaming A/B). */
#define SN_BN_DX_STREAM_MIN ((int64_t)16 << 20)

/* A software prefetch of the line at p for reading, into L2 only (prefetcht1, locality 2). */
#define SN_PF_READ(p) __builtin_prefetch((p), 0, 2)

/* Makes this thread's streaming stores visible to the others (sfence) when nt: each thread that
 * streamed calls it once at the end of its share of the work, before the parallel region's end.
 * A no-op off x86-64 (where nothing streams). */
static inline void sn__stream_fence(int nt) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (nt) __builtin_ia32_sfence();
#else
  (void)nt;
#endif
}

/* Elements of 4 bytes from p up to the first 64-byte boundary, at most n (0 where p is aligned,
 * or not 4-byte aligned and so never): the head a streamed f32 loop writes with ordinary stores
 * before its blocks start on whole lines. */
static inline int64_t sn__head64(const void *p, int64_t n) {
  const uintptr_t mis = (uintptr_t)p & 63;
  if (mis == 0 || (mis & 3) != 0) return 0;
  const int64_t h = (int64_t)(64 - mis) / 4;
  return h < n ? h : n;
}

/* Whether p starts a 64-byte line: bf16 rows, whose 64-byte pair blocks are fixed by the
 * element index, stream only where they start on one. */
static inline int sn__aligned64(const void *p) { return ((uintptr_t)p & 63) == 0; }

/* 64 bytes from v to p, streamed (four 16-byte movntps, SSE: every clone has them) when nt and p
 * is 64-byte aligned, else an ordinary store. */
static inline __attribute__((always_inline)) void sn__store64(void *p, const void *v, int nt) {
#if defined(__x86_64__) && defined(__GNUC__)
  typedef float sn__v4sf __attribute__((vector_size(16)));
  if (nt && ((uintptr_t)p & 63) == 0) {
    sn__v4sf q[4];
    memcpy(q, v, sizeof q);
    for (int k = 0; k < 4; k++)
#if defined(__clang__) /* clang has no __builtin_ia32_movntps; this is its movntps */
      __builtin_nontemporal_store(q[k], (sn__v4sf *)((float *)p + 4 * k));
#else
      __builtin_ia32_movntps((float *)p + 4 * k, q[k]);
#endif
    return;
  }
#else
  (void)nt;
#endif
  memcpy(p, v, 64);
}

/* dst[i] = (float)src[off + i] for i < n; src has dtype `dtype` (f32, bf16 or f16). */
SN_HIDDEN void sn__to_f32(float *dst, const void *src, int64_t off, int64_t n, sn_dtype_t dtype);
/* dst[off + i] = round_to_dtype(src[i]) for i < n (round-to-nearest-even, NaN kept NaN). */
SN_HIDDEN void sn__from_f32(void *dst, int64_t off, const float *src, int64_t n, sn_dtype_t dtype);

/* A read-only f32 view of elements [off, off+n) of an activation: the memory itself for f32,
 * else converted into tmp (n floats). */
static inline const float *sn__in_row(const void *base, int64_t off, int64_t n, sn_dtype_t dtype,
                                      float *tmp) {
  if (dtype == SN_DTYPE_F32) return (const float *)base + off;
  sn__to_f32(tmp, base, off, n, dtype);
  return tmp;
}

/* Where to compute an output run [off, off+n): the memory itself for f32, else tmp; finish
 * with sn__out_done. */
static inline float *sn__out_row(void *base, int64_t off, sn_dtype_t dtype, float *tmp) {
  return dtype == SN_DTYPE_F32 ? (float *)base + off : tmp;
}
static inline void sn__out_done(void *base, int64_t off, int64_t n, sn_dtype_t dtype,
                                const float *tmp) {
  if (dtype != SN_DTYPE_F32) sn__from_f32(base, off, tmp, n, dtype);
}

/* Σ src[i] and Σ (src[i] − shift)² in fp64 with SN_LANES fixed lanes (bitwise reproducible). */
SN_HIDDEN double sn__sum_f64(const float *src, int64_t n);
SN_HIDDEN double sn__sumsq_shifted_f64(const float *src, int64_t n, double shift);

/* v, or where v is NaN the quiet NaN NAN (positive, payload 0). x86 returns one operand's NaN
 * for NaN op NaN, and a compiler may order the operands of the same + or · either way in two
 * copies of one piece of code; so where the thread count picks which copy computes a value
 * (BatchNorm's fused and unfused passes, GroupNorm NHWC samples shared by a team or not), a
 * NaN's sign could follow it. BatchNorm's per-channel statistics, sums, dgamma and dbeta,
 * GroupNorm's mean, rstd, dgamma and dbeta, and the maps' per-channel constants
 * (sn__chan_k_set, sn__tile_set) go through this. */
static inline double sn__nan_canon(double v) { return isnan(v) ? (double)NAN : v; }

/* Whether an fp64 value is served by its f32 rounding: exactly representable, or a normal
 * finite f32 (a subnormal keeps fewer than 24 bits; beyond FLT_MAX it is inf). */
static inline int sn__f32_holds(double v) {
  const float f = (float)v;
  return (double)f == v || (fabsf(f) >= FLT_MIN && fabsf(f) <= FLT_MAX);
}

/* L2 cache bytes of one core, as sysconf(_SC_LEVEL2_CACHE_SIZE) reports it once per process, or
 * SN_L2_DEFAULT_BYTES where it reports nothing (0 or -1: some VMs and non-x86 systems). */
#define SN_L2_DEFAULT_BYTES ((int64_t)1 << 20)
SN_HIDDEN int64_t sn__l2_bytes(void);

/* Number of OpenMP threads a parallel region started now would get (1 without OpenMP). */
SN_HIDDEN int sn__max_threads(void);
/* The team for `units` pieces of work (rows, chunks) that each go to one thread: at most
 * sn__max_threads() and at most units (at least 1). Per-thread scratch is sized by it and the
 * parallel region made with it (num_threads), so that a batch of fewer rows than threads does
 * not allocate rows of scratch no thread uses (a single f16 row of 30M would otherwise take
 * 2·d floats per thread). */
SN_HIDDEN int sn__team_for(int64_t units);
/* Threads that can run at the same time: sn__max_threads(), at most the processors this process
 * may run on (omp_get_num_procs); 1 without OpenMP. */
SN_HIDDEN int sn__concurrent_threads(void);
/* This thread's number inside a parallel region (0 outside or without OpenMP). */
SN_HIDDEN int sn__thread_num(void);
/* Threads of the current team (1 outside a parallel region or without OpenMP). */
SN_HIDDEN int sn__team_size(void);

/* Allocates `count` blocks of `per_block` elements of `elem_size` bytes each, 64-byte aligned,
 * or returns NULL and records SN_ERR_ALLOC / SN_ERR_OVERFLOW for `fn` in *status. Free with
 * sn__free. */
SN_HIDDEN void *sn__alloc(const char *fn, int64_t count, int64_t per_block, int64_t elem_size,
                          sn_status_t *status);
SN_HIDDEN void sn__free(void *p);

/* n elements of elem_size bytes (a divisor of 64) rounded up to whole 64-byte lines, in
 * elements: the stride of per-thread scratch blocks, which sn__alloc starts on a line. Every
 * thread's block then has the same alignment, so the compiler's alignment peeling (a few
 * elements in scalar code before the vector loop) splits each thread's loops alike. Scalar and
 * vector code may order the operands of an add or multiply differently, which decides the sign
 * of NaN op NaN: with blocks of different alignments the sign of a NaN output could change with
 * the thread count. */
static inline int64_t sn__line_stride(int64_t n, int64_t elem_size) {
  const int64_t per_line = 64 / elem_size;
  return (n + per_line - 1) / per_line * per_line;
}

/* Cross-row reductions (dgamma, per-channel sums) are split into at most SN_RED_CHUNKS chunks of
 * consecutive rows: chunk k of K covers [k·rows/K, (k+1)·rows/K). Partials are summed in chunk
 * order, so the result depends on rows only, never on the thread count. */
#define SN_RED_CHUNKS 64
static inline int64_t sn__chunks(int64_t rows) { return rows < SN_RED_CHUNKS ? rows : SN_RED_CHUNKS; }
static inline int64_t sn__chunk_begin(int64_t k, int64_t rows, int64_t chunks) {
  /* k·rows can overflow int64 only for rows > 2^57; split the product to stay exact. */
  return (rows / chunks) * k + ((rows % chunks) * k) / chunks;
}

#endif /* SN_CPU_H */
