/*
 * statcheck.c — syncnorm-statcheck, two tools in one program:
 *
 *   mpirun -np 4 syncnorm-statcheck --channels 64 --spatial 49 --layout nhwc --dtype bf16
 *
 * a self test of SyncBatchNorm over MPI: every step each rank draws a batch of a random size
 * (some ranks may get none, and the global batch may be empty or hold one value per channel,
 * where every rank must get SN_ERR_INSUFFICIENT_COUNT with nothing written), runs a training
 * forward and backward, and rank 0 gathers all batches and computes the reference itself, in
 * fp64, with no library kernel: y, dx, dgamma/dbeta (the ranks' local gradients summed), the
 * batch mean and variance (sn_syncbn_batch_stats) and the running statistics (PyTorch's
 * update). It prints the largest differences with where they are (step, rank, channel) and
 * whether the running statistics are bitwise identical on every rank; and
 *
 *   syncnorm-statcheck --compare rank0.safetensors rank1.safetensors ...   (no mpirun)
 *
 * compares the BatchNorm state a job's ranks saved (statcheck_compare.c). Exit status: 0 within
 * tolerance, 1 beyond it, 2 on bad arguments or a library error.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "statcheck.h"
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
          "  --exact           small dyadic inputs, whose sums are exact in fp64 on any number of\n"
          "                    ranks: the batch mean must then match the fp64 reference to\n"
          "                    2^-48 relative (the variance, kept in f32, to 2^-23)\n"
          "  --tol T           max relative difference allowed (default 1e-5 for f32, 2e-2 for bf16/f16)\n"
          "  -h, --help\n"
          "       syncnorm-statcheck --compare [--tol T] [--params] FILE|DIR|GLOB...\n"
          "  compares the BatchNorm state (running_mean, running_var, num_batches_tracked; with\n"
          "  --params weight and bias) in the safetensors files a job's ranks saved; default\n"
          "  tolerance 0 (bitwise); exit 0 all agree, 1 some differ, 2 bad input\n");
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
  if (dt == SN_DTYPE_F64) return ((const double *)buf)[i];
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

/* The largest difference of a quantity so far, relative to the largest |reference| of its
 * comparison (normwise-max), and where it was. */
typedef struct {
  double abs, rel;
  int step;
  int64_t at; /* activations: the element of the gathered batch; per channel: the channel */
} worst_t;

enum { Q_Y, Q_DX, Q_DGAMMA, Q_DBETA, Q_MEAN, Q_VAR, Q_RMEAN, Q_RVAR, NQ };
static const char *const q_name[NQ] = {"y", "dx", "dgamma (sum over ranks)",
                                       "dbeta (sum over ranks)", "batch mean", "batch var",
                                       "running_mean", "running_var"};
/* The batch mean of exactly representable inputs (--exact): their sums are exact, so what is
 * left are a few fp64 roundings; the layer keeps the variance in f32: one f32 rounding. */
#define EXACT_MEAN_RTOL 0x1p-48
#define EXACT_VAR_RTOL 0x1p-23

/* got [n] (dtype) against ref [n] (fp64): the largest difference relative to `scale` (0: the
 * largest |ref|), and the worst so far (w) updated with where it is. A result that cancels (dx
 * of a batch of two values is 0) is accurate relative to its terms, which scale gives. */
static double compare(const void *got, sn_dtype_t dt, const double *ref, int64_t n,
                      double scale, int step, worst_t *w) {
  double m = 0.0, largest = 0.0;
  int64_t at = -1;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(load(got, i, dt) - ref[i]);
    if (isnan(d)) d = INFINITY;
    if (at < 0 || d > m) m = d, at = i;
    if (fabs(ref[i]) > largest) largest = fabs(ref[i]);
  }
  if (scale == 0.0) scale = largest;
  const double rel = scale > 0 ? m / scale : m;
  if (at >= 0 && (rel > w->rel || w->step < 0)) *w = (worst_t){m, rel, step, at};
  return rel;
}

/* Where element i of the gathered batch comes from: its rank, sample (in that rank's batch)
 * and channel. */
