/*
 * fuzz_kernels.c — libFuzzer target for the argument validation of the public CPU kernels
 * (syncnorm.h), SyncBatchNorm without a communicator or with a "self" one, and the
 * communicator calls that take sizes (syncnorm_dist.h).
 *
 * Each input is a sequence of up to 16 operations: a byte choosing the function (mod 21: 0-5 the
 * row norms, 6-11 the BatchNorm blocks, 12-13 GroupNorm, 14 fold, 15 a communicator call, 16
 * status strings, 17-18 a SyncBatchNorm layer, 19 sn_batchnorm_bwd, 20 sn_batchnorm_fwd), a
 * byte choosing "tame" or "wild" arguments (see
 * fuzz_call.h), then the function's arguments. The bytes choose the function and every argument:
 * sizes (small, odd, negative, huge, overflowing products, raw 64-bit), dtype and layout enum
 * values (valid and not), NULL or real pointers, in-place aliasing where the API allows it, eps
 * (0, −0, negative, NaN, ±Inf, subnormal, FLT_MAX, raw bits), groups, counts, momentum, config
 * flags, and the data (small integers, large means, constants, raw bit patterns with NaN/Inf).
 *
 * An oracle written from the header's documented rules gives the set of statuses a call may
 * return: empty means the call is valid and must return SN_OK. Buffers follow one rule: a call
 * that may succeed only ever gets real buffers of exactly the documented size (each its own
 * malloc, so ASan flags one element too far); a call whose sizes cannot be backed (invalid or
 * larger than CAP_ELEMS) only runs when the oracle says it must fail, with small buffers — if the
 * library accepted it, it would read or write past them. After the call:
 *  - must fail:    the status is one of the allowed ones, sn_last_error() names the function,
 *                  and no buffer changed (inputs and poisoned outputs compared byte for byte);
 *  - must succeed: SN_OK, inputs unchanged (unless aliased by an output), and each output that
 *                  the call writes has no poison left (outputs are filled with a signalling-NaN
 *                  pattern the library can never produce: it only emits quiet NaNs).
 * SyncBatchNorm layers get more checks (fuzz_syncbn.c). The framework is fuzz_call.{h,c}.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_call.h"

int fuzz_kernels_one(const uint8_t *data, size_t size);

/* ---- row norms: LayerNorm, RMSNorm ------------------------------------------------------------- */

typedef struct {
  int64_t rows, d, n;
  float eps;
  int dtype;
  uint32_t errs;
  int sizes_ok;
} rowargs_t;

static rowargs_t pick_rows(fz_t *in, int with_eps) {
  rowargs_t r;
  r.rows = pick_size(in);
  r.d = pick_size(in);
  r.eps = with_eps ? pick_eps(in) : 1.0f;
  r.dtype = pick_dtype(in);
  r.errs = 0;
  r.n = 0;
  if (r.rows < 0 || r.d < 1) r.errs |= ERR(SN_ERR_INVALID_SIZE);
  else if (r.d > MAX_ELEMS || !mul_ok(r.rows, r.d, &r.n)) r.errs |= ERR(SN_ERR_OVERFLOW);
  r.sizes_ok = r.errs == 0;
  if (!eps_ok(r.eps)) r.errs |= ERR(SN_ERR_INVALID_EPS);
  if (!dtype_ok(r.dtype)) r.errs |= ERR(SN_ERR_INVALID_DTYPE);
  return r;
}

