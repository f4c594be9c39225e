/* testutil.c — see testutil.h. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void tu_rng_seed(tu_rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) { /* splitmix64 */
    seed += 0x9e3779b97f4a7c15ull;
    uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    r->s[i] = z ^ (z >> 31);
  }
}

uint64_t tu_rng_u64(tu_rng_t *r) {
  uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
  return result;
}

double tu_rng_uniform(tu_rng_t *r) { return (double)(tu_rng_u64(r) >> 11) * 0x1.0p-53; }

double tu_rng_normal(tu_rng_t *r) {
  double u1 = tu_rng_uniform(r), u2 = tu_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t tu_rng_int(tu_rng_t *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(tu_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* Round-to-nearest-even of v to a binary format with `mant` explicit mantissa bits, minimum
 * normal exponent emin and maximum finite value maxv (computed in double, exact for our
 * formats since they are narrower than binary64). */
static double round_to_format(double v, int mant, int emin, double maxv) {
  if (isnan(v) || isinf(v) || v == 0.0) return v;
  double a = fabs(v);
  int e;
  frexp(a, &e); /* a = f·2^e, f in [0.5, 1) */
  int exp = e - 1;
  if (exp < emin) exp = emin; /* subnormal: fixed quantum */
  double q = ldexp(1.0, exp - mant);
  double r = nearbyint(a / q) * q; /* default rounding mode: nearest-even */
  /* overflow: values at or beyond max + half an ulp round to infinity */
  double half_ulp_max = ldexp(1.0, (int)floor(log2(maxv)) - mant - 1);
  if (a >= maxv + half_ulp_max) r = INFINITY;
  else if (r > maxv) r = maxv;
  return copysign(r, v);
}

double tu_round(double v, sn_dtype_t dtype) {
  switch (dtype) {
    case SN_DTYPE_F32: return (double)(float)v;
    case SN_DTYPE_BF16: return round_to_format(v, 7, -126, 0x1.fep127);
    case SN_DTYPE_F16: return round_to_format(v, 10, -14, 65504.0);
    default: return v;
  }
}

double tu_get(const void *buf, int64_t i, sn_dtype_t dtype) {
  switch (dtype) {
    case SN_DTYPE_F32: return ((const float *)buf)[i];
    case SN_DTYPE_F64: return ((const double *)buf)[i];
    case SN_DTYPE_BF16: {
      uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case SN_DTYPE_F16: {
      uint16_t h = ((const uint16_t *)buf)[i];
      int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
      double v;
      if (exp == 31) v = man ? NAN : INFINITY;
      else if (exp == 0) v = ldexp((double)man, -24);
      else v = ldexp(1024.0 + man, exp - 25);
      return sign ? -v : v;
    }
  }
  return NAN;
}

void tu_set(void *buf, int64_t i, double v, sn_dtype_t dtype) {
  switch (dtype) {
    case SN_DTYPE_F32: ((float *)buf)[i] = (float)v; return;
    case SN_DTYPE_F64: ((double *)buf)[i] = v; return;
    case SN_DTYPE_BF16: {
      uint16_t h;
      if (isnan(v)) h = 0x7fc0;
      else {
        float f = (float)tu_round(v, SN_DTYPE_BF16);
        uint32_t u;
        memcpy(&u, &f, 4);
        h = (uint16_t)(u >> 16);
      }
      ((uint16_t *)buf)[i] = h;
      return;
    }
    case SN_DTYPE_F16: {
      uint16_t h;
      if (isnan(v)) h = 0x7e00;
      else {
        double r = tu_round(v, SN_DTYPE_F16), a = fabs(r);
        uint16_t sign = signbit(r) ? 0x8000 : 0;
        if (isinf(a)) h = sign | 0x7c00;
        else if (a < ldexp(1.0, -14)) h = sign | (uint16_t)(a / ldexp(1.0, -24));
        else {
          int e;
          double f = frexp(a, &e); /* a = f·2^e */
          int exp = e - 1 + 15;
          uint16_t man = (uint16_t)((f * 2.0 - 1.0) * 1024.0);
          h = sign | (uint16_t)(exp << 10) | man;
        }
      }
      ((uint16_t *)buf)[i] = h;
      return;
    }
  }
}

void *tu_alloc(int64_t n, sn_dtype_t dtype) {
  size_t bytes = (size_t)(n > 0 ? n : 1) * (size_t)sn_dtype_size(dtype);
  void *p = malloc(bytes);
  ck_assert_msg(p != NULL, "out of memory allocating %zu bytes", bytes);
  return p;
}

double *tu_dalloc(int64_t n) { return tu_alloc(n, SN_DTYPE_F64); }

float *tu_falloc(int64_t n) { return tu_alloc(n, SN_DTYPE_F32); }

double *tu_to_f64(const void *buf, int64_t n, sn_dtype_t dtype) {
  double *v = tu_dalloc(n);
  for (int64_t i = 0; i < n; i++) v[i] = tu_get(buf, i, dtype);
  return v;
}

float *tu_random_f32(int64_t n, double mean, double std, tu_rng_t *r) {
  float *v = tu_falloc(n);
  tu_fill_normal(v, n, SN_DTYPE_F32, mean, std, r);
  return v;
}

void tu_transpose(void *dst, sn_layout_t to, const void *src, sn_layout_t from, int64_t N,
                  int64_t C, int64_t S, sn_dtype_t dtype) {
  const size_t es = (size_t)sn_dtype_size(dtype);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t s = 0; s < S; s++)
        memcpy((char *)dst + (size_t)tu_at(to, n, c, s, C, S) * es,
               (const char *)src + (size_t)tu_at(from, n, c, s, C, S) * es, es);
}

void tu_fill_params(float *gamma, float *beta, int64_t C, tu_rng_t *r) {
  for (int64_t c = 0; c < C; c++) {
    gamma[c] = (float)(0.5 + tu_rng_uniform(r));
    beta[c] = (float)(tu_rng_uniform(r) - 0.5);
  }
}

void tu_poison(void *buf, int64_t n, sn_dtype_t dtype) {
  for (int64_t i = 0; i < n; i++) tu_set(buf, i, NAN, dtype);
}

void tu_poison_f32(float *buf, int64_t n) {
  for (int64_t i = 0; i < n; i++) buf[i] = NAN;
}

void tu_set_special(void *buf, int64_t i, sn_dtype_t dtype, int which) {
  static const uint32_t f[4] = {0x7fc00000u, 0xffc00000u, 0x7f800000u, 0xff800000u};
  static const uint16_t bf[4] = {0x7fc0u, 0xffc0u, 0x7f80u, 0xff80u};
  static const uint16_t hf[4] = {0x7e00u, 0xfe00u, 0x7c00u, 0xfc00u};
  if (dtype == SN_DTYPE_F32) memcpy((char *)buf + i * 4, &f[which], 4);
  else memcpy((char *)buf + i * 2, dtype == SN_DTYPE_BF16 ? &bf[which] : &hf[which], 2);
}

int tu_one_nan_f32(float v, int nan) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return nan ? u == 0x7fc00000u : !isnan(v);
}

int tu_one_nan_f64(double v, int nan) {
  uint64_t u;
  memcpy(&u, &v, 8);
  return nan ? u == UINT64_C(0x7ff8000000000000) : !isnan(v);
}

void tu_fill_normal(void *buf, int64_t n, sn_dtype_t dtype, double mean, double std, tu_rng_t *r) {
  for (int64_t i = 0; i < n; i++) tu_set(buf, i, mean + std * tu_rng_normal(r), dtype);
}

void tu_fill_add_adversarial(void *x, void *res, int64_t d, sn_dtype_t dtype, tu_rng_t *r) {
  const double big = dtype == SN_DTYPE_F16 ? 6e4 : 3e38; /* big + big overflows the dtype */
  tu_fill_normal(x, 4 * d, dtype, 0.0, 1.0, r);
  tu_fill_normal(res, 4 * d, dtype, 0.0, 1.0, r);
  for (int64_t i = 0; i < d; i++) {
    tu_set(x, i, 1e4 + tu_get(x, i, dtype), dtype); /* row 0: |x| ≫ σ, cancelled */
    tu_set(res, i, -1e4, dtype);
    tu_set(x, d + i, (double)i, dtype); /* row 1: sorted */
    tu_set(res, d + i, 0.5 * (double)i, dtype);
    tu_set(x, 3 * d + i, i % 3 == 0 ? -big : big, dtype); /* row 3: ±inf and ±big sums */
    tu_set(res, 3 * d + i, i % 2 == 0 ? big : -0.5, dtype);
  }
  tu_set(res, 2 * d + d / 2, NAN, dtype); /* row 2: one NaN */
}

void tu_assert_residual_sum(const void *sum, const void *x, const void *res, int64_t n,
                            sn_dtype_t dtype, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    const double want = tu_round((float)tu_get(x, i, dtype) + (float)tu_get(res, i, dtype), dtype);
    const double got = tu_get(sum, i, dtype);
    TU_CHECK(isnan(want) ? isnan(got) : got == want, "%s: sum_out[%lld] = %.9g, want %.9g", what,
             (long long)i, got, want);
  }
}

void tu_fill_huge_dy(void *x, void *dy, int64_t rows, sn_dtype_t dtype, tu_rng_t *r) {
  tu_fill_normal(dy, rows * 2, dtype, 0.0, 1.0, r);
  for (int64_t i = 0; i < rows; i++) {
    tu_set(x, 2 * i, 1.0, dtype);
    tu_set(x, 2 * i + 1, -1.0, dtype);
    if (i < 4) tu_set(dy, 2 * i, i < 2 ? 3e38 : -3e38, dtype);
  }
}

void tu_fill_near_max(void *buf, int64_t n, sn_dtype_t dtype, double p_pos, tu_rng_t *r) {
  for (int64_t i = 0; i < n; i++) {
    const double m = (0.75 + 0.25 * tu_rng_uniform(r)) * TU_BF16_MAX;
    tu_set(buf, i, tu_rng_uniform(r) < p_pos ? m : -m, dtype);
  }
}

double tu_ulp_diff(double a, double b, sn_dtype_t dtype) {
  if (a == b) return 0.0;
  if (isnan(a) || isnan(b)) return INFINITY;
  int mant = dtype == SN_DTYPE_BF16 ? 7 : dtype == SN_DTYPE_F16 ? 10 : 23;
  int emin = dtype == SN_DTYPE_BF16 ? -126 : dtype == SN_DTYPE_F16 ? -14 : -126;
  double m = fmax(fabs(a), fabs(b));
  int e;
  frexp(m, &e);
  int exp = e - 1 < emin ? emin : e - 1;
  return fabs(a - b) / ldexp(1.0, exp - mant);
}

double tu_normwise_rel(const void *got, sn_dtype_t dtype, const double *ref, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double d = tu_get(got, i, dtype) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (isnan(num)) return INFINITY;
  return sqrt(num) / fmax(sqrt(den), 1e-300);
}

double tu_normwise_rel_f32(const float *got, const double *ref, int64_t n) {
  return tu_normwise_rel(got, SN_DTYPE_F32, ref, n);
}

void tu_assert_all_finite(const void *got, sn_dtype_t dtype, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double v = tu_get(got, i, dtype);
    if (!isfinite(v))
      ck_abort_msg("%s: element %lld is %g (not written, or overflow)", what, (long long)i, v);
  }
}

