/*
 * fuzz_common.c — the in-memory file of fuzz_common.h (memfd_create: no disk I/O per input).
 */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"

int fz_memfd(const char *name) { return memfd_create(name, MFD_CLOEXEC); }

int fz_memfd_set(int fd, const uint8_t *data, size_t size, char *path, size_t pathlen) {
  if (fd < 0 || ftruncate(fd, 0) != 0) return -1;
  size_t done = 0;
  while (done < size) {
    ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
    if (w <= 0) return -1;
    done += (size_t)w;
  }
  snprintf(path, pathlen, "/proc/self/fd/%d", fd);
  return 0;
}
