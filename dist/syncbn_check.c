/*
 * syncbn_check.c — SyncBatchNorm's consistency check (cfg.check_consistency): before a layer's
 * collective, every rank's call signature (layer id, C, operation, dtype, layout, the status of
 * its own checks, configuration, a hash of the running statistics) is compared with one max
 * all-reduce, and on a mismatch the message names which ranks hold which value. Also the pivot
 * hash slots that ride in a host forward's all-reduce.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_internal.h"

static uint64_t fnv1a(const void *p, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
  return h;
}

/* The bits of a float as a nonnegative int64 (for the signature). */
static int64_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (int64_t)u;
}

/* The float whose bits float_bits gave. */
static float float_of(int64_t bits) {
  const uint32_t u = (uint32_t)bits;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* A hash of the running statistics (running_mean, running_var, num_batches_tracked), 0 without
 * them; nonnegative. */
static int64_t running_hash(const sn_syncbn_t *bn) {
  if (!bn->cfg.track_running_stats) return 0;
  const size_t bytes = (size_t)bn->C * sizeof(float);
  const uint64_t h = fnv1a(bn->running_mean, bytes) ^ (fnv1a(bn->running_var, bytes) * 31u) ^
                     fnv1a(&bn->num_batches_tracked, sizeof bn->num_batches_tracked);
  return (int64_t)(h >> 2);
}

/* The fields of the signature (check_consistency): those of the call up to CALL_FIELDS, then
 * the configuration up to CONFIG_FIELDS, then the running statistics. F_CHECKS: the status of
 * this rank's own checks of the call (0: passed; see tell_peers). */
enum {
  F_ID, F_C, F_OP, F_DTYPE, F_LAYOUT, F_CHECKS, F_MOMENTUM, F_EPS, F_TRACK, F_AFFINE, F_FINITE,
  F_RUNNING, K
};
enum { CALL_FIELDS = F_CHECKS + 1, CONFIG_FIELDS = F_RUNNING };
/* The value of a field a rank does not compare (the layout of a batch that is laid out alike in
 * NCHW and NHWC), in both halves of the max all-reduce: below every real value. */
#define ABSTAIN (INT64_MIN + 1)

/* The name of a value of field k of the signature (check_consistency), where it has one: the
 * operation, dtype and layout; NULL otherwise. */
static const char *field_name(int k, int64_t v) {
  static const char *const op_name[] = {"?", "forward", "backward"};
  static const char *const dtype_name[] = {"f32", "bf16", "f16", "f64"};
  static const char *const layout_name[] = {"NCHW", "NHWC"};
  if (k == F_CHECKS) return v == 0 ? "passed" : sn_status_string((sn_status_t)v);
  if (k == F_LAYOUT && v == ABSTAIN) return "either (an empty batch, or one position)";
  const char *const *names = k == F_OP       ? op_name
                             : k == F_DTYPE  ? dtype_name
                             : k == F_LAYOUT ? layout_name
                                             : NULL;
  const int64_t count = k == F_OP ? 3 : k == F_DTYPE ? 4 : 2;
  return names != NULL && v >= 0 && v < count ? names[v] : NULL;
}

/* One value of field k as text: a name (field_name), momentum and eps from their bits ("None"
 * for SN_MOMENTUM_CUMULATIVE; 0.1, or 0.100000009 where %g would print two values alike), the
 * number otherwise; the running statistics' hash has no text
 * of its own: "one state" for the first value shown (first != 0), "another" after it. */
static void field_value(char *out, size_t size, int k, int64_t v, int first) {
  const char *name = field_name(k, v);
  if (name != NULL) {
    snprintf(out, size, "%s", name);
  } else if (k == F_MOMENTUM || k == F_EPS) {
    const float f = float_of(v);
    if (k == F_MOMENTUM && f == SN_MOMENTUM_CUMULATIVE) {
      snprintf(out, size, "None");
    } else { /* the shortest of %g and %.9g that reads back as f: values that differ print so */
      snprintf(out, size, "%g", (double)f);
      if (strtof(out, NULL) != f) snprintf(out, size, "%.9g", (double)f);
    }
  } else if (k == F_RUNNING) {
    snprintf(out, size, "%s", first ? "one state" : "another");
  } else {
    snprintf(out, size, "%lld", (long long)v);
  }
}

/* One field's range over the ranks, lo..hi (its maxima of v and −v), for the message of
 * check_consistency beyond SN_MSG_TABLE_RANKS: names or values as field_value, with the lowest
 * rank holding each (rlo, rhi; −1: not known, then only the values); two momentum or eps values
 * (the extreme bit patterns) and two ranks whose running statistics differ as examples. */
static int field_range(char *out, size_t size, int k, int64_t lo, int64_t hi, int64_t rlo,
                       int64_t rhi) {
  const int ranked = rlo >= 0 && rhi >= 0;
  if (k == F_RUNNING)
    return ranked ? snprintf(out, size, " (e.g. ranks %lld and %lld)", (long long)rlo,
                             (long long)rhi)
                  : snprintf(out, size, "%s", "");
  char a[32], b[32], ra[32] = "", rb[32] = "";
  if ((k == F_MOMENTUM || k == F_EPS) && float_of(lo) > float_of(hi)) { /* order values, not bits */
    const int64_t t = lo, rt = rlo;
    lo = hi, rlo = rhi, hi = t, rhi = rt;
  }
  field_value(a, sizeof a, k, lo, 0), field_value(b, sizeof b, k, hi, 0);
  if (ranked) {
    snprintf(ra, sizeof ra, " on rank %lld", (long long)rlo);
    snprintf(rb, sizeof rb, " on rank %lld", (long long)rhi);
  }
  if (k == F_MOMENTUM || k == F_EPS) /* the extreme bit patterns: two of the values */
    return snprintf(out, size, " (e.g. %s%s, %s%s)", a, ranked ? ra : " on one rank", b,
                    ranked ? rb : " on another");
  if (!ranked) return snprintf(out, size, " (%s..%s)", a, b);
  return snprintf(out, size, " (%s..%s; e.g. %s%s, %s%s)", a, b, a, ra, b, rb);
}

/* Up to SN_MSG_TABLE_RANKS ranks, a mismatch gathers every rank's signature (on the stack: 6 KiB)
 * and the message lists the ranks of each value (sn__field_by_rank, agree.c); beyond, the lowest
 * rank holding each extreme (field_range). No allocation on that path: every rank must make the
 * same collective. */

/* With cfg.check_consistency: one max-all-reduce of (v, −v) for each field of this call's
 * signature. Every rank gets the same maxima, so every rank reaches the same verdict. The first
 * CALL_FIELDS fields say which call each rank made; where one of them differs the ranks are out
 * of step, and the others (another layer's configuration and state) differ as a consequence,
 * so only the call fields are reported then; likewise the configuration fields before the
 * running statistics (whose hash changes with track_running_stats). On a mismatch every rank
 * (all take that path) makes one more collective: up to SN_MSG_TABLE_RANKS ranks a sum
 * all-reduce of a [ranks, fields] table in which each rank fills its own row (exact: one nonzero
 * term per element), so that the message lists which ranks hold which value; beyond, a max
 * all-reduce of the lowest rank holding each field's extremes. The ranks are those of the
 * layer's communicator (of a split one, not the world's). Should that collective fail (a
 * timeout), its status is returned, with both messages: the communicator is then broken. */
static sn_status_t check_consistency(sn_syncbn_t *bn, const char *fn, int op, sn_status_t checks,
                                     int layout_matters) {
  /* check_finite is configuration too: a rank with it returns SN_ERR_NONFINITE before the
   * statistics' second all-reduce (the pivot refinement) that a rank without it makes, so ranks
   * that differ in it would go on out of step (Open MPI ends the job with MPI_ERR_TRUNCATE) */
  static const char *const field[K] = {
      "layer id", "C (num_features)", "operation", "dtype", "layout",
      "the call's own checks (a rank whose arguments or state failed them returned that error)",
      "momentum", "eps", "track_running_stats", "affine", "check_finite",
      "running statistics (load or set them on every rank, or broadcast them from one)"};
  /* momentum + 0.0f: -0 and 0 are the same momentum, with the same bits here */
  int64_t sig[K] = {bn->id, bn->C, op, (int64_t)bn->cfg.dtype, (int64_t)bn->cfg.layout,
                    (int64_t)checks, float_bits(bn->cfg.momentum + 0.0f), float_bits(bn->cfg.eps),
                    bn->cfg.track_running_stats, bn->cfg.affine, bn->cfg.check_finite != 0,
                    running_hash(bn)};
  int64_t v[2 * K];
  for (int k = 0; k < K; k++) v[k] = sig[k], v[K + k] = -sig[k];
  /* a rank whose layout does not matter abstains: the lowest value in both halves leaves the
   * maxima to the others (and to all abstaining, ABSTAIN in both) */
  if (!layout_matters) sig[F_LAYOUT] = v[F_LAYOUT] = v[K + F_LAYOUT] = ABSTAIN;
  bn->collectives++;
  char where[sizeof bn->label + 64];
  snprintf(where, sizeof where, "%s (%s, consistency check)", fn, bn->label);
  SN_TRY(sn__comm_allreduce_host(where, bn->comm, v, 2 * K, SN_RED_I64, SN_RED_MAX));
  int last = K, differs = 0;
  for (int k = K - 1; k >= 0; k--) { /* the tier of the first field that differs */
    if (v[k] == -v[K + k] || v[k] == ABSTAIN) continue;
    differs = 1;
    last = k < CALL_FIELDS ? CALL_FIELDS : k < CONFIG_FIELDS ? CONFIG_FIELDS : K;
  }
  if (!differs) return SN_OK;
  /* every rank is here (the same verdict everywhere): one more collective, of a size every rank
   * knows, tells which ranks hold which values; without it (an error) only the ranges */
  const int ranks = bn->comm->size, me = bn->comm->rank;
  int64_t table[SN_MSG_TABLE_RANKS * K] = {0}, who[2 * K];
  const int by_rank = ranks <= SN_MSG_TABLE_RANKS;
  if (by_rank) {
    memcpy(table + (int64_t)me * K, sig, sizeof sig);
  } else { /* −(the lowest rank) holding each field's largest value, then its smallest */
    for (int k = 0; k < K; k++) {
      who[k] = sig[k] == v[k] ? -me : INT64_MIN;
      who[K + k] = sig[k] == -v[K + k] ? -me : INT64_MIN;
    }
  }
  bn->collectives++;
  snprintf(where, sizeof where, "%s (%s, ranks of a mismatch)", fn, bn->label);
  const sn_status_t got = sn__comm_allreduce_host(where, bn->comm, by_rank ? table : who,
                                             by_rank ? (int64_t)ranks * K : 2 * K, SN_RED_I64,
                                             by_rank ? SN_RED_SUM : SN_RED_MAX);
  const int known = got == SN_OK;
  char why[256] = ""; /* why the ranks are not named: that collective's own error */
  if (!known) snprintf(why, sizeof why, "%s", sn_last_error());
  char msg[640];
  int len = 0;
  for (int k = 0; k < last && len < (int)sizeof msg; k++) {
    if (v[k] == -v[K + k] || v[k] == ABSTAIN) continue;
    len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s differs across ranks", len ? "; " : "",
                    field[k]);
    if (len >= (int)sizeof msg) break;
    len += known && by_rank
               ? sn__field_by_rank(msg + len, sizeof msg - (size_t)len, k, table, ranks, K,
                                   field_value)
               : field_range(msg + len, sizeof msg - (size_t)len, k, -v[K + k], v[k],
                             known ? -who[K + k] : -1, known ? -who[k] : -1);
  }
  if (len >= (int)sizeof msg) memcpy(msg + sizeof msg - 4, "...", 4); /* cut: say so */
  /* Where naming the ranks failed (a timeout or a broken communicator), that status is returned:
   * the communicator is now unusable, which the caller must learn from the code. */
  return sn__fail(known ? SN_ERR_MISMATCH : got,
                  "%s: ranks disagree on this collective (every rank must call the same layers "
                  "in the same order; a rank that got an error from an earlier call, or skipped "
                  "one, is a call behind); this rank called %s with C %lld (%s): %s%s%s",
                  fn, bn->label, (long long)bn->C, op == OP_FORWARD ? "forward" : "backward", msg,
                  known ? "" : "; then naming the ranks failed: ", why);
}

