/*
 * test_train_run.c — runs syncnorm-train under mpirun and checks what it promises:
 *  short        2 ranks, 200 steps on 3,200 images: the training loss falls, test accuracy is
 *               far above chance, parameters/running stats/momentum are byte-identical on both
 *               ranks (each rank's own dump compared here, not only the program's hash check),
 *               model.safetensors has PyTorch's state_dict and nothing else.
 *  equivalence  first step of 4 ranks × batch 8 with SyncBatchNorm vs 1 rank × batch 32: the
 *               BatchNorm running statistics and all averaged gradients agree to rounding; with
 *               --no-sync-bn they do not (local statistics of 8 images differ from those of 32).
 *  resume       a run stopped by --max-steps and continued with --resume ends byte-identical to
 *               the uninterrupted run; a checkpoint from another global batch or a model-only
 *               file is refused with exit status 2.
 *  errors       missing, truncated or inconsistent data, bad options, an unusable --out or
 *               --resume: exit status 2 and one clear message (no hang with several ranks).
 * Usage (from CMake): test_train_run PROG DATA_DIR WORK_DIR MPIEXEC NP_FLAG NPRE PRE... NPOST
 * POST...; CK_RUN_CASE selects the case. Exit 77 (skipped) when DATA_DIR is missing.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "syncnorm_dist.h"
#include "testutil.h"

static const char *g_prog, *g_data, *g_work, *g_mpiexec, *g_npflag;
static char **g_pre, **g_post;
static int g_npre, g_npost;

/* Output of the last run. */
static char g_out[1 << 16], g_err[1 << 16];

static void read_file(char *buf, size_t n, const char *path) {
  buf[0] = '\0';
  FILE *f = fopen(path, "rb");
  if (!f) return;
  const size_t got = fread(buf, 1, n - 1, f);
  buf[got] = '\0';
  fclose(f);
}

/* Runs `mpiexec -np np PRE... prog args... POST...` (args NULL-terminated); stdout and stderr go
 * to WORK/<name>.out/.err and into g_out/g_err. Returns the exit status. */
static int vrun(const char *name, int np, va_list ap) {
  const char *argv[128];
  int k = 0;
  char npbuf[16];
  snprintf(npbuf, sizeof npbuf, "%d", np);
  argv[k++] = g_mpiexec;
  argv[k++] = g_npflag;
  argv[k++] = npbuf;
  for (int i = 0; i < g_npre; i++) argv[k++] = g_pre[i];
  argv[k++] = g_prog;
  for (const char *a; (a = va_arg(ap, const char *)) != NULL && k < 100;) argv[k++] = a;
  for (int i = 0; i < g_npost; i++) argv[k++] = g_post[i];
  argv[k] = NULL;
  char out[1024], err[1024];
  snprintf(out, sizeof out, "%s/%s.out", g_work, name);
  snprintf(err, sizeof err, "%s/%s.err", g_work, name);
  fflush(NULL);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    const int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0) _exit(126);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) ck_assert_int_eq(errno, EINTR);
  read_file(g_out, sizeof g_out, out);
  read_file(g_err, sizeof g_err, err);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run(const char *name, int np, ...) {
  va_list ap;
  va_start(ap, np);
  const int st = vrun(name, np, ap);
  va_end(ap);
  return st;
}

static void wpath(char *p, size_t n, const char *rel) { snprintf(p, n, "%s/%s", g_work, rel); }

static void fresh_work_dir(void) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_work, g_work);
  ck_assert_int_eq(system(cmd), 0);
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

#define ASSERT_RUN(st, want, name)                                                            \
  ck_assert_msg((st) == (want),                                                              \
                "%s: exit status %d, expected %d\n--- stdout:\n%s\n--- stderr:\n%s",           \
                (name), (st), (want), g_out, g_err)

