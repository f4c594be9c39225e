/*
 * test_cuda_args.c — the host-side argument checks of every sn_cuda_* kernel against its CPU
 * twin's (syncnorm_cuda.h: "a call validates its arguments on the host (the CPU function's
 * checks ...), nothing enqueued"). Runs on every machine, with or without a GPU: the calls it
 * makes with bad arguments must return before touching the device, so all buffers are host
 * memory.
 *
 * For each function, valid argument sets (small odd shapes, every pointer a slot of one host
 * pool of valid values) are mutated one argument at a time. The sets (bases): f32 NHWC; bf16
 * NCHW and f16 where the function takes a dtype or layout; every optional pointer NULL at once
 * (each pointer the CPU function accepts as NULL alone; BatchNorm's bwd_apply also with both
 * sums NULL, its eval mode); an empty batch, each size the CPU accepts as 0 set to 0 in turn;
 * update_running with cumulative momentum (SN_MOMENTUM_CUMULATIVE) and with a NULL
 * num_batches_tracked. Every base is first checked to be valid on the CPU, duplicates dropped.
 * Mutations: each pointer NULL (the base's NULL ones excepted); each output equal
 * to, or 8 bytes into, each other buffer; each size 0, 1, −1, 3, 8, INT64_MIN, INT64_MAX/2 and
 * INT64_MAX; eps 0, −0, −1e-5, NaN, ±Inf and the valid 2^-149, FLT_MIN, FLT_MAX; momentum NaN,
 * ±Inf, −0.5, 2, just past ±1, cumulative and the valid 0, −0, 1, 2^-149; dtype −1, F64 (not an
 * activation dtype), 99; layout −1, 2, 7. The CPU function is called first:
 *  - where it fails, the CUDA function must fail with the same status (never SN_ERR_CUDA: it
 *    got past its checks) and the same message after the function's name ("<fn>: ..."), name
 *    itself in sn_last_error(), and leave the pool and its workspace bitwise as they were;
 *  - where it succeeds (an allowed NULL or in-place pair, an empty batch), the CUDA function may
 *    not be stricter: without a GPU it must get past its checks, returning SN_OK (nothing to
 *    enqueue) or SN_ERR_CUDA (the launch failed). With a GPU those calls are not made (they
 *    would launch kernels on host memory).
 * The workspace is the size its query returns for the mutated arguments (NULL and 0 where the
 * query fails); then, for each base, a NULL, short or overlapping workspace must give
 * SN_ERR_INVALID_ARGUMENT, except where the header says the workspace is unused (the row norms'
 * and GroupNorm's backwards without dgamma/dbeta or with an empty batch: a NULL one must pass
 * the checks). The three workspace queries are checked against the header's errors.
 *
 * Not compared, by design (syncnorm_cuda.h): checks that need the data (running_var < 0 in
 * infer/fold, a num_batches_tracked < 0, which CUDA holds in device memory); the pool's values
 * never trigger them.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudatest.h"

/* ---- the argument sets ----------------------------------------------------------------------- */

enum {
  MAX_PTR = 12,              /* pointer arguments of the longest signature */
  MAX_INT = 5,               /* int64 arguments */
  SLOT_BYTES = 4096,         /* each pointer argument's slot: every valid shape below fits */
  WS_CAP = 1 << 16,          /* largest workspace provided (the valid shapes need far less) */
  POOL_BYTES = MAX_PTR * SLOT_BYTES + WS_CAP, /* slots, then room for a workspace laid over them */
  OFFSET_BYTES = 8           /* a partial overlap: aligned for every element type */
};

typedef struct {
  void *p[MAX_PTR];
  int64_t i[MAX_INT];
  float eps, momentum;
  sn_dtype_t dtype;
  sn_layout_t layout;
} args_t;

/* What a function takes besides pointers and sizes; F_NO_EMPTY: no size may be 0 (the CPU
 * function needs a count above 1, or a non-empty weight); F_NO_NULL: every pointer required. */
enum { F_EPS = 1, F_MOM = 2, F_DTYPE = 4, F_LAYOUT = 8, F_NO_EMPTY = 16, F_NO_NULL = 32 };

typedef struct {
  const char *name;         /* the CUDA function, as sn_last_error() starts */
  const char *ptr[MAX_PTR]; /* pointer arguments in order; the first n_out are written */
  int n_ptr, n_out;
  const char *size[MAX_INT]; /* int64 arguments in order */
  int64_t base[MAX_INT];     /* their valid values */
  int n_size, flags;
  sn_status_t (*cpu)(const args_t *a);
  sn_status_t (*cuda)(const args_t *a, void *ws, size_t ws_bytes);
  sn_status_t (*ws_query)(const args_t *a, size_t *bytes); /* NULL: no workspace */
  unsigned ws_unused; /* pointer bits (the parameter gradients) that, all NULL, leave the
                         workspace unused, as does an empty batch: it may then be NULL
                         (syncnorm_cuda.h). 0: the workspace is always checked */
} api_t;

#define P(k) (a->p[k])
#define I(k) (a->i[k])
#define NOWS (void)ws, (void)wb

/* ---- adapters: one CPU/CUDA pair per function ------------------------------------------------ */

