/*
 * fastcheck.h — the element-wise assertions of testutil.h, calling Check only on failure.
 *
 * Check records every passing ck_assert with a write() to its result pipe (about 4 µs each).
 * tu_assert_fwd / tu_assert_all_finite / tu_assert_bitwise assert once per element (or byte), so
 * the BatchNorm/GroupNorm grids spent minutes in the kernel. These apply exactly the same
 * tolerances (TU_RTOL_F32_FWD, TU_ULPS_HALF, ...) with one Check call per buffer.
 * Static: included by test_batchnorm.c, test_groupnorm.c and test_fold.c.
 */
#ifndef SN_FASTCHECK_H
#define SN_FASTCHECK_H

#include <math.h>
#include <string.h>

#include "testutil.h"

/* ck_assert_msg that costs nothing when it passes (for loops over elements). */
#define FC_CHECK(cond, ...)                    \
  do {                                         \
    if (!(cond)) ck_abort_msg(__VA_ARGS__);    \
  } while (0)

/* As tu_assert_all_finite. */
static inline void fc_finite(const void *got, sn_dtype_t dt, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double v = tu_get(got, i, dt);
    FC_CHECK(isfinite(v), "%s: element %lld is %g (not written, or overflow)", what, (long long)i, v);
  }
  ck_assert(1);
}

/* As tu_assert_fwd: f32 normwise <= TU_RTOL_F32_FWD, bf16/f16 each element within TU_ULPS_HALF
 * ulp of the reference rounded to the dtype; all finite. */
static inline void fc_fwd(const void *got, sn_dtype_t dt, const double *ref, int64_t n,
                          const char *what) {
  fc_finite(got, dt, n, what);
  if (dt == SN_DTYPE_F32) {
    double e = tu_normwise_rel(got, dt, ref, n);
    ck_assert_msg(e <= TU_RTOL_F32_FWD, "%s (f32): normwise relative error %.3e > %.1e", what, e,
                  TU_RTOL_F32_FWD);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    double g = tu_get(got, i, dt), r = tu_round(ref[i], dt), u = tu_ulp_diff(g, r, dt);
    FC_CHECK(u <= TU_ULPS_HALF, "%s (%s): element %lld = %.8g, reference %.8g (rounded %.8g), %g ulp",
             what, tu_dtype_name[dt], (long long)i, g, ref[i], r, u);
  }
}

/* As tu_assert_rel: normwise relative error <= rtol, all finite. */
static inline void fc_rel(const void *got, sn_dtype_t dt, const double *ref, int64_t n, double rtol,
                          const char *what) {
  fc_finite(got, dt, n, what);
  double e = tu_normwise_rel(got, dt, ref, n);
  ck_assert_msg(e <= rtol, "%s (%s): normwise relative error %.3e > %.1e", what, tu_dtype_name[dt],
                e, rtol);
}

/* As tu_assert_bitwise. */
static inline void fc_bitwise(const void *a, const void *b, size_t bytes, const char *what) {
  if (memcmp(a, b, bytes) == 0) return;
  const unsigned char *x = a, *y = b;
  size_t i = 0;
  while (x[i] == y[i]) i++;
  ck_abort_msg("%s: byte %zu differs (0x%02x vs 0x%02x)", what, i, x[i], y[i]);
}

#endif /* SN_FASTCHECK_H */
