/*
 * test_comm_callback.c — the "callback" communicator (sn_comm_create_callback) in one process:
 * a callback that plays a group of P ranks holding the same data (a sum multiplies by P, a max
 * is the identity), so a SyncBatchNorm layer over it must equal BatchNorm over P copies of the
 * batch; failures and timeouts from the callback; argument checks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "syncnorm_dist.h"
#include "testutil.h"

typedef struct {
  int ranks;          /* the group the callback plays: sums are multiplied by it */
  sn_status_t fail;   /* returned instead of reducing, where not SN_OK */
  int calls;
  double timeout_s;   /* the last timeout handed to the callback */
  int64_t last_count;
  sn_comm_type_t last_type;
  sn_comm_op_t last_op;
} fake_t;

static sn_status_t fake_allreduce(void *user, void *buf, int64_t count, sn_comm_type_t type,
                                  sn_comm_op_t op, double timeout_s) {
  fake_t *f = user;
  f->calls++;
  f->timeout_s = timeout_s, f->last_count = count, f->last_type = type, f->last_op = op;
  if (f->fail != SN_OK) return f->fail;
  if (op == SN_COMM_MAX) return SN_OK; /* identical ranks: the max is each value */
  for (int64_t i = 0; i < count; i++) {
    if (type == SN_COMM_F32) ((float *)buf)[i] *= (float)f->ranks;
    else if (type == SN_COMM_F64) ((double *)buf)[i] *= (double)f->ranks;
    else ((int64_t *)buf)[i] *= f->ranks;
  }
  return SN_OK;
}

START_TEST(test_callback_basics) {
  fake_t f = {2, SN_OK, 0, 0.0, 0, 0, 0};
  sn_comm_t *c = NULL;
  ck_assert_int_eq(sn_comm_create_callback(NULL, 0, 2, fake_allreduce, &f), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_comm_create_callback(&c, 0, 2, NULL, &f), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_comm_create_callback(&c, 2, 2, fake_allreduce, &f), SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_comm_create_callback(&c, -1, 2, fake_allreduce, &f), SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_comm_create_callback(&c, 0, 0, fake_allreduce, &f), SN_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(c);
  ck_assert_int_eq(sn_comm_create_callback(&c, 1, 2, fake_allreduce, &f), SN_OK);
  ck_assert_str_eq(sn_comm_backend(c), "callback");
  int rank = -1, size = -1;
  ck_assert_int_eq(sn_comm_rank(c, &rank), SN_OK);
  ck_assert_int_eq(sn_comm_size(c, &size), SN_OK);
  ck_assert(rank == 1 && size == 2);
  double v[3] = {1.5, -2.0, 3.25};
  ck_assert_int_eq(sn_comm_allreduce_sum(c, v, 3, SN_DTYPE_F64), SN_OK);
  ck_assert(v[0] == 3.0 && v[1] == -4.0 && v[2] == 6.5);
  ck_assert(f.last_count == 3 && f.last_type == SN_COMM_F64 && f.last_op == SN_COMM_SUM);
  ck_assert(f.timeout_s == 1800.0); /* the default timeout, handed over */
  ck_assert_int_eq(sn_comm_set_timeout(c, 2.5), SN_OK);
  float w[2] = {1.0f, 0.25f};
  ck_assert_int_eq(sn_comm_allreduce_sum(c, w, 2, SN_DTYPE_F32), SN_OK);
  ck_assert(w[0] == 2.0f && w[1] == 0.5f && f.last_type == SN_COMM_F32 && f.timeout_s == 2.5);
  int same = 0;
  ck_assert_int_eq(sn_comm_all_identical(c, &same, v, sizeof v), SN_OK);
  ck_assert(same == 1 && f.last_type == SN_COMM_I64 && f.last_op == SN_COMM_MAX);
  const int before = f.calls;
  ck_assert_int_eq(sn_comm_allreduce_sum(c, NULL, 0, SN_DTYPE_F32), SN_OK);
  ck_assert_int_eq(f.calls, before); /* nothing to reduce: no call */
  sn_comm_t *sub = NULL;
  ck_assert_int_eq(sn_comm_split(c, &sub, 0, 0), SN_ERR_UNSUPPORTED);
  ck_assert_ptr_null(sub);
  sn_comm_destroy(c);
}
END_TEST

/* A callback that fails breaks the communicator: SN_ERR_TIMEOUT where it said so, else
 * SN_ERR_COMM, then SN_ERR_COMM for every later call; nothing written by the layer. */
START_TEST(test_callback_failures) {
  const sn_status_t fails[2] = {SN_ERR_TIMEOUT, SN_ERR_IO};
  for (int k = 0; k < 2; k++) {
    fake_t f = {2, fails[k], 0, 0.0, 0, 0, 0};
    sn_comm_t *c = NULL;
    ck_assert_int_eq(sn_comm_create_callback(&c, 0, 2, fake_allreduce, &f), SN_OK);
    sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
    sn_syncbn_t *bn = NULL;
    ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, c), SN_OK);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    tu_poison_f32(y, 8);
    float y0[8];
    memcpy(y0, y, sizeof y);
    const sn_status_t want = k == 0 ? SN_ERR_TIMEOUT : SN_ERR_COMM;
    ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 2, 1), want);
    ck_assert_msg(strstr(sn_last_error(), "callback returned") != NULL, "%s", sn_last_error());
    tu_assert_bitwise(y, y0, sizeof y, "y after a failed all-reduce");
    sn_syncbn_params_t p;
    ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_OK);
    ck_assert(p.running_mean[0] == 0.0f && *p.num_batches_tracked == 0);
    ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 2, 1), SN_ERR_COMM); /* broken */
    double v = 1.0;
    ck_assert_int_eq(sn_comm_allreduce_sum(c, &v, 1, SN_DTYPE_F64), SN_ERR_COMM);
    sn_syncbn_destroy(bn);
    sn_comm_destroy(c);
  }
}
END_TEST

