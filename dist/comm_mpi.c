/*
 * comm_mpi.c — the "mpi" backend: host buffers, Open MPI (any MPI-3 library).
 *
 * The handle owns a duplicate of the caller's communicator with MPI_ERRORS_RETURN set, so MPI
 * failures come back as SN_ERR_COMM. Every all-reduce is non-blocking (MPI_Iallreduce on a
 * staging buffer owned by the handle) and polled against the communicator's timeout: a rank that
 * never arrives makes the others fail with SN_ERR_TIMEOUT instead of hanging. After a timeout the
 * request may still complete later, so its staging buffer is abandoned (never freed or reused)
 * and the communicator is marked broken.
 */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "syncnorm_mpi.h"

typedef struct {
  MPI_Comm comm;  /* our duplicate */
  void *stage;    /* staging buffer for in-flight all-reduces */
  size_t stage_bytes;
} mpi_impl_t;

static sn_status_t mpi_fail(sn_comm_t *c, const char *what, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  if (c != NULL) c->broken = 1;
  return sn__fail(SN_ERR_COMM, "%s failed on rank %d: %s", what, c ? c->rank : -1, msg);
}

/* Polls a request until it completes (SN_OK), fails (SN_ERR_COMM, the MPI error in *rc), or
 * timeout_s passes (SN_ERR_TIMEOUT; 0: never). Spins briefly, then yields the core (ranks are
 * often oversubscribed), then sleeps in short steps. Sets no message. */
static sn_status_t mpi_poll(MPI_Request *req, double timeout_s, int *rc) {
  const double deadline = timeout_s > 0.0 ? sn__now() + timeout_s : INFINITY;
  for (long polls = 1;; polls++) {
    int done = 0;
    *rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (*rc != MPI_SUCCESS) return SN_ERR_COMM;
    if (done) return SN_OK;
    if (polls > 20000) sn__sleep_us(100);
    else if (polls > 200) sched_yield();
    if ((polls & 31) == 0 && sn__now() > deadline) return SN_ERR_TIMEOUT;
  }
}

/* mpi_poll against the communicator's timeout: a timeout marks it broken. */
static sn_status_t mpi_wait(sn_comm_t *c, MPI_Request *req, const char *what) {
  int rc = MPI_SUCCESS;
  const sn_status_t st = mpi_poll(req, c->timeout_s, &rc);
  if (st == SN_ERR_COMM) return mpi_fail(c, what, rc);
  if (st == SN_ERR_TIMEOUT) {
    c->broken = 1;
    return sn__fail(SN_ERR_TIMEOUT,
                      "%s: rank %d of %d waited %.1f s for the other ranks (timeout; set it with "
                      "sn_comm_set_timeout or SN_COMM_TIMEOUT_S). A rank may have died, skipped "
                      "a call, or be stuck; the communicator is now unusable",
                    what, c->rank, c->size, c->timeout_s);
  }
  return SN_OK;
}

static sn_status_t mpi_allreduce(sn_comm_t *c, void *buf, int64_t count, sn_red_type_t type,
                                 sn_red_op_t op) {
  mpi_impl_t *m = c->impl;
  MPI_Datatype dt = type == SN_RED_F32 ? MPI_FLOAT : type == SN_RED_F64 ? MPI_DOUBLE : MPI_INT64_T;
  size_t esize = type == SN_RED_F32 ? 4 : 8;
  size_t bytes = (size_t)count * esize;
  if (m->stage_bytes < bytes) {
    void *p = realloc(m->stage, bytes);
    if (p == NULL) return sn__fail(SN_ERR_ALLOC, "sn_comm(mpi): out of memory (%zu bytes)", bytes);
    m->stage = p;
    m->stage_bytes = bytes;
  }
  memcpy(m->stage, buf, bytes);
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, m->stage, (int)count, dt,
                          op == SN_RED_SUM ? MPI_SUM : MPI_MAX, m->comm, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(c, "MPI_Iallreduce", rc);
  sn_status_t st = mpi_wait(c, &req, "MPI_Iallreduce");
  if (st == SN_ERR_TIMEOUT) { /* MPI may still write into stage: abandon it */
    m->stage = NULL;
    m->stage_bytes = 0;
    return st;
  }
  if (st != SN_OK) return st;
  memcpy(buf, m->stage, bytes);
  return SN_OK;
}

static sn_status_t mpi_wrap(sn_comm_t **out, MPI_Comm dup);

