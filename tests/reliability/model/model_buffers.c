/* Buffers in the model: allocation, wrapping, release (and the pool's
 * promise that release then allocate gives the block back), mapping. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

#define PAGE ((size_t)4096)

static size_t round_page(size_t n) { return (n + PAGE - 1) & ~(PAGE - 1); }

/* Locked memory of this process now (VmLck), in bytes. */
static uint64_t vmlck_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long kb = 0;
  if (f == NULL)
    return UINT64_MAX;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmLck: %llu kB", &kb) == 1)
      break;
  fclose(f);
  return (uint64_t)kb * 1024u;
}

static void stale_forget(mdl_ctx *c, um_buffer *h) {
  for (int i = 0; i < c->nstale; i++)
    if (c->stale[i] == h)
      c->stale[i--] = c->stale[--c->nstale];
}

static void stale_remember(mdl_ctx *c, um_buffer *h) {
  if (c->sh != NULL)
    return; /* another thread may own the handle again at any moment */
  if (c->nstale == MDL_MAX_STALE)
    memmove(c->stale, c->stale + 1, (MDL_MAX_STALE - 1) * sizeof(c->stale[0])), c->nstale--;
  c->stale[c->nstale++] = h;
}

static uint64_t pinned_cost(const mdl_ctx *c, const mdl_buf *b) {
  if (b->kind == MDL_ALLOC)
    return c->devs[b->dev].kind == MDL_CPU && b->loc == UM_PINNED ? round_page(mdl_capacity(c, b)) : 0;
  return (b->flags & UM_WRAP_PIN) ? round_page(b->size) : 0;
}

/* Fill in a new live buffer's model. */
static void buf_live(mdl_ctx *c, mdl_buf *b, um_buffer *h, int dev, um_location loc, mdl_buf_kind kind,
                     unsigned flags, size_t size) {
  const mdl_dev *d = &c->devs[dev];
  b->live = true;
  b->id = mdl_next_id();
  b->h = h;
  b->dev = dev;
  b->loc = loc;
  b->kind = kind;
  b->flags = flags;
  b->pooled = kind == MDL_ALLOC && c->cfg.opts.enable_pooling && !(flags & UM_ALLOC_UNPOOLED);
  mdl_buf_attach(c, b, size);
  b->host_view = kind != MDL_ALLOC || mdl_dev_host_view(d, loc);
  b->map_style = kind != MDL_ALLOC ? MDL_MAP_POINTER : mdl_dev_map_style(d, loc);
  b->valid = b->host_view ? (UM_VALID_HOST | UM_VALID_DEVICE) : UM_VALID_DEVICE;
  stale_forget(c, h);
  mdl_count_in(c, b);
  c->pinned_live += pinned_cost(c, b);
}

/* ------------------------------------------------------------------------ */
/* Allocation */

static um_location pick_loc(mdl_ctx *c, int dev, size_t size) {
  const mdl_dev *d = &c->devs[dev];
  um_location loc = d->locs[mdl_range(&c->rng, 0, (size_t)d->nlocs - 1)];
  if (d->kind == MDL_CPU && loc == UM_PINNED &&
      (!c->cfg.pinned_ok || c->pinned_live + round_page(size + size / 4) > c->cfg.pinned_budget))
    loc = UM_DEVICE; /* the mlock budget is spent: the cpu's DEVICE is host memory too */
  return loc;
}

static void alloc_one(mdl_ctx *c, mdl_buf *b, int dev, um_location loc, size_t size, unsigned flags) {
  um_buffer *h = NULL;
  snprintf(c->what, sizeof(c->what), "um_alloc(dev %d, %zu, loc %d, flags %u)", dev, size, (int)loc, flags);
  MDL_EXPECT_ST(c, um_alloc(c->m, c->devs[dev].d, size, loc, flags, &h), UM_OK, "um_alloc");
  if (c->cfg.opts.enable_pooling && !(flags & UM_ALLOC_UNPOOLED))
    c->counts[dev].pooled_requests++;
  buf_live(c, b, h, dev, loc, MDL_ALLOC, flags, size);
  if ((flags & UM_ALLOC_ZERO) || c->cfg.opts.scrub) {
    memset(b->data, 0, size);
    memset(b->known, 1, size);
  }
  mdl_check_getters(c, b);
}