static void op_rownorm(fz_t *in, int which) {
  static const char *const names[6] = {"sn_layernorm_fwd", "sn_layernorm_bwd", "sn_add_layernorm_fwd",
                                       "sn_rmsnorm_fwd", "sn_rmsnorm_bwd", "sn_add_rmsnorm_fwd"};
  const int bwd = which == 1 || which == 4, ln = which < 3, add = which == 2 || which == 5;
  rowargs_t r = pick_rows(in, !bwd);
  call_t c;
  call_init(&c, names[which], r.dtype, r.sizes_ok, r.n == 0);
  c.overlap_ok = 1; /* every buffer checked for overlap */
  c.errs = r.errs;
  const sn_dtype_t dt = (sn_dtype_t)r.dtype;
  sn_status_t st;
  if (!bwd) {
    const int y = add_arg(&c, "y", T_ACT, R_NONEMPTY, OUT, r.n, 1);
    const int so = add ? add_arg(&c, "sum_out", T_ACT, R_NONEMPTY, OUT, r.n, 1) : -1;
    const int mean = ln ? add_arg(&c, "mean", T_F32, R_OPT, OUT, r.rows, 1) : -1;
    const int rstd = add_arg(&c, "rstd", T_F32, R_OPT, OUT, r.rows, 1);
    const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, r.n, 0);
    const int res = add ? add_arg(&c, "residual", T_ACT, R_NONEMPTY, IN, r.n, 0) : -1;
    const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, r.d, 0);
    const int b = ln ? add_arg(&c, "beta", T_F32, R_OPT, IN, r.d, 0) : -1;
    choose_pointers(&c, in);
    if (add) maybe_alias(&c, in, so, (fz_u8(in) & 1) ? x : res); /* sum_out may be x or residual */
    else maybe_alias(&c, in, y, x);                              /* y may be x */
    if (!setup(&c, in)) return;
    if (which == 0)
      st = sn_layernorm_fwd(P(&c, y), P(&c, mean), P(&c, rstd), P(&c, x), P(&c, g), P(&c, b), r.rows, r.d, r.eps, dt);
    else if (which == 2)
      st = sn_add_layernorm_fwd(P(&c, y), P(&c, so), P(&c, mean), P(&c, rstd), P(&c, x), P(&c, res), P(&c, g),
                                P(&c, b), r.rows, r.d, r.eps, dt);
    else if (which == 3)
      st = sn_rmsnorm_fwd(P(&c, y), P(&c, rstd), P(&c, x), P(&c, g), r.rows, r.d, r.eps, dt);
    else
      st = sn_add_rmsnorm_fwd(P(&c, y), P(&c, so), P(&c, rstd), P(&c, x), P(&c, res), P(&c, g), r.rows, r.d,
                              r.eps, dt);
  } else {
    const int dx = add_arg(&c, "dx", T_ACT, R_NONEMPTY, OUT, r.n, 1);
    const int dg = add_arg(&c, "dgamma", T_F32, R_OPT, OUT, r.d, 1);
    const int db = ln ? add_arg(&c, "dbeta", T_F32, R_OPT, OUT, r.d, 1) : -1;
    const int dy = add_arg(&c, "dy", T_ACT, R_NONEMPTY, IN, r.n, 0);
    const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, r.n, 0);
    /* per-row statistics: required for a non-empty batch only, as activations */
    const int mean = ln ? add_arg(&c, "mean", T_F32, R_NONEMPTY, IN, r.rows, 0) : -1;
    const int rstd = add_arg(&c, "rstd", T_F32, R_NONEMPTY, IN, r.rows, 0);
    const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, r.d, 0);
    choose_pointers(&c, in);
    maybe_alias(&c, in, dx, dy); /* dx may be dy */
    if (!setup(&c, in)) return;
    if (ln)
      st = sn_layernorm_bwd(P(&c, dx), P(&c, dg), P(&c, db), P(&c, dy), P(&c, x), P(&c, mean), P(&c, rstd),
                            P(&c, g), r.rows, r.d, dt);
    else
      st = sn_rmsnorm_bwd(P(&c, dx), P(&c, dg), P(&c, dy), P(&c, x), P(&c, rstd), P(&c, g), r.rows, r.d, dt);
  }
  verify(&c, st);
}

/* ---- BatchNorm building blocks ------------------------------------------------------------------- */

typedef struct {
  int64_t n, c, s, rows, total;
  int layout, dtype;
  uint32_t errs;
  int sizes_ok;
} ncs_t;

