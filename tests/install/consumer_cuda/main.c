/* A program using an installed syncnorm's CUDA component (libsyncnorm_cuda, syncnorm_cuda.h,
 * syncnorm_nccl.h where built with NCCL; tests/install/check_install.sh). Compiled and linked
 * everywhere, run only where a GPU is (scripts/gpu-check.sh): the LayerNorm of one row on the
 * device, and a device-memory SyncBatchNorm layer without a communicator (which needs the
 * device kernels registered: a static link must keep them). Without a device it says so and
 * exits 77. */
#include <math.h>
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <syncnorm_cuda.h>
#include <syncnorm_dist.h>
#if SN_HAVE_NCCL
#include <syncnorm_nccl.h>
#endif

int main(void) {
#if SN_HAVE_NCCL
  sn_status_t (*create_nccl)(sn_comm_t **, ncclComm_t, cudaStream_t) = sn_comm_create_nccl;
  if (create_nccl == NULL) return 1; /* the symbol resolves at link time */
#endif
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("consumer_cuda: linked; no CUDA device to run on\n");
    return 77;
  }
  const float x[4] = {2000.0f, 2001.0f, 2002.0f, 2003.0f};
  float y[4], *dx = NULL, *dy = NULL, *dm = NULL, *dr = NULL;
  int bad = cudaMalloc((void **)&dx, sizeof x) != cudaSuccess ||
            cudaMalloc((void **)&dy, sizeof y) != cudaSuccess ||
            cudaMalloc((void **)&dm, 8) != cudaSuccess || cudaMalloc((void **)&dr, 8) != cudaSuccess;
  if (!bad) bad = cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice) != cudaSuccess;
  sn_status_t st = SN_OK;
  if (!bad) st = sn_cuda_layernorm_fwd(dy, dm, dr, dx, NULL, NULL, 1, 4, 1e-5f, SN_DTYPE_F32, 0);
  if (!bad && st == SN_OK) bad = cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost) != cudaSuccess;
  if (!bad && st == SN_OK && !(fabs(y[3] - 1.341635) <= 1e-5)) bad = 1;
  sn_syncbn_t *bn = NULL;
  sn_syncbn_config_t cfg = sn_syncbn_default_config(1);
  cfg.device_memory = 1;
  if (!bad && st == SN_OK) st = sn_syncbn_create(&bn, &cfg, NULL);
  if (!bad && st == SN_OK) st = sn_syncbn_forward(bn, dy, dx, 4, 1, 1);
  if (st != SN_OK) fprintf(stderr, "%s: %s\n", sn_status_string(st), sn_last_error());
  sn_syncbn_destroy(bn);
  cudaFree(dx), cudaFree(dy), cudaFree(dm), cudaFree(dr);
  if (bad || st != SN_OK) return 1;
  printf("consumer_cuda: ok\n");
  return 0;
}
