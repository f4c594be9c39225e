/*
 * syncnorm_cuda.h — the CUDA twins of the CPU kernels of syncnorm.h (built with SN_WITH_CUDA).
 *
 * Conventions shared by every function here (each docstring only states exceptions); the
 * formulas, shapes, dtypes, aliasing rules and error codes are those of the CPU function of the
 * same name without `cuda_` (syncnorm.h), which is the reference the tests compare against:
 *  - Activations, parameters, statistics, gradients and workspaces are CUDA device memory (or
 *    memory the device can address: managed, mapped host). Scalars (sizes, eps, momentum) are
 *    host values. `stream` (last argument) is the CUDA stream the kernels are enqueued on; 0 is
 *    the legacy default stream.
 *  - Asynchronous: a call validates its arguments on the host (the CPU function's checks: NULL,
 *    sizes, int64 overflow, eps, dtype, layout, overlap of the buffers' address ranges), enqueues
 *    its kernels and returns; it never synchronizes the host and never allocates, so it can be
 *    captured in a CUDA graph. Results are ready once the stream reaches them. Checks that need
 *    the data (a running_var < 0 in infer/fold, a num_batches_tracked < 0 in update_running) are
 *    made on the device: such a channel's outputs are NaN instead of an error code.
 *  - Errors as the CPU function, nothing enqueued; plus SN_ERR_CUDA where a launch fails (an
 *    invalid stream, no device, a kernel image missing for this GPU), with the CUDA error's
 *    name in sn_last_error(); a failed launch can leave earlier kernels of the same call
 *    enqueued, so outputs are then unspecified. A fault of an earlier, unrelated kernel is
 *    reported by whichever call next sees it (CUDA's sticky errors).
 *  - Workspace: kernels that reduce across rows or samples do so deterministically (per-block
 *    partial sums in fp64, then a second kernel summing them in a fixed order; no float
 *    atomics), so results are bitwise the same from run to run on one GPU model, for the same
 *    shapes and the same alignment of the pointers: several kernels take 16-byte vector loads
 *    where the tensors are 16-byte aligned and element loads elsewhere, which sum in another
 *    order (a tensor one element off a 16-byte boundary can differ in the last bits). The partial
 *    sums live in a caller-provided workspace of at least the bytes the matching *_workspace
 *    query returns (device memory, 256-byte aligned, contents ignored and overwritten); too small
 *    or NULL with a size > 0, or not 256-byte aligned, is SN_ERR_INVALID_ARGUMENT. The LayerNorm,
 *    RMSNorm and GroupNorm
 *    backwards use theirs only for dgamma/dbeta: with both NULL, or an empty batch, it is not
 *    used or checked and may be NULL.
 *  - Accuracy: statistics in fp64 (row or channel sums two-pass or shifted as the CPU code);
 *    outputs within the CPU function's stated bounds of the exact result (bf16/f16:
 *    max(1 ulp, 2^-16·(|x̂·gamma| + |beta|))), so a CUDA result and the CPU one differ by at
 *    most twice that, and f32 ones by a few f32 roundings of the terms. Not bitwise equal to
 *    the CPU results.
 *  - sizes, dtypes and layouts are as syncnorm.h; rows·d and n·c·s may exceed 2^31.
 */
#ifndef SYNCNORM_CUDA_H
#define SYNCNORM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "syncnorm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether a usable CUDA device is present: *count = cudaGetDeviceCount's count (0 when the
 * driver reports none or no driver is loaded: not an error). Errors: SN_ERR_NULL_POINTER. */
SN_API sn_status_t sn_cuda_device_count(int *count);

/* ---- LayerNorm, RMSNorm and the fused residual add (one block of threads per row) -------- */

