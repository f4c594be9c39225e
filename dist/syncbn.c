/*
 * syncbn.c — SyncBatchNorm: BatchNorm whose batch statistics are summed over the ranks of a
 * communicator, with torch.nn.SyncBatchNorm's running-statistics semantics. One control flow for
 * host and device memory: the steps that touch the layer's tensors are its table of kernels
 * (bn->mem: syncbn_host.c, or the CUDA one libsyncnorm_cuda registers).
 *
 * Forward (training), per channel c, over all ranks:
 *   local Σ(x−p_c), Σ(x−p_c)², n·s (+ pivot hashes)  →  ONE all-reduce of f64  →  mean, biased
 *   var, rstd  →  y = (x−mean)·rstd·γ + β  →  running stats (unbiased var, global count).
 * The pivot p is the previous synchronized batch mean, identical on every rank, so the shifted
 * sums stay exact when |mean| ≫ σ (syncbn_host.c says when the host redoes them).
 * Backward: local Σdy, Σdy·x̂  →  ONE all-reduce of 2C f64  →  dx with the global count.
 * With nothing to all-reduce (comm == NULL or of one rank, or eval mode without running
 * statistics) the local steps run (mem->local_forward / local_backward where the memory has
 * them). References: Ioffe & Szegedy 2015 (BatchNorm); torch.nn.SyncBatchNorm and
 * torch.nn.functional.batch_norm docs (momentum, unbiased running_var, num_batches_tracked).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_internal.h"

/* A forward's all-reduce holds 2C sums, then the count and the host's pivot slots. */
#define SN_RED_EXTRA (1 + SN_PIVOT_SLOTS)

/* The kernels for cfg.device_memory = 1, once libsyncnorm_cuda has registered them. */
static const sn_syncbn_mem_t *device_mem;

void sn__syncbn_register_device(const sn_syncbn_mem_t *mem) { device_mem = mem; }

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
  const sn_syncbn_mem_t *mem = cfg->device_memory ? device_mem : &sn__syncbn_host_mem;
  if (cfg->device_memory && mem == NULL)
    return sn__fail(SN_ERR_UNSUPPORTED,
                    "%s: device_memory needs libsyncnorm_cuda (CMake: syncnorm::cuda; "
                    "pkg-config: syncnorm-cuda) linked into the program", fn);
  if (cfg->device_memory != 0 && cfg->device_memory != 1)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: device_memory must be 0 or 1, got %d", fn,
                    cfg->device_memory);
  if (cfg->device_memory && comm != NULL && !comm->ops->device_memory)
    return sn__fail(SN_ERR_UNSUPPORTED,
                    "%s: device_memory needs an \"nccl\" communicator (or none), got a '%s' one, "
                    "whose all-reduces take host memory", fn, comm->ops->name);
  if (cfg->check_finite && !mem->check_finite)
    return sn__fail(SN_ERR_UNSUPPORTED,
                    "%s: check_finite is not available with device_memory (it would need a host "
                    "round trip per step); check the activations yourself", fn);
  if (mem->usable != NULL) SN_TRY(mem->usable(fn));
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
  bn->mem = mem;
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
  if (mem->create != NULL) { /* the state on the device; the host arrays become its mirror */
    const sn_status_t st = mem->create(bn);
    if (st != SN_OK) {
      sn__handle_take(bn, SN_HANDLE_SYNCBN);
      if (comm != NULL && cfg->layer_id < 0) comm->next_layer_id--;
      free(f), free(d), free(bn);
      return st;
    }
  }
  *out = bn;
  return SN_OK;
}

void sn_syncbn_destroy(sn_syncbn_t *bn) {
  if (bn == NULL || !sn__handle_take(bn, SN_HANDLE_SYNCBN)) return; /* not (no longer) one */
  if (bn->mem->destroy != NULL) bn->mem->destroy(bn);
  free(bn->fblock);
  free(bn->red);
  free(bn);
}

sn_status_t sn_syncbn_params(sn_syncbn_t *bn, sn_syncbn_params_t *p) {
  SN_TRY(sn__check_ptr("sn_syncbn_params", "params", p));
  SN_TRY(sn__syncbn_check("sn_syncbn_params", bn));
  bn->mem->params(bn, p);
  return SN_OK;
}

