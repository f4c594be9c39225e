/*
 * testutil.h — shared helpers for the Check-based tests: a seeded RNG, dtype rounding written
 * independently of the library, NaN poisoning, fp64-reference comparisons and named tolerances.
 */
#ifndef SN_TESTUTIL_H
#define SN_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "syncnorm.h"

/* ---- tolerances (each with its reason) ------------------------------------------------------ */
/* f32 forward vs fp64 reference, normwise ||got−ref||/||ref||: the bound. Statistics are
 * fp64, so the error is the few f32 roundings of the final affine map (~3 ulp, 2e-7). */
#define TU_RTOL_F32_FWD 1e-6
/* f32 backward vs the analytic fp64 gradient, normwise: dx combines dy·gamma with two row means,
 * a handful of f32 roundings on values of the size of the result (~5 ulp). */
#define TU_RTOL_F32_BWD 2e-6
/* bf16/f16 forward outputs of every kernel (CPU and CUDA), the project's bound:
 *   |y − y_exact| ≤ max(1 ulp of y_exact in the dtype, TU_LOWP_SCALE_TOL·(|x̂·γ| + |β|)),
 * x̂ the exact normalized value. The second term is what f32 arithmetic in the affine map
 * x̂·γ + β meets: a few f32 roundings (2^-24) of its terms and the f32 statistics' relative error
 * times |x̂·γ|, with margin. Where β cancels x̂·γ, y is far below its terms and 1 ulp of y is out
 * of f32's reach; elsewhere the 1-ulp term is the larger and the bound is 1 ulp of y_exact. */
#define TU_LOWP_SCALE_TOL 0x1p-16
/* Central finite differences of the fp64 reference with step h = 1e-6·scale: truncation O(h²)
 * plus cancellation O(1e-16/h) — about 1e-9 relative; 1e-6 leaves margin for ill-conditioned
 * rows (tiny variance). */
#define TU_RTOL_FD 1e-6

/* ---- RNG: xoshiro256**, seeded; identical streams on every machine ------------------------- */
typedef struct { uint64_t s[4]; } tu_rng_t;
void tu_rng_seed(tu_rng_t *r, uint64_t seed);
uint64_t tu_rng_u64(tu_rng_t *r);
double tu_rng_uniform(tu_rng_t *r);          /* [0, 1) */
double tu_rng_normal(tu_rng_t *r);           /* N(0, 1), Box–Muller */
int64_t tu_rng_int(tu_rng_t *r, int64_t lo, int64_t hi); /* [lo, hi] */

/* ---- dtype helpers (independent of the library's conversion code) -------------------------- */
/* Round a double to the dtype's nearest value, returned as a double (f32: (float) cast). */
double tu_round(double v, sn_dtype_t dtype);
/* Element i of buf (dtype) as double / store v rounded to the dtype. */
double tu_get(const void *buf, int64_t i, sn_dtype_t dtype);
void tu_set(void *buf, int64_t i, double v, sn_dtype_t dtype);
/* Allocate n elements of dtype (aborts the test on failure); free with free(). */
void *tu_alloc(int64_t n, sn_dtype_t dtype);
/* n doubles / n floats (at least one element; aborts the test on failure); free with free(). */
double *tu_dalloc(int64_t n);
float *tu_falloc(int64_t n);
/* A new array of the n elements of buf (dtype) as doubles; free with free(). */
double *tu_to_f64(const void *buf, int64_t n, sn_dtype_t dtype);
/* A new array of n f32 values mean + std·N(0,1); free with free(). */
float *tu_random_f32(int64_t n, double mean, double std, tu_rng_t *r);
/* Fill with NaN (for outputs: every element must be overwritten). */
void tu_poison(void *buf, int64_t n, sn_dtype_t dtype);
void tu_poison_f32(float *buf, int64_t n);
/* Store the raw bits of a special value at element i: which 0 +NaN, 1 −NaN, 2 +Inf, 3 −Inf
 * (quiet NaNs of payload 0, as the dtype's bits). */
void tu_set_special(void *buf, int64_t i, sn_dtype_t dtype, int which);
/* Whether v is the one NaN the BatchNorm and GroupNorm statistics hold (NAN: positive, payload
 * 0) where nan, or else not a NaN. */
