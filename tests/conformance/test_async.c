/* Asynchronous operations on every profile's device (profile.h): ordering
 * on one buffer and between two (large copies run on worker threads or
 * device queues, small ones inline, and the result is what running them
 * one by one would give), across the profile's first and last devices
 * with and without peer access, from several threads at once; event
 * query/wait/cancel, batches, and release of buffers with operations in
 * flight. backends/test_opencl_ordering.c shows which of OpenCL's two
 * ordering mechanisms ran (the event states, from inside). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "order_model.h"
#include "profile.h"

static ut_env env;
static um_manager *m;
static um_device *dev;  /* the profile's device */
static um_device *last; /* the profile's last device (dev where it has one) */

static void setup(void) {
  env = ut_profile_open(NULL);
  m = env.m;
  dev = env.dev;
  last = env.dev_of[env.ndev - 1];
}

static void teardown(void) {
  if (m != NULL)
    ut_profile_close(&env);
  m = NULL;
}

TestSuite(async, .init = setup, .fini = teardown, .timeout = 120);

/* Above this an operation with an event goes to a worker thread on the cpu
 * (path.c runs host copies up to 256 KiB on the issuing thread); on the
 * other devices, a large transfer. */
#define WORKER_BYTES ((size_t)256 * 1024 + 1)

static unsigned char *xmalloc(size_t n) {
  unsigned char *p = malloc(n);
  cr_assert_not_null(p);
  return p;
}

/* ------------------------------------------------------------------------ */
/* Ordering: a random mix of copies in, fills, copies within and between
 * two buffers, and copies out, each with an event or blocking, on
 * overlapping ranges; the final contents and every copy-out equal a model
 * that applies the operations one by one. */

enum { OP_IN, OP_FILL, OP_COPY, OP_OUT, OP_KINDS };

typedef struct out_check {
  unsigned char *dst;  /* what the copy-out wrote */
  unsigned char *want; /* the model's bytes at the time it was issued */
  size_t n;
} out_check;

static void ordering_run(uint64_t seed, int nops) {
  const size_t size = 2u << 20;
  um_buffer *buf[2];
  unsigned char *model[2], *src, *back;
  um_event **events = calloc((size_t)nops, sizeof(*events));
  out_check *outs = calloc((size_t)nops, sizeof(*outs));
  int nouts = 0, nworker = 0, ninline = 0;
  uint64_t rng = seed;

  cr_assert_not_null(events);
  cr_assert_not_null(outs);
  src = xmalloc(size);
  back = xmalloc(size);
  ut_pattern(src, size, seed);
  for (int i = 0; i < 2; i++) {
    /* HOST memory of the device, and DEVICE memory of the last device */
    cr_assert_eq(um_alloc(m, i ? last : dev, size, i ? UM_DEVICE : UM_HOST, UM_ALLOC_ZERO, &buf[i]), UM_OK);
    model[i] = calloc(1, size);
    cr_assert_not_null(model[i]);
  }

  for (int k = 0; k < nops; k++) {
    int kind = (int)ut_range(&rng, 0, OP_KINDS - 1);
    int x = (int)ut_range(&rng, 0, 1), y = (int)ut_range(&rng, 0, 1);
    bool large = ut_range(&rng, 0, 3) == 0;
    size_t n = large ? ut_range(&rng, WORKER_BYTES, size / 2) : ut_range(&rng, 1, 64 * 1024);
    size_t off = ut_range(&rng, 0, size - n), off2 = ut_range(&rng, 0, size - n);
    bool blocking = ut_range(&rng, 0, 9) == 0;
    um_event **ev = blocking ? NULL : &events[k];
    int st = UM_EINVAL;
    if (!blocking && large)
      nworker++;
    else if (!blocking)
      ninline++;
    switch (kind) {
    case OP_IN:
      st = um_copy_from_host(buf[x], off, src + off2, n, ev);
      memcpy(model[x] + off, src + off2, n);
      break;
    case OP_FILL: {
      int v = (int)ut_range(&rng, 0, 255);
      st = um_fill(buf[x], off, v, n, ev);
      memset(model[x] + off, v, n);
      break;
    }
    case OP_COPY:
      st = um_copy(buf[x], off, buf[y], off2, n, ev);
      memmove(model[x] + off, model[y] + off2, n);
      break;
    case OP_OUT: {
      out_check *o = &outs[nouts++];
      o->n = n;
      o->dst = xmalloc(n);
      o->want = xmalloc(n);
      memcpy(o->want, model[x] + off, n);
      st = um_copy_to_host(buf[x], off, o->dst, n, ev);
      break;
    }
    }
    cr_assert_eq(st, UM_OK, "op %d kind %d: %s (%s)", k, kind, um_err_name(st), um_last_error());
    if (ev != NULL) {
      int q = um_event_query(*ev);
      cr_assert(q == UM_EAGAIN || q == UM_OK, "query answered %s", um_err_name(q));
    }
  }
  cr_assert_gt(nworker, 0);
  cr_assert_gt(ninline, 0);

  /* Copies out issued now come after everything: they see the end state. */
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(um_copy_to_host(buf[i], 0, back, size, NULL), UM_OK);
    for (size_t j = 0; j < size; j++)
      if (back[j] != model[i][j])
        cr_assert_fail("seed %llu: buffer %d differs from the sequential model at byte %zu",
                       (unsigned long long)seed, i, j);
  }
  for (int k = 0; k < nops; k++) {
    if (events[k] == NULL)
      continue;
    cr_assert_eq(um_event_wait(events[k]), UM_OK);
    cr_assert_eq(um_event_query(events[k]), UM_OK);
    um_event_release(events[k]);
  }
  for (int i = 0; i < nouts; i++) {
    cr_assert_arr_eq(outs[i].dst, outs[i].want, outs[i].n, "seed %llu: copy-out %d saw another state",
                     (unsigned long long)seed, i);
    free(outs[i].dst);
    free(outs[i].want);
  }
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(um_release(buf[i]), UM_OK);
    free(model[i]);
  }
  free(src);
  free(back);
  free(events);
  free(outs);
}

