/*
 * test_comm_self.c — the "self" communicator and the layer API in one process: argument
 * validation, handles, timeouts, and local BatchNorm semantics (comm == NULL and "self" agree).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <pthread.h>

#include "syncnorm_dist.h"
#include "testutil.h"

START_TEST(test_self_comm_basics) {
  sn_comm_t *c = NULL;
  ck_assert_int_eq(sn_comm_create_self(&c), SN_OK);
  int rank = -1, size = -1;
  ck_assert_int_eq(sn_comm_rank(c, &rank), SN_OK);
  ck_assert_int_eq(sn_comm_size(c, &size), SN_OK);
  ck_assert(rank == 0 && size == 1);
  ck_assert_str_eq(sn_comm_backend(c), "self");
  double v[3] = {1.5, -2.0, 3.25};
  ck_assert_int_eq(sn_comm_allreduce_sum(c, v, 3, SN_DTYPE_F64), SN_OK);
  ck_assert(v[0] == 1.5 && v[1] == -2.0 && v[2] == 3.25);
  ck_assert_int_eq(sn_comm_allreduce_sum(c, v, 3, SN_DTYPE_BF16), SN_ERR_INVALID_DTYPE);
  ck_assert_int_eq(sn_comm_allreduce_sum(c, NULL, 3, SN_DTYPE_F32), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_comm_allreduce_sum(c, v, -1, SN_DTYPE_F32), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_comm_allreduce_sum(c, NULL, 0, SN_DTYPE_F32), SN_OK);
  int same = 0;
  ck_assert_int_eq(sn_comm_all_identical(c, &same, v, sizeof v), SN_OK);
  ck_assert(same == 1);
  ck_assert_int_eq(sn_comm_set_timeout(c, -1.0), SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_comm_set_timeout(c, NAN), SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_comm_set_timeout(c, 0.0), SN_OK);
  sn_comm_t *sub = NULL, *none = (sn_comm_t *)0x1;
  ck_assert_int_eq(sn_comm_split(c, &sub, 3, 0), SN_OK);
  ck_assert_int_eq(sn_comm_size(sub, &size), SN_OK);
  ck_assert_int_eq(size, 1);
  ck_assert_int_eq(sn_comm_split(c, &none, -1, 0), SN_OK);
  ck_assert_ptr_null(none);
  sn_comm_destroy(sub);
  sn_comm_destroy(c);
  sn_comm_destroy(NULL);
  ck_assert_int_eq(sn_comm_rank(NULL, &rank), SN_ERR_NULL_POINTER);
  ck_assert_str_eq(sn_comm_backend(NULL), "invalid");
}
END_TEST

/* Destroyed handles, and pointers that never were one, are SN_ERR_INVALID_HANDLE without the
 * library reading them (an API-misuse audit: a forward on a destroyed layer read freed memory;
 * AddressSanitizer, in scripts/test.sh's first pass, reports any such read); destroying twice
 * is a no-op. A layer whose communicator was destroyed fails its calls the same way. */
