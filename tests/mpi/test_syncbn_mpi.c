/*
 * test_syncbn_mpi.c — SyncBatchNorm over MPI equals single-process BatchNorm on the
 * concatenated batch; PyTorch running-stat semantics on uneven and empty ranks; subgroups;
 * misuse detected on every rank; determinism across ranks and thread counts.
 *
 * Test cases (select with CK_RUN_CASE, as CTest does): "equivalence" (any number of ranks),
 * "two_ranks" (exactly 2), "subgroups" (exactly 4).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitest.h"

/* y and dx from a split batch vs the whole batch in one process (f32): both normalize with
 * statistics from fp64 sums that differ only in summation order (~1e-16 relative), so the
 * f32 outputs agree to a couple of ulps — the issue's 1e-6 normwise bound. */
#define RTOL_SPLIT_F32 1e-6
/* bf16 dx: the same tiny statistic differences can move an f32 value across a bf16 rounding
 * boundary: at most 1 bf16 ulp. (bf16/f16 y: the forward bound, tu_check_lowp_mixed, against
 * the fp64 forward of the whole batch, and tu_lowp_pair_ok between split and whole.) */
#define ULPS_SPLIT_HALF 1.0
/* Gradients of γ/β summed over ranks in fp64 from per-rank f32 values vs the whole-batch f32
 * value: each is one f32 rounding (6e-8) of an fp64 sum; bounded relative to Σ|parts|. */
#define RTOL_GRAD_SUM 2e-7

typedef struct {
  int64_t C, S;
  sn_layout_t layout;
  sn_dtype_t dtype;
  int exact;   /* small dyadic inputs: sums exact, results bitwise equal */
  int steps;
  int cancel;  /* before each forward, biases that cancel x̂·weight (cancelling_bias) */
} eq_case_t;

/* Copies samples [n0, n0+n) of a [N, C, S] or [N, S, C] tensor (sample-major either way). */
static void *slice(const void *all, int64_t n0, int64_t n, int64_t per_sample, sn_dtype_t dt) {
  int64_t es = sn_dtype_size(dt);
  void *p = tu_alloc(n * per_sample, dt);
  if (n > 0) memcpy(p, (const char *)all + n0 * per_sample * es, (size_t)(n * per_sample * es));
  return p;
}

static void assert_matches(const void *got, const void *ref, int64_t count, const eq_case_t *k,
                           const char *what) {
  if (k->exact) {
    tu_assert_bitwise(got, ref, (size_t)(count * sn_dtype_size(k->dtype)), what);
    return;
  }
  if (k->dtype == SN_DTYPE_F32) {
    double *r = malloc((size_t)(count > 0 ? count : 1) * sizeof *r);
    for (int64_t i = 0; i < count; i++) r[i] = ((const float *)ref)[i];
    tu_assert_rel(got, SN_DTYPE_F32, r, count, RTOL_SPLIT_F32, what);
    free(r);
    return;
  }
  for (int64_t i = 0; i < count; i++) {
    double u = tu_ulp_diff(tu_get(got, i, k->dtype), tu_get(ref, i, k->dtype), k->dtype);
    ck_assert_msg(u <= ULPS_SPLIT_HALF, "rank %d: %s: element %lld differs by %g ulp", mt_rank, what,
                  (long long)i, u);
  }
}

static void assert_stats(const float *got, const float *ref, int64_t C, int exact, const char *what) {
  if (exact) {
    tu_assert_bitwise(got, ref, (size_t)C * sizeof(float), what);
    return;
  }
  double *r = malloc((size_t)C * sizeof *r);
  for (int64_t c = 0; c < C; c++) r[c] = ref[c];
  tu_assert_rel(got, SN_DTYPE_F32, r, C, RTOL_SPLIT_F32, what);
  free(r);
}

/* The same for f64 arrays (sn_syncbn_batch_stats). */
static void assert_stats_f64(const double *got, const double *ref, int64_t C, int exact,
                             const char *what) {
  if (exact) {
    tu_assert_bitwise(got, ref, (size_t)C * sizeof(double), what);
    return;
  }
  for (int64_t c = 0; c < C; c++)
    ck_assert_msg(fabs(got[c] - ref[c]) <= RTOL_SPLIT_F32 * (fabs(ref[c]) + 1e-30),
                  "rank %d: %s[%lld] %.17g vs %.17g", mt_rank, what, (long long)c, got[c],
                  ref[c]);
}

/* The fp64 forward of samples [n0, n0 + n) of the global batch x [N, C, S] (k's layout and
 * dtype), S = k->S: x̂ from the whole batch's two-pass statistics (rm NULL) or from the running
 * statistics rm, rv; y = x̂·w + b, and scale = |x̂·w| + |b| (b NULL: 0). */
static void ref_forward(double *y, double *scale, const void *x, int64_t N, int64_t n0, int64_t n,
                        const eq_case_t *k, const float *w, const float *b, const float *rm,
                        const float *rv, double eps) {
  const int64_t C = k->C, S = k->S;
  for (int64_t c = 0; c < C; c++) {
    double m = 0.0, v = 0.0;
    if (rm == NULL) {
      for (int64_t i = 0; i < N; i++)
        for (int64_t s = 0; s < S; s++) m += tu_get(x, tu_at(k->layout, i, c, s, C, S), k->dtype);
      m /= (double)(N * S);
      for (int64_t i = 0; i < N; i++)
        for (int64_t s = 0; s < S; s++) {
          const double d = tu_get(x, tu_at(k->layout, i, c, s, C, S), k->dtype) - m;
          v += d * d;
        }
      v /= (double)(N * S);
    } else {
      m = rm[c], v = rv[c];
    }
    const double rs = 1.0 / sqrt(v + eps), bc = b ? b[c] : 0.0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t j = tu_at(k->layout, i, c, s, C, S);
        const double xg = (tu_get(x, tu_at(k->layout, n0 + i, c, s, C, S), k->dtype) - m) * rs *
                          w[c];
        y[j] = xg + bc;
        scale[j] = fabs(xg) + fabs(bc);
      }
  }
}

/* Biases that cancel x̂·w of one element of each channel of sample 0 (position (3c + 1) % S):
 * b[c] = −round_f32(x̂·w), so y there is ~2^-24 of its terms. Statistics as ref_forward's. */
