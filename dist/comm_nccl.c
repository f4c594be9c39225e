/*
 * comm_nccl.c — the "nccl" backend: device buffers, collectives enqueued on a CUDA stream.
 *
 * allreduce is ncclAllReduce in place on the caller's device buffer, on the handle's stream, and
 * returns at once (no host wait), so it can be captured in a CUDA graph. Before enqueueing it asks
 * ncclCommGetAsyncError: an asynchronous NCCL error (a peer gone, a network failure) marks the
 * communicator broken (SN_ERR_COMM). Where the host must read a collective's result (the call
 * check, a layer's consistency check: int64 arrays in host memory), allreduce_host stages the
 * array through a small device buffer owned by the handle and waits for the stream with
 * nccl_wait: cudaStreamQuery polled against the communicator's timeout, with
 * ncclCommGetAsyncError between polls; on a timeout or an asynchronous error the NCCL
 * communicator is aborted (ncclCommAbort, which frees it) and the handle marked broken. After a
 * timeout the staging buffers may still be written by the aborted work: they are abandoned
 * (never freed or reused), as comm_mpi.c's.
 * Every failure that marks the handle broken aborts the NCCL communicator first (cuda_fail,
 * nccl_fail, nccl_abort): broken always means aborted. An aborted ncclComm_t is never asked
 * anything again (async_check). Host waits and staging refuse while the stream is being captured
 * (not_capturing: SN_ERR_UNSUPPORTED, nothing enqueued, not broken). Blocking NCCL
 * communicators only: ncclInProgress (a non-blocking one) is an error.
 * The handle owns the ncclComm_t only where sn_comm_split made it (ncclCommSplit).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "syncnorm_nccl.h"

#define SN_NCCL_STAGE_BYTES 8192 /* the call check's and the layers' int64 tables (≤ 6 KiB) */

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  int device;     /* the CUDA device of comm (ncclCommCuDevice) */
  int owned;      /* 1: made by sn_comm_split, destroyed with the handle */
  int aborted;    /* ncclCommAbort was called: comm is gone */
  void *dstage;   /* device staging buffer for host all-reduces */
  void *hstage;   /* pinned host twin of dstage */
  size_t stage_bytes;
} nccl_impl_t;

static void nccl_abort(sn_comm_t *c);

/* These two break a live handle: its NCCL communicator is aborted too (nccl_abort), so that
 * broken always means aborted (sn_comm_create_nccl's documentation). */
static sn_status_t cuda_fail(sn_comm_t *c, const char *what, cudaError_t err) {
  if (c != NULL) nccl_abort(c);
  return sn__fail(SN_ERR_CUDA, "%s failed on rank %d: %s (%s)", what, c ? c->rank : -1,
                  cudaGetErrorName(err), cudaGetErrorString(err));
}

static sn_status_t nccl_fail(sn_comm_t *c, const char *what, ncclResult_t rc) {
  if (c != NULL) nccl_abort(c);
  return sn__fail(SN_ERR_COMM, "%s failed on rank %d: %s", what, c ? c->rank : -1,
                  ncclGetErrorString(rc));
}

/* Aborts the NCCL communicator (once) and marks the handle broken. */
static void nccl_abort(sn_comm_t *c) {
  nccl_impl_t *m = c->impl;
  c->broken = 1;
  if (!m->aborted) {
    ncclCommAbort(m->comm);
    m->aborted = 1;
  }
}

/* SN_OK unless NCCL reports an asynchronous error (then aborted, broken, SN_ERR_COMM). */
static sn_status_t async_check(sn_comm_t *c, const char *what) {
  nccl_impl_t *m = c->impl;
  if (m->aborted) /* the ncclComm_t is gone: never ask it anything again */
    return sn__fail(SN_ERR_COMM, "%s: the NCCL communicator of rank %d was aborted after an "
                    "earlier failure; recreate it", what, c->rank);
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(m->comm, &async);
  if (rc != ncclSuccess) return nccl_fail(c, "ncclCommGetAsyncError", rc);
  if (async != ncclSuccess) { /* ncclInProgress too: blocking communicators only */
    nccl_abort(c);
    return sn__fail(SN_ERR_COMM, "%s: NCCL reports an asynchronous error on rank %d: %s; the "
                    "communicator was aborted and is now unusable", what, c->rank,
                    ncclGetErrorString(async));
  }
  return SN_OK;
}

/* SN_ERR_UNSUPPORTED (nothing enqueued, the handle not broken) while the handle's stream is
 * being captured into a CUDA graph: a host wait or staging there would break the capture. */
static sn_status_t not_capturing(sn_comm_t *c, const char *what) {
  nccl_impl_t *m = c->impl;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(m->stream, &cs);
  if (err == cudaSuccess && cs == cudaStreamCaptureStatusNone) return SN_OK;
  if (err != cudaSuccess) (void)cudaGetLastError();
  return sn__fail(SN_ERR_UNSUPPORTED,
                  "%s cannot run while the stream is being captured: turn check_consistency "
                  "(and SN_COMM_CHECK) off, and warm up the shape first (one eager call)", what);
}

