/*
 * rownorm_bwd.h — what the LayerNorm and RMSNorm backwards share (layernorm_bwd.c, rmsnorm.c):
 * the call and row structs their row functions take, the driver that runs them
 * (rownorm_bwd.c), their buffers and the fixed-order dgamma/dbeta partials. Not installed.
 */
#ifndef SN_ROWNORM_BWD_H
#define SN_ROWNORM_BWD_H

#include "rownorm.h"

/* Memory a backward row function prefetches during its first pass (see sn__row_shifted_sums):
 * the next row's x and dy for reading, this row's dx for writing (esize bytes per element; NULL
 * for none). */
typedef struct {
  const char *x, *dy;
  char *dx;
  int esize;
  int nt; /* dx streamed (sn__store64) where the block loops write it; dx NULL then */
} sn__bwd_prefetch_t;

/* One row of a row-norm backward as the row kernels see it: the call's gamma and the row's saved
 * statistics. Built per row by the drivers (ln_bwd_store, rms_bwd_store); the kernels read the
 * fields into locals before their loops, so no store through a float pointer makes them reload. */
typedef struct {
  const float *gamma; /* [d] f32, NULL: none */
  const float *gs;    /* bf16 rows with gamma: gamma in pair order (sn__to_pairs); else NULL */
  int64_t d;
  float m, s;  /* the row's saved mean (LayerNorm; 0 for RMSNorm) and rstd */
  float gmax;  /* max|gamma| over the call (NaN skipped), 1 without gamma */
  const sn__bwd_prefetch_t *pf;
} sn__bwd_row_t;

/* Where a row adds its dgamma/dbeta terms: the thread's f32 partials g32, b32 [d] (in pair order
 * for the bf16 pair kernels; SN_PART_ROWS) and the chunk's fp64 partials g64, b64 [d], for rows
 * whose terms the f32 ones cannot hold. All NULL when the call wants neither; b32, b64 NULL for
 * RMSNorm. */
typedef struct {
  float *g32, *b32;
  double *g64, *b64;
} sn__bwd_part_t;

/* A row-norm backward call (sn_layernorm_bwd, sn_rmsnorm_bwd) as its per-row driver sees it:
 * the call's arguments a and what the driver derives from them once. */
typedef struct {
  const sn__rn_bwd_t *a;
  const float *gs; /* as sn__bwd_row_t's */
  float gmax;      /* as sn__bwd_row_t's */
  int nt;          /* dx streamed (sn__stream_out) */
} sn__bwd_call_t;

/* An operation's row function: row r of the call c, its dgamma/dbeta terms added into part,
 * tmp this thread's [2, d] f32 scratch for bf16/f16 (NULL for f32). */
typedef void (*sn__bwd_store_fn)(const sn__bwd_call_t *c, const sn__bwd_part_t *part, int64_t r,
                                 float *tmp);

/* The whole backward call a with the operation's row function store (rownorm_bwd.c): checks,
 * empty batch, long rows, buffers, and the rows over the threads with the parameter partials
 * summed in a fixed order. */
SN_HIDDEN sn_status_t sn__rownorm_bwd_run(const char *fn, const sn__rn_bwd_t *a,
                                          sn__bwd_store_fn store);

/* The buffers sn__bwd_buffers takes: each NULL where not needed. */
typedef struct {
  double *work;
  float *scratch, *gs;
} sn__bwd_bufs_t;

/* The prefetches of the block of SN_PAIR elements at element i: each line of each stream it
 * covers (one of a bf16 row, two of an f32 one). */
SN_INLINE void sn__bwd_prefetch_block(const sn__bwd_prefetch_t *pf, int64_t i) {
  for (int64_t o = i * pf->esize; o < (i + SN_PAIR) * pf->esize; o += 64) {
    if (pf->x != NULL) SN_PF_ROW_READ(pf->x + o);
    if (pf->dy != NULL) SN_PF_ROW_READ(pf->dy + o);
    if (pf->dx != NULL) __builtin_prefetch(pf->dx + o, 1);
  }
}

