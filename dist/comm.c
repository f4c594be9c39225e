/*
 * comm.c — backend-independent communicator functions: handle checks, rank/size, timeout,
 * sum all-reduce and the cross-rank identity check, dispatching through sn_comm_ops_t; the call
 * check (SN_COMM_CHECK) that compares each collective across the ranks before making it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
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
  c->device = -1;
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
  /* ERANGE: beyond the doubles (inf), or below them: 1e-400 rounded to 0, which would wait
   * forever, is refused; 5e-324, a subnormal, is a tiny timeout like any other */
  const double t = strtod(env, &end);
  if (!decimal || strspn(env, "0123456789.eE+-") != strlen(env) || *end != '\0' ||
      (errno == ERANGE && t == 0.0) || !(t >= 0.0) || !isfinite(t))
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: SN_COMM_TIMEOUT_S='%.64s' is not a number of seconds >= 0 (such as 300 "
                    "or 2.5; 0 waits forever); unset it for the default %g s",
                    fn, env, SN_DEFAULT_TIMEOUT_S);
  *seconds = t;
  return SN_OK;
}

sn_status_t sn__comm_env_check(const char *fn, int *on) {
  *on = 0;
  const char *env = getenv("SN_COMM_CHECK");
  if (env == NULL || *env == '\0' || strcmp(env, "0") == 0) return SN_OK; /* off */
  if (strcmp(env, "1") == 0) {
    *on = 1;
    return SN_OK;
  }
  return sn__fail(SN_ERR_INVALID_ARGUMENT,
                  "%s: SN_COMM_CHECK='%.64s' is neither 1 (compare each collective across the "
                  "ranks before making it) nor 0 (do not); unset it for 0",
                  fn, env);
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

/* The all-reduce itself, arguments checked, no call check. host: buf is host memory, also on a
 * device_memory backend (which then stages it: ops->allreduce_host). */
static sn_status_t comm_reduce(const char *fn, sn_comm_t *comm, void *buf, int64_t count,
                               sn_red_type_t type, sn_red_op_t op, int host) {
  const int device = comm->ops->device_memory && !host;
  /* nothing to exchange; a device buffer still goes through the backend on one rank (an
   * identity ncclAllReduce, stream-ordered like any other) */
  if ((comm->size == 1 && !device && !comm->force_collectives) || count == 0) return SN_OK;
  /* the backend's message names the MPI call; put the caller's name before it */
  const sn_status_t st = comm->ops->device_memory && host
                             ? comm->ops->allreduce_host(comm, buf, count, type, op)
                             : comm->ops->allreduce(comm, buf, count, type, op);
  return st == SN_OK ? SN_OK : sn__fail_prefix(st, "%s", fn);
}

/* ---- the call check (SN_COMM_CHECK) --------------------------------------------------------- */

/* Fields of a collective's signature, and the values of C_CALL. */
enum { C_CALL, C_COUNT, C_TYPE, C_OP, C_CHECKS, CK };
enum { CALL_ALLREDUCE_SUM = 1, CALL_ALL_IDENTICAL, CALL_SPLIT, CALL_LAYER, CALLS };

/* One value of field k as text (sn__field_text_t): names for the call, element type, reduction
 * and the own checks' status, the number otherwise. */
static void call_text(char *out, size_t size, int k, int64_t v, int first) {
  (void)first;
  static const char *const call[CALLS] = {"?", "sn_comm_allreduce_sum", "sn_comm_all_identical",
                                          "sn_comm_split", "a layer's all-reduce"};
  static const char *const type[] = {"f32", "f64", "int64"};
  static const char *const op[] = {"sum", "max"};
  const char *name = NULL;
  if (k == C_CALL && v >= 1 && v < CALLS) name = call[v];
  else if ((k == C_TYPE || k == C_OP) && v < 0) name = "none";
  else if (k == C_TYPE && v <= SN_RED_I64) name = type[v];
  else if (k == C_OP && v <= SN_RED_MAX) name = op[v];
  else if (k == C_CHECKS) name = v == 0 ? "passed" : sn_status_string((sn_status_t)v);
  else if (k == C_COUNT && v < 0) name = "negative";
  if (name != NULL) snprintf(out, size, "%s", name);
  else snprintf(out, size, "%lld", (long long)v);
}

/* With comm->check on a communicator of more than one rank: one max all-reduce of (v, −v) for
 * each field of this call's signature (which function, the count, element type and reduction
 * of its all-reduce, and `own`, the status of this rank's own checks of the call), so every rank
 * reaches the same verdict. Where a field differs, every rank (all take that path) makes one
 * more collective, up to SN_MSG_TABLE_RANKS ranks a sum all-reduce of the [ranks, fields] table
 * in which each rank fills its own row, and returns SN_ERR_MISMATCH naming the ranks that hold
 * each value (where the function differs, only it, else where the own checks do, only they:
 * the rest follows from them); the call's
 * collective is made by none, so the communicator stays in step. Beyond SN_MSG_TABLE_RANKS
 * ranks the message gives each field's range, with no second collective. A failure of these
 * collectives (a timeout) returns its status. As SyncBatchNorm's check_consistency (syncbn.c). */
static sn_status_t call_check(const char *fn, sn_comm_t *comm, int call, int64_t count,
                              int type, int op, sn_status_t own) {
  static const char *const field[CK] = {
      "function", "count", "element type", "reduction",
      "the call's own checks (a rank whose arguments failed them returned that error)"};
  const int64_t sig[CK] = {call, count < 0 ? -1 : count, type, op, (int64_t)own};
  int64_t v[2 * CK];
  for (int k = 0; k < CK; k++) v[k] = sig[k], v[CK + k] = -sig[k];
  char where[160];
  snprintf(where, sizeof where, "%s (SN_COMM_CHECK)", fn);
  SN_TRY(comm_reduce(where, comm, v, 2 * CK, SN_RED_I64, SN_RED_MAX, 1));
  int differs = 0;
  for (int k = 0; k < CK; k++) differs |= v[k] != -v[CK + k];
  if (!differs) return SN_OK;
  /* Another function: its count, type and reduction differ as a consequence, so only it is
   * told; likewise a rank whose own checks failed (it may not know what it would have sent). */
  const int only = v[C_CALL] != -v[CK + C_CALL]       ? C_CALL
                   : v[C_CHECKS] != -v[CK + C_CHECKS] ? C_CHECKS
                                                      : -1;
  const int ranks = comm->size, by_rank = ranks <= SN_MSG_TABLE_RANKS;
  int64_t table[SN_MSG_TABLE_RANKS * CK] = {0};
  sn_status_t got = SN_OK;
  char why[256] = ""; /* why the ranks are not named: that collective's own error */
  if (by_rank) {
    memcpy(table + (int64_t)comm->rank * CK, sig, sizeof sig);
    got = comm_reduce(where, comm, table, (int64_t)ranks * CK, SN_RED_I64, SN_RED_SUM, 1);
    if (got != SN_OK) snprintf(why, sizeof why, "%s", sn_last_error());
  }
  char msg[512];
  int len = 0;
  for (int k = 0; k < CK && len < (int)sizeof msg; k++) {
    if (v[k] == -v[CK + k] || (only >= 0 && k != only)) continue;
    len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s differs across ranks",
                    len ? "; " : "", field[k]);
    if (len >= (int)sizeof msg) break;
    if (by_rank && got == SN_OK) {
      len += sn__field_by_rank(msg + len, sizeof msg - (size_t)len, k, table, ranks, CK,
                               call_text);
    } else {
      char lo[32], hi[32];
      call_text(lo, sizeof lo, k, -v[CK + k], 1), call_text(hi, sizeof hi, k, v[k], 0);
      len += snprintf(msg + len, sizeof msg - (size_t)len, " (%s..%s)", lo, hi);
    }
  }
  if (len >= (int)sizeof msg) memcpy(msg + sizeof msg - 4, "...", 4); /* cut: say so */
  return sn__fail(got == SN_OK ? SN_ERR_MISMATCH : got,
                  "%s: ranks disagree on this collective (SN_COMM_CHECK; none of them made it): "
                  "%s%s%s",
                  fn, msg, got == SN_OK ? "" : "; then naming the ranks failed: ", why);
}

