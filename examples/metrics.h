/*
 * metrics.h — what syncnorm-train writes for people: metrics.csv, curves.png (through gnuplot
 * when it is installed), and durations formatted for progress lines.
 */
#ifndef SN_EXAMPLES_METRICS_H
#define SN_EXAMPLES_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* metrics.csv: one header line, then rows
 *   kind,epoch,step,loss,lr,images_per_s,test_accuracy,elapsed_s
 * kind "train": loss = mean training loss (over the global batches) of the last rows' steps,
 * lr at the row's step, images_per_s over those steps; test_accuracy empty.
 * kind "test": end of an epoch (or of the run): loss = mean test loss, test_accuracy in %, lr and
 * images_per_s empty. step counts global batches from 1; epoch from 1; elapsed_s since the start
 * of this invocation. */
typedef struct {
  FILE *f;
  char path[4096];
} metrics_t;

/* Creates dir and its parents (as mkdir -p). Returns 0, or −1 with a message in err. */
int metrics_mkdir_p(const char *dir, char *err, size_t errlen);

/* Checks, before the run, that a file can later be written at `file`: its directory exists and
 * is writable (or is `will_make`, a directory the run creates first; NULL for none), and `file`
 * is not a directory. Creates nothing. what names the option in the message
 * ("--dump-first-step"). Returns 0, or −1 with a message in err. */
int metrics_check_writable(const char *file, const char *will_make, const char *what, char *err,
                           size_t errlen);

/* Opens <dir>/metrics.csv: appended to when `append` and it exists (a resumed run), else created
 * with the header. Returns 0, or −1 with a message in err. */
int metrics_open(metrics_t *m, const char *dir, int append, char *err, size_t errlen);
void metrics_train_row(metrics_t *m, int64_t epoch, int64_t step, double loss, double lr,
                       double images_per_s, double elapsed_s);
void metrics_test_row(metrics_t *m, int64_t epoch, int64_t step, double loss, double accuracy,
                      double elapsed_s);
void metrics_close(metrics_t *m);

/* Writes <dir>/curves.gp (gnuplot script: training loss against step, test accuracy against
 * epoch, from metrics.csv) and, when gnuplot is on PATH, runs it in dir to make curves.png.
 * Returns 1 when curves.png was made, 0 when gnuplot is not installed, 2 when metrics.csv has
 * no rows to plot (gnuplot not run), −1 when writing the script or running gnuplot failed
 * (message in err). Forks: call it after MPI_Finalize. */
int metrics_plot(const char *dir, char *err, size_t errlen);

/* "1h02m", "3m07s", "42s" (or "9.3s" below 10 s) into buf. */
void metrics_format_duration(char *buf, size_t n, double seconds);

#endif /* SN_EXAMPLES_METRICS_H */
