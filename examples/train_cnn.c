/*
 * train_cnn.c — syncnorm-train: data-parallel training of a small CNN on Fashion-MNIST with the
 * library's SyncBatchNorm over MPI (run it under mpirun; see --help and scripts/run.sh).
 *
 * Data parallelism, step by step (every rank runs the same code):
 *  - every rank builds the same model from --seed and reads the same data;
 *  - epoch e uses one permutation of the training set drawn from (seed, e), the same on every
 *    rank; global batch i is perm[i·G .. (i+1)·G) with G = P·batch, and rank r takes the slice
 *    [r·batch, (r+1)·batch) of it. The last incomplete global batch of an epoch is dropped, so
 *    every rank has `batch` images in every step (SyncBatchNorm's statistics then weigh every
 *    image alike and gradient averaging needs no weights);
 *  - each rank's loss is the mean over its slice; SyncBatchNorm makes each rank's backward the
 *    gradient of Σ_ranks loss_r, so after ONE sn_comm_allreduce_sum over the flat gradient
 *    buffer (all conv/linear/BatchNorm parameter gradients, plus the loss) dividing by P gives
 *    the gradient of the mean loss over the global batch — what one process computes on the
 *    whole global batch (tests/train checks 4×8 against 1×32);
 *  - SGD with momentum 0.9, weight decay on conv/linear weights only, learning rate with cosine
 *    decay from --lr to 0 over epochs × steps_per_epoch steps. The all-reduced gradients are
 *    bitwise identical on every rank, so the parameters stay identical; the program checks it.
 * With --no-sync-bn each rank's BatchNorm uses its own batch statistics and keeps its own running
 * statistics; as PyTorch DDP (broadcast_buffers) evaluation and checkpoints use rank 0's, which
 * every rank adopts at the end of each epoch.
 *
 * Exit status: 0 success; 1 a library or MPI call failed (MPI_Abort); 2 bad usage, unreadable
 * or malformed data, unusable checkpoint, output directory or dump path; 3 the ranks'
 * parameters or running statistics differ at the end (a bug).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idx.h"
#include "metrics.h"
#include "model.h"
#include "options.h"
#include "syncnorm_mpi.h"

#define EXIT_USAGE 2
#define EXIT_DIVERGED 3
#define PROGRESS_EVERY_S 4.0 /* progress lines at least every 5 s: 4 s + one step */
#define SGD_MOMENTUM 0.9f

typedef struct {
  options_t o;
  int rank, size, threads, omp_threads, local_ranks;
  long cpus;
  sn_comm_t *comm;
  idx_dataset_t train, test;
  int64_t train_n, test_n;
  float lut[256];        /* pixel byte → standardized value */
  cnn_model_t *model;
  int64_t *perm, perm_epoch;
  uint8_t *labels;       /* [max(batch, eval_chunk)] */
  unsigned char *state;  /* scratch for the identical-state checks */
  metrics_t metrics;
  int64_t steps_per_epoch, total_steps, start_step, end_step;
  int64_t eval_chunk; /* images per evaluation forward: --eval-batch, at most a rank's shard */
  double t0, last_eval_s, last_accuracy; /* last_accuracy < 0: not evaluated */
} trainer_t;

static int g_rank = 0;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A library, MPI or internal failure: report it and abort every rank (exit status 1). */
static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "syncnorm-train: rank %d: error: ", g_rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

