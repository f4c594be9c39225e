/*
 * test_stream_bitwise.c — streaming (non-temporal) stores write the same bits as ordinary ones.
 *
 * Whether a call streams is fixed once per process (SN_STREAM_MIN_BYTES is read once: cpu.h,
 * convert.c), so one process cannot run a call both ways. The test runs this program twice more
 * (fork + exec of itself with --emit): once with every output streamed
 * (SN_STREAM_MIN_BYTES=0) and once with none (a threshold above any size). Each child runs the
 * same cases on the same seeded inputs: every kernel with an output that can stream; f32, bf16
 * and f16; the output at several offsets from a 64-byte line (the streamed f32 loops store a head
 * up to the first line, bf16 rows stream only where they start on one); in place and not; 1 and
 * 3 threads; with and without gamma, beta, dgamma, dbeta (each combination is a loop of its
 * own); planes split between threads (NCHW, S >= 8192), a second channel tile (NHWC, C > 256)
 * and a channel mapped in fp64 among f32 ones (mean 1e33). It writes one line per case to its
 * stdout, a pipe to the parent: the status, whether the bytes around every buffer (the offset
 * before it, 64+ bytes after it) kept their guard pattern, and an FNV-1a hash of every output,
 * each poisoned (all bits set: NaN in every dtype) before the call. The parent requires the two
 * runs to write the same lines, every case to have succeeded with its guards intact, and the
 * streaming child to stream (on x86-64, the only target with streaming stores; elsewhere the
 * two runs are the same code). Under valgrind (scripts/valgrind.sh) only the parent runs under
 * memcheck: the children are exec'd natively (the kernels are under memcheck in their tests).
 *
 * test_env_threshold runs it with --probe under values of SN_STREAM_MIN_BYTES: a value that is
 * not a whole number of bytes must be ignored, with one warning on stderr.
 *
 * Linked with the static library, for sn__stream_out (internal), as test_convert is.
 */
#include <check.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/cpu/cpu.h"
#include "testutil.h"

/* Output offsets from a 64-byte line, in elements: on a line, one element past it, 16 elements
 * past it (64 bytes for f32, half a line for bf16/f16) and 4 (16 bytes for f32: glibc malloc's
 * usual placement). */
static const int64_t OFFSETS[] = {0, 1, 4, 16};
static const int THREADS[] = {1, 3};
static const sn_dtype_t DTYPES[] = {SN_DTYPE_F32, SN_DTYPE_BF16, SN_DTYPE_F16};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* Guard bytes past each buffer (at least; up to the next 64-byte line beyond it). */
#define SLACK 64
#define EPS 1e-5f
/* SN_STREAM_MIN_BYTES of the ordinary child: above any output, so nothing streams */
#define NEVER "9223372036854775807"

/* ---- the child: the cases and their hashes ------------------------------------------------ */

/* The child has no Check runner to report to (Check's assertions need one): it exits. */
static void *need(void *p) {
  if (p == NULL) {
    fprintf(stderr, "test_stream_bitwise --emit: out of memory\n");
    exit(1);
  }
  return p;
}
/* n floats (f32 parameters and statistics) / n doubles (BatchNorm sums and mean). */
static float *floats(int64_t n) { return need(malloc((size_t)n * sizeof(float))); }
static double *doubles(int64_t n) { return need(calloc((size_t)n, sizeof(double))); }

/* n values mean + half·U[-1, 1) of dtype at p: bf16 the upper half of the f32 value, f16 its
 * _Float16 rounding (cheap: the inputs only have to be the same in both children). */
static void fill(void *p, int64_t n, sn_dtype_t dtype, double mean, double half, tu_rng_t *r) {
  for (int64_t i = 0; i < n; i++) {
    const float v = (float)(mean + half * ((double)(tu_rng_u64(r) >> 40) * 0x1p-23 - 1.0));
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if (dtype == SN_DTYPE_F32) ((float *)p)[i] = v;
    else if (dtype == SN_DTYPE_BF16) ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    else {
      const _Float16 h = (_Float16)v;
      memcpy((uint16_t *)p + i, &h, sizeof h);
    }
  }
}