/* *xv, *dv = the block of SN_PAIR values of x and dy at element i as f32 arrays in block order
 * (sn__block_load_arr): f32 rows read in place, bf16 rows widened into xw, dw [SN_PAIR]. */
SN_INLINE void sn__bwd_block_vals(const float **xv, const float **dv, float *xw, float *dw,
                                  const void *x, const void *dy, int64_t i, int bf16) {
  if (bf16) {
    sn__block_load_arr(xw, x, i, 1);
    sn__block_load_arr(dw, dy, i, 1);
    *xv = xw, *dv = dw;
  } else {
    *xv = (const float *)x + i, *dv = (const float *)dy + i;
  }
}

/* The buffers of the row-backward call a, all taken before anything is written: b->work
 * [threads + 1, work_cols] fp64 when work_cols > 0 (the chunk partials of dgamma/dbeta and their
 * total), b->scratch [threads, per_thread] f32 when per_thread > 0, and, for bf16 rows with
 * gamma, b->gs [d] = gamma in pair order (sn__to_pairs); then the overlap check of a's buffers
 * (sn__rownorm_bwd_spans; after the allocations: the allocation-failure tests pass sizes no
 * buffer has). SN_ERR_ALLOC or SN_ERR_INVALID_ARGUMENT with every pointer left NULL (nothing
 * held). */
SN_UNUSED static sn_status_t sn__bwd_buffers(const char *fn, sn__bwd_bufs_t *b,
                                             const sn__rn_bwd_t *a, int threads,
                                             int64_t work_cols, int64_t per_thread) {
  sn_status_t st = SN_OK;
  *b = (sn__bwd_bufs_t){NULL, NULL, NULL};
  if ((work_cols > 0 &&
       (b->work = sn__alloc(fn, threads + 1, work_cols, sizeof(double), &st)) == NULL) ||
      (per_thread > 0 &&
       (b->scratch = sn__alloc(fn, threads, per_thread, sizeof(float), &st)) == NULL) ||
      (a->dtype == SN_DTYPE_BF16 && a->gamma != NULL &&
       (b->gs = sn__alloc(fn, 1, a->d, sizeof(float), &st)) == NULL) ||
      (st = sn__rownorm_bwd_spans(fn, a, NULL, 0)) != SN_OK) {
    sn__free(b->work), sn__free(b->scratch), sn__free(b->gs);
    *b = (sn__bwd_bufs_t){NULL, NULL, NULL};
    return st;
  }
  if (b->gs != NULL) sn__to_pairs(b->gs, a->gamma, a->d);
  return SN_OK;
}

/* Row r of the call a as f32 rows for the generic row kernels: *x and *dy point at the rows
 * (f32) or at their widened copies in tmp [0, d) and [d, 2d) (bf16/f16), *dx at the f32 row dx
 * is computed in (f32: a's own row; else tmp [d, 2d), over dy's copy), narrowed into a by
 * sn__bwd_views_done. */
SN_INLINE void sn__bwd_views(const sn__rn_bwd_t *a, int64_t r, float *tmp, const float **x,
                             const float **dy, float **dx) {
  const int64_t d = a->d, off = r * d;
  float *tmp_dy = tmp != NULL ? tmp + d : NULL;
  *x = sn__in_row(a->x, off, d, a->dtype, tmp);
  *dy = sn__in_row(a->dy, off, d, a->dtype, tmp_dy);
  *dx = sn__out_row(a->dx, off, a->dtype, tmp_dy); /* may be *dy */
}
/* Narrows row r's dx from the tmp of sn__bwd_views into a (nothing for f32). */
SN_INLINE void sn__bwd_views_done(const sn__rn_bwd_t *a, int64_t r, float *tmp) {
  sn__out_done(a->dx, r * a->d, a->d, a->dtype, tmp != NULL ? tmp + a->d : NULL);
}

/* The row backwards' per-row set-up: row r's prefetches (the next row's x and dy, this row's dx
 * unless it is streamed) into *pf and its sn__bwd_row_t; returns whether dx streams (f32 rows,
 * and bf16 rows whose pair blocks are whole lines; f16 rows are computed in scratch). */