#define CHECK_SN(call)                                                                   \
  do {                                                                                   \
    sn_status_t st_ = (call);                                                            \
    if (st_ != SN_OK) die("%s: %s: %s", #call, sn_status_string(st_), sn_last_error()); \
  } while (0)

static void trainer_free(trainer_t *t) {
  cnn_model_destroy(t->model);
  t->model = NULL;
  sn_comm_destroy(t->comm); /* collective (MPI_Comm_free): every rank gets here */
  t->comm = NULL;
  idx_dataset_free(&t->train);
  idx_dataset_free(&t->test);
  free(t->perm);
  free(t->labels);
  free(t->state);
  t->perm = NULL, t->labels = NULL, t->state = NULL;
  metrics_close(&t->metrics);
}

/* A user-facing error (exit status 2) that any subset of ranks may have hit: the lowest failing
 * rank prints its message, every rank frees, finalizes and exits 2. Collective. */
static void exit_if_any_failed(trainer_t *t, int failed, const char *msg) {
  int mine = failed ? t->rank : t->size, first = t->size;
  if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
    die("MPI_Allreduce failed");
  if (first == t->size) return;
  if (t->rank == first) fprintf(stderr, "syncnorm-train: error: %s\n", msg);
  trainer_free(t);
  MPI_Finalize();
  exit(EXIT_USAGE);
}

/* Threads per rank: --threads, else the node's CPUs / ranks on the node (at least 1). */
static void setup_threads(trainer_t *t) {
  MPI_Comm node;
  int local = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, t->rank, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 1) cpus = 1;
  t->cpus = cpus, t->local_ranks = local;
  t->threads = t->o.threads > 0 ? t->o.threads : (int)(cpus / local > 0 ? cpus / local : 1);
  /* The GEMMs (most of the time) run on OpenBLAS's threads. OpenMP's worker threads (the
   * library's BatchNorm, im2col, pooling) spin after each parallel region by default and then
   * steal the cores OpenBLAS computes on (measured 5× slower steps with 2 threads on 2 busy
   * cores), so OpenMP gets the threads only when told to sleep instead: OMP_WAIT_POLICY=passive
   * (libgomp reads it at start-up, before main). */
  const char *policy = getenv("OMP_WAIT_POLICY");
  t->omp_threads = policy && (policy[0] == 'p' || policy[0] == 'P') ? t->threads : 1;
  openblas_set_num_threads(t->threads);
  omp_set_num_threads(t->omp_threads);
  cpu_set_t set;
  if (t->rank == 0 && sched_getaffinity(0, sizeof set, &set) == 0 &&
      CPU_COUNT(&set) < t->threads)
    fprintf(stderr,
            "syncnorm-train: warning: %d threads per rank but rank 0 may only run on %d CPU(s) "
            "(mpirun binds ranks to cores: add --bind-to none)\n",
            t->threads, CPU_COUNT(&set));
}

/* Open MPI's mpi_yield_when_idle (1: ranks waiting in a collective yield the CPU, which ranks
 * sharing cores need; Open MPI turns it on when it sees oversubscription), read through the MPI
 * tool interface; −1 when it cannot be read (another MPI). */
static int mpi_yield_when_idle(void) {
  int provided = 0, index = 0, count = 0, value = -1;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return -1;
  MPI_T_cvar_handle h;
  MPI_Datatype type;
  int size = 0;
  if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS &&
      MPI_T_cvar_get_info(index, NULL, NULL, NULL, &type, NULL, NULL, NULL, NULL, NULL) ==
          MPI_SUCCESS &&
      MPI_Type_size(type, &size) == MPI_SUCCESS && (size == 1 || size == 4) &&
      MPI_T_cvar_handle_alloc(index, NULL, &h, &count) == MPI_SUCCESS) {
    unsigned char buf[16] = {0};
    if (count == 1 && MPI_T_cvar_read(h, buf) == MPI_SUCCESS) {
      int v = buf[0];
      if (size == 4) memcpy(&v, buf, sizeof v);
      value = v != 0;
    }
    MPI_T_cvar_handle_free(&h);
  }
  MPI_T_finalize();
  return value;
}

/* Reads both splits on every rank (fast: ~0.5 s) and the standardization table. */
static void load_data(trainer_t *t) {
  char err[8192] = "";
  int failed = idx_dataset_read(&t->train, t->o.data, "train", CNN_IMG, CNN_IMG, CNN_CLASSES, err,
                                sizeof err) != 0;
  if (!failed)
    failed = idx_dataset_read(&t->test, t->o.data, "t10k", CNN_IMG, CNN_IMG, CNN_CLASSES, err,
                              sizeof err) != 0;
  exit_if_any_failed(t, failed, err);
  t->train_n = t->o.train_subset && t->o.train_subset < t->train.count ? t->o.train_subset
                                                                        : t->train.count;
  t->test_n = t->o.test_subset && t->o.test_subset < t->test.count ? t->o.test_subset
                                                                    : t->test.count;
  /* Mean and std of the whole training set's pixels (scaled to [0, 1]), from a histogram:
   * exact, the same on every rank. */
  double hist[256] = {0}, n = 0, mean = 0, var = 0;
  const int64_t pixels = t->train.count * CNN_PIXELS;
  int64_t counts[256] = {0};
  for (int64_t i = 0; i < pixels; i++) counts[t->train.images.data[i]]++;
  for (int v = 0; v < 256; v++) hist[v] = (double)counts[v], n += hist[v];
  for (int v = 0; v < 256; v++) mean += hist[v] * (v / 255.0);
  mean /= n;
  for (int v = 0; v < 256; v++) var += hist[v] * (v / 255.0 - mean) * (v / 255.0 - mean);
  const double std = sqrt(var / n);
  for (int v = 0; v < 256; v++) t->lut[v] = (float)((v / 255.0 - mean) / (std > 0 ? std : 1));
  if (t->rank == 0)
    printf("data: %s: %lld training images (of %lld), %lld test images; standardized with "
           "mean %.4f, std %.4f\n",
           t->o.data, (long long)t->train_n, (long long)t->train.count, (long long)t->test_n,
           mean, std);
}