static void cancelling_bias(float *b, const void *x, int64_t N, const eq_case_t *k,
                            const float *w, const float *rm, const float *rv, double eps) {
  const int64_t per = k->C * k->S;
  double *xg = malloc((size_t)per * sizeof *xg), *sc = malloc((size_t)per * sizeof *sc);
  ck_assert(xg != NULL && sc != NULL);
  ref_forward(xg, sc, x, N, 0, 1, k, w, NULL, rm, rv, eps);
  for (int64_t c = 0; c < k->C; c++)
    b[c] = -(float)xg[tu_at(k->layout, 0, c, (3 * c + 1) % k->S, k->C, k->S)];
  free(xg), free(sc);
}

/* bf16/f16 y of this rank's samples [n0, n0 + n): at the forward bound against the fp64 forward
 * of the global batch x [N] with the layer's statistics (batch or running: see ref_forward), and
 * within what that bound allows of yref, the whole batch's y in one process. */
static void assert_lowp_y(const void *ys, const void *yref, const void *x, int64_t N, int64_t n0,
                          int64_t n, const eq_case_t *k, const sn_syncbn_params_t *p, int training,
                          double eps, const char *what) {
  const int64_t count = n * k->C * k->S;
  double *ye = malloc((size_t)(count > 0 ? count : 1) * sizeof *ye);
  double *sc = malloc((size_t)(count > 0 ? count : 1) * sizeof *sc);
  ck_assert(ye != NULL && sc != NULL);
  ref_forward(ye, sc, x, N, n0, n, k, p->weight, p->bias, training ? NULL : p->running_mean,
              training ? NULL : p->running_var, eps);
  char msg[96];
  snprintf(msg, sizeof msg, "rank %d: %s", mt_rank, what);
  tu_check_lowp_mixed(ys, k->dtype, ye, sc, count, msg);
  for (int64_t i = 0; i < count; i++) {
    const double a = tu_get(ys, i, k->dtype), b = tu_get(yref, i, k->dtype);
    TU_CHECK(tu_lowp_pair_ok(a, b, sc[i], k->dtype),
             "%s: element %lld = %.9g, the whole batch's %.9g (scale %.3g)", msg, (long long)i,
             a, b, sc[i]);
  }
  free(ye), free(sc);
}

/* Runs `steps` training steps (forward+backward) and one eval forward on a split batch and on
 * the whole batch, comparing everything after each. */
static void run_equivalence(const eq_case_t *k, sn_comm_t *comm, uint64_t seed) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(k->C);
  cfg.layout = k->layout;
  cfg.dtype = k->dtype;
  cfg.check_consistency = 1;
  sn_syncbn_t *sync = NULL, *ref = NULL;
  MT_OK(sn_syncbn_create(&sync, &cfg, comm));
  MT_OK(sn_syncbn_create(&ref, &cfg, NULL));
  sn_syncbn_params_t ps, pr;
  MT_OK(sn_syncbn_params(sync, &ps));
  MT_OK(sn_syncbn_params(ref, &pr));
  int rank, size;
  MT_OK(sn_comm_rank(comm, &rank));
  MT_OK(sn_comm_size(comm, &size));
  for (int64_t c = 0; c < k->C; c++) { /* non-trivial affine parameters, equal everywhere */
    ps.weight[c] = pr.weight[c] = 0.5f + 0.25f * (float)(c % 5);
    ps.bias[c] = pr.bias[c] = -0.5f + 0.125f * (float)(c % 7);
  }
  const int64_t per = k->C * k->S;
  for (int step = 0; step <= k->steps; step++) {
    const int training = step < k->steps;
    int64_t sizes[64];
    int64_t N = mt_split_sizes(sizes, size, seed + 100 * (uint64_t)step, 1);
    int64_t n0 = 0;
    for (int r = 0; r < rank; r++) n0 += sizes[r];
    const int64_t n = sizes[rank];
    void *x = tu_alloc(N * per, k->dtype), *dy = tu_alloc(N * per, k->dtype);
    void *y = tu_alloc(N * per, k->dtype), *dx = tu_alloc(N * per, k->dtype);
    mt_fill(x, N * per, k->dtype, seed + 7 * (uint64_t)step, k->exact);
    mt_fill(dy, N * per, k->dtype, seed + 7 * (uint64_t)step + 3, k->exact);
    void *xs = slice(x, n0, n, per, k->dtype), *dys = slice(dy, n0, n, per, k->dtype);
    void *ys = tu_alloc(n * per, k->dtype), *dxs = tu_alloc(n * per, k->dtype);
    tu_poison(ys, n * per, k->dtype);
    tu_poison(dxs, n * per, k->dtype);
    if (k->cancel) { /* the same biases in both layers, from the statistics the step uses */
      cancelling_bias(ps.bias, x, N, k, ps.weight, training ? NULL : ps.running_mean,
                      training ? NULL : ps.running_var, (double)cfg.eps);
      memcpy(pr.bias, ps.bias, (size_t)k->C * sizeof *ps.bias);
    }

    MT_OK(sn_syncbn_forward(sync, ys, xs, n, k->S, training));
    MT_OK(sn_syncbn_forward(ref, y, x, N, k->S, training));
    void *yref = slice(y, n0, n, per, k->dtype);
    if (k->dtype != SN_DTYPE_F32 && !k->exact)
      assert_lowp_y(ys, yref, x, N, n0, n, k, &ps, training, (double)cfg.eps,
                    training ? "y" : "eval y");
    else
      assert_matches(ys, yref, n * per, k, "y");
    if (training) { /* the statistics the layer used: the whole batch's, the same bits on every rank */
      int64_t cs = 0, cr = 0;
      double *ms = malloc((size_t)(4 * k->C) * sizeof *ms), *vs = ms + k->C, *mr = vs + k->C,
             *vr = mr + k->C;
      MT_OK(sn_syncbn_batch_stats(sync, &cs, ms, vs));
      MT_OK(sn_syncbn_batch_stats(ref, &cr, mr, vr));
      ck_assert_int_eq(cs, cr);
      ck_assert_int_eq(cs, N * k->S);
      assert_stats_f64(ms, mr, k->C, k->exact, "batch mean");
      assert_stats_f64(vs, vr, k->C, k->exact, "batch var");
      int same = 0;
      MT_OK(sn_comm_all_identical(comm, &same, ms, 2 * k->C * 8));
      ck_assert_msg(same, "the batch statistics differ bitwise across ranks");
      free(ms);
    }
    if (training) {
      MT_OK(sn_syncbn_backward(sync, dxs, dys, xs, n, k->S));
      MT_OK(sn_syncbn_backward(ref, dx, dy, x, N, k->S));
      void *dxref = slice(dx, n0, n, per, k->dtype);
      assert_matches(dxs, dxref, n * per, k, "dx");
      free(dxref);
      /* dγ, dβ: local sums, added up over the ranks of comm */
      double *g = malloc((size_t)(4 * k->C) * sizeof *g);
      for (int64_t c = 0; c < k->C; c++) {
        g[c] = ps.grad_weight[c], g[k->C + c] = ps.grad_bias[c];
        g[2 * k->C + c] = fabs(ps.grad_weight[c]), g[3 * k->C + c] = fabs(ps.grad_bias[c]);
      }
      MT_OK(sn_comm_allreduce_sum(comm, g, 4 * k->C, SN_DTYPE_F64));
      for (int64_t c = 0; c < k->C; c++) {
        /* each rank's f32 value and the whole-batch f32 value are rounded once: the error is
         * relative to the sum of magnitudes, not to a sum that may cancel */
        double bw = RTOL_GRAD_SUM * (g[2 * k->C + c] + fabs(pr.grad_weight[c])) + 1e-30;
        double bb = RTOL_GRAD_SUM * (g[3 * k->C + c] + fabs(pr.grad_bias[c])) + 1e-30;
        ck_assert_msg(fabs(g[c] - pr.grad_weight[c]) <= bw, "rank %d: dgamma[%lld] summed over ranks %.9g vs %.9g",
                      mt_rank, (long long)c, g[c], (double)pr.grad_weight[c]);
        ck_assert_msg(fabs(g[k->C + c] - pr.grad_bias[c]) <= bb, "rank %d: dbeta[%lld] summed over ranks %.9g vs %.9g",
                      mt_rank, (long long)c, g[k->C + c], (double)pr.grad_bias[c]);
      }
      free(g);
    }
    assert_stats(ps.running_mean, pr.running_mean, k->C, k->exact, "running_mean");
    assert_stats(ps.running_var, pr.running_var, k->C, k->exact, "running_var");
    ck_assert_int_eq(*ps.num_batches_tracked, *pr.num_batches_tracked);
    int same = 0;
    MT_OK(sn_comm_all_identical(comm, &same, ps.running_mean, k->C * 4));
    ck_assert_msg(same, "running_mean differs bitwise across ranks");
    MT_OK(sn_comm_all_identical(comm, &same, ps.running_var, k->C * 4));
    ck_assert_msg(same, "running_var differs bitwise across ranks");
    free(x), free(dy), free(y), free(dx), free(xs), free(dys), free(ys), free(dxs), free(yref);
  }
  sn_syncbn_destroy(sync);
  sn_syncbn_destroy(ref);
}

