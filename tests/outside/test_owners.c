/* Handles of another manager: every public function that takes a manager
 * and a buffer, a device or an event given one that belongs to a second
 * live manager. The header promises UM_EINVAL for "device of another
 * manager" (um_alloc, um_stream) and "buffer of another manager"
 * (um_net_put); for the rest SPEC §5 asks that every function check its
 * arguments and leave the managers as they were. */
#include "outside.h"

#include <unimem_dlpack.h>

#define OW_N 4096u

typedef struct ow_pair {
  um_manager *a, *b;
  um_device *da, *db;
} ow_pair;

static ow_pair ow_two(void) {
  ow_pair p;
  p.a = os_manager();
  p.b = os_manager();
  p.da = os_device(p.a);
  p.db = os_device(p.b);
  return p;
}

static void ow_end(ow_pair *p) {
  cr_assert_eq(um_manager_destroy(p->a), UM_OK, "manager a: %s", um_last_error());
  cr_assert_eq(um_manager_destroy(p->b), UM_OK, "manager b: %s", um_last_error());
}

static um_buffer *ow_buffer(um_manager *m, um_device *d, uint32_t seed) {
  um_buffer *b = NULL;
  uint8_t h[OW_N];
  cr_assert_eq(um_alloc(m, d, OW_N, os_location(), 0, &b), UM_OK, "%s", um_last_error());
  os_pattern(h, OW_N, seed);
  cr_assert_eq(um_copy_from_host(b, 0, h, OW_N, NULL), UM_OK);
  return b;
}

static void ow_expect(um_buffer *b, uint32_t seed, const char *what) {
  uint8_t h[OW_N];
  cr_assert_eq(um_copy_to_host(b, 0, h, OW_N, NULL), UM_OK);
  cr_assert_eq(os_pattern_diff(h, OW_N, seed), SIZE_MAX, "%s: the buffer changed", what);
}

/* um_alloc / um_alloc_array / um_alloc_at with a device of the other
 * manager: UM_EINVAL, nothing allocated in either. */
Test(owners, alloc_on_a_device_of_another_manager, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *x = (um_buffer *)1;
  um_stats s;
  for (int i = 0; i < um_device_count(p.b); i++) {
    um_device *d = um_device_get(p.b, i);
    cr_assert_eq(um_alloc(p.a, d, OW_N, UM_HOST, 0, &x), UM_EINVAL, "um_alloc, device %d of b", i);
    cr_assert_eq(um_alloc(p.a, d, OW_N, UM_DEVICE, 0, &x), UM_EINVAL);
    cr_assert_eq(um_alloc_array(p.a, d, 4, OW_N / 4, UM_HOST, 0, &x), UM_EINVAL);
    cr_assert_eq(um_alloc_at(p.a, d, OW_N, UM_HOST, 0, &x, __FILE__, __LINE__), UM_EINVAL);
    cr_assert_eq(um_alloc_array_at(p.a, d, 4, OW_N / 4, UM_HOST, 0, &x, __FILE__, __LINE__), UM_EINVAL);
  }
  cr_assert_eq(x, (um_buffer *)1, "out written on failure");
  cr_assert_eq(um_stats_get(p.a, NULL, &s), UM_OK);
  cr_assert_eq(s.allocations, 0u);
  cr_assert_eq(um_stats_get(p.b, NULL, &s), UM_OK);
  cr_assert_eq(s.allocations, 0u);
  ow_end(&p);
}

/* um_stats_get(a, device of b): not a's device. */
Test(owners, stats_of_a_device_of_another_manager, .timeout = 60) {
  ow_pair p = ow_two();
  um_stats s;
  memset(&s, 0x5A, sizeof(s));
  cr_assert_eq(um_stats_get(p.a, p.db, &s), UM_EINVAL, "stats of b's device through a");
  cr_assert_eq(um_stats_get(p.a, um_device_get(p.b, 0), &s), UM_EINVAL, "stats of b's host device through a");
  ow_end(&p);
}

/* um_stream of a buffer of a onto a device of b: UM_EINVAL, fn never
 * called. */
static int ow_chunk(void *user, um_buffer *chunk, size_t off, size_t bytes) {
  (void)chunk;
  (void)off;
  (void)bytes;
  atomic_fetch_add((atomic_int *)user, 1);
  return 0;
}

