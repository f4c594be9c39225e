/*
 * cudatest.h — device-memory helpers for the CUDA tests (tests/cuda/). Each test program compares
 * a CUDA kernel with the CPU kernel of the same name on the same inputs; see testutil.h for the
 * host-side helpers (random fills, ulp distances, the bf16/f16 forward bound, poisoning).
 */
#ifndef SN_CUDATEST_H
#define SN_CUDATEST_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "syncnorm_cuda.h"
#include "testutil.h"

/* Exit status CTest reads as SKIPPED (SKIP_RETURN_CODE in tests/cuda/CMakeLists.txt). */
#define CT_SKIP_CODE 77

/* Call first in main(): where no CUDA device is present, prints "SKIPPED: <test>: no CUDA device
 * (<reason>)" and returns 1 (main then returns CT_SKIP_CODE); else 0. */
int ct_no_device(const char *test);

/* Runs the suite like tu_run_suite, but without forking a process per test: a process that has
 * initialized CUDA (ct_no_device does) cannot use it in a fork()ed child. A failing check ends
 * its test case only; a sticky CUDA error (a kernel fault) fails every later case too. Returns
 * EXIT_SUCCESS or EXIT_FAILURE for main. Use it, not tu_run_suite, in every CUDA test. */
int ct_run_suite(Suite *s);

/* cudaMalloc of bytes (at least 1), filled with 0xFF bytes: NaN in f32, bf16, f16 and f64, so
 * an element a kernel fails to write shows. Fails the test (ck_abort) on a CUDA error. */
void *ct_alloc_poison(size_t bytes);
/* cudaMalloc + copy of bytes from host. */
void *ct_upload(const void *host, size_t bytes);
/* Copy bytes from device to host after cudaDeviceSynchronize; fails the test on a CUDA error. */
void ct_download(void *host, const void *dev, size_t bytes);
/* cudaFree (NULL allowed). */
void ct_free(void *dev);
/* cudaDeviceSynchronize, failing the test with the CUDA error's name. */
void ct_sync(void);

#endif /* SN_CUDATEST_H */
