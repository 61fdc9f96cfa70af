/* REGRESSION (held): double release / use after release answer UM_ESTATE and do not touch a later block; two
 * threads racing to release one buffer get one UM_OK and one UM_ESTATE; huge requests (64 GiB, 1 TiB,
 * SIZE_MAX/2, SIZE_MAX) fail with UM_ENOMEM and the pool keeps working; um_alloc_array overflow -> UM_EOVERFLOW;
 * forked children create their own managers and allocate/trim with segments (bounded by alarm()).
 * Note: 2 GiB / 1 GiB+1 succeed on this 23 GiB box (mmap is lazy).
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_release_huge_fork.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_release_huge_fork
 * Run (from /tmp; binary /tmp/regress_release_huge_fork):
 *   ./regress_release_huge_fork
 *
 * What it printed on this tree:
 *   note: handle reused for size 100
 *   note: handle reused for size 70000
 *   note: handle reused for size 3145728
 *   alloc 2147483648: UM_OK ()
 *   alloc 1073741824: UM_OK ()
 *   alloc 1073741825: UM_OK ()
 *   alloc 68719476736: UM_ENOMEM (cpu: mmap of 68719476736 bytes: Cannot allocate memory)
 *   alloc 1099511627776: UM_ENOMEM (cpu: mmap of 1099511627776 bytes: Cannot allocate memory)
 *   alloc 9223372036854775807: UM_ENOMEM (um_alloc: 9223372036854775807 bytes is more than any device has)
 *   alloc 18446744073709547520: UM_ENOMEM (um_alloc: 18446744073709547520 bytes is more than any device has)
 *   alloc 18446744073709551615: UM_ENOMEM (um_alloc: 18446744073709551615 bytes is more than any device has)
 *   destroy UM_OK, 0 failures
 *   rc=0
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unimem.h>
static int fails;
#define EXPECT(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); fails++; } } while (0)
static um_manager *m; static um_device *d;
static void *rel_thread(void *b) { return (void *)(intptr_t)um_release((um_buffer *)b); }
int main(void) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0; snprintf(o.backends, sizeof o.backends, "cpu");
  um_manager_create(&o, &m); d = um_device_get(m, 0);
  um_buffer *a, *b, *c; int st;
  /* double release */
  size_t szs[] = {100, 70000, 3u << 20};
  for (int i = 0; i < 3; i++) {
    um_alloc(m, d, szs[i], UM_HOST, 0, &a);
    EXPECT(um_release(a) == UM_OK, "rel");
    st = um_release(a); EXPECT(st == UM_ESTATE, "second release %s", um_err_name(st));
    uint8_t x[4] = {1, 2, 3, 4};
    st = um_copy_from_host(a, 0, x, 4, NULL); EXPECT(st == UM_ESTATE, "copy after release %s", um_err_name(st));
    st = um_fill(a, 0, 0x77, 4, NULL); EXPECT(st == UM_ESTATE, "fill after release %s", um_err_name(st));
    EXPECT(um_buffer_host_ptr(a) == NULL, "host_ptr after release");
    EXPECT(um_buffer_size(a) == 0, "size after release");
    /* a new block now; stale handle must not reach it */
    um_alloc(m, d, szs[i], UM_HOST, 0, &b);
    memset(um_buffer_host_ptr(b), 0x11, szs[i]);
    if (b != a) {
      st = um_fill(a, 0, 0x77, szs[i] < 16 ? szs[i] : 16, NULL);
      EXPECT(st == UM_ESTATE, "stale fill %s", um_err_name(st));
      st = um_release(a); EXPECT(st == UM_ESTATE, "stale release %s", um_err_name(st));
    } else printf("note: handle reused for size %zu\n", szs[i]);
    uint8_t *p = um_buffer_host_ptr(b);
    for (size_t j = 0; j < szs[i]; j++) if (p[j] != 0x11) { EXPECT(0, "later block corrupted at %zu", j); break; }
    um_release(b);
  }
  /* release from another thread, and a race of two releases */
  for (int i = 0; i < 200; i++) {
    um_alloc(m, d, 1 + (size_t)i * 9973, UM_HOST, 0, &a);
    pthread_t t1, t2; void *r1, *r2;
    pthread_create(&t1, NULL, rel_thread, a); pthread_create(&t2, NULL, rel_thread, a);
    pthread_join(t1, &r1); pthread_join(t2, &r2);
    int x = (int)(intptr_t)r1, y = (int)(intptr_t)r2;
    EXPECT((x == UM_OK && y == UM_ESTATE) || (x == UM_ESTATE && y == UM_OK), "racing releases %s %s", um_err_name(x), um_err_name(y));
  }
  /* huge requests */
  size_t huge[] = {(size_t)2 << 30, (size_t)1 << 30, ((size_t)1 << 30) + 1, (size_t)64 << 30, (size_t)1 << 40, SIZE_MAX / 2, SIZE_MAX - 4095, SIZE_MAX};
  for (int i = 0; i < 8; i++) {
    um_buffer *h = NULL;
    st = um_alloc(m, d, huge[i], UM_HOST, 0, &h);
    printf("alloc %zu: %s (%s)\n", huge[i], um_err_name(st), st ? um_last_error() : "");
    if (st == UM_OK) {
      uint8_t *p = um_buffer_host_ptr(h); p[0] = 1; p[huge[i] - 1] = 2;
      /* other allocations must not overlap */
      um_alloc(m, d, 1000, UM_HOST, 0, &c);
      uint8_t *q = um_buffer_host_ptr(c);
      EXPECT(q + 1000 <= p || q >= p + huge[i], "overlap with huge block");
      um_release(c);
      um_release(h);
    } else EXPECT(st == UM_ENOMEM, "huge %zu: %s", huge[i], um_err_name(st));
    st = um_alloc(m, d, 4096, UM_HOST, UM_ALLOC_ZERO, &c);
    EXPECT(st == UM_OK, "pool after huge: %s", um_err_name(st));
    if (!st) um_release(c);
    st = um_alloc_array(m, d, SIZE_MAX / 2, 4, UM_HOST, 0, &c);
    EXPECT(st == UM_EOVERFLOW, "array overflow: %s", um_err_name(st));
  }
  um_stats s; um_pool_trim(m, 0); um_stats_get(m, NULL, &s);
  EXPECT(s.bytes_reserved == 0 && s.segments == 0, "not empty: reserved %llu segs %llu", (unsigned long long)s.bytes_reserved, (unsigned long long)s.segments);
  /* fork: child builds its own manager */
  um_alloc(m, d, 5u << 20, UM_HOST, 0, &a); memset(um_buffer_host_ptr(a), 0x33, 5u << 20);
  for (int i = 0; i < 3; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(20);
      um_manager *cm; um_options co; um_options_init(&co); snprintf(co.backends, sizeof co.backends, "cpu");
      if (um_manager_create(&co, &cm)) _exit(3);
      um_device *cd = um_device_get(cm, 0);
      for (int k = 0; k < 2000; k++) {
        um_buffer *x; size_t n = 1 + (size_t)(k * 7919) % (3u << 20);
        if (um_alloc(cm, cd, n, UM_HOST, UM_ALLOC_ZERO, &x)) _exit(4);
        uint8_t *p = um_buffer_host_ptr(x);
        if (p[0] || p[n - 1]) _exit(5);
        memset(p, 0x44, n); um_release(x);
        if (k % 100 == 0) um_pool_trim(cm, 0);
      }
      /* parent's buffer still readable in the child (copy of address space) */
      int r = um_manager_destroy(cm);
      _exit(r == UM_OK ? 0 : 6);
    }
    int ws; alarm(30); waitpid(pid, &ws, 0); alarm(0);
    EXPECT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child status %#x", ws);
  }
  uint8_t *p = um_buffer_host_ptr(a);
  for (size_t j = 0; j < (5u << 20); j++) if (p[j] != 0x33) { EXPECT(0, "parent buffer changed after fork"); break; }
  um_release(a);
  st = um_manager_destroy(m);
  printf("destroy %s, %d failures\n", um_err_name(st), fails);
  return fails != 0;
}