Test(owners, stream_onto_a_device_of_another_manager, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *x = ow_buffer(p.a, p.da, 1);
  atomic_int calls = 0;
  cr_assert_eq(um_stream(x, 0, OW_N, p.db, 1024, ow_chunk, NULL, &calls), UM_EINVAL);
  cr_assert_eq(um_stream(x, 0, OW_N, um_device_get(p.b, 0), 1024, ow_chunk, NULL, &calls), UM_EINVAL);
  cr_assert_eq(atomic_load(&calls), 0, "fn called for a refused stream");
  cr_assert_eq(um_stream(x, 0, OW_N, p.da, 1024, ow_chunk, NULL, &calls), UM_OK, "%s", um_last_error());
  cr_assert_eq(atomic_load(&calls), 4);
  cr_assert_eq(um_release(x), UM_OK);
  ow_end(&p);
}

/* um_copy_batch(a, ops over buffers of b): the batch names a manager, and
 * its ops buffers of another one. Refused (UM_EINVAL), or done right;
 * nothing in between. */
Test(owners, batch_of_buffers_of_another_manager, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *y = ow_buffer(p.b, p.db, 2);
  uint8_t h[OW_N];
  um_copy_op op;
  int st;
  os_pattern(h, OW_N, 3);
  memset(&op, 0, sizeof(op));
  op.dst = y;
  op.host_src = h;
  op.bytes = OW_N;
  st = um_copy_batch(p.a, &op, 1, NULL);
  cr_assert_eq(st, UM_EINVAL, "um_copy_batch(a, [b's buffer]): %s", um_err_name(st));
  ow_expect(y, 2, "a refused batch");
  cr_assert_eq(um_release(y), UM_OK);
  ow_end(&p);
}

/* A batch whose ops mix the two managers' buffers. */
Test(owners, batch_mixing_two_managers, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *x = ow_buffer(p.a, p.da, 4), *y = ow_buffer(p.b, p.db, 5);
  uint8_t h[OW_N];
  um_copy_op ops[2];
  int st;
  os_pattern(h, OW_N, 6);
  memset(ops, 0, sizeof(ops));
  ops[0].dst = x;
  ops[0].host_src = h;
  ops[0].bytes = OW_N;
  ops[1].dst = y;
  ops[1].src = x;
  ops[1].bytes = OW_N;
  st = um_copy_batch(p.a, ops, 2, NULL);
  cr_assert_eq(st, UM_EINVAL, "a batch of a whose second op writes a buffer of b: %s", um_err_name(st));
  ow_expect(x, 4, "a refused batch's first op");
  ow_expect(y, 5, "a refused batch's second op");
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  ow_end(&p);
}

/* um_copy between buffers of two managers. The header names no refusal,
 * so either the copy is made (the bytes arrive) or it is refused with
 * UM_EINVAL; it never crashes, and each manager's destroy stays clean. */
static void ow_cross_copy(um_location la, um_location lb) {
  ow_pair p = ow_two();
  um_buffer *x = NULL, *y = NULL;
  uint8_t h[OW_N];
  int st;
  cr_assert_eq(um_alloc(p.a, p.da, OW_N, la, 0, &x), UM_OK);
  cr_assert_eq(um_alloc(p.b, p.db, OW_N, lb, 0, &y), UM_OK);
  os_pattern(h, OW_N, 7);
  cr_assert_eq(um_copy_from_host(x, 0, h, OW_N, NULL), UM_OK);
  os_pattern(h, OW_N, 8);
  cr_assert_eq(um_copy_from_host(y, 0, h, OW_N, NULL), UM_OK);
  st = um_copy(y, 0, x, 0, OW_N, NULL);
  if (st == UM_OK)
    ow_expect(y, 7, "a cross-manager copy that answered UM_OK did not move the bytes");
  else {
    cr_assert_eq(st, UM_EINVAL, "um_copy across managers: %s (%s)", um_err_name(st), um_last_error());
    ow_expect(y, 8, "a refused cross-manager copy");
  }
  {
    um_event *e = NULL;
    st = um_copy(x, 0, y, 0, OW_N, &e);
    if (st == UM_OK) {
      cr_assert_eq(um_event_wait(e), UM_OK, "%s", um_last_error());
      cr_assert_eq(um_event_release(e), UM_OK);
    } else {
      cr_assert_eq(st, UM_EINVAL, "async um_copy across managers: %s", um_err_name(st));
      cr_assert_null(e);
    }
  }
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  ow_end(&p);
}

