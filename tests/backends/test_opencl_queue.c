/* Work on the caller's queue (um_queue_use), with real OpenCL C compiled by
 * PoCL, every result checked element by element:
 *  - the caller's loop (allocate, upload, kernel, download, release) on one
 *    in-order queue: no wait handle between the steps, exact results;
 *  - the order across queues: work of the caller's queue held by a user
 *    event holds up what follows on unimem's own queue, and on another
 *    thread's, and not the other way round;
 *  - a bracket ended with NULL on the queue: a later download on unimem's
 *    queue sees the kernel's writes;
 *  - a bracket ended with NULL rides on the queue's next command; with none
 *    after it, a download or copy of unimem's queue, a polling caller, a
 *    map, a release and a synchronize each have it carried;
 *  - a copy bound for the caller's queue behind work elsewhere is not
 *    overtaken by a bracket begun on its destination;
 *  - a batch on the caller's queue;
 *  - bad input with exact codes (the cpu device, a queue of another device,
 *    an out-of-order queue, too many queues, NULL);
 *  - the eight devices a thread may set at once: a device set back to NULL,
 *    or a destroyed manager's, makes room for another (ten PoCL devices of
 *    five managers).
 * The test links libOpenCL itself (the library never does). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <unistd.h>

#include "opencl_util.h"

#define N 1024 /* elements */

static const char *kernel_source = "__kernel void twice_plus_one(__global const uint *in, ulong in_first,\n"
                                   "                             __global uint *out, ulong out_first) {\n"
                                   "  size_t i = get_global_id(0);\n"
                                   "  out[out_first + i] = 2u * in[in_first + i] + 1u;\n"
                                   "}\n";

typedef struct qdev {
  um_device *d;
  um_device_native nat;
  cl_command_queue q; /* the device's caller queue */
  cl_program program;
  cl_kernel kernel;
} qdev;