START_TEST(test_destroyed_handles) {
  sn_comm_t *c = NULL;
  ck_assert_int_eq(sn_comm_create_self(&c), SN_OK);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(3);
  sn_syncbn_t *on_c = NULL, *bn = NULL;
  ck_assert_int_eq(sn_syncbn_create(&on_c, &cfg, c), SN_OK);
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
  float x[6] = {1, 2, 3, 4, 5, 7}, y[6], dx[6];
  for (int i = 0; i < 6; i++) y[i] = dx[i] = -7.0f;

  sn_comm_destroy(c); /* the layer on it outlives it (a misuse) */
  int rank = -1;
  ck_assert_int_eq(sn_comm_rank(c, &rank), SN_ERR_INVALID_HANDLE);
  ck_assert_int_eq(rank, -1);
  ck_assert_str_eq(sn_comm_backend(c), "invalid");
  ck_assert_int_eq(sn_comm_set_timeout(c, 1.0), SN_ERR_INVALID_HANDLE);
  ck_assert_int_eq(sn_comm_allreduce_sum(c, x, 1, SN_DTYPE_F32), SN_ERR_INVALID_HANDLE);
  sn_comm_destroy(c);
  ck_assert_int_eq(sn_syncbn_forward(on_c, y, x, 2, 1, 1), SN_ERR_INVALID_HANDLE);
  ck_assert_msg(strstr(sn_last_error(), "comm is not a live"), "%s", sn_last_error());
  sn_syncbn_destroy(on_c);

  sn_syncbn_destroy(bn);
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 1, 1), SN_ERR_INVALID_HANDLE);
  ck_assert_msg(strstr(sn_last_error(), "bn is not a live"), "%s", sn_last_error());
  ck_assert_int_eq(sn_syncbn_backward(bn, dx, x, x, 2, 1), SN_ERR_INVALID_HANDLE);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_ERR_INVALID_HANDLE);
  int64_t n = -1;
  ck_assert_int_eq(sn_syncbn_collective_count(bn, &n), SN_ERR_INVALID_HANDLE);
  sn_syncbn_destroy(bn);
  for (int i = 0; i < 6; i++) ck_assert(y[i] == -7.0f && dx[i] == -7.0f);

  /* never a handle: smaller than one, so even reading its first field would overrun it */
  int junk = 0;
  ck_assert_int_eq(sn_syncbn_params((sn_syncbn_t *)(void *)&junk, &p), SN_ERR_INVALID_HANDLE);
  ck_assert_int_eq(sn_comm_rank((sn_comm_t *)(void *)&junk, &rank), SN_ERR_INVALID_HANDLE);
  sn_syncbn_destroy((sn_syncbn_t *)(void *)&junk);
  sn_comm_destroy((sn_comm_t *)(void *)&junk);
  ck_assert_int_eq(junk, 0);
}
END_TEST

/* Two threads destroying the same layer (a misuse) free it once: were the check and the removal
 * from the set of live handles two steps, both could pass the check and free it twice ("double
 * free or corruption", within 0.5 s). DESTROY_RACES rounds, each thread released by a barrier. */
#define DESTROY_RACES 20000
static pthread_barrier_t race_start, race_end;
static sn_syncbn_t *race_bn;
static void *race_destroyer(void *arg) {
  (void)arg;
  for (int i = 0; i < DESTROY_RACES; i++) {
    pthread_barrier_wait(&race_start);
    sn_syncbn_destroy(race_bn);
    pthread_barrier_wait(&race_end);
  }
  return NULL;
}

START_TEST(test_destroy_race) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(1);
  ck_assert_int_eq(pthread_barrier_init(&race_start, NULL, 3), 0);
  ck_assert_int_eq(pthread_barrier_init(&race_end, NULL, 3), 0);
  pthread_t t[2];
  for (int k = 0; k < 2; k++)
    ck_assert_int_eq(pthread_create(&t[k], NULL, race_destroyer, NULL), 0);
  for (int i = 0; i < DESTROY_RACES; i++) {
    ck_assert_int_eq(sn_syncbn_create(&race_bn, &cfg, NULL), SN_OK);
    pthread_barrier_wait(&race_start);
    pthread_barrier_wait(&race_end);
    sn_syncbn_params_t p;
    ck_assert_int_eq(sn_syncbn_params(race_bn, &p), SN_ERR_INVALID_HANDLE);
  }
  for (int k = 0; k < 2; k++) ck_assert_int_eq(pthread_join(t[k], NULL), 0);
  pthread_barrier_destroy(&race_start);
  pthread_barrier_destroy(&race_end);
}
END_TEST

/* SN_COMM_TIMEOUT_S: numbers >= 0 are taken, anything else fails the creation ("5m" is not
 * ignored silently, which would leave the job on the 1800 s default). */
