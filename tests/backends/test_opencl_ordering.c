/* Ordering of mixed asynchronous operations on OpenCL buffers: writes,
 * fills, device-local copies (also within one buffer), peer and staged
 * copies, reads into host memory. The bytes at the end, and those every
 * read saw, equal a model that applies the same operations one after the
 * other. Two mechanisms keep the order, and each test shows which one ran:
 * the native wait list of one device's queue (every operation is handed to
 * the device at once: none is ever QUEUED), and registration with the
 * earlier operation (the later one is QUEUED until a worker starts it). */
#include "opencl_util.h"

#define N (256u * 1024u + 77u)
#define MAX_OPS 64

typedef struct model {
  unsigned char *bytes[2]; /* the two buffers' expected contents */
  unsigned char *reads[MAX_OPS];  /* what each read got */
  unsigned char *expect[MAX_OPS]; /* and what it should have got */
  size_t read_len[MAX_OPS];
  int nreads;
  unsigned char *sources[MAX_OPS]; /* host sources of asynchronous writes */
  int nsources;
  um_event *ev[MAX_OPS];
  int nev;
} model;

/* The model starts from zeros, and so do the buffers (a device buffer's
 * first bytes are whatever the driver left there). */
static void model_init(model *md, um_buffer *b0, um_buffer *b1) {
  memset(md, 0, sizeof(*md));
  for (int i = 0; i < 2; i++) {
    md->bytes[i] = ub_malloc(N);
    memset(md->bytes[i], 0, N);
  }
  cr_assert_eq(um_fill(b0, 0, 0, N, NULL), UM_OK);
  cr_assert_eq(um_fill(b1, 0, 0, N, NULL), UM_OK);
}

static void keep(model *md, um_event *e) {
  cr_assert_lt(md->nev, MAX_OPS);
  md->ev[md->nev++] = e;
}

static void op_write(model *md, um_buffer *b, int which, size_t off, size_t len, unsigned seed) {
  unsigned char *src = ub_malloc(len); /* freed at the end: async source */
  um_event *e = NULL;
  ub_pattern(src, len, seed);
  memcpy(md->bytes[which] + off, src, len);
  cr_assert_eq(um_copy_from_host(b, off, src, len, &e), UM_OK, "%s", um_last_error());
  keep(md, e);
  cr_assert_lt(md->nsources, MAX_OPS);
  md->sources[md->nsources++] = src;
}

static void op_fill(model *md, um_buffer *b, int which, size_t off, size_t len, int value) {
  um_event *e = NULL;
  memset(md->bytes[which] + off, value, len);
  cr_assert_eq(um_fill(b, off, value, len, &e), UM_OK, "%s", um_last_error());
  keep(md, e);
}

static void op_copy(model *md, um_buffer *dst, int dw, size_t doff, um_buffer *src, int sw, size_t soff,
                    size_t len) {
  um_event *e = NULL;
  memmove(md->bytes[dw] + doff, md->bytes[sw] + soff, len);
  cr_assert_eq(um_copy(dst, doff, src, soff, len, &e), UM_OK, "%s", um_last_error());
  keep(md, e);
}

static void op_read(model *md, um_buffer *b, int which, size_t off, size_t len) {
  unsigned char *dst = ub_malloc(len), *want = ub_malloc(len);
  um_event *e = NULL;
  memset(dst, 0xEE, len);
  memcpy(want, md->bytes[which] + off, len);
  cr_assert_eq(um_copy_to_host(b, off, dst, len, &e), UM_OK, "%s", um_last_error());
  keep(md, e);
  cr_assert_lt(md->nreads, MAX_OPS);
  md->reads[md->nreads] = dst;
  md->expect[md->nreads] = want;
  md->read_len[md->nreads++] = len;
}

/* Wait for everything, then compare what every read saw (the model's
 * bytes at its place in the order) and both buffers. */
static void model_check(model *md, um_buffer *b0, um_buffer *b1) {
  for (int i = 0; i < md->nev; i++)
    ub_wait(md->ev[i], UM_OK);
  for (int i = 0; i < md->nreads; i++)
    ub_assert_bytes(md->reads[i], md->expect[i], md->read_len[i], "read %d", i);
  {
    unsigned char *got = ub_read_all(b0);
    ub_assert_bytes(got, md->bytes[0], N, "buffer 0 at the end");
    free(got);
  }
  if (b1 != NULL) {
    unsigned char *got = ub_read_all(b1);
    ub_assert_bytes(got, md->bytes[1], N, "buffer 1 at the end");
    free(got);
  }
}

static void model_free(model *md) {
  for (int i = 0; i < md->nreads; i++) {
    free(md->reads[i]);
    free(md->expect[i]);
  }
  for (int i = 0; i < md->nsources; i++)
    free(md->sources[i]);
  free(md->bytes[0]);
  free(md->bytes[1]);
}

