/*
 * groupnorm_bwd.c — GroupNorm backward (Wu and He 2018; torch.nn.GroupNorm's gradients).
 *
 * x, dy, dx are [N, C, S] (NCHW) or [N, S, C] (NHWC); G groups of Cg = C/G channels, group
 * (n, g) holds L = Cg·S values; mean, rstd: [N, G] f32 from the forward.
 * Per group, with d = x − mean_saved (mean_saved the f32 mean from the forward):
 *   one pass gathers per channel Σd, Σdy and Σdy·d (fp64); μ_d = Σd/L re-centres
 *   x̂ = (d − μ_d)·rstd, so a rounded saved mean costs nothing; with g = dy·gamma_c,
 *   mean(g) = Σ_c gamma_c·Σdy / L and mean(g·x̂) = rstd·(Σ_c gamma_c·Σdy·d − μ_d·Σ_c gamma_c·Σdy)/L;
 *   a second pass writes dx = rstd·(g − mean(g) − x̂·mean(g·x̂)).
 *   dgamma_c = Σ_n rstd·(Σdy·d − μ_d·Σdy) and dbeta_c = Σ_n Σdy are summed over n in order.
 * NCHW: a task per group, its channels' planes summed with SN_LANES fixed lanes. NHWC: a task
 * per sample, the column sums by pieces of groupnorm.c (groupnorm.h); a batch of fewer samples
 * than threads shares each sample between the threads. Bitwise the same for any thread count.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "groupnorm.h"
#include "norm_kernels.h"
#include "rownorm.h"

/* ---- NCHW runs -------------------------------------------------------------------------------- */

/* How far ahead (in floats, 2 KiB) run_bwd prefetches dy and x: as batchnorm.c's NCHW runs. */
#define GN_PF_FLOATS 512

/* One contiguous run, f32 or (bf16) bf16 widened in registers, SN_LANES lanes per sum (lane k
 * gets elements i ≡ k mod SN_LANES): acc[0][k] += d, acc[1][k] += dy, acc[2][k] += dy·d with
 * d = x − m. */
SN_INLINE void run_bwd_impl(double *acc, const void *dy, const void *x, int64_t n, double m,
                            int bf16) {
  const uintptr_t es = bf16 ? 2 : 4, ahead = GN_PF_FLOATS * 4; /* prefetch 2 KiB ahead */
  sn__vd s1, s2, s3, d, g; /* lane k in element k, as the scalar tail below */
  SN_VLOAD(s1, acc);
  SN_VLOAD(s2, acc + SN_LANES);
  SN_VLOAD(s3, acc + 2 * SN_LANES);
  int64_t i = 0;
  for (; i + 2 * SN_LANES <= n; i += 2 * SN_LANES) { /* one cache line of each per step (f32) */
    __builtin_prefetch(sn__pf_addr(dy, i, es, ahead), 0);
    __builtin_prefetch(sn__pf_addr(x, i, es, ahead), 0);
    for (int h = 0; h < 2; h++) {
      SN_VLOAD_WIDEN_W(d, x, i + h * SN_LANES, bf16);
      SN_VLOAD_WIDEN_W(g, dy, i + h * SN_LANES, bf16);
      d -= m;
      s1 += d;
      s2 += g;
      s3 += g * d;
    }
  }
  for (; i + SN_LANES <= n; i += SN_LANES) {
    SN_VLOAD_WIDEN_W(d, x, i, bf16);
    SN_VLOAD_WIDEN_W(g, dy, i, bf16);
    d -= m;
    s1 += d;
    s2 += g;
    s3 += g * d;
  }
  SN_VSTORE(acc, s1);
  SN_VSTORE(acc + SN_LANES, s2);
  SN_VSTORE(acc + 2 * SN_LANES, s3);
  for (int k = 0; i < n; i++, k++) {
    double dd = (double)sn__load_w(x, bf16, i) - m, gg = (double)sn__load_w(dy, bf16, i);
    acc[k] += dd;
    acc[SN_LANES + k] += gg;
    acc[2 * SN_LANES + k] += gg * dd;
  }
}
SN_CLONES static void run_bwd(double *acc, const float *dy, const float *x, int64_t n, double m) {
  run_bwd_impl(acc, dy, x, n, m, 0);
}
SN_CLONES static void run_bwd_bf16(double *acc, const uint16_t *dy, const uint16_t *x, int64_t n,
                                   double m) {
  run_bwd_impl(acc, dy, x, n, m, 1);
}

