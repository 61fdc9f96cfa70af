/* The history: a bounded ring of events (um_history_start), written by
 * whoever observes them (observe.c: allocations and releases; ops/: copies,
 * fills, brackets, net transfers, maps; mem/: trims, through the upcall)
 * under one spin lock (held for one struct copy: cheaper than a mutex on
 * every event), and its export as Chrome trace-event JSON.
 *
 * Recording makes the manager observe (observe.c), so the events come from
 * the locked paths. A ring stays until the next start or the manager's
 * destroy; a writer that read the ring's pointer just before a new start
 * may still write into the old one, which is therefore only freed at
 * destroy (the retired list). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define HIST_MAX ((size_t)1 << 26)

struct um__hist {
  atomic_flag lock;
  um_history_event *ring;
  size_t cap;
  uint64_t next;      /* events written: the newest is next - 1 */
  atomic_bool recording; /* read without the lock by um__hist_on */
  struct um__hist *retired;
};

static void hist_lock(struct um__hist *h) {
  for (unsigned spins = 0; atomic_flag_test_and_set_explicit(&h->lock, memory_order_acquire); spins++)
    if (spins > 64)
      sched_yield(); /* the holder was preempted */
    else
      um__cpu_pause();
}

static void hist_unlock(struct um__hist *h) { atomic_flag_clear_explicit(&h->lock, memory_order_release); }

static struct um__hist *hist_new(size_t cap) {
  struct um__hist *h = calloc(1, sizeof(*h));
  if (h == NULL || (h->ring = calloc(cap, sizeof(*h->ring))) == NULL) {
    free(h);
    return NULL;
  }
  atomic_flag_clear(&h->lock);
  h->cap = cap;
  return h;
}

static void hist_free(struct um__hist *h) {
  while (h != NULL) {
    struct um__hist *next = h->retired;
    free(h->ring);
    free(h);
    h = next;
  }
}

void um__hist_destroy(um_manager *m) {
  hist_free(atomic_load(&m->hist));
  atomic_store(&m->hist, NULL);
}

int um_history_start(um_manager *m, size_t capacity) {
  struct um__hist *h, *old;
  int st = um__obs_check(m, "um_history_start");
  if (st != UM_OK)
    return st;
  if (capacity == 0 || capacity > HIST_MAX)
    return um__set_error(UM_EINVAL, "um_history_start: a capacity of %zu events (1 to %zu)", capacity, HIST_MAX);
  old = atomic_load(&m->hist);
  if (old != NULL && old->recording)
    return um__set_error(UM_ESTATE, "um_history_start: the manager records already");
  if ((h = hist_new(capacity)) == NULL)
    return um__set_error(UM_ENOMEM, "um_history_start: no memory for %zu events", capacity);
  h->retired = old;
  atomic_store_explicit(&h->recording, true, memory_order_relaxed);
  atomic_store(&m->hist, h);
  um__obs_history(m, true);
  return UM_OK;
}

int um_history_stop(um_manager *m) {
  struct um__hist *h;
  int st = um__obs_check(m, "um_history_stop");
  if (st != UM_OK)
    return st;
  h = atomic_load(&m->hist);
  if (h == NULL || !h->recording)
    return um__set_error(UM_ESTATE, "um_history_stop: the manager does not record");
  hist_lock(h);
  atomic_store_explicit(&h->recording, false, memory_order_relaxed);
  hist_unlock(h);
  um__obs_history(m, false);
  return UM_OK;
}

bool um__hist_on(um_manager *m) {
  struct um__hist *h = atomic_load_explicit(&m->hist, memory_order_acquire);
  return h != NULL && atomic_load_explicit(&h->recording, memory_order_relaxed);
}

void um__hist_put(um_manager *m, const um_history_event *e) {
  struct um__hist *h = atomic_load_explicit(&m->hist, memory_order_acquire);
  if (h == NULL)
    return;
  hist_lock(h);
  if (atomic_load_explicit(&h->recording, memory_order_relaxed))
    h->ring[h->next++ % h->cap] = *e;
  hist_unlock(h);
}