/* Waits until the stream has done all that is enqueued on it, polling cudaStreamQuery and
 * ncclCommGetAsyncError against the timeout (0: forever). Timeout or asynchronous error: the
 * NCCL communicator is aborted, the handle broken. Not during graph capture (the callers are
 * the host round trips only). */
static sn_status_t nccl_wait(sn_comm_t *c) {
  nccl_impl_t *m = c->impl;
  SN_TRY(not_capturing(c, "sn_comm (nccl): a host wait"));
  const double t0 = sn__now();
  for (long polls = 1;; polls++) {
    const cudaError_t q = cudaStreamQuery(m->stream);
    if (q == cudaSuccess) return SN_OK;
    if (q != cudaErrorNotReady) return cuda_fail(c, "cudaStreamQuery (sn_comm nccl)", q);
    SN_TRY(async_check(c, "sn_comm (nccl) wait"));
    if (c->timeout_s > 0.0 && sn__now() - t0 > c->timeout_s) {
      nccl_abort(c);
      return sn__fail(SN_ERR_TIMEOUT,
                      "sn_comm (nccl): rank %d of %d waited %.1f s for its stream (timeout; set "
                      "it with sn_comm_set_timeout or SN_COMM_TIMEOUT_S). A rank may have died, "
                      "skipped a call, or be stuck; the NCCL communicator was aborted "
                      "(ncclCommAbort) and is now unusable",
                      c->rank, c->size, c->timeout_s);
    }
    sn__sleep_us(polls < 1000 ? 10 : 200);
  }
}

static sn_status_t red_types(sn_red_type_t type, sn_red_op_t op, ncclDataType_t *dt,
                             ncclRedOp_t *ro, size_t *esize) {
  *dt = type == SN_RED_F32 ? ncclFloat32 : type == SN_RED_F64 ? ncclFloat64 : ncclInt64;
  *esize = type == SN_RED_F32 ? 4 : 8;
  *ro = op == SN_RED_SUM ? ncclSum : ncclMax;
  return SN_OK;
}

static sn_status_t nccl_allreduce(sn_comm_t *c, void *buf, int64_t count, sn_red_type_t type,
                                  sn_red_op_t op) {
  nccl_impl_t *m = c->impl;
  ncclDataType_t dt;
  ncclRedOp_t ro;
  size_t esize;
  red_types(type, op, &dt, &ro, &esize);
  SN_TRY(async_check(c, "ncclAllReduce"));
  const ncclResult_t rc = ncclAllReduce(buf, buf, (size_t)count, dt, ro, m->comm, m->stream);
  /* ncclInProgress: a non-blocking communicator (not supported: blocking ones only) */
  if (rc != ncclSuccess) return nccl_fail(c, "ncclAllReduce", rc);
  return SN_OK;
}

/* Grows the staging buffers to bytes (host path only: it may synchronize the device). */
static sn_status_t stage_reserve(sn_comm_t *c, size_t bytes) {
  nccl_impl_t *m = c->impl;
  if (bytes <= m->stage_bytes) return SN_OK;
  void *d = NULL, *h = NULL;
  cudaError_t err = cudaMalloc(&d, bytes);
  if (err == cudaSuccess) err = cudaMallocHost(&h, bytes);
  if (err != cudaSuccess) (void)cudaGetLastError(); /* not sticky: a later launch is fine */
  if (err != cudaSuccess) {
    cudaFree(d);
    return sn__fail(SN_ERR_ALLOC, "sn_comm (nccl): staging buffer of %zu bytes: %s", bytes,
                    cudaGetErrorName(err));
  }
  cudaFree(m->dstage);
  cudaFreeHost(m->hstage);
  m->dstage = d, m->hstage = h, m->stage_bytes = bytes;
  return SN_OK;
}

static sn_status_t nccl_allreduce_host(sn_comm_t *c, void *buf, int64_t count,
                                       sn_red_type_t type, sn_red_op_t op) {
  nccl_impl_t *m = c->impl;
  ncclDataType_t dt;
  ncclRedOp_t ro;
  size_t esize;
  red_types(type, op, &dt, &ro, &esize);
  const size_t bytes = (size_t)count * esize;
  SN_TRY(not_capturing(c, "sn_comm (nccl): an all-reduce of host memory"));
  SN_TRY(stage_reserve(c, bytes));
  memcpy(m->hstage, buf, bytes);
  cudaError_t err = cudaMemcpyAsync(m->dstage, m->hstage, bytes, cudaMemcpyHostToDevice,
                                    m->stream);
  if (err != cudaSuccess) return cuda_fail(c, "cudaMemcpyAsync (sn_comm nccl staging)", err);
  SN_TRY(nccl_allreduce(c, m->dstage, count, type, op));
  err = cudaMemcpyAsync(m->hstage, m->dstage, bytes, cudaMemcpyDeviceToHost, m->stream);
  if (err != cudaSuccess) return cuda_fail(c, "cudaMemcpyAsync (sn_comm nccl staging)", err);
  const sn_status_t st = nccl_wait(c);
  if (st == SN_ERR_TIMEOUT) { /* the aborted work may still write them: abandon both */
    m->dstage = m->hstage = NULL;
    m->stage_bytes = 0;
  }
  if (st != SN_OK) return st;
  memcpy(buf, m->hstage, bytes);
  return SN_OK;
}

