/*
 * test_checkpoint.c — safetensors save/load: round trips, several layers in one file, atomic
 * replacement, and rejection of corrupt or truncated files with nothing changed.
 */
#define _GNU_SOURCE /* O_TMPFILE */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "syncnorm_dist.h"
#include "testutil.h"

static char dir[256];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/sn_ckpt_test_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void path_in(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", dir, name); }

/* Entries of dir with ".tmp." in their name (a save's temporary files), each printed. */
static int temp_files_left(void) {
  DIR *dh = opendir(dir);
  ck_assert_ptr_nonnull(dh);
  int left = 0;
  for (struct dirent *e; (e = readdir(dh)) != NULL;)
    if (strstr(e->d_name, ".tmp.") != NULL) {
      fprintf(stderr, "left behind: %s\n", e->d_name);
      left++;
    }
  closedir(dh);
  return left;
}

static unsigned char *read_file(const char *path, long *size) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)*size + 1);
  ck_assert_int_eq(fread(b, 1, (size_t)*size, f), (size_t)*size);
  fclose(f);
  return b;
}

static void write_file(const char *path, const void *b, long size) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fwrite(b, 1, (size_t)size, f), (size_t)size);
  fclose(f);
}

/* Writes a safetensors file from a header string and raw data. */
static void write_st(const char *path, const char *header, const void *data, size_t data_len) {
  size_t h = strlen(header);
  unsigned char *b = malloc(8 + h + data_len + 1);
  for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)h >> (8 * k));
  memcpy(b + 8, header, h);
  if (data_len) memcpy(b + 8 + h, data, data_len);
  write_file(path, b, (long)(8 + h + data_len));
  free(b);
}

/* A layer whose state is filled with distinct, recognizable values. */
static sn_syncbn_t *make_layer(int64_t C, float base) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  sn_syncbn_t *bn = NULL;
  ck_assert_int_eq(sn_syncbn_create(&bn, &cfg, NULL), SN_OK);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(bn, &p), SN_OK);
  for (int64_t c = 0; c < C; c++) {
    p.weight[c] = base + (float)c, p.bias[c] = -base - (float)c;
    p.running_mean[c] = base * 0.5f + (float)c, p.running_var[c] = base + 2.0f * (float)c;
  }
  *p.num_batches_tracked = (int64_t)base * 1000 + 7;
  return bn;
}

static void assert_same_state(sn_syncbn_t *a, sn_syncbn_t *b) {
  sn_syncbn_params_t p, q;
  ck_assert_int_eq(sn_syncbn_params(a, &p), SN_OK);
  ck_assert_int_eq(sn_syncbn_params(b, &q), SN_OK);
  size_t bytes = (size_t)p.num_features * sizeof(float);
  tu_assert_bitwise(p.weight, q.weight, bytes, "weight");
  tu_assert_bitwise(p.bias, q.bias, bytes, "bias");
  tu_assert_bitwise(p.running_mean, q.running_mean, bytes, "running_mean");
  tu_assert_bitwise(p.running_var, q.running_var, bytes, "running_var");
  ck_assert_int_eq(*p.num_batches_tracked, *q.num_batches_tracked);
}