static sn_status_t c_ln_fwd(const args_t *a) {
  return sn_layernorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps, a->dtype);
}
static sn_status_t g_ln_fwd(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_layernorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps, a->dtype,
                               0);
}
static sn_status_t c_ln_bwd(const args_t *a) {
  return sn_layernorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), a->dtype);
}
static sn_status_t g_ln_bwd(const args_t *a, void *ws, size_t wb) {
  return sn_cuda_layernorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1),
                               a->dtype, ws, wb, 0);
}
static sn_status_t c_add_ln(const args_t *a) {
  return sn_add_layernorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), a->eps,
                              a->dtype);
}
static sn_status_t g_add_ln(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_add_layernorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1),
                                   a->eps, a->dtype, 0);
}
static sn_status_t c_rms_fwd(const args_t *a) {
  return sn_rmsnorm_fwd(P(0), P(1), P(2), P(3), I(0), I(1), a->eps, a->dtype);
}
static sn_status_t g_rms_fwd(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_rmsnorm_fwd(P(0), P(1), P(2), P(3), I(0), I(1), a->eps, a->dtype, 0);
}
static sn_status_t c_rms_bwd(const args_t *a) {
  return sn_rmsnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->dtype);
}
static sn_status_t g_rms_bwd(const args_t *a, void *ws, size_t wb) {
  return sn_cuda_rmsnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->dtype, ws, wb, 0);
}
static sn_status_t c_add_rms(const args_t *a) {
  return sn_add_rmsnorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps, a->dtype);
}
static sn_status_t g_add_rms(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_add_rmsnorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps, a->dtype,
                                 0);
}
static sn_status_t c_bn_stats(const args_t *a) {
  return sn_batchnorm_stats(P(0), P(1), P(2), P(3), I(0), I(1), I(2), a->layout, a->dtype);
}
static sn_status_t g_bn_stats(const args_t *a, void *ws, size_t wb) {
  return sn_cuda_batchnorm_stats(P(0), P(1), P(2), P(3), I(0), I(1), I(2), a->layout, a->dtype,
                                 ws, wb, 0);
}
static sn_status_t c_bn_fin(const args_t *a) {
  return sn_batchnorm_finalize(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps);
}
static sn_status_t g_bn_fin(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_batchnorm_finalize(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps, 0);
}
static sn_status_t c_bn_run(const args_t *a) {
  return sn_batchnorm_update_running(P(0), P(1), P(2), P(3), P(4), I(0), I(1), a->momentum);
}
static sn_status_t g_bn_run(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_batchnorm_update_running(P(0), P(1), P(2), P(3), P(4), I(0), I(1), a->momentum,
                                          0);
}
static sn_status_t c_bn_apply(const args_t *a) {
  return sn_batchnorm_apply(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), a->layout,
                            a->dtype);
}
static sn_status_t g_bn_apply(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_batchnorm_apply(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), a->layout,
                                 a->dtype, 0);
}
static sn_status_t c_bn_fwd(const args_t *a) {
  return sn_batchnorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), I(2),
                          a->eps, a->layout, a->dtype);
}
static sn_status_t g_bn_fwd(const args_t *a, void *ws, size_t wb) {
  return sn_cuda_batchnorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), I(2),
                               a->eps, a->layout, a->dtype, ws, wb, 0);
}
static sn_status_t c_bn_infer(const args_t *a) {
  return sn_batchnorm_infer(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), a->eps,
                            a->layout, a->dtype);
}
static sn_status_t g_bn_infer(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_batchnorm_infer(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), a->eps,
                                 a->layout, a->dtype, 0);
}
static sn_status_t c_bn_bred(const args_t *a) {
  return sn_batchnorm_bwd_reduce(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), a->layout,
                                 a->dtype);
}
static sn_status_t g_bn_bred(const args_t *a, void *ws, size_t wb) {
  return sn_cuda_batchnorm_bwd_reduce(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2),
                                      a->layout, a->dtype, ws, wb, 0);
}
static sn_status_t c_bn_bapply(const args_t *a) {
  return sn_batchnorm_bwd_apply(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), I(2),
                                I(3), a->layout, a->dtype);
}
static sn_status_t g_bn_bapply(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_batchnorm_bwd_apply(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1),
                                     I(2), I(3), a->layout, a->dtype, 0);
}
static sn_status_t c_bn_bwd(const args_t *a) {
  return sn_batchnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), I(2),
                          a->layout, a->dtype);
}
static sn_status_t g_bn_bwd(const args_t *a, void *ws, size_t wb) {
  return sn_cuda_batchnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), I(2),
                               a->layout, a->dtype, ws, wb, 0);
}
static sn_status_t c_gn_fwd(const args_t *a) {
  return sn_groupnorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), I(3), a->eps,
                          a->layout, a->dtype);
}
static sn_status_t g_gn_fwd(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_groupnorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), I(3), a->eps,
                               a->layout, a->dtype, 0);
}
static sn_status_t c_gn_bwd(const args_t *a) {
  return sn_groupnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), I(2), I(3),
                          a->layout, a->dtype);
}
static sn_status_t g_gn_bwd(const args_t *a, void *ws, size_t wb) {
  return sn_cuda_groupnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1), I(2),
                               I(3), a->layout, a->dtype, ws, wb, 0);
}
static sn_status_t c_fold(const args_t *a) {
  return sn_fold_batchnorm(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps);
}
static sn_status_t g_fold(const args_t *a, void *ws, size_t wb) {
  NOWS;
  return sn_cuda_fold_batchnorm(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), a->eps, 0);
}

