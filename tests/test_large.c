/*
 * test_large.c — LayerNorm and RMSNorm on one bf16 tensor of more than 2^31 elements (4.3 GB),
 * and LayerNorm on one row of 2^31 + 37 elements (test_one_row_bf16), in place (y == x) to halve
 * the memory: element offsets past 2^31 must be int64 everywhere. Also the scratch of GroupNorm
 * NHWC with 2^20 channels on 64 threads (test_groupnorm_nhwc_scratch).
 * d = 4097 is odd, so the element 2^31 falls inside row 524160, not on a row boundary.
 *
 * Checked: rows at the start, around the 2^31 boundary and at the end against an fp64 reference
 * (each element at the bf16 forward bound, which without beta is 1 ulp of the exact value;
 * mean/rstd within an f32 rounding); every row written (a row
 * left as input keeps its mean of 3..9 and fails the per-row mean/mean-square check).
 */
#define _GNU_SOURCE /* madvise(MADV_HUGEPAGE) */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "testutil.h"


static const int64_t D = 4097, ROWS = 524300; /* 2,148,057,100 elements > 2^31 */
static const float EPS = 1e-5f;

/* Input element i: row r = i / D holds 3 + r % 7 plus uniform noise in [-1, 1), from a hash of
 * i, so any row can be regenerated for the reference without keeping a copy. */
static float gen(int64_t i) {
  uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull;
  z ^= z >> 31;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 29;
  return (float)(3 + (i / D) % 7) + ((float)(z >> 40) * 0x1p-23f - 1.0f);
}

/* f32 → bf16, round to nearest even (finite inputs), written here independently of the
 * library. */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Rows checked against the fp64 reference. */
static int64_t sample_rows(int64_t *out) {
  const int64_t mid = ((int64_t)1 << 31) / D; /* row holding element 2^31 */
  const int64_t rows[] = {0, 1, mid - 1, mid, mid + 1, ROWS - 2, ROWS - 1};
  memcpy(out, rows, sizeof rows);
  return (int64_t)(sizeof rows / sizeof rows[0]);
}

/* A row (bf16) against its fp64 reference at the forward bound (no beta: the scale |x̂·gamma| is
 * |y|, tu_check_lowp_mixed's NULL scale). */
static void check_row(const uint16_t *got, const double *ref, const char *what, int64_t r) {
  char msg[64];
  snprintf(msg, sizeof msg, "%s row %lld", what, (long long)r);
  tu_check_lowp_mixed(got, SN_DTYPE_BF16, ref, NULL, D, msg);
}

/* Index of the first row whose mean or mean square is off (or ROWS if none): every row of the
 * normalized tensor has mean ≈ 0 (LayerNorm) and mean square ≈ ms. */
static int64_t first_bad_row(const uint16_t *buf, double ms, int centred) {
  int64_t bad = ROWS;
#pragma omp parallel for schedule(static) reduction(min : bad)
  for (int64_t r = 0; r < ROWS; r++) {
    double s = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < D; i++) {
      double v = from_bf16(buf[r * D + i]);
      s += v;
      s2 += v * v;
    }
    s /= (double)D, s2 /= (double)D;
    if (!(fabs(s2 / ms - 1.0) < 1e-2) || (centred && !(fabs(s) < 1e-2))) bad = r < bad ? r : bad;
  }
  return bad;
}

START_TEST(test_large_bf16_in_place) {
  const int64_t n = ROWS * D;
  ck_assert(n > ((int64_t)1 << 31));
  const size_t bytes = (size_t)n * sizeof(uint16_t);
  uint16_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED)
    ck_abort_msg("cannot map %zu bytes for the %lld-element tensor: this test needs 4.3 GB of "
                 "free memory", bytes, (long long)n);
#ifdef MADV_HUGEPAGE
  madvise(buf, bytes, MADV_HUGEPAGE); /* fewer page faults; a hint, failure is harmless */
