/*
 * model.h — syncnorm-train's CNN for 28×28 grey images, 10 classes:
 *
 *   conv1 3×3 (1→32, pad 1) → bn1 → ReLU → maxpool 2 → conv2 3×3 (32→64, pad 1) → bn2 → ReLU →
 *   maxpool 2 → fc (64·7·7 → 10) → softmax cross-entropy
 *
 * with parameters named and shaped as the equivalent PyTorch module's state_dict (conv1.weight
 * [32,1,3,3], bn1.running_mean [32], fc.weight [10,3136], ...). bn1 and bn2 are the library's
 * sn_syncbn_t: synchronized over a communicator, or local BatchNorm (comm NULL).
 *
 * Every gradient lives in one flat buffer (model->grads, in parameter order, plus
 * CNN_GRAD_EXTRA trailing floats the caller may use, e.g. for the loss), so that data-parallel
 * training averages all of them with one all-reduce. Buffers are allocated once, for batches of
 * up to batch_cap images: a training step allocates nothing.
 *
 * Functions return 0, or −1 with a message in err[errlen] (for a failing sn_* call:
 * "<call>: <status name>: <sn_last_error()>").
 */
#ifndef SN_EXAMPLES_MODEL_H
#define SN_EXAMPLES_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "cnn.h"
#include "syncnorm_dist.h"

#define CNN_IMG 28                 /* input rows = cols */
#define CNN_PIXELS (CNN_IMG * CNN_IMG)
#define CNN_CLASSES 10
#define CNN_FEATURES (64 * 7 * 7)  /* fc input */
#define CNN_GRAD_EXTRA 1           /* floats after the gradients in model->grads */

/* Parameters in the order of model->param[] (and of the flat gradient buffer). */
enum {
  CNN_CONV1_W, CNN_CONV1_B, CNN_BN1_W, CNN_BN1_B, CNN_CONV2_W, CNN_CONV2_B, CNN_BN2_W,
  CNN_BN2_B, CNN_FC_W, CNN_FC_B, CNN_NPARAMS
};

typedef struct {
  const char *name;     /* state_dict key, e.g. "conv1.weight" */
  float *data;          /* the parameter: model->weights, or the BatchNorm layer's memory */
  float *grad;          /* inside model->grads */
  float *momentum;      /* SGD momentum buffer, inside model->momentum */
  int64_t numel;
  int ndim;
  int64_t shape[4];
  int decay;            /* weight decay applies: conv and linear weights only */
} cnn_param_t;

typedef struct {
  int64_t batch_cap;
  cnn_conv_t conv1, conv2;
  sn_syncbn_t *bn1, *bn2;
  sn_syncbn_params_t bn1p, bn2p; /* pointers into the layers' state */
  cnn_param_t param[CNN_NPARAMS];
  float *weights;       /* conv/fc parameters, flat */
  float *grads;         /* [grad_count + CNN_GRAD_EXTRA]: every gradient, flat, parameter order */
  int64_t grad_count;
  float *momentum;      /* [grad_count] */
  char momentum_name[CNN_NPARAMS][64]; /* "optimizer.momentum_buffer.<param name>" */
  /* Activations, channel-major [C, N, H, W] (see cnn.h), sized for batch_cap images. */
  float *x;             /* [1, N, 28, 28] input, = [N, 784] */
  float *col1, *a1, *h1, *p1;  /* im2col [9, N·784]; conv1 out, bn1 out [32, N, 28, 28]; pooled */
  float *col2, *a2, *h2, *p2;  /* [288, N·196]; [64, N, 14, 14] twice; pooled [64, N, 7, 7] */
  float *dh1, *dh2;            /* gradients of bn1/bn2 out, then (in place) of their inputs */
  float *feat;          /* [N, 3136]: p2 in PyTorch's flatten order */
  float *logits, *dlogits;     /* [N, 10] */
  float *dfeat, *dp2, *dp1;    /* gradients of feat, p2, p1 */
} cnn_model_t;

/* Bytes of the activation buffers cnn_model_create allocates (and zeroes) for batch_cap images:
 * about 0.8 MB per image; the parameters (under 1 MB in all) aside. batch_cap <= 2^30. */
int64_t cnn_model_bytes(int64_t batch_cap);

/* Builds the model: PyTorch's default initialization (kaiming_uniform(a=√5): weights and biases
 * uniform in ±1/√fan_in) drawn from `seed` — the same parameters on every rank —, BatchNorm
 * weight 1, bias 0, running stats 0/1. bn_comm: communicator of both SyncBatchNorm layers, or
 * NULL for local BatchNorm. */
int cnn_model_create(cnn_model_t **model, int64_t batch_cap, sn_comm_t *bn_comm, uint64_t seed,
                     char *err, size_t errlen);

/* Frees the model and its BatchNorm layers (not the communicator); NULL is a no-op. */
void cnn_model_destroy(cnn_model_t *m);

/* Forward of n ≤ batch_cap images in m->x into m->logits. training != 0: batch statistics (a
 * collective with a synchronized comm: every rank calls it, in the same order) and running stats
 * updated; 0: running statistics, local. */
int cnn_model_forward(cnn_model_t *m, int64_t n, int training, char *err, size_t errlen);

/* Backward of the last (training) forward from m->dlogits: writes (=) every gradient into
 * m->grads (BatchNorm's as this rank's local sums, as PyTorch). Collective with a synchronized
 * comm. */
int cnn_model_backward(cnn_model_t *m, int64_t n, char *err, size_t errlen);

/* One SGD step on every parameter with the gradients in m->grads: momentum, lr, and weight decay
 * wd on the parameters marked decay. */
void cnn_model_sgd(cnn_model_t *m, float lr, float momentum, float wd);

/* Tensors of the model's state_dict (16: conv, bn with running stats and num_batches_tracked,
 * fc) into out[0..), and with with_momentum also "optimizer.momentum_buffer.<name>" for every
 * parameter (10 more). out must hold CNN_MAX_TENSORS. Data points into the model. */
#define CNN_MAX_TENSORS 32
int cnn_model_tensors(cnn_model_t *m, sn_tensor_t *out, int *count, int with_momentum,
                      char *err, size_t errlen);

/* Loads parameters, BatchNorm state and (with_momentum) momentum buffers from a file written
 * with cnn_model_tensors' names; checks dtypes and shapes. On error the model may be partly
 * loaded (the caller stops). */
int cnn_model_load(cnn_model_t *m, const sn_safetensors_t *file, int with_momentum, char *err,
                   size_t errlen);

/* Bytes of the state that must be identical on every rank (parameters, running stats,
 * num_batches_tracked, momentum), and a copy of it into buf (cnn_model_state_bytes(m) bytes).
 * running_only: just the BatchNorm running stats and num_batches_tracked. */
int64_t cnn_model_state_bytes(const cnn_model_t *m, int running_only);
void cnn_model_pack_state(const cnn_model_t *m, void *buf, int running_only);

#endif /* SN_EXAMPLES_MODEL_H */