static void qdev_open(qdev *k, um_device *d) {
  cl_int err;
  cl_device_id id;
  memset(k, 0, sizeof(*k));
  k->d = d;
  cr_assert_eq(um_device_native_get(d, &k->nat), UM_OK);
  k->q = (cl_command_queue)k->nat.cl_queue;
  id = (cl_device_id)k->nat.cl_device;
  k->program = clCreateProgramWithSource((cl_context)k->nat.cl_context, 1, &kernel_source, NULL, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(clBuildProgram(k->program, 1, &id, "", NULL, NULL), CL_SUCCESS, "kernel build");
  k->kernel = clCreateKernel(k->program, "twice_plus_one", &err);
  cr_assert_eq(err, CL_SUCCESS);
}

static void qdev_close(qdev *k) {
  clReleaseKernel(k->kernel);
  clReleaseProgram(k->program);
}

/* out = 2 * in + 1 over n elements on q, after the events of wait[0..nwait);
 * its event in *done when done is not NULL. */
static void enqueue_kernel(qdev *k, cl_command_queue q, um_buffer *in, um_buffer *out, size_t n, cl_uint nwait,
                           const cl_event *wait, cl_event *done) {
  um_buffer_native bi, bo;
  cl_ulong fi, fo;
  cr_assert_eq(um_buffer_native_get(in, &bi), UM_OK);
  cr_assert_eq(um_buffer_native_get(out, &bo), UM_OK);
  fi = bi.offset / sizeof(cl_uint);
  fo = bo.offset / sizeof(cl_uint);
  cr_assert_eq(clSetKernelArg(k->kernel, 0, sizeof(cl_mem), &bi.cl_mem), CL_SUCCESS);
  cr_assert_eq(clSetKernelArg(k->kernel, 1, sizeof(fi), &fi), CL_SUCCESS);
  cr_assert_eq(clSetKernelArg(k->kernel, 2, sizeof(cl_mem), &bo.cl_mem), CL_SUCCESS);
  cr_assert_eq(clSetKernelArg(k->kernel, 3, sizeof(fo), &fo), CL_SUCCESS);
  cr_assert_eq(clEnqueueNDRangeKernel(q, k->kernel, 1, NULL, &n, NULL, nwait, nwait ? wait : NULL, done),
               CL_SUCCESS);
}

static void fill_input(cl_uint *p, size_t n, cl_uint seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = seed * 7919u + (cl_uint)i;
}

static void check_output(const cl_uint *in, const cl_uint *out, size_t n) {
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(out[i], 2u * in[i] + 1u, "element %zu: %u, not 2 * %u + 1", i, out[i], in[i]);
}

static void release_event(um_event *e) { cr_assert_eq(um_event_release(e), UM_OK); }

/* The tests that hold the caller's queue with a user event do not run on
 * PoCL's basic device: there, setting a user event that a queued marker
 * waits for, with writes queued behind it, hangs inside
 * clSetUserEventStatus, in a raw program too (PoCL 3.1). */
static void skip_user_event_holds_on_basic(void) {
  if (strcmp(ou_pocl_kind(), "basic") == 0)
    cr_skip_test("SKIPPED on PoCL's basic device: a user event set behind queued writes hangs PoCL itself");
}

/* ------------------------------------------------------------------------ */

/* The loop a user writes: every step on the device's caller queue, no wait
 * handle ever, sizes changing, the results exact. */
OU_TEST_1_AND_2(opencl_queue, the_callers_loop_needs_no_event) {
  ou_env e = ou_open(NULL, 1);
  qdev k;
  cl_uint in[N], out[N];
  qdev_open(&k, e.dev[0]);
  cr_assert_eq(um_queue_use(k.d, k.q), UM_OK, "%s", um_last_error());
  for (int it = 0; it < 200; it++) {
    size_t n = 1 + (size_t)(it * 37) % N, bytes = n * sizeof(cl_uint);
    um_buffer *bin, *bout;
    um_event *up = NULL;
    void *w_in = (void *)1, *w_out = (void *)1;
    fill_input(in, n, (cl_uint)it);
    cr_assert_eq(um_alloc(e.m, k.d, bytes, UM_DEVICE, 0, &bin), UM_OK);
    cr_assert_eq(um_alloc(e.m, k.d, bytes, UM_DEVICE, 0, &bout), UM_OK);
    cr_assert_eq(um_copy_from_host(bin, 0, in, bytes, &up), UM_OK);
    release_event(up);
    cr_assert_eq(um_access_begin(bin, UM_MAP_READ, &w_in), UM_OK, "%s", um_last_error());
    cr_assert_eq(um_access_begin(bout, UM_MAP_WRITE_DISCARD, &w_out), UM_OK);
    cr_assert_null(w_in, "the upload is queued on the same queue: nothing to wait for");
    cr_assert_null(w_out, "nothing was issued on the output");
    enqueue_kernel(&k, k.q, bin, bout, n, 0, NULL, NULL);
    cr_assert_eq(um_access_end(bin, NULL), UM_OK);
    cr_assert_eq(um_access_end(bout, NULL), UM_OK);
    memset(out, 0, bytes);
    cr_assert_eq(um_copy_to_host(bout, 0, out, bytes, NULL), UM_OK, "%s", um_last_error());
    check_output(in, out, n);
    cr_assert_eq(um_release(bin), UM_OK);
    cr_assert_eq(um_release(bout), UM_OK);
  }
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
  qdev_close(&k);
  ou_close(&e);
}

/* A user event holds the caller's queue. What is queued there after it
 * waits; an operation of another buffer on unimem's own queue does not, and
 * one of the same buffer there waits for those (the buffer's order holds
 * across queues). */
OU_TEST_1_AND_2(opencl_queue, order_holds_across_queues) {
  ou_env e;
  qdev k;
  cl_int err;
  cl_uint in[N], got[N], other[N];
  um_buffer *b, *c;
  um_event *up, *down, *free_run;
  cl_event hold;
  skip_user_event_holds_on_basic();
  e = ou_open(NULL, 1);
  qdev_open(&k, e.dev[0]);
  fill_input(in, N, 5);
  hold = clCreateUserEvent((cl_context)k.nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(clEnqueueMarkerWithWaitList(k.q, 1, &hold, NULL), CL_SUCCESS);
  clFlush(k.q);
  b = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  c = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  cr_assert_eq(um_queue_use(k.d, k.q), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, in, sizeof(in), &up), UM_OK);
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(c, 0, other, sizeof(other), &free_run), UM_OK);
  cr_assert_eq(um_event_wait(free_run), UM_OK, "another buffer on unimem's queue is not held");
  cr_assert_eq(um_copy_to_host(b, 0, got, sizeof(got), &down), UM_OK);
  usleep(50 * 1000);
  cr_assert_eq(um_event_query(up), UM_EAGAIN, "the upload waits behind the caller's hold");
  cr_assert_eq(um_event_query(down), UM_EAGAIN, "the download waits for the upload, across queues");
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(um_event_wait(up), UM_OK);
  cr_assert_eq(um_event_wait(down), UM_OK);
  cr_assert_arr_eq(got, in, sizeof(in));
  release_event(up);
  release_event(down);
  release_event(free_run);
  clReleaseEvent(hold);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  qdev_close(&k);
  ou_close(&e);
}

