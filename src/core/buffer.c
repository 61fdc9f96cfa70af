/* Buffers: allocation (the thread cache's hit, then the pool's bins, then
 * a new block from the device with the pressure retry), wrapping caller
 * memory, release, and the getters. The host mapping is map.c's; what
 * happens to a released buffer's block is buffer_state.c's and block_return.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "testhook.h"

/* Sizes above this are refused outright: size classes stop at 2^63 and no
 * device comes near it. */
#define MAX_ALLOC_BYTES ((size_t)1 << 62)

/* Allocate a block, and under pressure release the device's idle blocks
 * and retry once (trim_on_pressure); then let the application's callback
 * free memory and ask for one more try. What the callback released went to
 * the pool, so the idle blocks go back to the device before that try
 * whatever trim_on_pressure says: the callback asked for the memory. */
static int block_alloc_pressured(um_device *d, um_location loc, size_t bytes, um__mem *mem) {
  um_manager *m = d->m;
  int st = um__block_alloc(d, loc, bytes, mem);
  if (st != UM_ENOMEM)
    return st;
  if (m->opts.trim_on_pressure) {
    um__trim_for_pressure(d);
    UM__STAT_ADD(d, oom_retries, 1);
    st = um__block_alloc(d, loc, bytes, mem);
    if (st != UM_ENOMEM)
      return st;
  }
  if (m->opts.on_oom != NULL && m->opts.on_oom(m->opts.oom_ctx, d, bytes)) {
    um__trim_for_pressure(d);
    UM__STAT_ADD(d, oom_retries, 1);
    st = um__block_alloc(d, loc, bytes, mem);
  }
  return st;
}

/* b is the caller's now: count it (in this thread's cache when there is
 * one), and publish it live. */
/* how: UM_HIST_POOL (a hit), UM_HIST_CARVE (counted as one), UM_HIST_DEVICE. */
static inline __attribute__((always_inline)) void go_live(um_device *d, um__tcache *tc, um_buffer *b,
                                                         size_t bytes, int how, um_buffer **out) {
  bool hit = how != UM_HIST_DEVICE;
  if (tc != NULL) {
    um__tcounters *c = &tc->ctr[d->index];
    um__tcounter_add(hit ? &c->pool_hits : &c->not_hits, 1);
    um__tcache_count_in(tc, d, bytes);
  } else {
    if (hit)
      UM__STAT_ADD(d, pool_hits, 1);
    UM__STAT_ADD(d, allocations, 1);
    um__stat_in_use_add(d, bytes);
  }
  atomic_store_explicit(&b->state, UM__BUF_LIVE, memory_order_release);
  *out = b;
  if (__builtin_expect(atomic_load_explicit(&d->m->observing, memory_order_relaxed) != 0, 0))
    um__obs_alloc(b, how);
}

/* An idle block taken from the pool for a new owner, zeroed when asked;
 * back to the pool when zeroing fails. from_slot: it came from a thread
 * cache's slot, whose blocks are clean (tcache.h). */
static inline __attribute__((always_inline)) int reuse_block(um_buffer *b, size_t bytes, unsigned flags,
                                                             const char *file, int line, bool from_slot) {
  int st = UM_OK;
  if (from_slot)
    um__buffer_go_live_clean(b, bytes, file, line);
  else
    um__buffer_init_live(b, bytes, file, line);
  if (__builtin_expect((flags & UM_ALLOC_ZERO) || b->m->opts.scrub, 0)) {
    st = um__block_zero(b, bytes);
    if (st != UM_OK)
      um__pool_put(&b->dev->pools[b->loc], b);
  }
  return st;
}

/* No segment holds room for capacity bytes, and the device gave no new
 * one: say so with the pool's free extents when they add up to enough. */
static int fragmented_error(um__pool *p, size_t capacity, int st) {
  um__seg_stats s = {0};
  um__seg_stats_add(p, &s);
  if (st != UM_ENOMEM || s.free_bytes < capacity)
    return st;
  return um__set_error(UM_ENOMEM,
                       "um_alloc: %zu bytes on %s: the device gave no new segment (%s), and the %llu free bytes of "
                       "its %llu segments lie in %llu extents, the largest %llu bytes",
                       capacity, p->dev->info.name, um_last_error(), (unsigned long long)s.free_bytes,
                       (unsigned long long)s.segments, (unsigned long long)s.free_extents,
                       (unsigned long long)s.largest_free);
}

/* A pooled block carved from the pool's segments, in segment.c's order
 * ("Growing"). The thread caches of other threads keep their blocks:
 * taking them would stop every thread. A new segment is of the preferred
 * size or, refused, of just this block's, with the pressure path's
 * retries. *fresh: a new segment was needed (a pool miss). */
