/*
 * syncbn_internal.h — the SyncBatchNorm layer object and its table of per-memory kernels.
 * syncbn.c holds the one control flow (argument and consistency checks, the collectives, the
 * saved forward) and calls the layer's table for every step that touches its tensors:
 * syncbn_host.c fills it for host memory; libsyncnorm_cuda (syncbn_device.c) registers one for
 * CUDA device memory (sn__syncbn_register_device). syncbn_check.c is the consistency check,
 * syncbn_state.c the checkpoint state. Not installed.
 */
#ifndef SN_SYNCBN_INTERNAL_H
#define SN_SYNCBN_INTERNAL_H

#include "comm_internal.h"

/* What the last forward saved for backward. */
typedef struct {
  int valid;       /* a forward succeeded since creation or the last load */
  int batch_stats; /* 1: normalized with batch statistics; 0: running stats (eval) */
  int synced;      /* 1: the batch statistics were all-reduced over comm */
  int64_t n, s;    /* the forward's shape on this rank */
  int64_t count;   /* global values per channel; -1: known on the device only */
} sn_syncbn_saved_t;

typedef struct sn_syncbn_mem sn_syncbn_mem_t;

struct sn_syncbn {
  sn_syncbn_config_t cfg;
  const sn_syncbn_mem_t *mem; /* the kernels for the layer's memory */
  sn_comm_t *comm;     /* NULL: local BatchNorm */
  int64_t C, id;
  char label[96];      /* "layer 'bn1' (id 0)" for messages */

  /* parameters and state: [C] each (NULL when the config has no such tensor); a device layer's
   * are a host mirror, filled by mem->to_host */
  float *weight, *bias, *grad_weight, *grad_bias, *running_mean, *running_var;
  int64_t num_batches_tracked;

  /* pivot of the shifted sums: identical on every rank (the last synchronized batch mean) */
  float *pivot;
  double *red;   /* [2C+5] all-reduce buffer: Σ(x−p) | Σ(x−p)² | count | 4 pivot slots, or
                    Σdy | Σdy·x̂ */
  double *local; /* [2C] this rank's backward sums (the parameter gradients) */

  /* what the last forward saved for backward */
  double *mean;  /* [C] */
  float *var;    /* [C] biased */
  float *rstd;   /* [C] */
  float *tmp;    /* [C] scratch (refined pivot) */
  sn_syncbn_saved_t saved;
  float *fblock;   /* the one allocation behind every f32 array above */

  int64_t collectives;          /* all-reduces issued by this layer */
  int force_sync;               /* test hook: behave as on more than one rank (never alone) */
  void *dev;                    /* the device table's own state (NULL on host memory) */
  char tensor_names[5][256];    /* names handed out by sn_syncbn_state_tensors */
};

/* A layer's own memory that its tensors must not overlap (check_call): pointer and bytes. */
typedef struct {
  const void *p;
  int64_t bytes;
} sn__dev_span_t;

/* The kernels of a layer's steps on one kind of memory. `fn` names the public call for messages;
 * every function returns SN_OK or an error with its message set. Forward (training):
 * prepare → sums (→ all-reduce) → global_count → [refine → sums …] → finalize → apply → update;
 * with nothing to all-reduce, local_forward (where not NULL) replaces sums … apply. Eval: eval.
 * Backward: prepare → bwd_sums (→ all-reduce) → bwd_apply, or local_backward; an empty global
 * batch: zero_grads. */
