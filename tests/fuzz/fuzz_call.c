/*
 * fuzz_call.c — pickers, data generation and the setup/verify oracle of fuzz_call.h.
 */
#include "fuzz_call.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pickers ----------------------------------------------------------------------------------- */

int g_tame;

int64_t pick_size(fz_t *in) {
  if (g_tame) {
    static const int64_t tame[20] = {1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 0, 9, 13, 16, 17, 31, 33, 64, 65};
    return tame[fz_u8(in) % 20];
  }
  static const int64_t special[16] = {17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 1000, 4097};
  static const int64_t negative[8] = {-1, -2, -3, -64, INT64_MIN, INT64_MIN + 1, -((int64_t)1 << 31), -4096};
  static const int64_t huge[16] = {INT32_MAX, (int64_t)1 << 31, (int64_t)1 << 32, ((int64_t)1 << 32) + 1,
                                   3037000499LL, 3037000500LL, INT64_MAX / 8, INT64_MAX / 8 + 1,
                                   INT64_MAX / 64, INT64_MAX / 64 + 1, INT64_MAX, (int64_t)1 << 62,
                                   (int64_t)1 << 40, (int64_t)1 << 53, INT64_MAX / 24, INT64_MAX / 2};
  const uint8_t b = fz_u8(in);
  switch (b >> 5) {
    case 0: case 1: case 2: return b & 15;
    case 3: return 16 + (b & 31) * 7;
    case 4: return special[b & 15];
    case 5: return (b & 8) ? negative[b & 7] : -(int64_t)fz_u8(in);
    case 6: return huge[b & 15];
    default: return (int64_t)fz_u64(in);
  }
}

float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float pick_eps(fz_t *in) {
  const uint8_t b = fz_u8(in);
  if (g_tame) {
    static const float tame[8] = {1e-5f, 1e-3f, 1.0f, FLT_MIN, 0.1f, 1e-45f, 1e-12f, FLT_MAX};
    return tame[b & 7];
  }
  switch (b & 15) {
    case 0: case 1: case 2: return 1e-5f;
    case 3: return 1e-3f;
    case 4: return 1.0f;
    case 5: return 0.0f;
    case 6: return -0.0f;
    case 7: return -1e-5f;
    case 8: return (b & 16) ? NAN : -NAN;
    case 9: return (b & 16) ? INFINITY : -INFINITY;
    case 10: return FLT_MIN;
    case 11: return bits_f32(1); /* smallest subnormal */
    case 12: return FLT_MAX;
    case 13: return 1e-12f;
    case 14: return 0.1f;
    default: return bits_f32(fz_u32(in));
  }
}

int eps_ok(float eps) { return eps > 0.0f && isfinite(eps); }

/* dtype (tame: f32, bf16, f16) or layout (tame: NCHW, NHWC) */
static int pick_enum_n(fz_t *in, int valid) {
  const uint8_t b = fz_u8(in);
  if (g_tame) return b % valid;
  if (b < 192) return b % 3;
  if (b < 224) return b & 7;                 /* 0..7: 3 is F64, the rest unknown */
  return (int)fz_u32(in);                     /* anything, negative included */
}

int pick_dtype(fz_t *in) { return pick_enum_n(in, 3); }
int pick_layout(fz_t *in) { return pick_enum_n(in, 2); }

int dtype_ok(int dt) { return dt == SN_DTYPE_F32 || dt == SN_DTYPE_BF16 || dt == SN_DTYPE_F16; }
int layout_ok(int l) { return l == SN_LAYOUT_NCHW || l == SN_LAYOUT_NHWC; }

/* out = a·b with the library's bound; 0 on overflow. a, b >= 0. */
int mul_ok(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > MAX_ELEMS / a) return 0;
  *out = a * b;
  return 1;
}