static ncs_t pick_ncs(fz_t *in) {
  ncs_t v;
  v.n = pick_size(in);
  v.c = pick_size(in);
  v.s = pick_size(in);
  v.layout = pick_layout(in);
  v.dtype = pick_dtype(in);
  v.errs = 0;
  v.rows = v.total = 0;
  int64_t nc = 0;
  if (v.c < 1 || v.n < 0 || v.s < 0) v.errs |= ERR(SN_ERR_INVALID_SIZE);
  else if (v.c > MAX_ELEMS || !mul_ok(v.n, v.c, &nc) || !mul_ok(nc, v.s, &v.total))
    v.errs |= ERR(SN_ERR_OVERFLOW);
  else v.rows = v.n * v.s;
  v.sizes_ok = v.errs == 0;
  if (!layout_ok(v.layout)) v.errs |= ERR(SN_ERR_INVALID_LAYOUT);
  if (!dtype_ok(v.dtype)) v.errs |= ERR(SN_ERR_INVALID_DTYPE);
  return v;
}

/* Whether some running_var[i], i < c, is negative: sn_batchnorm_infer and sn_fold_batchnorm
 * reject it (SN_ERR_INVALID_ARGUMENT); NaN is accepted. */
static int negative_var(const float *running_var, int64_t c) {
  for (int64_t i = 0; i < c; i++)
    if (running_var[i] < 0.0f) return 1;
  return 0;
}

