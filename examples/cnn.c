/*
 * cnn.c — layers of syncnorm-train (see cnn.h). The GEMMs go to OpenBLAS; the rest are memory
 * passes written to be obviously correct first (tests/train/test_layers.c checks each against a
 * direct fp64 loop and its backward against finite differences).
 */
#include "cnn.h"

#include <cblas.h>
#include <math.h>
#include <string.h>


cnn_conv_t cnn_conv_geometry(int64_t cin, int64_t cout, int64_t k, int64_t pad, int64_t h,
                             int64_t w) {
  cnn_conv_t g = {cin, cout, k, pad, h, w, h + 2 * pad - k + 1, w + 2 * pad - k + 1};
  return g;
}

/* Output columns ox whose input column ox+kx−pad lies inside [0, w): [*lo, *hi). */
static void valid_range(int64_t *lo, int64_t *hi, int64_t kx, int64_t pad, int64_t w,
                        int64_t ow) {
  int64_t a = pad - kx, b = w + pad - kx;
  *lo = a < 0 ? 0 : a;
  *hi = b > ow ? ow : b;
  if (*hi < *lo) *hi = *lo;
}

void cnn_im2col(float *col, const float *x, int64_t n, const cnn_conv_t *g) {
  const int64_t k = g->k, rows = cnn_conv_col_rows(g), plane_in = g->h * g->w;
  const int64_t plane_out = g->oh * g->ow, cols = n * plane_out;
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t img = 0; img < n; img++) {
      const int64_t ci = r / (k * k), ky = r / k % k, kx = r % k;
      const float *xp = x + (ci * n + img) * plane_in;
      float *cp = col + r * cols + img * plane_out;
      int64_t lo, hi;
      valid_range(&lo, &hi, kx, g->pad, g->w, g->ow);
      for (int64_t oy = 0; oy < g->oh; oy++) {
        float *crow = cp + oy * g->ow;
        const int64_t iy = oy + ky - g->pad;
        if (iy < 0 || iy >= g->h) {
          memset(crow, 0, (size_t)g->ow * sizeof *crow);
          continue;
        }
        for (int64_t ox = 0; ox < lo; ox++) crow[ox] = 0.0f;
        if (hi > lo) /* crow[ox] = x[iy, ox+kx−pad] for ox in [lo, hi) */
          memcpy(crow + lo, xp + iy * g->w + (lo + kx - g->pad), (size_t)(hi - lo) * sizeof *crow);
        for (int64_t ox = hi; ox < g->ow; ox++) crow[ox] = 0.0f;
      }
    }
  }
}

void cnn_col2im(float *dx, const float *dcol, int64_t n, const cnn_conv_t *g) {
  const int64_t k = g->k, plane_in = g->h * g->w, plane_out = g->oh * g->ow;
  const int64_t cols = n * plane_out;
  /* Each (channel, image) plane of dx is written by one thread only: no races, fixed order. */
#pragma omp parallel for collapse(2) schedule(static) if (g->cin * cols * k * k > 65536)
  for (int64_t ci = 0; ci < g->cin; ci++) {
    for (int64_t img = 0; img < n; img++) {
      float *xp = dx + (ci * n + img) * plane_in;
      memset(xp, 0, (size_t)plane_in * sizeof *xp);
      for (int64_t ky = 0; ky < k; ky++) {
        for (int64_t kx = 0; kx < k; kx++) {
          const int64_t r = (ci * k + ky) * k + kx;
          const float *cp = dcol + r * cols + img * plane_out;
          int64_t lo, hi;
          valid_range(&lo, &hi, kx, g->pad, g->w, g->ow);
          for (int64_t oy = 0; oy < g->oh; oy++) {
            const int64_t iy = oy + ky - g->pad;
            if (iy < 0 || iy >= g->h) continue;
            /* x[iy, ox+kx−pad] += dcol[r, img, oy, ox] for ox in [lo, hi) */
            float *xrow = xp + iy * g->w + (lo + kx - g->pad);
            const float *crow = cp + oy * g->ow + lo;
            for (int64_t t = 0; t < hi - lo; t++) xrow[t] += crow[t];
          }
        }
      }
    }
  }
}

/* y[r, :] += b[r] for rows of length cols. */
static void add_row_bias(float *y, const float *b, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; r++) {
    float *yr = y + r * cols;
    const float br = b[r];
    for (int64_t j = 0; j < cols; j++) yr[j] += br;
  }
}

/* s[r] = Σ_j a[r, j], accumulated in fp64 in 8 interleaved partial sums (so the loop vectorizes;
 * the order is fixed, so the result is deterministic), rounded once. */