static sn_status_t q_rownorm(const args_t *a, size_t *bytes) {
  return sn_cuda_rownorm_bwd_workspace(bytes, I(0), I(1));
}
static sn_status_t q_bn(const args_t *a, size_t *bytes) {
  return sn_cuda_batchnorm_workspace(bytes, I(0), I(1), I(2), a->layout);
}
static sn_status_t q_gn(const args_t *a, size_t *bytes) {
  return sn_cuda_groupnorm_bwd_workspace(bytes, I(0), I(1));
}

/* Valid shapes: rows 3, d 5; N 2, C 4, S 3 (count N·S = 6), G 2; C_out 4, per_out 3. */
#define ROWS_D {"rows", "d"}, {3, 5}, 2
#define NCS {"n", "c", "s"}, {2, 4, 3}, 3
static const api_t APIS[] = {
    {"sn_cuda_layernorm_fwd", {"y", "mean", "rstd", "x", "gamma", "beta"}, 6, 3, ROWS_D,
     F_EPS | F_DTYPE, c_ln_fwd, g_ln_fwd, NULL, 0},
    {"sn_cuda_layernorm_bwd", {"dx", "dgamma", "dbeta", "dy", "x", "mean", "rstd", "gamma"}, 8, 3,
     ROWS_D, F_DTYPE, c_ln_bwd, g_ln_bwd, q_rownorm, 1u << 1 | 1u << 2},
    {"sn_cuda_add_layernorm_fwd",
     {"y", "sum_out", "mean", "rstd", "x", "residual", "gamma", "beta"}, 8, 4, ROWS_D,
     F_EPS | F_DTYPE, c_add_ln, g_add_ln, NULL, 0},
    {"sn_cuda_rmsnorm_fwd", {"y", "rstd", "x", "gamma"}, 4, 2, ROWS_D, F_EPS | F_DTYPE, c_rms_fwd,
     g_rms_fwd, NULL, 0},
    {"sn_cuda_rmsnorm_bwd", {"dx", "dgamma", "dy", "x", "rstd", "gamma"}, 6, 2, ROWS_D, F_DTYPE,
     c_rms_bwd, g_rms_bwd, q_rownorm, 1u << 1},
    {"sn_cuda_add_rmsnorm_fwd", {"y", "sum_out", "rstd", "x", "residual", "gamma"}, 6, 3, ROWS_D,
     F_EPS | F_DTYPE, c_add_rms, g_add_rms, NULL, 0},
    {"sn_cuda_batchnorm_stats", {"sum", "sumsq", "x", "pivot"}, 4, 2, NCS, F_LAYOUT | F_DTYPE,
     c_bn_stats, g_bn_stats, q_bn, 0},
    {"sn_cuda_batchnorm_finalize", {"mean", "var", "rstd", "sum", "sumsq", "pivot"}, 6, 3,
     {"count", "c"}, {6, 4}, 2, F_EPS | F_NO_EMPTY, c_bn_fin, g_bn_fin, NULL, 0},
    {"sn_cuda_batchnorm_update_running",
     {"running_mean", "running_var", "num_batches_tracked", "mean", "var"}, 5, 3, {"count", "c"},
     {6, 4}, 2, F_MOM, c_bn_run, g_bn_run, NULL, 0},
    {"sn_cuda_batchnorm_apply", {"y", "x", "mean", "rstd", "gamma", "beta"}, 6, 1, NCS,
     F_LAYOUT | F_DTYPE, c_bn_apply, g_bn_apply, NULL, 0},
    {"sn_cuda_batchnorm_fwd", {"y", "mean", "var", "rstd", "x", "pivot", "gamma", "beta"}, 8, 4,
     NCS, F_EPS | F_LAYOUT | F_DTYPE | F_NO_EMPTY, c_bn_fwd, g_bn_fwd, q_bn, 0},
    {"sn_cuda_batchnorm_infer",
     {"y", "x", "running_mean", "running_var", "gamma", "beta"}, 6, 1, NCS,
     F_EPS | F_LAYOUT | F_DTYPE, c_bn_infer, g_bn_infer, NULL, 0},
    {"sn_cuda_batchnorm_bwd_reduce", {"sum_dy", "sum_dy_xhat", "dy", "x", "mean", "rstd"}, 6, 2,
     NCS, F_LAYOUT | F_DTYPE | F_NO_NULL, c_bn_bred, g_bn_bred, q_bn, 0},
    {"sn_cuda_batchnorm_bwd_apply",
     {"dx", "dy", "x", "mean", "rstd", "gamma", "sum_dy", "sum_dy_xhat"}, 8, 1,
     {"count", "n", "c", "s"}, {6, 2, 4, 3}, 4, F_LAYOUT | F_DTYPE, c_bn_bapply, g_bn_bapply,
     NULL, 0},
    {"sn_cuda_batchnorm_bwd", {"dx", "dgamma", "dbeta", "dy", "x", "mean", "rstd", "gamma"}, 8, 3,
     NCS, F_LAYOUT | F_DTYPE | F_NO_EMPTY, c_bn_bwd, g_bn_bwd, q_bn, 0},
    {"sn_cuda_groupnorm_fwd", {"y", "mean", "rstd", "x", "gamma", "beta"}, 6, 3,
     {"n", "c", "s", "groups"}, {2, 4, 3, 2}, 4, F_EPS | F_LAYOUT | F_DTYPE, c_gn_fwd, g_gn_fwd,
     NULL, 0},
    {"sn_cuda_groupnorm_bwd", {"dx", "dgamma", "dbeta", "dy", "x", "mean", "rstd", "gamma"}, 8, 3,
     {"n", "c", "s", "groups"}, {2, 4, 3, 2}, 4, F_LAYOUT | F_DTYPE, c_gn_bwd, g_gn_bwd, q_gn,
     1u << 1 | 1u << 2},
    {"sn_cuda_fold_batchnorm", {"w", "b", "gamma", "beta", "running_mean", "running_var"}, 6, 2,
     {"c_out", "per_out"}, {4, 3}, 2, F_EPS | F_NO_EMPTY, c_fold, g_fold, NULL, 0},
};
#define N_APIS ((int)(sizeof APIS / sizeof APIS[0]))

