/*
 * syncnorm.h — status codes, dtypes and the CPU normalization kernels.
 *
 * Conventions shared by every function in this header (each docstring only states exceptions):
 *  - Argument order: outputs first, then inputs, then int64_t sizes, then scalars (eps, ...),
 *    then layout and dtype last.
 *  - All pointers are host memory. Activations (x, y, dy, dx, residual, sum_out) have the dtype
 *    `dtype` (f32, bf16 or f16) and are dense row-major; gamma/beta, their gradients, mean, rstd
 *    and running statistics are f32; BatchNorm building-block sums and means are f64.
 *  - Sizes are int64_t element counts. rows == 0 or n·s == 0 is a valid empty batch: SN_OK,
 *    activations and per-row/per-sample statistics (mean/rstd written by a forward or read by a
 *    backward) are not accessed (their pointers may be NULL),
 *    and parameter gradients and per-channel sums (dgamma, dbeta, BatchNorm sums) are written as
 *    zeros, the gradient of an empty batch. Its other arguments are still validated.
 *  - Every output is overwritten (`=`); nothing accumulates. dgamma/dbeta in particular are
 *    written, not added to: sum them yourself when gradients come from several calls.
 *  - On any error nothing is written: every check happens before the first store, and the
 *    status names the problem (see sn_status_t) with a detail message in sn_last_error().
 *  - Forward statistics are computed in fp64 from fp32 (or widened bf16/f16) values, as sums
 *    shifted by a pivot taken from the data (with a two-pass fallback where the pivot is far
 *    from the mean) or in two passes, never E[x²]−E[x]² in fp32; the output is rounded to
 *    `dtype` once, round-to-nearest-even. eps is added to the variance (PyTorch convention).
 *    Backward sums: see each function.
 *  - Accuracy (docs/SEMANTICS.md): an f32 forward output errs by a few f32 roundings of
 *    |x̂·gamma| + |beta| (where beta cancels x̂·gamma, that is more than of y itself), plus the
 *    mean's own error times rstd·|gamma|: the mean is held to about 2^-48 relative, so where
 *    |mean| ≫ σ an element near the mean errs by up to ~2^-48·|mean|·rstd·|gamma|; a bf16/f16
 *    forward output y is within max(1 ulp of y_exact, 2^-16·(|x̂·gamma| + |beta|)) of the exact
 *    value. An f32 output whose x̂·gamma overflows f32 is ±inf even where
 *    beta would bring y back into range. dx of a backward is accurate relative to the size of
 *    its terms, ‖rstd·dy·gamma‖, not to dx itself, which can cancel to ~0 (dy proportional to
 *    x̂); dgamma/dbeta relative to their own size, except LayerNorm's dgamma, whose x̂ errs by
 *    about 2^-24 of its row's largest |x̂|: relative to Σ_rows |dy|·max_row|x̂| (an element near
 *    its row's mean, x̂ ≈ 0, has a dgamma term correct only to that). In BatchNorm's and
 *    GroupNorm's backward, a dx whose term rstd·gamma·dy (or x̂ times the sums' term) overflows
 *    f32 is likewise ±inf even where the other terms bring dx back into range; LayerNorm and
 *    RMSNorm compute such rows in fp64. At the other end, LayerNorm and RMSNorm form g = dy·gamma
 *    in f32 before scaling it by rstd: where g is below the normal f32 range (|g| < 2^-126)
 *    while rstd·g is not, dx errs by up to 2^-150·rstd absolute (all of it where g underflows
 *    to 0); BatchNorm and GroupNorm fold rstd·gamma first. A bf16/f16 dx within the f32 error
 *    above of its format's largest value (65504 for f16) can round to ±inf.
 *  - OpenMP threads (omp_set_num_threads) split rows or channels; reductions across rows run in
 *    a fixed order, so results are bitwise identical for any thread count. Where an input holds
 *    NaNs, outputs are NaN, but which NaN (sign, payload) is unspecified: it can differ between
 *    builds of the library, with the buffers' alignment and with streaming stores on or off
 *    (below), not with the thread count. BatchNorm's per-channel outputs (sums, mean, var,
 *    rstd, backward sums, dgamma, dbeta) and GroupNorm's mean, rstd, dgamma and dbeta that are
 *    NaN are always the quiet NaN NAN (positive, payload 0): the thread count picks between
 *    code paths there (BatchNorm's fused and unfused passes, GroupNorm NHWC samples shared by
 *    a team of threads or not), whose separately compiled sums could otherwise pick different
 *    operands' NaNs.
 *  - In-place: y may equal x, and dx may equal dy (the same pointer); a function names any
 *    other pair it allows. No other overlap is allowed: an output that overlaps any other buffer
 *    of the call, input or output, partly or as the same pointer (y one element into x, y over
 *    gamma, rstd over mean, dx over x), is SN_ERR_INVALID_ARGUMENT with nothing written. Every
 *    buffer passed is checked, at the size the call gives it; inputs may overlap each other. The
 *    "y overlaps x partly" of the error lists below stands for all of these.
 *  - Streaming (non-temporal) stores (x86-64 only): off by default but for the f32 dx of the
 *    BatchNorm training backward (sn_batchnorm_bwd, sn_batchnorm_bwd_apply) from 16 MiB. The
 *    environment variable SN_STREAM_MIN_BYTES=N (a byte count, read once per process) replaces
 *    that default: every output y or dx of at least N bytes is written with them (0: every
 *    output; not the LayerNorm/RMSNorm rows of more than 65536 elements): faster where memory
 *    bandwidth bounds the call on some CPUs, slower on others, and the output is then not in
 *    the cache for the next layer. A value that is not a whole number of bytes (digits only) is ignored with one line
 *    on stderr. The values written are the same either way, but for the sign of NaN outputs
 *    from NaN inputs (above).
 */
