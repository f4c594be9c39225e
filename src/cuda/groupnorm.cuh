/*
 * groupnorm.cuh — what the GroupNorm forward (groupnorm.cu) and backward (groupnorm_bwd.cu)
 * share on the device: the launch arguments, the element addressing and the grid. The CPU twins:
 * src/cpu/groupnorm.c, groupnorm_bwd.c. Internal, not installed; each file that includes it gets
 * its own copy (an unnamed namespace).
 *
 * x is [N, C, S] (NCHW) or [N, S, C] (NHWC); group g of sample n holds the Cg = C/G channels
 * [g·Cg, (g+1)·Cg) over its S positions, L = Cg·S values: contiguous in NCHW, Cg contiguous
 * values in each of the S rows of C in NHWC. Element k < L of a group is, in NCHW, at
 * (n·C + g·Cg)·S + k (channel g·Cg + k/S), in NHWC at (n·S + k/Cg)·C + g·Cg + k%Cg.
 *
 * One block of kThreads threads per (n, g), a grid-stride loop over them.
 */
#ifndef SN_CUDA_GROUPNORM_CUH
#define SN_CUDA_GROUPNORM_CUH

#include <math.h>

#include "common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;

__device__ __forceinline__ double gn_canon(double v) {
  return isnan(v) ? __longlong_as_double(0x7ff8000000000000LL) : v;
}

struct GnArgs {
  void *out;                   /* y (fwd) or dx (bwd) */
  const void *in, *x;          /* fwd: in = x; bwd: in = dy, x */
  float *mean_out, *rstd_out;  /* fwd, [N·G] or NULL */
  const float *mean, *rstd;    /* bwd, [N·G] */
  const float *gamma, *beta;   /* [C] or NULL */
  double *wq;                  /* bwd: [2][N·C] (dgamma terms, dbeta terms) or NULL */
  double eps;
  int64_t n, c, s, g;
  int nhwc;
};

/* Offset of element k of group (n, g) and its channel. */
__device__ __forceinline__ int64_t gn_off(const GnArgs &a, int64_t n, int64_t g, int64_t k,
                                          int64_t *ch) {
  const int64_t cg = a.c / a.g;
  if (a.nhwc) {
    const int64_t row = k / cg, j = k - row * cg;
    *ch = g * cg + j;
    return (n * a.s + row) * a.c + g * cg + j;
  }
  *ch = g * cg + k / a.s;
  return (n * a.c + g * cg) * a.s + k;
}

/* One block per group (n, g), at most kMaxGrid (the kernels loop beyond). */
inline unsigned gn_grid(const GnArgs &a) {
  const int64_t work = a.n * a.g;
  return (unsigned)(work < kMaxGrid ? work : kMaxGrid);
}

} /* namespace */

#endif /* SN_CUDA_GROUPNORM_CUH */