Test(async, ordering_seed_1) { ordering_run(1, 300); }
Test(async, ordering_seed_2) { ordering_run(2, 300); }
Test(async, ordering_seed_3) { ordering_run(0xdecafbad, 300); }

/* A chain of worker-sized writes to the same range, each with an event,
 * then a small inline one: the last issued wins, whatever the threads. */
Test(async, same_range_last_writer_wins) {
  const size_t n = 1u << 20;
  um_buffer *b;
  unsigned char *p[8], *back = xmalloc(n);
  um_event *ev[9];
  cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, 0, &b), UM_OK);
  for (int i = 0; i < 8; i++) {
    p[i] = xmalloc(n);
    memset(p[i], i + 1, n);
    cr_assert_eq(um_copy_from_host(b, 0, p[i], n, &ev[i]), UM_OK);
  }
  cr_assert_eq(um_fill(b, 0, 0xee, 16, &ev[8]), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert(ut_all_bytes(back, 16, 0xee));
  cr_assert(ut_all_bytes(back + 16, n - 16, 8));
  for (int i = 0; i < 9; i++) {
    cr_assert_eq(um_event_wait(ev[i]), UM_OK);
    um_event_release(ev[i]);
  }
  for (int i = 0; i < 8; i++)
    free(p[i]);
  free(back);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Events */

Test(async, query_and_wait) {
  const size_t n = 8u << 20;
  um_buffer *b;
  unsigned char *src = xmalloc(n), *dst = xmalloc(n);
  um_event *e1, *e2;
  int q;
  ut_pattern(src, n, 9);
  cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e1), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, dst, n, &e2), UM_OK);
  q = um_event_query(e2);
  cr_assert(q == UM_EAGAIN || q == UM_OK, "%s", um_err_name(q));
  cr_assert_eq(um_event_wait(e2), UM_OK);
  /* e1 finished before e2 started */
  cr_assert_eq(um_event_query(e1), UM_OK);
  cr_assert_eq(um_event_query(e2), UM_OK);
  cr_assert_eq(um_event_wait(e2), UM_OK); /* waiting twice is fine */
  cr_assert_arr_eq(dst, src, n);
  um_event_release(e1);
  um_event_release(e2);
  free(src);
  free(dst);
  cr_assert_eq(um_release(b), UM_OK);
}

