/*
 * fuzz_syncbn.c — the SyncBatchNorm operation of the fuzz_kernels target: a layer created from a
 * fuzzed config (sn_syncbn_create with comm NULL or "self"), then a sequence of forward and
 * backward calls with fuzzed shapes, NULLs, in-place use and data. Beyond the argument checks
 * it holds the layer to its documented behaviour: an error changes no buffer, parameter,
 * gradient or running statistic; a training forward of finite data gives finite outputs
 * (|x̂| ≤ √count); backward needs a successful forward of the same shape; num_batches_tracked
 * and the running statistics move only with a training forward.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_call.h"

/* ---- SyncBatchNorm --------------------------------------------------------------------------------- */

static float pick_momentum(fz_t *in) {
  static const float menu[12] = {0.1f, 0.0f, 1.0f, -1.0f, 0.5f, -0.0f, NAN, -0.1f, 1.0000001f, INFINITY,
                                 -INFINITY, -1.0000001f};
  const uint8_t b = fz_u8(in);
  if (g_tame) return menu[b % 6];
  if (b < 240) return menu[b % 12];
  return bits_f32(fz_u32(in));
}

static int pick_flag(fz_t *in) {
  const uint8_t b = fz_u8(in);
  if (g_tame) return b & 1;
  if (b < 240) return b & 1;
  return (int)fz_u32(in);
}

static int momentum_ok(float m) { return m == SN_MOMENTUM_CUMULATIVE || (m >= 0.0f && m <= 1.0f); }
static int flag_ok(int f) { return f == 0 || f == 1; }

/* The layer's parameter, gradient and statistic arrays and num_batches_tracked, concatenated. */
typedef struct {
  float *v; /* [6C] */
  int64_t nbt;
} bn_state_t;

static void bn_snapshot(sn_syncbn_t *bn, int64_t C, bn_state_t *s) {
  sn_syncbn_params_t p;
  FUZZ_CHECK(sn_syncbn_params(bn, &p) == SN_OK, "params: %s", sn_last_error());
  FUZZ_CHECK(p.num_features == C, "num_features %lld", (long long)p.num_features);
  float *src[6] = {p.weight, p.bias, p.grad_weight, p.grad_bias, p.running_mean, p.running_var};
  for (int k = 0; k < 6; k++) {
    if (src[k]) memcpy(s->v + k * C, src[k], (size_t)C * sizeof(float));
    else memset(s->v + k * C, 0, (size_t)C * sizeof(float));
  }
  s->nbt = p.num_batches_tracked ? *p.num_batches_tracked : -1;
}

static int all_finite_act(const void *buf, int64_t n, int dtype) {
  for (int64_t i = 0; i < n; i++) {
    if (dtype == SN_DTYPE_F32) {
      if (!isfinite(((const float *)buf)[i])) return 0;
    } else {
      const uint16_t h = ((const uint16_t *)buf)[i];
      if (dtype == SN_DTYPE_BF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u) return 0;
    }
  }
  return 1;
}

/* All |x| <= 1e37: then x − mean cannot overflow f32 (which the f32 apply map does for values
 * of opposite sign near FLT_MAX; see docs/RELIABILITY.md, fuzzing). */
static int all_moderate_act(const void *buf, int64_t n, int dtype) {
  for (int64_t i = 0; i < n; i++) {
    if (dtype == SN_DTYPE_F32) {
      if (!(fabsf(((const float *)buf)[i]) <= 1e37f)) return 0;
    } else if (dtype == SN_DTYPE_BF16) {
      const uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
      if (!(fabsf(bits_f32(u)) <= 1e37f)) return 0;
    } else if ((((const uint16_t *)buf)[i] & 0x7c00u) == 0x7c00u) {
      return 0;
    }
  }
  return 1;
}