START_TEST(test_equivalence) {
  static const int64_t channels[] = {1, 3, 64, 65};
  for (int layout = 0; layout < 2; layout++)
    for (int dt = 0; dt < 2; dt++)
      for (int exact = 0; exact < 2; exact++)
        for (int ci = 0; ci < 4; ci++) {
          eq_case_t k = {channels[ci], ci % 2 ? 5 : 4, (sn_layout_t)layout,
                         dt ? SN_DTYPE_BF16 : SN_DTYPE_F32, exact, 3, 0};
          run_equivalence(&k, mt_world, 1000 + (uint64_t)(layout * 100 + dt * 10 + exact + ci * 1000));
        }
}
END_TEST

/* bf16 and f16 y where the bias cancels x̂·weight (cancelling_bias, set before every forward from
 * the statistics it uses): training and eval, both layouts, at the forward bound against the
 * fp64 forward of the whole batch (assert_lowp_y). */
START_TEST(test_equivalence_beta_cancels) {
  static const sn_dtype_t dts[2] = {SN_DTYPE_BF16, SN_DTYPE_F16};
  for (int layout = 0; layout < 2; layout++)
    for (int dt = 0; dt < 2; dt++)
      for (int ci = 0; ci < 2; ci++) {
        eq_case_t k = {ci ? 65 : 3, 5, (sn_layout_t)layout, dts[dt], 0, 2, 1};
        run_equivalence(&k, mt_world, 5000 + (uint64_t)(layout * 100 + dt * 10 + ci));
      }
}
END_TEST

/* One layer, collectives counted: a forward and a backward are one all-reduce each, none with
 * one rank (nothing to synchronize, as torch.nn.SyncBatchNorm at world size 1). */
START_TEST(test_one_collective_each) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(8);
  cfg.check_consistency = 0;
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  float x[2 * 8 * 3], y[2 * 8 * 3], dx[2 * 8 * 3];
  mt_fill(x, 48, SN_DTYPE_F32, 5, 0);
  int64_t before = 0, after_fwd = 0, after_bwd = 0;
  MT_OK(sn_syncbn_collective_count(bn, &before));
  MT_OK(sn_syncbn_forward(bn, y, x, 2, 3, 1));
  MT_OK(sn_syncbn_collective_count(bn, &after_fwd));
  MT_OK(sn_syncbn_backward(bn, dx, x, x, 2, 3));
  MT_OK(sn_syncbn_collective_count(bn, &after_bwd));
  const int64_t each = mt_size > 1 ? 1 : 0;
  ck_assert_int_eq(after_fwd - before, each);
  ck_assert_int_eq(after_bwd - after_fwd, each);
  MT_OK(sn_syncbn_forward(bn, y, x, 2, 3, 0)); /* eval: no communication */
  int64_t after_eval = 0;
  MT_OK(sn_syncbn_collective_count(bn, &after_eval));
  ck_assert_int_eq(after_eval, after_bwd);
  sn_syncbn_destroy(bn);
}
END_TEST

/* Many steps with random uneven (sometimes empty) batches: running stats bitwise identical on
 * every rank, and identical for 1 and 2 OpenMP threads. */