START_TEST(test_roundtrip_several_layers) {
  char path[300];
  path_in(path, sizeof path, "model.safetensors");
  sn_syncbn_t *a[3] = {make_layer(3, 1.0f), make_layer(65, 2.0f), make_layer(1, 3.0f)};
  sn_syncbn_t *b[3] = {make_layer(3, 9.0f), make_layer(65, 9.0f), make_layer(1, 9.0f)};
  const char *prefixes[3] = {"bn1", "layer1.0.bn2", "head.bn"};
  ck_assert_int_eq(sn_syncbn_save(path, a, prefixes, 3), SN_OK);
  ck_assert_int_eq(sn_syncbn_load(path, b, prefixes, 3), SN_OK);
  for (int i = 0; i < 3; i++) assert_same_state(a[i], b[i]);
  /* the file lists PyTorch's state_dict keys, num_batches_tracked as an I64 scalar */
  sn_safetensors_t *f = NULL;
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_OK);
  ck_assert_int_eq(sn_safetensors_count(f), 15);
  sn_tensor_t t;
  ck_assert_int_eq(sn_safetensors_get(f, &t, "layer1.0.bn2.running_var"), SN_OK);
  ck_assert(t.dtype == SN_DTYPE_F32 && !t.is_i64 && t.ndim == 1 && t.shape[0] == 65);
  ck_assert_int_eq(sn_safetensors_get(f, &t, "head.bn.num_batches_tracked"), SN_OK);
  ck_assert(t.is_i64 && t.ndim == 0);
  int64_t nbt;
  memcpy(&nbt, t.data, 8);
  ck_assert_int_eq(nbt, 3007);
  ck_assert_int_eq(sn_safetensors_get(f, &t, "bn1.missing"), SN_ERR_NOT_FOUND);
  sn_safetensors_free(f);
  /* no temporary file is left behind */
  ck_assert_int_eq(temp_files_left(), 0);
  /* one layer under two prefixes: a clear error, the file on disk unchanged */
  sn_syncbn_t *twice[2] = {a[0], a[0]};
  const char *two[2] = {"x", "y"};
  ck_assert_int_eq(sn_syncbn_save(path, twice, two, 2), SN_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sn_last_error(), "same layer"));
  /* and loading one layer twice (refused, not the last one winning), the layer
   * unchanged */
  sn_syncbn_t *twice_b[2] = {b[0], b[0]};
  const char *two_saved[2] = {prefixes[0], prefixes[0]};
  sn_syncbn_params_t before;
  ck_assert_int_eq(sn_syncbn_params(b[0], &before), SN_OK);
  const float rm0 = before.running_mean[0];
  ck_assert_int_eq(sn_syncbn_load(path, twice_b, two_saved, 2), SN_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sn_last_error(), "same layer"));
  ck_assert(before.running_mean[0] == rm0);
  ck_assert_int_eq(sn_syncbn_load(path, b, prefixes, 3), SN_OK);
  for (int i = 0; i < 3; i++) assert_same_state(a[i], b[i]);
  for (int i = 0; i < 3; i++) sn_syncbn_destroy(a[i]), sn_syncbn_destroy(b[i]);
}
END_TEST

START_TEST(test_generic_tensors_roundtrip) {
  char path[300];
  path_in(path, sizeof path, "t.safetensors");
  float w[6] = {1, 2, 3, 4, 5, 6};
  uint16_t h[3] = {0x3f80, 0x4000, 0xc040};
  double d[2] = {1e300, -2.5};
  int64_t s = -42;
  sn_tensor_t ts[4] = {
      {"conv.weight", SN_DTYPE_F32, 0, 4, {1, 2, 3, 1}, w},
      {"h", SN_DTYPE_BF16, 0, 1, {3}, h},
      {"d", SN_DTYPE_F64, 0, 2, {2, 1}, d},
      {"step", SN_DTYPE_F32, 1, 0, {0}, &s},
  };
  ck_assert_int_eq(sn_safetensors_save(path, ts, 4), SN_OK);
  sn_safetensors_t *f = NULL;
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_OK);
  const void *want[4] = {w, h, d, &s};
  size_t bytes[4] = {sizeof w, sizeof h, sizeof d, sizeof s};
  for (int i = 0; i < 4; i++) {
    sn_tensor_t t;
    ck_assert_int_eq(sn_safetensors_get(f, &t, ts[i].name), SN_OK);
    ck_assert_int_eq(t.ndim, ts[i].ndim);
    for (int k = 0; k < t.ndim; k++) ck_assert_int_eq(t.shape[k], ts[i].shape[k]);
    ck_assert_int_eq(t.is_i64, ts[i].is_i64);
    tu_assert_bitwise(t.data, want[i], bytes[i], ts[i].name);
  }
  sn_safetensors_free(f);
  /* the header length is a multiple of 8 and every tensor starts aligned to its element size */
  long size;
  unsigned char *b = read_file(path, &size);
  uint64_t hl = 0;
  for (int k = 0; k < 8; k++) hl |= (uint64_t)b[k] << (8 * k);
  ck_assert_int_eq(hl % 8, 0);
  free(b);
  /* duplicates and bad names are refused */
  sn_tensor_t dup[2] = {ts[0], ts[0]};
  ck_assert_int_eq(sn_safetensors_save(path, dup, 2), SN_ERR_INVALID_ARGUMENT);
  sn_tensor_t bad = ts[0];
  bad.name = "__metadata__";
  ck_assert_int_eq(sn_safetensors_save(path, &bad, 1), SN_ERR_INVALID_ARGUMENT);
  bad.name = "x";
  bad.ndim = 9;
  ck_assert_int_eq(sn_safetensors_save(path, &bad, 1), SN_ERR_INVALID_ARGUMENT);
  /* a negative dimension is a bad shape (as documented), an overflowing product an overflow */
  bad.ndim = 2;
  bad.shape[0] = 3, bad.shape[1] = -2;
  ck_assert_int_eq(sn_safetensors_save(path, &bad, 1), SN_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(sn_last_error(), "shape[1] = -2") != NULL, "%s", sn_last_error());
  bad.shape[0] = INT64_MAX / 2, bad.shape[1] = 4;
  ck_assert_int_eq(sn_safetensors_save(path, &bad, 1), SN_ERR_OVERFLOW);
}
END_TEST

