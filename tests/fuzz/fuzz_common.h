/*
 * fuzz_common.h — helpers shared by the libFuzzer targets of tests/fuzz/: a reader that turns
 * the fuzz input into typed values (zeros once it runs out, so every input is valid), a
 * memory-backed file to hand bytes to loaders that take a path, and the failure macro.
 *
 * Every target defines `int fuzz_<name>_one(const uint8_t *data, size_t size)` and, unless
 * SN_FUZZ_NO_MAIN is defined, the libFuzzer entry point calling it. test_fuzz_regressions.c
 * compiles the targets with SN_FUZZ_NO_MAIN (gcc, no libFuzzer) to replay the corpus.
 *
 * FUZZ_CHECK aborts rather than asserts: the fuzz build is RelWithDebInfo (NDEBUG), and an
 * abort is what libFuzzer reports as a crash and saves as a reproducer.
 */
#ifndef SN_FUZZ_COMMON_H
#define SN_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond, ...)                                                    \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                              \
      fputc('\n', stderr);                                                       \
      abort();                                                                   \
    }                                                                            \
  } while (0)

/* Triage: SN_FUZZ_DEBUG=1 in the environment makes the targets print what they call. */
static inline int fz_debug(void) {
  static int v = -1;
  if (v < 0) v = getenv("SN_FUZZ_DEBUG") != NULL;
  return v;
}

/* ---- typed reads from the fuzz input --------------------------------------------------------- */

typedef struct {
  const uint8_t *p;
  size_t n;
} fz_t;

static inline uint8_t fz_u8(fz_t *f) {
  if (f->n == 0) return 0;
  f->n--;
  return *f->p++;
}

static inline uint64_t fz_bytes_u64(fz_t *f, int k) {
  uint64_t v = 0;
  for (int i = 0; i < k; i++) v |= (uint64_t)fz_u8(f) << (8 * i);
  return v;
}

static inline uint32_t fz_u32(fz_t *f) { return (uint32_t)fz_bytes_u64(f, 4); }
static inline uint64_t fz_u64(fz_t *f) { return fz_bytes_u64(f, 8); }

/* ---- a file with the given content, for APIs that take a path -------------------------------- */

/* Creates (once) an anonymous in-memory file and returns its descriptor, or -1. */
int fz_memfd(const char *name);
/* Replaces the content of the memory file fd with data[size] and writes "/proc/self/fd/<fd>"
 * into path. Returns 0, or -1 if the write failed. */
int fz_memfd_set(int fd, const uint8_t *data, size_t size, char *path, size_t pathlen);

#endif /* SN_FUZZ_COMMON_H */
