/*
 * test_rowsums.c — the fp64 row sums of src/cpu/rownorm.h (sn__row_shifted_sums), which read a
 * bf16 row 32 values at a time as the even and odd halves of 16 words and so keep their lanes
 * permuted until the end, against the documented order computed element by element (of a row,
 * and of the residual sum of two rows, stored as it goes), and against the same sums of the row
 * widened to f32: bitwise equal in fp64, the stored sums too, for every x86-64 level this CPU
 * runs (each compiled here with that level's target attribute, as the library's target_clones
 * variants are). A wrong lane mapping changes the order of the additions, and so the last bits
 * of the sums, which the public kernels' f32 outputs almost never show (their tests compare
 * mean and rstd in f32). The rows mix magnitudes from 2^-20 to 2^20 and both signs, so that the
 * order of the additions shows in the sums.
 * Links the static library (the internal functions the inline functions call).
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/rownorm.h"

/* Lengths: below one pair block, one block, blocks and a partial one, several blocks. */
static const int64_t LENGTHS[] = {1, 2, 31, 32, 33, 63, 64, 65, 95, 300, 1024, 4097};
#define MAX_LEN 4097
/* Rows per length and level: enough that a wrong lane order shows at most lengths (a mutation
 * that dropped the interleave failed at 4097 only with 8). */
#define REPS 64

/* The next of a xorshift64 sequence. */
static uint64_t next_u64(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

/* A bf16 value of random sign and significand with exponent in [-20, 20] (finite, normal). */
static uint16_t random_bf16(uint64_t *rng) {
  const uint64_t r = next_u64(rng);
  const uint32_t sign = (uint32_t)(r & 1u) << 15, mant = (uint32_t)(r >> 1) & 0x7fu;
  const uint32_t exp = 127u - 20u + (uint32_t)((r >> 8) % 41u);
  return (uint16_t)(sign | exp << 7 | mant);
}

/* The block sums (sn__row_shifted_sums) of one row, compiled for one target level: a bf16 row
 * x [n], or (f32) its widened copy xf; with res (the fused kernels' residual row; NULL for none)
 * of the residual sum, stored into sum_out. */
typedef struct {
  void (*bf16)(double s[2], uint16_t *sum_out, const uint16_t *x, const uint16_t *res, int64_t n,
               double K);
  void (*f32)(double s[2], float *sum_out, const float *x, const float *res, int64_t n, double K);
} sums_fns;

#define SUMS_VARIANTS(tag, attr)                                                              \
  attr static void bf16_##tag(double s[2], uint16_t *sum_out, const uint16_t *x,              \
                              const uint16_t *res, int64_t n, double K) {                     \
    sn__row_shifted_sums(s, sum_out, x, res, n, K, 1, SN_NO_PF);                              \
  }                                                                                           \
  attr static void f32_##tag(double s[2], float *sum_out, const float *x, const float *res,   \
                             int64_t n, double K) {                                           \
    sn__row_shifted_sums(s, sum_out, x, res, n, K, 0, SN_NO_PF);                              \
  }                                                                                           \
  static const sums_fns fns_##tag = {bf16_##tag, f32_##tag};

SUMS_VARIANTS(base, )
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SN_TEST_LEVELS 1
SUMS_VARIANTS(v3, __attribute__((target("arch=x86-64-v3"))))
SUMS_VARIANTS(v4, __attribute__((target("arch=x86-64-v4"))))
#endif

/* The sums as sn__row_shifted_sums documents them, element by element: element i (with res: the
 * residual sum, added in f32 and rounded to bf16, stored into sum_out[i]) into fp64 lane
 * i % SN_ROW_LANES, the lanes added by sn__lanes_total. */