/* A process that dies while saving (here by SIGXFSZ: its file-size limit is reached in the middle
 * of the data) leaves the previous file as it was and, where the file system has O_TMPFILE, no
 * temporary file either (sn_safetensors_save writes an unnamed file first). */
START_TEST(test_crash_while_saving) {
  char path[300];
  path_in(path, sizeof path, "crash.safetensors");
  float old[4] = {1, 2, 3, 4};
  sn_tensor_t t_old = {"w", SN_DTYPE_F32, 0, 1, {4}, old};
  ck_assert_int_eq(sn_safetensors_save(path, &t_old, 1), SN_OK);
  long old_size;
  unsigned char *before = read_file(path, &old_size);

  enum { BIG = 1 << 20 }; /* 4 MiB of f32, beyond the child's 256 KiB limit */
  float *big = calloc(BIG, sizeof(float));
  ck_assert_ptr_nonnull(big);
  fflush(NULL);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    const struct rlimit fsize = {256 << 10, 256 << 10}, core = {0, 0};
    setrlimit(RLIMIT_FSIZE, &fsize);
    setrlimit(RLIMIT_CORE, &core);
    signal(SIGXFSZ, SIG_DFL);
    sn_tensor_t t_big = {"w", SN_DTYPE_F32, 0, 1, {BIG}, big};
    sn_safetensors_save(path, &t_big, 1);
    _exit(0); /* not reached: the save dies of SIGXFSZ */
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ,
                "the child was to die of SIGXFSZ while saving (status 0x%x)", (unsigned)status);
  free(big);

  long size;
  unsigned char *after = read_file(path, &size);
  ck_assert_int_eq(size, old_size);
  tu_assert_bitwise(after, before, (size_t)size, "the previous file after a crashed save");
  free(before), free(after);

  /* nothing else in the directory, if the file system has O_TMPFILE */
  const int probe = open(dir, O_TMPFILE | O_WRONLY, 0600);
  if (probe < 0) return; /* the named route: "<path>.tmp.<pid>.<k>" stays, as documented */
  close(probe);
  DIR *dh = opendir(dir);
  ck_assert_ptr_nonnull(dh);
  int others = 0;
  for (struct dirent *e; (e = readdir(dh)) != NULL;)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
        strcmp(e->d_name, "crash.safetensors") != 0) {
      fprintf(stderr, "left behind: %s\n", e->d_name);
      others++;
    }
  closedir(dh);
  ck_assert_int_eq(others, 0);
}
END_TEST

/* File names of up to NAME_MAX bytes save, even where "<name>.tmp.<pid>.<k>" would be too long for
 * a name: two 250-byte names that differ only in their last byte, each loads back what was
 * saved, and nothing else is left in the directory. */