sn_status_t sn_syncbn_batch_stats(sn_syncbn_t *bn, int64_t *count, double *mean, double *var) {
  const char *fn = "sn_syncbn_batch_stats";
  SN_TRY(sn__syncbn_check(fn, bn));
  SN_TRY(sn__check_ptr(fn, "count", count));
  if (!bn->saved.valid || !bn->saved.batch_stats)
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: %s: the last forward %s", fn, bn->label,
                    bn->saved.valid ? "used the running statistics (eval mode)"
                                    : "did not succeed, or there was none");
  int64_t c = bn->saved.count;
  if (c < 0) SN_TRY(bn->mem->saved_count(bn, fn, &c)); /* known on the device only */
  if (c > 1 && (mean != NULL || var != NULL)) SN_TRY(bn->mem->batch_stats(bn, fn, mean, var));
  *count = c;
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
    sn__dev_span_t dspan[3];
    bn->mem->spans(bn, dspan);
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


/* Sum all-reduce of the layer's reduce buffer (count values) when synchronized; counts the
 * collective. */
static sn_status_t reduce(sn_syncbn_t *bn, const char *fn, int64_t count, int synced) {
  if (!synced) return SN_OK;
  bn->collectives++;
  char where[sizeof bn->label + 64];
  snprintf(where, sizeof where, "%s (%s)", fn, bn->label);
  return sn__comm_allreduce(where, bn->comm, bn->mem->reduce_buf(bn), count, SN_RED_F64,
                            SN_RED_SUM);
}

/* A step whose local sums failed (st, its message set) after the ranks agreed to make it: where
 * the memory's collectives have no timeout (NCCL), the others would wait for this rank's
 * all-reduce for ever, so it is made all the same over NaN sums (the others' statistics are NaN,
 * not silently wrong); st is returned with its message. */
static sn_status_t reduce_anyway(sn_syncbn_t *bn, const char *fn, int64_t count, int synced,
                                 sn_status_t st) {
  if (!synced || bn->mem->fill_nan == NULL) return st;
  char own[1024];
  snprintf(own, sizeof own, "%s", sn_last_error());
  bn->mem->fill_nan(bn, count);
  (void)reduce(bn, fn, count, synced);
  return sn__fail(st, "%s (the all-reduce was made over NaN sums, so that the other ranks do not "
                      "wait for it)", own);
}

static int all_finite(const double *v, int64_t count) {
  for (int64_t i = 0; i < count; i++)
    if (!isfinite(v[i])) return 0;
  return 1;
}

/* Local sums (around the refined pivot where `refined`) into the reduce buffer, then the
 * all-reduce of 2C sums, the count and the memory's pivot slots. */
static sn_status_t batch_sums(sn_syncbn_t *bn, const char *fn, const void *x, int64_t n,
                              int64_t s, int synced, int refined) {
  const int64_t count = 2 * bn->C + 1 + bn->mem->pivot_slots;
  const sn_status_t st = bn->mem->sums(bn, fn, x, n, s, refined);
  return st == SN_OK ? reduce(bn, fn, count, synced) : reduce_anyway(bn, fn, count, synced, st);
}

/* The batch statistics (mean, var, rstd) of x, summed over comm when `synced`, and y; *count:
 * the (global) count of values per channel (-1: known on the device only). A (global) count of
 * 0 writes nothing. */
