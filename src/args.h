/*
 * args.h — the argument checks of each public kernel, written once for the CPU function
 * (src/cpu/) and its CUDA twin (src/cuda/, syncnorm_cuda.h: "a call validates its arguments on the
 * host (the CPU function's checks ...)"), so the two cannot drift apart. Not installed.
 *
 * Each check returns SN_OK or the specific status with "<fn>: <what is wrong>" recorded
 * (sn__fail), having read nothing but the arguments themselves: checks that need the data (a
 * running_var < 0, a num_batches_tracked < 0) stay with the CPU function, which can read it.
 * The BatchNorm/GroupNorm/fold checks end with the overlap check of the call's buffers and leave
 * their spans in an sn__args_t, to which a CUDA twin adds its workspace (sn__args_workspace).
 */
#ifndef SN_ARGS_H
#define SN_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* ---- sizes shared by several kernels --------------------------------------------------------- */

/* Activation sizes of BatchNorm and GroupNorm, in this order: c >= 1, n >= 0, s >= 0, c and
 * n·c·s addressable (SN_ERR_INVALID_SIZE, SN_ERR_OVERFLOW); *rows = n·s, the (n, s) positions. */
SN_INTERNAL sn_status_t sn__check_ncs(const char *fn, int64_t n, int64_t c, int64_t s,
                                    int64_t *rows);
/* BatchNorm training needs more than 1 value per channel (PyTorch's "Expected more than 1 value
 * per channel when training"): count > 1, else SN_ERR_INSUFFICIENT_COUNT. */
SN_INTERNAL sn_status_t sn__check_train_count(const char *fn, int64_t count);

/* ---- row norms (LayerNorm, RMSNorm, the fused residual adds) --------------------------------- */

/* One row-norm forward call (sn_layernorm_fwd, sn_add_layernorm_fwd, sn_rmsnorm_fwd,
 * sn_add_rmsnorm_fwd and their CUDA twins) as its entry point receives it: [rows, d] tensors of
 * dtype, per-row mean/rstd [rows] f32, gamma/beta [d] f32. */
typedef struct {
  void *y, *sum_out;         /* sum_out: the fused kernels' residual sum; NULL in the plain ones */
  float *mean, *rstd;        /* NULL: not wanted; mean NULL for RMSNorm */
  const void *x, *res;       /* res: the fused kernels' residual; NULL in the plain ones */
  const float *gamma, *beta; /* NULL: none; beta NULL for RMSNorm */
  int64_t rows, d;
  float eps;
  sn_dtype_t dtype;
  int rms;   /* RMSNorm (no mean, no beta) */
  int fused; /* the fused residual add: sum_out and res are required */
} sn__rn_fwd_t;

/* One row-norm backward call (sn_layernorm_bwd, sn_rmsnorm_bwd and their CUDA twins). */
typedef struct {
  void *dx;
  float *dgamma, *dbeta;            /* NULL: not wanted; dbeta NULL for RMSNorm */
  const void *dy, *x;
  const float *mean, *rstd, *gamma; /* mean NULL (and not checked) for RMSNorm */
  int64_t rows, d;
  sn_dtype_t dtype;
  int rms;
} sn__rn_bwd_t;

/* The checks of a row-norm forward before the overlap of its buffers (sn__rownorm_fwd_spans),
 * in this order: rows >= 0, d >= 1, d and rows·d fit (SN_ERR_OVERFLOW), eps, dtype, then y,
 * sum_out, x, res non-NULL where the call has elements (sum_out and res only where fused).
 * *n = rows·d; 0 is an empty batch (the pointers may then be NULL). */
SN_INTERNAL sn_status_t sn__rownorm_fwd_check(const char *fn, const sn__rn_fwd_t *a, int64_t *n);
/* The same for a row-norm backward (no eps): dx, dy, x, mean (LayerNorm only) and rstd, the
 * per-row statistics, non-NULL where the call has elements. */
SN_INTERNAL sn_status_t sn__rownorm_bwd_check(const char *fn, const sn__rn_bwd_t *a, int64_t *n);
/* The overlap check of a row-norm forward (after sn__rownorm_fwd_check): each buffer of a, NULL
 * where not passed. y may equal x in the plain kernels and overlaps nothing in the fused ones;
 * sum_out may equal x or res. */
SN_INTERNAL sn_status_t sn__rownorm_fwd_spans(const char *fn, const sn__rn_fwd_t *a);
/* The overlap check of a row-norm backward: each buffer of a, NULL where not passed; ws,
 * ws_bytes: a CUDA twin's workspace (an output; NULL, 0 for none). dx may equal dy. */
SN_INTERNAL sn_status_t sn__rownorm_bwd_spans(const char *fn, const sn__rn_bwd_t *a,
                                            const void *ws, int64_t ws_bytes);

/* ---- BatchNorm, GroupNorm, fold: whole-call checks ------------------------------------------- */

enum { SN_ARGS_MAX_SPANS = 10 }; /* the longest call's buffers, and a workspace */