#endif
  float *mean = malloc(ROWS * sizeof(float)), *rstd = malloc(ROWS * sizeof(float));
  float *gamma = malloc(D * sizeof(float));
  int64_t srows[8];
  const int64_t ns = sample_rows(srows);
  double *saved = malloc((size_t)(ns * D) * sizeof(double)), *ref = malloc(D * sizeof(double));
  ck_assert(mean && rstd && gamma && saved && ref);
  tu_poison_f32(mean, ROWS);
  tu_poison_f32(rstd, ROWS);

#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) buf[i] = to_bf16(gen(i));

  /* LayerNorm, no affine, y == x */
  sn_status_t st = sn_layernorm_fwd(buf, mean, rstd, buf, NULL, NULL, ROWS, D, EPS, SN_DTYPE_BF16);
  ck_assert_msg(st == SN_OK, "sn_layernorm_fwd: %s", sn_last_error());
  for (int64_t k = 0; k < ns; k++) {
    const int64_t r = srows[k];
    double mu = 0.0, var = 0.0;
    for (int64_t i = 0; i < D; i++) mu += from_bf16(to_bf16(gen(r * D + i)));
    mu /= (double)D;
    for (int64_t i = 0; i < D; i++) {
      double v = from_bf16(to_bf16(gen(r * D + i))) - mu;
      var += v * v;
    }
    double rs = 1.0 / sqrt(var / (double)D + EPS);
    for (int64_t i = 0; i < D; i++) ref[i] = (from_bf16(to_bf16(gen(r * D + i))) - mu) * rs;
    check_row(buf + r * D, ref, "layernorm", r);
    TU_CHECK(fabs(mean[r] - mu) <= 0x1p-23 * fabs(mu) && fabs(rstd[r] - rs) <= 0x1p-23 * rs,
          "row %lld: mean %.9g rstd %.9g, reference %.9g %.9g", (long long)r, (double)mean[r],
          (double)rstd[r], mu, rs);
    for (int64_t i = 0; i < D; i++) saved[k * D + i] = from_bf16(buf[r * D + i]);
  }
  for (int64_t r = 0; r < ROWS; r++)
    TU_CHECK(fabs(mean[r] - (3 + r % 7)) < 0.1 && rstd[r] > 1.5f && rstd[r] < 2.0f,
          "row %lld: mean %g rstd %g not written", (long long)r, (double)mean[r], (double)rstd[r]);
  int64_t bad = first_bad_row(buf, 1.0, 1);
  TU_CHECK(bad == ROWS, "layernorm row %lld not normalized (left unwritten?)", (long long)bad);

  /* RMSNorm with gamma = 2 on the normalized tensor, y == x: mean square 1 → 4 */
  for (int64_t i = 0; i < D; i++) gamma[i] = 2.0f;
  tu_poison_f32(rstd, ROWS);
  st = sn_rmsnorm_fwd(buf, rstd, buf, gamma, ROWS, D, EPS, SN_DTYPE_BF16);
  ck_assert_msg(st == SN_OK, "sn_rmsnorm_fwd: %s", sn_last_error());
  for (int64_t k = 0; k < ns; k++) {
    const int64_t r = srows[k];
    const double *x = saved + k * D;
    double ms = 0.0;
    for (int64_t i = 0; i < D; i++) ms += x[i] * x[i];
    double rs = 1.0 / sqrt(ms / (double)D + EPS);
    for (int64_t i = 0; i < D; i++) ref[i] = x[i] * rs * 2.0;
    check_row(buf + r * D, ref, "rmsnorm", r);
    TU_CHECK(fabs(rstd[r] - rs) <= 0x1p-23 * rs, "row %lld: rstd %.9g, reference %.9g",
          (long long)r, (double)rstd[r], rs);
  }
  for (int64_t r = 0; r < ROWS; r++)
    TU_CHECK(fabs(rstd[r] - 1.0f) < 0.02f, "row %lld: rstd %g not written", (long long)r,
          (double)rstd[r]);
  bad = first_bad_row(buf, 4.0, 0);
  TU_CHECK(bad == ROWS, "rmsnorm row %lld not normalized (left unwritten?)", (long long)bad);

  munmap(buf, bytes);
  free(mean), free(rstd), free(gamma), free(saved), free(ref);
}
END_TEST

