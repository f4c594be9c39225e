/*
 * syncbn_internal.h — the SyncBatchNorm layer object, shared by syncbn.c (forward/backward) and
 * syncbn_state.c (checkpoint state). Not installed.
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
  int64_t count;   /* global values per channel */
} sn_syncbn_saved_t;

struct sn_syncbn {
  sn_syncbn_config_t cfg;
  sn_comm_t *comm;     /* NULL: local BatchNorm */
  int64_t C, id;
  char label[96];      /* "layer 'bn1' (id 0)" for messages */

  /* parameters and state: [C] each (NULL when the config has no such tensor) */
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
  void *dev;                    /* cfg.device_memory: the device state (syncbn_device.c);
                                   the host arrays above are then its mirror */
  char tensor_names[5][256];    /* names handed out by sn_syncbn_state_tensors */
};

/* A device layer's own device memory (check_call's overlap check): pointer and bytes. */
typedef struct {
  const void *p;
  int64_t bytes;
} sn__dev_span_t;

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
SN_HIDDEN void sn__syncbn_test_force_sync(sn_syncbn_t *bn, int on);
/* syncbn.c's tell_peers: a call that failed this rank's own checks (st) where the others would
 * be in its first all-reduce (would_sync) tells them; returns st (or telling's failure). */
SN_HIDDEN sn_status_t sn__syncbn_tell_peers(sn_syncbn_t *bn, const char *fn, int op,
                                            sn_status_t st, int would_sync);
/* check_consistency (syncbn.c) of a call whose own checks passed: one max all-reduce of the
 * call's signature in host memory (the device path's routes through the backend's staging). */
SN_HIDDEN sn_status_t sn__syncbn_consistency(sn_syncbn_t *bn, const char *fn, int op);

/* SN_OK for a live layer, else SN_ERR_NULL_POINTER / SN_ERR_INVALID_HANDLE. */
SN_HIDDEN sn_status_t sn__syncbn_check(const char *fn, const sn_syncbn_t *bn);

#endif /* SN_SYNCBN_INTERNAL_H */