/* m->x and t->labels from images idx[0..n) of a dataset. */
static void gather(trainer_t *t, const idx_dataset_t *ds, const int64_t *idx, int64_t first,
                   int64_t n) {
  float *x = t->model->x;
  for (int64_t j = 0; j < n; j++) {
    const int64_t i = idx ? idx[j] : first + j;
    const uint8_t *img = ds->images.data + i * CNN_PIXELS;
    for (int64_t k = 0; k < CNN_PIXELS; k++) x[j * CNN_PIXELS + k] = t->lut[img[k]];
    t->labels[j] = ds->labels.data[i];
  }
}

static double lr_at(const trainer_t *t, int64_t step) {
  return 0.5 * t->o.lr * (1.0 + cos(M_PI * (double)step / (double)t->total_steps));
}

/* Evaluates the test set in eval mode (running statistics); each rank takes a contiguous shard
 * and the correct counts and loss sums are summed over ranks. */
static void evaluate(trainer_t *t, double *accuracy, double *loss) {
  char err[1024];
  const int64_t lo = t->test_n * t->rank / t->size, hi = t->test_n * (t->rank + 1) / t->size;
  double acc[2] = {0, 0}; /* correct, Σ loss */
  for (int64_t b = lo; b < hi; b += t->eval_chunk) {
    const int64_t n = hi - b < t->eval_chunk ? hi - b : t->eval_chunk;
    gather(t, &t->test, NULL, b, n);
    if (cnn_model_forward(t->model, n, 0, err, sizeof err) != 0) die("%s", err);
    int64_t correct = 0;
    acc[1] += cnn_softmax_xent(NULL, &correct, t->model->logits, t->labels, n, CNN_CLASSES, 1.0);
    acc[0] += (double)correct;
  }
  CHECK_SN(sn_comm_allreduce_sum(t->comm, acc, 2, SN_DTYPE_F64));
  *accuracy = 100.0 * acc[0] / (double)t->test_n;
  *loss = acc[1] / (double)t->test_n;
}

/* Whether the running statistics (or the whole state) are bitwise identical on all ranks. */
static int state_identical(trainer_t *t, int running_only) {
  const int64_t bytes = cnn_model_state_bytes(t->model, running_only);
  cnn_model_pack_state(t->model, t->state, running_only);
  int same = 0;
  CHECK_SN(sn_comm_all_identical(t->comm, &same, t->state, bytes));
  return same;
}

/* --no-sync-bn: every rank takes rank 0's running statistics (a broadcast written as a sum
 * all-reduce where the other ranks contribute zeros: x + 0 + … + 0 == x exactly). */
static void adopt_rank0_running_stats(trainer_t *t) {
  sn_syncbn_params_t *bns[2] = {&t->model->bn1p, &t->model->bn2p};
  for (int i = 0; i < 2; i++) {
    const int64_t c = bns[i]->num_features;
    float *buf = (float *)t->state;
    memcpy(buf, bns[i]->running_mean, (size_t)c * sizeof *buf);
    memcpy(buf + c, bns[i]->running_var, (size_t)c * sizeof *buf);
    if (t->rank != 0) memset(buf, 0, 2 * (size_t)c * sizeof *buf);
    CHECK_SN(sn_comm_allreduce_sum(t->comm, buf, 2 * c, SN_DTYPE_F32));
    memcpy(bns[i]->running_mean, buf, (size_t)c * sizeof *buf);
    memcpy(bns[i]->running_var, buf + c, (size_t)c * sizeof *buf);
  }
}

/* Trainer state saved with the model so --resume continues the same run. */
enum { TS_STEP, TS_EPOCHS, TS_GLOBAL_BATCH, TS_WORLD, TS_SEED, TS_TRAIN_N, TS_SYNC, TS_COUNT };
static const char *const ts_names[TS_COUNT] = {
    "trainer.step", "trainer.epochs", "trainer.global_batch", "trainer.world_size",
    "trainer.seed", "trainer.train_examples", "trainer.sync_bn"};

/* model.safetensors (state_dict only) and checkpoint.safetensors (+ optimizer + trainer), or
 * with `path` one checkpoint-style file there. Rank 0 (or the caller's rank) only. */