#ifndef SYNCNORM_H
#define SYNCNORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SN_API __attribute__((visibility("default")))
#else
#define SN_API
#endif

/* Status returned by every public function. SN_OK is 0; errors are positive. */
typedef enum {
  SN_OK = 0,
  SN_ERR_NULL_POINTER = 1,        /* a required pointer is NULL */
  SN_ERR_INVALID_SIZE = 2,        /* d, C, G or per_out <= 0, or rows, N, S < 0 */
  SN_ERR_OVERFLOW = 3,            /* a product of sizes (elements or bytes) overflows int64 */
  SN_ERR_INVALID_EPS = 4,         /* eps <= 0, NaN or infinite */
  SN_ERR_INVALID_GROUPS = 5,      /* C % G != 0 */
  SN_ERR_INVALID_DTYPE = 6,       /* unknown or unsupported dtype */
  SN_ERR_INVALID_LAYOUT = 7,      /* unknown layout */
  SN_ERR_INSUFFICIENT_COUNT = 8,  /* BatchNorm training needs more than 1 value per channel */
  SN_ERR_INVALID_ARGUMENT = 9,    /* any other bad argument (momentum, config field, ...) */
  SN_ERR_ALLOC = 10,              /* out of memory */
  SN_ERR_MISMATCH = 11,           /* ranks disagree on a collective call (layer, C, order, ...) */
  SN_ERR_COMM = 12,               /* the communication backend (MPI, NCCL) reported an error */
  SN_ERR_TIMEOUT = 13,            /* a collective did not complete within the timeout */
  SN_ERR_NONFINITE = 14,          /* NaN or Inf found in an input checked for it */
  SN_ERR_IO = 15,                 /* a file could not be opened, read, written or renamed */
  SN_ERR_FORMAT = 16,             /* a file is corrupt, truncated or not what was expected */
  SN_ERR_NOT_FOUND = 17,          /* a tensor name is missing from a checkpoint */
  SN_ERR_UNSUPPORTED = 18,        /* the library was built without the needed backend */
  SN_ERR_INVALID_HANDLE = 19,     /* a handle is not (or no longer) a live object of its type */
  SN_ERR_CUDA = 20,               /* a CUDA runtime call failed */
  SN_ERR_INTERNAL = 21            /* a bug in syncnorm: please report */
} sn_status_t;

/* Element type of activations. Parameters and statistics are always f32 (or f64 where noted). */
typedef enum {
  SN_DTYPE_F32 = 0,   /* IEEE binary32 */
  SN_DTYPE_BF16 = 1,  /* bfloat16: the upper 16 bits of a binary32 */
  SN_DTYPE_F16 = 2,   /* IEEE binary16 */
  SN_DTYPE_F64 = 3    /* binary64: only for sn_comm_allreduce_sum, not for activations */
} sn_dtype_t;

/* Memory layout of a 4-D activation [N, C, H, W], with S = H·W the spatial size. */
typedef enum {
  SN_LAYOUT_NCHW = 0, /* [N, C, S]: channel planes contiguous (PyTorch default) */
  SN_LAYOUT_NHWC = 1  /* [N, S, C]: channels contiguous (channels_last) */
} sn_layout_t;

/* Name of a status code ("SN_ERR_INVALID_EPS"); never NULL, "SN_ERR_UNKNOWN" for values outside
 * the enum. The string is static: do not free it. Thread-safe. */
SN_API const char *sn_status_string(sn_status_t status);

/* Detail message of the most recent failed call made by this thread, e.g.
 * "sn_layernorm_fwd: d must be >= 1, got 0"; "" if no call failed yet in this thread. Successful
 * calls leave it unchanged. The buffer is thread-local and valid until this thread's next failing
 * call. */
SN_API const char *sn_last_error(void);

/* Version of the library as "MAJOR.MINOR.PATCH"; static string. */
SN_API const char *sn_version(void);

/* Bytes of one element of `dtype`: 4, 2, 2 or 8; 0 for an unknown dtype. */
SN_API int64_t sn_dtype_size(sn_dtype_t dtype);

