/*
 * groupnorm.c — GroupNorm forward (Wu and He 2018; torch.nn.GroupNorm), and the NHWC sums by
 * pieces of a sample that the backward (groupnorm_bwd.c) shares.
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC), S = H·W; G groups of Cg = C/G consecutive
 * channels; group (n, g) holds L = Cg·S values. mean, rstd: [N, G] f32.
 *
 * Statistics are fp64, one pass of sums shifted by a pivot k (Σ(x − k), Σ(x − k)², see
 * SN_SHIFT_RHO_MAX in rownorm.h), or two passes (mean = Σx/L, then var = Σ(x − mean)²/L) where
 * k lies too far from the mean.
 *   NCHW: a group is one contiguous run of L values. Tasks are the N·G groups; each does its
 *         reductions (f32: one shifted pass, k the mean of the group's first 32 values,
 *         SN_ROW_LANES fixed lanes, prefetching the next group and this group's output; bf16:
 *         the same pass reading the group in pairs, rownorm.h, bitwise the f32 pass on the
 *         widened group; f16: the f32 pass on the group widened once into per-thread scratch,
 *         which the map then reads, for groups of up to GN_F16_WIDE_MAX values, two passes over
 *         converted tiles for larger ones) and writes its Cg output planes while the group is
 *         in cache.
 *   NHWC: a group is strided inside each row. Tasks are the N samples; per-channel column sums
 *         over the S rows (vectorized across channels, fp64: gn_kernels.h), shifted by each
 *         channel's mean over the sample's first rows, give each channel's mean and M2,
 *         combined into groups in channel order (gn_nhwc_stats); then the sample's rows are
 *         normalized. The sums are taken over GN_PIECES fixed pieces of rows, added in piece
 *         order (groupnorm.h), so that a batch of fewer samples than threads, or a sample larger
 *         than a core's L2 (but not than the team's), can be shared by the whole team with the
 *         same bits.
 * The normalization is norm_kernels.h's f32 map y = ((x − hi) − lo)·a + b (for bf16/f16
 * outputs guarded: an element whose f32 value is not finite is recomputed in fp64).
 * Results are bitwise identical for any thread count. "Threads" that share a sample are those
 * that can run at once (sn__concurrent_threads): with more OpenMP threads than processors, each
 * barrier of a shared sample would wait for descheduled threads.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "gn_kernels.h"
#include "groupnorm.h"
#include "norm_kernels.h"
#include "rownorm.h"

/* ---- NHWC sums by pieces ---------------------------------------------------------------------- */

/* The column sums of `kind` over rows [r0, r1) of an [rows, C] activation into acc (+=), channel
 * tile by channel tile (acc's layout: gn_sum_kind_t). */
static void rows_reduce(gn_sum_kind_t kind, double *acc, const void *dy, const void *x,
                        const double *m, int64_t r0, int64_t r1, int64_t C, sn_dtype_t dtype) {
  float tg[SN_TILE], tx[SN_TILE];
  for (int64_t c0 = 0; c0 < C; c0 += SN_TILE_C) {
    const int64_t ct = sn__min64(SN_TILE_C, C - c0), off0 = r0 * C + c0;
    const double *mc = m != NULL ? m + c0 : NULL;
    const int bwd = kind == GN_SUM_BWD;
    if (dtype == SN_DTYPE_BF16) { /* the rows as they are: one call, no f32 tile */
      col_reduce(kind, acc + c0, C, bwd ? (const uint16_t *)dy + off0 : NULL,
                 (const uint16_t *)x + off0, mc, r1 - r0, ct, 1);
      continue;
    }
    const int64_t per = sn__rows_per_block(r1 - r0, C, ct, dtype);
    for (int64_t r = r0; r < r1; r += per) {
      const int64_t nr = sn__min64(per, r1 - r), off = r * C + c0, span = (nr - 1) * C + ct;
      const float *xb = sn__in_row(x, off, span, dtype, tx);
      const float *gb = bwd ? sn__in_row(dy, off, span, dtype, tg) : NULL;
      col_reduce(kind, acc + c0, C, gb, xb, mc, nr, ct, 0);
    }
  }
}

/* Each piece is summed from zero, by rows_reduce. Shared: piece p into part[p·width, ...)
 * (overwritten), then, once the whole team has summed its pieces, every thread adds all of them
 * in piece order. Otherwise piece by piece through part [width], which stays in L1, into acc in
 * piece order: the same additions. */