START_TEST(test_determinism_many_steps) {
  float means[2][16], vars[2][16];
  for (int run = 0; run < 2; run++) {
    omp_set_num_threads(run + 1);
    sn_syncbn_config_t cfg = sn_syncbn_default_config(16);
    cfg.layout = SN_LAYOUT_NHWC;
    sn_syncbn_t *bn = NULL;
    MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
    sn_syncbn_params_t p;
    MT_OK(sn_syncbn_params(bn, &p));
    for (int step = 0; step < 200; step++) {
      int64_t sizes[64];
      mt_split_sizes(sizes, mt_size, 77 + (uint64_t)step, 1);
      const int64_t n = sizes[mt_rank], S = 9, per = 16 * S;
      float *x = tu_alloc(n * per, SN_DTYPE_F32), *y = tu_alloc(n * per, SN_DTYPE_F32);
      mt_fill(x, n * per, SN_DTYPE_F32, 1000 * (uint64_t)step + (uint64_t)mt_rank, 0);
      MT_OK(sn_syncbn_forward(bn, y, x, n, S, 1));
      MT_OK(sn_syncbn_backward(bn, y, x, x, n, S));
      free(x), free(y);
    }
    int same = 0;
    MT_OK(sn_comm_all_identical(mt_world, &same, p.running_mean, 16 * 4));
    ck_assert_msg(same, "running_mean differs across ranks after 200 steps");
    MT_OK(sn_comm_all_identical(mt_world, &same, p.running_var, 16 * 4));
    ck_assert_msg(same, "running_var differs across ranks after 200 steps");
    ck_assert_int_eq(*p.num_batches_tracked, 200);
    memcpy(means[run], p.running_mean, sizeof means[run]);
    memcpy(vars[run], p.running_var, sizeof vars[run]);
    sn_syncbn_destroy(bn);
  }
  omp_set_num_threads(1);
  tu_assert_bitwise(means[0], means[1], sizeof means[0], "running_mean, 1 vs 2 threads");
  tu_assert_bitwise(vars[0], vars[1], sizeof vars[0], "running_var, 1 vs 2 threads");
}
END_TEST

/* ---- exactly two ranks ------------------------------------------------------------------------ */

/* The issue's example: C = 2; rank 0 holds (2,2,2) with channel 0 = 10, channel 1 = 10/3; rank 1
 * holds (2,2,4) all ones. */
static void run_uneven(float momentum, int steps, const double want_mean[2], const double want_var[2]) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  cfg.momentum = momentum;
  cfg.check_consistency = 1;
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  const int64_t S = mt_rank == 0 ? 2 : 4, n = 2;
  float x[2 * 2 * 4], y[2 * 2 * 4];
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < 2; c++)
      for (int64_t s = 0; s < S; s++)
        x[(i * 2 + c) * S + s] = mt_rank == 0 ? (c == 0 ? 10.0f : 10.0f / 3.0f) : 1.0f;
  for (int t = 0; t < steps; t++) MT_OK(sn_syncbn_forward(bn, y, x, n, S, 1));
  sn_syncbn_params_t p;
  MT_OK(sn_syncbn_params(bn, &p));
  /* the issue states these to 7 significant digits; f32 running stats hold ~7 */
  for (int c = 0; c < 2; c++) {
    ck_assert_msg(fabs(p.running_mean[c] - want_mean[c]) <= 5e-6 * fabs(want_mean[c]) + 1e-7,
                  "momentum %g, %d steps: running_mean[%d] = %.7f, want %.7f", (double)momentum, steps, c,
                  (double)p.running_mean[c], want_mean[c]);
    ck_assert_msg(fabs(p.running_var[c] - want_var[c]) <= 5e-6 * fabs(want_var[c]),
                  "momentum %g, %d steps: running_var[%d] = %.7f, want %.7f", (double)momentum, steps, c,
                  (double)p.running_var[c], want_var[c]);
  }
  sn_syncbn_destroy(bn);
}

START_TEST(test_uneven_batches_issue_example) {
  const double m100[2] = {4.0, 1.777778}, v100[2] = {19.636364, 1.319865};
  const double m1[2] = {0.4, 0.1777778}, v1[2] = {2.8636364, 1.0319865};
  run_uneven(0.99f, 100, m100, v100);
  run_uneven(0.1f, 1, m1, v1);
}
END_TEST

/* Rank 0 has (0,3,4,4), rank 1 has (2,3,4,4): no hang, rank 1's y is local BatchNorm of its
 * batch, running stats from the count 32. */
START_TEST(test_empty_rank) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(3);
  cfg.check_consistency = 1;
  sn_syncbn_t *bn = NULL, *local = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  MT_OK(sn_syncbn_create(&local, &cfg, NULL));
  const int64_t n = mt_rank == 0 ? 0 : 2, S = 16, per = 3 * S;
  float x1[2 * 48], dy1[2 * 48], y[2 * 48], yl[2 * 48], dx[2 * 48], dxl[2 * 48];
  mt_fill(x1, 2 * per, SN_DTYPE_F32, 11, 0); /* rank 1's batch, known to both */
  mt_fill(dy1, 2 * per, SN_DTYPE_F32, 12, 0);
  tu_poison_f32(y, 2 * per);
  MT_OK(sn_syncbn_forward(bn, n ? y : NULL, n ? x1 : NULL, n, S, 1));
  MT_OK(sn_syncbn_forward(local, yl, x1, 2, S, 1));
  MT_OK(sn_syncbn_backward(bn, n ? dx : NULL, n ? dy1 : NULL, n ? x1 : NULL, n, S));
  MT_OK(sn_syncbn_backward(local, dxl, dy1, x1, 2, S));
  if (mt_rank == 1) {
    tu_assert_bitwise(y, yl, sizeof(float) * 2 * (size_t)per, "rank 1 y vs local BatchNorm");
    tu_assert_bitwise(dx, dxl, sizeof(float) * 2 * (size_t)per, "rank 1 dx vs local BatchNorm");
  }
  sn_syncbn_params_t p, pl;
  MT_OK(sn_syncbn_params(bn, &p));
  MT_OK(sn_syncbn_params(local, &pl));
  tu_assert_bitwise(p.running_mean, pl.running_mean, 12, "running_mean (count 32)");
  tu_assert_bitwise(p.running_var, pl.running_var, 12, "running_var (count 32, unbiased by 32/31)");
  if (mt_rank == 0) /* an empty batch contributes zero local gradients */
    for (int c = 0; c < 3; c++) ck_assert(p.grad_weight[c] == 0.0f && p.grad_bias[c] == 0.0f);
  sn_syncbn_destroy(bn);
  sn_syncbn_destroy(local);
}
END_TEST

/* Global count 1: every rank gets SN_ERR_INSUFFICIENT_COUNT, nothing changes; with and without
 * check_consistency (_i = 1, 0), as on device memory (tests/cuda/test_cuda_syncbn.c). */
START_TEST(test_global_count_one) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  cfg.check_consistency = _i;
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  float x[2] = {1.0f, 2.0f}, y[2] = {-7.0f, -7.0f};
  const int64_t n = mt_rank == 0 ? 1 : 0;
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, n, 1, 1), SN_ERR_INSUFFICIENT_COUNT);
  ck_assert_msg(strstr(sn_last_error(), "more than 1 value per channel") != NULL, "%s", sn_last_error());
  ck_assert(y[0] == -7.0f && y[1] == -7.0f);
  sn_syncbn_params_t p;
  MT_OK(sn_syncbn_params(bn, &p));
  ck_assert(p.running_mean[0] == 0.0f && p.running_var[0] == 1.0f && *p.num_batches_tracked == 0);
  sn_syncbn_destroy(bn);
}
END_TEST

