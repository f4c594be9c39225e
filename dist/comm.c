/*
 * comm.c — backend-independent communicator functions: handle checks, rank/size, timeout,
 * sum all-reduce and the cross-rank identity check, dispatching through sn_comm_ops_t.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

#define SN_DEFAULT_TIMEOUT_S 1800.0

double sn__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void sn__sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

sn_status_t sn__comm_new(sn_comm_t **out, const sn_comm_ops_t *ops, int rank, int size,
                         void *impl) {
  sn_comm_t *c = calloc(1, sizeof *c);
  if (c == NULL || !sn__handle_add(c, SN_HANDLE_COMM)) {
    free(c);
    return sn__fail(SN_ERR_ALLOC, "sn_comm: out of memory");
  }
  c->ops = ops;
  c->rank = rank;
  c->size = size;
  c->timeout_s = SN_DEFAULT_TIMEOUT_S;
  c->impl = impl;
  *out = c;
  return SN_OK;
}

sn_status_t sn__comm_env_timeout(const char *fn, double *seconds) {
  *seconds = SN_DEFAULT_TIMEOUT_S;
  const char *env = getenv("SN_COMM_TIMEOUT_S");
  if (env == NULL || *env == '\0') return SN_OK; /* unset or empty: the default */
  /* a decimal number only: strtod alone also takes leading spaces, hex ("0x10") and "inf" */
  const int decimal = (env[0] >= '0' && env[0] <= '9') || env[0] == '.';
  char *end;
  errno = 0;
  const double t = strtod(env, &end); /* ERANGE: beyond the doubles, or 1e-400 rounded to 0 */
  if (!decimal || strspn(env, "0123456789.eE+-") != strlen(env) || *end != '\0' ||
      errno == ERANGE || !(t >= 0.0) || !isfinite(t))
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: SN_COMM_TIMEOUT_S='%.64s' is not a number of seconds >= 0 (such as 300 "
                    "or 2.5; 0 waits forever); unset it for the default %g s",
                    fn, env, SN_DEFAULT_TIMEOUT_S);
  *seconds = t;
  return SN_OK;
}

sn_status_t sn__comm_check(const char *fn, const sn_comm_t *comm) {
  SN_TRY(sn__check_ptr(fn, "comm", comm));
  if (!SN_COMM_LIVE(comm))
    return sn__fail(SN_ERR_INVALID_HANDLE, "%s: comm is not a live sn_comm_t (destroyed, or never one)", fn);
  if (comm->broken)
    return sn__fail(SN_ERR_COMM,
                    "%s: communicator is broken by an earlier timeout or failure; recreate it", fn);
  return SN_OK;
}

sn_status_t sn__comm_allreduce(const char *fn, sn_comm_t *comm, void *buf, int64_t count,
                               sn_red_type_t type, sn_red_op_t op) {
  SN_TRY(sn__comm_check(fn, comm));
  SN_TRY(sn__check_size(fn, "count", count, 0));
  if (count > 0) SN_TRY(sn__check_ptr(fn, "buf", buf));
  if (count > INT32_MAX)
    return sn__fail(SN_ERR_OVERFLOW, "%s: count %lld exceeds the 2^31-1 elements of one collective",
                    fn, (long long)count);
  if (comm->size == 1 || count == 0) return SN_OK; /* nothing to exchange */
  /* the backend's message names the MPI call; put the caller's name before it */
  const sn_status_t st = comm->ops->allreduce(comm, buf, count, type, op);
  return st == SN_OK ? SN_OK : sn__fail_prefix(st, "%s", fn);
}

sn_status_t sn_comm_rank(const sn_comm_t *comm, int *rank) {
  SN_TRY(sn__check_ptr("sn_comm_rank", "rank", rank));
  SN_TRY(sn__check_ptr("sn_comm_rank", "comm", comm));
  if (!SN_COMM_LIVE(comm))
    return sn__fail(SN_ERR_INVALID_HANDLE, "sn_comm_rank: comm is not a live sn_comm_t");
  *rank = comm->rank;
  return SN_OK;
}