/* A collective whose own checks gave `own` (its message set where it failed): on a live,
 * unbroken communicator with the call check on, the check (call_check) first, which this rank
 * makes even when its own checks failed, so that the others return SN_ERR_MISMATCH at once
 * rather than wait for it until the timeout; this rank returns its own error then (or, should
 * telling fail, that status with both messages). Then, for an all-reduce (call != CALL_SPLIT),
 * the all-reduce. */
static sn_status_t checked(const char *fn, sn_comm_t *comm, int call, void *buf, int64_t count,
                           int type, int op, sn_status_t own, int host) {
  if (!SN_COMM_LIVE(comm) || comm->broken) return own != SN_OK ? own : sn__comm_check(fn, comm);
  if (comm->check && comm->size > 1) {
    char mine[512] = "";
    if (own != SN_OK) snprintf(mine, sizeof mine, "%s", sn_last_error());
    const sn_status_t told = call_check(fn, comm, call, count, type, op, own);
    if (own != SN_OK) {
      if (told == SN_OK || told == SN_ERR_MISMATCH) return sn__fail(own, "%s", mine);
      char why[512];
      snprintf(why, sizeof why, "%s", sn_last_error()); /* sn__fail writes over it */
      return sn__fail(told, "%s; then telling the other ranks failed: %s", mine, why);
    }
    if (told != SN_OK) return told;
  } else if (own != SN_OK) {
    return own;
  }
  if (call == CALL_SPLIT) return SN_OK;
  return comm_reduce(fn, comm, buf, count, (sn_red_type_t)type, (sn_red_op_t)op, host);
}

