/*
 * convert.c — f32 <-> bf16/f16 conversion of contiguous runs, fixed-lane fp64 sums, scratch
 * allocation and thread helpers for the CPU kernels.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu.h"

/* bf16 is the upper half of a binary32: widening is a shift. */
static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round-to-nearest-even to bf16; NaN stays a (quiet) NaN, overflow rounds to Inf as IEEE does. */
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#if defined(__FLT16_MAX__)
/* The compiler's _Float16 converts exactly (F16C / AVX-512 instructions in the cloned variants). */
static inline float f16_to_f32(uint16_t h) {
  _Float16 v;
  memcpy(&v, &h, sizeof v);
  return (float)v;
}
static inline uint16_t f32_to_f16(float f) {
  _Float16 v = (_Float16)f;
  uint16_t h;
  memcpy(&h, &v, sizeof h);
  return h;
}
#else
/* Portable IEEE binary16 conversions (used only where the compiler lacks _Float16). */
static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else { /* subnormal: normalize */
    int e = -1;
    do { man <<= 1; e++; } while (!(man & 0x400u));
    u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: Inf */
  if (a < 0x38800000u) { /* result subnormal or zero: add 0.5 (as float) and round there */
    float mag;
    memcpy(&mag, &a, sizeof mag);
    mag += 0.5f;
    uint32_t m;
    memcpy(&m, &mag, sizeof m);
    return (uint16_t)(sign | (uint16_t)(m - 0x3f000000u));
  }
  uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd; /* rebias exponent (−112 << 23) and round to nearest even */
  return (uint16_t)(sign | (uint16_t)(a >> 13));
}
#endif

/* GCC 12 converts _Float16 one element at a time even where F16C can do eight (it vectorizes
 * those conversions only for AVX-512 FP16), so on CPUs with F16C the f16 runs use its
 * instructions directly: 8 elements per vcvtph2ps / vcvtps2ph, the same per-element results as
 * the scalar forms the cloned loops compile to (exact widening, subnormals included; narrowing
 * in the current rounding mode, as those and the soft-float path of CPUs without F16C do:
 * round-to-nearest-even unless the caller changed it; NaN kept a quiet NaN). */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__FLT16_MAX__)
#include <immintrin.h>
#define SN_HAVE_F16C_RUNS 1
#define SN_F16C_ROUND _MM_FROUND_CUR_DIRECTION

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *dst, const uint16_t *src,
                                                                 int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}

__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *dst, const float *src,
                                                                 int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                                           SN_F16C_ROUND));
  for (; i < n; i++) dst[i] = _cvtss_sh(src[i], SN_F16C_ROUND);
}

/* Whether this CPU has F16C (libgcc fills the CPU model before any library code runs). */
static int have_f16c(void) { return __builtin_cpu_supports("f16c"); }
#else
#define SN_HAVE_F16C_RUNS 0
#endif

SN_CLONES static void bf16_to_f32_run(float *dst, const uint16_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}
SN_CLONES static void f16_to_f32_run(float *dst, const uint16_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}
SN_CLONES static void f32_to_bf16_run(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}
SN_CLONES static void f32_to_f16_run(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}

void sn__to_f32(float *dst, const void *src, int64_t off, int64_t n, sn_dtype_t dtype) {
  switch (dtype) {
    case SN_DTYPE_F32: memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float)); break;
    case SN_DTYPE_BF16: bf16_to_f32_run(dst, (const uint16_t *)src + off, n); break;
    case SN_DTYPE_F16:
#if SN_HAVE_F16C_RUNS
      if (have_f16c()) {
        f16_to_f32_f16c(dst, (const uint16_t *)src + off, n);
        break;
      }
#endif
      f16_to_f32_run(dst, (const uint16_t *)src + off, n);
      break;
    default: break; /* validated by every caller */
  }
}

void sn__from_f32(void *dst, int64_t off, const float *src, int64_t n, sn_dtype_t dtype) {
  switch (dtype) {
    case SN_DTYPE_F32: memcpy((float *)dst + off, src, (size_t)n * sizeof(float)); break;
    case SN_DTYPE_BF16: f32_to_bf16_run((uint16_t *)dst + off, src, n); break;
    case SN_DTYPE_F16:
#if SN_HAVE_F16C_RUNS
      if (have_f16c()) {
        f32_to_f16_f16c((uint16_t *)dst + off, src, n);
        break;
      }
#endif
      f32_to_f16_run((uint16_t *)dst + off, src, n);
      break;
    default: break;
  }
}