/* The live buffers of a case and their guard zones: the `off` bytes before each and the slack
 * after it, filled with GUARD and checked after the call, so that a store past either end shows
 * (unless it stores GUARD bytes itself). */
#define GUARD 0xa5
enum { MAX_BUFS = 8 };
static struct {
  unsigned char *base;
  size_t off, bytes, size;
} bufs[MAX_BUFS];
static int nbufs;

/* A buffer of `bytes` starting `off` bytes past a 64-byte line, guarded (freed with bufs_free). */
static void *buf_at(int64_t bytes, int64_t off) {
  const size_t size = (size_t)((off + bytes + SLACK + 63) / 64 * 64);
  unsigned char *base = need(aligned_alloc(64, size));
  memset(base, GUARD, size);
  if (nbufs == MAX_BUFS) need(NULL);
  bufs[nbufs].base = base, bufs[nbufs].off = (size_t)off, bufs[nbufs].bytes = (size_t)bytes;
  bufs[nbufs++].size = size;
  return base + off;
}

/* Whether every live buffer's guard zones still hold GUARD. */
static int guards_ok(void) {
  for (int b = 0; b < nbufs; b++)
    for (size_t i = 0; i < bufs[b].size; i++)
      if ((i < bufs[b].off || i >= bufs[b].off + bufs[b].bytes) && bufs[b].base[i] != GUARD)
        return 0;
  return 1;
}

static void bufs_free(void) {
  for (int b = 0; b < nbufs; b++) free(bufs[b].base);
  nbufs = 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t bytes) {
  const unsigned char *b = p;
  for (size_t i = 0; i < bytes; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* The outputs of one case, hashed in order. */
typedef struct {
  const void *p[4];
  size_t bytes[4];
  int count;
} outs_t;

/* Records an output that is also an input (in place: dx == dy, sum_out == x). */
static void keep(outs_t *o, const void *p, size_t bytes) {
  o->p[o->count] = p, o->bytes[o->count] = bytes, o->count++;
}
/* Poisons an output (every bit set) and records it. */
static void out(outs_t *o, void *p, size_t bytes) {
  memset(p, 0xff, bytes);
  keep(o, p, bytes);
}
/* An output, poisoned unless in place (then an input of the call). */
static void out_or_keep(outs_t *o, void *p, size_t bytes, int inplace) {
  if (inplace) keep(o, p, bytes);
  else out(o, p, bytes);
}

static void emit(FILE *f, const char *name, sn_status_t st, const outs_t *o) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int k = 0; k < o->count; k++) h = fnv(h, o->p[k], o->bytes[k]);
  fprintf(f, "%s: status %d guards %d hash %016llx\n", name, (int)st, guards_ok(),
          (unsigned long long)h);
}

enum { LN_FWD, RMS_FWD, ADD_LN_FWD, ADD_RMS_FWD, LN_BWD, RMS_BWD, N_ROW_KERNELS };
static const char *const ROW_KERNEL[] = {"layernorm_fwd",   "rmsnorm_fwd",   "add_layernorm_fwd",
                                         "add_rmsnorm_fwd", "layernorm_bwd", "rmsnorm_bwd"};

/* Which of the optional f32 vectors a row case passes (NULL for the others). */
enum {
  AFF_ALL,   /* gamma and beta; the backwards dgamma (and dbeta) */
  AFF_GAMMA, /* gamma, no beta; the backwards no dgamma/dbeta */
  AFF_NONE,  /* neither; the backwards no gamma, no dgamma/dbeta */
  AFF_BETA,  /* beta, no gamma; the backwards no gamma but dgamma and dbeta */
  N_AFF
};
static const char *const AFF_NAME[] = {"", ", gamma only", ", no gamma or beta",
                                       ", beta only"};

/* Row kernel k on [rows, d] of dtype, the output `off` elements past a line; in place: y == x,
 * dx == dy, and for the fused kernels sum_out == x (their y may alias nothing); aff: AFF_*. x has
 * mean 3 (LayerNorm centres it), the backwards take the statistics of a forward on x. */
