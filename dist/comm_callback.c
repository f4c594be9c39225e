/*
 * comm_callback.c — the "callback" backend: a communicator whose all-reduces call a function of
 * the caller's (host buffers). For runtimes whose collectives syncnorm cannot call itself: a
 * torch.distributed process group from Python (python/syncnorm/torch/), or any other framework.
 * The callback makes the collective and returns; a failure it reports breaks the communicator
 * as a failed MPI collective does.
 */
#include <stdlib.h>

#include "comm_internal.h"

_Static_assert((int)SN_RED_F32 == (int)SN_COMM_F32 && (int)SN_RED_F64 == (int)SN_COMM_F64 &&
                   (int)SN_RED_I64 == (int)SN_COMM_I64 && (int)SN_RED_SUM == (int)SN_COMM_SUM &&
                   (int)SN_RED_MAX == (int)SN_COMM_MAX,
               "the internal and the public reduction enums are numbered alike");

typedef struct {
  sn_comm_allreduce_fn allreduce;
  void *user;
} callback_t;

static sn_status_t callback_allreduce(sn_comm_t *comm, void *buf, int64_t count,
                                      sn_red_type_t type, sn_red_op_t op) {
  const callback_t *cb = comm->impl;
  const sn_status_t st = cb->allreduce(cb->user, buf, count, (sn_comm_type_t)type,
                                       (sn_comm_op_t)op, comm->timeout_s);
  if (st == SN_OK) return SN_OK;
  comm->broken = 1;
  const sn_status_t out = st == SN_ERR_TIMEOUT ? SN_ERR_TIMEOUT : SN_ERR_COMM;
  return sn__fail(out, "the all-reduce callback returned %s on rank %d (%lld elements); the "
                  "communicator is broken", sn_status_string(st), comm->rank, (long long)count);
}

static sn_status_t callback_split(sn_comm_t *comm, int color, int key, sn_comm_t **sub) {
  (void)comm, (void)color, (void)key, (void)sub;
  return sn__fail(SN_ERR_UNSUPPORTED,
                  "sn_comm_split: a callback communicator cannot split (its callback reduces "
                  "over its own group only): create one over the subgroup instead");
}

static void callback_destroy(sn_comm_t *comm) { free(comm->impl); }

static const sn_comm_ops_t callback_ops = {"callback", 0, callback_allreduce, callback_split,
                                           callback_destroy, NULL, NULL};

sn_status_t sn_comm_create_callback(sn_comm_t **comm, int rank, int size,
                                    sn_comm_allreduce_fn allreduce, void *user) {
  const char *fn = "sn_comm_create_callback";
  SN_TRY(sn__check_ptr(fn, "comm", comm));
  if (allreduce == NULL)
    return sn__fail(SN_ERR_NULL_POINTER, "%s: allreduce is NULL", fn);
  if (size < 1 || rank < 0 || rank >= size)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: need 0 <= rank < size, got rank %d, size %d",
                    fn, rank, size);
  double timeout_s;
  int check;
  SN_TRY(sn__comm_env_timeout(fn, &timeout_s));
  SN_TRY(sn__comm_env_check(fn, &check));
  callback_t *cb = malloc(sizeof *cb);
  if (cb == NULL) return sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  cb->allreduce = allreduce, cb->user = user;
  const sn_status_t st = sn__comm_new(comm, &callback_ops, rank, size, cb);
  if (st != SN_OK) {
    free(cb);
    return st;
  }
  (*comm)->timeout_s = timeout_s;
  (*comm)->check = check;
  return SN_OK;
}