/* Misuse with check_consistency on: every rank gets SN_ERR_MISMATCH naming the layer, and the
 * test finishes (no hang). */
START_TEST(test_mismatch_detected) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(3);
  cfg.check_consistency = 1;
  snprintf(cfg.name, sizeof cfg.name, "bn1");
  cfg.layer_id = 7;
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  float x[2 * 3 * 2], y[2 * 3 * 2];
  mt_fill(x, 12, SN_DTYPE_F32, 3, 0);
  /* rank 0 calls forward twice, rank 1 forward then backward */
  MT_OK(sn_syncbn_forward(bn, y, x, 2, 2, 1));
  sn_status_t st = mt_rank == 0 ? sn_syncbn_forward(bn, y, x, 2, 2, 1)
                                : sn_syncbn_backward(bn, y, x, x, 2, 2);
  ck_assert_int_eq(st, SN_ERR_MISMATCH);
  ck_assert_msg(strstr(sn_last_error(), "bn1") &&
                    strstr(sn_last_error(), "operation differs across ranks (forward on rank 0; backward on rank 1)"),
                "%s", sn_last_error());

  /* another C on each rank (same id) */
  sn_syncbn_config_t c2 = sn_syncbn_default_config(mt_rank == 0 ? 3 : 4);
  c2.check_consistency = 1;
  c2.layer_id = 8;
  sn_syncbn_t *b2 = NULL;
  MT_OK(sn_syncbn_create(&b2, &c2, mt_world));
  float xx[2 * 4 * 2], yy[2 * 4 * 2];
  mt_fill(xx, 16, SN_DTYPE_F32, 4, 0);
  ck_assert_int_eq(sn_syncbn_forward(b2, yy, xx, 2, 2, 1), SN_ERR_MISMATCH);
  ck_assert_msg(strstr(sn_last_error(), "C (num_features) differs across ranks (3 on rank 0; 4 on rank 1)"), "%s",
                sn_last_error());
  /* the running statistics differ too (3 against 4 channels), as a consequence: not reported */
  ck_assert_msg(!strstr(sn_last_error(), "running statistics"), "%s", sn_last_error());

  /* layer order swapped: both calls mismatch on both ranks, nothing is mixed */
  sn_syncbn_params_t p;
  MT_OK(sn_syncbn_params(bn, &p));
  float rm[3];
  memcpy(rm, p.running_mean, sizeof rm);
  sn_syncbn_t *first = mt_rank == 0 ? bn : b2, *second = mt_rank == 0 ? b2 : bn;
  void *xf = mt_rank == 0 ? (void *)x : (void *)xx, *yf = mt_rank == 0 ? (void *)y : (void *)yy;
  void *xsn = mt_rank == 0 ? (void *)xx : (void *)x, *ysn = mt_rank == 0 ? (void *)yy : (void *)y;
  ck_assert_int_eq(sn_syncbn_forward(first, yf, xf, 2, 2, 1), SN_ERR_MISMATCH);
  ck_assert_int_eq(sn_syncbn_forward(second, ysn, xsn, 2, 2, 1), SN_ERR_MISMATCH);
  tu_assert_bitwise(rm, p.running_mean, sizeof rm, "running_mean untouched by mismatched calls");

  /* dtype differs */
  sn_syncbn_config_t c3 = sn_syncbn_default_config(3);
  c3.check_consistency = 1;
  c3.layer_id = 9;
  c3.dtype = mt_rank == 0 ? SN_DTYPE_F32 : SN_DTYPE_BF16;
  sn_syncbn_t *b3 = NULL;
  MT_OK(sn_syncbn_create(&b3, &c3, mt_world));
  uint16_t xh[12];
  for (int i = 0; i < 12; i++) tu_set(xh, i, i, SN_DTYPE_BF16);
  ck_assert_int_eq(sn_syncbn_forward(b3, mt_rank == 0 ? (void *)y : (void *)xh,
                                     mt_rank == 0 ? (void *)x : (void *)xh, 2, 2, 1),
                   SN_ERR_MISMATCH);
  ck_assert_msg(strstr(sn_last_error(), "dtype differs across ranks (f32 on rank 0; bf16 on rank 1)"), "%s",
                sn_last_error());

  /* momentum (None on rank 1), then eps, then track_running_stats, then eps by one ulp (which
   * %g would print alike), then check_finite differ. check_finite, were it not compared: with
   * NaN in x a rank with it would return SN_ERR_NONFINITE and one without SN_OK, and with a large
   * mean (the pivot refinement's second all-reduce on one rank only) MPI would end the job */
  for (int f = 0; f < 5; f++) {
    sn_syncbn_config_t c4 = sn_syncbn_default_config(3);
    c4.check_consistency = 1;
    c4.layer_id = 10 + f;
    if (mt_rank == 1 && f == 0) c4.momentum = SN_MOMENTUM_CUMULATIVE;
    if (mt_rank == 1 && f == 1) c4.eps = 0.5f;
    if (mt_rank == 1 && f == 2) c4.track_running_stats = 0;
    if (mt_rank == 1 && f == 3) c4.eps = nextafterf(c4.eps, 1.0f);
    if (mt_rank == 0 && f == 4) c4.check_finite = 1;
    sn_syncbn_t *b4 = NULL;
    MT_OK(sn_syncbn_create(&b4, &c4, mt_world));
    float xn[12];
    for (int i = 0; i < 12; i++) xn[i] = f == 4 ? 1e6f + x[i] : x[i]; /* a mean far from 0 */
    if (f == 4) xn[2] = NAN;
    ck_assert_int_eq(sn_syncbn_forward(b4, y, xn, 2, 2, 1), SN_ERR_MISMATCH);
    static const char *const what[5] = {
        "momentum differs across ranks (0.1 on rank 0; None on rank 1)",
        "eps differs across ranks (1e-05 on rank 0; 0.5 on rank 1)",
        "track_running_stats differs",
        "eps differs across ranks (1e-05 on rank 0; 1.00000007e-05 on rank 1)",
        "check_finite differs across ranks (1 on rank 0; 0 on rank 1)"};
    ck_assert_msg(strstr(sn_last_error(), what[f]), "%s", sn_last_error());
    /* the running statistics' hash differs with track_running_stats: not reported then */
    ck_assert_msg(!strstr(sn_last_error(), "running statistics"), "%s", sn_last_error());
    sn_syncbn_destroy(b4);
  }
  sn_syncbn_destroy(bn);
  sn_syncbn_destroy(b2);
  sn_syncbn_destroy(b3);
}
END_TEST

