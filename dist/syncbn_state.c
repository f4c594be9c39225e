/*
 * syncbn_state.c — a SyncBatchNorm layer's state as PyTorch state_dict tensors, saved to and
 * loaded from safetensors files (keys "<prefix>.weight", ".bias", ".running_mean",
 * ".running_var" as F32 [C], ".num_batches_tracked" as an I64 scalar — torch.nn.BatchNorm2d's).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_internal.h"

#define SN_MAX_PREFIX 200

enum { T_WEIGHT, T_BIAS, T_RMEAN, T_RVAR, T_NBT, T_COUNT };
static const char *const suffix[T_COUNT] = {"weight", "bias", "running_mean", "running_var",
                                            "num_batches_tracked"};

/* Which tensors this layer's config has. */
static int has_tensor(const sn_syncbn_t *bn, int k) {
  return k <= T_BIAS ? bn->cfg.affine : bn->cfg.track_running_stats;
}

static sn_status_t check_prefix(const char *fn, const char *prefix) {
  SN_TRY(sn__check_ptr(fn, "prefix", prefix));
  if (strnlen(prefix, SN_MAX_PREFIX + 1) > SN_MAX_PREFIX)
    return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: prefix longer than %d bytes", fn, SN_MAX_PREFIX);
  return SN_OK;
}

/* "<prefix>.<suffix>", or "<suffix>" for an empty prefix (a bare module's state_dict). */
static void tensor_name(char *out, size_t size, const char *prefix, int k) {
  snprintf(out, size, "%s%s%s", prefix, prefix[0] ? "." : "", suffix[k]);
}

sn_status_t sn_syncbn_state_tensors(sn_syncbn_t *bn, sn_tensor_t out[5], int *count,
                                    const char *prefix) {
  const char *fn = "sn_syncbn_state_tensors";
  SN_TRY(sn__syncbn_check(fn, bn));
  SN_TRY(check_prefix(fn, prefix));
  SN_TRY(sn__check_ptr(fn, "out", out));
  SN_TRY(sn__check_ptr(fn, "count", count));
  /* a device layer's state is copied to its host mirror (waits for the stream): a snapshot */
  SN_TRY(bn->mem->to_host(bn));
  const void *data[T_COUNT] = {bn->weight, bn->bias, bn->running_mean, bn->running_var,
                               &bn->num_batches_tracked};
  int n = 0;
  for (int k = 0; k < T_COUNT; k++) {
    if (!has_tensor(bn, k)) continue;
    tensor_name(bn->tensor_names[k], sizeof bn->tensor_names[k], prefix, k);
    sn_tensor_t t;
    memset(&t, 0, sizeof t);
    t.name = bn->tensor_names[k];
    t.dtype = SN_DTYPE_F32;
    t.is_i64 = k == T_NBT;
    t.ndim = k == T_NBT ? 0 : 1;
    t.shape[0] = bn->C;
    t.data = data[k];
    out[n++] = t;
  }
  *count = n;
  return SN_OK;
}

/* Finds and validates every tensor the layer needs; found[k] is filled for each. */
static sn_status_t lookup_state(const char *fn, const sn_syncbn_t *bn, const sn_safetensors_t *file,
                                const char *prefix, sn_tensor_t found[T_COUNT]) {
  for (int k = 0; k < T_COUNT; k++) {
    if (!has_tensor(bn, k)) continue;
    char name[SN_MAX_PREFIX + 32];
    tensor_name(name, sizeof name, prefix, k);
    sn_tensor_t t;
    const sn_status_t got = sn_safetensors_get(file, &t, name);
    if (got == SN_ERR_INVALID_DTYPE) /* there, of a dtype the layer cannot take */
      return sn__fail_prefix(SN_ERR_FORMAT, "%s: %s", fn, bn->label);
    if (got != SN_OK)
      return sn__fail(SN_ERR_NOT_FOUND, "%s: %s: the checkpoint has no tensor '%s'", fn, bn->label, name);
    if (k == T_NBT) {
      int scalar = t.ndim == 0 || (t.ndim == 1 && t.shape[0] == 1);
      if (!t.is_i64 || !scalar)
        return sn__fail(SN_ERR_FORMAT, "%s: '%s' must be an I64 scalar", fn, name);
      int64_t nbt;
      memcpy(&nbt, t.data, sizeof nbt); /* the file's bytes: not necessarily aligned */
      if (nbt < 0) /* momentum=None divides by it: 1/0 or a negative factor */
        return sn__fail(SN_ERR_FORMAT, "%s: '%s' is %lld, must be >= 0", fn, name, (long long)nbt);
    } else if (t.is_i64 || t.dtype != SN_DTYPE_F32 || t.ndim != 1 || t.shape[0] != bn->C) {
      return sn__fail(SN_ERR_FORMAT, "%s: '%s' must be F32 of shape [%lld] (C of %s)", fn, name,
                      (long long)bn->C, bn->label);
    } else if (k == T_RVAR) {
      for (int64_t c = 0; c < bn->C; c++) {
        float v;
        memcpy(&v, (const char *)t.data + c * (int64_t)sizeof v, sizeof v); /* unaligned bytes */
        if (v < 0.0f) /* eval mode would divide by √(negative + eps) */
          return sn__fail(SN_ERR_FORMAT, "%s: '%s'[%lld] is %g; a variance must be >= 0", fn,
                          name, (long long)c, (double)v);
      }
    }
    found[k] = t;
  }
  return SN_OK;
}