void sn__gn_sample_sums(const gn_sample_t *sm, gn_sum_kind_t kind, double *acc, int64_t width,
                        const double *m) {
  const int64_t S = sm->S, P = gn_pieces(S);
  if (!sm->shared) memset(acc, 0, (size_t)width * sizeof(double));
  for (int64_t p = sm->p0; p < sm->p1; p++) {
    double *piece = sm->shared ? sm->part + p * width : sm->part;
    memset(piece, 0, (size_t)width * sizeof(double));
    rows_reduce(kind, piece, sm->dy, sm->x, m, sm->r0 + gn_piece_row(S, P, p),
                sm->r0 + gn_piece_row(S, P, p + 1), sm->C, sm->dtype);
    if (!sm->shared)
      for (int64_t i = 0; i < width; i++) acc[i] += piece[i];
  }
  if (!sm->shared) return;
#pragma omp barrier
  memset(acc, 0, (size_t)width * sizeof(double));
  for (int64_t p = 0; p < P; p++)
    for (int64_t i = 0; i < width; i++) acc[i] += sm->part[p * width + i];
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* The arguments of sn_groupnorm_fwd: y, x [N, C, S] or [N, S, C]; gamma, beta [C] or NULL;
 * mean, rstd [N, G] outputs or NULL. */
typedef struct {
  void *y;
  float *mean, *rstd;
  const void *x;
  const float *gamma, *beta;
  int64_t N, C, S, G;
  double eps;
  sn_dtype_t dtype;
} gn_fwd_t;

/* Σ x over elements [off, off+n) in fp64 (fixed lanes; bf16/f16 tile by tile, in order). */
static double span_sum(const void *x, int64_t off, int64_t n, sn_dtype_t dtype) {
  if (dtype == SN_DTYPE_F32) return sn__sum_f64((const float *)x + off, n);
  float t[SN_TILE];
  double s = 0.0;
  for (int64_t i = 0; i < n; i += SN_TILE) {
    int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(t, x, off + i, m, dtype);
    s += sn__sum_f64(t, m);
  }
  return s;
}

/* Σ (x − shift)² over elements [off, off+n) in fp64. */
static double span_sumsq(const void *x, int64_t off, int64_t n, double shift, sn_dtype_t dtype) {
  if (dtype == SN_DTYPE_F32) return sn__sumsq_shifted_f64((const float *)x + off, n, shift);
  float t[SN_TILE];
  double s = 0.0;
  for (int64_t i = 0; i < n; i += SN_TILE) {
    int64_t m = sn__min64(SN_TILE, n - i);
    sn__to_f32(t, x, off + i, m, dtype);
    s += sn__sumsq_shifted_f64(t, m, shift);
  }
  return s;
}

/* Mean and rstd of one NCHW group x [L], f32 or (bf16) bf16: one pass of sums shifted by the
 * mean of its first values, SN_ROW_LANES fp64 lanes, or two passes where that pivot is too far
 * from the mean (sn__row_stats in rownorm.h; a bf16 group gives the bits of its widened copy),
 * prefetching the next group `next` (NULL for none) for reading and this group's output `out`
 * for writing as it goes. One body, an SN_CLONES function per dtype. */
SN_INLINE void gn_group_stats(double *mu, double *rs, const void *x, int64_t L, double eps,
                              const char *next, char *out, int bf16) {
  double m2;
  sn__row_stats(mu, &m2, NULL, x, NULL, L, bf16, (sn__row_pf_t){next, NULL, out, bf16 ? 2 : 4});
  *rs = 1.0 / sqrt(m2 / (double)L + eps);
}
SN_CLONES static void gn_group_stats_f32(double *mu, double *rs, const float *x, int64_t L,
                                         double eps, const char *next, char *out) {
  gn_group_stats(mu, rs, x, L, eps, next, out, 0);
}
SN_CLONES static void gn_group_stats_bf16(double *mu, double *rs, const uint16_t *x, int64_t L,
                                          double eps, const char *next, char *out) {
  gn_group_stats(mu, rs, x, L, eps, next, out, 1);
}

/* f16 NCHW groups of up to GN_F16_WIDE_MAX values are widened once into a per-thread f32 row
 * (gn_fwd_nchw's wide), whose statistics are then the f32 groups' (one shifted pass; the same
 * bits as f32 on the widened x) and which the map reads (sn__aff_span_from_f32): x is widened
 * once instead of three times (two passes of sums and the map over f32 tiles), which larger
 * groups still take. 2^18 floats: 1 MiB a thread. */
#define GN_F16_WIDE_MAX ((int64_t)1 << 18)

/* NCHW, a task per group. wide: f16 with groups of at most GN_F16_WIDE_MAX values, a thread's
 * f32 row of wide_stride floats each; NULL otherwise. */
static void gn_fwd_nchw(const gn_fwd_t *f, float *wide, int64_t wide_stride) {
  const int64_t N = f->N, C = f->C, S = f->S, G = f->G, Cg = C / G, L = Cg * S;
  const sn_dtype_t dtype = f->dtype;
  const void *x = f->x;
  void *y = f->y;
  const int stream = sn__stream_out(N * C * S * (int64_t)sn_dtype_size(dtype));
#pragma omp parallel if (N * C * S >= SN_PAR_MIN)
  {
    float *wf = wide != NULL ? wide + (int64_t)sn__thread_num() * wide_stride : NULL; /* [L] */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N * G; t++) {
      const int64_t n = t / G, g = t % G, off = (n * C + g * Cg) * S;
      double mu, rs;
      if (dtype == SN_DTYPE_F32) {
        const char *next = t + 1 < N * G ? (const char *)((const float *)x + off + L) : NULL;
        gn_group_stats_f32(&mu, &rs, (const float *)x + off, L, f->eps, next,
                           stream ? NULL : (char *)((float *)y + off)); /* streamed: no RFO */
      } else if (dtype == SN_DTYPE_BF16) {
        const char *next = t + 1 < N * G ? (const char *)((const uint16_t *)x + off + L) : NULL;
        gn_group_stats_bf16(&mu, &rs, (const uint16_t *)x + off, L, f->eps, next,
                            (char *)((uint16_t *)y + off)); /* bf16 maps never stream */
      } else if (wf != NULL) {
        sn__to_f32(wf, x, off, L, dtype);
        gn_group_stats_f32(&mu, &rs, wf, L, f->eps, NULL, NULL);
      } else {
        mu = span_sum(x, off, L, dtype) / (double)L;
        rs = 1.0 / sqrt(span_sumsq(x, off, L, mu, dtype) / (double)L + f->eps);
      }
      if (f->mean) f->mean[t] = (float)sn__nan_canon(mu);
      if (f->rstd) f->rstd[t] = (float)sn__nan_canon(rs);
      for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
        sn__chan_k_t k;
        const double gm = f->gamma ? (double)f->gamma[ch] : 1.0;
        sn__chan_k_set(&k, mu, rs * gm, f->beta ? f->beta[ch] : 0.0, 0.0);
        if (wf != NULL) /* f16 from its widened group */
          sn__aff_span_from_f32(y, (n * C + ch) * S, wf + (ch - g * Cg) * S, S, &k, dtype);
        else
          sn__aff_span(y, x, (n * C + ch) * S, S, &k, dtype, stream);
      }
    }
    sn__stream_fence(stream);
  }
}

