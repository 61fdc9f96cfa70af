/* FINDING: a um_alloc_tagged that fails (UM_EINVAL: a device of another manager, zero bytes; UM_ENOTSUP)
 * still registers its tag name: the name shows in um_tag_stats_get (all zero) and uses one of the
 * manager's UM_TAGS_MAX names, and the manager starts observing.
 * Promise (unimem.h, conventions): "Results come back through out-parameters, which are written only on
 * success"; um_tag_stats_get: "Before the first tag, count is 0" (is a refused call a "first tag"?).
 * Not a broken sentence as such; surprising, and it eats UM_TAGS_MAX.
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/finding_failed_alloc_tagged_registers_name.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: UNIMEM_BACKENDS=cpu /tmp/X
 * Printed:
 *   alloc_tagged(device of b, "wrongdev") = UM_EINVAL
 *   alloc_tagged(0 bytes, "zerobytes") = UM_EINVAL
 *   alloc_tagged(location 9, "badloc") = UM_EINVAL
 *   tag_stats count 4: '' 'wrongdev' 'zerobytes' 'badloc'
 *   FINDING: refused um_alloc_tagged calls registered 3 tag name(s)
 */
#include <stdio.h>
#include <unimem.h>
int main(void) {
  um_manager *a, *b;
  um_manager_create(NULL, &a); um_manager_create(NULL, &b);
  um_buffer *x = NULL;
  printf("alloc_tagged(device of b, \"wrongdev\") = %s\n", um_err_name(um_alloc_tagged(a, um_device_get(b, 0), 8, UM_HOST, 0, "wrongdev", &x)));
  printf("alloc_tagged(0 bytes, \"zerobytes\") = %s\n", um_err_name(um_alloc_tagged(a, um_device_get(a, 0), 0, UM_HOST, 0, "zerobytes", &x)));
  printf("alloc_tagged(location 9, \"badloc\") = %s\n", um_err_name(um_alloc_tagged(a, um_device_get(a, 0), 8, (um_location)9, 0, "badloc", &x)));
  um_tag_stats t[8];
  int c = um_tag_stats_get(a, NULL, t, 8);
  printf("tag_stats count %d:", c);
  for (int i = 0; i < c && i < 8; i++) printf(" '%s'", t[i].name);
  printf("\n");
  um_manager_destroy(b); um_manager_destroy(a);
  if (c > 0) { printf("FINDING: refused um_alloc_tagged calls registered %d tag name(s)\n", c - 1); return 1; }
  printf("ok\n");
  return 0;
}
