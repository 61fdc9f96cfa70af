/* Statistics: per-device counters (relaxed atomics), summed on demand. The
 * figures that are not sums (peaks, largest idle block, fragmentation) are
 * kept or computed at the manager level.
 *
 * The hot counters (allocations, releases, pool hits, live buffers and
 * bytes) are kept per thread in the thread caches (tcache.h) and added
 * here on read; a thread's share moves into the device's counters when it
 * exits. The peaks are brought up to date, from the exact sum over all
 * threads, when a thread whose own bytes in use passed its highest level
 * so far turns down (its next release), after a run of new highs of a
 * thread that keeps growing (tcache.h), and when a thread leaves; a read adds the level of
 * the moment. Exact for one thread (and for threads that take turns); with
 * several threads allocating at the same moment, a peak that no such
 * moment of a single thread coincides with can be missed. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

static void add_device(um_stats *s, um_device *d) {
  const um__counters *c = &d->stats;
#define SUM(f) s->f += (uint64_t)um__atomic_load_relaxed(&c->f)
  SUM(bytes_in_use);
  SUM(bytes_reserved);
  SUM(bytes_pooled);
  SUM(allocations);
  SUM(releases);
  SUM(pool_hits);
  SUM(pool_misses);
  SUM(device_allocs);
  SUM(device_frees);
  SUM(trims);
  SUM(bytes_trimmed);
  SUM(oom_retries);
  SUM(bytes_h2d);
  SUM(bytes_d2h);
  SUM(bytes_d2d);
  SUM(bytes_peer);
  SUM(xfer_local);
  SUM(xfer_peer);
  SUM(xfer_direct);
  SUM(xfer_pipelined);
  SUM(xfer_staged);
  SUM(fills);
  SUM(bytes_net_out);
  SUM(bytes_net_in);
  SUM(xfer_net);
#undef SUM
  for (int l = 0; l < UM_LOCATION_COUNT; l++) {
    um__seg_stats g = {0};
    uint64_t seg_largest;
    um__pool_largest(&d->pools[l], &s->largest_pooled_block);
    um__seg_stats_add(&d->pools[l], &g);
    /* The largest free extent is an idle block a carve takes whole; of a
     * virtual segment, no more of it than its free memory counts. */
    seg_largest = g.largest_free < g.free_bytes ? g.largest_free : g.free_bytes;
    if (seg_largest > s->largest_pooled_block)
      s->largest_pooled_block = seg_largest;
    s->segments += g.segments;
    s->bytes_segment_free += g.free_bytes;
    s->free_extents += g.free_extents;
    if (g.largest_free > s->largest_free_extent)
      s->largest_free_extent = g.largest_free;
  }
}

int um_stats_get(um_manager *m, um_device *d, um_stats *out) {
  um_stats s;
  if (!um__manager_ok(m) || out == NULL)
    return um__set_error(UM_EINVAL, "um_stats_get: NULL argument or not a manager");
  if (d != NULL && !um__device_ok(d))
    return um__set_error(UM_EINVAL, "um_stats_get: not a device");
  if (d != NULL && d->m != m)
    return um__set_error(UM_EINVAL, "um_stats_get: device belongs to another manager");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  memset(&s, 0, sizeof(s));
  /* The caches' list lock: a thread's exit moves its counters into the
   * device's under it, so each share is counted once. */
  pthread_mutex_lock(&m->tcache_lock);
  if (d != NULL) {
    add_device(&s, d);
    s.peak_bytes_in_use = um__atomic_load_relaxed(&d->stats.peak_bytes_in_use);
  } else {
    for (int i = 0; i < um__ndevices(m); i++)
      add_device(&s, m->devices[i]);
    s.peak_bytes_in_use = um__atomic_load_relaxed(&m->peak_bytes_in_use);
  }
  um__tcache_stats_add(m, d, &s);
  pthread_mutex_unlock(&m->tcache_lock);
  /* Every buffer that went live was counted in allocations, and in
   * releases when it was released (the hot paths count no third figure). */
  s.active_buffers = s.allocations - s.releases;
  /* Free extents are idle memory held from the devices, as idle blocks are. */
  s.bytes_pooled += s.bytes_segment_free;
  if (s.bytes_in_use > s.peak_bytes_in_use)
    s.peak_bytes_in_use = s.bytes_in_use; /* a concurrent new high not yet noted */
  s.hit_rate = (s.pool_hits + s.pool_misses) ? (double)s.pool_hits / (double)(s.pool_hits + s.pool_misses) : 0.0;
  s.fragmentation = s.bytes_pooled ? 1.0 - (double)s.largest_pooled_block / (double)s.bytes_pooled : 0.0;
  if (s.fragmentation < 0.0)
    s.fragmentation = 0.0; /* a block can leave between the two reads */
  *out = s;
  return UM_OK;
}

/* Append to buf (cap bytes, *len written so far, counting what did not
 * fit); *failed once a format fails. */
__attribute__((format(printf, 5, 6))) static void append(char *buf, size_t cap, size_t *len, bool *failed,
                                                         const char *fmt, ...) {
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(buf ? buf + (*len < cap ? *len : cap) : NULL, *len < cap ? cap - *len : 0, fmt, ap);
  va_end(ap);
  if (n < 0)
    *failed = true;
  else
    *len += (size_t)n;
}

int um_stats_json(const um_stats *s, char *buf, size_t cap) {
  size_t len = 0;
  bool failed = false;
  if (s == NULL || (buf == NULL && cap != 0))
    return um__set_error(UM_EINVAL, "um_stats_json: NULL argument");
#define APPEND(...) append(buf, cap, &len, &failed, __VA_ARGS__)
#define FMT_uint64_t(name) APPEND("%s\"%s\":%llu", first ? "" : ",", #name, (unsigned long long)s->name)
#define FMT_double(name) APPEND("%s\"%s\":%.6f", first ? "" : ",", #name, s->name)
#define EMIT(type, name, desc)                                                 \
  FMT_##type(name);                                                            \
  first = 0;
  int first = 1;
  APPEND("{");
  UM_STATS_FIELDS(EMIT)
  APPEND("}");
#undef EMIT
#undef FMT_double
#undef FMT_uint64_t
#undef APPEND
  if (failed)
    return um__set_error(UM_EINVAL, "um_stats_json: format failed");
  return len > (size_t)INT32_MAX ? UM_EOVERFLOW : (int)len;
}
