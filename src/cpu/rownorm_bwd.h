/*
 * rownorm_bwd.h — what the LayerNorm and RMSNorm backwards share (layernorm_bwd.c, rmsnorm.c):
 * their buffers and the fixed-order dgamma/dbeta partials. Not installed.
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
  int nt; /* dx streamed (sn__store64) where the f32 or bf16 pair loops write it; dx NULL then */
} sn__bwd_prefetch_t;

/* The prefetches of the bf16 pair block at element i: one line of each stream. */
SN_INLINE void sn__pair_prefetch(const sn__bwd_prefetch_t *pf, int64_t i) {
  if (pf->x != NULL) SN_PF_ROW_READ(pf->x + i * 2);
  if (pf->dy != NULL) SN_PF_ROW_READ(pf->dy + i * 2);
  if (pf->dx != NULL) __builtin_prefetch(pf->dx + i * 2, 1);
}

/* m[k] = max(m[k], |p[k]|) on the bits, for the 32 bf16 values at p: nonnegative values order
 * as their bits, so the largest is max|p| (NaN bits lie above inf's). In the loop form GCC 12
 * vectorizes (vpmaxuw). */
SN_INLINE void sn__pair_absmax(uint16_t m[SN_PAIR], const uint16_t *p) {
  for (int k = 0; k < SN_PAIR; k++) {
    const uint16_t a = p[k] & 0x7fffu;
    m[k] = a > m[k] ? a : m[k];
  }
}

/* The largest of the 32 maxima m of sn__pair_absmax, as f32 (a bf16 value). */
SN_INLINE float sn__pair_absmax_total(const uint16_t m[SN_PAIR]) {
  uint16_t h = 0;
  for (int k = 0; k < SN_PAIR; k++) h = m[k] > h ? m[k] : h;
  return sn__bf16_to_f32(h);
}

/* The row backwards' buffers, all taken before anything is written: *work [threads + 1,
 * work_cols] fp64 when work_cols > 0 (the chunk partials of dgamma/dbeta and their total),
 * *scratch [threads, per_thread] f32 when per_thread > 0, and, for bf16 rows with gamma, *gs
 * [d] = gamma in pair order (sn__to_pairs); then the overlap check of the call's buffers
 * (sn__rownorm_bwd_spans; after the allocations: the allocation-failure tests pass sizes no
 * buffer has). dgamma, dbeta, dy, x, mean, rstd, gamma, rows, esize: the call's, for that
 * check. SN_ERR_ALLOC or SN_ERR_INVALID_ARGUMENT with every pointer left NULL (nothing held). */
SN_UNUSED static sn_status_t sn__bwd_buffers(const char *fn, double **work, float **scratch,
                                             float **gs, int threads, int64_t work_cols,
                                             int64_t per_thread, const void *dx,
                                             const float *dgamma, const float *dbeta,
                                             const void *dy, const void *x, const float *mean,
                                             const float *rstd, const float *gamma,
                                             int64_t rows, int64_t d, sn_dtype_t dtype) {
  sn_status_t st = SN_OK;
  *work = NULL, *scratch = NULL, *gs = NULL;
  if ((work_cols > 0 &&
       (*work = sn__alloc(fn, threads + 1, work_cols, sizeof(double), &st)) == NULL) ||
      (per_thread > 0 &&
       (*scratch = sn__alloc(fn, threads, per_thread, sizeof(float), &st)) == NULL) ||
      (dtype == SN_DTYPE_BF16 && gamma != NULL &&
       (*gs = sn__alloc(fn, 1, d, sizeof(float), &st)) == NULL) ||
      (st = sn__rownorm_bwd_spans(fn, dx, dgamma, dbeta, dy, x, mean, rstd, gamma, NULL, 0,
                                  rows, d, sn_dtype_size(dtype))) != SN_OK) {
    sn__free(*work), sn__free(*scratch), sn__free(*gs);
    *work = NULL, *scratch = NULL, *gs = NULL;
    return st;
  }
  if (*gs != NULL) sn__to_pairs(*gs, gamma, d);
  return SN_OK;
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

/* acc[k] += (double)v[k] for the 16 floats of the vector v (double acc[16]), in the loop form
 * GCC 12 vectorizes to one vcvtps2pd per 8. */
#define SN_ADD16_F64(acc, v)                                                                  \
  do {                                                                                        \
    float vb_[16];                                                                            \
    memcpy(vb_, &(v), sizeof vb_);                                                            \
    for (int k_ = 0; k_ < 16; k_++) (acc)[k_] += (double)vb_[k_];                             \
  } while (0)

/* total[j] += part[j] for j < n (fp64): one chunk's partials added to the running total. */
SN_INLINE void sn__add_partial(double *total, const double *part, int64_t n) {
  for (int64_t j = 0; j < n; j++) total[j] += part[j];
}

/* out[j] = (float)total[j] for j < n. */
static inline void sn__store_f32(float *out, const double *total, int64_t n) {
  for (int64_t j = 0; j < n; j++) out[j] = (float)total[j];
}

#endif /* SN_ROWNORM_BWD_H */