static void locate(int64_t i, const options_t *o, const int64_t *sizes, int *r, int64_t *sample,
                   int64_t *c) {
  int64_t g = i / (o->C * o->S), in = i % (o->C * o->S);
  *c = o->layout == SN_LAYOUT_NCHW ? in / o->S : in % o->C;
  *r = 0;
  while (*r < nranks - 1 && g >= sizes[*r]) g -= sizes[(*r)++];
  *sample = g;
}

/* Element (sample g, channel c, position p) of a batch in o's layout. */
static int64_t at_of(const options_t *o, int64_t g, int64_t c, int64_t p) {
  return o->layout == SN_LAYOUT_NCHW ? (g * o->C + c) * o->S + p : (g * o->S + p) * o->C + c;
}

/* What the fp64 reference computes: y, dx over the batch's elements; mean, var (biased),
 * dgamma, dbeta [C]; and the scale of dx's, dgamma's and dbeta's terms (max |γ·rstd·dy|,
 * Σ|dy·x̂| and Σ|dy|) that their differences are measured against. */
typedef struct {
  double *y, *dx, *mean, *var, *dgamma, *dbeta;
  double scale[3];
} ref_t;

/* The fp64 reference of one training step over the gathered batch (total samples):
 * BatchNorm's forward (biased variance) and backward (Ioffe & Szegedy 2015), computed here
 * with two passes, independent of the library's kernels. */
