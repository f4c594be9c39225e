/*
 * cnn.h — the layers of syncnorm-train's small CNN, apart from BatchNorm (the library's
 * sn_syncbn_t): 2-D convolution by im2col + OpenBLAS sgemm, fused ReLU + 2×2 max pooling, a linear
 * layer (sgemm), softmax cross-entropy, and SGD with momentum and weight decay.
 *
 * Activation layout is channel-major, [C, N, H, W] ("CNHW"): what one batched im2col GEMM
 * produces (y[Cout, N·H·W] = W[Cout, Cin·k·k] · col[Cin·k·k, N·H·W]), so no transposes are needed
 * between layers; BatchNorm sees it as NCHW with n = 1, s = N·H·W, which normalizes each channel
 * over the same N·H·W values. Parameters are stored as PyTorch stores them (conv weight
 * [Cout, Cin, k, k], linear weight [out, in]), so a checkpoint loads into torch.nn modules as is.
 *
 * All pointers are host f32 unless said otherwise, dense row-major. Outputs come first and are
 * overwritten (=); nothing accumulates. Scratch is passed in by the caller: nothing allocates.
 * Loops over channels or planes are split with OpenMP; sgemm uses OpenBLAS's own threads.
 */
#ifndef SN_EXAMPLES_CNN_H
#define SN_EXAMPLES_CNN_H

#include <stdint.h>

/* Geometry of a stride-1 convolution with square kernel k and zero padding pad. */
typedef struct {
  int64_t cin, cout, k, pad;
  int64_t h, w;   /* input plane */
  int64_t oh, ow; /* output plane: h + 2·pad − k + 1, w + 2·pad − k + 1 */
} cnn_conv_t;

/* Fills the geometry (oh, ow computed). */
cnn_conv_t cnn_conv_geometry(int64_t cin, int64_t cout, int64_t k, int64_t pad, int64_t h,
                             int64_t w);

/* Rows of the im2col matrix (cin·k·k) and its columns for n images (n·oh·ow). */
static inline int64_t cnn_conv_col_rows(const cnn_conv_t *g) { return g->cin * g->k * g->k; }
static inline int64_t cnn_conv_col_cols(const cnn_conv_t *g, int64_t n) {
  return n * g->oh * g->ow;
}

/* col[(ci,ky,kx), (img,oy,ox)] = x[ci, img, oy+ky−pad, ox+kx−pad], 0 outside the image (=).
 * x: [cin, n, h, w]; col: [cin·k·k, n·oh·ow]. */
void cnn_im2col(float *col, const float *x, int64_t n, const cnn_conv_t *g);

/* Adjoint of cnn_im2col: dx[ci, img, iy, ix] = Σ of the dcol entries im2col copied x from (=).
 * dx: [cin, n, h, w]; dcol: [cin·k·k, n·oh·ow]. */
void cnn_col2im(float *dx, const float *dcol, int64_t n, const cnn_conv_t *g);

/* Convolution forward (cross-correlation, as torch.nn.Conv2d):
 *   col = im2col(x);  y[co, :] = Σ_r w[co, r]·col[r, :] + b[co]   (one sgemm for the batch).
 * y: [cout, n, oh, ow] (=); col: scratch [cin·k·k, n·oh·ow], written (=) and kept for backward;
 * x: [cin, n, h, w]; w: [cout, cin, k, k]; b: [cout] or NULL (no bias). */
void cnn_conv_fwd(float *y, float *col, const float *x, const float *w, const float *b, int64_t n,
                  const cnn_conv_t *g);

/* Convolution backward, with col from the forward on the same x:
 *   dw = dy · colᵀ,  db[co] = Σ dy[co, :],  dx = col2im(wᵀ · dy).
 * dw: [cout, cin, k, k] (=); db: [cout] (=) or NULL; dx: [cin, n, h, w] (=) or NULL (not needed
 * for the first layer). col: [cin·k·k, n·oh·ow] from cnn_conv_fwd; it is overwritten with wᵀ·dy
 * when dx is wanted (the buffer is reused as dcol). dy: [cout, n, oh, ow]. */
