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

sn_status_t sn__bn_stats_args(sn__args_t *a, const char *fn, const double *sum,
                              const double *sumsq, const void *x, const float *pivot, int64_t n,
                              int64_t c, int64_t s, sn_layout_t layout, sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "sum", sum));
  SN_TRY(sn__check_ptr(fn, "sumsq", sumsq));
  if (rows > 0) SN_TRY(sn__check_ptr(fn, "x", x));
  const sn__span_t spans[] = {SN_SPAN_OUT("sum", sum, c * 8, 0u),
                              SN_SPAN_OUT("sumsq", sumsq, c * 8, 0u),
                              SN_SPAN_IN("x", x, rows * c * sn_dtype_size(dtype)),
                              SN_SPAN_IN("pivot", pivot, c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_finalize_args(sn__args_t *a, const char *fn, const double *mean,
                                 const float *var, const float *rstd, const double *sum,
                                 const double *sumsq, const float *pivot, int64_t count, int64_t c,
                                 float eps) {
  args_init(a, fn, 0);
  SN_TRY(sn__check_size(fn, "c", c, 1));
  SN_TRY(sn__check_elems(fn, "c", c)); /* the overlap check's byte counts */
  SN_TRY(sn__check_train_count(fn, count));
  SN_TRY(sn__check_eps(fn, eps));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  SN_TRY(sn__check_ptr(fn, "sum", sum));
  SN_TRY(sn__check_ptr(fn, "sumsq", sumsq));
  const sn__span_t spans[] = {SN_SPAN_OUT("mean", mean, c * 8, 0u),
                              SN_SPAN_OUT("var", var, c * 4, 0u),
                              SN_SPAN_OUT("rstd", rstd, c * 4, 0u),
                              SN_SPAN_IN("sum", sum, c * 8),
                              SN_SPAN_IN("sumsq", sumsq, c * 8),
                              SN_SPAN_IN("pivot", pivot, c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_update_running_args(sn__args_t *a, const char *fn, const float *running_mean,
                                       const float *running_var,
                                       const int64_t *num_batches_tracked, const double *mean,
                                       const float *var, int64_t count, int64_t c,
                                       float momentum) {
  args_init(a, fn, 0);
  SN_TRY(sn__check_size(fn, "c", c, 1));
  SN_TRY(sn__check_elems(fn, "c", c)); /* the overlap check's byte counts */
  SN_TRY(sn__check_size(fn, "count", count, 0));
  SN_TRY(sn__check_momentum(fn, momentum));
  if (momentum == SN_MOMENTUM_CUMULATIVE)
    SN_TRY(sn__check_ptr(fn, "num_batches_tracked", num_batches_tracked));
  if (count == 1) return sn__check_train_count(fn, count); /* 0: an empty batch, counted */
  if (count > 1) {
    SN_TRY(sn__check_ptr(fn, "running_mean", running_mean));
    SN_TRY(sn__check_ptr(fn, "running_var", running_var));
    SN_TRY(sn__check_ptr(fn, "mean", mean));
    SN_TRY(sn__check_ptr(fn, "var", var));
  }
  /* every array passed at its size, also for an empty batch (count 0), which writes only
   * num_batches_tracked: that must not land in them either */
  const int64_t cb = c * 4;
  const sn__span_t spans[] = {SN_SPAN_OUT("running_mean", running_mean, cb, 0u),
                              SN_SPAN_OUT("running_var", running_var, cb, 0u),
                              SN_SPAN_OUT("num_batches_tracked", num_batches_tracked, 8, 0u),
                              SN_SPAN_IN("mean", mean, 2 * cb),
                              SN_SPAN_IN("var", var, cb)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_apply_args(sn__args_t *a, const char *fn, const void *y, const void *x,
                              const double *mean, const float *rstd, const float *gamma,
                              const float *beta, int64_t n, int64_t c, int64_t s,
                              sn_layout_t layout, sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  if (rows == 0) return SN_OK; /* nothing written */
  SN_TRY(sn__check_ptr(fn, "y", y));
  SN_TRY(sn__check_ptr(fn, "x", x));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("y", y, ab, 1u << 1), SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("mean", mean, c * 8),  SN_SPAN_IN("rstd", rstd, c * 4),
                              SN_SPAN_IN("gamma", gamma, c * 4), SN_SPAN_IN("beta", beta, c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_fwd_args(sn__args_t *a, const char *fn, const void *y, const double *mean,
                            const float *var, const float *rstd, const void *x,
                            const float *pivot, const float *gamma, const float *beta, int64_t n,
                            int64_t c, int64_t s, float eps, sn_layout_t layout,
                            sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_train_count(fn, rows));
  SN_TRY(sn__check_eps(fn, eps));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  SN_TRY(sn__check_ptr(fn, "y", y));
  SN_TRY(sn__check_ptr(fn, "x", x));
  /* the CPU's fused path writes a block's statistics while other threads still read other
   * channels' inputs: no [C] output may overlap anything either */
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {
      SN_SPAN_OUT("y", y, ab, 1u << 4),     SN_SPAN_OUT("mean", mean, c * 8, 0u),
      SN_SPAN_OUT("var", var, c * 4, 0u),   SN_SPAN_OUT("rstd", rstd, c * 4, 0u),
      SN_SPAN_IN("x", x, ab),               SN_SPAN_IN("pivot", pivot, c * 4),
      SN_SPAN_IN("gamma", gamma, c * 4),    SN_SPAN_IN("beta", beta, c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_infer_args(sn__args_t *a, const char *fn, const void *y, const void *x,
                              const float *running_mean, const float *running_var,
                              const float *gamma, const float *beta, int64_t n, int64_t c,
                              int64_t s, float eps, sn_layout_t layout, sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_eps(fn, eps));
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "running_mean", running_mean));
  SN_TRY(sn__check_ptr(fn, "running_var", running_var));
  if (rows == 0) return SN_OK; /* nothing written */
  SN_TRY(sn__check_ptr(fn, "y", y));
  SN_TRY(sn__check_ptr(fn, "x", x));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("y", y, ab, 1u << 1),
                              SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("running_mean", running_mean, c * 4),
                              SN_SPAN_IN("running_var", running_var, c * 4),
                              SN_SPAN_IN("gamma", gamma, c * 4),
                              SN_SPAN_IN("beta", beta, c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_bwd_reduce_args(sn__args_t *a, const char *fn, const double *sum_dy,
                                   const double *sum_dy_xhat, const void *dy, const void *x,
                                   const double *mean, const float *rstd, int64_t n, int64_t c,
                                   int64_t s, sn_layout_t layout, sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "sum_dy", sum_dy));
  SN_TRY(sn__check_ptr(fn, "sum_dy_xhat", sum_dy_xhat));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  if (rows > 0) {
    SN_TRY(sn__check_ptr(fn, "dy", dy));
    SN_TRY(sn__check_ptr(fn, "x", x));
  }
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {SN_SPAN_OUT("sum_dy", sum_dy, c * 8, 0u),
                              SN_SPAN_OUT("sum_dy_xhat", sum_dy_xhat, c * 8, 0u),
                              SN_SPAN_IN("dy", dy, ab),
                              SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("mean", mean, c * 8),
                              SN_SPAN_IN("rstd", rstd, c * 4)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_bwd_apply_args(sn__args_t *a, const char *fn, const void *dx, const void *dy,
                                  const void *x, const double *mean, const float *rstd,
                                  const float *gamma, const double *sum_dy,
                                  const double *sum_dy_xhat, int64_t count, int64_t n, int64_t c,
                                  int64_t s, sn_layout_t layout, sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  if (sum_dy != NULL || sum_dy_xhat != NULL) { /* training mode; both NULL: eval */
    SN_TRY(sn__check_ptr(fn, "sum_dy", sum_dy));
    SN_TRY(sn__check_ptr(fn, "sum_dy_xhat", sum_dy_xhat));
    SN_TRY(sn__check_train_count(fn, count)); /* as finalize: such a batch had no forward */
  }
  if (rows == 0) return SN_OK; /* nothing written */
  SN_TRY(sn__check_ptr(fn, "dx", dx));
  SN_TRY(sn__check_ptr(fn, "dy", dy));
  SN_TRY(sn__check_ptr(fn, "x", x));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  const sn__span_t spans[] = {
      SN_SPAN_OUT("dx", dx, ab, 1u << 1),      SN_SPAN_IN("dy", dy, ab),
      SN_SPAN_IN("x", x, ab),                  SN_SPAN_IN("mean", mean, c * 8),
      SN_SPAN_IN("rstd", rstd, c * 4),         SN_SPAN_IN("gamma", gamma, c * 4),
      SN_SPAN_IN("sum_dy", sum_dy, c * 8),     SN_SPAN_IN("sum_dy_xhat", sum_dy_xhat, c * 8)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__bn_bwd_args(sn__args_t *a, const char *fn, const void *dx, const float *dgamma,
                            const float *dbeta, const void *dy, const void *x, const double *mean,
                            const float *rstd, const float *gamma, int64_t n, int64_t c,
                            int64_t s, sn_layout_t layout, sn_dtype_t dtype) {
  int64_t rows;
  SN_TRY(sn__check_ncs(fn, n, c, s, &rows));
  args_init(a, fn, rows);
  SN_TRY(sn__check_layout(fn, layout));
  SN_TRY(sn__check_act_dtype(fn, dtype));
  SN_TRY(sn__check_train_count(fn, rows)); /* as finalize: such a batch had no forward */
  SN_TRY(sn__check_ptr(fn, "mean", mean));
  SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  SN_TRY(sn__check_ptr(fn, "dx", dx));
  SN_TRY(sn__check_ptr(fn, "dy", dy));
  SN_TRY(sn__check_ptr(fn, "x", x));
  const int64_t ab = rows * c * sn_dtype_size(dtype);
  /* every input is read before dgamma and dbeta are written: they may equal gamma or rstd */
  const unsigned over_params = 1u << 6 | 1u << 7; /* rstd, gamma */
  const sn__span_t spans[] = {SN_SPAN_OUT("dx", dx, ab, 1u << 3),
                              SN_SPAN_OUT("dgamma", dgamma, c * 4, over_params),
                              SN_SPAN_OUT("dbeta", dbeta, c * 4, over_params),
                              SN_SPAN_IN("dy", dy, ab),
                              SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("mean", mean, c * 8),
                              SN_SPAN_IN("rstd", rstd, c * 4),
                              SN_SPAN_IN("gamma", gamma, c * 4)};
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

sn_status_t sn__gn_fwd_args(sn__args_t *a, const char *fn, const void *y, const float *mean,
                            const float *rstd, const void *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t s, int64_t groups,
                            float eps, sn_layout_t layout, sn_dtype_t dtype) {
  SN_TRY(check_gn(a, fn, n, c, s, groups, layout, dtype));
  SN_TRY(sn__check_eps(fn, eps));
  const int64_t rows = a->rows;
  if (rows > 0) {
    SN_TRY(sn__check_ptr(fn, "y", y));
    SN_TRY(sn__check_ptr(fn, "x", x));
  }
  /* mean and rstd [N, G] checked also where S == 0 (an empty batch writes nothing) */
  const int64_t ab = rows * c * sn_dtype_size(dtype), sb = n * groups * 4, pb = c * 4;
  const sn__span_t spans[] = {SN_SPAN_OUT("y", y, ab, 1u << 3), SN_SPAN_OUT("mean", mean, sb, 0u),
                              SN_SPAN_OUT("rstd", rstd, sb, 0u),  SN_SPAN_IN("x", x, ab),
                              SN_SPAN_IN("gamma", gamma, pb),     SN_SPAN_IN("beta", beta, pb)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__gn_bwd_args(sn__args_t *a, const char *fn, const void *dx, const float *dgamma,
                            const float *dbeta, const void *dy, const void *x, const float *mean,
                            const float *rstd, const float *gamma, int64_t n, int64_t c,
                            int64_t s, int64_t groups, sn_layout_t layout, sn_dtype_t dtype) {
  SN_TRY(check_gn(a, fn, n, c, s, groups, layout, dtype));
  const int64_t rows = a->rows;
  if (rows > 0) { /* an empty batch may pass NULL for these */
    SN_TRY(sn__check_ptr(fn, "dx", dx));
    SN_TRY(sn__check_ptr(fn, "dy", dy));
    SN_TRY(sn__check_ptr(fn, "x", x));
    SN_TRY(sn__check_ptr(fn, "mean", mean));
    SN_TRY(sn__check_ptr(fn, "rstd", rstd));
  }
  /* dx may equal dy; activations absent (0 bytes) in an empty batch, mean and rstd [N, G] */
  const int64_t ab = rows * c * sn_dtype_size(dtype), sb = n * groups * 4, pb = c * 4;
  const sn__span_t spans[] = {
      SN_SPAN_OUT("dx", dx, ab, 1u << 3),     SN_SPAN_OUT("dgamma", dgamma, pb, 0u),
      SN_SPAN_OUT("dbeta", dbeta, pb, 0u),    SN_SPAN_IN("dy", dy, ab),
      SN_SPAN_IN("x", x, ab),                 SN_SPAN_IN("mean", mean, sb),
      SN_SPAN_IN("rstd", rstd, sb),           SN_SPAN_IN("gamma", gamma, pb)};
  return args_spans(a, spans, SN_SPANS(spans));
}

sn_status_t sn__fold_args(sn__args_t *a, const char *fn, const float *w, const float *b,
                          const float *gamma, const float *beta, const float *running_mean,
                          const float *running_var, int64_t c_out, int64_t per_out, float eps) {
  int64_t total;
  args_init(a, fn, 0);
  SN_TRY(sn__check_size(fn, "c_out", c_out, 1));
  SN_TRY(sn__check_size(fn, "per_out", per_out, 1));
  SN_TRY(sn__mul(fn, &total, c_out, per_out));
  a->rows = total;
  SN_TRY(sn__check_eps(fn, eps));
  SN_TRY(sn__check_ptr(fn, "w", w));
  SN_TRY(sn__check_ptr(fn, "b", b));
  SN_TRY(sn__check_ptr(fn, "running_mean", running_mean));
  SN_TRY(sn__check_ptr(fn, "running_var", running_var));
  const int64_t cb = c_out * 4;
  const sn__span_t spans[] = {SN_SPAN_OUT("w", w, total * 4, 0u),
                              SN_SPAN_OUT("b", b, cb, 0u),
                              SN_SPAN_IN("gamma", gamma, cb),
                              SN_SPAN_IN("beta", beta, cb),
                              SN_SPAN_IN("running_mean", running_mean, cb),
                              SN_SPAN_IN("running_var", running_var, cb)};
  return args_spans(a, spans, SN_SPANS(spans));
}