/* Rows the NHWC pivots average: a sample falls back to two passes when any of its C channels
 * has ρ > SN_SHIFT_RHO_MAX; with the mean of m shuffled rows as pivot, ρ ~ χ²(1)/m, so each
 * channel does with probability P(χ²(1) > m/4): 0.5 % at m = 32 (a quarter of 64-channel
 * samples), 1e-8 at m = 128. */
#define GN_PIVOT_ROWS 128

/* The NHWC group statistics of sample sm (its rows of C channels) into gm, gr [G]: one pass of
 * per-channel sums shifted by a pivot k[c], the channel's mean over the sample's first
 * GN_PIVOT_ROWS rows rounded to f32 (GN_SUM_SHIFTED), giving each channel's mean
 * μ_c = k_c + A_c/S and M2_c = B_c − A_c²/S (A, B: the shifted sums), combined per group without
 * cancellation (Chan et al.): M2_g = Σ_c M2_c + S·(μ_c − μ_g)², μ_g the mean of the μ_c. A
 * channel whose pivot lies more than σ_c/2 from its mean (ρ above SN_SHIFT_RHO_MAX, see
 * rownorm.h), or with anything not finite, sends the sample to the two passes: Σx, then
 * Σ(x − μ_g)². With sm->shared the team's threads call it together and all get the same gm, gr.
 * col: [2][C], k: [C], this thread's; sm->part [2][C] (or the team's [GN_PIECES][2][C]). */