/* ---- the pool and one comparison ------------------------------------------------------------- */

static unsigned char *g_pool, *g_pool_ref; /* the live pool and its valid contents */
static unsigned char *g_ws, *g_ws_ref;     /* a workspace (separate from the pool) */
static int g_have_device;
/* Counts over the whole run, reported and asserted non-trivial at the end. */
static int g_compared, g_cpu_ok, g_cpu_ok_checked, g_bases, g_ws_bases, g_ws_unused_checked;

/* Floats in [0.5, 1): valid for every argument read as f32 (running_var >= 0, pivots), as an
 * f64 (positive), an int64 (num_batches_tracked >= 0) or bf16/f16 pairs; distinct, so a store
 * of a computed value shows. */
static void fill_valid(unsigned char *buf, size_t bytes, uint64_t seed) {
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const float v = (float)(0.5 + 0.5 * tu_rng_uniform(&r));
    memcpy(buf + i, &v, 4);
  }
}

/* A valid argument set the mutations start from: the function's shape and pointers with these
 * changes. */
typedef struct {
  char name[96];
  sn_dtype_t dtype;
  sn_layout_t layout;
  float momentum;
  unsigned null_mask; /* bit k: pointer k NULL */
  int empty;          /* index + 1 of a size set to 0; 0 = none */
} base_t;

static const base_t BASE0 = {"f32 NHWC", SN_DTYPE_F32, SN_LAYOUT_NHWC, 0.1f, 0u, 0};

/* Pointer argument k's slot in the pool, and whether base b makes it NULL. */
static unsigned char *slot(int k) { return g_pool + (size_t)k * SLOT_BYTES; }
static int is_null(const base_t *b, int k) { return b->null_mask >> k & 1u; }

static void base_args(const api_t *f, const base_t *b, args_t *a) {
  memset(a, 0, sizeof *a);
  for (int k = 0; k < f->n_ptr; k++)
    a->p[k] = is_null(b, k) ? NULL : slot(k);
  for (int k = 0; k < f->n_size; k++) a->i[k] = f->base[k];
  if (b->empty > 0) a->i[b->empty - 1] = 0;
  a->eps = 1e-5f;
  a->momentum = b->momentum;
  a->dtype = b->dtype;
  a->layout = b->layout;
}

static const char *status_name(sn_status_t s) { return sn_status_string(s); }

/* The text of message m after "<fn>: ", or NULL where m does not start so. */
static const char *after_fn(const char *m, const char *fn) {
  const size_t n = strlen(fn);
  return strncmp(m, fn, n) == 0 && m[n] == ':' && m[n + 1] == ' ' ? m + n + 2 : NULL;
}

/* Whether the last error names fn ("<fn>: ..."). */
static int names_fn(const char *fn) { return after_fn(sn_last_error(), fn) != NULL; }

/* The CPU twin's name: "sn_cuda_x" → "sn_x". */
static void cpu_name(const api_t *f, char *out, size_t cap) {
  snprintf(out, cap, "sn_%s", f->name + strlen("sn_cuda_"));
}

static void assert_untouched(const api_t *f, const char *what, const char *side) {
  ck_assert_msg(memcmp(g_pool, g_pool_ref, POOL_BYTES) == 0,
                "%s, %s: the %s call failed but wrote to its buffers", f->name, what, side);
  ck_assert_msg(memcmp(g_ws, g_ws_ref, WS_CAP) == 0,
                "%s, %s: the %s call failed but wrote to its workspace", f->name, what, side);
}

