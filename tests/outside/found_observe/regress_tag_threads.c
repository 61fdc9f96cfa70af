/* Tags are per thread: a pop from another thread answers UM_ESTATE and leaves the owner's tag open; a thread
 * that exits with tags open leaves nothing behind (the next threads' allocations are untagged, no leak under
 * LSan, destroy fine); 8 threads with their own tags allocating and releasing at once give exact per-tag
 * counts, and the sum over tags equals um_stats_get's bytes_in_use / active_buffers.
 * Promises (unimem.h): um_tag_push "this thread's allocations ... on m count for tag name"; um_tag_pop "End
 * this thread's innermost tag on m. UM_ESTATE when none is open"; um_tag_stats fields "live buffers",
 * "requested bytes of live buffers", "buffers allocated", "buffers released".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_tag_threads.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu /tmp/X ; POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X
 * Printed: "ok" in both (exit 0).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unimem.h>
static int bad;
#define CHECK(c, ...) do { if (!(c)) { __atomic_store_n(&bad, 1, __ATOMIC_SEQ_CST); printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static um_manager *m;
static um_device *dev;
static pthread_barrier_t bar;
static const char *tg(um_buffer *b) { const char *t = um_buffer_tag(b); return t ? t : "(null)"; }
static void *owner(void *p) {
  (void)p;
  CHECK(um_tag_push(m, "t1") == UM_OK, "push t1");
  pthread_barrier_wait(&bar); /* main pops now */
  pthread_barrier_wait(&bar);
  um_buffer *b;
  CHECK(um_alloc(m, dev, 100, UM_HOST, 0, &b) == UM_OK, "alloc");
  CHECK(strcmp(tg(b), "t1") == 0, "owner's tag after another thread's pop: %s", tg(b));
  um_release(b);
  CHECK(um_tag_push(m, "t1-inner") == UM_OK, "push inner");
  return NULL; /* exits with 2 tags open */
}
static void *fresh(void *p) {
  (void)p;
  um_buffer *b;
  CHECK(um_alloc(m, dev, 10, UM_HOST, 0, &b) == UM_OK, "alloc fresh");
  CHECK(strcmp(tg(b), "") == 0, "new thread's buffer tagged %s", tg(b));
  CHECK(um_tag_pop(m) == UM_ESTATE, "new thread pop");
  um_release(b);
  for (int i = 0; i < 3; i++) um_tag_push(m, "leftover");
  return NULL;
}
#define NT 8
#define NB 200
static void *worker(void *p) {
  long id = (long)p;
  char nm[16]; snprintf(nm, sizeof nm, "w%ld", id);
  um_buffer *bs[NB];
  CHECK(um_tag_push(m, nm) == UM_OK, "push %s", nm);
  for (int i = 0; i < NB; i++) {
    um_device *d = (i % 2 && um_device_count(m) > 1) ? um_device_get(m, 1) : dev;
    CHECK(um_alloc(m, d, 1000 + id, (i % 2) ? UM_DEVICE : UM_HOST, 0, &bs[i]) == UM_OK, "alloc");
  }
  for (int i = 0; i < NB; i += 2) um_release(bs[i]);
  pthread_barrier_wait(&bar);
  pthread_barrier_wait(&bar);
  for (int i = 1; i < NB; i += 2) um_release(bs[i]);
  um_tag_pop(m);
  return NULL;
}
int main(void) {
  CHECK(um_manager_create(NULL, &m) == UM_OK, "create");
  dev = um_device_get(m, 0);
  pthread_barrier_init(&bar, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, owner, NULL);
  pthread_barrier_wait(&bar);
  CHECK(um_tag_pop(m) == UM_ESTATE, "pop of another thread's tag");
  um_buffer *b;
  um_alloc(m, dev, 10, UM_HOST, 0, &b);
  CHECK(strcmp(tg(b), "") == 0, "main's buffer while t1 open elsewhere: %s", tg(b));
  um_release(b);
  pthread_barrier_wait(&bar);
  pthread_join(t, NULL);
  um_alloc(m, dev, 10, UM_HOST, 0, &b);
  CHECK(strcmp(tg(b), "") == 0, "main's buffer after owner exited: %s", tg(b));
  um_release(b);
  for (int i = 0; i < 300; i++) { pthread_create(&t, NULL, fresh, NULL); pthread_join(t, NULL); }
  /* concurrent tagged workers */
  pthread_barrier_destroy(&bar);
  pthread_barrier_init(&bar, NULL, NT + 1);
  pthread_t w[NT];
  for (long i = 0; i < NT; i++) pthread_create(&w[i], NULL, worker, (void *)i);
  pthread_barrier_wait(&bar);
  um_tag_stats ts[32];
  int c = um_tag_stats_get(m, NULL, ts, 32);
  uint64_t sum_b = 0, sum_n = 0;
  for (int i = 0; i < c && i < 32; i++) {
    sum_b += ts[i].bytes_in_use; sum_n += ts[i].active_buffers;
    long id;
    if (sscanf(ts[i].name, "w%ld", &id) == 1) {
      CHECK(ts[i].active_buffers == NB / 2 && ts[i].bytes_in_use == (uint64_t)(NB / 2) * (1000 + id) &&
            ts[i].allocations == NB && ts[i].releases == NB / 2 && ts[i].peak_bytes_in_use == (uint64_t)NB * (1000 + id),
            "%s: active %llu in_use %llu allocs %llu rel %llu peak %llu", ts[i].name, (unsigned long long)ts[i].active_buffers,
            (unsigned long long)ts[i].bytes_in_use, (unsigned long long)ts[i].allocations, (unsigned long long)ts[i].releases,
            (unsigned long long)ts[i].peak_bytes_in_use);
    }
  }
  um_stats st; um_stats_get(m, NULL, &st);
  CHECK(sum_b == st.bytes_in_use && sum_n == st.active_buffers, "sum over tags %llu bytes %llu buffers, stats %llu %llu",
        (unsigned long long)sum_b, (unsigned long long)sum_n, (unsigned long long)st.bytes_in_use, (unsigned long long)st.active_buffers);
  /* per device sums = all */
  uint64_t per = 0; int nd = um_device_count(m);
  for (int d = 0; d < nd; d++) {
    um_tag_stats td[32]; int cd = um_tag_stats_get(m, um_device_get(m, d), td, 32);
    CHECK(cd == c, "device %d count %d vs %d", d, cd, c);
    for (int i = 0; i < cd && i < 32; i++) { per += td[i].bytes_in_use; CHECK(strcmp(td[i].name, ts[i].name) == 0, "order differs on device %d", d); }
  }
  CHECK(per == sum_b, "per-device sum %llu vs all %llu", (unsigned long long)per, (unsigned long long)sum_b);
  pthread_barrier_wait(&bar);
  for (int i = 0; i < NT; i++) pthread_join(w[i], NULL);
  c = um_tag_stats_get(m, NULL, ts, 32);
  for (int i = 0; i < c && i < 32; i++) CHECK(ts[i].bytes_in_use == 0 && ts[i].active_buffers == 0, "%s still holds %llu", ts[i].name, (unsigned long long)ts[i].bytes_in_use);
  CHECK(um_manager_destroy(m) == UM_OK, "destroy");
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
