/*
 * bench_dnnl.c — see bench_dnnl.h. oneDNN 2.x C API (dnnl_*_desc_init +
 * dnnl_primitive_desc_create); oneDNN 3.x replaced that API and is not supported here (the build
 * then falls back to "-").
 */
#include "bench_dnnl.h"

#include "bench_util.h"

#ifndef SN_BENCH_HAVE_DNNL

struct bd_prim {
  int unused;
};

const char *bd_describe(void) { return "not built with oneDNN"; }

static bd_prim_t *bd_none(const char **why) {
  if (why) *why = "built without oneDNN";
  return NULL;
}

bd_prim_t *bd_layernorm_fwd(void *y, float *mean, float *var, const void *x, const float *gamma,
                            const float *beta, int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                            const char **why) {
  (void)y, (void)mean, (void)var, (void)x, (void)gamma, (void)beta, (void)rows, (void)d, (void)eps,
      (void)dtype;
  return bd_none(why);
}
bd_prim_t *bd_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                            const float *mean, const float *var, const float *gamma,
                            const float *beta, int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                            const char **why) {
  (void)dx, (void)dgamma, (void)dbeta, (void)dy, (void)x, (void)mean, (void)var, (void)gamma,
      (void)beta, (void)rows, (void)d, (void)eps, (void)dtype;
  return bd_none(why);
}
bd_prim_t *bd_batchnorm_fwd(void *y, float *mean, float *var, const void *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t h, int64_t w,
                            float eps, sn_layout_t layout, sn_dtype_t dtype, const char **why) {
  (void)y, (void)mean, (void)var, (void)x, (void)gamma, (void)beta, (void)n, (void)c, (void)h,
      (void)w, (void)eps, (void)layout, (void)dtype;
  return bd_none(why);
}
bd_prim_t *bd_batchnorm_infer(void *y, const void *x, const float *mean, const float *var,
                              const float *gamma, const float *beta, int64_t n, int64_t c,
                              int64_t h, int64_t w, float eps, sn_layout_t layout, sn_dtype_t dtype,
                              const char **why) {
  (void)y, (void)x, (void)mean, (void)var, (void)gamma, (void)beta, (void)n, (void)c, (void)h,
      (void)w, (void)eps, (void)layout, (void)dtype;
  return bd_none(why);
}
bd_prim_t *bd_batchnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                            const float *mean, const float *var, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t h, int64_t w,
                            float eps, sn_layout_t layout, sn_dtype_t dtype, const char **why) {
  (void)dx, (void)dgamma, (void)dbeta, (void)dy, (void)x, (void)mean, (void)var, (void)gamma,
      (void)beta, (void)n, (void)c, (void)h, (void)w, (void)eps, (void)layout, (void)dtype;
  return bd_none(why);
}
void bd_run(bd_prim_t *p) { (void)p; }
const char *bd_impl(const bd_prim_t *p) {
  (void)p;
  return "-";
}
void bd_destroy(bd_prim_t *p) { (void)p; }
void bd_shutdown(void) {}

#else /* SN_BENCH_HAVE_DNNL */

#include <dnnl.h>
#include <dnnl_debug.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if DNNL_VERSION_MAJOR != 2
#error "bench_dnnl.c needs the oneDNN 2.x C API"
#endif

#define BD_MAX_ARGS 12

struct bd_prim {
  dnnl_primitive_t prim;
  int nargs;
  dnnl_exec_arg_t args[BD_MAX_ARGS];
  char impl[128];
};

static dnnl_engine_t bd_engine;
static dnnl_stream_t bd_stream;

/* Exits with the oneDNN status name unless st is dnnl_success. */
static void bd_ok(dnnl_status_t st, const char *what) {
  if (st != dnnl_success) bu_die("oneDNN %s failed: %s", what, dnnl_status2str(st));
}

static void bd_init(void) {
  if (bd_engine) return;
  bd_ok(dnnl_engine_create(&bd_engine, dnnl_cpu, 0), "engine_create");
  bd_ok(dnnl_stream_create(&bd_stream, bd_engine, dnnl_stream_default_flags), "stream_create");
}