static void op_batchnorm(fz_t *in, int which) {
  static const char *const names[8] = {"sn_batchnorm_stats", "sn_batchnorm_finalize", "sn_batchnorm_apply",
                                       "sn_batchnorm_infer", "sn_batchnorm_bwd_reduce", "sn_batchnorm_bwd_apply",
                                       "sn_batchnorm_bwd",   "sn_batchnorm_fwd"};
  call_t c;
  sn_status_t st;
  if (which == 1) { /* finalize: c, count, eps only */
    const int64_t ch = pick_size(in), count = pick_size(in);
    const float eps = pick_eps(in);
    call_init(&c, names[1], SN_DTYPE_F32, ch >= 1 && ch <= MAX_ELEMS, 0);
    c.overlap_ok = 1; /* every buffer checked for overlap */
    if (ch < 1) c.errs |= ERR(SN_ERR_INVALID_SIZE);
    else if (ch > MAX_ELEMS) c.errs |= ERR(SN_ERR_OVERFLOW); /* [C] arrays' byte counts */
    if (count <= 1) c.errs |= ERR(SN_ERR_INSUFFICIENT_COUNT);
    if (!eps_ok(eps)) c.errs |= ERR(SN_ERR_INVALID_EPS);
    const int mean = add_arg(&c, "mean", T_F64, R_REQ, OUT, ch, 1);
    const int var = add_arg(&c, "var", T_F32, R_OPT, OUT, ch, 1);
    const int rstd = add_arg(&c, "rstd", T_F32, R_REQ, OUT, ch, 1);
    const int sum = add_arg(&c, "sum", T_F64, R_REQ, IN, ch, 0);
    const int sumsq = add_arg(&c, "sumsq", T_F64, R_REQ, IN, ch, 0);
    const int piv = add_arg(&c, "pivot", T_F32, R_OPT, IN, ch, 0);
    choose_pointers(&c, in);
    if (!setup(&c, in)) return;
    st = sn_batchnorm_finalize(P(&c, mean), P(&c, var), P(&c, rstd), P(&c, sum), P(&c, sumsq), P(&c, piv), count,
                               ch, eps);
    verify(&c, st);
    return;
  }
  ncs_t v = pick_ncs(in);
  const float eps = which == 3 || which == 7 ? pick_eps(in) : 1.0f;
  call_init(&c, names[which], v.dtype, v.sizes_ok, v.rows == 0);
  c.overlap_ok = 1; /* every buffer checked for overlap */
  c.errs = v.errs;
  if (!eps_ok(eps)) c.errs |= ERR(SN_ERR_INVALID_EPS);
  const sn_layout_t lay = (sn_layout_t)v.layout;
  const sn_dtype_t dt = (sn_dtype_t)v.dtype;
  switch (which) {
    case 0: { /* stats: sums written even for an empty batch (zeros) */
      const int sum = add_arg(&c, "sum", T_F64, R_REQ, OUT, v.c, 1);
      const int sumsq = add_arg(&c, "sumsq", T_F64, R_REQ, OUT, v.c, 1);
      const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int piv = add_arg(&c, "pivot", T_F32, R_OPT, IN, v.c, 0);
      choose_pointers(&c, in);
      if (!setup(&c, in)) return;
      const int empty = c.empty;
      c.empty = 0; /* the sums are written either way */
      st = sn_batchnorm_stats(P(&c, sum), P(&c, sumsq), P(&c, x), P(&c, piv), v.n, v.c, v.s, lay, dt);
      if (st == SN_OK && empty)
        for (int64_t k = 0; k < v.c; k++)
          FUZZ_CHECK(((double *)c.a[sum].p)[k] == 0.0 && ((double *)c.a[sumsq].p)[k] == 0.0,
                     "empty batch: sums not zero");
      break;
    }
    case 2: case 3: {
      const int y = add_arg(&c, "y", T_ACT, R_NONEMPTY, OUT, v.total, 1);
      const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int m = add_arg(&c, which == 2 ? "mean" : "running_mean", which == 2 ? T_F64 : T_F32, R_REQ, IN, v.c, 0);
      const int r = add_arg(&c, which == 2 ? "rstd" : "running_var", T_F32, R_REQ, IN, v.c, 0);
      const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, v.c, 0);
      const int b = add_arg(&c, "beta", T_F32, R_OPT, IN, v.c, 0);
      choose_pointers(&c, in);
      maybe_alias(&c, in, y, x);
      if (!setup(&c, in)) return;
      if (which == 3 && c.errs == 0 && !c.empty && negative_var(P(&c, r), v.c))
        c.errs |= ERR(SN_ERR_INVALID_ARGUMENT);
      if (which == 2)
        st = sn_batchnorm_apply(P(&c, y), P(&c, x), P(&c, m), P(&c, r), P(&c, g), P(&c, b), v.n, v.c, v.s, lay, dt);
      else
        st = sn_batchnorm_infer(P(&c, y), P(&c, x), P(&c, m), P(&c, r), P(&c, g), P(&c, b), v.n, v.c, v.s, eps,
                                lay, dt);
      break;
    }
    case 4: {
      const int sdy = add_arg(&c, "sum_dy", T_F64, R_REQ, OUT, v.c, 1);
      const int sdx = add_arg(&c, "sum_dy_xhat", T_F64, R_REQ, OUT, v.c, 1);
      const int dy = add_arg(&c, "dy", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int m = add_arg(&c, "mean", T_F64, R_REQ, IN, v.c, 0);
      const int r = add_arg(&c, "rstd", T_F32, R_REQ, IN, v.c, 0);
      choose_pointers(&c, in);
      if (!setup(&c, in)) return;
      c.empty = 0; /* written as zeros for an empty batch */
      st = sn_batchnorm_bwd_reduce(P(&c, sdy), P(&c, sdx), P(&c, dy), P(&c, x), P(&c, m), P(&c, r), v.n, v.c,
                                   v.s, lay, dt);
      break;
    }
    case 6: { /* the local backward: count n·s <= 1 is an error, even for an empty batch */
      const int dx = add_arg(&c, "dx", T_ACT, R_NONEMPTY, OUT, v.total, 1);
      const int dg = add_arg(&c, "dgamma", T_F32, R_OPT, OUT, v.c, 1);
      const int db = add_arg(&c, "dbeta", T_F32, R_OPT, OUT, v.c, 1);
      const int dy = add_arg(&c, "dy", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int m = add_arg(&c, "mean", T_F64, R_REQ, IN, v.c, 0);
      const int r = add_arg(&c, "rstd", T_F32, R_REQ, IN, v.c, 0);
      const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, v.c, 0);
      choose_pointers(&c, in);
      if (v.sizes_ok && v.rows <= 1) c.errs |= ERR(SN_ERR_INSUFFICIENT_COUNT);
      maybe_alias(&c, in, dx, dy);
      if (!setup(&c, in)) return;
      st = sn_batchnorm_bwd(P(&c, dx), P(&c, dg), P(&c, db), P(&c, dy), P(&c, x), P(&c, m), P(&c, r),
                            P(&c, g), v.n, v.c, v.s, lay, dt);
      break;
    }
    case 7: { /* the local forward: count n·s <= 1 is an error, even for an empty batch */
      const int y = add_arg(&c, "y", T_ACT, R_NONEMPTY, OUT, v.total, 1);
      const int m = add_arg(&c, "mean", T_F64, R_REQ, OUT, v.c, 1);
      const int var = add_arg(&c, "var", T_F32, R_OPT, OUT, v.c, 1);
      const int r = add_arg(&c, "rstd", T_F32, R_REQ, OUT, v.c, 1);
      const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int piv = add_arg(&c, "pivot", T_F32, R_OPT, IN, v.c, 0);
      const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, v.c, 0);
      const int b = add_arg(&c, "beta", T_F32, R_OPT, IN, v.c, 0);
      choose_pointers(&c, in);
      if (v.sizes_ok && v.rows <= 1) c.errs |= ERR(SN_ERR_INSUFFICIENT_COUNT);
      maybe_alias(&c, in, y, x);
      if (!setup(&c, in)) return;
      st = sn_batchnorm_fwd(P(&c, y), P(&c, m), P(&c, var), P(&c, r), P(&c, x), P(&c, piv), P(&c, g), P(&c, b),
                            v.n, v.c, v.s, eps, lay, dt);
      break;
    }
    default: { /* bwd_apply: both sums NULL = eval mode; one NULL is an error */
      const int64_t count = pick_size(in);
      const int dx = add_arg(&c, "dx", T_ACT, R_NONEMPTY, OUT, v.total, 1);
      const int dy = add_arg(&c, "dy", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
      const int m = add_arg(&c, "mean", T_F64, R_REQ, IN, v.c, 0);
      const int r = add_arg(&c, "rstd", T_F32, R_REQ, IN, v.c, 0);
      const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, v.c, 0);
      const int sdy = add_arg(&c, "sum_dy", T_F64, R_OPT, IN, v.c, 0);
      const int sdx = add_arg(&c, "sum_dy_xhat", T_F64, R_OPT, IN, v.c, 0);
      choose_pointers(&c, in);
      const int nulls = c.a[sdy].is_null + c.a[sdx].is_null;
      if (nulls == 1) c.errs |= ERR(SN_ERR_NULL_POINTER);
      if (nulls == 0 && count <= 1) c.errs |= ERR(SN_ERR_INSUFFICIENT_COUNT);
      maybe_alias(&c, in, dx, dy);
      if (!setup(&c, in)) return;
      st = sn_batchnorm_bwd_apply(P(&c, dx), P(&c, dy), P(&c, x), P(&c, m), P(&c, r), P(&c, g), P(&c, sdy),
                                  P(&c, sdx), count, v.n, v.c, v.s, lay, dt);
      break;
    }
  }
  verify(&c, st);
}

