/* Page locks that nest.
 *
 * mlock() does not count: a page is locked or not, and one munlock() undoes
 * every mlock() before it. So a second UM_WRAP_PIN wrap over the same pages,
 * or a caller's own mlock(), would lose its lock when the first wrap is
 * released. This file keeps, process-wide, the ranges unimem locked (one
 * entry per owner: a pinned wrap, a PINNED block) and the parts of them
 * that were locked already before unimem first locked them (found in
 * /proc/self/smaps, VmFlags "lo"). Releasing a range unlocks only the pages
 * no other owner covers and that nobody had locked before. A caller's mlock
 * of pages unimem has locked already cannot be told apart and ends with
 * unimem's last owner of them.
 *
 * Ranges are whole pages. Every call takes one mutex; these are the slow
 * paths of pinned wraps and pinned allocations, where the system calls cost
 * far more. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base.h"

typedef struct range {
  uintptr_t start, end; /* [start, end), page-aligned */
} range;

typedef struct range_list {
  range *r;
  size_t n, cap;
} range_list;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static range_list owners;  /* one entry per acquire, duplicates allowed */
static range_list foreign; /* locked by someone else before unimem locked them */

static int list_add(range_list *l, uintptr_t start, uintptr_t end) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    range *r = realloc(l->r, cap * sizeof(*r));
    if (r == NULL)
      return -1;
    l->r = r;
    l->cap = cap;
  }
  l->r[l->n].start = start;
  l->r[l->n++].end = end;
  return 0;
}

static int by_start(const void *a, const void *b) {
  uintptr_t x = ((const range *)a)->start, y = ((const range *)b)->start;
  return x < y ? -1 : x > y;
}

/* The parts of [start, end) that no range of l covers, into out. */
static int uncovered(uintptr_t start, uintptr_t end, const range_list *l, range_list *out) {
  range *sorted = NULL;
  uintptr_t at = start;
  if (l->n > 0) {
    if ((sorted = malloc(l->n * sizeof(*sorted))) == NULL)
      return -1;
    memcpy(sorted, l->r, l->n * sizeof(*sorted));
    qsort(sorted, l->n, sizeof(*sorted), by_start);
  }
  for (size_t i = 0; i < l->n && at < end; i++) {
    if (sorted[i].end <= at || sorted[i].start >= end)
      continue;
    if (sorted[i].start > at && list_add(out, at, sorted[i].start) != 0)
      goto fail;
    if (sorted[i].end > at)
      at = sorted[i].end;
  }
  if (at < end && list_add(out, at, end) != 0)
    goto fail;
  free(sorted);
  return 0;
fail:
  free(sorted);
  return -1;
}

/* Parts of [start, end) that lie in locked mappings now. */
static void locked_now(uintptr_t start, uintptr_t end, range_list *out) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  uintptr_t vs = 0, ve = 0;
  if (f == NULL)
    return; /* nothing known: treated as not locked */
  while (fgets(line, sizeof(line), f) != NULL) {
    uintmax_t a, b;
    if (sscanf(line, "%jx-%jx ", &a, &b) == 2) {
      vs = (uintptr_t)a;
      ve = (uintptr_t)b;
    } else if (strncmp(line, "VmFlags:", 8) == 0 && strstr(line, " lo") != NULL) {
      uintptr_t s = vs > start ? vs : start, e = ve < end ? ve : end;
      if (s < e)
        (void)list_add(out, s, e);
    }
  }
  fclose(f);
}

static void page_bounds(const void *addr, size_t bytes, uintptr_t *start, uintptr_t *end) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  *start = (uintptr_t)addr & ~(page - 1);
  *end = ((uintptr_t)addr + bytes + page - 1) & ~(page - 1);
}

int um__pagelock_acquire(void *addr, size_t bytes, int fresh) {
  uintptr_t start, end;
  range_list fresh_parts = {0};
  int st = UM_OK;
  page_bounds(addr, bytes, &start, &end);
  pthread_mutex_lock(&lock);
  /* Pages unimem holds no lock on yet, and which of them are locked: those
   * are someone else's locks, to keep. A fresh mapping has none. */
  if (!fresh && uncovered(start, end, &owners, &fresh_parts) == 0) {
    for (size_t i = 0; i < fresh_parts.n; i++)
      locked_now(fresh_parts.r[i].start, fresh_parts.r[i].end, &foreign);
  }
  if (mlock((void *)start, end - start) != 0) {
    int err = errno;
    st = um__set_error(UM_ENOMEM, "mlock of %zu bytes refused: %s", (size_t)(end - start),
                       strerror(err));
  } else if (list_add(&owners, start, end) != 0) {
    st = um__set_error(UM_ENOMEM, "out of memory for a page-lock record");
  }
  pthread_mutex_unlock(&lock);
  free(fresh_parts.r);
  return st;
}

/* Drop the foreign records inside [start, end): no owner of unimem covers
 * those pages any more, so a later lock of them starts afresh. */
static void forget_foreign(uintptr_t start, uintptr_t end) {
  size_t k = 0;
  for (size_t i = 0; i < foreign.n; i++)
    if (foreign.r[i].start < start || foreign.r[i].end > end)
      foreign.r[k++] = foreign.r[i];
  foreign.n = k;
}

void um__pagelock_release(void *addr, size_t bytes) {
  uintptr_t start, end;
  range_list alone = {0};
  page_bounds(addr, bytes, &start, &end);
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < owners.n; i++) {
    if (owners.r[i].start == start && owners.r[i].end == end) {
      owners.r[i] = owners.r[--owners.n];
      break;
    }
  }
  /* Pages no other owner covers, less those locked before unimem came. If
   * the bookkeeping cannot be done (no memory), keep the lock: a page left
   * locked is safer than a lock taken from its owner. */
  if (uncovered(start, end, &owners, &alone) == 0) {
    for (size_t i = 0; i < alone.n; i++) {
      range_list unlock = {0};
      if (uncovered(alone.r[i].start, alone.r[i].end, &foreign, &unlock) == 0)
        for (size_t j = 0; j < unlock.n; j++)
          munlock((void *)unlock.r[j].start, unlock.r[j].end - unlock.r[j].start);
      free(unlock.r);
      forget_foreign(alone.r[i].start, alone.r[i].end);
    }
  }
  pthread_mutex_unlock(&lock);
  free(alone.r);
}
