/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors checkpoint loader (dist/checkpoint.c).
 *
 * The fuzz input is the file. It is written to an in-memory file (memfd) and loaded with
 * sn_safetensors_load. A load must either fail with SN_ERR_FORMAT (the only status bad bytes can
 * cause) or succeed with a table that keeps every promise of syncnorm_dist.h:
 *  - names: unique, non-NULL for 0 <= i < count, NULL outside; each found by sn_safetensors_get,
 *    or refused with SN_ERR_INVALID_DTYPE (a dtype sn_tensor_t cannot describe), *tensor
 *    untouched; such a tensor's size is unknown here, so the data-order and coverage checks and
 *    the round trip stop at the first one;
 *  - each tensor: ndim 0..8, shape >= 0, data readable for product(shape) elements (ASan checks
 *    every byte), and the tensors cover the data region exactly (sum of their bytes = file size
 *    − 8 − header length);
 *  - an unknown name gives SN_ERR_NOT_FOUND, NULL arguments SN_ERR_NULL_POINTER;
 *  - sn_syncbn_load_state from the file either succeeds or leaves the layer unchanged;
 *  - saving the loaded tensors (when their names are savable) and loading the result back gives
 *    the same tensors (dtype, shape, bytes).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "syncnorm_dist.h"

int fuzz_safetensors_one(const uint8_t *data, size_t size);

static int64_t tensor_elem_size(const sn_tensor_t *t) {
  return t->is_i64 ? 8 : sn_dtype_size(t->dtype);
}

static int64_t tensor_bytes(const sn_tensor_t *t) {
  int64_t n = 1;
  for (int k = 0; k < t->ndim; k++) n *= t->shape[k]; /* bounded: the loader checked it */
  return n * tensor_elem_size(t);
}

static uint64_t header_len(const uint8_t *data, size_t size) {
  uint64_t h = 0;
  for (int k = 0; k < 8 && (size_t)k < size; k++) h |= (uint64_t)data[k] << (8 * k);
  return h;
}

/* A name sn_safetensors_save accepts: 1..255 bytes, no control character, not "__metadata__". */
static int savable_name(const char *name) {
  size_t len = strlen(name);
  if (len == 0 || len > 255 || strcmp(name, "__metadata__") == 0) return 0;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)name[i] < 0x20) return 0;
  return 1;
}

/* Snapshot of a layer's host state, to check that a failed load changed nothing. */
static void layer_state(sn_syncbn_t *bn, int64_t C, float *out /* [4C] */, int64_t *nbt) {
  sn_syncbn_params_t p;
  FUZZ_CHECK(sn_syncbn_params(bn, &p) == SN_OK, "%s", sn_last_error());
  memcpy(out, p.weight, (size_t)C * sizeof(float));
  memcpy(out + C, p.bias, (size_t)C * sizeof(float));
  memcpy(out + 2 * C, p.running_mean, (size_t)C * sizeof(float));
  memcpy(out + 3 * C, p.running_var, (size_t)C * sizeof(float));
  *nbt = *p.num_batches_tracked;
}

/* Loads the file's "<prefix>.*" into a fresh layer whose C is taken from the tensor `name`. */
static void try_load_state(const sn_safetensors_t *f, const char *name, const sn_tensor_t *t) {
  if (t->ndim != 1 || t->shape[0] < 1 || t->shape[0] > 4096) return;
  const int64_t C = t->shape[0];
  char prefix[256];
  snprintf(prefix, sizeof prefix, "%s", name);
  char *dot = strrchr(prefix, '.');
  if (dot != NULL) *dot = '\0';
  else prefix[0] = '\0';
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  sn_syncbn_t *bn = NULL;
  FUZZ_CHECK(sn_syncbn_create(&bn, &cfg, NULL) == SN_OK, "%s", sn_last_error());
  float *before = malloc((size_t)(4 * C) * sizeof(float)), *after = malloc((size_t)(4 * C) * sizeof(float));
  FUZZ_CHECK(before != NULL && after != NULL, "out of memory");
  int64_t nbt0, nbt1;
  layer_state(bn, C, before, &nbt0);
  sn_status_t st = sn_syncbn_load_state(bn, f, prefix);
  FUZZ_CHECK(st == SN_OK || st == SN_ERR_NOT_FOUND || st == SN_ERR_FORMAT ||
                 (st == SN_ERR_INVALID_ARGUMENT && strlen(prefix) > 200),
             "sn_syncbn_load_state: %s (%s)", sn_status_string(st), sn_last_error());
  layer_state(bn, C, after, &nbt1);
  if (st != SN_OK) {
    FUZZ_CHECK(memcmp(before, after, (size_t)(4 * C) * sizeof(float)) == 0 && nbt0 == nbt1,
               "a failed sn_syncbn_load_state changed the layer");
  } else {
    /* the layer now holds exactly the file's tensors */
    sn_tensor_t w;
    char full[300];
    snprintf(full, sizeof full, "%s%sweight", prefix, prefix[0] ? "." : "");
    FUZZ_CHECK(sn_safetensors_get(f, &w, full) == SN_OK, "loaded without '%s'", full);
    FUZZ_CHECK(memcmp(after, w.data, (size_t)C * sizeof(float)) == 0, "weight differs from the file");
    /* a forward on the loaded layer must not crash, whatever the stored values */
    float x[6] = {1.0f, -2.0f, 0.5f, 3.0f, 0.0f, 7.0f};
    float *xin = malloc((size_t)(2 * C) * sizeof(float)), *y = malloc((size_t)(2 * C) * sizeof(float));
    FUZZ_CHECK(xin != NULL && y != NULL, "out of memory");
    for (int64_t i = 0; i < 2 * C; i++) xin[i] = x[i % 6];
    st = sn_syncbn_forward(bn, y, xin, 2, 1, 0); /* eval: running stats from the file */
    FUZZ_CHECK(st == SN_OK, "eval forward after load: %s", sn_last_error());
    st = sn_syncbn_forward(bn, y, xin, 2, 1, 1); /* training: pivot from the file's running mean */
    FUZZ_CHECK(st == SN_OK, "training forward after load: %s", sn_last_error());
    free(xin);
    free(y);
  }
  free(before);
  free(after);
  sn_syncbn_destroy(bn);
}

