/* Buffers: allocation through the pool, wrapping, release, getters, and
 * the host mapping with its coherence state.
 *
 * Coherence of a buffer with no host view (device memory of a discrete
 * device), as um_buffer_valid reports it:
 *
 *   DEVICE --map(read/write modes, fetch)--> HOST|DEVICE (read)
 *                                            HOST        (writing modes)
 *   HOST --unmap (write back the mapped range)--> HOST|DEVICE
 *   HOST|DEVICE --map(read): no transfer, the host shadow is current
 *   any --copy into / fill--> DEVICE (the shadow is stale)
 *
 * A buffer with a host view (host, pinned, unified, everything on the cpu
 * device) is one memory: always HOST|DEVICE, and mapping is a pointer.
 */
#include <stdlib.h>
#include <string.h>

#include "tcache.h"
#include "testhook.h"

/* Sizes above this are refused outright: size classes stop at 2^63 and no
 * device comes near it. */
#define MAX_ALLOC_BYTES ((size_t)1 << 62)

int um__block_alloc(um_device *d, um_location loc, size_t bytes, um__mem *mem) {
  int st;
  memset(mem, 0, sizeof(*mem));
  st = d->be->mem_alloc(d->bdev, loc, bytes, mem);
  if (st == UM_OK) {
    UM__STAT_ADD(d, device_allocs, 1);
    UM__STAT_ADD(d, bytes_reserved, bytes);
  }
  return st;
}

void um__block_free(um_device *d, um_location loc, size_t bytes, um__mem *mem) {
  d->be->mem_free(d->bdev, loc, bytes, mem);
  UM__STAT_ADD(d, device_frees, 1);
  UM__STAT_SUB(d, bytes_reserved, bytes);
}

/* Give every idle block of d back to it: the pool's, and in debug mode the
 * quarantined buffers'. */
static void release_idle_blocks(um_device *d) {
  if (d->m->opts.debug)
    um__quarantine_drop_blocks(d->m, d);
  um__pool_trim(d->m, d, 0);
}

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
    release_idle_blocks(d);
    UM__STAT_ADD(d, oom_retries, 1);
    st = um__block_alloc(d, loc, bytes, mem);
    if (st != UM_ENOMEM)
      return st;
  }
  if (m->opts.on_oom != NULL && m->opts.on_oom(m->opts.oom_ctx, d, bytes)) {
    release_idle_blocks(d);
    UM__STAT_ADD(d, oom_retries, 1);
    st = um__block_alloc(d, loc, bytes, mem);
  }
  return st;
}

/* Set a block's first bytes to zero. */
static __attribute__((noinline)) int zero_block(um_buffer *b, size_t bytes) {
  um__xfer x;
  if (b->mem.host != NULL) {
    memset(b->mem.host, 0, bytes);
    return UM_OK;
  }
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_FILL;
  x.dst = &b->mem;
  x.dst_loc = b->loc;
  x.bytes = bytes;
  return b->dev->be->xfer(b->dev->bdev, &x);
}

void um__buffer_init_live(um_buffer *b, size_t bytes, const char *file, int line) {
  /* Only the thread making the descriptor live writes gen: no locked add. */
  atomic_store_explicit(&b->gen, atomic_load_explicit(&b->gen, memory_order_relaxed) + 1,
                        memory_order_release);
  b->size = bytes;
  b->valid = b->mem.host ? (UM_VALID_HOST | UM_VALID_DEVICE) : UM_VALID_DEVICE;
  b->mapped = false;
  b->map_busy = false;
  b->map_ptr = NULL;
  b->map_native = false;
  b->last = NULL;
  b->pending = 0;
  b->release_deferred = false;
  b->readonly = false;
  b->pinned_wrap = false;
  atomic_store_explicit(&b->touched, false, memory_order_relaxed);
  b->site_file = file;
  b->site_line = line;
}

/* Everything but a hit in this thread's cache: the bins, then the device
 * (with the pressure retry). Arguments are checked. */