static const char *bd_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "all";
  }
}

const char *bd_describe(void) {
  static char text[128];
  const dnnl_version_t *v = dnnl_version();
  snprintf(text, sizeof text, "oneDNN %d.%d.%d (max ISA %s)", v->major, v->minor, v->patch,
           bd_isa_name(dnnl_get_effective_cpu_isa()));
  return text;
}

static dnnl_data_type_t bd_dt(sn_dtype_t dtype) {
  return dtype == SN_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
}

static dnnl_memory_desc_t bd_md(int ndims, const int64_t *dims, dnnl_data_type_t dt,
                                dnnl_format_tag_t tag) {
  dnnl_memory_desc_t md;
  dnnl_dims_t d = {0};
  for (int i = 0; i < ndims; i++) d[i] = dims[i];
  bd_ok(dnnl_memory_desc_init_by_tag(&md, ndims, d, dt, tag), "memory_desc_init_by_tag");
  return md;
}

static dnnl_memory_desc_t bd_vec(int64_t len) { return bd_md(1, &len, dnnl_f32, dnnl_a); }

/* Wraps `ptr` (not copied, not owned) as argument `arg` of p. */
static void bd_arg(bd_prim_t *p, int arg, const dnnl_memory_desc_t *md, const void *ptr) {
  if (p->nargs >= BD_MAX_ARGS) bu_die("bench_dnnl: too many arguments");
  dnnl_memory_t m;
  bd_ok(dnnl_memory_create(&m, md, bd_engine, (void *)ptr), "memory_create");
  p->args[p->nargs].arg = arg;
  p->args[p->nargs].memory = m;
  p->nargs++;
}

/* The statistics and affine parameters every normalization primitive here takes: mean and var
 * (described by stat), gamma and beta (by par; beta is an input of 2.6's backward too). */
static void bd_arg_stats(bd_prim_t *p, const dnnl_memory_desc_t *stat, const float *mean,
                         const float *var, const dnnl_memory_desc_t *par, const float *gamma,
                         const float *beta) {
  bd_arg(p, DNNL_ARG_MEAN, stat, mean);
  bd_arg(p, DNNL_ARG_VARIANCE, stat, var);
  bd_arg(p, DNNL_ARG_SCALE, par, gamma);
  bd_arg(p, DNNL_ARG_SHIFT, par, beta);
}

/* The outputs of a backward: dx (data), dgamma and dbeta (par). */
static void bd_arg_grads(bd_prim_t *p, const dnnl_memory_desc_t *data, void *dx,
                         const dnnl_memory_desc_t *par, float *dgamma, float *dbeta) {
  bd_arg(p, DNNL_ARG_DIFF_SRC, data, dx);
  bd_arg(p, DNNL_ARG_DIFF_SCALE, par, dgamma);
  bd_arg(p, DNNL_ARG_DIFF_SHIFT, par, dbeta);
}

/* Creates the primitive of `pd` into a new bd_prim_t and takes ownership of pd's lifetime
 * (destroyed here: the primitive keeps what it needs). Workspace is not supported (our flags
 * never need one). */
static bd_prim_t *bd_make(dnnl_primitive_desc_t pd) {
  bd_prim_t *p = calloc(1, sizeof *p);
  if (!p) bu_die("out of memory");
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
    impl = "?";
  snprintf(p->impl, sizeof p->impl, "%s", impl);
  const dnnl_memory_desc_t *ws = dnnl_primitive_desc_query_md(pd, dnnl_query_workspace_md, 0);
  if (ws && dnnl_memory_desc_get_size(ws) != 0) bu_die("bench_dnnl: unexpected workspace");
  bd_ok(dnnl_primitive_create(&p->prim, pd), "primitive_create");
  dnnl_primitive_desc_destroy(pd);
  return p;
}

