/* Buffer handles: the checks of a caller's handle, a descriptor going live,
 * an operation ending on a buffer, and the end of a released buffer
 * (retire). The layer under the API files (buffer.c, map.c, copy.c,
 * stream.c) and the operation layer (op.c); above the quarantine, the
 * owners (block_return.c) and the thread caches. */
#include <stdlib.h>

#include "core.h"

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

void um__buffer_op_finish_locked(um_buffer *b, um_event *op, bool *drop_last, bool *retire) {
  b->pending--;
  *drop_last = b->last == op;
  if (*drop_last)
    b->last = NULL;
  *retire = false;
  if (b->pending == 0) {
    pthread_cond_broadcast(&b->idle_cond);
    if (b->release_deferred) {
      b->release_deferred = false;
      *retire = true;
    }
  }
}

void um__buffer_wait_idle_locked(um_buffer *b) {
  if (b->pending == 0)
    return;
  /* The kick (riders.c) may complete operations here: not under the lock. */
  pthread_mutex_unlock(&b->lock);
  um__riders_wait_begin(b->m);
  pthread_mutex_lock(&b->lock);
  while (b->pending > 0)
    pthread_cond_wait(&b->idle_cond, &b->lock);
  um__riders_wait_end(b->m);
}

void um__buffer_wait_idle(um_buffer *b) {
  pthread_mutex_lock(&b->lock);
  um__buffer_wait_idle_locked(b);
  pthread_mutex_unlock(&b->lock);
}

/* ------------------------------------------------------------------------ */
/* UM_WRAP_PIN registrations with other backends */

/* UM_WRAP_PIN page-locks the range through device 0 and also registers it
 * with every other backend that can register host memory (CUDA:
 * cuMemHostRegister, portable to all of its devices), once per backend
 * through its first device: that backend's copies then DMA from the range
 * directly instead of staging it through pinned chunks. A backend that
 * refuses (the range overlaps memory it pinned already, say) only loses
 * that shortcut: the range is page-locked all the same. wrap_regs is NULL
 * whenever the buffer is not a live pinned wrap (retiring resets it). */
void um__wrap_register_devices(um_buffer *b) {
  um_manager *m = b->m;
  const um_device *seen[UM__MAX_BACKENDS]; /* one device of each backend met */
  int nseen = 0;
  for (int i = 1; i < um__ndevices(m); i++) {
    um_device *d = m->devices[i];
    bool known = um__dev_same_backend(d, b->dev) || !um__dev_can_register(d);
    for (int j = 0; j < nseen && !known; j++)
      known = um__dev_same_backend(seen[j], d);
    if (known || nseen == UM__MAX_BACKENDS)
      continue;
    seen[nseen++] = d;
    if (b->wrap_regs == NULL &&
        (b->wrap_regs = calloc(UM__MAX_BACKENDS, sizeof(*b->wrap_regs))) == NULL)
      return; /* no memory for the bookkeeping: the staging paths still work */
    if (um__dev_host_register(d, b->mem.host, b->size, &b->wrap_regs[b->nwrap_regs].mem) == UM_OK)
      b->wrap_regs[b->nwrap_regs++].dev = d;
    else
      um__log(&m->opts, UM_LOG_INFO, "um_wrap_host: %s did not register %zu bytes at %p (%s); its copies stage them",
              um__dev_backend_name(d), b->size, b->mem.host, um_last_error());
  }
  if (b->nwrap_regs == 0) {
    free(b->wrap_regs);
    b->wrap_regs = NULL;
  }
}

static void wrap_unregister_devices(um_buffer *b) {
  for (int i = 0; i < b->nwrap_regs; i++)
    um__dev_host_unregister(b->wrap_regs[i].dev, &b->wrap_regs[i].mem);
  free(b->wrap_regs);
  b->wrap_regs = NULL;
  b->nwrap_regs = 0;
}

bool um__wrap_registered(const um_buffer *b, const um_device *d) {
  for (int i = 0; i < b->nwrap_regs; i++)
    if (um__dev_same_backend(b->wrap_regs[i].dev, d))
      return true;
  return false;
}

/* ------------------------------------------------------------------------ */
/* Retire */

void um__buffer_retire(um_buffer *b, um__tcache *tc) {
  /* Memory that a peer may still write waits in the net until it cannot. */
  if (__builtin_expect(atomic_load_explicit(&b->net_held, memory_order_relaxed), 0) && um__upcall.net.hold != NULL &&
      um__upcall.net.hold(b))
    return;
  /* A pooled block released on the caller's thread goes to that thread's
   * cache when its class has a slot (tc->slots_on: pooling on, debug off). */
  if (b->kind == UM__KIND_POOLED && tc != NULL && tc->slots_on && b->cls < UM__TCACHE_CLASSES) {
    free(b->shadow);
    b->shadow = NULL;
    um__tcache_put(tc, b);
    return;
  }
  /* Before the quarantine too: the caller may free the range now. */
  if (b->wrap_regs != NULL)
    wrap_unregister_devices(b);
  if (__builtin_expect(b->m->opts.debug != 0, 0)) {
    um__quarantine_put(b);
    return;
  }
  um__buffer_to_owner(b);
}
