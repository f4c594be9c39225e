/*
 * model.c — the CNN of syncnorm-train (see model.h): parameter table, buffers, forward/backward
 * through cnn.c's layers and the library's SyncBatchNorm, SGD, checkpoint tensors.
 */
#include "model.h"
#include "errmsg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Formats a failed sn_* call into err and returns −1. */
static int fail_sn(char *err, size_t errlen, const char *call, sn_status_t st) {
  return ex_fail(err, errlen, "%s: %s: %s", call, sn_status_string(st), sn_last_error());
}

#define TRY_SN(call, what)                                       \
  do {                                                           \
    sn_status_t st_ = (call);                                    \
    if (st_ != SN_OK) return fail_sn(err, errlen, (what), st_);  \
  } while (0)

/* 64-byte aligned, zeroed array of n floats (or bytes with elem 1); NULL on failure. */
static void *alloc_zero(int64_t n, size_t elem) {
  void *p = NULL;
  size_t bytes = (size_t)(n > 0 ? n : 1) * elem;
  if (posix_memalign(&p, 64, bytes) != 0) return NULL;
  memset(p, 0, bytes);
  return p;
}

/* The activation buffers for a batch of b images, as cnn_model_create allocates them: floats
 * of x, col1, a1, h1, p1, dh1, col2, a2, h2, p2, dh2, feat, dfeat, dp2, dp1, logits, dlogits. */
#define CNN_NACT 17
static void act_floats(int64_t b, int64_t n[CNN_NACT]) {
  const int64_t s1 = b * CNN_PIXELS, s2 = s1 / 4, s3 = s2 / 4; /* N·28·28, N·14·14, N·7·7 */
  const int64_t f[CNN_NACT] = {s1,      9 * s1,  32 * s1, 32 * s1, 32 * s2, 32 * s1,
                               288 * s2, 64 * s2, 64 * s2, 64 * s3, 64 * s2, 64 * s3,
                               64 * s3, 64 * s3, 32 * s2, b * CNN_CLASSES, b * CNN_CLASSES};
  memcpy(n, f, sizeof f);
}

int64_t cnn_model_bytes(int64_t batch_cap) {
  int64_t floats[CNN_NACT], total = 0;
  act_floats(batch_cap, floats);
  for (int i = 0; i < CNN_NACT; i++) total += floats[i];
  return total * (int64_t)sizeof(float);
}

static void set_param(cnn_param_t *p, const char *name, float *data, int decay, int ndim,
                      int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  const int64_t d[4] = {d0, d1, d2, d3};
  p->name = name;
  p->data = data;
  p->decay = decay;
  p->ndim = ndim;
  p->numel = 1;
  for (int i = 0; i < 4; i++) {
    p->shape[i] = i < ndim ? d[i] : 0;
    if (i < ndim) p->numel *= d[i];
  }
}

/* PyTorch's default init of Conv2d/Linear weights and biases: U(−1/√fan_in, 1/√fan_in). */
static void init_uniform(float *w, int64_t n, int64_t fan_in, cnn_rng_t *rng) {
  const float bound = (float)(1.0 / sqrt((double)fan_in));
  for (int64_t i = 0; i < n; i++) w[i] = cnn_rng_uniform(rng, -bound, bound);
}

