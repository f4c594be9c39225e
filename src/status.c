/*
 * status.c — status strings, the thread-local error message and argument validation helpers.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

#define SN_ERRMSG_LEN 1024

static _Thread_local char sn__errmsg[SN_ERRMSG_LEN];

const char *sn_status_string(sn_status_t status) {
  switch (status) {
    case SN_OK: return "SN_OK";
    case SN_ERR_NULL_POINTER: return "SN_ERR_NULL_POINTER";
    case SN_ERR_INVALID_SIZE: return "SN_ERR_INVALID_SIZE";
    case SN_ERR_OVERFLOW: return "SN_ERR_OVERFLOW";
    case SN_ERR_INVALID_EPS: return "SN_ERR_INVALID_EPS";
    case SN_ERR_INVALID_GROUPS: return "SN_ERR_INVALID_GROUPS";
    case SN_ERR_INVALID_DTYPE: return "SN_ERR_INVALID_DTYPE";
    case SN_ERR_INVALID_LAYOUT: return "SN_ERR_INVALID_LAYOUT";
    case SN_ERR_INSUFFICIENT_COUNT: return "SN_ERR_INSUFFICIENT_COUNT";
    case SN_ERR_INVALID_ARGUMENT: return "SN_ERR_INVALID_ARGUMENT";
    case SN_ERR_ALLOC: return "SN_ERR_ALLOC";
    case SN_ERR_MISMATCH: return "SN_ERR_MISMATCH";
    case SN_ERR_COMM: return "SN_ERR_COMM";
    case SN_ERR_TIMEOUT: return "SN_ERR_TIMEOUT";
    case SN_ERR_NONFINITE: return "SN_ERR_NONFINITE";
    case SN_ERR_IO: return "SN_ERR_IO";
    case SN_ERR_FORMAT: return "SN_ERR_FORMAT";
    case SN_ERR_NOT_FOUND: return "SN_ERR_NOT_FOUND";
    case SN_ERR_UNSUPPORTED: return "SN_ERR_UNSUPPORTED";
    case SN_ERR_INVALID_HANDLE: return "SN_ERR_INVALID_HANDLE";
    case SN_ERR_CUDA: return "SN_ERR_CUDA";
    case SN_ERR_INTERNAL: return "SN_ERR_INTERNAL";
  }
  return "SN_ERR_UNKNOWN";
}

const char *sn_last_error(void) { return sn__errmsg; }

const char *sn_version(void) { return SN_VERSION_STRING; }

int64_t sn_dtype_size(sn_dtype_t dtype) {
  switch (dtype) {
    case SN_DTYPE_F32: return 4;
    case SN_DTYPE_BF16: return 2;
    case SN_DTYPE_F16: return 2;
    case SN_DTYPE_F64: return 8;
  }
  return 0;
}

sn_status_t sn__fail(sn_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sn__errmsg, sizeof sn__errmsg, fmt, ap);
  va_end(ap);
  return status;
}

sn_status_t sn__check_spans(const char *fn, const sn__span_t *s, int count) {
  for (int i = 0; i < count; i++)
    for (int j = i + 1; j < count; j++) {
      const sn__span_t *a = &s[i], *b = &s[j];
      if (!a->out && !b->out) continue;
      if (a->p == NULL || b->p == NULL || a->bytes <= 0 || b->bytes <= 0) continue;
      const uintptr_t pa = (uintptr_t)a->p, pb = (uintptr_t)b->p;
      if (pa >= pb + (uintptr_t)b->bytes || pb >= pa + (uintptr_t)a->bytes) continue;
      const int in_place = j < 32 && ((a->may_equal >> j) & 1u);
      if (pa == pb && a->bytes == b->bytes) {
        if (in_place) continue;
        return sn__fail(SN_ERR_INVALID_ARGUMENT, "%s: %s and %s are the same buffer", fn,
                        a->name, b->name);
      }
      return sn__fail(SN_ERR_INVALID_ARGUMENT,
                      "%s: %s (%lld bytes) and %s (%lld bytes) overlap%s, %lld bytes apart%s",
                      fn, a->name, (long long)a->bytes, b->name, (long long)b->bytes,
                      a->bytes == b->bytes ? " without being the same buffer" : "",
                      (long long)(pa > pb ? pa - pb : pb - pa),
                      in_place ? ": an in-place call passes the same pointer" : "");
    }
  return SN_OK;
}

sn_status_t sn__check_momentum(const char *fn, float momentum) {
  if (momentum == SN_MOMENTUM_CUMULATIVE || (momentum >= 0.0f && momentum <= 1.0f)) return SN_OK;
  return sn__fail(SN_ERR_INVALID_ARGUMENT,
                  "%s: momentum must be in [0, 1] or SN_MOMENTUM_CUMULATIVE, got %g", fn,
                  (double)momentum);
}

sn_status_t sn__fail_prefix(sn_status_t status, const char *fmt, ...) {
  char prefix[SN_ERRMSG_LEN / 2], msg[SN_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(msg, sn__errmsg, sizeof msg);
  /* prefix (< half the buffer), ": ", then as much of the old message as fits */
  const size_t pl = strlen(prefix), ml = strnlen(msg, sizeof sn__errmsg - pl - 3);
  memcpy(sn__errmsg, prefix, pl);
  memcpy(sn__errmsg + pl, ": ", 2);
  memcpy(sn__errmsg + pl + 2, msg, ml);
  sn__errmsg[pl + 2 + ml] = '\0';
  return status;
}

