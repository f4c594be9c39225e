/*
 * test_convert.c — the f32 <-> bf16/f16 runs every low-precision kernel goes through
 * (sn__to_f32, sn__from_f32 in src/cpu/convert.c), against references written here from the
 * IEEE 754 definitions: every f16 and bf16 bit pattern widened exactly (f16 NaNs quieted), and f32 values narrowed
 * round-to-nearest-even at every tie, boundary and special case, in runs of every length 0..40
 * at every offset 0..7 (the vector body and the scalar tail of each run). Links the static
 * library for the internal functions.
 */
#include <check.h>
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/cpu.h"

/* ck_assert_msg marks a point on every pass (a write to Check's pipe): too slow for millions of
 * elements, so the element loops test first and fail through ck_abort_msg. */
#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) ck_abort_msg(__VA_ARGS__); \
  } while (0)

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* The next of a xorshift64 sequence of random bit patterns (its upper half). */
static uint32_t next_u32(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return (uint32_t)(*x >> 32);
}

/* binary16 → double from its fields: (−1)^s · 2^(e−15) · 1.m, subnormals 2^-14 · 0.m. */
static double ref_f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double v = e == 31 ? INFINITY : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

/* f32 → binary16 bits, round to nearest even, from the value: the f16 neighbours below and
 * above |f| are found by scaling to the f16 quantum (2^-24 below 2^-14, else 2^(e−10)). */
static uint16_t ref_f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (isnan(f)) return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu)); /* quieted, payload */
  const double a = fabs((double)f);
  if (a >= 65520.0) return (uint16_t)(sign | 0x7c00u); /* max 65504; from the midpoint up: inf */
  int e;
  frexp(a, &e); /* a = 0.5..1 · 2^e */
  const int q = a < 0x1p-14 ? -24 : e - 1 - 10; /* quantum exponent */
  const double n = ldexp(a, -q);                /* exact: a has 24 bits */
  double r = floor(n);
  const double frac = n - r;
  if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) != 0.0)) r += 1.0;
  const double v = ldexp(r, q);
  /* encode v (exactly representable, < 65520) */
  if (v == 0.0) return sign;
  if (v < 0x1p-14) return (uint16_t)(sign | (uint16_t)ldexp(v, 24));
  int ev;
  const double mant = frexp(v, &ev); /* v = mant · 2^ev, mant in [0.5, 1) */
  const int eb = ev - 1 + 15, mb = (int)(ldexp(mant, 11) - 1024.0);
  return (uint16_t)(sign | (uint16_t)(eb << 10) | (uint16_t)mb);
}

/* f32 → bf16 bits, round to nearest even on the upper half, NaN quieted. */
static uint16_t ref_f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x0040u);
  const uint32_t lo = u & 0xffffu, hi = u >> 16;
  const uint32_t up = lo > 0x8000u || (lo == 0x8000u && (hi & 1u));
  return (uint16_t)(hi + up); /* carries into the exponent (to inf) as rounding does */
}

/* src [total] through sn__from_f32 in one run at output offsets 0..7, then in runs of every
 * length 0..40 at offsets 0..7 from a sample of starting points, compared with ref elementwise;
 * the element after each short run must stay untouched. */
static void check_narrow_runs(const float *src, int64_t total, sn_dtype_t dt,
                              uint16_t (*ref)(float)) {
  uint16_t *all = malloc((size_t)(total + 8) * sizeof *all);
  for (int off = 0; off < 8; off++) { /* every value, one long run at each output offset */
    sn__from_f32(all, off, src, total, dt);
    for (int64_t k = 0; k < total; k++) {
      const uint16_t want = ref(src[k]);
      CHECK(all[off + k] == want, "%s: %a (0x%08x) narrowed to 0x%04x, want 0x%04x",
            dt == SN_DTYPE_F16 ? "f16" : "bf16", (double)src[k], f32_bits(src[k]),
            all[off + k], want);
    }
  }
  free(all);
  uint16_t out[64];
  for (int64_t base = 0; base + 48 <= total; base += 41 * 5)
    for (int off = 0; off < 8; off++)
      for (int64_t n = 0; n <= 40; n++) {
        for (int k = 0; k < 64; k++) out[k] = 0xdeadu;
        sn__from_f32(out, off, src + base, n, dt);
        for (int64_t k = 0; k < n; k++) {
          const uint16_t want = ref(src[base + k]);
          CHECK(out[off + k] == want, "%s: %a (0x%08x) narrowed to 0x%04x, want 0x%04x",
                dt == SN_DTYPE_F16 ? "f16" : "bf16", (double)src[base + k],
                f32_bits(src[base + k]), out[off + k], want);
        }
        CHECK(out[off + n] == 0xdeadu, "the run of %lld wrote past its end", (long long)n);
      }
}