/* ------------------------------------------------------------------------------------------ */
/* LayerNorm (Ba, Kiros, Hinton 2016; torch.nn.LayerNorm over the last dimension)               */
/* ------------------------------------------------------------------------------------------ */

/* LayerNorm forward over each row of x [rows, d]:
 *   mean = Σx/d, var = Σ(x−mean)²/d (biased), rstd = 1/√(var+eps), y = (x−mean)·rstd·gamma + beta.
 * y, x: [rows, d] dtype. gamma, beta: [d] f32, NULL means 1 (no affine) / 0 (no bias).
 * mean, rstd: [rows] f32, written (=) for sn_layernorm_bwd; either may be NULL (not saved).
 * The statistics take one fp64 pass over the row, summing t = x − K and t², K the mean of the
 * row's first 32 values (rounded to f32; mean = K + Σt/d, d·var = Σt² − (Σt)²/d), or two fp64
 * passes (Σx, then Σ(x−mean)²) for a row whose K lies more than σ/2 from its mean, where the
 * shifted sums would cancel, or that holds a non-finite value. y is computed in f32 from the
 * fp64 statistics (mean as hi + lo), in fp64 for rows whose mean is 2^103 or more (values near
 * the f32 range) or below 2^-100, and for every row where √d·max|gamma| + max|beta| exceeds
 * 2^127 (an f32 x̂·gamma could overflow where y does not). Rows of more than 65536 elements
 * take two fp64 passes for the statistics and map in fp64, block by block.
 * Scratch (allocated per call, freed before it returns): rows of up to 65536 elements, for
 * bf16 2·d floats (gamma and beta in the order the bf16 kernel reads them) plus d per thread,
 * for f16 2·d floats per thread, for f32 none; longer rows, one fp64 value per block of up to
 * 4096 elements of each row, two per row and, for bf16/f16, two blocks of 4096 floats per
 * thread, whatever d.
 * y may equal x. Errors: SN_ERR_NULL_POINTER (x or y NULL with rows·d > 0), SN_ERR_INVALID_SIZE
 * (rows < 0, d <= 0), SN_ERR_OVERFLOW, SN_ERR_INVALID_EPS, SN_ERR_INVALID_DTYPE,
 * SN_ERR_INVALID_ARGUMENT (y overlaps x partly), SN_ERR_ALLOC. */
SN_API sn_status_t sn_layernorm_fwd(void *y, float *mean, float *rstd, const void *x,
                                    const float *gamma, const float *beta, int64_t rows,
                                    int64_t d, float eps, sn_dtype_t dtype);

/* LayerNorm backward, with g = dy·gamma and x̂ = (x−mean)·rstd (x̂ re-centred to mean 0 per row,
 * so an f32-rounded mean loses nothing when |mean| ≫ σ):
 *   dx = rstd·(g − mean(g) − x̂·mean(g·x̂)),  dgamma = Σ_rows dy·x̂,  dbeta = Σ_rows dy.
 * dx, dy, x: [rows, d] dtype; mean, rstd: [rows] f32 from sn_layernorm_fwd on this x;
 * gamma: [d] f32 or NULL (= 1). dgamma, dbeta: [d] f32, overwritten (=), either may be NULL (not
 * computed); summed over rows in a fixed order (f32 within runs of 8 rows, the runs in fp64).
 * The per-row sums are fp64 (bf16/f16: f32 lanes of at most 16 terms each per block, the
 * blocks in fp64). Rows with terms near the f32 range add them to the fp64 sums directly; such
 * bf16 rows, and rows of any dtype whose saved mean is 2^103 or more, are computed in fp64
 * throughout. Rows of more than 65536 elements are computed in fp64 throughout, dgamma and
 * dbeta summed over the rows in row order per column.
 * Scratch: rows of up to 65536 elements, per thread of the team (one per chunk of rows, at
 * most 64) 2·d fp64 and 2·d floats with dgamma/dbeta, 2·d floats more for bf16/f16, plus 2·d
 * fp64 (and d floats for bf16 with gamma); longer rows, three fp64 values per block of up to
 * 4096 elements of each row, three per row and seven blocks of 4096 floats per thread, whatever
 * d. dx may equal dy.
 * Errors as sn_layernorm_fwd (without eps), SN_ERR_NULL_POINTER also for mean/rstd (NULL with
 * rows·d > 0). */
SN_API sn_status_t sn_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy,
                                    const void *x, const float *mean, const float *rstd,
                                    const float *gamma, int64_t rows, int64_t d,
                                    sn_dtype_t dtype);

/* Fused residual add + LayerNorm forward, one pass over memory per row (three for rows of more
 * than 65536 elements):
 *   sum_out = round_dtype(x + residual),  y = LayerNorm(sum_out) as in sn_layernorm_fwd.
 * The norm reads the rounded sum_out values, so the result equals sn_layernorm_fwd on sum_out.
 * y, sum_out, x, residual: [rows, d] dtype; sum_out may equal x or residual, y may not overlap
 * anything (SN_ERR_INVALID_ARGUMENT). gamma, beta, mean, rstd as sn_layernorm_fwd. Errors as
 * sn_layernorm_fwd. */