/* ---- GroupNorm ------------------------------------------------------------------------------------ */

static void op_groupnorm(fz_t *in, int bwd) {
  ncs_t v = pick_ncs(in);
  int64_t groups = pick_size(in);
  if (g_tame && v.c >= 1 && groups >= 1) { /* a divisor of C */
    groups = 1 + (groups - 1) % v.c;
    while (v.c % groups != 0) groups--;
  }
  const float eps = bwd ? 1.0f : pick_eps(in);
  call_t c;
  uint32_t errs = v.errs;
  if (groups < 1) {
    errs |= ERR(SN_ERR_INVALID_SIZE);
    v.sizes_ok = 0;
  } else if (v.c >= 1 && v.c % groups != 0) {
    errs |= ERR(SN_ERR_INVALID_GROUPS);
  }
  if (!eps_ok(eps)) errs |= ERR(SN_ERR_INVALID_EPS);
  call_init(&c, bwd ? "sn_groupnorm_bwd" : "sn_groupnorm_fwd", v.dtype, v.sizes_ok, v.rows == 0);
  c.overlap_ok = 1; /* every buffer checked for overlap */
  c.errs = errs;
  /* [N, G] statistics: N·G <= N·C when G divides C; otherwise the call fails anyway */
  int64_t ng = 0;
  if (v.sizes_ok && !mul_ok(v.n, groups, &ng)) ng = INT64_MAX;
  const sn_layout_t lay = (sn_layout_t)v.layout;
  const sn_dtype_t dt = (sn_dtype_t)v.dtype;
  sn_status_t st;
  if (!bwd) {
    const int y = add_arg(&c, "y", T_ACT, R_NONEMPTY, OUT, v.total, 1);
    const int mean = add_arg(&c, "mean", T_F32, R_OPT, OUT, ng, 1);
    const int rstd = add_arg(&c, "rstd", T_F32, R_OPT, OUT, ng, 1);
    const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
    const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, v.c, 0);
    const int b = add_arg(&c, "beta", T_F32, R_OPT, IN, v.c, 0);
    choose_pointers(&c, in);
    maybe_alias(&c, in, y, x);
    if (!setup(&c, in)) return;
    st = sn_groupnorm_fwd(P(&c, y), P(&c, mean), P(&c, rstd), P(&c, x), P(&c, g), P(&c, b), v.n, v.c, v.s, groups,
                          eps, lay, dt);
  } else {
    const int dx = add_arg(&c, "dx", T_ACT, R_NONEMPTY, OUT, v.total, 1);
    const int dg = add_arg(&c, "dgamma", T_F32, R_OPT, OUT, v.c, 1);
    const int db = add_arg(&c, "dbeta", T_F32, R_OPT, OUT, v.c, 1);
    const int dy = add_arg(&c, "dy", T_ACT, R_NONEMPTY, IN, v.total, 0);
    const int x = add_arg(&c, "x", T_ACT, R_NONEMPTY, IN, v.total, 0);
    /* mean/rstd are only required for a non-empty batch (N·S > 0), as in sn_layernorm_bwd */
    const int mean = add_arg(&c, "mean", T_F32, R_NONEMPTY, IN, ng, 0);
    const int rstd = add_arg(&c, "rstd", T_F32, R_NONEMPTY, IN, ng, 0);
    const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, v.c, 0);
    choose_pointers(&c, in);
    maybe_alias(&c, in, dx, dy);
    if (!setup(&c, in)) return;
    st = sn_groupnorm_bwd(P(&c, dx), P(&c, dg), P(&c, db), P(&c, dy), P(&c, x), P(&c, mean), P(&c, rstd),
                          P(&c, g), v.n, v.c, v.s, groups, lay, dt);
  }
  verify(&c, st);
}

