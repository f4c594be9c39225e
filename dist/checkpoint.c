/*
 * checkpoint.c — safetensors files: an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the raw little-endian data, offsets relative to its start, no holes, no overlap.
 * Spec: https://github.com/huggingface/safetensors (README, "Format"). JSON via jansson.
 *
 * Saving is atomic: write an unnamed file in path's directory (O_TMPFILE) or, where the file
 * system lacks that, "<path>.tmp.<pid>.<k>" (k: this process's count of saves); fsync; link the
 * unnamed file as "<path>.tmp.<pid>.<k>"; rename that over path; fsync the directory. A process
 * that dies while writing leaves nothing behind on the first route (the unnamed file goes with
 * it), its named file on the second.
 * Loading reads the whole file and validates every field before anything is handed out.
 */
#define _GNU_SOURCE /* O_TMPFILE, linkat's AT_SYMLINK_FOLLOW */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm_internal.h"

#define SN_ST_MAX_HEADER (100 * 1024 * 1024) /* the reference implementation's limit */
#define SN_ST_MAX_NAME 255
#define SN_ST_MAX_NDIM 8

typedef struct {
  char *name;
  sn_tensor_t t;
  int64_t begin, end; /* data offsets */
  const char *other;  /* the tag of a dtype sn_tensor_t cannot describe, or NULL */
  int64_t bits;       /* bits per element */
} st_entry_t;

struct sn_safetensors {
  unsigned char *bytes; /* the whole file */
  st_entry_t *entries;  /* sorted by data offset */
  int64_t count;
};

/* ---- dtypes ---------------------------------------------------------------------------------- */

static const char *dtype_tag(const sn_tensor_t *t) {
  if (t->is_i64) return "I64";
  switch (t->dtype) {
    case SN_DTYPE_F32: return "F32";
    case SN_DTYPE_BF16: return "BF16";
    case SN_DTYPE_F16: return "F16";
    case SN_DTYPE_F64: return "F64";
  }
  return NULL;
}

static int64_t elem_size(const sn_tensor_t *t) { return t->is_i64 ? 8 : sn_dtype_size(t->dtype); }

/* The safetensors dtypes (the reference implementation's list; sub-byte ones packed, so a
 * tensor's bits must fill whole bytes), with their bits per element. Those sn_tensor_t describes
 * (readable) carry its dtype and is_i64; a file may hold the others too (a model's integer,
 * boolean or quantized tensors) and is validated with them, and only sn_safetensors_get refuses
 * such a tensor. Any other tag makes the file SN_ERR_FORMAT: its sizes cannot be checked. */
typedef struct {
  const char *tag;
  int64_t bits;
  int readable;
  sn_dtype_t dtype;
  int is_i64;
} st_dtype_t;
static const st_dtype_t st_dtypes[] = {
    {"F32", 32, 1, SN_DTYPE_F32, 0}, {"BF16", 16, 1, SN_DTYPE_BF16, 0},
    {"F16", 16, 1, SN_DTYPE_F16, 0}, {"F64", 64, 1, SN_DTYPE_F64, 0},
    {"I64", 64, 1, SN_DTYPE_F64, 1}, {"BOOL", 8, 0, SN_DTYPE_F32, 0},
    {"U8", 8, 0, SN_DTYPE_F32, 0},   {"I8", 8, 0, SN_DTYPE_F32, 0},
    {"F8_E5M2", 8, 0, SN_DTYPE_F32, 0}, {"F8_E4M3", 8, 0, SN_DTYPE_F32, 0},
    {"F8_E8M0", 8, 0, SN_DTYPE_F32, 0}, {"I16", 16, 0, SN_DTYPE_F32, 0},
    {"U16", 16, 0, SN_DTYPE_F32, 0}, {"I32", 32, 0, SN_DTYPE_F32, 0},
    {"U32", 32, 0, SN_DTYPE_F32, 0}, {"U64", 64, 0, SN_DTYPE_F32, 0},
    {"C64", 64, 0, SN_DTYPE_F32, 0}, {"F4", 4, 0, SN_DTYPE_F32, 0},
    {"F6_E2M3", 6, 0, SN_DTYPE_F32, 0}, {"F6_E3M2", 6, 0, SN_DTYPE_F32, 0}};