int tu_one_nan_f32(float v, int nan);
int tu_one_nan_f64(double v, int nan);
/* Fill with mean + std·N(0,1), rounded to the dtype. */
void tu_fill_normal(void *buf, int64_t n, sn_dtype_t dtype, double mean, double std, tu_rng_t *r);
/* A row-norm backward batch x, dy [rows, 2] (rows >= 4) whose gradients near FLT_MAX cancel:
 * every x row is [1, −1]; dy is N(0,1) except dy[0..3][0] = +3e38, +3e38, −3e38, −3e38 (one
 * reduction chunk when rows >= 256), whose f32 running sums would overflow. */
void tu_fill_huge_dy(void *x, void *dy, int64_t rows, sn_dtype_t dtype, tu_rng_t *r);
/* The largest finite bf16, 0x1.fep127 (3.39e38): every value of magnitude ≤ it is a finite bf16
 * and f32 after rounding. */
#define TU_BF16_MAX 0x1.fep127
/* Fill with ±U[0.75, 1)·TU_BF16_MAX rounded to the dtype (f32 or bf16), + with probability
 * p_pos: values of both signs near the f32 range, whose differences from the mean (about
 * (2·p_pos − 1)·0.9·TU_BF16_MAX, well beyond 2^103) exceed FLT_MAX although every normalized
 * output is O(1). */
void tu_fill_near_max(void *buf, int64_t n, sn_dtype_t dtype, double p_pos, tu_rng_t *r);
/* The fused kernels' adversarial batch x, residual [4, d], N(0,1) but: row 0 a sum that cancels
 * |x| ≫ σ (x = 1e4 + N(0,1), residual −1e4), row 1 sorted (x = i, residual i/2: the first values
 * are not typical of the row), row 2 one NaN in the residual, row 3 sums beyond the dtype's range
 * (±big + ±big or −0.5, big = 6e4 for f16, else 3e38). */
void tu_fill_add_adversarial(void *x, void *res, int64_t d, sn_dtype_t dtype, tu_rng_t *r);
/* Asserts sum[i] == round_dtype((float)x[i] + (float)res[i]) (NaN where that is NaN) for i < n:
 * the fused kernels' sum_out. */
void tu_assert_residual_sum(const void *sum, const void *x, const void *res, int64_t n,
                            sn_dtype_t dtype, const char *what);
/* Distance in units in the last place of the dtype between a and b (both representable). */
double tu_ulp_diff(double a, double b, sn_dtype_t dtype);

/* ---- activations [N, C, S] (NCHW) or [N, S, C] (NHWC), S = H·W --------------------------- */
/* The index of element (n, c, s) in layout lay. */
static inline int64_t tu_at(sn_layout_t lay, int64_t n, int64_t c, int64_t s, int64_t C,
                            int64_t S) {
  return lay == SN_LAYOUT_NCHW ? (n * C + c) * S + s : (n * S + s) * C + c;
}
/* Copies src (layout from) into dst (layout to), element by element. */
void tu_transpose(void *dst, sn_layout_t to, const void *src, sn_layout_t from, int64_t N,
                  int64_t C, int64_t S, sn_dtype_t dtype);
/* Per-channel affine parameters: gamma[c] = 0.5 + U[0,1), beta[c] = U[0,1) − 0.5, drawn in
 * that order for c = 0..C−1. */
void tu_fill_params(float *gamma, float *beta, int64_t C, tu_rng_t *r);

/* ---- comparisons --------------------------------------------------------------------------- */
/* Element-wise checks call Check only on a failure: every passing ck_assert writes a record to
 * Check's pipe, which makes per-element asserts over millions of values take minutes. */
/* ||got − ref||₂ / max(||ref||₂, tiny) over n elements; got in dtype. */
double tu_normwise_rel(const void *got, sn_dtype_t dtype, const double *ref, int64_t n);
double tu_normwise_rel_f32(const float *got, const double *ref, int64_t n);
/* ck_assert_msg that costs nothing when it passes (for loops over elements). */
#define TU_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) ck_abort_msg(__VA_ARGS__);  \
  } while (0)

/* Asserts every element of got is finite (no NaN left from poisoning). */
void tu_assert_all_finite(const void *got, sn_dtype_t dtype, int64_t n, const char *what);
/* Asserts a forward output, all finite: f32 normwise ≤ TU_RTOL_F32_FWD (scale unused, may be
 * NULL); bf16/f16 the mixed bound, tu_check_lowp_mixed(got, dtype, ref, scale, n, what). */