/* A bracket ended with NULL on the thread's queue ends behind the kernel
 * queued there: a download issued from a thread on unimem's queue sees the
 * kernel's writes. */
static void *download_on_unimem_queue(void *arg) {
  um_buffer *b = arg;
  cl_uint *out = ub_malloc(N * sizeof(cl_uint));
  cr_assert_eq(um_copy_to_host(b, 0, out, N * sizeof(cl_uint), NULL), UM_OK, "%s", um_last_error());
  return out;
}

OU_TEST_1_AND_2(opencl_queue, a_bracket_ends_behind_the_queue) {
  ou_env e = ou_open(NULL, 1);
  qdev k;
  cl_uint in[N], *out;
  um_buffer *bin, *bout;
  void *w = NULL;
  pthread_t t;
  qdev_open(&k, e.dev[0]);
  fill_input(in, N, 9);
  bin = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  bout = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  cr_assert_eq(um_copy_from_host(bin, 0, in, sizeof(in), NULL), UM_OK);
  cr_assert_eq(um_queue_use(k.d, k.q), UM_OK);
  cr_assert_eq(um_access_begin(bin, UM_MAP_READ, &w), UM_OK);
  cr_assert_null(w, "the blocking upload finished");
  cr_assert_eq(um_access_begin(bout, UM_MAP_WRITE_DISCARD, &w), UM_OK);
  enqueue_kernel(&k, k.q, bin, bout, N, 0, NULL, NULL);
  cr_assert_eq(um_access_end(bin, NULL), UM_OK);
  cr_assert_eq(um_access_end(bout, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(bout), UM_VALID_DEVICE);
  cr_assert_eq(pthread_create(&t, NULL, download_on_unimem_queue, bout), 0);
  cr_assert_eq(pthread_join(t, (void **)&out), 0);
  check_output(in, out, N);
  free(out);
  cr_assert_eq(um_release(bin), UM_OK);
  cr_assert_eq(um_release(bout), UM_OK);
  qdev_close(&k);
  ou_close(&e);
}

/* A batch's copies go to the thread's queue too, behind the caller's hold. */
OU_TEST_1_AND_2(opencl_queue, a_batch_on_the_callers_queue) {
  ou_env e;
  skip_user_event_holds_on_basic();
  e = ou_open(NULL, 1);
  qdev k;
  cl_int err;
  enum { NB = 8 };
  cl_uint in[NB][64], out[NB][64];
  um_buffer *b[NB];
  um_copy_op ops[NB];
  um_event *batch;
  cl_event hold;
  qdev_open(&k, e.dev[0]);
  hold = clCreateUserEvent((cl_context)k.nat.cl_context, &err);
  cr_assert_eq(clEnqueueMarkerWithWaitList(k.q, 1, &hold, NULL), CL_SUCCESS);
  clFlush(k.q);
  memset(ops, 0, sizeof(ops));
  for (int i = 0; i < NB; i++) {
    fill_input(in[i], 64, (cl_uint)i);
    b[i] = ub_alloc(e.m, k.d, sizeof(in[i]), UM_DEVICE);
    ops[i] = (um_copy_op){.dst = b[i], .host_src = in[i], .bytes = sizeof(in[i])};
  }
  cr_assert_eq(um_queue_use(k.d, k.q), UM_OK);
  cr_assert_eq(um_copy_batch(e.m, ops, NB, &batch), UM_OK);
  usleep(30 * 1000);
  cr_assert_eq(um_event_query(batch), UM_EAGAIN, "queued behind the caller's hold");
  cr_assert_eq(clSetUserEventStatus(hold, CL_COMPLETE), CL_SUCCESS);
  cr_assert_eq(um_event_wait(batch), UM_OK);
  release_event(batch);
  for (int i = 0; i < NB; i++) {
    cr_assert_eq(um_copy_to_host(b[i], 0, out[i], sizeof(out[i]), NULL), UM_OK);
    cr_assert_arr_eq(out[i], in[i], sizeof(in[i]));
    cr_assert_eq(um_release(b[i]), UM_OK);
  }
  clReleaseEvent(hold);
  qdev_close(&k);
  ou_close(&e);
}

/* A bracket ended with NULL on the caller's queue enqueues nothing: the
 * queue's next command carries it. Where none follows, whatever waits for
 * it has one queued: each of these returns, with the kernel's results. */
static void open_riding_pair(ou_env *e, qdev *k, cl_uint *in, um_buffer **bin, um_buffer **bout, cl_uint seed) {
  void *w = NULL;
  fill_input(in, N, seed);
  *bin = ub_alloc(e->m, k->d, N * sizeof(cl_uint), UM_DEVICE);
  *bout = ub_alloc(e->m, k->d, N * sizeof(cl_uint), UM_DEVICE);
  cr_assert_eq(um_queue_use(k->d, k->q), UM_OK);
  cr_assert_eq(um_copy_from_host(*bin, 0, in, N * sizeof(cl_uint), NULL), UM_OK);
  cr_assert_eq(um_access_begin(*bin, UM_MAP_READ, &w), UM_OK);
  cr_assert_eq(um_access_begin(*bout, UM_MAP_WRITE_DISCARD, &w), UM_OK);
  cr_assert_null(w);
  enqueue_kernel(k, k->q, *bin, *bout, N, 0, NULL, NULL);
  cr_assert_eq(um_access_end(*bin, NULL), UM_OK);
  cr_assert_eq(um_access_end(*bout, NULL), UM_OK);
}

OU_TEST_1_AND_2(opencl_queue, a_riding_end_is_carried_on_demand) {
  ou_env e = ou_open(NULL, 1);
  qdev k;
  cl_uint in[N], out[N], *mapped;
  um_buffer *bin, *bout, *copy;
  um_event *down, *d2d;
  int polls = 0, st;
  qdev_open(&k, e.dev[0]);
  /* An operation of unimem's own queue after it: queued at once, behind a
   * marker the bracket gets then. */
  open_riding_pair(&e, &k, in, &bin, &bout, 21);
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
  memset(out, 0, sizeof(out));
  cr_assert_eq(um_copy_to_host(bout, 0, out, sizeof(out), &down), UM_OK);
  cr_assert_eq(um_event_wait(down), UM_OK, "%s", um_last_error());
  check_output(in, out, N);
  release_event(down);
  /* A caller who polls: a copy of unimem's queue, um_event_query only. */
  copy = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  cr_assert_eq(um_release(bin), UM_OK);
  cr_assert_eq(um_release(bout), UM_OK);
  open_riding_pair(&e, &k, in, &bin, &bout, 22);
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
  cr_assert_eq(um_copy(copy, 0, bout, 0, sizeof(in), &d2d), UM_OK);
  while ((st = um_event_query(d2d)) == UM_EAGAIN && polls++ < 20000)
    usleep(100);
  cr_assert_eq(st, UM_OK, "polled %d times: %s", polls, um_err_name(st));
  release_event(d2d);
  cr_assert_eq(um_copy_to_host(copy, 0, out, sizeof(out), NULL), UM_OK);
  check_output(in, out, N);
  /* um_map waits for it. */
  cr_assert_eq(um_release(bin), UM_OK);
  cr_assert_eq(um_release(bout), UM_OK);
  open_riding_pair(&e, &k, in, &bin, &bout, 23);
  cr_assert_eq(um_map(bout, UM_MAP_READ, 0, sizeof(out), (void **)&mapped), UM_OK, "%s", um_last_error());
  check_output(in, mapped, N);
  cr_assert_eq(um_unmap(bout, mapped), UM_OK);
  /* A release with nothing after it on the queue, then a synchronize: the
   * release has the bracket carried, the synchronize returns. */
  cr_assert_eq(um_release(bin), UM_OK);
  cr_assert_eq(um_release(bout), UM_OK);
  open_riding_pair(&e, &k, in, &bin, &bout, 24);
  cr_assert_eq(um_release(bin), UM_OK);
  cr_assert_eq(um_release(bout), UM_OK);
  cr_assert_eq(um_device_synchronize(k.d), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
  cr_assert_eq(um_release(copy), UM_OK);
  qdev_close(&k);
  ou_close(&e);
}

/* Riders while another thread waits all the time: each bracket end either
 * sees the waiter or is seen by its kick (core/riders.c); none is left
 * behind, so every download and synchronize returns. */
typedef struct sync_loop {
  um_manager *m;
  um_device *d;
  atomic_int stop;
  atomic_int rounds;
} sync_loop;

/* A synchronize (UM_ESTATE while the other thread has a bracket open, as
 * documented), and a wait for a copy of a buffer of its own, in turn. */
static void *synchronize_all_the_time(void *arg) {
  sync_loop *s = arg;
  cl_uint mine[64] = {7}, back[64];
  um_buffer *b = ub_alloc(s->m, s->d, sizeof(mine), UM_DEVICE);
  while (!atomic_load(&s->stop)) {
    um_event *ev;
    int st = um_device_synchronize(s->d);
    cr_assert(st == UM_OK || st == UM_ESTATE, "%s", um_last_error());
    cr_assert_eq(um_copy_from_host(b, 0, mine, sizeof(mine), &ev), UM_OK);
    cr_assert_eq(um_event_wait(ev), UM_OK, "%s", um_last_error());
    release_event(ev);
    cr_assert_eq(um_copy_to_host(b, 0, back, sizeof(back), NULL), UM_OK);
    cr_assert_arr_eq(back, mine, sizeof(mine));
    mine[0]++;
    atomic_fetch_add(&s->rounds, 1);
  }
  cr_assert_eq(um_release(b), UM_OK);
  return NULL;
}

OU_TEST_1_AND_2(opencl_queue, riders_beside_a_waiting_thread) {
  ou_env e = ou_open(NULL, 1);
  qdev k;
  cl_uint in[N], out[N];
  um_buffer *bin, *bout;
  sync_loop s = {.m = e.m, .d = NULL};
  pthread_t t;
  qdev_open(&k, e.dev[0]);
  s.d = k.d;
  atomic_init(&s.stop, 0);
  atomic_init(&s.rounds, 0);
  cr_assert_eq(pthread_create(&t, NULL, synchronize_all_the_time, &s), 0);
  /* 300 rounds, and at least 3 of the waiter's beside them */
  for (int it = 0; it < 300 || (atomic_load(&s.rounds) < 3 && it < 100000); it++) {
    um_event *down;
    open_riding_pair(&e, &k, in, &bin, &bout, (cl_uint)it);
    cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
    if (it % 2 == 0) { /* unimem's queue, a waiter's event */
      cr_assert_eq(um_copy_to_host(bout, 0, out, sizeof(out), &down), UM_OK);
      cr_assert_eq(um_event_wait(down), UM_OK, "%s", um_last_error());
      release_event(down);
    } else { /* released with nothing after the brackets; read by map */
      uint32_t *mapped;
      cr_assert_eq(um_map(bout, UM_MAP_READ, 0, sizeof(out), (void **)&mapped), UM_OK, "%s", um_last_error());
      memcpy(out, mapped, sizeof(out));
      cr_assert_eq(um_unmap(bout, mapped), UM_OK);
    }
    check_output(in, out, N);
    cr_assert_eq(um_release(bin), UM_OK);
    cr_assert_eq(um_release(bout), UM_OK);
  }
  atomic_store(&s.stop, 1);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_geq(atomic_load(&s.rounds), 3);
  qdev_close(&k);
  ou_close(&e);
}

/* A copy bound for the caller's queue that must wait for work elsewhere
 * first (a bracket of unimem's queues held open by the caller's event) is
 * queued there only once that work is done. A bracket begun on its
 * destination meanwhile gets no gate, which the queue would hold ahead of
 * the copy forever: begin waits for the copy, and the kernel needs no
 * event. */
static void *set_after_delay(void *arg) {
  usleep(50 * 1000);
  cr_assert_eq(clSetUserEventStatus((cl_event)arg, CL_COMPLETE), CL_SUCCESS);
  return NULL;
}

OU_TEST_1_AND_2(opencl_queue, a_copy_bound_for_the_queue_is_not_overtaken) {
  ou_env e;
  qdev k;
  cl_int err;
  cl_uint in[N], out[N];
  um_buffer *src, *mid, *dst;
  um_event *cp;
  cl_event hold;
  void *w = NULL;
  pthread_t t;
  skip_user_event_holds_on_basic();
  e = ou_open(NULL, 1);
  qdev_open(&k, e.dev[0]);
  fill_input(in, N, 31);
  src = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  mid = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  dst = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  cr_assert_eq(um_copy_from_host(src, 0, in, sizeof(in), NULL), UM_OK);
  hold = clCreateUserEvent((cl_context)k.nat.cl_context, &err);
  cr_assert_eq(err, CL_SUCCESS);
  cr_assert_eq(um_access_begin(src, UM_MAP_READ, &w), UM_OK); /* on unimem's queues */
  cr_assert_eq(um_access_end(src, hold), UM_OK);              /* done once hold is set */
  cr_assert_eq(um_queue_use(k.d, k.q), UM_OK);
  cr_assert_eq(um_copy(mid, 0, src, 0, sizeof(in), &cp), UM_OK); /* bound for k.q, after hold */
  cr_assert_eq(pthread_create(&t, NULL, set_after_delay, hold), 0);
  cr_assert_eq(um_access_begin(mid, UM_MAP_READ, &w), UM_OK, "%s", um_last_error());
  cr_assert_null(w, "the copy is queued on this queue by now, or done");
  cr_assert_eq(um_access_begin(dst, UM_MAP_WRITE_DISCARD, &w), UM_OK);
  enqueue_kernel(&k, k.q, mid, dst, N, 0, NULL, NULL);
  cr_assert_eq(um_access_end(mid, NULL), UM_OK);
  cr_assert_eq(um_access_end(dst, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(dst, 0, out, sizeof(out), NULL), UM_OK, "%s", um_last_error());
  check_output(in, out, N);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(um_event_wait(cp), UM_OK);
  release_event(cp);
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
  clReleaseEvent(hold);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_release(mid), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  qdev_close(&k);
  ou_close(&e);
}

/* Bad input: exact codes, and a refused call changes nothing. */
Test(opencl_queue, bad_queues) {
  ou_env e;
  qdev k;
  cl_int err;
  cl_command_queue ooo, extra[4];
  um_buffer *b;
  cl_uint in[16] = {1, 2, 3}, out[16];
  const cl_queue_properties ooo_props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, 0};
  ou_want_devices(2);
  e = ou_open(NULL, 1);
  qdev_open(&k, e.dev[0]);
  cr_assert_eq(um_queue_use(NULL, k.q), UM_EINVAL);
  cr_assert_eq(um_queue_use(um_device_get(e.m, 0), k.q), UM_ENOTSUP, "the cpu device has no queues");
  if (e.ndev > 1) {
    um_device_native other;
    cr_assert_eq(um_device_native_get(e.dev[1], &other), UM_OK);
    if (other.cl_context == k.nat.cl_context) {
      cr_assert_eq(um_queue_use(k.d, other.cl_queue), UM_EINVAL, "a queue of another device");
      cr_assert(strstr(um_last_error(), "another device") != NULL, "%s", um_last_error());
    }
  }
  ooo = clCreateCommandQueueWithProperties((cl_context)k.nat.cl_context, (cl_device_id)k.nat.cl_device,
                                           ooo_props, &err);
  if (ooo != NULL) {
    cr_assert_eq(um_queue_use(k.d, ooo), UM_ENOTSUP, "an out-of-order queue");
    clReleaseCommandQueue(ooo);
  }
  /* Four queues of the caller's: the device's caller queue and three more;
   * a fifth distinct one is refused, one already given is taken again. */
  cr_assert_eq(um_queue_use(k.d, k.q), UM_OK);
  for (int i = 0; i < 4; i++) {
    extra[i] = clCreateCommandQueueWithProperties((cl_context)k.nat.cl_context, (cl_device_id)k.nat.cl_device,
                                                  NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
  }
  for (int i = 0; i < 3; i++)
    cr_assert_eq(um_queue_use(k.d, extra[i]), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_queue_use(k.d, extra[3]), UM_ENOMEM);
  cr_assert_eq(um_queue_use(k.d, extra[1]), UM_OK);
  /* Still working, on extra[1] (retained by unimem until destroy). */
  b = ub_alloc(e.m, k.d, sizeof(in), UM_DEVICE);
  cr_assert_eq(um_copy_from_host(b, 0, in, sizeof(in), NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, out, sizeof(out), NULL), UM_OK);
  cr_assert_arr_eq(out, in, sizeof(in));
  cr_assert_eq(um_release(b), UM_OK);
  for (int i = 0; i < 4; i++)
    clReleaseCommandQueue(extra[i]);
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK);
  cr_assert_eq(um_queue_use(k.d, NULL), UM_OK, "going back twice is no error");
  qdev_close(&k);
  ou_close(&e);
}

/* One round trip of 16 words on d, checked (on the thread's queue of d
 * when one is set). */
static void round_trip(um_manager *m, um_device *d, cl_uint seed) {
  cl_uint in[16], out[16];
  um_buffer *b = ub_alloc(m, d, sizeof(in), UM_DEVICE);
  fill_input(in, 16, seed);
  memset(out, 0, sizeof(out));
  cr_assert_eq(um_copy_from_host(b, 0, in, sizeof(in), NULL), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_copy_to_host(b, 0, out, sizeof(out), NULL), UM_OK, "%s", um_last_error());
  cr_assert_arr_eq(out, in, sizeof(in));
  cr_assert_eq(um_release(b), UM_OK);
}

#define TEN 10

typedef struct ten_devices {
  ou_env e[TEN / 2];
  um_device *d[TEN];
  um_manager *m[TEN];
  void *q[TEN];
} ten_devices;

/* Five managers of two PoCL devices each: ten devices, each with its own
 * caller queue. */
static void ten_open(ten_devices *t) {
  ou_want_devices(2);
  for (int i = 0; i < TEN / 2; i++) {
    t->e[i] = ou_open(NULL, 2);
    for (int k = 0; k < 2; k++) {
      um_device_native nat;
      t->d[2 * i + k] = t->e[i].dev[k];
      t->m[2 * i + k] = t->e[i].m;
      cr_assert_eq(um_device_native_get(t->d[2 * i + k], &nat), UM_OK);
      t->q[2 * i + k] = nat.cl_queue;
    }
  }
}

static void ten_close(ten_devices *t) {
  for (int i = 0; i < TEN; i++)
    if (t->m[i] != NULL)
      cr_assert_eq(um_queue_use(t->d[i], NULL), UM_OK);
  for (int i = 0; i < TEN / 2; i++)
    if (t->e[i].m != NULL)
      ou_close(&t->e[i]);
}

static void set_first_eight(ten_devices *t) {
  for (int i = 0; i < 8; i++)
    cr_assert_eq(um_queue_use(t->d[i], t->q[i]), UM_OK, "device %d: %s", i, um_last_error());
  cr_assert_eq(um_queue_use(t->d[8], t->q[8]), UM_ENOMEM, "a ninth device while eight are set");
  cr_assert(strstr(um_last_error(), "at most 8 devices") != NULL, "%s", um_last_error());
}

/* A thread sets queues on at most 8 devices at once; one set back to NULL
 * makes room for another, and the device that gave its room up needs room
 * again to be set. */
Test(opencl_queue, a_ninth_device_one_off_first) {
  ten_devices t;
  ten_open(&t);
  set_first_eight(&t);
  cr_assert_eq(um_queue_use(t.d[3], NULL), UM_OK);
  cr_assert_eq(um_queue_use(t.d[8], t.q[8]), UM_OK, "room made by device 3: %s", um_last_error());
  round_trip(t.m[8], t.d[8], 8);
  round_trip(t.m[3], t.d[3], 3); /* on unimem's own queue again */
  cr_assert_eq(um_queue_use(t.d[9], t.q[9]), UM_ENOMEM, "eight set again");
  cr_assert_eq(um_queue_use(t.d[3], t.q[3]), UM_ENOMEM, "device 3's room was taken");
  /* Setting a device already set to its queue again takes no room. */
  cr_assert_eq(um_queue_use(t.d[8], t.q[8]), UM_OK);
  ten_close(&t);
}

/* All eight set back to NULL: any eight others may be set, and the first
 * ones come back in turn as rooms free. */
Test(opencl_queue, a_ninth_device_all_off_first) {
  ten_devices t;
  ten_open(&t);
  set_first_eight(&t);
  for (int i = 0; i < 8; i++)
    cr_assert_eq(um_queue_use(t.d[i], NULL), UM_OK);
  cr_assert_eq(um_queue_use(t.d[8], t.q[8]), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_queue_use(t.d[9], t.q[9]), UM_OK, "%s", um_last_error());
  for (int i = 0; i < 6; i++)
    cr_assert_eq(um_queue_use(t.d[i], t.q[i]), UM_OK, "device %d back: %s", i, um_last_error());
  cr_assert_eq(um_queue_use(t.d[6], t.q[6]), UM_ENOMEM, "eight set again");
  round_trip(t.m[9], t.d[9], 9);
  round_trip(t.m[0], t.d[0], 10);
  ten_close(&t);
}

/* A manager the thread destroys gives its devices' rooms back. */
Test(opencl_queue, a_destroyed_managers_devices_make_room) {
  ten_devices t;
  ten_open(&t);
  set_first_eight(&t);
  ou_close(&t.e[1]); /* devices 2 and 3 */
  t.m[2] = t.m[3] = NULL;
  cr_assert_eq(um_queue_use(t.d[8], t.q[8]), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_queue_use(t.d[9], t.q[9]), UM_OK, "%s", um_last_error());
  round_trip(t.m[8], t.d[8], 8);
  round_trip(t.m[9], t.d[9], 9);
  round_trip(t.m[0], t.d[0], 0); /* the others' queues still in use */
  /* A new manager's devices are new devices: no room is left for them. */
  t.e[1] = ou_open(NULL, 2);
  cr_assert_eq(um_queue_use(t.e[1].dev[0], NULL), UM_OK, "NULL on a device never set");
  {
    um_device_native nat;
    cr_assert_eq(um_device_native_get(t.e[1].dev[0], &nat), UM_OK);
    cr_assert_eq(um_queue_use(t.e[1].dev[0], nat.cl_queue), UM_ENOMEM, "eight set");
  }
  ten_close(&t);
}