/* The entry of tag in st_dtypes, or NULL. */
static const st_dtype_t *find_dtype(const char *tag) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(tag, st_dtypes[i].tag) == 0) return &st_dtypes[i];
  return NULL;
}

/* Elements of a shape, or −1 on overflow. */
static int64_t numel(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > (INT64_MAX / 8) / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

/* ---- saving ---------------------------------------------------------------------------------- */

static sn_status_t check_tensor(const char *fn, const sn_tensor_t *t, int64_t i, int64_t *bytes) {
  if (t->name == NULL) return sn__fail(SN_ERR_NULL_POINTER, "%s: tensors[%lld].name is NULL", fn, (long long)i);
  size_t len = strnlen(t->name, SN_ST_MAX_NAME + 1);
  if (len == 0 || len > SN_ST_MAX_NAME || strcmp(t->name, "__metadata__") == 0)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: tensors[%lld] has an empty, reserved or longer than %d bytes name",
                    fn, (long long)i, SN_ST_MAX_NAME);
  for (size_t k = 0; k < len; k++)
    if ((unsigned char)t->name[k] < 0x20)
      return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: tensor name '%s' has a control character", fn, t->name);
  if (dtype_tag(t) == NULL)
    return sn__fail(SN_ERR_INVALID_DTYPE, "%s: tensor '%s' has unsupported dtype %d", fn, t->name, (int)t->dtype);
  if (t->ndim < 0 || t->ndim > SN_ST_MAX_NDIM)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has ndim %d (0..%d)", fn, t->name, t->ndim, SN_ST_MAX_NDIM);
  for (int k = 0; k < t->ndim; k++)
    if (t->shape[k] < 0)
      return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has shape[%d] = %lld (< 0)", fn, t->name, k,
                      (long long)t->shape[k]);
  int64_t n = numel(t->shape, t->ndim);
  if (n < 0)
    return sn__fail(SN_ERR_OVERFLOW, "%s: tensor '%s' has a shape whose bytes overflow int64", fn, t->name);
  if (n > 0 && t->data == NULL)
    return sn__fail(SN_ERR_NULL_POINTER, "%s: tensor '%s' has NULL data", fn, t->name);
  *bytes = n * elem_size(t);
  return SN_OK;
}

static int by_alignment(const void *a, const void *b) {
  const sn_tensor_t *x = *(const sn_tensor_t *const *)a, *y = *(const sn_tensor_t *const *)b;
  int64_t ex = elem_size(x), ey = elem_size(y);
  if (ex != ey) return ex > ey ? -1 : 1; /* widest first: every tensor starts aligned */
  return x < y ? -1 : x > y; /* then in the caller's order (stable) */
}

/* Builds the padded JSON header; *order receives the tensors in data order. */
static sn_status_t build_header(const char *fn, const sn_tensor_t *tensors, int64_t count,
                                const sn_tensor_t **order, char **header, size_t *header_len) {
  for (int64_t i = 0; i < count; i++) order[i] = &tensors[i];
  qsort(order, (size_t)count, sizeof *order, by_alignment);
  json_t *root = json_object(), *meta = json_object();
  if (root == NULL || meta == NULL || json_object_set_new(meta, "format", json_string("pt")) ||
      json_object_set_new(root, "__metadata__", meta)) {
    json_decref(root);
    return sn__fail(SN_ERR_ALLOC, "%s: out of memory building the header", fn);
  }
  int64_t offset = 0;
  for (int64_t i = 0; i < count; i++) {
    const sn_tensor_t *t = order[i];
    int64_t bytes = numel(t->shape, t->ndim) * elem_size(t);
    json_t *shape = json_array(), *e = json_object();
    int bad = shape == NULL || e == NULL;
    for (int k = 0; !bad && k < t->ndim; k++) bad = json_array_append_new(shape, json_integer(t->shape[k]));
    bad = bad || json_object_set_new(e, "dtype", json_string(dtype_tag(t))) ||
          json_object_set_new(e, "shape", shape) ||
          json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)offset, (json_int_t)(offset + bytes)));
    if (bad || json_object_set_new(root, t->name, e)) {
      json_decref(root);
      return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: cannot encode tensor '%s' (invalid UTF-8 name?)", fn, t->name);
    }
    offset += bytes;
  }
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (text == NULL) return sn__fail(SN_ERR_ALLOC, "%s: out of memory encoding the header", fn);
  size_t len = strlen(text), padded = (len + 7) / 8 * 8; /* data starts 8-byte aligned */
  char *h = malloc(padded);
  if (h == NULL) {
    free(text);
    return sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  }
  memcpy(h, text, len);
  memset(h + len, ' ', padded - len); /* the spec allows trailing spaces */
  free(text);
  *header = h;
  *header_len = padded;
  return SN_OK;
}

