/* A released buffer's block goes back to its owner, by the buffer's kind:
 * a pooled block to the pool (its bin), an unpooled one to its device, the
 * memory a wrap or a mapped file borrowed to the caller or the file. Then
 * the descriptor waits for its next allocation (a husk), unless it went to
 * the pool with its block.
 *
 * Reached from buffer_state.c (a released buffer with nothing pending) and from
 * the debug quarantine (an entry leaving it). A pooled block released on
 * the caller's thread may go to that thread's cache instead (buffer_state.c). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tcache.h"

void um__buffer_return_borrowed(um_buffer *b) {
  if (b->kind == UM__KIND_WRAPPED) {
    void (*fn)(void *) = b->on_return;
    if (b->pinned_wrap)
      um__dev_host_unregister(b->dev, &b->mem);
    b->pinned_wrap = false;
    b->on_return = NULL;
    if (fn != NULL) /* the owner's own release (a DLPack deleter), once */
      fn(b->on_return_ctx);
  } else if (b->kind == UM__KIND_FILE && b->mem.host != NULL) {
    if (!b->readonly) /* a writable mapping is written back first */
      msync(b->mem.host, b->capacity, MS_SYNC);
    um__os_munmap(b->mem.host, b->capacity);
  }
  memset(&b->mem, 0, sizeof(b->mem));
}

void um__buffer_to_owner(um_buffer *b) {
  um_device *d = b->dev;
  um_manager *m = b->m;
  free(b->shadow);
  b->shadow = NULL;
  switch (b->kind) {
  case UM__KIND_POOLED:
    if (m->opts.enable_pooling) {
      um__pool_put(&d->pools[b->loc], b);
      return;
    }
    /* fall through */
  case UM__KIND_UNPOOLED:
    um__block_free(d, b->loc, b->capacity, &b->mem);
    break;
  case UM__KIND_WRAPPED:
  case UM__KIND_FILE:
    um__buffer_return_borrowed(b);
    break;
  }
  um__descriptor_put(m, b);
}
