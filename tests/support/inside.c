/* What the tests that use only the public API reach of the library's
 * inside, through functions (test_util.h declares them): size classes, and
 * the "discrete device" test backend: DEVICE memory only, malloc'd blocks
 * with no host view (mem.host == NULL, the handle is the pointer), blocking
 * transfers with memcpy on the handle, no xfer_async and no map, so the
 * core keeps a host shadow and runs transfers on its own threads. It offers
 * two devices with no peer access between them, so copies between them
 * take the staged path. */
/* A file of the support library, not a test program (test_util_tsan.h). */
#define UT_NO_MAIN
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "testing.h"
#define UT_DISC_TOTAL (1ull << 30)

typedef struct ut_disc_dev {
  int index;
  atomic_uint_fast64_t used;
} ut_disc_dev;

/* Blocks allocated and not yet freed, across every manager: 0 after every
 * manager was destroyed. */
atomic_long ut_disc_live_blocks;

int ut_disc_open(const um_options *opts, void **ctx, int *count) {
  ut_disc_dev *d = calloc(UT_DISC_DEVICES, sizeof(*d));
  (void)opts;
  if (d == NULL)
    return um__set_error(UM_ENOMEM, "test-discrete: out of memory");
  for (int i = 0; i < UT_DISC_DEVICES; i++) {
    d[i].index = i;
    atomic_init(&d[i].used, 0);
  }
  *ctx = d;
  *count = UT_DISC_DEVICES;
  return UM_OK;
}

int ut_disc_describe(void *ctx, int i, um__bdev_desc *out) {
  ut_disc_dev *d = ctx;
  memset(out, 0, sizeof(*out));
  snprintf(out->name, sizeof(out->name), "test-discrete %d", i);
  out->caps = 0;
  out->locations = 1u << UM_DEVICE;
  out->total_bytes = UT_DISC_TOTAL;
  out->bdev = &d[i];
  return UM_OK;
}

void ut_disc_close(void *ctx) { free(ctx); }

int ut_disc_mem_alloc(void *bdev, um_location loc, size_t bytes, um__mem *out) {
  ut_disc_dev *d = bdev;
  void *p;
  if (loc != UM_DEVICE)
    return um__set_error(UM_ENOTSUP, "test-discrete: location %d", (int)loc);
  p = malloc(bytes);
  if (p == NULL)
    return um__set_error(UM_ENOMEM, "test-discrete: out of memory for %zu bytes", bytes);
  out->host = NULL;
  out->handle = (uintptr_t)p;
  out->priv = NULL;
  atomic_fetch_add(&d->used, bytes);
  atomic_fetch_add(&ut_disc_live_blocks, 1);
  return UM_OK;
}

void ut_disc_mem_free(void *bdev, um_location loc, size_t bytes, um__mem *mem) {
  ut_disc_dev *d = bdev;
  (void)loc;
  free((void *)mem->handle);
  mem->handle = 0;
  atomic_fetch_sub(&d->used, bytes);
  atomic_fetch_sub(&ut_disc_live_blocks, 1);
}

int ut_disc_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes) {
  ut_disc_dev *d = bdev;
  *total_bytes = UT_DISC_TOTAL;
  *free_bytes = UT_DISC_TOTAL - (uint64_t)atomic_load(&d->used);
  return UM_OK;
}

int ut_disc_synchronize(void *bdev) {
  (void)bdev;
  return UM_OK;
}

int ut_disc_xfer(void *bdev, const um__xfer *x) {
  (void)bdev;
  switch (x->kind) {
  case UM__XFER_H2D:
    if (x->dst->host != NULL) /* a discrete block never has a host view */
      return um__set_error(UM_EBACKEND, "test-discrete: H2D into a block with a host view");
    memcpy((char *)x->dst->handle + x->dst_off, x->host, x->bytes);
    return UM_OK;
  case UM__XFER_D2H:
    if (x->src->host != NULL)
      return um__set_error(UM_EBACKEND, "test-discrete: D2H from a block with a host view");
    memcpy(x->host, (const char *)x->src->handle + x->src_off, x->bytes);
    return UM_OK;
  case UM__XFER_D2D:
    memmove((char *)x->dst->handle + x->dst_off, (const char *)x->src->handle + x->src_off,
            x->bytes);
    return UM_OK;
  case UM__XFER_FILL:
    memset((char *)x->dst->handle + x->dst_off, x->value, x->bytes);
    return UM_OK;
  case UM__XFER_PEER:
  case UM__XFER_MARKER:
  case UM__XFER_QUEUE_MARK:
    break;
  }
  return um__set_error(UM_ENOTSUP, "test-discrete: transfer kind %d", (int)x->kind);
}

const um__backend ut_disc_backend = {
    .name = "test-discrete",
    .open = ut_disc_open,
    .describe = ut_disc_describe,
    .close = ut_disc_close,
    .mem_alloc = ut_disc_mem_alloc,
    .mem_free = ut_disc_mem_free,
    .memory = ut_disc_memory,
    .synchronize = ut_disc_synchronize,
    .xfer = ut_disc_xfer,
};


int ut_disc_manager_create(const um_options *o, um_manager **out) {
  const um__backend *extra[] = {&ut_disc_backend};
  return um__manager_create_ex(o, extra, 1, out);
}

uint64_t ut_class(size_t bytes) { return (uint64_t)um__class_size(um__size_class_of(bytes)); }
