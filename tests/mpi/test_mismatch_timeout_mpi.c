/*
 * test_mismatch_timeout_mpi.c — a SyncBatchNorm mismatch whose second collective (the one that
 * names the ranks, dist/syncbn.c check_consistency) does not complete in time on one rank.
 *
 * A profiling-interface wrapper makes rank 1 post that collective (the only int64 sum
 * all-reduce the layer makes) LATE_S seconds late; rank 0's communicator times out after
 * TIMEOUT_S. Rank 0 must get SN_ERR_TIMEOUT (not a plain mismatch: its communicator is broken,
 * and its next call fails with SN_ERR_COMM), with the mismatch (the range of C, which needs no
 * second collective) and the reason the ranks are not named in the message; rank 1, whose
 * collective completes once it posts its part, gets SN_ERR_MISMATCH naming both ranks.
 * The communicator's call check (SN_COMM_CHECK=1, dist/comm.c) the same way: its naming
 * collective late on rank 1 (test_call_check_naming_times_out), and its first collective late
 * while rank 0 tells an argument error of its own (test_call_check_telling_times_out).
 * Run with 2 ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitest.h"

/* Rank 0's communicator timeout, and how late rank 1 posts its part: well past it. */
#define TIMEOUT_S 1.0
#define LATE_S 3

static int armed;                 /* the next int64 all-reduce of rank 1 with armed_op is late */
static MPI_Op armed_op = MPI_SUM; /* MPI_SUM: the naming collectives; MPI_MAX: the checks' */

int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request *req) {
  if (armed && mt_rank == 1 && type == MPI_INT64_T && op == armed_op) {
    armed = 0;
    sleep(LATE_S);
  }
  return PMPI_Iallreduce(sendbuf, recvbuf, count, type, op, comm, req);
}

/* A communicator over MPI_COMM_WORLD with the call check on (SN_COMM_CHECK=1 at creation). */
static sn_comm_t *checked_comm(void) {
  ck_assert_int_eq(setenv("SN_COMM_CHECK", "1", 1), 0);
  sn_comm_t *comm = NULL;
  MT_OK(sn_comm_create_mpi(&comm, MPI_COMM_WORLD));
  ck_assert_int_eq(unsetenv("SN_COMM_CHECK"), 0);
  return comm;
}

/* The naming collective of a mismatch timed out on rank 0 (st: SN_ERR_TIMEOUT, with `range`,
 * the mismatch's range, and why the ranks are not named), completed on rank 1 (SN_ERR_MISMATCH
 * naming the ranks: `ranks`). */
static void assert_naming_timed_out(sn_status_t st, const char *range, const char *ranks) {
  const char *msg = sn_last_error();
  if (mt_rank == 0) {
    ck_assert_msg(st == SN_ERR_TIMEOUT, "rank 0: got %s: %s", sn_status_string(st), msg);
    ck_assert_msg(strstr(msg, range) != NULL && strstr(msg, "then naming the ranks failed") != NULL,
                  "rank 0: %s", msg);
  } else {
    ck_assert_msg(st == SN_ERR_MISMATCH, "rank 1: got %s: %s", sn_status_string(st), msg);
    ck_assert_msg(strstr(msg, ranks) != NULL, "rank 1: %s", msg);
  }
}

START_TEST(test_naming_times_out) {
  ck_assert_int_eq(mt_size, 2);
  sn_comm_t *comm = NULL;
  MT_OK(sn_comm_create_mpi(&comm, MPI_COMM_WORLD));
  MT_OK(sn_comm_set_timeout(comm, mt_rank == 0 ? TIMEOUT_S : MT_TIMEOUT_S));
  sn_syncbn_config_t cfg = sn_syncbn_default_config(mt_rank == 1 ? 4 : 3);
  cfg.check_consistency = 1;
  cfg.layer_id = 5;
  sn_syncbn_t *bn = NULL;
  MT_OK(sn_syncbn_create(&bn, &cfg, comm));
  float x[2 * 4 * 2], y[2 * 4 * 2];
  mt_fill(x, 2 * cfg.num_features * 2, SN_DTYPE_F32, 5, 0);
  armed = 1;
  assert_naming_timed_out(sn_syncbn_forward(bn, y, x, 2, 2, 1),
                          "C (num_features) differs across ranks (3..4)",
                          "C (num_features) differs across ranks (3 on rank 0; 4 on rank 1)");
  if (mt_rank == 0)
    ck_assert_int_eq(sn_syncbn_forward(bn, y, x, 2, 2, 1), SN_ERR_COMM); /* broken now */
  sn_syncbn_destroy(bn);
  sn_comm_destroy(comm);
}
END_TEST

/* The call check finds another count; its second collective (naming the ranks: an int64 sum)
 * is late on rank 1: rank 0 SN_ERR_TIMEOUT with the range and the reason, rank 1 the ranks. */
START_TEST(test_call_check_naming_times_out) {
  ck_assert_int_eq(mt_size, 2);
  sn_comm_t *comm = checked_comm();
  MT_OK(sn_comm_set_timeout(comm, mt_rank == 0 ? TIMEOUT_S : MT_TIMEOUT_S));
  double b[8] = {0};
  armed_op = MPI_SUM, armed = 1;
  assert_naming_timed_out(sn_comm_allreduce_sum(comm, b, mt_rank == 1 ? 5 : 8, SN_DTYPE_F64),
                          "count differs across ranks (5..8)",
                          "count differs across ranks (8 on rank 0; 5 on rank 1)");
  if (mt_rank == 0)
    ck_assert_int_eq(sn_comm_allreduce_sum(comm, b, 8, SN_DTYPE_F64), SN_ERR_COMM); /* broken */
  for (int i = 0; i < 8; i++) ck_assert(b[i] == 0.0);
  sn_comm_destroy(comm);
}
END_TEST

/* Rank 0's own argument error (a NULL buf) is told in the check's first collective (an int64
 * max), which is late on rank 1: rank 0 returns SN_ERR_TIMEOUT with its own message and why the
 * telling failed; rank 1, once it posts, sees the mismatch, and its naming collective (which
 * rank 0, broken, never makes) times out in turn. */
START_TEST(test_call_check_telling_times_out) {
  ck_assert_int_eq(mt_size, 2);
  sn_comm_t *comm = checked_comm();
  MT_OK(sn_comm_set_timeout(comm, TIMEOUT_S));
  double b[8] = {0};
  armed_op = MPI_MAX, armed = 1;
  const sn_status_t st = sn_comm_allreduce_sum(comm, mt_rank == 0 ? NULL : b, 8, SN_DTYPE_F64);
  const char *msg = sn_last_error();
  ck_assert_msg(st == SN_ERR_TIMEOUT, "rank %d: got %s: %s", mt_rank, sn_status_string(st), msg);
  if (mt_rank == 0)
    ck_assert_msg(strstr(msg, "buf must not be NULL; then telling the other ranks failed") &&
                      strstr(msg, "waited"),
                  "rank 0: %s", msg);
  else
    ck_assert_msg(strstr(msg, "own checks") && strstr(msg, "(passed..SN_ERR_NULL_POINTER)") &&
                      strstr(msg, "then naming the ranks failed"),
                  "rank 1: %s", msg);
  for (int i = 0; i < 8; i++) ck_assert(b[i] == 0.0);
  sn_comm_destroy(comm);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("mismatch_timeout_mpi");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_naming_times_out);
  tcase_add_test(tc, test_call_check_naming_times_out);
  tcase_add_test(tc, test_call_check_telling_times_out);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) { return mt_main(argc, argv, make_suite); }