static void row_case(FILE *f, int k, int64_t rows, int64_t d, sn_dtype_t dtype, int64_t off,
                     int inplace, int aff, int threads) {
  const int64_t n = rows * d, es = sn_dtype_size(dtype), bytes = n * es, ob = off * es;
  tu_rng_t r;
  tu_rng_seed(&r, (uint64_t)(k * 7919 + rows * 104729 + d * 31 + dtype));
  void *x = buf_at(bytes, ob), *dy = buf_at(bytes, ob), *res = buf_at(bytes, ob),
       *y = buf_at(bytes, ob), *sum = buf_at(bytes, ob);
  float *gamma = floats(d), *beta = floats(d);
  float *mean = floats(rows), *rstd = floats(rows);
  float *dgamma = floats(d), *dbeta = floats(d);
  fill(x, n, dtype, 3.0, 2.0, &r);
  fill(dy, n, dtype, 0.0, 1.0, &r);
  fill(res, n, dtype, -1.0, 0.5, &r);
  fill(gamma, d, SN_DTYPE_F32, 1.0, 0.5, &r);
  fill(beta, d, SN_DTYPE_F32, 0.0, 1.0, &r);
  float *const g = aff == AFF_ALL || aff == AFF_GAMMA ? gamma : NULL;
  float *const bt = aff == AFF_ALL || aff == AFF_BETA ? beta : NULL;
  float *const dg = aff == AFF_ALL || aff == AFF_BETA ? dgamma : NULL;
  float *const db = aff == AFF_ALL || aff == AFF_BETA ? dbeta : NULL;
  sn_status_t st = SN_OK;
  if (k == LN_BWD) st = sn_layernorm_fwd(y, mean, rstd, x, g, bt, rows, d, EPS, dtype);
  if (k == RMS_BWD) st = sn_rmsnorm_fwd(y, rstd, x, g, rows, d, EPS, dtype);
  outs_t o = {{0}, {0}, 0};
  void *yo = inplace ? x : y, *dxo = inplace ? dy : y, *so = inplace ? x : sum;
  if (st == SN_OK) switch (k) {
      case LN_FWD:
        out(&o, yo, (size_t)bytes), out(&o, mean, (size_t)rows * 4);
        out(&o, rstd, (size_t)rows * 4);
        st = sn_layernorm_fwd(yo, mean, rstd, x, g, bt, rows, d, EPS, dtype);
        break;
      case RMS_FWD:
        out(&o, yo, (size_t)bytes), out(&o, rstd, (size_t)rows * 4);
        st = sn_rmsnorm_fwd(yo, rstd, x, g, rows, d, EPS, dtype);
        break;
      case ADD_LN_FWD:
        out(&o, y, (size_t)bytes), out(&o, mean, (size_t)rows * 4);
        out(&o, rstd, (size_t)rows * 4), out_or_keep(&o, so, (size_t)bytes, inplace);
        st = sn_add_layernorm_fwd(y, so, mean, rstd, x, res, g, bt, rows, d, EPS, dtype);
        break;
      case ADD_RMS_FWD:
        out(&o, y, (size_t)bytes), out(&o, rstd, (size_t)rows * 4);
        out_or_keep(&o, so, (size_t)bytes, inplace);
        st = sn_add_rmsnorm_fwd(y, so, rstd, x, res, g, rows, d, EPS, dtype);
        break;
      case LN_BWD:
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        if (dg != NULL) out(&o, dg, (size_t)d * 4), out(&o, db, (size_t)d * 4);
        st = sn_layernorm_bwd(dxo, dg, db, dy, x, mean, rstd, g, rows, d, dtype);
        break;
      default: /* RMS_BWD */
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        if (dg != NULL) out(&o, dg, (size_t)d * 4);
        st = sn_rmsnorm_bwd(dxo, dg, dy, x, rstd, g, rows, d, dtype);
        break;
    }
  char name[192];
  snprintf(name, sizeof name, "%s [%lld,%lld] %s, output %lld elements past a line%s%s, %d threads",
           ROW_KERNEL[k], (long long)rows, (long long)d, tu_dtype_name[dtype], (long long)off,
           inplace ? ", in place" : "", AFF_NAME[aff], threads);
  emit(f, name, st, &o);
  bufs_free();
  free(gamma), free(beta), free(mean), free(rstd), free(dgamma), free(dbeta);
}