static void save(trainer_t *t, int64_t step, const char *path) {
  sn_tensor_t ts[CNN_MAX_TENSORS + TS_COUNT + 1];
  int n = 0;
  char err[1024], file[4200];
  if (!path) {
    if (cnn_model_tensors(t->model, ts, &n, 0, err, sizeof err) != 0) die("%s", err);
    snprintf(file, sizeof file, "%s/model.safetensors", t->o.out);
    CHECK_SN(sn_safetensors_save(file, ts, n));
  }
  if (cnn_model_tensors(t->model, ts, &n, 1, err, sizeof err) != 0) die("%s", err);
  int64_t v[TS_COUNT] = {step, t->o.epochs, t->o.batch * t->size, t->size, (int64_t)t->o.seed,
                         t->train_n, t->o.sync_bn};
  for (int i = 0; i < TS_COUNT; i++)
    ts[n++] = (sn_tensor_t){.name = ts_names[i], .is_i64 = 1, .ndim = 0, .data = &v[i]};
  double lr = t->o.lr;
  ts[n++] = (sn_tensor_t){.name = "trainer.lr", .dtype = SN_DTYPE_F64, .ndim = 0, .data = &lr};
  if (!path) snprintf(file, sizeof file, "%s/checkpoint.safetensors", t->o.out);
  CHECK_SN(sn_safetensors_save(path ? path : file, ts, n));
}

/* --resume: every rank loads the same file. Returns the step to continue from. */
static int64_t load_checkpoint(trainer_t *t) {
  char err[8192] = "";
  sn_safetensors_t *f = NULL;
  int64_t v[TS_COUNT] = {0};
  sn_status_t st = sn_safetensors_load(&f, t->o.resume);
  int failed = st != SN_OK;
  if (failed)
    snprintf(err, sizeof err, "--resume %s: %s: %s", t->o.resume, sn_status_string(st),
             sn_last_error());
  for (int i = 0; !failed && i < TS_COUNT; i++) {
    sn_tensor_t x;
    if (sn_safetensors_get(f, &x, ts_names[i]) != SN_OK || !x.is_i64) {
      snprintf(err, sizeof err,
               "--resume %s: no I64 tensor \"%s\": not a checkpoint.safetensors of "
               "syncnorm-train (model.safetensors holds the model only)",
               t->o.resume, ts_names[i]);
      failed = 1;
    } else if (x.ndim != 0) { /* save_checkpoint writes scalars: 8 bytes of data */
      snprintf(err, sizeof err, "--resume %s: \"%s\" has %d dimensions, not a scalar: a corrupt "
               "checkpoint", t->o.resume, ts_names[i], x.ndim);
      failed = 1;
    } else {
      memcpy(&v[i], x.data, sizeof v[i]);
    }
  }
  if (!failed && v[TS_STEP] < 0) {
    snprintf(err, sizeof err, "--resume %s: trainer.step is %lld: a corrupt checkpoint",
             t->o.resume, (long long)v[TS_STEP]);
    failed = 1;
  }
  const int64_t g = t->o.batch * t->size;
  if (!failed && (v[TS_GLOBAL_BATCH] != g || v[TS_SEED] != (int64_t)t->o.seed ||
                  v[TS_TRAIN_N] != t->train_n)) {
    snprintf(err, sizeof err,
             "--resume %s: made with global batch %lld, seed %lld, %lld training images; this "
             "run has %lld, %lld, %lld: the data order would differ (use the same ranks × "
             "--batch, --seed and --train-subset)",
             t->o.resume, (long long)v[TS_GLOBAL_BATCH], (long long)v[TS_SEED],
             (long long)v[TS_TRAIN_N], (long long)g, (long long)t->o.seed,
             (long long)t->train_n);
    failed = 1;
  }
  double lr = t->o.lr; /* absent from checkpoints of older builds: no note then */
  sn_tensor_t lt;
  if (!failed && sn_safetensors_get(f, &lt, "trainer.lr") == SN_OK && !lt.is_i64 &&
      lt.dtype == SN_DTYPE_F64 && lt.ndim == 0)
    memcpy(&lr, lt.data, sizeof lr);
  char detail[1024] = "";
  if (!failed && cnn_model_load(t->model, f, 1, detail, sizeof detail) != 0) {
    snprintf(err, sizeof err, "--resume %s: %s", t->o.resume, detail);
    failed = 1;
  }
  sn_safetensors_free(f);
  /* start == end is a finished run restarted (a job scheduler's retry after a crash past the
   * last checkpoint): it ends at once with the same results. Ending before the checkpoint is a
   * mistake in the arguments, refused before anything says the run resumed. */
  if (!failed && v[TS_STEP] > t->end_step) {
    snprintf(err, sizeof err,
             "--resume %s: the checkpoint is at step %lld, past the end of this run at step %lld "
             "(--epochs %lld%s); raise --epochs or --max-steps",
             t->o.resume, (long long)v[TS_STEP], (long long)t->end_step, (long long)t->o.epochs,
             t->o.max_steps > 0 ? ", --max-steps" : "");
    failed = 1;
  }
  exit_if_any_failed(t, failed, err);
  if (t->rank == 0) {
    if (v[TS_STEP] < t->end_step)
      printf("resumed from %s at step %lld of %lld (epoch %lld of %lld)\n", t->o.resume,
             (long long)v[TS_STEP], (long long)t->end_step,
             (long long)(v[TS_STEP] / t->steps_per_epoch + 1), (long long)t->o.epochs);
    else
      printf("resumed from %s at step %lld of %lld\n", t->o.resume, (long long)v[TS_STEP],
             (long long)t->end_step);
    if (v[TS_EPOCHS] != t->o.epochs || v[TS_WORLD] != t->size || v[TS_SYNC] != t->o.sync_bn ||
        lr != t->o.lr)
      printf("note: the checkpoint was made with --epochs %lld --lr %g on %lld ranks%s; this run "
             "uses --epochs %lld --lr %g on %d ranks%s (the learning-rate schedule follows this "
             "run)\n",
             (long long)v[TS_EPOCHS], lr, (long long)v[TS_WORLD], v[TS_SYNC] ? "" : " --no-sync-bn",
             (long long)t->o.epochs, t->o.lr, t->size, t->o.sync_bn ? "" : " --no-sync-bn");
  }
  return v[TS_STEP];
}

