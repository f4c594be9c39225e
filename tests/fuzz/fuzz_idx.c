/*
 * fuzz_idx.c — libFuzzer target for the IDX reader of syncnorm-train (examples/idx.c).
 *
 * Input: one control byte, then the file content.
 *   control & 3:   0 idx_read(ndim 1), 1 idx_read(ndim 3), 2 idx_read(ndim from the next byte,
 *                  0..255 as a signed value: mostly invalid), 3 idx_dataset_read (the content is
 *                  split in two: images | labels, at a point given by the next two bytes; then a
 *                  byte for want_rows/want_cols and one for classes)
 *   control & 4:   gzip-compress the content(s) first (so the reader sees valid gzip around
 *                  arbitrary IDX bytes)
 *   control & 8:   with gzip: truncate the compressed stream (length from the next byte)
 *   control & 16:  with gzip: flip one bit of the compressed stream (position from the next byte)
 *   control & 32:  error buffer of 0..15 bytes instead of 256 (truncation of the messages)
 * Raw content starting with the gzip magic exercises zlib's error paths on garbage.
 *
 * Checks: idx_read and idx_dataset_read agree with a reference parser written here from the
 * format description (magic 0x00000800|ndim, big-endian dimensions > 0, exactly the product of
 * the dimensions in data bytes), their data equal the content, a failure leaves the output
 * zeroed with a message naming the file, and messages never overrun the error buffer (it is
 * malloc'd at its exact size: ASan).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz_common.h"
#include "idx.h"

int fuzz_idx_one(const uint8_t *data, size_t size);

/* ---- reference parser -------------------------------------------------------------------------- */

typedef struct {
  int ok;
  int64_t dims[3];
  size_t header;
} ref_t;

static ref_t ref_parse(const uint8_t *b, size_t len, int ndim) {
  ref_t r;
  memset(&r, 0, sizeof r);
  if (ndim < 1 || ndim > 3) return r;
  r.header = 4 + 4 * (size_t)ndim;
  if (len < r.header) return r;
  if (b[0] != 0 || b[1] != 0 || b[2] != 0x08 || b[3] != (uint8_t)ndim) return r;
  uint64_t elems = 1;
  for (int d = 0; d < ndim; d++) {
    const uint8_t *p = b + 4 + 4 * d;
    r.dims[d] = (int64_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    if (r.dims[d] == 0) return r;
    elems *= (uint64_t)r.dims[d]; /* < 2^96: use the 2^31 bound before it can wrap */
    if (elems > ((uint64_t)1 << 31)) return r;
  }
  r.ok = elems == (uint64_t)(len - r.header);
  return r;
}

/* ---- files ------------------------------------------------------------------------------------- */

/* gzip of src into *out (malloc'd); returns its length. */
static size_t gzip_bytes(const uint8_t *src, size_t n, uint8_t **out) {
  z_stream z;
  memset(&z, 0, sizeof z);
  FUZZ_CHECK(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK, "deflateInit2");
  uLong cap = deflateBound(&z, (uLong)n) + 32;
  *out = malloc(cap);
  FUZZ_CHECK(*out != NULL, "out of memory");
  z.next_in = (Bytef *)(uintptr_t)src;
  z.avail_in = (uInt)n;
  z.next_out = *out;
  z.avail_out = (uInt)cap;
  FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
  size_t len = z.total_out;
  deflateEnd(&z);
  return len;
}

/* The bytes the reader will see for `content`, after the optional gzip wrapping and damage.
 * *intact: the reader decompresses (or passes through) back to exactly `content`. */
typedef struct {
  uint8_t *bytes;
  size_t len;
  int intact;
} encoded_t;

static encoded_t encode(const uint8_t *content, size_t n, unsigned control, uint8_t cut, uint8_t flip) {
  encoded_t e;
  if (!(control & 4)) {
    e.bytes = malloc(n > 0 ? n : 1);
    FUZZ_CHECK(e.bytes != NULL, "out of memory");
    if (n > 0) memcpy(e.bytes, content, n);
    e.len = n;
    /* zlib passes non-gzip bytes through; 1f 8b starts a gzip stream */
    e.intact = !(n >= 2 && content[0] == 0x1f && content[1] == 0x8b);
    return e;
  }
  e.len = gzip_bytes(content, n, &e.bytes);
  e.intact = 1;
  if ((control & 8) && e.len > 0) {
    e.len = (size_t)cut % e.len; /* shorter than the full stream: truncated */
    e.intact = 0;
  }
  if ((control & 16) && e.len > 0) {
    e.bytes[(size_t)flip % e.len] ^= (uint8_t)(1u << (flip % 8));
    e.intact = 0; /* usually a zlib error; a flip in the header's MTIME/OS bytes is harmless */
  }
  return e;
}

static void write_file(const char *path, const uint8_t *b, size_t n) {
  FILE *f = fopen(path, "wb");
  FUZZ_CHECK(f != NULL, "cannot create %s: %s", path, strerror(errno));
  FUZZ_CHECK(n == 0 || fwrite(b, 1, n, f) == n, "cannot write %s", path);
  FUZZ_CHECK(fclose(f) == 0, "cannot close %s", path);
}

static char work_dir[64];

static void remove_work_dir(void) {
  static const char *const names[] = {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz",
                                      "train-labels-idx1-ubyte", "train-labels-idx1-ubyte.gz"};
  char path[128];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", work_dir, names[i]);
    unlink(path);
  }
  rmdir(work_dir);
}

