/* Scopes: exact start/end/peak/allocations/releases/bytes_allocated for nested scopes over two devices,
 * peak of an inner scope counting in the outer one, a scope pushed on one thread and popped on another,
 * 64 nested (the 65th UM_EOVERFLOW), pop with none open UM_ESTATE, out NULL, wrong handles.
 * Promises (unimem.h): um_scope_push "Begin a scope of m (all threads), nested in the open one: what is
 * allocated and released from now on is counted for it until um_scope_pop. Returns UM_OK, UM_EINVAL,
 * UM_EOVERFLOW (UM_TAG_DEPTH_MAX scopes open)"; um_scope_pop "End m's innermost scope into *out (may be
 * NULL); its peak counts in the scope around it. UM_ESTATE when none is open"; um_scope_stats "all devices
 * together", peak "the highest in between (nested scopes included)".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_scopes.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X ; UNIMEM_BACKENDS=cpu /tmp/X
 * Printed (both backends): inner: start 11000 end 11000 peak 16000 allocs 1 rels 1 bytes_allocated 5000
 *   outer: start 10000 end 2000 peak 16000 allocs 3 rels 3 bytes_allocated 8000
 *   popped elsewhere: start 0 end 0 peak 777 allocs 1 rels 1 bytes_allocated 777 / ok
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unimem.h>
static int bad;
#define U(x) ((unsigned long long)(x))
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static um_manager *m;
static um_device *g;
static void pr(const char *w, um_scope_stats *s) {
  printf("%s: start %llu end %llu peak %llu allocs %llu rels %llu bytes_allocated %llu\n", w, U(s->bytes_in_use_start), U(s->bytes_in_use_end),
         U(s->peak_bytes_in_use), U(s->allocations), U(s->releases), U(s->bytes_allocated));
}
static void *popper(void *p) {
  um_scope_stats *s = p;
  um_buffer *b;
  um_alloc(m, g, 777, UM_DEVICE, 0, &b);
  um_release(b);
  CHECK(um_scope_pop(m, s) == UM_OK, "pop on another thread");
  return NULL;
}
int main(void) {
  CHECK(um_manager_create(NULL, &m) == UM_OK, "create");
  int nd = um_device_count(m);
  um_device *h = um_device_get(m, 0);
  g = um_device_get(m, nd - 1);
  CHECK(um_scope_pop(m, NULL) == UM_ESTATE, "pop none");
  CHECK(um_scope_push(NULL) == UM_EINVAL && um_scope_pop(NULL, NULL) == UM_EINVAL, "NULL");
  um_buffer *pre, *x, *y, *z;
  um_alloc(m, h, 10000, UM_HOST, 0, &pre); /* before any scope, before observing */
  um_stats st; um_stats_get(m, NULL, &st);
  uint64_t B = st.bytes_in_use;
  um_scope_stats s1, s2;
  CHECK(um_scope_push(m) == UM_OK, "push 1");
  um_alloc(m, h, 1000, UM_HOST, 0, &x);
  CHECK(um_scope_push(m) == UM_OK, "push 2");
  um_alloc(m, g, 5000, UM_DEVICE, 0, &y);
  um_release(y);
  CHECK(um_scope_pop(m, &s2) == UM_OK, "pop 2");
  pr("inner", &s2);
  CHECK(s2.bytes_in_use_start == B + 1000 && s2.bytes_in_use_end == B + 1000 && s2.peak_bytes_in_use == B + 6000 && s2.allocations == 1 &&
        s2.releases == 1 && s2.bytes_allocated == 5000, "inner scope");
  um_alloc(m, g, 2000, UM_DEVICE, 0, &z);
  um_release(x);
  um_release(pre);
  CHECK(um_scope_pop(m, &s1) == UM_OK, "pop 1");
  pr("outer", &s1);
  CHECK(s1.bytes_in_use_start == B && s1.bytes_in_use_end == B - 10000 + 2000 && s1.peak_bytes_in_use == B + 6000, "outer start/end/peak");
  CHECK(s1.allocations == 3 && s1.releases == 3 && s1.bytes_allocated == 8000, "outer counts (inner's included)");
  um_release(z);
  /* push here, pop on another thread */
  um_stats_get(m, NULL, &st);
  CHECK(um_scope_push(m) == UM_OK, "push");
  pthread_t t; pthread_create(&t, NULL, popper, &s1); pthread_join(t, NULL);
  pr("popped elsewhere", &s1);
  CHECK(s1.allocations == 1 && s1.releases == 1 && s1.peak_bytes_in_use == st.bytes_in_use + 777 && s1.bytes_allocated == 777, "cross-thread scope");
  CHECK(um_scope_pop(m, NULL) == UM_ESTATE, "nothing left");
  /* depth */
  int i;
  for (i = 0; i < UM_TAG_DEPTH_MAX; i++) if (um_scope_push(m) != UM_OK) break;
  CHECK(i == UM_TAG_DEPTH_MAX, "%d scopes pushed", i);
  CHECK(um_scope_push(m) == UM_EOVERFLOW, "65th");
  um_buffer *big; um_alloc(m, h, 123456, UM_HOST, 0, &big); um_release(big);
  um_stats_get(m, NULL, &st);
  for (i = 0; i < UM_TAG_DEPTH_MAX; i++) {
    um_scope_stats s;
    CHECK(um_scope_pop(m, &s) == UM_OK, "pop %d", i);
    CHECK(s.peak_bytes_in_use == st.bytes_in_use + 123456 && s.allocations == 1 && s.releases == 1, "level %d: peak %llu allocs %llu", i, U(s.peak_bytes_in_use), U(s.allocations));
  }
  CHECK(um_scope_pop(m, NULL) == UM_ESTATE, "past depth");
  CHECK(um_manager_destroy(m) == UM_OK, "destroy");
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