Test(owners, copy_across_managers_device, .timeout = 60) { ow_cross_copy(os_location(), os_location()); }
Test(owners, copy_across_managers_host, .timeout = 60) { ow_cross_copy(UM_HOST, UM_HOST); }

/* A copy across managers that stays pending (behind a bracket in b) while
 * a is destroyed: a must not free what the copy still reads, and b's
 * operation must finish or fail, not touch freed memory. */
Test(owners, cross_copy_pending_when_source_manager_destroyed, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *x = ow_buffer(p.a, p.da, 9), *y = ow_buffer(p.b, p.db, 10);
  um_event *e = NULL;
  void *w = NULL;
  int st;
  cr_assert_eq(um_access_begin(y, UM_MAP_READ_WRITE, &w), UM_OK);
  st = um_copy(y, 0, x, 0, OW_N, &e);
  if (st != UM_OK) {
    cr_assert_eq(st, UM_EINVAL, "%s", um_err_name(st));
    cr_assert_eq(um_access_end(y, NULL), UM_OK);
    cr_assert_eq(um_release(x), UM_OK);
    cr_assert_eq(um_release(y), UM_OK);
    ow_end(&p);
    return;
  }
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_manager_destroy(p.a), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_access_end(y, NULL), UM_OK);
  st = um_event_wait(e);
  fprintf(stderr, "[info] " "the copy from a destroyed manager's buffer: %s\n", um_err_name(st));
  if (st == UM_OK)
    ow_expect(y, 9, "a copy that answered UM_OK");
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_manager_destroy(p.b), UM_OK);
}

/* Peers across managers: two devices of different managers. */
Test(owners, peer_across_managers, .timeout = 60) {
  ow_pair p = ow_two();
  int st = um_peer_enable(p.da, p.db);
  cr_assert(st == UM_EINVAL || st == UM_ENOTSUP, "um_peer_enable across managers: %s", um_err_name(st));
  st = um_peer_enabled(p.da, p.db);
  cr_assert(st == 0 || st == UM_EINVAL, "um_peer_enabled across managers: %d", st);
  st = um_peer_possible(p.da, p.db);
  cr_assert(st == 0 || st == UM_EINVAL, "um_peer_possible across managers: %d", st);
  ow_end(&p);
}

/* um_access_end(b's buffer, the wait event of a bracket in a). On OpenCL
 * that is a cl_event of another context (UM_EINVAL, the bracket stays
 * open); on the cpu device done must be NULL. */
Test(owners, access_end_with_the_event_of_another_manager, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *x = ow_buffer(p.a, p.da, 11), *y = ow_buffer(p.b, p.db, 12);
  um_event *fill = NULL;
  void *wx = NULL, *wy = NULL, *wz = NULL;
  um_buffer *z = ow_buffer(p.a, p.da, 13);
  um_device_native dn;
  int st;
  cr_assert_eq(um_device_native_get(p.da, &dn), UM_OK);
  /* x's bracket must have something to wait for: a copy z -> x held
   * behind a bracket on z */
  cr_assert_eq(um_access_begin(z, UM_MAP_READ_WRITE, &wz), UM_OK);
  cr_assert_eq(um_copy(x, 0, z, 0, OW_N, &fill), UM_OK);
  cr_assert_eq(um_access_begin(x, UM_MAP_READ_WRITE, &wx), UM_OK);
  cr_assert_not_null(wx, "a bracket behind a pending copy has something to wait for");
  cr_assert_eq(um_access_begin(y, UM_MAP_READ_WRITE, &wy), UM_OK);
  st = um_access_end(y, wx);
  cr_assert_eq(st, UM_EINVAL, "um_access_end(b's buffer, a's %s event): %s", dn.backend, um_err_name(st));
  cr_assert_eq(um_access_end(y, NULL), UM_OK, "the refused end left the bracket open");
  cr_assert_eq(um_access_end(z, NULL), UM_OK);
  cr_assert_eq(um_event_wait(fill), UM_OK);
  cr_assert_eq(um_event_release(fill), UM_OK);
  cr_assert_eq(um_access_end(x, NULL), UM_OK);
  ow_expect(x, 13, "x after the copy from z");
  ow_expect(y, 12, "y");
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_release(z), UM_OK);
  ow_end(&p);
}

