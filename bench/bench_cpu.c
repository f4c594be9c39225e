/*
 * bench_cpu.c — CPU benchmark of the syncnorm kernels against the machine's copy bandwidth and
 * oneDNN, in one process (issue: "Speed (a benchmark, not a timed test)").
 *
 * For each kernel, shape, layout and dtype it prints one row
 *   kernel shape layout dtype threads ms GB/s %-of-copy ratio-vs-oneDNN oneDNN-ms
 * ms: median wall time of one call over --reps calls after warm-up, each call starting with cold
 * caches (a read-only sweep before it) unless --warm. GB/s: the activation bytes a call must
 * move (rule below) over that median. %-of-copy: against a 1 GiB parallel memcpy timed once in
 * every repetition of the same row, so both see the same phases of machine load.
 * ratio-vs-oneDNN: oneDNN's median / ours (> 1: syncnorm is faster), the two alternating in the
 * same loop on the same input buffers; "-" where oneDNN 2.x has no such primitive (or the bench
 * was built without it). Our outputs are compared with oneDNN's; a mismatch fails the run.
 *
 * Byte rule (activations only; per-row / per-channel vectors are < 0.1% and ignored): each input
 * read once + each output written once, except BatchNorm, whose statistics must be complete
 * before any output is written: training forward = 2 reads of x + 1 write of y; backward =
 * 2 reads of (dy, x) + 1 write of dx = 4 reads + 1 write, also for the fused sn_batchnorm_bwd,
 * whose second read of a channel comes from the cache where it fits (so the rows compare by ms).
 *
 * Run with --help for the options. Exit status: 0, 1 on an error (a failed sn_* call prints
 * sn_last_error()), 2 on bad usage, 3 when an output check against oneDNN failed.
 */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_dnnl.h"
#include "bench_util.h"
#include "syncnorm.h"

#define EPS 1e-5f
#define GROUPS 32
#define MAX_FILTERS 16

/* ---- options and output ---------------------------------------------------------------- */

typedef struct {
  int threads, reps, warmup, quick, list, verbose;
  int copy_reps;
  const char *filter[MAX_FILTERS]; /* substrings of "kernel shape layout dtype" */
  int nfilter;
  const char *csv_path;
  FILE *csv;
  int warm;        /* --warm: no cache sweep, no per-row copy */
  double max_busy; /* --max-busy: re-run a row when others used more CPUs than this */
  int retries;     /* --retries: at most this many re-runs per row */
  int disturbed;   /* rows still above --max-busy after their retries */
  bu_mem_t mem;    /* reference copy and cache-sweep buffers */
  double copy_gbs; /* start-up copy bandwidth: the %-of-copy reference under --warm */
  int check_failures;
} opts_t;

typedef struct {
  const char *kernel;
  char shape[48];
  const char *layout; /* "-" for LayerNorm/RMSNorm */
  sn_dtype_t dtype;
  double bytes; /* counted bytes per call */
} row_t;

static const char *dtype_name(sn_dtype_t dt) { return dt == SN_DTYPE_BF16 ? "bf16" : "f32"; }
static const char *layout_name(sn_layout_t l) { return l == SN_LAYOUT_NHWC ? "NHWC" : "NCHW"; }

/* 1 if no --filter was given or the row "kernel shape layout dtype" contains one of them. */
static int wanted(const opts_t *o, const char *kernel, const char *shape, const char *layout,
                  sn_dtype_t dt) {
  if (o->nfilter == 0) return 1;
  char label[160];
  snprintf(label, sizeof label, "%s %s %s %s", kernel, shape, layout, dtype_name(dt));
  for (int i = 0; i < o->nfilter; i++)
    if (strstr(label, o->filter[i])) return 1;
  return 0;
}

typedef struct {
  double ms, p10, p90;                /* syncnorm */
  double dnnl_ms, dnnl_p10, dnnl_p90; /* oneDNN; 0 = not run */
  double copy_gbs;                    /* the %-of-copy reference for this row */
  double others;                      /* CPUs others kept busy meanwhile (--max-busy) */
  int tries;                          /* measurements made (> 1: re-run after disturbance) */
} meas_t;

typedef void (*run_fn)(void *ctx);

/* Before each timed call (unless --warm): a read-only sweep that evicts the caches, so every
 * call starts cold, as a DRAM-sized tensor would. */
static void before_call(const opts_t *o) {
  if (!o->warm) bu_sweep(&o->mem);
}

/* Times `ours` (and `dnnl` when not NULL) `reps` times after `warmup` untimed calls. Each
 * repetition also times one reference copy (unless --warm), then the two kernels in an order
 * that swaps every repetition, so phases of machine load hit the copy and both kernels alike. */