/* The workspace the query gives for a (g_ws, or NULL/0 where the query fails or asks too much). */
static void pick_workspace(const api_t *f, const args_t *a, void **ws, size_t *bytes) {
  size_t need = 0;
  *ws = NULL;
  *bytes = 0;
  if (f->ws_query != NULL && f->ws_query(a, &need) == SN_OK && need > 0 && need <= WS_CAP) {
    *ws = g_ws;
    *bytes = need;
  }
}

/* One mutated argument set a: the CPU function, then the CUDA one, as the header comment says. */
static void compare(const api_t *f, const args_t *a, const char *what) {
  memcpy(g_pool, g_pool_ref, POOL_BYTES);
  memcpy(g_ws, g_ws_ref, WS_CAP);
  const sn_status_t cs = f->cpu(a);
  void *ws;
  size_t wb;
  if (cs == SN_OK) {
    g_cpu_ok++;
    if (!g_have_device) { /* the CUDA function must get past its checks too */
      memcpy(g_pool, g_pool_ref, POOL_BYTES);
      memcpy(g_ws, g_ws_ref, WS_CAP);
      pick_workspace(f, a, &ws, &wb);
      const sn_status_t gs = f->cuda(a, ws, wb);
      ck_assert_msg(gs == SN_OK || gs == SN_ERR_CUDA,
                    "%s, %s: the CPU function accepts it, the CUDA one returns %s (%s)", f->name,
                    what, status_name(gs), sn_last_error());
      g_cpu_ok_checked++;
    }
    return;
  }
  assert_untouched(f, what, "CPU");
  ck_assert_msg(cs != SN_ERR_CUDA, "%s, %s: the CPU function returned SN_ERR_CUDA", f->name, what);
  char cname[64], cmsg[512];
  cpu_name(f, cname, sizeof cname);
  const char *ctext = after_fn(sn_last_error(), cname);
  ck_assert_msg(ctext != NULL, "%s, %s: the CPU message \"%s\" does not start with \"%s: \"",
                f->name, what, sn_last_error(), cname);
  snprintf(cmsg, sizeof cmsg, "%s", ctext);
  pick_workspace(f, a, &ws, &wb);
  const sn_status_t gs = f->cuda(a, ws, wb);
  ck_assert_msg(gs == cs, "%s, %s: CUDA returns %s (%s), the CPU function %s", f->name, what,
                status_name(gs), sn_last_error(), status_name(cs));
  const char *gtext = after_fn(sn_last_error(), f->name);
  ck_assert_msg(gtext != NULL, "%s, %s: sn_last_error() is \"%s\"", f->name, what,
                sn_last_error());
  ck_assert_msg(strcmp(gtext, cmsg) == 0, "%s, %s: CUDA says \"%s\", the CPU function \"%s\"",
                f->name, what, gtext, cmsg);
  assert_untouched(f, what, "CUDA");
  g_compared++;
}

/* ---- the mutations --------------------------------------------------------------------------- */

static const int64_t BAD_SIZES[] = {0, 1, -1, 3, 8, INT64_MIN, INT64_MAX / 2, INT64_MAX};
static const int BAD_DTYPES[] = {-1, SN_DTYPE_F64, 99};
static const int BAD_LAYOUTS[] = {-1, 2, 7};

/* Every mutation of base b; what names the base and the change. */
static void mutate_all(const api_t *f, const base_t *b) {
  args_t a;
  char what[256];
  for (int k = 0; k < f->n_ptr; k++) { /* NULL pointers */
    if (is_null(b, k)) continue;
    base_args(f, b, &a);
    a.p[k] = NULL;
    snprintf(what, sizeof what, "[%.96s] %s = NULL", b->name, f->ptr[k]);
    compare(f, &a, what);
  }
  for (int k = 0; k < f->n_out; k++) { /* an output over another buffer */
    for (int j = 0; j < f->n_ptr; j++) {
      if (j == k || is_null(b, j)) continue;
      for (int off = 0; off <= OFFSET_BYTES; off += OFFSET_BYTES) {
        base_args(f, b, &a);
        a.p[k] = slot(j) + off;
        snprintf(what, sizeof what, "[%.96s] %s = %s + %d bytes", b->name, f->ptr[k], f->ptr[j],
                 off);
        compare(f, &a, what);
      }
    }
  }
  for (int k = 0; k < f->n_size; k++) {
    for (size_t v = 0; v < sizeof BAD_SIZES / sizeof BAD_SIZES[0]; v++) {
      base_args(f, b, &a);
      a.i[k] = BAD_SIZES[v];
      snprintf(what, sizeof what, "[%.96s] %s = %lld", b->name, f->size[k],
               (long long)BAD_SIZES[v]);
      compare(f, &a, what);
    }
  }
  if (f->flags & F_EPS) {
    /* invalid, then valid boundaries (the CPU function decides which is which) */
    const float bad[] = {0.0f,     -0.0f,     -1e-5f,  NAN,    INFINITY,
                         -INFINITY, 0x1p-149f, FLT_MIN, FLT_MAX};
    for (size_t v = 0; v < sizeof bad / sizeof bad[0]; v++) {
      base_args(f, b, &a);
      a.eps = bad[v];
      snprintf(what, sizeof what, "[%.96s] eps = %g", b->name, (double)bad[v]);
      compare(f, &a, what);
    }
  }
  if (f->flags & F_MOM) {
    const float bad[] = {NAN,         INFINITY,    -INFINITY,
                         -0.5f,       2.0f,        1.0000001f,
                         -1.0000001f, SN_MOMENTUM_CUMULATIVE, 0.0f,
                         -0.0f,       1.0f,        0x1p-149f};
    for (size_t v = 0; v < sizeof bad / sizeof bad[0]; v++) {
      if (memcmp(&bad[v], &b->momentum, sizeof(float)) == 0) continue; /* the base's own */
      base_args(f, b, &a);
      a.momentum = bad[v];
      snprintf(what, sizeof what, "[%.96s] momentum = %.9g", b->name, (double)bad[v]);
      compare(f, &a, what);
    }
  }
  if (f->flags & F_DTYPE) {
    for (size_t v = 0; v < sizeof BAD_DTYPES / sizeof BAD_DTYPES[0]; v++) {
      base_args(f, b, &a);
      a.dtype = (sn_dtype_t)BAD_DTYPES[v];
      snprintf(what, sizeof what, "[%.96s] dtype = %d", b->name, BAD_DTYPES[v]);
      compare(f, &a, what);
    }
  }
  if (f->flags & F_LAYOUT) {
    for (size_t v = 0; v < sizeof BAD_LAYOUTS / sizeof BAD_LAYOUTS[0]; v++) {
      base_args(f, b, &a);
      a.layout = (sn_layout_t)BAD_LAYOUTS[v];
      snprintf(what, sizeof what, "[%.96s] layout = %d", b->name, BAD_LAYOUTS[v]);
      compare(f, &a, what);
    }
  }
}

