/*
 * test_model.c — syncnorm-train's whole model (examples/model.c) in one process, with the
 * library's BatchNorm (comm NULL): the f32 loss equals an fp64 reference model written here
 * independently (plain NCHW loops), and the gradients of cnn_model_backward match directional
 * finite differences of that reference, tensor by tensor (this checks the wiring: buffers, the
 * channel-major layout, BatchNorm's [1, C, N·H·W] view, the flatten order); the state_dict
 * names and shapes are
 * PyTorch's; a safetensors round trip restores the state exactly; the seed fixes the init.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "testutil.h"

#define BATCH 6

static cnn_model_t *make_model(uint64_t seed) {
  cnn_model_t *m = NULL;
  char err[512] = "";
  ck_assert_msg(cnn_model_create(&m, BATCH, NULL, seed, err, sizeof err) == 0, "%s", err);
  return m;
}

static void fill_input(cnn_model_t *m, uint8_t *labels, uint64_t seed) {
  tu_rng_t r;
  tu_rng_seed(&r, seed);
  for (int64_t i = 0; i < BATCH * CNN_PIXELS; i++) m->x[i] = (float)tu_rng_normal(&r);
  for (int i = 0; i < BATCH; i++) labels[i] = (uint8_t)tu_rng_int(&r, 0, 9);
}

/* Training-mode loss (mean cross-entropy) of the current parameters; with grads also backward. */
static double loss_of(cnn_model_t *m, const uint8_t *labels, int grads) {
  char err[512] = "";
  ck_assert_msg(cnn_model_forward(m, BATCH, 1, err, sizeof err) == 0, "%s", err);
  const double loss = cnn_softmax_xent(grads ? m->dlogits : NULL, NULL, m->logits, labels, BATCH,
                                       CNN_CLASSES, 1.0 / BATCH);
  if (grads) ck_assert_msg(cnn_model_backward(m, BATCH, err, sizeof err) == 0, "%s", err);
  return loss;
}

/* ---- an fp64 reference of the whole model, written independently: NCHW per image ---------- */

/* y[N][co][h][w] = b[co] + Σ w[co][ci][ky][kx]·x[N][ci][h+ky−1][w+kx−1] (3×3, pad 1) */
static void ref_conv(double *y, const double *x, const double *w, const double *b, int n,
                     int cin, int cout, int hw) {
  for (int i = 0; i < n; i++)
    for (int co = 0; co < cout; co++)
      for (int oy = 0; oy < hw; oy++)
        for (int ox = 0; ox < hw; ox++) {
          double s = b[co];
          for (int ci = 0; ci < cin; ci++)
            for (int ky = 0; ky < 3; ky++)
              for (int kx = 0; kx < 3; kx++) {
                const int iy = oy + ky - 1, ix = ox + kx - 1;
                if (iy >= 0 && iy < hw && ix >= 0 && ix < hw)
                  s += w[((co * cin + ci) * 3 + ky) * 3 + kx] *
                       x[((i * cin + ci) * hw + iy) * hw + ix];
              }
          y[((i * cout + co) * hw + oy) * hw + ox] = s;
        }
}

/* training-mode BatchNorm (biased variance, eps 1e-5), then ReLU, then 2×2 max pooling */
static void ref_bn_relu_pool(double *out, double *x, const double *g, const double *b, int n,
                             int c, int hw) {
  const int s = hw * hw;
  for (int ch = 0; ch < c; ch++) {
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < s; k++) mean += x[(i * c + ch) * s + k];
    mean /= n * s;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < s; k++) var += pow(x[(i * c + ch) * s + k] - mean, 2);
    var /= n * s;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < s; k++) {
        double *v = &x[(i * c + ch) * s + k];
        *v = fmax(0.0, (*v - mean) / sqrt(var + 1e-5) * g[ch] + b[ch]);
      }
  }
  const int h2 = hw / 2;
  for (int p = 0; p < n * c; p++)
    for (int i = 0; i < h2; i++)
      for (int j = 0; j < h2; j++) {
        const double *r0 = x + (p * hw + 2 * i) * hw + 2 * j, *r1 = r0 + hw;
        out[(p * h2 + i) * h2 + j] = fmax(fmax(r0[0], r0[1]), fmax(r1[0], r1[1]));
      }
}

