/*
 * syncnorm_dist.h — communicators, SyncBatchNorm and checkpoint (safetensors) I/O: libsyncnorm.
 *
 * Names no MPI, CUDA or NCCL type: a single-process program (SyncBatchNorm without a
 * communicator or on sn_comm_create_self, checkpoints) compiles with plain `cc`. The
 * communicators over MPI and NCCL are created through syncnorm_mpi.h (libsyncnorm_mpi) and
 * syncnorm_nccl.h (libsyncnorm_cuda); everything else about them is here. Conventions are those
 * of syncnorm.h: every function returns sn_status_t with a detail in sn_last_error(), outputs
 * before inputs, int64_t sizes, nothing written on error. Handles are opaque; destroy functions
 * accept NULL. A destroyed handle, or a pointer that never was one, is SN_ERR_INVALID_HANDLE
 * (destroying it is a no-op, also from two threads at once), checked against the set of live
 * handles without reading it, until a later create returns the same address: that handle is
 * then the new object, as with free and malloc.
 *
 * Collectives: every function documented as "collective" must be called by every rank of the
 * communicator, in the same order. Misuse is detected where possible (check_consistency,
 * SN_COMM_CHECK) and bounded in time by the communicator's timeout, never left to hang
 * silently; treat any error as fatal to the step on every rank. What each rank sees on a
 * mismatch, a timeout or an error of one rank's own arguments, and train/eval across ranks:
 * docs/SEMANTICS.md.
 */
#ifndef SYNCNORM_DIST_H
#define SYNCNORM_DIST_H

#include <stdint.h>

#include "syncnorm.h"
#include "syncnorm_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Communicators                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* A group of ranks that all-reduce together (opaque). Backends: "self" (one rank, no MPI), "mpi"
 * (host buffers), "nccl" (device buffers on a CUDA stream). */
typedef struct sn_comm sn_comm_t;

/* A world of one rank: every all-reduce is the identity. *comm receives the handle (host object);
 * free it with sn_comm_destroy. Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_ARGUMENT
 * (SN_COMM_TIMEOUT_S set to a value that is not a number of seconds >= 0: see
 * sn_comm_set_timeout; SN_COMM_CHECK set to another value than 0 or 1: see
 * sn_comm_allreduce_sum), SN_ERR_ALLOC. */
SN_API sn_status_t sn_comm_create_self(sn_comm_t **comm);

/* Element types and reductions of a callback communicator's all-reduce. */
typedef enum { SN_COMM_F32 = 0, SN_COMM_F64 = 1, SN_COMM_I64 = 2 } sn_comm_type_t;
typedef enum { SN_COMM_SUM = 0, SN_COMM_MAX = 1 } sn_comm_op_t;

/* The all-reduce of a callback communicator: in place, count > 0 elements of `type` at buf (host
 * memory), reduced with `op` over the group's ranks, the result bitwise identical on every rank.
 * timeout_s: the communicator's timeout (0: none) for the callback to honour where its runtime
 * can. Returns SN_OK, SN_ERR_TIMEOUT, or any other status for a failure. */
typedef sn_status_t (*sn_comm_allreduce_fn)(void *user, void *buf, int64_t count,
                                            sn_comm_type_t type, sn_comm_op_t op,
                                            double timeout_s);

/* A communicator ("callback") whose collectives call `allreduce` (with `user`, not owned, which
 * must outlive the communicator): for runtimes syncnorm does not link, such as a
 * torch.distributed process group (python/syncnorm/torch). This rank is `rank` of `size`; every
 * rank of the group creates one and calls the same collectives, as with the other backends. The
 * callback is called from the thread making the collective. A callback that fails breaks the
 * communicator: the call returns SN_ERR_TIMEOUT (where the callback said so) or SN_ERR_COMM, and
 * later calls SN_ERR_COMM. The timeout (sn_comm_set_timeout) is handed to the callback, which is
 * what bounds the wait; SN_COMM_CHECK and check_consistency work as on "mpi". sn_comm_split is
 * SN_ERR_UNSUPPORTED (create a communicator over the subgroup instead). Local, not collective.
 * Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_ARGUMENT (not 0 <= rank < size; the environment
 * variables, as sn_comm_create_self), SN_ERR_ALLOC. */