START_TEST(test_long_file_names) {
  char base[2][251], path[2][600];
  for (int k = 0; k < 2; k++) {
    memset(base[k], 'n', 250);
    base[k][250] = '\0';
    base[k][249] = (char)('0' + k);
    path_in(path[k], sizeof path[k], base[k]);
  }
  float v[2][3] = {{1, 2, 3}, {4, 5, 6}};
  for (int k = 0; k < 2; k++) {
    sn_tensor_t t = {"w", SN_DTYPE_F32, 0, 1, {3}, v[k]};
    ck_assert_msg(sn_safetensors_save(path[k], &t, 1) == SN_OK, "%s", sn_last_error());
  }
  for (int k = 0; k < 2; k++) {
    sn_safetensors_t *f = NULL;
    ck_assert_int_eq(sn_safetensors_load(&f, path[k]), SN_OK);
    sn_tensor_t t;
    ck_assert_int_eq(sn_safetensors_get(f, &t, "w"), SN_OK);
    ck_assert(t.ndim == 1 && t.shape[0] == 3);
    float got[3];
    memcpy(got, t.data, sizeof got);
    tu_assert_bitwise(got, v[k], sizeof v[k], "long name: loaded tensor");
    sn_safetensors_free(f);
  }
  DIR *dh = opendir(dir);
  ck_assert_ptr_nonnull(dh);
  int files = 0;
  for (struct dirent *e; (e = readdir(dh)) != NULL;)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      ck_assert_msg(strcmp(e->d_name, base[0]) == 0 || strcmp(e->d_name, base[1]) == 0,
                    "left behind: %s", e->d_name);
      files++;
    }
  closedir(dh);
  ck_assert_int_eq(files, 2);
}
END_TEST

/* Threads saving to one path at once (with "<path>.tmp.<pid>" as every save's temporary name,
 * each thread's unlink of a stale one would remove the other's link before its rename, and 8-17
 * of 600 saves would fail with SN_ERR_IO): every save succeeds, the file is then one thread's
 * tensor whole, and no temporary file is left. */
enum { CONC_THREADS = 3, CONC_SAVES = 150, CONC_ELEMS = 1000 };
typedef struct {
  const char *path;
  float v[CONC_ELEMS];
  int failed;
  char error[256];
} conc_t;
static void *conc_saver(void *arg) {
  conc_t *c = arg;
  sn_tensor_t t = {"w", SN_DTYPE_F32, 0, 1, {CONC_ELEMS}, c->v};
  for (int i = 0; i < CONC_SAVES; i++)
    if (sn_safetensors_save(c->path, &t, 1) != SN_OK && c->failed++ == 0)
      snprintf(c->error, sizeof c->error, "%s", sn_last_error());
  return NULL;
}
START_TEST(test_concurrent_saves) {
  char path[300];
  path_in(path, sizeof path, "shared.safetensors");
  static conc_t c[CONC_THREADS];
  pthread_t th[CONC_THREADS];
  for (int k = 0; k < CONC_THREADS; k++) {
    c[k].path = path, c[k].failed = 0;
    for (int i = 0; i < CONC_ELEMS; i++) c[k].v[i] = (float)(k * CONC_ELEMS + i);
    ck_assert_int_eq(pthread_create(&th[k], NULL, conc_saver, &c[k]), 0);
  }
  for (int k = 0; k < CONC_THREADS; k++) ck_assert_int_eq(pthread_join(th[k], NULL), 0);
  for (int k = 0; k < CONC_THREADS; k++)
    ck_assert_msg(c[k].failed == 0, "thread %d: %d of %d saves failed, first: %s", k, c[k].failed,
                  CONC_SAVES, c[k].error);
  sn_safetensors_t *f = NULL;
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_OK);
  sn_tensor_t t;
  ck_assert_int_eq(sn_safetensors_get(f, &t, "w"), SN_OK);
  ck_assert(t.ndim == 1 && t.shape[0] == CONC_ELEMS);
  float got[CONC_ELEMS];
  memcpy(got, t.data, sizeof got);
  sn_safetensors_free(f);
  const int k = (int)got[0] / CONC_ELEMS;
  ck_assert_msg(k >= 0 && k < CONC_THREADS, "first element %g", (double)got[0]);
  tu_assert_bitwise(got, c[k].v, sizeof got, "the file after concurrent saves: one thread's");
  ck_assert_int_eq(temp_files_left(), 0);
}
END_TEST