/* ---- fold ------------------------------------------------------------------------------------------ */

static void op_fold(fz_t *in) {
  const int64_t c_out = pick_size(in), per_out = pick_size(in);
  const float eps = pick_eps(in);
  int64_t total = 0;
  call_t c;
  uint32_t errs = 0;
  if (c_out < 1 || per_out < 1) errs |= ERR(SN_ERR_INVALID_SIZE);
  else if (!mul_ok(c_out, per_out, &total)) errs |= ERR(SN_ERR_OVERFLOW);
  call_init(&c, "sn_fold_batchnorm", SN_DTYPE_F32, errs == 0, 0);
  c.overlap_ok = 1; /* every buffer checked for overlap */
  if (!eps_ok(eps)) errs |= ERR(SN_ERR_INVALID_EPS);
  c.errs = errs;
  const int w = add_arg(&c, "w", T_F32, R_REQ, INOUT, total, 0);
  const int b = add_arg(&c, "b", T_F32, R_REQ, INOUT, c_out, 0);
  const int g = add_arg(&c, "gamma", T_F32, R_OPT, IN, c_out, 0);
  const int be = add_arg(&c, "beta", T_F32, R_OPT, IN, c_out, 0);
  const int rm = add_arg(&c, "running_mean", T_F32, R_REQ, IN, c_out, 0);
  const int rv = add_arg(&c, "running_var", T_F32, R_REQ, IN, c_out, 0);
  choose_pointers(&c, in);
  if (!setup(&c, in)) return;
  if (c.errs == 0 && negative_var(P(&c, rv), c_out)) c.errs |= ERR(SN_ERR_INVALID_ARGUMENT);
  sn_status_t st = sn_fold_batchnorm(P(&c, w), P(&c, b), P(&c, g), P(&c, be), P(&c, rm), P(&c, rv), c_out,
                                     per_out, eps);
  verify(&c, st);
}

