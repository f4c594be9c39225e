/*
 * bn_driver.c — runs a local SyncBatchNorm layer on inputs from a safetensors file, for the
 * PyTorch comparison in test_torch_interop.py.
 *
 *   bn_driver run IN OUT CKPT      IN: "config" F64 [7] = {C, momentum (−1 = None), eps,
 *                                  layout (0 NCHW, 1 NHWC), steps, affine, track}, "weight",
 *                                  "bias" F32 [C], "x.<t>", "dy.<t>" F32 for t < steps, and
 *                                  "x_eval", "dy_eval". OUT gets "y.<t>", "dx.<t>",
 *                                  "grad_weight.<t>", "grad_bias.<t>", "running_mean.<t>",
 *                                  "running_var.<t>", "y_eval", "dx_eval"; CKPT the layer's state
 *                                  under the prefix "bn" (sn_syncbn_save).
 *   bn_driver roundtrip IN OUT C   loads "bn.*" of a C-channel layer from IN, saves it to OUT.
 * Exit status 0 on success, 1 with a message otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncnorm_dist.h"

#define TRY(call)                                                                      \
  do {                                                                                 \
    sn_status_t st_ = (call);                                                          \
    if (st_ != SN_OK) {                                                                \
      fprintf(stderr, "bn_driver: %s: %s: %s\n", #call, sn_status_string(st_), sn_last_error()); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* Output tensors, each a heap copy named and shaped like its input. */
static sn_tensor_t outs[1024];
static char names[1024][64];
static int nout = 0;

static void add_out(const char *name, const float *data, const sn_tensor_t *like, int64_t C) {
  sn_tensor_t *t = &outs[nout];
  snprintf(names[nout], sizeof names[nout], "%s", name);
  memset(t, 0, sizeof *t);
  t->name = names[nout];
  t->dtype = SN_DTYPE_F32;
  if (like) {
    t->ndim = like->ndim;
    memcpy(t->shape, like->shape, sizeof t->shape);
  } else {
    t->ndim = 1;
    t->shape[0] = C;
  }
  int64_t n = 1;
  for (int k = 0; k < t->ndim; k++) n *= t->shape[k];
  float *copy = malloc((size_t)n * sizeof *copy + 1);
  memcpy(copy, data, (size_t)n * sizeof *copy);
  t->data = copy;
  nout++;
}

static float *get_f32(const sn_safetensors_t *f, const char *name, sn_tensor_t *t) {
  TRY(sn_safetensors_get(f, t, name));
  int64_t n = 1;
  for (int k = 0; k < t->ndim; k++) n *= t->shape[k];
  float *p = malloc((size_t)n * sizeof *p + 1);
  memcpy(p, t->data, (size_t)n * sizeof *p); /* file data need not be aligned */
  return p;
}

static int run(const char *in, const char *out, const char *ckpt) {
  sn_safetensors_t *f = NULL;
  TRY(sn_safetensors_load(&f, in));
  sn_tensor_t t;
  TRY(sn_safetensors_get(f, &t, "config"));
  double cfgv[7];
  memcpy(cfgv, t.data, sizeof cfgv);
  const int64_t C = (int64_t)cfgv[0];
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  cfg.momentum = cfgv[1] < 0 ? SN_MOMENTUM_CUMULATIVE : (float)cfgv[1];
  cfg.eps = (float)cfgv[2];
  cfg.layout = cfgv[3] == 0 ? SN_LAYOUT_NCHW : SN_LAYOUT_NHWC;
  const int steps = (int)cfgv[4];
  cfg.affine = (int)cfgv[5];
  cfg.track_running_stats = (int)cfgv[6];
  sn_syncbn_t *bn = NULL;
  TRY(sn_syncbn_create(&bn, &cfg, NULL));
  sn_syncbn_params_t p;
  TRY(sn_syncbn_params(bn, &p));
  if (cfg.affine) {
    float *w = get_f32(f, "weight", &t), *b = get_f32(f, "bias", &t);
    memcpy(p.weight, w, (size_t)C * 4), memcpy(p.bias, b, (size_t)C * 4);
    free(w), free(b);
  }
  char name[64];
  for (int step = 0; step <= steps; step++) {
    const int eval = step == steps;
    snprintf(name, sizeof name, eval ? "x_eval" : "x.%d", step);
    sn_tensor_t tx, tdy;
    float *x = get_f32(f, name, &tx);
    snprintf(name, sizeof name, eval ? "dy_eval" : "dy.%d", step);
    float *dy = get_f32(f, name, &tdy);
    const int64_t n = tx.shape[0], s = cfg.layout == SN_LAYOUT_NCHW ? tx.shape[2] : tx.shape[1];
    float *y = malloc((size_t)(n * C * s) * 4 + 1), *dx = malloc((size_t)(n * C * s) * 4 + 1);
    TRY(sn_syncbn_forward(bn, y, x, n, s, !eval));
    TRY(sn_syncbn_backward(bn, dx, dy, x, n, s));
    snprintf(name, sizeof name, eval ? "y_eval" : "y.%d", step);
    add_out(name, y, &tx, C);
    snprintf(name, sizeof name, eval ? "dx_eval" : "dx.%d", step);
    add_out(name, dx, &tx, C);
    if (!eval && cfg.affine) {
      snprintf(name, sizeof name, "grad_weight.%d", step), add_out(name, p.grad_weight, NULL, C);
      snprintf(name, sizeof name, "grad_bias.%d", step), add_out(name, p.grad_bias, NULL, C);
    }
    if (!eval && cfg.track_running_stats) {
      snprintf(name, sizeof name, "running_mean.%d", step), add_out(name, p.running_mean, NULL, C);
      snprintf(name, sizeof name, "running_var.%d", step), add_out(name, p.running_var, NULL, C);
    }
    free(x), free(dy), free(y), free(dx);
  }
  TRY(sn_safetensors_save(out, outs, nout));
  const char *prefix = "bn";
  TRY(sn_syncbn_save(ckpt, &bn, &prefix, 1));
  sn_syncbn_destroy(bn);
  sn_safetensors_free(f);
  return 0;
}

static int roundtrip(const char *in, const char *out, int64_t C) {
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  sn_syncbn_t *bn = NULL;
  TRY(sn_syncbn_create(&bn, &cfg, NULL));
  const char *prefix = "bn";
  TRY(sn_syncbn_load(in, &bn, &prefix, 1));
  TRY(sn_syncbn_save(out, &bn, &prefix, 1));
  sn_syncbn_destroy(bn);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "run") == 0) return run(argv[2], argv[3], argv[4]);
  if (argc == 5 && strcmp(argv[1], "roundtrip") == 0) return roundtrip(argv[2], argv[3], atoll(argv[4]));
  fprintf(stderr, "usage: bn_driver run IN OUT CKPT | bn_driver roundtrip IN OUT C\n");
  return 1;
}
