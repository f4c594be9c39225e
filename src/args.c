/*
 * args.c — the argument checks each CPU kernel and its CUDA twin share (args.h). The order of
 * the checks in each function is the order its errors are reported in.
 */
#include "args.h"

#include <stdint.h>
#include <string.h>

/* ---- sizes ----------------------------------------------------------------------------------- */

sn_status_t sn__check_ncs(const char *fn, int64_t n, int64_t c, int64_t s, int64_t *rows) {
  int64_t nc, total;
  SN_TRY(sn__check_size(fn, "c", c, 1));
  SN_TRY(sn__check_size(fn, "n", n, 0));
  SN_TRY(sn__check_size(fn, "s", s, 0));
  SN_TRY(sn__check_elems(fn, "c", c)); /* the c-element sums and parameters, even when n·s = 0 */
  SN_TRY(sn__mul(fn, &nc, n, c));
  SN_TRY(sn__mul(fn, &total, nc, s));
  *rows = n * s; /* <= total since c >= 1 */
  return SN_OK;
}

sn_status_t sn__check_train_count(const char *fn, int64_t count) {
  if (count > 1) return SN_OK;
  return sn__fail(SN_ERR_INSUFFICIENT_COUNT,
                  "%s: expected more than 1 value per channel when training, got count %lld", fn,
                  (long long)count);
}

/* ---- row norms ------------------------------------------------------------------------------- */

/* rows >= 0, d >= 1, d and rows·d fit, eps (unless NULL: the backwards), dtype; *n = rows·d. */
static sn_status_t rownorm_sizes(const char *fn, int64_t rows, int64_t d, const float *eps,
                                 sn_dtype_t dtype, int64_t *n) {
  SN_TRY(sn__check_size(fn, "rows", rows, 0));
  SN_TRY(sn__check_size(fn, "d", d, 1));
  SN_TRY(sn__check_elems(fn, "d", d)); /* gamma, dgamma: d elements even when rows = 0 */
  SN_TRY(sn__mul(fn, n, rows, d));
  if (eps != NULL) SN_TRY(sn__check_eps(fn, *eps));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  return SN_OK;
}

/* A row of activations or per-row statistics: may be NULL only for an empty batch (n == 0). */
static sn_status_t check_act(const char *fn, const char *name, const void *p, int64_t n) {
  return n > 0 ? sn__check_ptr(fn, name, p) : SN_OK;
}

sn_status_t sn__rownorm_fwd_check(const char *fn, const sn__rn_fwd_t *a, int64_t *n) {
  SN_TRY(rownorm_sizes(fn, a->rows, a->d, &a->eps, a->dtype, n));
  SN_TRY(check_act(fn, "y", a->y, *n));
  if (a->fused) SN_TRY(check_act(fn, "sum_out", a->sum_out, *n));
  SN_TRY(check_act(fn, "x", a->x, *n));
  if (a->fused) SN_TRY(check_act(fn, "residual", a->res, *n));
  return SN_OK;
}

sn_status_t sn__rownorm_bwd_check(const char *fn, const sn__rn_bwd_t *a, int64_t *n) {
  SN_TRY(rownorm_sizes(fn, a->rows, a->d, NULL, a->dtype, n));
  SN_TRY(check_act(fn, "dx", a->dx, *n));
  SN_TRY(check_act(fn, "dy", a->dy, *n));
  SN_TRY(check_act(fn, "x", a->x, *n));
  if (!a->rms) SN_TRY(check_act(fn, "mean", a->mean, *n));
  SN_TRY(check_act(fn, "rstd", a->rstd, *n));
  return SN_OK;
}

