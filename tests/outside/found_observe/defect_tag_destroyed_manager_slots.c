/* DEFECT: a manager destroyed while this thread has a tag open on it keeps one of the thread's (4) tag
 * slots forever. After 4 such managers (one at a time: never more than one manager alive) the thread can
 * never push a tag on any manager again (UM_ENOMEM, "open on 4 other managers"); other threads can.
 * Also: the pop on a fresh manager at a reused address must answer UM_ESTATE and its buffers be untagged.
 * Promise (unimem.h): um_manager_destroy "free everything"; um_tag_push "UM_ENOMEM (UM_TAGS_MAX names in
 * use)" only; header: "every function may be called from any thread".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/defect_tag_destroyed_manager_slots.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: UNIMEM_BACKENDS=cpu /tmp/X
 * Printed:
 *   manager 0..3: push OK, destroyed with the tag open
 *   manager 4: fresh manager at a new address: pop UM_ESTATE, buffer tag '' (both as promised)
 *   FAIL: push on manager 4 (only manager alive): UM_ENOMEM (um_tag_push: no room for this thread's tags (open on 4 other managers, or no memory))
 *   push from another thread on it: UM_OK
 *   FAILED
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unimem.h>
static void *other(void *p) { int rc = um_tag_push(p, "other"); if (rc == UM_OK) um_tag_pop(p); return (void *)(long)rc; }
int main(void) {
  int bad = 0;
  void *addrs[4];
  for (int i = 0; i < 4; i++) {
    um_manager *m;
    um_manager_create(NULL, &m);
    addrs[i] = m;
    int rc = um_tag_push(m, "open-at-destroy");
    printf("manager %d: push %s, destroyed with the tag open\n", i, um_err_name(rc));
    if (rc != UM_OK) bad = 1;
    um_manager_destroy(m);
  }
  um_manager *m;
  um_manager_create(NULL, &m);
  int reused = 0;
  for (int i = 0; i < 4; i++) reused |= ((void *)m == addrs[i]);
  int prc = um_tag_pop(m);
  um_buffer *b;
  um_alloc(m, um_device_get(m, 0), 16, UM_HOST, 0, &b);
  const char *t = um_buffer_tag(b);
  printf("manager 4: fresh manager at a %s address: pop %s, buffer tag '%s'\n", reused ? "reused" : "new", um_err_name(prc), t ? t : "(null)");
  if (prc != UM_ESTATE || !t || t[0]) bad = 1;
  um_release(b);
  int rc = um_tag_push(m, "x");
  if (rc != UM_OK) { bad = 1; printf("FAIL: push on manager 4 (only manager alive): %s (%s)\n", um_err_name(rc), um_last_error()); }
  else um_tag_pop(m);
  pthread_t th; void *r;
  pthread_create(&th, NULL, other, m); pthread_join(th, &r);
  printf("push from another thread on it: %s\n", um_err_name((int)(long)r));
  um_manager_destroy(m);
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