static int carve_block(um_device *d, um_location loc, size_t capacity, um__mem *mem, bool *fresh) {
  um__pool *p = &d->pools[loc];
  um__mem seg;
  size_t bytes;
  int st;
  *fresh = false;
  if ((st = um__seg_carve(p, capacity, false, mem)) != UM_ENOMEM)
    return st;
  if (um__pool_return_idle(p) > 0 && (st = um__seg_carve(p, capacity, false, mem)) != UM_ENOMEM)
    return st;
  if (um__tcache_flush_own_pool(d->m, d, loc) > 0 && um__pool_return_idle(p) > 0 &&
      (st = um__seg_carve(p, capacity, false, mem)) != UM_ENOMEM)
    return st;
  /* Virtual segments: new memory inside one (segment.c gives back free
   * memory first when the pool would pass its peak). */
  if ((st = um__seg_carve(p, capacity, true, mem)) != UM_ENOMEM)
    return st;
  *fresh = true;
  bytes = um__seg_size_for(p, capacity);
  um__seg_before_grow(p, bytes);
  st = bytes != 0 ? um__block_alloc(d, loc, bytes, &seg) : UM_ENOMEM;
  if (st == UM_ENOMEM && (bytes = um__seg_exact_size(p, capacity)) != 0)
    st = block_alloc_pressured(d, loc, bytes, &seg);
  if (st != UM_OK)
    return fragmented_error(p, capacity, st);
  return um__seg_add_and_carve(p, &seg, bytes, capacity, mem);
}

/* A miss: a new block from the device (or carved from a segment), with a
 * descriptor. *fresh: from the device (not carved from a segment it had). */
static int new_block(um_device *d, size_t bytes, size_t capacity, int cls, um_location loc,
                     unsigned flags, um_buffer **out, const char *file, int line, bool *fresh) {
  um__mem mem;
  um_buffer *b;
  int st;
  *fresh = true;
  if (cls >= 0 && d->pools[loc].segs != NULL)
    st = carve_block(d, loc, capacity, &mem, fresh);
  else
    st = block_alloc_pressured(d, loc, capacity, &mem);
  if (st != UM_OK)
    return st;
  if ((b = um__descriptor_get(d->m)) == NULL) {
    um__block_free(d, loc, capacity, &mem);
    return um__set_error(UM_ENOMEM, "um_alloc: out of memory for a descriptor");
  }
  b->dev = d;
  b->loc = loc;
  b->kind = cls >= 0 ? UM__KIND_POOLED : UM__KIND_UNPOOLED;
  b->capacity = capacity;
  b->cls = cls;
  b->mem = mem;
  b->slot = cls >= 0 && cls < UM__TCACHE_CLASSES ? um__tcache_slot_index(d, loc, cls) : UM__NO_SLOT;
  um__buffer_init_live(b, bytes, file, line);
  if ((flags & UM_ALLOC_ZERO) || d->m->opts.scrub) {
    if ((st = um__block_zero(b, bytes)) != UM_OK) {
      um__block_free(d, loc, capacity, &b->mem);
      um__descriptor_put(d->m, b);
      return st;
    }
  }
  *out = b;
  return UM_OK;
}

/* The three tags holding the most on d, as "; the most in use by tag: a
 * N bytes, b M bytes" into out (empty before the first tag). */
static void top_tags(um_device *d, char *out, size_t cap) {
  um_tag_stats t[64], top[3];
  int n = um_tag_stats_get(d->m, d, t, 64), k = 0;
  size_t o;
  memset(top, 0, sizeof(top));
  out[0] = '\0';
  for (int i = 0; i < n && i < 64; i++)
    for (int j = 0; j < 3; j++)
      if (t[i].bytes_in_use > top[j].bytes_in_use) {
        memmove(&top[j + 1], &top[j], (size_t)(2 - j) * sizeof(*top));
        top[j] = t[i];
        break;
      }
  o = (size_t)snprintf(out, cap, "; the most in use by tag:");
  for (int j = 0; j < 3 && o < cap; j++)
    if (top[j].bytes_in_use != 0) {
      o += (size_t)snprintf(out + o, cap - o, "%s %s %llu bytes", k++ ? "," : "",
                            top[j].name[0] ? top[j].name : "(untagged)", (unsigned long long)top[j].bytes_in_use);
    }
  if (k == 0)
    out[0] = '\0';
}

/* um_options.oom_snapshot: a snapshot at the failure, "%p" the process id;
 * what was done, as "; a snapshot is in PATH" into out. */