SN_API sn_status_t sn_comm_create_callback(sn_comm_t **comm, int rank, int size,
                                           sn_comm_allreduce_fn allreduce, void *user);

/* Splits comm into sub-communicators, as MPI_Comm_split / PyTorch's process groups: ranks with
 * the same color form a group, ordered by key then by rank. Collective over comm. color < 0
 * gives *sub = NULL (this rank joins no group). *sub is owned by the caller (sn_comm_destroy) and
 * inherits the timeout and the call check (SN_COMM_CHECK, see sn_comm_allreduce_sum, which also
 * checks this call). Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_HANDLE, SN_ERR_MISMATCH (the
 * call check), SN_ERR_COMM, SN_ERR_TIMEOUT, SN_ERR_ALLOC. */
SN_API sn_status_t sn_comm_split(sn_comm_t *comm, sn_comm_t **sub, int color, int key);

/* This process's rank in comm (0 ≤ rank < size). Errors: SN_ERR_NULL_POINTER,
 * SN_ERR_INVALID_HANDLE. */
SN_API sn_status_t sn_comm_rank(const sn_comm_t *comm, int *rank);

/* Number of ranks in comm. Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_HANDLE. */
SN_API sn_status_t sn_comm_size(const sn_comm_t *comm, int *size);

/* Name of comm's backend: "self", "callback", "mpi" or "nccl" (static string); "invalid" for a bad
 * handle. */
SN_API const char *sn_comm_backend(const sn_comm_t *comm);

/* In-place sum all-reduce of count elements of dtype SN_DTYPE_F32 or SN_DTYPE_F64 in buf (host
 * memory for "self"/"mpi", device memory for "nccl", enqueued on its stream). Collective: every
 * rank passes the same count and dtype. By default that is not checked (as MPI_Allreduce:
 * another count or dtype on some rank mixes or truncates buffers, and Open MPI may end the job;
 * an argument error returns on that rank only, before the collective, and the others wait for
 * the timeout; the layers check theirs with check_consistency).
 * The call check, for debugging (as PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL): with the
 * environment variable SN_COMM_CHECK=1 when the communicator is created (inherited by
 * sn_comm_split), every collective on it (this function's, sn_comm_all_identical's,
 * sn_comm_split's and the layers' all-reduces) is first compared across the ranks with one
 * max-all-reduce of 10 int64: which function, the count, element type and reduction of its
 * all-reduce, and whether this rank's own argument checks passed (a rank whose checks fail
 * still joins it, as does a SyncBatchNorm training forward, or backward after a synchronized
 * forward, whose own checks fail on a layer without check_consistency). Where anything differs,
 * no rank makes the collective: the ranks with a failed check return that error, the others
 * SN_ERR_MISMATCH with a message naming which ranks (of this communicator) hold which value (up
 * to 64 ranks; beyond, the range), e.g. "count differs across ranks (8 on ranks 0, 1; 5 on rank
 * 2)", at once; buffers are not written, and the communicator stays in step. Still local, as
 * without the check: a NULL, destroyed or broken comm handle on that rank (the others wait for
 * the timeout). It cannot see a rank that skipped a call and makes the next one of the same
 * shape, nor catch what the count and dtype do not show; and it doubles the collectives.
 * The result is bitwise identical on every rank. Errors: SN_ERR_NULL_POINTER (buf NULL with
 * count > 0), SN_ERR_INVALID_SIZE (count < 0), SN_ERR_OVERFLOW (count beyond what the backend
 * can send in one call: 2^31 − 1 elements for MPI), SN_ERR_INVALID_DTYPE,
 * SN_ERR_INVALID_HANDLE, SN_ERR_MISMATCH (the call check), SN_ERR_ALLOC (staging buffer),
 * SN_ERR_COMM, SN_ERR_TIMEOUT. */