static void reference(double s[2], uint16_t *sum_out, const uint16_t *x, const uint16_t *res,
                      int64_t n, double K) {
  double a[SN_ROW_LANES] = {0}, b[SN_ROW_LANES] = {0};
  for (int64_t i = 0; i < n; i++) {
    float v = sn__bf16_to_f32(x[i]);
    if (res != NULL) {
      sum_out[i] = sn__f32_to_bf16(v + sn__bf16_to_f32(res[i]));
      v = sn__bf16_to_f32(sum_out[i]);
    }
    const double t = (double)v - K;
    a[i % SN_ROW_LANES] += t;
    b[i % SN_ROW_LANES] += t * t;
  }
  s[0] = sn__lanes_total(a);
  s[1] = sn__lanes_total(b);
}

static void check_level(const char *level, const sums_fns *f) {
  static uint16_t x[MAX_LEN], res[MAX_LEN], s1[MAX_LEN], s2[MAX_LEN], xin[MAX_LEN];
  static float xf[MAX_LEN], rf[MAX_LEN], sf[MAX_LEN];
  uint64_t rng = 0x9e3779b97f4a7c15u;
  for (size_t l = 0; l < sizeof LENGTHS / sizeof LENGTHS[0]; l++)
    for (int rep = 0; rep < REPS; rep++) {
      const int64_t n = LENGTHS[l];
      for (int64_t i = 0; i < n; i++) x[i] = random_bf16(&rng), res[i] = random_bf16(&rng);
      for (int64_t i = 0; i < n; i++)
        xf[i] = sn__bf16_to_f32(x[i]), rf[i] = sn__bf16_to_f32(res[i]);
      /* a pivot near 0 (rep even) and one near the first value, as sn__row_pivot picks */
      const double K = rep % 2 ? (double)sn__bf16_to_f32(x[0]) : 0.0;
      double a[2], b[2], c[2];
      f->bf16(a, NULL, x, NULL, n, K);
      f->f32(b, NULL, xf, NULL, n, K);
      reference(c, NULL, x, NULL, n, K);
      ck_assert_msg(memcmp(a, c, sizeof a) == 0 && memcmp(b, c, sizeof b) == 0,
                    "%s n=%lld rep %d: bf16 sums %a %a, f32 %a %a, reference %a %a", level,
                    (long long)n, rep, a[0], a[1], b[0], b[1], c[0], c[1]);
      /* the residual sum x + res, into separate rows, then in place (sum_out == x) */
      f->bf16(a, s1, x, res, n, K);
      reference(c, s2, x, res, n, K);
      ck_assert_msg(memcmp(a, c, sizeof a) == 0 && memcmp(s1, s2, (size_t)n * 2) == 0,
                    "%s n=%lld rep %d: residual bf16 sums %a %a, reference %a %a (or sum rows "
                    "differ)", level, (long long)n, rep, a[0], a[1], c[0], c[1]);
      memcpy(xin, x, (size_t)n * 2);
      f->bf16(a, xin, xin, res, n, K);
      ck_assert_msg(memcmp(a, c, sizeof a) == 0 && memcmp(xin, s2, (size_t)n * 2) == 0,
                    "%s n=%lld rep %d: residual bf16 sums in place differ", level, (long long)n,
                    rep);
      /* f32: the residual sum in f32, stored unrounded; the sums are those of the stored row */
      f->f32(a, sf, xf, rf, n, K);
      f->f32(b, NULL, sf, NULL, n, K);
      int same = memcmp(a, b, sizeof a) == 0;
      for (int64_t i = 0; i < n; i++) same &= sf[i] == xf[i] + rf[i];
      ck_assert_msg(same, "%s n=%lld rep %d: f32 residual sums %a %a, of the stored row %a %a",
                    level, (long long)n, rep, a[0], a[1], b[0], b[1]);
    }
}

START_TEST(test_shifted_sums_bf16_bitwise) {
  check_level("baseline", &fns_base);
#ifdef SN_TEST_LEVELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v3")) check_level("x86-64-v3", &fns_v3);
  if (__builtin_cpu_supports("x86-64-v4")) check_level("x86-64-v4", &fns_v4);
#endif
}
END_TEST

int main(void) {
  Suite *s = suite_create("rowsums");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_shifted_sums_bf16_bitwise);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
