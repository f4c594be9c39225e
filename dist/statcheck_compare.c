/*
 * statcheck_compare.c — `syncnorm-statcheck --compare FILE|DIR|GLOB...`: compares the BatchNorm
 * state that the ranks of a job saved, one safetensors file per rank, with PyTorch state_dict
 * keys (syncnorm's sn_syncbn_save, syncnorm.torch.save_state_dict, or any safetensors file).
 *
 * A BatchNorm layer is a prefix P with a tensor "P.running_mean" (or a bare "running_mean");
 * its running_mean, running_var and num_batches_tracked (and weight, bias with --params) are
 * compared across the files. The files are grouped by the exact bytes of each tensor: one group
 * is agreement; otherwise the largest group is the reference, and the report gives the largest
 * absolute and relative difference from it, the channel where it is, and the files (ranks) in
 * the other groups. A tensor present in some files only is reported too. Exit status: 0 when
 * every tensor agrees within --tol (relative; default 0: bitwise), 1 otherwise, 2 on bad input
 * (an unreadable or malformed file: the loader's error). No MPI: a plain process.
 */
#include <dirent.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "statcheck.h"
#include "syncnorm_dist.h"

enum { K_MEAN, K_VAR, K_NBT, K_WEIGHT, K_BIAS, KINDS };
static const char *const kind_name[KINDS] = {"running_mean", "running_var",
                                             "num_batches_tracked", "weight", "bias"};

typedef struct {
  char **v;
  int n, cap;
} strs_t;

static int push(strs_t *s, const char *str) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 16;
    char **v = realloc(s->v, (size_t)cap * sizeof *v);
    if (v == NULL) return 0;
    s->v = v, s->cap = cap;
  }
  s->v[s->n] = strdup(str);
  return s->v[s->n++] != NULL;
}

static int has(const strs_t *s, const char *str) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->v[i], str) == 0) return 1;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files named by one argument: a directory's *.safetensors (sorted), a glob's matches
 * (sorted by glob), or the path itself. 0 where a directory or pattern yields none. */
static int expand(const char *arg, strs_t *files) {
  struct stat st;
  if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
    DIR *d = opendir(arg);
    if (d == NULL) return 0;
    strs_t found = {0};
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      size_t len = strlen(e->d_name);
      if (len > 12 && strcmp(e->d_name + len - 12, ".safetensors") == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", arg, e->d_name);
        if (!push(&found, path)) break;
      }
    }
    closedir(d);
    qsort(found.v, (size_t)found.n, sizeof *found.v, by_name);
    for (int i = 0; i < found.n; i++) push(files, found.v[i]), free(found.v[i]);
    free(found.v);
    return found.n > 0;
  }
  if (strpbrk(arg, "*?[") != NULL) {
    glob_t g;
    if (glob(arg, 0, NULL, &g) != 0) return 0;
    for (size_t i = 0; i < g.gl_pathc; i++) push(files, g.gl_pathv[i]);
    globfree(&g);
    return 1;
  }
  return push(files, arg);
}