static meas_t measure(const opts_t *o, run_fn ours, void *ctx, bd_prim_t *dnnl) {
  int n = o->reps;
  double *t = malloc((size_t)n * sizeof *t), *u = malloc((size_t)n * sizeof *u),
         *cp = malloc((size_t)n * sizeof *cp);
  if (!t || !u || !cp) bu_die("out of memory");
  for (int w = 0; w < o->warmup; w++) {
    ours(ctx);
    if (dnnl) bd_run(dnnl);
  }
  for (int r = 0; r < n; r++) {
    if (!o->warm) cp[r] = bu_copy_once(&o->mem, 0);
    for (int k = 0; k < 2; k++) {
      int is_dnnl = (k == (r & 1)) ? 0 : 1; /* even r: ours first; odd r: oneDNN first */
      if (is_dnnl && !dnnl) continue;
      before_call(o);
      double t0 = bu_now();
      if (is_dnnl)
        bd_run(dnnl);
      else
        ours(ctx);
      double dt = bu_now() - t0;
      if (is_dnnl)
        u[r] = dt;
      else
        t[r] = dt;
    }
  }
  meas_t m = {0};
  m.ms = 1e3 * bu_quantile(t, n, 0.5);
  m.p10 = 1e3 * bu_quantile(t, n, 0.1);
  m.p90 = 1e3 * bu_quantile(t, n, 0.9);
  if (dnnl) {
    m.dnnl_ms = 1e3 * bu_quantile(u, n, 0.5);
    m.dnnl_p10 = 1e3 * bu_quantile(u, n, 0.1);
    m.dnnl_p90 = 1e3 * bu_quantile(u, n, 0.9);
  }
  m.copy_gbs = o->warm ? o->copy_gbs : bu_copy_bytes(&o->mem) / bu_quantile(cp, n, 0.5) * 1e-9;
  free(t);
  free(u);
  free(cp);
  return m;
}

/* measure(), re-run while other processes or steal time kept more than --max-busy CPUs busy
 * during it, at most 1 + --retries times, each try after waiting (up to 15 s) for them to go
 * quiet; the least disturbed try is kept. */
static meas_t measure_row(const opts_t *o, run_fn ours, void *ctx, bd_prim_t *dnnl) {
  meas_t best = {0};
  for (int tries = 1;; tries++) {
    if (o->max_busy > 0) (void)bu_wait_idle(o->max_busy, 15.0);
    bu_cpu_snap_t a, b;
    bu_cpu_snap(&a);
    meas_t m = measure(o, ours, ctx, dnnl);
    bu_cpu_snap(&b);
    m.others = bu_others_cpus(&a, &b);
    if (tries == 1 || m.others < best.others) best = m;
    best.tries = tries;
    if (o->max_busy <= 0 || m.others <= o->max_busy || tries > o->retries) return best;
  }
}

static void print_header(const opts_t *o) {
  printf("%-25s %-17s %-6s %-5s %7s %9s %8s %9s %16s %9s\n", "kernel", "shape", "layout", "dtype",
         "threads", "ms", "GB/s", "%-of-copy", "ratio-vs-oneDNN", "oneDNN-ms");
  if (o->csv)
    fprintf(o->csv,
            "kernel,shape,layout,dtype,threads,ms,gbps,pct_of_copy,ratio_vs_onednn,"
            "onednn_ms,copy_gbps,ms_p10,ms_p90,onednn_ms_p10,onednn_ms_p90,bytes,"
            "onednn_impl,check_rel_diff,others_cpus,tries\n");
}

/* Prints one table row (and the CSV line); `check` < 0 means no comparison was made. */
static void emit(opts_t *o, const row_t *r, meas_t m, const bd_prim_t *dnnl, double check) {
  double gbs = r->bytes / (m.ms * 1e-3) * 1e-9, pct = 100.0 * gbs / m.copy_gbs;
  char ratio[32] = "-", dms[32] = "-";
  if (dnnl) {
    snprintf(ratio, sizeof ratio, "%.2f", m.dnnl_ms / m.ms);
    snprintf(dms, sizeof dms, "%.3f", m.dnnl_ms);
  }
  printf("%-25s %-17s %-6s %-5s %7d %9.3f %8.1f %9.1f %16s %9s\n", r->kernel, r->shape, r->layout,
         dtype_name(r->dtype), o->threads, m.ms, gbs, pct, ratio, dms);
  if (o->verbose) {
    printf("#   p10..p90 %.3f..%.3f ms; copy %.1f GB/s; others %.2f CPUs", m.p10, m.p90, m.copy_gbs,
           m.others);
    if (m.tries > 1) printf(" (try %d)", m.tries);
    if (dnnl)
      printf("; oneDNN %s p10..p90 %.3f..%.3f ms; outputs differ by %.2g", bd_impl(dnnl),
             m.dnnl_p10, m.dnnl_p90, check);
    printf("\n");
  }
  if (o->max_busy > 0 && m.others > o->max_busy) o->disturbed++;
  fflush(stdout);
  if (o->csv) {
    fprintf(o->csv,
            "%s,%s,%s,%s,%d,%.4f,%.2f,%.1f,%s,%s,%.2f,%.4f,%.4f,%.4f,%.4f,%.0f,%s,%.3g,%.3f,%d\n",
            r->kernel, r->shape, r->layout, dtype_name(r->dtype), o->threads, m.ms, gbs, pct, ratio,
            dms, m.copy_gbs, m.p10, m.p90, m.dnnl_p10, m.dnnl_p90, r->bytes,
            dnnl ? bd_impl(dnnl) : "-", check, m.others, m.tries);
    fflush(o->csv);
  }
}