static __attribute__((noinline)) int alloc_slow(um_manager *m, um_device *d, size_t bytes,
                                                um_location loc, unsigned flags, um_buffer **out,
                                                const char *file, int line, um__tcache *tc) {
  um_buffer *b = NULL;
  bool pooled;
  int cls = -1, st;
  size_t capacity;
  um__mem mem;

  if (tc != NULL && tc->epoch != atomic_load_explicit(&m->flush_epoch, memory_order_relaxed))
    um__tcache_flush_own(tc, m); /* a trim asked for the cached blocks back */
  pooled = m->opts.enable_pooling && !(flags & UM_ALLOC_UNPOOLED);
  if (pooled) {
    cls = um__size_class_of(bytes);
    capacity = um__class_size(cls);
    b = um__pool_take(&d->pools[loc], cls);
    if (b != NULL) {
      um__buffer_init_live(b, bytes, file, line);
      if ((flags & UM_ALLOC_ZERO) || m->opts.scrub) {
        st = zero_block(b, bytes);
        if (st != UM_OK) {
          um__pool_give(&d->pools[loc], b);
          return st;
        }
      }
      /* Counted once the block is really handed out. */
      if (tc != NULL)
        um__tcounter_add(&tc->ctr[d->index].pool_hits, 1);
      else
        UM__STAT_ADD(d, pool_hits, 1);
      goto live;
    }
    UM__STAT_ADD(d, pool_misses, 1);
  } else {
    capacity = bytes;
  }

  st = block_alloc_pressured(d, loc, capacity, &mem);
  if (st != UM_OK)
    return st;
  b = um__descriptor_get(m);
  if (b == NULL) {
    um__block_free(d, loc, capacity, &mem);
    return um__set_error(UM_ENOMEM, "um_alloc: out of memory for a descriptor");
  }
  b->dev = d;
  b->loc = loc;
  b->kind = pooled ? UM__KIND_POOLED : UM__KIND_UNPOOLED;
  b->capacity = capacity;
  b->cls = cls;
  b->mem = mem;
  um__buffer_init_live(b, bytes, file, line);
  if ((flags & UM_ALLOC_ZERO) || m->opts.scrub) {
    st = zero_block(b, bytes);
    if (st != UM_OK) {
      um__block_free(d, loc, capacity, &b->mem);
      um__descriptor_put(m, b);
      return st;
    }
  }

live:
  if (tc != NULL) {
    um__tcounter_add(&tc->ctr[d->index].allocations, 1);
    um__tcache_count_in(tc, d, bytes);
  } else {
    UM__STAT_ADD(d, allocations, 1);
    um__stat_in_use_add(d, bytes);
  }
  atomic_store_explicit(&b->state, UM__BUF_LIVE, memory_order_release);
  *out = b;
  return UM_OK;
}