enum { BN_APPLY, BN_INFER, BN_BWD_APPLY, BN_BWD, GN_FWD, GN_BWD, BN_FWD, N_CH_KERNELS };
static const char *const CH_KERNEL[] = {"batchnorm_apply", "batchnorm_infer", "batchnorm_bwd_apply",
                                        "batchnorm_bwd",   "groupnorm_fwd",   "groupnorm_bwd",
                                        "batchnorm_fwd"};

/* Channel kernel k on [N, C, S] (layout, dtype), the output `off` elements past a line; in
 * place: y == x, dx == dy. BatchNorm takes the statistics of x (sn_batchnorm_stats and
 * finalize), bwd_apply the sums of sn_batchnorm_bwd_reduce; GroupNorm has groups G
 * (C % G == 0) and its backward the statistics of a forward on x. extreme: channel 1 holds
 * 1e33 + 1e31·U[-1, 1) (a mean beyond 2^103: mapped in fp64 among f32 channels; f32 and bf16). */
static void ch_case(FILE *f, int k, int64_t N, int64_t C, int64_t S, int64_t G, sn_layout_t layout,
                    sn_dtype_t dtype, int64_t off, int inplace, int extreme, int threads) {
  const int64_t n = N * C * S, es = sn_dtype_size(dtype), bytes = n * es, ob = off * es;
  tu_rng_t r;
  tu_rng_seed(&r, (uint64_t)(k * 7919 + N * 104729 + C * 131 + S * 31 + dtype * 3 + layout));
  void *x = buf_at(bytes, ob), *dy = buf_at(bytes, ob), *y = buf_at(bytes, ob);
  float *gamma = floats(C), *beta = floats(C);
  float *var = floats(C), *rstd = floats(C);
  float *gmean = floats(N * G), *grstd = floats(N * G);
  float *dgamma = floats(C), *dbeta = floats(C);
  float *rmean = floats(C), *rvar = floats(C);
  double *sum = doubles(C), *sumsq = doubles(C), *mean = doubles(C), *sdy = doubles(C),
         *sdyx = doubles(C);
  fill(x, n, dtype, 3.0, 2.0, &r);
  if (extreme)
    for (int64_t i = 0; i < n; i++) {
      const int64_t c = layout == SN_LAYOUT_NCHW ? i / S % C : i % C;
      if (c == 1) fill((char *)x + i * es, 1, dtype, 1e33, 1e31, &r);
    }
  fill(dy, n, dtype, 0.0, 1.0, &r);
  fill(gamma, C, SN_DTYPE_F32, 1.0, 0.5, &r);
  fill(beta, C, SN_DTYPE_F32, 0.0, 1.0, &r);
  for (int64_t c = 0; c < C; c++)
    rmean[c] = (float)(3.0 + 0.1 * tu_rng_normal(&r)), rvar[c] = (float)(4.0 + tu_rng_uniform(&r));
  sn_status_t st = SN_OK;
  if (k <= BN_BWD) {
    st = sn_batchnorm_stats(sum, sumsq, x, NULL, N, C, S, layout, dtype);
    if (st == SN_OK) st = sn_batchnorm_finalize(mean, var, rstd, sum, sumsq, NULL, N * S, C, EPS);
    if (st == SN_OK && k == BN_BWD_APPLY)
      st = sn_batchnorm_bwd_reduce(sdy, sdyx, dy, x, mean, rstd, N, C, S, layout, dtype);
  } else if (k == GN_BWD) {
    st = sn_groupnorm_fwd(y, gmean, grstd, x, gamma, beta, N, C, S, G, EPS, layout, dtype);
  }
  outs_t o = {{0}, {0}, 0};
  void *yo = inplace ? x : y, *dxo = inplace ? dy : y;
  if (st == SN_OK) switch (k) {
      case BN_APPLY:
        out(&o, yo, (size_t)bytes);
        st = sn_batchnorm_apply(yo, x, mean, rstd, gamma, beta, N, C, S, layout, dtype);
        break;
      case BN_INFER:
        out(&o, yo, (size_t)bytes);
        st = sn_batchnorm_infer(yo, x, rmean, rvar, gamma, beta, N, C, S, EPS, layout, dtype);
        break;
      case BN_BWD_APPLY:
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        st = sn_batchnorm_bwd_apply(dxo, dy, x, mean, rstd, gamma, sdy, sdyx, N * S, N, C, S,
                                    layout, dtype);
        break;
      case GN_FWD:
        out(&o, yo, (size_t)bytes), out(&o, gmean, (size_t)(N * G) * 4);
        out(&o, grstd, (size_t)(N * G) * 4);
        st = sn_groupnorm_fwd(yo, gmean, grstd, x, gamma, beta, N, C, S, G, EPS, layout, dtype);
        break;
      case BN_BWD: /* the local backward: fused in NCHW (a channel's map right after its sums) */
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        out(&o, dgamma, (size_t)C * 4), out(&o, dbeta, (size_t)C * 4);
        st = sn_batchnorm_bwd(dxo, dgamma, dbeta, dy, x, mean, rstd, gamma, N, C, S, layout, dtype);
        break;
      case BN_FWD: /* the local forward: fused in NCHW (a channel's map right after its sums) */
        out_or_keep(&o, yo, (size_t)bytes, inplace), out(&o, mean, (size_t)C * 8);
        out(&o, var, (size_t)C * 4), out(&o, rstd, (size_t)C * 4);
        st = sn_batchnorm_fwd(yo, mean, var, rstd, x, NULL, gamma, beta, N, C, S, EPS, layout,
                              dtype);
        break;
      default: /* GN_BWD */
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        out(&o, dgamma, (size_t)C * 4), out(&o, dbeta, (size_t)C * 4);
        st = sn_groupnorm_bwd(dxo, dgamma, dbeta, dy, x, gmean, grstd, gamma, N, C, S, G, layout,
                              dtype);
        break;
    }
  char name[192];
  snprintf(name, sizeof name,
           "%s [%lld,%lld,%lld] G %lld %s %s, output %lld elements past a line%s%s, %d threads",
           CH_KERNEL[k], (long long)N, (long long)C, (long long)S, (long long)G,
           layout == SN_LAYOUT_NCHW ? "NCHW" : "NHWC", tu_dtype_name[dtype], (long long)off,
           inplace ? ", in place" : "", extreme ? ", channel 1 at 1e33" : "", threads);
  emit(f, name, st, &o);
  bufs_free();
  free(gamma), free(beta), free(var), free(rstd), free(gmean), free(grstd), free(dgamma);
  free(dbeta), free(rmean), free(rvar), free(sum), free(sumsq), free(mean), free(sdy), free(sdyx);
}