void fuzz_op_syncbn(fz_t *in) {
  const int64_t C = pick_size(in);
  sn_syncbn_config_t cfg = sn_syncbn_default_config(C);
  const uint8_t mut = fz_u8(in), mut2 = fz_u8(in);
  if (mut & 1) cfg.eps = pick_eps(in);
  if (mut & 2) cfg.momentum = pick_momentum(in);
  if (mut & 4) cfg.affine = pick_flag(in);
  if (mut & 8) cfg.track_running_stats = pick_flag(in);
  if (mut & 16) cfg.check_consistency = pick_flag(in);
  if (mut & 32) cfg.check_finite = pick_flag(in);
  if (mut & 64) cfg.layout = (sn_layout_t)pick_layout(in);
  if (mut & 128) cfg.dtype = (sn_dtype_t)pick_dtype(in);
  if (mut2 & 1) cfg.device_memory = pick_flag(in);
  if (mut2 & 2) cfg.layer_id = pick_size(in);
  if (mut2 & 4) { /* name: terminated at a fuzzed place, or not at all */
    const uint8_t end = fz_u8(in);
    for (size_t i = 0; i < sizeof cfg.name; i++) cfg.name[i] = (char)(fz_u8(in) | 1);
    if (end < sizeof cfg.name) cfg.name[end] = '\0';
  }
  sn_comm_t *comm = (mut2 & 8) ? self_comm() : NULL;
  const int null_out = (mut2 & 0x70) == 0x70, null_cfg = (mut2 & 0xf0) == 0x80;

  uint32_t errs = 0;
  if (null_out || null_cfg) errs |= ERR(SN_ERR_NULL_POINTER);
  if (C < 1) errs |= ERR(SN_ERR_INVALID_SIZE);
  if (C > INT64_MAX / 64) errs |= ERR(SN_ERR_OVERFLOW);
  if (!eps_ok(cfg.eps)) errs |= ERR(SN_ERR_INVALID_EPS);
  if (!momentum_ok(cfg.momentum) || !flag_ok(cfg.affine) || !flag_ok(cfg.track_running_stats) ||
      !flag_ok(cfg.check_consistency) || !flag_ok(cfg.check_finite) || cfg.layer_id < -1 ||
      memchr(cfg.name, '\0', sizeof cfg.name) == NULL)
    errs |= ERR(SN_ERR_INVALID_ARGUMENT);
  if (!layout_ok(cfg.layout)) errs |= ERR(SN_ERR_INVALID_LAYOUT);
  if (!dtype_ok(cfg.dtype)) errs |= ERR(SN_ERR_INVALID_DTYPE);
  /* the harness links libsyncnorm alone: no device kernels are registered */
  if (cfg.device_memory != 0) errs |= ERR(SN_ERR_UNSUPPORTED);

  sn_syncbn_t *const sentinel = (sn_syncbn_t *)&errs;
  sn_syncbn_t *bn = sentinel;
  if (errs == 0 && C > CAP_ELEMS) return; /* valid but too large for this harness */
  sn_status_t st = sn_syncbn_create(null_out ? NULL : &bn, null_cfg ? NULL : &cfg, comm);
  count_call("sn_syncbn_create", st);
  if (errs != 0) {
    FUZZ_CHECK(st != SN_OK && (errs & ERR(st)), "sn_syncbn_create: %s, expected bits 0x%x (%s)",
               sn_status_string(st), errs, sn_last_error());
    FUZZ_CHECK(bn == sentinel, "a failed sn_syncbn_create wrote *bn");
    FUZZ_CHECK(strncmp(sn_last_error(), "sn_syncbn_create", 16) == 0, "message '%s'", sn_last_error());
    return;
  }
  FUZZ_CHECK(st == SN_OK, "sn_syncbn_create rejected a valid config: %s", sn_last_error());
  if (fz_debug())
    fprintf(stderr, "syncbn C=%lld eps=%g momentum=%g affine=%d track=%d consistency=%d finite=%d layout=%d dtype=%d comm=%s\n",
            (long long)C, (double)cfg.eps, (double)cfg.momentum, cfg.affine, cfg.track_running_stats,
            cfg.check_consistency, cfg.check_finite, (int)cfg.layout, (int)cfg.dtype, comm ? "self" : "NULL");

  const int dtype = cfg.dtype;
  const size_t es = (size_t)sn_dtype_size(cfg.dtype);
  bn_state_t before, after;
  before.v = malloc((size_t)(6 * C) * sizeof(float));
  after.v = malloc((size_t)(6 * C) * sizeof(float));
  FUZZ_CHECK(before.v && after.v, "out of memory");
  int fwd_valid = 0; /* the layer holds a successful forward (backward allowed) */
  int64_t fwd_n = -1, fwd_s = -1, fwd_count = -1;
  int fwd_batch = 0;

  /* an invalid handle: a zeroed block is no live layer */
  void *fake = calloc(1, 4096);
  FUZZ_CHECK(fake != NULL, "out of memory");
  float one[2] = {1.0f, 2.0f};
  FUZZ_CHECK(sn_syncbn_forward((sn_syncbn_t *)fake, one, one, 1, 1, 0) == SN_ERR_INVALID_HANDLE, "fake handle");
  FUZZ_CHECK(sn_syncbn_forward(NULL, one, one, 1, 1, 0) == SN_ERR_NULL_POINTER, "NULL handle");
  free(fake);

  for (int step = 0; step < 8 && in->n > 0; step++) {
    const uint8_t op = fz_u8(in);
    const int backward = op & 1;
    const int training = (op & 2) ? 1 : (op & 4) ? pick_flag(in) : 0;
    const int same_shape = backward && (op & 8) && fwd_n >= 0;
    const int64_t n = same_shape ? fwd_n : pick_size(in), s = same_shape ? fwd_s : pick_size(in);
    int64_t ns = 0, total = 0;
    uint32_t e = 0; /* failures of the argument checks */
    int64_t nc = 0;
    if (n < 0 || s < 0) e |= ERR(SN_ERR_INVALID_SIZE);
    else if (!mul_ok(n, C, &nc) || !mul_ok(nc, s, &total)) e |= ERR(SN_ERR_OVERFLOW); /* n·C is a product too */
    else ns = n * s;
    const int sizes_ok = e == 0;
    const uint8_t nulls = fz_u8(in);
    const uint8_t nm = g_tame ? 0x1f : 0x07; /* tame: one in 32 per pointer */
    const int null_a = (nulls & nm) == 0, null_b = ((nulls >> 1) & nm) == 0, null_c = ((nulls >> 2) & nm) == 0;
    if ((null_a || null_b || (backward && null_c)) && !(sizes_ok && total == 0)) e |= ERR(SN_ERR_NULL_POINTER);
    if (e == 0 && total > CAP_ELEMS) continue; /* valid but too large for this harness */
    const size_t bytes = sizes_ok && total <= CAP_ELEMS ? (size_t)total * es : (size_t)(nulls & 15);

    /* buffers: forward a = x (in), b = y (out); backward a = dy (in), b = x (in), c = dx (out) */
    call_t c; /* for the data generator only */
    call_init(&c, "", dtype, 1, 0);
    c.data_mode = fz_u8(in) & 7;
    c.seed = fz_u32(in);
    const int inplace = (fz_u8(in) & 3) == 0; /* y = x, dx = dy */
    arg_t buf[3];
    for (int k = 0; k < 3; k++) {
      memset(&buf[k], 0, sizeof buf[k]);
      buf[k].type = T_ACT;
      buf[k].esize = es;
      buf[k].bytes = bytes;
      buf[k].role = (k == 1 && !backward) || k == 2 ? OUT : IN;
      buf[k].p = malloc(bytes > 0 ? bytes : 1);
      FUZZ_CHECK(buf[k].p != NULL, "out of memory");
      fill(&c, &buf[k], k, in);
      buf[k].snap = malloc(bytes > 0 ? bytes : 1);
      FUZZ_CHECK(buf[k].snap != NULL, "out of memory");
      memcpy(buf[k].snap, buf[k].p, bytes);
    }
    const int out_k = backward ? 2 : 1;
    void *out = inplace ? buf[0].p : buf[out_k].p;
    const void *x = backward ? buf[1].p : buf[0].p;
    sn_syncbn_params_t p;
    FUZZ_CHECK(sn_syncbn_params(bn, &p) == SN_OK, "params");
    if (backward && p.grad_weight != NULL) /* a successful backward writes them all */
      for (int64_t k = 0; k < C; k++) poison((uint8_t *)&p.grad_weight[k], 4, 0), poison((uint8_t *)&p.grad_bias[k], 4, 0);
    bn_snapshot(bn, C, &before);

    /* the documented outcome once the arguments pass */
    uint32_t allowed = e;   /* statuses allowed; 0: SN_OK required */
    int ok_too = 0;         /* SN_OK allowed besides `allowed` */
    int written = 0;        /* a success writes every output element */
    int finite_out = 0;     /* a success gives finite outputs */
    int updates = 0;        /* a success updates the running statistics */
    int counts = 0;         /* a success adds 1 to num_batches_tracked (empty batches too) */
    if (e == 0 && !backward) {
      if (!training && cfg.track_running_stats) {
        written = 1;
      } else if (ns == 1) {
        allowed = ERR(SN_ERR_INSUFFICIENT_COUNT);
      } else if (ns >= 2 && cfg.check_finite && !all_finite_act(x, total, dtype)) {
        allowed = ERR(SN_ERR_NONFINITE);
      } else {
        written = 1;
        finite_out = ns >= 2 && all_moderate_act(x, total, dtype); /* |x̂| <= sqrt(count) */
        updates = ns >= 2 && training && cfg.track_running_stats;
        counts = ns != 1 && training && cfg.track_running_stats; /* as torch's module forward */
      }
    } else if (e == 0) {
      if (!fwd_valid || n != fwd_n || s != fwd_s) {
        allowed = ERR(SN_ERR_INVALID_ARGUMENT);
      } else if (fwd_batch && fwd_count == 0) {
        written = 1; /* zero gradients, no dx element */
      } else if (cfg.check_finite && !(all_finite_act(buf[0].p, total, dtype) && all_finite_act(x, total, dtype))) {
        allowed = ERR(SN_ERR_NONFINITE);
      } else {
        written = 1;
        /* after an eval forward the saved statistics are the running ones, which may have
         * overflowed (var of values near FLT_MAX): their sums can be non-finite */
        if (cfg.check_finite && !fwd_batch) allowed = ERR(SN_ERR_NONFINITE), ok_too = 1;
      }
    }

    /* the call's activations: forward (y, x) = (pa[1], pa[0]); backward (dx, dy, x) = (pa[2],
     * pa[0], pa[1]) */
    void *pa[3] = {null_a ? NULL : buf[0].p, null_b ? NULL : backward ? buf[1].p : out,
                   null_c ? NULL : out};
    /* In one call in eight that would pass the argument checks with real buffers, one of its
     * activations is placed over the layer's own memory instead: an element of an array that
     * sn_syncbn_params hands out, or the handle itself. The call must fail with
     * SN_ERR_INVALID_ARGUMENT before it reads or writes anything (check_call), the saved forward
     * kept. Chosen from the data seed's bits, so it reads no input bytes of its own and the
     * committed inputs keep their layout. */
    int over = -1; /* the activation placed, or -1 */
    if (e == 0 && total > 0 && (c.seed >> 29) == 0) {
      float *arr[6] = {p.weight, p.bias, p.grad_weight, p.grad_bias, p.running_mean, p.running_var};
      void *target[7];
      int nt = 0;
      for (int k = 0; k < 6; k++)
        if (arr[k] != NULL) target[nt++] = arr[k] + (int64_t)((c.seed >> 8) % (uint64_t)C);
      target[nt++] = bn;
      over = (int)((c.seed >> 4) % (backward ? 3u : 2u));
      pa[over] = target[c.seed % (uint64_t)nt];
      allowed = ERR(SN_ERR_INVALID_ARGUMENT), ok_too = 0;
      written = finite_out = updates = counts = 0;
    }
    if (backward)
      st = sn_syncbn_backward(bn, pa[2], pa[0], pa[1], n, s);
    else
      st = sn_syncbn_forward(bn, pa[1], pa[0], n, s, training);
    const char *fname = backward ? "sn_syncbn_backward" : "sn_syncbn_forward";
    count_call(fname, st);
    if (fz_debug() && over >= 0) {
      fprintf(stderr, "  %s n=%lld s=%lld: activation %d over the layer -> %s %s\n", fname, (long long)n,
              (long long)s, over, sn_status_string(st), st ? sn_last_error() : "");
    } else if (fz_debug()) {
      fprintf(stderr, "  %s n=%lld s=%lld training=%d inplace=%d mode=%d -> %s %s\n", fname, (long long)n, (long long)s,
              training, inplace, c.data_mode, sn_status_string(st), st ? sn_last_error() : "");
      for (int64_t k = 0; k < (int64_t)(bytes / es) && k < 64 && dtype == SN_DTYPE_F32; k++)
        fprintf(stderr, "    x[%lld]=%g y=%g\n", (long long)k, (double)((const float *)x)[k], (double)((const float *)out)[k]);
    }

    bn_snapshot(bn, C, &after);
    if (st != SN_OK) {
      FUZZ_CHECK(allowed != 0 && (allowed & ERR(st)), "%s: %s, expected bits 0x%x: %s", fname, sn_status_string(st),
                 allowed, sn_last_error());
      FUZZ_CHECK(strncmp(sn_last_error(), fname, strlen(fname)) == 0, "message '%s'", sn_last_error());
      for (int k = 0; k < 3; k++)
        FUZZ_CHECK(memcmp(buf[k].p, buf[k].snap, bytes) == 0, "%s failed (%s) but changed buffer %d", fname,
                   sn_status_string(st), k);
      FUZZ_CHECK(memcmp(before.v, after.v, (size_t)(6 * C) * sizeof(float)) == 0 && before.nbt == after.nbt,
                 "%s failed (%s) but changed the layer's state", fname, sn_status_string(st));
      if (!backward && e == 0 && over < 0) fwd_valid = 0; /* a forward that failed past its checks */
    } else {
      FUZZ_CHECK(allowed == 0 || ok_too, "%s returned SN_OK, expected bits 0x%x", fname, allowed);
      const int out_idx = inplace ? 0 : out_k;
      for (int k = 0; k < 3; k++)
        if (k != out_idx && !(inplace && k == out_k))
          FUZZ_CHECK(memcmp(buf[k].p, buf[k].snap, bytes) == 0, "%s changed input buffer %d", fname, k);
      const size_t elems = bytes / es;
      if (written)
        for (size_t k = 0; k < elems && !inplace; k++)
          FUZZ_CHECK(!is_poison((uint8_t *)buf[out_k].p + k * es, es, dtype == SN_DTYPE_BF16),
                     "%s left output element %zu unwritten", fname, k);
      if (finite_out)
        FUZZ_CHECK(all_finite_act(out, total, dtype), "%s: finite x gave a non-finite y (training, count %lld)",
                   fname, (long long)ns);
      /* parameters never change; running stats only with a training forward */
      FUZZ_CHECK(memcmp(before.v, after.v, (size_t)(2 * C) * sizeof(float)) == 0, "%s changed weight/bias", fname);
      if (!backward)
        FUZZ_CHECK(memcmp(before.v + 2 * C, after.v + 2 * C, (size_t)(2 * C) * sizeof(float)) == 0,
                   "%s changed the gradients", fname);
      if (backward && p.grad_weight != NULL)
        for (int64_t k = 0; k < 2 * C; k++)
          FUZZ_CHECK(!is_poison((uint8_t *)&after.v[2 * C + k], 4, 0), "%s left gradient %lld unwritten", fname,
                     (long long)k);
      if (counts)
        FUZZ_CHECK(after.nbt == (before.nbt < INT64_MAX ? before.nbt + 1 : before.nbt),
                   "num_batches_tracked %lld -> %lld", (long long)before.nbt, (long long)after.nbt);
      else
        FUZZ_CHECK(after.nbt == before.nbt, "%s changed num_batches_tracked", fname);
      if (!updates)
        FUZZ_CHECK(memcmp(before.v + 4 * C, after.v + 4 * C, (size_t)(2 * C) * sizeof(float)) == 0,
                   "%s changed the running statistics", fname);
      if (!backward) {
        fwd_valid = 1;
        fwd_n = n, fwd_s = s;
        fwd_batch = training || !cfg.track_running_stats;
        fwd_count = ns;
      }
    }
    int64_t cc = -1;
    FUZZ_CHECK(sn_syncbn_collective_count(bn, &cc) == SN_OK && cc >= 0, "collective_count");
    /* nothing to synchronize without a communicator or on one of a single rank ("self") */
    FUZZ_CHECK(cc == 0, "%lld collectives %s", (long long)cc,
               comm ? "on a one-rank communicator" : "without a communicator");
    for (int k = 0; k < 3; k++) free(buf[k].p), free(buf[k].snap);
  }
  free(before.v);
  free(after.v);
  sn_syncbn_destroy(bn);
  sn_syncbn_destroy(NULL);
}
