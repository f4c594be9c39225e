/*
 * killhook.c — a test hook, preloaded (LD_PRELOAD) into the ranks of syncnorm-train by
 * train_kill_check.sh, that kills the process with SIGKILL at an exact point of a checkpoint
 * save or of a training step. It changes nothing in the program or the library: it wraps the C
 * library's fopen/fwrite/fsync/rename and MPI's MPI_Iallreduce (through the MPI profiling
 * interface), and only acts in the rank and at the point the environment names:
 *
 *   SN_KILLHOOK_RANK   the rank that dies (OMPI_COMM_WORLD_RANK or PMIX_RANK); default 0
 *   SN_KILLHOOK_AT     POINT:FILE:NTH — at the NTH save (1-based) of a file whose path contains
 *                      FILE, where POINT is
 *                        write         half-way through writing "<path>.tmp.<pid>.<k>" (after the
 *                                      length, the header and half of the first tensor: flushed,
 *                                      so a truncated temporary file is left on disk)
 *                        fsync         written and flushed, right before fsync
 *                        rename        fsynced and closed, right before the rename over <path>
 *                        after-rename  right after the rename (the new file is in place)
 *                      or allreduce::NTH — inside the NTH MPI_Iallreduce (posted, then killed):
 *                      in the middle of a training step's SyncBatchNorm or gradient all-reduce
 *   SN_KILLHOOK_PIDDIR every rank writes its pid to DIR/rank<R>.pid at start-up (for a driver
 *                      that kills ranks from outside at random moments)
 * While SN_KILLHOOK_AT names a save point, unnamed files (open with O_TMPFILE) fail with
 * EOPNOTSUPP, as on a file system without them: sn_safetensors_save then takes its named route
 * ("<path>.tmp.<pid>.<k>" through fopen), whose steps the points above name. (The unnamed route's
 * crash behaviour is test_checkpoint's test_crash_while_saving.)
 * Before dying it prints "KILLHOOK rank=R point=P file=F nth=N t=<unix time>" to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The library builds with hidden visibility by default; the wrappers must be exported. */
#define HOOK __attribute__((visibility("default")))

static int g_active = -1; /* -1: not yet configured */
static int g_rank = -1;
static char g_point[32], g_file[256];
static long g_nth = 0;
static long g_saves = 0, g_calls = 0, g_writes = 0;
static FILE *g_target = NULL; /* the temporary file of the NTH save */

