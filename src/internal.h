/*
 * internal.h — error reporting and argument validation shared by src/ and dist/.
 * Not installed. Every public entry point validates with these helpers before its first store,
 * so that a failing call leaves its outputs untouched.
 */
#ifndef SN_INTERNAL_H
#define SN_INTERNAL_H

#include <stdint.h>

#include "syncnorm.h"

/* SN_HIDDEN: internal to the library that defines it. SN_INTERNAL: defined in libsyncnorm and
 * exported for syncnorm's own backend libraries (libsyncnorm_mpi, libsyncnorm_cuda) and tests;
 * not API (no declaration in an installed header, no stability promise). */
#if defined(__GNUC__)
#define SN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define SN_HIDDEN __attribute__((visibility("hidden")))
#define SN_INTERNAL __attribute__((visibility("default")))
#else
#define SN_PRINTF(a, b)
#define SN_HIDDEN
#define SN_INTERNAL
#endif

/* Records "fmt..." as this thread's sn_last_error() message and returns `status`. */
SN_INTERNAL sn_status_t sn__fail(sn_status_t status, const char *fmt, ...) SN_PRINTF(2, 3);
/* Puts "<formatted prefix>: " before the current sn_last_error() message (where it happened,
 * for an error passed up from a lower layer) and returns status. */
SN_INTERNAL sn_status_t sn__fail_prefix(sn_status_t status, const char *fmt, ...) SN_PRINTF(2, 3);

/* Each check returns SN_OK, or records "<fn>: <what is wrong>" and returns the specific code. */

/* p != NULL, else SN_ERR_NULL_POINTER naming the argument. */
SN_INTERNAL sn_status_t sn__check_ptr(const char *fn, const char *name, const void *p);
/* One buffer of a call for sn__check_spans: `bytes` long from p (absent where p is NULL or
 * bytes <= 0), written by the call (out) or only read. may_equal: bit j set where this buffer may
 * be buffer j of the list, listed after it, exactly (the same pointer and length: an in-place
 * pair). */
typedef struct {
  const char *name;
  const void *p;
  int64_t bytes;
  int out;
  unsigned may_equal;
} sn__span_t;
#define SN_SPAN_IN(name, p, bytes) {(name), (p), (bytes), 0, 0u}
#define SN_SPAN_OUT(name, p, bytes, may_equal) {(name), (p), (bytes), 1, (may_equal)}
/* SN_ERR_INVALID_ARGUMENT naming the first pair of the `count` buffers s (in list order) where an
 * output overlaps another buffer, input or output, partly or wholly, other than an allowed
 * in-place pair; inputs may overlap each other. Checked before anything is written: an output
 * over an input changes values the call still reads (the rows or channels not yet done, or, in
 * place partly, the rest of the same buffer), and two outputs over each other leave whichever
 * was written last. syncnorm.h: "No other overlap is allowed". */
SN_INTERNAL sn_status_t sn__check_spans(const char *fn, const sn__span_t *s, int count);
#define SN_SPANS(s) ((int)(sizeof(s) / sizeof((s)[0])))
/* SN_ERR_INVALID_ARGUMENT unless momentum is in [0, 1] or SN_MOMENTUM_CUMULATIVE. */
SN_INTERNAL sn_status_t sn__check_momentum(const char *fn, float momentum);
/* v >= min (min is 0 for counts that may be empty, 1 for d/C/G), else SN_ERR_INVALID_SIZE. */
SN_INTERNAL sn_status_t sn__check_size(const char *fn, const char *name, int64_t v, int64_t min);
/* *out = a·b (both >= 0) without int64 overflow, and a·b·8 bytes addressable; else
 * SN_ERR_OVERFLOW. */
SN_INTERNAL sn_status_t sn__mul(const char *fn, int64_t *out, int64_t a, int64_t b);
/* SN_ERR_OVERFLOW if v elements (a per-channel or per-feature array, which an empty batch still
 * has: gamma, dgamma, the channel sums) are beyond sn__mul's bound of INT64_MAX/8. */
SN_INTERNAL sn_status_t sn__check_elems(const char *fn, const char *name, int64_t v);
/* eps finite and > 0, else SN_ERR_INVALID_EPS. */
SN_INTERNAL sn_status_t sn__check_eps(const char *fn, float eps);
/* dtype is an activation dtype (f32, bf16, f16), else SN_ERR_INVALID_DTYPE. */
SN_INTERNAL sn_status_t sn__check_act_dtype(const char *fn, sn_dtype_t dtype);
/* Every running_var[i], i < c, is >= 0 (NaN passes: it propagates, as in PyTorch), else
 * SN_ERR_INVALID_ARGUMENT naming the first negative one. */
SN_INTERNAL sn_status_t sn__check_running_var(const char *fn, const float *running_var, int64_t c);
/* layout is NCHW or NHWC, else SN_ERR_INVALID_LAYOUT. */
SN_INTERNAL sn_status_t sn__check_layout(const char *fn, sn_layout_t layout);

/* The pivot refinement of a BatchNorm training forward (sn_batchnorm_fwd, SyncBatchNorm): sums
 * shifted by `pivot` over `count` values lost more than 24 bits to cancellation where, with
 * m = sum/count and var = sumsq/count − m², m ≠ 0 and m² > SN_BN_REFINE_RATIO·var. Then sets
 * *refined, the pivot to sum around again, and returns 1; else returns 0 and leaves *refined
 * (NaN sums: 0). `round` counts the sums so far (1: around the caller's pivot):
 *   round 1: (float)(pivot + m), within fp64 reach of the mean (at least 29 of 53 bits kept)
 *            unless the pivot was so far from the data that the sums held nothing of it;
 *   round 2: then 0 (or (float)m where the pivot already is 0): sums around 0 carry the mean to
 *            2^-53 of itself, whatever the previous pivot (a pivot far from the data, 3e38 for
 *            data at 8e6, leaves round 1's pivot at a rounding residue, the variance 11 % off);
 *   round 3: (float)(pivot + m) again; round 4 and on: 0 returned, no more sums (the fourth
 *            sums are around the mean rounded to f32, whose error leaves f32 data's variance
 *            to at least 2^-23).
 * A pivot that is not finite (finite data gives sums that are not) is refined to 0 in any
 * round. */
#define SN_BN_REFINE_RATIO 16777216.0 /* 2^24 */
#define SN_BN_REFINE_ROUNDS 3          /* refinements at most: 4 sums */
SN_HIDDEN int sn__bn_refine(double sum, double sumsq, double count, float pivot, int round,
                            float *refined);
/* The same over C channels: out [C] (=) gets each channel's pivot (pivot [C], NULL = 0), refined
 * where its sums sum, sumsq [C] over count values need it. Returns whether any was. out may equal
 * pivot (not overlap it otherwise) and may not overlap the sums. */
SN_HIDDEN int sn__bn_refine_pivots(float *out, const double *sum, const double *sumsq,
                                   const float *pivot, int64_t c, double count, int round);

/* Evaluate a check and return its status from the calling function if it failed. */
#define SN_TRY(expr)                    \
  do {                                  \
    sn_status_t sn__st_ = (expr);       \
    if (sn__st_ != SN_OK) return sn__st_; \
  } while (0)

#endif /* SN_INTERNAL_H */