/* out[0..2] = Σ d, Σ dy, Σ dy·d over elements [off, off+n), d = x − m. */
static void span_bwd(double out[3], const void *dy, const void *x, int64_t off, int64_t n,
                     double m, sn_dtype_t dtype) {
  double acc[3 * SN_LANES] = {0};
  if (dtype == SN_DTYPE_F32) {
    run_bwd(acc, (const float *)dy + off, (const float *)x + off, n, m);
  } else if (dtype == SN_DTYPE_BF16) { /* as is: the same sums as on f32 tiles */
    run_bwd_bf16(acc, (const uint16_t *)dy + off, (const uint16_t *)x + off, n, m);
  } else {
    float tg[SN_TILE], tx[SN_TILE]; /* SN_TILE is a multiple of SN_LANES: lanes line up */
    for (int64_t i = 0; i < n; i += SN_TILE) {
      int64_t len = sn__min64(SN_TILE, n - i);
      sn__to_f32(tg, dy, off + i, len, dtype);
      sn__to_f32(tx, x, off + i, len, dtype);
      run_bwd(acc, tg, tx, len, m);
    }
  }
  for (int q = 0; q < 3; q++) {
    double s = 0.0;
    for (int k = 0; k < SN_LANES; k++) s += acc[q * SN_LANES + k];
    out[q] = s;
  }
}

/* The arguments of sn_groupnorm_bwd: dx, dy, x [N, C, S] or [N, S, C]; mean, rstd [N, G];
 * gamma [C] or NULL; wq [2][N·C] (the dgamma and dbeta terms of each sample) or NULL. */
typedef struct {
  void *dx;
  double *wq;
  const void *dy, *x;
  const float *mean, *rstd, *gamma;
  int64_t N, C, S, G;
  sn_dtype_t dtype;
} gn_bwd_t;

/* NCHW, a task per group: the sums plane by plane, then dx and the dgamma terms. */
static void gn_bwd_nchw(const gn_bwd_t *b) {
  const int64_t N = b->N, C = b->C, S = b->S, G = b->G, Cg = C / G, L = Cg * S;
  const sn_dtype_t dtype = b->dtype;
  double *wq = b->wq;
  const int stream = sn__stream_out(N * C * S * (int64_t)sn_dtype_size(dtype));
#pragma omp parallel if (N * C * S >= SN_PAR_MIN)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N * G; t++) {
      const int64_t n = t / G, ch0 = (t % G) * Cg;
      const double m = (double)b->mean[t], rs = (double)b->rstd[t];
      double A = 0.0, B = 0.0, D = 0.0; /* Σd, Σ gamma·Σdy, Σ gamma·Σdy·d over the group */
      for (int64_t ch = ch0; ch < ch0 + Cg; ch++) { /* pass 1: sums, plane by plane */
        double sum3[3];
        span_bwd(sum3, b->dy, b->x, (n * C + ch) * S, S, m, dtype);
        const double gm = b->gamma ? (double)b->gamma[ch] : 1.0;
        A += sum3[0];
        B += gm * sum3[1];
        D += gm * sum3[2];
        if (wq) wq[n * C + ch] = sum3[2], wq[N * C + n * C + ch] = sum3[1];
      }
      const double mu_d = A / (double)L, mg = B / (double)L, mgx = rs * (D - mu_d * B) / (double)L;
      for (int64_t ch = ch0; ch < ch0 + Cg; ch++) { /* pass 2: dx, and the dgamma terms */
        if (wq) wq[n * C + ch] = rs * (wq[n * C + ch] - mu_d * wq[N * C + n * C + ch]);
        sn__chan_k_t k;
        sn__chan_k_set(&k, m + mu_d, rs * (b->gamma ? (double)b->gamma[ch] : 1.0), rs * mg,
                       rs * rs * mgx);
        sn__affbwd_span(b->dx, b->dy, b->x, (n * C + ch) * S, S, &k, dtype, stream);
      }
    }
    sn__stream_fence(stream);
  }
}