void mdl_step_alloc(mdl_ctx *c) {
  mdl_buf *b = mdl_buf_slot(c);
  int dev = (int)mdl_range(&c->rng, 0, (size_t)c->ndevs - 1);
  size_t size = mdl_pick_len(c, c->cfg.max_size);
  unsigned flags = (mdl_pct(&c->rng, 20) ? UM_ALLOC_UNPOOLED : 0) | (mdl_pct(&c->rng, 30) ? UM_ALLOC_ZERO : 0);
  if (b == NULL || mdl_live_count(c) >= MDL_MAX_BUFS - 4) {
    mdl_step_release(c, NULL);
    return;
  }
  if (c->in_use_total + size > c->cfg.max_live_bytes)
    size = mdl_range(&c->rng, 1, 4096);
  alloc_one(c, b, dev, pick_loc(c, dev, size), size, flags);
  if ((flags & UM_ALLOC_ZERO) && !c->no_block && mdl_pct(&c->rng, 30))
    mdl_verify_buf(c, b);
}

/* ------------------------------------------------------------------------ */
/* Wraps: caller memory at odd addresses; page-aligned when pinned. */

static bool can_pin(mdl_ctx *c, size_t size) {
  uint64_t locked;
  if (!c->cfg.pinned_ok || size > 256 * 1024)
    return false;
  if (c->cfg.mlock_limit == UINT64_MAX)
    return true;
  locked = vmlck_bytes();
  return locked != UINT64_MAX && locked + round_page(size) + 2 * PAGE <= c->cfg.mlock_limit;
}

void mdl_step_wrap(mdl_ctx *c) {
  mdl_buf *b = mdl_buf_slot(c);
  size_t size = mdl_pick_len(c, c->cfg.max_size < (2u << 20) ? c->cfg.max_size : (2u << 20));
  unsigned flags = mdl_pct(&c->rng, 30) ? UM_WRAP_READONLY : 0;
  unsigned char *base, *mem;
  um_buffer *h = NULL;
  if (b == NULL || mdl_live_count(c) >= MDL_MAX_BUFS - 4 || c->in_use_total + size > c->cfg.max_live_bytes)
    return;
  if (mdl_pct(&c->rng, 15) && can_pin(c, size))
    flags |= UM_WRAP_PIN;
  if (flags & UM_WRAP_PIN) {
    base = mem = aligned_alloc(PAGE, round_page(size));
  } else {
    base = malloc(size + 64);
    mem = base + mdl_range(&c->rng, 0, 63);
  }
  MDL_CHECK(c, base != NULL, "test out of memory for a wrap of %zu bytes", size);
  mdl_fill_random(&c->rng, mem, size);
  snprintf(c->what, sizeof(c->what), "um_wrap_host(%p, %zu, flags %u)", (void *)mem, size, flags);
  MDL_EXPECT_ST(c, um_wrap_host(c->m, mem, size, flags, &h), UM_OK, "um_wrap_host");
  buf_live(c, b, h, 0, UM_HOST, (flags & UM_WRAP_READONLY) ? MDL_WRAP_RO : MDL_WRAP, flags, size);
  b->wrap_mem = mem;
  b->wrap_base = base;
  memcpy(b->data, mem, size);
  memset(b->known, 1, size);
  mdl_check_getters(c, b);
}

/* ------------------------------------------------------------------------ */
/* Release */

/* A released wrap: its memory must now hold the last contents the model
 * gave it (releasing waits for the wrap's operations), and it must not
 * change any more. */
static void wrap_released(mdl_ctx *c, mdl_buf *b) {
  mdl_wrap_gone *g;
  char what[96];
  mdl_fence_data(c, b->id);
  snprintf(what, sizeof(what), "wrap #%llu right after um_release", (unsigned long long)b->id);
  if (!b->mapped)
    mdl_compare(c, what, b->wrap_mem, b->data, b->known, b->size, 0);
  g = &c->gone[c->ngone++];
  g->mem = b->wrap_base;
  g->size = (size_t)(b->wrap_mem - b->wrap_base) + b->size;
  memset(g->mem, MDL_POISON, g->size);
  g->id = b->id;
}

