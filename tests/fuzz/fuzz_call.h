/*
 * fuzz_call.h — the oracle framework of the fuzz_kernels target (fuzz_call.c): pickers that turn
 * fuzz bytes into arguments (sizes, enums, eps), a description of one call (its pointer
 * arguments, which may be NULL, how many elements each has, which statuses the call may return)
 * and the setup/verify pair that backs the call with exactly sized buffers and checks the
 * outcome. fuzz_kernels.c (stateless kernels, communicator) and fuzz_syncbn.c (SyncBatchNorm)
 * describe the calls; fuzz_kernels.c has the entry point. The rules are in fuzz_kernels.c's
 * header comment.
 */
#ifndef SN_FUZZ_CALL_H
#define SN_FUZZ_CALL_H

#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "syncnorm.h"
#include "syncnorm_dist.h"

/* Largest buffer (elements) a call that may succeed gets; larger valid calls are skipped. */
#define CAP_ELEMS 4096
/* The library's element-count limit: a·b·8 bytes must stay addressable (internal.h). */
#define MAX_ELEMS (INT64_MAX / 8)
#define ERR(code) (1u << (code))

/* ---- pickers ------------------------------------------------------------------------------------ */

/* Per operation, the input picks "tame" (3 in 4: sizes small and valid, enums and eps valid,
 * NULLs rare — so that many calls succeed and the kernels run) or "wild" (anything). */
extern int g_tame;

int64_t pick_size(fz_t *in);   /* small, odd, negative, huge, overflowing, raw 64-bit */
float pick_eps(fz_t *in);      /* valid, 0, −0, negative, NaN, ±Inf, subnormal, raw bits */
int pick_dtype(fz_t *in);      /* tame: f32, bf16, f16; wild: F64, unknown, any int */
int pick_layout(fz_t *in);     /* tame: NCHW, NHWC; wild: any int */
float bits_f32(uint32_t u);
int eps_ok(float eps);
int dtype_ok(int dt);          /* an activation dtype */
int layout_ok(int l);
/* *out = a·b within the library's MAX_ELEMS bound (a, b >= 0); 0 on overflow. */
int mul_ok(int64_t a, int64_t b, int64_t *out);

/* ---- call description -------------------------------------------------------------------------- */

enum { T_ACT, T_F32, T_F64 };       /* element type: the call's dtype, f32, f64 */
enum { R_OPT, R_REQ, R_NONEMPTY };  /* NULL: allowed, never, only for an empty batch */
enum { IN, OUT, INOUT };

typedef struct {
  const char *name;
  int type, req, role;
  int64_t elems;   /* -1 when the sizes are invalid */
  int must_write;  /* OUT: a successful call writes every element */
  int alias;       /* index of the argument whose buffer this one shares, or -1 */
  int overlay;     /* placed partly over another argument's buffer (place_overlap) */
  size_t room;     /* bytes after this buffer in its block, holding an overlaid output */
  int is_null;
  void *p;
  size_t bytes, esize;
  uint8_t *snap;
} arg_t;

typedef struct {
  const char *fn;
  arg_t a[12];
  int na;
  uint32_t errs;  /* statuses the call may return; 0: it must return SN_OK */
  int sizes_ok;   /* every elems is known */
  int empty;      /* an empty batch: R_NONEMPTY pointers may be NULL */
  int overlap_ok;  /* the function checks every buffer for overlap: setup may overlay one */
  int dtype;
  int data_mode;
  uint64_t seed;
} call_t;

/* ---- calls -------------------------------------------------------------------------------------- */

void call_init(call_t *c, const char *fn, int dtype, int sizes_ok, int empty);
/* Adds a pointer argument; returns its index. elems is ignored (-1) when !sizes_ok. */
int add_arg(call_t *c, const char *name, int type, int req, int role, int64_t elems, int must_write);
/* Decides from the input which pointers are NULL. */
void choose_pointers(call_t *c, fz_t *in);
/* Lets output `out` share the buffer of input `src` (in-place) when the input says so. */
void maybe_alias(call_t *c, fz_t *in, int out, int src);
/* Adds NULL_POINTER to the allowed statuses where required pointers are NULL, allocates and fills
 * the buffers; returns 0 when the call must be skipped (valid but larger than CAP_ELEMS). With
 * c->overlap_ok, one call in eight that has real buffers gets an output placed partly over
 * another buffer (syncnorm.h: no overlap but the in-place pairs), and must then fail. */
int setup(call_t *c, fz_t *in);
/* The buffer of argument i as passed to the library (NULL when chosen so). */
void *P(const call_t *c, int i);
/* Checks the outcome against the oracle (aborts on a violation) and frees the buffers. */
void verify(call_t *c, sn_status_t st);

/* Fills one buffer: data for inputs (c->data_mode, c->seed), poison for outputs. */
void fill(call_t *c, arg_t *a, int index, fz_t *in);
/* Signalling-NaN poison of one element of esize bytes (half_bf16: the bf16 pattern). */
void poison(uint8_t *p, size_t esize, int half_bf16);
int is_poison(const uint8_t *p, size_t esize, int half_bf16);
/* SN_FUZZ_DEBUG: counts calls and successes per function, printed at exit. */
void count_call(const char *fn, sn_status_t st);

/* A "self" communicator shared by every input (created on first use). */
sn_comm_t *self_comm(void);

/* ---- operations ------------------------------------------------------------------------------------ */

/* One SyncBatchNorm layer: create with a fuzzed config, then up to 8 forward/backward calls
 * (fuzz_syncbn.c). */
void fuzz_op_syncbn(fz_t *in);

#endif /* SN_FUZZ_CALL_H */