static void reference(const options_t *o, const void *X, const void *DY, int64_t total,
                      const double *gamma, const double *beta, ref_t *r) {
  const double cnt = (double)(total * o->S);
  double *scale = r->scale;
  scale[0] = scale[1] = scale[2] = 0.0;
  for (int64_t c = 0; c < o->C; c++) {
    double s = 0.0, q = 0.0, sdy = 0.0, sdyx = 0.0, ady = 0.0, adyx = 0.0;
    for (int64_t g = 0; g < total; g++)
      for (int64_t p = 0; p < o->S; p++) s += load(X, at_of(o, g, c, p), o->dtype);
    const double m = s / cnt;
    for (int64_t g = 0; g < total; g++)
      for (int64_t p = 0; p < o->S; p++) {
        const double d = load(X, at_of(o, g, c, p), o->dtype) - m;
        q += d * d;
      }
    const double v = q / cnt, rstd = 1.0 / sqrt(v + (double)o->eps);
    for (int64_t g = 0; g < total; g++)
      for (int64_t p = 0; p < o->S; p++) {
        const int64_t i = at_of(o, g, c, p);
        const double xh = (load(X, i, o->dtype) - m) * rstd, d = load(DY, i, o->dtype);
        r->y[i] = xh * gamma[c] + beta[c];
        sdy += d, sdyx += d * xh, ady += fabs(d), adyx += fabs(d * xh);
        scale[0] = fmax(scale[0], fabs(gamma[c] * rstd * d));
      }
    scale[1] = fmax(scale[1], adyx), scale[2] = fmax(scale[2], ady);
    for (int64_t g = 0; g < total; g++)
      for (int64_t p = 0; p < o->S; p++) {
        const int64_t i = at_of(o, g, c, p);
        const double xh = (load(X, i, o->dtype) - m) * rstd;
        r->dx[i] = gamma[c] * rstd * (load(DY, i, o->dtype) - sdy / cnt - xh * sdyx / cnt);
      }
    r->mean[c] = m, r->var[c] = v, r->dgamma[c] = sdyx, r->dbeta[c] = sdy;
  }
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

/* Whether every rank's flag is set. */
static int all_ranks(int flag) {
  MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return flag;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--compare") == 0) return statcheck_compare(argc - 1, argv + 1);
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
  if (o.max_batch * nranks * o.S < 2) { /* no step could be a training step */
    if (rank == 0)
      fprintf(stderr, "syncnorm-statcheck: --max-batch %lld x %d ranks x --spatial %lld gives "
              "at most %lld value per channel: BatchNorm training needs 2\n",
              (long long)o.max_batch, nranks, (long long)o.S,
              (long long)(o.max_batch * nranks * o.S));
    MPI_Finalize();
    return 2;
  }
  sn_comm_t *world = NULL;
  CHECK(sn_comm_create_mpi(&world, MPI_COMM_WORLD));
  sn_syncbn_config_t cfg = sn_syncbn_default_config(o.C);
  cfg.layout = o.layout, cfg.dtype = o.dtype, cfg.momentum = o.momentum, cfg.eps = o.eps;
  cfg.check_consistency = 1;
  sn_syncbn_t *sync = NULL;
  CHECK(sn_syncbn_create(&sync, &cfg, world));
  sn_syncbn_params_t ps;
  CHECK(sn_syncbn_params(sync, &ps));

  const int64_t es = sn_dtype_size(o.dtype), per = o.C * o.S, bps = per * es;
  const int64_t cap = o.max_batch * nranks;
  char *x = malloc((size_t)(o.max_batch * bps + 1)), *dy = malloc((size_t)(o.max_batch * bps + 1));
  char *y = malloc((size_t)(o.max_batch * bps + 1)), *dx = malloc((size_t)(o.max_batch * bps + 1));
  char *X = NULL, *DY = NULL, *YS = NULL, *DXS = NULL;
  double *Y = NULL, *DX = NULL;
  if (rank == 0) {
    X = malloc((size_t)(cap * bps + 1)), DY = malloc((size_t)(cap * bps + 1));
    YS = malloc((size_t)(cap * bps + 1)), DXS = malloc((size_t)(cap * bps + 1));
    Y = malloc((size_t)(cap * per + 1) * sizeof *Y), DX = malloc((size_t)(cap * per + 1) * sizeof *DX);
  }
  /* per channel: gamma, beta, the reference's mean, var, dgamma, dbeta, running mean and var,
   * the layer's batch mean and var, the summed gradients */
  double *pc = malloc((size_t)(12 * o.C) * sizeof *pc);
  int64_t *sizes = malloc((size_t)nranks * sizeof *sizes);
  if (!x || !dy || !y || !dx || !pc || !sizes ||
      (rank == 0 && (!X || !DY || !YS || !DXS || !Y || !DX))) {
    fprintf(stderr, "syncnorm-statcheck: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  double *gamma = pc, *beta = pc + o.C, *rmean = pc + 2 * o.C, *rvar = pc + 3 * o.C;
  double *mean = pc + 4 * o.C, *var = pc + 5 * o.C, *dgamma = pc + 6 * o.C, *dbeta = pc + 7 * o.C;
  double *bmean = pc + 8 * o.C, *bvar = pc + 9 * o.C, *g = pc + 10 * o.C;
  uint64_t ps_seed = o.seed * 7919u + 17u;
  for (int64_t c = 0; c < o.C; c++) { /* the same parameters on every rank, exact in f32 */
    gamma[c] = (double)(float)(0.5 + uniform(&ps_seed)), beta[c] = (double)(float)(uniform(&ps_seed) - 0.5);
    ps.weight[c] = (float)gamma[c], ps.bias[c] = (float)beta[c];
    rmean[c] = 0.0, rvar[c] = 1.0; /* PyTorch's initial running statistics */
  }
  int64_t tracked = 0;
  if (rank == 0) {
    printf("syncnorm-statcheck: %d ranks, C=%lld, S=%lld, %s, %s, %d steps, %lld..%lld samples per rank%s; "
           "reference: fp64 over the gathered batch\n",
           nranks, (long long)o.C, (long long)o.S, o.layout == SN_LAYOUT_NCHW ? "NCHW" : "NHWC",
           o.dtype == SN_DTYPE_F32 ? "f32" : o.dtype == SN_DTYPE_BF16 ? "bf16" : "f16", o.steps,
           (long long)o.min_batch, (long long)o.max_batch, o.exact ? ", exact inputs" : "");
    printf("%4s %6s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "step", "N", "y", "dx", "dgamma",
           "dbeta", "mean", "var", "run_mean", "run_var", "identical");
  }
  worst_t worst[NQ];
  for (int q = 0; q < NQ; q++) worst[q] = (worst_t){0, 0, -1, -1};
  int all_identical = 1, pass = 1;
  for (int step = 0; step < o.steps; step++) {
    uint64_t s = o.seed * 1000003u + (uint64_t)step;
    int64_t total = 0;
    for (int r = 0; r < nranks; r++) { /* every rank draws the same sizes */
      sizes[r] = o.min_batch + (int64_t)(mix(&s) % (uint64_t)(o.max_batch - o.min_batch + 1));
      total += sizes[r];
    }
    const int64_t n = sizes[rank];
    fill(x, n, &o, s * 31 + (uint64_t)rank, 1.0 + step);
    fill(dy, n, &o, s * 37 + (uint64_t)rank, 1.0);
    memset(y, 0x7e, (size_t)(n * bps)); /* a poison a forward that writes nothing leaves */
    const sn_status_t st = sn_syncbn_forward(sync, y, x, n, o.S, 1);
    if (total * o.S == 1) { /* one value per channel: an error everywhere, nothing written */
      int untouched = st == SN_ERR_INSUFFICIENT_COUNT;
      for (int64_t i = 0; i < n * bps; i++) untouched &= y[i] == 0x7e;
      untouched &= *ps.num_batches_tracked == tracked;
      untouched = all_ranks(untouched);
      pass &= untouched;
      if (rank == 0)
        printf("%4d %6lld  one value per channel: %s\n", step, (long long)total,
               untouched ? "SN_ERR_INSUFFICIENT_COUNT on every rank, nothing written (ok)"
                         : "NOT the expected SN_ERR_INSUFFICIENT_COUNT with nothing written (FAIL)");
      continue;
    }
    if (st != SN_OK) die("sn_syncbn_forward", st);
    CHECK(sn_syncbn_backward(sync, dx, dy, x, n, o.S));
    tracked++;
    int64_t bcount = -1;
    CHECK(sn_syncbn_batch_stats(sync, &bcount, bmean, bvar));
    for (int64_t c = 0; c < o.C; c++) g[c] = ps.grad_weight[c], g[o.C + c] = ps.grad_bias[c];
    MPI_Allreduce(MPI_IN_PLACE, g, (int)(2 * o.C), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    gather(x, n, bps, X, sizes);
    gather(dy, n, bps, DY, sizes);
    gather(y, n, bps, YS, sizes);
    gather(dx, n, bps, DXS, sizes);
    int same_mean = 0, same_var = 0, same_batch = 1;
    CHECK(sn_comm_all_identical(world, &same_mean, ps.running_mean, o.C * 4));
    CHECK(sn_comm_all_identical(world, &same_var, ps.running_var, o.C * 4));
    if (total > 0) CHECK(sn_comm_all_identical(world, &same_batch, bmean, 2 * o.C * 8));
    all_identical &= same_mean && same_var && same_batch;
    if (rank != 0) continue;
    if (bcount != total * o.S) {
      printf("%4d %6lld  sn_syncbn_batch_stats gives a count of %lld, not %lld (FAIL)\n", step,
             (long long)total, (long long)bcount, (long long)(total * o.S));
      pass = 0;
      continue;
    }
    if (total == 0) { /* an empty global batch: counted, nothing else */
      printf("%4d %6lld  empty global batch: counted (num_batches_tracked %lld)\n", step,
             (long long)total, (long long)*ps.num_batches_tracked);
      pass &= *ps.num_batches_tracked == tracked;
      continue;
    }
    ref_t ref = {Y, DX, mean, var, dgamma, dbeta, {0.0, 0.0, 0.0}};
    reference(&o, X, DY, total, gamma, beta, &ref);
    const double *scale = ref.scale;
    const double f = o.momentum == SN_MOMENTUM_CUMULATIVE ? 1.0 / (double)tracked : o.momentum;
    const double N = (double)(total * o.S);
    for (int64_t c = 0; c < o.C; c++) {
      rmean[c] = (1.0 - f) * rmean[c] + f * mean[c];
      rvar[c] = (1.0 - f) * rvar[c] + f * var[c] * N / (N - 1.0);
    }
    double d[NQ];
    d[Q_Y] = compare(YS, o.dtype, Y, total * per, 0.0, step, &worst[Q_Y]);
    d[Q_DX] = compare(DXS, o.dtype, DX, total * per, scale[0], step, &worst[Q_DX]);
    d[Q_DGAMMA] = compare(g, SN_DTYPE_F64, dgamma, o.C, scale[1], step, &worst[Q_DGAMMA]);
    d[Q_DBETA] = compare(g + o.C, SN_DTYPE_F64, dbeta, o.C, scale[2], step, &worst[Q_DBETA]);
    d[Q_MEAN] = compare(bmean, SN_DTYPE_F64, mean, o.C, 0.0, step, &worst[Q_MEAN]);
    d[Q_VAR] = compare(bvar, SN_DTYPE_F64, var, o.C, 0.0, step, &worst[Q_VAR]);
    d[Q_RMEAN] = compare(ps.running_mean, SN_DTYPE_F32, rmean, o.C, 0.0, step, &worst[Q_RMEAN]);
    d[Q_RVAR] = compare(ps.running_var, SN_DTYPE_F32, rvar, o.C, 0.0, step, &worst[Q_RVAR]);
    pass &= *ps.num_batches_tracked == tracked;
    printf("%4d %6lld", step, (long long)total);
    for (int q = 0; q < NQ; q++) printf(" %9.2e", d[q]);
    printf(" %9s\n", same_mean && same_var && same_batch ? "yes" : "NO");
  }
  if (rank == 0) {
    printf("max differences vs the fp64 reference (relative to the largest |reference|; dx, "
           "dgamma, dbeta to their largest terms):\n");
    for (int q = 0; q < NQ; q++) {
      const double tol = o.exact && q == Q_MEAN  ? fmin(o.tol, EXACT_MEAN_RTOL)
                         : o.exact && q == Q_VAR ? fmin(o.tol, EXACT_VAR_RTOL)
                                                 : o.tol;
      const int bad = !(worst[q].rel <= tol);
      pass &= !bad;
      char where[160] = "";
      if (worst[q].step >= 0 && (q == Q_Y || q == Q_DX)) {
        int r;
        int64_t sample, c;
        /* the sizes of that step, drawn again */
        uint64_t s = o.seed * 1000003u + (uint64_t)worst[q].step;
        for (int k = 0; k < nranks; k++)
          sizes[k] = o.min_batch + (int64_t)(mix(&s) % (uint64_t)(o.max_batch - o.min_batch + 1));
        locate(worst[q].at, &o, sizes, &r, &sample, &c);
        snprintf(where, sizeof where, "step %d, rank %d, sample %lld, channel %lld",
                 worst[q].step, r, (long long)sample, (long long)c);
      } else if (worst[q].step >= 0) {
        snprintf(where, sizeof where, "step %d, channel %lld", worst[q].step,
                 (long long)worst[q].at);
      }
      printf("  %-24s abs %.3e  rel %.3e  %-4s %s\n", q_name[q], worst[q].abs, worst[q].rel,
             bad ? "FAIL" : "ok", where);
    }
    printf("num_batches_tracked: %lld (%lld steps counted)\n", (long long)*ps.num_batches_tracked,
           (long long)tracked);
    if (nranks == 1) printf("running stats: 1 rank, nothing to compare across ranks\n");
    else printf("running and batch statistics bitwise identical on all %d ranks: %s\n", nranks,
                all_identical ? "yes" : "NO");
    pass &= all_identical;
    printf("%s (tolerance %.1e%s)\n", pass ? "PASS" : "FAIL", o.tol,
           o.exact ? "; exact inputs: batch mean to 2^-48, variance to 2^-23" : "");
  }
  MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
  sn_syncbn_destroy(sync);
  sn_comm_destroy(world);
  free(x), free(dy), free(y), free(dx), free(X), free(DY), free(YS), free(DXS), free(Y), free(DX);
  free(pc), free(sizes);
  MPI_Finalize();
  return pass ? 0 : 1;
}