static int write_all(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n; }

/* fsync the directory holding path, so the rename itself is durable. */
static void sync_dir(const char *path) {
  char *copy = strdup(path);
  if (copy == NULL) return;
  int fd = open(dirname(copy), O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  free(copy);
}

/* The error of a save that failed with errno err (the temporary file already removed). */
static sn_status_t save_failed(const char *fn, const char *path, int err) {
  return sn__fail(SN_ERR_IO, "%s: writing '%s' failed: %s (any previous file is unchanged)", fn,
                  path, strerror(err));
}

/* The file's bytes: the 8-byte header length, the header, the tensors' data in `order`; then
 * flushed and fsynced. Returns 0 with errno set on failure; f stays open. */
static int write_payload(FILE *f, const char *header, size_t header_len,
                         const sn_tensor_t *const *order, int64_t count) {
  unsigned char len8[8];
  for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)header_len >> (8 * k));
  int ok = write_all(f, len8, 8) && write_all(f, header, header_len);
  for (int64_t i = 0; ok && i < count; i++)
    ok = write_all(f, order[i]->data, (size_t)(numel(order[i]->shape, order[i]->ndim) * elem_size(order[i])));
  return ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
}

/* Saves started by this process so far: the last part of their temporary names. */
static atomic_uint_fast64_t saves_started;

/* The temporary name of a save: "<path>.tmp.<pid>.<k>" with k this process's count of saves
 * (so that threads saving to one path at once never share a temporary file: with the pid
 * alone each unlinked the other's link before renaming it, and one of the two saves failed; a
 * review), or, where that name's last component would exceed NAME_MAX (a valid path up to 255
 * bytes long, plus the suffix), its first bytes then ".<hash of the whole last
 * component>.tmp.<pid>.<k>", so that it stays a valid name and two long names with a common
 * start still differ. out holds plen + 64 bytes. */
static void temp_name(char *out, size_t size, const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash != NULL ? slash + 1 : path;
  char suffix[48];
  const int sl = snprintf(suffix, sizeof suffix, ".tmp.%ld.%llu", (long)getpid(),
                          (unsigned long long)atomic_fetch_add(&saves_started, 1));
  const size_t blen = strlen(base);
  if (blen + (size_t)sl <= NAME_MAX) {
    snprintf(out, size, "%s%s", path, suffix);
    return;
  }
  uint32_t h = 2166136261u; /* FNV-1a of the last component */
  for (size_t i = 0; i < blen; i++) h = (h ^ (unsigned char)base[i]) * 16777619u;
  const size_t keep = NAME_MAX - (size_t)sl - 9; /* 9: "." and 8 hex digits */
  snprintf(out, size, "%.*s.%08x%s", (int)((size_t)(base - path) + keep), path, (unsigned)h,
           suffix);
}

/* The unnamed route of sn_safetensors_save: the payload into an O_TMPFILE file in path's
 * directory, then linked as tmp (through /proc/self/fd) and renamed over path. Returns 0 where
 * that route is not available here (no O_TMPFILE on the file system, no /proc; nothing is left
 * behind, the caller takes the named route); else 1 with *st the outcome (SN_ERR_IO if writing,
 * closing or renaming failed, nothing left behind either). */