/* Dropping the event does not drop the operation. */
Test(async, released_event_still_runs) {
  const size_t n = 4u << 20;
  um_buffer *b;
  unsigned char *src = xmalloc(n), *dst = xmalloc(n);
  um_event *e;
  ut_pattern(src, n, 10);
  cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e), UM_OK);
  um_event_release(e);
  cr_assert_eq(um_copy_to_host(b, 0, dst, n, NULL), UM_OK);
  cr_assert_arr_eq(dst, src, n);
  free(src);
  free(dst);
  cr_assert_eq(um_release(b), UM_OK);
}

/* Whether the profile's device takes every operation on its buffers into
 * its own in-order queue at once (OpenCL: none waits in the core, as
 * backends/test_opencl_ordering.c shows), so that an operation has started
 * as soon as it is issued. */
static int device_queues_at_once(void) {
  um_device_info info;
  cr_assert_eq(um_device_info_get(dev, &info), UM_OK);
  return strcmp(info.backend, "opencl") == 0;
}

/* Cancel an operation queued behind a large one on the same buffer: it
 * never runs, waiting answers UM_ECANCELED, the operation after it runs.
 * The large one could in principle finish before the small one is issued;
 * then the small one starts at once and cancel says UM_EBUSY: try again.
 * On a device that queues at once, every try answers UM_EBUSY and every
 * operation runs. */
Test(async, cancel_queued) {
  const size_t n = 32u << 20;
  unsigned char *big = xmalloc(n), small[4096], back[3 * 4096];
  int canceled = 0, at_once = device_queues_at_once();
  memset(small, 0xee, sizeof(small));
  ut_pattern(big, n, 11);
  for (int attempt = 0; attempt < 5 && (at_once || !canceled); attempt++) {
    um_buffer *x;
    um_event *e1, *e2, *e3;
    um_stats before, after;
    int st;
    cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, UM_ALLOC_UNPOOLED, &x), UM_OK);
    before = ut_stats(m, NULL);
    cr_assert_eq(um_copy_from_host(x, 0, big, n, &e1), UM_OK);
    cr_assert_eq(um_copy_from_host(x, 0, small, sizeof(small), &e2), UM_OK);
    cr_assert_eq(um_fill(x, 8192, 0x77, 4096, &e3), UM_OK);
    st = um_event_cancel(e2);
    if (st == UM_OK) {
      canceled = 1;
      cr_assert_eq(um_event_cancel(e2), UM_EBUSY, "second cancel");
      cr_assert_eq(um_event_wait(e2), UM_ECANCELED);
      cr_assert_eq(um_event_query(e2), UM_ECANCELED);
      cr_assert_eq(um_event_wait(e1), UM_OK);
      cr_assert_eq(um_event_wait(e3), UM_OK);
      cr_assert_eq(um_copy_to_host(x, 0, back, sizeof(back), NULL), UM_OK);
      cr_assert_arr_eq(back, big, 8192, "the canceled copy wrote its data");
      cr_assert(ut_all_bytes(back + 8192, 4096, 0x77), "the op after the canceled one did not run");
      cr_assert_eq(um_device_synchronize(dev), UM_OK);
      after = ut_stats(m, NULL);
      cr_assert_eq(after.bytes_h2d - before.bytes_h2d, n, "a canceled copy is not counted");
      cr_assert_eq(after.bytes_d2h - before.bytes_d2h, sizeof(back));
      cr_assert_eq(after.fills - before.fills, 1);
    } else {
      cr_assert_eq(st, UM_EBUSY, "%s", um_err_name(st));
      cr_assert_eq(um_event_wait(e2), UM_OK);
      cr_assert_eq(um_event_wait(e1), UM_OK);
      cr_assert_eq(um_event_wait(e3), UM_OK);
      cr_assert_eq(um_copy_to_host(x, 0, back, sizeof(back), NULL), UM_OK);
      cr_assert(ut_all_bytes(back, 4096, 0xee), "the copy that was not canceled did not run");
      cr_assert_arr_eq(back + 4096, big + 4096, 4096);
      cr_assert(ut_all_bytes(back + 8192, 4096, 0x77));
    }
    um_event_release(e1);
    um_event_release(e2);
    um_event_release(e3);
    cr_assert_eq(um_release(x), UM_OK);
  }
  if (at_once)
    cr_assert(!canceled, "an operation the device had queued was canceled");
  else
    cr_assert(canceled, "the small copy was never still queued behind a 32 MiB copy in 5 tries");
  free(big);
}