static sn_status_t mpi_split(sn_comm_t *c, int color, int key, sn_comm_t **sub) {
  mpi_impl_t *m = c->impl;
  /* MPI_Comm_split has no non-blocking form: first make sure every rank has arrived, under the
   * timeout, so that a missing rank fails here instead of hanging in the split. Two barriers:
   * ranks that time out in the first have posted it, so a rank arriving after they gave up
   * still completes it; the second, which they never post, makes that rank time out too,
   * instead of entering the split alone and waiting there for ever. What
   * remains: a rank stalled for a whole timeout between its two barriers (a few instructions
   * apart) still enters the split alone once the others have timed out in the second. */
  int rc = MPI_SUCCESS;
  for (int step = 0; step < 2; step++) {
    MPI_Request req;
    rc = MPI_Ibarrier(m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "MPI_Ibarrier", rc);
    SN_TRY(mpi_wait(c, &req, "sn_comm_split (MPI_Ibarrier)"));
  }
  MPI_Comm nc;
  rc = MPI_Comm_split(m->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
  if (rc != MPI_SUCCESS) return mpi_fail(c, "MPI_Comm_split", rc);
  if (nc == MPI_COMM_NULL) {
    *sub = NULL;
    return SN_OK;
  }
  rc = MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&nc);
    return mpi_fail(c, "MPI_Comm_set_errhandler", rc);
  }
  sn_status_t st = mpi_wrap(sub, nc);
  if (st != SN_OK) MPI_Comm_free(&nc);
  return st;
}

static void mpi_destroy(sn_comm_t *c) {
  mpi_impl_t *m = c->impl;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !c->broken) MPI_Comm_free(&m->comm);
  if (!c->broken) free(m->stage); /* a broken comm may have a request writing into it */
  free(m);
}

static const sn_comm_ops_t mpi_ops = {"mpi", 0, mpi_allreduce, mpi_split, mpi_destroy,
                                      NULL, NULL};

/* The heap buffers of sn_comm_create_mpi's non-blocking steps. */
typedef struct {
  int agree[3];
  MPI_Comm dup;
} create_wait_t;

/* One step of sn_comm_create_mpi (`what`), posted with MPI status `posted`, then waited for
 * under timeout_s. w, the creation's buffers, is kept on SN_OK and freed on any error, except
 * after a timeout in a step that writes it (writes_w): then MPI may still write it, and it is
 * abandoned. */
static sn_status_t create_step(const char *fn, int posted, MPI_Request *req, double timeout_s,
                               int rank, int ranks, const char *what, create_wait_t *w,
                               int writes_w) {
  int rc = posted;
  const sn_status_t st = rc != MPI_SUCCESS ? SN_ERR_COMM : mpi_poll(req, timeout_s, &rc);
  if (st == SN_ERR_COMM) {
    free(w);
    return mpi_fail(NULL, what, rc);
  }
  if (st == SN_ERR_TIMEOUT) {
    if (!writes_w) free(w);
    return sn__fail(SN_ERR_TIMEOUT,
                    "%s: %s: rank %d of %d of mpi_comm waited %.1f s for the other ranks "
                    "(timeout: SN_COMM_TIMEOUT_S, or the default). A rank may have died or not "
                    "reached the creation; nothing was created, and mpi_comm keeps the pending "
                    "operation: do not use it for collectives again",
                    fn, what, rank, ranks, timeout_s);
  }
  return SN_OK;
}

static sn_status_t mpi_wrap(sn_comm_t **out, MPI_Comm dup) {
  int rank, size;
  int rc = MPI_Comm_rank(dup, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(dup, &size);
  if (rc != MPI_SUCCESS) return mpi_fail(NULL, "MPI_Comm_rank/size", rc);
  mpi_impl_t *m = calloc(1, sizeof *m);
  if (m == NULL) return sn__fail(SN_ERR_ALLOC, "sn_comm_create_mpi: out of memory");
  m->comm = dup;
  sn_status_t st = sn__comm_new(out, &mpi_ops, rank, size, m);
  if (st != SN_OK) free(m);
  return st;
}

/* MPI_Init called and MPI_Finalize not yet, else SN_ERR_INVALID_ARGUMENT naming fn. */
static sn_status_t check_initialized(const char *fn) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: MPI is not initialized (call MPI_Init first)", fn);
  return SN_OK;
}

static sn_status_t create_mpi(const char *fn, sn_comm_t **comm, MPI_Comm mpi_comm);

sn_status_t sn_comm_create_mpi(sn_comm_t **comm, MPI_Comm mpi_comm) {
  const char *fn = "sn_comm_create_mpi";
  SN_TRY(sn__check_ptr(fn, "comm", comm));
  SN_TRY(check_initialized(fn));
  return create_mpi(fn, comm, mpi_comm);
}

sn_status_t sn_comm_create_mpi_fortran(sn_comm_t **comm, int64_t fortran_handle) {
  const char *fn = "sn_comm_create_mpi_fortran";
  SN_TRY(sn__check_ptr(fn, "comm", comm));
  SN_TRY(check_initialized(fn));
  const MPI_Fint f = (MPI_Fint)fortran_handle;
  if ((int64_t)f != fortran_handle)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: %lld is not an MPI_Fint", fn,
                    (long long)fortran_handle);
  return create_mpi(fn, comm, MPI_Comm_f2c(f));
}

