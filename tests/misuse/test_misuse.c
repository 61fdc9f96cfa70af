/* Misuse: the seeds' pitfalls (premature disposal, double release, size
 * mismatch, writing where one may not) answer with a code, never a crash,
 * and leave the manager as it was. Then the debug option: released handles
 * and blocks wait in a quarantine, so a stale handle keeps answering
 * UM_ESTATE even after its size was allocated again, and freed host bytes
 * read as the poison pattern. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_backend.h"
#include "test_util.h" /* Criterion, or its stand-in under TSan */

static um_manager *m;
static um_device *cpu, *fdev, *fmap;

static void quiet_log(void *ctx, um_log_level level, const char *msg) {
  (void)level, (void)msg;
  if (ctx != NULL)
    (*(int *)ctx)++;
}

static int log_count;

static void options(um_options *o, int debug) {
  um_options_init(o);
  snprintf(o->backends, sizeof(o->backends), "cpu");
  o->enable_pooling = 1;
  o->trim_interval_ms = 0;
  o->trim_on_pressure = 1;
  o->scrub = 0;
  o->debug = debug;
  o->segments = 0; /* bytes_pooled counts quarantined blocks' returns exactly */
  o->log = quiet_log;
  o->log_ctx = &log_count;
}

static void start(int debug) {
  um_options o;
  options(&o, debug);
  fault_configure(1, 256u << 20);
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_count(m), 3);
  cpu = um_device_get(m, 0);
  fdev = um_device_get(m, 1);
  fmap = um_device_get(m, 2);
}

static void setup(void) { start(0); }
static void setup_debug(void) { start(1); }

static void teardown(void) {
  FAULT_ASSERT_DESTROYED_CLEAN(m);
}