/* SyncBatchNorm over a callback playing P identical ranks equals BatchNorm over the batch
 * repeated P times (fp64 reference): y, dx, running statistics (unbiased over P·n·s values),
 * num_batches_tracked; grad_weight/bias are this rank's own sums. NCHW and NHWC, f32. */
START_TEST(test_callback_syncbn_equals_repeated_batch) {
  enum { P = 3, N = 2, C = 4, S = 5, STEPS = 3 };
  /* f32 outputs against the fp64 reference: a few f32 roundings (~1e-7); statistics from
   * fp64 sums, running stats one f32 rounding per step */
  const double RTOL = 2e-6;
  const int layout = _i;
  fake_t f = {P, SN_OK, 0, 0.0, 0, 0, 0};
  sn_comm_t *c = NULL;
  ck_assert_int_eq(sn_comm_create_callback(&c, 0, P, fake_allreduce, &f), SN_OK);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  cfg.layout = (sn_layout_t)layout;
  sn_syncbn_t *bn = NULL;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, c), SN_OK);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_OK);
  int64_t bcount = -5;
  double bmean[C], bvar[C];
  ck_assert_int_eq(sn_syncbn_batch_stats(bn, &bcount, bmean, bvar), SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(bcount, -5); /* before any forward: nothing written */
  tu_rng_t r;
  tu_rng_seed(&r, 11);
  for (int c_ = 0; c_ < C; c_++) p.weight[c_] = 0.5f + (float)c_, p.bias[c_] = -0.25f * (float)c_;
  double rm[C], rv[C];
  for (int c_ = 0; c_ < C; c_++) rm[c_] = 0.0, rv[c_] = 1.0;
  for (int step = 0; step < STEPS; step++) {
    float x[N * C * S], dy[N * C * S], y[N * C * S], dx[N * C * S];
    for (int i = 0; i < N * C * S; i++) {
      x[i] = (float)(3.0 + 2.0 * tu_rng_normal(&r));
      dy[i] = (float)tu_rng_normal(&r);
    }
    ck_assert_int_eq(sn_syncbn_forward(bn, y, x, N, S, 1), SN_OK);
    ck_assert_int_eq(sn_syncbn_backward(bn, dx, dy, x, N, S), SN_OK);
    ck_assert_int_eq(sn_syncbn_batch_stats(bn, &bcount, bmean, bvar), SN_OK);
    ck_assert_int_eq(bcount, (int64_t)P * N * S); /* the global count */
    for (int c_ = 0; c_ < C; c_++) {
      /* the repeated batch has the same mean and biased variance; its count is P·N·S */
      double sum = 0.0, sq = 0.0, sdy = 0.0, sdyx = 0.0;
      for (int n = 0; n < N; n++)
        for (int s = 0; s < S; s++) sum += x[tu_at((sn_layout_t)layout, n, c_, s, C, S)];
      const double cnt = N * S, mean = sum / cnt;
      for (int n = 0; n < N; n++)
        for (int s = 0; s < S; s++) {
          const double d = x[tu_at((sn_layout_t)layout, n, c_, s, C, S)] - mean;
          sq += d * d;
        }
      const double var = sq / cnt, rstd = 1.0 / sqrt(var + 1e-5);
      ck_assert_msg(fabs(bmean[c_] - mean) <= 1e-6 * (1.0 + fabs(mean)), "batch mean[%d]", c_);
      ck_assert_msg(fabs(bvar[c_] - var) <= 1e-6 * var, "batch var[%d] %g vs %g", c_, bvar[c_],
                    var);
      for (int n = 0; n < N; n++)
        for (int s = 0; s < S; s++) {
          const int64_t i = tu_at((sn_layout_t)layout, n, c_, s, C, S);
          sdy += dy[i];
          sdyx += dy[i] * (x[i] - mean) * rstd;
        }
      for (int n = 0; n < N; n++)
        for (int s = 0; s < S; s++) {
          const int64_t i = tu_at((sn_layout_t)layout, n, c_, s, C, S);
          const double xh = (x[i] - mean) * rstd;
          const double want_y = xh * p.weight[c_] + p.bias[c_];
          /* Σ over the P ranks is P times this rank's sums, over P·cnt values */
          const double want_dx = p.weight[c_] * rstd * (dy[i] - sdy / cnt - xh * sdyx / cnt);
          ck_assert_msg(fabs(y[i] - want_y) <= RTOL * (1.0 + fabs(want_y)), "y[%lld] %g vs %g",
                        (long long)i, (double)y[i], want_y);
          ck_assert_msg(fabs(dx[i] - want_dx) <= RTOL * (1.0 + fabs(want_dx)),
                        "dx[%lld] %g vs %g", (long long)i, (double)dx[i], want_dx);
        }
      const double all = (double)P * cnt;
      rm[c_] = 0.9 * rm[c_] + 0.1 * mean;
      rv[c_] = 0.9 * rv[c_] + 0.1 * var * all / (all - 1.0);
      ck_assert_msg(fabs(p.running_mean[c_] - rm[c_]) <= RTOL * (1.0 + fabs(rm[c_])),
                    "running_mean[%d] %g vs %g", c_, (double)p.running_mean[c_], rm[c_]);
      ck_assert_msg(fabs(p.running_var[c_] - rv[c_]) <= RTOL * rv[c_], "running_var[%d] %g vs %g",
                    c_, (double)p.running_var[c_], rv[c_]);
      ck_assert(fabs(p.grad_bias[c_] - sdy) <= RTOL * (1.0 + fabs(sdy)));
      ck_assert(fabs(p.grad_weight[c_] - sdyx) <= RTOL * (1.0 + fabs(sdyx)));
    }
    ck_assert_int_eq(*p.num_batches_tracked, step + 1);
  }
  int64_t collectives = 0;
  ck_assert_int_eq(sn_syncbn_collective_count(bn, &collectives), SN_OK);
  ck_assert_int_eq(collectives, 4 * STEPS); /* forward, backward, and a check before each */
  /* an empty global batch: the count 0 only; eval mode: no batch statistics */
  ck_assert_int_eq(sn_syncbn_forward(bn, NULL, NULL, 0, S, 1), SN_OK);
  bmean[0] = -7.0;
  ck_assert_int_eq(sn_syncbn_batch_stats(bn, &bcount, bmean, NULL), SN_OK);
  ck_assert(bcount == 0 && bmean[0] == -7.0);
  float xe[N * C * S] = {0}, ye[N * C * S];
  ck_assert_int_eq(sn_syncbn_forward(bn, ye, xe, N, S, 0), SN_OK);
  ck_assert_int_eq(sn_syncbn_batch_stats(bn, &bcount, bmean, bvar), SN_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(sn_last_error(), "running statistics") != NULL, "%s", sn_last_error());
  ck_assert_int_eq(sn_syncbn_batch_stats(bn, NULL, bmean, bvar), SN_ERR_NULL_POINTER);
  sn_syncbn_destroy(bn);
  sn_comm_destroy(c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("comm_callback");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_callback_basics);
  tcase_add_test(tc, test_callback_failures);
  tcase_add_loop_test(tc, test_callback_syncbn_equals_repeated_batch, 0, 2);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