/* um_dlpack_import into b of a tensor exported from a: host memory is a
 * wrap like any other; an OpenCL tensor's cl_mem belongs to a's context
 * ("a cl_mem of another context": UM_EINVAL, the tensor untouched). */
Test(owners, dlpack_import_of_another_managers_tensor, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *x = ow_buffer(p.a, p.da, 14), *y = NULL;
  int64_t shape = OW_N;
  void *t = NULL;
  um_device_native dn;
  int st = um_dlpack_export(x, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, &t);
  if (st == UM_ENOTSUP)
    cr_skip_test("no DLPack export here");
  cr_assert_eq(st, UM_OK, "%s", um_last_error());
  cr_assert_eq(um_device_native_get(p.da, &dn), UM_OK);
  st = um_dlpack_import(p.b, t, UM_DLPACK_VERSIONED, &y);
  if (strcmp(dn.backend, "opencl") == 0) {
    cr_assert_eq(st, UM_EINVAL, "import of a's cl_mem into b: %s", um_err_name(st));
    cr_assert_null(y);
    ((um_dl_managed_tensor_versioned *)t)->deleter(t);
  } else {
    cr_assert_eq(st, UM_OK, "%s", um_last_error());
    ow_expect(y, 14, "the import");
    cr_assert_eq(um_release(y), UM_OK, "the deleter releases a's reference");
  }
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(x), UM_ESTATE, "the tensor's reference is gone: x is released");
  ow_end(&p);
}

/* um_device_adopt_opencl(b, a's context, device, queue): allowed (b then
 * allocates in a's context); copies between the adopted device and a's own
 * device in the same context. */
Test(owners, adopt_the_context_of_another_manager, .timeout = 60) {
  ow_pair p = ow_two();
  um_device_native dn;
  um_device *ad = NULL;
  um_buffer *x, *y = NULL;
  cr_assert_eq(um_device_native_get(p.da, &dn), UM_OK);
  if (strcmp(dn.backend, "opencl") != 0) {
    ow_end(&p);
    cr_skip_test("no OpenCL device");
  }
  cr_assert_eq(um_device_adopt_opencl(p.b, dn.cl_context, dn.cl_device, dn.cl_queue, &ad), UM_OK, "%s",
               um_last_error());
  x = ow_buffer(p.a, p.da, 15);
  cr_assert_eq(um_alloc(p.b, ad, OW_N, UM_DEVICE, 0, &y), UM_OK);
  {
    int st = um_copy(y, 0, x, 0, OW_N, NULL);
    cr_assert(st == UM_OK || st == UM_EINVAL, "%s", um_err_name(st));
    if (st == UM_OK)
      ow_expect(y, 15, "a copy into the adopted device");
  }
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  /* b retained a's context: destroying a first leaves b's device working */
  cr_assert_eq(um_manager_destroy(p.a), UM_OK);
  y = ow_buffer(p.b, ad, 16);
  ow_expect(y, 16, "the adopted device after its context's first owner went");
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_manager_destroy(p.b), UM_OK);
}

/* Events do not name a manager in their calls: an event of a is waited,
 * queried, canceled and released from a thread that works with b, and
 * while b is created and destroyed. */
Test(owners, events_of_a_while_b_comes_and_goes, .timeout = 60) {
  um_manager *a = os_manager();
  um_buffer *x = ow_buffer(a, os_device(a), 17);
  um_event *e = NULL, *f = NULL;
  void *w = NULL;
  cr_assert_eq(um_access_begin(x, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(x, 0, 1, OW_N, &e), UM_OK);
  cr_assert_eq(um_fill(x, 0, 2, OW_N, &f), UM_OK);
  {
    um_manager *b = os_manager();
    um_buffer *y = ow_buffer(b, os_device(b), 18);
    cr_assert_eq(um_event_query(e), UM_EAGAIN);
    cr_assert_eq(um_event_cancel(f), UM_OK);
    cr_assert_eq(um_release(y), UM_OK);
    cr_assert_eq(um_manager_destroy(b), UM_OK);
  }
  cr_assert_eq(um_event_query(e), UM_EAGAIN);
  /* f's wait comes after the bracket's end: a canceled operation behind a
   * bracket is timeouts::cancel_behind_a_bracket_then_wait's case */
  cr_assert_eq(um_access_end(x, NULL), UM_OK);
  cr_assert_eq(um_event_wait(f), UM_ECANCELED);
  cr_assert_eq(um_event_wait(e), UM_OK);
  {
    uint8_t h[OW_N];
    cr_assert_eq(um_copy_to_host(x, 0, h, OW_N, NULL), UM_OK);
    for (size_t i = 0; i < OW_N; i++)
      cr_assert_eq(h[i], 1, "byte %zu: the canceled fill ran", i);
  }
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_event_release(f), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_manager_destroy(a), UM_OK);
}