static sn_status_t create_mpi(const char *fn, sn_comm_t **comm, MPI_Comm mpi_comm) {
  if (mpi_comm == MPI_COMM_NULL)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: mpi_comm is MPI_COMM_NULL", fn);
  /* An intercommunicator's all-reduce returns the other group's values: not a world to
   * normalize over. Local test, the same answer on every rank of it: checked before the dup. */
  int inter = 0;
  int rc = MPI_Comm_test_inter(mpi_comm, &inter);
  if (rc != MPI_SUCCESS) return mpi_fail(NULL, "MPI_Comm_test_inter", rc);
  if (inter)
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: mpi_comm is an intercommunicator; pass an intracommunicator (for "
                    "example from MPI_Intercomm_merge)", fn);
  /* SN_COMM_TIMEOUT_S and SN_COMM_CHECK can differ between ranks (Open MPI passes a shell's
   * variables to other hosts only with -x): the ranks agree on them first, so that a rank
   * refusing one does not leave the others waiting inside the dup, and so that the call
   * check is on everywhere where any rank asks for it (a rank checking its calls alone would make
   * collectives the others do not). Collective over mpi_comm, as the dup is. */
  double timeout_s;
  int check = 0;
  const sn_status_t time_st = sn__comm_env_timeout(fn, &timeout_s);
  const sn_status_t env_st = time_st != SN_OK ? time_st : sn__comm_env_check(fn, &check);
  int my_rank = 0, ranks = 1;
  rc = MPI_Comm_rank(mpi_comm, &my_rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mpi_comm, &ranks);
  if (rc != MPI_SUCCESS) return mpi_fail(NULL, "MPI_Comm_rank/size", rc);
  /* The steps (the agreement, a barrier, the dup) are non-blocking, polled against this rank's
   * timeout (SN_COMM_TIMEOUT_S, or the default where it is unset or refused), so that a rank
   * that never arrives makes the others fail with SN_ERR_TIMEOUT here too. A rank arriving after
   * the others gave up completes their abandoned agreement, then times out in the barrier,
   * which they never post: it must not post the dup, since a pending MPI_Comm_idup holds up
   * every later communicator creation in the process in Open MPI 4.1 (even
   * MPI_Comm_dup(MPI_COMM_SELF) hangs behind one). What remains, as in sn_comm_split: a rank
   * stalled for a whole timeout between the barrier and the dup. The agreement and the dup
   * write into heap buffers: after a timeout MPI may still write them, so they are abandoned,
   * as the communicators' staging buffers are. */
  create_wait_t *w = malloc(sizeof *w);
  if (w == NULL) return sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  /* the first rank with a bad SN_COMM_TIMEOUT_S, with a bad SN_COMM_CHECK; −(any rank's check) */
  w->agree[0] = time_st != SN_OK ? my_rank : ranks;
  w->agree[1] = time_st == SN_OK && env_st != SN_OK ? my_rank : ranks;
  w->agree[2] = -check;
  MPI_Request req;
  rc = MPI_Iallreduce(MPI_IN_PLACE, w->agree, 3, MPI_INT, MPI_MIN, mpi_comm, &req);
  SN_TRY(create_step(fn, rc, &req, timeout_s, my_rank, ranks,
                     "MPI_Iallreduce (SN_COMM_TIMEOUT_S)", w, 1));
  const int agree[3] = {w->agree[0], w->agree[1], w->agree[2]};
  if (env_st != SN_OK || agree[0] < ranks || agree[1] < ranks) free(w);
  if (env_st != SN_OK) return env_st; /* its message is set */
  if (agree[0] < ranks || agree[1] < ranks)
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: %s on rank %d of mpi_comm (this is rank %d); nothing was created", fn,
                    agree[0] < ranks ? "SN_COMM_TIMEOUT_S is not a number of seconds >= 0"
                                     : "SN_COMM_CHECK is neither 0 nor 1",
                    agree[0] < ranks ? agree[0] : agree[1], my_rank);
  rc = MPI_Ibarrier(mpi_comm, &req);
  SN_TRY(create_step(fn, rc, &req, timeout_s, my_rank, ranks, "MPI_Ibarrier", w, 0));
  rc = MPI_Comm_idup(mpi_comm, &w->dup, &req);
  SN_TRY(create_step(fn, rc, &req, timeout_s, my_rank, ranks, "MPI_Comm_idup", w, 1));
  MPI_Comm dup = w->dup;
  free(w);
  rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&dup);
    return mpi_fail(NULL, "MPI_Comm_set_errhandler", rc);
  }
  sn_status_t st = mpi_wrap(comm, dup);
  if (st != SN_OK) MPI_Comm_free(&dup);
  else (*comm)->timeout_s = timeout_s, (*comm)->check = -agree[2];
  return st;
}
