/*
 * test_layers.c — syncnorm-train's layers (examples/cnn.c) against fp64 references written here
 * as direct loops: convolution (im2col + sgemm) forward and backward, fused ReLU + 2×2 max
 * pooling, linear, softmax cross-entropy, the [a,b,s] transpose, SGD, the RNG. Every backward is
 * checked against central finite differences of the fp64 reference (exact up to fp64 rounding for
 * the linear layers and for piecewise-linear ones away from kinks, which the inputs avoid).
 * Sizes are odd and small (1, 3, 5, 7, …) so boundaries and padding are all exercised.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "testutil.h"

/* f32 results vs fp64 reference, normwise: sgemm sums ≤ a few hundred products in f32
 * (relative error ~ K·2^-24 worst case, ~1e-7 typical). */
#define RTOL_LAYER 2e-6
/* analytic f32 gradient vs finite differences of the fp64 reference (FD error ~1e-10 here). */
#define RTOL_GRAD 1e-5

static double *dalloc(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}
static float *falloc(int64_t n) {
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}
static void fill(float *a, int64_t n, tu_rng_t *r) {
  for (int64_t i = 0; i < n; i++) a[i] = (float)tu_rng_normal(r);
}
static void widen(double *d, const float *f, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = f[i];
}
static double dot(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* ---- convolution ------------------------------------------------------------------------- */

/* y[co, img, oy, ox] = b[co] + Σ w[co, ci, ky, kx]·x[ci, img, oy+ky−pad, ox+kx−pad] (CNHW). */
static void conv_ref(double *y, const double *x, const double *w, const double *b, int64_t n,
                     const cnn_conv_t *g) {
  for (int64_t co = 0; co < g->cout; co++)
    for (int64_t img = 0; img < n; img++)
      for (int64_t oy = 0; oy < g->oh; oy++)
        for (int64_t ox = 0; ox < g->ow; ox++) {
          double s = b ? b[co] : 0.0;
          for (int64_t ci = 0; ci < g->cin; ci++)
            for (int64_t ky = 0; ky < g->k; ky++)
              for (int64_t kx = 0; kx < g->k; kx++) {
                const int64_t iy = oy + ky - g->pad, ix = ox + kx - g->pad;
                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                s += w[((co * g->cin + ci) * g->k + ky) * g->k + kx] *
                     x[((ci * n + img) * g->h + iy) * g->w + ix];
              }
          y[((co * n + img) * g->oh + oy) * g->ow + ox] = s;
        }
}

/* L = Σ r·conv_ref(x, w, b). */
static double conv_loss(const double *r, const double *x, const double *w, const double *b,
                        int64_t n, const cnn_conv_t *g, double *scratch) {
  conv_ref(scratch, x, w, b, n, g);
  return dot(r, scratch, g->cout * n * g->oh * g->ow);
}

/* Central differences of L with respect to every element of v (h = 0.5: L is linear in v). */
static void fd_grad(double *grad, double *v, int64_t nv, const double *r, double *x, double *w,
                    double *b, int64_t n, const cnn_conv_t *g, double *scratch) {
  const double h = 0.5;
  for (int64_t i = 0; i < nv; i++) {
    const double keep = v[i];
    v[i] = keep + h;
    const double lp = conv_loss(r, x, w, b, n, g, scratch);
    v[i] = keep - h;
    const double lm = conv_loss(r, x, w, b, n, g, scratch);
    v[i] = keep;
    grad[i] = (lp - lm) / (2 * h);
  }
}

static void check_conv(int64_t cin, int64_t cout, int64_t k, int64_t pad, int64_t h, int64_t w,
                       int64_t n, uint64_t seed) {
  const cnn_conv_t g = cnn_conv_geometry(cin, cout, k, pad, h, w);
  const int64_t nx = cin * n * h * w, nw = cout * cin * k * k, ny = cout * n * g.oh * g.ow;
  const int64_t ncol = cnn_conv_col_rows(&g) * cnn_conv_col_cols(&g, n);
  tu_rng_t rng;
  tu_rng_seed(&rng, seed);
  float *x = falloc(nx), *wt = falloc(nw), *b = falloc(cout), *y = falloc(ny), *col = falloc(ncol);
  float *dy = falloc(ny), *dx = falloc(nx), *dw = falloc(nw), *db = falloc(cout);
  fill(x, nx, &rng), fill(wt, nw, &rng), fill(b, cout, &rng), fill(dy, ny, &rng);
  double *xd = dalloc(nx), *wd = dalloc(nw), *bd = dalloc(cout), *yd = dalloc(ny),
         *rd = dalloc(ny), *scratch = dalloc(ny), *gx = dalloc(nx), *gw = dalloc(nw),
         *gb = dalloc(cout);
  widen(xd, x, nx), widen(wd, wt, nw), widen(bd, b, cout), widen(rd, dy, ny);

  tu_poison_f32(y, ny);
  cnn_conv_fwd(y, col, x, wt, b, n, &g);
  conv_ref(yd, xd, wd, bd, n, &g);
  tu_assert_rel(y, SN_DTYPE_F32, yd, ny, RTOL_LAYER, "conv forward");

  tu_poison_f32(dx, nx), tu_poison_f32(dw, nw), tu_poison_f32(db, cout);
  cnn_conv_bwd(dx, dw, db, col, dy, wt, n, &g);
  fd_grad(gx, xd, nx, rd, xd, wd, bd, n, &g, scratch);
  fd_grad(gw, wd, nw, rd, xd, wd, bd, n, &g, scratch);
  fd_grad(gb, bd, cout, rd, xd, wd, bd, n, &g, scratch);
  tu_assert_rel(dx, SN_DTYPE_F32, gx, nx, RTOL_GRAD, "conv dx");
  tu_assert_rel(dw, SN_DTYPE_F32, gw, nw, RTOL_GRAD, "conv dw");
  tu_assert_rel(db, SN_DTYPE_F32, gb, cout, RTOL_GRAD, "conv db");

  /* without bias and without dx (the first layer): dw unchanged */
  float *dw2 = falloc(nw);
  cnn_conv_fwd(y, col, x, wt, NULL, n, &g);
  cnn_conv_bwd(NULL, dw2, NULL, col, dy, wt, n, &g);
  tu_assert_rel(dw2, SN_DTYPE_F32, gw, nw, RTOL_GRAD, "conv dw (no bias, no dx)");

  free(x), free(wt), free(b), free(y), free(col), free(dy), free(dx), free(dw), free(db), free(dw2);
  free(xd), free(wd), free(bd), free(yd), free(rd), free(scratch), free(gx), free(gw), free(gb);
}

START_TEST(test_conv_against_reference_and_fd) {
  check_conv(3, 5, 3, 1, 5, 6, 2, 1);   /* the model's kernel, odd plane */
  check_conv(1, 4, 3, 1, 7, 7, 3, 2);   /* one input channel, like conv1 */
  check_conv(2, 3, 1, 0, 4, 5, 1, 3);   /* 1×1 */
  check_conv(4, 2, 3, 0, 6, 5, 2, 4);   /* no padding */
  check_conv(3, 2, 5, 2, 6, 7, 1, 5);   /* 5×5, pad 2 */
  check_conv(2, 3, 3, 1, 1, 1, 4, 6);   /* 1×1 images: only the centre tap sees data */
}
END_TEST

START_TEST(test_conv_empty_batch) {
  const cnn_conv_t g = cnn_conv_geometry(2, 3, 3, 1, 4, 4);
  float dw[54], db[3], y[1] = {42.0f}, col[1];
  tu_poison_f32(dw, 54), tu_poison_f32(db, 3);
  cnn_conv_fwd(y, col, NULL, dw, NULL, 0, &g);
  ck_assert(y[0] == 42.0f); /* nothing written */
  cnn_conv_bwd(NULL, dw, db, col, NULL, dw, 0, &g);
  for (int i = 0; i < 54; i++) ck_assert(dw[i] == 0.0f);
  for (int i = 0; i < 3; i++) ck_assert(db[i] == 0.0f);
}
END_TEST

START_TEST(test_im2col_col2im_adjoint) {
  /* <im2col(x), c> == <x, col2im(c)>: col2im is exactly the transpose of im2col. */
  const cnn_conv_t g = cnn_conv_geometry(3, 1, 3, 1, 5, 7);
  const int64_t n = 2, nx = 3 * n * 5 * 7, nc = cnn_conv_col_rows(&g) * cnn_conv_col_cols(&g, n);
  tu_rng_t rng;
  tu_rng_seed(&rng, 9);
  float *x = falloc(nx), *c = falloc(nc), *col = falloc(nc), *dx = falloc(nx);
  fill(x, nx, &rng), fill(c, nc, &rng);
  cnn_im2col(col, x, n, &g);
  cnn_col2im(dx, c, n, &g);
  double a = 0, b = 0;
  for (int64_t i = 0; i < nc; i++) a += (double)col[i] * c[i];
  for (int64_t i = 0; i < nx; i++) b += (double)x[i] * dx[i];
  ck_assert_msg(fabs(a - b) <= 1e-5 * fabs(a), "%g vs %g", a, b);
  free(x), free(c), free(col), free(dx);
}
END_TEST

/* ---- ReLU + max pooling -------------------------------------------------------------------- */

static void pool_ref(double *y, const double *x, int64_t planes, int64_t h, int64_t w) {
  for (int64_t p = 0; p < planes; p++)
    for (int64_t i = 0; i < h / 2; i++)
      for (int64_t j = 0; j < w / 2; j++) {
        double m = -INFINITY;
        for (int a = 0; a < 2; a++)
          for (int b = 0; b < 2; b++) {
            const double v = x[(p * h + 2 * i + a) * w + 2 * j + b];
            m = fmax(m, v > 0 ? v : 0); /* ReLU first, as the model writes it */
          }
        y[(p * (h / 2) + i) * (w / 2) + j] = m;
      }
}

START_TEST(test_relu_maxpool_against_reference_and_fd) {
  const int64_t planes = 3, h = 6, w = 10, nx = planes * h * w, ny = nx / 4;
  tu_rng_t rng;
  tu_rng_seed(&rng, 11);
  /* distinct values 0.01 apart, none at 0 (no kinks within the FD step) */
  float *x = falloc(nx), *y = falloc(ny), *dy = falloc(ny), *dx = falloc(nx);
  for (int64_t i = 0; i < nx; i++) x[i] = (float)((double)i - (double)nx / 2 + 0.5) * 0.01f;
  for (int64_t i = nx - 1; i > 0; i--) { /* shuffle */
    const int64_t j = tu_rng_int(&rng, 0, i);
    const float t = x[i];
    x[i] = x[j], x[j] = t;
  }
  fill(dy, ny, &rng);
  double *xd = dalloc(nx), *yd = dalloc(ny), *rd = dalloc(ny), *gx = dalloc(nx),
         *tmp = dalloc(ny);
  widen(xd, x, nx), widen(rd, dy, ny);
  tu_poison_f32(y, ny);
  cnn_relu_maxpool2_fwd(y, x, planes, h, w);
  pool_ref(yd, xd, planes, h, w);
  for (int64_t i = 0; i < ny; i++) ck_assert_msg(y[i] == (float)yd[i], "y[%lld]", (long long)i);
  tu_poison_f32(dx, nx);
  cnn_relu_maxpool2_bwd(dx, dy, x, planes, h, w);
  const double step = 1e-4;
  for (int64_t i = 0; i < nx; i++) {
    const double keep = xd[i];
    xd[i] = keep + step;
    pool_ref(tmp, xd, planes, h, w);
    const double lp = dot(rd, tmp, ny);
    xd[i] = keep - step;
    pool_ref(tmp, xd, planes, h, w);
    const double lm = dot(rd, tmp, ny);
    xd[i] = keep;
    gx[i] = (lp - lm) / (2 * step);
  }
  tu_assert_rel(dx, SN_DTYPE_F32, gx, nx, RTOL_GRAD, "relu+maxpool dx");
  free(x), free(y), free(dy), free(dx);
  free(xd), free(yd), free(rd), free(gx), free(tmp);
}
END_TEST

START_TEST(test_relu_maxpool_ties_and_negatives) {
  /* ties: the first maximum in row-major order gets the gradient (as PyTorch's MaxPool2d);
   * an all-negative window outputs 0 and passes no gradient (ReLU'(x<0) = 0, and at 0). */
  const float x[2 * 2 * 4] = {5, 5, -1, -2,   /* plane 0: window 0 ties 5/5/5/5 */
                              5, 5, -3, -4,   /*          window 1 all negative */
                              0, 1, 2, 7,     /* plane 1: window 0 max 1 at (0,1) */
                              1, 0, 7, 2};    /*          window 1 tie 7 at (0,1) and (1,0) */
  float y[4], dx[16];
  const float dy[4] = {10, 20, 30, 40};
  cnn_relu_maxpool2_fwd(y, x, 2, 2, 4);
  ck_assert(y[0] == 5 && y[1] == 0 && y[2] == 1 && y[3] == 7);
  tu_poison_f32(dx, 16);
  cnn_relu_maxpool2_bwd(dx, dy, x, 2, 2, 4);
  const float want[16] = {10, 0, 0, 0, 0, 0, 0, 0, 0, 30, 0, 40, 0, 0, 0, 0};
  for (int i = 0; i < 16; i++) ck_assert_msg(dx[i] == want[i], "dx[%d] = %g", i, (double)dx[i]);
}
END_TEST

START_TEST(test_relu_maxpool_random_ties) {
  /* small integers: many ties and zeros, on the model's plane sizes (rows of 14 and 7 windows,
   * so the vectorized loops and their remainders both run); the reference applies PyTorch's
   * rule directly: the first maximum of each window in row-major order, ReLU gradient 0 at 0 */
  const int64_t sizes[2][2] = {{28, 28}, {14, 14}};
  tu_rng_t rng;
  tu_rng_seed(&rng, 13);
  for (int s = 0; s < 2; s++) {
    const int64_t planes = 5, h = sizes[s][0], w = sizes[s][1], nx = planes * h * w;
    float *x = falloc(nx), *y = falloc(nx / 4), *dy = falloc(nx / 4), *dx = falloc(nx);
    for (int64_t i = 0; i < nx; i++) x[i] = (float)tu_rng_int(&rng, -2, 2);
    for (int64_t i = 0; i < nx / 4; i++) dy[i] = (float)(i + 1);
    cnn_relu_maxpool2_fwd(y, x, planes, h, w);
    tu_poison_f32(dx, nx);
    cnn_relu_maxpool2_bwd(dx, dy, x, planes, h, w);
    for (int64_t p = 0; p < planes; p++)
      for (int64_t i = 0; i < h / 2; i++)
        for (int64_t j = 0; j < w / 2; j++) {
          int64_t at[4], best = 0;
          for (int k = 0; k < 4; k++) at[k] = (p * h + 2 * i + k / 2) * w + 2 * j + k % 2;
          for (int k = 1; k < 4; k++)
            if (x[at[k]] > x[at[best]]) best = k;
          const int64_t o = (p * (h / 2) + i) * (w / 2) + j;
          const float m = x[at[best]];
          ck_assert(y[o] == (m > 0 ? m : 0.0f));
          for (int k = 0; k < 4; k++) {
            const float want = k == best && m > 0 ? dy[o] : 0.0f;
            ck_assert_msg(dx[at[k]] == want, "plane %lld window (%lld,%lld) position %d: %g vs %g",
                          (long long)p, (long long)i, (long long)j, k, (double)dx[at[k]],
                          (double)want);
          }
        }
    free(x), free(y), free(dy), free(dx);
  }
}
END_TEST

/* ---- linear -------------------------------------------------------------------------------- */

static void linear_ref(double *y, const double *x, const double *w, const double *b, int64_t n,
                       int64_t in, int64_t out) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < out; o++) {
      double s = b[o];
      for (int64_t k = 0; k < in; k++) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
}