/* ---- NHWC samples ----------------------------------------------------------------------------- */

/* Scratch doubles of one thread: col [3][C], shift [C], mu_d, mg, mgx [G], part [3][C]. */
static int64_t gn_bwd_nhwc_scratch(int64_t C, int64_t G) { return gn_per_thread(7 * C + 3 * G); }

/* Whether the NHWC backward shares each sample between the threads: fewer samples than nt (the
 * threads that can run at once). A sample larger than L2 stays with one thread, its dx pass
 * prefetching x and dy (gn_map_nt). */
static int gn_bwd_split(int64_t N, int nt) { return nt > 1 && N < nt; }

/* Sample n of the NHWC backward: its sums by pieces (this thread's [p0, p1) into part, added by
 * the team when shared), the group constants, wq's terms when `writer`, and dx over the rows of
 * pieces [p0, p1). w: this thread's block (gn_bwd_nhwc_scratch). */
static void gn_bwd_sample(const gn_bwd_t *b, int64_t n, double *w, double *part, int64_t p0,
                          int64_t p1, int shared, int writer, int stream) {
  const int64_t N = b->N, C = b->C, S = b->S, G = b->G;
  const int64_t Cg = C / G, L = Cg * S, P = gn_pieces(S), r0 = n * S;
  const float *rstd = b->rstd, *gamma = b->gamma;
  double *col = w, *shift = col + 3 * C;                   /* [3][C]; [C] the group's saved mean */
  double *mu_d = shift + C, *mg = mu_d + G, *mgx = mg + G; /* [G] each */
  for (int64_t ch = 0; ch < C; ch++) shift[ch] = (double)b->mean[n * G + ch / Cg];
  const gn_sample_t sm = {b->x, b->dy, S, C, b->dtype, r0, p0, p1, part, shared};
  sn__gn_sample_sums(&sm, GN_SUM_BWD, col, 3 * C, shift); /* Σd, Σdy, Σdy·d per channel */
  for (int64_t g = 0; g < G; g++) {
    const double rs = (double)rstd[n * G + g];
    double A = 0.0, B = 0.0, D = 0.0;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
      const double gm = gamma ? (double)gamma[ch] : 1.0;
      A += col[ch];
      B += gm * col[C + ch];
      D += gm * col[2 * C + ch];
    }
    mu_d[g] = A / (double)L;
    mg[g] = B / (double)L;
    mgx[g] = rs * (D - mu_d[g] * B) / (double)L;
  }
  if (b->wq && writer)
    for (int64_t ch = 0; ch < C; ch++) {
      const int64_t g = ch / Cg;
      b->wq[n * C + ch] = (double)rstd[n * G + g] * (col[2 * C + ch] - mu_d[g] * col[C + ch]);
      b->wq[N * C + n * C + ch] = col[C + ch];
    }
  sn__chan_tile_t p;
  for (int64_t c0 = 0; c0 < C; c0 += SN_TILE_C) { /* pass 2: dx */
    const int64_t ct = sn__min64(SN_TILE_C, C - c0);
    for (int64_t j = 0; j < ct; j++) {
      const int64_t ch = c0 + j, g = ch / Cg;
      const double rs = (double)rstd[n * G + g];
      sn__tile_set(&p, j, shift[ch] + mu_d[g], rs * (gamma ? (double)gamma[ch] : 1.0), rs * mg[g],
                   rs * rs * mgx[g]);
    }
    sn__affbwd_rowspan(b->dx, b->dy, b->x, r0 + gn_piece_row(S, P, p0),
                       r0 + gn_piece_row(S, P, p1), C, c0, ct, &p, b->dtype, stream);
  }
}

/* scratch: nt·gn_bwd_nhwc_scratch(C, G) doubles, a block per thread; team: NULL, or (a batch of
 * fewer samples than threads) [2][GN_PIECES][3][C] doubles, the team's part buffers by sample
 * parity. With team each sample is shared by the team, each thread summing and then mapping a
 * fixed range of its rows; otherwise each thread takes whole samples. The same bits either way
 * (the sums by pieces). */