/* ---- communicator calls on a "self" communicator --------------------------------------------------- */

static void op_comm(fz_t *in) {
  sn_comm_t *comm = (fz_u8(in) & 7) == 0 ? NULL : self_comm();
  const uint8_t what = fz_u8(in) % 5;
  if (what == 0) { /* allreduce_sum */
    const int64_t count = pick_size(in);
    const int dtype = pick_dtype(in);
    call_t c;
    uint32_t errs = 0;
    const int sizes_ok = count >= 0 && count <= INT32_MAX;
    if (count < 0) errs |= ERR(SN_ERR_INVALID_SIZE);
    if (count > INT32_MAX) errs |= ERR(SN_ERR_OVERFLOW);
    if (dtype != SN_DTYPE_F32 && dtype != SN_DTYPE_F64) errs |= ERR(SN_ERR_INVALID_DTYPE);
    if (comm == NULL) errs |= ERR(SN_ERR_NULL_POINTER);
    call_init(&c, "sn_comm_allreduce_sum", SN_DTYPE_F32, sizes_ok, count == 0);
    c.errs = errs;
    const int buf = add_arg(&c, "buf", dtype == SN_DTYPE_F64 ? T_F64 : T_F32, R_NONEMPTY, IN, count, 0);
    choose_pointers(&c, in);
    if (!setup(&c, in)) return;
    /* a one-rank sum is the identity: buf must come back unchanged (role IN) */
    verify(&c, sn_comm_allreduce_sum(comm, P(&c, buf), count, (sn_dtype_t)dtype));
  } else if (what == 1) { /* all_identical */
    const int64_t bytes = pick_size(in);
    const int null_out = (fz_u8(in) & 7) == 0;
    call_t c;
    uint32_t errs = 0;
    if (bytes < 0) errs |= ERR(SN_ERR_INVALID_SIZE);
    if (comm == NULL || null_out) errs |= ERR(SN_ERR_NULL_POINTER);
    call_init(&c, "sn_comm_all_identical", SN_DTYPE_F32, bytes >= 0, bytes == 0);
    c.errs = errs;
    const int buf = add_arg(&c, "buf", T_F32, R_NONEMPTY, IN, bytes >= 0 ? bytes / 4 + (bytes % 4 != 0) : -1, 0);
    choose_pointers(&c, in);
    if (!setup(&c, in)) return;
    int identical = -7;
    sn_status_t st = sn_comm_all_identical(comm, null_out ? NULL : &identical, P(&c, buf), bytes);
    const int ok = st == SN_OK;
    verify(&c, st);
    FUZZ_CHECK(ok ? identical == 1 : identical == -7, "identical %d after %s", identical, ok ? "OK" : "an error");
  } else if (what == 2) { /* set_timeout */
    double sec;
    const uint8_t b = fz_u8(in);
    static const double menu[8] = {0.0, -0.0, 1.0, -1.0, 1800.0, NAN, INFINITY, 1e300};
    if (b & 8) {
      uint64_t u = fz_u64(in);
      memcpy(&sec, &u, sizeof sec);
    } else {
      sec = menu[b & 7];
    }
    const int valid = comm != NULL && sec >= 0.0 && isfinite(sec);
    sn_status_t st = sn_comm_set_timeout(comm, sec);
    FUZZ_CHECK(valid ? st == SN_OK : (st == SN_ERR_INVALID_ARGUMENT || (comm == NULL && st == SN_ERR_NULL_POINTER)),
               "sn_comm_set_timeout(%g): %s", sec, sn_status_string(st));
  } else if (what == 3) { /* rank/size/backend */
    int rank = -5, sz = -5;
    FUZZ_CHECK(sn_comm_rank(comm, &rank) == (comm ? SN_OK : SN_ERR_NULL_POINTER), "rank");
    FUZZ_CHECK(sn_comm_size(comm, &sz) == (comm ? SN_OK : SN_ERR_NULL_POINTER), "size");
    FUZZ_CHECK(comm ? rank == 0 && sz == 1 : rank == -5 && sz == -5, "rank %d size %d", rank, sz);
    FUZZ_CHECK(sn_comm_rank(comm, NULL) == SN_ERR_NULL_POINTER, "rank(NULL)");
    FUZZ_CHECK(strcmp(sn_comm_backend(comm), comm ? "self" : "invalid") == 0, "backend");
  } else { /* split */
    const int color = (int)fz_u32(in), key = (int)fz_u32(in);
    sn_comm_t *sub = (sn_comm_t *)&sub; /* sentinel: must be overwritten only on success */
    sn_status_t st = sn_comm_split(comm, &sub, color, key);
    if (comm == NULL) {
      FUZZ_CHECK(st == SN_ERR_NULL_POINTER && sub == (sn_comm_t *)&sub, "split(NULL comm)");
    } else {
      FUZZ_CHECK(st == SN_OK, "split: %s", sn_last_error());
      FUZZ_CHECK(color < 0 ? sub == NULL : sub != NULL, "split: color %d gave %p", color, (void *)sub);
      sn_comm_destroy(sub);
    }
    FUZZ_CHECK(sn_comm_split(self_comm(), NULL, 0, 0) == SN_ERR_NULL_POINTER, "split(NULL sub)");
  }
}