/* A checkpoint loaded on rank 0 only, its running statistics copied into rank 1's layer through
 * sn_syncbn_params (a broadcast): the load set rank 0's pivot to the loaded running mean, rank 1's
 * stays 0. The ranks see the disagreement in the forward's all-reduce and redo the sums around 0:
 * y, the running statistics and dx bitwise those of a layer whose stats were set on both ranks
 * (pivot 0 everywhere), identical on both ranks, one all-reduce more than that layer's forward;
 * with and without check_consistency (the running statistics agree, so it passes). Loaded on
 * rank 0 without the copy, check_consistency reports the running statistics on both ranks. */
START_TEST(test_partial_load) {
  enum { C = 2, N = 2, S = 2, T = N * C * S };
  char path[64];
  snprintf(path, sizeof path, "/tmp/sn_partial_load_%d.safetensors", (int)getpid()); /* rank 0's */
  const char *prefix = "bn";
  if (mt_rank == 0) { /* the checkpoint: running_mean 1000, running_var 4, 7 batches */
    sn_syncbn_config_t lc = sn_syncbn_default_config(C);
    sn_syncbn_t *loc = NULL;
    MT_OK(sn_syncbn_create(&loc, &lc, NULL));
    sn_syncbn_params_t q;
    MT_OK(sn_syncbn_params(loc, &q));
    for (int c = 0; c < C; c++) q.running_mean[c] = 1000.0f, q.running_var[c] = 4.0f;
    *q.num_batches_tracked = 7;
    MT_OK(sn_syncbn_save(path, &loc, &prefix, 1));
    sn_syncbn_destroy(loc);
  }
  float x[T], dy[T];
  for (int i = 0; i < T; i++) x[i] = 1000.0f + 0.25f * (float)(i + 5 * mt_rank), dy[i] = (float)(i % 3) - 1.0f;
  float y[2][T], dx[2][T], rm[2][C], rv[2][C];
  for (int check = 0; check < 2; check++) {
    for (int which = 0; which < 2; which++) { /* 0: rank 0 loads, 1: both set through params */
      sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
      cfg.check_consistency = check;
      sn_syncbn_t *bn = NULL;
      MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
      sn_syncbn_params_t p;
      MT_OK(sn_syncbn_params(bn, &p));
      if (which == 0 && mt_rank == 0) {
        MT_OK(sn_syncbn_load(path, &bn, &prefix, 1));
      } else {
        for (int c = 0; c < C; c++) p.running_mean[c] = 1000.0f, p.running_var[c] = 4.0f;
        *p.num_batches_tracked = 7;
      }
      int64_t c0 = 0, c1 = 0;
      MT_OK(sn_syncbn_collective_count(bn, &c0));
      MT_OK(sn_syncbn_forward(bn, y[which], x, N, S, 1));
      MT_OK(sn_syncbn_collective_count(bn, &c1));
      ck_assert_int_eq(c1 - c0, (which == 0 ? 2 : 1) + check);
      MT_OK(sn_syncbn_backward(bn, dx[which], dy, x, N, S));
      memcpy(rm[which], p.running_mean, sizeof rm[which]);
      memcpy(rv[which], p.running_var, sizeof rv[which]);
      ck_assert_int_eq(*p.num_batches_tracked, 8);
      sn_syncbn_destroy(bn);
    }
    tu_assert_bitwise(y[0], y[1], sizeof y[0], "partial load: y");
    tu_assert_bitwise(dx[0], dx[1], sizeof dx[0], "partial load: dx");
    tu_assert_bitwise(rm[0], rm[1], sizeof rm[0], "partial load: running_mean");
    tu_assert_bitwise(rv[0], rv[1], sizeof rv[0], "partial load: running_var");
    /* the same on both ranks, and what momentum 0.1 gives from the global batch's mean */
    int same = 0;
    MT_OK(sn_comm_all_identical(mt_world, &same, rm[0], sizeof rm[0]));
    ck_assert_msg(same, "running_mean differs across ranks");
    double mean = 0.0;
    for (int r = 0; r < 2; r++) /* channel 0 of rank r: elements n·C·S + s, n < N, s < S */
      for (int n = 0; n < N; n++)
        for (int s2 = 0; s2 < S; s2++) mean += 1000.0 + 0.25 * (n * C * S + s2 + 5 * r);
    mean /= 2.0 * N * S;
    ck_assert_msg(fabs(rm[0][0] - (0.9 * 1000.0 + 0.1 * mean)) < 1e-3, "running_mean %g, want %g",
                  (double)rm[0][0], 0.9 * 1000.0 + 0.1 * mean);
  }
  /* loaded on rank 0 only, no copy: the running statistics differ, check_consistency says so */
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  cfg.check_consistency = 1;
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  if (mt_rank == 0) MT_OK(sn_syncbn_load(path, &bn, &prefix, 1));
  ck_assert_int_eq(sn_syncbn_forward(bn, y[0], x, N, S, 1), SN_ERR_MISMATCH);
  ck_assert_msg(strstr(sn_last_error(), "running statistics"), "%s", sn_last_error());
  sn_syncbn_destroy(bn);
  if (mt_rank == 0) remove(path);
}
END_TEST

/* An intercommunicator (each rank a group of its own, joined to the other) is rejected on every
 * rank before any collective: its all-reduce would return the other group's sums. */
START_TEST(test_intercomm_rejected) {
  MPI_Comm local = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  ck_assert_int_eq(MPI_Comm_split(MPI_COMM_WORLD, mt_rank, 0, &local), MPI_SUCCESS);
  ck_assert_int_eq(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - mt_rank, 7, &inter),
                   MPI_SUCCESS);
  sn_comm_t *c = (sn_comm_t *)0x1;
  ck_assert_int_eq(sn_comm_create_mpi(&c, inter), SN_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(sn_last_error(), "intercommunicator") != NULL, "%s", sn_last_error());
  ck_assert_ptr_eq(c, (sn_comm_t *)0x1);
  MPI_Comm_free(&inter);
  MPI_Comm_free(&local);
}
END_TEST

/* The layout is compared only where it matters: a rank whose batch is empty, or has one
 * position per channel (s = 1), is laid out alike in NCHW and NHWC, and may use a layer of
 * either layout while the others use NHWC (a PyTorch tensor of such a shape is both contiguous
 * and channels_last); its statistics still join in. */