/* sn_layernorm_fwd on the device: y [rows, d] dtype, mean, rstd [rows] f32 (= or NULL),
 * x [rows, d], gamma, beta [d] f32 or NULL. Statistics two-pass over the row held on chip (read
 * from memory once): the mean from compensated f32 per-thread sums added in fp64, then Σ(x −
 * mean)² in fp64; y = (x − mean)·rstd·gamma + beta in f32 from the fp64 mean (as two floats)
 * and rstd, in fp64 for bf16/f16 elements where beta cancels x̂·gamma and for rows whose mean is
 * 2^103 or more or not finite. */
SN_API sn_status_t sn_cuda_layernorm_fwd(void *y, float *mean, float *rstd, const void *x,
                                         const float *gamma, const float *beta, int64_t rows,
                                         int64_t d, float eps, sn_dtype_t dtype,
                                         cudaStream_t stream);

/* Bytes of workspace sn_cuda_layernorm_bwd and sn_cuda_rmsnorm_bwd need for [rows, d]: the
 * per-block partial sums of dgamma and dbeta (0 when rows == 0). Errors: SN_ERR_NULL_POINTER,
 * SN_ERR_INVALID_SIZE, SN_ERR_OVERFLOW. Host only. */
SN_API sn_status_t sn_cuda_rownorm_bwd_workspace(size_t *bytes, int64_t rows, int64_t d);

/* sn_layernorm_bwd on the device: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·gamma, x̂ and
 * g in f32, per-thread f32 partial sums added in fp64; rows with terms near the f32 range (or
 * non-finite) computed in fp64 throughout. dgamma = Σ_rows dy·x̂, dbeta = Σ_rows dy ([d] f32, =,
 * or NULL): f32 within runs of 8 rows, the runs in fp64 per-block partials in `workspace`,
 * summed in a fixed order (with dgamma and dbeta both NULL, or rows == 0, the workspace is not
 * used and may be NULL). dx may equal dy. */
SN_API sn_status_t sn_cuda_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy,
                                         const void *x, const float *mean, const float *rstd,
                                         const float *gamma, int64_t rows, int64_t d,
                                         sn_dtype_t dtype, void *workspace,
                                         size_t workspace_bytes, cudaStream_t stream);

/* sn_add_layernorm_fwd on the device: sum_out = round_dtype(x + residual), y = LayerNorm of the
 * rounded sum; x, residual read once, sum_out and y written once. */
SN_API sn_status_t sn_cuda_add_layernorm_fwd(void *y, void *sum_out, float *mean, float *rstd,
                                             const void *x, const void *residual,
                                             const float *gamma, const float *beta, int64_t rows,
                                             int64_t d, float eps, sn_dtype_t dtype,
                                             cudaStream_t stream);

/* sn_rmsnorm_fwd on the device: rstd = 1/√(Σx²/d + eps) (Σx² in f32 runs of 4 squares added in
 * fp64; fp64 where a run leaves [2^-60, FLT_MAX]), y = (x·rstd)·gamma in f32 (fp64 where it is
 * not finite). */
SN_API sn_status_t sn_cuda_rmsnorm_fwd(void *y, float *rstd, const void *x, const float *gamma,
                                       int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                                       cudaStream_t stream);

/* sn_rmsnorm_bwd on the device: dx = rstd·g − x̂·rstd·mean(g·x̂), x̂ = x·rstd, g = dy·gamma;
 * dgamma = Σ_rows dy·x̂ ([d] f32, =, or NULL) through `workspace` (sn_cuda_rownorm_bwd_workspace;
 * not used, and may be NULL, with dgamma NULL or rows == 0). dx may equal dy. */
SN_API sn_status_t sn_cuda_rmsnorm_bwd(void *dx, float *dgamma, const void *dy, const void *x,
                                       const float *rstd, const float *gamma, int64_t rows,
                                       int64_t d, sn_dtype_t dtype, void *workspace,
                                       size_t workspace_bytes, cudaStream_t stream);