/* ------------------------------------------------------------------------ */

/* One device, one buffer (and a second on the same device for copies):
 * every operation is native, ordered by the device's queue. */
OU_TEST_1_AND_2(opencl_ordering, one_device_through_the_native_queue) {
  ou_env e = ou_open(NULL, 1);
  um_buffer *a = ub_alloc(e.m, e.dev[0], N, UM_DEVICE), *b = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  model md;
  model_init(&md, a, b);
  for (int round = 0; round < 3; round++) {
    int first = md.nev;
    op_fill(&md, a, 0, 0, N, 0x10 + round);
    op_write(&md, a, 0, 1000 + round, 50000, 1 + (unsigned)round);
    op_fill(&md, a, 0, 20000, 7001, 0x7F);
    op_copy(&md, b, 1, 3, a, 0, 999, 60000);           /* a -> b */
    op_write(&md, a, 0, 30001, 4096, 40 + (unsigned)round);
    op_copy(&md, a, 0, 200000, a, 0, 1000, 50000);     /* within a, disjoint */
    op_read(&md, a, 0, 0, N);
    op_copy(&md, a, 0, 100000, b, 1, 0, 70000);        /* b -> a */
    op_fill(&md, b, 1, 5, 100, 0xC3);
    op_read(&md, b, 1, 0, N);
    op_write(&md, a, 0, N - 4097, 4097, 60 + (unsigned)round);
    op_read(&md, a, 0, 0, N);
    /* The device orders them: none waited in the core's queue. */
    for (int i = first; i < md.nev; i++)
      cr_assert_neq(ou_event_state(md.ev[i]), UM__EV_QUEUED, "operation %d was queued in the core", i);
  }
  model_check(&md, a, b);
  model_free(&md);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* Two devices with peer access: a peer copy runs on the destination's
 * queue, so it waits for the source's earlier operations by registration;
 * what follows on its queue is ordered natively again. */
Test(opencl_ordering, two_devices_through_registration) {
  ou_env e;
  um_buffer *a, *b;
  model md;
  ou_want_two_devices();
  e = ou_open(NULL, 2);
  a = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  b = ub_alloc(e.m, e.dev[1], N, UM_DEVICE);
  model_init(&md, a, b);
  for (int round = 0; round < 3; round++) {
    op_fill(&md, a, 0, 0, N, 0x21 + round);
    op_write(&md, a, 0, 77, N - 200, 5 + (unsigned)round);  /* a long write on device 0 */
    op_fill(&md, b, 1, 0, N, 0x31);
    op_copy(&md, b, 1, 11, a, 0, 33, N - 100);             /* peer, after both */
    op_fill(&md, b, 1, 1000, 3000, 0x99);                  /* after the peer copy */
    op_read(&md, b, 1, 0, N);
    op_copy(&md, a, 0, 0, b, 1, 500, 100000);              /* peer back to a */
    op_write(&md, a, 0, 50, 10, 70 + (unsigned)round);
  }
  model_check(&md, a, b);
  model_free(&md);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* Operations behind a worker-run copy (pipelined staging forced) wait for
 * it by registration: while a worker holds the copy, what was issued
 * after it is QUEUED, and runs in order once the copy finishes. */
OU_TEST_1_AND_2(opencl_ordering, behind_a_worker_run_copy) {
  um_options o;
  ou_env e;
  um_buffer *a, *b;
  model md;
  int first;
  ou_options(&o);
  o.use_pinned_staging = 2;
  o.staging_chunk_bytes = 16 * 1024;
  e = ou_open(&o, 1);
  a = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  b = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  model_init(&md, a, b);
  op_fill(&md, b, 1, 0, N, 0x01);
  ou_gate_install(e.m, 0);
  op_write(&md, a, 0, 0, N, 90); /* pipelined: a worker runs it */
  ou_gate_wait_entered(1);
  cr_assert_eq(ou_event_state(md.ev[md.nev - 1]), UM__EV_RUNNING);
  first = md.nev;
  op_fill(&md, a, 0, 100, 1000, 0x55);
  op_copy(&md, b, 1, 7, a, 0, 0, 10000);
  op_write(&md, a, 0, 5, 20, 91);
  op_read(&md, a, 0, 0, N);
  op_copy(&md, a, 0, 200000, a, 0, 0, 50000);
  for (int i = first; i < md.nev; i++)
    cr_assert_eq(ou_event_state(md.ev[i]), UM__EV_QUEUED, "operation %d should wait behind the copy", i);
  cr_assert_eq(um_event_query(md.ev[first]), UM_EAGAIN);
  ou_gate_open();
  model_check(&md, a, b);
  model_free(&md);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* Staged copies between two devices without peer access run on workers;
 * operations on both buffers around them keep their order. */
Test(opencl_ordering, around_staged_copies) {
  um_options o;
  ou_env e;
  um_buffer *a, *b;
  model md;
  ou_options(&o);
  o.enable_peer = 0;
  o.staging_chunk_bytes = 32 * 1024;
  ou_want_two_devices();
  e = ou_open(&o, 2);
  a = ub_alloc(e.m, e.dev[0], N, UM_DEVICE);
  b = ub_alloc(e.m, e.dev[1], N, UM_DEVICE);
  model_init(&md, a, b);
  for (int round = 0; round < 3; round++) {
    op_write(&md, a, 0, 0, N, 100 + (unsigned)round);
    op_copy(&md, b, 1, 0, a, 0, 0, N);                  /* staged */
    op_fill(&md, a, 0, 0, N / 2, 0x66);                 /* after the staged read of a */
    op_write(&md, b, 1, 1000, 5000, 110 + (unsigned)round);
    op_copy(&md, a, 0, 3, b, 1, 900, 200000);           /* staged back */
    op_read(&md, a, 0, 0, N);
  }
  model_check(&md, a, b);
  model_free(&md);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  ou_close(&e);
}

/* Several threads issue asynchronous chains on their own buffers of the
 * same devices at once: every chain keeps its order. */
typedef struct worker_arg {
  um_manager *m;
  um_device *d;
  unsigned seed;
  int ok;
} worker_arg;

static void *issuer(void *p) {
  worker_arg *w = p;
  um_buffer *b = NULL;
  unsigned char *src = malloc(N), *back = malloc(N), *want = malloc(N);
  um_event *ev[4];
  w->ok = 0;
  if (src == NULL || back == NULL || want == NULL || um_alloc(w->m, w->d, N, UM_DEVICE, 0, &b) != UM_OK)
    goto out;
  for (int r = 0; r < 20; r++) {
    ub_pattern(src, N, w->seed + (unsigned)r);
    memcpy(want, src, N);
    memset(want + 10, r, 100);
    if (um_fill(b, 0, 0xAB, N, &ev[0]) != UM_OK || um_copy_from_host(b, 0, src, N, &ev[1]) != UM_OK ||
        um_fill(b, 10, r, 100, &ev[2]) != UM_OK || um_copy_to_host(b, 0, back, N, &ev[3]) != UM_OK)
      goto out;
    for (int i = 0; i < 4; i++) {
      if (um_event_wait(ev[i]) != UM_OK)
        goto out;
      um_event_release(ev[i]);
    }
    if (memcmp(back, want, N) != 0)
      goto out;
  }
  w->ok = 1;
out:
  if (b)
    um_release(b);
  free(src);
  free(back);
  free(want);
  return NULL;
}

OU_TEST_1_AND_2(opencl_ordering, threads_on_their_own_buffers) {
  ou_env e;
  e = ou_open(NULL, 1);
  pthread_t t[3];
  worker_arg w[3];
  for (int i = 0; i < 3; i++) {
    w[i] = (worker_arg){e.m, e.dev[i % e.ndev], 300u + (unsigned)i * 17u, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, issuer, &w[i]), 0);
  }
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
    cr_assert(w[i].ok, "thread %d saw wrong bytes or a failed operation", i);
  }
  ou_close(&e);
}

/* Releasing buffers with native operations in flight: their blocks go back
 * when the operations finish, which happens in the driver's completion
 * callback (the OpenCL backend lets the core finish operations there), so
 * unpooled blocks are freed from PoCL's thread. Every block comes back. */
OU_TEST_1_AND_2(opencl_ordering, release_with_operations_in_flight) {
  ou_env e = ou_open(NULL, 1);
  enum { ROUNDS = 40, S = 64 * 1024 };
  unsigned char *src = ub_malloc(S);
  um_stats before, after;
  ub_pattern(src, S, 77);
  before = ut_stats(e.m, e.dev[0]);
  for (int r = 0; r < ROUNDS; r++) {
    um_buffer *b = NULL, *c = NULL;
    um_event *w = NULL, *cp = NULL;
    unsigned flags = r % 2 ? UM_ALLOC_UNPOOLED : 0;
    cr_assert_eq(um_alloc(e.m, e.dev[0], S, UM_DEVICE, flags, &b), UM_OK);
    cr_assert_eq(um_alloc(e.m, e.dev[0], S, r % 3 ? UM_DEVICE : UM_PINNED, flags, &c), UM_OK);
    cr_assert_eq(um_copy_from_host(b, 0, src, S, &w), UM_OK);
    cr_assert_eq(um_copy(c, 0, b, 0, S, &cp), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
    cr_assert_eq(um_release(c), UM_OK);
    ub_wait(w, UM_OK);
    ub_wait(cp, UM_OK);
  }
  cr_assert_eq(um_device_synchronize(e.dev[0]), UM_OK);
  after = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(after.active_buffers, before.active_buffers);
  cr_assert_eq(after.releases - before.releases, 2 * ROUNDS);
  free(src);
  ou_close(&e);
}