int cnn_model_create(cnn_model_t **model, int64_t batch_cap, sn_comm_t *bn_comm, uint64_t seed,
                     char *err, size_t errlen) {
  if (!model || batch_cap < 1) return ex_fail(err, errlen, "cnn_model_create: bad arguments");
  *model = NULL;
  cnn_model_t *m = calloc(1, sizeof *m);
  if (!m) return ex_fail(err, errlen, "cnn_model_create: out of memory");
  m->batch_cap = batch_cap;
  m->conv1 = cnn_conv_geometry(1, 32, 3, 1, CNN_IMG, CNN_IMG);
  m->conv2 = cnn_conv_geometry(32, 64, 3, 1, CNN_IMG / 2, CNN_IMG / 2);

  sn_syncbn_config_t c1 = sn_syncbn_default_config(32), c2 = sn_syncbn_default_config(64);
  snprintf(c1.name, sizeof c1.name, "bn1");
  snprintf(c2.name, sizeof c2.name, "bn2");
  sn_status_t st = sn_syncbn_create(&m->bn1, &c1, bn_comm);
  if (st == SN_OK) st = sn_syncbn_create(&m->bn2, &c2, bn_comm);
  if (st == SN_OK) st = sn_syncbn_params(m->bn1, &m->bn1p);
  if (st == SN_OK) st = sn_syncbn_params(m->bn2, &m->bn2p);
  if (st != SN_OK) {
    fail_sn(err, errlen, "sn_syncbn_create", st);
    cnn_model_destroy(m);
    return -1;
  }

  /* Parameter table; conv/fc parameters are slices of one flat buffer. */
  const int64_t n_w1 = 32 * 9, n_w2 = 64 * 32 * 9, n_fc = CNN_CLASSES * CNN_FEATURES;
  const int64_t n_weights = n_w1 + 32 + n_w2 + 64 + n_fc + CNN_CLASSES;
  m->weights = alloc_zero(n_weights, sizeof(float));
  if (!m->weights) goto oom;
  float *w = m->weights;
  cnn_param_t *p = m->param;
  set_param(&p[CNN_CONV1_W], "conv1.weight", w, 1, 4, 32, 1, 3, 3), w += n_w1;
  set_param(&p[CNN_CONV1_B], "conv1.bias", w, 0, 1, 32, 0, 0, 0), w += 32;
  set_param(&p[CNN_BN1_W], "bn1.weight", m->bn1p.weight, 0, 1, 32, 0, 0, 0);
  set_param(&p[CNN_BN1_B], "bn1.bias", m->bn1p.bias, 0, 1, 32, 0, 0, 0);
  set_param(&p[CNN_CONV2_W], "conv2.weight", w, 1, 4, 64, 32, 3, 3), w += n_w2;
  set_param(&p[CNN_CONV2_B], "conv2.bias", w, 0, 1, 64, 0, 0, 0), w += 64;
  set_param(&p[CNN_BN2_W], "bn2.weight", m->bn2p.weight, 0, 1, 64, 0, 0, 0);
  set_param(&p[CNN_BN2_B], "bn2.bias", m->bn2p.bias, 0, 1, 64, 0, 0, 0);
  set_param(&p[CNN_FC_W], "fc.weight", w, 1, 2, CNN_CLASSES, CNN_FEATURES, 0, 0), w += n_fc;
  set_param(&p[CNN_FC_B], "fc.bias", w, 0, 1, CNN_CLASSES, 0, 0, 0);

  m->grad_count = 0;
  for (int i = 0; i < CNN_NPARAMS; i++) m->grad_count += p[i].numel;
  m->grads = alloc_zero(m->grad_count + CNN_GRAD_EXTRA, sizeof(float));
  m->momentum = alloc_zero(m->grad_count, sizeof(float));
  if (!m->grads || !m->momentum) goto oom;
  for (int64_t i = 0, off = 0; i < CNN_NPARAMS; off += p[i].numel, i++) {
    p[i].grad = m->grads + off;
    p[i].momentum = m->momentum + off;
    snprintf(m->momentum_name[i], sizeof m->momentum_name[i], "optimizer.momentum_buffer.%s",
             p[i].name);
  }

  /* Same draws, same order, on every rank. */
  cnn_rng_t rng = {seed};
  init_uniform(p[CNN_CONV1_W].data, p[CNN_CONV1_W].numel, 9, &rng);
  init_uniform(p[CNN_CONV1_B].data, p[CNN_CONV1_B].numel, 9, &rng);
  init_uniform(p[CNN_CONV2_W].data, p[CNN_CONV2_W].numel, 32 * 9, &rng);
  init_uniform(p[CNN_CONV2_B].data, p[CNN_CONV2_B].numel, 32 * 9, &rng);
  init_uniform(p[CNN_FC_W].data, p[CNN_FC_W].numel, CNN_FEATURES, &rng);
  init_uniform(p[CNN_FC_B].data, p[CNN_FC_B].numel, CNN_FEATURES, &rng);

  float **act[CNN_NACT] = {&m->x,  &m->col1, &m->a1, &m->h1, &m->p1,    &m->dh1,
                           &m->col2, &m->a2, &m->h2, &m->p2, &m->dh2,  &m->feat,
                           &m->dfeat, &m->dp2, &m->dp1, &m->logits, &m->dlogits};
  int64_t floats[CNN_NACT];
  act_floats(batch_cap, floats);
  for (int i = 0; i < CNN_NACT; i++)
    if ((*act[i] = alloc_zero(floats[i], sizeof(float))) == NULL) goto oom;
  *model = m;
  return 0;
oom:
  cnn_model_destroy(m);
  return ex_fail(err, errlen, "cnn_model_create: out of memory (batch %lld)", (long long)batch_cap);
}

