/*
 * mpitest.h — helpers for multi-rank tests: every rank runs the same Check suite in one process
 * (CK_NOFORK, MPI cannot fork), builds the same global batch from a seed and takes its slice.
 */
#ifndef SN_MPITEST_H
#define SN_MPITEST_H

#include <mpi.h>

#include "syncnorm_mpi.h"
#include "testutil.h"

extern int mt_rank, mt_size;
extern sn_comm_t *mt_world; /* sn_comm over MPI_COMM_WORLD, timeout MT_TIMEOUT_S */

/* A hung collective in a test fails after this many seconds instead of hanging CTest. */
#define MT_TIMEOUT_S 60.0

/* Asserts a library call returned SN_OK, printing its message otherwise. */
#define MT_OK(call)                                                                       \
  do {                                                                                    \
    sn_status_t mt_st_ = (call);                                                          \
    ck_assert_msg(mt_st_ == SN_OK, "rank %d: %s -> %s: %s", mt_rank, #call,               \
                  sn_status_string(mt_st_), sn_last_error());                             \
  } while (0)

/* Initializes MPI and mt_world, runs the suite with CK_NOFORK on every rank, finalizes.
 * Returns the exit code: non-zero if this rank failed a test. */
int mt_main(int argc, char **argv, Suite *(*make_suite)(void));

/* Per-rank batch sizes (samples) for a global batch: uneven, some ranks may get 0.
 * sizes[r] for r < mt_size; returns the global count of samples. */
int64_t mt_split_sizes(int64_t *sizes, int p, uint64_t seed, int allow_empty);

/* Fills the global activation x [N, C, S] (or NHWC) deterministically from seed: values
 * mean_c + std·N(0,1) per channel, or small dyadic integers/4 in [−8, 8] when exact != 0. */
void mt_fill(void *x, int64_t count, sn_dtype_t dtype, uint64_t seed, int exact);

#endif /* SN_MPITEST_H */
