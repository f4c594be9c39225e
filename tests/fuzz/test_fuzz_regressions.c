/*
 * test_fuzz_regressions.c — what the fuzzers of tests/fuzz found, kept as ordinary unit tests
 * that every build runs (gcc included, no libFuzzer needed):
 *  - replay: every committed corpus input through the same harness code the fuzzers use
 *    (compiled here with SN_FUZZ_NO_MAIN); a harness aborts on any broken promise;
 *  - one test per finding, asserting the clean error (or correct result) the library gives.
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "syncnorm_dist.h"
#include "testutil.h"
#if SN_FUZZ_HAVE_IDX
#include "idx.h"
#endif

int fuzz_safetensors_one(const uint8_t *data, size_t size);
int fuzz_kernels_one(const uint8_t *data, size_t size);
#if SN_FUZZ_HAVE_IDX
int fuzz_idx_one(const uint8_t *data, size_t size);
#endif

/* Reads a whole file (malloc'd; *size bytes). */
static uint8_t *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  ck_assert_int_ge(n, 0);
  ck_assert_int_eq(fseek(f, 0, SEEK_SET), 0);
  uint8_t *b = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(b);
  ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return b;
}

/* Runs every file of corpus/<target> through `one`; returns how many. */
static int replay(const char *target, int (*one)(const uint8_t *, size_t)) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", SN_FUZZ_CORPUS_DIR, target);
  DIR *d = opendir(dir);
  ck_assert_msg(d != NULL, "no corpus directory %s", dir);
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    size_t size;
    uint8_t *data = slurp(path, &size);
    one(data, size); /* aborts (a failed test) on any violation */
    free(data);
    count++;
  }
  closedir(d);
  return count;
}

START_TEST(test_replay_safetensors) {
  ck_assert_int_gt(replay("fuzz_safetensors", fuzz_safetensors_one), 0);
}
END_TEST

START_TEST(test_replay_kernels) { ck_assert_int_gt(replay("fuzz_kernels", fuzz_kernels_one), 0); }
END_TEST

#if SN_FUZZ_HAVE_IDX
START_TEST(test_replay_idx) { ck_assert_int_gt(replay("fuzz_idx", fuzz_idx_one), 0); }
END_TEST
#endif

/* ---- findings ------------------------------------------------------------------------------------ */

/* fuzz_kernels, corpus regress-syncbn-nan-pivot: one training batch holding NaN/Inf (check_finite
 * off, the default) must not leave the layer's pivot — the previous batch mean — NaN, or every
 * later batch, however clean, would normalize to NaN. dist/syncbn.c: forward_batch resets a
 * non-finite pivot to 0. */
START_TEST(test_syncbn_nonfinite_batch_does_not_poison_later_batches) {
  const float clean[8] = {1, 2, 3, 4, -1, 0.5f, 7, 2};
  const float bad[3][8] = {{1, NAN, 3, 4, 5, 6, 7, 8},
                           {1, INFINITY, 3, 4, 5, 6, 7, 8},
                           {-INFINITY, INFINITY, 3, 4, 5, 6, 7, 8}};
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  sn_syncbn_t *ref = NULL;
  float want[8], got[8];
  ck_assert_int_eq(sn_syncbn_create(&ref, &cfg, NULL), SN_OK);
  ck_assert_int_eq(sn_syncbn_forward(ref, want, clean, 4, 1, 1), SN_OK); /* fresh layer: pivot 0 */
  for (int k = 0; k < 3; k++) {
    sn_syncbn_t *bn = NULL;
    ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
    float y[8];
    ck_assert_int_eq(sn_syncbn_forward(bn, y, bad[k], 4, 1, 1), SN_OK); /* NaN out: allowed */
    ck_assert_int_eq(sn_syncbn_forward(bn, got, clean, 4, 1, 1), SN_OK);
    for (int i = 0; i < 8; i++) ck_assert_msg(isfinite(got[i]), "case %d: y[%d] = %g", k, i, (double)got[i]);
    tu_assert_bitwise(got, want, sizeof got, "clean batch after a non-finite one");
    sn_syncbn_destroy(bn);
  }
  sn_syncbn_destroy(ref);
}
END_TEST