void cnn_model_destroy(cnn_model_t *m) {
  if (!m) return;
  sn_syncbn_destroy(m->bn1);
  sn_syncbn_destroy(m->bn2);
  void *bufs[] = {m->weights, m->grads, m->momentum, m->x, m->col1, m->a1, m->h1, m->p1,
                  m->dh1, m->col2, m->a2, m->h2, m->p2, m->dh2, m->feat, m->dfeat, m->dp2,
                  m->dp1, m->logits, m->dlogits};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  free(m);
}

int cnn_model_forward(cnn_model_t *m, int64_t n, int training, char *err, size_t errlen) {
  if (n < 0 || n > m->batch_cap)
    return ex_fail(err, errlen, "cnn_model_forward: batch %lld outside 0..%lld", (long long)n,
                   (long long)m->batch_cap);
  const cnn_param_t *p = m->param;
  /* BatchNorm sees [C, N, H, W] as NCHW [1, C, N·H·W]: per-channel statistics over N·H·W. */
  cnn_conv_fwd(m->a1, m->col1, m->x, p[CNN_CONV1_W].data, p[CNN_CONV1_B].data, n, &m->conv1);
  TRY_SN(sn_syncbn_forward(m->bn1, m->h1, m->a1, 1, n * CNN_PIXELS, training),
         "sn_syncbn_forward(bn1)");
  cnn_relu_maxpool2_fwd(m->p1, m->h1, 32 * n, CNN_IMG, CNN_IMG);
  cnn_conv_fwd(m->a2, m->col2, m->p1, p[CNN_CONV2_W].data, p[CNN_CONV2_B].data, n, &m->conv2);
  TRY_SN(sn_syncbn_forward(m->bn2, m->h2, m->a2, 1, n * CNN_PIXELS / 4, training),
         "sn_syncbn_forward(bn2)");
  cnn_relu_maxpool2_fwd(m->p2, m->h2, 64 * n, CNN_IMG / 2, CNN_IMG / 2);
  cnn_transpose_abs(m->feat, m->p2, 64, n, 49); /* [64, N, 49] → [N, 64·49] (torch.flatten) */
  cnn_linear_fwd(m->logits, m->feat, p[CNN_FC_W].data, p[CNN_FC_B].data, n, CNN_FEATURES,
                 CNN_CLASSES);
  return 0;
}