static int save_unnamed(const char *fn, const char *path, const char *tmp, const char *header,
                        size_t header_len, const sn_tensor_t *const *order, int64_t count,
                        sn_status_t *st) {
#ifdef O_TMPFILE
  char *copy = strdup(path);
  if (copy == NULL) return 0;
  const int fd = open(dirname(copy), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  free(copy);
  if (fd < 0) return 0; /* EOPNOTSUPP, EISDIR (old kernels) or any other: the named route */
  FILE *f = fdopen(fd, "wb");
  if (f == NULL) {
    close(fd);
    return 0;
  }
  int ok = write_payload(f, header, header_len, order, count), err = errno;
  if (ok) {
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fileno(f));
    unlink(tmp); /* a stale one of an earlier process with this pid and count */
    if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) != 0) {
      fclose(f); /* the unnamed file goes */
      return 0;
    }
  }
  if (fclose(f) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  if (!ok) {
    unlink(tmp); /* linked or not */
    *st = save_failed(fn, path, err);
    return 1;
  }
  sync_dir(path);
  *st = SN_OK;
  return 1;
#else
  (void)fn, (void)path, (void)tmp, (void)header, (void)header_len, (void)order, (void)count;
  (void)st;
  return 0;
#endif
}

sn_status_t sn_safetensors_save(const char *path, const sn_tensor_t *tensors, int64_t count) {
  const char *fn = "sn_safetensors_save";
  SN_TRY(sn__check_ptr(fn, "path", path));
  SN_TRY(sn__check_size(fn, "count", count, 0));
  if (count > 0) SN_TRY(sn__check_ptr(fn, "tensors", tensors));
  int64_t total = 0;
  for (int64_t i = 0; i < count; i++) {
    int64_t bytes = 0;
    SN_TRY(check_tensor(fn, &tensors[i], i, &bytes));
    if (bytes > INT64_MAX / 2 - total) return sn__fail(SN_ERR_OVERFLOW, "%s: total size overflows", fn);
    total += bytes;
    for (int64_t j = 0; j < i; j++)
      if (strcmp(tensors[i].name, tensors[j].name) == 0)
        return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: duplicate tensor name '%s'", fn, tensors[i].name);
  }
  const sn_tensor_t **order = malloc((size_t)(count > 0 ? count : 1) * sizeof *order);
  if (order == NULL) return sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  char *header = NULL;
  size_t header_len = 0;
  sn_status_t st = build_header(fn, tensors, count, order, &header, &header_len);
  if (st != SN_OK) {
    free(order);
    return st;
  }
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 64);
  FILE *f = NULL;
  if (tmp == NULL) {
    st = sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
    goto done;
  }
  temp_name(tmp, plen + 64, path);
  if (save_unnamed(fn, path, tmp, header, header_len, order, count, &st)) goto done;
  f = fopen(tmp, "wb");
  if (f == NULL) {
    st = sn__fail(SN_ERR_IO, "%s: cannot create '%s': %s", fn, tmp, strerror(errno));
    goto done;
  }
  int ok = write_payload(f, header, header_len, order, count);
  int err = errno;
  if (fclose(f) != 0 && ok) {
    ok = 0;
    err = errno;
  }
  if (!ok || rename(tmp, path) != 0) {
    if (ok) err = errno;
    unlink(tmp);
    st = save_failed(fn, path, err);
    goto done;
  }
  sync_dir(path);
done:
  free(tmp);
  free(header);
  free(order);
  return st;
}

/* ---- loading --------------------------------------------------------------------------------- */

/* Data order: by begin, then end (a zero-size tensor [k, k] precedes one starting at k, whatever
 * the header's order), then name (unique), so the order never depends on qsort. */