/* ---- data -------------------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* One value of the data mode (0..7); NaN always the canonical quiet NaN. */
static double gen_value(int mode, uint64_t *s, fz_t *in) {
  const uint64_t r = splitmix(s);
  const double u = (double)(r >> 11) * 0x1.0p-53; /* [0, 1) */
  double v;
  switch (mode) {
    case 0: v = (double)((int)(r % 9) - 4); break;                       /* small integers */
    case 1: v = 1e4 + (2.0 * u - 1.0); break;                              /* |mean| ≫ σ */
    case 2: v = 3.25; break;                                               /* constant: var 0 */
    case 3: v = (double)bits_f32((uint32_t)r); break;                      /* any f32 bits */
    case 4: {                                                              /* normal + specials */
      static const double sp[8] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, FLT_MAX, -FLT_MAX, 1e-40};
      v = (r & 0xf00) == 0 ? sp[r % 8] : 2.0 * u - 1.0;
      break;
    }
    case 5: v = (r & 1 ? 1.0 : -1.0) * (u < 0.5 ? 3e38 : 6e4); break;     /* huge magnitudes */
    case 6: v = (double)bits_f32((uint32_t)(r & 0x807fffffu)); break;    /* subnormals */
    default: v = (double)bits_f32(fz_u32(in)); break;                      /* from the input */
  }
  return isnan(v) ? (double)NAN : v;
}

/* f32 → bf16/f16 bits by truncation (inputs only need to be valid, canonical values). */
static uint16_t to_half_bits(float f, int bf16) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (isnan(f)) return bf16 ? 0x7fc0 : 0x7e00;
  if (bf16) return (uint16_t)(u >> 16);
  const int e = (int)((u >> 23) & 0xff) - 127 + 15;
  const uint32_t m = u & 0x7fffffu;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return sign;
    return (uint16_t)(sign | ((m | 0x800000u) >> (14 - e)));
  }
  return (uint16_t)(sign | (uint16_t)(e << 10) | (uint16_t)(m >> 13));
}

/* ---- calls ------------------------------------------------------------------------------------- */

void call_init(call_t *c, const char *fn, int dtype, int sizes_ok, int empty) {
  memset(c, 0, sizeof *c);
  c->fn = fn;
  c->dtype = dtype;
  c->sizes_ok = sizes_ok;
  c->empty = empty;
}

int add_arg(call_t *c, const char *name, int type, int req, int role, int64_t elems,
                   int must_write) {
  arg_t *a = &c->a[c->na];
  memset(a, 0, sizeof *a);
  a->name = name;
  a->type = type;
  a->req = req;
  a->role = role;
  a->elems = c->sizes_ok ? elems : -1;
  a->must_write = must_write;
  a->alias = -1;
  return c->na++;
}

static size_t esize_of(const call_t *c, const arg_t *a) {
  if (a->type == T_F32) return 4;
  if (a->type == T_F64) return 8;
  const int64_t s = dtype_ok(c->dtype) ? sn_dtype_size((sn_dtype_t)c->dtype) : 4;
  return (size_t)s;
}

/* Poison patterns: signalling NaNs; the library's conversions and arithmetic only emit quiet
 * NaNs, so finding one after a successful call means the element was not written. */
int is_poison(const uint8_t *p, size_t esize, int half_bf16) {
  if (esize == 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v == 0x7ff4a5a5a5a5a5a5ull;
  }
  if (esize == 4) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v == 0x7fa5a5a5u;
  }
  uint16_t v;
  memcpy(&v, p, 2);
  return v == (half_bf16 ? 0x7fa5u : 0x7ca5u);
}

void poison(uint8_t *p, size_t esize, int half_bf16) {
  if (esize == 8) {
    const uint64_t v = 0x7ff4a5a5a5a5a5a5ull;
    memcpy(p, &v, 8);
  } else if (esize == 4) {
    const uint32_t v = 0x7fa5a5a5u;
    memcpy(p, &v, 4);
  } else {
    const uint16_t v = half_bf16 ? 0x7fa5u : 0x7ca5u;
    memcpy(p, &v, 2);
  }
}

void fill(call_t *c, arg_t *a, int index, fz_t *in) {
  const size_t n = a->bytes / a->esize;
  const int bf16 = a->type == T_ACT && c->dtype == SN_DTYPE_BF16;
  uint64_t s = c->seed + 0x1000u * (uint64_t)index;
  for (size_t i = 0; i < n; i++) {
    uint8_t *e = (uint8_t *)a->p + i * a->esize;
    if (a->role == OUT) {
      poison(e, a->esize, bf16);
      continue;
    }
    const double v = gen_value(c->data_mode, &s, in);
    if (a->esize == 8) {
      memcpy(e, &v, 8);
    } else if (a->esize == 4) {
      const float f = (float)v;
      memcpy(e, &f, 4);
    } else {
      const uint16_t h = to_half_bits((float)v, bf16);
      memcpy(e, &h, 2);
    }
  }
  /* a short tail (small buffers of odd byte counts) */
  for (size_t i = n * a->esize; i < a->bytes; i++) ((uint8_t *)a->p)[i] = 0xa5;
}