START_TEST(test_linear_against_reference_and_fd) {
  const int64_t n = 3, in = 7, out = 5;
  tu_rng_t rng;
  tu_rng_seed(&rng, 21);
  float *x = falloc(n * in), *w = falloc(out * in), *b = falloc(out), *y = falloc(n * out);
  float *dy = falloc(n * out), *dx = falloc(n * in), *dw = falloc(out * in), *db = falloc(out);
  fill(x, n * in, &rng), fill(w, out * in, &rng), fill(b, out, &rng), fill(dy, n * out, &rng);
  double *xd = dalloc(n * in), *wd = dalloc(out * in), *bd = dalloc(out), *yd = dalloc(n * out);
  double *rd = dalloc(n * out), *g = dalloc(n * in + out * in + out);
  widen(xd, x, n * in), widen(wd, w, out * in), widen(bd, b, out), widen(rd, dy, n * out);
  cnn_linear_fwd(y, x, w, b, n, in, out);
  linear_ref(yd, xd, wd, bd, n, in, out);
  tu_assert_rel(y, SN_DTYPE_F32, yd, n * out, RTOL_LAYER, "linear forward");
  cnn_linear_bwd(dx, dw, db, dy, x, w, n, in, out);
  double *vars[3] = {xd, wd, bd};
  const int64_t sizes[3] = {n * in, out * in, out};
  float *got[3] = {dx, dw, db};
  for (int v = 0; v < 3; v++) {
    for (int64_t i = 0; i < sizes[v]; i++) {
      const double keep = vars[v][i];
      vars[v][i] = keep + 0.5;
      linear_ref(yd, xd, wd, bd, n, in, out);
      const double lp = dot(rd, yd, n * out);
      vars[v][i] = keep - 0.5;
      linear_ref(yd, xd, wd, bd, n, in, out);
      const double lm = dot(rd, yd, n * out);
      vars[v][i] = keep;
      g[i] = (lp - lm) / 1.0;
    }
    tu_assert_rel(got[v], SN_DTYPE_F32, g, sizes[v], RTOL_GRAD,
                  v == 0 ? "linear dx" : v == 1 ? "linear dw" : "linear db");
  }
  /* empty batch: gradients of the parameters are 0 */
  cnn_linear_bwd(NULL, dw, db, NULL, NULL, w, 0, in, out);
  for (int64_t i = 0; i < out * in; i++) ck_assert(dw[i] == 0.0f);
  free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db);
  free(xd), free(wd), free(bd), free(yd), free(rd), free(g);
}
END_TEST