static int by_offset(const void *a, const void *b) {
  const st_entry_t *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Parses one tensor entry of the header into e (name owned by the caller's table). */
static sn_status_t parse_entry(const char *fn, const char *path, const char *name, json_t *v,
                               int64_t data_len, const unsigned char *data, st_entry_t *e) {
  json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
         *offs = json_object_get(v, "data_offsets");
  if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
      json_array_size(offs) != 2)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' lacks dtype, shape or data_offsets", fn, path, name);
  const st_dtype_t *type = find_dtype(json_string_value(dt));
  if (type == NULL)
    return sn__fail(SN_ERR_FORMAT,
                    "%s: '%s': tensor '%s' has dtype '%s', which syncnorm does not know (so it "
                    "cannot check the file's sizes)", fn, path, name, json_string_value(dt));
  e->bits = type->bits;
  e->other = type->readable ? NULL : type->tag;
  e->t.dtype = type->dtype;
  e->t.is_i64 = type->is_i64;
  size_t ndim = json_array_size(shape);
  if (ndim > SN_ST_MAX_NDIM)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' has %zu dimensions (at most %d)", fn, path, name, ndim, SN_ST_MAX_NDIM);
  e->t.ndim = (int)ndim;
  for (size_t k = 0; k < ndim; k++) {
    json_t *d = json_array_get(shape, k);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' has a bad shape entry", fn, path, name);
    e->t.shape[k] = json_integer_value(d);
  }
  json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
  if (!json_is_integer(b) || !json_is_integer(en))
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' has non-integer data_offsets", fn, path, name);
  e->begin = json_integer_value(b);
  e->end = json_integer_value(en);
  int64_t n = numel(e->t.shape, e->t.ndim);
  if (n < 0)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' has an overflowing shape", fn, path, name);
  if (e->begin < 0 || e->end < e->begin || e->end > data_len)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' data_offsets [%lld, %lld] outside the %lld data bytes (truncated file?)",
                    fn, path, name, (long long)e->begin, (long long)e->end, (long long)data_len);
  /* n·bits == 8·bytes, by division (n·bits could overflow; 8·bytes is guarded) */
  const int64_t bytes = e->end - e->begin;
  if (bytes > INT64_MAX / 8 || (8 * bytes) % e->bits != 0 || (8 * bytes) / e->bits != n)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' has %lld data bytes for %lld elements of %s", fn,
                    path, name, (long long)(e->end - e->begin), (long long)n, json_string_value(dt));
  e->t.data = data + e->begin;
  return SN_OK;
}

/* Validates the header of a file already in memory and builds the entry table. */
static sn_status_t parse_file(const char *fn, const char *path, sn_safetensors_t *f, int64_t size) {
  if (size < 8)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s' is %lld bytes, shorter than the 8-byte header length (truncated?)",
                    fn, path, (long long)size);
  uint64_t hlen = 0;
  for (int k = 0; k < 8; k++) hlen |= (uint64_t)f->bytes[k] << (8 * k);
  if (hlen > SN_ST_MAX_HEADER || (int64_t)hlen > size - 8)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': header length %llu exceeds the file (%lld bytes) or the 100 MiB limit: truncated or not safetensors",
                    fn, path, (unsigned long long)hlen, (long long)size);
  if (hlen < 2 || f->bytes[8] != '{')
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': the header is not a JSON object", fn, path);
  json_error_t jerr;
  json_t *root = json_loadb((const char *)f->bytes + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL || !json_is_object(root)) {
    json_decref(root);
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': bad JSON header: %s (at byte %d)", fn, path,
                    root ? "not an object" : jerr.text, root ? 0 : jerr.position);
  }
  const int64_t data_len = size - 8 - (int64_t)hlen;
  const unsigned char *data = f->bytes + 8 + hlen;
  size_t n = json_object_size(root);
  f->entries = calloc(n > 0 ? n : 1, sizeof *f->entries);
  if (f->entries == NULL) {
    json_decref(root);
    return sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  }
  sn_status_t st = SN_OK;
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(v)) st = sn__fail(SN_ERR_FORMAT, "%s: '%s': __metadata__ is not an object", fn, path);
      if (st != SN_OK) break;
      continue;
    }
    st_entry_t *e = &f->entries[f->count];
    if ((e->name = strdup(key)) == NULL) st = sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
    if (st == SN_OK) {
      f->count++;
      e->t.name = e->name;
      st = parse_entry(fn, path, key, v, data_len, data, e);
    }
    if (st != SN_OK) break;
  }
  json_decref(root);
  if (st != SN_OK) return st;
  /* the data region must be covered exactly: sorted, contiguous, no overlap, no slack */
  qsort(f->entries, (size_t)f->count, sizeof *f->entries, by_offset);
  int64_t at = 0;
  for (int64_t i = 0; i < f->count; i++) {
    if (f->entries[i].begin != at)
      return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensor '%s' starts at %lld, expected %lld (overlap or hole)", fn,
                      path, f->entries[i].name, (long long)f->entries[i].begin, (long long)at);
    at = f->entries[i].end;
  }
  if (at != data_len)
    return sn__fail(SN_ERR_FORMAT, "%s: '%s': tensors cover %lld of %lld data bytes (trailing garbage?)", fn,
                    path, (long long)at, (long long)data_len);
  return SN_OK;
}