START_TEST(test_env_timeout) {
  const char *outer = getenv("SN_COMM_TIMEOUT_S"); /* restored at the end */
  char saved[256] = "";
  if (outer != NULL) snprintf(saved, sizeof saved, "%s", outer);
  static const char *const good[] = {"", "0", "300", "2.5", "1e3", ".5",
                                     "5e-324"}; /* subnormal: strtod's ERANGE, yet a number */
  static const char *const bad[] = {"5m", "-1",  "inf", "nan",  "abc", " ",
                                    "1800s", "-0.5", " 5",  "5 ",  "0x10", "1e400",
                                    "1e-400"}; /* rounds to 0, which would wait forever */
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", good[i], 1), 0);
    sn_comm_t *c = NULL;
    ck_assert_msg(sn_comm_create_self(&c) == SN_OK, "'%s': %s", good[i], sn_last_error());
    sn_comm_destroy(c);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", bad[i], 1), 0);
    sn_comm_t *c = (sn_comm_t *)0x1; /* untouched on error */
    ck_assert_msg(sn_comm_create_self(&c) == SN_ERR_INVALID_ARGUMENT, "'%s' accepted", bad[i]);
    ck_assert_ptr_eq(c, (sn_comm_t *)0x1);
    ck_assert_msg(strstr(sn_last_error(), "SN_COMM_TIMEOUT_S") != NULL, "%s", sn_last_error());
  }
  ck_assert_int_eq(unsetenv("SN_COMM_TIMEOUT_S"), 0);
  sn_comm_t *c = NULL;
  ck_assert_int_eq(sn_comm_create_self(&c), SN_OK);
  sn_comm_destroy(c);
  if (outer != NULL) ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", saved, 1), 0);
}
END_TEST

/* SN_COMM_CHECK: unset, "" and "0" off, "1" on, anything else fails the creation (the self
 * backend has one rank, so the check itself never runs: test_comm_check_mpi). */
START_TEST(test_env_check) {
  const char *outer = getenv("SN_COMM_CHECK"); /* restored at the end */
  char saved[64] = "";
  if (outer != NULL) snprintf(saved, sizeof saved, "%s", outer);
  static const char *const good[] = {"", "0", "1"};
  static const char *const bad[] = {"yes", "2", "on", " 1", "1 ", "true", "01"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    ck_assert_int_eq(setenv("SN_COMM_CHECK", good[i], 1), 0);
    sn_comm_t *c = NULL, *sub = NULL;
    ck_assert_msg(sn_comm_create_self(&c) == SN_OK, "'%s': %s", good[i], sn_last_error());
    double v = 3.0;
    ck_assert_int_eq(sn_comm_allreduce_sum(c, &v, 1, SN_DTYPE_F64), SN_OK);
    ck_assert(v == 3.0);
    ck_assert_int_eq(sn_comm_split(c, &sub, 0, 0), SN_OK);
    sn_comm_destroy(sub);
    sn_comm_destroy(c);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(setenv("SN_COMM_CHECK", bad[i], 1), 0);
    sn_comm_t *c = (sn_comm_t *)0x1; /* untouched on error */
    ck_assert_msg(sn_comm_create_self(&c) == SN_ERR_INVALID_ARGUMENT, "'%s' accepted", bad[i]);
    ck_assert_ptr_eq(c, (sn_comm_t *)0x1);
    ck_assert_msg(strstr(sn_last_error(), "SN_COMM_CHECK='") != NULL, "%s", sn_last_error());
  }
  if (outer != NULL) ck_assert_int_eq(setenv("SN_COMM_CHECK", saved, 1), 0);
  else ck_assert_int_eq(unsetenv("SN_COMM_CHECK"), 0);
}
END_TEST

