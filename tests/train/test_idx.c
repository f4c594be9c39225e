/*
 * test_idx.c — syncnorm-train's IDX reader (examples/idx.c): valid files (gzip and plain) read
 * back exactly; every malformed input — missing, empty, truncated, wrong magic, gzip garbage,
 * wrong sizes, image/label counts differing, labels out of range, a directory — gives −1 and one
 * message that names the file and the problem, never a crash (run it under SN_SANITIZE=address
 * too). Random corruptions of a valid gzip file (fuzzing) must either read or fail cleanly.
 * The program turns these errors into exit status 2 (tests/train/test_train_run.c checks that).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "idx.h"
#include "testutil.h"

static char g_dir[256];

/* A fresh temporary directory per test (Check forks each test). */
static void setup(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/sn_test_idx_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void teardown(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

static void path_of(char *p, size_t n, const char *name) { snprintf(p, n, "%s/%s", g_dir, name); }

static void write_raw(const char *name, const void *data, size_t len) {
  char p[512];
  path_of(p, sizeof p, name);
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  fclose(f);
}

static void write_gz(const char *name, const void *data, size_t len) {
  char p[512];
  path_of(p, sizeof p, name);
  gzFile f = gzopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  if (len) ck_assert_int_eq(gzwrite(f, data, (unsigned)len), (int)len);
  ck_assert_int_eq(gzclose(f), Z_OK);
}

/* Bytes of an IDX file: magic 0x08<ndim>, big-endian dims, then the elements (count given
 * separately, to make files whose data do not match the header). */
static size_t make_idx(uint8_t *buf, int ndim, const uint32_t *dims, const uint8_t *elems,
                       size_t nelems) {
  size_t k = 0;
  buf[k++] = 0, buf[k++] = 0, buf[k++] = 8, buf[k++] = (uint8_t)ndim;
  for (int d = 0; d < ndim; d++) {
    buf[k++] = (uint8_t)(dims[d] >> 24), buf[k++] = (uint8_t)(dims[d] >> 16);
    buf[k++] = (uint8_t)(dims[d] >> 8), buf[k++] = (uint8_t)dims[d];
  }
  if (nelems) memcpy(buf + k, elems, nelems);
  return k + nelems;
}

/* A consistent small data set in g_dir: n images of rows×cols and n labels (i % 10). */
static void make_dataset(const char *split, uint32_t n, uint32_t rows, uint32_t cols,
                         uint32_t nlabels, int gz) {
  static uint8_t buf[1 << 20], px[1 << 20], lab[4096];
  for (uint32_t i = 0; i < n * rows * cols; i++) px[i] = (uint8_t)(i * 7 + 3);
  for (uint32_t i = 0; i < nlabels; i++) lab[i] = (uint8_t)(i % 10);
  char name[128];
  const uint32_t idims[3] = {n, rows, cols}, ldims[1] = {nlabels};
  size_t len = make_idx(buf, 3, idims, px, (size_t)n * rows * cols);
  snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", split, gz ? ".gz" : "");
  gz ? write_gz(name, buf, len) : write_raw(name, buf, len);
  len = make_idx(buf, 1, ldims, lab, nlabels);
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", split, gz ? ".gz" : "");
  gz ? write_gz(name, buf, len) : write_raw(name, buf, len);
}

/* Asserts that reading `name` as an ndim array fails with a message containing the path and
 * `what`. */
static void expect_read_error(const char *name, int ndim, const char *what) {
  char p[512], err[1024] = "";
  path_of(p, sizeof p, name);
  idx_array_t a;
  memset(&a, 0xab, sizeof a);
  ck_assert_int_eq(idx_read(&a, p, ndim, err, sizeof err), -1);
  ck_assert_ptr_null(a.data);
  ck_assert_msg(strstr(err, p) != NULL, "message does not name the file: %s", err);
  ck_assert_msg(strstr(err, what) != NULL, "message lacks \"%s\": %s", what, err);
  idx_free(&a);
}

START_TEST(test_valid_gz_and_plain) {
  for (int gz = 0; gz <= 1; gz++) {
    make_dataset("train", 5, 28, 28, 5, gz);
    idx_dataset_t ds;
    char err[1024] = "";
    ck_assert_msg(idx_dataset_read(&ds, g_dir, "train", 28, 28, 10, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_int_eq(ds.count, 5);
    ck_assert_int_eq(ds.rows, 28);
    ck_assert_int_eq(ds.cols, 28);
    for (int i = 0; i < 5 * 28 * 28; i++)
      ck_assert_uint_eq(ds.images.data[i], (uint8_t)(i * 7 + 3));
    for (int i = 0; i < 5; i++) ck_assert_uint_eq(ds.labels.data[i], (uint8_t)i);
    idx_dataset_free(&ds);
    idx_dataset_free(&ds); /* twice: no-op */
    idx_dataset_free(NULL);
    /* remove the .gz files so the plain ones are read in the next round (and vice versa) */
    char p[512];
    path_of(p, sizeof p, gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte");
    unlink(p);
    path_of(p, sizeof p, gz ? "train-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte");
    unlink(p);
  }
}
END_TEST

START_TEST(test_missing_empty_directory) {
  expect_read_error("nope.gz", 3, "cannot open");
  write_raw("empty", "", 0);
  expect_read_error("empty", 1, "truncated");
  char p[512];
  path_of(p, sizeof p, "sub");
  ck_assert_int_eq(mkdir(p, 0755), 0);
  expect_read_error("sub", 1, "directory");
  /* a whole data set missing: the message names the .gz file looked for */
  idx_dataset_t ds;
  char err[1024] = "";
  ck_assert_int_eq(idx_dataset_read(&ds, g_dir, "t10k", 28, 28, 10, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "t10k-images-idx3-ubyte.gz") && strstr(err, "cannot open"), "%s", err);
  ck_assert_ptr_null(ds.images.data);
}
END_TEST

START_TEST(test_bad_magic) {
  uint8_t buf[64];
  const uint32_t d1[1] = {3};
  const uint8_t e[3] = {1, 2, 3};
  size_t len = make_idx(buf, 1, d1, e, 3);
  write_gz("labels.gz", buf, len);
  expect_read_error("labels.gz", 3, "bad magic 0x00000801, expected 0x00000803");
  buf[2] = 0x0d; /* float element type */
  write_gz("float.gz", buf, len);
  expect_read_error("float.gz", 1, "bad magic");
  /* random bytes without a gzip header are read as they are: not an IDX file */
  uint8_t junk[300];
  for (int i = 0; i < 300; i++) junk[i] = (uint8_t)(i * 131 + 17);
  write_raw("junk.gz", junk, sizeof junk);
  expect_read_error("junk.gz", 3, "not an IDX file");
}
END_TEST

START_TEST(test_gz_garbage_and_truncation) {
  /* a real gzip stream, then: cut in the middle; header followed by garbage; bad CRC */
  uint8_t buf[8192];
  const uint32_t d[3] = {4, 28, 28};
  uint8_t px[4 * 784];
  for (int i = 0; i < 4 * 784; i++) px[i] = (uint8_t)(i % 251);
  size_t len = make_idx(buf, 3, d, px, sizeof px);
  write_gz("good.gz", buf, len);
  char p[512];
  path_of(p, sizeof p, "good.gz");
  FILE *f = fopen(p, "rb");
  ck_assert_ptr_nonnull(f);
  uint8_t gz[8192];
  size_t gzlen = fread(gz, 1, sizeof gz, f);
  fclose(f);
  ck_assert_uint_gt(gzlen, 40);
  write_raw("cut.gz", gz, gzlen / 2);
  expect_read_error("cut.gz", 3, "corrupt or truncated gzip data");
  uint8_t garbage[600];
  memcpy(garbage, gz, 10); /* gzip header */
  for (int i = 10; i < 600; i++) garbage[i] = (uint8_t)(i * 97 + 5);
  write_raw("garbage.gz", garbage, sizeof garbage);
  expect_read_error("garbage.gz", 3, "corrupt or truncated gzip data");
  gz[gzlen - 6] ^= 0xff; /* CRC32 of the trailer */
  write_raw("crc.gz", gz, gzlen);
  expect_read_error("crc.gz", 3, "corrupt or truncated gzip data");
}
END_TEST

START_TEST(test_wrong_sizes) {
  uint8_t buf[8192], px[4 * 784] = {0};
  const uint32_t d[3] = {4, 28, 28};
  /* header cut: magic, then only 5 of the 12 dimension bytes */
  size_t len = make_idx(buf, 3, d, px, 0);
  write_gz("hdr.gz", buf, 9);
  expect_read_error("hdr.gz", 3, "the header needs 16 bytes, the file has 9");
  /* data shorter than the header says */
  len = make_idx(buf, 3, d, px, 3 * 784 + 10);
  write_gz("short.gz", buf, len);
  expect_read_error("short.gz", 3, "truncated: the header says 4×28×28 = 3136 bytes of data, "
                                   "the file has 2362");
  /* more data than the header says */
  len = make_idx(buf, 3, d, px, sizeof px);
  buf[len++] = 1;
  write_gz("long.gz", buf, len);
  expect_read_error("long.gz", 3, "count mismatch (extra bytes)");
  /* a zero dimension; absurd dimensions (no huge allocation, no overflow) */
  const uint32_t dz[3] = {0, 28, 28}, dh[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
  len = make_idx(buf, 3, dz, px, 0);
  write_gz("zero.gz", buf, len);
  expect_read_error("zero.gz", 3, "dimension 0 is 0");
  len = make_idx(buf, 3, dh, px, 16);
  write_gz("huge.gz", buf, len);
  expect_read_error("huge.gz", 3, "too large");
}
END_TEST

START_TEST(test_dataset_cross_checks) {
  char err[1024] = "";
  idx_dataset_t ds;
  /* image and label counts differ: both files named */
  make_dataset("train", 5, 28, 28, 4, 1);
  ck_assert_int_eq(idx_dataset_read(&ds, g_dir, "train", 28, 28, 10, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "train-images-idx3-ubyte.gz has 5 images") &&
                    strstr(err, "train-labels-idx1-ubyte.gz has 4 labels"),
                "%s", err);
  /* wrong image size for the model */
  make_dataset("train", 5, 27, 28, 5, 1);
  ck_assert_int_eq(idx_dataset_read(&ds, g_dir, "train", 28, 28, 10, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "images are 27×28, the model needs 28×28"), "%s", err);
  /* a label out of range */
  make_dataset("train", 12, 28, 28, 12, 1);
  ck_assert_int_eq(idx_dataset_read(&ds, g_dir, "train", 28, 28, 5, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "train-labels-idx1-ubyte.gz: label 5 of example 5 is out of range"),
                "%s", err);
  ck_assert_ptr_null(ds.images.data);
  ck_assert_ptr_null(ds.labels.data);
}
END_TEST

/* Fuzzing: flip, zero or cut bytes of a valid gzip file at random; every result must be a clean
 * read (then consistent) or a clean error naming the file. */
START_TEST(test_fuzz_corruptions) {
  uint8_t buf[8192], px[3 * 784];
  const uint32_t d[3] = {3, 28, 28};
  tu_rng_t rng;
  tu_rng_seed(&rng, 4);
  for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)tu_rng_int(&rng, 0, 255);
  size_t len = make_idx(buf, 3, d, px, sizeof px);
  write_gz("base.gz", buf, len);
  char p[512];
  path_of(p, sizeof p, "base.gz");
  FILE *f = fopen(p, "rb");
  ck_assert_ptr_nonnull(f);
  uint8_t gz[8192], mut[8192];
  const size_t gzlen = fread(gz, 1, sizeof gz, f);
  fclose(f);
  int ok = 0, failed = 0;
  for (int it = 0; it < 400; it++) {
    memcpy(mut, gz, gzlen);
    size_t n = gzlen;
    const int kind = (int)tu_rng_int(&rng, 0, 2);
    const size_t at = (size_t)tu_rng_int(&rng, 0, (int64_t)gzlen - 1);
    if (kind == 0) mut[at] ^= (uint8_t)tu_rng_int(&rng, 1, 255);
    if (kind == 1) {
      size_t z = (size_t)tu_rng_int(&rng, 1, 16);
      memset(mut + at, 0, z < gzlen - at ? z : gzlen - at);
    }
    if (kind == 2) n = at;
    write_raw("fuzz.gz", mut, n);
    char fp[512], err[1024] = "";
    path_of(fp, sizeof fp, "fuzz.gz");
    idx_array_t a;
    if (idx_read(&a, fp, 3, err, sizeof err) == 0) {
      ok++;
      ck_assert_int_eq(a.ndim, 3);
      ck_assert_int_eq(a.dims[0] * a.dims[1] * a.dims[2] > 0, 1);
      idx_free(&a);
    } else {
      failed++;
      ck_assert_msg(strstr(err, fp) != NULL, "message does not name the file: %s", err);
      ck_assert_ptr_null(a.data);
    }
  }
  ck_assert_int_gt(failed, 300); /* nearly every corruption is caught (CRC, sizes, magic) */
  (void)ok;
}
END_TEST

/* The installed Fashion-MNIST files, when present: the sizes the program expects. */
START_TEST(test_fashion_mnist_if_installed) {
  const char *dir = "/usr/share/datasets/fashion-mnist";
  struct stat st;
  if (stat(dir, &st) != 0) return; /* not installed: nothing to check */
  char err[1024] = "";
  idx_dataset_t ds;
  ck_assert_msg(idx_dataset_read(&ds, dir, "t10k", 28, 28, 10, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(ds.count, 10000);
  int64_t per_class[10] = {0};
  for (int64_t i = 0; i < ds.count; i++) per_class[ds.labels.data[i]]++;
  for (int c = 0; c < 10; c++) ck_assert_int_eq(per_class[c], 1000);
  idx_dataset_free(&ds);
}
END_TEST

int main(void) {
  Suite *s = suite_create("idx");
  TCase *tc = tcase_create("reader");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_valid_gz_and_plain);
  tcase_add_test(tc, test_missing_empty_directory);
  tcase_add_test(tc, test_bad_magic);
  tcase_add_test(tc, test_gz_garbage_and_truncation);
  tcase_add_test(tc, test_wrong_sizes);
  tcase_add_test(tc, test_dataset_cross_checks);
  tcase_add_test(tc, test_fuzz_corruptions);
  tcase_add_test(tc, test_fashion_mnist_if_installed);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
