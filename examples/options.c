/*
 * options.c — syncnorm-train's command line (see options.h).
 */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "syncnorm.h"

static void usage(FILE *f) {
  fprintf(f,
"Usage: mpirun -np P syncnorm-train [options]\n"
"Data-parallel training of a small CNN (conv-BN-ReLU-pool ×2, linear) on Fashion-MNIST with\n"
"syncnorm's SyncBatchNorm over MPI. Rank 0 prints progress, per-epoch test accuracy and writes\n"
"the results into --out.\n"
"\n"
"  --data DIR          IDX files (train-images-idx3-ubyte.gz, ...) [" OPTIONS_DEFAULT_DATA "]\n"
"  --out DIR           results: metrics.csv, model.safetensors (PyTorch state_dict keys),\n"
"                      checkpoint.safetensors (model + optimizer + step, for --resume),\n"
"                      curves.png when gnuplot is installed [runs/latest]\n"
"  --epochs N          epochs [2]\n"
"  --batch B           images per rank per step; global batch = P·B; the last incomplete\n"
"                      global batch of each epoch is dropped [8]\n"
"  --lr LR             initial learning rate, cosine decay to 0 over the run [0.01]\n"
"  --weight-decay WD   on conv/linear weights (not biases, not BatchNorm) [5e-4]\n"
"  --seed S            initialization and data order, the same on every rank [1]\n"
"  --threads T         threads per rank [CPU cores / ranks on the node, ≥ 1]: OpenBLAS's,\n"
"                      and OpenMP's too when OMP_WAIT_POLICY=passive (else OpenMP uses 1:\n"
"                      spinning OpenMP workers would slow OpenBLAS's threads down)\n"
"  --no-sync-bn        local BatchNorm per rank (no statistics all-reduce), for comparison;\n"
"                      as PyTorch DDP, evaluation and checkpoints use rank 0's running stats\n"
"  --resume FILE       continue from a checkpoint.safetensors (same global batch, seed and\n"
"                      data): the run continues exactly where it stopped\n"
"  --max-steps N       stop after global step N (the schedule still spans --epochs);\n"
"                      a checkpoint is written, so --resume continues the same run\n"
"  --train-subset N    use the first N training images only\n"
"  --test-subset N     evaluate on the first N test images only\n"
"  --log-every N       a metrics.csv row every N steps [50]\n"
"  --eval-batch N      images per forward pass in evaluation (at most a rank's share\n"
"                      of the test set) [100]\n"
"  --help, --version\n"
"Testing and debugging:\n"
"  --dump-first-step FILE  rank 0 writes, after the first step's gradient all-reduce and before\n"
"                      the update: the averaged gradients (\"grad.<param>\"), the loss (\"loss\")\n"
"                      and bn1/bn2 running_mean/running_var as safetensors\n"
"  --dump-rank-state PREFIX  at the end every rank writes PREFIX.rank<r>.safetensors (its\n"
"                      parameters, running stats and momentum) to compare ranks byte by byte\n"
"Exit status: 0 ok, 1 library/MPI failure, 2 bad usage/data/checkpoint, 3 ranks diverged.\n");
}

/* Whole decimal integers only: strtoll/strtoull alone take leading spaces and a sign, and
 * clamp a value out of range (errno ERANGE) instead of failing. */
static int parse_i64(const char *s, int64_t *v, int64_t min) {
  char *end = NULL;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  if (!((s[0] >= '0' && s[0] <= '9') || s[0] == '-') || *end || errno == ERANGE || x < min)
    return -1;
  *v = x;
  return 0;
}

static int parse_u64(const char *s, unsigned long long *v) {
  char *end = NULL;
  errno = 0;
  unsigned long long x = strtoull(s, &end, 10);
  if (!(s[0] >= '0' && s[0] <= '9') || *end || errno == ERANGE) return -1;
  *v = x;
  return 0;
}