START_TEST(test_layer_config_validation) {
  sn_syncbn_t *bn = (sn_syncbn_t *)0x1;
  sn_syncbn_config_t cfg = sn_syncbn_default_config(4);
  ck_assert(cfg.eps == 1e-5f && cfg.momentum == 0.1f && cfg.affine == 1 &&
            cfg.track_running_stats == 1 && cfg.layout == SN_LAYOUT_NCHW &&
            cfg.dtype == SN_DTYPE_F32 && cfg.layer_id == -1 && cfg.check_finite == 0);
  sn_syncbn_config_t bad;
  bad = cfg, bad.num_features = 0;
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_SIZE);
  bad = cfg, bad.eps = 0.0f;
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_EPS);
  bad = cfg, bad.momentum = 1.5f;
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_ARGUMENT);
  bad = cfg, bad.momentum = NAN;
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_ARGUMENT);
  bad = cfg, bad.layout = (sn_layout_t)5;
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_LAYOUT);
  bad = cfg, bad.dtype = SN_DTYPE_F64;
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_DTYPE);
  bad = cfg, bad.affine = 2;
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_ARGUMENT);
  bad = cfg, bad.device_memory = 1; /* a host communicator (or no CUDA build, or no device) */
  sn_comm_t *self = NULL;
  ck_assert_int_eq(sn_comm_create_self(&self), SN_OK);
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, self), SN_ERR_UNSUPPORTED);
  sn_comm_destroy(self);
  bad = cfg, memset(bad.name, 'a', sizeof bad.name);
  ck_assert_int_eq(sn_syncbn_create(&bn, &bad, NULL), SN_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_eq(bn, (sn_syncbn_t *)0x1); /* never written on error */
  ck_assert_int_eq(sn_syncbn_create(&bn, NULL, NULL), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_OK);
  for (int c = 0; c < 4; c++) /* PyTorch's initial values */
    ck_assert(p.weight[c] == 1.0f && p.bias[c] == 0.0f && p.running_mean[c] == 0.0f &&
              p.running_var[c] == 1.0f);
  ck_assert_int_eq(*p.num_batches_tracked, 0);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  /* backward before forward, negative sizes, NULL data */
  ck_assert_int_eq(sn_syncbn_backward(bn, y, x, x, 1, 2), SN_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, -1, 2, 1), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_syncbn_forward(bn, NULL, x, 1, 2, 1), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, INT64_MAX / 2, 3, 1), SN_ERR_OVERFLOW);
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 1, 2, 1), SN_OK);
  ck_assert_int_eq(sn_syncbn_backward(bn, y, x, x, 2, 1), SN_ERR_INVALID_ARGUMENT); /* other shape */
  sn_syncbn_destroy(bn);
  ck_assert_int_eq(sn_syncbn_params(NULL, &p), SN_ERR_NULL_POINTER);
  sn_syncbn_destroy(NULL);
}
END_TEST

/* A forward rejected for its arguments (NULL x, n < 0, eval with a running_var < 0, training
 * with a num_batches_tracked < 0) changes
 * nothing, the saved forward included: the backward after it works on the last good forward,
 * bitwise as right after it. A forward that fails after its arguments were accepted (a count of
 * 1) drops the saved forward: the backward after it is an error and writes nothing. */
START_TEST(test_failed_forward_and_saved) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  sn_syncbn_t *bn = NULL;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_OK);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8], dy[8] = {1, -1, 2, 0, 1, 1, -3, 1}, dx[8], dx0[8];
  for (int how = 0; how < 5; how++) {
    ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 2, 1), SN_OK);
    ck_assert_int_eq(sn_syncbn_backward(bn, dx0, dy, x, 2, 2), SN_OK);
    sn_status_t st;
    if (how == 0) st = sn_syncbn_forward(bn, y, NULL, 2, 2, 1);     /* x NULL */
    else if (how == 1) st = sn_syncbn_forward(bn, y, x, -1, 2, 0);  /* n < 0, eval */
    else if (how == 2) {                                            /* running_var < 0, eval */
      p.running_var[0] = -1.0f;
      st = sn_syncbn_forward(bn, y, x, 2, 2, 0);
      p.running_var[0] = 1.0f;
      /* the message names the call and the layer, not only the inner sn_batchnorm_infer */
      ck_assert_msg(strncmp(sn_last_error(), "sn_syncbn_forward (layer 0)", 27) == 0 &&
                        strstr(sn_last_error(), "running_var[0]") != NULL,
                    "%s", sn_last_error());
    } else if (how == 3) { /* num_batches_tracked < 0, training: y and the state untouched */
      const int64_t keep = *p.num_batches_tracked;
      float rm[2], y0[8];
      memcpy(rm, p.running_mean, sizeof rm), memcpy(y0, y, sizeof y0);
      *p.num_batches_tracked = -2;
      st = sn_syncbn_forward(bn, y, x, 2, 2, 1);
      ck_assert_msg(st == SN_ERR_INVALID_ARGUMENT && *p.num_batches_tracked == -2, "%s",
                    sn_last_error());
      tu_assert_bitwise(rm, p.running_mean, sizeof rm, "running_mean after a rejected forward");
      tu_assert_bitwise(y0, y, sizeof y0, "y after a rejected forward");
      *p.num_batches_tracked = keep;
    } else {
      st = sn_syncbn_forward(bn, y, x, 1, 1, 1); /* count 1: accepted, then failed */
    }
    ck_assert_msg(st != SN_OK, "case %d: the forward should fail", how);
    for (int i = 0; i < 8; i++) dx[i] = -7.0f;
    if (how < 4) {
      ck_assert_int_eq(sn_syncbn_backward(bn, dx, dy, x, 2, 2), SN_OK);
      tu_assert_bitwise(dx, dx0, sizeof dx, "backward after a rejected forward");
    } else {
      ck_assert_int_eq(sn_syncbn_backward(bn, dx, dy, x, 2, 2), SN_ERR_INVALID_ARGUMENT);
      ck_assert_msg(strstr(sn_last_error(), "without a successful forward") != NULL, "%s",
                    sn_last_error());
      for (int i = 0; i < 8; i++) ck_assert_msg(dx[i] == -7.0f, "dx written");
    }
  }
  sn_syncbn_destroy(bn);
}
END_TEST

