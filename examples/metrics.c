/*
 * metrics.c — metrics.csv, curves.png and duration formatting (see metrics.h).
 */
#include "metrics.h"
#include "errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int metrics_mkdir_p(const char *dir, char *err, size_t errlen) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
    return ex_fail(err, errlen, "%s: path too long", dir);
  for (char *p = path + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      const char saved = *p;
      *p = '\0';
      if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return ex_fail(err, errlen, "cannot create directory %s: %s", path, strerror(errno));
      *p = saved;
      if (saved == '\0') break;
    }
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return ex_fail(err, errlen, "%s: not a directory", dir);
  return 0;
}

/* a and b name the same path, but for trailing slashes ("runs/x/" and "runs/x") */
static int same_dir(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  while (la > 1 && a[la - 1] == '/') la--;
  while (lb > 1 && b[lb - 1] == '/') lb--;
  return la == lb && strncmp(a, b, la) == 0;
}

int metrics_check_writable(const char *file, const char *will_make, const char *what, char *err,
                           size_t errlen) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", file) >= (int)sizeof dir)
    return ex_fail(err, errlen, "%s %s: path too long", what, file);
  char *slash = strrchr(dir, '/');
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    dir[1] = '\0'; /* "/name": the root directory */
  else
    *slash = '\0';
  struct stat st;
  if (will_make != NULL && same_dir(dir, will_make) && stat(dir, &st) != 0)
    return 0; /* made by the run before the file is written (a failure is reported then) */
  if (stat(dir, &st) != 0)
    return ex_fail(err, errlen, "%s %s: directory %s: %s", what, file, dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return ex_fail(err, errlen, "%s %s: %s is not a directory", what, file, dir);
  if (access(dir, W_OK | X_OK) != 0)
    return ex_fail(err, errlen, "%s %s: cannot write in %s: %s", what, file, dir, strerror(errno));
  if (stat(file, &st) == 0 && S_ISDIR(st.st_mode))
    return ex_fail(err, errlen, "%s %s: is a directory", what, file);
  return 0;
}

int metrics_open(metrics_t *m, const char *dir, int append, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  snprintf(m->path, sizeof m->path, "%s/metrics.csv", dir);
  struct stat st;
  const int exists = stat(m->path, &st) == 0 && st.st_size > 0;
  m->f = fopen(m->path, append && exists ? "a" : "w");
  if (!m->f) return ex_fail(err, errlen, "cannot write %s: %s", m->path, strerror(errno));
  if (!(append && exists))
    fprintf(m->f, "kind,epoch,step,loss,lr,images_per_s,test_accuracy,elapsed_s\n");
  fflush(m->f);
  return 0;
}

void metrics_train_row(metrics_t *m, int64_t epoch, int64_t step, double loss, double lr,
                       double images_per_s, double elapsed_s) {
  if (!m->f) return;
  fprintf(m->f, "train,%lld,%lld,%.6f,%.6g,%.1f,,%.2f\n", (long long)epoch, (long long)step, loss,
          lr, images_per_s, elapsed_s);
  fflush(m->f);
}

void metrics_test_row(metrics_t *m, int64_t epoch, int64_t step, double loss, double accuracy,
                      double elapsed_s) {
  if (!m->f) return;
  fprintf(m->f, "test,%lld,%lld,%.6f,,,%.2f,%.2f\n", (long long)epoch, (long long)step, loss,
          accuracy, elapsed_s);
  fflush(m->f);
}

void metrics_close(metrics_t *m) {
  if (m->f) fclose(m->f);
  m->f = NULL;
}

/* Whether an executable `name` is on PATH. */
static int on_path(const char *name) {
  const char *path = getenv("PATH");
  if (!path) path = "/usr/bin:/bin";
  char buf[4096];
  while (*path) {
    const char *end = strchr(path, ':');
    const size_t len = end ? (size_t)(end - path) : strlen(path);
    if (len > 0 && len + strlen(name) + 2 < sizeof buf) {
      memcpy(buf, path, len);
      snprintf(buf + len, sizeof buf - len, "/%s", name);
      if (access(buf, X_OK) == 0) return 1;
    }
    if (!end) break;
    path = end + 1;
  }
  return 0;
}

static const char plot_script[] =
    "# curves.gp — written by syncnorm-train; run `gnuplot curves.gp` in this directory.\n"
    "set datafile separator ','\n"
    "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
    "  set terminal pngcairo size 1100,450 font ',10'\n"
    "} else {\n"
    "  set terminal png size 1100,450\n"
    "}\n"
    "set output 'curves.png'\n"
    "set multiplot layout 1,2 title 'syncnorm-train (metrics.csv)'\n"
    "set grid\n"
    "set key top right\n"
    "set xlabel 'step (global batch)'\n"
    "set ylabel 'loss'\n"
    "set logscale y\n"
    "plot \"< grep '^train,' metrics.csv\" using 3:4 with lines lw 2 title 'training loss', \\\n"
    "     \"< grep '^test,' metrics.csv\" using 3:4 with linespoints lw 2 pt 7 title 'test loss'\n"
    "unset logscale y\n"
    "set xlabel 'epoch'\n"
    "set ylabel 'test accuracy (%)'\n"
    "set xrange [0:*]\n"
    "set xtics 1\n"
    "plot \"< grep '^test,' metrics.csv\" using 2:7 with linespoints lw 2 pt 7 "
    "title 'test accuracy (eval mode)'\n"
    "unset multiplot\n";

int metrics_plot(const char *dir, char *err, size_t errlen) {
  char path[4096];
  snprintf(path, sizeof path, "%s/curves.gp", dir);
  FILE *f = fopen(path, "w");
  if (!f) return ex_fail(err, errlen, "cannot write %s: %s", path, strerror(errno));
  fputs(plot_script, f);
  if (fclose(f) != 0) return ex_fail(err, errlen, "cannot write %s: %s", path, strerror(errno));
  /* a run that trained nothing (a finished checkpoint resumed into a new directory) leaves a
   * header-only metrics.csv, on which gnuplot fails ("x range is invalid") */
  snprintf(path, sizeof path, "%s/metrics.csv", dir);
  f = fopen(path, "r");
  int lines = 0;
  for (int ch; f != NULL && lines < 2 && (ch = fgetc(f)) != EOF;) lines += ch == '\n';
  if (f != NULL) fclose(f);
  if (lines < 2) return 2;
  if (!on_path("gnuplot")) return 0;
  fflush(NULL);
  const pid_t pid = fork();
  if (pid < 0) return ex_fail(err, errlen, "fork for gnuplot: %s", strerror(errno));
  if (pid == 0) { /* gnuplot's warnings (e.g. one test point: "empty x range") are noise here */
    const int devnull = open("/dev/null", O_WRONLY);
    if (chdir(dir) != 0 || devnull < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0) _exit(126);
    execlp("gnuplot", "gnuplot", "curves.gp", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return ex_fail(err, errlen, "waiting for gnuplot: %s", strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return ex_fail(err, errlen, "gnuplot %s/curves.gp failed (status %d)", dir,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 1;
}

void metrics_format_duration(char *buf, size_t n, double s) {
  if (!(s >= 0)) s = 0; /* also NaN */
  if (s < 10)
    snprintf(buf, n, "%.1fs", s);
  else if (s < 60)
    snprintf(buf, n, "%ds", (int)s);
  else if (s < 3600)
    snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else
    snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}
