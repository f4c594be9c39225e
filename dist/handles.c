/*
 * handles.c — the set of live communicator and SyncBatchNorm handles.
 *
 * A handle is checked against this set before the library reads through it: a destroyed handle
 * then gives SN_ERR_INVALID_HANDLE instead of a read of freed memory. A handle whose address a later create reuses is that new object again, as with free() and
 * malloc(): the set cannot tell them apart.
 *
 * Each entry has its kind (SN_HANDLE_COMM, SN_HANDLE_SYNCBN), so that a layer passed as a
 * communicator is not one. A destroy takes its handle out of the set and frees it only if it was
 * there, in one step under the lock: two threads destroying the same handle free it once (a
 * check and a removal in two steps could free it twice).
 *
 * An unsorted array under a mutex: programs hold tens of handles (a layer per BatchNorm of a
 * network), and each check is one scan, small next to any collective or kernel.
 */
#include <pthread.h>
#include <stdlib.h>

#include "comm_internal.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const void *h;
  int kind;
} *live;
static size_t count, capacity;

/* The index of (h, kind) in live, or count; under the lock. */
static size_t find(const void *h, int kind) {
  size_t i = 0;
  while (i < count && !(live[i].h == h && live[i].kind == kind)) i++;
  return i;
}

int sn__handle_add(const void *h, int kind) {
  int ok = 1;
  pthread_mutex_lock(&lock);
  if (count == capacity) {
    const size_t cap = capacity ? 2 * capacity : 64;
    void *grown = realloc(live, cap * sizeof *live);
    if (grown == NULL) ok = 0;
    else live = grown, capacity = cap;
  }
  if (ok) live[count].h = h, live[count].kind = kind, count++;
  pthread_mutex_unlock(&lock);
  return ok;
}

int sn__handle_take(const void *h, int kind) {
  pthread_mutex_lock(&lock);
  const size_t i = find(h, kind);
  const int found = i < count;
  if (found) live[i] = live[--count];
  pthread_mutex_unlock(&lock);
  return found;
}

int sn__handle_live(const void *h, int kind) {
  pthread_mutex_lock(&lock);
  const int found = find(h, kind) < count;
  pthread_mutex_unlock(&lock);
  return found;
}