/* Compares our output with oneDNN's (norm-wise relative difference); reports on stderr and
 * counts a failure above the dtype's tolerance. Returns the difference. */
static double check_close(opts_t *o, const row_t *r, const char *what, double diff) {
  double tol = r->dtype == SN_DTYPE_BF16 ? 2e-2 : 1e-3;
  if (!(diff <= tol)) {
    fprintf(stderr,
            "bench_cpu: CHECK FAILED %s %s %s %s: %s differs from oneDNN by %.3g (tol %g)\n",
            r->kernel, r->shape, r->layout, dtype_name(r->dtype), what, diff, tol);
    o->check_failures++;
  }
  return diff;
}

static double max2(double a, double b) { return a > b ? a : b; }

/* ---- LayerNorm / RMSNorm family: x [rows, d] -------------------------------------------- */

typedef struct {
  int64_t rows, d;
  sn_dtype_t dt;
  void *x, *x2, *out, *ref; /* x2 = residual or dy; ref = oneDNN output or sum_out */
  float *mean, *rstd, *gamma, *beta, *dgamma, *dbeta;
  float *dmean, *dvar, *ddgamma, *ddbeta; /* oneDNN's */
} ln_t;

static void ln_fwd(void *p) {
  ln_t *c = p;
  BU_CHECK(sn_layernorm_fwd(c->out, c->mean, c->rstd, c->x, c->gamma, c->beta, c->rows, c->d, EPS,
                            c->dt));
}
static void ln_bwd(void *p) {
  ln_t *c = p;
  BU_CHECK(sn_layernorm_bwd(c->out, c->dgamma, c->dbeta, c->x2, c->x, c->mean, c->rstd, c->gamma,
                            c->rows, c->d, c->dt));
}
static void rms_fwd(void *p) {
  ln_t *c = p;
  BU_CHECK(sn_rmsnorm_fwd(c->out, c->rstd, c->x, c->gamma, c->rows, c->d, EPS, c->dt));
}
static void rms_bwd(void *p) {
  ln_t *c = p;
  BU_CHECK(sn_rmsnorm_bwd(c->out, c->dgamma, c->x2, c->x, c->rstd, c->gamma, c->rows, c->d, c->dt));
}
static void add_ln_fwd(void *p) {
  ln_t *c = p;
  BU_CHECK(sn_add_layernorm_fwd(c->out, c->ref, c->mean, c->rstd, c->x, c->x2, c->gamma, c->beta,
                                c->rows, c->d, EPS, c->dt));
}
static void add_rms_fwd(void *p) {
  ln_t *c = p;
  BU_CHECK(sn_add_rmsnorm_fwd(c->out, c->ref, c->rstd, c->x, c->x2, c->gamma, c->rows, c->d, EPS,
                              c->dt));
}