static char rt_dir[64];

static void remove_rt_dir(void) {
  if (strcmp(rt_dir, "/tmp") != 0) rmdir(rt_dir);
}

/* Saves every tensor of f to a real file and loads it back: the same tensors must come back. */
static void round_trip(const sn_safetensors_t *f, int64_t count) {
  char *dir = rt_dir;
  if (dir[0] == '\0') {
    snprintf(rt_dir, sizeof rt_dir, "/dev/shm/sn_fuzz_st_%ld", (long)getpid());
    if (mkdir(rt_dir, 0700) != 0 && errno != EEXIST) snprintf(rt_dir, sizeof rt_dir, "/tmp");
    atexit(remove_rt_dir);
  }
  char path[128];
  snprintf(path, sizeof path, "%s/rt_%ld.safetensors", dir, (long)getpid());
  sn_tensor_t *ts = calloc((size_t)(count > 0 ? count : 1), sizeof *ts);
  FUZZ_CHECK(ts != NULL, "out of memory");
  for (int64_t i = 0; i < count; i++) {
    const char *name = sn_safetensors_name(f, i);
    FUZZ_CHECK(sn_safetensors_get(f, &ts[i], name) == SN_OK, "%s", sn_last_error());
    if (!savable_name(name)) {
      free(ts);
      return;
    }
  }
  sn_status_t st = sn_safetensors_save(path, ts, count);
  FUZZ_CHECK(st == SN_OK, "re-saving a loaded file: %s (%s)", sn_status_string(st), sn_last_error());
  sn_safetensors_t *g = NULL;
  st = sn_safetensors_load(&g, path);
  FUZZ_CHECK(st == SN_OK, "loading a re-saved file: %s (%s)", sn_status_string(st), sn_last_error());
  FUZZ_CHECK(sn_safetensors_count(g) == count, "count %lld after round trip, was %lld",
             (long long)sn_safetensors_count(g), (long long)count);
  for (int64_t i = 0; i < count; i++) {
    sn_tensor_t u;
    FUZZ_CHECK(sn_safetensors_get(g, &u, ts[i].name) == SN_OK, "'%s' lost in the round trip", ts[i].name);
    FUZZ_CHECK(u.dtype == ts[i].dtype && u.is_i64 == ts[i].is_i64 && u.ndim == ts[i].ndim,
               "'%s' changed type in the round trip", ts[i].name);
    FUZZ_CHECK(memcmp(u.shape, ts[i].shape, (size_t)u.ndim * sizeof(int64_t)) == 0,
               "'%s' changed shape in the round trip", ts[i].name);
    FUZZ_CHECK(memcmp(u.data, ts[i].data, (size_t)tensor_bytes(&u)) == 0,
               "'%s' changed data in the round trip", ts[i].name);
  }
  sn_safetensors_free(g);
  unlink(path);
  free(ts);
}

