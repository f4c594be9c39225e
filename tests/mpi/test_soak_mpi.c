/*
 * test_soak_mpi.c — soak: SOAK_STEPS SyncBatchNorm training steps (forward + backward) with
 * random uneven per-rank batches, empty ranks and now and then an empty global batch. Asserts:
 *  - memory stays flat: VmRSS (/proc/self/status) at the end exceeds VmRSS after SOAK_WARMUP
 *    steps by at most SOAK_RSS_GROWTH_KB on every rank;
 *  - the running statistics (and num_batches_tracked) are bitwise identical on every rank at
 *    the end, and bitwise equal to a single-process reference: every rank also runs a local
 *    BatchNorm (comm = NULL) on the whole global batch, which every rank generates from the same
 *    seed; y equals the reference's slice bit for bit at every step, dx within SOAK_RTOL_DX.
 * Exactness: every global count is a power of two (N ∈ {4, 8, 16} samples × S = 4) and inputs are
 * multiples of 1/4 of magnitude ≤ 10, so batch means are short dyadic numbers, every pivot is
 * one, every shifted sum Σ(x−p), Σ(x−p)² is exact in fp64 whatever the summation order, and the
 * split and the whole batch produce identical statistics — a real bitwise comparison, not luck.
 *
 * Test case "soak" (any P; CTest runs P = 4). SN_SOAK_STEPS overrides the number of steps.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitest.h"

/* AddressSanitizer keeps freed memory in a quarantine (256 MB by default): the per-step churn of
 * libgomp (a team per parallel region) and Open MPI (a schedule per non-blocking collective)
 * then shows as RSS growth that is no leak. Sanitizer builds skip the RSS bound (LeakSanitizer
 * checks leaks there) and only print the numbers. */
#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

#define SOAK_STEPS 10000
/* RSS is sampled after this many steps: by then every buffer the loop needs (the library's
 * staging buffer, Open MPI's free lists and connections) exists. */
#define SOAK_WARMUP 100
/* Allowed RSS growth from step SOAK_WARMUP to the end. Measured growth is 0 KiB. A leak of
 * even one small allocation per step (a 2C+5 fp64 reduction buffer is 136 bytes at C = 6, plus
 * malloc's 16 of overhead) would add ≥ 700 KiB over 9,900 steps; 256 KiB leaves room for
 * page-granular noise (glibc trimming, stack pages) without hiding such a leak. */
#define SOAK_RSS_GROWTH_KB 256
#define SOAK_C 6
#define SOAK_S 4
#define SOAK_MAX_N 16
/* dx of the split batch vs the whole batch, normwise: Σdy·x̂ is not exact (x̂ holds rstd), so
 * the two summation orders differ in the last fp64 bits; dx is f32: a few ulps. */
#define SOAK_RTOL_DX 1e-6
/* Steps whose global batch is empty (no samples on any rank): one in this many. */
#define SOAK_EMPTY_EVERY 97

static long vmrss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) {
      kb = strtol(line + 6, NULL, 10);
      break;
    }
  fclose(f);
  return kb;
}

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The global batch of one step: total N (power of two, or 0) split at random over the ranks. */
static int64_t draw_sizes(tu_rng_t *r, int64_t *sizes, int p, int step) {
  for (int i = 0; i < p; i++) sizes[i] = 0;
  if (step % SOAK_EMPTY_EVERY == SOAK_EMPTY_EVERY - 1) return 0;
  const int64_t N = (int64_t)4 << tu_rng_int(r, 0, 2); /* 4, 8 or 16 */
  /* every sample goes to a random rank, but with a skew so that some ranks are often empty */
  const int favorite = (int)tu_rng_int(r, 0, p - 1);
  for (int64_t k = 0; k < N; k++) {
    const int to = tu_rng_int(r, 0, 2) == 0 ? favorite : (int)tu_rng_int(r, 0, p - 1);
    sizes[to]++;
  }
  return N;
}

