/* A single-process program built against an installed libsyncnorm alone
 * (tests/install/check_install.sh), with no MPI, CUDA or NCCL flag on its command line:
 *  - LayerNorm of one row [2000, 2001, 2002, 2003] must give ±1.341635 and ±0.447212;
 *  - a SyncBatchNorm layer without a communicator and one on sn_comm_create_self: a training
 *    forward over [4, 1, 1] must give running_mean = 0.1·mean and
 *    running_var = 0.9 + 0.1·(unbiased variance);
 *  - the layer saved to a safetensors checkpoint and loaded into a fresh layer gives back the
 *    same running statistics and num_batches_tracked. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <syncnorm.h>
#include <syncnorm_dist.h>

static int fail(const char *what, sn_status_t st) {
  fprintf(stderr, "%s: %s: %s\n", what, sn_status_string(st), sn_last_error());
  return 1;
}

/* One training forward of [4, 1, 1] on a layer over comm (NULL: none), then a checkpoint round
 * trip through path. */
static int check_syncbn(sn_comm_t *comm, const char *path) {
  sn_syncbn_t *bn = NULL, *back = NULL;
  sn_syncbn_config_t cfg = sn_syncbn_default_config(1);
  const float x[4] = {1.0f, 2.0f, 3.0f, 6.0f}; /* mean 3, unbiased variance 14/3 */
  float y[4];
  sn_syncbn_params_t p, q;
  const char *prefix = "bn1";
  sn_status_t st = sn_syncbn_create(&bn, &cfg, comm);
  if (st == SN_OK) st = sn_syncbn_forward(bn, y, x, 4, 1, 1);
  if (st == SN_OK) st = sn_syncbn_params(bn, &p);
  if (st == SN_OK) st = sn_syncbn_save(path, &bn, &prefix, 1);
  if (st == SN_OK) st = sn_syncbn_create(&back, &cfg, NULL);
  if (st == SN_OK) st = sn_syncbn_load(path, &back, &prefix, 1);
  if (st == SN_OK) st = sn_syncbn_params(back, &q);
  int bad = st != SN_OK ? fail("SyncBatchNorm", st) : 0;
  if (!bad && !(fabs(p.running_mean[0] - 0.3) <= 1e-6 &&
                fabs(p.running_var[0] - (0.9 + 0.1 * 14.0 / 3.0)) <= 1e-6)) {
    fprintf(stderr, "running_mean %.7f, running_var %.7f\n", (double)p.running_mean[0],
            (double)p.running_var[0]);
    bad = 1;
  }
  if (!bad && (memcmp(p.running_mean, q.running_mean, sizeof(float)) != 0 ||
               memcmp(p.running_var, q.running_var, sizeof(float)) != 0 ||
               *p.num_batches_tracked != 1 || *q.num_batches_tracked != 1)) {
    fprintf(stderr, "the checkpoint did not give the same state back\n");
    bad = 1;
  }
  sn_syncbn_destroy(back);
  sn_syncbn_destroy(bn);
  unlink(path);
  return bad;
}

int main(void) {
  const float x[4] = {2000.0f, 2001.0f, 2002.0f, 2003.0f};
  const double want[4] = {-1.341635, -0.447212, 0.447212, 1.341635};
  float y[4], mean, rstd;
  const sn_status_t st = sn_layernorm_fwd(y, &mean, &rstd, x, NULL, NULL, 1, 4, 1e-5f,
                                          SN_DTYPE_F32);
  if (st != SN_OK) return fail("sn_layernorm_fwd", st);
  for (int i = 0; i < 4; i++)
    if (!(fabs(y[i] - want[i]) <= 1e-5)) {
      fprintf(stderr, "y[%d] = %.7f, want %.6f\n", i, (double)y[i], want[i]);
      return 1;
    }
  char path[64];
  snprintf(path, sizeof path, "consumer-%ld.safetensors", (long)getpid());
  if (check_syncbn(NULL, path) != 0) return 1;
  sn_comm_t *self = NULL;
  const sn_status_t cst = sn_comm_create_self(&self);
  if (cst != SN_OK) return fail("sn_comm_create_self", cst);
  const int bad = check_syncbn(self, path);
  sn_comm_destroy(self);
  if (bad) return 1;
  printf("consumer: ok (syncnorm %s: kernels, SyncBatchNorm, checkpoint)\n", sn_version());
  return 0;
}