/* A finished operation cannot be canceled; nor can a batch. */
Test(async, cancel_finished_and_batch) {
  um_buffer *b;
  unsigned char src[64], dst[64];
  um_event *e, *g;
  um_copy_op op = {.host_dst = dst, .bytes = 64};
  memset(src, 5, sizeof(src));
  cr_assert_eq(um_alloc(m, dev, 64, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, 64, &e), UM_OK); /* small, nothing before: inline */
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_cancel(e), UM_EBUSY);
  cr_assert_eq(um_event_wait(e), UM_OK);
  um_event_release(e);
  op.src = b;
  cr_assert_eq(um_copy_batch(m, &op, 1, &g), UM_OK);
  cr_assert_eq(um_event_wait(g), UM_OK);
  cr_assert_eq(um_event_cancel(g), UM_EBUSY);
  um_event_release(g);
  cr_assert_arr_eq(dst, src, 64);
  cr_assert_eq(um_release(b), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* Batches */

static void batch_run(bool with_event, size_t seg) {
  const int nseg = 64;
  size_t size = seg * (size_t)nseg;
  um_buffer *a, *b;
  unsigned char *src = xmalloc(size), *dst = xmalloc(size);
  um_copy_op *ops = calloc(3 * (size_t)nseg, sizeof(*ops));
  um_stats before, after;
  int n = 0;
  cr_assert_not_null(ops);
  ut_pattern(src, size, seg);
  memset(dst, 0, size);
  cr_assert_eq(um_alloc(m, dev, size, UM_DEVICE, UM_ALLOC_ZERO, &a), UM_OK);
  cr_assert_eq(um_alloc(m, dev, size, UM_DEVICE, UM_ALLOC_ZERO, &b), UM_OK);
  before = ut_stats(m, NULL);
  /* host -> a (segment i), a -> b (segment i to segment nseg-1-i),
   * b -> host: issued in that order, so each op sees the earlier ones. */
  for (int i = 0; i < nseg; i++)
    ops[n++] = (um_copy_op){.dst = a, .dst_off = (size_t)i * seg, .host_src = src + (size_t)i * seg, .bytes = seg};
  for (int i = 0; i < nseg; i++)
    ops[n++] = (um_copy_op){.dst = b, .dst_off = (size_t)(nseg - 1 - i) * seg, .src = a,
                            .src_off = (size_t)i * seg, .bytes = seg};
  for (int i = 0; i < nseg; i++)
    ops[n++] = (um_copy_op){.host_dst = dst + (size_t)i * seg, .src = b, .src_off = (size_t)i * seg, .bytes = seg};
  if (with_event) {
    um_event *g;
    cr_assert_eq(um_copy_batch(m, ops, (size_t)n, &g), UM_OK);
    cr_assert_eq(um_event_wait(g), UM_OK);
    cr_assert_eq(um_event_query(g), UM_OK);
    um_event_release(g);
  } else {
    cr_assert_eq(um_copy_batch(m, ops, (size_t)n, NULL), UM_OK);
  }
  for (int i = 0; i < nseg; i++)
    cr_assert_arr_eq(dst + (size_t)i * seg, src + (size_t)(nseg - 1 - i) * seg, seg, "segment %d", i);
  cr_assert_eq(um_device_synchronize(dev), UM_OK);
  after = ut_stats(m, NULL);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, size);
  cr_assert_eq(after.bytes_d2d - before.bytes_d2d, size);
  cr_assert_eq(after.bytes_d2h - before.bytes_d2h, size);
  cr_assert_eq(after.xfer_direct - before.xfer_direct, 2 * (uint64_t)nseg);
  cr_assert_eq(after.xfer_local - before.xfer_local, (uint64_t)nseg);
  { /* read back after the figures were taken */
    unsigned char *got = ub_read_all(a);
    ub_assert_bytes(got, src, size, "the batch's first buffer");
    free(got);
  }
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(dst);
  free(ops);
}

