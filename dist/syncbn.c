/*
 * syncbn.c — SyncBatchNorm: BatchNorm whose batch statistics are summed over the ranks of a
 * communicator, with torch.nn.SyncBatchNorm's running-statistics semantics.
 *
 * Forward (training), per channel c, over all ranks:
 *   local Σ(x−p_c), Σ(x−p_c)², n·s, pivot hashes  →  ONE all-reduce of 2C+5 fp64  →  mean,
 *   biased var, rstd  →  y = (x−mean)·rstd·γ + β  →  running stats (unbiased var, global count).
 * The pivot p is the previous synchronized batch mean, identical on every rank, so the fp64
 * shifted sums stay exact when |mean| ≫ σ; if p was so far off that fp64 would lose more than
 * 24 bits (first step on data with a huge mean), every rank sees it in the same reduced sums and
 * all redo the sums, around the new mean in such channels (sn__bn_refine): a second
 * all-reduce, taken by all or none (up to three more where p was nowhere near the data: around the
 * refined pivot, around 0, around the mean). With nothing to all-reduce (comm == NULL or of one
 * rank, or eval mode without running statistics) and check_finite off, sn_batchnorm_fwd does the
 * same steps in one call (fused in NCHW). The pivot is state (a checkpoint load sets it to the
 * loaded running mean): a rank whose pivot differs (a checkpoint loaded on some ranks only) would
 * add sums around another point, so two hashes of it ride in the same all-reduce, and if they
 * disagree every rank redoes the sums around 0 (then refined as above): correct statistics, one or
 * two all-reduces more, only then.
 * Backward: local Σdy, Σdy·x̂  →  ONE all-reduce of 2C fp64  →  dx with the global count.
 * References: Ioffe & Szegedy 2015 (BatchNorm); torch.nn.SyncBatchNorm and
 * torch.nn.functional.batch_norm docs (momentum, unbiased running_var, num_batches_tracked).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_internal.h"
#if SN_HAVE_CUDA
#include "syncbn_device.h"
#endif

/* A forward's all-reduce holds 2C sums, then the count and the SN_PIVOT_SLOTS pivot slots. */
#define SN_PIVOT_SLOTS 4
#define SN_RED_EXTRA (1 + SN_PIVOT_SLOTS)

sn_syncbn_config_t sn_syncbn_default_config(int64_t num_features) {
  sn_syncbn_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.num_features = num_features;
  cfg.eps = 1e-5f;
  cfg.momentum = 0.1f;
  cfg.affine = 1;
  cfg.track_running_stats = 1;
  cfg.layout = SN_LAYOUT_NCHW;
  cfg.dtype = SN_DTYPE_F32;
  cfg.check_consistency = 1; /* misuse is an error, not a mix of buffers (bench_syncbn: noise) */
  cfg.check_finite = 0;
  cfg.device_memory = 0;
  cfg.layer_id = -1;
  return cfg;
}

sn_status_t sn__syncbn_check(const char *fn, const sn_syncbn_t *bn) {
  SN_TRY(sn__check_ptr(fn, "bn", bn));
  if (!SN_SYNCBN_LIVE(bn))
    return sn__fail(SN_ERR_INVALID_HANDLE, "%s: bn is not a live sn_syncbn_t (destroyed, or never one)",
                    fn);
  return SN_OK;
}

static sn_status_t check_config(const char *fn, const sn_syncbn_config_t *cfg) {
  SN_TRY(sn__check_size(fn, "num_features", cfg->num_features, 1));
  if (cfg->num_features > (INT64_MAX / 64))
    return sn__fail(SN_ERR_OVERFLOW, "%s: num_features %lld is too large", fn,
                    (long long)cfg->num_features);
  SN_TRY(sn__check_eps(fn, cfg->eps));
  SN_TRY(sn__check_momentum(fn, cfg->momentum));
  const int flags[4] = {cfg->affine, cfg->track_running_stats, cfg->check_consistency,
                        cfg->check_finite};
  const char *names[4] = {"affine", "track_running_stats", "check_consistency", "check_finite"};
  for (int i = 0; i < 4; i++)
    if (flags[i] != 0 && flags[i] != 1)
      return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: %s must be 0 or 1, got %d", fn, names[i],
                      flags[i]);
  SN_TRY(sn__check_layout(fn, cfg->layout));
  SN_TRY(sn__check_act_dtype(fn, cfg->dtype));
  if (cfg->layer_id < -1)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: layer_id must be >= 0, or -1 for automatic, got %lld",
                    fn, (long long)cfg->layer_id);
  if (memchr(cfg->name, '\0', sizeof cfg->name) == NULL)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: name is not NUL-terminated within %zu bytes", fn,
                    sizeof cfg->name);
  return SN_OK;
}

sn_status_t sn_syncbn_create(sn_syncbn_t **out, const sn_syncbn_config_t *cfg, sn_comm_t *comm) {
  const char *fn = "sn_syncbn_create";
  SN_TRY(sn__check_ptr(fn, "bn", out));
  SN_TRY(sn__check_ptr(fn, "cfg", cfg));
  SN_TRY(check_config(fn, cfg));
  if (comm != NULL) SN_TRY(sn__comm_check(fn, comm));
  if (cfg->device_memory && !SN_HAVE_CUDA)
    return sn__fail(SN_ERR_UNSUPPORTED,
                    "%s: device_memory needs the CUDA build, which this library is not", fn);
  if (cfg->device_memory != 0 && cfg->device_memory != 1)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: device_memory must be 0 or 1, got %d", fn,
                    cfg->device_memory);
  if (cfg->device_memory && comm != NULL && !comm->ops->device_memory)
    return sn__fail(SN_ERR_UNSUPPORTED,
                    "%s: device_memory needs an \"nccl\" communicator (or none), got a '%s' one, "
                    "whose all-reduces take host memory", fn, comm->ops->name);
  if (cfg->device_memory && cfg->check_finite)
    return sn__fail(SN_ERR_UNSUPPORTED,
                    "%s: check_finite is not available with device_memory (it would need a host "
                    "round trip per step); check the activations yourself", fn);