static void gn_nhwc_stats(const gn_fwd_t *f, const gn_sample_t *sm, double *gm, double *gr,
                          double *col, double *k) {
  const int64_t S = f->S, C = f->C, G = f->G, Cg = C / G, L = Cg * S;
  const int64_t pr = sn__min64(S, GN_PIVOT_ROWS); /* k = the mean of the first pr rows, as f32 */
  memset(k, 0, (size_t)C * sizeof(double));
  rows_reduce(GN_SUM_X, k, NULL, f->x, NULL, sm->r0, sm->r0 + pr, C, f->dtype); /* rows in order */
  for (int64_t ch = 0; ch < C; ch++) k[ch] = (double)(float)(k[ch] / (double)pr);
  sn__gn_sample_sums(sm, GN_SUM_SHIFTED, col, 2 * C, k);
  int ok = 1;
  for (int64_t ch = 0; ch < C; ch++) { /* col[ch] = μ_c, col[C + ch] = M2_c */
    const double a = col[ch], m2 = col[C + ch] - a * a / (double)S;
    ok &= a * a <= SN_SHIFT_RHO_MAX * (double)S * m2; /* false for NaN */
    col[ch] = k[ch] + a / (double)S;
    col[C + ch] = m2;
  }
  if (ok) {
    for (int64_t g = 0; g < G; g++) {
      double mu = 0.0, m2 = 0.0;
      for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) mu += col[ch];
      mu /= (double)Cg;
      for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
        const double dm = col[ch] - mu;
        m2 += col[C + ch] + (double)S * dm * dm;
      }
      gm[g] = mu;
      gr[g] = 1.0 / sqrt(m2 / (double)L + f->eps);
    }
    return;
  }
  /* every thread of a team decides alike (the same totals); part is rewritten only once all
   * have read it */
  if (sm->shared) {
#pragma omp barrier
  }
  sn__gn_sample_sums(sm, GN_SUM_X, col, C, NULL);
  for (int64_t g = 0; g < G; g++) {
    double s = 0.0;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) s += col[ch];
    gm[g] = s / (double)L;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) k[ch] = gm[g];
  }
  if (sm->shared) {
#pragma omp barrier
  }
  sn__gn_sample_sums(sm, GN_SUM_SQ, col, C, k);
  for (int64_t g = 0; g < G; g++) {
    double s = 0.0;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) s += col[ch];
    gr[g] = 1.0 / sqrt(s / (double)L + f->eps);
  }
}

/* y over rows [r0, r1) of one sample from its group statistics gm, gr [G]. */
static void gn_nhwc_map(const gn_fwd_t *f, const double *gm, const double *gr, int64_t r0,
                        int64_t r1, int stream) {
  const int64_t C = f->C, Cg = C / f->G;
  sn__chan_tile_t p;
  for (int64_t c0 = 0; c0 < C; c0 += SN_TILE_C) {
    const int64_t ct = sn__min64(SN_TILE_C, C - c0);
    for (int64_t j = 0; j < ct; j++) {
      const int64_t ch = c0 + j, g = ch / Cg;
      const double gmm = f->gamma ? (double)f->gamma[ch] : 1.0;
      sn__tile_set(&p, j, gm[g], gr[g] * gmm, f->beta ? f->beta[ch] : 0.0, 0.0);
    }
    sn__aff_rowspan(f->y, f->x, r0, r1, C, c0, ct, &p, f->dtype, stream);
  }
}

/* Scratch doubles of one thread: col [2][C], k [C], gm, gr [G], part [2][C]. */
static int64_t gn_fwd_nhwc_scratch(int64_t C, int64_t G) { return gn_per_thread(5 * C + 2 * G); }

/* Whether the NHWC forward shares each sample between the threads: fewer samples than nt (the
 * threads that can run at once), or a sample larger than a core's L2 whose share per thread
 * (gn_share_rows) fits it, so that the team reads the sample from memory once, and that has a
 * piece for each thread (nt <= GN_PIECES; else some would idle at every barrier). Where the
 * share is larger too, the map reads it again from L3 or memory either way, and the team's
 * barrier per sample costs more than it saves. */
static int gn_fwd_split(int64_t N, int64_t C, int64_t S, sn_dtype_t dtype, int nt) {
  const int64_t es = sn_dtype_size(dtype), l2 = sn__l2_bytes();
  if (nt <= 1) return 0;
  if (N < nt) return 1;
  return S * C * es > l2 && nt <= gn_pieces(S) && gn_share_rows(S, nt) * C * es <= l2;
}

/* Sample n of the NHWC forward: its statistics (this thread's pieces [p0, p1) into part, added
 * by the team when shared; mean and rstd written when `writer`), then y over the rows of pieces
 * [p0, p1). w: this thread's block (gn_fwd_nhwc_scratch). */