/* Whether the CPU function accepts base b as it is. */
static int cpu_accepts(const api_t *f, const base_t *b) {
  args_t a;
  base_args(f, b, &a);
  memcpy(g_pool, g_pool_ref, POOL_BYTES);
  const sn_status_t st = f->cpu(&a);
  memcpy(g_pool, g_pool_ref, POOL_BYTES);
  return st == SN_OK;
}

enum { MAX_BASES = 16 };

static const char *dtype_name(sn_dtype_t d) {
  return d == SN_DTYPE_F32 ? "f32" : d == SN_DTYPE_BF16 ? "bf16" : d == SN_DTYPE_F16 ? "f16" : "?";
}

/* Appends b to out[*n] unless an equal base is there; its name gets the dtype (and layout, for
 * functions that take one) in front. */
static void add_base(const api_t *f, base_t *out, int *n, base_t b, const char *what) {
  for (int k = 0; k < *n; k++)
    if (out[k].dtype == b.dtype && out[k].layout == b.layout &&
        memcmp(&out[k].momentum, &b.momentum, sizeof(float)) == 0 &&
        out[k].null_mask == b.null_mask && out[k].empty == b.empty)
      return;
  ck_assert_int_lt(*n, MAX_BASES);
  snprintf(b.name, sizeof b.name, "%s%s%s", f->flags & F_DTYPE ? dtype_name(b.dtype) : "",
           f->flags & F_LAYOUT ? (b.layout == SN_LAYOUT_NCHW ? " NCHW" : " NHWC") : "", what);
  out[(*n)++] = b;
}

/* The bases of f (see the header comment), each checked valid on the CPU; returns their count.
 * The functions not marked F_NO_NULL / F_NO_EMPTY have a pointer the CPU accepts as NULL and an
 * empty batch: those bases must be there (a CPU change that dropped them would otherwise thin
 * the test), and the marked ones must have none. */
static int make_bases(const api_t *f, base_t *out) {
  int n = 0, n_null = 0, n_empty = 0;
  add_base(f, out, &n, BASE0, "");
  if (f->flags & (F_DTYPE | F_LAYOUT)) {
    base_t b = BASE0;
    if (f->flags & F_DTYPE) b.dtype = SN_DTYPE_BF16;
    if (f->flags & F_LAYOUT) b.layout = SN_LAYOUT_NCHW;
    add_base(f, out, &n, b, "");
  }
  if (f->flags & F_DTYPE) {
    base_t b = BASE0;
    b.dtype = SN_DTYPE_F16;
    add_base(f, out, &n, b, "");
  }
  { /* every pointer the CPU accepts as NULL alone, NULL together */
    base_t b = BASE0;
    for (int k = 0; k < f->n_ptr; k++) {
      base_t one = BASE0;
      one.null_mask = 1u << k;
      if (cpu_accepts(f, &one)) b.null_mask |= 1u << k;
    }
    char what[64];
    snprintf(what, sizeof what, ", optional pointers NULL (mask 0x%x)", b.null_mask);
    if (b.null_mask != 0) {
      add_base(f, out, &n, b, what);
      n_null++;
    }
  }
  if (strcmp(f->name, "sn_cuda_batchnorm_bwd_apply") == 0) { /* eval mode: both sums NULL */
    base_t b = BASE0;
    b.null_mask = 1u << 6 | 1u << 7;
    add_base(f, out, &n, b, ", eval mode (sum_dy, sum_dy_xhat NULL)");
    b.null_mask |= 1u << 5;
    add_base(f, out, &n, b, ", eval mode, gamma NULL");
  }
  if (f->flags & F_MOM) {
    base_t b = BASE0;
    b.momentum = SN_MOMENTUM_CUMULATIVE;
    add_base(f, out, &n, b, ", momentum cumulative");
    b = BASE0;
    b.null_mask = 1u << 2; /* the same as the optional-pointer base: not added twice */
    add_base(f, out, &n, b, ", num_batches_tracked NULL");
  }
  for (int k = 0; k < f->n_size; k++) { /* empty batches */
    base_t b = BASE0;
    b.empty = k + 1;
    char what[64];
    snprintf(what, sizeof what, ", empty: %s = 0", f->size[k]);
    if (cpu_accepts(f, &b)) {
      add_base(f, out, &n, b, what);
      n_empty++;
    }
  }
  ck_assert_msg(n_null == !(f->flags & F_NO_NULL), "%s: %d bases with optional pointers NULL",
                f->name, n_null);
  ck_assert_msg((n_empty > 0) == !(f->flags & F_NO_EMPTY), "%s: %d empty-batch bases", f->name,
                n_empty);
  for (int k = 0; k < n; k++)
    ck_assert_msg(cpu_accepts(f, &out[k]), "%s: base [%s] is not valid on the CPU", f->name,
                  out[k].name);
  return n;
}