int sn__comm_tell(const char *fn, sn_comm_t *comm, sn_status_t own, sn_status_t *told) {
  if (!comm->check) return 0; /* live, unbroken, more than one rank: the caller's checks */
  *told = call_check(fn, comm, CALL_LAYER, -1, -1, -1, own);
  return 1;
}

/* The checks of an all-reduce's arguments, comm aside. */
static sn_status_t reduce_args(const char *fn, const void *buf, int64_t count) {
  SN_TRY(sn__check_size(fn, "count", count, 0));
  if (count > 0) SN_TRY(sn__check_ptr(fn, "buf", buf));
  if (count > INT32_MAX)
    return sn__fail(SN_ERR_OVERFLOW, "%s: count %lld exceeds the 2^31-1 elements of one collective",
                    fn, (long long)count);
  return SN_OK;
}

sn_status_t sn__comm_allreduce(const char *fn, sn_comm_t *comm, void *buf, int64_t count,
                               sn_red_type_t type, sn_red_op_t op) {
  SN_TRY(sn__comm_check(fn, comm));
  return checked(fn, comm, CALL_LAYER, buf, count, type, op, reduce_args(fn, buf, count), 0);
}

sn_status_t sn__comm_allreduce_host(const char *fn, sn_comm_t *comm, void *buf, int64_t count,
                                    sn_red_type_t type, sn_red_op_t op) {
  SN_TRY(sn__comm_check(fn, comm));
  return checked(fn, comm, CALL_LAYER, buf, count, type, op, reduce_args(fn, buf, count), 1);
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
  const int type = dtype == SN_DTYPE_F32 ? SN_RED_F32 : dtype == SN_DTYPE_F64 ? SN_RED_F64 : -1;
  const sn_status_t own =
      type < 0 ? sn__fail(SN_ERR_INVALID_DTYPE,
                          "%s: dtype must be SN_DTYPE_F32 or SN_DTYPE_F64, got %d", fn, (int)dtype)
               : reduce_args(fn, buf, count);
  return checked(fn, comm, CALL_ALLREDUCE_SUM, buf, count, type, SN_RED_SUM, own, 0);
}

sn_status_t sn_comm_all_identical(sn_comm_t *comm, int *identical, const void *buf,
                                  int64_t bytes) {
  const char *fn = "sn_comm_all_identical";
  SN_TRY(sn__comm_check(fn, comm));
  if (comm->ops->device_memory)
    return sn__fail(SN_ERR_UNSUPPORTED, "%s: needs a host communicator (self or mpi)", fn);
  sn_status_t own = sn__check_ptr(fn, "identical", identical);
  if (own == SN_OK) own = sn__check_size(fn, "bytes", bytes, 0);
  if (own == SN_OK && bytes > 0) own = sn__check_ptr(fn, "buf", buf);
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
  const unsigned char *p = buf;
  for (int64_t i = 0; own == SN_OK && i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  /* max(v) == −max(−v) iff all ranks hold the same v; split h so negation never overflows */
  int64_t v[4] = {(int64_t)(h >> 1), -(int64_t)(h >> 1), (int64_t)(h & 1), -(int64_t)(h & 1)};
  SN_TRY(checked(fn, comm, CALL_ALL_IDENTICAL, v, 4, SN_RED_I64, SN_RED_MAX, own, 1));
  *identical = v[0] == -v[1] && v[2] == -v[3];
  return SN_OK;
}

sn_status_t sn_comm_split(sn_comm_t *comm, sn_comm_t **sub, int color, int key) {
  const char *fn = "sn_comm_split";
  SN_TRY(sn__comm_check(fn, comm));
  SN_TRY(checked(fn, comm, CALL_SPLIT, NULL, 0, -1, -1, sn__check_ptr(fn, "sub", sub), 1));
  sn_status_t st = comm->ops->split(comm, color, key, sub);
  if (st == SN_OK && *sub != NULL) {
    (*sub)->timeout_s = comm->timeout_s;
    (*sub)->check = comm->check;
  }
  return st;
}

void sn_comm_destroy(sn_comm_t *comm) {
  if (comm == NULL || !sn__handle_take(comm, SN_HANDLE_COMM)) return; /* not (no longer) one */
  comm->ops->destroy(comm);
  free(comm);
}