int fuzz_safetensors_one(const uint8_t *data, size_t size) {
  static int fd = -1;
  if (fd < 0) fd = fz_memfd("sn_fuzz_safetensors");
  FUZZ_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
  char path[64];
  FUZZ_CHECK(fz_memfd_set(fd, data, size, path, sizeof path) == 0, "writing the memfd failed");

  sn_safetensors_t *f = NULL;
  sn_status_t st = sn_safetensors_load(&f, path);
  if (st != SN_OK) {
    FUZZ_CHECK(st == SN_ERR_FORMAT, "load: %s (%s)", sn_status_string(st), sn_last_error());
    FUZZ_CHECK(f == NULL, "load failed but set *file");
    FUZZ_CHECK(strncmp(sn_last_error(), "sn_safetensors_load: ", 21) == 0, "message '%s'",
               sn_last_error());
    return 0;
  }
  FUZZ_CHECK(f != NULL, "load succeeded without a handle");
  const int64_t count = sn_safetensors_count(f);
  FUZZ_CHECK(count >= 0, "count %lld", (long long)count);
  FUZZ_CHECK(sn_safetensors_name(f, -1) == NULL && sn_safetensors_name(f, count) == NULL,
             "name() out of range is not NULL");

  int64_t covered = 0;
  int opaque = 0; /* a tensor of a dtype get refuses was seen */
  for (int64_t i = 0; i < count; i++) {
    const char *name = sn_safetensors_name(f, i);
    FUZZ_CHECK(name != NULL, "name(%lld) is NULL", (long long)i);
    for (int64_t j = 0; j < i; j++)
      FUZZ_CHECK(strcmp(name, sn_safetensors_name(f, j)) != 0, "duplicate name '%s'", name);
    sn_tensor_t t, poison;
    memset(&t, 0xa5, sizeof t);
    poison = t;
    st = sn_safetensors_get(f, &t, name);
    if (st == SN_ERR_INVALID_DTYPE) {
      FUZZ_CHECK(memcmp(&t, &poison, sizeof t) == 0, "get('%s') refused it but wrote *tensor", name);
      FUZZ_CHECK(strstr(sn_last_error(), "does not read") != NULL, "message '%s'", sn_last_error());
      opaque = 1;
      continue;
    }
    FUZZ_CHECK(st == SN_OK, "get('%s'): %s", name, sn_last_error());
    FUZZ_CHECK(t.name != NULL && strcmp(t.name, name) == 0, "tensor name differs");
    FUZZ_CHECK(t.ndim >= 0 && t.ndim <= 8, "ndim %d", t.ndim);
    FUZZ_CHECK(t.is_i64 == 0 || t.is_i64 == 1, "is_i64 %d", t.is_i64);
    FUZZ_CHECK(tensor_elem_size(&t) > 0, "dtype %d", (int)t.dtype);
    for (int k = 0; k < t.ndim; k++) FUZZ_CHECK(t.shape[k] >= 0, "shape[%d] %lld", k, (long long)t.shape[k]);
    const int64_t bytes = tensor_bytes(&t);
    FUZZ_CHECK(bytes >= 0 && bytes <= (int64_t)size, "tensor '%s' of %lld bytes in a %zu-byte file", name,
               (long long)bytes, size);
    FUZZ_CHECK(bytes == 0 || t.data != NULL, "NULL data");
    /* names come in data order: tensor i is the bytes after tensors 0..i-1 of the data region
     * (compared byte by byte: ASan checks the pointer covers them) */
    const uint64_t data_at = 8 + header_len(data, size);
    if (!opaque) {
      FUZZ_CHECK((uint64_t)covered + (uint64_t)bytes <= size - data_at, "tensor '%s' past the end",
                 name);
      FUZZ_CHECK(bytes == 0 || memcmp(t.data, data + data_at + covered, (size_t)bytes) == 0,
                 "tensor '%s' is not the file's bytes at its place in data order", name);
    }
    covered += bytes;
    if (i == 0) try_load_state(f, name, &t);
  }
  /* the tensors cover the data region exactly */
  const uint64_t hlen = header_len(data, size);
  FUZZ_CHECK(opaque || covered == (int64_t)(size - 8 - hlen),
             "tensors cover %lld of %lld data bytes", (long long)covered,
             (long long)(size - 8 - hlen));

  sn_tensor_t t;
  FUZZ_CHECK(sn_safetensors_get(f, &t, NULL) == SN_ERR_NULL_POINTER, "get(NULL name)");
  FUZZ_CHECK(sn_safetensors_get(NULL, &t, "x") == SN_ERR_NULL_POINTER, "get(NULL file)");
  if (count > 0)
    FUZZ_CHECK(sn_safetensors_get(f, NULL, sn_safetensors_name(f, 0)) == SN_ERR_NULL_POINTER,
               "get(NULL tensor)");
  /* a name that cannot be in a valid file: longer than any JSON key we accept as a prefix */
  char missing[300];
  snprintf(missing, sizeof missing, "%s\x01missing", count > 0 ? sn_safetensors_name(f, 0) : "");
  st = sn_safetensors_get(f, &t, missing);
  FUZZ_CHECK(st == SN_ERR_NOT_FOUND || st == SN_OK, "get(missing): %s", sn_status_string(st));

  if (!opaque) round_trip(f, count);
  sn_safetensors_free(f);
  return 0;
}

#ifndef SN_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  return fuzz_safetensors_one(data, size);
}
#endif