/* With valid arguments: the workspace alone is wrong. CUDA only, so the expected status is the
 * header's, SN_ERR_INVALID_ARGUMENT, with nothing written. */
static void check_workspace(const api_t *f, const base_t *b, const void *ws, size_t bytes,
                            const char *what) {
  args_t a;
  base_args(f, b, &a);
  memcpy(g_pool, g_pool_ref, POOL_BYTES);
  const sn_status_t gs = f->cuda(&a, (void *)ws, bytes);
  ck_assert_msg(gs == SN_ERR_INVALID_ARGUMENT, "%s, %s: returns %s (%s)", f->name, what,
                status_name(gs), sn_last_error());
  ck_assert_msg(names_fn(f->name), "%s, %s: sn_last_error() is \"%s\"", f->name, what,
                sn_last_error());
  assert_untouched(f, what, "CUDA");
  g_compared++;
}

/* The workspace errors with base b, where its query asks for a workspace (an empty batch may
 * need none). */
static void mutate_workspace(const api_t *f, const base_t *b) {
  args_t a;
  size_t need = 0;
  char what[192];
  base_args(f, b, &a);
  ck_assert_int_eq(f->ws_query(&a, &need), SN_OK);
  ck_assert_msg(need <= WS_CAP, "%s [%s]: needs %zu workspace bytes", f->name, b->name, need);
  if (need == 0) return;
  if (f->ws_unused != 0 && (b->empty > 0 || (b->null_mask & f->ws_unused) == f->ws_unused)) {
    if (!g_have_device) { /* nothing to sum: a NULL workspace passes the checks */
      memcpy(g_pool, g_pool_ref, POOL_BYTES);
      const sn_status_t gs = f->cuda(&a, NULL, 0);
      ck_assert_msg(gs == SN_OK || gs == SN_ERR_CUDA,
                    "%s [%s]: with nothing to sum, a NULL workspace gives %s (%s)",
                    f->name, b->name, status_name(gs), sn_last_error());
      g_ws_unused_checked++;
    }
    return;
  }
  snprintf(what, sizeof what, "[%.96s] workspace NULL", b->name);
  check_workspace(f, b, NULL, need, what);
  snprintf(what, sizeof what, "[%.96s] workspace one byte short", b->name);
  check_workspace(f, b, g_ws, need - 1, what);
  snprintf(what, sizeof what, "[%.96s] workspace_bytes 0", b->name);
  check_workspace(f, b, g_ws, 0, what);
  for (int off = 4; off <= 128; off *= 2) { /* misaligned: a device fault, were it launched */
    snprintf(what, sizeof what, "[%.96s] workspace at +%d bytes", b->name, off);
    check_workspace(f, b, g_ws + off, need, what);
    ck_assert_msg(strstr(sn_last_error(), "aligned") != NULL, "%s: %s", what, sn_last_error());
  }
  for (int j = 0; j < f->n_ptr; j++) { /* the workspace laid over an argument's slot */
    if (is_null(b, j)) continue;
    snprintf(what, sizeof what, "[%.96s] workspace over %s", b->name, f->ptr[j]);
    check_workspace(f, b, slot(j), need, what);
  }
  g_ws_bases++;
}

/* ---- tests ----------------------------------------------------------------------------------- */

START_TEST(test_args_vs_cpu) {
  const api_t *f = &APIS[_i];
  const int compared = g_compared;
  const int ws_bases = g_ws_bases;
  base_t bases[MAX_BASES];
  const int nb = make_bases(f, bases);
  for (int k = 0; k < nb; k++) {
    mutate_all(f, &bases[k]);
    if (f->ws_query != NULL) mutate_workspace(f, &bases[k]);
  }
  g_bases += nb;
  /* Every base has a NULL output and bad sizes the CPU rejects: at least one per size and one
   * per required pointer were compared, per base. */
  ck_assert_int_ge(g_compared - compared, nb * (f->n_size + 1));
  /* and a function with a workspace had its workspace errors tried on at least its first base */
  if (f->ws_query != NULL) ck_assert_int_ge(g_ws_bases - ws_bases, 1);
}
END_TEST