/* dnnl_primitive_desc_create for op_desc, or NULL with the status in *why. */
static dnnl_primitive_desc_t bd_pd(const void *op_desc, const_dnnl_primitive_desc_t hint,
                                   const char **why) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t st = dnnl_primitive_desc_create(&pd, op_desc, NULL, bd_engine, hint);
  if (st != dnnl_success) {
    if (why) *why = st == dnnl_unimplemented ? "oneDNN: unimplemented" : dnnl_status2str(st);
    return NULL;
  }
  return pd;
}

static const unsigned bd_affine = dnnl_use_scale | dnnl_use_shift;

bd_prim_t *bd_layernorm_fwd(void *y, float *mean, float *var, const void *x, const float *gamma,
                            const float *beta, int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                            const char **why) {
  bd_init();
  int64_t dims[2] = {rows, d};
  dnnl_memory_desc_t data = bd_md(2, dims, bd_dt(dtype), dnnl_ab);
  dnnl_memory_desc_t stat = bd_vec(rows), par = bd_vec(d);
  dnnl_layer_normalization_desc_t desc;
  bd_ok(dnnl_layer_normalization_forward_desc_init(&desc, dnnl_forward_training, &data, &stat, eps,
                                                   bd_affine),
        "layer_normalization_forward_desc_init");
  dnnl_primitive_desc_t pd = bd_pd(&desc, NULL, why);
  if (!pd) return NULL;
  bd_prim_t *p = bd_make(pd);
  bd_arg(p, DNNL_ARG_SRC, &data, x);
  bd_arg(p, DNNL_ARG_DST, &data, y);
  bd_arg_stats(p, &stat, mean, var, &par, gamma, beta);
  return p;
}

bd_prim_t *bd_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                            const float *mean, const float *var, const float *gamma,
                            const float *beta, int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                            const char **why) {
  bd_init();
  int64_t dims[2] = {rows, d};
  dnnl_memory_desc_t data = bd_md(2, dims, bd_dt(dtype), dnnl_ab);
  dnnl_memory_desc_t stat = bd_vec(rows), par = bd_vec(d);
  dnnl_layer_normalization_desc_t fdesc, bdesc;
  bd_ok(dnnl_layer_normalization_forward_desc_init(&fdesc, dnnl_forward_training, &data, &stat, eps,
                                                   bd_affine),
        "layer_normalization_forward_desc_init");
  dnnl_primitive_desc_t hint = bd_pd(&fdesc, NULL, why);
  if (!hint) return NULL;
  bd_ok(dnnl_layer_normalization_backward_desc_init(&bdesc, dnnl_backward, &data, &data, &stat, eps,
                                                    bd_affine),
        "layer_normalization_backward_desc_init");
  dnnl_primitive_desc_t pd = bd_pd(&bdesc, hint, why);
  dnnl_primitive_desc_destroy(hint);
  if (!pd) return NULL;
  bd_prim_t *p = bd_make(pd);
  bd_arg(p, DNNL_ARG_SRC, &data, x);
  bd_arg(p, DNNL_ARG_DIFF_DST, &data, dy);
  bd_arg_stats(p, &stat, mean, var, &par, gamma, beta);
  bd_arg_grads(p, &data, dx, &par, dgamma, dbeta);
  return p;
}

static dnnl_memory_desc_t bd_act(int64_t n, int64_t c, int64_t h, int64_t w, sn_layout_t layout,
                                 sn_dtype_t dtype) {
  int64_t dims[4] = {n, c, h, w};
  return bd_md(4, dims, bd_dt(dtype), layout == SN_LAYOUT_NHWC ? dnnl_nhwc : dnnl_nchw);
}

static dnnl_primitive_desc_t bd_bnorm_pd(dnnl_prop_kind_t prop, const dnnl_memory_desc_t *data,
                                         float eps, unsigned flags, const char **why) {
  dnnl_batch_normalization_desc_t desc;
  bd_ok(dnnl_batch_normalization_forward_desc_init(&desc, prop, data, eps, flags),
        "batch_normalization_forward_desc_init");
  return bd_pd(&desc, NULL, why);
}