Test(async, batch_blocking_small) { batch_run(false, 4096); }
Test(async, batch_event_small) { batch_run(true, 4096); }
Test(async, batch_blocking_large) { batch_run(false, WORKER_BYTES + 3); }
Test(async, batch_event_large) { batch_run(true, WORKER_BYTES + 3); }

/* ------------------------------------------------------------------------ */
/* Deferred release: releasing a buffer with operations in flight answers
 * at once, the operations complete with their data, and the block reaches
 * the pool only afterwards. */
Test(async, deferred_release) {
  const size_t n = 16u << 20;
  unsigned char *src = xmalloc(n), *dst = xmalloc(n);
  int observed_in_flight = 0;
  ut_pattern(src, n, 12);
  for (int attempt = 0; attempt < 5 && !observed_in_flight; attempt++) {
    um_buffer *b, *again;
    um_event *e1, *e2;
    um_stats s;
    memset(dst, 0, n);
    cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, 0, &b), UM_OK);
    cr_assert_eq(um_copy_from_host(b, 0, src, n, &e1), UM_OK);
    cr_assert_eq(um_copy_to_host(b, 0, dst, n, &e2), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    s = ut_stats(m, NULL);
    if (um_event_query(e2) == UM_EAGAIN) {
      /* Still running after the figures were read: they saw it in flight. */
      observed_in_flight = 1;
      cr_assert_eq(s.bytes_pooled, 0, "block pooled while an operation still used it");
    }
    cr_assert_eq(s.active_buffers, 0);
    cr_assert_eq(s.bytes_in_use, 0);
    cr_assert_eq(s.releases, 2 * (uint64_t)attempt + 1);
    cr_assert_eq(um_release(b), UM_ESTATE);
    cr_assert_eq(um_copy_to_host(b, 0, dst, 1, NULL), UM_ESTATE);
    cr_assert_eq(um_event_wait(e1), UM_OK);
    cr_assert_eq(um_event_wait(e2), UM_OK);
    cr_assert_arr_eq(dst, src, n);
    um_event_release(e1);
    um_event_release(e2);
    /* the engine has finished with the buffer once synchronize returns */
    cr_assert_eq(um_device_synchronize(dev), UM_OK);
    s = ut_stats(m, NULL);
    cr_assert_eq(s.bytes_pooled, n);
    cr_assert_eq(s.largest_pooled_block, n);
    cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, 0, &again), UM_OK);
    cr_assert_eq(again, b, "the block came back to the pool");
    cr_assert_eq(um_release(again), UM_OK);
  }
  if (ut_profile_is("pocl-basic")) /* PoCL's basic device runs commands inside the submitting call */
    cr_assert(!observed_in_flight, "a copy was still running after the call that submitted it returned");
  else
    cr_assert(observed_in_flight, "two 16 MiB copies never outlasted um_release in 5 tries");
  free(src);
  free(dst);
}

/* A buffer released with operations in flight, whose event the caller
 * dropped too: nothing leaks and the next allocation can reuse it. */
Test(async, deferred_release_without_events) {
  const size_t n = 4u << 20;
  unsigned char *src = xmalloc(n);
  um_buffer *b;
  um_event *e;
  um_stats s;
  ut_pattern(src, n, 13);
  cr_assert_eq(um_alloc(m, dev, n, UM_DEVICE, UM_ALLOC_UNPOOLED, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e), UM_OK);
  um_event_release(e);
  cr_assert_eq(um_fill(b, 0, 1, n, &e), UM_OK);
  um_event_release(e);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_device_synchronize(dev), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.device_frees, 1);
  cr_assert_eq(s.bytes_reserved, 0);
  cr_assert_eq(s.bytes_h2d, n);
  cr_assert_eq(s.fills, 1);
  free(src);
}

/* Once an operation's event reports completion, the buffer's bookkeeping is
 * finished too: releasing it right after the wait returns the block to the
 * pool at once, not when the engine catches up. */