struct sn_syncbn_mem {
  const char *name;  /* "host", "cuda" */
  int pivot_slots;   /* values after the count in a forward's all-reduce (pivot hashes) */
  int check_finite;  /* 1: cfg.check_finite can be honoured (the sums are read on the host) */
  /* SN_OK where this memory can be used now (a CUDA device is present), else naming fn */
  sn_status_t (*usable)(const char *fn);
  /* after the host arrays are set up: the memory's own state (device buffers, initial upload);
   * destroy frees it (never fails) */
  sn_status_t (*create)(sn_syncbn_t *bn);
  void (*destroy)(sn_syncbn_t *bn);
  /* pointers into the state as sn_syncbn_params hands them out */
  void (*params)(const sn_syncbn_t *bn, sn_syncbn_params_t *p);
  /* the memory's own buffers, for check_call's overlap check ({NULL, 0}: none) */
  void (*spans)(const sn_syncbn_t *bn, sn__dev_span_t span[3]);
  /* state → host arrays (weight, bias, running statistics, num_batches_tracked): the
   * consistency check's hash and the checkpoint functions read those; and back (a load) */
  sn_status_t (*to_host)(sn_syncbn_t *bn);
  sn_status_t (*from_host)(sn_syncbn_t *bn);
  /* the all-reduce buffer: [2C + 1 + pivot_slots] f64 in the communicator's memory */
  double *(*reduce_buf)(const sn_syncbn_t *bn);
  /* this rank's own failures of a call, found before its first collective (so that they can
   * be told to the other ranks): the state (a negative num_batches_tracked where `update`),
   * scratch for [n, C, s]; forward != 0 for a forward */
  sn_status_t (*prepare)(sn_syncbn_t *bn, const char *fn, int forward, int update, int64_t n,
                         int64_t s);
  /* local Σ(x−p), Σ(x−p)² around the layer's pivot (refined: the refined one), the count n·s
   * and the pivot slots into reduce_buf */
  sn_status_t (*sums)(sn_syncbn_t *bn, const char *fn, const void *x, int64_t n, int64_t s,
                      int refined);
  /* sets the pivot to 0 (the ranks summed around different pivots; pivot_slots > 0 only) */
  void (*reset_pivot)(sn_syncbn_t *bn);
  /* the all-reduced count; -1 where the host cannot read it now (during CUDA graph capture) */
  sn_status_t (*global_count)(sn_syncbn_t *bn, const char *fn, int64_t *count);
  /* where the sums lost too much to cancellation (sn__bn_refine_pivots): the refined pivot,
   * returns 1; NULL where the memory does not refine */
  int (*refine)(sn_syncbn_t *bn, int64_t count, int round, int refined);
  /* mean, var (biased), rstd from the summed sums over count values */
  sn_status_t (*finalize)(sn_syncbn_t *bn, const char *fn, int64_t count, int refined);
  /* y = (x − mean)·rstd·γ + β */
  sn_status_t (*apply)(sn_syncbn_t *bn, const char *fn, void *y, const void *x, int64_t n,
                       int64_t s);
  /* with `update`: num_batches_tracked += 1 and the running statistics (count 0: counted only);
   * with set_pivot: the next pivot is the batch mean */
  sn_status_t (*update)(sn_syncbn_t *bn, const char *fn, int64_t count, int update,
                        int set_pivot);
  /* nothing to all-reduce, count > 1: the batch statistics and y in one call (NULL: none) */
  sn_status_t (*local_forward)(sn_syncbn_t *bn, const char *fn, void *y, const void *x,
                               int64_t n, int64_t s);
  /* eval forward from the running statistics, and the frozen backward's mean and rstd */
  sn_status_t (*eval)(sn_syncbn_t *bn, const char *fn, void *y, const void *x, int64_t n,
                      int64_t s);
  /* local Σdy, Σdy·x̂ into reduce_buf [2C], kept for this rank's gradients */
  sn_status_t (*bwd_sums)(sn_syncbn_t *bn, const char *fn, const void *dy, const void *x,
                          int64_t n, int64_t s);
  /* dx from reduce_buf (batch_stats; global count saved.count) or the frozen statistics, and
   * grad_weight, grad_bias (=) from this rank's sums */
  sn_status_t (*bwd_apply)(sn_syncbn_t *bn, const char *fn, void *dx, const void *dy,
                           const void *x, int64_t n, int64_t s, int batch_stats);
  /* nothing to all-reduce: bwd_sums and bwd_apply in one call (NULL: none) */
  sn_status_t (*local_backward)(sn_syncbn_t *bn, const char *fn, void *dx, const void *dy,
                                const void *x, int64_t n, int64_t s);
  /* grad_weight = grad_bias = 0 (an empty global batch) */
  sn_status_t (*zero_grads)(sn_syncbn_t *bn, const char *fn);
  /* the last forward's mean [C] and biased variance [C] into host arrays (NULL: not wanted) */
  sn_status_t (*batch_stats)(sn_syncbn_t *bn, const char *fn, double *mean, double *var);
  /* the last forward's global count, where the host did not read it (saved.count < 0) */
  sn_status_t (*saved_count)(sn_syncbn_t *bn, const char *fn, int64_t *count);
  /* reduce_buf [count] = NaN, for an all-reduce made after this rank's sums failed, where the
   * memory's collectives have no timeout to end the others' wait (NULL: not needed) */
  void (*fill_nan)(sn_syncbn_t *bn, int64_t count);
};

