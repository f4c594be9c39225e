/*
 * statcheck.c — syncnorm-statcheck: checks that SyncBatchNorm over MPI computes what one process
 * computes on the whole batch. Run it the way you run training:
 *
 *   mpirun -np 4 syncnorm-statcheck --channels 64 --spatial 49 --layout nhwc --dtype bf16
 *
 * Every step each rank draws a batch of a random size (some ranks may get none), runs a
 * SyncBatchNorm training forward and backward, and rank 0 gathers all batches and recomputes
 * with a local BatchNorm over the concatenation. It prints the largest differences in y, dx,
 * dgamma/dbeta (local gradients summed over ranks) and the running statistics, and whether the
 * running statistics are bitwise identical on every rank. Exit status: 0 within tolerance,
 * 1 beyond it, 2 on bad arguments or a library error.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncnorm_mpi.h"

typedef struct {
  int64_t C, S, min_batch, max_batch;
  int steps, exact, threads_set;
  sn_layout_t layout;
  sn_dtype_t dtype;
  uint64_t seed;
  float momentum, eps;
  double tol;
} options_t;

static int rank = 0, nranks = 1;

static void die(const char *what, sn_status_t st) {
  fprintf(stderr, "syncnorm-statcheck: rank %d: %s: %s: %s\n", rank, what, sn_status_string(st),
          sn_last_error());
  MPI_Abort(MPI_COMM_WORLD, 2);
}
#define CHECK(call)                                \
  do {                                             \
    sn_status_t st_ = (call);                      \
    if (st_ != SN_OK) die(#call, st_);             \
  } while (0)

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np P syncnorm-statcheck [options]\n"
          "  --channels C      channels (default 64)\n"
          "  --spatial S       values per channel and sample, H*W (default 49)\n"
          "  --min-batch N     smallest per-rank batch, samples (default 0)\n"
          "  --max-batch N     largest per-rank batch, samples (default 4)\n"
          "  --layout L        nchw or nhwc (default nchw)\n"
          "  --dtype T         f32, bf16 or f16 (default f32)\n"
          "  --steps K         training steps (default 10)\n"
          "  --momentum M      running-stat momentum, or 'none' for the cumulative average (default 0.1)\n"
          "  --eps E           (default 1e-5)\n"
          "  --seed S          (default 1)\n"
          "  --exact           small dyadic inputs: every result must match bit for bit, except\n"
          "                    dgamma (a sum of per-rank f32 sums: held to --tol)\n"
          "  --tol T           max relative difference allowed (default 1e-5 for f32, 2e-2 for bf16/f16)\n"
          "  -h, --help\n");
}

static int print_errors = 1; /* rank 0 only */

/* An invalid option value: says which, then parse returns 0 (usage, exit 2). */
static int bad(const char *opt, const char *val) {
  if (print_errors) fprintf(stderr, "syncnorm-statcheck: invalid value '%s' for --%s\n", val, opt);
  return 0;
}

/* Whole decimal integers only (strtoll/strtoull alone take leading spaces and a sign, and clamp
 * a value out of range instead of failing); 0 when s is one, at least min. */
static int int_ok(const char *s, long long *v, long long min) {
  char *end;
  errno = 0;
  *v = strtoll(s, &end, 10);
  return ((s[0] >= '0' && s[0] <= '9') || s[0] == '-') && !*end && errno != ERANGE && *v >= min;
}

static int uint_ok(const char *s, uint64_t *v) {
  char *end;
  errno = 0;
  *v = strtoull(s, &end, 10);
  return s[0] >= '0' && s[0] <= '9' && !*end && errno != ERANGE;
}

