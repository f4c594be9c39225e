/*
 * bench_dnnl.h — oneDNN (DNNL 2.x C API) batch and layer normalization on caller-owned buffers,
 * the comparison column of bench_cpu.c. Built without oneDNN (SN_BENCH_HAVE_DNNL undefined),
 * every constructor returns NULL with the reason "built without oneDNN".
 *
 * Each constructor wraps the caller's pointers (no copies; the buffers must outlive the handle),
 * creates the primitive and returns a handle to run with bd_run(), or NULL with a reason in
 * *why when oneDNN has no implementation (e.g. bf16 on a CPU without it). Semantics match the
 * syncnorm kernels they are compared with: scale (gamma) and shift (beta) always used, biased
 * variance, eps added to the variance. mean/var are oneDNN's own f32 statistics buffers.
 * Layout and dtype use syncnorm's enums; activations are f32 or bf16.
 */
#ifndef SN_BENCH_DNNL_H
#define SN_BENCH_DNNL_H

#include <stdint.h>

#include "syncnorm.h"

typedef struct bd_prim bd_prim_t;

/* "oneDNN 2.6.3 (isa avx512_core_bf16)" or "not built with oneDNN"; static string. */
const char *bd_describe(void);

/* LayerNorm over rows of x [rows, d], training forward: writes y and mean/var [rows]. */
bd_prim_t *bd_layernorm_fwd(void *y, float *mean, float *var, const void *x, const float *gamma,
                            const float *beta, int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                            const char **why);
/* LayerNorm backward (prop dnnl_backward): dx, dgamma, dbeta from dy, x, mean, var, gamma. */
bd_prim_t *bd_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                            const float *mean, const float *var, const float *gamma,
                            const float *beta, int64_t rows, int64_t d, float eps, sn_dtype_t dtype,
                            const char **why);
/* BatchNorm training forward on [n, c, h, w] (NCHW or NHWC): batch statistics to mean/var [c],
 * y = normalized x. */
bd_prim_t *bd_batchnorm_fwd(void *y, float *mean, float *var, const void *x, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t h, int64_t w,
                            float eps, sn_layout_t layout, sn_dtype_t dtype, const char **why);
/* BatchNorm inference with given statistics (dnnl_use_global_stats): mean/var are inputs. */
bd_prim_t *bd_batchnorm_infer(void *y, const void *x, const float *mean, const float *var,
                              const float *gamma, const float *beta, int64_t n, int64_t c,
                              int64_t h, int64_t w, float eps, sn_layout_t layout, sn_dtype_t dtype,
                              const char **why);
/* BatchNorm backward (prop dnnl_backward) from the batch statistics of bd_batchnorm_fwd. */
bd_prim_t *bd_batchnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                            const float *mean, const float *var, const float *gamma,
                            const float *beta, int64_t n, int64_t c, int64_t h, int64_t w,
                            float eps, sn_layout_t layout, sn_dtype_t dtype, const char **why);

/* Executes the primitive and waits for it. Exits (bu_die) on a oneDNN error. */
void bd_run(bd_prim_t *p);
/* oneDNN's implementation name ("bnorm_jit:avx512_core", "simple_layer_normalization:any"). */
const char *bd_impl(const bd_prim_t *p);
/* Releases the primitive and its memory objects (not the caller's buffers); NULL is a no-op. */
void bd_destroy(bd_prim_t *p);
/* Releases the engine and stream (call once at exit). */
void bd_shutdown(void);

#endif /* SN_BENCH_DNNL_H */
