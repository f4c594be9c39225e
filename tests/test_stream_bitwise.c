/*
 * test_stream_bitwise.c — streaming (non-temporal) stores write the same bits as ordinary ones.
 *
 * Whether a call streams is fixed once per process (SN_STREAM_MIN_BYTES is read once: cpu.h,
 * convert.c), so one process cannot run a call both ways. The test runs this program twice more
 * (fork + exec of itself with --emit FILE): once with every output streamed
 * (SN_STREAM_MIN_BYTES=0) and once with none (a threshold above any size). Each child runs the
 * same cases on the same seeded inputs: every kernel with an output that can stream; f32, bf16
 * and f16; the output at several offsets from a 64-byte line (the streamed f32 loops store a head
 * up to the first line, bf16 rows stream only where they start on one); in place and not; 1 and
 * 3 threads. It writes one line per case: the status and an FNV-1a hash of every output, each
 * poisoned (all bits set: NaN in every dtype) before the call. The parent requires the two files
 * to hold the same lines, the cases to have succeeded, and the streaming child to have streamed
 * (on x86-64, the only target with streaming stores; elsewhere the two runs are the same code).
 *
 * Linked with the static library, for sn__stream_out (internal), as test_convert is.
 */
#include <check.h>
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
/* Bytes past each buffer for the largest offset (16 elements of 4 bytes). */
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

/* A buffer of `bytes` starting `off` bytes past a 64-byte line (freed with buf_free). */
static void *buf_at(int64_t bytes, int64_t off) {
  return (char *)need(aligned_alloc(64, (size_t)((bytes + SLACK + 63) / 64 * 64))) + off;
}
static void buf_free(void *p, int64_t off) { free((char *)p - off); }

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
  fprintf(f, "%s: status %d hash %016llx\n", name, (int)st, (unsigned long long)h);
}

enum { LN_FWD, RMS_FWD, ADD_LN_FWD, ADD_RMS_FWD, LN_BWD, RMS_BWD, N_ROW_KERNELS };
static const char *const ROW_KERNEL[] = {"layernorm_fwd",   "rmsnorm_fwd",   "add_layernorm_fwd",
                                         "add_rmsnorm_fwd", "layernorm_bwd", "rmsnorm_bwd"};

/* Row kernel k on [rows, d] of dtype, the output `off` elements past a line; in place: y == x,
 * dx == dy, and for the fused kernels sum_out == x (their y may alias nothing). x has mean 3
 * (LayerNorm centres it), the backwards take the statistics of a forward on x. */
static void row_case(FILE *f, int k, int64_t rows, int64_t d, sn_dtype_t dtype, int64_t off,
                     int inplace, int threads) {
  const int64_t n = rows * d, es = sn_dtype_size(dtype), bytes = n * es, ob = off * es;
  tu_rng_t r;
  tu_rng_seed(&r, (uint64_t)(k * 7919 + rows * 104729 + d * 31 + dtype));
  void *x = buf_at(bytes, ob), *dy = buf_at(bytes, ob), *res = buf_at(bytes, ob),
       *y = buf_at(bytes, ob), *sum = buf_at(bytes, ob);
  float *gamma = floats(d), *beta = floats(d);
  float *mean = floats(rows), *rstd = floats(rows);
  float *dgamma = floats(d), *dbeta = floats(d);
  tu_fill_normal(x, n, dtype, 3.0, 2.0, &r);
  tu_fill_normal(dy, n, dtype, 0.0, 1.0, &r);
  tu_fill_normal(res, n, dtype, -1.0, 0.5, &r);
  tu_fill_normal(gamma, d, SN_DTYPE_F32, 1.0, 0.5, &r);
  tu_fill_normal(beta, d, SN_DTYPE_F32, 0.0, 1.0, &r);
  sn_status_t st = SN_OK;
  if (k == LN_BWD) st = sn_layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, d, EPS, dtype);
  if (k == RMS_BWD) st = sn_rmsnorm_fwd(y, rstd, x, gamma, rows, d, EPS, dtype);
  outs_t o = {{0}, {0}, 0};
  void *yo = inplace ? x : y, *dxo = inplace ? dy : y, *so = inplace ? x : sum;
  if (st == SN_OK) switch (k) {
      case LN_FWD:
        out(&o, yo, (size_t)bytes), out(&o, mean, (size_t)rows * 4);
        out(&o, rstd, (size_t)rows * 4);
        st = sn_layernorm_fwd(yo, mean, rstd, x, gamma, beta, rows, d, EPS, dtype);
        break;
      case RMS_FWD:
        out(&o, yo, (size_t)bytes), out(&o, rstd, (size_t)rows * 4);
        st = sn_rmsnorm_fwd(yo, rstd, x, gamma, rows, d, EPS, dtype);
        break;
      case ADD_LN_FWD:
        out(&o, y, (size_t)bytes), out(&o, mean, (size_t)rows * 4);
        out(&o, rstd, (size_t)rows * 4), out_or_keep(&o, so, (size_t)bytes, inplace);
        st = sn_add_layernorm_fwd(y, so, mean, rstd, x, res, gamma, beta, rows, d, EPS, dtype);
        break;
      case ADD_RMS_FWD:
        out(&o, y, (size_t)bytes), out(&o, rstd, (size_t)rows * 4);
        out_or_keep(&o, so, (size_t)bytes, inplace);
        st = sn_add_rmsnorm_fwd(y, so, rstd, x, res, gamma, rows, d, EPS, dtype);
        break;
      case LN_BWD:
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        out(&o, dgamma, (size_t)d * 4), out(&o, dbeta, (size_t)d * 4);
        st = sn_layernorm_bwd(dxo, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, dtype);
        break;
      default: /* RMS_BWD */
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        out(&o, dgamma, (size_t)d * 4);
        st = sn_rmsnorm_bwd(dxo, dgamma, dy, x, rstd, gamma, rows, d, dtype);
        break;
    }
  char name[192];
  snprintf(name, sizeof name, "%s [%lld,%lld] %s, output %lld elements past a line%s, %d threads",
           ROW_KERNEL[k], (long long)rows, (long long)d, tu_dtype_name[dtype], (long long)off,
           inplace ? ", in place" : "", threads);
  emit(f, name, st, &o);
  buf_free(x, ob), buf_free(dy, ob), buf_free(res, ob), buf_free(y, ob), buf_free(sum, ob);
  free(gamma), free(beta), free(mean), free(rstd), free(dgamma), free(dbeta);
}