static int parse(int argc, char **argv, options_t *o) {
  static const struct option opts[] = {
      {"channels", 1, 0, 'c'}, {"spatial", 1, 0, 's'}, {"min-batch", 1, 0, 'a'},
      {"max-batch", 1, 0, 'b'}, {"layout", 1, 0, 'l'}, {"dtype", 1, 0, 'd'},
      {"steps", 1, 0, 'k'},    {"momentum", 1, 0, 'm'}, {"eps", 1, 0, 'e'},
      {"seed", 1, 0, 'r'},     {"exact", 0, 0, 'x'},    {"tol", 1, 0, 't'},
      {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
  *o = (options_t){64, 49, 0, 4, 10, 0, 0, SN_LAYOUT_NCHW, SN_DTYPE_F32, 1, 0.1f, 1e-5f, -1.0};
  int c;
  char *end;
  long long v;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case 'c': if (!int_ok(optarg, &v, 1)) return bad("channels", optarg); o->C = v; break;
      case 's': if (!int_ok(optarg, &v, 1)) return bad("spatial", optarg); o->S = v; break;
      case 'a': if (!int_ok(optarg, &v, 0)) return bad("min-batch", optarg); o->min_batch = v; break;
      case 'b': if (!int_ok(optarg, &v, 0)) return bad("max-batch", optarg); o->max_batch = v; break;
      case 'k':
        if (!int_ok(optarg, &v, 1) || v > INT_MAX) return bad("steps", optarg);
        o->steps = (int)v;
        break;
      case 'e': /* as the library checks it: > 0 and finite */
        o->eps = strtof(optarg, &end);
        if (!*optarg || *end || !(o->eps > 0) || isinf(o->eps)) return bad("eps", optarg);
        break;
      case 'r': if (!uint_ok(optarg, &o->seed)) return bad("seed", optarg); break;
      case 't': /* an empty value parsed as 0 (exact) before */
        o->tol = strtod(optarg, &end);
        if (!*optarg || *end || !(o->tol >= 0)) return bad("tol", optarg);
        break;
      case 'x': o->exact = 1; break;
      case 'm':
        if (strcmp(optarg, "none") == 0) o->momentum = SN_MOMENTUM_CUMULATIVE;
        else if ((o->momentum = strtof(optarg, &end)), !*optarg || *end ||
                 !(o->momentum >= 0 && o->momentum <= 1)) /* as the library: in [0, 1] */
          return bad("momentum", optarg);
        break;
      case 'l':
        if (strcmp(optarg, "nchw") == 0) o->layout = SN_LAYOUT_NCHW;
        else if (strcmp(optarg, "nhwc") == 0) o->layout = SN_LAYOUT_NHWC;
        else return bad("layout", optarg);
        break;
      case 'd':
        if (strcmp(optarg, "f32") == 0) o->dtype = SN_DTYPE_F32;
        else if (strcmp(optarg, "bf16") == 0) o->dtype = SN_DTYPE_BF16;
        else if (strcmp(optarg, "f16") == 0) o->dtype = SN_DTYPE_F16;
        else return bad("dtype", optarg);
        break;
      case 'h': usage(stdout); return -1;
      default: return 0;
    }
  }
  if (optind != argc) {
    if (print_errors) fprintf(stderr, "syncnorm-statcheck: unexpected argument '%s'\n", argv[optind]);
    return 0;
  }
  if (o->min_batch > o->max_batch) {
    if (print_errors)
      fprintf(stderr, "syncnorm-statcheck: --min-batch %lld is above --max-batch %lld\n",
              (long long)o->min_batch, (long long)o->max_batch);
    return 0;
  }
  if (o->tol < 0) o->tol = o->dtype == SN_DTYPE_F32 ? 1e-5 : 2e-2;
  return 1;
}

/* Whether the buffers of a run fit: rank 0 holds six batches of max_batch samples from each of
 * `ranks` ranks, C·S elements each, and every byte count must fit int64 and size_t (such as
 * --max-batch 9223372036854775807 would overflow them). */
static int sizes_fit(const options_t *o, int ranks) {
  int64_t per, bytes, cap, all;
  return !__builtin_mul_overflow(o->C, o->S, &per) &&
         !__builtin_mul_overflow(per, (int64_t)sn_dtype_size(o->dtype), &bytes) &&
         !__builtin_mul_overflow(o->max_batch, (int64_t)ranks, &cap) &&
         !__builtin_mul_overflow(cap, bytes, &all) && !__builtin_mul_overflow(all, 6, &all) &&
         (uint64_t)all < (uint64_t)SIZE_MAX;
}

