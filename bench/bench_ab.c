/*
 * bench_ab.c — two builds of libsyncnorm compared in one process, call by call.
 *
 * This machine's memory bandwidth moves in phases (see docs/BENCHMARKS.md), so two separate
 * runs of bench_cpu cannot tell a 10 % change from the weather. bench_ab loads two copies of the
 * library (dlopen, RTLD_LOCAL | RTLD_DEEPBIND: each resolves its own symbols), runs one kernel
 * on the same buffers in the order A B B A, A B B A, ..., and reports both medians and the
 * median of the per-pair ratios B/A: a phase change moves both calls of a pair alike.
 *
 *   bench_ab LIB_A LIB_B KERNEL [options]
 *   KERNEL: layernorm_fwd layernorm_bwd rmsnorm_fwd rmsnorm_bwd batchnorm_stats
 *           batchnorm_apply batchnorm_bwd_reduce batchnorm_bwd_apply groupnorm_fwd
 *           groupnorm_bwd batchnorm_train_fwd (sn_batchnorm_fwd; stats, finalize, apply in
 *           a build without it) batchnorm_bwd (sn_batchnorm_bwd; bwd_reduce then bwd_apply in
 *           a build without it): these two as bench_cpu times them; batchnorm_train_fwd_split
 *           (stats, finalize, apply); batchnorm_bwd_split (bwd_reduce then bwd_apply);
 *           add_layernorm_fwd add_rmsnorm_fwd (the residual is dy's buffer)
 *   --rows R --d D          row norms (default 8192 × 1024)
 *   --n N --c C --s S       BatchNorm / GroupNorm [N, C, S] (default 32 × 64 × 3136), G = 32
 *   --nhwc                  NHWC instead of NCHW
 *   --dtype f32|bf16|f16    activations (default f32)
 *   --reps P                pairs A B (default 21)
 *   --cold                  a 256 MiB read sweep before every call (caches cold)
 *   --malloc                buffers from malloc (4 KiB pages) instead of bu_alloc (huge pages
 *                           requested): the hardware prefetchers stop at page boundaries
 *   --no-beta               beta NULL (the forwards that take one: LayerNorm, fused
 *                           LayerNorm, BatchNorm, GroupNorm)
 * Output: one line, "A ms  B ms  B/A (pairs p10..p90)". Exit status 2 on bad usage, 3 if a call
 * fails. Not a test: a development tool for changes to the kernels.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "syncnorm.h"

typedef struct {
  __typeof__(sn_layernorm_fwd) *ln_fwd;
  __typeof__(sn_layernorm_bwd) *ln_bwd;
  __typeof__(sn_rmsnorm_fwd) *rms_fwd;
  __typeof__(sn_rmsnorm_bwd) *rms_bwd;
  __typeof__(sn_add_layernorm_fwd) *add_ln_fwd;
  __typeof__(sn_add_rmsnorm_fwd) *add_rms_fwd;
  __typeof__(sn_batchnorm_stats) *bn_stats;
  __typeof__(sn_batchnorm_finalize) *bn_finalize;
  __typeof__(sn_batchnorm_apply) *bn_apply;
  __typeof__(sn_batchnorm_bwd_reduce) *bn_bwd_reduce;
  __typeof__(sn_batchnorm_bwd_apply) *bn_bwd_apply;
  __typeof__(sn_batchnorm_bwd) *bn_bwd; /* NULL in builds before it existed */
  __typeof__(sn_batchnorm_fwd) *bn_fwd; /* NULL in builds before it existed */
  __typeof__(sn_groupnorm_fwd) *gn_fwd;
  __typeof__(sn_groupnorm_bwd) *gn_bwd;
  __typeof__(sn_status_string) *status_string;
  __typeof__(sn_last_error) *last_error; /* this copy's thread-local message */
} lib_t;

static void *sym(void *h, const char *path, const char *name) {
  void *p = dlsym(h, name);
  if (p == NULL) bu_die("%s: no symbol %s", path, name);
  return p;
}