static void bench_ln_family(opts_t *o, int64_t rows, int64_t d, sn_dtype_t dt) {
  static const char *kernels[] = {"layernorm_fwd", "layernorm_bwd",     "rmsnorm_fwd",
                                  "rmsnorm_bwd",   "add_layernorm_fwd", "add_rmsnorm_fwd"};
  const int nk = (int)(sizeof kernels / sizeof *kernels);
  row_t r = {0};
  snprintf(r.shape, sizeof r.shape, "[%lld,%lld]", (long long)rows, (long long)d);
  r.layout = "-";
  r.dtype = dt;
  int any = 0;
  for (int k = 0; k < nk; k++) {
    if (wanted(o, kernels[k], r.shape, r.layout, dt)) {
      any = 1;
      if (o->list) printf("%s %s %s %s\n", kernels[k], r.shape, r.layout, dtype_name(dt));
    }
  }
  if (!any || o->list) return;

  ln_t c = {.rows = rows, .d = d, .dt = dt};
  int64_t n = rows * d;
  double e = (double)n * (double)sn_dtype_size(dt);
  size_t act = (size_t)n * (size_t)sn_dtype_size(dt), rv = (size_t)rows * sizeof(float),
         dv = (size_t)d * sizeof(float);
  c.x = bu_alloc(act);
  c.x2 = bu_alloc(act);
  c.out = bu_alloc(act);
  c.ref = bu_alloc(act);
  c.mean = bu_alloc(rv), c.rstd = bu_alloc(rv), c.dmean = bu_alloc(rv), c.dvar = bu_alloc(rv);
  c.gamma = bu_alloc(dv), c.beta = bu_alloc(dv), c.dgamma = bu_alloc(dv), c.dbeta = bu_alloc(dv);
  c.ddgamma = bu_alloc(dv), c.ddbeta = bu_alloc(dv);
  bu_fill(c.x, n, dt, 1, -1.0f, 3.0f);
  bu_fill(c.x2, n, dt, 2, -1.0f, 1.0f);
  bu_fill_f32(c.gamma, d, 3, 0.5f, 1.5f);
  bu_fill_f32(c.beta, d, 4, -0.5f, 0.5f);

  for (int k = 0; k < nk; k++) {
    if (!wanted(o, kernels[k], r.shape, r.layout, dt)) continue;
    r.kernel = kernels[k];
    bd_prim_t *dn = NULL;
    const char *why = NULL; /* set when oneDNN has the kernel but not this case */
    run_fn fn = NULL;
    double check = -1.0;
    switch (k) {
      case 0: /* layernorm_fwd: read x, write y */
        r.bytes = 2 * e;
        fn = ln_fwd;
        dn = bd_layernorm_fwd(c.ref, c.dmean, c.dvar, c.x, c.gamma, c.beta, rows, d, EPS, dt, &why);
        break;
      case 1: { /* layernorm_bwd: read dy, x, write dx */
        r.bytes = 3 * e;
        fn = ln_bwd;
        ln_fwd(&c); /* mean, rstd of x */
        bd_prim_t *f =
            bd_layernorm_fwd(c.ref, c.dmean, c.dvar, c.x, c.gamma, c.beta, rows, d, EPS, dt, &why);
        if (f) {
          bd_run(f);
          bd_destroy(f);
          dn = bd_layernorm_bwd(c.ref, c.ddgamma, c.ddbeta, c.x2, c.x, c.dmean, c.dvar, c.gamma,
                                c.beta, rows, d, EPS, dt, &why);
        }
        break;
      }
      case 2: /* rmsnorm_fwd: read x, write y */
        r.bytes = 2 * e;
        fn = rms_fwd;
        break;
      case 3: /* rmsnorm_bwd: read dy, x, write dx */
        r.bytes = 3 * e;
        fn = rms_bwd;
        rms_fwd(&c); /* rstd of x */
        break;
      case 4: /* add_layernorm_fwd: read x, residual, write y, sum_out */
        r.bytes = 4 * e;
        fn = add_ln_fwd;
        break;
      default: /* add_rmsnorm_fwd */
        r.bytes = 4 * e;
        fn = add_rms_fwd;
        break;
    }
    meas_t m = measure_row(o, fn, &c, dn);
    if (dn) {
      check = check_close(o, &r, "y/dx", bu_rel_diff(c.out, c.ref, n, dt));
      if (k == 1) {
        check = max2(check, check_close(o, &r, "dgamma", bu_rel_diff_f32(c.dgamma, c.ddgamma, d)));
        check = max2(check, check_close(o, &r, "dbeta", bu_rel_diff_f32(c.dbeta, c.ddbeta, d)));
      }
    }
    emit(o, &r, m, dn, check);
    if (!dn && why && o->verbose) printf("#   oneDNN: %s\n", why);
    bd_destroy(dn);
  }
  void *bufs[] = {c.x,    c.x2,    c.out,  c.ref,    c.mean,  c.rstd,    c.dmean,
                  c.dvar, c.gamma, c.beta, c.dgamma, c.dbeta, c.ddgamma, c.ddbeta};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) bu_free(bufs[i]);
}

/* ---- BatchNorm / GroupNorm family: x [N, C, H, W] in NCHW or NHWC ---------------------- */

typedef struct {
  int64_t n, c, h, w, s;
  sn_layout_t layout;
  sn_dtype_t dt;
  void *x, *dy, *out, *ref;
  float *pivot, *var, *rstd, *gamma, *beta, *run_mean, *run_var; /* [C] */
  double *sum, *sumsq, *mean, *sum_dy, *sum_dy_xhat;             /* [C] f64 */
  float *gn_mean, *gn_rstd, *dgamma, *dbeta;                     /* [N·G], [C] */
  float *dmean, *dvar, *ddgamma, *ddbeta;                        /* oneDNN's [C] */
} bn_t;

