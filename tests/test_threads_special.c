/*
 * test_threads_special.c — every kernel's outputs are bitwise the same for 1, 2, 3 and 8
 * OpenMP threads when the inputs hold NaN (of both signs) and ±Inf, NaN signs included.
 *
 * The kernel tests check thread-count invariance on finite data. With NaN inputs one more thing
 * can differ: x86 returns one operand's NaN for NaN op NaN, so a sum whose operand order follows
 * the thread split could flip a NaN output's sign. IEEE 754 leaves that sign unspecified; the
 * issue's rule ("bitwise the same for any thread count") covers it. Each case runs on one set
 * of buffers, re-poisoned before each thread count: where a kernel starts its vector loop at the
 * output's cache line (streaming stores), the split between scalar head and vector body follows
 * the output address, which may order a NaN op NaN differently, so the NaN signs of outputs at
 * different addresses need not agree (the numbers do: test_*'s in-place and stream tests).
 * Every third case runs without gamma and beta (and the row norms' backwards without their
 * gradients, unchunked), every fourth row-norm case in place.
 * Each family first runs a fixed list of shapes at its thread-count switches, then random ones.
 * Run again by CTest with SN_STREAM_MIN_BYTES=0, where every f32 output streams.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const int THREADS[] = {1, 2, 3, 8};
#define NT ((int)(sizeof THREADS / sizeof THREADS[0]))
/* Random cases per kernel family and dtype: each runs NT times; about a second in all. */
#define CASES 12
/* Largest tensor of a case, in elements: above SN_PAR_MIN (32768, the kernels' threshold for a
 * parallel region) so that most cases split between threads. */
#define MAX_ELEMS (1 << 17)
#define EPS 1e-5f

/* N(mean, 1) data with each element special with probability p, and with probability 1/4 one
 * whole run of `run` consecutive elements (a row or plane) special too. */