SN_INLINE int sn__bwd_row_setup(sn__bwd_prefetch_t *pf, sn__bwd_row_t *row,
                                const sn__bwd_call_t *c, int64_t r) {
  const sn__rn_bwd_t *a = c->a;
  const int64_t d = a->d, off = r * d, esize = sn_dtype_size(a->dtype);
  const int64_t next = r + 1 < a->rows ? off + d : -1;
  const int nt = c->nt && (a->dtype == SN_DTYPE_F32 ||
                           (a->dtype == SN_DTYPE_BF16 &&
                            sn__aligned64((const uint16_t *)a->dx + off)));
  *pf = (sn__bwd_prefetch_t){next < 0 ? NULL : (const char *)a->x + next * esize,
                             next < 0 ? NULL : (const char *)a->dy + next * esize,
                             nt ? NULL : (char *)a->dx + off * esize, (int)esize, nt};
  *row = (sn__bwd_row_t){a->gamma, c->gs, d, a->mean != NULL ? a->mean[r] : 0.0f, a->rstd[r],
                         c->gmax, pf};
  return nt;
}

/* dgamma/dbeta partials of the row-norm backwards: a row adds its terms (dy·x̂', dy; RMSNorm
 * dy·x·rstd) into per-thread f32 partials [d]; every SN_PART_ROWS rows of a chunk, and at its
 * end, sn__flush_partial adds those into the chunk's fp64 partials and clears them. f32 then
 * sums at most 8 terms per element: < 2^-21 of their magnitudes (dgamma is checked to 2^-19),
 * and the row pass moves 8 bytes of partials per element instead of 16, so the partials stay
 * in L1 beside the rows up to d = 4096. The runs are fixed by the row index: the same sums for
 * any thread count. */
#define SN_PART_ROWS 8
/* Largest term a row may add to the f32 partials: SN_PART_ROWS of them sum to at most 2^126,
 * below FLT_MAX (~2^128). A row with a larger (or non-finite) term adds into the fp64 partials
 * directly instead; the choice depends on the row's data only. */
#define SN_PART_F32_MAX 0x1p123

/* max(m, |v|) as a plain vector max (a NaN v leaves m). */
SN_INLINE float sn__max_abs(float m, float v) {
  const float a = fabsf(v);
  return a > m ? a : m;
}

/* p[j] += p32[j] (fp64) and p32[j] = 0, for j < n. Cloned per ISA in each including file. */
SN_CLONES SN_UNUSED static void sn__flush_partial(double *p, float *p32, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    p[j] += (double)p32[j];
    p32[j] = 0.0f;
  }
}

/* sn__flush_partial for a bf16 row kernel's partials q [d] kept in pair order (each full block
 * of SN_PAIR: its even elements, then its odd ones; the tail as is): p[j] += q[j'] in element
 * order, and q = 0. */
SN_CLONES SN_UNUSED static void sn__flush_pairs(double *p, float *q, int64_t d) {
  int64_t i = 0;
  for (; i + SN_PAIR <= d; i += SN_PAIR)
    for (int m = 0; m < SN_PAIR / 2; m++) {
      p[i + 2 * m] += (double)q[i + m];
      p[i + 2 * m + 1] += (double)q[i + SN_PAIR / 2 + m];
    }
  for (; i < d; i++) p[i] += (double)q[i];
  memset(q, 0, (size_t)d * sizeof *q);
}

/* total[j] += part[j] for j < n (fp64): one chunk's partials added to the running total. */
SN_INLINE void sn__add_partial(double *total, const double *part, int64_t n) {
  for (int64_t j = 0; j < n; j++) total[j] += part[j];
}

/* out[j] = (float)total[j] for j < n. */
static inline void sn__store_f32(float *out, const double *total, int64_t n) {
  for (int64_t j = 0; j < n; j++) out[j] = (float)total[j];
}

#endif /* SN_ROWNORM_BWD_H */