static void oom_snapshot(um_manager *m, char *out, size_t cap) {
  char path[300];
  um_snapshot *s = NULL;
  out[0] = '\0';
  if (m->opts.oom_snapshot[0] == '\0')
    return;
  um__expand_path(m->opts.oom_snapshot, 0, path, sizeof(path));
  if (um_snapshot_take(m, &s) == UM_OK && um_snapshot_write(s, path) == UM_OK)
    snprintf(out, cap, "; a snapshot is in %s", path);
  else
    snprintf(out, cap, "; no snapshot written to %s (%s)", path, um_last_error());
  um_snapshot_free(s);
}

/* UM_ENOMEM from um_alloc, explained: the reason the device or the pool
 * gave, then what was asked for and where, what this manager holds there
 * (in use, reserved, idle in the pool, its free extents), the device's
 * own free and total memory (as device_limit_bytes caps them), the tags
 * that hold the most, and the snapshot written when asked
 * (oom_snapshot). Into the history too. */
static __attribute__((noinline, cold)) int oom_report(um_device *d, um_location loc, size_t bytes) {
  static const char *const loc_names[] = {"UM_HOST", "UM_DEVICE", "UM_PINNED", "UM_UNIFIED"};
  char why[512], mem[128] = "", tags[256], snap[340];
  uint64_t f = 0, t = 0;
  um_stats s;
  snprintf(why, sizeof(why), "%s", um_last_error());
  if (um_stats_get(d->m, d, &s) != UM_OK)
    memset(&s, 0, sizeof(s));
  if (um_device_memory(d, &f, &t) == UM_OK)
    snprintf(mem, sizeof(mem), "; the device has %llu of %llu bytes free", (unsigned long long)f,
             (unsigned long long)t);
  top_tags(d, tags, sizeof(tags));
  if (atomic_load_explicit(&d->m->observing, memory_order_relaxed) != 0 && um__hist_on(d->m)) {
    um_history_event e = {.kind = UM_HIST_OOM, .device = d->index, .src_device = -1, .dst_device = -1,
                          .loc = loc, .status = UM_ENOMEM, .bytes = bytes,
                          .tag = um__obs_tag_name(d->m, um__obs_tag_now(d->m)), .in_use = s.bytes_in_use};
    e.begin_ns = e.end_ns = um__now_ns();
    um__obs_event(d->m, &e);
  }
  oom_snapshot(d->m, snap, sizeof(snap));
  return um__set_error(UM_ENOMEM,
                       "%s. Asked: %zu bytes (%s) on device %d (%s). Held there: %llu bytes in use by %llu "
                       "buffer(s), %llu reserved, %llu idle in the pool (%llu free extent(s), the largest %llu "
                       "bytes)%s%s%s",
                       why, bytes, loc_names[loc], d->index, d->info.name, (unsigned long long)s.bytes_in_use,
                       (unsigned long long)s.active_buffers, (unsigned long long)s.bytes_reserved,
                       (unsigned long long)s.bytes_pooled, (unsigned long long)s.free_extents,
                       (unsigned long long)s.largest_free_extent, mem, tags, snap);
}

/* Everything but a hit in this thread's cache: the bins, then the device
 * (with the pressure retry). Arguments are checked. */
static __attribute__((noinline)) int alloc_slow(um_manager *m, um_device *d, size_t bytes,
                                                um_location loc, unsigned flags, um_buffer **out,
                                                const char *file, int line, um__tcache *tc) {
  bool pooled = m->opts.enable_pooling && !(flags & UM_ALLOC_UNPOOLED);
  int cls = pooled ? um__size_class_of(bytes) : -1, st;
  bool fresh;
  um_buffer *b = NULL;

  if (tc != NULL && tc->epoch != atomic_load_explicit(&m->flush_epoch, memory_order_relaxed))
    um__tcache_flush_own(tc, m); /* a trim asked for the cached blocks back */
  if (pooled && (b = um__pool_take(&d->pools[loc], cls)) != NULL) {
    if ((st = reuse_block(b, bytes, flags, file, line, false)) != UM_OK)
      return st;
    go_live(d, tc, b, bytes, UM_HIST_POOL, out);
    return UM_OK;
  }
  size_t cap = !pooled ? bytes : um__seg_large_cap(&d->pools[loc], bytes);
  st = new_block(d, bytes, cap != 0 ? cap : um__class_size(cls), cls, loc, flags, &b, file, line, &fresh);
  /* A block carved from a segment the pool held is a hit: no device call. */
  if (pooled && (fresh || st != UM_OK))
    UM__STAT_ADD(d, pool_misses, 1);
  if (st != UM_OK)
    return st == UM_ENOMEM ? oom_report(d, loc, bytes) : st;
  go_live(d, tc, b, bytes, !pooled || fresh ? UM_HIST_DEVICE : UM_HIST_CARVE, out);
  return UM_OK;
}