static void fill_special(void *buf, int64_t n, sn_dtype_t dt, double p, int64_t run,
                         tu_rng_t *r) {
  tu_fill_normal(buf, n, dt, tu_rng_uniform(r) < 0.5 ? 0.0 : 100.0, 1.0, r);
  for (int64_t i = 0; i < n; i++)
    if (tu_rng_uniform(r) < p) tu_set_special(buf, i, dt, (int)tu_rng_int(r, 0, 3));
  if (run > 0 && run <= n && tu_rng_uniform(r) < 0.25) {
    const int64_t b = tu_rng_int(r, 0, n / run - 1) * run;
    for (int64_t i = b; i < b + run; i++) tu_set_special(buf, i, dt, (int)tu_rng_int(r, 0, 3));
  }
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static float *params(int64_t n, double mean, tu_rng_t *r) {
  float *p = malloc((size_t)n * sizeof *p);
  ck_assert_ptr_nonnull(p);
  for (int64_t i = 0; i < n; i++) p[i] = (float)(mean + 0.5 * tu_rng_normal(r));
  return p;
}

/* One case's output arena: every output of a kernel family carved from one buffer, so that a
 * run is one memcpy and one comparison. */
typedef struct {
  char *base, *ref;
  size_t used, cap;
} arena_t;

static void *take(arena_t *a, int64_t bytes) {
  const size_t b = ((size_t)bytes + 63) / 64 * 64;
  ck_assert_uint_le(a->used + b, a->cap);
  void *p = a->base + a->used;
  a->used += b;
  return p;
}

/* Runs the body (the variadic arguments) with each thread count on the same arena (poisoned with 0xA5 first) and asserts
 * that every byte matches the single-thread run. */
#define FOR_THREADS(a, what, ...)                                                       \
  do {                                                                                   \
    const int saved_ = omp_get_max_threads();                                            \
    for (int t_ = 0; t_ < NT; t_++) {                                                    \
      omp_set_num_threads(THREADS[t_]);                                                  \
      memset((a)->base, 0xA5, (a)->cap);                                                 \
      (a)->used = 0;                                                                     \
      __VA_ARGS__;                                                                       \
      if (t_ == 0) {                                                                     \
        memcpy((a)->ref, (a)->base, (a)->cap);                                           \
      } else if (memcmp((a)->ref, (a)->base, (a)->cap) != 0) {                           \
        size_t k_ = 0;                                                                   \
        while ((a)->ref[k_] == (a)->base[k_]) k_++;                                      \
        omp_set_num_threads(saved_);                                                     \
        ck_abort_msg("%s: %d threads differ from 1 at arena byte %zu", what, THREADS[t_], \
                     k_);                                                                \
      }                                                                                  \
    }                                                                                    \
    omp_set_num_threads(saved_);                                                         \
  } while (0)

static void arena_init(arena_t *a, size_t cap) {
  a->cap = (cap + 63) / 64 * 64, a->used = 0; /* aligned_alloc: a multiple of the alignment */
  a->base = aligned_alloc(64, a->cap);
  a->ref = malloc(a->cap);
  ck_assert_ptr_nonnull(a->base);
  ck_assert_ptr_nonnull(a->ref);
}

static void arena_free(arena_t *a) { free(a->base), free(a->ref); }

#define OK(call) ck_assert_msg((call) == SN_OK, "%s: %s", #call, sn_last_error())

/* LayerNorm and RMSNorm: forward, fused residual add, backward with parameter gradients. */
/* Shapes at the thread-count switches, run before the random cases: one row, fewer rows than
 * threads (the ranges of the pipelined bf16 rows, a thread with none), rows in ranges that do
 * not divide, odd d. {rows, d}. */
static const int64_t ROW_SHAPES[][2] = {{1, 40000}, {2, 20001}, {3, 11000}, {7, 5003},
                                        {9, 4096},  {257, 129}, {1000, 33}};
#define N_ROW_SHAPES ((int)(sizeof ROW_SHAPES / sizeof ROW_SHAPES[0]))

START_TEST(test_rownorm_special) {
  const sn_dtype_t dt = (sn_dtype_t)_i;
  const int64_t es = sn_dtype_size(dt);
  tu_rng_t rng;
  tu_rng_seed(&rng, 9100 + (uint64_t)_i);
  for (int c = 0; c < N_ROW_SHAPES + CASES; c++) {
    const int fixed = c < N_ROW_SHAPES;
    const int64_t d = fixed ? ROW_SHAPES[c][1] : tu_rng_int(&rng, 1, 700);
    const int64_t rows = fixed ? ROW_SHAPES[c][0] : tu_rng_int(&rng, 1, MAX_ELEMS / d);
    const int64_t n = rows * d;
    const double p = c % 2 ? 1e-2 : 1e-4;
    void *x = tu_alloc(n, dt), *res = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
    fill_special(x, n, dt, p, d, &rng);
    fill_special(res, n, dt, p, d, &rng);
    fill_special(dy, n, dt, p, d, &rng);
    float *gamma = params(d, 1.0, &rng), *beta = params(d, 0.0, &rng);
    /* every third case without gamma, beta and their gradients (the backward's rows then run
     * unchunked); every fourth in place (y = x, dx = dy) */
    const int affine = c % 3 != 2, in_place = c % 4 == 3;
    const float *g = affine ? gamma : NULL, *b = affine ? beta : NULL;
    const size_t bytes = (size_t)(n * es);
    arena_t a;
    arena_init(&a, (size_t)(6 * n * es + 6 * rows * 4 + 3 * d * 4) + 16 * 64);
    FOR_THREADS(&a, "LayerNorm", {
      void *y = take(&a, n * es), *s = take(&a, n * es), *y2 = take(&a, n * es);
      void *dx = take(&a, n * es);
      float *mean = take(&a, rows * 4), *rstd = take(&a, rows * 4);
      float *m2 = take(&a, rows * 4), *r2 = take(&a, rows * 4);
      float *dg = take(&a, d * 4), *db = take(&a, d * 4);
      if (in_place) memcpy(y, x, bytes), memcpy(dx, dy, bytes);
      OK(sn_layernorm_fwd(y, mean, rstd, in_place ? y : x, g, b, rows, d, EPS, dt));
      OK(sn_add_layernorm_fwd(y2, s, m2, r2, x, res, g, b, rows, d, EPS, dt));
      OK(sn_layernorm_bwd(dx, affine ? dg : NULL, affine ? db : NULL, in_place ? dx : dy, x,
                          mean, rstd, g, rows, d, dt));
    });
    FOR_THREADS(&a, "RMSNorm", {
      void *y = take(&a, n * es), *s = take(&a, n * es), *y2 = take(&a, n * es);
      void *dx = take(&a, n * es);
      float *rstd = take(&a, rows * 4), *r2 = take(&a, rows * 4), *dg = take(&a, d * 4);
      if (in_place) memcpy(y, x, bytes), memcpy(dx, dy, bytes);
      OK(sn_rmsnorm_fwd(y, rstd, in_place ? y : x, g, rows, d, EPS, dt));
      OK(sn_add_rmsnorm_fwd(y2, s, r2, x, res, g, rows, d, EPS, dt));
      OK(sn_rmsnorm_bwd(dx, affine ? dg : NULL, in_place ? dx : dy, x, rstd, g, rows, d, dt));
    });
    arena_free(&a);
    free(x), free(res), free(dy), free(gamma), free(beta);
  }
}
END_TEST

/* BatchNorm shapes at the switches of the fused NCHW passes (fused_block: tasks of up to 8
 * channels, fused where they share evenly between the threads or are many), run before the
 * random cases: N=7 C=117 S=114 (15 tasks: fused on 1 thread, not on 8, so the fused and
 * unfused sums must give a NaN the same sign), one task, 8 tasks, one channel, C beyond a
 * multiple of 8. {N, C, S}. */
static const int64_t BN_SHAPES[][3] = {{7, 117, 114}, {1, 8, 5000}, {2, 64, 300},
                                       {1, 1, 40000}, {9, 3, 2000}, {4, 257, 33}};
#define N_BN_SHAPES ((int)(sizeof BN_SHAPES / sizeof BN_SHAPES[0]))

/* BatchNorm: every building block and the fused forward/backward, NCHW and NHWC, with and
 * without a pivot. _i: dtype · 2 + layout. */
START_TEST(test_batchnorm_special) {
  const sn_dtype_t dt = (sn_dtype_t)(_i / 2);
  const sn_layout_t lay = (sn_layout_t)(_i % 2);
  const int64_t es = sn_dtype_size(dt);
  tu_rng_t rng;
  tu_rng_seed(&rng, 9200 + (uint64_t)_i);
  for (int c = 0; c < N_BN_SHAPES + CASES; c++) {
    const int fixed = c < N_BN_SHAPES;
    const int64_t C = fixed ? BN_SHAPES[c][1] : tu_rng_int(&rng, 1, 300);
    const int64_t N = fixed ? BN_SHAPES[c][0] : tu_rng_int(&rng, 1, 9);
    const int64_t S = fixed ? BN_SHAPES[c][2]
                            : tu_rng_int(&rng, N == 1 ? 2 : 1, max64(2, MAX_ELEMS / (C * N)));
    const int64_t n = N * C * S, count = N * S;
    const double p = c % 2 ? 1e-2 : 1e-4;
    void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
    fill_special(x, n, dt, p, lay == SN_LAYOUT_NCHW ? S : C, &rng);
    fill_special(dy, n, dt, p, lay == SN_LAYOUT_NCHW ? S : C, &rng);
    float *gamma = params(C, 1.0, &rng), *beta = params(C, 0.0, &rng);
    float *pivot = params(C, 0.0, &rng), *rvar = params(C, 2.0, &rng);
    for (int64_t j = 0; j < C; j++) rvar[j] = rvar[j] < 0.1f ? 0.1f : rvar[j];
    if (C > 1) pivot[0] = NAN; /* a pivot NaN too */
    const int affine = c % 3 != 2; /* every third case without gamma and beta */
    const float *g = affine ? gamma : NULL, *b = affine ? beta : NULL;
    arena_t a;
    arena_init(&a, (size_t)(5 * n * es + 9 * C * 8) + 20 * 64);
    FOR_THREADS(&a, lay == SN_LAYOUT_NCHW ? "BatchNorm NCHW" : "BatchNorm NHWC", {
      void *y = take(&a, n * es), *yp = take(&a, n * es), *ya = take(&a, n * es);
      void *yi = take(&a, n * es), *dx = take(&a, n * es);
      double *mean = take(&a, C * 8), *meanp = take(&a, C * 8), *sum = take(&a, C * 8);
      double *sumsq = take(&a, C * 8), *sdy = take(&a, C * 8), *sdxh = take(&a, C * 8);
      float *var = take(&a, C * 4), *rstd = take(&a, C * 4), *varp = take(&a, C * 4);
      float *rstdp = take(&a, C * 4), *dg = take(&a, C * 4), *db = take(&a, C * 4);
      OK(sn_batchnorm_fwd(y, mean, var, rstd, x, NULL, g, b, N, C, S, EPS, lay, dt));
      OK(sn_batchnorm_fwd(yp, meanp, varp, rstdp, x, pivot, g, b, N, C, S, EPS, lay, dt));
      OK(sn_batchnorm_stats(sum, sumsq, x, pivot, N, C, S, lay, dt));
      OK(sn_batchnorm_apply(ya, x, mean, rstd, g, b, N, C, S, lay, dt));
      OK(sn_batchnorm_infer(yi, x, pivot, rvar, g, b, N, C, S, EPS, lay, dt));
      OK(sn_batchnorm_bwd_reduce(sdy, sdxh, dy, x, mean, rstd, N, C, S, lay, dt));
      OK(sn_batchnorm_bwd(dx, dg, db, dy, x, mean, rstd, g, N, C, S, lay, dt));
      /* the unfused backward into the forward's buffer (its outputs are compared above) */
      OK(sn_batchnorm_bwd_apply(ya, dy, x, mean, rstd, g, sdy, sdxh, count, N, C, S, lay,
                                dt));
    });
    arena_free(&a);
    free(x), free(dy), free(gamma), free(beta), free(pivot), free(rvar);
  }
}
END_TEST

/* GroupNorm shapes at the thread-count switches, run before the random cases: one sample (NHWC
 * shares it between a team of threads, and rstd's NaN sign must not follow the thread count),
 * two and three samples (fewer than the threads that can run at once on hosts with more
 * processors than that, in teams that do not divide; on two processors they take a sample per
 * thread), one channel. {N, C, S, G}. */
static const int64_t GN_SHAPES[][4] = {{1, 64, 1024, 8}, {1, 32, 2048, 32}, {2, 48, 600, 4},
                                       {3, 96, 256, 32}, {1, 1, 40000, 1}};
#define N_GN_SHAPES ((int)(sizeof GN_SHAPES / sizeof GN_SHAPES[0]))

/* GroupNorm forward and backward, NCHW and NHWC, G ∈ {1, 2, …, 32, C}. N up to 3, so that a
 * batch smaller than the thread count is shared between threads. _i: dtype · 2 + layout. */
START_TEST(test_groupnorm_special) {
  const sn_dtype_t dt = (sn_dtype_t)(_i / 2);
  const sn_layout_t lay = (sn_layout_t)(_i % 2);
  const int64_t es = sn_dtype_size(dt);
  tu_rng_t rng;
  tu_rng_seed(&rng, 9300 + (uint64_t)_i);
  for (int c = 0; c < N_GN_SHAPES + CASES; c++) {
    const int fixed = c < N_GN_SHAPES;
    const int64_t G = fixed ? GN_SHAPES[c][3] : (int64_t)1 << tu_rng_int(&rng, 0, 5);
    const int64_t C = fixed ? GN_SHAPES[c][1]
                            : c % 3 == 0 ? G : G * tu_rng_int(&rng, 1, 12);
    const int64_t N = fixed ? GN_SHAPES[c][0] : tu_rng_int(&rng, 1, 3);
    const int64_t S = fixed ? GN_SHAPES[c][2]
                            : tu_rng_int(&rng, 1, max64(1, MAX_ELEMS / (C * N)));
    const int64_t n = N * C * S;
    const double p = c % 2 ? 1e-2 : 1e-4;
    void *x = tu_alloc(n, dt), *dy = tu_alloc(n, dt);
    fill_special(x, n, dt, p, lay == SN_LAYOUT_NCHW ? S : C, &rng);
    fill_special(dy, n, dt, p, lay == SN_LAYOUT_NCHW ? S : C, &rng);
    float *gamma = params(C, 1.0, &rng), *beta = params(C, 0.0, &rng);
    const int affine = c % 3 != 2; /* every third case without gamma and beta */
    const float *g = affine ? gamma : NULL, *b = affine ? beta : NULL;
    arena_t a;
    arena_init(&a, (size_t)(2 * n * es + 2 * N * G * 4 + 2 * C * 4) + 8 * 64);
    FOR_THREADS(&a, lay == SN_LAYOUT_NCHW ? "GroupNorm NCHW" : "GroupNorm NHWC", {
      void *y = take(&a, n * es), *dx = take(&a, n * es);
      float *mean = take(&a, N * G * 4), *rstd = take(&a, N * G * 4);
      float *dg = take(&a, C * 4), *db = take(&a, C * 4);
      OK(sn_groupnorm_fwd(y, mean, rstd, x, g, b, N, C, S, G, EPS, lay, dt));
      OK(sn_groupnorm_bwd(dx, dg, db, dy, x, mean, rstd, g, N, C, S, G, lay, dt));
    });
    arena_free(&a);
    free(x), free(dy), free(gamma), free(beta);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("threads_special");
  TCase *tc = tcase_create("core");
  tcase_add_loop_test(tc, test_rownorm_special, 0, 3);
  tcase_add_loop_test(tc, test_batchnorm_special, 0, 6);
  tcase_add_loop_test(tc, test_groupnorm_special, 0, 6);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