#if SN_HAVE_CUDA
  if (cfg->device_memory) SN_TRY(sn__syncbn_dev_usable(fn));
#endif
  if (!cfg->device_memory && comm != NULL && comm->ops->device_memory)
    return sn__fail(SN_ERR_UNSUPPORTED, "%s: a '%s' communicator needs cfg.device_memory = 1", fn,
                    comm->ops->name);

  const int64_t C = cfg->num_features;
  sn_syncbn_t *bn = calloc(1, sizeof *bn);
  float *f = calloc((size_t)(10 * C), sizeof(float)); /* 10 [C] f32 arrays */
  double *d = calloc((size_t)(6 * C + SN_RED_EXTRA), sizeof(double)); /* red, local 2C, mean C */
  if (bn == NULL || f == NULL || d == NULL || !sn__handle_add(bn, SN_HANDLE_SYNCBN)) {
    free(bn), free(f), free(d);
    return sn__fail(SN_ERR_ALLOC, "%s: out of memory for %lld channels", fn, (long long)C);
  }
  bn->cfg = *cfg;
  bn->comm = comm;
  bn->C = C;
  if (cfg->layer_id >= 0) bn->id = cfg->layer_id;
  else bn->id = comm != NULL ? comm->next_layer_id++ : 0;
  if (cfg->name[0] != '\0') snprintf(bn->label, sizeof bn->label, "layer '%s' (id %lld)", cfg->name, (long long)bn->id);
  else snprintf(bn->label, sizeof bn->label, "layer %lld", (long long)bn->id);

  /* carve the f32 arrays: weight bias gw gb rm rv pivot var rstd tmp */
  float *arr[10];
  for (int i = 0; i < 10; i++) arr[i] = f + (size_t)i * (size_t)C;
  if (cfg->affine) {
    bn->weight = arr[0], bn->bias = arr[1], bn->grad_weight = arr[2], bn->grad_bias = arr[3];
    for (int64_t c = 0; c < C; c++) bn->weight[c] = 1.0f; /* PyTorch init: γ = 1, β = 0 */
  }
  if (cfg->track_running_stats) {
    bn->running_mean = arr[4], bn->running_var = arr[5];
    for (int64_t c = 0; c < C; c++) bn->running_var[c] = 1.0f; /* PyTorch init: rm 0, rv 1 */
  }
  bn->fblock = f;
  bn->pivot = arr[6], bn->var = arr[7], bn->rstd = arr[8], bn->tmp = arr[9];
  bn->red = d, bn->local = d + 2 * C + SN_RED_EXTRA, bn->mean = d + 4 * C + SN_RED_EXTRA;
#if SN_HAVE_CUDA
  if (cfg->device_memory) { /* the state on the device; the host arrays become its mirror */
    const sn_status_t st = sn__syncbn_dev_create(bn);
    if (st != SN_OK) {
      sn__handle_take(bn, SN_HANDLE_SYNCBN);
      if (comm != NULL && cfg->layer_id < 0) comm->next_layer_id--;
      free(f), free(d), free(bn);
      return st;
    }
  }
#endif
  *out = bn;
  return SN_OK;
}

void sn_syncbn_destroy(sn_syncbn_t *bn) {
  if (bn == NULL || !sn__handle_take(bn, SN_HANDLE_SYNCBN)) return; /* not (no longer) one */
#if SN_HAVE_CUDA
  sn__syncbn_dev_destroy(bn);
#endif
  free(bn->fblock);
  free(bn->red);
  free(bn);
}

sn_status_t sn_syncbn_params(sn_syncbn_t *bn, sn_syncbn_params_t *p) {
  SN_TRY(sn__check_ptr("sn_syncbn_params", "params", p));
  SN_TRY(sn__syncbn_check("sn_syncbn_params", bn));
  p->weight = bn->weight, p->bias = bn->bias;
  p->grad_weight = bn->grad_weight, p->grad_bias = bn->grad_bias;
  p->running_mean = bn->running_mean, p->running_var = bn->running_var;
  p->num_batches_tracked = bn->cfg.track_running_stats ? &bn->num_batches_tracked : NULL;
  p->num_features = bn->C;
#if SN_HAVE_CUDA
  if (bn->dev != NULL) sn__syncbn_dev_params(bn, p); /* device pointers */
#endif
  return SN_OK;
}

sn_status_t sn_syncbn_collective_count(const sn_syncbn_t *bn, int64_t *count) {
  SN_TRY(sn__check_ptr("sn_syncbn_collective_count", "count", count));
  SN_TRY(sn__syncbn_check("sn_syncbn_collective_count", bn));
  *count = bn->collectives;
  return SN_OK;
}