SN_API sn_status_t sn_comm_allreduce_sum(sn_comm_t *comm, void *buf, int64_t count,
                                         sn_dtype_t dtype);

/* Whether `bytes` bytes at buf (host memory) are identical on every rank: *identical = 1 on
 * every rank if so, 0 on every rank if not. Compares a 64-bit FNV-1a hash (collision chance
 * 2^-64) with one max-all-reduce. Collective (checked with SN_COMM_CHECK=1 as
 * sn_comm_allreduce_sum says). Errors as sn_comm_allreduce_sum, plus SN_ERR_UNSUPPORTED (a
 * backend without max-all-reduce on host buffers: "nccl"). */
SN_API sn_status_t sn_comm_all_identical(sn_comm_t *comm, int *identical, const void *buf,
                                         int64_t bytes);

/* Seconds a collective may wait for the other ranks before it fails with SN_ERR_TIMEOUT (and
 * the communicator is marked broken: later calls fail with SN_ERR_COMM). 0 waits forever; a
 * tiny timeout such as 1e-9 fails any collective that has to wait at all. The default is 1800 s
 * (as PyTorch's process groups), or the environment variable SN_COMM_TIMEOUT_S read at creation
 * (seconds, a decimal number >= 0 such as 300, 2.5 or 1e3; unset or empty: the default; any
 * other value, such as "5m", "-1", "inf", "0x10" or one with spaces, makes the creation fail
 * with SN_ERR_INVALID_ARGUMENT rather than run with a timeout nobody asked for).
 * Sub-communicators from sn_comm_split inherit the parent's timeout. Local, not collective.
 * On an "nccl" communicator it bounds only the library's own host waits (SN_COMM_CHECK,
 * check_consistency, a device layer's state copies and destroy), not the NCCL collectives
 * enqueued on the stream: with check_consistency off a dead rank leaves the stream blocked and
 * the caller's synchronization of it unbounded (sn_comm_create_nccl).
 * Errors:
 * SN_ERR_NULL_POINTER, SN_ERR_INVALID_ARGUMENT (seconds < 0, NaN or infinite: 0 waits forever),
 * SN_ERR_INVALID_HANDLE. */
SN_API sn_status_t sn_comm_set_timeout(sn_comm_t *comm, double seconds);

/* Frees comm (and its duplicated MPI communicator: collective for "mpi", like MPI_Comm_free).
 * NULL is a no-op. Layers created on comm must be destroyed first (their calls fail with
 * SN_ERR_INVALID_HANDLE, unless a new communicator has taken the old one's address). */
SN_API void sn_comm_destroy(sn_comm_t *comm);

/* ------------------------------------------------------------------------------------------ */
/* SyncBatchNorm (torch.nn.SyncBatchNorm semantics)                                             */
/* ------------------------------------------------------------------------------------------ */

/* SN_MOMENTUM_CUMULATIVE (PyTorch's momentum=None) is defined in syncnorm.h. */

