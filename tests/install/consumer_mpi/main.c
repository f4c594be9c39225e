/* A program using the Open MPI communicator of an installed syncnorm (libsyncnorm_mpi, through
 * syncnorm_mpi.h; tests/install/check_install.sh): a SyncBatchNorm layer on MPI_COMM_WORLD, one
 * process (MPI's singleton start). Its training forward over [4, 1, 1] must give
 * running_mean = 0.1·mean and running_var = 0.9 + 0.1·(unbiased variance). Compiled as C and,
 * through ../consumer_mixed, as C++ (where syncnorm_mpi.h keeps the MPI C++ bindings out). */
#include <math.h>
#include <stdio.h>

#include <syncnorm_mpi.h>

int main(void) {
  MPI_Init(NULL, NULL);
  sn_comm_t *world = NULL;
  sn_syncbn_t *bn = NULL;
  sn_syncbn_config_t cfg = sn_syncbn_default_config(1);
  const float x[4] = {1.0f, 2.0f, 3.0f, 6.0f}; /* mean 3, unbiased variance 14/3 */
  float y[4];
  sn_syncbn_params_t p;
  sn_status_t st = sn_comm_create_mpi(&world, MPI_COMM_WORLD);
  if (st == SN_OK) st = sn_syncbn_create(&bn, &cfg, world);
  if (st == SN_OK) st = sn_syncbn_forward(bn, y, x, 4, 1, 1);
  if (st == SN_OK) st = sn_syncbn_params(bn, &p);
  int bad = st != SN_OK;
  if (bad) fprintf(stderr, "SyncBatchNorm: %s: %s\n", sn_status_string(st), sn_last_error());
  if (!bad && !(fabs(p.running_mean[0] - 0.3) <= 1e-6 &&
                fabs(p.running_var[0] - (0.9 + 0.1 * 14.0 / 3.0)) <= 1e-6)) {
    fprintf(stderr, "running_mean %.7f, running_var %.7f\n", (double)p.running_mean[0],
            (double)p.running_var[0]);
    bad = 1;
  }
  sn_syncbn_destroy(bn);
  sn_comm_destroy(world);
  MPI_Finalize();
  if (!bad) printf("consumer_mpi: SyncBatchNorm on MPI ok\n");
  return bad;
}
