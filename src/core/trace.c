/* UNIMEM_TRACE_FILE=path: every allocation and release of a manager's
 * buffers, one line each, in the replay format of bench/traces (bench_pool
 * --trace, unimem bench pool --trace): "a ID BYTES" and "f ID", each
 * followed by the device index, the location, the thread (a small number
 * per thread, in the order threads first allocated) and the nanoseconds
 * since the manager was created. Replay reads the first fields and ignores
 * the rest. An id is free again once its buffer is released, so ids stay
 * small in a long run.
 *
 * Ids start at 1 (0: a buffer not recorded, such as a wrap).
 *
 * "%p" in the path becomes the process id; the second manager of the
 * process to record writes the path with ".2" appended, the third ".3", and
 * so on, so every file is one manager's. Recording takes every allocation
 * and release through the pool's locked path (the thread caches are off,
 * tcache.c): slower, and every event is seen in order under one lock.
 * Lines are buffered here (not in stdio, which a fork child's exit would
 * flush a second time) and written when the buffer fills and at
 * um_manager_destroy; a file that cannot be opened is logged and nothing is
 * recorded. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#define TRACE_BUF 65536

struct um__trace {
  pthread_mutex_t lock;
  int fd;
  bool failed; /* a write failed: said at close */
  size_t used;
  char buf[TRACE_BUF];
  uint64_t t0;
  uint32_t *free_ids; /* released ids, reused last-in first-out */
  size_t nfree, cap;
  uint32_t next_id;
};

static _Atomic int trace_managers;            /* managers that recorded, for the suffix */

/* The path with %p expanded and, for the n-th concurrent recorder, ".n". */
void um__expand_path(const char *pattern, int n, char *out, size_t cap) {
  size_t o = 0;
  for (const char *p = pattern; *p && o + 1 < cap; p++) {
    if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)snprintf(out + o, cap - o, "%ld", (long)getpid());
      p++;
    } else {
      out[o++] = *p;
    }
    if (o >= cap)
      o = cap - 1;
  }
  out[o] = '\0';
  if (n > 1 && o + 1 < cap)
    snprintf(out + o, cap - o, ".%d", n);
}

static void flush_locked(um__trace *t) {
  for (size_t done = 0; done < t->used;) {
    ssize_t n = write(t->fd, t->buf + done, t->used - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      t->failed = true;
      break;
    }
    done += (size_t)n;
  }
  t->used = 0;
}

/* One line into the buffer (flushed first when it might not fit). */
static void put_line(um__trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_line(um__trace *t, const char *fmt, ...) {
  va_list ap;
  int n;
  if (TRACE_BUF - t->used < 256)
    flush_locked(t);
  va_start(ap, fmt);
  n = vsnprintf(t->buf + t->used, TRACE_BUF - t->used, fmt, ap);
  va_end(ap);
  if (n > 0 && (size_t)n < TRACE_BUF - t->used)
    t->used += (size_t)n;
}

void um__trace_open(um_manager *m) {
  const char *pattern = getenv("UNIMEM_TRACE_FILE");
  char path[4096];
  um__trace *t;
  if (pattern == NULL || *pattern == '\0')
    return;
  um__expand_path(pattern, atomic_fetch_add(&trace_managers, 1) + 1, path, sizeof(path));
  if ((t = calloc(1, sizeof(*t))) == NULL ||
      (t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    um__log(&m->opts, UM_LOG_ERROR, "UNIMEM_TRACE_FILE: cannot write %s: nothing is recorded", path);
    free(t);
    return;
  }
  pthread_mutex_init(&t->lock, NULL);
  t->t0 = um__now_ns();
  put_line(t, "# unimem allocation trace: UNIMEM_TRACE_FILE, process %ld\n"
              "# a ID BYTES DEVICE LOCATION THREAD NS: allocate; f ID DEVICE LOCATION THREAD NS: release\n",
           (long)getpid());
  m->trace = t;
}

void um__trace_close(um_manager *m) {
  um__trace *t = m->trace;
  if (t == NULL)
    return;
  m->trace = NULL;
  flush_locked(t);
  if (close(t->fd) != 0 || t->failed)
    um__log(&m->opts, UM_LOG_ERROR, "UNIMEM_TRACE_FILE: the trace could not be written whole");
  pthread_mutex_destroy(&t->lock);
  free(t->free_ids);
  free(t);
}

void um__trace_alloc(um_manager *m, um_buffer *b) {
  um__trace *t = m->trace;
  uint64_t ns = um__now_ns() - t->t0;
  unsigned th = um__thread_number();
  pthread_mutex_lock(&t->lock);
  b->trace_id = t->nfree > 0 ? t->free_ids[--t->nfree] : ++t->next_id;
  put_line(t, "a %u %zu %d %d %u %llu\n", b->trace_id, b->size, b->dev->index, (int)b->loc, th,
           (unsigned long long)ns);
  pthread_mutex_unlock(&t->lock);
}

void um__trace_release(um_manager *m, um_buffer *b) {
  um__trace *t = m->trace;
  uint64_t ns = um__now_ns() - t->t0;
  unsigned th = um__thread_number();
  if (b->trace_id == 0) /* not recorded: a wrap, or allocated before */
    return;
  pthread_mutex_lock(&t->lock);
  put_line(t, "f %u %d %d %u %llu\n", b->trace_id, b->dev->index, (int)b->loc, th, (unsigned long long)ns);
  if (t->nfree == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 256;
    uint32_t *grown = realloc(t->free_ids, cap * sizeof(*grown));
    if (grown != NULL) {
      t->free_ids = grown;
      t->cap = cap;
    }
  }
  if (t->nfree < t->cap) /* else the id is not reused: ids grow, nothing is wrong */
    t->free_ids[t->nfree++] = b->trace_id;
  pthread_mutex_unlock(&t->lock);
  b->trace_id = 0;
}