/* Shape and pointer checks shared by forward and backward. */
static sn_status_t check_call(const char *fn, const sn_syncbn_t *bn, int64_t n, int64_t s,
                              const void *a, const char *an, const void *b, const char *bname,
                              const void *c, const char *cn) {
  SN_TRY(sn__syncbn_check(fn, bn));
  SN_TRY(sn__check_size(fn, "n", n, 0));
  SN_TRY(sn__check_size(fn, "s", s, 0));
  /* n·C then ·s: the order of the kernels' own check (sn__check_ncs), so that they never reject
   * a size this check let through (after the layer's state was already touched) */
  int64_t nc, total;
  SN_TRY(sn__mul(fn, &nc, n, bn->C));
  SN_TRY(sn__mul(fn, &total, nc, s));
  if (total > 0) {
    SN_TRY(sn__check_ptr(fn, an, a));
    SN_TRY(sn__check_ptr(fn, bname, b));
    if (c != NULL || cn != NULL) SN_TRY(sn__check_ptr(fn, cn, c));
    /* as the kernels check them, but before any collective: y may equal x, dx may equal dy but
     * not overlap x; no partial overlaps; and no activation over the layer's own arrays
     * (sn_syncbn_params hands out pointers into them), which the step writes */
    const int64_t bytes = total * sn_dtype_size(bn->cfg.dtype), C = bn->C;
    sn__dev_span_t dspan[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
#if SN_HAVE_CUDA
    if (bn->dev != NULL) sn__syncbn_dev_spans(bn, dspan);
#endif
    const sn__span_t spans[] = {
        /* forward: b = y (may equal a = x); backward: c = dx (may equal a = dy), b = x */
        SN_SPAN_OUT(c == NULL ? bname : cn, c == NULL ? b : c, bytes, 1u << 1),
        SN_SPAN_IN(an, a, bytes),
        SN_SPAN_IN(c == NULL ? "(none)" : bname, c == NULL ? NULL : b, bytes),
        SN_SPAN_OUT("the layer's f32 arrays", bn->fblock, 10 * C * 4, 0u),
        SN_SPAN_OUT("the layer's f64 arrays", bn->red, (6 * C + SN_RED_EXTRA) * 8, 0u),
        SN_SPAN_OUT("the layer", bn, (int64_t)sizeof *bn, 0u),
        /* a device layer's own device arrays and workspace (NULL: none) */
        SN_SPAN_OUT("the layer's device f32 arrays", dspan[0].p, dspan[0].bytes, 0u),
        SN_SPAN_OUT("the layer's device f64 arrays", dspan[1].p, dspan[1].bytes, 0u),
        SN_SPAN_OUT("the layer's device workspace", dspan[2].p, dspan[2].bytes, 0u)};
    SN_TRY(sn__check_spans(fn, spans, SN_SPANS(spans)));
  }
  if (bn->comm != NULL) SN_TRY(sn__comm_check(fn, bn->comm));
  return SN_OK;
}

static uint64_t fnv1a(const void *p, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
  return h;
}

/* The bits of a float as a nonnegative int64 (for the signature). */
static int64_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (int64_t)u;
}