static const char *get_work_dir(void) {
  if (work_dir[0] == '\0') {
    snprintf(work_dir, sizeof work_dir, "/dev/shm/sn_fuzz_idx_%ld", (long)getpid());
    if (mkdir(work_dir, 0700) != 0 && errno != EEXIST)
      snprintf(work_dir, sizeof work_dir, "/tmp/sn_fuzz_idx_%ld", (long)getpid());
    mkdir(work_dir, 0700);
    atexit(remove_work_dir);
  }
  return work_dir;
}

/* Writes "<dir>/<stem>" or "<dir>/<stem>.gz" (removing the other, which the reader would prefer
 * or fall back to). */
static void place(const char *dir, const char *stem, const encoded_t *e, int gz) {
  char path[128], other[128];
  snprintf(path, sizeof path, "%s/%s%s", dir, stem, gz ? ".gz" : "");
  snprintf(other, sizeof other, "%s/%s%s", dir, stem, gz ? "" : ".gz");
  unlink(other);
  write_file(path, e->bytes, e->len);
}

/* ---- checks ------------------------------------------------------------------------------------- */

static int all_zero(const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

/* The message must be a NUL-terminated string inside the buffer (checked by strnlen + ASan). */
static void check_message(const char *err, size_t errlen, const char *path) {
  if (errlen == 0) return;
  size_t len = strnlen(err, errlen);
  FUZZ_CHECK(len < errlen, "message not terminated inside its %zu-byte buffer", errlen);
  FUZZ_CHECK(len > 0 || errlen == 1, "empty error message");
  if (path != NULL && errlen > strlen(path) + 1 && strncmp(err, "idx_", 4) != 0)
    FUZZ_CHECK(strstr(err, path) != NULL || strncmp(err, path, len) == 0,
               "message '%s' does not name '%s'", err, path);
}

static void check_array(const idx_array_t *a, const uint8_t *content, const ref_t *r, int ndim) {
  FUZZ_CHECK(a->ndim == ndim, "ndim %d, asked %d", a->ndim, ndim);
  int64_t elems = 1;
  for (int d = 0; d < ndim; d++) {
    FUZZ_CHECK(a->dims[d] == r->dims[d], "dims[%d] %lld, reference %lld", d, (long long)a->dims[d],
               (long long)r->dims[d]);
    elems *= a->dims[d];
  }
  FUZZ_CHECK(a->data != NULL, "no data");
  FUZZ_CHECK(memcmp(a->data, content + r->header, (size_t)elems) == 0, "data differ from the file");
}

static char *make_err(size_t errlen) {
  char *err = malloc(errlen > 0 ? errlen : 1);
  FUZZ_CHECK(err != NULL, "out of memory");
  return err;
}

static void fuzz_read(fz_t *in, unsigned control, size_t errlen) {
  int ndim = (control & 3) == 0 ? 1 : (control & 3) == 1 ? 3 : (int)(int8_t)fz_u8(in);
  uint8_t cut = fz_u8(in), flip = fz_u8(in);
  const uint8_t *content = in->p;
  const size_t n = in->n;
  encoded_t e = encode(content, n, control, cut, flip);
  static int fd = -1;
  if (fd < 0) fd = fz_memfd("sn_fuzz_idx");
  FUZZ_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
  char path[64];
  FUZZ_CHECK(fz_memfd_set(fd, e.bytes, e.len, path, sizeof path) == 0, "writing the memfd failed");

  char *err = make_err(errlen);
  idx_array_t a;
  memset(&a, 0x5a, sizeof a);
  int rc = idx_read(&a, path, ndim, errlen > 0 ? err : NULL, errlen);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  ref_t r = ref_parse(content, n, ndim);
  if (rc != 0) {
    FUZZ_CHECK(all_zero(&a, sizeof a), "failed read (ndim %d) left *out set", ndim);
    check_message(err, errlen, path);
    FUZZ_CHECK(!(e.intact && r.ok), "a valid IDX file (ndim %d) was rejected: %s", ndim,
               errlen > 0 ? err : "(no message buffer)");
  } else {
    FUZZ_CHECK(ndim >= 1 && ndim <= 3, "ndim %d accepted", ndim);
    if (e.intact) {
      FUZZ_CHECK(r.ok, "an invalid IDX file (ndim %d) was accepted", ndim);
      check_array(&a, content, &r, ndim);
    }
    idx_free(&a);
    FUZZ_CHECK(all_zero(&a, sizeof a), "idx_free left the array set");
  }
  idx_free(&a); /* a second free is a no-op */
  idx_free(NULL);
  free(err);
  free(e.bytes);
}

static void fuzz_dataset(fz_t *in, unsigned control, size_t errlen) {
  uint8_t cut = fz_u8(in), flip = fz_u8(in);
  uint16_t split = (uint16_t)(fz_u8(in) | fz_u8(in) << 8);
  uint8_t want = fz_u8(in), cls = fz_u8(in);
  const int64_t want_rows = want & 0x0f, want_cols = want >> 4; /* 0 = any */
  const int classes = (int)cls + ((control & 64) ? 1 : 0) * 256 - 1; /* -1..510 */
  const uint8_t *content = in->p;
  const size_t n = in->n, ni = n > 0 ? split % (n + 1) : 0;
  const uint8_t *lab = content + ni;
  const size_t nl = n - ni;
  encoded_t ei = encode(content, ni, control, cut, flip), el = encode(lab, nl, control, cut, flip);
  const char *dir = get_work_dir();
  place(dir, "train-images-idx3-ubyte", &ei, (control & 4) != 0);
  place(dir, "train-labels-idx1-ubyte", &el, (control & 4) != 0);

  char *err = make_err(errlen);
  idx_dataset_t ds;
  memset(&ds, 0x5a, sizeof ds);
  int rc = idx_dataset_read(&ds, dir, "train", want_rows, want_cols, classes,
                            errlen > 0 ? err : NULL, errlen);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  ref_t ri = ref_parse(content, ni, 3), rl = ref_parse(lab, nl, 1);
  int ok = classes >= 1 && classes <= 256 && ri.ok && rl.ok && ri.dims[0] == rl.dims[0] &&
           (want_rows == 0 || ri.dims[1] == want_rows) && (want_cols == 0 || ri.dims[2] == want_cols);
  for (int64_t i = 0; ok && i < rl.dims[0]; i++) ok = lab[rl.header + (size_t)i] < classes;
  const int intact = ei.intact && el.intact;
  if (rc != 0) {
    FUZZ_CHECK(all_zero(&ds, sizeof ds), "failed read (classes %d) left *ds set", classes);
    check_message(err, errlen, NULL);
    FUZZ_CHECK(!(intact && ok), "a valid dataset was rejected: %s", errlen > 0 ? err : "(no buffer)");
  } else {
    FUZZ_CHECK(classes >= 1 && classes <= 256, "classes %d accepted", classes);
    if (intact) {
      FUZZ_CHECK(ok, "an invalid dataset was accepted");
      check_array(&ds.images, content, &ri, 3);
      check_array(&ds.labels, lab, &rl, 1);
      FUZZ_CHECK(ds.count == ri.dims[0] && ds.rows == ri.dims[1] && ds.cols == ri.dims[2],
                 "dataset sizes differ from the images");
    }
    idx_dataset_free(&ds);
    FUZZ_CHECK(all_zero(&ds, sizeof ds), "idx_dataset_free left the dataset set");
  }
  idx_dataset_free(&ds);
  idx_dataset_free(NULL);
  free(err);
  free(ei.bytes);
  free(el.bytes);
}

int fuzz_idx_one(const uint8_t *data, size_t size) {
  fz_t in = {data, size};
  const unsigned control = fz_u8(&in);
  const size_t errlen = (control & 32) ? (size_t)(fz_u8(&in) & 15) : 256;
  if ((control & 3) == 3) fuzz_dataset(&in, control, errlen);
  else fuzz_read(&in, control, errlen);
  return 0;
}

#ifndef SN_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_idx_one(data, size); }
#endif