typedef struct {
  int64_t num_features;    /* C, > 0 */
  float eps;               /* added to the variance; default 1e-5 */
  float momentum;          /* in [0, 1], or SN_MOMENTUM_CUMULATIVE; default 0.1 */
  int affine;              /* learnable weight (init 1) and bias (init 0); default 1 */
  int track_running_stats; /* keep running_mean (init 0), running_var (init 1); default 1 */
  sn_layout_t layout;      /* NCHW ([N, C, S]) or NHWC ([N, S, C]); default NCHW */
  sn_dtype_t dtype;        /* x, y, dy, dx: f32, bf16 or f16; parameters stay f32; default f32 */
  int check_consistency;   /* before each collective, check all ranks call the same layer id,
                              C, operation, dtype, layout (where this rank's batch is nonempty
                              with s > 1: elsewhere NCHW and NHWC are the same memory),
                              momentum, eps, track_running_stats,
                              affine and check_finite with the same running statistics, and
                              tell the other ranks where this rank's own checks of the call
                              failed (see sn_syncbn_forward) (one extra
                              all-reduce of 24 int64; on a mismatch one more, so that the message
                              names the ranks (of this communicator) holding each value: up to 64
                              ranks all of them, beyond the lowest rank at each end of the range;
                              should that one time out, its SN_ERR_TIMEOUT is returned); default 1.
                              Off, a rank that calls another layer or another size is not detected:
                              MPI mixes or truncates buffers (Open MPI ends the job on a size
                              mismatch: see sn_comm_create_mpi). Set it alike on every rank: ranks
                              that differ in it do different collectives */
  int check_finite;        /* fail with SN_ERR_NONFINITE on every rank, stats untouched, when any
                              rank's x (forward) or dy (backward) holds NaN/Inf; default 0. Set
                              it alike on every rank (ranks that differ in it make different
                              collectives): check_consistency reports a difference */
  int device_memory;       /* x, y, dy, dx, parameters and stats in CUDA device memory (needs an
                              "nccl" communicator, or comm == NULL in a CUDA build: then on the
                              legacy default stream 0, which cannot be captured in a CUDA
                              graph: graph capture needs an "nccl" communicator, one of one
                              rank will do); kernels and the all-reduce are enqueued
                              on the communicator's stream without host waits. check_finite is
                              not available with it (SN_ERR_UNSUPPORTED); see sn_syncbn_forward
                              for what differs from the host path; default 0 */
  int64_t layer_id;        /* identity checked across ranks; -1 (default): creation order on the
                              communicator (0, 1, 2, ...) */
  char name[48];           /* shown in error messages; "" (default): "layer <id>" */
} sn_syncbn_config_t;

/* A SyncBatchNorm layer (opaque): parameters, running statistics and what backward needs. */
typedef struct sn_syncbn sn_syncbn_t;

/* Pointers into a layer's state (host memory, or device memory with cfg.device_memory, the
 * num_batches_tracked int64 included: read or write them with cudaMemcpy after synchronizing the
 * communicator's stream). They stay valid until sn_syncbn_destroy. Writing the running statistics
 * does not touch the pivot of the shifted sums (internal state, identical on every rank: the
 * last synchronized batch mean; a device layer's starts at 0 and is reset to 0 by a load). Each is [C] f32 unless said
 * otherwise. */
typedef struct {
  float *weight, *bias;            /* gamma, beta; NULL without affine */
  float *grad_weight, *grad_bias;  /* dgamma, dbeta of this rank's batch, written (=) by
                                      sn_syncbn_backward; NULL without affine */
  float *running_mean;             /* NULL without track_running_stats */
  float *running_var;              /* unbiased; NULL without track_running_stats */
  int64_t *num_batches_tracked;    /* scalar; NULL without track_running_stats */
  int64_t num_features;            /* C */
} sn_syncbn_params_t;

/* Defaults for C channels, as torch.nn.SyncBatchNorm(C): eps 1e-5, momentum 0.1, affine,
 * track_running_stats, NCHW, f32, layer_id -1, check_finite 0, check_consistency as documented
 * above. Validation happens in sn_syncbn_create. */
SN_API sn_syncbn_config_t sn_syncbn_default_config(int64_t num_features);

/* Creates a layer. comm == NULL: plain local BatchNorm (no communication); otherwise statistics are
 * synchronized over comm (a comm of one rank: nothing to synchronize, the layer makes no
 * collective, as torch.nn.SyncBatchNorm at world size 1), which must outlive the layer; creation is
 * local (no collective), but layers must be created in the same order on every rank when layer_id
 * is -1. *bn receives the handle. Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE
 * (num_features <= 0), SN_ERR_INVALID_EPS, SN_ERR_INVALID_ARGUMENT (momentum, flags),
 * SN_ERR_INVALID_DTYPE, SN_ERR_INVALID_LAYOUT, SN_ERR_INVALID_HANDLE, SN_ERR_UNSUPPORTED (device_memory without CUDA
 * or a CUDA device, with a host communicator, or with check_finite; an "nccl" communicator
 * without device_memory), SN_ERR_OVERFLOW (num_features too large to allocate its
 * buffers), SN_ERR_COMM (comm broken by an earlier failure), SN_ERR_ALLOC; with device_memory
 * also SN_ERR_INVALID_ARGUMENT (the current CUDA device is not the "nccl" communicator's,
 * ncclCommCuDevice: the layer lives on the current device) and SN_ERR_CUDA (a CUDA call failed;
 * creation uploads the initial state on a private stream and waits for it, not for the
 * communicator's stream). */