/* --dump-first-step: the averaged gradients, loss and running stats after the first step. */
static void dump_first_step(trainer_t *t, float loss) {
  sn_tensor_t ts[CNN_NPARAMS + 5];
  char names[CNN_NPARAMS][64];
  int n = 0;
  for (int i = 0; i < CNN_NPARAMS; i++) {
    const cnn_param_t *p = &t->model->param[i];
    snprintf(names[i], sizeof names[i], "grad.%s", p->name);
    ts[n] = (sn_tensor_t){.name = names[i], .dtype = SN_DTYPE_F32, .ndim = p->ndim,
                          .data = p->grad};
    memcpy(ts[n++].shape, p->shape, sizeof p->shape);
  }
  const sn_syncbn_params_t *bp[2] = {&t->model->bn1p, &t->model->bn2p};
  static const char *const rs[4] = {"bn1.running_mean", "bn1.running_var", "bn2.running_mean",
                                    "bn2.running_var"};
  for (int i = 0; i < 4; i++)
    ts[n++] = (sn_tensor_t){.name = rs[i], .dtype = SN_DTYPE_F32, .ndim = 1,
                            .shape = {bp[i / 2]->num_features},
                            .data = i % 2 ? bp[i / 2]->running_var : bp[i / 2]->running_mean};
  ts[n++] = (sn_tensor_t){.name = "loss", .dtype = SN_DTYPE_F32, .ndim = 0, .data = &loss};
  CHECK_SN(sn_safetensors_save(t->o.dump_first_step, ts, n));
}

/* One training step on global batch `step`: forward, backward, one all-reduce, SGD. Returns the
 * mean loss over the global batch. */
static float train_step(trainer_t *t, int64_t step, int first) {
  char err[1024];
  cnn_model_t *m = t->model;
  const int64_t epoch = step / t->steps_per_epoch, i = step % t->steps_per_epoch;
  if (epoch != t->perm_epoch) { /* the epoch's shuffle, identical on every rank */
    cnn_rng_t rng = {t->o.seed * 0x100000001b3ull ^ (uint64_t)(epoch + 1) * 0x9e3779b97f4a7c15ull};
    cnn_rng_permutation(t->perm, t->train_n, &rng);
    t->perm_epoch = epoch;
  }
  const int64_t b = t->o.batch;
  gather(t, &t->train, t->perm + i * b * t->size + (int64_t)t->rank * b, 0, b);
  if (cnn_model_forward(m, b, 1, err, sizeof err) != 0) die("%s", err);
  const double loss = cnn_softmax_xent(m->dlogits, NULL, m->logits, t->labels, b, CNN_CLASSES,
                                       1.0 / (double)b);
  if (cnn_model_backward(m, b, err, sizeof err) != 0) die("%s", err);
  m->grads[m->grad_count] = (float)loss; /* summed with the gradients: no extra collective */
  CHECK_SN(sn_comm_allreduce_sum(t->comm, m->grads, m->grad_count + 1, SN_DTYPE_F32));
  const float inv_p = 1.0f / (float)t->size;
  for (int64_t k = 0; k <= m->grad_count; k++) m->grads[k] *= inv_p;
  if (first && t->o.dump_first_step && t->rank == 0) dump_first_step(t, m->grads[m->grad_count]);
  cnn_model_sgd(m, (float)lr_at(t, step), SGD_MOMENTUM, (float)t->o.weight_decay);
  return m->grads[m->grad_count];
}