/* A failed save leaves the previous file as it was. */
START_TEST(test_failed_save_keeps_old_file) {
  char path[300];
  path_in(path, sizeof path, "keep.safetensors");
  sn_syncbn_t *a = make_layer(4, 1.0f);
  const char *pre[1] = {"bn"};
  ck_assert_int_eq(sn_syncbn_save(path, &a, pre, 1), SN_OK);
  long s0;
  unsigned char *before = read_file(path, &s0);
  /* a directory where the file should go makes rename fail; a missing directory makes open fail */
  char sub[300];
  path_in(sub, sizeof sub, "adir");
  ck_assert_int_eq(mkdir(sub, 0700), 0);
  ck_assert_int_eq(sn_syncbn_save(sub, &a, pre, 1), SN_ERR_IO);
  ck_assert_int_eq(sn_syncbn_save("/nonexistent-dir/x.safetensors", &a, pre, 1), SN_ERR_IO);
  ck_assert_msg(strstr(sn_last_error(), "nonexistent-dir") != NULL, "%s", sn_last_error());
  long s1;
  unsigned char *after = read_file(path, &s1);
  ck_assert_int_eq(s0, s1);
  tu_assert_bitwise(before, after, (size_t)s0, "checkpoint after failed saves");
  free(before), free(after);
  sn_syncbn_destroy(a);
}
END_TEST

/* Every truncation of a valid file is refused with SN_ERR_FORMAT; nothing crashes. */
START_TEST(test_truncated_files_rejected) {
  char path[300], cut[300];
  path_in(path, sizeof path, "full.safetensors");
  path_in(cut, sizeof cut, "cut.safetensors");
  sn_syncbn_t *a = make_layer(5, 1.0f), *b = make_layer(5, 4.0f), *ref = make_layer(5, 4.0f);
  const char *pre[1] = {"bn"};
  ck_assert_int_eq(sn_syncbn_save(path, &a, pre, 1), SN_OK);
  long size;
  unsigned char *bytes = read_file(path, &size);
  for (long len = 0; len < size; len++) {
    write_file(cut, bytes, len);
    sn_safetensors_t *f = (sn_safetensors_t *)0x1;
    sn_status_t st = sn_safetensors_load(&f, cut);
    ck_assert_msg(st == SN_ERR_FORMAT, "truncated to %ld of %ld bytes: %s (%s)", len, size,
                  sn_status_string(st), sn_last_error());
    ck_assert_ptr_eq(f, (sn_safetensors_t *)0x1); /* output untouched */
    ck_assert_int_eq(sn_syncbn_load(cut, &b, pre, 1), SN_ERR_FORMAT);
  }
  assert_same_state(b, ref); /* nothing was loaded from any broken file */
  ck_assert_int_eq(sn_syncbn_load("/nonexistent/file", &b, pre, 1), SN_ERR_IO);
  free(bytes);
  sn_syncbn_destroy(a), sn_syncbn_destroy(b), sn_syncbn_destroy(ref);
}
END_TEST

/* Hand-made corrupt headers: each is refused with SN_ERR_FORMAT and a reason. */
START_TEST(test_corrupt_headers_rejected) {
  char path[300];
  path_in(path, sizeof path, "bad.safetensors");
  float data[4] = {1, 2, 3, 4};
  static const struct { const char *header; size_t data_len; const char *why; } cases[] = {
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}", 16, "JSON"},
      {"[1,2,3]", 0, "object"},
      {"{\"a\":{\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "dtype"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[0,16]}}", 16, "data bytes"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,32]}}", 16, "outside"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, "overlap"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "trailing"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16, "shape"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, "data_offsets"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "JSON"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,16]}}", 16, "overflow"},
      {"{\"__metadata__\":3}", 0, "__metadata__"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_st(path, cases[i].header, data, cases[i].data_len);
    sn_safetensors_t *f = NULL;
    sn_status_t st = sn_safetensors_load(&f, path);
    ck_assert_msg(st == SN_ERR_FORMAT, "case %zu (%s): %s", i, cases[i].why, sn_status_string(st));
    ck_assert_msg(strstr(sn_last_error(), cases[i].why) != NULL, "case %zu: message '%s' lacks '%s'", i,
                  sn_last_error(), cases[i].why);
    ck_assert_ptr_null(f);
  }
  /* a header length larger than the file */
  unsigned char b[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
  write_file(path, b, 16);
  sn_safetensors_t *f = NULL;
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_ERR_FORMAT);
  /* and the valid minimal file is accepted */
  write_st(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16);
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_OK);
  sn_safetensors_free(f);
  /* a zero-size tensor at the offset where another starts is valid in either header order */
  static const char *const zero_size[2] = {
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}"};
  for (int k = 0; k < 2; k++) {
    write_st(path, zero_size[k], data, 16);
    f = NULL;
    sn_status_t st = sn_safetensors_load(&f, path);
    ck_assert_msg(st == SN_OK, "zero-size tensor, order %d: %s", k, sn_last_error());
    ck_assert_int_eq(sn_safetensors_count(f), 2);
    ck_assert_str_eq(sn_safetensors_name(f, 0), "a");
    ck_assert_str_eq(sn_safetensors_name(f, 1), "b");
    sn_safetensors_free(f);
  }
}
END_TEST