START_TEST(test_layout_of_empty_or_single_position) {
  enum { C = 3 };
  for (int k = 0; k < 2; k++) {
    sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
    cfg.layout = mt_rank == 0 ? SN_LAYOUT_NHWC : SN_LAYOUT_NCHW;
    cfg.layer_id = 40 + k;
    sn_syncbn_t *bn = NULL;
    MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
    const int64_t n = mt_rank == 0 ? 2 : (k == 0 ? 0 : 2), s = mt_rank == 0 ? 3 : 1;
    float x[2 * C * 3], y[2 * C * 3], dx[2 * C * 3];
    for (int i = 0; i < 2 * C * 3; i++) x[i] = (float)(i % 7) - 2.0f * (float)mt_rank;
    MT_OK(sn_syncbn_forward(bn, y, x, n, s, 1));
    MT_OK(sn_syncbn_backward(bn, dx, x, x, n, s));
    sn_syncbn_params_t p;
    MT_OK(sn_syncbn_params(bn, &p));
    ck_assert_int_eq(*p.num_batches_tracked, 1);
    sn_syncbn_destroy(bn);
  }
}
END_TEST

/* sn_comm_create_mpi_fortran: the communicator of a Fortran handle (as mpi4py's py2f hands it
 * over) is that communicator; a value that is no MPI_Fint, or no communicator's handle, is
 * SN_ERR_INVALID_ARGUMENT with nothing created (local checks, the same on every rank). */
START_TEST(test_create_from_fortran_handle) {
  sn_comm_t *c = (sn_comm_t *)0x1;
  ck_assert_int_eq(sn_comm_create_mpi_fortran(&c, (int64_t)1 << 40), SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_comm_create_mpi_fortran(&c, (int64_t)MPI_Comm_c2f(MPI_COMM_NULL)),
                   SN_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_eq(c, (sn_comm_t *)0x1);
  ck_assert_int_eq(sn_comm_create_mpi_fortran(NULL, 0), SN_ERR_NULL_POINTER);
  MT_OK(sn_comm_create_mpi_fortran(&c, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD)));
  int rank = -1, size = -1;
  MT_OK(sn_comm_rank(c, &rank));
  MT_OK(sn_comm_size(c, &size));
  ck_assert(rank == mt_rank && size == mt_size);
  double v = 1.0 + mt_rank;
  MT_OK(sn_comm_allreduce_sum(c, &v, 1, SN_DTYPE_F64));
  ck_assert(v == mt_size * (mt_size + 1) / 2.0);
  sn_comm_destroy(c);
}
END_TEST

/* A bad SN_COMM_TIMEOUT_S fails sn_comm_create_mpi on every rank before MPI_Comm_dup (no rank
 * is left inside it), also where only one rank has it (else the other rank would wait in the
 * dup forever); a good one after it creates a working communicator. */
START_TEST(test_env_timeout_rejected) {
  const char *outer = getenv("SN_COMM_TIMEOUT_S"); /* restored at the end */
  char saved[256] = "";
  if (outer != NULL) snprintf(saved, sizeof saved, "%s", outer);
  ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", "5m", 1), 0);
  sn_comm_t *c = (sn_comm_t *)0x1;
  ck_assert_int_eq(sn_comm_create_mpi(&c, MPI_COMM_WORLD), SN_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(sn_last_error(), "SN_COMM_TIMEOUT_S='5m'") != NULL, "%s",
                sn_last_error());
  ck_assert_ptr_eq(c, (sn_comm_t *)0x1);
  /* only rank 0's value is bad: every rank fails, none hangs */
  if (mt_rank == 0) ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", "5m", 1), 0);
  else ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", "30", 1), 0);
  ck_assert_int_eq(sn_comm_create_mpi(&c, MPI_COMM_WORLD), SN_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_eq(c, (sn_comm_t *)0x1);
  if (mt_rank != 0)
    ck_assert_msg(strstr(sn_last_error(), "not a number of seconds >= 0 on rank 0") != NULL,
                  "%s", sn_last_error());
  ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", "30", 1), 0);
  c = NULL;
  MT_OK(sn_comm_create_mpi(&c, MPI_COMM_WORLD));
  if (outer != NULL) ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", saved, 1), 0);
  else ck_assert_int_eq(unsetenv("SN_COMM_TIMEOUT_S"), 0);
  double v = 1.0;
  MT_OK(sn_comm_allreduce_sum(c, &v, 1, SN_DTYPE_F64));
  ck_assert(v == (double)mt_size);
  sn_comm_destroy(c);
}
END_TEST

/* check_finite: NaN in one rank's input → SN_ERR_NONFINITE everywhere, no stat changes. */
START_TEST(test_nonfinite_everywhere) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(3);
  cfg.check_finite = 1;
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
  float x[2 * 3 * 2], y[2 * 3 * 2];
  mt_fill(x, 12, SN_DTYPE_F32, 3, 0);
  if (mt_rank == 1) x[5] = NAN;
  tu_poison_f32(y, 12);
  y[0] = 42.0f;
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 2, 1), SN_ERR_NONFINITE);
  ck_assert(y[0] == 42.0f);
  sn_syncbn_params_t p;
  MT_OK(sn_syncbn_params(bn, &p));
  for (int c = 0; c < 3; c++) ck_assert(p.running_mean[c] == 0.0f && p.running_var[c] == 1.0f);
  ck_assert_int_eq(*p.num_batches_tracked, 0);
  sn_syncbn_destroy(bn);
}
END_TEST

/* ---- four ranks in two groups ------------------------------------------------------------------ */

START_TEST(test_subgroups) {
  ck_assert_int_eq(mt_size, 4);
  sn_comm_t *group = NULL;
  MT_OK(sn_comm_split(mt_world, &group, mt_rank / 2, mt_rank));
  int grank = -1, gsize = 0;
  MT_OK(sn_comm_rank(group, &grank));
  MT_OK(sn_comm_size(group, &gsize));
  ck_assert_int_eq(gsize, 2);
  ck_assert_int_eq(grank, mt_rank % 2);
  /* each group's stats equal BatchNorm over that group's batch only: the group's seed differs */
  eq_case_t k = {5, 3, SN_LAYOUT_NCHW, SN_DTYPE_F32, 1, 3, 0};
  run_equivalence(&k, group, 5000 + 17 * (uint64_t)(mt_rank / 2));
  k.layout = SN_LAYOUT_NHWC;
  k.exact = 0;
  run_equivalence(&k, group, 6000 + 17 * (uint64_t)(mt_rank / 2));
  /* the two groups really saw different data: their running means differ */
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, group));
  float x[2 * 2 * 2] = {0}, y[8];
  for (int i = 0; i < 8; i++) x[i] = (float)(mt_rank / 2) * 10.0f + (float)i;
  MT_OK(sn_syncbn_forward(bn, y, x, 2, 2, 1));
  sn_syncbn_params_t p;
  MT_OK(sn_syncbn_params(bn, &p));
  int same = 1;
  MT_OK(sn_comm_all_identical(mt_world, &same, p.running_mean, 8));
  ck_assert_msg(!same, "groups should have different statistics");
  MT_OK(sn_comm_all_identical(group, &same, p.running_mean, 8));
  ck_assert_msg(same, "ranks of one group must agree");
  sn_syncbn_destroy(bn);
  sn_comm_destroy(group);
}
END_TEST