static void gn_bwd_nhwc(const gn_bwd_t *b, double *scratch, double *team, int nt) {
  const int64_t N = b->N, C = b->C, S = b->S, G = b->G;
  const int64_t P = gn_pieces(S), block = gn_bwd_nhwc_scratch(C, G);
  const int64_t es = sn_dtype_size(b->dtype);
  const int stream0 = sn__stream_out(N * C * S * es);
#pragma omp parallel num_threads(nt) if (N * C * S >= SN_PAR_MIN)
  {
    double *w = scratch + (int64_t)sn__thread_num() * block, *own = w + 4 * C + 3 * G;
    const int stream = gn_map_nt(stream0, team != NULL, S, C, es, 2);
    if (team == NULL) {
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; n++) gn_bwd_sample(b, n, w, own, 0, P, 0, 1, stream);
    } else {
      const int64_t T = sn__team_size(), t = sn__thread_num();
      for (int64_t n = 0; n < N; n++)
        gn_bwd_sample(b, n, w, team + (n & 1) * GN_PIECES * 3 * C, t * P / T, (t + 1) * P / T, 1,
                      t == 0, stream);
    }
    sn__stream_fence(stream);
  }
}

/* ---- public entry point ----------------------------------------------------------------------- */

sn_status_t sn_groupnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                             const float *mean, const float *rstd, const float *gamma, int64_t n,
                             int64_t c, int64_t s, int64_t groups, sn_layout_t layout,
                             sn_dtype_t dtype) {
  static const char fn[] = "sn_groupnorm_bwd";
  sn__args_t args;
  const sn__gn_call_t call = {.dx = dx, .dgamma = dgamma, .dbeta = dbeta, .dy = dy, .x = x,
                              .mean = mean, .rstd = rstd, .gamma = gamma, .n = n, .c = c, .s = s,
                              .groups = groups, .layout = layout, .dtype = dtype};
  SN_TRY(sn__gn_bwd_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) { /* empty batch: the parameter gradients are zero, nothing else is written */
    if (dgamma != NULL) memset(dgamma, 0, (size_t)c * sizeof *dgamma);
    if (dbeta != NULL) memset(dbeta, 0, (size_t)c * sizeof *dbeta);
    return SN_OK;
  }
  sn_status_t st = SN_OK;
  double *wq = NULL, *scratch = NULL, *team = NULL;
  if (dgamma || dbeta) {
    wq = sn__alloc(fn, 2, n * c, (int64_t)sizeof(double), &st); /* [2][N·C] */
    if (wq == NULL) return st;
  }
  const gn_bwd_t b = {dx, wq, dy, x, mean, rstd, gamma, n, c, s, groups, dtype};
  if (layout == SN_LAYOUT_NHWC) {
    int bt;
    const int nt = gn_nhwc_threads(gn_bwd_nhwc_scratch(c, groups), &bt);
    scratch = sn__alloc(fn, nt, gn_bwd_nhwc_scratch(c, groups), (int64_t)sizeof(double), &st);
    if (scratch == NULL ||
        (gn_bwd_split(n, bt) &&
         (team = sn__alloc(fn, 2 * GN_PIECES * 3, c, (int64_t)sizeof(double), &st)) == NULL)) {
      sn__free(scratch);
      sn__free(wq);
      return st;
    }
    gn_bwd_nhwc(&b, scratch, team, nt);
  } else {
    gn_bwd_nchw(&b);
  }
  if (wq) {
#pragma omp parallel for schedule(static) if (n * c >= SN_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) { /* over samples in order */
      double dg = 0.0, db = 0.0;
      for (int64_t i = 0; i < n; i++) dg += wq[i * c + ch], db += wq[n * c + i * c + ch];
      if (dgamma) dgamma[ch] = (float)sn__nan_canon(dg);
      if (dbeta) dbeta[ch] = (float)sn__nan_canon(db);
    }
  }
  sn__free(team);
  sn__free(scratch);
  sn__free(wq);
  return SN_OK;
}
