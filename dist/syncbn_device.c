/*
 * syncbn_device.c — SyncBatchNorm's kernels on CUDA device memory (cfg.device_memory = 1): the
 * table of syncbn_internal.h for device memory, part of libsyncnorm_cuda, which registers it
 * when it is loaded. syncbn.c's control flow calls it as it calls the host table.
 *
 * Per layer on the device: weight, bias, grad_weight, grad_bias, running_mean, running_var,
 * pivot, var, rstd [C] f32; red [2C + 1] f64 (Σ(x−p) | Σ(x−p)² | count, or Σdy | Σdy·x̂), local
 * [2C] f64 (this rank's backward sums), mean [C] f64, count [1] f64 (the last forward's global
 * count), num_batches_tracked [1] int64, and the BatchNorm workspace. The host arrays of the
 * layer are a mirror, filled by to_host for the consistency check's hash and the checkpoints.
 *
 * Training forward: sn_cuda_batchnorm_stats of x around the device pivot into red, the local
 * count written by a kernel (n·s is a kernel argument, so a captured graph replays it), the
 * all-reduce of red [2C + 1] on the communicator's stream, the global count read back to the
 * host (a wait, skipped during graph capture), a finalize kernel (mean, var, rstd),
 * sn_cuda_batchnorm_apply, and an update kernel (running statistics, num_batches_tracked, next
 * pivot). Backward: sn_cuda_batchnorm_bwd_reduce into local, a kernel copies it to the gradients
 * (this rank's sums) and to red, the all-reduce of red [2C], a kernel rescales it by the
 * device-held count, sn_cuda_batchnorm_bwd_apply writes dx. No allocation, except where the
 * workspace grows (the first call of a larger shape: cudaMalloc after waiting for the stream).
 * The pivot is 0 at creation and after a load (never the loaded running mean, which may differ
 * across ranks), then the last synchronized mean: identical on every rank, so no pivot hash
 * slots are needed. No pivot refinement: shifted sums around the previous batch's mean lose
 * about log2((mean−p)²/var) of fp64's 53 bits, noticeable only where the data's mean jumps by
 * thousands of σ between batches.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_device.h"
#include "syncnorm_cuda.h"

enum { D_WEIGHT, D_BIAS, D_GW, D_GB, D_RM, D_RV, D_PIVOT, D_VAR, D_RSTD, D_FLOATS };

typedef struct {
  cudaStream_t stream;  /* the communicator's, or 0 (legacy default stream) without one */
  float *f;             /* [D_FLOATS · C] */
  double *red;          /* [2C + 1] */
  double *local;        /* [2C] */
  double *mean;         /* [C] */
  double *count;        /* [1] the last forward's global count */
  int64_t *nbt;         /* [1] num_batches_tracked */
  void *ws;             /* BatchNorm workspace */
  size_t ws_bytes;
} dev_state_t;

static dev_state_t *dev_of(const sn_syncbn_t *bn) { return (dev_state_t *)bn->dev; }
static float *arr(const sn_syncbn_t *bn, int k) {
  return dev_of(bn)->f + (size_t)k * (size_t)bn->C;
}

static sn_status_t cuda_st(const char *fn, const sn_syncbn_t *bn, const char *what,
                           cudaError_t err) {
  if (err == cudaSuccess) return SN_OK;
  return sn__fail(SN_ERR_CUDA, "%s: %s: %s failed: %s (%s)", fn, bn->label, what,
                  cudaGetErrorName(err), cudaGetErrorString(err));
}

static sn_status_t dev_wait(const char *fn, sn_syncbn_t *bn);
static sn_status_t upload_on(const char *fn, sn_syncbn_t *bn, cudaStream_t t);

static sn_status_t dev_usable(const char *fn) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess && n > 0) return SN_OK;
  (void)cudaGetLastError(); /* not sticky: clear it */
  return sn__fail(SN_ERR_UNSUPPORTED, "%s: device_memory needs a CUDA device, and there is none "
                  "(%s)", fn, err != cudaSuccess ? cudaGetErrorName(err) : "no device found");
}