bd_prim_t *bd_batchnorm_fwd(void *y, float *mean, float *var, const void *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t h, int64_t w,
                            float eps, sn_layout_t layout, sn_dtype_t dtype, const char **why) {
  bd_init();
  dnnl_memory_desc_t data = bd_act(n, c, h, w, layout, dtype), par = bd_vec(c);
  dnnl_primitive_desc_t pd = bd_bnorm_pd(dnnl_forward_training, &data, eps, bd_affine, why);
  if (!pd) return NULL;
  bd_prim_t *p = bd_make(pd);
  bd_arg(p, DNNL_ARG_SRC, &data, x);
  bd_arg(p, DNNL_ARG_DST, &data, y);
  bd_arg_stats(p, &par, mean, var, &par, gamma, beta);
  return p;
}

bd_prim_t *bd_batchnorm_infer(void *y, const void *x, const float *mean, const float *var,
                              const float *gamma, const float *beta, int64_t n, int64_t c,
                              int64_t h, int64_t w, float eps, sn_layout_t layout, sn_dtype_t dtype,
                              const char **why) {
  bd_init();
  dnnl_memory_desc_t data = bd_act(n, c, h, w, layout, dtype), par = bd_vec(c);
  dnnl_primitive_desc_t pd =
      bd_bnorm_pd(dnnl_forward_inference, &data, eps, bd_affine | dnnl_use_global_stats, why);
  if (!pd) return NULL;
  bd_prim_t *p = bd_make(pd);
  bd_arg(p, DNNL_ARG_SRC, &data, x);
  bd_arg(p, DNNL_ARG_DST, &data, y);
  bd_arg_stats(p, &par, mean, var, &par, gamma, beta);
  return p;
}

bd_prim_t *bd_batchnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                            const float *mean, const float *var, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t h, int64_t w,
                            float eps, sn_layout_t layout, sn_dtype_t dtype, const char **why) {
  bd_init();
  dnnl_memory_desc_t data = bd_act(n, c, h, w, layout, dtype), par = bd_vec(c);
  dnnl_primitive_desc_t hint = bd_bnorm_pd(dnnl_forward_training, &data, eps, bd_affine, why);
  if (!hint) return NULL;
  dnnl_batch_normalization_desc_t desc;
  bd_ok(dnnl_batch_normalization_backward_desc_init(&desc, dnnl_backward, &data, &data, eps,
                                                    bd_affine),
        "batch_normalization_backward_desc_init");
  dnnl_primitive_desc_t pd = bd_pd(&desc, hint, why);
  dnnl_primitive_desc_destroy(hint);
  if (!pd) return NULL;
  bd_prim_t *p = bd_make(pd);
  bd_arg(p, DNNL_ARG_SRC, &data, x);
  bd_arg(p, DNNL_ARG_DIFF_DST, &data, dy);
  bd_arg_stats(p, &par, mean, var, &par, gamma, beta);
  bd_arg_grads(p, &data, dx, &par, dgamma, dbeta);
  return p;
}

void bd_run(bd_prim_t *p) {
  bd_ok(dnnl_primitive_execute(p->prim, bd_stream, p->nargs, p->args), "primitive_execute");
  bd_ok(dnnl_stream_wait(bd_stream), "stream_wait");
}

const char *bd_impl(const bd_prim_t *p) { return p ? p->impl : "-"; }

void bd_destroy(bd_prim_t *p) {
  if (!p) return;
  for (int i = 0; i < p->nargs; i++) dnnl_memory_destroy(p->args[i].memory);
  dnnl_primitive_destroy(p->prim);
  free(p);
}

void bd_shutdown(void) {
  if (bd_stream) dnnl_stream_destroy(bd_stream);
  if (bd_engine) dnnl_engine_destroy(bd_engine);
  bd_stream = NULL;
  bd_engine = NULL;
}

#endif /* SN_BENCH_HAVE_DNNL */