/* The same through a checkpoint: a non-finite running_mean loaded from a file becomes the pivot. */
START_TEST(test_syncbn_nonfinite_loaded_running_mean) {
  char dir[] = "/tmp/sn_fuzzreg_XXXXXX", path[64];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/bn.safetensors", dir);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  sn_syncbn_t *a = NULL, *b = NULL, *ref = NULL;
  ck_assert_int_eq(sn_syncbn_create(&a, &cfg, NULL), SN_OK);
  ck_assert_int_eq(sn_syncbn_create(&b, &cfg, NULL), SN_OK);
  ck_assert_int_eq(sn_syncbn_create(&ref, &cfg, NULL), SN_OK);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(a, &p), SN_OK);
  p.running_mean[0] = NAN;
  p.running_mean[1] = -INFINITY;
  const char *prefix = "bn";
  ck_assert_int_eq(sn_syncbn_save(path, &a, &prefix, 1), SN_OK);
  ck_assert_int_eq(sn_syncbn_load(path, &b, &prefix, 1), SN_OK);
  const float x[8] = {1, 2, 3, 4, -1, 0.5f, 7, 2};
  float y[8], want[8];
  ck_assert_int_eq(sn_syncbn_forward(b, y, x, 4, 1, 1), SN_OK);
  ck_assert_int_eq(sn_syncbn_forward(ref, want, x, 4, 1, 1), SN_OK);
  tu_assert_bitwise(y, want, sizeof y, "training forward after loading a non-finite running_mean");
  sn_syncbn_destroy(a), sn_syncbn_destroy(b), sn_syncbn_destroy(ref);
  unlink(path);
  rmdir(dir);
}
END_TEST

/* fuzz_kernels, corpus regress-syncbn-overflow-order: sn_syncbn_forward checks the sizes in the
 * kernels' order (n·C first; check_call, dist/syncbn.c). Checking n·s·C alone, n = 2^60, s = 0,
 * C = 3 would pass the layer's checks and fail inside sn_batchnorm_stats/infer — a message
 * naming the kernel, and (training) the previous forward's saved state already discarded, so the
 * next backward would fail. */
START_TEST(test_syncbn_size_overflow_rejected_before_any_change) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(3);
  sn_syncbn_t *bn = NULL;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
  float x[6] = {1, 2, 3, 4, 5, 7}, y[6], dy[6] = {1, -1, 2, 0, 1, 1}, dx[6];
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 1, 1), SN_OK);
  for (int training = 0; training <= 1; training++) {
    ck_assert_int_eq(sn_syncbn_forward(bn, y, x, (int64_t)1 << 60, 0, training), SN_ERR_OVERFLOW);
    ck_assert_msg(strncmp(sn_last_error(), "sn_syncbn_forward:", 18) == 0, "message '%s'", sn_last_error());
  }
  ck_assert_int_eq(sn_syncbn_backward(bn, dx, dy, x, 2, 1), SN_OK); /* the forward is still saved */
  sn_syncbn_destroy(bn);
}
END_TEST

/* sn_safetensors_load on a directory: fopen succeeds and ftell reports LLONG_MAX (ext4), so a
 * loader trusting it would try malloc(2^63) — SN_ERR_ALLOC with a bogus size, an abort under
 * ASan. Not reachable from file bytes, hence a test of its own. dist/checkpoint.c reads only
 * regular files. */
START_TEST(test_safetensors_load_directory) {
  sn_safetensors_t *f = (sn_safetensors_t *)&f;
  ck_assert_int_eq(sn_safetensors_load(&f, SN_FUZZ_CORPUS_DIR), SN_ERR_IO);
  ck_assert_ptr_eq(f, (sn_safetensors_t *)&f);
  ck_assert_msg(strstr(sn_last_error(), "not a regular file") != NULL, "message '%s'", sn_last_error());
}
END_TEST

/* Writes a BatchNorm state for C = 2 under prefix "bn" with the given num_batches_tracked. */
static void save_state_with_nbt(const char *path, int64_t nbt) {
  static const float w[2] = {1, 1}, b[2] = {0, 0}, rm[2] = {0.5f, -1}, rv[2] = {1, 2};
  const void *data[5] = {w, b, rm, rv, &nbt};
  static const char *const names[5] = {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                                       "bn.num_batches_tracked"};
  sn_tensor_t t[5];
  memset(t, 0, sizeof t);
  for (int k = 0; k < 5; k++) {
    t[k].name = names[k];
    t[k].dtype = SN_DTYPE_F32;
    t[k].is_i64 = k == 4;
    t[k].ndim = k == 4 ? 0 : 1;
    t[k].shape[0] = 2;
    t[k].data = data[k];
  }
  ck_assert_int_eq(sn_safetensors_save(path, t, 5), SN_OK);
}