sn_status_t sn__rownorm_fwd_spans(const char *fn, const sn__rn_fwd_t *a) {
  const int64_t ab = a->rows * a->d * sn_dtype_size(a->dtype), rb = a->rows * 4, pb = a->d * 4;
  const sn__span_t s[] = {SN_SPAN_OUT("y", a->y, ab, a->sum_out == NULL ? 1u << 4 : 0u),
                          SN_SPAN_OUT("sum_out", a->sum_out, ab, 1u << 4 | 1u << 5),
                          SN_SPAN_OUT("mean", a->mean, rb, 0u),
                          SN_SPAN_OUT("rstd", a->rstd, rb, 0u),
                          SN_SPAN_IN("x", a->x, ab),
                          SN_SPAN_IN("residual", a->res, ab),
                          SN_SPAN_IN("gamma", a->gamma, pb), /* 4: sizeof(float) */
                          SN_SPAN_IN("beta", a->beta, pb)};
  return sn__check_spans(fn, s, SN_SPANS(s));
}

sn_status_t sn__rownorm_bwd_spans(const char *fn, const sn__rn_bwd_t *a, const void *ws,
                                  int64_t ws_bytes) {
  const int64_t ab = a->rows * a->d * sn_dtype_size(a->dtype), rb = a->rows * 4, pb = a->d * 4;
  const sn__span_t s[] = {SN_SPAN_OUT("dx", a->dx, ab, 1u << 3),
                          SN_SPAN_OUT("dgamma", a->dgamma, pb, 0u),
                          SN_SPAN_OUT("dbeta", a->dbeta, pb, 0u),
                          SN_SPAN_IN("dy", a->dy, ab),
                          SN_SPAN_IN("x", a->x, ab),
                          SN_SPAN_IN("mean", a->mean, rb), /* 4: sizeof(float) */
                          SN_SPAN_IN("rstd", a->rstd, rb),
                          SN_SPAN_IN("gamma", a->gamma, pb),
                          SN_SPAN_OUT("workspace", ws, ws_bytes, 0u)};
  return sn__check_spans(fn, s, SN_SPANS(s));
}

/* ---- whole-call checks ----------------------------------------------------------------------- */

static void args_init(sn__args_t *a, const char *fn, int64_t rows) {
  a->fn = fn;
  a->count = 0;
  a->rows = rows;
}

/* Keeps the call's buffers in a and checks them for overlap (sn__check_spans). */
static sn_status_t args_spans(sn__args_t *a, const sn__span_t *s, int count) {
  memcpy(a->span, s, (size_t)count * sizeof *s);
  a->count = count;
  return sn__check_spans(a->fn, a->span, count);
}

sn_status_t sn__check_workspace(const char *fn, const void *ws, size_t bytes, size_t need) {
  if (need == 0) return SN_OK;
  if (ws == NULL)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: workspace is NULL, %zu bytes are needed", fn,
                    need);
  if (bytes < need)
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: workspace_bytes is %zu, %zu are needed (see the *_workspace query)", fn,
                    bytes, need);
  /* the kernels read and write it as double and 16-byte vectors: a misaligned one would fault
   * on the device, which ends the CUDA context */
  if (((uintptr_t)ws & (SN_WORKSPACE_ALIGN - 1)) != 0)
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: workspace %p is not %d-byte aligned (cudaMalloc's memory is)", fn, ws,
                    SN_WORKSPACE_ALIGN);
  return SN_OK;
}

sn_status_t sn__args_workspace(sn__args_t *a, const void *ws, size_t bytes, size_t need) {
  if (need == 0) return SN_OK;
  SN_TRY(sn__check_workspace(a->fn, ws, bytes, need));
  if (need > (size_t)INT64_MAX || a->count >= SN_ARGS_MAX_SPANS)
    return sn__fail(SN_ERR_INTERNAL, "%s: workspace of %zu bytes not checkable", a->fn, need);
  const sn__span_t w = SN_SPAN_OUT("workspace", ws, (int64_t)need, 0u);
  a->span[a->count++] = w;
  return sn__check_spans(a->fn, a->span, a->count);
}