/* sn_add_rmsnorm_fwd on the device. */
SN_API sn_status_t sn_cuda_add_rmsnorm_fwd(void *y, void *sum_out, float *rstd, const void *x,
                                           const void *residual, const float *gamma,
                                           int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                                           cudaStream_t stream);

/* ---- BatchNorm building blocks (NCHW [N, C, S] and NHWC [N, S, C]) ------------------------ */

/* Bytes of workspace the BatchNorm reductions (stats, fwd, bwd_reduce, bwd) need for this shape:
 * per-block fp64 partial sums per channel. Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE,
 * SN_ERR_OVERFLOW, SN_ERR_INVALID_LAYOUT. Host only. */
SN_API sn_status_t sn_cuda_batchnorm_workspace(size_t *bytes, int64_t n, int64_t c, int64_t s,
                                               sn_layout_t layout);

/* sn_batchnorm_stats on the device: sum, sumsq [C] f64 (=) of x − pivot_c (pivot [C] f32 or
 * NULL = 0), over the n·s values of each channel, fixed-order fp64 sums. */
SN_API sn_status_t sn_cuda_batchnorm_stats(double *sum, double *sumsq, const void *x,
                                           const float *pivot, int64_t n, int64_t c, int64_t s,
                                           sn_layout_t layout, sn_dtype_t dtype, void *workspace,
                                           size_t workspace_bytes, cudaStream_t stream);

/* sn_batchnorm_finalize on the device (count a host value, > 1): mean [C] f64, var [C] f32 or
 * NULL, rstd [C] f32, from sum, sumsq [C] f64 and pivot [C] f32 or NULL. */
SN_API sn_status_t sn_cuda_batchnorm_finalize(double *mean, float *var, float *rstd,
                                              const double *sum, const double *sumsq,
                                              const float *pivot, int64_t count, int64_t c,
                                              float eps, cudaStream_t stream);

/* sn_batchnorm_update_running on the device: running_mean, running_var [C] f32 updated in place
 * from mean [C] f64 and var [C] f32 (biased) over `count` values (host value); momentum in
 * [0, 1] or SN_MOMENTUM_CUMULATIVE, which then needs num_batches_tracked: one int64 in DEVICE
 * memory, incremented on the device (so a captured graph counts its replays). A negative
 * num_batches_tracked (the CPU's SN_ERR_INVALID_ARGUMENT, seen only on the device) gives NaN
 * running statistics where count > 1, whatever the momentum, and is left as it is. */
SN_API sn_status_t sn_cuda_batchnorm_update_running(float *running_mean, float *running_var,
                                                    int64_t *num_batches_tracked,
                                                    const double *mean, const float *var,
                                                    int64_t count, int64_t c, float momentum,
                                                    cudaStream_t stream);

/* sn_batchnorm_apply on the device: y = (x − mean_c)·rstd_c·gamma_c + beta_c, x − mean in fp64. */
SN_API sn_status_t sn_cuda_batchnorm_apply(void *y, const void *x, const double *mean,
                                           const float *rstd, const float *gamma,
                                           const float *beta, int64_t n, int64_t c, int64_t s,
                                           sn_layout_t layout, sn_dtype_t dtype,
                                           cudaStream_t stream);

/* sn_batchnorm_fwd on the device: stats around pivot (NULL = 0), redone per channel on the
 * device around the mean rounded to f32 where (mean − p)² > 2^24·var (a fixed launch sequence:
 * graph-capturable), finalize, apply. mean [C] f64, var [C] f32 or NULL, rstd [C] f32. */
SN_API sn_status_t sn_cuda_batchnorm_fwd(void *y, double *mean, float *var, float *rstd,
                                         const void *x, const float *pivot, const float *gamma,
                                         const float *beta, int64_t n, int64_t c, int64_t s,
                                         float eps, sn_layout_t layout, sn_dtype_t dtype,
                                         void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream);

/* sn_batchnorm_infer on the device; a running_var < 0 gives that channel NaN outputs (checked on
 * the device, where the CPU function returns SN_ERR_INVALID_ARGUMENT). */
