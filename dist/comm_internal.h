/*
 * comm_internal.h — the communicator object and its table of backend operations.
 * Backends (comm_self.c, comm_mpi.c, comm_nccl.c) fill an sn_comm_ops_t; everything above them
 * (comm.c, syncbn.c) calls through the table only. Not installed.
 */
#ifndef SN_COMM_INTERNAL_H
#define SN_COMM_INTERNAL_H

#include <stdint.h>

#include "../src/internal.h"
#include "syncnorm_dist.h"

/* Element type of an internal all-reduce: the public f32/f64 plus int64 for consistency checks. */
typedef enum { SN_RED_F32, SN_RED_F64, SN_RED_I64 } sn_red_type_t;
typedef enum { SN_RED_SUM, SN_RED_MAX } sn_red_op_t;

typedef struct sn_comm_ops {
  const char *name;  /* "self", "mpi", "nccl" */
  int device_memory; /* 1: buffers are CUDA device memory, collectives enqueued on a stream */
  /* In-place all-reduce of count elements at buf. Must give bitwise identical results on every
   * rank and respect comm->timeout_s (SN_ERR_TIMEOUT, after which the backend sets broken). */
  sn_status_t (*allreduce)(sn_comm_t *comm, void *buf, int64_t count, sn_red_type_t type,
                           sn_red_op_t op);
  /* Collective split (see sn_comm_split); *sub = NULL for color < 0. */
  sn_status_t (*split)(sn_comm_t *comm, int color, int key, sn_comm_t **sub);
  /* Frees backend resources (not the sn_comm_t itself). */
  void (*destroy)(sn_comm_t *comm);
  /* device_memory backends only (NULL otherwise): the all-reduce of count elements of HOST
   * memory (the call check's and the layers' consistency checks), staged through the backend's
   * device buffer and waited for under the timeout (synchronizes the host: not capturable). */
  sn_status_t (*allreduce_host)(sn_comm_t *comm, void *buf, int64_t count, sn_red_type_t type,
                                sn_red_op_t op);
  /* device_memory backends only (NULL otherwise): waits until the backend's stream has done all
   * that is enqueued on it, under the timeout (SN_ERR_TIMEOUT / SN_ERR_COMM, broken after). */
  sn_status_t (*wait)(sn_comm_t *comm);
} sn_comm_ops_t;

struct sn_comm {
  const sn_comm_ops_t *ops;
  int rank, size;
  double timeout_s;       /* 0 = wait forever */
  int broken;             /* set after a timeout or fatal error: later collectives fail */
  int check;              /* SN_COMM_CHECK: each collective compared across the ranks first */
  int64_t next_layer_id;  /* default SyncBatchNorm layer ids, in creation order */
  void *impl;             /* backend state */
  void *stream;           /* device_memory backends: the cudaStream_t collectives run on */
  int device;             /* "nccl": the CUDA device of its ncclComm_t (ncclCommCuDevice); -1
                             for the others */
  int force_collectives;  /* test hook (sn__syncbn_test_force_sync): host all-reduces are made
                             on one rank too (the identity), as with more than one */
};

/* Allocates a communicator for a backend, with the default timeout (1800 s). */
SN_INTERNAL sn_status_t sn__comm_new(sn_comm_t **out, const sn_comm_ops_t *ops, int rank, int size,
                                   void *impl);
/* The timeout a new communicator gets: SN_COMM_TIMEOUT_S, or 1800 s where it is unset or
 * empty. Another value (not a number >= 0 in full, or infinite) is SN_ERR_INVALID_ARGUMENT,
 * message naming fn. Local: creators call it before their collective part. */
SN_INTERNAL sn_status_t sn__comm_env_timeout(const char *fn, double *seconds);
/* Whether SN_COMM_CHECK asks for the call check: unset, empty or "0" off, "1" on; any other
 * value is SN_ERR_INVALID_ARGUMENT, message naming fn. Local, as sn__comm_env_timeout. */
SN_INTERNAL sn_status_t sn__comm_env_check(const char *fn, int *on);
/* SN_OK for a live, unbroken communicator; else SN_ERR_INVALID_HANDLE / SN_ERR_COMM. */
SN_INTERNAL sn_status_t sn__comm_check(const char *fn, const sn_comm_t *comm);
/* Validated all-reduce through the backend table, for internal callers (the layers); with the
 * call check on (comm->check), compared across the ranks first as "a layer's all-reduce". */
SN_INTERNAL sn_status_t sn__comm_allreduce(const char *fn, sn_comm_t *comm, void *buf,
                                         int64_t count, sn_red_type_t type, sn_red_op_t op);
/* As sn__comm_allreduce, for a buf in HOST memory whatever the backend: a device_memory backend
 * stages it through device memory and waits for the result (ops->allreduce_host). */
SN_HIDDEN sn_status_t sn__comm_allreduce_host(const char *fn, sn_comm_t *comm, void *buf,
                                              int64_t count, sn_red_type_t type, sn_red_op_t op);
/* The live handles (handles.c), by kind: sn__handle_add records a new communicator or layer
 * (0: out of memory); sn__handle_take removes h if it is a live one of that kind and says
 * whether it was (a destroy frees it only then); sn__handle_live says whether h is a live one of
 * that kind (then, and only then, its memory may be read). Thread-safe. */
enum { SN_HANDLE_COMM = 1, SN_HANDLE_SYNCBN = 2 };
SN_HIDDEN int sn__handle_add(const void *h, int kind);
SN_HIDDEN int sn__handle_take(const void *h, int kind);
SN_INTERNAL int sn__handle_live(const void *h, int kind);
/* A live communicator. */
#define SN_COMM_LIVE(c) ((c) != NULL && sn__handle_live((c), SN_HANDLE_COMM))
/* For a layer call that failed this rank's own checks (own, its message set) while the other
 * ranks are in the call's first all-reduce, on a live, unbroken communicator of more than one
 * rank (the caller checks): with the call check on (comm->check), makes that call check with
 * own in it, so the others return SN_ERR_MISMATCH naming it; *told = its status (SN_OK: every
 * rank failed alike), and returns 1. Returns 0, telling nothing, where the check is off.
 * Overwrites sn_last_error. */
SN_HIDDEN int sn__comm_tell(const char *fn, sn_comm_t *comm, sn_status_t own, sn_status_t *told);
/* Disagreements across ranks (agree.c): up to SN_MSG_TABLE_RANKS ranks, a mismatch is told by a
 * [ranks, nf] int64 table every rank fills its own row of (one sum all-reduce); the text of field
 * k's values, grouped, most common first: " (3 on ranks 0, 1, 3; 4 on rank 2)", each value as
 * text() writes it (first: the first value shown). Returns the snprintf length. */
enum { SN_MSG_TABLE_RANKS = 64 };
typedef void (*sn__field_text_t)(char *out, size_t size, int k, int64_t v, int first);
SN_HIDDEN int sn__field_by_rank(char *out, size_t size, int k, const int64_t *table, int ranks,
                                int nf, sn__field_text_t text);
/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
SN_INTERNAL double sn__now(void);
/* Sleeps about `us` microseconds (used between polls of a pending collective). */
SN_INTERNAL void sn__sleep_us(long us);

#endif /* SN_COMM_INTERNAL_H */