static void expect_in_use(uint64_t buffers, uint64_t bytes) {
  um_stats s;
  cr_assert_eq(um_stats_get(m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, buffers);
  cr_assert_eq(s.bytes_in_use, bytes);
}

/* Every operation on a released handle answers UM_ESTATE (getters: 0/NULL). */
static void expect_stale(um_buffer *b) {
  char tmp[16] = {0};
  void *p = NULL;
  um_event *e = NULL;
  um_buffer *other = NULL;
  um_copy_op op = {.dst = b, .host_src = tmp, .bytes = 8};
  cr_assert_eq(um_release(b), UM_ESTATE);
  cr_assert_eq(um_copy_from_host(b, 0, tmp, 8, NULL), UM_ESTATE);
  cr_assert_eq(um_copy_from_host(b, 0, tmp, 8, &e), UM_ESTATE);
  cr_assert_null(e);
  cr_assert_eq(um_copy_to_host(b, 0, tmp, 8, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(b, 0, 1, 8, NULL), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 8, &p), UM_ESTATE);
  cr_assert_null(p);
  cr_assert_eq(um_unmap(b, tmp), UM_ESTATE);
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_alloc(m, cpu, 16, UM_HOST, 0, &other), UM_OK);
  cr_assert_eq(um_copy(other, 0, b, 0, 8, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(b, 0, other, 0, 8, NULL), UM_ESTATE);
  cr_assert_eq(um_release(other), UM_OK);
  cr_assert_eq(um_buffer_size(b), 0);
  cr_assert_null(um_buffer_device(b));
  cr_assert_null(um_buffer_host_ptr(b));
  cr_assert_eq(um_buffer_valid(b), 0);
}

TestSuite(misuse, .init = setup, .fini = teardown);

Test(misuse, release_twice) {
  um_location locs[] = {UM_HOST, UM_DEVICE, UM_PINNED, UM_UNIFIED};
  for (int i = 0; i < 4; i++) {
    um_buffer *b;
    cr_assert_eq(um_alloc(m, cpu, 100, locs[i], 0, &b), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    cr_assert_eq(um_release(b), UM_ESTATE);
  }
  for (int d = 1; d <= 2; d++) {
    um_buffer *b;
    cr_assert_eq(um_alloc(m, um_device_get(m, d), 100, UM_DEVICE, 0, &b), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    cr_assert_eq(um_release(b), UM_ESTATE);
  }
  expect_in_use(0, 0);
}

Test(misuse, use_after_release) {
  um_device *devs[] = {cpu, fdev, fmap};
  for (int i = 0; i < 3; i++) {
    um_buffer *b;
    cr_assert_eq(um_alloc(m, devs[i], 64, UM_DEVICE, 0, &b), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    expect_stale(b);
  }
  expect_in_use(0, 0);
}

Test(misuse, release_with_operations_in_flight) {
  static char src[256 << 10], back[256 << 10];
  um_buffer *b, *c;
  um_event *e1, *e2;
  memset(src, 0x3C, sizeof(src));
  cr_assert_eq(um_alloc(m, fdev, sizeof(src), UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_alloc(m, fdev, sizeof(src), UM_DEVICE, 0, &c), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, sizeof(src), &e1), UM_OK);
  cr_assert_eq(um_copy(c, 0, b, 0, sizeof(src), &e2), UM_OK);
  /* Released while both copies may still run: deferred, never a crash. */
  cr_assert_eq(um_release(b), UM_OK);
  expect_stale(b);
  cr_assert_eq(um_event_wait(e1), UM_OK);
  cr_assert_eq(um_event_wait(e2), UM_OK);
  um_event_release(e1);
  um_event_release(e2);
  cr_assert_eq(um_copy_to_host(c, 0, back, sizeof(back), NULL), UM_OK);
  cr_assert_arr_eq(back, src, sizeof(src));
  cr_assert_eq(um_release(c), UM_OK);
  expect_in_use(0, 0);
}

Test(misuse, map_and_unmap_out_of_order) {
  um_device *devs[] = {cpu, fdev, fmap};
  for (int i = 0; i < 3; i++) {
    um_buffer *b;
    void *p = NULL, *q = NULL;
    char x = 0;
    cr_assert_eq(um_alloc(m, devs[i], 64, UM_DEVICE, 0, &b), UM_OK);
    cr_assert_eq(um_unmap(b, &x), UM_ESTATE, "device %d: unmap of an unmapped buffer", i);
    cr_assert_eq(um_unmap(b, NULL), UM_ESTATE);
    cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 0, 64, &p), UM_OK);
    cr_assert_eq(um_map(b, UM_MAP_READ, 0, 8, &q), UM_ESTATE, "mapping a mapped buffer");
    cr_assert_null(q);
    cr_assert_eq(um_unmap(b, &x), UM_EINVAL, "not the pointer um_map returned");
    /* While mapped, operations on the buffer are refused. */
    cr_assert_eq(um_fill(b, 0, 0, 8, NULL), UM_ESTATE);
    cr_assert_eq(um_copy_from_host(b, 0, &x, 1, NULL), UM_ESTATE);
    cr_assert_eq(um_unmap(b, p), UM_OK);
    cr_assert_eq(um_unmap(b, p), UM_ESTATE, "unmapping twice");
    /* Releasing a mapped buffer ends the mapping; the handle is stale. */
    cr_assert_eq(um_map(b, UM_MAP_WRITE, 0, 64, &p), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    cr_assert_eq(um_unmap(b, p), UM_ESTATE);
  }
  expect_in_use(0, 0);
}

Test(misuse, write_through_read_only_wrap) {
  char mem[128], src[128];
  um_buffer *w, *h;
  void *p = NULL;
  um_copy_op op = {.host_src = src, .bytes = 16};
  memset(mem, 0x11, sizeof(mem));
  memset(src, 0x77, sizeof(src));
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), UM_WRAP_READONLY, &w), UM_OK);
  cr_assert_eq(um_alloc(m, fdev, sizeof(mem), UM_DEVICE, 0, &h), UM_OK);
  cr_assert_eq(um_copy_from_host(h, 0, src, sizeof(src), NULL), UM_OK);
  cr_assert_eq(um_copy_from_host(w, 0, src, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(w, 0, h, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(w, 0, 0, 16, NULL), UM_ESTATE);
  op.dst = w;
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_map(w, UM_MAP_WRITE, 0, 16, &p), UM_ESTATE);
  cr_assert_eq(um_map(w, UM_MAP_READ_WRITE, 0, 16, &p), UM_ESTATE);
  cr_assert_eq(um_map(w, UM_MAP_WRITE_DISCARD, 0, 16, &p), UM_ESTATE);
  cr_assert_null(p);
  for (size_t i = 0; i < sizeof(mem); i++)
    cr_assert_eq(mem[i], 0x11, "byte %zu of the read-only range changed", i);
  /* Reading from it works. */
  cr_assert_eq(um_map(w, UM_MAP_READ, 0, 16, &p), UM_OK);
  cr_assert_eq(p, mem);
  cr_assert_eq(um_unmap(w, p), UM_OK);
  cr_assert_eq(um_copy(h, 0, w, 0, sizeof(mem), NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(h, 0, src, sizeof(src), NULL), UM_OK);
  cr_assert_arr_eq(src, mem, sizeof(mem));
  cr_assert_eq(um_release(w), UM_OK);
  cr_assert_eq(um_release(h), UM_OK);
  expect_in_use(0, 0);
}

Test(misuse, buffers_of_two_managers) {
  um_manager *m2;
  um_options o;
  um_buffer *a, *b;
  um_stats s;
  char tmp[32] = {0};
  um_copy_op op = {0};
  options(&o, 0);
  cr_assert_eq(fault_manager_create(&o, &m2), UM_OK);
  cr_assert_eq(um_alloc(m, fdev, 32, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), 32, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy(a, 0, b, 0, 32, NULL), UM_EINVAL);
  cr_assert_eq(um_copy(b, 0, a, 0, 32, NULL), UM_EINVAL);
  op.dst = a, op.src = b, op.bytes = 32;
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_EINVAL);
  op.dst = b, op.src = NULL, op.host_src = tmp;
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_EINVAL, "batch of m with a buffer of m2");
  cr_assert_eq(um_alloc(m, um_device_get(m2, 0), 32, UM_HOST, 0, &a), UM_EINVAL);
  cr_assert_eq(um_stats_get(m, um_device_get(m2, 0), &s), UM_EINVAL);
  cr_assert_eq(um_peer_enable(fdev, um_device_get(m2, 1)), UM_EINVAL);
  cr_assert_eq(um_peer_enabled(fdev, um_device_get(m2, 1)), UM_EINVAL);
  /* Each manager still counts only its own. */
  cr_assert_eq(um_stats_get(m2, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 1);
  cr_assert_eq(s.bytes_in_use, 32);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
  expect_in_use(1, 32);
  cr_assert_eq(um_release(a), UM_OK);
}

Test(misuse, bad_arguments_change_nothing) {
  um_buffer *b = NULL, *h;
  um_event *e = NULL;
  char tmp[64] = {0};
  uint64_t not_a_buffer[64] = {0};
  void *p = NULL;
  um_stats before, after;
  cr_assert_eq(um_alloc(m, fdev, 64, UM_DEVICE, 0, &h), UM_OK);
  cr_assert_eq(um_stats_get(m, NULL, &before), UM_OK);
  cr_assert_eq(um_alloc(NULL, cpu, 8, UM_HOST, 0, &b), UM_EINVAL);
  cr_assert_eq(um_alloc(m, NULL, 8, UM_HOST, 0, &b), UM_EINVAL);
  cr_assert_eq(um_alloc(m, cpu, 8, UM_HOST, 0, NULL), UM_EINVAL);
  cr_assert_eq(um_alloc(m, cpu, 0, UM_HOST, 0, &b), UM_EINVAL);
  cr_assert_eq(um_alloc(m, cpu, 8, (um_location)7, 0, &b), UM_EINVAL);
  cr_assert_eq(um_alloc(m, cpu, 8, UM_HOST, 0x80, &b), UM_EINVAL);
  cr_assert_eq(um_alloc(m, fdev, 8, UM_PINNED + 99, 0, &b), UM_EINVAL);
  cr_assert_eq(um_alloc(m, fdev, 8, UM_UNIFIED, 0, &b), UM_ENOTSUP);
  cr_assert_eq(um_alloc(m, fdev, (size_t)1 << 40, UM_DEVICE, 0, &b), UM_ENOMEM);
  cr_assert_eq(um_alloc_array(m, cpu, SIZE_MAX / 2, 3, UM_HOST, 0, &b), UM_EOVERFLOW);
  cr_assert_null(b);
  cr_assert_eq(um_copy_from_host(h, 60, tmp, 8, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_from_host(h, SIZE_MAX, tmp, 1, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_to_host(h, 0, tmp, 65, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_to_host(h, 0, tmp, 0, NULL), UM_EINVAL);
  cr_assert_eq(um_copy_to_host(h, 0, NULL, 8, NULL), UM_EINVAL);
  cr_assert_eq(um_copy(h, 1, h, 0, 64, &e), UM_ERANGE);
  cr_assert_null(e);
  cr_assert_eq(um_fill(h, 64, 0, 1, NULL), UM_ERANGE);
  cr_assert_eq(um_map(h, (um_map_mode)9, 0, 8, &p), UM_EINVAL);
  cr_assert_eq(um_map(h, UM_MAP_READ, 0, 0, &p), UM_EINVAL);
  cr_assert_eq(um_map(h, UM_MAP_READ, 8, 57, &p), UM_ERANGE);
  cr_assert_eq(um_map(h, UM_MAP_READ, 0, 8, NULL), UM_EINVAL);
  cr_assert_eq(um_copy_batch(m, NULL, 1, NULL), UM_EINVAL);
  cr_assert_eq(um_event_wait(NULL), UM_EINVAL);
  cr_assert_eq(um_event_query(NULL), UM_EINVAL);
  cr_assert_eq(um_event_cancel(NULL), UM_EINVAL);
  um_event_release(NULL);
  cr_assert_eq(um_release(NULL), UM_EINVAL);
  /* Not a buffer at all: the magic number says so. */
  cr_assert_eq(um_release((um_buffer *)(void *)not_a_buffer), UM_EINVAL);
  cr_assert_eq(um_stats_get(m, NULL, &after), UM_OK);
  cr_assert_eq(after.active_buffers, before.active_buffers);
  cr_assert_eq(after.bytes_in_use, before.bytes_in_use);
  cr_assert_eq(after.allocations, before.allocations);
  cr_assert_eq(after.bytes_reserved, before.bytes_reserved);
  cr_assert_eq(after.bytes_h2d + after.bytes_d2h + after.bytes_d2d,
               before.bytes_h2d + before.bytes_d2h + before.bytes_d2d);
  cr_assert_eq(um_release(h), UM_OK);
}

Test(misuse, leak_is_reported_and_freed) {
  um_manager *m2;
  um_options o;
  um_buffer *a, *b;
  fault_counts c;
  options(&o, 0);
  log_count = 0;
  cr_assert_eq(fault_manager_create(&o, &m2), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), 1000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), 1000, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_ELEAK);
  cr_assert_eq(log_count, 3, "one line per leaked buffer and a summary");
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0, "the leaked blocks were freed all the same");
}

/* Without the debug option the pool gives a released handle back at once:
 * this is the hole that the quarantine closes. */
Test(misuse, without_debug_a_stale_handle_is_reused) {
  um_buffer *a, *b;
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(b, a);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Debug mode */

TestSuite(debug, .init = setup_debug, .fini = teardown);

Test(debug, environment_turns_it_on) {
  um_options o;
  setenv("UNIMEM_DEBUG", "1", 1);
  um_options_init(&o);
  cr_assert_eq(o.debug, 1);
  setenv("UNIMEM_DEBUG", "0", 1);
  um_options_init(&o);
  cr_assert_eq(o.debug, 0);
  unsetenv("UNIMEM_DEBUG");
}

Test(debug, stale_handle_answers_estate_after_reallocation) {
  um_device *devs[] = {cpu, fdev, fmap};
  um_location locs[] = {UM_HOST, UM_DEVICE, UM_DEVICE};
  for (int i = 0; i < 3; i++) {
    um_buffer *a, *b;
    void *pa;
    cr_assert_eq(um_alloc(m, devs[i], 4096, locs[i], 0, &a), UM_OK);
    pa = a->mem.host ? a->mem.host : a->mem.priv;
    cr_assert_eq(um_release(a), UM_OK);
    cr_assert_eq(um_alloc(m, devs[i], 4096, locs[i], 0, &b), UM_OK);
    cr_assert_neq(b, a, "device %d: the quarantined handle was handed out again", i);
    cr_assert_neq(b->mem.host ? b->mem.host : b->mem.priv, pa, "the quarantined block was reused");
    expect_stale(a);
    cr_assert_eq(um_buffer_size(b), 4096);
    cr_assert_eq(um_release(b), UM_OK);
    expect_stale(b);
  }
  expect_in_use(0, 0);
}

Test(debug, wrapped_handle_stays_stale) {
  char mem[256];
  um_buffer *a, *b;
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), 0, &b), UM_OK);
  cr_assert_neq(b, a);
  expect_stale(a);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(debug, released_host_bytes_are_poisoned) {
  um_buffer *a;
  unsigned char *p;
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &a), UM_OK);
  p = um_buffer_host_ptr(a);
  memset(p, 0x11, 4096);
  cr_assert_eq(um_release(a), UM_OK);
  /* The block is still held (quarantined), so reading it is defined. */
  for (int i = 0; i < 4096; i++)
    cr_assert_eq(p[i], UM__POISON_BYTE, "byte %d", i);
}

