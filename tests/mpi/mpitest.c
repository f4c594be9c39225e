/* mpitest.c — see mpitest.h. */
#include "mpitest.h"

#include <stdio.h>
#include <stdlib.h>

int mt_rank = 0, mt_size = 1;
sn_comm_t *mt_world = NULL;

int mt_main(int argc, char **argv, Suite *(*make_suite)(void)) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
  if (sn_comm_create_mpi(&mt_world, MPI_COMM_WORLD) != SN_OK ||
      sn_comm_set_timeout(mt_world, MT_TIMEOUT_S) != SN_OK) {
    fprintf(stderr, "rank %d: cannot create the communicator: %s\n", mt_rank, sn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  SRunner *sr = srunner_create(make_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, mt_rank == 0 ? CK_NORMAL : CK_SILENT);
  int failed = srunner_ntests_failed(sr);
  if (failed && mt_rank != 0) { /* rank 0 prints its own; others say what failed here */
    TestResult **res = srunner_failures(sr);
    for (int i = 0; i < failed; i++)
      fprintf(stderr, "rank %d: %s:%d: %s\n", mt_rank, tr_lfile(res[i]), tr_lno(res[i]), tr_msg(res[i]));
    free(res);
  }
  srunner_free(sr);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed == 0 && any != 0)
    fprintf(stderr, "rank %d: passed, but another rank failed\n", mt_rank);
  sn_comm_destroy(mt_world);
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int64_t mt_split_sizes(int64_t *sizes, int p, uint64_t seed, int allow_empty) {
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  int64_t total = 0;
  for (int i = 0; i < p; i++) {
    sizes[i] = tu_rng_int(&r, allow_empty ? 0 : 1, 4);
    total += sizes[i];
  }
  if (total < 2) { /* BatchNorm training needs a global count of at least 2 */
    sizes[0] += 2;
    total += 2;
  }
  return total;
}

void mt_fill(void *x, int64_t count, sn_dtype_t dtype, uint64_t seed, int exact) {
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  double mean = 3.0 * tu_rng_normal(&r), std = 0.5 + tu_rng_uniform(&r);
  for (int64_t i = 0; i < count; i++) {
    double v = exact ? (double)tu_rng_int(&r, -32, 32) / 4.0 : mean + std * tu_rng_normal(&r);
    tu_set(x, i, v, dtype);
  }
}