int um_history_get(um_manager *m, um_history_event *out, size_t cap, size_t *count, uint64_t *dropped) {
  struct um__hist *h;
  size_t n = 0, held = 0;
  uint64_t first = 0;
  int st = um__obs_check(m, "um_history_get");
  if (st != UM_OK)
    return st;
  if (out == NULL && cap > 0)
    return um__set_error(UM_EINVAL, "um_history_get: NULL out");
  h = atomic_load(&m->hist);
  if (h != NULL) {
    hist_lock(h);
    held = h->next < h->cap ? (size_t)h->next : h->cap;
    first = h->next - held;
    for (n = 0; n < held && n < cap; n++)
      out[n] = h->ring[(first + n) % h->cap];
    hist_unlock(h);
  }
  if (count != NULL)
    *count = held;
  if (dropped != NULL)
    *dropped = first;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* The trace-event export */

static const char *const kind_names[] = {"alloc", "release", "trim", "copy", "fill",
                                         "bracket", "net put", "net get", "map", "out of memory"};

/* The lane (thread id) of a slice, per direction, and its name. */
static int lane_of(const um_history_event *e) {
  switch (e->kind) {
  case UM_HIST_COPY:
    if (e->src_device == e->dst_device || (e->src_device <= 0 && e->dst_device <= 0))
      return 12;
    if (e->src_device <= 0)
      return 10;
    if (e->dst_device <= 0)
      return 11;
    return 13;
  case UM_HIST_FILL:
    return 12;
  case UM_HIST_BRACKET:
    return 14;
  case UM_HIST_NET_PUT:
    return 15;
  case UM_HIST_NET_GET:
    return 16;
  default:
    return 1;
  }
}

static const char *const lane_names[] = {"allocations", "copies host to device", "copies device to host",
                                         "copies and fills on the device", "copies between devices",
                                         "the caller's kernels (brackets)", "net puts", "net gets"};

static double us(uint64_t ns) { return (double)ns / 1000.0; }

/* Per tag and device: the bytes in use, for the "in use by tag" counter. */
typedef struct tag_use {
  const char *tag;
  int device;
  int64_t bytes;
} tag_use;

static void write_tag_counter(FILE *f, const tag_use *u, int nu, int device, uint64_t ts_ns) {
  bool first = true;
  fprintf(f, ",\n{\"name\": \"in use by tag\", \"ph\": \"C\", \"ts\": %.3f, \"pid\": %d, \"args\": {", us(ts_ns),
          device);
  for (int i = 0; i < nu; i++) {
    if (u[i].device != device)
      continue;
    fputs(first ? "" : ", ", f);
    um__json_string(f, u[i].tag[0] != '\0' ? u[i].tag : "(untagged)");
    fprintf(f, ": %lld", (long long)(u[i].bytes > 0 ? u[i].bytes : 0));
    first = false;
  }
  fputs("}}", f);
}

static int write_events(FILE *f, um_manager *m, const um_history_event *ev, size_t n, uint64_t dropped) {
  tag_use *use = NULL;
  int nuse = 0, ndev = um__ndevices(m);
  fprintf(f, "{\"displayTimeUnit\": \"ns\", \"otherData\": {\"format\": \"unimem history 1\", \"dropped\": %llu},\n"
             "\"traceEvents\": [\n",
          (unsigned long long)dropped);
  for (int d = 0; d < ndev; d++) {
    um_device_info info;
    char name[300];
    if (um_device_info_get(m->devices[d], &info) != UM_OK)
      continue;
    snprintf(name, sizeof(name), "device %d: %s", d, info.name);
    fprintf(f, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": ", d ? ",\n" : "",
            d);
    um__json_string(f, name);
    fprintf(f, "}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"sort_index\": %d}}",
            d, d);
    for (int l = 0; l < 8; l++)
      fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
              d, l == 0 ? 1 : 9 + l, lane_names[l]);
  }
  for (size_t i = 0; i < n; i++) {
    const um_history_event *e = &ev[i];
    const char *kind = (unsigned)e->kind < sizeof(kind_names) / sizeof(*kind_names) ? kind_names[e->kind] : "?";
    bool slice = e->kind == UM_HIST_COPY || e->kind == UM_HIST_FILL || e->kind == UM_HIST_BRACKET ||
                 e->kind == UM_HIST_NET_PUT || e->kind == UM_HIST_NET_GET;
    fprintf(f, ",\n{\"name\": \"%s%s%s\", \"cat\": \"%s\", ", kind, e->path != NULL ? " " : "",
            e->path != NULL ? e->path : "", kind);
    if (slice)
      fprintf(f, "\"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, ", us(e->begin_ns),
              us(e->end_ns >= e->begin_ns ? e->end_ns - e->begin_ns : 0));
    else
      fprintf(f, "\"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, ", us(e->end_ns));
    fprintf(f, "\"pid\": %d, \"tid\": %d, \"args\": {\"kind\": %d, \"bytes\": %llu, \"address\": %llu, \"tag\": ",
            e->device, lane_of(e), (int)e->kind, (unsigned long long)e->bytes, (unsigned long long)e->address);
    um__json_string(f, e->tag != NULL ? e->tag : "");
    fprintf(f, ", \"thread\": %u, \"status\": %d, \"location\": %d, \"how\": %d, \"src_device\": %d, "
               "\"dst_device\": %d, \"in_use\": %llu, \"site\": ",
            e->thread, e->status, (int)e->loc, e->how, e->src_device, e->dst_device,
            (unsigned long long)e->in_use);
    um__json_site(f, e->site_file, e->site_line);
    fputs("}}", f);
    if (e->kind == UM_HIST_ALLOC || e->kind == UM_HIST_RELEASE) {
      const char *tag = e->tag != NULL ? e->tag : "";
      int k;
      fprintf(f, ",\n{\"name\": \"in use\", \"ph\": \"C\", \"ts\": %.3f, \"pid\": %d, \"args\": {\"bytes\": %llu}}",
              us(e->end_ns), e->device, (unsigned long long)e->in_use);
      for (k = 0; k < nuse && (use[k].device != e->device || strcmp(use[k].tag, tag) != 0); k++)
        ;
      if (k == nuse) {
        tag_use *grown = realloc(use, (size_t)(nuse + 1) * sizeof(*use));
        if (grown == NULL) {
          free(use);
          return UM_ENOMEM;
        }
        use = grown;
        use[nuse++] = (tag_use){tag, e->device, 0};
      }
      use[k].bytes += e->kind == UM_HIST_ALLOC ? (int64_t)e->bytes : -(int64_t)e->bytes;
      write_tag_counter(f, use, nuse, e->device, e->end_ns);
    }
  }
  fputs("\n]}\n", f);
  free(use);
  return UM_OK;
}