static void bn_train_fwd(void *p) { /* the local forward */
  bn_t *b = p;
  BU_CHECK(sn_batchnorm_fwd(b->out, b->mean, b->var, b->rstd, b->x, b->pivot, b->gamma, b->beta,
                            b->n, b->c, b->s, EPS, b->layout, b->dt));
}
static void bn_train_fwd_split(void *p) { /* SyncBatchNorm's steps (no all-reduce between) */
  bn_t *b = p;
  BU_CHECK(
      sn_batchnorm_stats(b->sum, b->sumsq, b->x, b->pivot, b->n, b->c, b->s, b->layout, b->dt));
  BU_CHECK(sn_batchnorm_finalize(b->mean, b->var, b->rstd, b->sum, b->sumsq, b->pivot, b->n * b->s,
                                 b->c, EPS));
  BU_CHECK(sn_batchnorm_apply(b->out, b->x, b->mean, b->rstd, b->gamma, b->beta, b->n, b->c, b->s,
                              b->layout, b->dt));
}
static void bn_bwd(void *p) { /* the local backward; dgamma, dbeta f32 */
  bn_t *b = p;
  BU_CHECK(sn_batchnorm_bwd(b->out, b->dgamma, b->dbeta, b->dy, b->x, b->mean, b->rstd, b->gamma,
                            b->n, b->c, b->s, b->layout, b->dt));
}
static void bn_bwd_split(void *p) { /* SyncBatchNorm's two passes, with no all-reduce between */
  bn_t *b = p;
  BU_CHECK(sn_batchnorm_bwd_reduce(b->sum_dy, b->sum_dy_xhat, b->dy, b->x, b->mean, b->rstd, b->n,
                                   b->c, b->s, b->layout, b->dt));
  BU_CHECK(sn_batchnorm_bwd_apply(b->out, b->dy, b->x, b->mean, b->rstd, b->gamma, b->sum_dy,
                                  b->sum_dy_xhat, b->n * b->s, b->n, b->c, b->s, b->layout, b->dt));
}
static void bn_infer(void *p) {
  bn_t *b = p;
  BU_CHECK(sn_batchnorm_infer(b->out, b->x, b->run_mean, b->run_var, b->gamma, b->beta, b->n, b->c,
                              b->s, EPS, b->layout, b->dt));
}
static void gn_fwd(void *p) {
  bn_t *b = p;
  BU_CHECK(sn_groupnorm_fwd(b->out, b->gn_mean, b->gn_rstd, b->x, b->gamma, b->beta, b->n, b->c,
                            b->s, GROUPS, EPS, b->layout, b->dt));
}
static void gn_bwd(void *p) {
  bn_t *b = p;
  BU_CHECK(sn_groupnorm_bwd(b->out, b->dgamma, b->dbeta, b->dy, b->x, b->gn_mean, b->gn_rstd,
                            b->gamma, b->n, b->c, b->s, GROUPS, b->layout, b->dt));
}