/* FIFO: a released buffer leaves after UM__QUARANTINE_MAX_BUFFERS later
 * releases; its block then reaches the pool with the poison in it. */
Test(debug, fifo_bound_then_block_returns_poisoned) {
  um_buffer *a, *b, *c;
  um_stats s;
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &a), UM_OK);
  memset(um_buffer_host_ptr(a), 0x11, 4096);
  cr_assert_eq(um_release(a), UM_OK);
  /* Each of these gets a new block: the previous one is quarantined. */
  for (unsigned i = 0; i < UM__QUARANTINE_MAX_BUFFERS - 1; i++) {
    cr_assert_eq(um_alloc(m, cpu, 64, UM_HOST, 0, &b), UM_OK);
    cr_assert_neq(b, a);
    cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(um_stats_get(m, cpu, &s), UM_OK);
  cr_assert_eq(s.bytes_pooled, 0, "everything released is still quarantined");
  cr_assert_eq(s.pool_hits, 0);
  cr_assert_eq(um_alloc(m, cpu, 64, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK); /* one release more pushes a out */
  cr_assert_eq(um_stats_get(m, cpu, &s), UM_OK);
  cr_assert_eq(s.bytes_pooled, 4096);
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &c), UM_OK);
  cr_assert_eq(c, a, "out of quarantine, the pool gives the block back");
  for (int i = 0; i < 4096; i++)
    cr_assert_eq(((unsigned char *)um_buffer_host_ptr(c))[i], UM__POISON_BYTE, "byte %d", i);
  cr_assert_eq(um_release(c), UM_OK);
}

