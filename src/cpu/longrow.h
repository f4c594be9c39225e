/*
 * longrow.h — LayerNorm and RMSNorm (forwards, fused residual adds, backwards) over rows of
 * more than SN_LONG_ROW elements, with scratch that does not grow with d: the row kernels
 * (layernorm.c, layernorm_bwd.c, rmsnorm.c) keep up to a few f32/fp64 copies of a row per
 * thread, which for a row of 2^31 elements is many times the input. Not installed.
 */
#ifndef SN_LONGROW_H
#define SN_LONGROW_H

#include "cpu.h"

/* Rows longer than this take the long-row kernels: the row kernels' per-thread scratch (at
 * most ~40 bytes per element of a row) then stays under ~2.6 MB per thread. */
#define SN_LONG_ROW ((int64_t)1 << 16)

static inline int sn__long_row(int64_t d) { return d > SN_LONG_ROW; }

/* A forward's arguments, as the public call's (already checked by sn__rownorm_fwd_check):
 * rms selects RMSNorm (no mean, no beta); res and sum_out the fused residual add (NULL: none). */
typedef struct {
  void *y, *sum_out;
  float *mean, *rstd;
  const void *x, *res;
  const float *gamma, *beta;
  int64_t rows, d;
  float eps;
  sn_dtype_t dtype;
  int rms;
} sn__long_fwd_t;

/* A backward's arguments (checked by sn__rownorm_bwd_check); rms: RMSNorm (mean, dbeta NULL). */
typedef struct {
  void *dx;
  float *dgamma, *dbeta;
  const void *dy, *x;
  const float *mean, *rstd, *gamma;
  int64_t rows, d;
  sn_dtype_t dtype;
  int rms;
} sn__long_bwd_t;

/* The forward and backward: allocate their scratch, check the buffers' overlap, compute. */
SN_HIDDEN sn_status_t sn__long_rows_fwd(const char *fn, const sn__long_fwd_t *a);
SN_HIDDEN sn_status_t sn__long_rows_bwd(const char *fn, const sn__long_bwd_t *a);

#endif /* SN_LONGROW_H */
