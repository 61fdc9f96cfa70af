/* What the tests that look inside the library see of it: the layers up
 * to core/ (src/README.md: the backend table, blocks, pools and thread
 * caches, the manager and buffer objects, the test points), and the parts
 * of the discrete test backend (inside.c) that are made of internal types.
 * Nothing of ops/, interop/ or net/: operations are tested through the
 * public API. Only these tests include it: they link unimem_internals,
 * which gives them exactly that view (cmake/layers.cmake); the others see
 * the public API and test_util.h alone. */
#ifndef UNIMEM_TESTING_H
#define UNIMEM_TESTING_H

#include <stdatomic.h>

#include "core.h"
#include "testhook.h"

/* The discrete test backend (inside.c), for a test that builds a backend
 * table of its own from its parts. */
extern const um__backend ut_disc_backend;
extern atomic_long ut_disc_live_blocks;
int ut_disc_open(const um_options *opts, void **ctx, int *count);
int ut_disc_describe(void *ctx, int i, um__bdev_desc *out);
void ut_disc_close(void *ctx);
int ut_disc_mem_alloc(void *bdev, um_location loc, size_t bytes, um__mem *out);
void ut_disc_mem_free(void *bdev, um_location loc, size_t bytes, um__mem *mem);
int ut_disc_memory(void *bdev, uint64_t *free_bytes, uint64_t *total_bytes);
int ut_disc_synchronize(void *bdev);
int ut_disc_xfer(void *bdev, const um__xfer *x);

#endif /* UNIMEM_TESTING_H */