static sn_status_t nccl_wrap(sn_comm_t **out, ncclComm_t nc, cudaStream_t stream, int owned);

static sn_status_t nccl_split(sn_comm_t *c, int color, int key, sn_comm_t **sub) {
  nccl_impl_t *m = c->impl;
  SN_TRY(async_check(c, "ncclCommSplit"));
  ncclComm_t nc = NULL;
  const ncclResult_t rc =
      ncclCommSplit(m->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, NULL);
  if (rc != ncclSuccess) return nccl_fail(c, "ncclCommSplit", rc);
  if (nc == NULL) {
    *sub = NULL;
    return SN_OK;
  }
  const sn_status_t st = nccl_wrap(sub, nc, m->stream, 1);
  if (st != SN_OK) ncclCommDestroy(nc);
  return st;
}

static void nccl_destroy(sn_comm_t *c) {
  nccl_impl_t *m = c->impl;
  if (!c->broken) { /* a broken one may have aborted work still writing the staging buffers */
    cudaFree(m->dstage);
    cudaFreeHost(m->hstage);
  }
  if (m->owned && !m->aborted) ncclCommDestroy(m->comm);
  free(m);
}

static const sn_comm_ops_t nccl_ops = {"nccl",       1,         nccl_allreduce,
                                       nccl_split,   nccl_destroy, nccl_allreduce_host,
                                       nccl_wait};

/* The handle over nc (its rank, size and device), with its staging buffers. */
static sn_status_t nccl_wrap(sn_comm_t **out, ncclComm_t nc, cudaStream_t stream, int owned) {
  int rank = 0, size = 0, device = 0;
  ncclResult_t rc = ncclCommUserRank(nc, &rank);
  if (rc == ncclSuccess) rc = ncclCommCount(nc, &size);
  if (rc == ncclSuccess) rc = ncclCommCuDevice(nc, &device);
  if (rc != ncclSuccess) return nccl_fail(NULL, "ncclCommUserRank/Count/CuDevice", rc);
  nccl_impl_t *m = calloc(1, sizeof *m);
  if (m == NULL) return sn__fail(SN_ERR_ALLOC, "sn_comm_create_nccl: out of memory");
  m->comm = nc, m->stream = stream, m->device = device, m->owned = owned;
  /* the staging buffers on comm's device; the caller's current device is restored */
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != device) err = cudaSetDevice(device);
  sn_comm_t tmp = {.impl = m, .rank = rank};
  sn_status_t st = err == cudaSuccess ? stage_reserve(&tmp, SN_NCCL_STAGE_BYTES)
                                      : cuda_fail(NULL, "cudaSetDevice", err);
  if (current != device) cudaSetDevice(current);
  if (st == SN_OK) st = sn__comm_new(out, &nccl_ops, rank, size, m);
  if (st == SN_OK) (*out)->stream = (void *)stream, (*out)->device = device;
  if (st != SN_OK) {
    cudaFree(m->dstage);
    cudaFreeHost(m->hstage);
    free(m);
  }
  return st;
}

sn_status_t sn_comm_create_nccl(sn_comm_t **comm, ncclComm_t nccl, cudaStream_t stream) {
  const char *fn = "sn_comm_create_nccl";
  SN_TRY(sn__check_ptr(fn, "comm", comm));
  if (nccl == NULL)
    return sn__fail(SN_ERR_NULL_POINTER, "%s: nccl is NULL (create it with ncclCommInitRank)", fn);
  double timeout_s;
  int check;
  SN_TRY(sn__comm_env_timeout(fn, &timeout_s));
  SN_TRY(sn__comm_env_check(fn, &check));
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(nccl, &async);
  if (rc == ncclSuccess && async == ncclInProgress)
    return sn__fail(SN_ERR_UNSUPPORTED, "%s: the NCCL communicator is non-blocking (its "
                    "initialization is still in progress): blocking NCCL communicators only", fn);
  if (rc != ncclSuccess || async != ncclSuccess)
    return sn__fail(SN_ERR_COMM, "%s: the NCCL communicator reports an error: %s", fn,
                    ncclGetErrorString(rc != ncclSuccess ? rc : async));
  SN_TRY(nccl_wrap(comm, nccl, stream, 0));
  (*comm)->timeout_s = timeout_s;
  (*comm)->check = check;
  return SN_OK;
}