/* ---- misc ------------------------------------------------------------------------------------------ */

static void op_misc(fz_t *in) {
  const int v = (int)fz_u32(in);
  const char *s = sn_status_string((sn_status_t)v);
  FUZZ_CHECK(s != NULL && strncmp(s, "SN_", 3) == 0, "sn_status_string(%d)", v);
  const int64_t sz = sn_dtype_size((sn_dtype_t)v);
  FUZZ_CHECK(sz == (v == 0 ? 4 : v == 1 || v == 2 ? 2 : v == 3 ? 8 : 0), "sn_dtype_size(%d) = %lld", v, (long long)sz);
  FUZZ_CHECK(sn_last_error() != NULL && sn_version() != NULL, "strings");
}

int fuzz_kernels_one(const uint8_t *data, size_t size) {
  fz_t in = {data, size};
  for (int op = 0; op < 16 && in.n > 0; op++) {
    const uint8_t which = fz_u8(&in) % 21;
    g_tame = (fz_u8(&in) & 3) != 0;
    if (which < 6) op_rownorm(&in, which);
    else if (which < 12) op_batchnorm(&in, which - 6);
    else if (which < 14) op_groupnorm(&in, which - 12);
    else if (which == 14) op_fold(&in);
    else if (which == 15) op_comm(&in);
    else if (which == 16) op_misc(&in);
    else if (which == 19) op_batchnorm(&in, 6); /* sn_batchnorm_bwd, added after the others */
    else if (which == 20) op_batchnorm(&in, 7); /* sn_batchnorm_fwd, added after that */
    else fuzz_op_syncbn(&in);
  }
  return 0;
}

#ifndef SN_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_kernels_one(data, size); }
#endif