/* splitmix64: the same stream on every machine. */
static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return (double)(mix(s) >> 11) * 0x1.0p-53; }

/* Stores v in element i of a dtype buffer, rounded to nearest even (the library's convention). */
static void store(void *buf, int64_t i, double v, sn_dtype_t dt) {
  float f = (float)v;
  if (dt == SN_DTYPE_F32) { ((float *)buf)[i] = f; return; }
  uint32_t u;
  memcpy(&u, &f, 4);
  if (dt == SN_DTYPE_BF16) {
    u += 0x7fffu + ((u >> 16) & 1u);
    ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
  } else {
    _Float16 h = (_Float16)f;
    memcpy((uint16_t *)buf + i, &h, 2);
  }
}
static double load(const void *buf, int64_t i, sn_dtype_t dt) {
  if (dt == SN_DTYPE_F32) return ((const float *)buf)[i];
  uint16_t h = ((const uint16_t *)buf)[i];
  if (dt == SN_DTYPE_BF16) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  _Float16 v;
  memcpy(&v, &h, 2);
  return (double)v;
}

/* Random batch: per channel a mean and scale drawn from the step, so channels differ. */
static void fill(void *buf, int64_t n, const options_t *o, uint64_t seed, double amp) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n * o->C * o->S; i++) {
    int64_t c = o->layout == SN_LAYOUT_NCHW ? (i / o->S) % o->C : i % o->C;
    double v;
    if (o->exact) v = (double)((int64_t)(mix(&s) % 65) - 32) / 4.0;
    else v = amp * (0.3 * (double)(c % 7) + (uniform(&s) - 0.5) * (1.0 + (double)(c % 3)));
    store(buf, i, v, o->dtype);
  }
}

typedef struct { double abs, rel; } diff_t;

/* Largest |a − b| and that relative to the largest |b| (normwise-max relative error). */
static diff_t compare(const void *a, const void *b, int64_t n, sn_dtype_t dt) {
  double m = 0, ref = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = load(a, i, dt), y = load(b, i, dt);
    double d = fabs(x - y);
    if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    if (fabs(y) > ref) ref = fabs(y);
  }
  return (diff_t){m, ref > 0 ? m / ref : m};
}