SN_API sn_status_t sn_cuda_batchnorm_infer(void *y, const void *x, const float *running_mean,
                                           const float *running_var, const float *gamma,
                                           const float *beta, int64_t n, int64_t c, int64_t s,
                                           float eps, sn_layout_t layout, sn_dtype_t dtype,
                                           cudaStream_t stream);

/* sn_batchnorm_bwd_reduce on the device: sum_dy, sum_dy_xhat [C] f64 (=). */
SN_API sn_status_t sn_cuda_batchnorm_bwd_reduce(double *sum_dy, double *sum_dy_xhat,
                                                const void *dy, const void *x,
                                                const double *mean, const float *rstd, int64_t n,
                                                int64_t c, int64_t s, sn_layout_t layout,
                                                sn_dtype_t dtype, void *workspace,
                                                size_t workspace_bytes, cudaStream_t stream);

/* sn_batchnorm_bwd_apply on the device (count a host value; sums NULL = eval mode). */
SN_API sn_status_t sn_cuda_batchnorm_bwd_apply(void *dx, const void *dy, const void *x,
                                               const double *mean, const float *rstd,
                                               const float *gamma, const double *sum_dy,
                                               const double *sum_dy_xhat, int64_t count,
                                               int64_t n, int64_t c, int64_t s,
                                               sn_layout_t layout, sn_dtype_t dtype,
                                               cudaStream_t stream);

/* sn_batchnorm_bwd on the device: bwd_reduce then bwd_apply with count n·s; dgamma, dbeta [C]
 * f32 (=) or NULL. */
SN_API sn_status_t sn_cuda_batchnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy,
                                         const void *x, const double *mean, const float *rstd,
                                         const float *gamma, int64_t n, int64_t c, int64_t s,
                                         sn_layout_t layout, sn_dtype_t dtype, void *workspace,
                                         size_t workspace_bytes, cudaStream_t stream);

/* ---- GroupNorm and folding ----------------------------------------------------------------- */

/* sn_groupnorm_fwd on the device: mean, rstd [N, G] f32 (= or NULL); statistics two-pass fp64
 * per (n, g). */
SN_API sn_status_t sn_cuda_groupnorm_fwd(void *y, float *mean, float *rstd, const void *x,
                                         const float *gamma, const float *beta, int64_t n,
                                         int64_t c, int64_t s, int64_t groups, float eps,
                                         sn_layout_t layout, sn_dtype_t dtype,
                                         cudaStream_t stream);

/* Bytes of workspace sn_cuda_groupnorm_bwd needs (per-sample partial dgamma/dbeta, [N, C] f64
 * each). Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE, SN_ERR_OVERFLOW. Host only. */
SN_API sn_status_t sn_cuda_groupnorm_bwd_workspace(size_t *bytes, int64_t n, int64_t c);

/* sn_groupnorm_bwd on the device; dgamma, dbeta [C] f32 (=) or NULL, summed over samples in a
 * fixed order through `workspace` (not used, and may be NULL, with both NULL or an empty batch,
 * n·s == 0). dx may equal dy. */
SN_API sn_status_t sn_cuda_groupnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy,
                                         const void *x, const float *mean, const float *rstd,
                                         const float *gamma, int64_t n, int64_t c, int64_t s,
                                         int64_t groups, sn_layout_t layout, sn_dtype_t dtype,
                                         void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream);

/* sn_fold_batchnorm on the device: w [c_out, per_out], b [c_out] f32 in place, k in fp64; a
 * running_var < 0 gives that channel NaN (checked on the device). */
SN_API sn_status_t sn_cuda_fold_batchnorm(float *w, float *b, const float *gamma,
                                          const float *beta, const float *running_mean,
                                          const float *running_var, int64_t c_out,
                                          int64_t per_out, float eps, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* SYNCNORM_CUDA_H */