static lib_t load(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == NULL) bu_die("dlopen %s: %s", path, dlerror());
  lib_t l;
  l.ln_fwd = sym(h, path, "sn_layernorm_fwd");
  l.ln_bwd = sym(h, path, "sn_layernorm_bwd");
  l.rms_fwd = sym(h, path, "sn_rmsnorm_fwd");
  l.rms_bwd = sym(h, path, "sn_rmsnorm_bwd");
  l.add_ln_fwd = sym(h, path, "sn_add_layernorm_fwd");
  l.add_rms_fwd = sym(h, path, "sn_add_rmsnorm_fwd");
  l.bn_stats = sym(h, path, "sn_batchnorm_stats");
  l.bn_finalize = sym(h, path, "sn_batchnorm_finalize");
  l.bn_apply = sym(h, path, "sn_batchnorm_apply");
  l.bn_bwd_reduce = sym(h, path, "sn_batchnorm_bwd_reduce");
  l.bn_bwd_apply = sym(h, path, "sn_batchnorm_bwd_apply");
  l.bn_bwd = (__typeof__(sn_batchnorm_bwd) *)dlsym(h, "sn_batchnorm_bwd");
  l.bn_fwd = (__typeof__(sn_batchnorm_fwd) *)dlsym(h, "sn_batchnorm_fwd");
  l.gn_fwd = sym(h, path, "sn_groupnorm_fwd");
  l.gn_bwd = sym(h, path, "sn_groupnorm_bwd");
  l.status_string = sym(h, path, "sn_status_string");
  l.last_error = sym(h, path, "sn_last_error");
  return l;
}

enum { LN_FWD, LN_BWD, RMS_FWD, RMS_BWD, BN_STATS, BN_APPLY, BN_BWD_REDUCE, BN_BWD_APPLY, GN_FWD,
       GN_BWD, BN_TRAIN, BN_BWD, ADD_LN_FWD, ADD_RMS_FWD, BN_BWD_SPLIT, BN_TRAIN_SPLIT,
       NKERNELS };
static const char *const NAMES[NKERNELS] = {
    "layernorm_fwd",   "layernorm_bwd",        "rmsnorm_fwd",         "rmsnorm_bwd",
    "batchnorm_stats", "batchnorm_apply",      "batchnorm_bwd_reduce", "batchnorm_bwd_apply",
    "groupnorm_fwd",   "groupnorm_bwd",        "batchnorm_train_fwd", "batchnorm_bwd",
    "add_layernorm_fwd", "add_rmsnorm_fwd",     "batchnorm_bwd_split", "batchnorm_train_fwd_split"};
#define GROUPS 32