/* The float whose bits float_bits gave. */
static float float_of(int64_t bits) {
  const uint32_t u = (uint32_t)bits;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* A hash of the running statistics (running_mean, running_var, num_batches_tracked), 0 without
 * them; nonnegative. */
static int64_t running_hash(const sn_syncbn_t *bn) {
  if (!bn->cfg.track_running_stats) return 0;
  const size_t bytes = (size_t)bn->C * sizeof(float);
  const uint64_t h = fnv1a(bn->running_mean, bytes) ^ (fnv1a(bn->running_var, bytes) * 31u) ^
                     fnv1a(&bn->num_batches_tracked, sizeof bn->num_batches_tracked);
  return (int64_t)(h >> 2);
}

/* The fields of the signature (check_consistency): those of the call up to CALL_FIELDS, then
 * the configuration up to CONFIG_FIELDS, then the running statistics. F_CHECKS: the status of
 * this rank's own checks of the call (0: passed; see tell_peers). */
enum {
  F_ID, F_C, F_OP, F_DTYPE, F_LAYOUT, F_CHECKS, F_MOMENTUM, F_EPS, F_TRACK, F_AFFINE, F_FINITE,
  F_RUNNING, K
};
enum { CALL_FIELDS = F_CHECKS + 1, CONFIG_FIELDS = F_RUNNING };

/* The name of a value of field k of the signature (check_consistency), where it has one: the
 * operation, dtype and layout; NULL otherwise. */
static const char *field_name(int k, int64_t v) {
  static const char *const op_name[] = {"?", "forward", "backward"};
  static const char *const dtype_name[] = {"f32", "bf16", "f16", "f64"};
  static const char *const layout_name[] = {"NCHW", "NHWC"};
  if (k == F_CHECKS) return v == 0 ? "passed" : sn_status_string((sn_status_t)v);
  const char *const *names = k == F_OP       ? op_name
                             : k == F_DTYPE  ? dtype_name
                             : k == F_LAYOUT ? layout_name
                                             : NULL;
  const int64_t count = k == F_OP ? 3 : k == F_DTYPE ? 4 : 2;
  return names != NULL && v >= 0 && v < count ? names[v] : NULL;
}

/* One value of field k as text: a name (field_name), momentum and eps from their bits ("None"
 * for SN_MOMENTUM_CUMULATIVE; 0.1, or 0.100000009 where %g would print two values alike), the
 * number otherwise; the running statistics' hash has no text
 * of its own: "one state" for the first value shown (first != 0), "another" after it. */
static void field_value(char *out, size_t size, int k, int64_t v, int first) {
  const char *name = field_name(k, v);
  if (name != NULL) {
    snprintf(out, size, "%s", name);
  } else if (k == F_MOMENTUM || k == F_EPS) {
    const float f = float_of(v);
    if (k == F_MOMENTUM && f == SN_MOMENTUM_CUMULATIVE) {
      snprintf(out, size, "None");
    } else { /* the shortest of %g and %.9g that reads back as f: values that differ print so */
      snprintf(out, size, "%g", (double)f);
      if (strtof(out, NULL) != f) snprintf(out, size, "%.9g", (double)f);
    }
  } else if (k == F_RUNNING) {
    snprintf(out, size, "%s", first ? "one state" : "another");
  } else {
    snprintf(out, size, "%lld", (long long)v);
  }
}

/* One field's range over the ranks, lo..hi (its maxima of v and −v), for the message of
 * check_consistency beyond SN_MSG_TABLE_RANKS: names or values as field_value, with the lowest
 * rank holding each (rlo, rhi; −1: not known, then only the values); two momentum or eps values
 * (the extreme bit patterns) and two ranks whose running statistics differ as examples. */
static int field_range(char *out, size_t size, int k, int64_t lo, int64_t hi, int64_t rlo,
                       int64_t rhi) {
  const int ranked = rlo >= 0 && rhi >= 0;
  if (k == F_RUNNING)
    return ranked ? snprintf(out, size, " (e.g. ranks %lld and %lld)", (long long)rlo,
                             (long long)rhi)
                  : snprintf(out, size, "%s", "");
  char a[32], b[32], ra[32] = "", rb[32] = "";
  if ((k == F_MOMENTUM || k == F_EPS) && float_of(lo) > float_of(hi)) { /* order values, not bits */
    const int64_t t = lo, rt = rlo;
    lo = hi, rlo = rhi, hi = t, rhi = rt;
  }
  field_value(a, sizeof a, k, lo, 0), field_value(b, sizeof b, k, hi, 0);
  if (ranked) {
    snprintf(ra, sizeof ra, " on rank %lld", (long long)rlo);
    snprintf(rb, sizeof rb, " on rank %lld", (long long)rhi);
  }
  if (k == F_MOMENTUM || k == F_EPS) /* the extreme bit patterns: two of the values */
    return snprintf(out, size, " (e.g. %s%s, %s%s)", a, ranked ? ra : " on one rank", b,
                    ranked ? rb : " on another");
  if (!ranked) return snprintf(out, size, " (%s..%s)", a, b);
  return snprintf(out, size, " (%s..%s; e.g. %s%s, %s%s)", a, b, a, ra, b, rb);
}

/* Up to SN_MSG_TABLE_RANKS ranks, a mismatch gathers every rank's signature (on the stack: 6 KiB)
 * and the message lists the ranks of each value (sn__field_by_rank, agree.c); beyond, the lowest
 * rank holding each extreme (field_range). No allocation on that path: every rank must make the
 * same collective. */

/* With cfg.check_consistency: one max-all-reduce of (v, −v) for each field of this call's
 * signature. Every rank gets the same maxima, so every rank reaches the same verdict. The first
 * CALL_FIELDS fields say which call each rank made; where one of them differs the ranks are out
 * of step, and the others (another layer's configuration and state) differ as a consequence,
 * so only the call fields are reported then; likewise the configuration fields before the
 * running statistics (whose hash changes with track_running_stats). On a mismatch every rank
 * (all take that path) makes one more collective: up to SN_MSG_TABLE_RANKS ranks a sum
 * all-reduce of a [ranks, fields] table in which each rank fills its own row (exact: one nonzero
 * term per element), so that the message lists which ranks hold which value; beyond, a max
 * all-reduce of the lowest rank holding each field's extremes. The ranks are those of the
 * layer's communicator (of a split one, not the world's). Should that collective fail (a
 * timeout), its status is returned, with both messages: the communicator is then broken. */
static sn_status_t check_consistency(sn_syncbn_t *bn, const char *fn, int op, sn_status_t checks) {
  /* check_finite is configuration too: a rank with it returns SN_ERR_NONFINITE before the
   * statistics' second all-reduce (the pivot refinement) that a rank without it makes, so ranks
   * that differ in it would go on out of step (a review: MPI_ERR_TRUNCATE ended the job) */
  static const char *const field[K] = {
      "layer id", "C (num_features)", "operation", "dtype", "layout",
      "the call's own checks (a rank whose arguments or state failed them returned that error)",
      "momentum", "eps", "track_running_stats", "affine", "check_finite",
      "running statistics (load or set them on every rank, or broadcast them from one)"};
  /* momentum + 0.0f: -0 and 0 are the same momentum (a review: they were reported as differing) */
  int64_t sig[K] = {bn->id, bn->C, op, (int64_t)bn->cfg.dtype, (int64_t)bn->cfg.layout,
                    (int64_t)checks, float_bits(bn->cfg.momentum + 0.0f), float_bits(bn->cfg.eps),
                    bn->cfg.track_running_stats, bn->cfg.affine, bn->cfg.check_finite != 0,
                    running_hash(bn)};
  int64_t v[2 * K];
  for (int k = 0; k < K; k++) v[k] = sig[k], v[K + k] = -sig[k];
  bn->collectives++;
  char where[sizeof bn->label + 64];
  snprintf(where, sizeof where, "%s (%s, consistency check)", fn, bn->label);
  SN_TRY(sn__comm_allreduce_host(where, bn->comm, v, 2 * K, SN_RED_I64, SN_RED_MAX));
  int last = K, differs = 0;
  for (int k = K - 1; k >= 0; k--) { /* the tier of the first field that differs */
    if (v[k] == -v[K + k]) continue;
    differs = 1;
    last = k < CALL_FIELDS ? CALL_FIELDS : k < CONFIG_FIELDS ? CONFIG_FIELDS : K;
  }
  if (!differs) return SN_OK;
  /* every rank is here (the same verdict everywhere): one more collective, of a size every rank
   * knows, tells which ranks hold which values; without it (an error) only the ranges */
  const int ranks = bn->comm->size, me = bn->comm->rank;
  int64_t table[SN_MSG_TABLE_RANKS * K] = {0}, who[2 * K];
  const int by_rank = ranks <= SN_MSG_TABLE_RANKS;
  if (by_rank) {
    memcpy(table + (int64_t)me * K, sig, sizeof sig);
  } else { /* −(the lowest rank) holding each field's largest value, then its smallest */
    for (int k = 0; k < K; k++) {
      who[k] = sig[k] == v[k] ? -me : INT64_MIN;
      who[K + k] = sig[k] == -v[K + k] ? -me : INT64_MIN;
    }
  }
  bn->collectives++;
  snprintf(where, sizeof where, "%s (%s, ranks of a mismatch)", fn, bn->label);
  const sn_status_t got = sn__comm_allreduce_host(where, bn->comm, by_rank ? table : who,
                                             by_rank ? (int64_t)ranks * K : 2 * K, SN_RED_I64,
                                             by_rank ? SN_RED_SUM : SN_RED_MAX);
  const int known = got == SN_OK;
  char why[256] = ""; /* why the ranks are not named: that collective's own error */
  if (!known) snprintf(why, sizeof why, "%s", sn_last_error());
  char msg[640];
  int len = 0;
  for (int k = 0; k < last && len < (int)sizeof msg; k++) {
    if (v[k] == -v[K + k]) continue;
    len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s differs across ranks", len ? "; " : "",
                    field[k]);
    if (len >= (int)sizeof msg) break;
    len += known && by_rank
               ? sn__field_by_rank(msg + len, sizeof msg - (size_t)len, k, table, ranks, K,
                                   field_value)
               : field_range(msg + len, sizeof msg - (size_t)len, k, -v[K + k], v[k],
                             known ? -who[K + k] : -1, known ? -who[k] : -1);
  }
  if (len >= (int)sizeof msg) memcpy(msg + sizeof msg - 4, "...", 4); /* cut: say so */
  /* Where naming the ranks failed (a timeout or a broken communicator), that status is returned:
   * the communicator is now unusable, which the caller must learn from the code. */
  return sn__fail(known ? SN_ERR_MISMATCH : got,
                  "%s: ranks disagree on this collective (every rank must call the same layers "
                  "in the same order; a rank that got an error from an earlier call, or skipped "
                  "one, is a call behind); this rank called %s with C %lld (%s): %s%s%s",
                  fn, bn->label, (long long)bn->C, op == OP_FORWARD ? "forward" : "backward", msg,
                  known ? "" : "; then naming the ranks failed: ", why);
}

