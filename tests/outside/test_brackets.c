/* Access brackets seen from outside: calls that would wait through an open
 * bracket, on any device of the profile.
 *
 * A chain of length k: buffer 0 is bracketed, and k asynchronous copies
 * follow it, 0 -> 1 -> ... -> k, alternating between the profile's
 * accelerator and the cpu device. Every blocking call on the chain's last
 * buffer would wait for the bracket's um_access_end: it answers UM_ESTATE
 * at once, whatever k (k = 0 is the bracketed buffer itself). */
#include "outside.h"

#include <stdbool.h>

#include <unimem_dlpack.h>

#ifdef OS_HAVE_OPENCL
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#endif

#define CHAIN_BYTES 4096
#define CHAIN_MAX 3
#define BOUND_MS 10000u

static bool os_has_accelerator(um_manager *m) { return um_device_count(m) > 1; }

/* ------------------------------------------------------------------------ */
/* Chains */

typedef struct chain {
  um_manager *m;
  int len;
  um_buffer *b[CHAIN_MAX + 1]; /* b[0] is bracketed */
  um_event *ev[CHAIN_MAX];     /* ev[i]: the copy b[i] -> b[i + 1] */
  bool open;
} chain;

/* Buffer i of a chain: on the accelerator for even i, the cpu device for
 * odd i (both the cpu device on the cpu profile). */
static um_device *chain_device(um_manager *m, int i) { return i % 2 == 0 ? os_device(m) : um_device_get(m, 0); }

/* Open a chain of len copies behind a bracket on b[0]; tail, when not
 * NULL, is its last buffer instead of a new one (a wrap). */
static void chain_open(chain *c, um_manager *m, int len, um_buffer *tail) {
  unsigned char pattern[CHAIN_BYTES];
  void *wait = NULL;
  memset(c, 0, sizeof(*c));
  c->m = m;
  c->len = len;
  for (int i = 0; i <= len; i++) {
    if (i == len && tail != NULL && len > 0) {
      c->b[i] = tail;
      continue;
    }
    cr_assert_eq(um_alloc(m, chain_device(m, i), CHAIN_BYTES, i % 2 == 0 ? os_location() : UM_HOST, 0, &c->b[i]),
                 UM_OK);
  }
  os_pattern(pattern, sizeof(pattern), 11);
  cr_assert_eq(um_copy_from_host(c->b[0], 0, pattern, sizeof(pattern), NULL), UM_OK);
  cr_assert_eq(um_access_begin(c->b[0], UM_MAP_READ_WRITE, &wait), UM_OK, "%s", um_last_error());
  c->open = true;
  for (int i = 0; i < len; i++)
    cr_assert_eq(um_copy(c->b[i + 1], 0, c->b[i], 0, CHAIN_BYTES, &c->ev[i]), UM_OK, "copy %d: %s", i,
                 um_last_error());
  if (len > 0)
    cr_assert_eq(um_event_query(c->ev[len - 1]), UM_EAGAIN, "the chain's last copy waits for the bracket");
}

static um_buffer *chain_tail(const chain *c) { return c->b[c->len]; }

typedef struct wait_arg {
  um_event *e;
} wait_arg;

static int call_event_wait(void *p) { return um_event_wait(((wait_arg *)p)->e); }

static void chain_end(chain *c) {
  if (c->open)
    cr_assert_eq(um_access_end(c->b[0], NULL), UM_OK, "%s", um_last_error());
  c->open = false;
}

/* End the bracket, check every copy and the tail's bytes, release all
 * (keep_tail: not the tail, the caller's). */