Test(async, release_after_wait_pools_at_once) {
  unsigned char *src = malloc(WORKER_BYTES);
  um_buffer *b;
  um_event *e;
  um_stats s;
  cr_assert_not_null(src);
  memset(src, 0x3c, WORKER_BYTES);
  for (int round = 0; round < 20; round++) {
    cr_assert_eq(um_alloc(m, dev, WORKER_BYTES, UM_DEVICE, 0, &b), UM_OK);
    cr_assert_eq(um_copy_from_host(b, 0, src, WORKER_BYTES, &e), UM_OK);
    cr_assert_eq(um_event_wait(e), UM_OK);
    um_event_release(e);
    cr_assert_eq(um_release(b), UM_OK);
    s = ut_stats(m, dev);
    cr_assert_eq(s.bytes_pooled, ut_class(WORKER_BYTES), "round %d", round);
  }
  free(src);
}

/* ------------------------------------------------------------------------ */
/* Two devices (the profile's first and last; one device where the profile
 * has one), several threads, releases in flight: each test with its own
 * manager. */

/* A copy between the devices waits for the source's earlier operations
 * (with peer access on a profile whose devices have it: on OpenCL the peer
 * copy runs on the destination's queue, ordered by registration), and
 * what follows it waits for it. */
Test(async_devices, two_devices_in_order) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *a = ub_alloc(e.m, e.dev, OM_BYTES, UM_DEVICE);
  um_buffer *b = ub_alloc(e.m, e.dev_of[e.ndev - 1], OM_BYTES, UM_DEVICE);
  om_model md;
  om_init(&md, a, b);
  for (int round = 0; round < 3; round++) {
    om_fill(&md, a, 0, 0, OM_BYTES, 0x21 + round);
    om_write(&md, a, 0, 77, OM_BYTES - 200, 5 + (unsigned)round); /* a long write on the first device */
    om_fill(&md, b, 1, 0, OM_BYTES, 0x31);
    om_copy(&md, b, 1, 11, a, 0, 33, OM_BYTES - 100); /* between the devices, after both */
    om_fill(&md, b, 1, 1000, 3000, 0x99);             /* after that copy */
    om_read(&md, b, 1, 0, OM_BYTES);
    om_copy(&md, a, 0, 0, b, 1, 500, 100000); /* and back */
    om_write(&md, a, 0, 50, 10, 70 + (unsigned)round);
  }
  om_finish(&md, a, b);
  ut_profile_close(&e);
}

/* Without peer access, copies between two devices are staged through host
 * memory by workers; operations on both buffers around them keep their
 * order. */
Test(async_devices, around_copies_without_peer_access) {
  um_options o;
  ut_env e;
  um_buffer *a, *b;
  om_model md;
  ut_profile_options(&o);
  o.enable_peer = 0;
  o.staging_chunk_bytes = 32 * 1024;
  e = ut_profile_open(&o);
  a = ub_alloc(e.m, e.dev, OM_BYTES, UM_DEVICE);
  b = ub_alloc(e.m, e.dev_of[e.ndev - 1], OM_BYTES, UM_DEVICE);
  om_init(&md, a, b);
  for (int round = 0; round < 3; round++) {
    om_write(&md, a, 0, 0, OM_BYTES, 100 + (unsigned)round);
    om_copy(&md, b, 1, 0, a, 0, 0, OM_BYTES);          /* staged between two devices */
    om_fill(&md, a, 0, 0, OM_BYTES / 2, 0x66);         /* after that copy's read of a */
    om_write(&md, b, 1, 1000, 5000, 110 + (unsigned)round);
    om_copy(&md, a, 0, 3, b, 1, 900, 200000);          /* and back */
    om_read(&md, a, 0, 0, OM_BYTES);
  }
  om_finish(&md, a, b);
  ut_profile_close(&e);
}

/* Several threads issue asynchronous chains on their own buffers of the
 * profile's devices at once: every chain keeps its order. */
typedef struct issuer_arg {
  ut_env *e;
  int index; /* thread i works on device i of the profile (round robin) */
  int ok;
} issuer_arg;

/* 20 rounds of fill, write, fill, read on b, each waited for: whether every
 * operation succeeded and every read saw the chain's bytes (no Criterion
 * assertion off the test's thread). */