/* comm == NULL and a "self" communicator give bitwise the same results. */
START_TEST(test_null_comm_equals_self) {
  sn_comm_t *self = NULL;
  ck_assert_int_eq(sn_comm_create_self(&self), SN_OK);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(3);
  cfg.check_consistency = 1;
  sn_syncbn_t *a = NULL, *b = NULL;
  ck_assert_int_eq(sn_syncbn_create(&a, &cfg, NULL), SN_OK);
  ck_assert_int_eq(sn_syncbn_create(&b, &cfg, self), SN_OK);
  tu_rng_t r;
  tu_rng_seed(&r, 9);
  float x[4 * 3 * 5], dy[4 * 3 * 5], ya[60], yb[60], dxa[60], dxb[60];
  for (int step = 0; step < 5; step++) {
    tu_fill_normal(x, 60, SN_DTYPE_F32, 2.0, 3.0, &r);
    tu_fill_normal(dy, 60, SN_DTYPE_F32, 0.0, 1.0, &r);
    ck_assert_int_eq(sn_syncbn_forward(a, ya, x, 4, 5, step < 4), SN_OK);
    ck_assert_int_eq(sn_syncbn_forward(b, yb, x, 4, 5, step < 4), SN_OK);
    tu_assert_bitwise(ya, yb, sizeof ya, "y");
    ck_assert_int_eq(sn_syncbn_backward(a, dxa, dy, x, 4, 5), SN_OK);
    ck_assert_int_eq(sn_syncbn_backward(b, dxb, dy, x, 4, 5), SN_OK);
    tu_assert_bitwise(dxa, dxb, sizeof dxa, "dx");
  }
  sn_syncbn_params_t pa, pb;
  ck_assert_int_eq(sn_syncbn_params(a, &pa), SN_OK);
  ck_assert_int_eq(sn_syncbn_params(b, &pb), SN_OK);
  tu_assert_bitwise(pa.running_var, pb.running_var, 12, "running_var");
  tu_assert_bitwise(pa.grad_weight, pb.grad_weight, 12, "grad_weight");
  sn_syncbn_destroy(a), sn_syncbn_destroy(b);
  sn_comm_destroy(self);
}
END_TEST

/* comm == NULL runs the local forward and backward (sn_batchnorm_fwd, sn_batchnorm_bwd, fused
 * in NCHW), and so does a "self" communicator (one rank: nothing to all-reduce, no collective);
 * with check_finite on, the layer takes the separate passes it takes around its all-reduces
 * (the sums are checked before y is written). All three must give the same bits in y, the
 * running statistics, dx, grad_weight and grad_bias after every step:
 * layouts, f32 and bf16, with and without affine, training and eval without running statistics
 * (batch statistics, local; it moves the pivot as a training step does), 1 and 2 threads, and
 * shapes that fuse (many channels, or planes of 3136) and one that does not (3 channels on 2
 * threads). The first step's channels lie 1000 and 2000 from the initial pivot 0: only the even
 * ones are refined. */