sn_status_t sn_safetensors_load(sn_safetensors_t **out, const char *path) {
  const char *fn = "sn_safetensors_load";
  SN_TRY(sn__check_ptr(fn, "file", out));
  SN_TRY(sn__check_ptr(fn, "path", path));
  FILE *fp = fopen(path, "rb");
  if (fp == NULL) return sn__fail(SN_ERR_IO, "%s: cannot open '%s': %s", fn, path, strerror(errno));
  /* fopen succeeds on a directory, whose "size" (ftell at SEEK_END) is LLONG_MAX on ext4: refuse
   * anything but a regular file before sizing a buffer from it */
  struct stat sb;
  if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(fp);
    return sn__fail(SN_ERR_IO, "%s: '%s' is not a regular file", fn, path);
  }
  sn_safetensors_t *f = calloc(1, sizeof *f);
  sn_status_t st = SN_OK;
  long size = -1;
  if (f == NULL) st = sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  if (st == SN_OK && (fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0))
    st = sn__fail(SN_ERR_IO, "%s: cannot seek in '%s': %s", fn, path, strerror(errno));
  if (st == SN_OK && (f->bytes = malloc((size_t)size + 1)) == NULL)
    st = sn__fail(SN_ERR_ALLOC, "%s: out of memory for %ld bytes", fn, size);
  if (st == SN_OK && size > 0 && fread(f->bytes, 1, (size_t)size, fp) != (size_t)size)
    st = sn__fail(SN_ERR_IO, "%s: cannot read '%s': %s", fn, path, ferror(fp) ? strerror(errno) : "short read");
  fclose(fp);
  if (st == SN_OK) st = parse_file(fn, path, f, size);
  if (st != SN_OK) {
    sn_safetensors_free(f);
    return st;
  }
  *out = f;
  return SN_OK;
}

sn_status_t sn_safetensors_get(const sn_safetensors_t *f, sn_tensor_t *tensor,
                               const char *name) {
  const char *fn = "sn_safetensors_get";
  SN_TRY(sn__check_ptr(fn, "file", f));
  SN_TRY(sn__check_ptr(fn, "name", name));
  SN_TRY(sn__check_ptr(fn, "tensor", tensor));
  for (int64_t i = 0; i < f->count; i++)
    if (strcmp(f->entries[i].name, name) == 0) {
      if (f->entries[i].other != NULL)
        return sn__fail(SN_ERR_INVALID_DTYPE,
                        "%s: tensor '%s' has dtype %s, which syncnorm does not read (F32, BF16, "
                        "F16, F64, I64)", fn, name, f->entries[i].other);
      *tensor = f->entries[i].t;
      return SN_OK;
    }
  return sn__fail(SN_ERR_NOT_FOUND, "%s: no tensor named '%s'", fn, name);
}

int64_t sn_safetensors_count(const sn_safetensors_t *f) { return f ? f->count : 0; }

const char *sn_safetensors_name(const sn_safetensors_t *f, int64_t i) {
  return f != NULL && i >= 0 && i < f->count ? f->entries[i].name : NULL;
}

void sn_safetensors_free(sn_safetensors_t *f) {
  if (f == NULL) return;
  for (int64_t i = 0; i < f->count; i++) free(f->entries[i].name);
  free(f->entries);
  free(f->bytes);
  free(f);
}