/* The host-memory kernels (syncbn_host.c). */
SN_HIDDEN extern const sn_syncbn_mem_t sn__syncbn_host_mem;
/* Registers the kernels for cfg.device_memory = 1 (libsyncnorm_cuda does, when it is loaded);
 * until then such a layer is SN_ERR_UNSUPPORTED. */
SN_INTERNAL void sn__syncbn_register_device(const sn_syncbn_mem_t *mem);

/* A live layer (sn__handle_live). */
#define SN_SYNCBN_LIVE(b) ((b) != NULL && sn__handle_live((b), SN_HANDLE_SYNCBN))

/* The operations of a layer's calls (the consistency check's signature). */
enum { OP_FORWARD = 1, OP_BACKWARD = 2 };

/* No other rank to agree with: no communicator, or one of a single rank (and no test hook). */
SN_HIDDEN int sn__syncbn_alone(const sn_syncbn_t *bn);
/* Test hook (tests/cuda/test_cuda_syncbn.c; not API): on (1) a layer with a communicator takes
 * the synchronized path even on one rank (no `alone` shortcut), and the host all-reduces of its
 * communicator (comm.c) are made on one rank too, so one GPU runs the multi-rank code (a one-rank
 * all-reduce is the identity). Sets a flag of the communicator too (all its layers' host
 * all-reduces; turning it off for one layer turns that flag off for all). No effect on a layer
 * without a communicator. */
SN_INTERNAL void sn__syncbn_test_force_sync(sn_syncbn_t *bn, int on);
/* check_consistency (syncbn_check.c): one max all-reduce of the call's signature (checks: this
 * rank's own checks' status, SN_OK where they passed) in host memory; the running statistics'
 * hash is read from the host arrays (mem->to_host first). layout_matters 0: this rank's batch
 * is laid out alike in NCHW and NHWC (empty, or one spatial position), and its layout is not
 * compared with the others'. */
SN_HIDDEN sn_status_t sn__syncbn_consistency(sn_syncbn_t *bn, const char *fn, int op,
                                             sn_status_t checks, int layout_matters);
/* The pivot slots of a forward's all-reduce, and whether their sums over `ranks` ranks say
 * every rank summed around the same pivot (syncbn_check.c). */
enum { SN_PIVOT_SLOTS = 4 };
SN_HIDDEN void sn__syncbn_pivot_slots(double slot[SN_PIVOT_SLOTS], const float *pivot,
                                      int64_t C);
SN_HIDDEN int sn__syncbn_pivots_agree(const double slot[SN_PIVOT_SLOTS], int ranks);

/* SN_OK for a live layer, else SN_ERR_NULL_POINTER / SN_ERR_INVALID_HANDLE. */
SN_HIDDEN sn_status_t sn__syncbn_check(const char *fn, const sn_syncbn_t *bn);

#endif /* SN_SYNCBN_INTERNAL_H */