void mdl_step_release(mdl_ctx *c, mdl_buf *b) {
  if (b == NULL) {
    b = mdl_pick_buf(c, false, false);
    if (b == NULL || b->shared)
      return;
  }
  if (b->kind != MDL_ALLOC && (c->no_block || c->ngone == MDL_MAX_WRAPS_GONE)) {
    if (c->no_block)
      return; /* releasing a wrap waits for its operations: not with the gate closed */
    mdl_sync(c);
  }
  mdl_resolve_all(c);
  snprintf(c->what, sizeof(c->what), "um_release(#%llu%s)", (unsigned long long)b->id,
           b->mapped ? ", mapped" : "");
  if (b->kind == MDL_WRAP_RO)
    mdl_compare(c, "read-only wrap before release", b->wrap_mem, b->data, b->known, b->size, 0);
  MDL_EXPECT_ST(c, um_release(b->h), UM_OK, "um_release");
  mdl_count_out(c, b);
  c->pinned_live -= pinned_cost(c, b);
  if (b->kind != MDL_ALLOC)
    wrap_released(c, b);
  stale_remember(c, b->h);
  free(b->map_written);
  mdl_buf_detach(c, b);
}

/* SPEC section 4: a released block is reused by the next fitting request
 * on the same device and location: release then allocate (any size of the
 * same class) gives back the same handle, counted as one pool hit. Only
 * when nothing is pending on it (a mapping waits for that) and the limits
 * leave room. */
void mdl_step_release_realloc(mdl_ctx *c) {
  mdl_buf *b = mdl_pick_buf(c, false, false);
  um_buffer *old;
  um_stats before, after;
  um_location loc;
  int dev, cls;
  size_t size;
  unsigned flags = mdl_pct(&c->rng, 40) ? UM_ALLOC_ZERO : 0;
  if (c->sh != NULL || c->no_block || b == NULL || !b->pooled || b->shared || !c->cfg.generous_pool ||
      c->cfg.opts.debug)
    return;
  if (!b->mapped) {
    void *p = NULL;
    MDL_EXPECT_ST(c, um_map(b->h, UM_MAP_READ, 0, 1, &p), UM_OK, "um_map (fence before release)");
    MDL_EXPECT_ST(c, um_unmap(b->h, p), UM_OK, "um_unmap (fence before release)");
    mdl_fence_buffer(c, b->id);
    if (b->map_style == MDL_MAP_SHADOW)
      b->valid |= UM_VALID_HOST;
  }
  old = b->h, dev = b->dev, loc = b->loc, cls = um__size_class_of(b->size);
  size = mdl_range(&c->rng, cls == 0 ? 1 : um__class_size(cls - 1) + 1, um__class_size(cls));
  before = mdl_stats(c, dev);
  mdl_step_release(c, b);
  b = mdl_buf_slot(c);
  alloc_one(c, b, dev, loc, size, flags);
  after = mdl_stats(c, dev);
  MDL_CHECK(c, b->h == old, "the released block was not handed back (got %p, released %p)", (void *)b->h,
            (void *)old);
  MDL_CHECK(c, after.pool_hits == before.pool_hits + 1, "pool_hits moved from %llu to %llu, expected one hit",
            (unsigned long long)before.pool_hits, (unsigned long long)after.pool_hits);
}

/* ------------------------------------------------------------------------ */
/* Mapping. The coherence state follows src/buffer.c's state machine. */

static void valid_after_map(mdl_buf *b, um_map_mode mode) {
  bool writes = mode != UM_MAP_READ;
  if (b->map_style == MDL_MAP_NATIVE)
    b->valid = writes ? UM_VALID_HOST : (UM_VALID_HOST | UM_VALID_DEVICE);
  else if (b->map_style == MDL_MAP_SHADOW)
    b->valid = writes ? UM_VALID_HOST : (b->valid | UM_VALID_HOST);
}

static void valid_after_unmap(mdl_buf *b) {
  if (b->map_style == MDL_MAP_NATIVE)
    b->valid = UM_VALID_DEVICE;
  else if (b->map_style == MDL_MAP_SHADOW && b->map_mode != UM_MAP_READ)
    b->valid = UM_VALID_HOST | UM_VALID_DEVICE;
}

/* Write random bytes into part of the mapping. */
static void write_mapping(mdl_ctx *c, mdl_buf *b) {
  size_t len = mdl_pick_len(c, b->map_len), off = mdl_range(&c->rng, 0, b->map_len - len);
  mdl_fill_random(&c->rng, b->map_ptr + off, len);
  memset(b->map_written + off, 1, len);
}

