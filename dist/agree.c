/*
 * agree.c — the text of a disagreement across ranks: which ranks hold which value of a field,
 * read from a [ranks, fields] table in which every rank filled its own row (one sum
 * all-reduce). Used by SyncBatchNorm's check_consistency (syncbn.c) and by the communicator's
 * call check (SN_COMM_CHECK, comm.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include "comm_internal.h"

/* Values listed per field, and ranks per value (then "..."). */
enum { MSG_VALUES = 3, MSG_RANKS = 6 };

typedef struct {
  int leader; /* the first rank with the value */
  int count;  /* ranks with it */
} group_t;

static int group_order(const void *a, const void *b) { /* most ranks first, then by rank */
  const group_t *p = a, *q = b;
  if (p->count != q->count) return p->count > q->count ? -1 : 1;
  return (p->leader > q->leader) - (p->leader < q->leader);
}

int sn__field_by_rank(char *out, size_t size, int k, const int64_t *table, int ranks, int nf,
                      sn__field_text_t text) {
  group_t groups[SN_MSG_TABLE_RANKS];
  if (ranks > SN_MSG_TABLE_RANKS) ranks = SN_MSG_TABLE_RANKS; /* callers stay below */
  int ng = 0;
  for (int r = 0; r < ranks; r++) {
    int g = 0;
    while (g < ng && table[(int64_t)groups[g].leader * nf + k] != table[(int64_t)r * nf + k]) g++;
    if (g == ng) groups[ng].leader = r, groups[ng].count = 0, ng++;
    groups[g].count++;
  }
  qsort(groups, (size_t)ng, sizeof *groups, group_order);
  int len = snprintf(out, size, " (");
  for (int g = 0; g < ng && g < MSG_VALUES && len < (int)size; g++) {
    const int64_t v = table[(int64_t)groups[g].leader * nf + k];
    char value[32];
    text(value, sizeof value, k, v, g == 0);
    len += snprintf(out + len, size - (size_t)len, "%s%s on rank%s", g ? "; " : "", value,
                    groups[g].count > 1 ? "s" : "");
    for (int r = groups[g].leader, shown = 0; r < ranks && len < (int)size; r++) {
      if (table[(int64_t)r * nf + k] != v) continue;
      if (shown == MSG_RANKS) {
        len += snprintf(out + len, size - (size_t)len, ", ... (%d ranks)", groups[g].count);
        break;
      }
      len += snprintf(out + len, size - (size_t)len, "%s %d", shown ? "," : "", r);
      shown++;
    }
  }
  if (ng > MSG_VALUES && len < (int)size)
    len += snprintf(out + len, size - (size_t)len, "; %d more value%s", ng - MSG_VALUES,
                    ng - MSG_VALUES > 1 ? "s" : "");
  if (len < (int)size) len += snprintf(out + len, size - (size_t)len, ")");
  return len;
}