int cnn_model_backward(cnn_model_t *m, int64_t n, char *err, size_t errlen) {
  if (n < 0 || n > m->batch_cap)
    return ex_fail(err, errlen, "cnn_model_backward: batch %lld outside 0..%lld", (long long)n,
                   (long long)m->batch_cap);
  cnn_param_t *p = m->param;
  cnn_linear_bwd(m->dfeat, p[CNN_FC_W].grad, p[CNN_FC_B].grad, m->dlogits, m->feat,
                 p[CNN_FC_W].data, n, CNN_FEATURES, CNN_CLASSES);
  cnn_transpose_abs(m->dp2, m->dfeat, n, 64, 49);
  /* dh2 = d(bn2 out), then d(bn2 in) in place */
  cnn_relu_maxpool2_bwd(m->dh2, m->dp2, m->h2, 64 * n, CNN_IMG / 2, CNN_IMG / 2);
  TRY_SN(sn_syncbn_backward(m->bn2, m->dh2, m->dh2, m->a2, 1, n * CNN_PIXELS / 4),
         "sn_syncbn_backward(bn2)");
  memcpy(p[CNN_BN2_W].grad, m->bn2p.grad_weight, 64 * sizeof(float));
  memcpy(p[CNN_BN2_B].grad, m->bn2p.grad_bias, 64 * sizeof(float));
  cnn_conv_bwd(m->dp1, p[CNN_CONV2_W].grad, p[CNN_CONV2_B].grad, m->col2, m->dh2,
               p[CNN_CONV2_W].data, n, &m->conv2);
  cnn_relu_maxpool2_bwd(m->dh1, m->dp1, m->h1, 32 * n, CNN_IMG, CNN_IMG);
  TRY_SN(sn_syncbn_backward(m->bn1, m->dh1, m->dh1, m->a1, 1, n * CNN_PIXELS),
         "sn_syncbn_backward(bn1)");
  memcpy(p[CNN_BN1_W].grad, m->bn1p.grad_weight, 32 * sizeof(float));
  memcpy(p[CNN_BN1_B].grad, m->bn1p.grad_bias, 32 * sizeof(float));
  cnn_conv_bwd(NULL, p[CNN_CONV1_W].grad, p[CNN_CONV1_B].grad, m->col1, m->dh1,
               p[CNN_CONV1_W].data, n, &m->conv1);
  return 0;
}

void cnn_model_sgd(cnn_model_t *m, float lr, float momentum, float wd) {
  for (int i = 0; i < CNN_NPARAMS; i++) {
    cnn_param_t *p = &m->param[i];
    cnn_sgd_update(p->data, p->momentum, p->grad, p->numel, lr, momentum, p->decay ? wd : 0.0f);
  }
}

static sn_tensor_t f32_tensor(const char *name, const float *data, int ndim,
                              const int64_t *shape) {
  sn_tensor_t t;
  memset(&t, 0, sizeof t);
  t.name = name;
  t.dtype = SN_DTYPE_F32;
  t.ndim = ndim;
  for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
  t.data = data;
  return t;
}

int cnn_model_tensors(cnn_model_t *m, sn_tensor_t *out, int *count, int with_momentum,
                      char *err, size_t errlen) {
  int k = 0, nbn = 0;
  const cnn_param_t *p = m->param;
  for (int i = CNN_CONV1_W; i <= CNN_CONV1_B; i++)
    out[k++] = f32_tensor(p[i].name, p[i].data, p[i].ndim, p[i].shape);
  TRY_SN(sn_syncbn_state_tensors(m->bn1, out + k, &nbn, "bn1"), "sn_syncbn_state_tensors(bn1)");
  k += nbn;
  for (int i = CNN_CONV2_W; i <= CNN_CONV2_B; i++)
    out[k++] = f32_tensor(p[i].name, p[i].data, p[i].ndim, p[i].shape);
  TRY_SN(sn_syncbn_state_tensors(m->bn2, out + k, &nbn, "bn2"), "sn_syncbn_state_tensors(bn2)");
  k += nbn;
  for (int i = CNN_FC_W; i <= CNN_FC_B; i++)
    out[k++] = f32_tensor(p[i].name, p[i].data, p[i].ndim, p[i].shape);
  if (with_momentum) {
    for (int i = 0; i < CNN_NPARAMS; i++) {
      out[k++] = f32_tensor(m->momentum_name[i], p[i].momentum, p[i].ndim, p[i].shape);
    }
  }
  *count = k;
  return 0;
}

