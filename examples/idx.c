/*
 * idx.c — IDX reader (see idx.h). zlib's gzread decompresses gzip files and passes other files
 * through unchanged, so "gz garbage" shows up either as a zlib error (a gzip header followed by
 * a corrupt stream, a truncated stream, a bad CRC) or as a wrong IDX magic (no gzip header).
 */
#include "idx.h"
#include "errmsg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Reads the whole (decompressed) content of path into *buf (malloc'd) and *len. At most
 * IDX_MAX_BYTES + 1 bytes are kept, so an oversized file is detected without reading it all. */
static int read_all(uint8_t **buf, int64_t *len, const char *path, char *err, size_t errlen) {
  *buf = NULL;
  *len = 0;
  struct stat st;
  if (stat(path, &st) != 0) return ex_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) return ex_fail(err, errlen, "%s: is a directory, not an IDX file", path);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    int e = errno;
    return ex_fail(err, errlen, "%s: cannot open: %s", path, e ? strerror(e) : "out of memory");
  }
  int64_t cap = 1 << 20, n = 0;
  uint8_t *data = malloc((size_t)cap);
  int rc = -1;
  if (!data) {
    ex_fail(err, errlen, "%s: out of memory", path);
    goto done;
  }
  for (;;) {
    if (n == cap) {
      if (cap > IDX_MAX_BYTES) {
        ex_fail(err, errlen, "%s: more than %lld bytes uncompressed: not an IDX file of this program",
                path, (long long)IDX_MAX_BYTES);
        goto done;
      }
      int64_t bigger_cap = cap * 2 > IDX_MAX_BYTES ? IDX_MAX_BYTES + 1 : cap * 2;
      uint8_t *bigger = realloc(data, (size_t)bigger_cap);
      if (!bigger) {
        ex_fail(err, errlen, "%s: out of memory after %lld bytes", path, (long long)n);
        goto done;
      }
      data = bigger;
      cap = bigger_cap;
    }
    int64_t want = cap - n;
    if (want > (1 << 30)) want = 1 << 30;
    int got = gzread(f, data + n, (unsigned)want);
    if (got < 0) break;  /* error: reported below */
    if (got == 0) break; /* end of file (or a truncated stream: reported below) */
    n += got;
  }
  int zerr = Z_OK;
  const char *zmsg = gzerror(f, &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END) {
    /* zlib's message already starts with the path ("<path>: unexpected end of file"). */
    const char *detail = zmsg;
    size_t plen = strlen(path);
    if (strncmp(detail, path, plen) == 0 && detail[plen] == ':') detail += plen + 2;
    ex_fail(err, errlen, "%s: corrupt or truncated gzip data (zlib: %s) after %lld bytes", path,
            zerr == Z_ERRNO ? strerror(errno) : detail, (long long)n);
    goto done;
  }
  *buf = data;
  *len = n;
  data = NULL;
  rc = 0;
done:
  free(data);
  gzclose(f);
  return rc;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