static int files_equal(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    const int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = 0;
    if (ca == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

static sn_safetensors_t *load(const char *path) {
  sn_safetensors_t *f = NULL;
  const sn_status_t st = sn_safetensors_load(&f, path);
  ck_assert_msg(st == SN_OK, "%s: %s: %s", path, sn_status_string(st), sn_last_error());
  return f;
}

static int64_t get_i64(const sn_safetensors_t *f, const char *name) {
  sn_tensor_t t;
  ck_assert_msg(sn_safetensors_get(f, &t, name) == SN_OK, "no tensor %s", name);
  ck_assert(t.is_i64);
  int64_t v;
  memcpy(&v, t.data, sizeof v);
  return v;
}

/* ---- short run ------------------------------------------------------------------------------ */

START_TEST(test_short_run) {
  fresh_work_dir();
  char out[1024], state[1024];
  wpath(out, sizeof out, "out");
  /* the rank dumps go into --out, which the run creates: accepted by the check before it */
  wpath(state, sizeof state, "out/state");
  const int st = run("short", 2, "--data", g_data, "--out", out, "--train-subset", "3200",
                     "--test-subset", "1000", "--epochs", "1", "--batch", "8", "--log-every", "10",
                     "--seed", "3", "--threads", "1", "--dump-rank-state", state, NULL);
  ASSERT_RUN(st, 0, "short run");
  ck_assert_msg(strstr(g_out, "200 steps per epoch"), "%s", g_out);
  ck_assert_msg(strstr(g_out, "running stats bitwise identical on all 2 ranks"), "%s", g_out);
  ck_assert_msg(strstr(g_out, "momentum bitwise identical on all 2 ranks: yes"), "%s", g_out);

  /* metrics.csv: 20 training rows (every 10 steps) with a falling loss, one test row */
  char path[1200], csv[1 << 15];
  snprintf(path, sizeof path, "%s/metrics.csv", out);
  read_file(csv, sizeof csv, path);
  ck_assert_msg(strncmp(csv, "kind,epoch,step,loss,lr,images_per_s,test_accuracy,elapsed_s\n",
                        61) == 0, "%s", csv);
  double first = -1, last = -1, acc = -1;
  int rows = 0;
  for (char *line = strchr(csv, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
    long long epoch, step;
    double loss, x;
    if (sscanf(line + 1, "train,%lld,%lld,%lf,%lf", &epoch, &step, &loss, &x) == 4) {
      if (first < 0) first = loss;
      last = loss, rows++;
    } else if (sscanf(line + 1, "test,%lld,%lld,%lf,,,%lf", &epoch, &step, &loss, &acc) == 4) {
      ck_assert_int_eq(step, 200);
    }
  }
  ck_assert_int_eq(rows, 20);
  ck_assert_msg(first > 1.0 && last < 0.6 * first, "loss %g → %g", first, last);
  ck_assert_msg(acc > 65.0, "test accuracy %g%% after 200 steps", acc);

  /* every rank's own state: byte-identical */
  char r0[1200], r1[1200];
  snprintf(r0, sizeof r0, "%s.rank0.safetensors", state);
  snprintf(r1, sizeof r1, "%s.rank1.safetensors", state);
  ck_assert_msg(access(r0, R_OK) == 0 && access(r1, R_OK) == 0, "no rank dumps");
  ck_assert_msg(files_equal(r0, r1), "rank 0 and rank 1 state differ");

  /* model.safetensors: exactly the PyTorch state_dict; checkpoint: + optimizer + trainer */
  snprintf(path, sizeof path, "%s/model.safetensors", out);
  sn_safetensors_t *f = load(path);
  ck_assert_int_eq(sn_safetensors_count(f), 16);
  for (int64_t i = 0; i < sn_safetensors_count(f); i++)
    ck_assert_msg(strncmp(sn_safetensors_name(f, i), "optimizer.", 10) != 0 &&
                      strncmp(sn_safetensors_name(f, i), "trainer.", 8) != 0,
                  "%s in model.safetensors", sn_safetensors_name(f, i));
  sn_tensor_t t;
  ck_assert_int_eq(sn_safetensors_get(f, &t, "fc.weight"), SN_OK);
  ck_assert(t.ndim == 2 && t.shape[0] == 10 && t.shape[1] == 3136 && t.dtype == SN_DTYPE_F32);
  ck_assert_int_eq(sn_safetensors_get(f, &t, "conv1.weight"), SN_OK);
  ck_assert(t.ndim == 4 && t.shape[0] == 32 && t.shape[1] == 1 && t.shape[2] == 3);
  ck_assert_int_eq(get_i64(f, "bn2.num_batches_tracked"), 200);
  sn_safetensors_free(f);
  snprintf(path, sizeof path, "%s/checkpoint.safetensors", out);
  f = load(path);
  ck_assert_int_eq(get_i64(f, "trainer.step"), 200);
  ck_assert_int_eq(sn_safetensors_get(f, &t, "optimizer.momentum_buffer.bn1.weight"), SN_OK);
  sn_safetensors_free(f);

  /* one rank: nothing to compare across ranks, said so (it read "on all 1 ranks") */
  wpath(out, sizeof out, "out1");
  const int st1 = run("one_rank", 1, "--data", g_data, "--out", out, "--train-subset", "3200",
                      "--test-subset", "100", "--epochs", "1", "--max-steps", "3", "--threads",
                      "1", NULL);
  ASSERT_RUN(st1, 0, "one rank");
  ck_assert_msg(strstr(g_out, "1 rank (no running stats to compare across ranks)") &&
                    strstr(g_out, "momentum: 1 rank, nothing to compare across ranks") &&
                    !strstr(g_out, "all 1 ranks"),
                "%s", g_out);
}
END_TEST

/* ---- equivalence ----------------------------------------------------------------------------- */

/* ‖a − b‖₂ / ‖b‖₂ of tensor `name` (F32) in two files. */
static double rel_diff(const sn_safetensors_t *a, const sn_safetensors_t *b, const char *name,
                       double *norm_b) {
  sn_tensor_t ta, tb;
  ck_assert_msg(sn_safetensors_get(a, &ta, name) == SN_OK, "no %s", name);
  ck_assert_msg(sn_safetensors_get(b, &tb, name) == SN_OK, "no %s", name);
  ck_assert_int_eq(ta.ndim, tb.ndim);
  int64_t n = 1;
  for (int d = 0; d < ta.ndim; d++) {
    ck_assert_int_eq(ta.shape[d], tb.shape[d]);
    n *= ta.shape[d];
  }
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    float x, y;
    memcpy(&x, (const char *)ta.data + 4 * i, 4);
    memcpy(&y, (const char *)tb.data + 4 * i, 4);
    num += ((double)x - y) * ((double)x - y);
    den += (double)y * y;
  }
  *norm_b = sqrt(den);
  return sqrt(num) / (den > 0 ? sqrt(den) : 1e-300);
}

START_TEST(test_sync_equivalence) {
  fresh_work_dir();
  char a[1024], b[1024], c[1024], oa[1024], ob[1024], oc[1024];
  wpath(a, sizeof a, "p4b8.safetensors"), wpath(oa, sizeof oa, "p4b8");
  wpath(b, sizeof b, "p1b32.safetensors"), wpath(ob, sizeof ob, "p1b32");
  wpath(c, sizeof c, "p4b8_nosync.safetensors"), wpath(oc, sizeof oc, "p4b8_nosync");
#define COMMON "--data", g_data, "--max-steps", "1", "--train-subset", "320", "--test-subset", \
               "100", "--threads", "1", "--seed", "5"
  int st = run("p4b8", 4, COMMON, "--batch", "8", "--out", oa, "--dump-first-step", a, NULL);
  ASSERT_RUN(st, 0, "4 ranks × 8");
  st = run("p1b32", 1, COMMON, "--batch", "32", "--out", ob, "--dump-first-step", b, NULL);
  ASSERT_RUN(st, 0, "1 rank × 32");
  st = run("p4b8_nosync", 4, COMMON, "--batch", "8", "--no-sync-bn", "--out", oc,
           "--dump-first-step", c, NULL);
  ASSERT_RUN(st, 0, "4 ranks × 8 --no-sync-bn");
#undef COMMON
  sn_safetensors_t *fa = load(a), *fb = load(b), *fc = load(c);
  ck_assert_int_eq(sn_safetensors_count(fa), 15);
  /* Tolerances: running stats come from fp64 sums over the same 32·H·W values in another order,
   * rounded to f32 (~1e-7). Gradients: the same sums in f32 GEMMs blocked differently (K =
   * 8·H·W vs 32·H·W) and the loss scaled by 1/8 then /4 vs 1/32 (exact), ~1e-6. The conv biases'
   * gradients are ~0 (BatchNorm follows) and pure rounding noise: compared absolutely, against
   * the conv weight gradient's norm. */
  static const char *const stats[] = {"bn1.running_mean", "bn1.running_var", "bn2.running_mean",
                                      "bn2.running_var"};
  static const char *const grads[] = {"grad.conv1.weight", "grad.bn1.weight", "grad.bn1.bias",
                                      "grad.conv2.weight", "grad.bn2.weight", "grad.bn2.bias",
                                      "grad.fc.weight", "grad.fc.bias"};
  double nb, worst_sync = 0, least_nosync = INFINITY;
  for (int i = 0; i < 4; i++) {
    const double d = rel_diff(fa, fb, stats[i], &nb);
    ck_assert_msg(d <= 1e-6, "%s: 4×8 sync vs 1×32 differ by %g (normwise)", stats[i], d);
    worst_sync = fmax(worst_sync, d);
    const double e = rel_diff(fc, fb, stats[i], &nb);
    least_nosync = fmin(least_nosync, e);
  }
  for (int i = 0; i < 8; i++) {
    const double d = rel_diff(fa, fb, grads[i], &nb);
    ck_assert_msg(d <= 1e-5, "%s: 4×8 sync vs 1×32 differ by %g (normwise)", grads[i], d);
    worst_sync = fmax(worst_sync, d);
  }
  for (int l = 1; l <= 2; l++) {
    char bias[64], weight[64];
    snprintf(bias, sizeof bias, "grad.conv%d.bias", l);
    snprintf(weight, sizeof weight, "grad.conv%d.weight", l);
    double nw, nbias;
    rel_diff(fa, fb, weight, &nw);
    const double d = rel_diff(fa, fb, bias, &nbias) * nbias;
    ck_assert_msg(d <= 1e-5 * nw, "%s: |difference| %g vs |conv weight grad| %g", bias, d, nw);
  }
  const double dl = rel_diff(fa, fb, "loss", &nb);
  ck_assert_msg(dl <= 1e-6, "loss differs by %g", dl);
  /* --no-sync-bn: rank 0's statistics of its 8 images are not those of all 32 */
  ck_assert_msg(least_nosync > 100 * worst_sync && least_nosync > 5e-4,
                "--no-sync-bn running stats should differ: least difference %g (sync: %g)",
                least_nosync, worst_sync);
  const double dg = rel_diff(fc, fb, "grad.bn1.weight", &nb);
  ck_assert_msg(dg > 1e-3, "--no-sync-bn: grad.bn1.weight differs by only %g", dg);
  sn_safetensors_free(fa), sn_safetensors_free(fb), sn_safetensors_free(fc);
}
END_TEST

/* ---- resume ---------------------------------------------------------------------------------- */

/* A copy of the checkpoint src as dst with its trainer.step replaced: the scalar `step`, or
 * with empty != 0 an I64 tensor of shape [0] (no data), as a corrupt or crafted file would
 * have. */
static void write_bad_step(const char *src, const char *dst, int64_t step, int empty) {
  sn_safetensors_t *f = NULL;
  ck_assert_int_eq(sn_safetensors_load(&f, src), SN_OK);
  const int64_t n = sn_safetensors_count(f);
  sn_tensor_t *t = calloc((size_t)n, sizeof *t);
  ck_assert_ptr_nonnull(t);
  for (int64_t i = 0; i < n; i++) {
    ck_assert_int_eq(sn_safetensors_get(f, &t[i], sn_safetensors_name(f, i)), SN_OK);
    if (strcmp(t[i].name, "trainer.step") != 0) continue;
    t[i].data = &step;
    if (empty) t[i].ndim = 1, t[i].shape[0] = 0;
  }
  ck_assert_int_eq(sn_safetensors_save(dst, t, n), SN_OK);
  free(t);
  sn_safetensors_free(f);
}

START_TEST(test_resume_is_exact) {
  fresh_work_dir();
  char full[1024], part[1024], ck[1200], a[1300], b[1300];
  wpath(full, sizeof full, "full");
  wpath(part, sizeof part, "part");
#define COMMON "--data", g_data, "--epochs", "2", "--train-subset", "640", "--test-subset", \
               "200", "--threads", "1", "--seed", "9", "--batch", "8"
  int st = run("full", 2, COMMON, "--out", full, NULL);
  ASSERT_RUN(st, 0, "uninterrupted run");
  st = run("part1", 2, COMMON, "--out", part, "--max-steps", "50", NULL);
  ASSERT_RUN(st, 0, "run stopped at step 50");
  snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", part);
  st = run("part2", 2, COMMON, "--out", part, "--resume", ck, NULL);
  ASSERT_RUN(st, 0, "resumed run");
  ck_assert_msg(strstr(g_out, "resumed from") && strstr(g_out, "at step 50"), "%s", g_out);
  ck_assert_msg(strstr(g_out, "note:") == NULL, "same settings, yet a note: %s", g_out);
  snprintf(a, sizeof a, "%s/checkpoint.safetensors", full);
  snprintf(b, sizeof b, "%s/checkpoint.safetensors", part);
  ck_assert_msg(files_equal(a, b), "the resumed run ends differently from the uninterrupted one");
  snprintf(a, sizeof a, "%s/model.safetensors", full);
  snprintf(b, sizeof b, "%s/model.safetensors", part);
  ck_assert_msg(files_equal(a, b), "model.safetensors differ");
  /* another --lr: allowed (the schedule follows this run), but said */
  snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", full);
  wpath(b, sizeof b, "other_lr");
  st = run("other_lr", 2, "--data", g_data, "--epochs", "3", "--train-subset", "640",
           "--test-subset", "200", "--threads", "1", "--seed", "9", "--batch", "8", "--lr",
           "0.02", "--max-steps", "81", "--out", b, "--resume", ck, NULL);
  ASSERT_RUN(st, 0, "resume with another --lr");
  ck_assert_msg(strstr(g_out, "made with --epochs 2 --lr 0.01") &&
                    strstr(g_out, "uses --epochs 3 --lr 0.02"),
                "%s", g_out);
  /* refused: another global batch; a model-only file */
  snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", full);
  st = run("wrong_batch", 2, "--data", g_data, "--epochs", "2", "--train-subset", "640",
           "--seed", "9", "--batch", "4", "--out", part, "--resume", ck, NULL);
  ASSERT_RUN(st, 2, "resume with another global batch");
  ck_assert_msg(strstr(g_err, "global batch 16") && count_of(g_err, "syncnorm-train: error") == 1,
                "%s", g_err);
  snprintf(ck, sizeof ck, "%s/model.safetensors", full);
  st = run("model_only", 2, COMMON, "--out", part, "--resume", ck, NULL);
  ASSERT_RUN(st, 2, "resume from model.safetensors");
  ck_assert_msg(strstr(g_err, "not a checkpoint.safetensors"), "%s", g_err);
  /* the finished run restarted: nothing to train, exit 0, files unchanged; a run that would end
   * before the checkpoint's step (80 = 2 epochs of 40): refused */
  snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", full);
  st = run("finished", 2, COMMON, "--out", full, "--resume", ck, NULL);
  ASSERT_RUN(st, 0, "resume of a finished run");
  ck_assert_msg(strstr(g_out, "nothing to train"), "%s", g_out);
  snprintf(a, sizeof a, "%s/checkpoint.safetensors", full);
  snprintf(b, sizeof b, "%s/checkpoint.safetensors", part);
  ck_assert_msg(files_equal(a, b), "resuming the finished run changed its checkpoint");
  st = run("past_end", 2, COMMON, "--out", part, "--max-steps", "30", "--resume", ck, NULL);
  ASSERT_RUN(st, 2, "resume past the end of the run");
  ck_assert_msg(strstr(g_err, "past the end") && count_of(g_err, "syncnorm-train: error") == 1,
                "%s", g_err);
  /* refused before anything says it resumed (no "resumed from ... (epoch 3)" ahead of it) */
  ck_assert_msg(strstr(g_out, "resumed from") == NULL, "%s", g_out);
  /* the finished run resumed into a new directory: no plot failure, and the results line lists
   * only the files there (no model was written) */
  char fresh[1024];
  wpath(fresh, sizeof fresh, "finished_elsewhere");
  /* with a curves.png from some earlier run there: not claimed as this run's */
  char stale[2200];
  snprintf(stale, sizeof stale, "mkdir -p '%s' && touch '%s/curves.png'", fresh, fresh);
  ck_assert_int_eq(system(stale), 0);
  st = run("finished_elsewhere", 2, COMMON, "--out", fresh, "--resume", ck, NULL);
  ASSERT_RUN(st, 0, "resume of a finished run into a new --out");
  ck_assert_msg(strstr(g_err, "warning") == NULL, "%s", g_err);
  ck_assert_msg(strstr(g_out, "nothing plotted") && !strstr(g_out, "model.safetensors") &&
                    !strstr(g_out, "curves.png"),
                "%s", g_out);
  /* corrupt trainer.step: refused (a negative step would index before the data order, and a
   * shape [0] tensor would be read past the file's buffer) */
  wpath(b, sizeof b, "negative_step.safetensors");
  write_bad_step(ck, b, -5, 0);
  st = run("negative_step", 2, COMMON, "--out", part, "--resume", b, NULL);
  ASSERT_RUN(st, 2, "resume from a negative step");
  ck_assert_msg(strstr(g_err, "trainer.step is -5") && count_of(g_err, "syncnorm-train: error") == 1,
                "%s", g_err);
  wpath(b, sizeof b, "empty_step.safetensors");
  write_bad_step(ck, b, 0, 1);
  st = run("empty_step", 2, COMMON, "--out", part, "--resume", b, NULL);
  ASSERT_RUN(st, 2, "resume from a shape [0] step");
  ck_assert_msg(strstr(g_err, "not a scalar") && count_of(g_err, "syncnorm-train: error") == 1,
                "%s", g_err);
#undef COMMON
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

/* Writes a plain (uncompressed) IDX file: n images of 28×28 or n labels. */
static void write_idx(const char *dir, const char *name, int images, uint32_t n) {
  char p[1200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  const uint8_t magic[4] = {0, 0, 8, (uint8_t)(images ? 3 : 1)};
  fwrite(magic, 1, 4, f);
  const uint32_t dims[3] = {n, 28, 28};
  for (int d = 0; d < (images ? 3 : 1); d++) {
    const uint8_t be[4] = {(uint8_t)(dims[d] >> 24), (uint8_t)(dims[d] >> 16),
                           (uint8_t)(dims[d] >> 8), (uint8_t)dims[d]};
    fwrite(be, 1, 4, f);
  }
  for (uint32_t i = 0; i < n * (images ? 784u : 1u); i++) fputc((int)(i % 10), f);
  fclose(f);
}

/* Runs the program with the arguments after msg (NULL-terminated by the macro below) and expects
 * exit status 2 with msg in stderr, printed once. */
static void expect_error_(const char *name, int np, const char *msg, ...) {
  va_list ap;
  va_start(ap, msg);
  const int st = vrun(name, np, ap);
  va_end(ap);
  ASSERT_RUN(st, 2, name);
  ck_assert_msg(strstr(g_err, msg), "%s: stderr lacks \"%s\":\n%s", name, msg, g_err);
  ck_assert_msg(count_of(g_err, "syncnorm-train: error") == 1,
                "%s: the error should be printed once:\n%s", name, g_err);
}
#define expect_error(name, np, ...) expect_error_((name), (np), __VA_ARGS__, (const char *)NULL)

START_TEST(test_errors_exit_2) {
  fresh_work_dir();
  char bad[1024], cut[1024], mism[1024], src[1200], cmd[4096];
  /* missing data directory */
  expect_error("missing", 2, "/nonexistent/train-images-idx3-ubyte.gz: cannot open", "--data",
               "/nonexistent", "--epochs", "1");
  /* truncated gzip file (the first 100 kB of the real one) */
  wpath(cut, sizeof cut, "cut");
  snprintf(src, sizeof src, "%s/train-images-idx3-ubyte.gz", g_data);
  snprintf(cmd, sizeof cmd,
           "mkdir -p '%s' && head -c 100000 '%s' > '%s/train-images-idx3-ubyte.gz'", cut, src, cut);
  ck_assert_int_eq(system(cmd), 0);
  expect_error("truncated", 2, "train-images-idx3-ubyte.gz: corrupt or truncated gzip data",
               "--data", cut, "--epochs", "1");
  /* image and label counts differ */
  wpath(mism, sizeof mism, "mismatch");
  ck_assert_int_eq(mkdir(mism, 0755), 0);
  write_idx(mism, "train-images-idx3-ubyte", 1, 50);
  write_idx(mism, "train-labels-idx1-ubyte", 0, 49);
  expect_error("count_mismatch", 2, "has 50 images but", "--data", mism, "--epochs", "1");
  /* wrong magic: labels where the images should be */
  wpath(bad, sizeof bad, "magic");
  ck_assert_int_eq(mkdir(bad, 0755), 0);
  write_idx(bad, "train-images-idx3-ubyte", 0, 50);
  write_idx(bad, "train-labels-idx1-ubyte", 0, 50);
  expect_error("bad_magic", 2, "bad magic", "--data", bad, "--epochs", "1");
  /* fewer training images than one global batch */
  expect_error("tiny_subset", 2, "fewer than one global batch", "--data", g_data,
               "--train-subset", "10");
  /* options */
  expect_error("bad_batch", 2, "invalid value '0' for --batch", "--batch", "0", "--epochs", "1");
  expect_error("bad_lr", 2, "invalid value 'x' for --lr", "--lr", "x", "--epochs", "1");
  /* epochs × steps per epoch beyond 2^63: refused (wrapped into a negative schedule, the run
   * would exit 0 and write no files) */
  expect_error("huge_epochs", 2, "beyond 2^63 steps", "--data", g_data, "--epochs",
               "9223372036854775807");
  /* a batch the host's memory cannot hold: refused (exit 2, one message) instead of the
   * kernel's OOM killer mid-allocation. One rank × 60000 images × ~0.8 MB of buffers = 48 GB:
   * asserted where the host has less (else it would run, or be killed), with one rank so that
   * the refusal does not rest on counting the ranks per host */
  const double host = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  if (host < 45e9)
    expect_error("batch_beyond_memory", 1, "GiB of buffers per rank", "--data", g_data,
                 "--batch", "60000", "--epochs", "1");
  else
    printf("batch_beyond_memory: skipped, this host has %.0f GB\n", host / 1e9);
  /* --eval-batch 65536 where each rank evaluates 5 images: the buffers hold at most a rank's
   * shard of the test set (sized for 65536 images they would take 53 GB per rank) */
  char out_eval[1024];
  wpath(out_eval, sizeof out_eval, "out_eval");
  int st = run("eval_batch_beyond_shard", 2, "--data", g_data, "--train-subset", "40",
               "--test-subset", "10", "--eval-batch", "65536", "--max-steps", "2", "--out",
               out_eval, NULL);
  ASSERT_RUN(st, 0, "--eval-batch 65536");
  st = run("unknown_option", 2, "--bogus", NULL);
  ASSERT_RUN(st, 2, "unknown option");
  expect_error("resume_missing", 2, "--resume /nonexistent.safetensors", "--data", g_data,
               "--resume", "/nonexistent.safetensors");
  expect_error("bad_out", 2, "cannot create directory", "--data", g_data, "--out",
               "/dev/null/x");
  /* dump paths checked before training (a bad one found only at the dump would abort every
   * rank, exit 1, after the first step) */
  char out[1024];
  wpath(out, sizeof out, "out_dump");
  expect_error("bad_dump_first", 2, "--dump-first-step /nonexistent/first.safetensors: directory",
               "--data", g_data, "--epochs", "1", "--out", out, "--dump-first-step",
               "/nonexistent/first.safetensors");
  expect_error("dump_first_is_dir", 2, "is a directory", "--data", g_data, "--epochs", "1",
               "--out", out, "--dump-first-step", g_work);
  expect_error("bad_dump_rank", 2, "--dump-rank-state /nonexistent/s.rank", "--data", g_data,
               "--epochs", "1", "--out", out, "--dump-rank-state", "/nonexistent/s");
  /* checked before --out is made: nothing left behind, neither --out nor metrics.csv */
  struct stat sb;
  ck_assert_msg(stat(out, &sb) != 0, "%s exists after the refused runs", out);
  /* seeds out of range or with spaces: refused, not clamped to 2^64-1 silently */
  expect_error("seed_range", 2, "invalid value '99999999999999999999' for --seed", "--seed",
               "99999999999999999999", "--epochs", "1");
  expect_error("seed_space", 2, "for --seed", "--seed", " 1", "--epochs", "1");
  expect_error("epochs_space", 2, "for --epochs", "--epochs", " 1");
  /* a bad SN_COMM_TIMEOUT_S: bad usage (exit 2, one message), not an MPI abort */
  const char *outer = getenv("SN_COMM_TIMEOUT_S"); /* restored after */
  char saved[256] = "";
  if (outer != NULL) snprintf(saved, sizeof saved, "%s", outer);
  ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", "5m", 1), 0);
  expect_error("bad_timeout_env", 2, "environment: SN_COMM_TIMEOUT_S='5m'", "--data", g_data,
               "--epochs", "1", "--out", out);
  ck_assert_msg(strstr(g_err, "sn_comm_create_self") == NULL, /* a call the user never made */
                "bad_timeout_env names the probe: %s", g_err);
  if (outer != NULL) ck_assert_int_eq(setenv("SN_COMM_TIMEOUT_S", saved, 1), 0);
  else ck_assert_int_eq(unsetenv("SN_COMM_TIMEOUT_S"), 0);
  st = run("help", 1, "--help", NULL);
  ASSERT_RUN(st, 0, "--help");
  ck_assert_msg(strstr(g_out, "--dump-first-step") && strstr(g_out, "--no-sync-bn"), "%s", g_out);
}
END_TEST

int main(int argc, char **argv) {
  if (argc < 8) {
    fprintf(stderr, "usage: %s PROG DATA WORK MPIEXEC NPFLAG NPRE PRE... NPOST POST...\n",
            argv[0]);
    return 2;
  }
  g_prog = argv[1], g_data = argv[2], g_work = argv[3], g_mpiexec = argv[4];
  g_npflag = argv[5];
  g_npre = atoi(argv[6]);
  g_pre = argv + 7;
  if (7 + g_npre >= argc) return 2;
  g_npost = atoi(argv[7 + g_npre]);
  g_post = argv + 8 + g_npre;
  struct stat st;
  char probe[2048];
  snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", g_data);
  if (stat(probe, &st) != 0) {
    printf("skipped: Fashion-MNIST not found in %s (apt-get install dataset-fashion-mnist)\n",
           g_data);
    return 77;
  }
  Suite *s = suite_create("train_run");
  struct { const char *name; const TTest *test; } cases[] = {
      {"short", test_short_run}, {"equivalence", test_sync_equivalence},
      {"resume", test_resume_is_exact}, {"errors", test_errors_exit_2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TCase *tc = tcase_create(cases[i].name);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, cases[i].test);
    suite_add_tcase(s, tc);
  }
  return tu_run_suite(s);
}