/* Gathers each rank's `n` samples (bytes per sample `ps`) to rank 0, in rank order. */
static void gather(const void *mine, int64_t n, int64_t ps, void *all, const int64_t *sizes) {
  int *counts = NULL, *displs = NULL;
  if (rank == 0) {
    counts = malloc((size_t)nranks * sizeof *counts), displs = malloc((size_t)nranks * sizeof *displs);
    int64_t at = 0;
    for (int r = 0; r < nranks; r++) {
      counts[r] = (int)(sizes[r] * ps);
      displs[r] = (int)at;
      at += sizes[r] * ps;
    }
  }
  MPI_Gatherv(mine, (int)(n * ps), MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD);
  free(counts), free(displs);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  options_t o;
  print_errors = rank == 0;
  opterr = print_errors; /* getopt's own messages (an unknown option) once, not once per rank */
  int ok = parse(argc, argv, &o);
  if (ok <= 0) {
    if (ok == 0 && rank == 0) usage(stderr);
    MPI_Finalize();
    return ok == 0 ? 2 : 0;
  }
  if (!sizes_fit(&o, nranks)) {
    if (rank == 0)
      fprintf(stderr, "syncnorm-statcheck: invalid value: --channels %lld x --spatial %lld x "
              "--max-batch %lld x %d ranks is too large (rank 0 holds six such batches)\n",
              (long long)o.C, (long long)o.S, (long long)o.max_batch, nranks);
    MPI_Finalize();
    return 2;
  }
  if (o.max_batch * nranks < 2) {
    if (rank == 0) fprintf(stderr, "syncnorm-statcheck: --max-batch x ranks must be >= 2 (BatchNorm needs 2 values)\n");
    MPI_Finalize();
    return 2;
  }
  sn_comm_t *world = NULL;
  CHECK(sn_comm_create_mpi(&world, MPI_COMM_WORLD));
  sn_syncbn_config_t cfg = sn_syncbn_default_config(o.C);
  cfg.layout = o.layout, cfg.dtype = o.dtype, cfg.momentum = o.momentum, cfg.eps = o.eps;
  cfg.check_consistency = 1;
  sn_syncbn_t *sync = NULL, *ref = NULL;
  CHECK(sn_syncbn_create(&sync, &cfg, world));
  if (rank == 0) CHECK(sn_syncbn_create(&ref, &cfg, NULL));
  sn_syncbn_params_t ps, pr;
  CHECK(sn_syncbn_params(sync, &ps));
  if (rank == 0) CHECK(sn_syncbn_params(ref, &pr));

  const int64_t es = sn_dtype_size(o.dtype), per = o.C * o.S, bps = per * es;
  const int64_t cap = o.max_batch * nranks;
  char *x = malloc((size_t)(o.max_batch * bps + 1)), *dy = malloc((size_t)(o.max_batch * bps + 1));
  char *y = malloc((size_t)(o.max_batch * bps + 1)), *dx = malloc((size_t)(o.max_batch * bps + 1));
  char *X = NULL, *DY = NULL, *Y = NULL, *DX = NULL, *YS = NULL, *DXS = NULL;
  if (rank == 0) {
    X = malloc((size_t)(cap * bps + 1)), DY = malloc((size_t)(cap * bps + 1));
    Y = malloc((size_t)(cap * bps + 1)), DX = malloc((size_t)(cap * bps + 1));
    YS = malloc((size_t)(cap * bps + 1)), DXS = malloc((size_t)(cap * bps + 1));
  }
  double *g = malloc((size_t)(2 * o.C) * sizeof *g), *gsum = malloc((size_t)(2 * o.C) * sizeof *gsum);
  int64_t *sizes = malloc((size_t)nranks * sizeof *sizes);
  if (!x || !dy || !y || !dx || !g || !gsum || !sizes || (rank == 0 && (!X || !DY || !Y || !DX || !YS || !DXS))) {
    fprintf(stderr, "syncnorm-statcheck: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (rank == 0) {
    printf("syncnorm-statcheck: %d ranks, C=%lld, S=%lld, %s, %s, %d steps, %lld..%lld samples per rank%s\n",
           nranks, (long long)o.C, (long long)o.S, o.layout == SN_LAYOUT_NCHW ? "NCHW" : "NHWC",
           o.dtype == SN_DTYPE_F32 ? "f32" : o.dtype == SN_DTYPE_BF16 ? "bf16" : "f16", o.steps,
           (long long)o.min_batch, (long long)o.max_batch, o.exact ? ", exact inputs" : "");
    printf("%4s %6s %10s %10s %10s %10s %10s %10s %10s\n", "step", "N", "y", "dx", "dgamma", "dbeta",
           "run_mean", "run_var", "identical");
  }
  diff_t worst[6] = {{0, 0}};
  int all_identical = 1;
  for (int step = 0; step < o.steps; step++) {
    uint64_t s = o.seed * 1000003u + (uint64_t)step;
    int64_t total = 0;
    for (int r = 0; r < nranks; r++) { /* every rank draws the same sizes */
      sizes[r] = o.min_batch + (int64_t)(mix(&s) % (uint64_t)(o.max_batch - o.min_batch + 1));
      total += sizes[r];
    }
    for (int r = 0; total < 2; r = (r + 1) % nranks) /* training needs a global count >= 2 */
      if (sizes[r] < o.max_batch) sizes[r]++, total++;
    const int64_t n = sizes[rank];
    fill(x, n, &o, s * 31 + (uint64_t)rank, 1.0 + step);
    fill(dy, n, &o, s * 37 + (uint64_t)rank, 1.0);
    CHECK(sn_syncbn_forward(sync, y, x, n, o.S, 1));
    CHECK(sn_syncbn_backward(sync, dx, dy, x, n, o.S));
    for (int64_t c = 0; c < o.C; c++) g[c] = ps.grad_weight[c], g[o.C + c] = ps.grad_bias[c];
    MPI_Reduce(g, gsum, (int)(2 * o.C), MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    gather(x, n, bps, X, sizes);
    gather(dy, n, bps, DY, sizes);
    gather(y, n, bps, YS, sizes);
    gather(dx, n, bps, DXS, sizes);
    int same_mean = 0, same_var = 0;
    CHECK(sn_comm_all_identical(world, &same_mean, ps.running_mean, o.C * 4));
    CHECK(sn_comm_all_identical(world, &same_var, ps.running_var, o.C * 4));
    all_identical &= same_mean && same_var;
    if (rank != 0) continue;
    CHECK(sn_syncbn_forward(ref, Y, X, total, o.S, 1));
    CHECK(sn_syncbn_backward(ref, DX, DY, X, total, o.S));
    float *gw = malloc((size_t)o.C * 4), *gb = malloc((size_t)o.C * 4);
    for (int64_t c = 0; c < o.C; c++) gw[c] = (float)gsum[c], gb[c] = (float)gsum[o.C + c];
    diff_t d[6] = {compare(YS, Y, total * per, o.dtype), compare(DXS, DX, total * per, o.dtype),
                   compare(gw, pr.grad_weight, o.C, SN_DTYPE_F32), compare(gb, pr.grad_bias, o.C, SN_DTYPE_F32),
                   compare(ps.running_mean, pr.running_mean, o.C, SN_DTYPE_F32),
                   compare(ps.running_var, pr.running_var, o.C, SN_DTYPE_F32)};
    free(gw), free(gb);
    printf("%4d %6lld", step, (long long)total);
    for (int k = 0; k < 6; k++) {
      printf(" %10.3e", d[k].rel);
      if (d[k].rel > worst[k].rel || isnan(d[k].rel)) worst[k].rel = d[k].rel;
      if (d[k].abs > worst[k].abs || isnan(d[k].abs)) worst[k].abs = d[k].abs;
    }
    printf(" %10s\n", same_mean && same_var ? "yes" : "NO");
  }
  int pass = 1;
  if (rank == 0) {
    static const char *name[6] = {"y", "dx", "dgamma (sum over ranks)", "dbeta (sum over ranks)",
                                  "running_mean", "running_var"};
    printf("max differences vs single-process BatchNorm over the gathered batch:\n");
    for (int k = 0; k < 6; k++) {
      /* dγ/dβ are sums of per-rank f32 values: allow the f32 tolerance even for bf16 data */
      double tol = o.exact && k != 2 ? 0.0 : o.tol;
      int bad = !(worst[k].rel <= tol);
      pass &= !bad;
      printf("  %-24s abs %.3e  rel %.3e  %s\n", name[k], worst[k].abs, worst[k].rel, bad ? "FAIL" : "ok");
    }
    if (nranks == 1) printf("running stats: 1 rank, nothing to compare across ranks\n");
    else printf("running stats bitwise identical on all %d ranks: %s\n", nranks, all_identical ? "yes" : "NO");
    pass &= all_identical;
    printf("%s (tolerance %.1e%s)\n", pass ? "PASS" : "FAIL", o.tol, o.exact ? ", exact: bitwise except dgamma" : "");
  }
  MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
  sn_syncbn_destroy(sync);
  sn_syncbn_destroy(ref);
  sn_comm_destroy(world);
  free(x), free(dy), free(y), free(dx), free(X), free(DY), free(Y), free(DX), free(YS), free(DXS);
  free(g), free(gsum), free(sizes);
  MPI_Finalize();
  return pass ? 0 : 1;
}