void cnn_conv_bwd(float *dx, float *dw, float *db, float *col, const float *dy, const float *w,
                  int64_t n, const cnn_conv_t *g);

/* ReLU followed by 2×2 max pooling with stride 2, computed as relu(maxpool(x)) (equal, and 4×
 * less work): y[p, i, j] = max(0, max_{a,b∈{0,1}} x[p, 2i+a, 2j+b]).
 * y: [planes, h/2, w/2] (=); x: [planes, h, w], h and w even; planes = C·N. */
void cnn_relu_maxpool2_fwd(float *y, const float *x, int64_t planes, int64_t h, int64_t w);

/* Backward of cnn_relu_maxpool2_fwd, from the same x: in each window the first maximum in
 * row-major order (PyTorch's MaxPool2d choice on ties) gets dy where the window's maximum is > 0
 * (ReLU's gradient is 0 at 0, as PyTorch's), every other dx entry is 0 (=).
 * dx, x: [planes, h, w]; dy: [planes, h/2, w/2]. dx must not overlap dy or x. */
void cnn_relu_maxpool2_bwd(float *dx, const float *dy, const float *x, int64_t planes, int64_t h,
                           int64_t w);

/* Linear layer (torch.nn.Linear): y = x·wᵀ + b.  y: [n, out] (=); x: [n, in]; w: [out, in];
 * b: [out] or NULL. */
void cnn_linear_fwd(float *y, const float *x, const float *w, const float *b, int64_t n,
                    int64_t in, int64_t out);

/* Linear backward: dx = dy·w, dw = dyᵀ·x, db = Σ_rows dy.  dx: [n, in] (=) or NULL; dw: [out, in]
 * (=); db: [out] (=) or NULL; dy: [n, out]; x: [n, in]. */
void cnn_linear_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                    const float *w, int64_t n, int64_t in, int64_t out);

/* Softmax cross-entropy (torch.nn.functional.cross_entropy, reduction "mean" scaled by `scale`):
 *   loss = Σ_i −log softmax(logits_i)[label_i] · scale,
 *   dlogits_i = (softmax(logits_i) − onehot(label_i)) · scale.
 * Computed in fp64 with log-sum-exp. scale = 1/n gives the mean loss. logits, dlogits:
 * [n, classes] (dlogits (=) or NULL: loss only); labels: [n] u8 in 0..classes−1. *correct (or
 * NULL) gets how many rows have argmax == label (first maximum on ties). Returns the loss. */
double cnn_softmax_xent(float *dlogits, int64_t *correct, const float *logits,
                        const uint8_t *labels, int64_t n, int64_t classes, double scale);

/* Transposes [a, b, s] to [b, a, s] (s contiguous) (=); y and x must not overlap. Converts the
 * channel-major [C, N, S] activations to the [N, C·S] rows of PyTorch's flatten and back. */
void cnn_transpose_abs(float *y, const float *x, int64_t a, int64_t b, int64_t s);

/* SGD with momentum and weight decay, as torch.optim.SGD (dampening 0, not Nesterov):
 *   g' = g + wd·w,  buf = momentum·buf + g',  w = w − lr·buf.
 * On the first step pass buf = 0 (PyTorch starts with buf = g', the same thing). All f32, same
 * operation order on every rank, so equal inputs give bitwise equal results. */
void cnn_sgd_update(float *w, float *buf, const float *g, int64_t n, float lr, float momentum,
                    float wd);

/* A small seeded RNG (splitmix64), the same stream on every machine and rank. */
typedef struct { uint64_t s; } cnn_rng_t;
uint64_t cnn_rng_u64(cnn_rng_t *r);
/* Uniform in [lo, hi), 24-bit resolution. */
float cnn_rng_uniform(cnn_rng_t *r, float lo, float hi);
/* Fills a[0..n) with 0..n−1 in a random order (Fisher–Yates, unbiased). */
void cnn_rng_permutation(int64_t *a, int64_t n, cnn_rng_t *r);

#endif /* SN_EXAMPLES_CNN_H */