/* End of an epoch (or of the run): running-stat check, evaluation, report, checkpoint. */
static void end_epoch(trainer_t *t, int64_t step_done, double epoch_start, double train_s) {
  const int same = state_identical(t, 1);
  if (!t->o.sync_bn) adopt_rank0_running_stats(t);
  const double e0 = now_s();
  double acc = 0, loss = 0;
  evaluate(t, &acc, &loss);
  t->last_eval_s = now_s() - e0;
  t->last_accuracy = acc;
  const int64_t epoch = (step_done - 1) / t->steps_per_epoch + 1;
  if (t->rank == 0) {
    const int64_t steps = step_done - (epoch - 1) * t->steps_per_epoch;
    char stats[160];
    if (t->size == 1) /* "identical on all 1 ranks" said nothing */
      snprintf(stats, sizeof stats, "1 rank (no running stats to compare across ranks)");
    else if (t->o.sync_bn)
      snprintf(stats, sizeof stats, "running stats %s on all %d ranks",
               same ? "bitwise identical" : "DIFFERENT", t->size);
    else
      snprintf(stats, sizeof stats, "running stats %s across the %d ranks (--no-sync-bn: local "
               "BatchNorm), rank 0's adopted", same ? "identical" : "differ", t->size);
    printf("epoch %lld/%lld done%s: test accuracy %.2f%% (loss %.4f, eval mode), epoch time "
           "%.1f s (training %.1f s, %.0f images/s), %s\n",
           (long long)epoch, (long long)t->o.epochs,
           step_done % t->steps_per_epoch ? " (stopped early)" : "", acc, loss,
           now_s() - epoch_start, train_s,
           train_s > 0 ? (double)(steps * t->o.batch * t->size) / train_s : 0.0, stats);
    fflush(stdout);
    metrics_test_row(&t->metrics, epoch, step_done, loss, acc, now_s() - t->t0);
    save(t, step_done, NULL);
  }
  if (t->o.sync_bn && !same) {
    if (t->rank == 0) fprintf(stderr, "syncnorm-train: error: running statistics diverged\n");
    trainer_free(t);
    MPI_Finalize();
    exit(EXIT_DIVERGED);
  }
}