SN_API sn_status_t sn_add_layernorm_fwd(void *y, void *sum_out, float *mean, float *rstd,
                                        const void *x, const void *residual, const float *gamma,
                                        const float *beta, int64_t rows, int64_t d, float eps,
                                        sn_dtype_t dtype);

/* ------------------------------------------------------------------------------------------ */
/* RMSNorm (Zhang and Sennrich 2019; torch.nn.RMSNorm of PyTorch 2.4 on, not in 1.13)           */
/* ------------------------------------------------------------------------------------------ */

/* RMSNorm forward over each row of x [rows, d]:  rstd = 1/√(Σx²/d + eps),  y = x·rstd·gamma.
 * y, x: [rows, d] dtype; gamma: [d] f32 or NULL (= 1); rstd: [rows] f32 (=) or NULL.
 * Σx² in fp64 (bf16/f16: f32 blocks of 16 squares per lane added in fp64, relative error below
 * 2^-19.9, so rstd to 2^-20.9; fp64 where squares leave the f32 range); y = (x·rstd)·gamma in
 * f32 (an x·rstd below the normal f32 range loses bits before a large gamma scales it back).
 * Rows of more than 65536 elements as sn_layernorm_fwd's (fp64, block by block). Scratch:
 * rows of up to 65536 elements, d floats for bf16 (gamma in pair order), d per thread for f16,
 * none for f32; longer rows as sn_layernorm_fwd's. y may equal x. Errors as sn_layernorm_fwd. */
SN_API sn_status_t sn_rmsnorm_fwd(void *y, float *rstd, const void *x, const float *gamma,
                                  int64_t rows, int64_t d, float eps, sn_dtype_t dtype);

/* RMSNorm backward, with g = dy·gamma:
 *   dx = rstd·g − rstd³·x·mean(g·x),  dgamma = Σ_rows dy·x·rstd,
 * computed as dx = rstd·g − x̂·e with x̂ = x·rstd, e = rstd·mean(g·x̂), so no f32 factor leaves
 * the range unless dx's own terms do, whatever the RMS or eps. dx, dy, x: [rows, d] dtype;
 * rstd: [rows] f32 from sn_rmsnorm_fwd; gamma: [d] f32 or NULL. dgamma: [d] f32 (=) or NULL,
 * summed over rows as sn_layernorm_bwd's; the per-row sum Σg·x is fp64. Rows whose dy·gamma
 * exceeds the f32 range, whose terms may reach 2^127 (bounded with the row's max|dy|, max|x|
 * and max|gamma|), or whose e is subnormal in f32, are computed in fp64; a g = dy·gamma below
 * the normal range is not (see the accuracy notes at the top). Rows of more than 65536
 * elements as sn_layernorm_bwd's (fp64). Scratch: rows of up to 65536 elements, per thread
 * of the team d fp64 and d floats with dgamma, 2·d floats more for bf16/f16, plus d fp64 (and
 * d floats for bf16 with gamma); longer rows as sn_layernorm_bwd's. dx may equal dy. Errors as
 * sn_layernorm_bwd. */
SN_API sn_status_t sn_rmsnorm_bwd(void *dx, float *dgamma, const void *dy, const void *x,
                                  const float *rstd, const float *gamma, int64_t rows, int64_t d,
                                  sn_dtype_t dtype);

/* Fused residual add + RMSNorm forward: sum_out = round_dtype(x + residual),
 * y = RMSNorm(sum_out). Shapes, aliasing and errors as sn_add_layernorm_fwd. */
SN_API sn_status_t sn_add_rmsnorm_fwd(void *y, void *sum_out, float *rstd, const void *x,
                                      const void *residual, const float *gamma, int64_t rows,
                                      int64_t d, float eps, sn_dtype_t dtype);

/* ------------------------------------------------------------------------------------------ */
/* BatchNorm building blocks (Ioffe and Szegedy 2015; torch.nn.BatchNorm2d)                     */
/*                                                                                              */
/* x is [N, C, S] (NCHW) or [N, S, C] (NHWC). A training step is                                */
/*   sn_batchnorm_stats → (all-reduce the sums across ranks) → sn_batchnorm_finalize →          */
/*   sn_batchnorm_apply, or sn_batchnorm_fwd where there is no all-reduce (and                  */
/*   sn_batchnorm_update_running); backward: sn_batchnorm_bwd_reduce →                          */
/*   (all-reduce) → sn_batchnorm_bwd_apply, or sn_batchnorm_bwd where there is no all-reduce.   */
/* Per-channel sums and the mean are f64 so that |mean| ≫ σ stays exact; rstd is f32.           */
/* ------------------------------------------------------------------------------------------ */