/* Every binary16 / bf16 bit pattern widened: exact values (NaN stays NaN, with its sign and
 * payload shifted into place), in runs of every length at every offset. */
START_TEST(test_widen_every_pattern) {
  const sn_dtype_t dt = _i == 0 ? SN_DTYPE_F16 : SN_DTYPE_BF16;
  uint16_t *all = malloc(65536 * sizeof *all);
  float *out = malloc((65536 + 8) * sizeof *out);
  for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
  for (int off = 0; off < 3; off++) { /* whole array at a few offsets of the output */
    sn__to_f32(out + off, all, 0, 65536, dt);
    for (uint32_t h = 0; h < 65536; h++) {
      const float got = out[off + h];
      if (dt == SN_DTYPE_BF16) {
        CHECK(f32_bits(got) == h << 16, "bf16 0x%04x widened to 0x%08x", h,
              f32_bits(got));
        continue;
      }
      const int nan = ((h >> 10) & 31) == 31 && (h & 1023) != 0;
      if (nan) {
        /* IEEE 754 conversion quiets a signalling NaN: the payload moves up, quiet bit set */
        const uint32_t want = ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 1023u) << 13);
        CHECK(f32_bits(got) == want, "f16 NaN 0x%04x widened to 0x%08x", h,
              f32_bits(got));
      } else {
        const double want = ref_f16_value((uint16_t)h);
        CHECK((double)got == want && !signbit(got) == !signbit(want),
              "f16 0x%04x widened to %a, want %a", h, (double)got, want);
      }
    }
  }
  /* short runs: lengths 0..40 at offsets 0..7 of the source, one element past stays put */
  for (int64_t base = 0; base < 65536 - 48; base += 997)
    for (int off = 0; off < 8; off++)
      for (int64_t n = 0; n <= 40; n++) {
        float run[48];
        for (int k = 0; k < 48; k++) run[k] = -7.0f;
        sn__to_f32(run, all, base + off, n, dt);
        float whole[48];
        sn__to_f32(whole, all, base + off, 48, dt);
        CHECK(memcmp(run, whole, (size_t)n * sizeof(float)) == 0,
              "run of %lld at %lld differs from the whole conversion", (long long)n,
              (long long)(base + off));
        CHECK(run[n] == -7.0f, "a run wrote past its end");
      }
  free(all);
  free(out);
}
END_TEST

/* f32 values that exercise f16 rounding: for every exponent from below the f16 subnormals to
 * beyond its range and both signs, mantissas at and around each tie (the 13 or more bits dropped
 * equal to half, half ± 1 ulp, all ones, zero) with even and odd kept bits; the largest finite
 * f16, the overflow midpoint 65520 and its neighbours, the subnormal and normal boundaries,
 * zeros, infinities, quiet and signalling NaNs; then random bit patterns. */
