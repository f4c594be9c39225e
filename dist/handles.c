/*
 * handles.c — the set of live communicator and SyncBatchNorm handles.
 *
 * A handle is checked against this set before the library reads through it: a destroyed handle
 * then gives SN_ERR_INVALID_HANDLE instead of a read of freed memory (an API-misuse audit found
 * sn_syncbn_forward on a destroyed layer reading it, and a stale handle driving the layer later
 * allocated at the same address). A handle whose address a later create reuses is that new
 * object again, as with free() and malloc(): the set cannot tell them apart.
 *
 * An unsorted array under a mutex: programs hold tens of handles (a layer per BatchNorm of a
 * network), and each check is one scan, small next to any collective or kernel.
 */
#include <pthread.h>
#include <stdlib.h>

#include "comm_internal.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const void **live;
static size_t count, capacity;

int sn__handle_add(const void *h) {
  int ok = 1;
  pthread_mutex_lock(&lock);
  if (count == capacity) {
    const size_t cap = capacity ? 2 * capacity : 64;
    const void **grown = realloc(live, cap * sizeof *grown);
    if (grown == NULL) ok = 0;
    else live = grown, capacity = cap;
  }
  if (ok) live[count++] = h;
  pthread_mutex_unlock(&lock);
  return ok;
}

void sn__handle_remove(const void *h) {
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < count; i++)
    if (live[i] == h) {
      live[i] = live[--count];
      break;
    }
  pthread_mutex_unlock(&lock);
}

int sn__handle_live(const void *h) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < count && !found; i++) found = live[i] == h;
  pthread_mutex_unlock(&lock);
  return found;
}