/* Local per-channel sums, shifted by a pivot p (identical on every rank in SyncBatchNorm):
 *   sum[c] = Σ_{n,s} (x − p_c),  sumsq[c] = Σ_{n,s} (x − p_c)²   (fp64, =).
 * The count is n·s per channel. Choose p_c near the channel mean (e.g. the previous batch mean):
 * the variance is exact to fp64 rounding times (1 + (mean−p)²/var) (the shifted-data algorithm,
 * Chan, Golub and LeVeque 1983). pivot: [C] f32, NULL = 0.
 * n == 0 or s == 0 is valid (sums written as 0). The sums are added in a fixed order of
 * chunks of rows, so they are bitwise the same for any thread count and either layout.
 * Scratch: the chunks' sums, 16·K bytes per channel with K <= max(1, n·s/64) and K < 128, and
 * for NHWC (or s == 1) 17·256 doubles per thread.
 * Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE (C <= 0, N or S < 0), SN_ERR_OVERFLOW,
 * SN_ERR_INVALID_LAYOUT, SN_ERR_INVALID_DTYPE, SN_ERR_INVALID_ARGUMENT (an output overlaps
 * another array), SN_ERR_ALLOC (the scratch). */
SN_API sn_status_t sn_batchnorm_stats(double *sum, double *sumsq, const void *x,
                                      const float *pivot, int64_t n, int64_t c, int64_t s,
                                      sn_layout_t layout, sn_dtype_t dtype);

/* Batch statistics from (global) shifted sums over `count` values per channel:
 *   mean = p + sum/count (f64),  var = sumsq/count − (sum/count)² (biased, clamped at 0),
 *   rstd = 1/√(var + eps).
 * mean: [C] f64 (=); var: [C] f32 (=) or NULL; rstd: [C] f32 (=). sum, sumsq: [C] f64; pivot as
 * in sn_batchnorm_stats. count <= 1 → SN_ERR_INSUFFICIENT_COUNT, as PyTorch's "Expected more than
 * 1 value per channel when training". Other errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE,
 * SN_ERR_OVERFLOW (C beyond INT64_MAX/8), SN_ERR_INVALID_EPS, SN_ERR_INVALID_ARGUMENT (an
 * output overlaps another array). */
SN_API sn_status_t sn_batchnorm_finalize(double *mean, float *var, float *rstd, const double *sum,
                                         const double *sumsq, const float *pivot, int64_t count,
                                         int64_t c, float eps);

/* momentum value meaning PyTorch's momentum=None: cumulative average, factor 1/num_batches. */
#define SN_MOMENTUM_CUMULATIVE (-1.0f)

/* The running statistics update of a BatchNorm training step (torch.nn.BatchNorm2d's), from the
 * batch statistics of sn_batchnorm_finalize over `count` values per channel:
 *   num_batches_tracked += 1 (saturating at INT64_MAX), f = momentum, or 1/num_batches_tracked
 *   with momentum SN_MOMENTUM_CUMULATIVE (PyTorch's momentum=None: the cumulative average),
 *   running_mean = (1 − f)·running_mean + f·mean,
 *   running_var  = (1 − f)·running_var + f·var·count/(count − 1)   (var unbiased, in fp64).
 * running_mean, running_var: [C] f32, updated in place; num_batches_tracked: one int64, updated
 * in place, may be NULL unless momentum is SN_MOMENTUM_CUMULATIVE. mean: [C] f64, var: [C] f32
 * (biased), both from sn_batchnorm_finalize. count == 0 (an empty global batch) only counts the
 * batch, as PyTorch's module forward does before normalizing; count == 1 is
 * SN_ERR_INSUFFICIENT_COUNT (no such training step exists). NaN statistics propagate. Host
 * memory. Errors (nothing written): SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE (C <= 0, count < 0),
 * SN_ERR_OVERFLOW (C beyond INT64_MAX/8), SN_ERR_INSUFFICIENT_COUNT, SN_ERR_INVALID_ARGUMENT
 * (momentum not in [0, 1] and not SN_MOMENTUM_CUMULATIVE, num_batches_tracked < 0, or an
 * output overlapping another array). SyncBatchNorm (syncnorm_dist.h) calls it
 * with the global count. */
SN_API sn_status_t sn_batchnorm_update_running(float *running_mean, float *running_var,
                                               int64_t *num_batches_tracked, const double *mean,
                                               const float *var, int64_t count, int64_t c,
                                               float momentum);

/* Normalize with given per-channel statistics:  y = (x − mean_c)·rstd_c·gamma_c + beta_c.
 * y, x: [N, C, S] or [N, S, C] dtype; mean: [C] f64; rstd: [C] f32; gamma, beta: [C] f32 or NULL
 * (1 / 0). Computed in f32 with the mean as two floats (exact when |mean| ≫ σ); in fp64 for a
 * channel whose mean is 2^103 or more (there x − mean can overflow f32) or whose factor
 * gamma·rstd is subnormal in f32 (σ near the f32 range), and, for bf16/f16 y, for the elements
 * whose f32 value is not finite (x̂·gamma beyond the f32 range where beta brings y back; a mean
 * below ~2^-102 is mapped in fp64 too): each bf16/f16 output is within the bf16/f16 bound above
 * of the formula applied exactly to the given mean and rstd. The same holds for sn_batchnorm_infer,
 * sn_batchnorm_bwd_apply (also in fp64 where its O(rstd²) factor underflows f32, σ beyond
 * about 2^63) and GroupNorm. y may equal x. Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE,
 * SN_ERR_OVERFLOW, SN_ERR_INVALID_LAYOUT, SN_ERR_INVALID_DTYPE, SN_ERR_INVALID_ARGUMENT (y
 * overlaps x partly). */