static void bench_bn_family(opts_t *o, int64_t n, int64_t c, int64_t h, int64_t w,
                            sn_layout_t layout, sn_dtype_t dt) {
  static const char *kernels[] = {"batchnorm_train_fwd", "batchnorm_train_fwd_split",
                                  "batchnorm_bwd",       "batchnorm_bwd_split",
                                  "batchnorm_infer",     "groupnorm_fwd",
                                  "groupnorm_bwd"};
  const int nk = (int)(sizeof kernels / sizeof *kernels);
  row_t r = {0};
  snprintf(r.shape, sizeof r.shape, "[%lld,%lld,%lld,%lld]", (long long)n, (long long)c,
           (long long)h, (long long)w);
  r.layout = layout_name(layout);
  r.dtype = dt;
  int any = 0;
  for (int k = 0; k < nk; k++) {
    if (wanted(o, kernels[k], r.shape, r.layout, dt)) {
      any = 1;
      if (o->list) printf("%s %s %s %s\n", kernels[k], r.shape, r.layout, dtype_name(dt));
    }
  }
  if (!any || o->list) return;

  bn_t b = {.n = n, .c = c, .h = h, .w = w, .s = h * w, .layout = layout, .dt = dt};
  int64_t ne = n * c * h * w;
  double e = (double)ne * (double)sn_dtype_size(dt);
  size_t act = (size_t)ne * (size_t)sn_dtype_size(dt), cf = (size_t)c * sizeof(float),
         cd = (size_t)c * sizeof(double), gf = (size_t)(n * GROUPS) * sizeof(float);
  b.x = bu_alloc(act), b.dy = bu_alloc(act), b.out = bu_alloc(act), b.ref = bu_alloc(act);
  float **fv[] = {&b.pivot,  &b.var,   &b.rstd,  &b.gamma,   &b.beta,   &b.run_mean, &b.run_var,
                  &b.dgamma, &b.dbeta, &b.dmean, &b.ddgamma, &b.ddbeta, &b.dvar};
  for (size_t i = 0; i < sizeof fv / sizeof *fv; i++) *fv[i] = bu_alloc(cf);
  double **dv[] = {&b.sum, &b.sumsq, &b.mean, &b.sum_dy, &b.sum_dy_xhat};
  for (size_t i = 0; i < sizeof dv / sizeof *dv; i++) *dv[i] = bu_alloc(cd);
  b.gn_mean = bu_alloc(gf), b.gn_rstd = bu_alloc(gf);
  bu_fill(b.x, ne, dt, 11, -1.0f, 3.0f);
  bu_fill(b.dy, ne, dt, 12, -1.0f, 1.0f);
  bu_fill_f32(b.gamma, c, 13, 0.5f, 1.5f);
  bu_fill_f32(b.beta, c, 14, -0.5f, 0.5f);
  bu_fill_f32(b.run_mean, c, 15, 0.5f, 1.5f);
  bu_fill_f32(b.run_var, c, 16, 1.0f, 2.0f);
  memcpy(b.pivot, b.run_mean, cf); /* SyncBatchNorm's pivot: the running mean */

  for (int k = 0; k < nk; k++) {
    if (!wanted(o, kernels[k], r.shape, r.layout, dt)) continue;
    r.kernel = kernels[k];
    bd_prim_t *dn = NULL;
    const char *why = NULL; /* set when oneDNN has the kernel but not this case */
    run_fn fn = NULL;
    switch (k) {
      case 0:   /* sn_batchnorm_fwd (fused in NCHW: the second read of a channel from L2) */
      case 1: { /* stats (read x) + finalize + apply (read x, write y) */
        r.bytes = 3 * e;
        fn = k == 0 ? bn_train_fwd : bn_train_fwd_split;
        dn = bd_batchnorm_fwd(b.ref, b.dmean, b.dvar, b.x, b.gamma, b.beta, n, c, h, w, EPS, layout,
                              dt, &why);
        break;
      }
      case 2:   /* sn_batchnorm_bwd (fused in NCHW: the second read of a channel from L2) */
      case 3: { /* bwd_reduce (read dy, x) + bwd_apply (read dy, x, write dx) */
        r.bytes = 5 * e;
        fn = k == 2 ? bn_bwd : bn_bwd_split;
        bn_train_fwd(&b); /* batch mean, rstd */
        bd_prim_t *f = bd_batchnorm_fwd(b.ref, b.dmean, b.dvar, b.x, b.gamma, b.beta, n, c, h, w,
                                        EPS, layout, dt, &why);
        if (f) {
          bd_run(f);
          bd_destroy(f);
          dn = bd_batchnorm_bwd(b.ref, b.ddgamma, b.ddbeta, b.dy, b.x, b.dmean, b.dvar, b.gamma,
                                b.beta, n, c, h, w, EPS, layout, dt, &why);
        }
        break;
      }
      case 4: /* read x, write y */
        r.bytes = 2 * e;
        fn = bn_infer;
        dn = bd_batchnorm_infer(b.ref, b.x, b.run_mean, b.run_var, b.gamma, b.beta, n, c, h, w, EPS,
                                layout, dt, &why);
        break;
      case 5: /* read x, write y */
        r.bytes = 2 * e;
        fn = gn_fwd;
        break;
      default: /* read dy, x, write dx */
        r.bytes = 3 * e;
        fn = gn_bwd;
        gn_fwd(&b); /* group mean, rstd */
        break;
    }
    meas_t m = measure_row(o, fn, &b, dn);
    double check = -1.0;
    if (dn) {
      check = check_close(o, &r, "y/dx", bu_rel_diff(b.out, b.ref, ne, dt));
      if (k == 2 || k == 3) { /* dgamma = Σ dy·x̂, dbeta = Σ dy */
        for (int64_t i = 0; k == 3 && i < c; i++) {
          b.dgamma[i] = (float)b.sum_dy_xhat[i];
          b.dbeta[i] = (float)b.sum_dy[i];
        }
        check = max2(check, check_close(o, &r, "dgamma", bu_rel_diff_f32(b.dgamma, b.ddgamma, c)));
        check = max2(check, check_close(o, &r, "dbeta", bu_rel_diff_f32(b.dbeta, b.ddbeta, c)));
      }
    }
    emit(o, &r, m, dn, check);
    if (!dn && why && o->verbose) printf("#   oneDNN: %s\n", why);
    bd_destroy(dn);
  }
  bu_free(b.x), bu_free(b.dy), bu_free(b.out), bu_free(b.ref);
  for (size_t i = 0; i < sizeof fv / sizeof *fv; i++) bu_free(*fv[i]);
  for (size_t i = 0; i < sizeof dv / sizeof *dv; i++) bu_free(*dv[i]);
  bu_free(b.gn_mean), bu_free(b.gn_rstd);
}