START_TEST(test_local_paths_equal_steps) {
  static const int64_t shapes[][3] = {{4, 3, 5}, {3, 64, 49}, {2, 16, 3136}};
  static const sn_dtype_t dts[2] = {SN_DTYPE_F32, SN_DTYPE_BF16};
  sn_comm_t *self = NULL;
  ck_assert_int_eq(sn_comm_create_self(&self), SN_OK);
  tu_rng_t r;
  tu_rng_seed(&r, 21);
  const int saved_threads = omp_get_max_threads();
  for (int threads = 1; threads <= 2; threads++)
    for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
      for (int lay = 0; lay < 2; lay++)
        for (int di = 0; di < 2; di++)
          for (int affine = 0; affine < 2; affine++)
            for (int track = 0; track < 2; track++) {
              omp_set_num_threads(threads);
              const int64_t N = shapes[is][0], C = shapes[is][1], S = shapes[is][2];
              const int64_t T = N * C * S;
              sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
              cfg.layout = lay ? SN_LAYOUT_NHWC : SN_LAYOUT_NCHW;
              cfg.dtype = dts[di];
              cfg.affine = affine;
              cfg.track_running_stats = track;
              sn_syncbn_t *a = NULL, *b = NULL, *o = NULL; /* local, steps, one-rank comm */
              ck_assert_int_eq(sn_syncbn_create(&a, &cfg, NULL), SN_OK);
              ck_assert_int_eq(sn_syncbn_create(&o, &cfg, self), SN_OK);
              cfg.check_finite = 1;
              ck_assert_int_eq(sn_syncbn_create(&b, &cfg, NULL), SN_OK);
              sn_syncbn_params_t pa, pb, po;
              ck_assert_int_eq(sn_syncbn_params(a, &pa), SN_OK);
              ck_assert_int_eq(sn_syncbn_params(b, &pb), SN_OK);
              ck_assert_int_eq(sn_syncbn_params(o, &po), SN_OK);
              if (affine)
                for (int64_t c = 0; c < C; c++) { /* the same non-trivial parameters in all */
                  pa.weight[c] = (float)(1.0 + 0.3 * tu_rng_normal(&r));
                  pa.bias[c] = (float)(0.2 * tu_rng_normal(&r));
                  pb.weight[c] = po.weight[c] = pa.weight[c];
                  pb.bias[c] = po.bias[c] = pa.bias[c];
                }
              void *x = tu_alloc(T, cfg.dtype), *dy = tu_alloc(T, cfg.dtype);
              void *ya = tu_alloc(T, cfg.dtype), *yb = tu_alloc(T, cfg.dtype);
              void *yo = tu_alloc(T, cfg.dtype), *dxo = tu_alloc(T, cfg.dtype);
              void *dxa = tu_alloc(T, cfg.dtype), *dxb = tu_alloc(T, cfg.dtype);
              const size_t bytes = (size_t)(T * sn_dtype_size(cfg.dtype));
              char what[160];
              snprintf(what, sizeof what, "[%lld,%lld,%lld] %s %s affine %d track %d, %d threads",
                       (long long)N, (long long)C, (long long)S, lay ? "NHWC" : "NCHW",
                       tu_dtype_name[cfg.dtype], affine, track, threads);
              for (int step = 0; step < 4; step++) {
                /* training; without running statistics, step 2 in eval mode (batch statistics
                 * too), far from the others (mean 3500): the pivot it leaves changes the sums
                 * of step 3 (training again) in their last bits */
                const int training = track || step != 2;
                if (step == 2)
                  tu_fill_normal(x, T, cfg.dtype, 3500.0, 1.0, &r);
                else
                  tu_fill_normal(x, T, cfg.dtype, 2.0, 3.0, &r);
                if (step == 0) /* even channels refined; odd ones just not, where their
                                  * sums around 0 keep only ~30 bits, so that summing them
                                  * again around their mean would change some y */
                  for (int64_t n = 0; n < N; n++)
                    for (int64_t k = 0; k < S; k++)
                      for (int64_t c = 0; c < C; c++) {
                        const int64_t i = lay ? (n * S + k) * C + c : (n * C + c) * S + k;
                        const double v = c % 2 ? 1000.0 + 0.3 * tu_rng_normal(&r)
                                               : 2000.0 + 0.1 * tu_rng_normal(&r);
                        tu_set(x, i, v, cfg.dtype);
                      }
                tu_fill_normal(dy, T, cfg.dtype, 0.0, 1.0, &r);
                tu_poison(ya, T, cfg.dtype), tu_poison(yb, T, cfg.dtype);
                tu_poison(yo, T, cfg.dtype);
                tu_poison(dxa, T, cfg.dtype), tu_poison(dxb, T, cfg.dtype);
                tu_poison(dxo, T, cfg.dtype);
                if (affine) {
                  tu_poison_f32(pa.grad_weight, C), tu_poison_f32(pa.grad_bias, C);
                  tu_poison_f32(pb.grad_weight, C), tu_poison_f32(pb.grad_bias, C);
                  tu_poison_f32(po.grad_weight, C), tu_poison_f32(po.grad_bias, C);
                }
                ck_assert_int_eq(sn_syncbn_forward(a, ya, x, N, S, training), SN_OK);
                ck_assert_int_eq(sn_syncbn_forward(b, yb, x, N, S, training), SN_OK);
                ck_assert_int_eq(sn_syncbn_forward(o, yo, x, N, S, training), SN_OK);
                tu_assert_bitwise(ya, yb, bytes, what);
                tu_assert_bitwise(ya, yo, bytes, what);
                ck_assert_msg(sn_syncbn_backward(a, dxa, dy, x, N, S) == SN_OK, "%s: %s", what,
                              sn_last_error());
                ck_assert_int_eq(sn_syncbn_backward(b, dxb, dy, x, N, S), SN_OK);
                ck_assert_int_eq(sn_syncbn_backward(o, dxo, dy, x, N, S), SN_OK);
                tu_assert_bitwise(dxa, dxb, bytes, what);
                tu_assert_bitwise(dxa, dxo, bytes, what);
                tu_assert_all_finite(dxa, cfg.dtype, T, what);
                if (track) {
                  tu_assert_bitwise(pa.running_mean, pb.running_mean, (size_t)C * 4, what);
                  tu_assert_bitwise(pa.running_var, pb.running_var, (size_t)C * 4, what);
                  tu_assert_bitwise(pa.running_mean, po.running_mean, (size_t)C * 4, what);
                  tu_assert_bitwise(pa.running_var, po.running_var, (size_t)C * 4, what);
                  ck_assert(*pa.num_batches_tracked == *pb.num_batches_tracked);
                  ck_assert(*pa.num_batches_tracked == *po.num_batches_tracked);
                }
                if (affine) {
                  tu_assert_bitwise(pa.grad_weight, pb.grad_weight, (size_t)C * 4, what);
                  tu_assert_bitwise(pa.grad_bias, pb.grad_bias, (size_t)C * 4, what);
                  tu_assert_bitwise(pa.grad_weight, po.grad_weight, (size_t)C * 4, what);
                  tu_assert_bitwise(pa.grad_bias, po.grad_bias, (size_t)C * 4, what);
                }
              }
              int64_t collectives = -1; /* one rank: nothing was all-reduced */
              ck_assert_int_eq(sn_syncbn_collective_count(o, &collectives), SN_OK);
              ck_assert_int_eq(collectives, 0);
              free(x), free(dy), free(ya), free(yb), free(yo), free(dxa), free(dxb), free(dxo);
              sn_syncbn_destroy(a), sn_syncbn_destroy(b), sn_syncbn_destroy(o);
            }
  omp_set_num_threads(saved_threads);
  sn_comm_destroy(self);
}
END_TEST

int main(void) {
  Suite *s = suite_create("comm_self");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_self_comm_basics);
  tcase_add_test(tc, test_destroyed_handles);
  tcase_add_test(tc, test_destroy_race);
  tcase_add_test(tc, test_env_timeout);
  tcase_add_test(tc, test_env_check);
  tcase_add_test(tc, test_layer_config_validation);
  tcase_add_test(tc, test_null_comm_equals_self);
  tcase_add_test(tc, test_local_paths_equal_steps);
  tcase_add_test(tc, test_failed_forward_and_saved);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