/* Row shapes: whole lines per row (1024), rows that start on a line every 8th row (1000 f32:
 * 4000 bytes; bf16 2000), short rows below a line and a tail (37), one element, and many short
 * rows. Channel shapes: planes of 49 and 3136 (NCHW maps per plane), 64/65/3 channels (NHWC
 * rows), one channel, two planes of 20000 split between threads (NCHW: fewer planes than
 * 4 per thread, at least 4096 elements a piece) and 300 channels (NHWC: a second tile of 44
 * after SN_TILE_C = 256); the last two have enough elements (SN_PAR_MIN) for threads. */
static const int64_t ROW_SHAPES[][2] = {{5, 1024}, {9, 1000}, {3, 37}, {2, 1}, {70, 64}};
static const int64_t CH_SHAPES[][4] = {/* N, C, S, G */
                                       {3, 64, 49, 32}, {2, 65, 7, 5},     {2, 3, 1, 3},
                                       {4, 1, 33, 1},   {2, 8, 3136, 4},   {1, 2, 20000, 2},
                                       {2, 300, 64, 30}};
/* The channel shapes also run with channel 1 at 1e33 (f32, bf16): the first and the last. */
static const int EXTREME_SHAPES[] = {0, 6};

/* The child: every case to stdout; the first line says whether this process streams. */
static int emit_all(void) {
  FILE *f = stdout;
  fprintf(f, "streams %d\n", sn__stream_out(1));
  for (int t = 0; t < COUNT(THREADS); t++) {
    omp_set_num_threads(THREADS[t]);
    for (int di = 0; di < COUNT(DTYPES); di++)
      for (int oi = 0; oi < COUNT(OFFSETS); oi++) {
        const sn_dtype_t dt = DTYPES[di];
        const int64_t off = OFFSETS[oi];
        for (int ip = 0; ip < 2; ip++) {
          for (int s = 0; s < COUNT(ROW_SHAPES); s++)
            for (int k = 0; k < N_ROW_KERNELS; k++)
              row_case(f, k, ROW_SHAPES[s][0], ROW_SHAPES[s][1], dt, off, ip, AFF_ALL,
                       THREADS[t]);
          for (int s = 0; s < COUNT(CH_SHAPES); s++)
            for (int l = 0; l < 2; l++)
              for (int k = 0; k < N_CH_KERNELS; k++)
                ch_case(f, k, CH_SHAPES[s][0], CH_SHAPES[s][1], CH_SHAPES[s][2], CH_SHAPES[s][3],
                        l ? SN_LAYOUT_NHWC : SN_LAYOUT_NCHW, dt, off, ip, 0, THREADS[t]);
        }
        /* the optional vectors left out, and the extreme channel: not in place */
        for (int a = AFF_GAMMA; a < N_AFF; a++)
          for (int s = 0; s < COUNT(ROW_SHAPES); s++)
            for (int k = 0; k < N_ROW_KERNELS; k++)
              row_case(f, k, ROW_SHAPES[s][0], ROW_SHAPES[s][1], dt, off, 0, a, THREADS[t]);
        for (int e = 0; e < COUNT(EXTREME_SHAPES) && dt != SN_DTYPE_F16; e++)
          for (int l = 0; l < 2; l++)
            for (int k = 0; k < N_CH_KERNELS; k++) {
              const int64_t *sh = CH_SHAPES[EXTREME_SHAPES[e]];
              ch_case(f, k, sh[0], sh[1], sh[2], sh[3], l ? SN_LAYOUT_NHWC : SN_LAYOUT_NCHW, dt,
                      off, 0, 1, THREADS[t]);
            }
      }
  }
  return fflush(f) != 0 || ferror(f);
}