SN_API sn_status_t sn_batchnorm_apply(void *y, const void *x, const double *mean,
                                      const float *rstd, const float *gamma, const float *beta,
                                      int64_t n, int64_t c, int64_t s, sn_layout_t layout,
                                      sn_dtype_t dtype);

/* Local BatchNorm training forward, with nothing to all-reduce (one process, or
 * torch.nn.BatchNorm2d in training mode, PyTorch's native_batch_norm with training=True, without
 * the running statistics: call sn_batchnorm_update_running with count n·s for them). Per channel
 * c, over its count = n·s values:
 *   sum = Σ (x − p_c), sumsq = Σ (x − p_c)² around the pivot p (sn_batchnorm_stats); where those
 *   lost more than 24 bits to cancellation, (mean − p_c)² > 2^24·var, summed again around
 *   p_c + (mean − p_c) rounded to f32 (SyncBatchNorm's refinement, per channel); where those
 *   sums lost as much again (p_c so far from the data that the first sums held nothing of it),
 *   once more around 0 and then around that mean rounded to f32: at most four sums; a pivot
 *   that is not finite gives non-finite first sums and is then refined to 0;
 *   mean, var (biased), rstd = 1/√(var + eps) as sn_batchnorm_finalize;
 *   y = (x − mean_c)·rstd_c·gamma_c + beta_c as sn_batchnorm_apply (its accuracy notes hold).
 * y, x: [N, C, S] or [N, S, C] as layout, dtype, host memory; y overwritten (=), may equal x.
 * mean: [C] f64 (=); var: [C] f32 (=) biased, or NULL; rstd: [C] f32 (=); pivot: [C] f32 or
 * NULL (= 0), best near the channel means (e.g. the previous batch's mean, as SyncBatchNorm
 * keeps it); gamma, beta: [C] f32 or NULL (1 / 0). mean, var and rstd may not overlap each
 * other, pivot, gamma, beta, x or y (SN_ERR_INVALID_ARGUMENT). The results
 * are bitwise those of sn_batchnorm_stats, the refinement above (summing again with the refined
 * pivots where any channel needs it), sn_batchnorm_finalize and sn_batchnorm_apply, for any
 * thread count. Where x fits in the threads' L2 caches (NCHW, s > 1), blocks of channels may be
 * summed and mapped while in the cache, with no scratch; otherwise scratch of 20 bytes per
 * channel (the sums and refined pivots) plus sn_batchnorm_stats's.
 * Errors (outputs untouched): SN_ERR_INSUFFICIENT_COUNT (n·s <= 1, as sn_batchnorm_finalize),
 * SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE, SN_ERR_OVERFLOW, SN_ERR_INVALID_EPS,
 * SN_ERR_INVALID_LAYOUT, SN_ERR_INVALID_DTYPE, SN_ERR_INVALID_ARGUMENT (y overlaps x partly,
 * or a [C] output overlaps another array, x and y included), SN_ERR_ALLOC (the scratch). */
SN_API sn_status_t sn_batchnorm_fwd(void *y, double *mean, float *var, float *rstd, const void *x,
                                    const float *pivot, const float *gamma, const float *beta,
                                    int64_t n, int64_t c, int64_t s, float eps, sn_layout_t layout,
                                    sn_dtype_t dtype);

/* Inference (eval mode) with running statistics:
 *   y = (x − running_mean_c)/√(running_var_c + eps)·gamma_c + beta_c.
 * running_mean, running_var: [C] f32 (running_var unbiased, as PyTorch keeps it); gamma, beta:
 * [C] f32 or NULL. y may equal x. Errors as sn_batchnorm_apply plus SN_ERR_INVALID_EPS and
 * SN_ERR_INVALID_ARGUMENT (a running_var < 0; checked only for a non-empty batch). A NaN
 * running_var is not an error: its channel's outputs are NaN, as in PyTorch (running statistics
 * of a training run that met NaN data). */
SN_API sn_status_t sn_batchnorm_infer(void *y, const void *x, const float *running_mean,
                                      const float *running_var, const float *gamma,
                                      const float *beta, int64_t n, int64_t c, int64_t s,
                                      float eps, sn_layout_t layout, sn_dtype_t dtype);