SN_API sn_status_t sn_syncbn_create(sn_syncbn_t **bn, const sn_syncbn_config_t *cfg,
                                    sn_comm_t *comm);

/* Forward of x [n, C, s] (NCHW) or [n, s, C] (NHWC) into y (same shape, cfg.dtype); y may equal x.
 * training != 0: y from the batch statistics of all ranks (biased variance), then, with running
 * statistics, num_batches_tracked += 1 and running_x = (1−f)·running_x + f·batch_x with
 * f = momentum (or 1/num_batches_tracked for SN_MOMENTUM_CUMULATIVE), the variance unbiased by
 * the global count N: var·N/(N−1). Collective: one all-reduce of 2C+5 f64 (2C+1 on device
 * memory): the shifted sums Σ(x−p), Σ(x−p)² around a pivot p identical on every rank, the count
 * and the pivot's hashes; up to 4 more in a rare step where p was far from the data; plus one
 * for check_consistency. A rank with n·s == 0 still calls it. training == 0: y from the running
 * statistics, local; without running statistics from this rank's own batch statistics, local.
 * With no communicator, or one of one rank, nothing is all-reduced (sn_batchnorm_fwd's bits).
 * A global count of 0 is an empty batch: SN_OK, y and the running statistics untouched,
 * num_batches_tracked += 1 (as PyTorch). Memory: host, or device with cfg.device_memory (on the
 * communicator's stream; what differs there is below). Formulas: Ioffe & Szegedy 2015
 * (arXiv:1502.03167), running statistics as torch.nn.BatchNorm; shifted sums: Chan, Golub &
 * LeVeque 1983. Errors (nothing written; the saved forward kept for argument errors, dropped by
 * any later failure): SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE, SN_ERR_OVERFLOW,
 * SN_ERR_INSUFFICIENT_COUNT (global count 1), SN_ERR_MISMATCH, SN_ERR_NONFINITE, SN_ERR_COMM,
 * SN_ERR_TIMEOUT, SN_ERR_INVALID_HANDLE, SN_ERR_ALLOC, SN_ERR_INVALID_ARGUMENT (eval with a
 * running_var < 0, training with a num_batches_tracked < 0, both written through
 * sn_syncbn_params; y overlapping x partly; x or y over the layer's own arrays). With
 * check_consistency, a rank whose own checks fail still makes the consistency all-reduce, so
 * that the other ranks return SN_ERR_MISMATCH naming it at once (docs/SEMANTICS.md). */
/* With cfg.device_memory (x, y device pointers; statistics on the device) the steps are the
 * same, enqueued on the communicator's stream (the legacy stream 0 without a communicator):
 * sn_cuda_batchnorm_stats around the device-held pivot, ONE all-reduce of 2C + 1 f64 (the sums
 * and the count), the global count read back to the host (one wait for the stream, so that a
 * count of 1 is SN_ERR_INSUFFICIENT_COUNT with nothing written, as on the host), kernels for the
 * statistics, y, and the running statistics and next pivot. What differs from the host: no pivot
 * refinement and no pivot hash slots (sums around the previous batch's mean lose about
 * log2((mean−p)²/var) of fp64's 53 bits where the data's mean jumps by many σ between batches);
 * the device pivot is 0 at creation and after every load, and only a synchronized batch mean
 * sets it; a negative num_batches_tracked written through sn_syncbn_params is taken as 0, and a
 * running_var < 0 in eval mode gives NaN outputs (the host cannot see device state without a
 * wait). CUDA graph capture (cudaStreamBeginCapture on the communicator's stream): with
 * check_consistency off (or one rank) and SN_COMM_CHECK unset, a training forward and backward
 * enqueue one NCCL collective each and never wait on the host; the count is then not read back
 * (a global count of 1 leaves y NaN and the running statistics untouched). The first call of a
 * shape larger than any before allocates the layer's workspace (cudaMalloc after waiting for
 * the stream): make one eager call of the largest shape before capturing (growing frees the old
 * workspace, which graphs captured before still use). What would wait on the host during
 * capture (check_consistency's all-reduce, a workspace that must grow) returns
 * SN_ERR_UNSUPPORTED before enqueueing anything, and the communicator stays usable. */