void tu_assert_fwd(const void *got, sn_dtype_t dtype, const double *ref, const double *scale,
                   int64_t n, const char *what);
/* The mixed bound's allowance for one bf16/f16 element: max(1 ulp of exact in the dtype (the
 * subnormal spacing below its normal range, so also for exact = 0), TU_LOWP_SCALE_TOL·scale). */
double tu_lowp_allowed(double exact, double scale, sn_dtype_t dtype);
/* Asserts the bf16/f16 forward bound (TU_LOWP_SCALE_TOL) for n elements: |got[i] − exact[i]| ≤
 * tu_lowp_allowed(exact[i], scale[i], dtype), exact the fp64 y and scale[i] = |x̂·γ| + |β| of
 * the element in fp64. scale NULL: |exact[i]| (no β, so x̂·γ is y: the bound is 1 ulp). A NaN
 * exact wants a NaN, an infinite one itself. On failure names the worst element (largest
 * error / allowance): index, got, exact, scale, allowed, and how many elements failed. */
void tu_check_lowp_mixed(const void *got, sn_dtype_t dtype, const double *exact,
                         const double *scale, int64_t n, const char *what);
/* Whether two bf16/f16 outputs a, b of two kernels that each meet the mixed bound for the same
 * exact value (scale its |x̂·γ| + |β|) are within what that allows of each other:
 * |a − b| ≤ 2·tu_lowp_allowed(max(|a|, |b|), scale, dtype). (For a ≠ b both within 1 ulp of the
 * exact value, its ulp is at most that of the larger of them.) NaN only against NaN. */
int tu_lowp_pair_ok(double a, double b, double scale, sn_dtype_t dtype);
/* Asserts normwise relative error ≤ rtol (and all finite). */
void tu_assert_rel(const void *got, sn_dtype_t dtype, const double *ref, int64_t n, double rtol,
                   const char *what);
/* bf16/f16 dx of the BatchNorm and GroupNorm backwards, normwise: each element is one rounding
 * to the dtype (unit roundoff 2^-8 bf16, 2^-11 f16) of an f32 value good to ~1e-6. */
double tu_rtol_half_bwd(sn_dtype_t dtype);
/* Asserts ||got − ref||₂ ≤ rtol·max(||ref||₂, scale) (and all finite), with an absolute allowance
 * of 2^-25 per element for f16 (outputs below 2^-14 are subnormal, spaced 2^-24). For gradients
 * that cancel: `scale` is the size of the terms (the row norms' ||rstd·g||), which any f32
 * computation errs relative to, however small the result. */
void tu_assert_rel_scaled(const void *got, sn_dtype_t dtype, const double *ref, int64_t n,
                          double scale, double rtol, const char *what);
/* Asserts a saved f32 statistic (a row's mean or rstd) against its fp64 reference: one f32
 * rounding (2^-23 relative leaves a factor 2) of a value that differs from the reference only by
 * fp64 rounding; 1e-12·spread (the row's σ) absorbs that difference where the value is ~0.
 * r is the row, for the message. */
void tu_assert_stat(float got, double ref, double spread, const char *what, int64_t r);
/* Asserts two buffers are bitwise equal. */
void tu_assert_bitwise(const void *a, const void *b, size_t bytes, const char *what);
/* Asserts sn_last_error() is the scratch SN_ERR_ALLOC message ("... allocating N bytes of
 * scratch") with N == bytes. */
void tu_assert_scratch_bytes(long long bytes, const char *what);
/* Peak resident memory of this process so far, in bytes (getrusage ru_maxrss; Check runs each
 * test in a child of its own, so within a test it is that test's peak). */
double tu_peak_bytes(void);
/* The same where the request must be at most max_bytes (and more than 0). */
void tu_assert_scratch_below(long long max_bytes, const char *what);

/* ---- running a suite ----------------------------------------------------------------------- */
/* Runs the suite with CK_NORMAL output; returns the process exit code (0 if all passed). */
int tu_run_suite(Suite *s);

static const char *const tu_dtype_name[] = {"f32", "bf16", "f16", "f64"};

#endif /* SN_TESTUTIL_H */