/* ---- softmax cross-entropy ------------------------------------------------------------------ */

static double xent_ref(const double *z, const uint8_t *labels, int64_t n, int64_t c, double scale) {
  double loss = 0;
  for (int64_t i = 0; i < n; i++) {
    double m = z[i * c];
    for (int64_t k = 1; k < c; k++) m = fmax(m, z[i * c + k]);
    double s = 0;
    for (int64_t k = 0; k < c; k++) s += exp(z[i * c + k] - m);
    loss += (m + log(s) - z[i * c + labels[i]]) * scale;
  }
  return loss;
}

START_TEST(test_softmax_xent) {
  const int64_t n = 5, c = 10;
  tu_rng_t rng;
  tu_rng_seed(&rng, 31);
  float z[50], dz[50];
  double zd[50], g[50];
  uint8_t labels[5] = {0, 9, 3, 3, 7};
  fill(z, n * c, &rng);
  for (int i = 0; i < 50; i++) z[i] *= 3.0f;
  widen(zd, z, n * c);
  int64_t correct = -1;
  const double loss = cnn_softmax_xent(dz, &correct, z, labels, n, c, 1.0 / n);
  ck_assert_msg(fabs(loss - xent_ref(zd, labels, n, c, 1.0 / n)) < 1e-12, "loss %g", loss);
  int64_t want_correct = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t best = 0;
    for (int64_t k = 1; k < c; k++)
      if (z[i * c + k] > z[i * c + best]) best = k;
    want_correct += best == labels[i];
  }
  ck_assert_int_eq(correct, want_correct);
  const double h = 1e-6;
  for (int64_t i = 0; i < n * c; i++) {
    const double keep = zd[i];
    zd[i] = keep + h;
    const double lp = xent_ref(zd, labels, n, c, 1.0 / n);
    zd[i] = keep - h;
    const double lm = xent_ref(zd, labels, n, c, 1.0 / n);
    zd[i] = keep;
    g[i] = (lp - lm) / (2 * h);
  }
  tu_assert_rel(dz, SN_DTYPE_F32, g, n * c, RTOL_GRAD, "softmax cross-entropy dlogits");
  /* huge logits: log-sum-exp keeps everything finite; a confident right answer costs ~0 */
  float big[10] = {1e4f, -1e4f, 0, 0, 0, 0, 0, 0, 0, 3e4f};
  uint8_t l9 = 9, l0 = 0;
  ck_assert(cnn_softmax_xent(dz, NULL, big, &l9, 1, 10, 1.0) < 1e-12);
  const double wrong = cnn_softmax_xent(dz, NULL, big, &l0, 1, 10, 1.0);
  ck_assert_msg(fabs(wrong - 2e4) < 1e-6 * 2e4, "loss %g", wrong);
  for (int k = 0; k < 10; k++) ck_assert(isfinite(dz[k]));
  ck_assert(dz[0] == -1.0f && dz[9] == 1.0f);
  /* loss only */
  ck_assert(cnn_softmax_xent(NULL, NULL, z, labels, n, c, 1.0) > 0);
}
END_TEST

