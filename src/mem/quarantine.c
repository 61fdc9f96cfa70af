/* The debug quarantine (um_options.debug, UNIMEM_DEBUG=1).
 *
 * Without it, a released buffer's descriptor and block go straight back to
 * the pool, and the next allocation of the same size gets the same handle:
 * a stale handle then silently works on someone else's buffer. In debug
 * mode a released buffer waits here first, in FIFO order, its handle still
 * answering UM_ESTATE and its host bytes overwritten with UM__POISON_BYTE,
 * until UM__QUARANTINE_MAX_BUFFERS later releases or UM__QUARANTINE_MAX_BYTES
 * of quarantined blocks push it out; then it takes the ordinary path (pool
 * or device). A block retrieved from the pool afterwards still shows the
 * poison where nothing wrote since, so a read of stale data is visible too.
 *
 * Resources that are not ours (a wrapped range's page lock, a file mapping)
 * are given back at release, at once: only the descriptor waits.
 *
 * Under memory pressure (an allocation failed on the device) the blocks
 * of the device's quarantined buffers go back to it at once, but their
 * descriptors stay: a stale handle is still caught.
 *
 * The list is guarded by the manager's registry_lock (it is a list of
 * descriptors, like the husks); the lock is never held while a buffer is
 * recycled, since recycling takes bin locks and the registry lock itself,
 * nor while a block goes back to its device.
 */
#include <stdlib.h>
#include <string.h>

#include "tcache.h"
#include "list.h"

/* Bytes a quarantined buffer holds from its device (wraps and files hold
 * none: their memory went back at release). */
static uint64_t held_bytes(const um_buffer *b) {
  return (b->kind == UM__KIND_POOLED || b->kind == UM__KIND_UNPOOLED) ? b->capacity : 0;
}

/* Evict (into *out, linked through quarantine_next) what exceeds the
 * bounds; the newest entry always stays. Called under registry_lock. */
static um_buffer *take_excess(um_manager *m) {
  um_buffer *out = NULL, **tail = &out;
  while (m->quarantine_count > 1 &&
         (m->quarantine_count > UM__QUARANTINE_MAX_BUFFERS ||
          m->quarantine_bytes > UM__QUARANTINE_MAX_BYTES)) {
    um_buffer *b = m->quarantine_head;
    m->quarantine_head = b->quarantine_next;
    m->quarantine_count--;
    m->quarantine_bytes -= held_bytes(b);
    b->quarantine_next = NULL;
    *tail = b;
    tail = &b->quarantine_next;
  }
  if (m->quarantine_head == NULL)
    m->quarantine_tail = NULL;
  return out;
}

/* Leave the quarantine: the block goes to its owner (a wrap's or a file's
 * memory went back at release: only the descriptor is left). */
static void release_list(um_buffer *b) {
  while (b != NULL) {
    um_buffer *next = b->quarantine_next;
    b->quarantine_next = NULL;
    um__buffer_to_owner(b);
    b = next;
  }
}

void um__quarantine_put(um_buffer *b) {
  um_manager *m = b->m;
  um_buffer *evicted;

  if (b->kind == UM__KIND_WRAPPED || b->kind == UM__KIND_FILE)
    um__buffer_return_borrowed(b); /* not ours to hold back */
  else if (b->mem.host != NULL)
    memset(b->mem.host, UM__POISON_BYTE, b->capacity);
  if (b->shadow != NULL) {
    memset(b->shadow, UM__POISON_BYTE, b->capacity);
    free(b->shadow);
    b->shadow = NULL;
  }

  pthread_mutex_lock(&m->registry_lock);
  b->quarantine_next = NULL;
  UM__QUEUE_APPEND(m->quarantine_head, m->quarantine_tail, b, quarantine_next);
  m->quarantine_count++;
  m->quarantine_bytes += held_bytes(b);
  evicted = take_excess(m);
  pthread_mutex_unlock(&m->registry_lock);
  release_list(evicted);
}

void um__quarantine_flush(um_manager *m) {
  um_buffer *out;
  pthread_mutex_lock(&m->registry_lock);
  out = m->quarantine_head;
  m->quarantine_head = m->quarantine_tail = NULL;
  m->quarantine_count = 0;
  m->quarantine_bytes = 0;
  pthread_mutex_unlock(&m->registry_lock);
  release_list(out);
}

/* One block taken from a quarantined descriptor, to free after the lock. */
typedef struct dropped_block {
  um_location loc;
  size_t capacity;
  um__mem mem;
} dropped_block;

/* Under registry_lock: detach the blocks of d's quarantined buffers (at most
 * cap of them) into out; the entries keep their handles and hold no memory
 * from here on, like a wrap whose range went back. um_alloc sets the kind
 * again when it reuses the descriptor. */
static size_t detach_blocks_locked(um_manager *m, um_device *d, dropped_block *out, size_t cap) {
  size_t n = 0;
  for (um_buffer *b = m->quarantine_head; b != NULL && n < cap; b = b->quarantine_next) {
    if (b->dev != d || held_bytes(b) == 0)
      continue;
    m->quarantine_bytes -= held_bytes(b);
    out[n].loc = b->loc;
    out[n].capacity = b->capacity;
    out[n++].mem = b->mem;
    memset(&b->mem, 0, sizeof(b->mem));
    b->kind = UM__KIND_WRAPPED;
    b->slot = UM__NO_SLOT;
    b->pinned_wrap = false;
  }
  return n;
}

void um__quarantine_drop_blocks(um_manager *m, um_device *d) {
  /* The device frees run after the lock is dropped (a device free can be
   * slow, and every allocation needing a descriptor takes this lock), in
   * rounds of a fixed array: an entry whose block was detached may leave
   * the quarantine and be reused at once, it references the block no more. */
  dropped_block blocks[64];
  size_t n;
  do {
    pthread_mutex_lock(&m->registry_lock);
    n = detach_blocks_locked(m, d, blocks, sizeof(blocks) / sizeof(blocks[0]));
    pthread_mutex_unlock(&m->registry_lock);
    for (size_t i = 0; i < n; i++)
      um__block_free(d, blocks[i].loc, blocks[i].capacity, &blocks[i].mem);
  } while (n == sizeof(blocks) / sizeof(blocks[0]));
}