int um_history_write(um_manager *m, const char *path) {
  um_history_event *ev;
  size_t n, held;
  uint64_t dropped;
  FILE *f;
  int st, bad;
  if ((st = um__obs_check(m, "um_history_write")) != UM_OK)
    return st;
  if (path == NULL)
    return um__set_error(UM_EINVAL, "um_history_write: NULL path");
  if (atomic_load(&m->hist) == NULL)
    return um__set_error(UM_ESTATE, "um_history_write: nothing was recorded (um_history_start)");
  um_history_get(m, NULL, 0, &n, NULL);
  if ((ev = malloc((n ? n : 1) * sizeof(*ev))) == NULL)
    return um__set_error(UM_ENOMEM, "um_history_write: out of memory");
  /* Recording goes on meanwhile: the ring may hold more by now, of which
   * the n oldest are copied (then the dropped count is theirs). */
  um_history_get(m, ev, n, &held, &dropped);
  n = n < held ? n : held;
  f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
  if (f == NULL) {
    free(ev);
    return um__set_error(UM_EBACKEND, "um_history_write: cannot write %s: %s", path, strerror(errno));
  }
  st = write_events(f, m, ev, n, dropped);
  free(ev);
  bad = ferror(f);
  bad |= f != stdout ? fclose(f) : fflush(f);
  if (st != UM_OK)
    return um__set_error(st, "um_history_write: out of memory");
  if (bad)
    return um__set_error(UM_EBACKEND, "um_history_write: writing %s failed", path);
  return UM_OK;
}