/* --probe: whether outputs of 1 byte, 1 MiB and INT64_MAX bytes stream in a kernel that does
 * not stream by default, and outputs of one byte less than SN_BN_DX_STREAM_MIN and of
 * SN_BN_DX_STREAM_MIN bytes in the BatchNorm backward (which streams from there by default), as
 * one line "probe A B C D E" on stdout; each asked three times, so that a warning about
 * SN_STREAM_MIN_BYTES shows whether it is written once per process. */
static int probe(void) {
  int a = 0, b = 0, c = 0, d = 0, e = 0;
  for (int k = 0; k < 3; k++) {
    a = sn__stream_out(1), b = sn__stream_out((int64_t)1 << 20), c = sn__stream_out(INT64_MAX);
    d = sn__stream_out_from(SN_BN_DX_STREAM_MIN - 1, SN_BN_DX_STREAM_MIN);
    e = sn__stream_out_from(SN_BN_DX_STREAM_MIN, SN_BN_DX_STREAM_MIN);
  }
  printf("probe %d %d %d %d %d\n", a, b, c, d, e);
  return fflush(stdout) != 0;
}

/* ---- the parent -------------------------------------------------------------------------- */

/* This program's path, read at start (readlink of /proc/self/exe, which valgrind answers with
 * the program it runs, not itself; else argv[0]). */