/* Mean cross-entropy of the model with parameters theta (flat, in model->param order). */
static double ref_loss(const cnn_model_t *m, const double *theta, const double *x,
                       const uint8_t *labels) {
  const double *p[CNN_NPARAMS];
  for (int i = 0; i < CNN_NPARAMS; i++) p[i] = theta + (m->param[i].grad - m->grads);
  double *a1 = malloc(sizeof(double) * BATCH * 32 * 784);
  double *p1 = malloc(sizeof(double) * BATCH * 32 * 196);
  double *a2 = malloc(sizeof(double) * BATCH * 64 * 196);
  double *p2 = malloc(sizeof(double) * BATCH * 64 * 49);
  ref_conv(a1, x, p[CNN_CONV1_W], p[CNN_CONV1_B], BATCH, 1, 32, 28);
  ref_bn_relu_pool(p1, a1, p[CNN_BN1_W], p[CNN_BN1_B], BATCH, 32, 28);
  ref_conv(a2, p1, p[CNN_CONV2_W], p[CNN_CONV2_B], BATCH, 32, 64, 14);
  ref_bn_relu_pool(p2, a2, p[CNN_BN2_W], p[CNN_BN2_B], BATCH, 64, 14);
  double loss = 0;
  for (int i = 0; i < BATCH; i++) {
    double z[CNN_CLASSES], zmax = -INFINITY, sum = 0;
    for (int o = 0; o < CNN_CLASSES; o++) {
      z[o] = p[CNN_FC_B][o];
      for (int k = 0; k < CNN_FEATURES; k++) /* p2 row i is torch.flatten's (c, h, w) order */
        z[o] += p[CNN_FC_W][o * CNN_FEATURES + k] * p2[i * CNN_FEATURES + k];
      zmax = fmax(zmax, z[o]);
    }
    for (int o = 0; o < CNN_CLASSES; o++) sum += exp(z[o] - zmax);
    loss += (zmax + log(sum) - z[labels[i]]) / BATCH;
  }
  free(a1), free(p1), free(a2), free(p2);
  return loss;
}