sn_status_t sn__syncbn_consistency(sn_syncbn_t *bn, const char *fn, int op) {
  return check_consistency(bn, fn, op, SN_OK);
}

/* The pivot slots of a forward's all-reduce: two 16-bit hashes h1, h2 of the pivot [C] and
 * their squares, summed over the ranks (exact: integers below 2^53). */
static void pivot_slots(double slot[SN_PIVOT_SLOTS], const float *pivot, int64_t C) {
  const uint64_t h = fnv1a(pivot, (size_t)C * sizeof(float));
  const double h1 = (double)(h & 0xffffu), h2 = (double)((h >> 16) & 0xffffu);
  slot[0] = h1, slot[1] = h1 * h1, slot[2] = h2, slot[3] = h2 * h2;
}

/* a·b == c·d exactly, for doubles whose products stay below 2^1000: the rounded products and
 * their exact rounding errors (fma) are equal exactly when the products are. */
static int products_equal(double a, double b, double c, double d) {
  const double p = a * b, q = c * d;
  return p == q && fma(a, b, -p) == fma(c, d, -q);
}

/* Whether the summed pivot slots of `ranks` ranks say every rank used the same pivot: N·Σh² ==
 * (Σh)² holds exactly when all h are equal (Cauchy–Schwarz), for both hashes; two different
 * pivots pass only if both 16-bit hashes collide (2^-32). The sums are the same on every rank,
 * so every rank reaches the same verdict. */
static int pivots_agree(const double slot[SN_PIVOT_SLOTS], int ranks) {
  return products_equal((double)ranks, slot[1], slot[0], slot[0]) &&
         products_equal((double)ranks, slot[3], slot[2], slot[2]);
}

/* Sum all-reduce of bn->red (count values) when synchronized; counts the collective. */
static sn_status_t reduce(sn_syncbn_t *bn, const char *fn, int64_t count, int synced) {
  if (!synced) return SN_OK;
  bn->collectives++;
  char where[sizeof bn->label + 64];
  snprintf(where, sizeof where, "%s (%s)", fn, bn->label);
  return sn__comm_allreduce(where, bn->comm, bn->red, count, SN_RED_F64, SN_RED_SUM);
}