void mdl_step_map(mdl_ctx *c) {
  mdl_buf *b = mdl_pick_buf(c, false, true);
  um_map_mode mode = (um_map_mode)mdl_range(&c->rng, 0, 3);
  size_t off = 0, len;
  void *p = NULL;
  char what[96];
  if (c->no_block || b == NULL || b->shared)
    return;
  if (b->kind == MDL_WRAP_RO)
    mode = UM_MAP_READ;
  len = b->size;
  if (mdl_pct(&c->rng, 65)) {
    len = mdl_pick_len(c, b->size);
    off = mdl_range(&c->rng, 0, b->size - len);
  }
  mdl_resolve_all(c);
  snprintf(c->what, sizeof(c->what), "um_map(#%llu, mode %d, %zu, %zu)", (unsigned long long)b->id, (int)mode,
           off, len);
  MDL_EXPECT_ST(c, um_map(b->h, mode, off, len, &p), UM_OK, "um_map");
  mdl_fence_buffer(c, b->id);
  valid_after_map(b, mode);
  if (b->host_view)
    MDL_CHECK(c, p == (unsigned char *)um_buffer_host_ptr(b->h) + off, "the mapping is not the host view");
  snprintf(what, sizeof(what), "mapping of #%llu (mode %d)", (unsigned long long)b->id, (int)mode);
  if (mode != UM_MAP_WRITE_DISCARD)
    mdl_compare(c, what, p, b->data + off, b->known + off, len, off);
  b->mapped = true, b->map_mode = mode, b->map_off = off, b->map_len = len, b->map_ptr = p;
  b->map_written = calloc(len, 1);
  MDL_CHECK(c, b->map_written != NULL, "test out of memory");
  mdl_check_getters(c, b);
  if (mode != UM_MAP_READ)
    write_mapping(c, b);
  b->map_age = (int)mdl_range(&c->rng, 0, 3);
  if (b->map_age == 0)
    mdl_step_unmap(c, b);
}

/* The model takes the written bytes; after WRITE_DISCARD the unwritten
 * ones are undefined unless the mapping was the buffer's own memory. */
void mdl_step_unmap(mdl_ctx *c, mdl_buf *b) {
  bool discard = b->map_mode == UM_MAP_WRITE_DISCARD;
  size_t off = b->map_off, len = b->map_len;
  if (b->map_mode != UM_MAP_READ && mdl_pct(&c->rng, 50))
    write_mapping(c, b);
  memcpy(c->scratch, b->map_ptr, len); /* the view may be gone after unmap */
  snprintf(c->what, sizeof(c->what), "um_unmap(#%llu, mode %d, %zu, %zu)", (unsigned long long)b->id,
           (int)b->map_mode, off, len);
  MDL_EXPECT_ST(c, um_unmap(b->h, b->map_ptr), UM_OK, "um_unmap");
  for (size_t i = 0; i < len; i++) {
    if (b->map_written[i]) {
      b->data[off + i] = c->scratch[i];
      b->known[off + i] = 1;
    } else if (discard && !b->host_view) {
      b->known[off + i] = 0;
    }
  }
  valid_after_unmap(b);
  free(b->map_written);
  b->map_written = NULL;
  b->mapped = false;
  b->map_ptr = NULL;
  mdl_check_getters(c, b);
  if (!c->no_block && mdl_pct(&c->rng, 40))
    mdl_verify_buf(c, b); /* bytes outside the mapped range must not have moved */
}

/* ------------------------------------------------------------------------ */
/* Shared sources of the threaded program: written once here, then only
 * read, by every thread. */

mdl_buf *mdl_make_shared(mdl_ctx *c, int dev) {
  mdl_buf *b = mdl_buf_slot(c);
  size_t size = mdl_range(&c->rng, 1, 512 * 1024);
  MDL_CHECK(c, b != NULL, "no slot for a shared source");
  if (dev < 0) {
    unsigned char *mem = malloc(size);
    um_buffer *h = NULL;
    MDL_CHECK(c, mem != NULL, "test out of memory");
    mdl_fill_random(&c->rng, mem, size);
    MDL_EXPECT_ST(c, um_wrap_host(c->m, mem, size, UM_WRAP_READONLY, &h), UM_OK, "um_wrap_host (shared)");
    buf_live(c, b, h, 0, UM_HOST, MDL_WRAP_RO, UM_WRAP_READONLY, size);
    b->wrap_mem = b->wrap_base = mem;
    memcpy(b->data, mem, size);
  } else {
    alloc_one(c, b, dev, pick_loc(c, dev, size), size, 0);
    mdl_fill_random(&c->rng, b->data, size);
    MDL_EXPECT_ST(c, um_copy_from_host(b->h, 0, b->data, size, NULL), UM_OK, "um_copy_from_host (shared)");
    if (!b->host_view)
      b->valid = UM_VALID_DEVICE;
  }
  memset(b->known, 1, size);
  b->shared = true;
  return b;
}