int main(int argc, char **argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    fprintf(stderr, "syncnorm-train: MPI_Init_thread failed\n");
    return 1;
  }
  trainer_t t;
  memset(&t, 0, sizeof t);
  t.t0 = now_s();
  t.last_accuracy = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &t.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &t.size);
  g_rank = t.rank;
  if (t.rank == 0) setvbuf(stdout, NULL, _IOLBF, 0);
  const int parsed = options_parse(&t.o, argc, argv, t.rank);
  if (parsed != 0) {
    MPI_Finalize();
    return parsed == 1 ? 0 : EXIT_USAGE;
  }
  setup_threads(&t);
  { /* The library's environment (SN_COMM_TIMEOUT_S) is checked by every communicator's
     * creation: a "self" one checks it locally, so a bad value ends the run as bad usage (exit
     * 2, one message) before the collective sn_comm_create_mpi, on every rank alike. */
    sn_comm_t *probe = NULL;
    char err[1024] = "";
    const sn_status_t st = sn_comm_create_self(&probe);
    if (st != SN_OK) { /* the message without the probe's function name: not the user's call */
      const char *msg = sn_last_error(), *probe_fn = "sn_comm_create_self: ";
      if (strncmp(msg, probe_fn, strlen(probe_fn)) == 0) msg += strlen(probe_fn);
      snprintf(err, sizeof err, "%s: environment: %s", sn_status_string(st), msg);
    }
    sn_comm_destroy(probe);
    exit_if_any_failed(&t, st != SN_OK, err);
  }
  CHECK_SN(sn_comm_create_mpi(&t.comm, MPI_COMM_WORLD));
  load_data(&t);

  int64_t global; /* the options are the same on every rank, so is each verdict below */
  const int batch_overflows = __builtin_mul_overflow(t.o.batch, (int64_t)t.size, &global);
  t.steps_per_epoch = batch_overflows ? 0 : t.train_n / global; /* the last incomplete global
                                                                    batch is dropped */
  {
    char msg[512];
    snprintf(msg, sizeof msg,
             "%lld training images are fewer than one global batch of %d ranks × %lld",
             (long long)t.train_n, t.size, (long long)t.o.batch);
    exit_if_any_failed(&t, t.steps_per_epoch == 0, msg);
    /* --epochs 2^63-1 would overflow the step count into a negative schedule */
    snprintf(msg, sizeof msg, "--epochs %lld × %lld steps per epoch is beyond 2^63 steps",
             (long long)t.o.epochs, (long long)t.steps_per_epoch);
    exit_if_any_failed(&t, __builtin_mul_overflow(t.o.epochs, t.steps_per_epoch, &t.total_steps),
                       msg);
  }
  char err[4096] = "";
  /* the model's buffers hold the larger of a training batch and an evaluation chunk, which
   * never needs to exceed a rank's shard of the test set (the largest: ceil(test_n / size));
   * sized by --eval-batch alone, 65536 would take 53 GB per rank for a test set of 10, and the
   * kernel's OOM killer would end the job */
  const int64_t shard = (t.test_n + t.size - 1) / t.size;
  t.eval_chunk = t.o.eval_batch < shard ? t.o.eval_batch : shard > 0 ? shard : 1;
  const int64_t cap = t.o.batch > t.eval_chunk ? t.o.batch : t.eval_chunk;
  {
    /* refused while every rank can still say so, rather than by the OOM killer mid-allocation
     * (it may pick another process): all ranks on this host together against its memory */
    const double per_rank = (double)cnn_model_bytes(cap), need = per_rank * t.local_ranks;
    const double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    char msg[512];
    snprintf(msg, sizeof msg,
             "a batch of %lld images (--batch %lld, --eval-batch %lld) needs %.1f GiB of "
             "buffers per rank, %.1f GiB for the %d rank%s on this host, which has %.1f GiB of "
             "memory: use a smaller --batch or --eval-batch, or fewer ranks per host",
             (long long)cap, (long long)t.o.batch, (long long)t.o.eval_batch,
             per_rank / 1073741824.0, need / 1073741824.0, t.local_ranks,
             t.local_ranks == 1 ? "" : "s", have / 1073741824.0);
    exit_if_any_failed(&t, have > 0 && need > have, msg);
  }
  if (cnn_model_create(&t.model, cap, t.o.sync_bn ? t.comm : NULL, t.o.seed, err, sizeof err))
    die("%s", err);
  t.perm = malloc((size_t)t.train_n * sizeof *t.perm);
  t.labels = malloc((size_t)cap);
  t.state = malloc((size_t)cnn_model_state_bytes(t.model, 0));
  if (!t.perm || !t.labels || !t.state) die("out of memory");
  t.perm_epoch = -1;
  /* The dump files are written after the first step and at the end: a bad path found then
   * would waste the run and abort every rank (exit 1). Checked before anything is written or
   * printed; a dump into --out, which rank 0 creates below, counts as writable. */
  int dump_bad = 0;
  if (t.o.dump_first_step && t.rank == 0)
    dump_bad = metrics_check_writable(t.o.dump_first_step, t.o.out, "--dump-first-step", err,
                                      sizeof err);
  if (!dump_bad && t.o.dump_rank_state) {
    char path[4200];
    snprintf(path, sizeof path, "%s.rank%d.safetensors", t.o.dump_rank_state, t.rank);
    dump_bad = metrics_check_writable(path, t.o.out, "--dump-rank-state", err, sizeof err);
  }
  exit_if_any_failed(&t, dump_bad, err);
  t.end_step = t.o.max_steps > 0 && t.o.max_steps < t.total_steps ? t.o.max_steps : t.total_steps;
  t.start_step = t.o.resume ? load_checkpoint(&t) : 0;

  int failed = 0;
  if (t.rank == 0) {
    failed = metrics_mkdir_p(t.o.out, err, sizeof err) != 0 ||
             metrics_open(&t.metrics, t.o.out, t.o.resume != NULL, err, sizeof err) != 0;
  }
  exit_if_any_failed(&t, failed, err);
  const int yield = mpi_yield_when_idle();
  if (t.rank == 0) {
    printf("syncnorm-train (syncnorm %s): %d rank%s × batch %lld = global batch %lld, %d "
           "thread%s per rank (OpenBLAS %d, OpenMP %d), %s, %lld step%s per epoch, %lld epoch%s, "
           "lr %g cosine, MPI yield when idle: %s\n",
           sn_version(), t.size, t.size > 1 ? "s" : "", (long long)t.o.batch, (long long)global,
           t.threads, t.threads > 1 ? "s" : "", t.threads, t.omp_threads,
           t.o.sync_bn ? "SyncBatchNorm" : "local BatchNorm (--no-sync-bn)",
           (long long)t.steps_per_epoch, t.steps_per_epoch > 1 ? "s" : "", (long long)t.o.epochs,
           t.o.epochs > 1 ? "s" : "", t.o.lr,
           yield < 0 ? "unknown" : yield ? "yes" : "no");
    if (yield == 0 && t.local_ranks > t.cpus)
      fprintf(stderr, "syncnorm-train: warning: %d ranks share %ld cores but MPI does not yield "
              "when idle: collectives will be very slow (export "
              "OMPI_MCA_mpi_yield_when_idle=1)\n", t.local_ranks, t.cpus);
  }

  /* ---- training loop ---- */
  double epoch_start = now_s(), train_s = 0, train_total_s = 0, last_print = now_s();
  double print_loss = 0, log_loss = 0, last_log = now_s();
  int64_t print_steps = 0, log_steps = 0, done_steps = 0;
  for (int64_t step = t.start_step; step < t.end_step; step++) {
    const double s0 = now_s();
    const float loss = train_step(&t, step, step == t.start_step);
    const double dt = now_s() - s0;
    train_s += dt, train_total_s += dt, done_steps++;
    print_loss += loss, log_loss += loss, print_steps++, log_steps++;
    const int64_t epoch = step / t.steps_per_epoch + 1;
    if (t.rank == 0 && ((step + 1) % t.o.log_every == 0 || step + 1 == t.end_step)) {
      const double tn = now_s();
      metrics_train_row(&t.metrics, epoch, step + 1, log_loss / (double)log_steps,
                        lr_at(&t, step), (double)(log_steps * global) / (tn - last_log),
                        tn - t.t0);
      log_loss = 0, log_steps = 0, last_log = tn;
    }
    if (t.rank == 0 && now_s() - last_print >= PROGRESS_EVERY_S) {
      const double tn = now_s();
      const int64_t left = t.end_step - step - 1;
      const int64_t evals_left = (t.end_step - 1) / t.steps_per_epoch - step / t.steps_per_epoch;
      char eta[32];
      metrics_format_duration(eta, sizeof eta,
                              (double)left * train_total_s / (double)done_steps +
                                  (double)evals_left * t.last_eval_s);
      printf("epoch %lld/%lld  step %lld/%lld  loss %.4f  lr %.5f  %.0f images/s  ETA %s\n",
             (long long)epoch, (long long)t.o.epochs,
             (long long)(step % t.steps_per_epoch + 1), (long long)t.steps_per_epoch,
             print_loss / (double)print_steps, lr_at(&t, step),
             (double)(print_steps * global) / (tn - last_print), eta);
      print_loss = 0, print_steps = 0, last_print = tn;
    }
    if ((step + 1) % t.steps_per_epoch == 0 || step + 1 == t.end_step) {
      end_epoch(&t, step + 1, epoch_start, train_s);
      epoch_start = now_s(), train_s = 0, last_print = now_s();
    }
  }
  if (t.start_step >= t.end_step && t.rank == 0)
    printf("nothing to train: the checkpoint is at step %lld of %lld\n", (long long)t.start_step,
           (long long)t.end_step);

  /* ---- the end: identical state on every rank? ---- */
  const int same = state_identical(&t, 0);
  if (t.o.dump_rank_state) {
    char path[4200];
    snprintf(path, sizeof path, "%s.rank%d.safetensors", t.o.dump_rank_state, t.rank);
    save(&t, t.end_step, path);
  }
  if (t.rank == 0) {
    if (t.size == 1)
      printf("parameters, running stats and momentum: 1 rank, nothing to compare across ranks\n");
    else
      printf("parameters, running stats and momentum bitwise identical on all %d ranks: %s\n",
             t.size, same ? "yes" : "NO");
    if (t.last_accuracy >= 0)
      printf("test accuracy %.2f%% after %lld step%s (%.2f epochs)\n", t.last_accuracy,
             (long long)t.end_step, t.end_step == 1 ? "" : "s",
             (double)t.end_step / (double)t.steps_per_epoch);
    printf("wall time %.1f s (training %.1f s for %lld step%s, %.1f ms/step)\n", now_s() - t.t0,
           train_total_s, (long long)done_steps, done_steps == 1 ? "" : "s",
           done_steps ? 1e3 * train_total_s / (double)done_steps : 0.0);
  }
  char out[4096];
  snprintf(out, sizeof out, "%s", t.o.out);
  const int rank = t.rank;
  trainer_free(&t);
  MPI_Finalize();
  if (rank == 0) {
    const int plotted = metrics_plot(out, err, sizeof err);
    if (plotted < 0) fprintf(stderr, "syncnorm-train: warning: %s\n", err);
    /* the files that are there (a run that trained nothing into a new --out wrote no model);
     * a curves.png only when this run drew it (not one left by an earlier run) */
    static const char *const files[] = {"metrics.csv", "model.safetensors",
                                        "checkpoint.safetensors", "curves.gp", "curves.png"};
    char list[256] = "";
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
      char path[4200];
      snprintf(path, sizeof path, "%s/%s", out, files[i]);
      if (access(path, F_OK) == 0 && (plotted == 1 || strcmp(files[i], "curves.png") != 0))
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? ", " : "",
                 files[i]);
    }
    printf("results in %s: %s%s\n", out, list,
           plotted == 1   ? ""
           : plotted == 2 ? " (no training rows: nothing plotted)"
           : plotted == 0 ? " (gnuplot not installed: no curves.png; curves.gp plots it)"
                          : " (gnuplot failed: no curves.png)");
  }
  return same ? 0 : EXIT_DIVERGED;
}