/* The argument checks in their order, with their messages (any failure of
 * the combined test in alloc_fast ends here). */
static __attribute__((noinline)) int alloc_args_error(um_manager *m, um_device *d, size_t bytes, um_location loc,
                                                      unsigned flags, um_buffer **out) {
  if (m == NULL || out == NULL || !um__device_ok(d))
    return um__set_error(UM_EINVAL, "um_alloc: NULL argument or not a device");
  if (d->m != m)
    return um__set_error(UM_EINVAL, "um_alloc: device belongs to another manager");
  if (um__process_changed(m))
    return um__manager_check_process(m);
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "um_alloc: zero bytes");
  if (!um__loc_valid((int)loc))
    return um__set_error(UM_EINVAL, "um_alloc: unknown location %d", (int)loc);
  if (flags & ~(unsigned)(UM_ALLOC_UNPOOLED | UM_ALLOC_ZERO))
    return um__set_error(UM_EINVAL, "um_alloc: unknown flags 0x%x", flags);
  if (!(d->info.locations & (1u << loc)))
    return um__set_error(UM_ENOTSUP, "um_alloc: device %d (%s) cannot allocate location %d", d->index,
                         d->info.name, (int)loc);
  if (bytes > MAX_ALLOC_BYTES)
    return um__set_error(UM_ENOMEM, "um_alloc: %zu bytes is more than any device has", bytes);
  return UM_OK;
}

/* Everything of um_alloc after the argument and process checks, but for
 * the hit alloc_fast takes itself (and the trace's record of it). */
static int alloc_slow_untraced(um_manager *m, um_device *d, size_t bytes, um_location loc, unsigned flags,
                               um_buffer **out, const char *file, int line) {
  um__tcache *tc = um__tcache_for(m, d);
  um_buffer *b;
  int cls, st;
  if (tc == NULL || (flags & UM_ALLOC_UNPOOLED) || !um__tcache_ready(tc, m))
    return alloc_slow(m, d, bytes, loc, flags, out, file, line, tc);
  cls = um__size_class_of(bytes);
  if (cls >= UM__TCACHE_CLASSES || (b = um__tcache_take(tc, d, loc, cls)) == NULL)
    return alloc_slow(m, d, bytes, loc, flags, out, file, line, tc);
  if (b->capacity < bytes) { /* a large block carved at its size (mem.h): back to its extent */
    um__pool_put(&d->pools[loc], b);
    return alloc_slow(m, d, bytes, loc, flags, out, file, line, tc);
  }
  if ((st = reuse_block(b, bytes, flags, file, line, true)) != UM_OK)
    return st;
  go_live(d, tc, b, bytes, UM_HIST_POOL, out);
  return UM_OK;
}

static __attribute__((noinline)) int alloc_slow_path(um_manager *m, um_device *d, size_t bytes, um_location loc,
                                                unsigned flags, um_buffer **out, const char *file, int line) {
  int st = alloc_slow_untraced(m, d, bytes, loc, flags, out, file, line);
  if (__builtin_expect(m->trace != NULL, 0) && st == UM_OK)
    um__trace_alloc(m, *out);
  return st;
}

/* alloc_slow_path for um_alloc, which records no site: six arguments, so that
 * um_alloc reaches it with a jump and needs no frame of its own. */
static __attribute__((noinline)) int alloc_slow_path_nosite(um_manager *m, um_device *d, size_t bytes,
                                                            um_location loc, unsigned flags, um_buffer **out) {
  return alloc_slow_path(m, d, bytes, loc, flags, out, NULL, 0);
}

/* alloc_fast's slot held a large block carved at its size (mem.h), too
 * small for bytes: it goes back to its extent, then the slow path. */
static __attribute__((noinline)) int slot_too_small_path(um_manager *m, um_device *d, size_t bytes, um_location loc,
                                                         unsigned flags, um_buffer **out, const char *file, int line,
                                                         um_buffer *b) {
  um__pool_put(&d->pools[loc], b);
  return alloc_slow_path(m, d, bytes, loc, flags, out, file, line);
}

/* A hit that passed this thread's highest level (publish: carry the new
 * highs), or on a manager that observes (core/observe.c). */
static __attribute__((noinline)) int hit_after(um__tcache *tc, um_buffer *b, bool publish) {
  if (publish)
    um__tcache_publish_high(tc);
  if (atomic_load_explicit(&b->m->observing, memory_order_relaxed) != 0)
    um__obs_alloc(b, UM_HIST_POOL);
  return UM_OK;
}