static void chain_close(chain *c, bool keep_tail) {
  unsigned char out[CHAIN_BYTES];
  chain_end(c);
  for (int i = 0; i < c->len; i++) {
    wait_arg w = {c->ev[i]};
    int st = os_bounded(call_event_wait, &w, BOUND_MS, "um_event_wait after the bracket's end");
    cr_assert_eq(st, UM_OK, "copy %d: %s", i, um_err_name(st));
    cr_assert_eq(um_event_release(c->ev[i]), UM_OK);
  }
  cr_assert_eq(um_copy_to_host(chain_tail(c), 0, out, sizeof(out), NULL), UM_OK);
  cr_assert_eq(os_pattern_diff(out, sizeof(out), 11), SIZE_MAX, "the chain's bytes arrived");
  for (int i = 0; i <= c->len; i++)
    if (!(keep_tail && i == c->len))
      cr_assert_eq(um_release(c->b[i]), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* The blocking calls */

typedef enum {
  CALL_TO_HOST,
  CALL_FROM_HOST,
  CALL_FILL,
  CALL_COPY_FROM,
  CALL_COPY_INTO,
  CALL_BATCH,
  CALL_MAP,
  CALL_DLPACK,
  CALL_STREAM,
  CALL_SYNCHRONIZE,
  CALL_COUNT
} call_kind;

static const char *const call_names[CALL_COUNT] = {
    "um_copy_to_host",     "um_copy_from_host", "um_fill",   "um_copy (from it)", "um_copy (into it)",
    "um_copy_batch",       "um_map",            "um_dlpack_export", "um_stream",  "um_device_synchronize"};

typedef struct call_arg {
  call_kind kind;
  um_manager *m;
  um_buffer *t;     /* the buffer the call waits on */
  um_buffer *other; /* a fresh buffer for the copies */
  unsigned char host[CHAIN_BYTES];
} call_arg;

static int count_chunk(void *user, um_buffer *chunk, size_t off, size_t bytes) {
  (void)user, (void)chunk, (void)off, (void)bytes;
  return 0;
}

static int call_blocking(void *p) {
  call_arg *a = p;
  void *mapped = NULL, *tensor = NULL;
  int64_t shape = CHAIN_BYTES;
  um_copy_op op;
  int st;
  switch (a->kind) {
  case CALL_TO_HOST:
    return um_copy_to_host(a->t, 0, a->host, CHAIN_BYTES, NULL);
  case CALL_FROM_HOST:
    return um_copy_from_host(a->t, 0, a->host, CHAIN_BYTES, NULL);
  case CALL_FILL:
    return um_fill(a->t, 0, 7, CHAIN_BYTES, NULL);
  case CALL_COPY_FROM:
    return um_copy(a->other, 0, a->t, 0, CHAIN_BYTES, NULL);
  case CALL_COPY_INTO:
    return um_copy(a->t, 0, a->other, 0, CHAIN_BYTES, NULL);
  case CALL_BATCH:
    memset(&op, 0, sizeof(op));
    op.src = a->t;
    op.host_dst = a->host;
    op.bytes = CHAIN_BYTES;
    return um_copy_batch(a->m, &op, 1, NULL);
  case CALL_MAP:
    if ((st = um_map(a->t, UM_MAP_READ, 0, CHAIN_BYTES, &mapped)) == UM_OK)
      um_unmap(a->t, mapped);
    return st;
  case CALL_DLPACK:
    if ((st = um_dlpack_export(a->t, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, 0, &tensor)) == UM_OK)
      ((um_dl_managed_tensor *)tensor)->deleter(tensor);
    return st;
  case CALL_STREAM:
    return um_stream(a->t, 0, CHAIN_BYTES, os_device(a->m), CHAIN_BYTES / 2, count_chunk, NULL, NULL);
  case CALL_SYNCHRONIZE:
    return um_device_synchronize(um_buffer_device(a->t));
  default:
    return UM_EINVAL;
  }
}

/* Every blocking call on the tail of a chain of len copies: UM_ESTATE,
 * within the bound, and the chain's bytes all arrive once it ends. */
static void check_chain(int len) {
  um_manager *m = os_manager();
  call_arg *a = calloc(1, sizeof(*a)); /* leaked on a hang: the call's thread may still use it */
  chain c;
  cr_assert_not_null(a);
  chain_open(&c, m, len, NULL);
  a->m = m;
  a->t = chain_tail(&c);
  cr_assert_eq(um_alloc(m, os_device(m), CHAIN_BYTES, os_location(), 0, &a->other), UM_OK);
  for (int k = 0; k < CALL_COUNT; k++) {
    char what[96];
    int st;
    a->kind = (call_kind)k;
    snprintf(what, sizeof(what), "%s behind a chain of %d through a bracket", call_names[k], len);
    st = os_bounded(call_blocking, a, BOUND_MS, what);
    cr_assert_eq(st, UM_ESTATE, "%s: %s (%s)", what, um_err_name(st), um_last_error());
  }
  cr_assert_eq(um_release(a->other), UM_OK);
  free(a);
  chain_close(&c, false);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(brackets, blocking_calls_on_the_bracketed_buffer, .timeout = 120) { check_chain(0); }
Test(brackets, blocking_calls_through_a_chain_of_1, .timeout = 120) { check_chain(1); }
Test(brackets, blocking_calls_through_a_chain_of_2, .timeout = 120) { check_chain(2); }
Test(brackets, blocking_calls_through_a_chain_of_3, .timeout = 120) { check_chain(3); }

/* ------------------------------------------------------------------------ */
/* um_device_synchronize */

typedef struct sync_arg {
  um_device *d;
} sync_arg;

static int call_synchronize(void *p) { return um_device_synchronize(((sync_arg *)p)->d); }

/* um_device_synchronize on a device while a bracket is open on one of its
 * buffers: the bracket's end is the caller's to give, so the call is
 * refused (UM_ESTATE) instead of waiting for it. */
Test(brackets, synchronize_with_a_bracket_open, .timeout = 60) {
  um_manager *m = os_manager();
  um_device *d = os_device(m);
  um_buffer *b;
  void *wait_native = NULL;
  sync_arg a = {d};
  int st;
  cr_assert_eq(um_alloc(m, d, 4096, os_location(), 0, &b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait_native), UM_OK);
  st = os_bounded(call_synchronize, &a, BOUND_MS, "um_device_synchronize inside a bracket");
  cr_assert_eq(st, UM_ESTATE, "um_device_synchronize: %s", um_err_name(st));
  cr_assert_eq(um_access_end(b, NULL), UM_OK);
  cr_assert_eq(um_device_synchronize(d), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A bracket (and a copy behind it) on one device does not stop another
 * device's synchronize, which still waits for that device's own work. */
Test(brackets, synchronize_of_another_device, .timeout = 60) {
  um_manager *m = os_manager();
  um_device *dev[2];
  if (!os_has_accelerator(m)) {
    um_manager_destroy(m);
    cr_skip_test("profile %s has one device", os_profile());
  }
  dev[0] = um_device_get(m, 0);
  dev[1] = os_device(m);
  for (int side = 0; side < 2; side++) {
    um_device *br = dev[side], *other = dev[side ^ 1];
    um_buffer *x, *y, *z;
    um_event *behind, *fill;
    void *wait_native = NULL;
    sync_arg a = {other};
    int st;
    cr_assert_eq(um_alloc(m, br, 1 << 16, br == dev[0] ? UM_HOST : os_location(), 0, &x), UM_OK);
    cr_assert_eq(um_alloc(m, br, 1 << 16, br == dev[0] ? UM_HOST : os_location(), 0, &y), UM_OK);
    cr_assert_eq(um_alloc(m, other, 1 << 20, other == dev[0] ? UM_HOST : os_location(), 0, &z), UM_OK);
    cr_assert_eq(um_access_begin(x, UM_MAP_READ_WRITE, &wait_native), UM_OK);
    cr_assert_eq(um_copy(y, 0, x, 0, 1 << 16, &behind), UM_OK);
    cr_assert_eq(um_fill(z, 0, 3, 1 << 20, &fill), UM_OK);
    st = os_bounded(call_synchronize, &a, BOUND_MS, "um_device_synchronize of the other device");
    cr_assert_eq(st, UM_OK, "side %d: %s (%s)", side, um_err_name(st), um_last_error());
    cr_assert_eq(um_event_query(fill), UM_OK, "the other device's fill is done");
    cr_assert_eq(um_event_query(behind), UM_EAGAIN, "the copy behind the bracket still waits");
    a.d = br;
    cr_assert_eq(os_bounded(call_synchronize, &a, BOUND_MS, "um_device_synchronize of the bracket's device"),
                 UM_ESTATE);
    cr_assert_eq(um_access_end(x, NULL), UM_OK);
    cr_assert_eq(os_bounded(call_synchronize, &a, BOUND_MS, "um_device_synchronize after the end"), UM_OK);
    cr_assert_eq(um_event_query(behind), UM_OK);
    cr_assert_eq(um_event_release(behind), UM_OK);
    cr_assert_eq(um_event_release(fill), UM_OK);
    cr_assert_eq(um_release(x), UM_OK);
    cr_assert_eq(um_release(y), UM_OK);
    cr_assert_eq(um_release(z), UM_OK);
  }
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* ------------------------------------------------------------------------ */
/* A wrap's release, um_event_wait, um_manager_destroy */

typedef struct release_arg {
  um_buffer *b;
} release_arg;

static int call_release(void *p) { return um_release(((release_arg *)p)->b); }

/* A wrap's release waits for its operations (the caller frees the memory
 * next): through a bracket it is refused and the wrap stays live. */
static void check_wrap_release(int len) {
  um_manager *m = os_manager();
  void *mem = aligned_alloc(64, CHAIN_BYTES);
  um_buffer *w;
  release_arg r;
  chain c;
  int st;
  cr_assert_not_null(mem);
  cr_assert_eq(um_wrap_host(m, mem, CHAIN_BYTES, 0, &w), UM_OK);
  chain_open(&c, m, len, w);
  r.b = w;
  st = os_bounded(call_release, &r, BOUND_MS, "um_release of a wrap behind a bracket");
  cr_assert_eq(st, UM_ESTATE, "um_release: %s", um_err_name(st));
  cr_assert_eq(um_buffer_size(w), CHAIN_BYTES, "the wrap is still live");
  chain_close(&c, true);
  cr_assert_eq(os_pattern_diff(mem, CHAIN_BYTES, 11), SIZE_MAX);
  cr_assert_eq(os_bounded(call_release, &r, BOUND_MS, "um_release of the wrap after the end"), UM_OK);
  free(mem);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(brackets, wrap_release_through_a_chain_of_1, .timeout = 60) { check_wrap_release(1); }
Test(brackets, wrap_release_through_a_chain_of_3, .timeout = 60) { check_wrap_release(3); }

typedef struct ender {
  um_buffer *b;
  unsigned delay_ms;
  atomic_int status;
} ender;

static void *end_later(void *p) {
  ender *e = p;
  os_sleep_ms(e->delay_ms);
  atomic_store(&e->status, um_access_end(e->b, NULL));
  return NULL;
}

/* um_event_wait may wait through a bracket: it returns once another thread
 * ends it (the header says so; on the bracket's own thread it would not). */
Test(brackets, event_wait_through_a_bracket_ended_elsewhere, .timeout = 60) {
  um_manager *m = os_manager();
  ender e = {NULL, 200, -100};
  pthread_t t;
  wait_arg w;
  chain c;
  int st;
  chain_open(&c, m, 2, NULL);
  e.b = c.b[0];
  w.e = c.ev[1];
  cr_assert_eq(pthread_create(&t, NULL, end_later, &e), 0);
  st = os_bounded(call_event_wait, &w, BOUND_MS, "um_event_wait while another thread ends the bracket");
  cr_assert_eq(st, UM_OK, "um_event_wait: %s", um_err_name(st));
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&e.status), UM_OK);
  c.open = false;
  chain_close(&c, false);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

typedef struct destroy_arg {
  um_manager *m;
  atomic_int done;
  int status;
} destroy_arg;

static int call_destroy(void *p) { return um_manager_destroy(((destroy_arg *)p)->m); }

/* um_manager_destroy ends the brackets left open, so the chains behind
 * them finish, and returns (the buffers are leaks). */
Test(brackets, destroy_with_chains_open, .timeout = 60) {
  um_manager *m = os_manager();
  destroy_arg d = {m, 0, 0};
  chain c[2];
  int st;
  chain_open(&c[0], m, 3, NULL);
  chain_open(&c[1], m, 1, NULL);
  /* Released (which does not wait): an event never released keeps its
   * native event past destroy, a leak of its own. */
  for (int j = 0; j < 2; j++)
    for (int i = 0; i < c[j].len; i++)
      cr_assert_eq(um_event_release(c[j].ev[i]), UM_OK);
  st = os_bounded(call_destroy, &d, BOUND_MS, "um_manager_destroy with brackets open");
  cr_assert_eq(st, UM_ELEAK, "um_manager_destroy: %s", um_err_name(st));
}

/* ------------------------------------------------------------------------ */
/* The done event of um_access_end */

/* What the caller passes as the done event must be one: other native
 * handles of the device answer UM_EINVAL and leave the bracket open. */
Test(brackets, done_event_that_is_not_an_event, .timeout = 60) {
  um_manager *m = os_manager();
  um_device *d = os_device(m);
  um_device_native dn;
  um_buffer_native bn;
  um_buffer *b;
  void *wait_native = NULL;
  cr_assert_eq(um_alloc(m, d, 4096, os_location(), 0, &b), UM_OK);
  cr_assert_eq(um_device_native_get(d, &dn), UM_OK);
  cr_assert_eq(um_buffer_native_get(b, &bn), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait_native), UM_OK);
  if (os_has_accelerator(m)) {
    void *const not_events[] = {bn.cl_mem, dn.cl_queue, dn.cl_context, dn.cl_device};
    for (size_t i = 0; i < sizeof(not_events) / sizeof(not_events[0]); i++) {
      cr_assert_not_null(not_events[i]);
      cr_assert_eq(um_access_end(b, not_events[i]), UM_EINVAL, "handle %zu as the done event: %s", i,
                   um_last_error());
    }
  } else {
    cr_assert_eq(um_access_end(b, (void *)b), UM_EINVAL, "the cpu device takes no done event");
  }
  cr_assert_eq(um_access_end(b, NULL), UM_OK, "the bracket stayed open");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

#ifdef OS_HAVE_OPENCL
static void *destroy_thread(void *p) {
  destroy_arg *d = p;
  d->status = um_manager_destroy(d->m);
  atomic_store(&d->done, 1);
  return NULL;
}

/* um_manager_destroy waits for the caller's done event of a bracket (the
 * header says so): an OpenCL user event not set keeps it waiting; once
 * the caller sets it, destroy returns. */
Test(brackets, destroy_waits_for_the_callers_done_event, .timeout = 60) {
  um_manager *m = os_manager();
  um_device_native dn;
  um_buffer *b;
  destroy_arg d = {m, 0, -100};
  void *wait_native = NULL;
  cl_event user;
  cl_int err = CL_SUCCESS;
  pthread_t t;
  uint64_t end;
  if (!os_has_accelerator(m)) {
    um_manager_destroy(m);
    cr_skip_test("profile %s has no OpenCL device", os_profile());
  }
  cr_assert_eq(um_device_native_get(os_device(m), &dn), UM_OK);
  user = clCreateUserEvent((cl_context)dn.cl_context, &err);
  cr_assert(user != NULL && err == CL_SUCCESS, "clCreateUserEvent: %d", err);
  cr_assert_eq(um_alloc(m, os_device(m), 4096, os_location(), 0, &b), UM_OK);
  cr_assert_eq(um_access_begin(b, UM_MAP_READ_WRITE, &wait_native), UM_OK);
  cr_assert_eq(um_access_end(b, user), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(pthread_create(&t, NULL, destroy_thread, &d), 0);
  os_sleep_ms(300);
  cr_assert_eq(atomic_load(&d.done), 0, "um_manager_destroy returned with the done event not set");
  cr_assert_eq(clSetUserEventStatus(user, CL_COMPLETE), CL_SUCCESS);
  end = os_now_ms() + BOUND_MS;
  while (!atomic_load(&d.done) && os_now_ms() < end)
    os_sleep_ms(2);
  cr_assert_eq(atomic_load(&d.done), 1, "um_manager_destroy did not return once the done event was set");
  pthread_join(t, NULL);
  cr_assert_eq(d.status, UM_OK, "um_manager_destroy: %s", um_err_name(d.status));
  clReleaseEvent(user);
}
#endif

/* ------------------------------------------------------------------------ */
/* Many brackets, and brackets that follow one another */

#define MANY 70 /* beyond the brackets that the library tells apart at once */

/* With many brackets open at once, a blocking call waits through none of
 * them is still served, and one behind any of them (the first, the last)
 * is refused; all of them ended, nothing is refused. */
Test(brackets, many_brackets_open, .timeout = 120) {
  um_manager *m = os_manager();
  um_device *d = os_device(m);
  um_buffer *b[MANY], *behind[2], *free_buf;
  um_event *ev[2];
  unsigned char host[256];
  void *wait_native = NULL;
  for (int i = 0; i < MANY; i++) {
    cr_assert_eq(um_alloc(m, d, 256, os_location(), 0, &b[i]), UM_OK);
    cr_assert_eq(um_access_begin(b[i], UM_MAP_READ_WRITE, &wait_native), UM_OK, "bracket %d", i);
  }
  cr_assert_eq(um_alloc(m, d, 256, os_location(), 0, &free_buf), UM_OK);
  for (int j = 0; j < 2; j++) {
    cr_assert_eq(um_alloc(m, d, 256, os_location(), 0, &behind[j]), UM_OK);
    cr_assert_eq(um_copy(behind[j], 0, b[j == 0 ? 0 : MANY - 1], 0, 256, &ev[j]), UM_OK);
  }
  cr_assert_eq(um_copy_to_host(free_buf, 0, host, sizeof(host), NULL), UM_OK, "%s", um_last_error());
  for (int j = 0; j < 2; j++)
    cr_assert_eq(um_copy_to_host(behind[j], 0, host, sizeof(host), NULL), UM_ESTATE, "behind bracket %d",
                 j == 0 ? 0 : MANY - 1);
  for (int i = 0; i < MANY; i++)
    cr_assert_eq(um_access_end(b[i], NULL), UM_OK);
  for (int j = 0; j < 2; j++) {
    wait_arg w = {ev[j]};
    cr_assert_eq(os_bounded(call_event_wait, &w, BOUND_MS, "the copy behind a bracket"), UM_OK);
    cr_assert_eq(um_copy_to_host(behind[j], 0, host, sizeof(host), NULL), UM_OK);
    cr_assert_eq(um_event_release(ev[j]), UM_OK);
    cr_assert_eq(um_release(behind[j]), UM_OK);
  }
  for (int i = 0; i < MANY; i++)
    cr_assert_eq(um_release(b[i]), UM_OK);
  cr_assert_eq(um_release(free_buf), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

#ifdef OS_HAVE_OPENCL
typedef struct copy_arg {
  um_buffer *b;
  unsigned char host[CHAIN_BYTES];
  atomic_int done;
  int status;
} copy_arg;

static void *blocking_copy_thread(void *p) {
  copy_arg *a = p;
  a->status = um_copy_to_host(a->b, 0, a->host, CHAIN_BYTES, NULL);
  atomic_store(&a->done, 1);
  return NULL;
}

/* A copy queued behind a bracket that has ended, but whose done event is
 * not set yet, waits for device work, not for an open bracket, even once
 * later brackets open: a blocking call behind it waits, and returns when
 * the event is set. */
Test(brackets, ended_bracket_then_later_brackets, .timeout = 60) {
  um_manager *m = os_manager();
  um_device_native dn;
  um_buffer *x, *y, *later[4];
  um_event *ev;
  void *wait_native = NULL;
  copy_arg *a = calloc(1, sizeof(*a)); /* leaked on a hang */
  pthread_t t;
  cl_event user;
  cl_int err = CL_SUCCESS;
  uint64_t end;
  cr_assert_not_null(a);
  if (!os_has_accelerator(m)) {
    um_manager_destroy(m);
    cr_skip_test("profile %s has no OpenCL device", os_profile());
  }
  cr_assert_eq(um_device_native_get(os_device(m), &dn), UM_OK);
  user = clCreateUserEvent((cl_context)dn.cl_context, &err);
  cr_assert(user != NULL && err == CL_SUCCESS, "clCreateUserEvent: %d", err);
  cr_assert_eq(um_alloc(m, os_device(m), CHAIN_BYTES, os_location(), 0, &x), UM_OK);
  cr_assert_eq(um_alloc(m, os_device(m), CHAIN_BYTES, os_location(), 0, &y), UM_OK);
  cr_assert_eq(um_access_begin(x, UM_MAP_READ_WRITE, &wait_native), UM_OK);
  cr_assert_eq(um_copy(y, 0, x, 0, CHAIN_BYTES, &ev), UM_OK);
  cr_assert_eq(um_access_end(x, user), UM_OK, "%s", um_last_error());
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(um_alloc(m, os_device(m), 256, os_location(), 0, &later[i]), UM_OK);
    cr_assert_eq(um_access_begin(later[i], UM_MAP_READ_WRITE, &wait_native), UM_OK);
  }
  a->b = y;
  cr_assert_eq(pthread_create(&t, NULL, blocking_copy_thread, a), 0);
  os_sleep_ms(200);
  cr_assert_eq(atomic_load(&a->done), 0, "the blocking copy returned (%s) with the done event not set",
               um_err_name(a->status));
  cr_assert_eq(clSetUserEventStatus(user, CL_COMPLETE), CL_SUCCESS);
  end = os_now_ms() + BOUND_MS;
  while (!atomic_load(&a->done) && os_now_ms() < end)
    os_sleep_ms(2);
  cr_assert_eq(atomic_load(&a->done), 1, "the blocking copy did not return once the done event was set");
  pthread_join(t, NULL);
  cr_assert_eq(a->status, UM_OK, "%s", um_err_name(a->status));
  free(a);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(um_access_end(later[i], NULL), UM_OK);
    cr_assert_eq(um_release(later[i]), UM_OK);
  }
  cr_assert_eq(um_event_release(ev), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  clReleaseEvent(user);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
#endif