void tu_assert_fwd(const void *got, sn_dtype_t dtype, const double *ref, const double *scale,
                   int64_t n, const char *what) {
  tu_assert_all_finite(got, dtype, n, what);
  if (dtype == SN_DTYPE_F32) {
    double e = tu_normwise_rel(got, dtype, ref, n);
    ck_assert_msg(e <= TU_RTOL_F32_FWD, "%s (f32): normwise relative error %.3e > %.1e", what, e,
                  TU_RTOL_F32_FWD);
    return;
  }
  tu_check_lowp_mixed(got, dtype, ref, scale, n, what);
}

double tu_lowp_allowed(double exact, double scale, sn_dtype_t dtype) {
  const int mant = dtype == SN_DTYPE_BF16 ? 7 : 10, emin = dtype == SN_DTYPE_BF16 ? -126 : -14;
  int e = emin + 1;
  if (exact != 0.0 && isfinite(exact)) frexp(exact, &e); /* |exact| in [2^(e-1), 2^e) */
  const double ulp = ldexp(1.0, (e - 1 < emin ? emin : e - 1) - mant);
  return fmax(ulp, TU_LOWP_SCALE_TOL * scale);
}

void tu_check_lowp_mixed(const void *got, sn_dtype_t dtype, const double *exact,
                         const double *scale, int64_t n, const char *what) {
  ck_assert_msg(dtype == SN_DTYPE_BF16 || dtype == SN_DTYPE_F16,
                "%s: the mixed bound is for bf16/f16 outputs, not %s", what, tu_dtype_name[dtype]);
  int64_t failed = 0, worst = -1;
  double worst_ratio = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double g = tu_get(got, i, dtype), e = exact[i];
    const double s = scale != NULL ? scale[i] : fabs(e);
    double ratio;
    if (isnan(e)) ratio = isnan(g) ? 0.0 : INFINITY;
    else if (isinf(e)) ratio = g == e ? 0.0 : INFINITY;
    else {
      const double err = fabs(g - e); /* NaN for a NaN g */
      ratio = err <= tu_lowp_allowed(e, s, dtype) ? 0.0
              : isnan(err) ? INFINITY : err / tu_lowp_allowed(e, s, dtype);
    }
    if (ratio > 0.0) {
      failed++;
      if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
    }
  }
  if (failed > 0) {
    const double e = exact[worst], s = scale != NULL ? scale[worst] : fabs(e);
    ck_abort_msg("%s (%s): %lld of %lld elements outside |y - exact| <= max(1 ulp, %a * "
                 "(|xhat*gamma| + |beta|)); worst element %lld = %.9g, exact %.17g, scale %.6g, "
                 "allowed %.3g (error %.3g times that)",
                 what, tu_dtype_name[dtype], (long long)failed, (long long)n, TU_LOWP_SCALE_TOL,
                 (long long)worst,
                 tu_get(got, worst, dtype), e, s, tu_lowp_allowed(e, s, dtype), worst_ratio);
  }
}

