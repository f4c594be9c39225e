/*
 * common.cu — host helpers of the CUDA kernels: launch checks, device count.
 */
#include "common.cuh"

sn_status_t sn__cuda_status(const char *fn, cudaError_t err) {
  if (err == cudaSuccess) return SN_OK;
  return sn__fail(SN_ERR_CUDA, "%s: CUDA error %s (%s)", fn, cudaGetErrorName(err),
                  cudaGetErrorString(err));
}

sn_status_t sn__cuda_launched(const char *fn) { return sn__cuda_status(fn, cudaGetLastError()); }

extern "C" sn_status_t sn__cuda_pending(const char *fn) {
  const cudaError_t err = cudaPeekAtLastError();
  if (err == cudaSuccess) return SN_OK;
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice ||
      err == cudaErrorInitializationError || err == cudaErrorStubLibrary)
    return sn__fail(SN_ERR_CUDA, "%s: no usable CUDA device or driver: %s (%s)", fn,
                    cudaGetErrorName(err), cudaGetErrorString(err));
  return sn__fail(SN_ERR_CUDA,
                  "%s: a CUDA error was pending before this call, from earlier work of the "
                  "program: %s (%s); nothing was enqueued, and the error is left pending (clear "
                  "it with cudaGetLastError)",
                  fn, cudaGetErrorName(err), cudaGetErrorString(err));
}

extern "C" sn_status_t sn_cuda_device_count(int *count) {
  SN_TRY(sn__check_ptr("sn_cuda_device_count", "count", count));
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); /* no driver or no device: not an error, and not sticky */
    n = 0;
  }
  *count = n;
  return SN_OK;
}