/* Local backward sums, with x̂ = (x − mean_c)·rstd_c:
 *   sum_dy[c] = Σ_{n,s} dy,  sum_dy_xhat[c] = Σ_{n,s} dy·x̂   (fp64, =).
 * They are dbeta and dgamma of this rank's batch (round to f32 for the parameter gradients).
 * dy, x: [N, C, S] or [N, S, C] dtype; mean: [C] f64; rstd: [C] f32. n·s == 0 writes zeros.
 * Summation order and scratch as sn_batchnorm_stats. Errors as sn_batchnorm_stats
 * (SN_ERR_ALLOC included). apply, infer and bwd_apply need no scratch, so they cannot fail once
 * their arguments are valid. */
SN_API sn_status_t sn_batchnorm_bwd_reduce(double *sum_dy, double *sum_dy_xhat, const void *dy,
                                           const void *x, const double *mean, const float *rstd,
                                           int64_t n, int64_t c, int64_t s, sn_layout_t layout,
                                           sn_dtype_t dtype);

/* Input gradient from (global) backward sums over `count` values per channel (training mode):
 *   dx = gamma_c·rstd_c·(dy − sum_dy_c/count − x̂·sum_dy_xhat_c/count).
 * With sum_dy == sum_dy_xhat == NULL the statistics are treated as constants (eval mode, frozen
 * BatchNorm): dx = gamma_c·rstd_c·dy, count ignored. Pass the same mean/rstd as the forward
 * (for eval mode: running_mean and 1/√(running_var+eps)). dx, dy, x: [N, C, S] or [N, S, C] as
 * layout, dtype, overwritten (=); mean [C] f64; sum_dy, sum_dy_xhat [C] f64; rstd,
 * gamma [C] f32 (gamma NULL = 1). dx may equal dy. count <= 1 with sums given →
 * SN_ERR_INSUFFICIENT_COUNT (as sn_batchnorm_finalize: no training forward had such a batch);
 * one of the two sums NULL → SN_ERR_NULL_POINTER; others as sn_batchnorm_apply. */
SN_API sn_status_t sn_batchnorm_bwd_apply(void *dx, const void *dy, const void *x,
                                          const double *mean, const float *rstd,
                                          const float *gamma, const double *sum_dy,
                                          const double *sum_dy_xhat, int64_t count, int64_t n,
                                          int64_t c, int64_t s, sn_layout_t layout,
                                          sn_dtype_t dtype);

/* Local BatchNorm backward of a training step, with nothing to all-reduce (one process, or
 * torch.nn.BatchNorm2d's backward, PyTorch's native_batch_norm_backward), x̂ = (x − mean_c)·rstd_c
 * and count = n·s:
 *   dbeta_c = Σ_{n,s} dy,  dgamma_c = Σ_{n,s} dy·x̂,
 *   dx = gamma_c·rstd_c·(dy − dbeta_c/count − x̂·dgamma_c/count).
 * dx, dy, x: [N, C, S] or [N, S, C] as layout, dtype, host memory; dx overwritten (=), may equal
 * dy. mean: [C] f64 and rstd: [C] f32 from sn_batchnorm_finalize on this batch; gamma: [C] f32
 * or NULL (= 1). dgamma, dbeta: [C] f32, overwritten (=), either may be NULL (not returned); the
 * sums are the fp64 ones of sn_batchnorm_bwd_reduce, rounded once. The results are bitwise those
 * of sn_batchnorm_bwd_reduce followed by sn_batchnorm_bwd_apply with count n·s, for any thread
 * count (every input is read before dgamma and dbeta are written, so each may equal gamma or
 * rstd: the same pointer). Where x and dy fit in the threads' L2 caches (NCHW, s > 1), blocks of
 * channels may be summed and mapped while in the cache, with no scratch; else scratch of 16
 * bytes per channel plus sn_batchnorm_bwd_reduce's.
 * Errors (outputs untouched): SN_ERR_INSUFFICIENT_COUNT (n·s <= 1, as sn_batchnorm_finalize),
 * SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE, SN_ERR_OVERFLOW, SN_ERR_INVALID_LAYOUT,
 * SN_ERR_INVALID_DTYPE, SN_ERR_INVALID_ARGUMENT (dx overlaps dy partly, or x at all; dgamma or
 * dbeta overlaps any other array but as the same pointer as gamma or rstd), SN_ERR_ALLOC (the
 * scratch). */
SN_API sn_status_t sn_batchnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy,
                                    const void *x, const double *mean, const float *rstd,
                                    const float *gamma, int64_t n, int64_t c, int64_t s,
                                    sn_layout_t layout, sn_dtype_t dtype);

/* ------------------------------------------------------------------------------------------ */
/* GroupNorm (Wu and He 2018; torch.nn.GroupNorm)                                               */
/* ------------------------------------------------------------------------------------------ */

