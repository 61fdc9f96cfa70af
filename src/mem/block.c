/* Blocks: memory taken from a device and given back to it, the descriptors
 * (um_buffer) that travel with blocks, and the pinned staging chunks of
 * pageable copies. The bottom of the core: it calls the backend table and
 * nothing above it.
 *
 * Descriptors are made once and kept until the manager is destroyed: a
 * descriptor without a block (a "husk") waits on the manager's list for the
 * next allocation, so that a stale handle always points at a readable
 * descriptor. */
#include <stdlib.h>
#include <string.h>

#include "tcache.h"
#include "testhook.h"

/* The device whose backend gives d's blocks at loc: UM_HOST on any device
 * is ordinary pageable host memory, the cpu device's (device 0), accounted
 * to d (every location on every device, as unimem.h promises). */
static um_device *giver(um_device *d, um_location loc) {
  return loc == UM_HOST ? d->m->devices[0] : d;
}

/* Whether a block counts against device_limit_bytes: GPU memory (DEVICE,
 * UNIFIED) of an OpenCL or CUDA device, not host memory nor the cpu's. */
static bool limited(const um_device *d, um_location loc) {
  return (loc == UM_DEVICE || loc == UM_UNIFIED) && um__device_limited(d);
}

/* Count bytes against the limit before allocating them, so that two
 * threads cannot both pass the check and then together exceed it. */
static int limit_reserve(um_device *d, size_t bytes) {
  uint64_t limit = um__device_limit_bytes(d);
  uint_fast64_t held = um__atomic_load_relaxed(&d->limited_bytes);
  do {
    if (limit != 0 && ((uint64_t)bytes > limit || held > limit - (uint64_t)bytes))
      return um__set_error(UM_ENOMEM, "%s: %zu bytes on %s would pass %s (%llu bytes, %llu in use)",
                           um__dev_backend_name(d), bytes, d->info.name,
                           limit == d->m->opts.device_limit_bytes ? "device_limit_bytes" : "the device's memory size",
                           (unsigned long long)limit, (unsigned long long)held);
  } while (!um__atomic_cas_acq_rel(&d->limited_bytes, &held, held + (uint64_t)bytes));
  return UM_OK;
}

int um__block_alloc(um_device *d, um_location loc, size_t bytes, um__mem *mem) {
  um_device *g = giver(d, loc);
  bool counted = limited(d, loc);
  int st;
  memset(mem, 0, sizeof(*mem));
  if (counted && (st = limit_reserve(d, bytes)) != UM_OK)
    return st;
  st = um__dev_mem_alloc(g, loc, bytes, mem);
  if (st != UM_OK && counted)
    um__atomic_sub_relaxed(&d->limited_bytes, (uint64_t)bytes);
  if (st == UM_OK) {
    UM__STAT_ADD(d, device_allocs, 1);
    UM__STAT_ADD(d, bytes_reserved, bytes);
  }
  return st;
}

void um__block_free(um_device *d, um_location loc, size_t bytes, um__mem *mem) {
  um_device *g = giver(d, loc);
  if (mem->carved != NULL) {
    um__seg_release(&d->pools[loc], mem, bytes);
    return;
  }
  UM__TEST_POINT(UM__TP_BLOCK_FREE, d);
  um__dev_mem_free(g, loc, bytes, mem);
  if (limited(d, loc))
    um__atomic_sub_relaxed(&d->limited_bytes, (uint64_t)bytes);
  UM__STAT_ADD(d, device_frees, 1);
  UM__STAT_SUB(d, bytes_reserved, bytes);
}

/* Set a block's first bytes to zero. Kept out of line: it is off the pool
 * hit's path unless UM_ALLOC_ZERO or scrub asks for it. */
__attribute__((noinline)) int um__block_zero(um_buffer *b, size_t bytes) {
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
  return um__dev_xfer(b->dev, &x);
}

/* ------------------------------------------------------------------------ */
/* Descriptors */

um_buffer *um__descriptor_get(um_manager *m) {
  um_buffer *b;
  pthread_mutex_lock(&m->registry_lock);
  b = m->husks;
  if (b != NULL) {
    m->husks = b->husk_next;
    pthread_mutex_unlock(&m->registry_lock);
    b->husk_next = NULL;
    return b;
  }
  pthread_mutex_unlock(&m->registry_lock);
  /* Whole cache lines: two threads working on two buffers (each from its
   * own thread cache) must not share a line. */
  b = aligned_alloc(64, (sizeof(*b) + 63) & ~(size_t)63);
  if (b == NULL)
    return NULL;
  memset(b, 0, sizeof(*b));
  b->magic = UM__BUFFER_MAGIC;
  b->m = m;
  atomic_init(&b->state, UM__BUF_HUSK);
  pthread_mutex_init(&b->lock, NULL);
  pthread_cond_init(&b->idle_cond, NULL);
  pthread_mutex_lock(&m->registry_lock);
  b->all_next = m->all_buffers;
  m->all_buffers = b;
  pthread_mutex_unlock(&m->registry_lock);
  return b;
}

void um__descriptor_put(um_manager *m, um_buffer *b) {
  atomic_store_explicit(&b->state, UM__BUF_HUSK, memory_order_release);
  memset(&b->mem, 0, sizeof(b->mem));
  pthread_mutex_lock(&m->registry_lock);
  b->husk_next = m->husks;
  m->husks = b;
  pthread_mutex_unlock(&m->registry_lock);
}

void um__descriptors_free_all(um_manager *m) {
  while (m->all_buffers) {
    um_buffer *b = m->all_buffers;
    m->all_buffers = b->all_next;
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->idle_cond);
    free(b->shadow);
    free(b);
  }
  m->husks = NULL;
}

/* ------------------------------------------------------------------------ */
/* Pinned staging chunks, kept per device up to pinned_pool_bytes. */

int um__staging_get(um_device *d, um__mem *out) {
  pthread_mutex_lock(&d->staging_lock);
  if (d->staging_count > 0) {
    *out = d->staging_free[--d->staging_count];
    pthread_mutex_unlock(&d->staging_lock);
    return UM_OK;
  }
  pthread_mutex_unlock(&d->staging_lock);
  return um__block_alloc(d, UM_PINNED, d->m->opts.staging_chunk_bytes, out);
}

void um__staging_put(um_device *d, um__mem *mem) {
  size_t chunk = d->m->opts.staging_chunk_bytes;
  uint64_t cap = d->m->opts.pinned_pool_bytes / chunk;
  if (cap > sizeof(d->staging_free) / sizeof(d->staging_free[0]))
    cap = sizeof(d->staging_free) / sizeof(d->staging_free[0]);
  pthread_mutex_lock(&d->staging_lock);
  if ((uint64_t)d->staging_count < cap) {
    d->staging_free[d->staging_count++] = *mem;
    pthread_mutex_unlock(&d->staging_lock);
    return;
  }
  pthread_mutex_unlock(&d->staging_lock);
  um__block_free(d, UM_PINNED, chunk, mem);
}

void um__staging_free_all(um_device *d) {
  size_t chunk = d->m->opts.staging_chunk_bytes;
  pthread_mutex_lock(&d->staging_lock);
  while (d->staging_count > 0)
    um__block_free(d, UM_PINNED, chunk, &d->staging_free[--d->staging_count]);
  pthread_mutex_unlock(&d->staging_lock);
}