static void configure(void) {
  if (g_active >= 0) return;
  g_active = 0;
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  if (r == NULL) r = getenv("PMIX_RANK");
  if (r == NULL) return; /* not an MPI rank (mpirun itself, a shell): never act */
  g_rank = atoi(r);
  const char *want = getenv("SN_KILLHOOK_RANK");
  const char *at = getenv("SN_KILLHOOK_AT");
  if (at == NULL || (want ? atoi(want) : 0) != g_rank) return;
  const char *c1 = strchr(at, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
  if (c2 == NULL || (size_t)(c1 - at) >= sizeof g_point || (size_t)(c2 - c1 - 1) >= sizeof g_file)
    return;
  memcpy(g_point, at, (size_t)(c1 - at));
  memcpy(g_file, c1 + 1, (size_t)(c2 - c1 - 1));
  g_nth = atol(c2 + 1);
  g_active = g_nth > 0;
}

__attribute__((constructor)) static void killhook_init(void) {
  configure();
  const char *dir = getenv("SN_KILLHOOK_PIDDIR");
  if (dir == NULL || g_rank < 0) return; /* ranks only, not mpirun */
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.pid", dir, g_rank);
  FILE *f = fopen(path, "w");
  if (f) fprintf(f, "%ld\n", (long)getpid()), fclose(f);
}

static void die(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  fprintf(stderr, "KILLHOOK rank=%d point=%s file=%s nth=%ld t=%.3f\n", g_rank, g_point, g_file,
          g_nth, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
  fflush(stderr);
  raise(SIGKILL);
}

#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

static int is_save_tmp(const char *path) {
  return g_active == 1 && g_file[0] && strstr(path, g_file) && strstr(path, ".tmp.");
}

static FILE *open_hook(FILE *f, const char *path, const char *mode) {
  if (f != NULL && mode[0] == 'w' && is_save_tmp(path) && ++g_saves == g_nth) {
    g_target = f;
    g_writes = 0;
  }
  return f;
}

HOOK FILE *fopen(const char *path, const char *mode) {
  typedef FILE *(*fn_t)(const char *, const char *);
  REAL(fopen, fn_t);
  configure();
  return open_hook(real_fopen(path, mode), path, mode);
}

HOOK FILE *fopen64(const char *path, const char *mode) {
  typedef FILE *(*fn_t)(const char *, const char *);
  REAL(fopen64, fn_t);
  configure();
  return open_hook(real_fopen64(path, mode), path, mode);
}

HOOK size_t fwrite(const void *p, size_t size, size_t n, FILE *f) {
  typedef size_t (*fn_t)(const void *, size_t, size_t, FILE *);
  REAL(fwrite, fn_t);
  if (g_target != NULL && f == g_target && strcmp(g_point, "write") == 0 && ++g_writes == 3) {
    /* the 3rd write is the first tensor's data (after the length and the header) */
    real_fwrite(p, 1, size * n / 2, f);
    fflush(f);
    die();
  }
  return real_fwrite(p, size, n, f);
}

HOOK int fsync(int fd) {
  typedef int (*fn_t)(int);
  REAL(fsync, fn_t);
  if (g_target != NULL && strcmp(g_point, "fsync") == 0 && fd == fileno(g_target)) die();
  return real_fsync(fd);
}

HOOK int fclose(FILE *f) {
  typedef int (*fn_t)(FILE *);
  REAL(fclose, fn_t);
  if (f == g_target && strcmp(g_point, "rename") != 0 && strcmp(g_point, "after-rename") != 0)
    g_target = NULL;
  return real_fclose(f);
}

HOOK int rename(const char *from, const char *to) {
  typedef int (*fn_t)(const char *, const char *);
  REAL(rename, fn_t);
  const int mine = g_target != NULL && is_save_tmp(from);
  if (mine && strcmp(g_point, "rename") == 0) die();
  const int rc = real_rename(from, to);
  if (mine && strcmp(g_point, "after-rename") == 0) die();
  if (mine) g_target = NULL;
  return rc;
}

/* open/open64/openat: O_TMPFILE refused while a save point is armed (see the header). */
static int refuse_tmpfile(int flags) {
  configure();
  return g_active == 1 && strcmp(g_point, "allreduce") != 0 && (flags & O_TMPFILE) == O_TMPFILE;
}
#define OPEN_WRAPPER(name, ...)                                                                 \
  {                                                                                           \
    mode_t mode = 0;                                                                          \
    if (flags & (O_CREAT | O_TMPFILE)) {                                                      \
      va_list ap;                                                                             \
      va_start(ap, flags);                                                                    \
      mode = (mode_t)va_arg(ap, int);                                                         \
      va_end(ap);                                                                             \
    }                                                                                         \
    if (refuse_tmpfile(flags)) {                                                              \
      errno = EOPNOTSUPP;                                                                     \
      return -1;                                                                              \
    }                                                                                         \
    REAL(name, fn_t);                                                                         \
    return real_##name(__VA_ARGS__, mode);                                                    \
  }
HOOK int open(const char *path, int flags, ...) {
  typedef int (*fn_t)(const char *, int, ...);
  OPEN_WRAPPER(open, path, flags)
}
HOOK int open64(const char *path, int flags, ...) {
  typedef int (*fn_t)(const char *, int, ...);
  OPEN_WRAPPER(open64, path, flags)
}
HOOK int openat(int dirfd, const char *path, int flags, ...) {
  typedef int (*fn_t)(int, const char *, int, ...);
  OPEN_WRAPPER(openat, dirfd, path, flags)
}
#undef OPEN_WRAPPER

HOOK int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                   MPI_Comm comm, MPI_Request *request) {
  configure();
  const int rc = PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  if (g_active == 1 && strcmp(g_point, "allreduce") == 0 && ++g_calls == g_nth) die();
  return rc;
}