static void row_sums(float *s, const float *a, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; r++) {
    const float *ar = a + r * cols;
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8)
      for (int l = 0; l < 8; l++) part[l] += ar[j + l];
    double acc = ((part[0] + part[1]) + (part[2] + part[3])) +
                 ((part[4] + part[5]) + (part[6] + part[7]));
    for (; j < cols; j++) acc += ar[j];
    s[r] = (float)acc;
  }
}

void cnn_conv_fwd(float *y, float *col, const float *x, const float *w, const float *b, int64_t n,
                  const cnn_conv_t *g) {
  const int64_t kk = cnn_conv_col_rows(g), cols = cnn_conv_col_cols(g, n);
  if (cols == 0) return;
  cnn_im2col(col, x, n, g);
  /* y[cout, cols] = w[cout, kk] · col[kk, cols] */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->cout, (int)cols, (int)kk, 1.0f,
              w, (int)kk, col, (int)cols, 0.0f, y, (int)cols);
  if (b) add_row_bias(y, b, g->cout, cols);
}

void cnn_conv_bwd(float *dx, float *dw, float *db, float *col, const float *dy, const float *w,
                  int64_t n, const cnn_conv_t *g) {
  const int64_t kk = cnn_conv_col_rows(g), cols = cnn_conv_col_cols(g, n);
  if (cols == 0) {
    memset(dw, 0, (size_t)(g->cout * kk) * sizeof *dw);
    if (db) memset(db, 0, (size_t)g->cout * sizeof *db);
    if (dx) memset(dx, 0, (size_t)(g->cin * n * g->h * g->w) * sizeof *dx);
    return;
  }
  /* dw[cout, kk] = dy[cout, cols] · col[kk, cols]ᵀ */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->cout, (int)kk, (int)cols, 1.0f, dy,
              (int)cols, col, (int)cols, 0.0f, dw, (int)kk);
  if (db) row_sums(db, dy, g->cout, cols);
  if (dx) {
    /* dcol[kk, cols] = w[cout, kk]ᵀ · dy[cout, cols], into col (no longer needed). */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kk, (int)cols, (int)g->cout, 1.0f,
                w, (int)kk, dy, (int)cols, 0.0f, col, (int)cols);
    cnn_col2im(dx, col, n, g);
  }
}

/* The pooling loops are written without branches, so that they vectorize even for the short
 * rows here (7 or 14 windows) and their scalar remainders do not mispredict on random data
 * (measured: 15× faster than an if/else argmax on baseline x86-64; wider AVX-512 clones were
 * slower, the rows being shorter than one vector). */

/* Max of a 2×2 window (a b / c d); ?: on floats compiles to max instructions. */
static inline float max4(float a, float b, float c, float d) {
  const float ab = a > b ? a : b, cd = c > d ? c : d;
  return ab > cd ? ab : cd;
}

/* One output row of the pooling: y[j] = relu(max4(window j of rows r0, r1)). A function of its
 * own (restrict pointers, no OpenMP capture) so that it vectorizes. */
static void pool_fwd_row(float *restrict y, const float *restrict r0,
                                    const float *restrict r1, int64_t pw) {
  for (int64_t j = 0; j < pw; j++) {
    const float m = max4(r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]);
    y[j] = m > 0.0f ? m : 0.0f;
  }
}

/* v if cond (0 or 1), else +0.0f, by masking the bits: no branch. */
static inline float keep_if(float v, int cond) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  u &= 0u - (uint32_t)cond;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* Backward of one output row: rows d0, d1 of dx from rows r0, r1 of x and the row g of dy. */
static void pool_bwd_row(float *restrict d0, float *restrict d1,
                                    const float *restrict g, const float *restrict r0,
                                    const float *restrict r1, int64_t pw) {
  for (int64_t j = 0; j < pw; j++) {
    const float a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], d = r1[2 * j + 1];
    const float m = max4(a, b, c, d);
    const float gs = keep_if(g[j], m > 0.0f);
    /* the first of a, b, c, d equal to the maximum takes the gradient */
    const int ia = a == m, ib = !ia & (b == m), ic = !ia & !ib & (c == m);
    const int id = !ia & !ib & !ic;
    d0[2 * j] = keep_if(gs, ia);
    d0[2 * j + 1] = keep_if(gs, ib);
    d1[2 * j] = keep_if(gs, ic);
    d1[2 * j + 1] = keep_if(gs, id);
  }
}

