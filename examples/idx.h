/*
 * idx.h — reading the IDX files of MNIST / Fashion-MNIST (http://yann.lecun.com/exdb/mnist/,
 * "FILE FORMATS"), gzip-compressed or not, with zlib.
 *
 * An IDX file is a 4-byte magic (0x00 0x00, element type 0x08 = unsigned byte, number of
 * dimensions), one big-endian uint32 per dimension, then the elements row-major. Every problem
 * (missing file, not gzip/garbage, truncated, bad magic, wrong sizes, image and label counts that
 * differ, label out of range) is reported as one message naming the file and the problem, never
 * by aborting. The caller (syncnorm-train) prints it and exits with status 2.
 */
#ifndef SN_EXAMPLES_IDX_H
#define SN_EXAMPLES_IDX_H

#include <stddef.h>
#include <stdint.h>

/* Files larger than this (uncompressed) are rejected before they fill memory: the largest IDX
 * file used here (60,000 images of 28×28) is 47 MB. */
#define IDX_MAX_BYTES ((int64_t)1 << 31)

/* One IDX array of unsigned bytes. data: malloc'd, dims[0]·…·dims[ndim−1] bytes. */
typedef struct {
  uint8_t *data;
  int ndim;
  int64_t dims[3];
} idx_array_t;

/* Reads `path` (gzip or plain: zlib reads a file without gzip header as is) and checks that it is
 * an unsigned-byte IDX array with `ndim` (1 or 3) dimensions whose sizes match the data exactly.
 * Returns 0 and fills *out (free with idx_free), or −1 with "<path>: <problem>" in err[errlen]
 * and *out zeroed. */
int idx_read(idx_array_t *out, const char *path, int ndim, char *err, size_t errlen);

/* Frees a->data and zeroes *a; NULL or an already freed array is a no-op. */
void idx_free(idx_array_t *a);

/* A labelled image set: images [count, rows, cols] u8, labels [count] u8 in 0..classes−1. */
typedef struct {
  idx_array_t images, labels;
  int64_t count, rows, cols;
} idx_dataset_t;

/* Reads "<dir>/<split>-images-idx3-ubyte.gz" and "<dir>/<split>-labels-idx1-ubyte.gz" (split is
 * "train" or "t10k"; when a .gz file does not exist, the same name without ".gz" is tried) and
 * checks them against each other: the same count, rows == want_rows and cols == want_cols (0:
 * any), every label < classes. Returns 0 and fills *ds (free with idx_dataset_free), or −1 with
 * one message in err naming the file and the problem, and *ds zeroed. */
int idx_dataset_read(idx_dataset_t *ds, const char *dir, const char *split, int64_t want_rows,
                     int64_t want_cols, int classes, char *err, size_t errlen);

/* Frees both arrays; NULL is a no-op. */
void idx_dataset_free(idx_dataset_t *ds);

#endif /* SN_EXAMPLES_IDX_H */