/* Decides from the input which pointers are NULL (one in eight). */
void choose_pointers(call_t *c, fz_t *in) {
  for (int i = 0; i < c->na; i++) {
    arg_t *a = &c->a[i];
    a->is_null = (fz_u8(in) & (g_tame ? 31 : 7)) == 0;
  }
}

/* Adds NULL_POINTER for required pointers that are NULL. */
static void null_errors(call_t *c) {
  for (int i = 0; i < c->na; i++) {
    const arg_t *a = &c->a[i];
    if (!a->is_null || a->alias >= 0) continue;
    if (a->req == R_REQ || (a->req == R_NONEMPTY && !(c->sizes_ok && c->empty)))
      c->errs |= ERR(SN_ERR_NULL_POINTER);
  }
}

/* Lets output `out` share the buffer of input `src` (in-place) when the input says so. */
void maybe_alias(call_t *c, fz_t *in, int out, int src) {
  if ((fz_u8(in) & 3) != 0) return;
  if (c->a[out].is_null || c->a[src].is_null) return;
  c->a[out].alias = src;
}

/* One call in eight (decided from the data seed's top bits, so that an input's bytes still mean
 * what they meant before this existed): an output (OUT or INOUT, real, not an in-place alias)
 * is moved to start one or more of its elements into another real buffer of the call, input or
 * output, whose block is grown to hold it. That is a partial overlap, never the same pointer,
 * so no in-place pair allows it: the call must fail (SN_ERR_INVALID_ARGUMENT, or another error
 * it already has) and change nothing, the grown block included. */
static void place_overlap(call_t *c) {
  const uint64_t s = (c->seed + 1) * 0x9e3779b97f4a7c15ull;
  if ((s >> 61) != 0) return;
  int outs[12], hosts[12], no = 0, nh = 0;
  for (int i = 0; i < c->na; i++) {
    const arg_t *a = &c->a[i];
    if (a->role != IN && a->p != NULL && a->alias < 0 && a->bytes > 0) outs[no++] = i;
  }
  if (no == 0) return;
  arg_t *o = &c->a[outs[(s >> 8) % (uint64_t)no]];
  for (int j = 0; j < c->na; j++) {
    const arg_t *a = &c->a[j];
    if (a != o && a->p != NULL && a->alias < 0 && a->bytes > o->esize) hosts[nh++] = j;
  }
  if (nh == 0) return;
  arg_t *h = &c->a[hosts[(s >> 16) % (uint64_t)nh]];
  const size_t off = o->esize * (1 + (size_t)((s >> 24) % ((h->bytes - 1) / o->esize)));
  uint8_t *blk = malloc(h->bytes + o->bytes);
  FUZZ_CHECK(blk != NULL, "out of memory");
  memcpy(blk, h->p, h->bytes);
  memset(blk + h->bytes, 0x5a, o->bytes);
  free(h->p);
  free(o->p);
  h->p = blk;
  h->room = o->bytes;
  o->p = blk + off;
  o->overlay = 1;
  c->errs |= ERR(SN_ERR_INVALID_ARGUMENT);
}

/* Allocates and fills the buffers; returns 0 when the call must be skipped (valid but too large
 * to back with real buffers). */