/* Exits unless a call into library l returned SN_OK. */
#define AB_CHECK(l, call)                                                                      \
  do {                                                                                         \
    sn_status_t ab_st_ = (call);                                                               \
    if (ab_st_ != SN_OK)                                                                       \
      bu_die("%s failed: %s: %s", #call, (l).status_string(ab_st_), (l).last_error());         \
  } while (0)

typedef struct {
  int64_t rows, d, n, c, s;
  sn_layout_t layout;
  sn_dtype_t dtype;
  void *x, *y, *dy, *so;                        /* activations (so: the fused sum_out) */
  float *gamma, *beta, *mean, *rstd, *dg, *db; /* per feature / row / group, f32 */
  double *sum, *sumsq, *bmean;                  /* BatchNorm [C], fp64 */
  float *var, *brstd;                           /* BatchNorm [C], f32 */
} bufs_t;

static sn_status_t run(const lib_t *l, int k, bufs_t *b) {
  const sn_dtype_t dt = b->dtype;
  switch (k) {
    case LN_FWD:
      return l->ln_fwd(b->y, b->mean, b->rstd, b->x, b->gamma, b->beta, b->rows, b->d, 1e-5f, dt);
    case LN_BWD:
      return l->ln_bwd(b->y, b->dg, b->db, b->dy, b->x, b->mean, b->rstd, b->gamma, b->rows, b->d,
                       dt);
    case RMS_FWD: return l->rms_fwd(b->y, b->rstd, b->x, b->gamma, b->rows, b->d, 1e-5f, dt);
    case RMS_BWD:
      return l->rms_bwd(b->y, b->dg, b->dy, b->x, b->rstd, b->gamma, b->rows, b->d, dt);
    case ADD_LN_FWD:
      return l->add_ln_fwd(b->y, b->so, b->mean, b->rstd, b->x, b->dy, b->gamma, b->beta,
                           b->rows, b->d, 1e-5f, dt);
    case ADD_RMS_FWD:
      return l->add_rms_fwd(b->y, b->so, b->rstd, b->x, b->dy, b->gamma, b->rows, b->d, 1e-5f,
                            dt);
    case BN_STATS:
      return l->bn_stats(b->sum, b->sumsq, b->x, NULL, b->n, b->c, b->s, b->layout, dt);
    case BN_APPLY:
      return l->bn_apply(b->y, b->x, b->bmean, b->brstd, b->gamma, b->beta, b->n, b->c, b->s,
                         b->layout, dt);
    case BN_BWD_REDUCE:
      return l->bn_bwd_reduce(b->sum, b->sumsq, b->dy, b->x, b->bmean, b->brstd, b->n, b->c,
                              b->s, b->layout, dt);
    case BN_BWD_APPLY:
      return l->bn_bwd_apply(b->y, b->dy, b->x, b->bmean, b->brstd, b->gamma, b->sum, b->sumsq,
                             b->n * b->s, b->n, b->c, b->s, b->layout, dt);
    case GN_FWD:
      return l->gn_fwd(b->y, b->mean, b->rstd, b->x, b->gamma, b->beta, b->n, b->c, b->s, GROUPS,
                       1e-5f, b->layout, dt);
    case BN_TRAIN:
      if (l->bn_fwd)
        return l->bn_fwd(b->y, b->bmean, b->var, b->brstd, b->x, NULL, b->gamma, b->beta, b->n,
                         b->c, b->s, 1e-5f, b->layout, dt);
      __attribute__((fallthrough)); /* a build without it: the split */
    case BN_TRAIN_SPLIT: { /* stats → finalize → apply, as one training forward */
      sn_status_t st = l->bn_stats(b->sum, b->sumsq, b->x, NULL, b->n, b->c, b->s, b->layout, dt);
      if (st == SN_OK)
        st = l->bn_finalize(b->bmean, b->var, b->brstd, b->sum, b->sumsq, NULL, b->n * b->s, b->c,
                            1e-5f);
      return st != SN_OK ? st
                         : l->bn_apply(b->y, b->x, b->bmean, b->brstd, b->gamma, b->beta, b->n,
                                       b->c, b->s, b->layout, dt);
    }
    case BN_BWD:
      if (l->bn_bwd)
        return l->bn_bwd(b->y, b->dg, b->db, b->dy, b->x, b->bmean, b->brstd, b->gamma, b->n,
                         b->c, b->s, b->layout, dt);
      __attribute__((fallthrough)); /* a build without it: the split */
    case BN_BWD_SPLIT: { /* backward sums → dx, as one backward */
      sn_status_t st = l->bn_bwd_reduce(b->sum, b->sumsq, b->dy, b->x, b->bmean, b->brstd, b->n,
                                        b->c, b->s, b->layout, dt);
      return st != SN_OK ? st
                         : l->bn_bwd_apply(b->y, b->dy, b->x, b->bmean, b->brstd, b->gamma,
                                           b->sum, b->sumsq, b->n * b->s, b->n, b->c, b->s,
                                           b->layout, dt);
    }
    default:
      return l->gn_bwd(b->y, b->dg, b->db, b->dy, b->x, b->mean, b->rstd, b->gamma, b->n, b->c,
                       b->s, GROUPS, b->layout, dt);
  }
}

static void usage(void) {
  fprintf(stderr, "usage: bench_ab LIB_A LIB_B KERNEL [--rows R --d D | --n N --c C --s S] "
                  "[--nhwc] [--dtype f32|bf16|f16] [--reps P] [--cold] [--malloc] [--no-beta]\nKERNEL:");
  for (int k = 0; k < NKERNELS; k++) fprintf(stderr, " %s", NAMES[k]);
  fprintf(stderr, "\n");
  exit(2);
}

static int64_t arg_i64(const char *s) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < 1) usage();
  return (int64_t)v;
}