int um_alloc_at(um_manager *m, um_device *d, size_t bytes, um_location loc, unsigned flags,
                um_buffer **out, const char *file, int line) {
  um__tcache *tc;
  int cls;

  if (m == NULL || d == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_alloc: NULL argument");
  if (d->m != m)
    return um__set_error(UM_EINVAL, "um_alloc: device belongs to another manager");
  UM__CHECK_PROCESS(m);
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

  /* Fast path: this thread's cached block of the class (tcache.h): one
   * compare-and-swap, counters only this thread writes, no lock. */
  tc = um__tcache_of(m);
  if (__builtin_expect(tc == NULL || !tc->slots_on || (flags & UM_ALLOC_UNPOOLED) ||
                           tc->epoch != atomic_load_explicit(&m->flush_epoch, memory_order_relaxed),
                       0))
    return alloc_slow(m, d, bytes, loc, flags, out, file, line, tc);
  cls = um__size_class_of(bytes);
  if (__builtin_expect(cls < UM__TCACHE_CLASSES, 1)) {
    _Atomic(uintptr_t) *slot = um__tcache_slot(tc, d, loc, cls);
    uintptr_t cur = atomic_load_explicit(slot, memory_order_relaxed);
    if (cur > UM__TSLOT_RESERVED &&
        atomic_compare_exchange_strong_explicit(slot, &cur, UM__TSLOT_RESERVED, memory_order_acquire,
                                                memory_order_relaxed)) {
      um_buffer *b = (um_buffer *)cur;
      um__tcounters *c = &tc->ctr[d->index];
      um__buffer_init_live(b, bytes, file, line);
      if (__builtin_expect((flags & UM_ALLOC_ZERO) || m->opts.scrub, 0)) {
        int st = zero_block(b, bytes);
        if (st != UM_OK) {
          um__pool_give(&d->pools[loc], b);
          return st;
        }
      }
      um__tcounter_add(&c->pool_hits, 1);
      um__tcounter_add(&c->allocations, 1);
      um__tcache_count_in(tc, d, bytes);
      atomic_store_explicit(&b->state, UM__BUF_LIVE, memory_order_release);
      *out = b;
      return UM_OK;
    }
  }
  return alloc_slow(m, d, bytes, loc, flags, out, file, line, tc);
}

int um_alloc(um_manager *m, um_device *d, size_t bytes, um_location loc, unsigned flags,
             um_buffer **out) {
  return um_alloc_at(m, d, bytes, loc, flags, out, NULL, 0);
}

int um_alloc_array_at(um_manager *m, um_device *d, size_t count, size_t elem_size, um_location loc,
                      unsigned flags, um_buffer **out, const char *file, int line) {
  size_t bytes;
  if (m == NULL || d == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_alloc_array: NULL argument");
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

/* UM_WRAP_PIN page-locks the range through device 0 and also registers it
 * with every other backend that can register host memory (CUDA:
 * cuMemHostRegister, portable to all of its devices), once per backend
 * through its first device: that backend's copies then DMA from the range
 * directly instead of staging it through pinned chunks. A backend that
 * refuses (the range overlaps memory it pinned already, say) only loses
 * that shortcut: the range is page-locked all the same. wrap_regs is NULL
 * whenever the buffer is not a live pinned wrap (recycling resets it). */
static void wrap_register_devices(um_buffer *b) {
  um_manager *m = b->m;
  const um__backend *seen[UM__MAX_BACKENDS];
  int nseen = 0;
  for (int i = 1; i < m->ndevices; i++) {
    um_device *d = m->devices[i];
    bool known = d->be == b->dev->be || d->be->host_register == NULL;
    for (int j = 0; j < nseen && !known; j++)
      known = seen[j] == d->be;
    if (known || nseen == UM__MAX_BACKENDS)
      continue;
    seen[nseen++] = d->be;
    if (b->wrap_regs == NULL &&
        (b->wrap_regs = calloc(UM__MAX_BACKENDS, sizeof(*b->wrap_regs))) == NULL)
      return; /* no memory for the bookkeeping: the staging paths still work */
    if (d->be->host_register(d->bdev, b->mem.host, b->size, &b->wrap_regs[b->nwrap_regs].mem) == UM_OK)
      b->wrap_regs[b->nwrap_regs++].dev = d;
    else
      um__log(&m->opts, UM_LOG_INFO, "um_wrap_host: %s did not register %zu bytes at %p (%s); its copies stage them",
              d->be->name, b->size, b->mem.host, um_last_error());
  }
  if (b->nwrap_regs == 0) {
    free(b->wrap_regs);
    b->wrap_regs = NULL;
  }
}

static void wrap_unregister_devices(um_buffer *b) {
  for (int i = 0; i < b->nwrap_regs; i++)
    b->wrap_regs[i].dev->be->host_unregister(b->wrap_regs[i].dev->bdev, &b->wrap_regs[i].mem);
  free(b->wrap_regs);
  b->wrap_regs = NULL;
  b->nwrap_regs = 0;
}

bool um__wrap_registered(const um_buffer *b, const um_device *d) {
  for (int i = 0; i < b->nwrap_regs; i++)
    if (b->wrap_regs[i].dev->be == d->be)
      return true;
  return false;
}

int um_wrap_host(um_manager *m, void *host, size_t bytes, unsigned flags, um_buffer **out) {
  um_device *d;
  um_buffer *b;
  um__mem mem;
  if (m == NULL || host == NULL || out == NULL)
    return um__set_error(UM_EINVAL, "um_wrap_host: NULL argument");
  if (bytes == 0)
    return um__set_error(UM_EINVAL, "um_wrap_host: zero bytes");
  if (flags & ~(unsigned)(UM_WRAP_READONLY | UM_WRAP_PIN))
    return um__set_error(UM_EINVAL, "um_wrap_host: unknown flags 0x%x", flags);
  UM__CHECK_PROCESS(m);
  d = m->devices[0];
  memset(&mem, 0, sizeof(mem));
  mem.host = host;
  mem.handle = (uintptr_t)host;
  if (flags & UM_WRAP_PIN) {
    int st;
    if (d->be->host_register == NULL)
      return um__set_error(UM_ENOTSUP, "um_wrap_host: pinning is not available");
    st = d->be->host_register(d->bdev, host, bytes, &mem);
    if (st != UM_OK)
      return st;
  }
  b = um__descriptor_get(m);
  if (b == NULL) {
    if (flags & UM_WRAP_PIN)
      d->be->host_unregister(d->bdev, &mem);
    return um__set_error(UM_ENOMEM, "um_wrap_host: out of memory for a descriptor");
  }
  b->dev = d;
  b->loc = UM_HOST;
  b->kind = UM__KIND_WRAPPED;
  b->capacity = bytes;
  b->cls = -1;
  b->mem = mem;
  um__buffer_init_live(b, bytes, NULL, 0);
  b->readonly = (flags & UM_WRAP_READONLY) != 0;
  b->pinned_wrap = (flags & UM_WRAP_PIN) != 0;
  if (b->pinned_wrap)
    wrap_register_devices(b);
  UM__STAT_ADD(d, allocations, 1);
  um__stat_in_use_add(d, bytes);
  atomic_store_explicit(&b->state, UM__BUF_LIVE, memory_order_release);
  *out = b;
  return UM_OK;
}

int um__buffer_check_live(const um_buffer *b) {
  if (b == NULL || b->magic != UM__BUFFER_MAGIC)
    return um__set_error(UM_EINVAL, "not a buffer");
  if (atomic_load_explicit(&b->state, memory_order_acquire) != UM__BUF_LIVE)
    return um__set_error(UM_ESTATE, "buffer %p was released", (const void *)b);
  return UM_OK;
}

int um__buffer_check_owner(const um_buffer *b, uint32_t *gen) {
  if (b == NULL || b->magic != UM__BUFFER_MAGIC)
    return um__set_error(UM_EINVAL, "not a buffer");
  /* gen before the state: a descriptor that went to a new owner after this
   * read shows a newer gen under the buffer's lock. */
  *gen = atomic_load_explicit(&b->gen, memory_order_acquire);
  return um__buffer_check_live(b);
}

/* End the mapping of a buffer being released (under its lock); returns
 * the pointer the backend mapped, for end_native_mapping to unmap once the
 * lock is dropped, or NULL. The bytes written through the mapping may or
 * may not reach the device copy: the block is going back anyway. */
static void *take_native_mapping_locked(um_buffer *b) {
  void *ptr = b->mapped && b->map_native ? b->map_ptr : NULL;
  b->mapped = false;
  b->map_native = false;
  b->map_ptr = NULL;
  return ptr;
}

static void end_native_mapping(um_buffer *b, void *ptr) {
  if (ptr != NULL)
    b->dev->be->unmap(b->dev->bdev, &b->mem, b->loc, ptr);
}

void um__buffer_recycle(um_buffer *b) {
  /* Before the quarantine too: the caller may free the range now. */
  if (b->wrap_regs != NULL)
    wrap_unregister_devices(b);
  if (__builtin_expect(b->m->opts.debug != 0, 0)) {
    um__quarantine_put(b);
    return;
  }
  um__buffer_recycle_now(b);
}

void um__buffer_recycle_now(um_buffer *b) {
  um_device *d = b->dev;
  um_manager *m = b->m;
  free(b->shadow);
  b->shadow = NULL;
  switch (b->kind) {
  case UM__KIND_POOLED:
    if (m->opts.enable_pooling) {
      um__pool_give(&d->pools[b->loc], b);
      return;
    }
    /* fall through */
  case UM__KIND_UNPOOLED:
    um__block_free(d, b->loc, b->capacity, &b->mem);
    break;
  case UM__KIND_WRAPPED:
    if (b->pinned_wrap)
      d->be->host_unregister(d->bdev, &b->mem);
    break;
  case UM__KIND_FILE:
    um__file_unmap(b);
    break;
  }
  um__descriptor_put(m, b);
}

/* A released buffer with nothing pending, on the releasing thread: a pooled
 * block goes to this thread's cache when its slot has room (tcache.h). */
static void recycle_released(um_buffer *b, um__tcache *tc) {
  um_manager *m = b->m;
  if (b->kind == UM__KIND_POOLED && tc != NULL && b->cls < UM__TCACHE_CLASSES &&
      m->opts.enable_pooling && !m->opts.debug) {
    free(b->shadow);
    b->shadow = NULL;
    um__tcache_give_slow(tc, b, um__tcache_slot(tc, b->dev, b->loc, b->cls));
    return;
  }
  um__buffer_recycle(b);
}

/* The rest of um_release, once the buffer is RELEASED and counted. */
static __attribute__((noinline)) int release_slow(um_buffer *b, um__tcache *tc) {
  if (atomic_load(&b->touched)) {
    /* Operations were issued or a mapping made: wait for the worker that
     * may still hold the lock, and defer behind pending operations. The
     * caller may free a wrap's memory as soon as this returns (SPEC §5), so
     * a wrap waits for its operations instead. */
    bool now;
    void *mapped;
    pthread_mutex_lock(&b->lock);
    while (b->map_busy) /* another thread's um_map / um_unmap in the backend */
      pthread_cond_wait(&b->idle_cond, &b->lock);
    mapped = take_native_mapping_locked(b);
    if (b->kind == UM__KIND_WRAPPED && b->pending > 0) {
      UM__TEST_POINT(UM__TP_WRAP_RELEASE_WAIT, b);
      while (b->pending > 0)
        pthread_cond_wait(&b->idle_cond, &b->lock);
    }
    now = b->pending == 0;
    b->release_deferred = !now;
    pthread_mutex_unlock(&b->lock);
    end_native_mapping(b, mapped);
    if (!now)
      return UM_OK;
  }
  recycle_released(b, tc);
  return UM_OK;
}

int um_release(um_buffer *b) {
  int live = UM__BUF_LIVE;
  um_manager *m;
  um_device *d;
  um__tcache *tc;
  um__tcounters *c;
  if (b == NULL || b->magic != UM__BUFFER_MAGIC)
    return um__set_error(UM_EINVAL, "not a buffer");
  UM__CHECK_PROCESS(b->m);
  /* seq_cst: paired with um__op_issue's touched store then state load. */
  if (!atomic_compare_exchange_strong(&b->state, &live, UM__BUF_RELEASED))
    return um__set_error(UM_ESTATE, "buffer %p was released", (void *)b);
  m = b->m;
  d = b->dev;
  tc = um__tcache_of(m);
  if (__builtin_expect(tc == NULL, 0)) {
    UM__STAT_ADD(d, releases, 1);
    um__stat_in_use_sub(d, b->size);
    return release_slow(b, NULL);
  }
  c = &tc->ctr[d->index];
  um__tcounter_add(&c->releases, 1);
  um__tcache_count_out(tc, d, b->size);
  /* Fast path: an untouched pooled block into this thread's reserved, empty
   * slot of its class: one plain store. */
  if (__builtin_expect(!atomic_load(&b->touched) && b->kind == UM__KIND_POOLED &&
                           b->cls < UM__TCACHE_CLASSES && tc->slots_on &&
                           tc->epoch == atomic_load_explicit(&m->flush_epoch, memory_order_relaxed),
                       1)) {
    _Atomic(uintptr_t) *slot = um__tcache_slot(tc, d, b->loc, b->cls);
    if (__builtin_expect(atomic_load_explicit(slot, memory_order_relaxed) == UM__TSLOT_RESERVED, 1)) {
      b->idle_key = um__tcache_key_fast(tc);
      atomic_store_explicit(&b->state, UM__BUF_IDLE, memory_order_relaxed);
      atomic_store_explicit(slot, (uintptr_t)b, memory_order_release);
      return UM_OK;
    }
  }
  return release_slow(b, tc);
}

void um__buffer_op_finish_locked(um_buffer *b, um_event *op, bool *drop_last, bool *recycle) {
  b->pending--;
  *drop_last = b->last == op;
  if (*drop_last)
    b->last = NULL;
  *recycle = false;
  if (b->pending == 0) {
    pthread_cond_broadcast(&b->idle_cond);
    if (b->release_deferred) {
      b->release_deferred = false;
      *recycle = true;
    }
  }
}

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

/* ------------------------------------------------------------------------ */
/* Mapping */

static bool mode_writes(um_map_mode mode) { return mode != UM_MAP_READ; }

/* Move [off, off + len) between the shadow and the device, blocking. */
static int shadow_xfer(um_buffer *b, bool to_device, size_t off, size_t len) {
  um__xfer x;
  int st;
  memset(&x, 0, sizeof(x));
  x.bytes = len;
  x.host = (char *)b->shadow + off;
  if (to_device) {
    x.kind = UM__XFER_H2D;
    x.dst = &b->mem, x.dst_loc = b->loc, x.dst_off = off;
  } else {
    x.kind = UM__XFER_D2H;
    x.src = &b->mem, x.src_loc = b->loc, x.src_off = off;
  }
  st = b->dev->be->xfer(b->dev->bdev, &x);
  if (st == UM_OK) {
    if (to_device)
      UM__STAT_ADD(b->dev, bytes_h2d, len);
    else
      UM__STAT_ADD(b->dev, bytes_d2h, len);
    UM__STAT_ADD(b->dev, xfer_direct, 1);
  }
  return st;
}

/* The device side of a mapping: a backend map, or the host shadow fetched
 * when the mode reads and the shadow is stale. Called without b's lock, b
 * marked busy (map_busy), so that no driver call stalls the threads that
 * take the lock. Returns the new valid bits through *valid. */
static int map_device(um_buffer *b, um_map_mode mode, size_t off, size_t len, void **ptr,
                      unsigned *valid) {
  int st;
  if (b->dev->be->map != NULL) {
    st = b->dev->be->map(b->dev->bdev, &b->mem, b->loc, off, len, mode, ptr);
    *valid = mode_writes(mode) ? UM_VALID_HOST : (UM_VALID_HOST | UM_VALID_DEVICE);
    return st;
  }
  bool whole = off == 0 && len == b->size;
  bool fetch = !(*valid & UM_VALID_HOST) && !(mode == UM_MAP_WRITE_DISCARD && whole);
  if (b->shadow == NULL && (b->shadow = aligned_alloc(64, (b->capacity + 63) & ~(size_t)63)) == NULL)
    return um__set_error(UM_ENOMEM, "um_map: no memory for the host copy");
  if (fetch && (st = shadow_xfer(b, false, 0, b->size)) != UM_OK)
    return st;
  *valid = mode_writes(mode) ? UM_VALID_HOST : (*valid | UM_VALID_HOST);
  *ptr = (char *)b->shadow + off;
  return UM_OK;
}

static int check_map_args(const um_buffer *b, um_map_mode mode, size_t off, size_t len, void **host) {
  if (host == NULL)
    return um__set_error(UM_EINVAL, "um_map: NULL host pointer");
  if ((unsigned)mode > UM_MAP_WRITE_DISCARD)
    return um__set_error(UM_EINVAL, "um_map: unknown mode %d", (int)mode);
  if (len == 0)
    return um__set_error(UM_EINVAL, "um_map: zero length");
  if (off > b->size || len > b->size - off)
    return um__set_error(UM_ERANGE, "um_map: range [%zu, +%zu) outside %zu bytes", off, len, b->size);
  if (b->readonly && mode_writes(mode))
    return um__set_error(UM_ESTATE, "um_map: buffer is a read-only wrap");
  return UM_OK;
}

/* Under b's lock: b may be mapped now (still the caller's, not mapped),
 * once every operation issued before has finished. */
static int map_begin_locked(um_buffer *b, uint32_t gen) {
  atomic_store(&b->touched, true); /* as in um__op_issue: before the state check */
  /* Checked again under the lock: released, or handed to a new owner (maybe
   * smaller) since the unlocked checks. */
  if (atomic_load(&b->state) != UM__BUF_LIVE || atomic_load(&b->gen) != gen)
    return um__set_error(UM_ESTATE, "um_map: buffer %p was released", (void *)b);
  if (b->mapped)
    return um__set_error(UM_ESTATE, "um_map: buffer is already mapped");
  /* The mapping sees the result of every operation issued before it. */
  while (b->pending > 0)
    pthread_cond_wait(&b->idle_cond, &b->lock);
  return UM_OK;
}

int um_map(um_buffer *b, um_map_mode mode, size_t off, size_t len, void **host) {
  uint32_t gen = 0;
  int st = um__buffer_check_owner(b, &gen);
  unsigned valid;
  void *ptr = NULL;
  if (st != UM_OK)
    return st;
  UM__CHECK_PROCESS(b->m);
  if ((st = check_map_args(b, mode, off, len, host)) != UM_OK)
    return st;
  UM__TEST_POINT(UM__TP_MAP_CHECKED, b);
  pthread_mutex_lock(&b->lock);
  if ((st = map_begin_locked(b, gen)) != UM_OK) {
    pthread_mutex_unlock(&b->lock);
    return st;
  }
  /* Mapped from here on for every other caller (operations answer
   * UM_ESTATE), busy until the device side is done. */
  b->mapped = true;
  b->map_busy = true;
  b->map_ptr = NULL;
  valid = b->valid;
  if (b->mem.host != NULL) {
    ptr = (char *)b->mem.host + off;
  } else {
    pthread_mutex_unlock(&b->lock);
    st = map_device(b, mode, off, len, &ptr, &valid);
    pthread_mutex_lock(&b->lock);
  }
  b->map_busy = false;
  if (st == UM_OK) {
    b->valid = valid;
    b->map_native = b->mem.host == NULL && b->dev->be->map != NULL;
    b->map_mode = mode;
    b->map_off = off;
    b->map_len = len;
    b->map_ptr = ptr;
    *host = ptr;
  } else {
    b->mapped = false;
  }
  pthread_cond_broadcast(&b->idle_cond);
  pthread_mutex_unlock(&b->lock);
  return st;
}

/* The device side of um_unmap, without b's lock (b busy): a backend unmap,
 * or the written range back from the shadow. Returns the new valid bits. */
static int unmap_device(um_buffer *b, void *host, unsigned *valid) {
  int st = UM_OK;
  if (b->map_native) {
    st = b->dev->be->unmap(b->dev->bdev, &b->mem, b->loc, host);
    *valid = UM_VALID_DEVICE;
  } else if (mode_writes(b->map_mode)) {
    st = shadow_xfer(b, true, b->map_off, b->map_len);
    /* A failed write-back loses the mapped writes (the call says so): the
     * device copy stays the current one, so later maps and copies agree. */
    *valid = st == UM_OK ? (UM_VALID_HOST | UM_VALID_DEVICE) : UM_VALID_DEVICE;
  }
  return st;
}

int um_unmap(um_buffer *b, void *host) {
  int st = um__buffer_check_live(b);
  unsigned valid;
  if (st != UM_OK)
    return st;
  UM__CHECK_PROCESS(b->m);
  pthread_mutex_lock(&b->lock);
  if (!b->mapped || b->map_busy) {
    st = um__set_error(UM_ESTATE, b->mapped ? "um_unmap: the mapping is being made or ended"
                                            : "um_unmap: buffer is not mapped");
    pthread_mutex_unlock(&b->lock);
    return st;
  }
  if (host != b->map_ptr) {
    st = um__set_error(UM_EINVAL, "um_unmap: %p is not the pointer um_map returned", host);
    pthread_mutex_unlock(&b->lock);
    return st;
  }
  valid = b->valid;
  if (b->mem.host == NULL) {
    b->map_busy = true;
    pthread_mutex_unlock(&b->lock);
    st = unmap_device(b, host, &valid);
    pthread_mutex_lock(&b->lock);
    b->map_busy = false;
  }
  b->valid = valid;
  b->mapped = false;
  b->map_native = false;
  b->map_ptr = NULL;
  pthread_cond_broadcast(&b->idle_cond);
  pthread_mutex_unlock(&b->lock);
  return st;
}