/* SN_OK where the current CUDA device is the communicator's (its ncclComm_t's: the layer's
 * buffers live there), or there is no such communicator; else SN_ERR_INVALID_ARGUMENT. */
static sn_status_t check_device(const char *fn, const sn_syncbn_t *bn) {
  if (bn->comm == NULL || bn->comm->device < 0) return SN_OK;
  int current = -1;
  const cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) return cuda_st(fn, bn, "cudaGetDevice", e);
  if (current != bn->comm->device)
    return sn__fail(SN_ERR_INVALID_ARGUMENT,
                    "%s: %s: the current CUDA device is %d, the communicator's (its "
                    "ncclComm_t's) is %d: one process (or thread) per GPU, with "
                    "cudaSetDevice(%d) current",
                    fn, bn->label, current, bn->comm->device, bn->comm->device);
  return SN_OK;
}

/* Whether the layer's stream is being captured into a CUDA graph (or cannot be asked: taken
 * as captured, the safe side), where the host must not wait. */
static int capturing(const dev_state_t *d) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (d->stream == (cudaStream_t)0) return 0; /* the legacy stream is never captured */
  if (cudaStreamIsCapturing(d->stream, &cs) == cudaSuccess)
    return cs != cudaStreamCaptureStatusNone;
  (void)cudaGetLastError();
  return 1;
}

static sn_status_t dev_create(sn_syncbn_t *bn) {
  const char *fn = "sn_syncbn_create";
  const size_t C = (size_t)bn->C;
  SN_TRY(check_device(fn, bn));
  dev_state_t *d = calloc(1, sizeof *d);
  if (d == NULL) return sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  d->stream = bn->comm != NULL ? (cudaStream_t)bn->comm->stream : (cudaStream_t)0;
  /* one f64 block: red 2C+1 | local 2C | mean C | count 1 | nbt 1 (int64, same size) */
  void *fb = NULL, *db = NULL;
  cudaError_t err = cudaMalloc(&fb, D_FLOATS * C * sizeof(float));
  if (err == cudaSuccess) err = cudaMalloc(&db, (5 * C + 3) * sizeof(double));
  if (err != cudaSuccess) {
    (void)cudaGetLastError(); /* not sticky: leave no error for the next launch check */
    cudaFree(fb);
    free(d);
    return sn__fail(SN_ERR_ALLOC, "%s: %s: cudaMalloc for %zu channels: %s", fn, bn->label, C,
                    cudaGetErrorName(err));
  }
  d->f = fb;
  d->red = db, d->local = d->red + 2 * C + 1, d->mean = d->local + 2 * C;
  d->count = d->mean + C, d->nbt = (int64_t *)(d->count + 1);
  bn->dev = d;
  /* zeros everywhere (grads, stats, count), then the initial state from the host arrays, on a
   * private stream waited for: nothing of the communicator's stream is waited for, and the
   * comm's (non-blocking) stream sees it all done */
  cudaStream_t t = NULL;
  err = cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking);
  sn_status_t st = cuda_st(fn, bn, "cudaStreamCreateWithFlags", err);
  if (st == SN_OK) {
    err = cudaMemsetAsync(fb, 0, D_FLOATS * C * sizeof(float), t);
    if (err == cudaSuccess) err = cudaMemsetAsync(db, 0, (5 * C + 3) * sizeof(double), t);
    st = cuda_st(fn, bn, "cudaMemsetAsync", err);
    if (st == SN_OK) st = upload_on(fn, bn, t);
    (void)cudaStreamSynchronize(t); /* also after a failure: nothing left on it to free under */
    cudaStreamDestroy(t);
  }
  if (st != SN_OK) { /* nothing of the layer's was ever on the communicator's stream */
    cudaFree(fb);
    cudaFree(db);
    free(d);
    bn->dev = NULL;
    return st;
  }
  return SN_OK;
}