static sn_status_t batch_stats(sn_syncbn_t *bn, const char *fn, void *y, const void *x,
                               int64_t n, int64_t s, int synced, int64_t *count) {
  const int64_t C = bn->C;
  const sn_syncbn_mem_t *mem = bn->mem;
  SN_TRY(batch_sums(bn, fn, x, n, s, synced, 0));
  if (synced && mem->pivot_slots > 0 &&
      !sn__syncbn_pivots_agree(mem->reduce_buf(bn) + 2 * C + 1, bn->comm->size)) {
    /* the ranks summed around different pivots: all redo the sums around 0 */
    mem->reset_pivot(bn);
    SN_TRY(batch_sums(bn, fn, x, n, s, synced, 0));
  }
  *count = n * s;
  if (synced) SN_TRY(mem->global_count(bn, fn, count));
  if (*count == 0) return SN_OK;
  if (*count == 1)
    return sn__fail(SN_ERR_INSUFFICIENT_COUNT,
                    "%s: %s: expected more than 1 value per channel when training, got a %s count "
                    "of 1 (input [%lld, %lld, %lld] on this rank)",
                    fn, bn->label, synced ? "global" : "batch", (long long)n, (long long)C,
                    (long long)s);
  if (bn->cfg.check_finite && !all_finite(mem->reduce_buf(bn), 2 * C)) /* host memory */
    return sn__fail(SN_ERR_NONFINITE,
                    "%s: %s: x holds NaN or Inf on %s; nothing was written or updated", fn,
                    bn->label, synced ? "at least one rank" : "this rank");
  int refined = 0;
  for (int round = 1; mem->refine != NULL && mem->refine(bn, *count, round, refined); round++) {
    refined = 1;
    SN_TRY(batch_sums(bn, fn, x, n, s, synced, 1));
  }
  SN_TRY(mem->finalize(bn, fn, *count, refined));
  return mem->apply(bn, fn, y, x, n, s);
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
 * signature, so that the others return SN_ERR_MISMATCH naming it at once instead of waiting for
 * it until SN_COMM_TIMEOUT_S. With check_consistency off the call has no such all-reduce: then
 * only where the communicator's call check (SN_COMM_CHECK) is on, in the call check of the
 * others' first all-reduce (sn__comm_tell). On a live layer whose communicator is live. A
 * forward told so drops the saved forward, as the others' forward, failing the check, does: a
 * backward then fails on every rank. A backward keeps it everywhere. Returns st with its
 * message, or, where telling failed, that collective's status (the communicator is then broken)
 * with both messages. */
static sn_status_t tell_peers(sn_syncbn_t *bn, const char *fn, int op, sn_status_t st,
                              int would_sync) {
  if (!would_sync || !SN_SYNCBN_LIVE(bn) || !SN_COMM_LIVE(bn->comm) || bn->comm->broken ||
      alone(bn))
    return st;
  char own[1024], why[1024];
  snprintf(own, sizeof own, "%s", sn_last_error());
  sn_status_t told = SN_OK;
  if (bn->cfg.check_consistency) {
    (void)bn->mem->to_host(bn); /* the running statistics' hash, as the others send it */
    told = sn__syncbn_consistency(bn, fn, op, st, 1);
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

/* The consistency check of a call on [n, C, s] whose own checks passed, on the layer's current
 * state. A batch that is empty or has one position per channel is laid out alike in NCHW and
 * NHWC: its layout is not compared. */
static sn_status_t consistency(sn_syncbn_t *bn, const char *fn, int op, int64_t n, int64_t s) {
  SN_TRY(bn->mem->to_host(bn)); /* the running statistics, for their hash */
  return sn__syncbn_consistency(bn, fn, op, SN_OK, n > 0 && s > 1);
}

/* Whether this rank's backward would make its consistency all-reduce: after a synchronized
 * forward of a nonempty global batch. Without a saved forward it cannot know what the others do
 * (they may be in another collective), so the error stays local. */
static int backward_would_sync(const sn_syncbn_t *bn) {
  return SN_SYNCBN_LIVE(bn) && bn->saved.valid && bn->saved.synced && bn->saved.count != 0;
}

/* Training-mode forward (or track_running_stats = 0): batch statistics, synced over comm when
 * `synced`, running stats updated when `update`. */
static sn_status_t forward_batch(sn_syncbn_t *bn, const char *fn, void *y, const void *x,
                                 int64_t n, int64_t s, int synced, int update) {
  const sn_syncbn_config_t *cfg = &bn->cfg;
  const sn_syncbn_mem_t *mem = bn->mem;
  /* this rank's own failures before the first collective, where the peers can be told */
  const sn_status_t own = mem->prepare(bn, fn, 1, update, n, s);
  if (own != SN_OK) return tell_peers(bn, fn, OP_FORWARD, own, synced);
  bn->saved.valid = 0; /* a failure below leaves no saved forward (on every rank: tell_peers) */
  if (synced && cfg->check_consistency) SN_TRY(consistency(bn, fn, OP_FORWARD, n, s));
  int64_t count = n * s;
  if (!synced && !cfg->check_finite && count > 1 && mem->local_forward != NULL) {
    /* nothing to all-reduce, nothing to check before y is written: the local forward, bitwise
     * the steps of batch_stats */
    SN_TRY(mem->local_forward(bn, fn, y, x, n, s));
  } else {
    SN_TRY(batch_stats(bn, fn, y, x, n, s, synced, &count));
  }
  /* a (global) count of 0: the whole batch is empty, nothing to normalize, but counted as
   * torch's module forward counts it (num_batches_tracked before F.batch_norm); otherwise the
   * running statistics, and the next pivot: this batch's mean — identical on every rank only
   * when synchronized */
  SN_TRY(mem->update(bn, fn, count, update, count != 0 && (synced || alone(bn))));
  bn->saved = (sn_syncbn_saved_t){1, 1, synced, n, s, count};
  return SN_OK;
}

sn_status_t sn_syncbn_forward(sn_syncbn_t *bn, void *y, const void *x, int64_t n, int64_t s,
                              int training) {
  const char *fn = "sn_syncbn_forward";
  const sn_status_t st = check_call(fn, bn, n, s, x, "x", y, "y", NULL, NULL);
  if (st != SN_OK) return tell_peers(bn, fn, OP_FORWARD, st, training); /* eval: not synced */
  if (!training && bn->cfg.track_running_stats) { /* running statistics, for a frozen backward */
    SN_TRY(bn->mem->eval(bn, fn, y, x, n, s));
    bn->saved = (sn_syncbn_saved_t){1, 0, 0, n, s, 0};
    return SN_OK;
  }
  /* PyTorch synchronizes only in training mode and with more than one rank
   * (torch.nn.SyncBatchNorm.forward: need_sync = ... and world_size > 1) */
  const int synced = training && !alone(bn);
  const int update = training && bn->cfg.track_running_stats;
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
  const sn_syncbn_config_t *cfg = &bn->cfg;
  const sn_syncbn_mem_t *mem = bn->mem;
  const int synced = bn->saved.synced, batch_stats = bn->saved.batch_stats;
  if (batch_stats && bn->saved.count == 0) /* empty global batch: zero gradients */
    return mem->zero_grads(bn, fn);
  st = mem->prepare(bn, fn, 0, 0, n, s); /* before the first collective, as forward */
  if (st != SN_OK) return tell_peers(bn, fn, OP_BACKWARD, st, backward_would_sync(bn));
  if (!synced && batch_stats && !cfg->check_finite && mem->local_backward != NULL)
    /* nothing to all-reduce (no communicator or one of one rank, or eval mode without running
     * statistics): the local backward, bitwise the steps below */
    return mem->local_backward(bn, fn, dx, dy, x, n, s);
  if (synced && cfg->check_consistency) SN_TRY(consistency(bn, fn, OP_BACKWARD, n, s));
  /* local Σdy, Σdy·x̂: this rank's dβ, dγ — and, summed over ranks, what dx needs */
  st = mem->bwd_sums(bn, fn, dy, x, n, s);
  if (st != SN_OK) return batch_stats ? reduce_anyway(bn, fn, 2 * bn->C, synced, st) : st;
  if (batch_stats) SN_TRY(reduce(bn, fn, 2 * bn->C, synced));
  if (cfg->check_finite && !all_finite(mem->reduce_buf(bn), 2 * bn->C)) /* host memory */
    return sn__fail(SN_ERR_NONFINITE, "%s: %s: dy holds NaN or Inf on %s; nothing was written", fn,
                    bn->label,
                    synced && all_finite(bn->local, 2 * bn->C) ? "another rank" : "this rank");
  return mem->bwd_apply(bn, fn, dx, dy, x, n, s, batch_stats);
}
