/* A program built against an installed syncnorm (tests/install/check_install.sh): LayerNorm of
 * one row [2000, 2001, 2002, 2003], the example, must give ±1.341635 and ±0.447212.
 * Where the library has MPI, also a SyncBatchNorm layer on MPI_COMM_WORLD (one process, MPI's
 * singleton start): through syncnorm_dist.h, which includes <mpi.h>, so the program must link
 * MPI through the package as it is (a review: from C++ the MPI C++ bindings came along and did
 * not link; pkg-config's --libs lacked -lmpi). Its training forward over [4, 1, 1] must give
 * running_mean = 0.1·mean and running_var = 0.9 + 0.1·(unbiased variance). */
#include <math.h>
#include <stdio.h>

#include <syncnorm.h>
#include <syncnorm_dist.h>

static int check_syncbn(void) {
#if SN_HAVE_MPI
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
  if (!bad) printf("consumer: SyncBatchNorm on MPI ok\n");
  return bad;
#else
  return 0;
#endif
}

int main(void) {
  const float x[4] = {2000.0f, 2001.0f, 2002.0f, 2003.0f};
  const double want[4] = {-1.341635, -0.447212, 0.447212, 1.341635};
  float y[4], mean, rstd;
  const sn_status_t st = sn_layernorm_fwd(y, &mean, &rstd, x, NULL, NULL, 1, 4, 1e-5f,
                                          SN_DTYPE_F32);
  if (st != SN_OK) {
    fprintf(stderr, "sn_layernorm_fwd: %s: %s\n", sn_status_string(st), sn_last_error());
    return 1;
  }
  for (int i = 0; i < 4; i++)
    if (!(fabs(y[i] - want[i]) <= 1e-5)) {
      fprintf(stderr, "y[%d] = %.7f, want %.6f\n", i, (double)y[i], want[i]);
      return 1;
    }
  if (check_syncbn() != 0) return 1;
  printf("consumer: ok (syncnorm %s)\n", sn_version());
  return 0;
}