/* ---- main ------------------------------------------------------------------------------- */

static void usage(FILE *f) {
  fputs(
      "usage: bench_cpu [--threads T] [--reps R] [--filter S]... [--quick] [--csv FILE]\n"
      "                 [--warm] [--copy-mib M] [--max-busy F [--retries N]] [--list]\n"
      "                 [--verbose]\n"
      "  --threads T   OpenMP threads for syncnorm and oneDNN (default: all cores)\n"
      "  --reps R      timed calls per row, median reported (default 30; --quick: 3)\n"
      "  --filter S    run only rows whose \"kernel shape layout dtype\" contains S, e.g.\n"
      "                'layernorm_fwd' or '[8192,1024] - f32'; repeat to run the union\n"
      "  --quick       few repetitions and small reference buffers (CI smoke run)\n"
      "  --csv FILE    also write every row as CSV, with the row's copy bandwidth, p10/p90\n"
      "                and oneDNN's implementation name\n"
      "  --warm        time back-to-back calls with warm caches; %-of-copy then uses the\n"
      "                start-up copy (default: each call starts with cold caches and every\n"
      "                repetition also times one reference copy)\n"
      "  --copy-mib M  reference copy buffers of M MiB each (default 1024; --quick: 64)\n"
      "  --max-busy F  wait (up to 15 s) for other processes and hypervisor steal to use < F\n"
      "                CPUs before each row; re-run a row during which they used more, keeping\n"
      "                the least disturbed try (default 0: off); --retries N: at most N re-runs\n"
      "                (default 3)\n"
      "  --list        print the rows that would run, run nothing\n"
      "  --verbose     print each row's p10..p90 spread, copy bandwidth and oneDNN's\n"
      "                implementation and output difference under it\n",
      f);
}