/* Polls the layer's stream until it is idle (cudaSuccess), an error, or the communicator's
 * timeout (cudaErrorNotReady; no communicator, or a timeout of 0: waits forever). Aborts
 * nothing, marks nothing broken; not during graph capture (cudaStreamQuery fails there). */
static cudaError_t destroy_wait(const sn_syncbn_t *bn) {
  const cudaStream_t st = dev_of(bn)->stream;
  const double timeout = bn->comm != NULL ? bn->comm->timeout_s : 0.0, t0 = sn__now();
  for (long polls = 1;; polls++) {
    const cudaError_t q = cudaStreamQuery(st);
    if (q != cudaErrorNotReady) return q;
    if (timeout > 0.0 && sn__now() - t0 > timeout) return q;
    sn__sleep_us(polls < 1000 ? 10 : 200);
  }
}

static void dev_destroy(sn_syncbn_t *bn) {
  dev_state_t *d = dev_of(bn);
  if (d == NULL) return;
  /* work still queued may use the buffers: wait for it, under the communicator's timeout but
   * without the communicator's wait, which aborts the NCCL communicator on a failure (destroy
   * returns nothing, and the caller would then ncclCommDestroy an aborted one). A failed
   * or timed-out wait, or a communicator already destroyed (its stream may be too) or broken
   * (aborted work may still write them): the device buffers are abandoned, never freed */
  const int live = bn->comm == NULL || (SN_COMM_LIVE(bn->comm) && !bn->comm->broken);
  if (!live || destroy_wait(bn) != cudaSuccess) {
    free(d);
    bn->dev = NULL;
    return;
  }
  cudaFree(d->f);
  cudaFree(d->red);
  cudaFree(d->ws);
  free(d);
  bn->dev = NULL;
}

static void dev_params(const sn_syncbn_t *bn, sn_syncbn_params_t *p) {
  const int aff = bn->cfg.affine, trk = bn->cfg.track_running_stats;
  p->weight = aff ? arr(bn, D_WEIGHT) : NULL, p->bias = aff ? arr(bn, D_BIAS) : NULL;
  p->grad_weight = aff ? arr(bn, D_GW) : NULL, p->grad_bias = aff ? arr(bn, D_GB) : NULL;
  p->running_mean = trk ? arr(bn, D_RM) : NULL, p->running_var = trk ? arr(bn, D_RV) : NULL;
  p->num_batches_tracked = trk ? dev_of(bn)->nbt : NULL;
  p->num_features = bn->C;
}

/* Waits for the layer's stream: under the communicator's timeout where it has one (which
 * refuses during graph capture: SN_ERR_UNSUPPORTED). A communicator that is not live: its
 * error, nothing waited for; a broken one (its NCCL communicator aborted): a plain
 * cudaStreamSynchronize. */
static sn_status_t dev_wait(const char *fn, sn_syncbn_t *bn) {
  if (bn->comm != NULL && !SN_COMM_LIVE(bn->comm)) return sn__comm_check(fn, bn->comm);
  if (bn->comm != NULL && !bn->comm->broken && bn->comm->ops->wait != NULL) {
    const sn_status_t st = bn->comm->ops->wait(bn->comm);
    return st == SN_OK ? SN_OK : sn__fail_prefix(st, "%s (%s)", fn, bn->label);
  }
  return cuda_st(fn, bn, "cudaStreamSynchronize", cudaStreamSynchronize(dev_of(bn)->stream));
}

static void dev_spans(const sn_syncbn_t *bn, sn__dev_span_t span[3]) {
  const dev_state_t *d = dev_of(bn);
  const int64_t C = bn->C;
  span[0] = (sn__dev_span_t){d->f, (int64_t)D_FLOATS * C * (int64_t)sizeof(float)};
  span[1] = (sn__dev_span_t){d->red, (5 * C + 3) * (int64_t)sizeof(double)};
  span[2] = (sn__dev_span_t){d->ws, d->ws != NULL ? (int64_t)d->ws_bytes : 0};
}