void cnn_relu_maxpool2_fwd(float *y, const float *x, int64_t planes, int64_t h, int64_t w) {
  const int64_t ph = h / 2, pw = w / 2;
#pragma omp parallel for schedule(static) if (planes * h * w > 65536)
  for (int64_t p = 0; p < planes; p++)
    for (int64_t i = 0; i < ph; i++) {
      const float *r0 = x + (p * h + 2 * i) * w;
      pool_fwd_row(y + (p * ph + i) * pw, r0, r0 + w, pw);
    }
}

void cnn_relu_maxpool2_bwd(float *dx, const float *dy, const float *x, int64_t planes, int64_t h,
                           int64_t w) {
  const int64_t ph = h / 2, pw = w / 2;
#pragma omp parallel for schedule(static) if (planes * h * w > 65536)
  for (int64_t p = 0; p < planes; p++)
    for (int64_t i = 0; i < ph; i++) {
      const float *r0 = x + (p * h + 2 * i) * w;
      float *d0 = dx + (p * h + 2 * i) * w;
      pool_bwd_row(d0, d0 + w, dy + (p * ph + i) * pw, r0, r0 + w, pw);
    }
}

void cnn_linear_fwd(float *y, const float *x, const float *w, const float *b, int64_t n,
                    int64_t in, int64_t out) {
  if (n == 0) return;
  /* y[n, out] = x[n, in] · w[out, in]ᵀ */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.0f, x,
              (int)in, w, (int)in, 0.0f, y, (int)out);
  if (b)
    for (int64_t i = 0; i < n; i++)
      for (int64_t o = 0; o < out; o++) y[i * out + o] += b[o];
}

void cnn_linear_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                    const float *w, int64_t n, int64_t in, int64_t out) {
  if (n == 0) {
    memset(dw, 0, (size_t)(out * in) * sizeof *dw);
    if (db) memset(db, 0, (size_t)out * sizeof *db);
    return;
  }
  /* dw[out, in] = dy[n, out]ᵀ · x[n, in] */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)out, (int)in, (int)n, 1.0f, dy,
              (int)out, x, (int)in, 0.0f, dw, (int)in);
  if (db) {
    for (int64_t o = 0; o < out; o++) {
      double acc = 0.0;
      for (int64_t i = 0; i < n; i++) acc += dy[i * out + o];
      db[o] = (float)acc;
    }
  }
  /* dx[n, in] = dy[n, out] · w[out, in] */
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)in, (int)out, 1.0f, dy,
                (int)out, w, (int)in, 0.0f, dx, (int)in);
}

double cnn_softmax_xent(float *dlogits, int64_t *correct, const float *logits,
                        const uint8_t *labels, int64_t n, int64_t classes, double scale) {
  double loss = 0.0;
  int64_t right = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *z = logits + i * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; c++)
      if (z[c] > z[best]) best = c;
    right += best == labels[i];
    const double zmax = z[best];
    double sum = 0.0;
    for (int64_t c = 0; c < classes; c++) sum += exp((double)z[c] - zmax);
    const double lse = zmax + log(sum);
    loss += (lse - (double)z[labels[i]]) * scale;
    if (dlogits) {
      for (int64_t c = 0; c < classes; c++) {
        const double p = exp((double)z[c] - lse);
        dlogits[i * classes + c] = (float)((p - (c == labels[i] ? 1.0 : 0.0)) * scale);
      }
    }
  }
  if (correct) *correct = right;
  return loss;
}

void cnn_transpose_abs(float *y, const float *x, int64_t a, int64_t b, int64_t s) {
  for (int64_t i = 0; i < a; i++)
    for (int64_t j = 0; j < b; j++)
      memcpy(y + (j * a + i) * s, x + (i * b + j) * s, (size_t)s * sizeof *y);
}

void cnn_sgd_update(float *w, float *buf, const float *g, int64_t n, float lr, float momentum,
                    float wd) {
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i] + wd * w[i];
    buf[i] = momentum * buf[i] + gi;
    w[i] = w[i] - lr * buf[i];
  }
}

uint64_t cnn_rng_u64(cnn_rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float cnn_rng_uniform(cnn_rng_t *r, float lo, float hi) {
  const float u = (float)(cnn_rng_u64(r) >> 40) * (1.0f / 16777216.0f); /* [0, 1), exact */
  return lo + (hi - lo) * u;
}

void cnn_rng_permutation(int64_t *a, int64_t n, cnn_rng_t *r) {
  for (int64_t i = 0; i < n; i++) a[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    /* j uniform in [0, i] by rejection (no modulo bias). */
    const uint64_t range = (uint64_t)i + 1, limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t v;
    do v = cnn_rng_u64(r);
    while (v >= limit);
    const int64_t j = (int64_t)(v % range);
    const int64_t t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}