enum { BN_APPLY, BN_INFER, BN_BWD_APPLY, GN_FWD, GN_BWD, N_CH_KERNELS };
static const char *const CH_KERNEL[] = {"batchnorm_apply", "batchnorm_infer", "batchnorm_bwd_apply",
                                        "groupnorm_fwd", "groupnorm_bwd"};

/* Channel kernel k on [N, C, S] (layout, dtype), the output `off` elements past a line; in
 * place: y == x, dx == dy. BatchNorm takes the statistics of x (sn_batchnorm_stats and
 * finalize), its backward the sums of sn_batchnorm_bwd_reduce; GroupNorm has groups G
 * (C % G == 0) and its backward the statistics of a forward on x. */
static void ch_case(FILE *f, int k, int64_t N, int64_t C, int64_t S, int64_t G, sn_layout_t layout,
                    sn_dtype_t dtype, int64_t off, int inplace, int threads) {
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
  tu_fill_normal(x, n, dtype, 3.0, 2.0, &r);
  tu_fill_normal(dy, n, dtype, 0.0, 1.0, &r);
  tu_fill_normal(gamma, C, SN_DTYPE_F32, 1.0, 0.5, &r);
  tu_fill_normal(beta, C, SN_DTYPE_F32, 0.0, 1.0, &r);
  for (int64_t c = 0; c < C; c++)
    rmean[c] = (float)(3.0 + 0.1 * tu_rng_normal(&r)), rvar[c] = (float)(4.0 + tu_rng_uniform(&r));
  sn_status_t st = SN_OK;
  if (k <= BN_BWD_APPLY) {
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
      default: /* GN_BWD */
        out_or_keep(&o, dxo, (size_t)bytes, inplace);
        out(&o, dgamma, (size_t)C * 4), out(&o, dbeta, (size_t)C * 4);
        st = sn_groupnorm_bwd(dxo, dgamma, dbeta, dy, x, gmean, grstd, gamma, N, C, S, G, layout,
                              dtype);
        break;
    }
  char name[192];
  snprintf(name, sizeof name,
           "%s [%lld,%lld,%lld] G %lld %s %s, output %lld elements past a line%s, %d threads",
           CH_KERNEL[k], (long long)N, (long long)C, (long long)S, (long long)G,
           layout == SN_LAYOUT_NCHW ? "NCHW" : "NHWC", tu_dtype_name[dtype], (long long)off,
           inplace ? ", in place" : "", threads);
  emit(f, name, st, &o);
  buf_free(x, ob), buf_free(dy, ob), buf_free(y, ob);
  free(gamma), free(beta), free(var), free(rstd), free(gmean), free(grstd), free(dgamma);
  free(dbeta), free(rmean), free(rvar), free(sum), free(sumsq), free(mean), free(sdy), free(sdyx);
}

/* Row shapes: whole lines per row (1024), rows that start on a line every 8th row (1000 f32:
 * 4000 bytes; bf16 2000), short rows below a line and a tail (37), one element, and many short
 * rows. Channel shapes: planes of 49 and 3136 (NCHW maps per plane), 64/65/3 channels (NHWC
 * rows), one channel. */