static char self[4096];

/* Runs this program with `mode` (--emit or --probe) and SN_STREAM_MIN_BYTES=min_bytes (NULL:
 * unset), its stdout, and with --probe its stderr too, a pipe read here (no files to leave
 * behind); requires exit 0. Returns the output (free it). */
static char *run_mode(const char *mode, const char *min_bytes) {
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  fflush(NULL);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(fd[1], STDOUT_FILENO);
    if (strcmp(mode, "--probe") == 0) dup2(fd[1], STDERR_FILENO);
    /* (with stdout or stderr closed, pipe() returned their numbers: those stay open) */
    if (fd[0] > STDERR_FILENO) close(fd[0]);
    if (fd[1] > STDERR_FILENO) close(fd[1]);
    if (min_bytes != NULL) setenv("SN_STREAM_MIN_BYTES", min_bytes, 1);
    else unsetenv("SN_STREAM_MIN_BYTES");
    execl(self, self, mode, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  size_t len = 0, cap = 1 << 20;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  for (;;) {
    if (cap - len < 65536) {
      text = realloc(text, cap *= 2);
      ck_assert_ptr_nonnull(text);
    }
    const ssize_t got = read(fd[0], text + len, cap - len - 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    len += (size_t)got;
  }
  close(fd[0]);
  text[len] = '\0';
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the child %s with SN_STREAM_MIN_BYTES=%s failed (status 0x%x)", mode,
                min_bytes != NULL ? min_bytes : "(unset)", (unsigned)status);
  return text;
}

/* The --emit child. */
static char *run_child(const char *min_bytes) { return run_mode("--emit", min_bytes); }

/* The next line of *p (its newline cut), advancing *p; NULL at the end. */
static char *next_line(char **p) {
  if (**p == '\0') return NULL;
  char *line = *p, *nl = strchr(line, '\n');
  if (nl != NULL) *nl = '\0', *p = nl + 1;
  else *p += strlen(line);
  return line;
}

START_TEST(test_streamed_equals_ordinary) {
  char *streamed = run_child("0"), *ordinary = run_child(NEVER);
  char *pa = streamed, *pb = ordinary, *la, *lb;
  int lines = 0;
  la = next_line(&pa), lb = next_line(&pb);
  ck_assert(la != NULL && lb != NULL);
#if defined(__x86_64__) && defined(__GNUC__) /* streaming stores exist */
  ck_assert_str_eq(la, "streams 1");
#endif
  ck_assert_str_eq(lb, "streams 0");
  for (;;) {
    la = next_line(&pa), lb = next_line(&pb);
    if (la == NULL || lb == NULL) {
      ck_assert_msg(la == NULL && lb == NULL, "the two runs wrote different numbers of cases");
      break;
    }
    ck_assert_msg(strstr(la, ": status 0 guards 1 ") != NULL, "a case failed: %s", la);
    ck_assert_msg(strcmp(la, lb) == 0, "streamed and ordinary stores differ:\n  %s\n  %s", la, lb);
    lines++;
  }
  free(streamed), free(ordinary);
  /* thread counts × dtypes × offsets × (in place or not × (row shapes × row kernels + channel
   * shapes × layouts × channel kernels) + the 3 other affine variants × row shapes × row
   * kernels) + the extreme channel (f32, bf16) */
  const int per = 2 * (COUNT(ROW_SHAPES) * N_ROW_KERNELS + COUNT(CH_SHAPES) * 2 * N_CH_KERNELS) +
                  (N_AFF - 1) * COUNT(ROW_SHAPES) * N_ROW_KERNELS;
  const int extreme =
      COUNT(THREADS) * 2 * COUNT(OFFSETS) * COUNT(EXTREME_SHAPES) * 2 * N_CH_KERNELS;
  ck_assert_int_eq(lines, COUNT(THREADS) * COUNT(DTYPES) * COUNT(OFFSETS) * per + extreme);
}
END_TEST

/* The lines of a --probe child's output that are the library's or the probe's ("syncnorm:",
 * "probe"), in order: others (libgomp's, under OMP_DISPLAY_ENV or a bad OMP_NUM_THREADS) are
 * dropped. In place; returns text. */
static char *ours(char *text) {
  char *in = text, *out = text, *line;
  while ((line = next_line(&in)) != NULL)
    if (strncmp(line, "syncnorm:", 9) == 0 || strncmp(line, "probe ", 6) == 0) {
      const size_t len = strlen(line); /* out <= line: the kept text moves back, if at all */
      memmove(out, line, len);
      out += len;
      *out++ = '\n'; /* where line's newline (now '\0') was, or before it */
    }
  *out = '\0';
  return text;
}

/* SN_STREAM_MIN_BYTES: a value that is not a whole number of bytes is ignored (the threshold of
 * the variable unset) with one line on stderr naming it (control characters shown as '?'),
 * however often the kernels ask; a whole number sets the threshold without a word; an empty one
 * is unset. */
START_TEST(test_env_threshold) {
  static const char *const bad[] = {"16M", "-1", " 5",  "+5",
                                    "0x10", "1e6", "5 ", "1\nsyncnorm: 2"};
  static const char *const shown[] = {"16M", "-1", " 5",  "+5",
                                      "0x10", "1e6", "5 ", "1?syncnorm: 2"};
  char *unset = ours(run_mode("--probe", NULL));
#if defined(__x86_64__) && defined(__GNUC__) /* by default only the BatchNorm dx streams */
  ck_assert_str_eq(unset, "probe 0 0 1 0 1\n");
#else
  ck_assert_str_eq(unset, "probe 0 0 0 0 0\n");
#endif
  for (int i = 0; i < COUNT(bad); i++) {
    char *out = ours(run_mode("--probe", bad[i])), want[128];
    snprintf(want, sizeof want, "syncnorm: ignoring SN_STREAM_MIN_BYTES='%s': ", shown[i]);
#if defined(__x86_64__) && defined(__GNUC__) /* elsewhere nothing streams: the variable is unread */
    ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "'%s': no warning first in '%s'",
                  shown[i], out);
    const char *eol = strchr(out, '\n');
    ck_assert_msg(eol != NULL && strcmp(eol + 1, unset) == 0,
                  "'%s': not one warning and then the default (%s): '%s'", shown[i], unset, out);
#else
    ck_assert_str_eq(out, unset);
#endif
    free(out);
  }
  char *empty = ours(run_mode("--probe", ""));
  ck_assert_str_eq(empty, unset);
  char *zero = ours(run_mode("--probe", "0")), *never = ours(run_mode("--probe", NEVER));
  char *beyond = ours(run_mode("--probe", "99999999999999999999")); /* beyond INT64_MAX: never */
#if defined(__x86_64__) && defined(__GNUC__) /* streaming stores exist */
  ck_assert_str_eq(zero, "probe 1 1 1 1 1\n"); /* the variable replaces every default */
  ck_assert_str_eq(never, "probe 0 0 1 0 0\n");
#else
  ck_assert_str_eq(zero, "probe 0 0 0 0 0\n");
  ck_assert_str_eq(never, "probe 0 0 0 0 0\n");
#endif
  ck_assert_str_eq(beyond, never);
  free(unset), free(empty), free(zero), free(never), free(beyond);
}
END_TEST

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--emit") == 0) return emit_all();
  if (argc == 2 && strcmp(argv[1], "--probe") == 0) return probe();
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) self[len] = '\0';
  else snprintf(self, sizeof self, "%s", argv[0]);
  Suite *s = suite_create("stream_bitwise");
  TCase *tc = tcase_create("core");
  /* ctest sets CK_DEFAULT_TIMEOUT (scaled for valgrind); run by hand, Check's default of 4 s is
   * below the two children's ~15 s */
  if (getenv("CK_DEFAULT_TIMEOUT") == NULL) tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_streamed_equals_ordinary);
  tcase_add_test(tc, test_env_threshold);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
