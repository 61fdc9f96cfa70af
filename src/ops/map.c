/* The host mapping of a buffer, and its coherence state.
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
 *
 * No backend call runs under the buffer's lock: the mapping is marked busy
 * (map_busy) while the backend maps, fetches, writes back or unmaps, so
 * that the threads that take the lock (completions, um_buffer_valid, a
 * release) are not stalled behind a device transfer. */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "testhook.h"

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
  st = um__dev_xfer(b->dev, &x);
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
  if (um__dev_has_map(b->dev)) {
    st = um__dev_map(b->dev, &b->mem, b->loc, off, len, mode, ptr);
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
 * once every operation issued before has finished. The wait for them
 * drops the lock, and another thread may map b, open a bracket on it or
 * release it meanwhile: every check is made again after a wait, and passes
 * only with nothing pending and the lock held since. */
static int map_begin_locked(um_buffer *b, uint32_t gen) {
  um__bias_leave(b->m); /* tcache.h: the sole thread's release is plain */
  atomic_store(&b->touched, true); /* as in um__op_issue: before the state check */
  for (;;) {
    /* Checked again under the lock: released, or handed to a new owner
     * (maybe smaller) since the unlocked checks. */
    if (atomic_load(&b->state) != UM__BUF_LIVE || atomic_load(&b->gen) != gen)
      return um__set_error(UM_ESTATE, "um_map: buffer %p was released", (void *)b);
    if (b->mapped)
      return um__set_error(UM_ESTATE, "um_map: buffer is already mapped");
    if (b->access_state != 0)
      return um__set_error(UM_ESTATE, "um_map: buffer is in an access bracket: end it first");
    /* The wait below would pass through another buffer's open bracket. */
    if (um__buffer_waits_bracket_locked(b, false))
      return um__op_bracket_error(b);
    /* The mapping sees the result of every operation issued before it. */
    if (b->pending == 0)
      return UM_OK;
    um__buffer_wait_idle_locked(b);
  }
}

/* A map while the manager observes: its event into the history (its
 * issue to its end), under the thread's tag. */
static __attribute__((noinline, cold)) void map_observed(um_buffer *b, size_t len, int st, uint64_t t0) {
  um_history_event e = {.kind = UM_HIST_MAP, .device = b->dev->index, .src_device = -1, .dst_device = -1,
                        .loc = b->loc, .status = st, .bytes = len,
                        .address = b->mem.host != NULL ? (uint64_t)(uintptr_t)b->mem.host : (uint64_t)b->mem.handle,
                        .tag = um__obs_tag_name(b->m, um__obs_tag_now(b->m)), .begin_ns = t0, .end_ns = um__now_ns()};
  if (um__hist_on(b->m))
    um__obs_event(b->m, &e);
}

int um_map(um_buffer *b, um_map_mode mode, size_t off, size_t len, void **host) {
  uint32_t gen = 0;
  int st = um__buffer_check_owner(b, &gen);
  unsigned valid;
  void *ptr = NULL;
  uint64_t t0;
  if (st != UM_OK)
    return st;
  t0 = atomic_load_explicit(&b->m->observing, memory_order_relaxed) != 0 ? um__now_ns() : 0;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
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
    b->map_native = b->mem.host == NULL && um__dev_has_map(b->dev);
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
  if (__builtin_expect(atomic_load_explicit(&b->m->observing, memory_order_relaxed) != 0, 0))
    map_observed(b, len, st, t0);
  return st;
}

/* The device side of um_unmap, without b's lock (b busy): a backend unmap,
 * or the written range back from the shadow. Returns the new valid bits. */
static int unmap_device(um_buffer *b, void *host, unsigned *valid) {
  int st = UM_OK;
  if (b->map_native) {
    st = um__dev_unmap(b->dev, &b->mem, b->loc, host);
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
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
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