/* A buffer of a released while b lives, then b's allocations: b never
 * hands out a's block, and a's released handle keeps answering UM_ESTATE. */
Test(owners, released_buffer_of_a_used_while_b_allocates, .timeout = 60) {
  ow_pair p = ow_two();
  um_buffer *x = ow_buffer(p.a, p.da, 19), *y = NULL;
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_alloc(p.b, p.db, OW_N, os_location(), 0, &y), UM_OK);
  cr_assert_neq(x, y, "b handed out a's handle");
  cr_assert_eq(um_release(x), UM_ESTATE);
  cr_assert_eq(um_fill(x, 0, 0, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(y, 0, x, 0, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_release(y), UM_OK);
  ow_end(&p);
}

/* Wrong-type handles the header names: "not a buffer" (um_release),
 * "not an event" (the event calls), "not a device" (um_device_native_get):
 * UM_EINVAL, and the object passed is unharmed. */
Test(owners, handles_of_the_wrong_kind_promised, .timeout = 60) {
  um_manager *m = os_manager();
  um_device *d = os_device(m);
  um_buffer *x = ow_buffer(m, d, 20);
  um_event *e = NULL;
  uint8_t h[OW_N];
  cr_assert_eq(um_fill(x, 0, 3, 16, &e), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  os_pattern(h, OW_N, 20);
  cr_assert_eq(um_copy_from_host(x, 0, h, OW_N, NULL), UM_OK);
  cr_assert_eq(um_release((um_buffer *)e), UM_EINVAL, "an event released as a buffer");
  cr_assert_eq(um_release((um_buffer *)d), UM_EINVAL, "a device released as a buffer");
  cr_assert_eq(um_release((um_buffer *)m), UM_EINVAL, "a manager released as a buffer");
  cr_assert_eq(um_event_wait((um_event *)x), UM_EINVAL, "a buffer waited as an event");
  cr_assert_eq(um_event_query((um_event *)x), UM_EINVAL);
  cr_assert_eq(um_event_cancel((um_event *)x), UM_EINVAL);
  cr_assert_eq(um_event_release((um_event *)x), UM_EINVAL);
  cr_assert_eq(um_event_release((um_event *)d), UM_EINVAL);
  cr_assert_eq(um_event_release((um_event *)m), UM_EINVAL);
  {
    um_device_native dn;
    cr_assert_eq(um_device_native_get((um_device *)x, &dn), UM_EINVAL, "a buffer as a device");
    cr_assert_eq(um_device_native_get((um_device *)e, &dn), UM_EINVAL, "an event as a device");
  }
  cr_assert_eq(um_event_query(e), UM_OK, "the event survived");
  cr_assert_eq(um_event_release(e), UM_OK);
  ow_expect(x, 20, "x after wrong-kind calls");
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Wrong-type handles where the header only says "UM_EINVAL for NULL"
 * (SPEC 5: every function checks its arguments): UM_EINVAL, no crash. */
Test(owners, handles_of_the_wrong_kind_spec, .timeout = 60) {
  um_manager *m = os_manager();
  um_device *d = os_device(m);
  um_buffer *x = ow_buffer(m, d, 21);
  um_device_info di;
  cr_assert_eq(um_buffer_retain((um_buffer *)d), UM_EINVAL, "a device retained as a buffer");
  cr_assert_eq(um_buffer_size((um_buffer *)d), 0u, "the size of a device");
  cr_assert_eq(um_device_synchronize((um_device *)x), UM_EINVAL, "a buffer synchronized as a device");
  cr_assert_eq(um_device_info_get((um_device *)x, &di), UM_EINVAL, "a buffer described as a device");
  {
    int n = um_device_count((um_manager *)x);
    cr_expect_eq(n, UM_EINVAL, "a buffer counted as a manager: %d devices", n);
    n = um_device_count((um_manager *)d);
    cr_expect_eq(n, UM_EINVAL, "a device counted as a manager: %d devices", n);
    cr_expect(um_device_get((um_manager *)x, 0) == NULL, "device 0 of a buffer");
  }
  ow_expect(x, 21, "x after wrong-kind calls");
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Functions taking a manager, given a buffer or a device instead. Buffers,
 * devices and events are checked for their kind (the tests above pass);
 * the manager's functions are given the same checks here, one test per
 * function so that a crash in one hides no other. Expected: UM_EINVAL (or
 * NULL for um_device_get), nothing read outside the object passed (ASan),
 * and the real manager unharmed. */
typedef struct ow_kind {
  um_manager *m;
  um_buffer *x;
  um_manager *fake;
} ow_kind;

static ow_kind ow_kind_start(int use_device) {
  ow_kind k;
  k.m = os_manager();
  k.x = ow_buffer(k.m, os_device(k.m), 30);
  k.fake = use_device ? (um_manager *)os_device(k.m) : (um_manager *)k.x;
  return k;
}

static void ow_kind_end(ow_kind *k) {
  ow_expect(k->x, 30, "the buffer passed as a manager");
  cr_assert_eq(um_release(k->x), UM_OK);
  cr_assert_eq(um_manager_destroy(k->m), UM_OK);
}

#define OW_KIND_TEST(name, expr)                                               \
  Test(owners_kind, name##_buffer, .timeout = 30) {                            \
    ow_kind k = ow_kind_start(0);                                              \
    um_manager *fm = k.fake;                                                   \
    (void)fm;                                                                  \
    expr;                                                                      \
    ow_kind_end(&k);                                                           \
  }                                                                            \
  Test(owners_kind, name##_device, .timeout = 30) {                            \
    ow_kind k = ow_kind_start(1);                                              \
    um_manager *fm = k.fake;                                                   \
    (void)fm;                                                                  \
    expr;                                                                      \
    ow_kind_end(&k);                                                           \
  }

OW_KIND_TEST(device_count, cr_assert_eq(um_device_count(fm), UM_EINVAL))
OW_KIND_TEST(device_get, cr_assert_null(um_device_get(fm, 0)))
OW_KIND_TEST(manager_options, {
  um_options o;
  cr_assert_eq(um_manager_options(fm, &o), UM_EINVAL);
})
OW_KIND_TEST(alloc, {
  um_buffer *y = NULL;
  cr_assert_eq(um_alloc(fm, um_device_get(k.m, 0), 64, UM_HOST, 0, &y), UM_EINVAL);
})
OW_KIND_TEST(wrap_host, {
  static char mem[64];
  um_buffer *y = NULL;
  cr_assert_eq(um_wrap_host(fm, mem, sizeof(mem), 0, &y), UM_EINVAL);
})
OW_KIND_TEST(stats_get, {
  um_stats s;
  cr_assert_eq(um_stats_get(fm, NULL, &s), UM_EINVAL);
})
OW_KIND_TEST(pool_trim, cr_assert_eq(um_pool_trim(fm, 0), UM_EINVAL))
OW_KIND_TEST(copy_batch, {
  um_copy_op op;
  char h[16] = {0};
  memset(&op, 0, sizeof(op));
  op.dst = k.x;
  op.host_src = h;
  op.bytes = 16;
  cr_assert_eq(um_copy_batch(fm, &op, 1, NULL), UM_EINVAL);
})
OW_KIND_TEST(map_file, {
  um_buffer *y = NULL;
  cr_assert_eq(um_map_file(fm, "/proc/self/exe", UM_MAP_READ, &y), UM_EINVAL);
})
OW_KIND_TEST(manager_destroy, cr_assert_eq(um_manager_destroy(fm), UM_EINVAL))
OW_KIND_TEST(net_create, {
  um_net *n = NULL;
  cr_assert_eq(um_net_create(fm, &n), UM_EINVAL);
})