int tu_lowp_pair_ok(double a, double b, double scale, sn_dtype_t dtype) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (a == b) return 1;
  return fabs(a - b) <= 2.0 * tu_lowp_allowed(fmax(fabs(a), fabs(b)), scale, dtype);
}

void tu_assert_rel(const void *got, sn_dtype_t dtype, const double *ref, int64_t n, double rtol,
                   const char *what) {
  tu_assert_all_finite(got, dtype, n, what);
  double e = tu_normwise_rel(got, dtype, ref, n);
  ck_assert_msg(e <= rtol, "%s (%s): normwise relative error %.3e > %.1e", what,
                tu_dtype_name[dtype], e, rtol);
}

double tu_rtol_half_bwd(sn_dtype_t dtype) {
  return (dtype == SN_DTYPE_BF16 ? 0x1p-8 : 0x1p-11) + 1e-6;
}

void tu_assert_rel_scaled(const void *got, sn_dtype_t dtype, const double *ref, int64_t n,
                          double scale, double rtol, const char *what) {
  tu_assert_all_finite(got, dtype, n, what);
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double e = tu_get(got, i, dtype) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  double atol = dtype == SN_DTYPE_F16 ? 0x1p-25 * sqrt((double)n) : 0.0;
  double err = (sqrt(num) - atol) / fmax(fmax(sqrt(den), scale), 1e-300);
  ck_assert_msg(err <= rtol, "%s (%s): relative error %.3e > %.1e", what, tu_dtype_name[dtype],
                err, rtol);
}