static void gn_fwd_sample(const gn_fwd_t *f, int64_t n, double *w, double *part, int64_t p0,
                          int64_t p1, int shared, int writer, int stream) {
  const int64_t C = f->C, S = f->S, G = f->G, P = gn_pieces(S), r0 = n * S;
  const gn_sample_t sm = {f->x, NULL, S, C, f->dtype, r0, p0, p1, part, shared};
  double *col = w, *k = col + 2 * C, *gm = k + C, *gr = gm + G; /* [2][C], [C], [G], [G] */
  gn_nhwc_stats(f, &sm, gm, gr, col, k);
  if (writer)
    for (int64_t g = 0; g < G; g++) {
      if (f->mean) f->mean[n * G + g] = (float)sn__nan_canon(gm[g]);
      if (f->rstd) f->rstd[n * G + g] = (float)sn__nan_canon(gr[g]);
    }
  gn_nhwc_map(f, gm, gr, r0 + gn_piece_row(S, P, p0), r0 + gn_piece_row(S, P, p1), stream);
}

/* scratch: nt·gn_fwd_nhwc_scratch(C, G) doubles, a block per thread; team (when
 * gn_fwd_split): [2][GN_PIECES][2][C] doubles, the team's part buffers, one per sample parity,
 * so that a thread may sum the next sample's pieces while another still adds this one's. A
 * shared sample is read from memory once, where a sample per thread larger than L2 is read
 * twice (sums, then map); otherwise each thread takes whole samples. The same bits either way
 * (pieces). */
static void gn_fwd_nhwc(const gn_fwd_t *f, double *scratch, double *team, int nt) {
  const int64_t N = f->N, C = f->C, S = f->S, G = f->G;
  const int64_t P = gn_pieces(S), block = gn_fwd_nhwc_scratch(C, G);
  const int64_t es = sn_dtype_size(f->dtype);
  const int stream0 = sn__stream_out(N * C * S * es);
#pragma omp parallel num_threads(nt) if (N * C * S >= SN_PAR_MIN)
  {
    double *w = scratch + (int64_t)sn__thread_num() * block, *own = w + 3 * C + 2 * G;
    const int stream = gn_map_nt(stream0, team != NULL, S, C, es, 1);
    if (team == NULL) {
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; n++) gn_fwd_sample(f, n, w, own, 0, P, 0, 1, stream);
    } else {
      const int64_t T = sn__team_size(), t = sn__thread_num();
      for (int64_t n = 0; n < N; n++)
        gn_fwd_sample(f, n, w, team + (n & 1) * GN_PIECES * 2 * C, t * P / T, (t + 1) * P / T, 1,
                      t == 0, stream);
    }
    sn__stream_fence(stream);
  }
}

sn_status_t sn_groupnorm_fwd(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                             const float *beta, int64_t n, int64_t c, int64_t s, int64_t groups,
                             float eps, sn_layout_t layout, sn_dtype_t dtype) {
  static const char fn[] = "sn_groupnorm_fwd";
  sn__args_t args;
  const sn__gn_call_t call = {.y = y, .mean = mean, .rstd = rstd, .x = x, .gamma = gamma,
                              .beta = beta, .n = n, .c = c, .s = s, .groups = groups, .eps = eps,
                              .layout = layout, .dtype = dtype};
  SN_TRY(sn__gn_fwd_args(&args, fn, &call));
  const int64_t rows = args.rows;
  if (rows == 0) return SN_OK;
  const gn_fwd_t f = {y, mean, rstd, x, gamma, beta, n, c, s, groups, (double)eps, dtype};
  sn_status_t st;
  if (layout == SN_LAYOUT_NCHW) {
    const int64_t L = c / groups * s, stride = sn__line_stride(L, (int64_t)sizeof(float));
    float *wide = NULL;
    if (dtype == SN_DTYPE_F16 && L <= GN_F16_WIDE_MAX &&
        (wide = sn__alloc(fn, sn__max_threads(), stride, (int64_t)sizeof(float), &st)) == NULL)
      return st;
    gn_fwd_nchw(&f, wide, stride);
    sn__free(wide);
    return SN_OK;
  }
  int bt;
  const int nt = gn_nhwc_threads(gn_fwd_nhwc_scratch(c, groups), &bt);
  double *scratch = sn__alloc(fn, nt, gn_fwd_nhwc_scratch(c, groups), (int64_t)sizeof(double), &st);
  if (scratch == NULL) return st;
  double *team = NULL;
  if (gn_fwd_split(n, c, s, dtype, bt) &&
      (team = sn__alloc(fn, 2 * GN_PIECES * 2, c, (int64_t)sizeof(double), &st)) == NULL) {
    sn__free(scratch);
    return st;
  }
  gn_fwd_nhwc(&f, scratch, team, nt);
  sn__free(team);
  sn__free(scratch);
  return SN_OK;
}