/* Copies bytes between host and device on the layer's stream and waits for it. */
static sn_status_t copy(const char *fn, sn_syncbn_t *bn, void *dst, const void *src,
                        size_t bytes, enum cudaMemcpyKind kind) {
  const cudaStream_t s = dev_of(bn)->stream;
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return cuda_st(fn, bn, "cudaMemcpyAsync", err);
}

static sn_status_t dev_to_host(sn_syncbn_t *bn) {
  const char *fn = "sn_syncbn (state to host)";
  SN_TRY(dev_wait(fn, bn));
  const size_t cb = (size_t)bn->C * sizeof(float);
  if (bn->cfg.affine) {
    SN_TRY(copy(fn, bn, bn->weight, arr(bn, D_WEIGHT), cb, cudaMemcpyDeviceToHost));
    SN_TRY(copy(fn, bn, bn->bias, arr(bn, D_BIAS), cb, cudaMemcpyDeviceToHost));
  }
  if (bn->cfg.track_running_stats) {
    SN_TRY(copy(fn, bn, bn->running_mean, arr(bn, D_RM), cb, cudaMemcpyDeviceToHost));
    SN_TRY(copy(fn, bn, bn->running_var, arr(bn, D_RV), cb, cudaMemcpyDeviceToHost));
    SN_TRY(copy(fn, bn, &bn->num_batches_tracked, dev_of(bn)->nbt, sizeof(int64_t),
                cudaMemcpyDeviceToHost));
  }
  return SN_OK;
}

/* The host mirror's state → device on stream t, the pivot 0 (host and device), then waits for
 * t. The pivot is never seeded from rank-local values (a loaded running mean may differ across
 * ranks): 0 on every rank until the first synchronized mean sets it alike everywhere. */