START_TEST(test_gradients_match_fp64_reference) {
  cnn_model_t *m = make_model(3);
  uint8_t labels[BATCH];
  fill_input(m, labels, 5);
  const double loss = loss_of(m, labels, 1);
  const size_t np = (size_t)m->grad_count;
  double *theta = malloc(sizeof(double) * np), *tp = malloc(sizeof(double) * np);
  double *d = malloc(sizeof(double) * np), *x = malloc(sizeof(double) * BATCH * CNN_PIXELS);
  ck_assert(theta && x && tp && d);
  for (int i = 0; i < CNN_NPARAMS; i++)
    for (int64_t k = 0; k < m->param[i].numel; k++)
      theta[(m->param[i].grad - m->grads) + k] = m->param[i].data[k];
  /* the model's input [1, N, 28, 28] is, with one channel, also NCHW [N, 1, 28, 28] */
  for (int64_t k = 0; k < BATCH * CNN_PIXELS; k++) x[k] = m->x[k];
  /* the f32 model's loss equals the fp64 reference's (f32 rounding through 5 layers) */
  const double ref = ref_loss(m, theta, x, labels);
  ck_assert_msg(fabs(loss - ref) <= 1e-6 * ref, "loss %.9g vs fp64 reference %.9g", loss, ref);
  /* directional derivatives, one tensor at a time and all at once: the analytic f32 gradient vs
   * central differences of the fp64 reference with h = 1e-5 (truncation ~h², rounding ~1e-16/h:
   * ~1e-10; crossing a ReLU/max kink within ±h along a random direction is very unlikely) */
  tu_rng_t r;
  tu_rng_seed(&r, 8);
  double scale = 0;
  for (int t = -1; t < CNN_NPARAMS; t++) {
    double norm = 0, an = 0;
    for (int i = 0; i < CNN_NPARAMS; i++) {
      const int64_t off = m->param[i].grad - m->grads;
      for (int64_t k = 0; k < m->param[i].numel; k++) {
        d[off + k] = t < 0 || t == i ? tu_rng_normal(&r) : 0.0;
        norm += d[off + k] * d[off + k];
      }
    }
    for (int64_t k = 0; k < m->grad_count; k++) d[k] /= sqrt(norm), an += m->grads[k] * d[k];
    const double h = 1e-5;
    for (int64_t k = 0; k < m->grad_count; k++) tp[k] = theta[k] + h * d[k];
    const double lp = ref_loss(m, tp, x, labels);
    for (int64_t k = 0; k < m->grad_count; k++) tp[k] = theta[k] - h * d[k];
    const double fd = (lp - ref_loss(m, tp, x, labels)) / (2 * h);
    if (t < 0) scale = fabs(fd);
    /* relative 2e-4 (f32 backward through 5 layers: ~1e-5 seen); conv biases have a ~0
     * gradient (BatchNorm follows), so an absolute part relative to the whole model's one */
    ck_assert_msg(fabs(fd - an) <= 2e-4 * fabs(fd) + 1e-5 * scale,
                  "%s: analytic %.9g vs finite differences %.9g",
                  t < 0 ? "all parameters" : m->param[t].name, an, fd);
  }
  ck_assert(scale > 1e-3);
  free(theta), free(x), free(tp), free(d);
  cnn_model_destroy(m);
}
END_TEST