sn_status_t sn_comm_size(const sn_comm_t *comm, int *size) {
  SN_TRY(sn__check_ptr("sn_comm_size", "size", size));
  SN_TRY(sn__check_ptr("sn_comm_size", "comm", comm));
  if (!SN_COMM_LIVE(comm))
    return sn__fail(SN_ERR_INVALID_HANDLE, "sn_comm_size: comm is not a live sn_comm_t");
  *size = comm->size;
  return SN_OK;
}

const char *sn_comm_backend(const sn_comm_t *comm) {
  if (!SN_COMM_LIVE(comm)) return "invalid";
  return comm->ops->name;
}

sn_status_t sn_comm_set_timeout(sn_comm_t *comm, double seconds) {
  SN_TRY(sn__check_ptr("sn_comm_set_timeout", "comm", comm));
  if (!SN_COMM_LIVE(comm))
    return sn__fail(SN_ERR_INVALID_HANDLE, "sn_comm_set_timeout: comm is not a live sn_comm_t");
  if (!(seconds >= 0.0) || isinf(seconds))
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "sn_comm_set_timeout: seconds must be finite and >= 0 (0 = forever), got %g",
                    seconds);
  comm->timeout_s = seconds;
  return SN_OK;
}

sn_status_t sn_comm_allreduce_sum(sn_comm_t *comm, void *buf, int64_t count, sn_dtype_t dtype) {
  const char *fn = "sn_comm_allreduce_sum";
  if (dtype != SN_DTYPE_F32 && dtype != SN_DTYPE_F64)
    return sn__fail(SN_ERR_INVALID_DTYPE,
                    "%s: dtype must be SN_DTYPE_F32 or SN_DTYPE_F64, got %d", fn, (int)dtype);
  return sn__comm_allreduce(fn, comm, buf, count, dtype == SN_DTYPE_F32 ? SN_RED_F32 : SN_RED_F64,
                            SN_RED_SUM);
}

sn_status_t sn_comm_all_identical(sn_comm_t *comm, int *identical, const void *buf,
                                  int64_t bytes) {
  const char *fn = "sn_comm_all_identical";
  SN_TRY(sn__check_ptr(fn, "identical", identical));
  SN_TRY(sn__comm_check(fn, comm));
  SN_TRY(sn__check_size(fn, "bytes", bytes, 0));
  if (bytes > 0) SN_TRY(sn__check_ptr(fn, "buf", buf));
  if (comm->ops->device_memory)
    return sn__fail(SN_ERR_UNSUPPORTED, "%s: needs a host communicator (self or mpi)", fn);
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
  const unsigned char *p = buf;
  for (int64_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  /* max(v) == −max(−v) iff all ranks hold the same v; split h so negation never overflows */
  int64_t v[4] = {(int64_t)(h >> 1), -(int64_t)(h >> 1), (int64_t)(h & 1), -(int64_t)(h & 1)};
  SN_TRY(sn__comm_allreduce(fn, comm, v, 4, SN_RED_I64, SN_RED_MAX));
  *identical = v[0] == -v[1] && v[2] == -v[3];
  return SN_OK;
}

sn_status_t sn_comm_split(sn_comm_t *comm, sn_comm_t **sub, int color, int key) {
  const char *fn = "sn_comm_split";
  SN_TRY(sn__check_ptr(fn, "sub", sub));
  SN_TRY(sn__comm_check(fn, comm));
  sn_status_t st = comm->ops->split(comm, color, key, sub);
  if (st == SN_OK && *sub != NULL) (*sub)->timeout_s = comm->timeout_s;
  return st;
}

void sn_comm_destroy(sn_comm_t *comm) {
  if (comm == NULL || !sn__handle_take(comm, SN_HANDLE_COMM)) return; /* not (no longer) one */
  comm->ops->destroy(comm);
  free(comm);
}