/* um_alloc and um_alloc_at: every check in one test, then the hit in this
 * thread's cached block of the class (tcache.h): no lock, counters only
 * this thread writes. Every other way out is a jump to a function that
 * does the rest (alloc_slow_path), so the hit calls nothing and keeps no frame. */
static inline __attribute__((always_inline)) int alloc_fast(um_manager *m, um_device *d, size_t bytes,
                                                            um_location loc, unsigned flags, um_buffer **out,
                                                            const char *file, int line, bool sited) {
  um__tcache *tc;
  um_buffer *b;
  int cls;
  /* (unsigned)loc < UM_LOCATION_COUNT is implied by the device's bit for
   * it: locations has no bit at or above UM_LOCATION_COUNT. */
  if (__builtin_expect(m == NULL || out == NULL || !um__device_ok(d) || d->m != m || bytes - 1 >= MAX_ALLOC_BYTES ||
                           (unsigned)loc >= UM_LOCATION_COUNT || !(d->info.locations & (1u << loc)) ||
                           (flags & ~(unsigned)(UM_ALLOC_UNPOOLED | UM_ALLOC_ZERO)) != 0,
                       0))
    return alloc_args_error(m, d, bytes, loc, flags, out);
  if (um__process_changed(m))
    return um__manager_check_process(m);
  /* The hit: this thread's cache for m, no flag (unpooled or zeroed), no
   * scrub, a class with slots, and a block in its slot. */
  tc = um__tcache_last;
  cls = um__size_class_of(bytes);
  if (__builtin_expect(!um__tcache_serves(tc, m, d) || flags != 0 || m->opts.scrub || !um__tcache_ready(tc, m) ||
                           cls >= UM__TCACHE_CLASSES || (b = um__tcache_take(tc, d, loc, cls)) == NULL,
                       0))
    return sited ? alloc_slow_path(m, d, bytes, loc, flags, out, file, line)
                 : alloc_slow_path_nosite(m, d, bytes, loc, flags, out);
  if (__builtin_expect(b->capacity < bytes, 0)) /* a large block carved at its size (mem.h) */
    return slot_too_small_path(m, d, bytes, loc, flags, out, file, line, b);
  um__buffer_go_live_clean(b, bytes, file, line); /* a slot's block is clean */
  um__tcounter_add(&tc->ctr[d->index].pool_hits, 1);
  bool publish = um__tcache_count_in_defer(tc, d, bytes);
  atomic_store_explicit(&b->state, UM__BUF_LIVE, memory_order_release);
  *out = b;
  if (__builtin_expect(publish || atomic_load_explicit(&m->observing, memory_order_relaxed) != 0, 0))
    return hit_after(tc, b, publish);
  return UM_OK;
}

int um_alloc_at(um_manager *m, um_device *d, size_t bytes, um_location loc, unsigned flags,
                um_buffer **out, const char *file, int line) {
  return alloc_fast(m, d, bytes, loc, flags, out, file, line, true);
}

int um_alloc(um_manager *m, um_device *d, size_t bytes, um_location loc, unsigned flags,
             um_buffer **out) {
  return alloc_fast(m, d, bytes, loc, flags, out, NULL, 0, false);
}

int um_alloc_array_at(um_manager *m, um_device *d, size_t count, size_t elem_size, um_location loc,
                      unsigned flags, um_buffer **out, const char *file, int line) {
  size_t bytes;
  if (!um__manager_ok(m) || out == NULL || !um__device_ok(d))
    return um__set_error(UM_EINVAL, "um_alloc_array: NULL argument, not a manager or not a device");
  if (count == 0 || elem_size == 0)
    return um__set_error(UM_EINVAL, "um_alloc_array: zero count or element size");
  if (__builtin_mul_overflow(count, elem_size, &bytes))
    return um__set_error(UM_EOVERFLOW, "um_alloc_array: %zu * %zu overflows", count, elem_size);
  return um_alloc_at(m, d, bytes, loc, flags, out, file, line);
}

