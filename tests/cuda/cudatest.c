/* cudatest.c — see cudatest.h. */
#include "cudatest.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ct_no_device(const char *test) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    printf("SKIPPED: %s: no CUDA device (%s)\n", test,
           err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found 0");
    return 1;
  }
  return 0;
}

int ct_run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

static void ct_check(cudaError_t err, const char *what) {
  if (err != cudaSuccess) ck_abort_msg("%s: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
}

void *ct_alloc_poison(size_t bytes) {
  void *p = NULL;
  ct_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  ct_check(cudaMemset(p, 0xFF, bytes ? bytes : 1), "cudaMemset");
  return p;
}

void *ct_upload(const void *host, size_t bytes) {
  void *p = NULL;
  ct_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  if (bytes) ct_check(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  return p;
}

void ct_download(void *host, const void *dev, size_t bytes) {
  ct_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (bytes) ct_check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

void ct_free(void *dev) {
  if (dev) cudaFree(dev);
}

void ct_sync(void) { ct_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
