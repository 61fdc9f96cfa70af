/* Completions of many small asynchronous commands on OpenCL (the OpenCL
 * backend's watch list, opencl.c: one completion callback armed at a time
 * per device, each report covering every watched command that has ended).
 * Whatever command the callback was armed on, and whichever thread ran it
 * (PoCL's, or the issuing thread when the command had ended already: the
 * basic device's variant), every event is reported exactly once, with its
 * own status, and not before the commands it follows on its buffer:
 *  - 2000 copies waited for in reverse order;
 *  - events released before their copies ran, then a synchronize;
 *  - four threads issuing and reading back at once;
 *  - batches (whose queue marks hold an event reference of their own)
 *    between single copies;
 *  - large copies (a callback each) between small ones (one callback for
 *    many), waited for in the order of a double-buffered pipeline. */
#include <pthread.h>

#include "opencl_util.h"

#define SMALL 4096u
#define COUNT 2000

/* 2000 writes of 4 KiB into one buffer, each with an event, waited for last
 * first: once the last is done, every earlier one is (each follows the
 * one before it on the buffer), and the bytes are all there. */
OU_TEST_1_AND_2(opencl_watch, copies_waited_in_reverse) {
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)COUNT * SMALL;
  unsigned char *src = ou_malloc(n), *back;
  um_event **ev = ou_malloc(COUNT * sizeof(*ev));
  um_buffer *b = ou_alloc(e.m, e.dev[0], n, UM_DEVICE);
  um_stats before = ut_stats(e.m, e.dev[0]), after;
  ou_pattern(src, n, 5);
  for (int i = 0; i < COUNT; i++)
    cr_assert_eq(um_copy_from_host(b, (size_t)i * SMALL, src + (size_t)i * SMALL, SMALL, &ev[i]), UM_OK, "copy %d: %s",
                 i, um_last_error());
  cr_assert_eq(um_event_wait(ev[COUNT - 1]), UM_OK, "%s", um_last_error());
  for (int i = 0; i < COUNT; i++)
    cr_assert_eq(um_event_query(ev[i]), UM_OK, "copy %d is reported done once the last one is", i);
  for (int i = COUNT - 1; i >= 0; i--)
    ou_wait(ev[i], UM_OK);
  after = ut_stats(e.m, e.dev[0]);
  cr_assert_eq(after.bytes_h2d - before.bytes_h2d, (uint64_t)n);
  back = ou_read_all(b);
  ou_assert_bytes(back, src, n, "2000 watched copies");
  um_release(b);
  free(back), free(ev), free(src);
  ou_close(&e);
}

/* Events released at once, before their copies ran: nobody waits for any
 * of them, and the device's synchronize still sees every copy done. */
OU_TEST_1_AND_2(opencl_watch, events_released_before_their_copies_ran) {
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)COUNT * SMALL;
  unsigned char *src = ou_malloc(n), *back;
  um_buffer *b = ou_alloc(e.m, e.dev[0], n, UM_DEVICE);
  ou_pattern(src, n, 9);
  for (int i = 0; i < COUNT; i++) {
    um_event *ev = NULL;
    cr_assert_eq(um_copy_from_host(b, (size_t)i * SMALL, src + (size_t)i * SMALL, SMALL, &ev), UM_OK, "copy %d: %s",
                 i, um_last_error());
    cr_assert_eq(um_event_release(ev), UM_OK);
  }
  cr_assert_eq(um_device_synchronize(e.dev[0]), UM_OK, "%s", um_last_error());
  back = ou_read_all(b);
  ou_assert_bytes(back, src, n, "copies whose events were released at once");
  /* The buffer is idle: its release pools the block at once. */
  cr_assert_eq(um_release(b), UM_OK);
  free(back), free(src);
  ou_close(&e);
}

typedef struct issuer_arg {
  um_manager *m;
  um_device *d;
  unsigned seed;
  int ok;
} issuer_arg;

/* One thread's round trips on a buffer of its own: 250 writes with events
 * and 250 reads with events behind them, every other event released
 * unwaited, the rest waited for in an order of their own. */