START_TEST(test_narrow_f16) {
  enum { MAX = 1 << 16 };
  float *v = malloc(MAX * sizeof *v);
  int64_t n = 0;
  for (int e = 127 - 30; e <= 127 + 17; e++)
    for (uint32_t s = 0; s < 2; s++)
      for (uint32_t kept = 0; kept < 4; kept++)
        for (uint32_t shift = 0; shift < 12; shift++) { /* subnormal f16 drop more bits */
          const uint32_t low_mask = (1u << (13 + shift)) - 1, tie = 1u << (12 + shift);
          const uint32_t dropped[] = {0, 1, tie - 1, tie, tie + 1, low_mask, tie >> 1};
          uint32_t high = ((kept * 0x2a5u) << 13) & ~low_mask & 0x7fffffu;
          if (kept & 1) high |= (low_mask + 1) & 0x7fffffu; /* odd kept bit */
          for (size_t l = 0; l < sizeof dropped / sizeof *dropped; l++)
            v[n++] = bits_f32(s << 31 | (uint32_t)e << 23 | high | dropped[l]);
        }
  static const float special[] = {65504.0f, 65519.99f, 65520.0f, 65520.01f, 65536.0f, 1e9f,
                                  0x1p-14f, 0x1.ffcp-15f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f,
                                  0x1p-26f, 0x1.8p-24f, 0x1.4p-24f, 0.0f, -0.0f, INFINITY,
                                  -INFINITY, 1.0f, -1.0f, 0x1p-149f, FLT_MAX};
  for (size_t k = 0; k < sizeof special / sizeof *special; k++) v[n++] = special[k], v[n++] = -special[k];
  v[n++] = bits_f32(0x7fc00000u), v[n++] = bits_f32(0xffc00001u); /* quiet NaNs */
  v[n++] = bits_f32(0x7f800001u), v[n++] = bits_f32(0xff802000u); /* signalling NaNs */
  v[n++] = bits_f32(0x7fffffffu);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  while (n < MAX) { /* random patterns, half of them inside the f16 range */
    uint32_t u = next_u32(&x);
    if (n & 1) u = (u & 0x807fffffu) | (uint32_t)(127 - 26 + (int)((x >> 8) % 44)) << 23;
    v[n++] = bits_f32(u);
  }
  check_narrow_runs(v, n, SN_DTYPE_F16, ref_f32_to_f16);
  free(v);
}
END_TEST

/* bf16 narrowing on the same kind of values: ties on the lower half with even and odd kept
 * bits at every exponent, overflow to infinity, NaNs, random patterns. */
START_TEST(test_narrow_bf16) {
  enum { MAX = 1 << 15 };
  float *v = malloc(MAX * sizeof *v);
  int64_t n = 0;
  static const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  for (uint32_t e = 0; e < 256; e++)
    for (uint32_t s = 0; s < 2; s++)
      for (uint32_t kept = 0; kept < 2; kept++)
        for (size_t l = 0; l < sizeof lows / sizeof *lows; l++)
          v[n++] = bits_f32(s << 31 | e << 23 | (0x7fu - kept) << 16 | lows[l]);
  uint64_t x = 0x1234567887654321ull;
  while (n < MAX) v[n++] = bits_f32(next_u32(&x));
  check_narrow_runs(v, n, SN_DTYPE_BF16, ref_f32_to_bf16);
  free(v);
}
END_TEST

/* Narrowing follows the current rounding mode on every path, as the compiler's own _Float16
 * conversion does (the scalar code of CPUs without F16C): under FE_UPWARD / FE_DOWNWARD /
 * FE_TOWARDZERO values between two f16 neighbours go up / down / toward 0. */
START_TEST(test_narrow_f16_rounding_mode) {
#if defined(__FLT16_MAX__) && defined(FE_UPWARD) && defined(FE_DOWNWARD) && defined(FE_TOWARDZERO)
  static const int modes[3] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
  volatile float in[6] = {1.0f + 0x1p-12f, -1.0f - 0x1p-12f, 0x1.0p-25f, 65519.0f, -3.0e-8f,
                          1.0f + 0x1p-11f + 0x1p-13f};
  for (int k = 0; k < 3; k++) {
    float v[24];
    for (int i = 0; i < 24; i++) v[i] = in[i % 6];
    uint16_t got[24], want[24];
    ck_assert_int_eq(fesetround(modes[k]), 0);
    sn__from_f32(got, 0, v, 24, SN_DTYPE_F16);
    for (int i = 0; i < 24; i++) {
      const _Float16 h = (_Float16)v[i];
      memcpy(&want[i], &h, sizeof h);
    }
    fesetround(FE_TONEAREST);
    for (int i = 0; i < 24; i++)
      CHECK(got[i] == want[i], "mode %d: %a narrowed to 0x%04x, the compiler's 0x%04x", k,
            (double)v[i], got[i], want[i]);
    CHECK(k != 0 || got[0] == 0x3c01u, "FE_UPWARD: 1 + 2^-12 must round up to 0x3c01");
  }
#endif
}
END_TEST

int main(void) {
  Suite *s = suite_create("convert");
  TCase *tc = tcase_create("core");
  tcase_add_loop_test(tc, test_widen_every_pattern, 0, 2);
  tcase_add_test(tc, test_narrow_f16);
  tcase_add_test(tc, test_narrow_bf16);
  tcase_add_test(tc, test_narrow_f16_rounding_mode);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
