/*
 * longrow.h — LayerNorm and RMSNorm (forwards, fused residual adds, backwards) over rows of
 * more than SN_LONG_ROW elements, with scratch that does not grow with d: the row kernels
 * (layernorm.c, layernorm_bwd.c, rmsnorm.c) keep up to a few f32/fp64 copies of a row per
 * thread, which for a row of 2^31 elements is many times the input. Called by the forwards
 * (layernorm.c, rmsnorm.c) and the backwards' driver (rownorm_bwd.c). Not installed.
 */
#ifndef SN_LONGROW_H
#define SN_LONGROW_H

#include "cpu.h"

/* Rows longer than this take the long-row kernels: the row kernels' per-thread scratch (at
 * most ~40 bytes per element of a row) then stays under ~2.6 MB per thread. */
#define SN_LONG_ROW ((int64_t)1 << 16)

static inline int sn__long_row(int64_t d) { return d > SN_LONG_ROW; }

/* The forward and backward of a call a (args.h; already checked by sn__rownorm_fwd_check,
 * sn__rownorm_bwd_check): allocate their scratch, check the buffers' overlap, compute. */
SN_HIDDEN sn_status_t sn__long_rows_fwd(const char *fn, const sn__rn_fwd_t *a);
SN_HIDDEN sn_status_t sn__long_rows_bwd(const char *fn, const sn__rn_bwd_t *a);

#endif /* SN_LONGROW_H */