SN_CLONES double sn__sum_f64(const float *src, int64_t n) {
  double acc[SN_LANES] = {0};
  int64_t i = 0;
  for (; i + SN_LANES <= n; i += SN_LANES)
    for (int k = 0; k < SN_LANES; k++) acc[k] += (double)src[i + k];
  for (int k = 0; i < n; i++, k++) acc[k] += (double)src[i];
  double s = 0.0;
  for (int k = 0; k < SN_LANES; k++) s += acc[k];
  return s;
}

SN_CLONES double sn__sumsq_shifted_f64(const float *src, int64_t n, double shift) {
  double acc[SN_LANES] = {0};
  int64_t i = 0;
  for (; i + SN_LANES <= n; i += SN_LANES)
    for (int k = 0; k < SN_LANES; k++) {
      double v = (double)src[i + k] - shift;
      acc[k] += v * v;
    }
  for (int k = 0; i < n; i++, k++) {
    double v = (double)src[i] - shift;
    acc[k] += v * v;
  }
  double s = 0.0;
  for (int k = 0; k < SN_LANES; k++) s += acc[k];
  return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
static int64_t stream_min = INT64_MAX;
static int stream_env; /* SN_STREAM_MIN_BYTES set to a valid value: stream_min overrides */
static pthread_once_t stream_once = PTHREAD_ONCE_INIT;

/* The threshold, once per process: SN_STREAM_MIN_BYTES when it holds a whole decimal number
 * (digits only; beyond INT64_MAX: never), which then replaces every kernel's default; else the
 * kernels' defaults (cpu.h). Another value ("16M", "-1", " 5")
 * is ignored with one line on stderr, as libgomp and NCCL do for their variables: a kernel
 * cannot fail over a speed setting, and ignoring it silently would leave a typo unnoticed. */
static void stream_init(void) {
  const char *env = getenv("SN_STREAM_MIN_BYTES");
  if (env == NULL || *env == '\0') return;
  if (strspn(env, "0123456789") != strlen(env)) {
    char shown[65]; /* the value's first 64 bytes, each outside printable ASCII shown as '?' */
    size_t k = 0;
    for (; k < sizeof shown - 1 && env[k] != '\0'; k++)
      shown[k] = env[k] >= ' ' && env[k] <= '~' ? env[k] : '?';
    shown[k] = '\0';
    fprintf(stderr,
            "syncnorm: ignoring SN_STREAM_MIN_BYTES='%s': not a whole number of bytes (such as "
            "0, every output, or 16777216); the default applies\n",
            shown);
    return;
  }
  errno = 0;
  const long long v = strtoll(env, NULL, 10);
  stream_min = errno == ERANGE ? INT64_MAX : v;
  stream_env = 1;
}

int sn__stream_out_from(int64_t out_bytes, int64_t default_min) {
  pthread_once(&stream_once, stream_init);
  return out_bytes >= (stream_env ? stream_min : default_min);
}
#else
int sn__stream_out_from(int64_t out_bytes, int64_t default_min) { /* x86-64 only (sn__store64) */
  (void)out_bytes, (void)default_min;
  return 0;
}
#endif

static int64_t l2_bytes;
static pthread_once_t l2_once = PTHREAD_ONCE_INIT;

/* sysconf reads the cache sizes with cpuid on every call (a VM exit under a hypervisor). */
static void l2_init(void) {
  long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
  v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  l2_bytes = v > 0 ? (int64_t)v : SN_L2_DEFAULT_BYTES;
}

int64_t sn__l2_bytes(void) {
  pthread_once(&l2_once, l2_init);
  return l2_bytes;
}

int sn__max_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int sn__team_for(int64_t units) {
  const int nt = sn__max_threads();
  return units < 1 ? 1 : units < nt ? (int)units : nt;
}

int sn__concurrent_threads(void) {
#ifdef _OPENMP
  const int nt = omp_get_max_threads(), procs = omp_get_num_procs();
  return nt < procs ? nt : procs;
#else
  return 1;
#endif
}

int sn__team_size(void) {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

int sn__thread_num(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

void *sn__alloc(const char *fn, int64_t count, int64_t per_block, int64_t elem_size,
                sn_status_t *status) {
  int64_t elems, bytes;
  *status = sn__mul(fn, &elems, count, per_block);
  if (*status != SN_OK) return NULL;
  *status = sn__mul(fn, &bytes, elems, elem_size);
  if (*status != SN_OK) return NULL;
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void *p = aligned_alloc(64, (size_t)bytes);
  if (p == NULL)
    *status = sn__fail(SN_ERR_ALLOC, "%s: out of memory allocating %lld bytes of scratch", fn,
                       (long long)bytes);
  return p;
}

void sn__free(void *p) { free(p); }