/* Copies validated tensors into the layer; the pivot restarts from the loaded running mean. A
 * device layer's are then uploaded (its only failure: a CUDA error), its pivot set to 0 (never
 * seeded from rank-local values: see syncbn_device.c). */
static sn_status_t commit_state(sn_syncbn_t *bn, const sn_tensor_t found[T_COUNT]) {
  float *dst[T_RVAR + 1] = {bn->weight, bn->bias, bn->running_mean, bn->running_var};
  for (int k = 0; k <= T_RVAR; k++)
    if (has_tensor(bn, k)) memcpy(dst[k], found[k].data, (size_t)bn->C * sizeof(float));
  if (has_tensor(bn, T_NBT)) memcpy(&bn->num_batches_tracked, found[T_NBT].data, sizeof(int64_t));
  if (bn->cfg.track_running_stats) memcpy(bn->pivot, bn->running_mean, (size_t)bn->C * sizeof(float));
  bn->saved.valid = 0;
  return bn->mem->from_host(bn);
}

sn_status_t sn_syncbn_load_state(sn_syncbn_t *bn, const sn_safetensors_t *file,
                                 const char *prefix) {
  const char *fn = "sn_syncbn_load_state";
  SN_TRY(sn__syncbn_check(fn, bn));
  SN_TRY(sn__check_ptr(fn, "file", file));
  SN_TRY(check_prefix(fn, prefix));
  sn_tensor_t found[T_COUNT];
  SN_TRY(lookup_state(fn, bn, file, prefix, found));
  return commit_state(bn, found);
}

static sn_status_t check_layers(const char *fn, sn_syncbn_t *const *layers,
                                const char *const *prefixes, int64_t count) {
  SN_TRY(sn__check_size(fn, "count", count, 0));
  if (count > 0) {
    SN_TRY(sn__check_ptr(fn, "layers", layers));
    SN_TRY(sn__check_ptr(fn, "prefixes", prefixes));
  }
  for (int64_t i = 0; i < count; i++) {
    SN_TRY(sn__syncbn_check(fn, layers[i]));
    SN_TRY(check_prefix(fn, prefixes[i]));
  }
  /* one prefix per layer: a save names the tensors after it, and a load under two would leave
   * the layer with whichever came last */
  for (int64_t i = 0; i < count; i++)
    for (int64_t j = 0; j < i; j++)
      if (layers[j] == layers[i])
        return sn__fail(SN_ERR_INVALID_ARGUMENT,
                        "%s: layers[%lld] and layers[%lld] are the same layer ('%s', '%s'); "
                        "give each layer once", fn, (long long)j, (long long)i, prefixes[j],
                        prefixes[i]);
  return SN_OK;
}

sn_status_t sn_syncbn_save(const char *path, sn_syncbn_t *const *layers,
                           const char *const *prefixes, int64_t count) {
  const char *fn = "sn_syncbn_save";
  SN_TRY(sn__check_ptr(fn, "path", path));
  SN_TRY(check_layers(fn, layers, prefixes, count));
  sn_tensor_t *all = malloc((size_t)(count > 0 ? count : 1) * T_COUNT * sizeof *all);
  if (all == NULL) return sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  int64_t total = 0;
  sn_status_t st = SN_OK;
  for (int64_t i = 0; i < count && st == SN_OK; i++) {
    int n = 0;
    st = sn_syncbn_state_tensors(layers[i], all + total, &n, prefixes[i]);
    total += n;
  }
  if (st == SN_OK) st = sn_safetensors_save(path, all, total);
  free(all);
  return st;
}

sn_status_t sn_syncbn_load(const char *path, sn_syncbn_t *const *layers,
                           const char *const *prefixes, int64_t count) {
  const char *fn = "sn_syncbn_load";
  SN_TRY(sn__check_ptr(fn, "path", path));
  SN_TRY(check_layers(fn, layers, prefixes, count));
  sn_safetensors_t *file = NULL;
  SN_TRY(sn_safetensors_load(&file, path));
  sn_tensor_t(*found)[T_COUNT] = malloc((size_t)(count > 0 ? count : 1) * sizeof *found);
  sn_status_t st = found ? SN_OK : sn__fail(SN_ERR_ALLOC, "%s: out of memory", fn);
  for (int64_t i = 0; i < count && st == SN_OK; i++) /* all or nothing: validate every layer first */
    st = lookup_state(fn, layers[i], file, prefixes[i], found[i]);
  for (int64_t i = 0; i < count && st == SN_OK; i++) st = commit_state(layers[i], found[i]);
  free(found);
  sn_safetensors_free(file);
  return st;
}