/* A file may hold tensors of the format's dtypes that sn_tensor_t cannot describe (a model's
 * token ids, masks): it loads, lists them, and refuses only those in sn_safetensors_get, so the
 * BatchNorm layers of such a file load (one I32 tensor must not block the whole file). */
START_TEST(test_other_dtypes_listed) {
  char path[300];
  path_in(path, sizeof path, "mixed.safetensors");
  unsigned char data[52] = {0};
  const float w[2] = {1.5f, 2.5f}, b[2] = {-1.0f, 0.25f}, rm[2] = {0.5f, -0.5f}, rv[2] = {2.0f, 3.0f};
  const int64_t nbt = 7;
  const int32_t ids[3] = {1, 2, 3};
  memcpy(data, w, 8), memcpy(data + 8, b, 8), memcpy(data + 16, rm, 8), memcpy(data + 24, rv, 8);
  memcpy(data + 32, &nbt, 8), memcpy(data + 40, ids, 12);
  static const char head[] =
      "{\"bn.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"bn.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"bn.running_mean\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
      "\"bn.running_var\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]},"
      "\"bn.num_batches_tracked\":{\"dtype\":\"%s\",\"shape\":[],\"data_offsets\":[32,40]},"
      "\"tok.ids\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[40,52]}}";
  char header[1024];
  snprintf(header, sizeof header, head, "I64");
  write_st(path, header, data, sizeof data);
  sn_safetensors_t *f = NULL;
  ck_assert_msg(sn_safetensors_load(&f, path) == SN_OK, "%s", sn_last_error());
  ck_assert_int_eq(sn_safetensors_count(f), 6);
  ck_assert_str_eq(sn_safetensors_name(f, 5), "tok.ids");
  sn_tensor_t t, keep;
  memset(&t, 0x5a, sizeof t);
  keep = t;
  ck_assert_int_eq(sn_safetensors_get(f, &t, "tok.ids"), SN_ERR_INVALID_DTYPE);
  ck_assert_msg(strstr(sn_last_error(), "I32") != NULL, "%s", sn_last_error());
  ck_assert(memcmp(&t, &keep, sizeof t) == 0); /* untouched */
  ck_assert_int_eq(sn_safetensors_get(f, &t, "bn.num_batches_tracked"), SN_OK);
  ck_assert(t.is_i64 && t.ndim == 0);
  sn_safetensors_free(f);

  /* the layer loads from it */
  sn_syncbn_config_t cfg = sn_syncbn_default_config(2);
  sn_syncbn_t *layer = NULL;
  ck_assert_int_eq(sn_syncbn_create(&layer, &cfg, NULL), SN_OK);
  const char *pre[1] = {"bn"};
  ck_assert_msg(sn_syncbn_load(path, &layer, pre, 1) == SN_OK, "%s", sn_last_error());
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(layer, &p), SN_OK);
  ck_assert(memcmp(p.weight, w, 8) == 0 && memcmp(p.bias, b, 8) == 0);
  ck_assert(memcmp(p.running_mean, rm, 8) == 0 && memcmp(p.running_var, rv, 8) == 0);
  ck_assert_int_eq(*p.num_batches_tracked, 7);

  /* one of the layer's own tensors in such a dtype: SN_ERR_FORMAT naming it, nothing loaded */
  snprintf(header, sizeof header, head, "U64");
  write_st(path, header, data, sizeof data);
  sn_syncbn_t *ref = NULL;
  ck_assert_int_eq(sn_syncbn_create(&ref, &cfg, NULL), SN_OK);
  ck_assert_int_eq(sn_syncbn_load(path, &ref, pre, 1), SN_ERR_FORMAT);
  ck_assert_msg(strstr(sn_last_error(), "bn.num_batches_tracked") && strstr(sn_last_error(), "U64"),
                "%s", sn_last_error());
  sn_syncbn_params_t q;
  ck_assert_int_eq(sn_syncbn_params(ref, &q), SN_OK);
  ck_assert_int_eq(*q.num_batches_tracked, 0);

  /* sizes are validated for them too, and a dtype the format lacks is refused */
  write_st(path, "{\"a\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, 8);
  f = NULL;
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_ERR_FORMAT);
  ck_assert_msg(strstr(sn_last_error(), "data bytes") != NULL, "%s", sn_last_error());
  write_st(path, "{\"a\":{\"dtype\":\"I128\",\"shape\":[1],\"data_offsets\":[0,16]}}", data, 16);
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_ERR_FORMAT);
  ck_assert_ptr_null(f);
  /* packed sub-byte dtypes: 4 F4 values are 2 bytes; 3 are 12 bits, not whole bytes */
  write_st(path, "{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]},"
                 "\"b\":{\"dtype\":\"F8_E8M0\",\"shape\":[2],\"data_offsets\":[2,4]},"
                 "\"c\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[4,7]}}",
           data, 7);
  ck_assert_msg(sn_safetensors_load(&f, path) == SN_OK, "%s", sn_last_error());
  ck_assert_int_eq(sn_safetensors_count(f), 3);
  ck_assert_int_eq(sn_safetensors_get(f, &t, "a"), SN_ERR_INVALID_DTYPE);
  sn_safetensors_free(f);
  f = NULL;
  write_st(path, "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", data, 2);
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_ERR_FORMAT);
  ck_assert_ptr_null(f);
  sn_syncbn_destroy(layer), sn_syncbn_destroy(ref);
}
END_TEST