SN_API sn_status_t sn_syncbn_forward(sn_syncbn_t *bn, void *y, const void *x, int64_t n,
                                     int64_t s, int training);

/* Backward of the last forward, with the same x and shape: dx = γ·rstd·(dy − Σdy/N − x̂·Σdy·x̂/N)
 * with Σ over all ranks (one all-reduce of 2C fp64 values, collective) after a training forward;
 * dx = γ·dy/√(running_var+eps), local, after an eval forward (frozen BatchNorm). grad_weight,
 * grad_bias (=) get this rank's local Σdy·x̂ and Σdy, as PyTorch (data-parallel gradient averaging
 * combines them later). After a forward on batch statistics with nothing to all-reduce
 * (comm == NULL or of one rank in training mode, or eval mode without running statistics) and
 * check_finite off, it is sn_batchnorm_bwd, with the same bits. dx may equal dy. Shapes and
 * dtype as forward; host memory (device memory with
 * cfg.device_memory: the same steps on the device, one all-reduce of 2C f64, no host wait; the
 * global count is taken from the device; see sn_syncbn_forward). Formula:
 * the BatchNorm backward of Ioffe & Szegedy 2015, as torch.nn.SyncBatchNorm's. Errors: as
 * forward (SN_ERR_ALLOC included), plus SN_ERR_INVALID_ARGUMENT (no forward has succeeded since
 * the layer was created or loaded, or the last forward failed after its consistency check; or
 * n/s differ from the forward's). After a synchronized forward of a nonempty global batch, a
 * rank whose own checks fail tells the others as in forward, and the saved forward is kept on
 * every rank (the call can be repeated); without a saved forward the error stays on this rank,
 * which cannot know what the others call. */
SN_API sn_status_t sn_syncbn_backward(sn_syncbn_t *bn, void *dx, const void *dy, const void *x,
                                      int64_t n, int64_t s);

/* Fills *params with pointers into the layer's state. Errors: SN_ERR_NULL_POINTER,
 * SN_ERR_INVALID_HANDLE. */
SN_API sn_status_t sn_syncbn_params(sn_syncbn_t *bn, sn_syncbn_params_t *params);

/* Number of collectives (all-reduces) this layer has issued so far: a training forward adds 1
 * (rarely up to 5, see forward), a backward after it adds 1, consistency checks add 1 each (2
 * when they find a mismatch); none on a communicator of one rank. The communicator's call check
 * (SN_COMM_CHECK=1) adds one of its own before each, not counted here (and an all-reduce it
 * refuses is counted all the same). For benchmarks and tests. Errors: SN_ERR_NULL_POINTER,
 * SN_ERR_INVALID_HANDLE. */
SN_API sn_status_t sn_syncbn_collective_count(const sn_syncbn_t *bn, int64_t *count);

/* What the layer's last forward normalized with, when that was a training forward on batch
 * statistics: *count = its global count of values per channel (over all ranks where
 * synchronized), and, where count > 1, mean [C] (=) the batch mean and var [C] (=) the biased
 * batch variance (host memory; a device_memory layer's are copied from the device after waiting
 * for its stream, under the communicator's timeout). Identical on every rank of a synchronized
 * layer: for checking statistics across ranks against a reference. mean or var may be NULL (not
 * wanted). A count of 0 (an empty global batch) writes only *count. Local, not collective.
 * Errors: SN_ERR_NULL_POINTER (bn, count), SN_ERR_INVALID_HANDLE, SN_ERR_INVALID_ARGUMENT (no
 * forward has succeeded since the layer was created or loaded, or the last one used the running
 * statistics), and for a device_memory layer SN_ERR_CUDA, SN_ERR_TIMEOUT, SN_ERR_COMM. */