/* A BatchNorm call's activation sizes (sn__check_ncs; a->rows = n·s), layout and dtype. */
static sn_status_t bn_acts(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, k->n, k->c, k->s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_layout(fn, k->layout));
  return sn__check_act_dtype(fn, k->dtype);
}

sn_status_t sn__bn_stats_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  SN_TRY(bn_acts(a, fn, k));
  const int64_t rows = a->rows;
  SN_TRY(sn__check_ptr(fn, "sum", k->sum));
  SN_TRY(sn__check_ptr(fn, "sumsq", k->sumsq));
  if (rows > 0) SN_TRY(sn__check_ptr(fn, "x", k->x));
  const sn__span_t spans[] = {SN_SPAN_OUT("sum", k->sum, k->c * 8, 0u),
                              SN_SPAN_OUT("sumsq", k->sumsq, k->c * 8, 0u),
                              SN_SPAN_IN("x", k->x, rows * k->c * sn_dtype_size(k->dtype)),
                              SN_SPAN_IN("pivot", k->pivot, k->c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_finalize_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  args_init(a, fn, 0);
  SN_TRY(sn__check_size(fn, "c", k->c, 1));
  SN_TRY(sn__check_elems(fn, "c", k->c)); /* the overlap check's byte counts */
  SN_TRY(sn__check_train_count(fn, k->count));
  SN_TRY(sn__check_eps(fn, k->eps));
  SN_TRY(sn__check_ptr(fn, "mean", k->mean));
  SN_TRY(sn__check_ptr(fn, "rstd", k->rstd));
  SN_TRY(sn__check_ptr(fn, "sum", k->sum));
  SN_TRY(sn__check_ptr(fn, "sumsq", k->sumsq));
  const sn__span_t spans[] = {
      SN_SPAN_OUT("mean", k->mean, k->c * 8, 0u), SN_SPAN_OUT("var", k->var, k->c * 4, 0u),
      SN_SPAN_OUT("rstd", k->rstd, k->c * 4, 0u), SN_SPAN_IN("sum", k->sum, k->c * 8),
      SN_SPAN_IN("sumsq", k->sumsq, k->c * 8),    SN_SPAN_IN("pivot", k->pivot, k->c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_update_running_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  args_init(a, fn, 0);
  SN_TRY(sn__check_size(fn, "c", k->c, 1));
  SN_TRY(sn__check_elems(fn, "c", k->c)); /* the overlap check's byte counts */
  SN_TRY(sn__check_size(fn, "count", k->count, 0));
  SN_TRY(sn__check_momentum(fn, k->momentum));
  if (k->momentum == SN_MOMENTUM_CUMULATIVE)
    SN_TRY(sn__check_ptr(fn, "num_batches_tracked", k->num_batches_tracked));
  if (k->count == 1) return sn__check_train_count(fn, k->count); /* 0: an empty batch, counted */
  if (k->count > 1) {
    SN_TRY(sn__check_ptr(fn, "running_mean", k->running_mean));
    SN_TRY(sn__check_ptr(fn, "running_var", k->running_var));
    SN_TRY(sn__check_ptr(fn, "mean", k->mean));
    SN_TRY(sn__check_ptr(fn, "var", k->var));
  }
  /* every array passed at its size, also for an empty batch (count 0), which writes only
   * num_batches_tracked: that must not land in them either */
  const int64_t cb = k->c * 4;
  const sn__span_t spans[] = {SN_SPAN_OUT("running_mean", k->running_mean, cb, 0u),
                              SN_SPAN_OUT("running_var", k->running_var, cb, 0u),
                              SN_SPAN_OUT("num_batches_tracked", k->num_batches_tracked, 8, 0u),
                              SN_SPAN_IN("mean", k->mean, 2 * cb), SN_SPAN_IN("var", k->var, cb)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_apply_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  SN_TRY(bn_acts(a, fn, k));
  const int64_t rows = a->rows;
  SN_TRY(sn__check_ptr(fn, "mean", k->mean));
  SN_TRY(sn__check_ptr(fn, "rstd", k->rstd));
  if (rows == 0) return SN_OK; /* nothing written */
  SN_TRY(sn__check_ptr(fn, "y", k->y));
  SN_TRY(sn__check_ptr(fn, "x", k->x));
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype);
  const sn__span_t spans[] = {
      SN_SPAN_OUT("y", k->y, ab, 1u << 1),     SN_SPAN_IN("x", k->x, ab),
      SN_SPAN_IN("mean", k->mean, k->c * 8),   SN_SPAN_IN("rstd", k->rstd, k->c * 4),
      SN_SPAN_IN("gamma", k->gamma, k->c * 4), SN_SPAN_IN("beta", k->beta, k->c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_fwd_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  SN_TRY(bn_acts(a, fn, k));
  const int64_t rows = a->rows;
  SN_TRY(sn__check_train_count(fn, rows));
  SN_TRY(sn__check_eps(fn, k->eps));
  SN_TRY(sn__check_ptr(fn, "mean", k->mean));
  SN_TRY(sn__check_ptr(fn, "rstd", k->rstd));
  SN_TRY(sn__check_ptr(fn, "y", k->y));
  SN_TRY(sn__check_ptr(fn, "x", k->x));
  /* the CPU's fused path writes a block's statistics while other threads still read other
   * channels' inputs: no [C] output may overlap anything either */
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("y", k->y, ab, 1u << 4),
                              SN_SPAN_OUT("mean", k->mean, k->c * 8, 0u),
                              SN_SPAN_OUT("var", k->var, k->c * 4, 0u),
                              SN_SPAN_OUT("rstd", k->rstd, k->c * 4, 0u),
                              SN_SPAN_IN("x", k->x, ab),
                              SN_SPAN_IN("pivot", k->pivot, k->c * 4),
                              SN_SPAN_IN("gamma", k->gamma, k->c * 4),
                              SN_SPAN_IN("beta", k->beta, k->c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_infer_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, k->n, k->c, k->s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_eps(fn, k->eps));
  SN_TRY(sn__check_layout(fn, k->layout));
  SN_TRY(sn__check_act_dtype(fn, k->dtype));
  SN_TRY(sn__check_ptr(fn, "running_mean", k->running_mean));
  SN_TRY(sn__check_ptr(fn, "running_var", k->running_var));
  if (rows == 0) return SN_OK; /* nothing written */
  SN_TRY(sn__check_ptr(fn, "y", k->y));
  SN_TRY(sn__check_ptr(fn, "x", k->x));
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("y", k->y, ab, 1u << 1),
                              SN_SPAN_IN("x", k->x, ab),
                              SN_SPAN_IN("running_mean", k->running_mean, k->c * 4),
                              SN_SPAN_IN("running_var", k->running_var, k->c * 4),
                              SN_SPAN_IN("gamma", k->gamma, k->c * 4),
                              SN_SPAN_IN("beta", k->beta, k->c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_bwd_reduce_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  SN_TRY(bn_acts(a, fn, k));
  const int64_t rows = a->rows;
  SN_TRY(sn__check_ptr(fn, "sum_dy", k->sum_dy));
  SN_TRY(sn__check_ptr(fn, "sum_dy_xhat", k->sum_dy_xhat));
  SN_TRY(sn__check_ptr(fn, "mean", k->mean));
  SN_TRY(sn__check_ptr(fn, "rstd", k->rstd));
  if (rows > 0) {
    SN_TRY(sn__check_ptr(fn, "dy", k->dy));
    SN_TRY(sn__check_ptr(fn, "x", k->x));
  }
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("sum_dy", k->sum_dy, k->c * 8, 0u),
                              SN_SPAN_OUT("sum_dy_xhat", k->sum_dy_xhat, k->c * 8, 0u),
                              SN_SPAN_IN("dy", k->dy, ab),
                              SN_SPAN_IN("x", k->x, ab),
                              SN_SPAN_IN("mean", k->mean, k->c * 8),
                              SN_SPAN_IN("rstd", k->rstd, k->c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_bwd_apply_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  SN_TRY(bn_acts(a, fn, k));
  const int64_t rows = a->rows;
  SN_TRY(sn__check_ptr(fn, "mean", k->mean));
  SN_TRY(sn__check_ptr(fn, "rstd", k->rstd));
  if (k->sum_dy != NULL || k->sum_dy_xhat != NULL) { /* training mode; both NULL: eval */
    SN_TRY(sn__check_ptr(fn, "sum_dy", k->sum_dy));
    SN_TRY(sn__check_ptr(fn, "sum_dy_xhat", k->sum_dy_xhat));
    SN_TRY(sn__check_train_count(fn, k->count)); /* as finalize: such a batch had no forward */
  }
  if (rows == 0) return SN_OK; /* nothing written */
  SN_TRY(sn__check_ptr(fn, "dx", k->dx));
  SN_TRY(sn__check_ptr(fn, "dy", k->dy));
  SN_TRY(sn__check_ptr(fn, "x", k->x));
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("dx", k->dx, ab, 1u << 1),
                              SN_SPAN_IN("dy", k->dy, ab),
                              SN_SPAN_IN("x", k->x, ab),
                              SN_SPAN_IN("mean", k->mean, k->c * 8),
                              SN_SPAN_IN("rstd", k->rstd, k->c * 4),
                              SN_SPAN_IN("gamma", k->gamma, k->c * 4),
                              SN_SPAN_IN("sum_dy", k->sum_dy, k->c * 8),
                              SN_SPAN_IN("sum_dy_xhat", k->sum_dy_xhat, k->c * 8)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_bwd_args(sn__args_t *a, const char *fn, const sn__bn_call_t *k) {
  SN_TRY(bn_acts(a, fn, k));
  const int64_t rows = a->rows;
  SN_TRY(sn__check_train_count(fn, rows)); /* as finalize: such a batch had no forward */
  SN_TRY(sn__check_ptr(fn, "mean", k->mean));
  SN_TRY(sn__check_ptr(fn, "rstd", k->rstd));
  SN_TRY(sn__check_ptr(fn, "dx", k->dx));
  SN_TRY(sn__check_ptr(fn, "dy", k->dy));
  SN_TRY(sn__check_ptr(fn, "x", k->x));
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype);
  /* every input is read before dgamma and dbeta are written: they may equal gamma or rstd */
  const unsigned over_params = 1u << 6 | 1u << 7; /* rstd, gamma */
  const sn__span_t spans[] = {SN_SPAN_OUT("dx", k->dx, ab, 1u << 3),
                              SN_SPAN_OUT("dgamma", k->dgamma, k->c * 4, over_params),
                              SN_SPAN_OUT("dbeta", k->dbeta, k->c * 4, over_params),
                              SN_SPAN_IN("dy", k->dy, ab),
                              SN_SPAN_IN("x", k->x, ab),
                              SN_SPAN_IN("mean", k->mean, k->c * 8),
                              SN_SPAN_IN("rstd", k->rstd, k->c * 4),
                              SN_SPAN_IN("gamma", k->gamma, k->c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

/* GroupNorm's sizes and enums: sn__check_ncs, groups >= 1 dividing c, layout, dtype. */
static sn_status_t check_gn(sn__args_t *a, const char *fn, int64_t n, int64_t c, int64_t s,
                            int64_t groups, sn_layout_t layout, sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_size(fn, "groups", groups, 1));
  if (c % groups != 0)
    return sn__fail(SN_ERR_INVALID_GROUPS, "%s: c (%lld) must be divisible by groups (%lld)", fn,
                    (long long)c, (long long)groups);
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  return SN_OK;
}

sn_status_t sn__gn_fwd_args(sn__args_t *a, const char *fn, const sn__gn_call_t *k) {
  SN_TRY(check_gn(a, fn, k->n, k->c, k->s, k->groups, k->layout, k->dtype));
  SN_TRY(sn__check_eps(fn, k->eps));
  const int64_t rows = a->rows;
  if (rows > 0) {
    SN_TRY(sn__check_ptr(fn, "y", k->y));
    SN_TRY(sn__check_ptr(fn, "x", k->x));
  }
  /* mean and rstd [N, G] checked also where S == 0 (an empty batch writes nothing) */
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype), sb = k->n * k->groups * 4,
                pb = k->c * 4;
  const sn__span_t spans[] = {
      SN_SPAN_OUT("y", k->y, ab, 1u << 3),  SN_SPAN_OUT("mean", k->mean, sb, 0u),
      SN_SPAN_OUT("rstd", k->rstd, sb, 0u), SN_SPAN_IN("x", k->x, ab),
      SN_SPAN_IN("gamma", k->gamma, pb),    SN_SPAN_IN("beta", k->beta, pb)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__gn_bwd_args(sn__args_t *a, const char *fn, const sn__gn_call_t *k) {
  SN_TRY(check_gn(a, fn, k->n, k->c, k->s, k->groups, k->layout, k->dtype));
  const int64_t rows = a->rows;
  if (rows > 0) { /* an empty batch may pass NULL for these */
    SN_TRY(sn__check_ptr(fn, "dx", k->dx));
    SN_TRY(sn__check_ptr(fn, "dy", k->dy));
    SN_TRY(sn__check_ptr(fn, "x", k->x));
    SN_TRY(sn__check_ptr(fn, "mean", k->mean));
    SN_TRY(sn__check_ptr(fn, "rstd", k->rstd));
  }
  /* dx may equal dy; activations absent (0 bytes) in an empty batch, mean and rstd [N, G] */
  const int64_t ab = rows * k->c * sn_dtype_size(k->dtype), sb = k->n * k->groups * 4,
                pb = k->c * 4;
  const sn__span_t spans[] = {SN_SPAN_OUT("dx", k->dx, ab, 1u << 3),
                              SN_SPAN_OUT("dgamma", k->dgamma, pb, 0u),
                              SN_SPAN_OUT("dbeta", k->dbeta, pb, 0u),
                              SN_SPAN_IN("dy", k->dy, ab),
                              SN_SPAN_IN("x", k->x, ab),
                              SN_SPAN_IN("mean", k->mean, sb),
                              SN_SPAN_IN("rstd", k->rstd, sb),
                              SN_SPAN_IN("gamma", k->gamma, pb)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__fold_args(sn__args_t *a, const char *fn, const sn__fold_call_t *k) {
  int64_t total;
  args_init(a, fn, 0);
  SN_TRY(sn__check_size(fn, "c_out", k->c_out, 1));
  SN_TRY(sn__check_size(fn, "per_out", k->per_out, 1));
  SN_TRY(sn__mul(fn, &total, k->c_out, k->per_out));
  a->rows = total;
  SN_TRY(sn__check_eps(fn, k->eps));
  SN_TRY(sn__check_ptr(fn, "w", k->w));
  SN_TRY(sn__check_ptr(fn, "b", k->b));
  SN_TRY(sn__check_ptr(fn, "running_mean", k->running_mean));
  SN_TRY(sn__check_ptr(fn, "running_var", k->running_var));
  const int64_t cb = k->c_out * 4;
  const sn__span_t spans[] = {SN_SPAN_OUT("w", k->w, total * 4, 0u),
                              SN_SPAN_OUT("b", k->b, cb, 0u),
                              SN_SPAN_IN("gamma", k->gamma, cb),
                              SN_SPAN_IN("beta", k->beta, cb),
                              SN_SPAN_IN("running_mean", k->running_mean, cb),
                              SN_SPAN_IN("running_var", k->running_var, cb)};
  return args_spans(a, spans, SN_SPANS(spans));
}