sn_status_t sn__syncbn_consistency(sn_syncbn_t *bn, const char *fn, int op,
                                   sn_status_t checks, int layout_matters) {
  return check_consistency(bn, fn, op, checks, layout_matters);
}

/* The pivot slots of a forward's all-reduce: two 16-bit hashes h1, h2 of the pivot [C] and
 * their squares, summed over the ranks (exact: integers below 2^53). */
void sn__syncbn_pivot_slots(double slot[SN_PIVOT_SLOTS], const float *pivot, int64_t C) {
  const uint64_t h = fnv1a(pivot, (size_t)C * sizeof(float));
  const double h1 = (double)(h & 0xffffu), h2 = (double)((h >> 16) & 0xffffu);
  slot[0] = h1, slot[1] = h1 * h1, slot[2] = h2, slot[3] = h2 * h2;
}

/* a·b == c·d exactly, for doubles whose products stay below 2^1000: the rounded products and
 * their exact rounding errors (fma) are equal exactly when the products are. */
static int products_equal(double a, double b, double c, double d) {
  const double p = a * b, q = c * d;
  return p == q && fma(a, b, -p) == fma(c, d, -q);
}

/* Whether the summed pivot slots of `ranks` ranks say every rank used the same pivot: N·Σh² ==
 * (Σh)² holds exactly when all h are equal (Cauchy–Schwarz), for both hashes; two different
 * pivots pass only if both 16-bit hashes collide (2^-32). The sums are the same on every rank,
 * so every rank reaches the same verdict. */
int sn__syncbn_pivots_agree(const double slot[SN_PIVOT_SLOTS], int ranks) {
  return products_equal((double)ranks, slot[1], slot[0], slot[0]) &&
         products_equal((double)ranks, slot[3], slot[2], slot[2]);
}