static int all_finite(const double *v, int64_t count) {
  for (int64_t i = 0; i < count; i++)
    if (!isfinite(v[i])) return 0;
  return 1;
}

/* Local sums with `pivot` into red (+ count, + pivot slots), then the all-reduce. */
static sn_status_t batch_sums(sn_syncbn_t *bn, const char *fn, const void *x, const float *pivot,
                              int64_t n, int64_t s, int synced) {
  const int64_t C = bn->C;
  SN_TRY(sn_batchnorm_stats(bn->red, bn->red + C, x, pivot, n, C, s, bn->cfg.layout, bn->cfg.dtype));
  bn->red[2 * C] = (double)(n * s);
  pivot_slots(bn->red + 2 * C + 1, pivot, C);
  return reduce(bn, fn, 2 * C + SN_RED_EXTRA, synced);
}

/* The batch statistics (bn->mean, var, rstd) of x, summed over comm when `synced`, and y;
 * *count: the (global) count of values per channel. A (global) count of 0 writes nothing. */
static sn_status_t batch_stats(sn_syncbn_t *bn, const char *fn, void *y, const void *x,
                               int64_t n, int64_t s, int synced, int64_t *count) {
  const int64_t C = bn->C;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  SN_TRY(batch_sums(bn, fn, x, bn->pivot, n, s, synced));
  if (synced && !pivots_agree(bn->red + 2 * C + 1, bn->comm->size)) {
    /* the ranks summed around different pivots: all redo the sums around 0 */
    for (int64_t c = 0; c < C; c++) bn->pivot[c] = 0.0f;
    SN_TRY(batch_sums(bn, fn, x, bn->pivot, n, s, synced));
  }
  *count = (int64_t)bn->red[2 * C];
  if (*count == 0) return SN_OK;
  if (*count == 1)
    return sn__fail(SN_ERR_INSUFFICIENT_COUNT,
                    "%s: %s: expected more than 1 value per channel when training, got a %s count "
                    "of 1 (input [%lld, %lld, %lld] on this rank)",
                    fn, bn->label, synced ? "global" : "batch", (long long)n, (long long)C,
                    (long long)s);
  if (cfg->check_finite && !all_finite(bn->red, 2 * C))
    return sn__fail(SN_ERR_NONFINITE,
                    "%s: %s: x holds NaN or Inf on %s; nothing was written or updated", fn,
                    bn->label, synced ? "at least one rank" : "this rank");
  const float *pivot = bn->pivot;
  /* the pivots to sum around again, per channel, as often as sn__bn_refine asks (once where the
   * pivot was the previous batch's mean of data that moved: up to three times where it was
   * nowhere near); every rank decides alike (the same sums) */
  for (int round = 1; sn__bn_refine_pivots(bn->tmp, bn->red, bn->red + C, pivot, C,
                                           (double)*count, round);
       round++) {
    pivot = bn->tmp;
    SN_TRY(batch_sums(bn, fn, x, pivot, n, s, synced));
  }
  SN_TRY(sn_batchnorm_finalize(bn->mean, bn->var, bn->rstd, bn->red, bn->red + C, pivot, *count,
                               C, cfg->eps));
  return sn_batchnorm_apply(y, x, bn->mean, bn->rstd, bn->weight, bn->bias, n, C, s, cfg->layout,
                            cfg->dtype);
}

/* No other rank to agree with: no communicator, or one of a single rank. */
int sn__syncbn_alone(const sn_syncbn_t *bn) {
  return bn->comm == NULL || (bn->comm->size == 1 && !bn->force_sync);
}

void sn__syncbn_test_force_sync(sn_syncbn_t *bn, int on) {
  if (bn == NULL || bn->comm == NULL) return;
  bn->force_sync = on != 0;
  bn->comm->force_collectives = on != 0;
}
static int alone(const sn_syncbn_t *bn) { return sn__syncbn_alone(bn); }

/* A call that failed this rank's own checks (st, its message in sn_last_error) where the other
 * ranks, making the same call, would be in its consistency all-reduce (would_sync, from this
 * rank's arguments and saved forward): this rank makes that all-reduce too, with st in its
 * signature (F_CHECKS), so that the others return SN_ERR_MISMATCH naming it at once instead of
 * waiting for it until SN_COMM_TIMEOUT_S. With check_consistency off the call has no such
 * all-reduce: then only where the communicator's call check (SN_COMM_CHECK) is on, in the call
 * check of the others' first all-reduce (sn__comm_tell). On a live layer whose communicator is
 * live. A forward told so drops the saved forward, as the others' forward, failing the check,
 * does: a backward then fails on every rank (a review: keeping it let a backward run on the step
 * before). A backward keeps it everywhere. Returns st with its message, or, where telling
 * failed, that collective's status (the communicator is then broken) with both messages. */