/* GroupNorm forward: for each sample n and group g of C/G channels, over its (C/G)·S values:
 *   mean, var (biased), rstd = 1/√(var+eps); y = (x − mean)·rstd·gamma_c + beta_c.
 * y, x: [N, C, S] or [N, S, C] dtype; gamma, beta: [C] f32 or NULL; mean, rstd: [N, G] f32 (=)
 * or NULL. y may equal x. Statistics in fp64: for f32 and bf16 NCHW and for NHWC one pass of
 * sums shifted by a pivot, the mean of the group's first 32 values (NCHW) or of each channel's
 * first 128 rows in the sample (NHWC, channels combined as M2 = Σ_c M2_c + S·(mean_c − mean)²),
 * as sn_layernorm_fwd, with two passes (Σx, then Σ(x − mean)²) where a pivot lies more than σ/2
 * from its mean or a value is not finite (bf16 NCHW, and f16 NCHW groups of up to 2^18 values,
 * widened once into per-thread scratch: the same bits as f32 on the widened x); larger f16 NCHW
 * groups always two passes. y in f32 from them,
 * in fp64 where f32 is not enough: bf16/f16 outputs whose f32 value is not finite, groups whose
 * mean is 2^103 or more, factors f32 cannot hold (as in sn_batchnorm_apply).
 * Scratch: NCHW, for f16 groups of up to 2^18 values one group as f32 per thread (at most
 * 1 MiB), else none; NHWC, (5·C + 2·G) doubles per thread (each channel's sums, pivot and
 * partial sums, each group's statistics), the call running on no more threads than keep these
 * blocks within 64 MiB together (one thread where one block is larger), plus 32·C doubles where
 * the threads share each sample (fewer samples than threads, or samples larger than a core's L2
 * that the threads can split).
 * Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE (C, G <= 0, N, S < 0),
 * SN_ERR_INVALID_GROUPS (C % G != 0), SN_ERR_OVERFLOW, SN_ERR_INVALID_EPS,
 * SN_ERR_INVALID_LAYOUT, SN_ERR_INVALID_DTYPE, SN_ERR_INVALID_ARGUMENT (y overlaps x partly),
 * SN_ERR_ALLOC. */
SN_API sn_status_t sn_groupnorm_fwd(void *y, float *mean, float *rstd, const void *x,
                                    const float *gamma, const float *beta, int64_t n, int64_t c,
                                    int64_t s, int64_t groups, float eps, sn_layout_t layout,
                                    sn_dtype_t dtype);

/* GroupNorm backward, per (n, g) with g_i = dy_i·gamma_c and x̂ = (x − mean)·rstd (re-centred):
 *   dx = rstd·(g − mean(g) − x̂·mean(g·x̂)),  dgamma_c = Σ_{n,s} dy·x̂,  dbeta_c = Σ_{n,s} dy.
 * dx, dy, x: [N, C, S] or [N, S, C] as layout, dtype, dx overwritten (=); mean, rstd: [N, G]
 * f32 from sn_groupnorm_fwd; gamma [C] f32 or NULL;
 * dgamma, dbeta: [C] f32 (=) or NULL. dx may equal dy. dgamma and dbeta add each sample's sums
 * in sample order, so the results are bitwise the same for any thread count. Scratch: 2·N·C
 * doubles where dgamma or dbeta is wanted (each sample's sums); NHWC also (7·C + 3·G) doubles
 * per thread, within 64 MiB as in sn_groupnorm_fwd, plus 48·C doubles where the threads share
 * each sample (fewer samples than threads). Errors as sn_groupnorm_fwd (no eps). */
SN_API sn_status_t sn_groupnorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy,
                                    const void *x, const float *mean, const float *rstd,
                                    const float *gamma, int64_t n, int64_t c, int64_t s,
                                    int64_t groups, sn_layout_t layout, sn_dtype_t dtype);

/* ------------------------------------------------------------------------------------------ */
/* Folding inference BatchNorm into the preceding conv/linear layer                             */
/* ------------------------------------------------------------------------------------------ */

/* In place, per output channel c with k = gamma_c/√(running_var_c + eps) (computed in fp64):
 *   w[c, :] = w[c, :]·k,  b[c] = (b[c] − running_mean_c)·k + beta_c.
 * Afterwards conv(x; w, b) equals BatchNorm_eval(conv(x; w_old, b_old)).
 * w: [c_out, per_out] f32 (per_out = C_in·kh·kw for a conv, in_features for a linear layer);
 * b: [c_out] f32 (pass zeros if the layer had no bias); gamma, beta: [c_out] f32 or NULL (1 / 0);
 * running_mean, running_var: [c_out] f32, host memory. w and b are overwritten (in place); on
 * an error nothing is written. Source: the algebra of conv-BN fusion (e.g. PyTorch's
 * torch.nn.utils.fusion.fuse_conv_bn_weights). Errors: SN_ERR_NULL_POINTER, SN_ERR_INVALID_SIZE
 * (c_out or per_out <= 0), SN_ERR_OVERFLOW, SN_ERR_INVALID_EPS, SN_ERR_INVALID_ARGUMENT (a
 * running_var < 0, or w or b overlapping another array; a NaN running_var gives that channel
 * NaN weights, as sn_batchnorm_infer NaN outputs). */
SN_API sn_status_t sn_fold_batchnorm(float *w, float *b, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var,
                                     int64_t c_out, int64_t per_out, float eps);

#ifdef __cplusplus
}
#endif

#endif /* SYNCNORM_H */
