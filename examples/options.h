/*
 * options.h — syncnorm-train's command line (getopt_long); see `syncnorm-train --help`.
 */
#ifndef SN_EXAMPLES_OPTIONS_H
#define SN_EXAMPLES_OPTIONS_H

#include <stdint.h>

#define OPTIONS_DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

typedef struct {
  int64_t epochs, batch, eval_batch, max_steps, train_subset, test_subset, log_every;
  double lr, weight_decay;
  unsigned long long seed;
  int threads, sync_bn;
  const char *data, *out, *resume, *dump_first_step, *dump_rank_state;
} options_t;

/* Parses argv into *o (defaults for what is not given). Only `rank` 0 prints (help, version,
 * errors). Returns 0 to run, 1 to exit with status 0 (--help, --version), 2 on a usage error. */
int options_parse(options_t *o, int argc, char **argv, int rank);

#endif /* SN_EXAMPLES_OPTIONS_H */