START_TEST(test_state_dict_names_and_shapes) {
  cnn_model_t *m = make_model(1);
  sn_tensor_t ts[CNN_MAX_TENSORS];
  int n = 0;
  char err[512] = "";
  ck_assert_msg(cnn_model_tensors(m, ts, &n, 0, err, sizeof err) == 0, "%s", err);
  /* what torch.nn.Sequential-free module with these attribute names has in its state_dict */
  static const struct { const char *name; int ndim; int64_t shape[4]; int i64; } want[] = {
      {"conv1.weight", 4, {32, 1, 3, 3}, 0}, {"conv1.bias", 1, {32}, 0},
      {"bn1.weight", 1, {32}, 0}, {"bn1.bias", 1, {32}, 0}, {"bn1.running_mean", 1, {32}, 0},
      {"bn1.running_var", 1, {32}, 0}, {"bn1.num_batches_tracked", 0, {0}, 1},
      {"conv2.weight", 4, {64, 32, 3, 3}, 0}, {"conv2.bias", 1, {64}, 0},
      {"bn2.weight", 1, {64}, 0}, {"bn2.bias", 1, {64}, 0}, {"bn2.running_mean", 1, {64}, 0},
      {"bn2.running_var", 1, {64}, 0}, {"bn2.num_batches_tracked", 0, {0}, 1},
      {"fc.weight", 2, {10, 3136}, 0}, {"fc.bias", 1, {10}, 0}};
  ck_assert_int_eq(n, 16);
  for (int i = 0; i < n; i++) {
    ck_assert_str_eq(ts[i].name, want[i].name);
    ck_assert_int_eq(ts[i].ndim, want[i].ndim);
    ck_assert_int_eq(ts[i].is_i64, want[i].i64);
    for (int d = 0; d < ts[i].ndim; d++) ck_assert_int_eq(ts[i].shape[d], want[i].shape[d]);
  }
  ck_assert_msg(cnn_model_tensors(m, ts, &n, 1, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(n, 26);
  ck_assert_str_eq(ts[16].name, "optimizer.momentum_buffer.conv1.weight");
  ck_assert_str_eq(ts[25].name, "optimizer.momentum_buffer.fc.bias");
  cnn_model_destroy(m);
}
END_TEST

START_TEST(test_save_load_round_trip_and_seed) {
  cnn_model_t *a = make_model(11), *b = make_model(11), *c = make_model(12);
  const int64_t bytes = cnn_model_state_bytes(a, 0);
  unsigned char *sa = malloc((size_t)bytes), *sb = malloc((size_t)bytes);
  cnn_model_pack_state(a, sa, 0);
  cnn_model_pack_state(b, sb, 0);
  ck_assert_mem_eq(sa, sb, (size_t)bytes); /* same seed, same model */
  cnn_model_pack_state(c, sb, 0);
  ck_assert(memcmp(sa, sb, (size_t)bytes) != 0);
  /* train a (running stats, momentum change), save, load into c: identical state */
  uint8_t labels[BATCH];
  fill_input(a, labels, 2);
  loss_of(a, labels, 1);
  cnn_model_sgd(a, 0.01f, 0.9f, 5e-4f);
  char path[] = "/tmp/sn_test_model_XXXXXX";
  const int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  sn_tensor_t ts[CNN_MAX_TENSORS];
  int n = 0;
  char err[512] = "";
  ck_assert_msg(cnn_model_tensors(a, ts, &n, 1, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(sn_safetensors_save(path, ts, n), SN_OK);
  sn_safetensors_t *f = NULL;
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_OK);
  ck_assert_msg(cnn_model_load(c, f, 1, err, sizeof err) == 0, "%s", err);
  cnn_model_pack_state(a, sa, 0);
  cnn_model_pack_state(c, sb, 0);
  ck_assert_mem_eq(sa, sb, (size_t)bytes);
  /* a model-only file has no momentum: loading it with_momentum names the missing tensor */
  ck_assert_msg(cnn_model_tensors(a, ts, &n, 0, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(sn_safetensors_save(path, ts, n), SN_OK);
  sn_safetensors_free(f);
  ck_assert_int_eq(sn_safetensors_load(&f, path), SN_OK);
  ck_assert_int_eq(cnn_model_load(b, f, 1, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "optimizer.momentum_buffer.conv1.weight") != NULL, "%s", err);
  sn_safetensors_free(f);
  unlink(path);
  free(sa), free(sb);
  cnn_model_destroy(a), cnn_model_destroy(b), cnn_model_destroy(c);
  cnn_model_destroy(NULL);
}
END_TEST

START_TEST(test_eval_mode_uses_running_stats) {
  /* eval forward is local, deterministic and uses the running statistics: after training
   * steps, evaluating the same images twice gives the same logits, different from training. */
  cnn_model_t *m = make_model(4);
  uint8_t labels[BATCH];
  fill_input(m, labels, 6);
  for (int i = 0; i < 3; i++) loss_of(m, labels, 0);
  char err[512] = "";
  float train_logits[BATCH * CNN_CLASSES], e1[BATCH * CNN_CLASSES];
  memcpy(train_logits, m->logits, sizeof train_logits);
  ck_assert_msg(cnn_model_forward(m, BATCH, 0, err, sizeof err) == 0, "%s", err);
  memcpy(e1, m->logits, sizeof e1);
  ck_assert_msg(cnn_model_forward(m, BATCH, 0, err, sizeof err) == 0, "%s", err);
  ck_assert_mem_eq(e1, m->logits, sizeof e1);
  ck_assert(memcmp(e1, train_logits, sizeof e1) != 0);
  ck_assert_int_eq(*m->bn1p.num_batches_tracked, 3);
  cnn_model_destroy(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("cnn");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gradients_match_fp64_reference);
  tcase_add_test(tc, test_state_dict_names_and_shapes);
  tcase_add_test(tc, test_save_load_round_trip_and_seed);
  tcase_add_test(tc, test_eval_mode_uses_running_stats);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