static void *get(int64_t elems, int64_t esize, int use_malloc) {
  const size_t bytes = (size_t)(elems > 0 ? elems : 1) * (size_t)esize;
  void *p = use_malloc ? malloc(bytes) : bu_alloc(bytes);
  if (p == NULL) bu_die("out of memory (%zu bytes)", bytes);
  if (use_malloc) memset(p, 0, bytes); /* fault the pages in before any timing */
  return p;
}

int main(int argc, char **argv) {
  if (argc < 4) usage();
  int k = 0;
  while (k < NKERNELS && strcmp(argv[3], NAMES[k]) != 0) k++;
  if (k == NKERNELS) usage();
  bufs_t b = {.rows = 8192, .d = 1024, .n = 32, .c = 64, .s = 3136, .layout = SN_LAYOUT_NCHW,
              .dtype = SN_DTYPE_F32};
  int reps = 21, cold = 0, use_malloc = 0, no_beta = 0;
  for (int i = 4; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--nhwc")) b.layout = SN_LAYOUT_NHWC;
    else if (!strcmp(o, "--cold")) cold = 1;
    else if (!strcmp(o, "--malloc")) use_malloc = 1;
    else if (!strcmp(o, "--no-beta")) no_beta = 1;
    else if (v == NULL) usage();
    else if (!strcmp(o, "--rows")) b.rows = arg_i64(v), i++;
    else if (!strcmp(o, "--d")) b.d = arg_i64(v), i++;
    else if (!strcmp(o, "--n")) b.n = arg_i64(v), i++;
    else if (!strcmp(o, "--c")) b.c = arg_i64(v), i++;
    else if (!strcmp(o, "--s")) b.s = arg_i64(v), i++;
    else if (!strcmp(o, "--reps")) reps = (int)arg_i64(v), i++;
    else if (!strcmp(o, "--dtype") && !strcmp(v, "f32")) b.dtype = SN_DTYPE_F32, i++;
    else if (!strcmp(o, "--dtype") && !strcmp(v, "bf16")) b.dtype = SN_DTYPE_BF16, i++;
    else if (!strcmp(o, "--dtype") && !strcmp(v, "f16")) b.dtype = SN_DTYPE_F16, i++;
    else usage();
  }
  const int fused_add = k == ADD_LN_FWD || k == ADD_RMS_FWD;
  const int rownorm = k <= RMS_BWD || fused_add;
  if (!rownorm && k >= GN_FWD && b.c % GROUPS != 0)
    bu_die("groupnorm: --c must be a multiple of 32");
  const lib_t lib[2] = {load(argv[1]), load(argv[2])};

  const int64_t elems = rownorm ? b.rows * b.d : b.n * b.c * b.s, esize = sn_dtype_size(b.dtype);
  const int64_t feat = rownorm ? b.d : b.c, per_row = rownorm ? b.rows : b.n * GROUPS;
  b.x = get(elems, esize, use_malloc), b.y = get(elems, esize, use_malloc);
  b.dy = get(elems, esize, use_malloc);
  b.so = fused_add ? get(elems, esize, use_malloc) : NULL;
  bu_fill(b.x, elems, b.dtype, 1, -1.0f, 3.0f);
  bu_fill(b.dy, elems, b.dtype, 2, -1.0f, 1.0f);
  b.gamma = get(feat, 4, 1), b.beta = get(feat, 4, 1), b.dg = get(feat, 4, 1);
  b.db = get(feat, 4, 1), b.mean = get(per_row, 4, 1), b.rstd = get(per_row, 4, 1);
  bu_fill_f32(b.gamma, feat, 3, 0.5f, 1.5f);
  bu_fill_f32(b.beta, feat, 4, -0.5f, 0.5f);
  if (no_beta) b.beta = NULL; /* the buffer stays allocated for the process's life, as the rest */
  b.sum = get(b.c, 8, 1), b.sumsq = get(b.c, 8, 1), b.bmean = get(b.c, 8, 1);
  b.var = get(b.c, 4, 1), b.brstd = get(b.c, 4, 1);
  /* inputs the backward / apply kernels need: library A's forward statistics */
  const lib_t *a = &lib[0];
  if (rownorm) {
    AB_CHECK(*a, a->ln_fwd(b.y, b.mean, b.rstd, b.x, b.gamma, b.beta, b.rows, b.d, 1e-5f,
                           b.dtype));
    if (k == RMS_BWD)
      AB_CHECK(*a, a->rms_fwd(b.y, b.rstd, b.x, b.gamma, b.rows, b.d, 1e-5f, b.dtype));
  } else {
    AB_CHECK(*a, a->bn_stats(b.sum, b.sumsq, b.x, NULL, b.n, b.c, b.s, b.layout, b.dtype));
    AB_CHECK(*a, a->bn_finalize(b.bmean, b.var, b.brstd, b.sum, b.sumsq, NULL, b.n * b.s, b.c,
                                1e-5f));
    AB_CHECK(*a, a->gn_fwd(b.y, b.mean, b.rstd, b.x, b.gamma, b.beta, b.n, b.c, b.s, GROUPS,
                           1e-5f, b.layout, b.dtype));
    if (k == BN_BWD_APPLY)
      AB_CHECK(*a, a->bn_bwd_reduce(b.sum, b.sumsq, b.dy, b.x, b.bmean, b.brstd, b.n, b.c, b.s,
                                    b.layout, b.dtype));
  }

  bu_mem_t mem;
  bu_mem_init(&mem, 64, cold ? (size_t)256 << 20 : 64);
  double *t[2] = {malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double))};
  double *ratio = malloc((size_t)reps * sizeof(double));
  if (t[0] == NULL || t[1] == NULL || ratio == NULL) bu_die("out of memory");
  for (int w = 0; w < 2; w++) /* warm-up: one call each */
    AB_CHECK(lib[w], run(&lib[w], k, &b));
  for (int i = 0; i < 2 * reps; i++) {
    const int pair = i / 2, which = (i + pair) % 2; /* A B B A A B ... */
    if (cold) bu_sweep(&mem);
    const double t0 = bu_now();
    const sn_status_t st = run(&lib[which], k, &b);
    t[which][pair] = bu_now() - t0;
    if (st != SN_OK) {
      fprintf(stderr, "%s (%s): %s: %s\n", NAMES[k], argv[1 + which],
              lib[which].status_string(st), lib[which].last_error());
      return 3;
    }
  }
  for (int p = 0; p < reps; p++) ratio[p] = t[1][p] / t[0][p];
  printf("%s %s %s: A %.3f ms  B %.3f ms  B/A %.3f (pairs p10 %.3f, p90 %.3f)\n", NAMES[k],
         rownorm ? "-" : b.layout == SN_LAYOUT_NHWC ? "NHWC" : "NCHW",
         b.dtype == SN_DTYPE_F32 ? "f32" : b.dtype == SN_DTYPE_BF16 ? "bf16" : "f16",
         1e3 * bu_quantile(t[0], reps, 0.5), 1e3 * bu_quantile(t[1], reps, 0.5),
         bu_quantile(ratio, reps, 0.5), bu_quantile(ratio, reps, 0.1),
         bu_quantile(ratio, reps, 0.9));
  bu_mem_free(&mem);
  return 0;
}