int um_alloc_array(um_manager *m, um_device *d, size_t count, size_t elem_size, um_location loc,
                   unsigned flags, um_buffer **out) {
  return um_alloc_array_at(m, d, count, elem_size, loc, flags, out, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* Wraps */

/* The caller's range as a block of device 0, page-locked for UM_WRAP_PIN. */
static int wrap_mem(um_device *d, void *host, size_t bytes, unsigned flags, um__mem *mem) {
  memset(mem, 0, sizeof(*mem));
  mem->host = host;
  mem->handle = (uintptr_t)host;
  if (!(flags & UM_WRAP_PIN))
    return UM_OK;
  return um__dev_host_register(d, host, bytes, mem);
}

/* A descriptor for memory unimem does not own (a wrap, a foreign block):
 * no size class, no cache slot. */
static void wrapped_init(um_buffer *b, um_device *d, um_location loc, const um__mem *mem, size_t bytes) {
  b->dev = d;
  b->loc = loc;
  b->kind = UM__KIND_WRAPPED;
  b->capacity = bytes;
  b->cls = -1;
  b->slot = UM__NO_SLOT;
  b->mem = *mem;
  um__buffer_init_live(b, bytes, NULL, 0);
}

int um_wrap_host(um_manager *m, void *host, size_t bytes, unsigned flags, um_buffer **out) {
  um_device *d;
  um_buffer *b;
  um__mem mem;
  int st;
  if (!um__manager_ok(m) || host == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_wrap_host: NULL argument or not a manager");
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "um_wrap_host: zero bytes");
  /* Its last byte must be an address: a range that wraps around would let
   * every later bounds check (offset + bytes <= size) pass past its end. */
  if (bytes - 1 > UINTPTR_MAX - (uintptr_t)host)
    return um__set_error(UM_EOVERFLOW, "um_wrap_host: %p + %zu bytes runs past the end of the address space",
                         host, bytes);
  if (flags & ~(unsigned)(UM_WRAP_READONLY | UM_WRAP_PIN))
    return um__set_error(UM_EINVAL, "um_wrap_host: unknown flags 0x%x", flags);
  if (um__process_changed(m))
    return um__manager_check_process(m);
  d = m->devices[0];
  if ((st = wrap_mem(d, host, bytes, flags, &mem)) != UM_OK)
    return st;
  if ((b = um__descriptor_get(m)) == NULL) {
    if (flags & UM_WRAP_PIN)
      um__dev_host_unregister(d, &mem);
    return um__set_error(UM_ENOMEM, "um_wrap_host: out of memory for a descriptor");
  }
  wrapped_init(b, d, UM_HOST, &mem, bytes);
  b->readonly = (flags & UM_WRAP_READONLY) != 0;
  b->pinned_wrap = (flags & UM_WRAP_PIN) != 0;
  if (b->pinned_wrap)
    um__wrap_register_devices(b);
  go_live(d, NULL, b, bytes, UM_HIST_DEVICE, out);
  return UM_OK;
}

int um__wrap_foreign(um_manager *m, um_device *d, um_location loc, const um__mem *mem, size_t bytes,
                     void (*on_return)(void *ctx), void *ctx, um_buffer **out) {
  um_buffer *b;
  if (um__process_changed(m))
    return um__manager_check_process(m);
  if ((b = um__descriptor_get(m)) == NULL)
    return um__set_error(UM_ENOMEM, "out of memory for a descriptor");
  wrapped_init(b, d, loc, mem, bytes);
  b->on_return = on_return;
  b->on_return_ctx = ctx;
  go_live(d, NULL, b, bytes, UM_HIST_DEVICE, out);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Release */

/* Under b's lock: the mapping of a buffer being released ends; returns the
 * pointer the backend mapped, for the unmap once the lock is dropped, or
 * NULL. The bytes written through the mapping may or may not reach the
 * device copy: the block is going back anyway. */
static void *take_native_mapping_locked(um_buffer *b) {
  void *ptr;
  while (b->map_busy) /* another thread's um_map / um_unmap in the backend */
    pthread_cond_wait(&b->idle_cond, &b->lock);
  ptr = b->mapped && b->map_native ? b->map_ptr : NULL;
  b->mapped = false;
  b->map_native = false;
  b->map_ptr = NULL;
  return ptr;
}

/* The rest of um_release, once the buffer is RELEASED and counted. */
static __attribute__((noinline)) int release_slow(um_buffer *b, um__tcache *tc) {
  int reached = UM_OK;
  if (atomic_load(&b->touched)) {
    /* Operations were issued or a mapping made: wait for the worker that
     * may still hold the lock, and defer behind pending operations. The
     * caller may free a wrap's memory as soon as this returns (unimem.h), so
     * a wrap waits for its operations instead. */
    bool now;
    void *mapped;
    um_event *bracket;
    um_device *dev;
    /* Peers lose an exposed buffer first (net.c: a revocation, which waits
     * for their transfers already admitted), so none reaches the block
     * once it is reused. When it gives up, the block is held back (net.c),
     * but a caller's wrap is the caller's: it is told. */
    if (um__upcall.net.buffer_released != NULL && um__upcall.net.buffer_released(b) == UM_EBUSY &&
        b->kind == UM__KIND_WRAPPED && b->on_return == NULL)
      reached = um__set_error(UM_EBUSY, "wrapped memory of buffer %p was released, but a peer's transfer "
                                        "admitted before the revocation may still write it",
                              (void *)b);
    pthread_mutex_lock(&b->lock);
    mapped = take_native_mapping_locked(b);
    bracket = um__upcall.brackets.take_locked != NULL ? um__upcall.brackets.take_locked(b) : NULL;
    pthread_mutex_unlock(&b->lock);
    /* A bracket left open ends here (access.c), behind what the caller
     * queued so far; its block waits for that like for any operation. */
    if (bracket != NULL)
      um__upcall.brackets.end_taken(bracket);
    if (mapped != NULL)
      um__dev_unmap(b->dev, &b->mem, b->loc, mapped);
    pthread_mutex_lock(&b->lock);
    if (b->kind == UM__KIND_WRAPPED && b->pending > 0) {
      UM__TEST_POINT(UM__TP_WRAP_RELEASE_WAIT, b);
      um__buffer_wait_idle_locked(b);
    }
    now = b->pending == 0;
    b->release_deferred = !now;
    dev = b->dev; /* once the lock is dropped, the last operation may retire b and its descriptor be reused */
    pthread_mutex_unlock(&b->lock);
    if (!now) {
      /* A bracket's end riding on its queue holds the block back only
       * until the queue's next command: have one queued. */
      um__dev_kick_riders(dev);
      return reached; /* the last operation to finish retires it (op.c) */
    }
  }
  um__buffer_retire(b, tc);
  return reached;
}

/* One of the owners um_buffer_retain added goes; false when there is none
 * left (this release is the last). */
static bool drop_hold(um_buffer *b) {
  int n = atomic_load_explicit(&b->holds, memory_order_relaxed);
  while (n > 0)
    if (atomic_compare_exchange_weak_explicit(&b->holds, &n, n - 1, memory_order_acq_rel,
                                              memory_order_relaxed))
      return true;
  return false;
}

int um_buffer_retain(um_buffer *b) {
  int st = um__buffer_check_live(b);
  if (st != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  atomic_fetch_add_explicit(&b->holds, 1, memory_order_acq_rel);
  /* A legitimate caller owns a reference, so b cannot be released under
   * it; a stale handle is caught here. */
  if (atomic_load(&b->state) != UM__BUF_LIVE) {
    atomic_fetch_sub_explicit(&b->holds, 1, memory_order_relaxed);
    return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
  }
  return UM_OK;
}

/* The rest of um_release once the buffer is RELEASED, but for the fast
 * path um_release takes itself: count it, then the slot or release_slow. */
static __attribute__((noinline)) int release_slow_path(um_buffer *b) {
  um_device *d = b->dev;
  um__tcache *tc = um__tcache_for(b->m, d);
  if (__builtin_expect(b->m->trace != NULL, 0))
    um__trace_release(b->m, b);
  if (__builtin_expect(atomic_load_explicit(&b->m->observing, memory_order_relaxed) != 0, 0)) /* tags keep it on */
    um__obs_release(b);
  if (tc == NULL) {
    UM__STAT_ADD(d, releases, 1);
    um__stat_in_use_sub(d, b->size);
    return release_slow(b, NULL);
  }
  um__tcounter_add(&tc->ctr[d->index].releases, 1);
  um__tcache_count_out(tc, d, b->size);
  if (!atomic_load(&b->touched) && b->slot != UM__NO_SLOT && um__tcache_ready(tc, b->m) &&
      um__tcache_put_fast(tc, b))
    return UM_OK;
  return release_slow(b, tc);
}

/* A wrap's release waits for the operations issued on it (the caller may
 * free the memory once it returns): refused, nothing changed, while that
 * wait would pass through an open bracket other than the wrap's own (which
 * the release ends first). Reached only while some bracket is open. */
static __attribute__((noinline)) int wrap_release_check(um_buffer *b) {
  bool waits;
  pthread_mutex_lock(&b->lock);
  waits = um__upcall.ops.waits_bracket_locked != NULL && um__upcall.ops.waits_bracket_locked(b, true);
  pthread_mutex_unlock(&b->lock);
  if (!waits)
    return UM_OK;
  return um__set_error(UM_ESTATE,
                       "um_release: wrap %p: its operations wait for an open um_access_begin bracket of another "
                       "buffer, and its release would wait for them: end that bracket first",
                       (void *)b);
}

/* The buffer's own kind first: the release of any other buffer then reads
 * no field of the manager, whose bracket word other threads write. */
static bool wrap_release_refused(um_buffer *b, int *st) {
  if (__builtin_expect(b->kind != UM__KIND_WRAPPED, 1) || um__atomic_load_relaxed(&b->m->brackets_open) == 0)
    return false;
  return (*st = wrap_release_check(b)) != UM_OK;
}

/* um_release of a buffer with owners beyond the first (um_buffer_retain):
 * drop one, or release when none is left. */
static __attribute__((noinline)) int release_held(um_buffer *b) {
  int live = UM__BUF_LIVE, st;
  if (drop_hold(b))
    return atomic_load(&b->state) == UM__BUF_LIVE
               ? UM_OK
               : um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
  if (wrap_release_refused(b, &st))
    return st;
  um__bias_leave(b->m); /* the compare-and-swap below is not the sole thread's way */
  if (!atomic_compare_exchange_strong(&b->state, &live, UM__BUF_RELEASED))
    return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
  return release_slow_path(b);
}

/* um_release of a manager that is not SHARED, where its own fast try did
 * not settle the state (this thread's last cache is not the sole cache, or
 * the bias went meanwhile): the sole thread, back from another manager's
 * work, changes the state its way; any other thread revokes the bias, then
 * takes the compare-and-swap. Then release_slow_path. */
static __attribute__((noinline)) int release_biased_manager(um_buffer *b) {
  um_manager *m = b->m;
  um__tcache *sole = atomic_load_explicit(&m->sole_tc, memory_order_relaxed);
  int live = UM__BUF_LIVE, r = -1;
  if (sole != NULL && um__tcache_of(m) == sole)
    r = um__bias_release(sole, m, b);
  if (r < 0) {
    um__bias_leave(m);
    r = atomic_compare_exchange_strong(&b->state, &live, UM__BUF_RELEASED);
  }
  if (r == 0)
    return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
  return release_slow_path(b);
}

int um_release(um_buffer *b) {
  int live = UM__BUF_LIVE, r;
  um__tcache *tc;
  um_manager *m;
  um_device *d;
  um__tcounters *c;
  uint64_t bytes;
  if (b == NULL || b->magic != UM__BUFFER_MAGIC)
    return um__set_error(UM_EINVAL, "not a buffer");
  m = b->m;
  if (um__process_changed(m))
    return um__manager_check_process(m);
  if (__builtin_expect(atomic_load_explicit(&b->holds, memory_order_relaxed) != 0, 0))
    return release_held(b);
  if (wrap_release_refused(b, &r))
    return r;
  /* The state change: on the manager's sole thread a plain load and store
   * (tcache.h, "A release without a locked instruction"); else a
   * compare-and-swap, seq_cst: paired with op.c's touched store then state
   * load. */
  tc = um__tcache_last;
  if (atomic_load_explicit(&m->bias, memory_order_relaxed) == UM__BIAS_SHARED)
    r = atomic_compare_exchange_strong(&b->state, &live, UM__BUF_RELEASED);
  else if (tc == NULL || tc != atomic_load_explicit(&m->sole_tc, memory_order_relaxed) ||
           (r = um__bias_release(tc, m, b)) < 0)
    return release_biased_manager(b);
  if (!r)
    return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
  /* Fast path: an untouched pooled block into this thread's reserved,
   * empty slot of its class (um__tcache_put_fast), with no new high to
   * carry; then the counters. Every other case is release_slow_path's, reached
   * by a jump, so this path keeps no frame. The size is read first: once
   * in the slot, the block may be taken by another thread. */
  d = b->dev;
  bytes = b->size;
  if (__builtin_expect(!um__tcache_serves(tc, m, d) || tc->high_pending != 0 || atomic_load(&b->touched) ||
                           b->slot == UM__NO_SLOT || !um__tcache_ready(tc, m) ||
                           atomic_load_explicit(&m->observing, memory_order_relaxed) != 0 ||
                           !um__tcache_put_fast(tc, b),
                       0))
    return release_slow_path(b);
  c = &tc->ctr[d->index];
  um__tcounter_add(&c->releases, 1);
  um__tcache_count_out_level(tc, c, bytes);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Getters read fields that only change while the buffer is not live. */

size_t um_buffer_size(const um_buffer *b) {
  return um__buffer_check_live(b) == UM_OK ? b->size : 0;
}

um_device *um_buffer_device(const um_buffer *b) {
  return um__buffer_check_live(b) == UM_OK ? b->dev : NULL;
}

um_location um_buffer_location(const um_buffer *b) {
  return um__buffer_check_live(b) == UM_OK ? b->loc : UM_HOST;
}

unsigned um_buffer_valid(const um_buffer *b) {
  unsigned v;
  if (um__buffer_check_live(b) != UM_OK)
    return 0;
  pthread_mutex_lock((pthread_mutex_t *)&b->lock);
  v = b->valid;
  pthread_mutex_unlock((pthread_mutex_t *)&b->lock);
  return v;
}

void *um_buffer_host_ptr(um_buffer *b) {
  return um__buffer_check_live(b) == UM_OK ? b->mem.host : NULL;
}