int main(int argc, char **argv) {
  opts_t o = {
      .threads = omp_get_num_procs(), .reps = -1, .warmup = 3, .copy_reps = 20, .retries = 3};
  long copy_mib = -1;
  static const struct option longopts[] = {{"threads", required_argument, NULL, 't'},
                                           {"reps", required_argument, NULL, 'r'},
                                           {"filter", required_argument, NULL, 'f'},
                                           {"quick", no_argument, NULL, 'q'},
                                           {"csv", required_argument, NULL, 'c'},
                                           {"warm", no_argument, NULL, 'w'},
                                           {"copy-mib", required_argument, NULL, 'm'},
                                           {"max-busy", required_argument, NULL, 'b'},
                                           {"retries", required_argument, NULL, 'R'},
                                           {"list", no_argument, NULL, 'l'},
                                           {"verbose", no_argument, NULL, 'v'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "t:r:f:qc:wm:b:R:lvh", longopts, NULL)) != -1) {
    switch (opt) {
      case 't': o.threads = atoi(optarg); break;
      case 'r': o.reps = atoi(optarg); break;
      case 'f':
        if (o.nfilter == MAX_FILTERS) bu_die("at most %d --filter options", MAX_FILTERS);
        o.filter[o.nfilter++] = optarg;
        break;
      case 'q': o.quick = 1; break;
      case 'c': o.csv_path = optarg; break;
      case 'w': o.warm = 1; break;
      case 'm': copy_mib = atol(optarg); break;
      case 'b': o.max_busy = atof(optarg); break;
      case 'R': o.retries = atoi(optarg); break;
      case 'l': o.list = 1; break;
      case 'v': o.verbose = 1; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc || o.threads < 1 || (o.reps != -1 && o.reps < 1) ||
      (copy_mib != -1 && copy_mib < 1) || o.max_busy < 0 || o.retries < 0) {
    usage(stderr);
    return 2;
  }
  if (o.quick) {
    o.warmup = 1;
    o.copy_reps = 3;
    if (o.reps < 0) o.reps = 3;
    if (copy_mib < 0) copy_mib = 64;
  }
  if (o.reps < 0) o.reps = 30;
  if (copy_mib < 0) copy_mib = 1024;
  omp_set_num_threads(o.threads);
  omp_set_dynamic(0);

  /* LayerNorm/RMSNorm shapes × {f32, bf16}; BatchNorm/GroupNorm shapes × {NCHW, NHWC} f32.
   * [256,256,56,56] f32 (784 MiB per tensor) checks the DRAM-sized targets for BatchNorm;
   * [65536,4096] (1 GiB f32, 512 MiB bf16) does for LayerNorm. */
  static const int64_t ln_shapes[][2] = {{8192, 1024}, {65536, 4096}};
  static const int64_t bn_shapes[][4] = {{32, 64, 56, 56}, {64, 256, 28, 28}, {256, 256, 56, 56}};
  static const sn_dtype_t ln_dtypes[] = {SN_DTYPE_F32, SN_DTYPE_BF16};
  static const sn_layout_t layouts[] = {SN_LAYOUT_NCHW, SN_LAYOUT_NHWC};
  const int n_ln = 2, n_bn = 3;

  if (!o.list) {
    if (o.csv_path) {
      o.csv = fopen(o.csv_path, "w");
      if (!o.csv) bu_die("cannot open %s for writing", o.csv_path);
    }
    /* The sweep must exceed the last-level cache; 4× the 64 MiB where copies stop speeding up
     * on the reference machine (--quick: small, the smoke run only checks it works). */
    size_t sweep = o.quick ? (size_t)64 << 20 : (size_t)256 << 20;
    bu_mem_init(&o.mem, (size_t)copy_mib << 20, sweep);

    char cpu[128], load[64], date[64];
    bu_cpu_model(cpu, sizeof cpu);
    bu_loadavg(load, sizeof load);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
    printf("# syncnorm %s CPU benchmark, %s\n", sn_version(), date);
    printf("# machine: %s, %d logical CPUs; threads %d; load average %s\n", cpu,
           omp_get_num_procs(), o.threads, load);
    printf("# comparison: %s\n", bd_describe());
    bu_copy_t cp = bu_copy_bandwidth(&o.mem, o.copy_reps);
    o.copy_gbs = cp.memcpy_gbs > cp.loop_gbs ? cp.memcpy_gbs : cp.loop_gbs;
    printf(
        "# copy (read + write bytes, %ld MiB buffers, median of %d): memcpy %.1f GB/s, "
        "store loop %.1f GB/s; read only (a sum of the source) %.1f GB/s\n",
        copy_mib, o.copy_reps, cp.memcpy_gbs, cp.loop_gbs, cp.read_gbs);
    printf(
        "# ms: median of %d calls after %d warm-up calls; syncnorm and oneDNN alternate, "
        "on the same inputs\n",
        o.reps, o.warmup);
    if (o.warm)
      printf("# --warm: back-to-back calls; %%-of-copy uses the best start-up copy, %.1f GB/s\n",
             o.copy_gbs);
    else
      printf(
          "# cold caches: a %zu MiB read sweep before every timed call; %%-of-copy uses the\n"
          "#   median of one memcpy timed in every repetition of the same row\n",
          sweep >> 20);
    printf(
        "# GB/s: activation bytes / ms (1e9 B/s); each input read once + each output written\n"
        "#   once, except batchnorm_train_fwd = 2 reads + 1 write, batchnorm_bwd = 4 reads +\n"
        "#   1 write (statistics must be complete before any output is written)\n");
    printf("# ratio-vs-oneDNN = oneDNN ms / syncnorm ms (> 1: syncnorm faster); - = none\n");
    if (o.max_busy > 0)
      printf(
          "# quiet check: each row waits (<= 15 s) for others to use < %.2f CPUs and is re-run "
          "(<= %d times, least disturbed try kept) if they used more during it\n",
          o.max_busy, o.retries);
    print_header(&o);
  }

  for (int s = 0; s < n_ln; s++)
    for (int t = 0; t < 2; t++) bench_ln_family(&o, ln_shapes[s][0], ln_shapes[s][1], ln_dtypes[t]);
  for (int s = 0; s < n_bn; s++)
    for (int l = 0; l < 2; l++)
      bench_bn_family(&o, bn_shapes[s][0], bn_shapes[s][1], bn_shapes[s][2], bn_shapes[s][3],
                      layouts[l], SN_DTYPE_F32);
  if (o.list) return 0;

  bu_copy_t end = bu_copy_bandwidth(&o.mem, o.copy_reps);
  char load[64];
  bu_loadavg(load, sizeof load);
  printf("# copy at the end: memcpy %.1f GB/s, store loop %.1f GB/s, read only %.1f GB/s; load "
         "average %s\n",
         end.memcpy_gbs, end.loop_gbs, end.read_gbs, load);
  if (o.max_busy > 0)
    printf("# rows still disturbed after %d re-runs (others > %.2f CPUs): %d\n", o.retries,
           o.max_busy, o.disturbed);
  bu_mem_free(&o.mem);
  bd_shutdown();
  if (o.csv) fclose(o.csv);
  if (o.check_failures) {
    fprintf(stderr, "bench_cpu: %d output check(s) against oneDNN failed\n", o.check_failures);
    return 3;
  }
  return 0;
}