/* Element i of a tensor as a double (F32, F64, BF16, F16, I64), from its unaligned bytes. */
static double value(const sn_tensor_t *t, int64_t i) {
  const unsigned char *p = t->data;
  if (t->is_i64) {
    int64_t v;
    memcpy(&v, p + 8 * i, 8);
    return (double)v;
  }
  switch (t->dtype) {
    case SN_DTYPE_F32: {
      float v;
      memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case SN_DTYPE_F64: {
      double v;
      memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case SN_DTYPE_BF16: {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      uint32_t u = (uint32_t)h << 16;
      float v;
      memcpy(&v, &u, 4);
      return v;
    }
    default: {
      _Float16 v;
      memcpy(&v, p + 2 * i, 2);
      return (double)v;
    }
  }
}

static int64_t numel(const sn_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

static int64_t bytes_of(const sn_tensor_t *t) {
  return numel(t) * (t->is_i64 ? 8 : sn_dtype_size(t->dtype));
}

/* Whether two tensors have the same dtype, shape and bytes. */
static int same(const sn_tensor_t *a, const sn_tensor_t *b) {
  if (a->is_i64 != b->is_i64 || (!a->is_i64 && a->dtype != b->dtype) || a->ndim != b->ndim)
    return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return memcmp(a->data, b->data, (size_t)bytes_of(a)) == 0;
}

/* The files' names, numbered ("file 1 (r1.safetensors)"), into out for the indices where
 * mark[i] is set. */
static void name_files(char *out, size_t size, const strs_t *files, const int *mark) {
  int len = 0, shown = 0;
  out[0] = '\0';
  for (int i = 0; i < files->n && len < (int)size; i++)
    if (mark[i]) {
      const char *base = strrchr(files->v[i], '/');
      len += snprintf(out + len, size - (size_t)len, "%s%d (%s)", shown++ ? ", " : "", i,
                      base ? base + 1 : files->v[i]);
    }
}

/* Compares one tensor across the files (t[i].data NULL: absent from file i); returns 1 where it
 * agrees within tol. */
static int compare_tensor(int kind, const sn_tensor_t *t, int nfiles, const strs_t *files,
                          double tol) {
  int *group = calloc((size_t)nfiles, sizeof *group), *mark = calloc((size_t)nfiles, sizeof *mark);
  char who[2048];
  int ok = 1, present = 0;
  for (int i = 0; i < nfiles; i++) present += t[i].data != NULL, mark[i] = t[i].data == NULL;
  if (present == 0) goto done;
  if (present < nfiles) {
    name_files(who, sizeof who, files, mark);
    printf("  %-20s MISSING in file%s %s\n", kind_name[kind], nfiles - present > 1 ? "s" : "",
           who);
    ok = 0;
  }
  /* groups of identical tensors; the largest is the reference */
  int groups = 0, best = -1, best_size = 0;
  for (int i = 0; i < nfiles; i++) {
    if (t[i].data == NULL) continue;
    group[i] = -1;
    for (int j = 0; j < i && group[i] < 0; j++)
      if (t[j].data != NULL && same(&t[i], &t[j])) group[i] = group[j];
    if (group[i] < 0) group[i] = groups++;
  }
  for (int g = 0; g < groups; g++) {
    int size = 0, first = -1;
    for (int i = 0; i < nfiles; i++)
      if (t[i].data != NULL && group[i] == g) size++, first = first < 0 ? i : first;
    if (size > best_size) best_size = size, best = first;
  }
  if (groups <= 1) {
    if (present == nfiles) printf("  %-20s bitwise identical in all %d files\n", kind_name[kind],
                                  nfiles);
    goto done;
  }
  const sn_tensor_t *ref = &t[best];
  double max_abs = 0.0, max_rel = 0.0;
  int64_t worst = -1;
  int shape_differs = 0;
  for (int i = 0; i < nfiles; i++) {
    mark[i] = t[i].data != NULL && group[i] != group[best];
    if (!mark[i]) continue;
    if (numel(&t[i]) != numel(ref) || t[i].ndim != ref->ndim || t[i].is_i64 != ref->is_i64 ||
        (!ref->is_i64 && t[i].dtype != ref->dtype)) {
      shape_differs = 1;
      continue;
    }
    for (int64_t c = 0; c < numel(ref); c++) {
      const double a = value(&t[i], c), b = value(ref, c);
      double d = fabs(a - b);
      if (isnan(d)) d = INFINITY; /* a NaN against a number (NaN against NaN: the same bytes) */
      const double r = d / fmax(fabs(b), 1e-300);
      if (worst < 0 || d > max_abs) max_abs = d, worst = c;
      if (r > max_rel) max_rel = r;
    }
  }
  name_files(who, sizeof who, files, mark);
  /* bitwise (tol 0): any other bytes differ, also another dtype of equal values, or -0 and 0 */
  const int within = !shape_differs && tol > 0 && max_rel <= tol;
  if (shape_differs)
    printf("  %-20s DIFFERS: another dtype or shape in file(s) %s than in the other %d\n",
           kind_name[kind], who, best_size);
  else
    printf("  %-20s %s: max abs %.3e, max rel %.3e, worst at %s %lld; file(s) %s differ from "
           "the other %d\n",
           kind_name[kind], within ? "within tolerance" : "DIFFERS", max_abs, max_rel,
           numel(ref) > 1 ? "channel" : "element", (long long)worst, who, best_size);
  ok &= within;
done:
  free(group), free(mark);
  return ok;
}

int statcheck_compare(int argc, char **argv) {
  double tol = 0.0;
  int params = 0;
  strs_t files = {0};
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--compare") == 0) continue;
    if (strcmp(argv[i], "--params") == 0) {
      params = 1;
    } else if (strcmp(argv[i], "--tol") == 0 || strncmp(argv[i], "--tol=", 6) == 0) {
      const char *v = argv[i][5] == '=' ? argv[i] + 6 : (i + 1 < argc ? argv[++i] : "");
      char *end;
      tol = strtod(v, &end);
      if (!*v || *end || !(tol >= 0)) {
        fprintf(stderr, "syncnorm-statcheck: invalid value '%s' for --tol\n", v);
        return 2;
      }
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      fprintf(stderr, "syncnorm-statcheck --compare: unknown option '%s' (--tol, --params)\n",
              argv[i]);
      return 2;
    } else if (!expand(argv[i], &files)) {
      fprintf(stderr, "syncnorm-statcheck --compare: '%s' names no .safetensors file\n", argv[i]);
      return 2;
    }
  }
  if (files.n < 2) {
    fprintf(stderr, "syncnorm-statcheck --compare: needs the files of at least two ranks, got "
                    "%d\n", files.n);
    return 2;
  }
  sn_safetensors_t **loaded = calloc((size_t)files.n, sizeof *loaded);
  int rc = 0;
  for (int i = 0; i < files.n && rc == 0; i++) {
    const sn_status_t st = sn_safetensors_load(&loaded[i], files.v[i]);
    if (st != SN_OK) {
      fprintf(stderr, "syncnorm-statcheck --compare: %s: %s: %s\n", files.v[i],
              sn_status_string(st), sn_last_error());
      rc = 2;
    }
  }
  /* the layers: every prefix with a running_mean in any file, in first-seen order */
  strs_t layers = {0};
  for (int i = 0; i < files.n && rc == 0; i++)
    for (int64_t k = 0; k < sn_safetensors_count(loaded[i]); k++) {
      const char *name = sn_safetensors_name(loaded[i], k);
      const size_t len = strlen(name), suf = strlen("running_mean");
      if (len < suf || strcmp(name + len - suf, "running_mean") != 0) continue;
      if (len > suf && name[len - suf - 1] != '.') continue;
      char prefix[512];
      snprintf(prefix, sizeof prefix, "%.*s", (int)(len > suf ? len - suf - 1 : 0), name);
      if (!has(&layers, prefix)) push(&layers, prefix);
    }
  int differ = 0;
  if (rc == 0) {
    printf("syncnorm-statcheck --compare: %d files, %d BatchNorm layers, tolerance %s\n",
           files.n, layers.n, tol > 0 ? "relative" : "0 (bitwise)");
    if (tol > 0) printf("  (relative tolerance %.3e)\n", tol);
    for (int i = 0; i < files.n; i++) printf("  file %d: %s\n", i, files.v[i]);
  }
  if (rc == 0 && layers.n == 0) {
    fprintf(stderr, "syncnorm-statcheck --compare: no BatchNorm layer (no tensor named "
                    "*running_mean) in any of the files\n");
    rc = 2;
  }
  sn_tensor_t *t = calloc((size_t)files.n, sizeof *t);
  for (int l = 0; l < layers.n && rc == 0; l++) {
    int ok = 1, headed = 0;
    for (int kind = 0; kind < (params ? KINDS : K_WEIGHT); kind++) {
      char name[600];
      snprintf(name, sizeof name, "%s%s%s", layers.v[l], layers.v[l][0] ? "." : "",
               kind_name[kind]);
      for (int i = 0; i < files.n; i++) {
        memset(&t[i], 0, sizeof t[i]);
        const sn_status_t st = sn_safetensors_get(loaded[i], &t[i], name);
        if (st == SN_ERR_INVALID_DTYPE) {
          fprintf(stderr, "syncnorm-statcheck --compare: %s: %s\n", files.v[i], sn_last_error());
          rc = 2;
        }
        if (st != SN_OK) t[i].data = NULL;
      }
      if (rc != 0) break;
      if (!headed) printf("layer '%s':\n", layers.v[l]), headed = 1;
      ok &= compare_tensor(kind, t, files.n, &files, tol);
    }
    differ += !ok;
  }
  if (rc == 0) {
    printf("%s: %d of %d layers %s\n", differ ? "FAIL" : "PASS", differ ? differ : layers.n,
           layers.n, differ ? "differ across the files" : "agree across the files");
    rc = differ ? 1 : 0;
  }
  for (int i = 0; i < files.n; i++) sn_safetensors_free(loaded[i]), free(files.v[i]);
  for (int l = 0; l < layers.n; l++) free(layers.v[l]);
  free(loaded), free(files.v), free(layers.v), free(t);
  return rc;
}