SN_API sn_status_t sn_syncbn_batch_stats(sn_syncbn_t *bn, int64_t *count, double *mean,
                                         double *var);

/* Frees the layer. NULL is a no-op. A device layer (device_memory) first waits for its stream
 * (work still queued may use its buffers), up to the communicator's timeout, without aborting
 * anything; where that wait fails or times out, the communicator is broken or already destroyed,
 * its device buffers are abandoned (never freed) rather than freed under running work. */
SN_API void sn_syncbn_destroy(sn_syncbn_t *bn);

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints: safetensors files (https://github.com/huggingface/safetensors, format spec)     */
/* ------------------------------------------------------------------------------------------ */

/* A named tensor: host data, dense row-major. Saving supports F32 (dtype SN_DTYPE_F32), BF16,
 * F16, F64 and I64 (is_i64 = 1, dtype ignored). ndim 0 is a scalar. */
typedef struct {
  const char *name;   /* e.g. "bn1.running_mean"; at most 255 bytes, no control characters */
  sn_dtype_t dtype;
  int is_i64;         /* 1: elements are int64_t ("I64") */
  int ndim;           /* 0..8 */
  int64_t shape[8];
  const void *data;   /* host memory, product(shape) elements */
} sn_tensor_t;

/* Writes the tensors to `path` as safetensors: to an unnamed file in path's directory
 * (O_TMPFILE), fsync, link it as "<path>.tmp.<pid>.<k>" (k counts this process's saves), then
 * rename over path, so a crash leaves either the old file or the complete new one, and a crash
 * while writing leaves no temporary file. On file systems without O_TMPFILE (or without /proc)
 * the file is written as "<path>.tmp.<pid>.<k>" directly, which a crash while writing leaves
 * behind (never loaded, as it is not <path>). Where that temporary name would be longer than
 * NAME_MAX, it is path's first bytes, a hash of its last component, then ".tmp.<pid>.<k>".
 * Threads may save to the same path at once: each save has its own temporary file, and path
 * ends up as one of them, complete. Errors:
 * SN_ERR_NULL_POINTER, SN_ERR_INVALID_ARGUMENT (bad name, duplicate name, ndim, a negative
 * dimension), SN_ERR_INVALID_DTYPE, SN_ERR_OVERFLOW (a tensor's or the file's bytes overflow
 * int64), SN_ERR_IO (path not writable; the old file stays),
 * SN_ERR_ALLOC. */
SN_API sn_status_t sn_safetensors_save(const char *path, const sn_tensor_t *tensors,
                                       int64_t count);

/* A loaded safetensors file (opaque), all in host memory. */
typedef struct sn_safetensors sn_safetensors_t;

/* Reads and validates a whole safetensors file: header length, JSON header, dtypes, shapes and
 * data offsets (in bounds, non-overlapping, covering the data exactly). Tensors of the format's
 * other dtypes (BOOL, U8, I8, I16, U16, I32, U32, U64, C64, F8_E5M2, F8_E4M3, F8_E8M0, and the
 * packed F4, F6_E2M3, F6_E3M2: a model's integer, boolean or quantized tensors) are validated
 * and listed too; only sn_safetensors_get refuses them. Errors: SN_ERR_NULL_POINTER, SN_ERR_IO
 * (cannot open or read), SN_ERR_FORMAT (corrupt or truncated, or a dtype not in that list,
 * whose sizes cannot be checked; with the reason), SN_ERR_ALLOC. */
SN_API sn_status_t sn_safetensors_load(sn_safetensors_t **file, const char *path);

/* Looks a tensor up by name: *tensor gets its dtype, shape and a data pointer into the file's
 * memory (valid until sn_safetensors_free; not necessarily aligned: memcpy from it). An I64
 * tensor comes back with is_i64 = 1 (and dtype SN_DTYPE_F64, to be ignored): test is_i64 before
 * dtype. Errors: SN_ERR_NULL_POINTER, SN_ERR_NOT_FOUND, SN_ERR_INVALID_DTYPE (the tensor is
 * there, of a dtype sn_tensor_t cannot describe: I32, U8, BOOL, ...). */
SN_API sn_status_t sn_safetensors_get(const sn_safetensors_t *file, sn_tensor_t *tensor,
                                      const char *name);

/* Number of tensors in a loaded file (host memory, read-only; the "__metadata__" entry is not a
 * tensor and not counted). Returns 0 for file == NULL; never fails, sets no error. */
SN_API int64_t sn_safetensors_count(const sn_safetensors_t *file);

/* Name of the i-th tensor, 0 <= i < sn_safetensors_count(file), in the order of the tensors'
 * data in the file (by data offset). The string belongs to file and stays valid until
 * sn_safetensors_free. Returns NULL for file == NULL or i out of range; sets no error. Names are
 * unique within a file. */
SN_API const char *sn_safetensors_name(const sn_safetensors_t *file, int64_t i);

/* Frees a loaded file. NULL is a no-op. */
SN_API void sn_safetensors_free(sn_safetensors_t *file);

/* The layer's state as PyTorch state_dict tensors named "<prefix>.weight", ".bias",
 * ".running_mean", ".running_var" (F32 [C]) and ".num_batches_tracked" (I64 scalar), those the
 * config has; out must hold 5, *count gets how many were filled. Names live in the layer until
 * the next call or destroy; data points at the layer's host state (a device_memory layer: a
 * host copy of its device state made by this call, which waits for the communicator's stream
 * (under its timeout) and copies with cudaMemcpy; valid until the next call on the layer).
 * Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_ARGUMENT (prefix longer than 200 bytes),
 * SN_ERR_INVALID_HANDLE, and for a device_memory layer SN_ERR_CUDA, SN_ERR_TIMEOUT, SN_ERR_COMM. */
SN_API sn_status_t sn_syncbn_state_tensors(sn_syncbn_t *bn, sn_tensor_t out[5], int *count,
                                           const char *prefix);

/* Loads "<prefix>.*" from a file into the layer: every tensor the config has must be present
 * with dtype F32 and shape [C] (num_batches_tracked: I64, shape [] or [1]); otherwise nothing
 * changes. Errors: SN_ERR_NULL_POINTER, SN_ERR_NOT_FOUND, SN_ERR_FORMAT (dtype, shape, a
 * negative running_var element or num_batches_tracked), SN_ERR_INVALID_ARGUMENT (prefix longer than 200 bytes),
 * SN_ERR_INVALID_HANDLE; a device_memory layer's state is then copied to the device (synchronous:
 * waits for the stream; SN_ERR_CUDA, SN_ERR_TIMEOUT, SN_ERR_COMM). */
SN_API sn_status_t sn_syncbn_load_state(sn_syncbn_t *bn, const sn_safetensors_t *file,
                                        const char *prefix);

/* Saves `count` layers into one safetensors file (atomic, as sn_safetensors_save), layer i under
 * prefixes[i] (e.g. "bn1" or "layer1.0.bn1"). Each layer at most once per call (its tensor
 * names live in the layer). Errors as sn_safetensors_save and sn_syncbn_state_tensors, plus
 * SN_ERR_INVALID_ARGUMENT (a layer given twice, or two prefixes alike). */
SN_API sn_status_t sn_syncbn_save(const char *path, sn_syncbn_t *const *layers,
                                  const char *const *prefixes, int64_t count);

/* Loads `count` layers from a safetensors file; either all load or none changes. Errors as
 * sn_safetensors_load and sn_syncbn_load_state, and SN_ERR_INVALID_ARGUMENT for a layer given
 * twice (as sn_syncbn_save). */
SN_API sn_status_t sn_syncbn_load(const char *path, sn_syncbn_t *const *layers,
                                  const char *const *prefixes, int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* SYNCNORM_DIST_H */