void tu_assert_stat(float got, double ref, double spread, const char *what, int64_t r) {
  double tol = 0x1p-23 * fabs(ref) + 1e-12 * spread;
  TU_CHECK(fabs((double)got - ref) <= tol, "%s row %lld: %.9g, reference %.9g", what,
           (long long)r, (double)got, ref);
}

void tu_assert_bitwise(const void *a, const void *b, size_t bytes, const char *what) {
  const unsigned char *x = a, *y = b;
  for (size_t i = 0; i < bytes; i++)
    if (x[i] != y[i])
      ck_abort_msg("%s: byte %zu differs (0x%02x vs 0x%02x)", what, i, x[i], y[i]);
}

int tu_run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

void tu_assert_scratch_bytes(long long bytes, const char *what) {
  long long got = 0;
  const char *at = strstr(sn_last_error(), "allocating ");
  ck_assert_msg(at != NULL && sscanf(at, "allocating %lld bytes of scratch", &got) == 1,
                "%s: %s", what, sn_last_error());
  ck_assert_msg(got == bytes, "%s: %lld bytes of scratch asked for, expected %lld", what, got,
                bytes);
}

void tu_assert_scratch_below(long long max_bytes, const char *what) {
  long long got = 0;
  const char *at = strstr(sn_last_error(), "allocating ");
  ck_assert_msg(at != NULL && sscanf(at, "allocating %lld bytes of scratch", &got) == 1,
                "%s: %s", what, sn_last_error());
  ck_assert_msg(got > 0 && got <= max_bytes, "%s: %lld bytes of scratch asked for, at most %lld",
                what, got, max_bytes);
}

double tu_peak_bytes(void) {
  struct rusage u;
  ck_assert_int_eq(getrusage(RUSAGE_SELF, &u), 0);
  return (double)u.ru_maxrss * 1024.0;
}
