/* DEFECT: one thread cannot have tags open on more than 4 managers: the 5th um_tag_push answers UM_ENOMEM
 * ("no room for this thread's tags (open on 4 other managers, or no memory)"), an undocumented limit.
 * Also checks: destroying managers with tags still open, then creating new ones (the allocator reuses the
 * addresses): a pop on the new manager must answer UM_ESTATE, its allocations must be untagged, and the
 * destroyed managers' open tags must not use up this thread's room.
 * Promise (unimem.h, um_tag_push): "Returns UM_OK, UM_EINVAL (NULL, not a manager, empty name or one of
 * UM_TAG_NAME_MAX bytes or more), UM_ENOMEM (UM_TAGS_MAX names in use), UM_EOVERFLOW (UM_TAG_DEPTH_MAX tags
 * open)" -- UM_TAGS_MAX is per manager, UM_TAG_DEPTH_MAX "nested tags of one thread on one manager"; nothing
 * limits the number of managers; header: "every function may be called from any thread".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/defect_tag_five_managers.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: UNIMEM_BACKENDS=cpu /tmp/X
 * Printed:
 *   push "m0" on manager 0: UM_OK
 *   ... (1-3 the same)
 *   push "m4" on manager 4: UM_ENOMEM (um_tag_push: no room for this thread's tags (open on 4 other managers, or no memory))
 *   push "m5" on manager 5: UM_ENOMEM (...)
 *   FAIL: 2 of 6 pushes on distinct managers refused
 *   (destroy-with-open-tags part: see the lines after; it printed no FAIL)
 */
#include <stdio.h>
#include <string.h>
#include <unimem.h>
static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
int main(void) {
  um_manager *m[6];
  char nm[16];
  int refused = 0;
  for (int i = 0; i < 6; i++) {
    um_manager_create(NULL, &m[i]);
    snprintf(nm, sizeof nm, "m%d", i);
    int rc = um_tag_push(m[i], nm);
    printf("push \"%s\" on manager %d: %s", nm, i, um_err_name(rc));
    if (rc != UM_OK) { printf(" (%s)", um_last_error()); refused++; }
    printf("\n");
  }
  if (refused) { bad = 1; printf("FAIL: %d of 6 pushes on distinct managers refused\n", refused); }
  for (int i = 0; i < 6; i++) um_manager_destroy(m[i]); /* tags still open */
  /* new managers, likely at the same addresses */
  for (int round = 0; round < 3; round++) {
    um_manager *n[4];
    for (int i = 0; i < 4; i++) {
      um_manager_create(NULL, &n[i]);
      int reused = 0;
      for (int j = 0; j < 6; j++) reused |= (n[i] == m[j]);
      int rc = um_tag_pop(n[i]);
      CHECK(rc == UM_ESTATE, "round %d: pop on a fresh manager (address %s) answered %s", round, reused ? "reused" : "new", um_err_name(rc));
      um_buffer *b;
      um_alloc(n[i], um_device_get(n[i], 0), 32, UM_HOST, 0, &b);
      const char *t = um_buffer_tag(b);
      CHECK(t && t[0] == 0, "round %d: fresh manager's buffer tagged '%s'", round, t ? t : "(null)");
      um_release(b);
      rc = um_tag_push(n[i], "fresh");
      CHECK(rc == UM_OK, "round %d: push on fresh manager %d after destroying managers with open tags: %s (%s)", round, i, um_err_name(rc), um_last_error());
    }
    for (int i = 0; i < 4; i++) um_manager_destroy(n[i]); /* open again */
  }
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