/* ---- transpose, SGD, RNG --------------------------------------------------------------------- */

START_TEST(test_transpose) {
  const int64_t a = 3, b = 5, s = 7;
  float x[105], y[105], back[105];
  for (int i = 0; i < 105; i++) x[i] = (float)i;
  cnn_transpose_abs(y, x, a, b, s);
  for (int64_t i = 0; i < a; i++)
    for (int64_t j = 0; j < b; j++)
      for (int64_t k = 0; k < s; k++) ck_assert(y[(j * a + i) * s + k] == x[(i * b + j) * s + k]);
  cnn_transpose_abs(back, y, b, a, s);
  ck_assert_mem_eq(back, x, sizeof x);
}
END_TEST

START_TEST(test_sgd_matches_pytorch_formula) {
  /* torch.optim.SGD(momentum=m, weight_decay=wd): g += wd·w; buf = m·buf + g (buf = g at the
   * first step); w -= lr·buf. Two steps, fp64 reference. */
  float w[3] = {1.0f, -2.0f, 0.5f}, buf[3] = {0, 0, 0};
  const float g1[3] = {0.1f, 0.2f, -0.3f}, g2[3] = {-0.05f, 0.0f, 0.4f};
  double wd[3] = {1.0, -2.0, 0.5}, bd[3] = {0, 0, 0};
  const double lr = 0.1, m = 0.9, dec = 5e-4;
  for (int step = 0; step < 2; step++) {
    const float *g = step ? g2 : g1;
    cnn_sgd_update(w, buf, g, 3, (float)lr, (float)m, (float)dec);
    for (int i = 0; i < 3; i++) {
      const double gi = (double)g[i] + dec * wd[i];
      bd[i] = step ? m * bd[i] + gi : gi;
      wd[i] -= lr * bd[i];
    }
  }
  for (int i = 0; i < 3; i++)
    ck_assert_msg(fabs(w[i] - wd[i]) < 1e-6, "w[%d] %g vs %g", i, (double)w[i], wd[i]);
  /* wd = 0 is plain momentum SGD */
  float v[1] = {3.0f}, b0[1] = {0.0f};
  const float g0[1] = {1.0f};
  cnn_sgd_update(v, b0, g0, 1, 0.5f, 0.9f, 0.0f);
  ck_assert(v[0] == 2.5f && b0[0] == 1.0f);
}
END_TEST