/* "ranks a, b, c" / "rank a": the ranks r < mt_size with pred(r) == want, as a mismatch message
 * lists them (up to 6; the test runs at most 7 ranks on this path). */
static const char *ranks_where(char *buf, size_t size, int (*pred)(int), int want) {
  int len = 0, n = 0;
  for (int r = 0; r < mt_size; r++) n += pred(r) == want;
  len = snprintf(buf, size, "rank%s", n > 1 ? "s" : "");
  for (int r = 0, k = 0; r < mt_size; r++)
    if (pred(r) == want) len += snprintf(buf + len, size - (size_t)len, "%s %d", k++ ? "," : "", r);
  return buf;
}
static int is_last(int r) { return r == mt_size - 1; }
static int is_cumulative(int r) { return r % 3 == 1; }
static int is_one(int r) { return r == 1; }

/* A mismatch among P ≥ 3 ranks names who holds which value: up to 64 ranks every rank's value
 * ("3 on ranks 0, 1, 2; 4 on rank 3", most common first), beyond that the range and the lowest
 * rank holding each end. Three layers: C larger on the last rank; momentum None on ranks 1, 4,
 * 7, ...; running_mean changed on rank 1. */
START_TEST(test_mismatch_names_ranks) {
  ck_assert_int_ge(mt_size, 3);
  const int table = mt_size <= 64; /* the library's MSG_TABLE_RANKS */
  ck_assert_msg(!table || mt_size <= 7, "the expected rank lists assume at most 6 per value");
  const char *running = "running statistics (load or set them on every rank, or broadcast them "
                        "from one) differs across ranks";
  for (int t = 0; t < 3; t++) {
    sn_syncbn_config_t cfg = sn_syncbn_default_config(t == 0 && mt_rank == mt_size - 1 ? 4 : 3);
    cfg.check_consistency = 1;
    cfg.layer_id = 30 + t;
    if (t == 1 && mt_rank % 3 == 1) cfg.momentum = SN_MOMENTUM_CUMULATIVE;
    sn_syncbn_t *bn = NULL;
    MT_OK(sn_syncbn_create(&bn, &cfg, mt_world));
    if (t == 2 && mt_rank == 1) {
      sn_syncbn_params_t p;
      MT_OK(sn_syncbn_params(bn, &p));
      p.running_mean[0] = 0.5f;
    }
    float x[2 * 4 * 2], y[2 * 4 * 2];
    mt_fill(x, 2 * cfg.num_features * 2, SN_DTYPE_F32, 40 + (uint64_t)t, 0);
    ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 2, 1), SN_ERR_MISMATCH);
    char want[1024], a[256], b[256];
    if (t == 0 && table)
      snprintf(want, sizeof want, "C (num_features) differs across ranks (3 on %s; 4 on %s)",
               ranks_where(a, sizeof a, is_last, 0), ranks_where(b, sizeof b, is_last, 1));
    if (t == 0 && !table)
      snprintf(want, sizeof want,
               "C (num_features) differs across ranks (3..4; e.g. 3 on rank 0, 4 on rank %d)",
               mt_size - 1);
    if (t == 1 && table) /* fewer None ranks than 0.1 ones while P <= 7 */
      snprintf(want, sizeof want, "momentum differs across ranks (0.1 on %s; None on %s)",
               ranks_where(a, sizeof a, is_cumulative, 0),
               ranks_where(b, sizeof b, is_cumulative, 1));
    if (t == 1 && !table)
      snprintf(want, sizeof want, "momentum differs across ranks (e.g. None on rank 1, 0.1 on "
                                  "rank 0)");
    if (t == 2 && table)
      snprintf(want, sizeof want, "%s (one state on %s; another on %s)", running,
               ranks_where(a, sizeof a, is_one, 0), ranks_where(b, sizeof b, is_one, 1));
    if (t == 2 && !table) /* which of the two hashes is the larger is not known here */
      snprintf(want, sizeof want, "%s (e.g. ranks %s)", running,
               strstr(sn_last_error(), "ranks 0 and 1") ? "0 and 1" : "1 and 0");
    ck_assert_msg(strstr(sn_last_error(), want) != NULL, "rank %d: want \"%s\" in: %s", mt_rank,
                  want, sn_last_error());
    sn_syncbn_destroy(bn);
  }
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("syncbn_mpi");
  TCase *eq = tcase_create("equivalence");
  tcase_set_timeout(eq, 600);
  tcase_add_test(eq, test_equivalence);
  tcase_add_test(eq, test_equivalence_beta_cancels);
  tcase_add_test(eq, test_one_collective_each);
  tcase_add_test(eq, test_determinism_many_steps);
  suite_add_tcase(s, eq);
  TCase *two = tcase_create("two_ranks");
  tcase_set_timeout(two, 300);
  tcase_add_test(two, test_uneven_batches_issue_example);
  tcase_add_test(two, test_empty_rank);
  tcase_add_loop_test(two, test_global_count_one, 0, 2);
  tcase_add_test(two, test_mismatch_detected);
  tcase_add_test(two, test_nonfinite_everywhere);
  tcase_add_test(two, test_partial_load);
  tcase_add_test(two, test_intercomm_rejected);
  tcase_add_test(two, test_create_from_fortran_handle);
  tcase_add_test(two, test_layout_of_empty_or_single_position);
  tcase_add_test(two, test_env_timeout_rejected);
  suite_add_tcase(s, two);
  TCase *many = tcase_create("mismatch_ranks");
  tcase_set_timeout(many, 300);
  tcase_add_test(many, test_mismatch_names_ranks);
  suite_add_tcase(s, many);
  TCase *sub = tcase_create("subgroups");
  tcase_set_timeout(sub, 300);
  tcase_add_test(sub, test_subgroups);
  suite_add_tcase(s, sub);
  return s;
}

int main(int argc, char **argv) { return mt_main(argc, argv, make_suite); }