/* What a whole-call check found valid: the call's buffers (for sn__args_workspace) and rows =
 * n·s where the call has activations (0: an empty batch; the check then skipped the pointers an
 * empty batch may leave NULL, and, in apply, infer and bwd_apply, which write nothing then, the
 * overlap check too: count == 0). */
typedef struct {
  const char *fn;
  sn__span_t span[SN_ARGS_MAX_SPANS];
  int count;
  int64_t rows;
} sn__args_t;

/* A CUDA twin's workspace of `bytes` bytes, of which the call needs `need`: nothing to check
 * where need == 0; else SN_ERR_INVALID_ARGUMENT where ws is NULL, bytes < need, or ws is not
 * SN_WORKSPACE_ALIGN-byte aligned (syncnorm_cuda.h). */
#define SN_WORKSPACE_ALIGN 256
SN_INTERNAL sn_status_t sn__check_workspace(const char *fn, const void *ws, size_t bytes,
                                          size_t need);
/* A CUDA twin's workspace, after the call's check: nothing where need == 0; else
 * SN_ERR_INVALID_ARGUMENT where ws is NULL, bytes < need, or its first need bytes (an output)
 * overlap one of a's buffers. */
SN_INTERNAL sn_status_t sn__args_workspace(sn__args_t *a, const void *ws, size_t bytes,
                                         size_t need);

/* One BatchNorm call (a public sn_batchnorm_* function or its CUDA twin) as its entry point
 * receives it, for its check: the arguments that function takes under their names there, the
 * others NULL or 0. The checks read addresses only, so every buffer is const here, output or
 * not. */
typedef struct {
  const void *y, *dx, *x, *dy;             /* activations [N, C, S] or [N, S, C], dtype */
  const double *sum, *sumsq, *mean;        /* [C] f64 */
  const double *sum_dy, *sum_dy_xhat;      /* [C] f64 */
  const float *var, *rstd, *pivot;         /* [C] f32 */
  const float *gamma, *beta, *dgamma, *dbeta; /* [C] f32 */
  const float *running_mean, *running_var; /* [C] f32 */
  const int64_t *num_batches_tracked;      /* one value */
  int64_t n, c, s, count;
  float eps, momentum;
  sn_layout_t layout;
  sn_dtype_t dtype;
} sn__bn_call_t;

/* One GroupNorm call (sn_groupnorm_fwd, sn_groupnorm_bwd, their CUDA twins), as sn__bn_call_t. */
typedef struct {
  const void *y, *dx, *x, *dy;                /* activations */
  const float *mean, *rstd;                   /* [N, G] f32 */
  const float *gamma, *beta, *dgamma, *dbeta; /* [C] f32 */
  int64_t n, c, s, groups;
  float eps;
  sn_layout_t layout;
  sn_dtype_t dtype;
} sn__gn_call_t;

/* One sn_fold_batchnorm call (or its CUDA twin), as sn__bn_call_t. */
typedef struct {
  const float *w, *b, *gamma, *beta, *running_mean, *running_var;
  int64_t c_out, per_out;
  float eps;
} sn__fold_call_t;

/* The checks of the function of the same name in syncnorm.h (sn_batchnorm_stats: ...) on the
 * fields of k that function takes, in the order that function's errors are listed; fn names the
 * caller. */
SN_INTERNAL sn_status_t sn__bn_stats_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k);
SN_INTERNAL sn_status_t sn__bn_finalize_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k);
/* Not the data check num_batches_tracked >= 0. count == 1 fails; count == 0 (an empty batch,
 * counted) passes with the pointers other than num_batches_tracked unchecked. */
SN_INTERNAL sn_status_t sn__bn_update_running_args(sn__args_t *a, const char *fn,
                                                   const sn__bn_call_t *k);
SN_INTERNAL sn_status_t sn__bn_apply_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k);
SN_INTERNAL sn_status_t sn__bn_fwd_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k);
/* Not the data check running_var >= 0. */
SN_INTERNAL sn_status_t sn__bn_infer_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k);
SN_INTERNAL sn_status_t sn__bn_bwd_reduce_args(sn__args_t *a, const char *fn,
                                               const sn__bn_call_t *k);
SN_INTERNAL sn_status_t sn__bn_bwd_apply_args(sn__args_t *a, const char *fn,
                                              const sn__bn_call_t *k);
SN_INTERNAL sn_status_t sn__bn_bwd_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k);
SN_INTERNAL sn_status_t sn__gn_fwd_args(sn__args_t *a, const char *fn, const sn__gn_call_t *k);
SN_INTERNAL sn_status_t sn__gn_bwd_args(sn__args_t *a, const char *fn, const sn__gn_call_t *k);
/* Not the data check running_var >= 0. rows = c_out·per_out (the weights). */
SN_INTERNAL sn_status_t sn__fold_args(sn__args_t *a, const char *fn, const sn__fold_call_t *k);

#endif /* SN_ARGS_H */