static int chains_in_order(um_buffer *b, unsigned seed, unsigned char *src, unsigned char *back,
                           unsigned char *want) {
  for (int r = 0; r < 20; r++) {
    um_event *ev[4] = {NULL, NULL, NULL, NULL};
    int st = UM_OK;
    ub_pattern(src, OM_BYTES, seed + (unsigned)r);
    memcpy(want, src, OM_BYTES);
    memset(want + 10, r, 100);
    st = um_fill(b, 0, 0xAB, OM_BYTES, &ev[0]);
    st = st == UM_OK ? um_copy_from_host(b, 0, src, OM_BYTES, &ev[1]) : st;
    st = st == UM_OK ? um_fill(b, 10, r, 100, &ev[2]) : st;
    st = st == UM_OK ? um_copy_to_host(b, 0, back, OM_BYTES, &ev[3]) : st;
    for (int i = 0; i < 4 && ev[i] != NULL; i++) {
      int w = um_event_wait(ev[i]);
      st = st == UM_OK ? w : st;
      um_event_release(ev[i]);
    }
    if (st != UM_OK || memcmp(back, want, OM_BYTES) != 0)
      return 0;
  }
  return 1;
}

static void *issuer(void *p) {
  issuer_arg *w = p;
  um_device *d = w->e->dev_of[w->index % w->e->ndev];
  um_buffer *b = NULL;
  unsigned char *src = malloc(OM_BYTES), *back = malloc(OM_BYTES), *want = malloc(OM_BYTES);
  w->ok = src != NULL && back != NULL && want != NULL && um_alloc(w->e->m, d, OM_BYTES, UM_DEVICE, 0, &b) == UM_OK &&
          chains_in_order(b, 300u + (unsigned)w->index * 17u, src, back, want);
  if (b != NULL && um_release(b) != UM_OK)
    w->ok = 0;
  free(src);
  free(back);
  free(want);
  return NULL;
}

Test(async_devices, threads_on_their_own_buffers) {
  ut_env e = ut_profile_open(NULL);
  pthread_t t[3];
  issuer_arg w[3];
  for (int i = 0; i < 3; i++)
    w[i] = (issuer_arg){&e, i, 0};
  for (int i = 0; i < 3; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, issuer, &w[i]), 0);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < 3; i++)
    cr_assert(w[i].ok, "thread %d saw wrong bytes or a failed operation", i);
  ut_profile_close(&e);
}

/* Releasing buffers with operations in flight, pooled and unpooled, DEVICE
 * and PINNED where the device has it: their blocks go back when the
 * operations finish (on OpenCL in the driver's completion callback, so
 * unpooled blocks are freed from PoCL's thread). Every block comes back. */
Test(async_devices, release_with_operations_in_flight) {
  ut_env e = ut_profile_open(NULL);
  enum { ROUNDS = 40, S = 64 * 1024 };
  unsigned char *src = ub_malloc(S);
  um_device_info info;
  um_stats before, after;
  cr_assert_eq(um_device_info_get(e.dev, &info), UM_OK);
  ub_pattern(src, S, 77);
  before = ut_stats(e.m, e.dev);
  for (int r = 0; r < ROUNDS; r++) {
    um_buffer *b = NULL, *c = NULL;
    um_event *w = NULL, *cp = NULL;
    unsigned flags = r % 2 ? UM_ALLOC_UNPOOLED : 0;
    um_location cloc = r % 3 || !(info.locations & (1u << UM_PINNED)) ? UM_DEVICE : UM_PINNED;
    cr_assert_eq(um_alloc(e.m, e.dev, S, UM_DEVICE, flags, &b), UM_OK);
    cr_assert_eq(um_alloc(e.m, e.dev, S, cloc, flags, &c), UM_OK);
    cr_assert_eq(um_copy_from_host(b, 0, src, S, &w), UM_OK);
    cr_assert_eq(um_copy(c, 0, b, 0, S, &cp), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    cr_assert_eq(um_release(c), UM_OK);
    ub_wait(w, UM_OK);
    ub_wait(cp, UM_OK);
  }
  cr_assert_eq(um_device_synchronize(e.dev), UM_OK);
  after = ut_stats(e.m, e.dev);
  cr_assert_eq(after.active_buffers, before.active_buffers);
  cr_assert_eq(after.releases - before.releases, 2 * ROUNDS);
  free(src);
  ut_profile_close(&e);
}
