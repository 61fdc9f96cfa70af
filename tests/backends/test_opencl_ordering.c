/* Ordering of mixed asynchronous operations on OpenCL buffers, and which
 * of the two mechanisms kept it: the native wait list of one device's
 * queue (every operation is handed to the device at once: none is ever
 * QUEUED in the core), and registration with the earlier operation (the
 * later one is QUEUED until a worker starts it), seen through the event's
 * state (the test build's inside). The bytes at the end, and those every
 * read saw, equal a model that applies the same operations one after the
 * other (order_model.h). Ordering across devices, around staged copies, on
 * several threads and with releases in flight is conformance/test_async.c's,
 * on the pocl profiles among the others. */
#include "opencl_util.h"
#include "order_model.h"

/* One device, one buffer (and a second on the same device for copies):
 * every operation is native, ordered by the device's queue. */
OU_TEST_1_AND_2(opencl_ordering, one_device_through_the_native_queue) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *a = ub_alloc(e.m, e.dev[0], OM_BYTES, UM_DEVICE), *b = ub_alloc(e.m, e.dev[0], OM_BYTES, UM_DEVICE);
  om_model md;
  om_init(&md, a, b);
  for (int round = 0; round < 3; round++) {
    int first = md.nev;
    om_fill(&md, a, 0, 0, OM_BYTES, 0x10 + round);
    om_write(&md, a, 0, 1000 + round, 50000, 1 + (unsigned)round);
    om_fill(&md, a, 0, 20000, 7001, 0x7F);
    om_copy(&md, b, 1, 3, a, 0, 999, 60000);           /* a -> b */
    om_write(&md, a, 0, 30001, 4096, 40 + (unsigned)round);
    om_copy(&md, a, 0, 200000, a, 0, 1000, 50000);     /* within a, disjoint */
    om_read(&md, a, 0, 0, OM_BYTES);
    om_copy(&md, a, 0, 100000, b, 1, 0, 70000);        /* b -> a */
    om_fill(&md, b, 1, 5, 100, 0xC3);
    om_read(&md, b, 1, 0, OM_BYTES);
    om_write(&md, a, 0, OM_BYTES - 4097, 4097, 60 + (unsigned)round);
    om_read(&md, a, 0, 0, OM_BYTES);
    /* The device orders them: none waited in the core's queue. */
    for (int i = first; i < md.nev; i++)
      cr_assert_neq(ou_event_state(md.ev[i]), UM__EV_QUEUED, "operation %d was queued in the core", i);
  }
  om_finish(&md, a, b);
  ou_close(&e);
}

/* Operations behind a worker-run copy (pipelined staging forced) wait for
 * it by registration: while a worker holds the copy, what was issued
 * after it is QUEUED, and runs in order once the copy finishes. */
OU_TEST_1_AND_2(opencl_ordering, behind_a_worker_run_copy) {
  um_options o;
  ou_env e;
  um_buffer *a, *b;
  om_model md;
  int first;
  ou_options(&o);
  o.use_pinned_staging = 2;
  o.staging_chunk_bytes = 16 * 1024;
  e = ou_open(&o, 1);
  a = ub_alloc(e.m, e.dev[0], OM_BYTES, UM_DEVICE);
  b = ub_alloc(e.m, e.dev[0], OM_BYTES, UM_DEVICE);
  om_init(&md, a, b);
  om_fill(&md, b, 1, 0, OM_BYTES, 0x01);
  ou_gate_install(e.m, 0);
  om_write(&md, a, 0, 0, OM_BYTES, 90); /* pipelined: a worker runs it */
  ou_gate_wait_entered(1);
  cr_assert_eq(ou_event_state(md.ev[md.nev - 1]), UM__EV_RUNNING);
  first = md.nev;
  om_fill(&md, a, 0, 100, 1000, 0x55);
  om_copy(&md, b, 1, 7, a, 0, 0, 10000);
  om_write(&md, a, 0, 5, 20, 91);
  om_read(&md, a, 0, 0, OM_BYTES);
  om_copy(&md, a, 0, 200000, a, 0, 0, 50000);
  for (int i = first; i < md.nev; i++)
    cr_assert_eq(ou_event_state(md.ev[i]), UM__EV_QUEUED, "operation %d should wait behind the copy", i);
  cr_assert_eq(um_event_query(md.ev[first]), UM_EAGAIN);
  ou_gate_open();
  om_finish(&md, a, b);
  ou_close(&e);
}