START_TEST(test_soak) {
  const char *env = getenv("SN_SOAK_STEPS");
  const int steps = env && atoi(env) > SOAK_WARMUP ? atoi(env) : SOAK_STEPS;
  const int64_t per = SOAK_C * SOAK_S, maxlen = SOAK_MAX_N * per;
  sn_syncbn_config_t cfg = sn_syncbn_default_config(SOAK_C);
  cfg.check_consistency = 1; /* one more collective per call: more traffic to soak */
  cfg.layout = SN_LAYOUT_NCHW;
  sn_syncbn_t *bn = NULL, *ref = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  MT_OK(sn_syncbn_create(&ref, &cfg, NULL));
  sn_syncbn_params_t p, pr;
  MT_OK(sn_syncbn_params(bn, &p));
  MT_OK(sn_syncbn_params(ref, &pr));
  for (int c = 0; c < SOAK_C; c++) /* dyadic affine parameters, equal everywhere */
    p.weight[c] = pr.weight[c] = 0.5f + 0.25f * (float)c, p.bias[c] = pr.bias[c] = 0.125f * (float)c;
  /* all buffers allocated once: the loop itself allocates nothing */
  float *x = malloc((size_t)maxlen * sizeof *x), *dy = malloc((size_t)maxlen * sizeof *dy);
  float *yr = malloc((size_t)maxlen * sizeof *yr), *dxr = malloc((size_t)maxlen * sizeof *dxr);
  float *y = malloc((size_t)maxlen * sizeof *y), *dx = malloc((size_t)maxlen * sizeof *dx);
  double *dxd = malloc((size_t)maxlen * sizeof *dxd);
  ck_assert(x && dy && yr && dxr && y && dx && dxd);
  int64_t sizes[64];
  ck_assert_int_le(mt_size, 64);
  tu_rng_t rng;
  tu_rng_seed(&rng, 20240601); /* the same stream on every rank */
  long rss_warm = -1, rss_mid = -1;
  int64_t empty_rank_steps = 0, empty_global_steps = 0, collectives0 = 0;
  MT_OK(sn_syncbn_collective_count(bn, &collectives0));
  const double t0 = mono_now();
  for (int step = 0; step < steps; step++) {
    const int64_t N = draw_sizes(&rng, sizes, mt_size, step);
    int64_t n0 = 0;
    for (int r = 0; r < mt_rank; r++) n0 += sizes[r];
    const int64_t n = sizes[mt_rank], len = N * per, mine = n * per;
    empty_rank_steps += n == 0;
    empty_global_steps += N == 0;
    for (int64_t i = 0; i < len; i++) { /* multiples of 1/4 in [c−4, c+4] and [−2, 2] */
      const int64_t c = (i / SOAK_S) % SOAK_C;
      x[i] = (float)(c - 2) + (float)tu_rng_int(&rng, -16, 16) * 0.25f;
      dy[i] = (float)tu_rng_int(&rng, -8, 8) * 0.25f;
    }
    const float *xs = x + n0 * per, *dys = dy + n0 * per;
    MT_OK(sn_syncbn_forward(bn, mine ? y : NULL, mine ? xs : NULL, n, SOAK_S, 1));
    MT_OK(sn_syncbn_backward(bn, mine ? dx : NULL, mine ? dys : NULL, mine ? xs : NULL, n, SOAK_S));
    MT_OK(sn_syncbn_forward(ref, len ? yr : NULL, len ? x : NULL, N, SOAK_S, 1));
    MT_OK(sn_syncbn_backward(ref, len ? dxr : NULL, len ? dy : NULL, len ? x : NULL, N, SOAK_S));
    if (mine > 0) {
      if (memcmp(y, yr + n0 * per, (size_t)mine * sizeof *y) != 0)
        ck_abort_msg("rank %d step %d: y differs bitwise from the single-process reference",
                     mt_rank, step);
      for (int64_t i = 0; i < mine; i++) dxd[i] = dxr[n0 * per + i];
      const double e = tu_normwise_rel_f32(dx, dxd, mine);
      ck_assert_msg(e <= SOAK_RTOL_DX, "rank %d step %d: dx differs from the reference by %g",
                    mt_rank, step, e);
    }
    if (step + 1 == SOAK_WARMUP) rss_warm = vmrss_kb();
    if (step + 1 == steps / 2) rss_mid = vmrss_kb();
  }
  const double elapsed = mono_now() - t0;
  const long rss_end = vmrss_kb();
  int64_t collectives1 = 0;
  MT_OK(sn_syncbn_collective_count(bn, &collectives1));

  /* identical across ranks, and equal to the reference */
  int same = 0;
  MT_OK(sn_comm_all_identical(mt_world, &same, p.running_mean, SOAK_C * 4));
  ck_assert_msg(same, "running_mean differs across ranks after %d steps", steps);
  MT_OK(sn_comm_all_identical(mt_world, &same, p.running_var, SOAK_C * 4));
  ck_assert_msg(same, "running_var differs across ranks after %d steps", steps);
  MT_OK(sn_comm_all_identical(mt_world, &same, p.num_batches_tracked, 8));
  ck_assert_msg(same, "num_batches_tracked differs across ranks");
  tu_assert_bitwise(p.running_mean, pr.running_mean, SOAK_C * 4, "running_mean vs reference");
  tu_assert_bitwise(p.running_var, pr.running_var, SOAK_C * 4, "running_var vs reference");
  ck_assert_int_eq(*p.num_batches_tracked, *pr.num_batches_tracked);
  ck_assert_int_eq(*p.num_batches_tracked, steps); /* empty global batches count too (PyTorch) */

  /* memory: every rank's numbers on rank 0's output, then each rank's bound */
  long mine3[3] = {rss_warm, rss_mid, rss_end}, all[3 * 64];
  MPI_Gather(mine3, 3, MPI_LONG, all, 3, MPI_LONG, 0, MPI_COMM_WORLD);
  int64_t empties = 0;
  MPI_Reduce(&empty_rank_steps, &empties, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  if (mt_rank == 0) {
    printf("soak: %d steps on %d ranks in %.1f s (%.2f ms/step), %lld collectives per rank, "
           "%lld rank-steps with an empty local batch, %lld empty global batches\n",
           steps, mt_size, elapsed, 1e3 * elapsed / steps, (long long)(collectives1 - collectives0),
           (long long)empties, (long long)empty_global_steps);
    for (int r = 0; r < mt_size; r++)
      printf("soak: rank %d VmRSS %ld KiB after %d steps, %ld KiB after %d, %ld KiB at the end "
             "(growth %+ld KiB, bound %d)\n",
             r, all[3 * r], SOAK_WARMUP, all[3 * r + 1], steps / 2, all[3 * r + 2],
             all[3 * r + 2] - all[3 * r], SOAK_RSS_GROWTH_KB);
    printf("soak: running_mean[0..2] %.9g %.9g %.9g, running_var[0..2] %.9g %.9g %.9g: bitwise "
           "identical on all ranks and to the single-process reference\n",
           (double)p.running_mean[0], (double)p.running_mean[1], (double)p.running_mean[2],
           (double)p.running_var[0], (double)p.running_var[1], (double)p.running_var[2]);
    fflush(stdout);
  }
  ck_assert_msg(rss_warm > 0 && rss_end > 0, "cannot read VmRSS from /proc/self/status");
  if (SOAK_ASAN && mt_rank == 0)
    printf("soak: AddressSanitizer build: RSS bound not checked (quarantine), LeakSanitizer "
           "checks leaks\n");
  ck_assert_msg(SOAK_ASAN || rss_end - rss_warm <= SOAK_RSS_GROWTH_KB,
                "rank %d: VmRSS grew by %ld KiB from step %d to step %d (bound %d KiB)", mt_rank,
                rss_end - rss_warm, SOAK_WARMUP, steps, SOAK_RSS_GROWTH_KB);
  free(x), free(dy), free(yr), free(dxr), free(y), free(dx), free(dxd);
  sn_syncbn_destroy(bn);
  sn_syncbn_destroy(ref);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("soak_mpi");
  TCase *tc = tcase_create("soak");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, test_soak);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) { return mt_main(argc, argv, make_suite); }