int setup(call_t *c, fz_t *in) {
  null_errors(c);
  int feasible = c->sizes_ok;
  for (int i = 0; i < c->na && feasible; i++) feasible = c->a[i].elems <= CAP_ELEMS;
  if (c->errs == 0 && !feasible) return 0;
  const size_t small = (size_t)(fz_u8(in) & 31);
  c->data_mode = fz_u8(in) & 7;
  c->seed = fz_u32(in);
  for (int i = 0; i < c->na; i++) {
    arg_t *a = &c->a[i];
    a->esize = esize_of(c, a);
    if (a->is_null || a->alias >= 0) continue;
    a->bytes = feasible ? (size_t)a->elems * a->esize : small;
    a->p = malloc(a->bytes > 0 ? a->bytes : 1);
    FUZZ_CHECK(a->p != NULL, "out of memory");
    if (a->bytes == 0) { /* malloc(0)-like: nothing may be touched; keep a distinct block */
      free(a->p);
      a->p = malloc(0);
      FUZZ_CHECK(a->p != NULL, "malloc(0)");
    }
    fill(c, a, i, in);
  }
  if (c->overlap_ok && feasible) place_overlap(c);
  for (int i = 0; i < c->na; i++) {
    arg_t *a = &c->a[i];
    if (a->alias >= 0) {
      arg_t *src = &c->a[a->alias];
      a->p = src->p;
      a->bytes = src->bytes;
    }
  }
  for (int i = 0; i < c->na; i++) {
    arg_t *a = &c->a[i];
    if (a->p == NULL || a->alias >= 0 || a->overlay) continue;
    a->snap = malloc(a->bytes + a->room > 0 ? a->bytes + a->room : 1);
    FUZZ_CHECK(a->snap != NULL, "out of memory");
    memcpy(a->snap, a->p, a->bytes + a->room);
  }
  return 1;
}

void *P(const call_t *c, int i) { return c->a[i].is_null ? NULL : c->a[i].p; }

/* SN_FUZZ_DEBUG: how often each function ran, succeeded and failed (printed at exit). */
static struct {
  const char *fn;
  long calls, ok;
} stats[32];

static void print_stats(void) {
  for (int i = 0; i < 32 && stats[i].fn; i++)
    fprintf(stderr, "%-24s %8ld calls %8ld SN_OK %8ld errors\n", stats[i].fn, stats[i].calls, stats[i].ok,
            stats[i].calls - stats[i].ok);
}

void count_call(const char *fn, sn_status_t st) {
  if (!fz_debug()) return;
  int i = 0;
  while (i < 31 && stats[i].fn && strcmp(stats[i].fn, fn) != 0) i++;
  if (stats[i].fn == NULL) {
    if (i == 0) atexit(print_stats);
    stats[i].fn = fn;
  }
  stats[i].calls++;
  stats[i].ok += st == SN_OK;
}

/* Checks the outcome against the oracle and frees the buffers. */
void verify(call_t *c, sn_status_t st) {
  count_call(c->fn, st);
  if (c->errs != 0) {
    FUZZ_CHECK(st != SN_OK && st <= SN_ERR_INTERNAL && (c->errs & ERR(st)),
               "%s returned %s, expected one of the bits 0x%x: %s", c->fn, sn_status_string(st),
               c->errs, sn_last_error());
    FUZZ_CHECK(strncmp(sn_last_error(), c->fn, strlen(c->fn)) == 0, "%s: message '%s'", c->fn,
               sn_last_error());
  } else {
    FUZZ_CHECK(st == SN_OK, "%s rejected a valid call: %s (%s)", c->fn, sn_status_string(st),
               sn_last_error());
  }
  for (int i = 0; i < c->na; i++) {
    arg_t *a = &c->a[i];
    if (a->snap == NULL) continue;
    int aliased = 0; /* an output writes into this buffer */
    for (int j = 0; j < c->na; j++) aliased |= c->a[j].alias == i;
    const int changed = memcmp(a->snap, a->p, a->bytes + a->room) != 0;
    if (st != SN_OK) {
      FUZZ_CHECK(!changed, "%s failed (%s) but changed '%s'", c->fn, sn_status_string(st), a->name);
    } else if (a->role == IN && !aliased) {
      FUZZ_CHECK(!changed, "%s changed its input '%s'", c->fn, a->name);
    } else if (a->role == OUT && a->must_write && !c->empty) {
      const int bf16 = a->type == T_ACT && c->dtype == SN_DTYPE_BF16;
      for (size_t k = 0; k + a->esize <= a->bytes; k += a->esize)
        FUZZ_CHECK(!is_poison((uint8_t *)a->p + k, a->esize, bf16), "%s left '%s'[%zu] unwritten",
                   c->fn, a->name, k / a->esize);
    }
  }
  for (int i = 0; i < c->na; i++) {
    if (c->a[i].alias < 0 && !c->a[i].overlay) free(c->a[i].p);
    free(c->a[i].snap);
  }
}

sn_comm_t *self_comm(void) {
  static sn_comm_t *comm;
  if (comm == NULL) FUZZ_CHECK(sn_comm_create_self(&comm) == SN_OK, "%s", sn_last_error());
  return comm;
}