/* One bf16 row of 2^31 + 37 elements, LayerNorm in place without gamma and beta: it runs, with
 * extra memory under ROW_PEAK_FRACTION of its input (longrow.c: scratch that does not grow with
 * d), and a sample of elements, at the start, around 2^31 and at the end, is within the bf16
 * bound of the fp64 reference (no beta: 1 ulp). */
#define ROW_PEAK_FRACTION (1.0 / 16)
START_TEST(test_one_row_bf16) {
  const int64_t d = ((int64_t)1 << 31) + 37;
  const size_t bytes = (size_t)d * sizeof(uint16_t);
  uint16_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED)
    ck_abort_msg("cannot map %zu bytes for the row: this test needs 4.3 GB of free memory", bytes);
#ifdef MADV_HUGEPAGE
  madvise(buf, bytes, MADV_HUGEPAGE);
#endif
  double s = 0.0, q = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s)
  for (int64_t i = 0; i < d; i++) {
    buf[i] = to_bf16(gen(i));
    s += from_bf16(buf[i]);
  }
  const double mu = s / (double)d;
#pragma omp parallel for schedule(static) reduction(+ : q)
  for (int64_t i = 0; i < d; i++) q += (from_bf16(buf[i]) - mu) * (from_bf16(buf[i]) - mu);
  const double rs = 1.0 / sqrt(q / (double)d + EPS);
  const int64_t at[] = {0, 1, ((int64_t)1 << 31) - 1, (int64_t)1 << 31, d - 2, d - 1};
  enum { NS = sizeof at / sizeof at[0] };
  double ref[NS], got[NS];
  for (int k = 0; k < NS; k++) ref[k] = (from_bf16(buf[at[k]]) - mu) * rs;
  float mean, rstd;
  const double before = tu_peak_bytes();
  sn_status_t st = sn_layernorm_fwd(buf, &mean, &rstd, buf, NULL, NULL, 1, d, EPS, SN_DTYPE_BF16);
  ck_assert_msg(st == SN_OK, "sn_layernorm_fwd: %s", sn_last_error());
  const double grew = tu_peak_bytes() - before;
  TU_CHECK(grew < ROW_PEAK_FRACTION * (double)bytes, "peak grew by %.0f bytes for a %zu-byte row",
           grew, bytes);
  for (int k = 0; k < NS; k++) {
    got[k] = from_bf16(buf[at[k]]);
    TU_CHECK(fabs(got[k] - ref[k]) <= tu_lowp_allowed(ref[k], fabs(ref[k]), SN_DTYPE_BF16),
             "element %lld: %.6g, reference %.6g", (long long)at[k], got[k], ref[k]);
  }
  TU_CHECK(fabs(mean - mu) <= 1e-6 * fabs(mu) && fabs(rstd - rs) <= 1e-6 * rs,
           "mean %.9g rstd %.9g, reference %.9g %.9g", (double)mean, (double)rstd, mu, rs);
  munmap(buf, bytes);
}
END_TEST

/* GroupNorm NHWC with 2^20 channels on 64 threads: the per-thread scratch blocks of the
 * forward and backward stay within the bound their docstrings state (64 MiB together, or one
 * block where one is larger), where one block per thread would be 2.7 GB; and the forward's y,
 * mean and rstd match an fp64 reference in a few groups. */
#define GN_BLOCKS_MAX (64.0 * 1024 * 1024) /* syncnorm.h, sn_groupnorm_fwd / _bwd */
#define PEAK_SLACK (4.0 * 1024 * 1024)     /* the allocator's and the OpenMP runtime's own */
/* f32 y within 16 roundings of |x̂| + 1 (no gamma, beta: a few, syncnorm.h); mean and rstd are
 * fp64 values rounded to f32 once */