static sn_status_t upload_on(const char *fn, sn_syncbn_t *bn, cudaStream_t t) {
  const size_t cb = (size_t)bn->C * sizeof(float);
  memset(bn->pivot, 0, cb);
  cudaError_t err = cudaMemsetAsync(arr(bn, D_PIVOT), 0, cb, t);
  if (err == cudaSuccess && bn->cfg.affine) {
    err = cudaMemcpyAsync(arr(bn, D_WEIGHT), bn->weight, cb, cudaMemcpyHostToDevice, t);
    if (err == cudaSuccess)
      err = cudaMemcpyAsync(arr(bn, D_BIAS), bn->bias, cb, cudaMemcpyHostToDevice, t);
  }
  if (err == cudaSuccess && bn->cfg.track_running_stats) {
    err = cudaMemcpyAsync(arr(bn, D_RM), bn->running_mean, cb, cudaMemcpyHostToDevice, t);
    if (err == cudaSuccess)
      err = cudaMemcpyAsync(arr(bn, D_RV), bn->running_var, cb, cudaMemcpyHostToDevice, t);
    if (err == cudaSuccess)
      err = cudaMemcpyAsync(dev_of(bn)->nbt, &bn->num_batches_tracked, sizeof(int64_t),
                            cudaMemcpyHostToDevice, t);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(t); /* only these copies are left on it */
  return cuda_st(fn, bn, "cudaMemcpyAsync (state to device)", err);
}

static sn_status_t dev_from_host(sn_syncbn_t *bn) {
  const char *fn = "sn_syncbn (state to device)";
  SN_TRY(dev_wait(fn, bn)); /* queued steps may still read or write the state */
  return upload_on(fn, bn, dev_of(bn)->stream);
}

/* The workspace for [n, C, s] (n·s > 0; nothing otherwise): grown, never shrunk. Growing waits
 * for the stream (dev_wait) and allocates: not during graph capture (SN_ERR_UNSUPPORTED, nothing
 * enqueued: a warm-up call of the shape first). Called before a call's first collective, so that
 * its failure is told to the other ranks (tell_peers) instead of leaving them waiting. */
static sn_status_t ensure_ws(const char *fn, sn_syncbn_t *bn, int64_t n, int64_t s) {
  dev_state_t *d = dev_of(bn);
  size_t need = 0;
  if (n * s == 0) return SN_OK;
  SN_TRY(sn_cuda_batchnorm_workspace(&need, n, bn->C, s, bn->cfg.layout));
  if (need <= d->ws_bytes) return SN_OK;
  if (capturing(d))
    return sn__fail(SN_ERR_UNSUPPORTED,
                    "%s: %s: growing the workspace (a new, larger shape) cannot run while the "
                    "stream is being captured: warm up the shape first (one eager call)",
                    fn, bn->label);
  SN_TRY(dev_wait(fn, bn));
  void *p = NULL;
  const cudaError_t err = cudaMalloc(&p, need);
  if (err != cudaSuccess) (void)cudaGetLastError(); /* not sticky: a later launch is fine */
  if (err != cudaSuccess)
    return sn__fail(SN_ERR_ALLOC, "%s: %s: cudaMalloc of a %zu-byte workspace: %s", fn,
                    bn->label, need, cudaGetErrorName(err));
  cudaFree(d->ws);
  d->ws = p, d->ws_bytes = need;
  return SN_OK;
}

static double *dev_red(const sn_syncbn_t *bn) { return dev_of(bn)->red; }

/* This rank's own failures before the call's first collective, which the flow tells the other
 * ranks: a CUDA error the program left pending (every later launch check would report it), a
 * current device other than the communicator's (the layer's buffers are on that one), and the
 * workspace. */
static sn_status_t dev_prepare(sn_syncbn_t *bn, const char *fn, int forward, int update,
                               int64_t n, int64_t s) {
  (void)forward, (void)update;
  char where[sizeof bn->label + 64];
  snprintf(where, sizeof where, "%s (%s)", fn, bn->label);
  SN_TRY(sn__cuda_pending(where));
  SN_TRY(check_device(fn, bn));
  return ensure_ws(fn, bn, n, s);
}

static void dev_fill_nan(sn_syncbn_t *bn, int64_t count) {
  /* all ones: a NaN double; enqueued before the all-reduce on the same stream */
  (void)cudaMemsetAsync(dev_of(bn)->red, 0xff, (size_t)count * sizeof(double),
                        dev_of(bn)->stream);
}

static sn_status_t dev_sums(sn_syncbn_t *bn, const char *fn, const void *x, int64_t n, int64_t s,
                            int refined) {
  (void)refined; /* no refinement on the device: always the layer's pivot */
  dev_state_t *d = dev_of(bn);
  const int64_t C = bn->C;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  if (n * s > 0) {
    const sn_status_t st = sn_cuda_batchnorm_stats(d->red, d->red + C, x, arr(bn, D_PIVOT), n, C,
                                                   s, cfg->layout, cfg->dtype, d->ws,
                                                   d->ws_bytes, d->stream);
    if (st != SN_OK) return sn__fail_prefix(st, "%s (%s)", fn, bn->label);
  }
  return sn__syncbn_cuda_count(d->red, C, n * s, d->stream);
}

/* The global count, read back after the all-reduce (a wait for the stream), so that a count of
 * 1 is SN_ERR_INSUFFICIENT_COUNT as on the host; during graph capture the host cannot wait:
 * -1, and the kernels handle counts of 0 and 1 on the device. */
static sn_status_t dev_global_count(sn_syncbn_t *bn, const char *fn, int64_t *count) {
  dev_state_t *d = dev_of(bn);
  if (capturing(d)) {
    *count = -1;
    return SN_OK;
  }
  SN_TRY(dev_wait(fn, bn));
  double c = 0.0;
  SN_TRY(copy(fn, bn, &c, d->red + 2 * bn->C, sizeof c, cudaMemcpyDeviceToHost));
  *count = (int64_t)c;
  return SN_OK;
}

static sn_status_t dev_finalize(sn_syncbn_t *bn, const char *fn, int64_t count, int refined) {
  (void)fn, (void)count, (void)refined; /* the kernel reads the count on the device */
  dev_state_t *d = dev_of(bn);
  return sn__syncbn_cuda_finalize(d->mean, arr(bn, D_VAR), arr(bn, D_RSTD), d->count, d->red,
                                  arr(bn, D_PIVOT), bn->C, bn->cfg.eps, d->stream);
}

static sn_status_t dev_apply(sn_syncbn_t *bn, const char *fn, void *y, const void *x, int64_t n,
                             int64_t s) {
  if (n * s == 0) return SN_OK;
  dev_state_t *d = dev_of(bn);
  const sn_syncbn_config_t *cfg = &bn->cfg;
  const int aff = cfg->affine;
  const sn_status_t st = sn_cuda_batchnorm_apply(y, x, d->mean, arr(bn, D_RSTD),
                                                 aff ? arr(bn, D_WEIGHT) : NULL,
                                                 aff ? arr(bn, D_BIAS) : NULL, n, bn->C, s,
                                                 cfg->layout, cfg->dtype, d->stream);
  return st == SN_OK ? SN_OK : sn__fail_prefix(st, "%s (%s)", fn, bn->label);
}

static sn_status_t dev_update(sn_syncbn_t *bn, const char *fn, int64_t count, int update,
                              int set_pivot) {
  (void)fn;
  dev_state_t *d = dev_of(bn);
  if (count == 0) /* an empty batch the host knows of: finalize did not run; 0.0 is all zeros */
    SN_TRY(cuda_st(fn, bn, "cudaMemsetAsync (count)",
                   cudaMemsetAsync(d->count, 0, sizeof *d->count, d->stream)));
  return sn__syncbn_cuda_update(arr(bn, D_PIVOT), update ? arr(bn, D_RM) : NULL,
                                update ? arr(bn, D_RV) : NULL, update ? d->nbt : NULL, d->mean,
                                arr(bn, D_VAR), d->count, bn->C, bn->cfg.momentum, update,
                                set_pivot, d->stream);
}

static sn_status_t dev_eval(sn_syncbn_t *bn, const char *fn, void *y, const void *x, int64_t n,
                            int64_t s) {
  dev_state_t *d = dev_of(bn);
  const sn_syncbn_config_t *cfg = &bn->cfg;
  const int aff = cfg->affine;
  if (n * s > 0) {
    const sn_status_t st = sn_cuda_batchnorm_infer(
        y, x, arr(bn, D_RM), arr(bn, D_RV), aff ? arr(bn, D_WEIGHT) : NULL,
        aff ? arr(bn, D_BIAS) : NULL, n, bn->C, s, cfg->eps, cfg->layout, cfg->dtype, d->stream);
    if (st != SN_OK) return sn__fail_prefix(st, "%s (%s)", fn, bn->label);
  }
  return sn__syncbn_cuda_eval_stats(d->mean, arr(bn, D_RSTD), arr(bn, D_RM), arr(bn, D_RV),
                                    bn->C, cfg->eps, d->stream);
}

static sn_status_t dev_bwd_sums(sn_syncbn_t *bn, const char *fn, const void *dy, const void *x,
                                int64_t n, int64_t s) {
  dev_state_t *d = dev_of(bn);
  const int64_t C = bn->C;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  const int aff = cfg->affine;
  if (n * s > 0) {
    const sn_status_t st = sn_cuda_batchnorm_bwd_reduce(
        d->local, d->local + C, dy, x, d->mean, arr(bn, D_RSTD), n, C, s, cfg->layout,
        cfg->dtype, d->ws, d->ws_bytes, d->stream);
    if (st != SN_OK) return sn__fail_prefix(st, "%s (%s)", fn, bn->label);
  }
  return sn__syncbn_cuda_bwd_local(aff ? arr(bn, D_GW) : NULL, aff ? arr(bn, D_GB) : NULL, d->red,
                                   d->local, C, n * s, d->stream);
}

static sn_status_t dev_bwd_apply(sn_syncbn_t *bn, const char *fn, void *dx, const void *dy,
                                 const void *x, int64_t n, int64_t s, int batch_stats) {
  dev_state_t *d = dev_of(bn);
  const int64_t C = bn->C;
  const sn_syncbn_config_t *cfg = &bn->cfg;
  const int aff = cfg->affine;
  if (batch_stats) SN_TRY(sn__syncbn_cuda_bwd_scale(d->red, d->count, C, d->stream));
  if (n * s == 0) return SN_OK;
  /* count 2 with the sums already scaled by 2/N (bwd_scale): the kernel's Σ/count is Σ/N */
  const sn_status_t st = sn_cuda_batchnorm_bwd_apply(
      dx, dy, x, d->mean, arr(bn, D_RSTD), aff ? arr(bn, D_WEIGHT) : NULL,
      batch_stats ? d->red : NULL, batch_stats ? d->red + C : NULL, batch_stats ? 2 : 0, n, C, s,
      cfg->layout, cfg->dtype, d->stream);
  return st == SN_OK ? SN_OK : sn__fail_prefix(st, "%s (%s)", fn, bn->label);
}

static sn_status_t dev_zero_grads(sn_syncbn_t *bn, const char *fn) {
  if (!bn->cfg.affine) return SN_OK;
  dev_state_t *d = dev_of(bn);
  const cudaError_t err = cudaMemsetAsync(arr(bn, D_GW), 0, 2 * (size_t)bn->C * sizeof(float),
                                          d->stream); /* D_GW, D_GB are adjacent */
  return cuda_st(fn, bn, "cudaMemsetAsync", err);
}

/* The last forward's statistics to host memory (waits for the stream). */
static sn_status_t dev_batch_stats(sn_syncbn_t *bn, const char *fn, double *mean, double *var) {
  dev_state_t *d = dev_of(bn);
  const size_t C = (size_t)bn->C;
  SN_TRY(dev_wait(fn, bn));
  if (mean != NULL) SN_TRY(copy(fn, bn, mean, d->mean, C * sizeof(double), cudaMemcpyDeviceToHost));
  if (var != NULL) {
    SN_TRY(copy(fn, bn, bn->var, arr(bn, D_VAR), C * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t c = 0; c < C; c++) var[c] = bn->var[c];
  }
  return SN_OK;
}

static sn_status_t dev_saved_count(sn_syncbn_t *bn, const char *fn, int64_t *count) {
  SN_TRY(dev_wait(fn, bn));
  double c = 0.0;
  SN_TRY(copy(fn, bn, &c, dev_of(bn)->count, sizeof c, cudaMemcpyDeviceToHost));
  *count = (int64_t)c;
  return SN_OK;
}

static const sn_syncbn_mem_t cuda_mem = {
    .name = "cuda",
    .pivot_slots = 0,
    .check_finite = 0,
    .usable = dev_usable,
    .create = dev_create,
    .destroy = dev_destroy,
    .params = dev_params,
    .spans = dev_spans,
    .to_host = dev_to_host,
    .from_host = dev_from_host,
    .reduce_buf = dev_red,
    .prepare = dev_prepare,
    .sums = dev_sums,
    .reset_pivot = NULL,
    .global_count = dev_global_count,
    .refine = NULL,
    .finalize = dev_finalize,
    .apply = dev_apply,
    .update = dev_update,
    .local_forward = NULL,
    .eval = dev_eval,
    .bwd_sums = dev_bwd_sums,
    .bwd_apply = dev_bwd_apply,
    .local_backward = NULL,
    .zero_grads = dev_zero_grads,
    .batch_stats = dev_batch_stats,
    .saved_count = dev_saved_count,
    .fill_nan = dev_fill_nan,
};

/* Loading libsyncnorm_cuda makes device_memory layers available (a static link keeps this
 * object through the -u option its CMake target and pkg-config file add). */
__attribute__((constructor)) void sn__cuda_syncbn_register(void) {
  sn__syncbn_register_device(&cuda_mem);
}