sn_status_t sn__check_ptr(const char *fn, const char *name, const void *p) {
  if (p == NULL) return sn__fail(SN_ERR_NULL_POINTER, "%s: %s must not be NULL", fn, name);
  return SN_OK;
}

sn_status_t sn__check_size(const char *fn, const char *name, int64_t v, int64_t min) {
  if (v < min)
    return sn__fail(SN_ERR_INVALID_SIZE, "%s: %s must be >= %lld, got %lld", fn, name,
                    (long long)min, (long long)v);
  return SN_OK;
}

/* 8 bytes per element is the widest element we address (f64 sums); keep bytes < 2^63. */
#define SN_MAX_ELEMS (INT64_MAX / 8)

sn_status_t sn__mul(const char *fn, int64_t *out, int64_t a, int64_t b) {
  const int64_t max_elems = SN_MAX_ELEMS;
  if (a < 0 || b < 0)
    return sn__fail(SN_ERR_INVALID_SIZE, "%s: negative size %lld x %lld", fn, (long long)a,
                    (long long)b);
  if (a != 0 && b > max_elems / a)
    return sn__fail(SN_ERR_OVERFLOW, "%s: size %lld x %lld overflows int64 byte counts", fn,
                    (long long)a, (long long)b);
  *out = a * b;
  return SN_OK;
}

sn_status_t sn__check_elems(const char *fn, const char *name, int64_t v) {
  if (v > SN_MAX_ELEMS)
    return sn__fail(SN_ERR_OVERFLOW, "%s: %s = %lld overflows int64 byte counts", fn, name,
                    (long long)v);
  return SN_OK;
}

sn_status_t sn__check_eps(const char *fn, float eps) {
  if (!(eps > 0.0f) || isinf(eps))
    return sn__fail(SN_ERR_INVALID_EPS, "%s: eps must be finite and > 0, got %g", fn,
                    (double)eps);
  return SN_OK;
}

sn_status_t sn__check_running_var(const char *fn, const float *running_var, int64_t c) {
  for (int64_t i = 0; i < c; i++)
    if (running_var[i] < 0.0f)
      return sn__fail(SN_ERR_INVALID_ARGUMENT,
                      "%s: running_var[%lld] is %g; a variance must be >= 0", fn, (long long)i,
                      (double)running_var[i]);
  return SN_OK;
}

sn_status_t sn__check_act_dtype(const char *fn, sn_dtype_t dtype) {
  if (dtype != SN_DTYPE_F32 && dtype != SN_DTYPE_BF16 && dtype != SN_DTYPE_F16)
    return sn__fail(SN_ERR_INVALID_DTYPE,
                    "%s: dtype must be SN_DTYPE_F32, SN_DTYPE_BF16 or SN_DTYPE_F16, got %d", fn,
                    (int)dtype);
  return SN_OK;
}

sn_status_t sn__check_layout(const char *fn, sn_layout_t layout) {
  if (layout != SN_LAYOUT_NCHW && layout != SN_LAYOUT_NHWC)
    return sn__fail(SN_ERR_INVALID_LAYOUT,
                    "%s: layout must be SN_LAYOUT_NCHW or SN_LAYOUT_NHWC, got %d", fn,
                    (int)layout);
  return SN_OK;
}