static sn_status_t tell_peers(sn_syncbn_t *bn, const char *fn, int op, sn_status_t st,
                              int would_sync) {
  if (!would_sync || !SN_SYNCBN_LIVE(bn) || !SN_COMM_LIVE(bn->comm) || bn->comm->broken ||
      alone(bn))
    return st;
  char own[1024], why[1024];
  snprintf(own, sizeof own, "%s", sn_last_error());
  sn_status_t told = SN_OK;
  if (bn->cfg.check_consistency) {
#if SN_HAVE_CUDA
    if (bn->dev != NULL) (void)sn__syncbn_dev_download(bn); /* the hash, as the others send it */
#endif
    told = check_consistency(bn, fn, op, st);
  } else { /* the communicator's call check, where it is on, meets the others' first all-reduce */
    char where[sizeof bn->label + 64];
    snprintf(where, sizeof where, "%s (%s)", fn, bn->label);
    if (!sn__comm_tell(where, bn->comm, st, &told)) return sn__fail(st, "%s", own);
  }
  if (op == OP_FORWARD) bn->saved.valid = 0;
  if (told == SN_OK) /* every rank failed its checks alike: each returns its own error */
    return sn__fail(st, "%s", own);
  if (told == SN_ERR_MISMATCH)
    return sn__fail(st, "%s (sent to the other ranks in the %s: those whose checks passed "
                        "return SN_ERR_MISMATCH)",
                    own, bn->cfg.check_consistency ? "consistency check" : "call check");
  snprintf(why, sizeof why, "%s", sn_last_error()); /* sn__fail writes over sn_last_error */
  return sn__fail(told, "%s; then telling the other ranks failed: %s", own, why);
}

sn_status_t sn__syncbn_tell_peers(sn_syncbn_t *bn, const char *fn, int op, sn_status_t st,
                                  int would_sync) {
  return tell_peers(bn, fn, op, st, would_sync);
}

/* Whether this rank's backward would make its consistency all-reduce: after a synchronized
 * forward of a nonempty global batch. Without a saved forward it cannot know what the others do
 * (a review: assuming they were in the forward this rank skipped, a frozen layer's stray
 * all-reduce met the others' next collective), so the error stays local, as before. */
static int backward_would_sync(const sn_syncbn_t *bn) {
  return SN_SYNCBN_LIVE(bn) && bn->saved.valid && bn->saved.synced && bn->saved.count != 0;
}

/* Training-mode forward (or track_running_stats = 0): batch statistics, synced over comm when
 * `synced`, running stats updated when `update`. */
static sn_status_t forward_batch(sn_syncbn_t *bn, const char *fn, void *y, const void *x,
                                 int64_t n, int64_t s, int synced, int update) {
  const int64_t C = bn->C;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  bn->saved.valid = 0; /* a failure below leaves no saved forward (on every rank: tell_peers) */
  /* A batch with NaN/Inf (check_finite off) or a checkpoint's non-finite running_mean leaves a
   * non-finite pivot, which would make the sums of every later batch NaN: restart such channels
   * from 0. The pivot is identical on every rank, so every rank resets the same channels. */
  for (int64_t c = 0; c < C; c++)
    if (!isfinite(bn->pivot[c])) bn->pivot[c] = 0.0f;
  if (synced && cfg->check_consistency) SN_TRY(check_consistency(bn, fn, OP_FORWARD, SN_OK));
  int64_t count = n * s;
  if (!synced && !cfg->check_finite && count > 1) {
    /* nothing to all-reduce, nothing to check before y is written: the local forward, bitwise
     * the steps of batch_stats, fused where x fits in the cache (x read from memory once) */
    SN_TRY(sn_batchnorm_fwd(y, bn->mean, bn->var, bn->rstd, x, bn->pivot, bn->weight, bn->bias,
                            n, C, s, cfg->eps, cfg->layout, cfg->dtype));
  } else {
    SN_TRY(batch_stats(bn, fn, y, x, n, s, synced, &count));
  }
  if (count == 0) { /* the whole (global) batch is empty: nothing to normalize, but counted as
                       * torch's module forward counts it (num_batches_tracked before F.batch_norm) */
    if (update) /* counts the batch only (cannot fail) */
      SN_TRY(sn_batchnorm_update_running(bn->running_mean, bn->running_var,
                                         &bn->num_batches_tracked, bn->mean, bn->var, 0, C,
                                         cfg->momentum));
    bn->saved = (sn_syncbn_saved_t){1, 1, synced, n, s, 0};
    return SN_OK;
  }
  if (update) /* cannot fail: count > 1 and momentum were checked */
    SN_TRY(sn_batchnorm_update_running(bn->running_mean, bn->running_var, &bn->num_batches_tracked,
                                       bn->mean, bn->var, count, C, cfg->momentum));
  /* the next pivot: this batch's mean — identical on every rank only when synchronized */
  if (synced || alone(bn))
    for (int64_t c = 0; c < C; c++) bn->pivot[c] = (float)bn->mean[c];
  bn->saved = (sn_syncbn_saved_t){1, 1, synced, n, s, count};
  return SN_OK;
}

/* Eval-mode forward with running statistics; saves them for a frozen backward. */
static sn_status_t forward_eval(sn_syncbn_t *bn, const char *fn, void *y, const void *x,
                                int64_t n, int64_t s) {
  const sn_syncbn_config_t *cfg = &bn->cfg;
  /* the running statistics can be bad (a negative running_var written through
   * sn_syncbn_params): the message names the caller and the layer before the kernel's */
  const sn_status_t st = sn_batchnorm_infer(y, x, bn->running_mean, bn->running_var, bn->weight,
                                            bn->bias, n, bn->C, s, cfg->eps, cfg->layout,
                                            cfg->dtype);
  if (st != SN_OK) return sn__fail_prefix(st, "%s (%s)", fn, bn->label);
  for (int64_t c = 0; c < bn->C; c++) {
    bn->mean[c] = bn->running_mean[c];
    bn->rstd[c] = (float)(1.0 / sqrt((double)bn->running_var[c] + (double)cfg->eps));
  }
  bn->saved = (sn_syncbn_saved_t){1, 0, 0, n, s, 0};
  return SN_OK;
}