#define GN_F32_TOL 0x1p-20
START_TEST(test_groupnorm_nhwc_scratch) {
  const int64_t N = 48, C = (int64_t)1 << 20, S = 1, G = 1024, Cg = C / G, n = N * S * C;
  float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
  float *dy = malloc((size_t)n * sizeof *dy), *mean = malloc((size_t)(N * G) * sizeof *mean);
  float *rstd = malloc((size_t)(N * G) * sizeof *rstd);
  ck_assert_msg(x && y && dy && mean && rstd, "cannot allocate 600 MB for the tensors");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) x[i] = gen(i), dy[i] = gen(n - 1 - i) - 6.0f, y[i] = 0.0f;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(64);
  double before = tu_peak_bytes();
  sn_status_t st = sn_groupnorm_fwd(y, mean, rstd, x, NULL, NULL, N, C, S, G, EPS, SN_LAYOUT_NHWC,
                                    SN_DTYPE_F32);
  double grew = tu_peak_bytes() - before, block = (5.0 * C + 2.0 * G) * sizeof(double);
  ck_assert_msg(st == SN_OK, "sn_groupnorm_fwd: %s", sn_last_error());
  TU_CHECK(grew <= fmax(GN_BLOCKS_MAX, block) + PEAK_SLACK, "forward: peak grew by %.0f bytes",
           grew);
  before = tu_peak_bytes();
  st = sn_groupnorm_bwd(dy, NULL, NULL, dy, x, mean, rstd, NULL, N, C, S, G, SN_LAYOUT_NHWC,
                        SN_DTYPE_F32);
  grew = tu_peak_bytes() - before, block = (7.0 * C + 3.0 * G) * sizeof(double);
  ck_assert_msg(st == SN_OK, "sn_groupnorm_bwd: %s", sn_last_error());
  TU_CHECK(grew <= fmax(GN_BLOCKS_MAX, block) + PEAK_SLACK, "backward: peak grew by %.0f bytes",
           grew);
  omp_set_num_threads(saved);
  const int64_t groups[][2] = {{0, 0}, {0, G - 1}, {N / 2, G / 3}, {N - 1, G - 1}};
  for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
    const int64_t s0 = groups[k][0] * C + groups[k][1] * Cg; /* S = 1: one run of Cg values */
    double mu = 0.0, q = 0.0;
    for (int64_t j = 0; j < Cg; j++) mu += x[s0 + j];
    mu /= (double)Cg;
    for (int64_t j = 0; j < Cg; j++) q += (x[s0 + j] - mu) * (x[s0 + j] - mu);
    const double rs = 1.0 / sqrt(q / (double)Cg + EPS);
    const int64_t gi = groups[k][0] * G + groups[k][1];
    TU_CHECK(fabs(mean[gi] - mu) <= GN_F32_TOL * fabs(mu) &&
                 fabs(rstd[gi] - rs) <= GN_F32_TOL * rs,
             "group %zu: mean %.9g rstd %.9g, reference %.9g %.9g", k, (double)mean[gi],
             (double)rstd[gi], mu, rs);
    for (int64_t j = 0; j < Cg; j++) {
      const double ref = (x[s0 + j] - mu) * rs;
      TU_CHECK(fabs(y[s0 + j] - ref) <= GN_F32_TOL * (fabs(ref) + 1.0),
               "group %zu, element %lld: %.9g, reference %.9g", k, (long long)j, (double)y[s0 + j],
               ref);
    }
  }
  free(x), free(y), free(dy), free(mean), free(rstd);
}
END_TEST

int main(void) {
  Suite *s = suite_create("large");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, test_large_bf16_in_place);
  tcase_add_test(tc, test_one_row_bf16);
  tcase_add_test(tc, test_groupnorm_nhwc_scratch);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