Test(debug, byte_bound_pushes_out_the_oldest) {
  const size_t big_size = UM__QUARANTINE_MAX_BYTES + 1;
  um_buffer *a, *big, *c, *d;
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, big_size, UM_HOST, 0, &big), UM_OK);
  cr_assert_eq(um_release(big), UM_OK);
  /* big alone passes the byte bound: a, the oldest, went to the pool. */
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &c), UM_OK);
  cr_assert_eq(c, a);
  /* big, the newest, stays quarantined. */
  cr_assert_eq(um_alloc(m, cpu, big_size, UM_HOST, 0, &d), UM_OK);
  cr_assert_neq(d, big);
  expect_stale(big);
  cr_assert_eq(um_release(d), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
}

Test(debug, stats_count_quarantined_blocks_as_reserved_only) {
  um_buffer *a;
  um_stats s;
  cr_assert_eq(um_alloc(m, fdev, 5000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_stats_get(m, fdev, &s), UM_OK);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(s.bytes_pooled, 0);
  cr_assert_eq(s.bytes_reserved, um__class_size(um__size_class_of(5000)));
  cr_assert_eq(s.bytes_reserved, fault_device_live_bytes(fdev));
  um__quarantine_flush(m);
  cr_assert_eq(um_stats_get(m, fdev, &s), UM_OK);
  cr_assert_eq(s.bytes_pooled, s.bytes_reserved);
}

/* Under pressure the quarantine gives way before the allocation fails. */
Test(debug, pressure_empties_the_quarantine) {
  um_manager *m2;
  um_options o;
  um_buffer *a, *b;
  um_stats s;
  options(&o, 1);
  fault_configure(1, 1u << 20);
  cr_assert_eq(fault_manager_create(&o, &m2), UM_OK);
  fault_configure(1, 256u << 20);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), 768u << 10, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), 700u << 10, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_neq(b, a, "the block went back to the device, the handle stays quarantined");
  cr_assert_eq(um_stats_get(m2, NULL, &s), UM_OK);
  cr_assert_eq(s.oom_retries, 1);
  cr_assert_eq(s.device_frees, 1);
  cr_assert_eq(s.bytes_reserved, 768u << 10);
  expect_stale(a);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
}

Test(debug, destroy_frees_the_quarantine_and_reports_leaks) {
  um_manager *m2;
  um_options o;
  um_buffer *a, *b;
  fault_counts c;
  options(&o, 1);
  cr_assert_eq(fault_manager_create(&o, &m2), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 1), 1000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 2), 1000, UM_PINNED, 0, &b), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_ELEAK);
  fault_counts_get(&c);
  cr_assert_eq(c.live_blocks, 0);
}