sn_status_t sn_syncbn_forward(sn_syncbn_t *bn, void *y, const void *x, int64_t n, int64_t s,
                              int training) {
  const char *fn = "sn_syncbn_forward";
  const sn_status_t st = check_call(fn, bn, n, s, x, "x", y, "y", NULL, NULL);
  if (st != SN_OK) return tell_peers(bn, fn, OP_FORWARD, st, training); /* eval: not synced */
#if SN_HAVE_CUDA
  if (bn->dev != NULL) return sn__syncbn_dev_forward(bn, fn, y, x, n, s, training);
#endif
  if (!training && bn->cfg.track_running_stats) return forward_eval(bn, fn, y, x, n, s);
  /* PyTorch synchronizes only in training mode and with more than one rank
   * (torch.nn.SyncBatchNorm.forward: need_sync = ... and world_size > 1) */
  const int synced = training && !alone(bn);
  const int update = training && bn->cfg.track_running_stats;
  if (update && bn->num_batches_tracked < 0) /* written through sn_syncbn_params */
    return tell_peers(bn, fn, OP_FORWARD,
                      sn__fail(SN_ERR_INVALID_ARGUMENT,
                               "%s: %s: num_batches_tracked must be >= 0, got %lld", fn, bn->label,
                               (long long)bn->num_batches_tracked),
                      synced);
  return forward_batch(bn, fn, y, x, n, s, synced, update);
}

sn_status_t sn_syncbn_backward(sn_syncbn_t *bn, void *dx, const void *dy, const void *x,
                               int64_t n, int64_t s) {
  const char *fn = "sn_syncbn_backward";
  sn_status_t st = check_call(fn, bn, n, s, dy, "dy", x, "x", dx, "dx");
  if (st == SN_OK && !bn->saved.valid)
    st = sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: %s: backward without a successful forward", fn,
                  bn->label);
  if (st == SN_OK && (n != bn->saved.n || s != bn->saved.s))
    st = sn__fail(SN_ERR_INVALID_ARGUMENT,
                  "%s: %s: shape n=%lld s=%lld differs from the forward's n=%lld s=%lld", fn,
                  bn->label, (long long)n, (long long)s, (long long)bn->saved.n,
                  (long long)bn->saved.s);
  if (st != SN_OK) return tell_peers(bn, fn, OP_BACKWARD, st, backward_would_sync(bn));
#if SN_HAVE_CUDA
  if (bn->dev != NULL) return sn__syncbn_dev_backward_call(bn, fn, dx, dy, x, n, s);
#endif
  const int64_t C = bn->C;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  const int synced = bn->saved.synced;
  if (bn->saved.batch_stats && bn->saved.count == 0) { /* empty global batch: zero gradients */
    if (cfg->affine)
      for (int64_t c = 0; c < C; c++) bn->grad_weight[c] = bn->grad_bias[c] = 0.0f;
    return SN_OK;
  }
  if (!synced && bn->saved.batch_stats && !cfg->check_finite)
    /* nothing to all-reduce (no communicator or one of one rank, or eval mode without running
     * statistics): the local backward, fused where it can be; bitwise the two passes below,
     * grad_weight and grad_bias the same roundings of the same sums */
    return sn_batchnorm_bwd(dx, cfg->affine ? bn->grad_weight : NULL,
                            cfg->affine ? bn->grad_bias : NULL, dy, x, bn->mean, bn->rstd,
                            bn->weight, n, C, s, cfg->layout, cfg->dtype);
  if (synced && cfg->check_consistency) SN_TRY(check_consistency(bn, fn, OP_BACKWARD, SN_OK));
  /* local Σdy, Σdy·x̂: this rank's dβ, dγ — and, summed over ranks, what dx needs */
  SN_TRY(sn_batchnorm_bwd_reduce(bn->red, bn->red + C, dy, x, bn->mean, bn->rstd, n, C, s,
                                 cfg->layout, cfg->dtype));
  memcpy(bn->local, bn->red, (size_t)(2 * C) * sizeof(double));
  if (bn->saved.batch_stats) SN_TRY(reduce(bn, fn, 2 * C, synced));
  if (cfg->check_finite && !all_finite(bn->red, 2 * C))
    return sn__fail(SN_ERR_NONFINITE, "%s: %s: dy holds NaN or Inf on %s; nothing was written", fn,
                    bn->label,
                    synced && all_finite(bn->local, 2 * C) ? "another rank" : "this rank");
  if (bn->saved.batch_stats)
    SN_TRY(sn_batchnorm_bwd_apply(dx, dy, x, bn->mean, bn->rstd, bn->weight, bn->red, bn->red + C,
                                  bn->saved.count, n, C, s, cfg->layout, cfg->dtype));
  else /* frozen BatchNorm: statistics are constants, dx = γ·rstd·dy */
    SN_TRY(sn_batchnorm_bwd_apply(dx, dy, x, bn->mean, bn->rstd, bn->weight, NULL, NULL, 0, n, C,
                                  s, cfg->layout, cfg->dtype));
  if (cfg->affine)
    for (int64_t c = 0; c < C; c++) {
      bn->grad_bias[c] = (float)bn->local[c];
      bn->grad_weight[c] = (float)bn->local[C + c];
    }
  return SN_OK;
}