static const int64_t ROW_SHAPES[][2] = {{5, 1024}, {9, 1000}, {3, 37}, {2, 1}, {70, 64}};
static const int64_t CH_SHAPES[][4] = {/* N, C, S, G */
                                       {3, 64, 49, 32}, {2, 65, 7, 5},  {2, 3, 1, 3},
                                       {4, 1, 33, 1},   {2, 8, 3136, 4}};

/* The child: every case into path; the first line says whether this process streams. */
static int emit_all(const char *path) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return 1;
  fprintf(f, "streams %d\n", sn__stream_out(1));
  for (int t = 0; t < COUNT(THREADS); t++) {
    omp_set_num_threads(THREADS[t]);
    for (int di = 0; di < COUNT(DTYPES); di++)
      for (int oi = 0; oi < COUNT(OFFSETS); oi++)
        for (int ip = 0; ip < 2; ip++) {
          for (int s = 0; s < COUNT(ROW_SHAPES); s++)
            for (int k = 0; k < N_ROW_KERNELS; k++)
              row_case(f, k, ROW_SHAPES[s][0], ROW_SHAPES[s][1], DTYPES[di], OFFSETS[oi], ip,
                       THREADS[t]);
          for (int s = 0; s < COUNT(CH_SHAPES); s++)
            for (int l = 0; l < 2; l++)
              for (int k = 0; k < N_CH_KERNELS; k++)
                ch_case(f, k, CH_SHAPES[s][0], CH_SHAPES[s][1], CH_SHAPES[s][2], CH_SHAPES[s][3],
                        l ? SN_LAYOUT_NHWC : SN_LAYOUT_NCHW, DTYPES[di], OFFSETS[oi], ip,
                        THREADS[t]);
        }
  }
  return fclose(f) != 0;
}

/* ---- the parent -------------------------------------------------------------------------- */

/* This program's path, read at start (readlink of /proc/self/exe, which valgrind answers with
 * the program it runs, not itself; else argv[0]). */
static char self[4096];

/* Runs this program with --emit path and SN_STREAM_MIN_BYTES=min_bytes; requires exit 0. */
static void run_child(const char *path, const char *min_bytes) {
  fflush(NULL);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    setenv("SN_STREAM_MIN_BYTES", min_bytes, 1);
    execl(self, self, "--emit", path, (char *)NULL);
    _exit(127);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the child with SN_STREAM_MIN_BYTES=%s failed (status 0x%x)", min_bytes,
                (unsigned)status);
}

START_TEST(test_streamed_equals_ordinary) {
  char streamed[] = "/tmp/sn_stream_XXXXXX", ordinary[] = "/tmp/sn_ordinary_XXXXXX";
  const int fs = mkstemp(streamed), fo = mkstemp(ordinary);
  ck_assert(fs >= 0 && fo >= 0);
  close(fs), close(fo);
  run_child(streamed, "0");
  run_child(ordinary, NEVER);
  FILE *a = fopen(streamed, "r"), *b = fopen(ordinary, "r");
  ck_assert(a != NULL && b != NULL);
  char la[512], lb[512];
  int lines = 0, first = 1;
  for (;;) {
    const char *ga = fgets(la, sizeof la, a), *gb = fgets(lb, sizeof lb, b);
    if (ga == NULL || gb == NULL) {
      ck_assert_msg(ga == NULL && gb == NULL, "the two runs wrote different numbers of cases");
      break;
    }
    if (first) { /* "streams 1" and "streams 0" where streaming stores exist */
#if defined(__x86_64__) && defined(__GNUC__)
      ck_assert_str_eq(la, "streams 1\n");
#endif
      ck_assert_str_eq(lb, "streams 0\n");
      first = 0;
      continue;
    }
    ck_assert_msg(strstr(la, ": status 0 ") != NULL, "a case failed: %s", la);
    ck_assert_msg(strcmp(la, lb) == 0, "streamed and ordinary stores differ:\n  %s  %s", la, lb);
    lines++;
  }
  fclose(a), fclose(b);
  remove(streamed), remove(ordinary);
  /* thread counts × dtypes × offsets × in place or not × (row shapes × row kernels + channel
   * shapes × layouts × channel kernels) */
  ck_assert_int_eq(lines, COUNT(THREADS) * COUNT(DTYPES) * COUNT(OFFSETS) * 2 *
                              (COUNT(ROW_SHAPES) * N_ROW_KERNELS +
                               COUNT(CH_SHAPES) * 2 * N_CH_KERNELS));
}
END_TEST

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--emit") == 0) return emit_all(argv[2]);
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) self[len] = '\0';
  else snprintf(self, sizeof self, "%s", argv[0]);
  Suite *s = suite_create("stream_bitwise");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_streamed_equals_ordinary);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