/* Copies tensor `name` (F32, shape of p) from the file into dst. */
static int load_f32(float *dst, const sn_safetensors_t *file, const char *name,
                    const cnn_param_t *p, char *err, size_t errlen) {
  sn_tensor_t t;
  sn_status_t st = sn_safetensors_get(file, &t, name);
  if (st == SN_ERR_NOT_FOUND) return ex_fail(err, errlen, "tensor \"%s\" is missing", name);
  if (st != SN_OK) return fail_sn(err, errlen, "sn_safetensors_get", st);
  int same = !t.is_i64 && t.dtype == SN_DTYPE_F32 && t.ndim == p->ndim;
  for (int i = 0; same && i < p->ndim; i++) same = t.shape[i] == p->shape[i];
  if (!same) {
    char want[64];
    if (p->ndim == 4)
      snprintf(want, sizeof want, "F32 [%lld,%lld,%lld,%lld]", (long long)p->shape[0],
               (long long)p->shape[1], (long long)p->shape[2], (long long)p->shape[3]);
    else if (p->ndim == 2)
      snprintf(want, sizeof want, "F32 [%lld,%lld]", (long long)p->shape[0],
               (long long)p->shape[1]);
    else
      snprintf(want, sizeof want, "F32 [%lld]", (long long)p->shape[0]);
    return ex_fail(err, errlen, "tensor \"%s\" has the wrong dtype or shape (expected %s)", name,
                   want);
  }
  memcpy(dst, t.data, (size_t)p->numel * sizeof(float));
  return 0;
}

int cnn_model_load(cnn_model_t *m, const sn_safetensors_t *file, int with_momentum, char *err,
                   size_t errlen) {
  const int own[] = {CNN_CONV1_W, CNN_CONV1_B, CNN_CONV2_W, CNN_CONV2_B, CNN_FC_W, CNN_FC_B};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
    const cnn_param_t *p = &m->param[own[i]];
    if (load_f32(p->data, file, p->name, p, err, errlen) != 0) return -1;
  }
  TRY_SN(sn_syncbn_load_state(m->bn1, file, "bn1"), "sn_syncbn_load_state(bn1)");
  TRY_SN(sn_syncbn_load_state(m->bn2, file, "bn2"), "sn_syncbn_load_state(bn2)");
  if (with_momentum) {
    for (int i = 0; i < CNN_NPARAMS; i++) {
      if (load_f32(m->param[i].momentum, file, m->momentum_name[i], &m->param[i], err, errlen) != 0)
        return -1;
    }
  }
  return 0;
}

/* Appends bytes to *dst (when dst != NULL) and counts them. */
static void put(unsigned char **dst, int64_t *total, const void *src, int64_t bytes) {
  if (*dst) {
    memcpy(*dst, src, (size_t)bytes);
    *dst += bytes;
  }
  *total += bytes;
}

static int64_t pack(const cnn_model_t *m, void *buf, int running_only) {
  unsigned char *dst = buf;
  int64_t total = 0;
  const sn_syncbn_params_t *bns[2] = {&m->bn1p, &m->bn2p};
  for (int i = 0; i < 2; i++) {
    const int64_t c = bns[i]->num_features;
    put(&dst, &total, bns[i]->running_mean, c * (int64_t)sizeof(float));
    put(&dst, &total, bns[i]->running_var, c * (int64_t)sizeof(float));
    put(&dst, &total, bns[i]->num_batches_tracked, (int64_t)sizeof(int64_t));
  }
  if (!running_only) {
    for (int i = 0; i < CNN_NPARAMS; i++)
      put(&dst, &total, m->param[i].data, m->param[i].numel * (int64_t)sizeof(float));
    put(&dst, &total, m->momentum, m->grad_count * (int64_t)sizeof(float));
  }
  return total;
}

int64_t cnn_model_state_bytes(const cnn_model_t *m, int running_only) {
  return pack(m, NULL, running_only);
}

void cnn_model_pack_state(const cnn_model_t *m, void *buf, int running_only) {
  pack(m, buf, running_only);
}