int idx_read(idx_array_t *out, const char *path, int ndim, char *err, size_t errlen) {
  if (out) memset(out, 0, sizeof *out); /* zeroed on every failure, bad arguments included */
  if (!out || !path || ndim < 1 || ndim > 3) return ex_fail(err, errlen, "idx_read: bad arguments");
  uint8_t *buf = NULL;
  int64_t len = 0;
  if (read_all(&buf, &len, path, err, errlen) != 0) return -1;

  int64_t header = 4 + 4 * (int64_t)ndim;
  if (len < 4) {
    free(buf);
    return ex_fail(err, errlen, "%s: truncated: %lld bytes, shorter than the 4-byte IDX magic", path,
                   (long long)len);
  }
  uint32_t magic = be32(buf), want_magic = 0x0800u | (uint32_t)ndim;
  if (magic != want_magic) {
    free(buf);
    return ex_fail(err, errlen,
                   "%s: bad magic 0x%08x, expected 0x%08x (IDX, unsigned bytes, %d dimension%s)%s",
                   path, magic, want_magic, ndim, ndim == 1 ? "" : "s",
                   (magic & 0xffffff00u) == 0x0800u ? "" : ": not an IDX file (or not gzip data)");
  }
  if (len < header) {
    free(buf);
    return ex_fail(err, errlen, "%s: truncated: the header needs %lld bytes, the file has %lld", path,
                   (long long)header, (long long)len);
  }
  int64_t elems = 1;
  for (int d = 0; d < ndim; d++) {
    out->dims[d] = be32(buf + 4 + 4 * d);
    if (out->dims[d] == 0) {
      free(buf);
      memset(out, 0, sizeof *out);
      return ex_fail(err, errlen, "%s: dimension %d is 0: no data", path, d);
    }
    if (elems > IDX_MAX_BYTES / out->dims[d]) { /* cannot be the size of what we could read */
      const long long dim = (long long)out->dims[d];
      free(buf);
      memset(out, 0, sizeof *out);
      return ex_fail(err, errlen, "%s: header sizes too large (dimension %d is %lld)", path, d, dim);
    }
    elems *= out->dims[d];
  }
  if (len - header != elems) {
    char shape[64];
    if (ndim == 3)
      snprintf(shape, sizeof shape, "%lld×%lld×%lld", (long long)out->dims[0],
               (long long)out->dims[1], (long long)out->dims[2]);
    else
      snprintf(shape, sizeof shape, "%lld", (long long)out->dims[0]);
    int64_t have = len - header;
    free(buf);
    memset(out, 0, sizeof *out);
    return ex_fail(err, errlen, "%s: %s: the header says %s = %lld bytes of data, the file has %lld",
                   path, have < elems ? "truncated" : "count mismatch (extra bytes)", shape,
                   (long long)elems, (long long)have);
  }
  /* Keep only the elements: move them to the front of the buffer (no second copy). */
  memmove(buf, buf + header, (size_t)elems);
  uint8_t *shrunk = realloc(buf, (size_t)elems);
  out->data = shrunk ? shrunk : buf;
  out->ndim = ndim;
  return 0;
}

void idx_free(idx_array_t *a) {
  if (!a) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

/* "<dir>/<stem>.gz" if it exists, else "<dir>/<stem>" if that exists, else the .gz name (so the
 * error names the file the program looks for by default). */
static void data_path(char *path, size_t n, const char *dir, const char *stem) {
  snprintf(path, n, "%s/%s", dir, stem);
  struct stat st;
  char gz[4096];
  snprintf(gz, sizeof gz, "%s/%s.gz", dir, stem);
  if (stat(gz, &st) == 0 || stat(path, &st) != 0) snprintf(path, n, "%s", gz);
}

int idx_dataset_read(idx_dataset_t *ds, const char *dir, const char *split, int64_t want_rows,
                     int64_t want_cols, int classes, char *err, size_t errlen) {
  if (ds) memset(ds, 0, sizeof *ds); /* idx_dataset_free is safe after any failure */
  if (!ds || !dir || !split || classes < 1 || classes > 256)
    return ex_fail(err, errlen, "idx_dataset_read: bad arguments");
  char ipath[4096], lpath[4096], stem[256];
  snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", split);
  data_path(ipath, sizeof ipath, dir, stem);
  snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", split);
  data_path(lpath, sizeof lpath, dir, stem);

  if (idx_read(&ds->images, ipath, 3, err, errlen) != 0) return -1;
  if (idx_read(&ds->labels, lpath, 1, err, errlen) != 0) {
    idx_dataset_free(ds);
    return -1;
  }
  int64_t ni = ds->images.dims[0], nl = ds->labels.dims[0];
  int64_t rows = ds->images.dims[1], cols = ds->images.dims[2];
  if (ni != nl) {
    ex_fail(err, errlen, "%s has %lld images but %s has %lld labels: the counts must be equal", ipath,
            (long long)ni, lpath, (long long)nl);
    idx_dataset_free(ds);
    return -1;
  }
  if ((want_rows > 0 && rows != want_rows) || (want_cols > 0 && cols != want_cols)) {
    ex_fail(err, errlen, "%s: images are %lld×%lld, the model needs %lld×%lld", ipath,
            (long long)rows, (long long)cols, (long long)want_rows, (long long)want_cols);
    idx_dataset_free(ds);
    return -1;
  }
  for (int64_t i = 0; i < nl; i++) {
    if (ds->labels.data[i] >= classes) {
      ex_fail(err, errlen, "%s: label %d of example %lld is out of range 0..%d", lpath,
              ds->labels.data[i], (long long)i, classes - 1);
      idx_dataset_free(ds);
      return -1;
    }
  }
  ds->count = ni;
  ds->rows = rows;
  ds->cols = cols;
  return 0;
}

void idx_dataset_free(idx_dataset_t *ds) {
  if (!ds) return;
  idx_free(&ds->images);
  idx_free(&ds->labels);
  ds->count = ds->rows = ds->cols = 0;
}