static void *issuer(void *p) {
  issuer_arg *a = p;
  enum { K = 250 };
  size_t n = (size_t)K * SMALL;
  unsigned char *src = malloc(n), *back = calloc(1, n);
  um_event *w[K], *r[K];
  um_buffer *b = NULL;
  a->ok = 0;
  if (src == NULL || back == NULL || um_alloc(a->m, a->d, n, UM_DEVICE, 0, &b) != UM_OK)
    goto out;
  ou_pattern(src, n, a->seed);
  for (int i = 0; i < K; i++)
    if (um_copy_from_host(b, (size_t)i * SMALL, src + (size_t)i * SMALL, SMALL, &w[i]) != UM_OK)
      goto out;
  for (int i = 0; i < K; i++)
    if (um_copy_to_host(b, (size_t)i * SMALL, back + (size_t)i * SMALL, SMALL, &r[i]) != UM_OK)
      goto out;
  a->ok = 1;
  for (int i = 0; i < K; i++) {
    int k = (int)((unsigned)(i * 97 + (int)a->seed) % K);
    if (i % 2 == 0 && um_event_wait(r[k]) != UM_OK)
      a->ok = 0;
  }
  for (int i = 0; i < K; i++) {
    if (um_event_wait(w[i]) != UM_OK)
      a->ok = 0;
    um_event_release(w[i]);
  }
  for (int i = 0; i < K; i++) {
    if (um_event_wait(r[i]) != UM_OK)
      a->ok = 0;
    um_event_release(r[i]);
  }
  if (memcmp(back, src, n) != 0)
    a->ok = 0;
out:
  if (b != NULL)
    um_release(b);
  free(src), free(back);
  return NULL;
}

OU_TEST_1_AND_2(opencl_watch, four_threads_at_once) {
  ou_env e = ou_open(NULL, 1);
  pthread_t t[4];
  issuer_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (issuer_arg){e.m, e.dev[i % e.ndev], 40u + (unsigned)i, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, issuer, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    cr_assert(a[i].ok, "thread %d saw a failed operation or wrong bytes", i);
  }
  ou_close(&e);
}

/* Batches between single copies with events: a batch's copies go out with
 * no event of their own and one queue mark behind them, whose event the
 * backend holds a reference on itself (the core does not keep the mark's
 * token); the single copies' events are the core's. All on one queue,
 * reported through one list. */
OU_TEST_1_AND_2(opencl_watch, batches_between_single_copies) {
  enum { ROUNDS = 20, PER = 50 };
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)ROUNDS * (PER + 1) * SMALL;
  unsigned char *src = ou_malloc(n), *back;
  um_buffer *b = ou_alloc(e.m, e.dev[0], n, UM_DEVICE);
  um_copy_op ops[PER];
  um_event *single[ROUNDS], *batch[ROUNDS];
  size_t off = 0;
  ou_pattern(src, n, 13);
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < PER; i++, off += SMALL)
      ops[i] = (um_copy_op){.dst = b, .dst_off = off, .host_src = src + off, .bytes = SMALL};
    cr_assert_eq(um_copy_batch(e.m, ops, PER, &batch[r]), UM_OK, "batch %d: %s", r, um_last_error());
    cr_assert_eq(um_copy_from_host(b, off, src + off, SMALL, &single[r]), UM_OK, "%s", um_last_error());
    off += SMALL;
  }
  for (int r = ROUNDS - 1; r >= 0; r--) {
    ou_wait(single[r], UM_OK);
    ou_wait(batch[r], UM_OK);
  }
  back = ou_read_all(b);
  ou_assert_bytes(back, src, n, "batches and single copies");
  um_release(b);
  free(back), free(src);
  ou_close(&e);
}

/* Large copies (64 KiB and more: a callback of their own) between small
 * ones (the lazy callback): a pipeline that issues copy k + 1 before it
 * waits for copy k, into two halves of a buffer, then reads both back. */
OU_TEST_1_AND_2(opencl_watch, large_copies_between_small_ones) {
  enum { ROUNDS = 24, BIG = 256 * 1024 };
  ou_env e = ou_open(NULL, 1);
  size_t n = (size_t)ROUNDS * (BIG + SMALL);
  unsigned char *src = ou_malloc(n), *back;
  um_buffer *b = ou_alloc(e.m, e.dev[0], n, UM_DEVICE);
  um_event *big[ROUNDS], *small[ROUNDS];
  size_t off = 0;
  ou_pattern(src, n, 21);
  for (int r = 0; r < ROUNDS; r++) {
    cr_assert_eq(um_copy_from_host(b, off, src + off, BIG, &big[r]), UM_OK, "%s", um_last_error());
    off += BIG;
    cr_assert_eq(um_copy_from_host(b, off, src + off, SMALL, &small[r]), UM_OK, "%s", um_last_error());
    off += SMALL;
    if (r > 0) {
      ou_wait(big[r - 1], UM_OK);
      ou_wait(small[r - 1], UM_OK);
    }
  }
  ou_wait(small[ROUNDS - 1], UM_OK);
  cr_assert_eq(um_event_query(big[ROUNDS - 1]), UM_OK, "the large copy before the last small one is done");
  ou_wait(big[ROUNDS - 1], UM_OK);
  back = ou_read_all(b);
  ou_assert_bytes(back, src, n, "large and small copies");
  um_release(b);
  free(back), free(src);
  ou_close(&e);
}
