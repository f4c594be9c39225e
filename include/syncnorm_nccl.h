/*
 * syncnorm_nccl.h — the NCCL communicator, for SyncBatchNorm on CUDA device memory:
 * libsyncnorm_cuda built with NCCL (CMake: syncnorm::cuda, from find_package(syncnorm
 * COMPONENTS cuda); pkg-config: syncnorm-cuda). Everything else about communicators and
 * SyncBatchNorm is in syncnorm_dist.h, which this header includes.
 */
#ifndef SYNCNORM_NCCL_H
#define SYNCNORM_NCCL_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "syncnorm_dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Communicator over a BLOCKING NCCL communicator (a non-blocking one, ncclConfig_t blocking = 0,
 * is not supported: one still initializing is SN_ERR_UNSUPPORTED here, and an ncclInProgress
 * from a collective is treated as a failure): buffers are CUDA device memory and every all-reduce
 * (ncclAllReduce, in place) is enqueued on `stream` and returns at once, without waiting on the
 * host, so a step can be captured in a CUDA graph (cudaStreamBeginCapture on stream). Local,
 * not collective. One process (or one thread) per GPU, with the communicator's device current
 * in every call: each layer call makes its own ncclAllReduce outside any NCCL group, so one
 * thread driving several GPUs (ncclCommInitAll's communicators in one thread) would deadlock
 * in the first synchronized forward; a call made with another device current is
 * SN_ERR_INVALID_ARGUMENT. nccl (from ncclCommInitRank) is NOT owned: the caller
 * destroys it after sn_comm_destroy, and keeps it and stream alive until then. A communicator
 * from sn_comm_split on this one owns its ncclComm_t (ncclCommSplit) and destroys it.
 * Before each collective ncclCommGetAsyncError is asked; an asynchronous error aborts nccl
 * (ncclCommAbort, which frees it: do not destroy it then) and later calls fail with SN_ERR_COMM.
 * Whatever breaks the communicator (SN_ERR_COMM, SN_ERR_TIMEOUT, or SN_ERR_CUDA from its own
 * CUDA calls: any failure after which later calls fail with "broken") has aborted nccl
 * first: after such an error the caller must neither use nor ncclCommDestroy its ncclComm_t,
 * only sn_comm_destroy this handle. Make one handle per ncclComm_t: an abort through one leaves
 * every other handle over the same ncclComm_t pointing at freed memory.
 * Where the host needs a result (the call check SN_COMM_CHECK, a layer's check_consistency:
 * small int64 arrays staged through an 8 KiB device buffer allocated here), the host waits
 * for stream, polling it under the timeout (sn_comm_set_timeout): on a timeout nccl is aborted
 * likewise and SN_ERR_TIMEOUT returned; such calls cannot be captured in a graph: made while
 * stream is being captured they return SN_ERR_UNSUPPORTED before enqueueing anything, and the
 * communicator stays usable. The timeout covers only these host waits of the library: the
 * collectives themselves are not waited for, so with check_consistency off (and SN_COMM_CHECK
 * unset) a dead or missing rank leaves stream blocked and the caller's own synchronization of
 * it (cudaStreamSynchronize) unbounded; bound it yourself (NCCL's own timeouts, or polling
 * with cudaStreamQuery and ncclCommAbort).
 * sn_comm_all_identical is SN_ERR_UNSUPPORTED. SN_COMM_TIMEOUT_S and SN_COMM_CHECK are read
 * here, on this rank only: set them alike on every rank. Errors: SN_ERR_NULL_POINTER (comm or
 * nccl NULL), SN_ERR_INVALID_ARGUMENT (the environment variables), SN_ERR_COMM (nccl reports an
 * error), SN_ERR_UNSUPPORTED (a non-blocking nccl still initializing), SN_ERR_CUDA,
 * SN_ERR_ALLOC. */
SN_API sn_status_t sn_comm_create_nccl(sn_comm_t **comm, ncclComm_t nccl, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* SYNCNORM_NCCL_H */