int options_parse(options_t *o, int argc, char **argv, int rank) {
  *o = (options_t){.epochs = 2, .batch = 8, .eval_batch = 100, .max_steps = 0,
                   .train_subset = 0, .test_subset = 0, .log_every = 50, .lr = 0.01,
                   .weight_decay = 5e-4, .seed = 1, .threads = 0, .sync_bn = 1,
                   .data = OPTIONS_DEFAULT_DATA, .out = "runs/latest"};
  enum { O_DATA = 256, O_OUT, O_EPOCHS, O_BATCH, O_LR, O_WD, O_SEED, O_THREADS, O_NOSYNC,
         O_RESUME, O_MAXSTEPS, O_TRAINSUB, O_TESTSUB, O_LOGEVERY, O_EVALBATCH, O_DUMPFIRST,
         O_DUMPRANK, O_HELP, O_VERSION };
  static const struct option longopts[] = {
      {"data", required_argument, 0, O_DATA}, {"out", required_argument, 0, O_OUT},
      {"epochs", required_argument, 0, O_EPOCHS}, {"batch", required_argument, 0, O_BATCH},
      {"lr", required_argument, 0, O_LR}, {"weight-decay", required_argument, 0, O_WD},
      {"seed", required_argument, 0, O_SEED}, {"threads", required_argument, 0, O_THREADS},
      {"no-sync-bn", no_argument, 0, O_NOSYNC}, {"resume", required_argument, 0, O_RESUME},
      {"max-steps", required_argument, 0, O_MAXSTEPS},
      {"train-subset", required_argument, 0, O_TRAINSUB},
      {"test-subset", required_argument, 0, O_TESTSUB},
      {"log-every", required_argument, 0, O_LOGEVERY},
      {"eval-batch", required_argument, 0, O_EVALBATCH},
      {"dump-first-step", required_argument, 0, O_DUMPFIRST},
      {"dump-rank-state", required_argument, 0, O_DUMPRANK}, {"help", no_argument, 0, O_HELP},
      {"version", no_argument, 0, O_VERSION}, {0, 0, 0, 0}};
  opterr = rank == 0;
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    int bad = 0;
    int64_t v = 0;
    char *end = NULL;
    switch (c) {
      case O_DATA: o->data = optarg; break;
      case O_OUT: o->out = optarg; break;
      case O_EPOCHS: bad = parse_i64(optarg, &o->epochs, 1); break;
      case O_BATCH: bad = parse_i64(optarg, &o->batch, 1); break;
      case O_LR:
        o->lr = strtod(optarg, &end);
        bad = !optarg[0] || *end || !(o->lr >= 0 && o->lr < 1e3);
        break;
      case O_WD:
        o->weight_decay = strtod(optarg, &end);
        bad = !optarg[0] || *end || !(o->weight_decay >= 0 && o->weight_decay < 1);
        break;
      case O_SEED:
        bad = parse_u64(optarg, &o->seed);
        break;
      case O_THREADS:
        bad = parse_i64(optarg, &v, 1) || v > 1024;
        o->threads = (int)v;
        break;
      case O_NOSYNC: o->sync_bn = 0; break;
      case O_RESUME: o->resume = optarg; break;
      case O_MAXSTEPS: bad = parse_i64(optarg, &o->max_steps, 1); break;
      case O_TRAINSUB: bad = parse_i64(optarg, &o->train_subset, 1); break;
      case O_TESTSUB: bad = parse_i64(optarg, &o->test_subset, 1); break;
      case O_LOGEVERY: bad = parse_i64(optarg, &o->log_every, 1); break;
      case O_EVALBATCH: bad = parse_i64(optarg, &o->eval_batch, 1); break;
      case O_DUMPFIRST: o->dump_first_step = optarg; break;
      case O_DUMPRANK: o->dump_rank_state = optarg; break;
      case O_HELP:
        if (rank == 0) usage(stdout);
        return 1;
      case O_VERSION:
        if (rank == 0) printf("syncnorm-train (syncnorm %s)\n", sn_version());
        return 1;
      default:
        if (rank == 0) fprintf(stderr, "Try 'syncnorm-train --help'.\n");
        return 2;
    }
    if (bad) {
      if (rank == 0)
        fprintf(stderr, "syncnorm-train: error: invalid value '%s' for --%s\n", optarg,
                longopts[c - O_DATA].name);
      return 2;
    }
  }
  if (optind < argc) {
    if (rank == 0)
      fprintf(stderr, "syncnorm-train: error: unexpected argument '%s' (see --help)\n",
              argv[optind]);
    return 2;
  }
  if (o->batch > 1 << 20 || o->eval_batch > 1 << 16) {
    if (rank == 0) fprintf(stderr, "syncnorm-train: error: --batch or --eval-batch too large\n");
    return 2;
  }
  return 0;
}