/* Loading into layers: wrong C or dtype is SN_ERR_FORMAT, a missing key SN_ERR_NOT_FOUND, and a
 * multi-layer load with one bad layer changes none. */
START_TEST(test_load_validation_all_or_nothing) {
  char path[300];
  path_in(path, sizeof path, "m.safetensors");
  sn_syncbn_t *a[2] = {make_layer(3, 1.0f), make_layer(4, 2.0f)};
  const char *pre[2] = {"bn1", "bn2"};
  ck_assert_int_eq(sn_syncbn_save(path, a, pre, 2), SN_OK);
  sn_syncbn_t *b[2] = {make_layer(3, 7.0f), make_layer(5, 7.0f)}; /* bn2 has C = 5, not 4 */
  sn_syncbn_t *ref0 = make_layer(3, 7.0f);
  ck_assert_int_eq(sn_syncbn_load(path, b, pre, 2), SN_ERR_FORMAT);
  ck_assert_msg(strstr(sn_last_error(), "bn2.weight") != NULL, "%s", sn_last_error());
  assert_same_state(b[0], ref0); /* bn1 is valid, but was not loaded alone */
  const char *missing[2] = {"bn1", "bn9"};
  ck_assert_int_eq(sn_syncbn_load(path, a, missing, 2), SN_ERR_NOT_FOUND);
  /* a layer without affine or running stats loads only what it has */
  sn_syncbn_config_t cfg = sn_syncbn_default_config(3);
  cfg.affine = 0;
  sn_syncbn_t *plain = NULL;
  ck_assert_int_eq(sn_syncbn_create(&plain, &cfg, NULL), SN_OK);
  ck_assert_int_eq(sn_syncbn_load(path, &plain, pre, 1), SN_OK);
  sn_syncbn_params_t p;
  ck_assert_int_eq(sn_syncbn_params(plain, &p), SN_OK);
  ck_assert_ptr_null(p.weight);
  ck_assert(p.running_var[2] == 1.0f + 4.0f && *p.num_batches_tracked == 1007);
  sn_syncbn_destroy(plain), sn_syncbn_destroy(ref0);
  for (int i = 0; i < 2; i++) sn_syncbn_destroy(a[i]), sn_syncbn_destroy(b[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("safetensors");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_roundtrip_several_layers);
  tcase_add_test(tc, test_generic_tensors_roundtrip);
  tcase_add_test(tc, test_failed_save_keeps_old_file);
  tcase_add_test(tc, test_crash_while_saving);
  tcase_add_test(tc, test_long_file_names);
  tcase_add_test(tc, test_concurrent_saves);
  tcase_add_test(tc, test_truncated_files_rejected);
  tcase_add_test(tc, test_corrupt_headers_rejected);
  tcase_add_test(tc, test_load_validation_all_or_nothing);
  tcase_add_test(tc, test_other_dtypes_listed);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