/* The workspace queries (host only): errors as the header says, *bytes untouched on error. */
START_TEST(test_workspace_queries) {
  const size_t poison = (size_t)0x5a5a5a5a;
  size_t b = poison;
  ck_assert_int_eq(sn_cuda_rownorm_bwd_workspace(NULL, 3, 5), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_rownorm_bwd_workspace(&b, -1, 5), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_rownorm_bwd_workspace(&b, 3, 0), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_rownorm_bwd_workspace(&b, INT64_MAX / 2, 5), SN_ERR_OVERFLOW);
  ck_assert_uint_eq(b, poison);
  ck_assert_int_eq(sn_cuda_rownorm_bwd_workspace(&b, 0, 5), SN_OK);
  ck_assert_uint_eq(b, 0); /* "0 when rows == 0" */

  b = poison;
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(NULL, 2, 4, 3, SN_LAYOUT_NCHW),
                   SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&b, -1, 4, 3, SN_LAYOUT_NCHW), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&b, 2, 0, 3, SN_LAYOUT_NCHW), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&b, 2, 4, -1, SN_LAYOUT_NCHW), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&b, INT64_MAX / 2, 4, 3, SN_LAYOUT_NHWC),
                   SN_ERR_OVERFLOW);
  ck_assert_int_eq(sn_cuda_batchnorm_workspace(&b, 2, 4, 3, (sn_layout_t)7),
                   SN_ERR_INVALID_LAYOUT);
  ck_assert_uint_eq(b, poison);
  for (int lay = 0; lay < 2; lay++) {
    ck_assert_int_eq(sn_cuda_batchnorm_workspace(&b, 2, 4, 3, (sn_layout_t)lay), SN_OK);
    ck_assert_uint_gt(b, 0);
    ck_assert_uint_eq(b % 256, 0); /* arrays carved from it start 256-byte aligned */
  }

  b = poison;
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(NULL, 2, 4), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&b, -1, 4), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&b, 2, 0), SN_ERR_INVALID_SIZE);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&b, INT64_MAX / 2, 4), SN_ERR_OVERFLOW);
  ck_assert_uint_eq(b, poison);
  ck_assert_int_eq(sn_cuda_groupnorm_bwd_workspace(&b, 2, 4), SN_OK);
  ck_assert_uint_ge(b, 2 * 2 * 4 * sizeof(double)); /* dgamma and dbeta partials, [N, C] f64 */

  int count = -1;
  ck_assert_int_eq(sn_cuda_device_count(NULL), SN_ERR_NULL_POINTER);
  ck_assert_int_eq(sn_cuda_device_count(&count), SN_OK);
  ck_assert_int_ge(count, 0);
}
END_TEST

/* The run as a whole compared many cases and, without a GPU, checked the accepted ones too. */
START_TEST(test_counts) {
  printf("test_cuda_args: %d bases (%d with workspace checks), %d rejected cases compared, %d "
         "accepted by the CPU (%d of them checked on the CUDA side: %s)\n",
         g_bases, g_ws_bases, g_compared, g_cpu_ok, g_cpu_ok_checked,
         g_have_device ? "a GPU is present, not launched" : "no GPU");
  ck_assert_int_ge(g_bases, 3 * N_APIS); /* make_bases: the first, bf16/f16, NULLs, empty... */
  if (!g_have_device) ck_assert_int_ge(g_ws_unused_checked, 3); /* LN, RMS and GN backward */
  ck_assert_int_ge(g_compared, 20 * g_bases);
  ck_assert_int_gt(g_cpu_ok, 0);
  if (!g_have_device) ck_assert_int_eq(g_cpu_ok_checked, g_cpu_ok);
}
END_TEST

int main(void) {
  g_pool = aligned_alloc(256, POOL_BYTES); /* its slots are workspaces too: 256-byte aligned */
  g_pool_ref = malloc(POOL_BYTES);
  g_ws = aligned_alloc(256, WS_CAP);
  g_ws_ref = malloc(WS_CAP);
  if (!g_pool || !g_pool_ref || !g_ws || !g_ws_ref) {
    fprintf(stderr, "test_cuda_args: out of memory\n");
    return EXIT_FAILURE;
  }
  fill_valid(g_pool_ref, POOL_BYTES, 11);
  memcpy(g_pool, g_pool_ref, POOL_BYTES);
  fill_valid(g_ws_ref, WS_CAP, 12);
  memcpy(g_ws, g_ws_ref, WS_CAP);
  int count = 0;
  g_have_device = sn_cuda_device_count(&count) == SN_OK && count > 0;

  Suite *s = suite_create("cuda_args");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_args_vs_cpu, 0, N_APIS);
  tcase_add_test(tc, test_workspace_queries);
  tcase_add_test(tc, test_counts);
  suite_add_tcase(s, tc);
  const int rc = ct_run_suite(s);
  free(g_pool);
  free(g_pool_ref);
  free(g_ws);
  free(g_ws_ref);
  return rc;
}