/* fuzz_safetensors, corpus regress-syncbn-nbt-int64-max: a checkpoint whose num_batches_tracked
 * is INT64_MAX, loaded and followed by a training forward, must not overflow
 * `num_batches_tracked += 1` (signed overflow, undefined behaviour; UBSan): the count saturates
 * (dist/syncbn.c). A negative count, with momentum=None, would make the running-average factor
 * 1/0 or negative: it is SN_ERR_FORMAT, nothing loaded (dist/syncbn_state.c). */
START_TEST(test_syncbn_loaded_num_batches_tracked_extremes) {
  char dir[] = "/tmp/sn_fuzzreg_XXXXXX", path[64];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/bn.safetensors", dir);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  cfg.momentum = SN_MOMENTUM_CUMULATIVE;
  sn_syncbn_t *bn = NULL;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
  const char *prefix = "bn";
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_OK);

  save_state_with_nbt(path, INT64_MAX);
  ck_assert_int_eq(sn_syncbn_load(path, &bn, &prefix, 1), SN_OK);
  const float x[8] = {1, 2, 3, 4, -1, 0.5f, 7, 2};
  float y[8];
  ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 4, 1, 1), SN_OK);
  ck_assert(*p.num_batches_tracked == INT64_MAX); /* saturated */
  for (int i = 0; i < 2; i++) ck_assert(isfinite(p.running_mean[i]) && isfinite(p.running_var[i]));

  const float rm0 = p.running_mean[0];
  for (int64_t bad = -1; bad >= -2; bad--) {
    save_state_with_nbt(path, bad == -2 ? INT64_MIN : bad);
    ck_assert_int_eq(sn_syncbn_load(path, &bn, &prefix, 1), SN_ERR_FORMAT);
    ck_assert_msg(strstr(sn_last_error(), "must be >= 0") != NULL, "message '%s'", sn_last_error());
    ck_assert(*p.num_batches_tracked == INT64_MAX && p.running_mean[0] == rm0); /* unchanged */
  }
  sn_syncbn_destroy(bn);
  unlink(path);
  rmdir(dir);
}
END_TEST

#if SN_FUZZ_HAVE_IDX
/* fuzz_idx, corpus regress-bad-ndim-out-not-zeroed: idx_read with ndim outside 1..3 returns −1
 * with *out zeroed, as idx.h promises on failure (else idx_free on it would free garbage). Same
 * for idx_dataset_read with bad arguments (examples/idx.c). */
START_TEST(test_idx_bad_arguments_zero_output) {
  char err[128];
  idx_array_t a;
  memset(&a, 0x5a, sizeof a);
  ck_assert_int_eq(idx_read(&a, "/nonexistent", 0, err, sizeof err), -1);
  idx_array_t zero;
  memset(&zero, 0, sizeof zero);
  ck_assert_mem_eq(&a, &zero, sizeof a);
  idx_free(&a);
  memset(&a, 0x5a, sizeof a);
  ck_assert_int_eq(idx_read(&a, NULL, 1, err, sizeof err), -1);
  ck_assert_mem_eq(&a, &zero, sizeof a);
  idx_dataset_t ds, dzero;
  memset(&ds, 0x5a, sizeof ds);
  memset(&dzero, 0, sizeof dzero);
  ck_assert_int_eq(idx_dataset_read(&ds, "/nonexistent", "train", 0, 0, 0, err, sizeof err), -1);
  ck_assert_mem_eq(&ds, &dzero, sizeof ds);
  idx_dataset_free(&ds);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("fuzz_regressions");
  TCase *tc = tcase_create("replay");
  tcase_add_test(tc, test_replay_safetensors);
  tcase_add_test(tc, test_replay_kernels);
#if SN_FUZZ_HAVE_IDX
  tcase_add_test(tc, test_replay_idx);
#endif
  suite_add_tcase(s, tc);
  TCase *found = tcase_create("findings");
  tcase_add_test(found, test_syncbn_nonfinite_batch_does_not_poison_later_batches);
  tcase_add_test(found, test_syncbn_nonfinite_loaded_running_mean);
  tcase_add_test(found, test_syncbn_size_overflow_rejected_before_any_change);
  tcase_add_test(found, test_safetensors_load_directory);
  tcase_add_test(found, test_syncbn_loaded_num_batches_tracked_extremes);
#if SN_FUZZ_HAVE_IDX
  tcase_add_test(found, test_idx_bad_arguments_zero_output);
#endif
  suite_add_tcase(s, found);
  return tu_run_suite(s);
}