START_TEST(test_rng_permutation) {
  enum { N = 1000 };
  static int64_t a[N], b[N];
  cnn_rng_t r1 = {42}, r2 = {42}, r3 = {43};
  cnn_rng_permutation(a, N, &r1);
  cnn_rng_permutation(b, N, &r2);
  ck_assert_mem_eq(a, b, sizeof a); /* same seed, same order: every rank shuffles alike */
  static int seen[N];
  for (int i = 0; i < N; i++) {
    ck_assert(a[i] >= 0 && a[i] < N && !seen[a[i]]);
    seen[a[i]] = 1;
  }
  cnn_rng_permutation(b, N, &r3);
  ck_assert(memcmp(a, b, sizeof a) != 0);
  int fixed = 0;
  for (int i = 0; i < N; i++) fixed += a[i] == i;
  ck_assert_int_lt(fixed, 10); /* a shuffle (expected 1 fixed point) */
  for (int i = 0; i < 10000; i++) {
    const float u = cnn_rng_uniform(&r1, -0.25f, 0.25f);
    ck_assert(u >= -0.25f && u < 0.25f);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("layers");
  TCase *tc = tcase_create("cnn");
  tcase_add_test(tc, test_conv_against_reference_and_fd);
  tcase_add_test(tc, test_conv_empty_batch);
  tcase_add_test(tc, test_im2col_col2im_adjoint);
  tcase_add_test(tc, test_relu_maxpool_against_reference_and_fd);
  tcase_add_test(tc, test_relu_maxpool_ties_and_negatives);
  tcase_add_test(tc, test_relu_maxpool_random_ties);
  tcase_add_test(tc, test_linear_against_reference_and_fd);
  tcase_add_test(tc, test_softmax_xent);
  tcase_add_test(tc, test_transpose);
  tcase_add_test(tc, test_sgd_matches_pytorch_formula);
  tcase_add_test(tc, test_rng_permutation);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
