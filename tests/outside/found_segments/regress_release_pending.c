/* REGRESSION (held): a buffer released with async copy + fill still pending is not carved for a new buffer
 * before they finish (the new buffers' contents survive the old operations), with and without trims.
 * Args: device location.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_release_pending.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_release_pending
 * Run (from /tmp; binary /tmp/regress_release_pending):
 *   POCL_DEVICES=pthread ./regress_release_pending 1 1 (and 1 2, 1 3, 0 0)
 *
 * What it printed on this tree:
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   destroy UM_OK, 0 failures
 *   rc=0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
static int fails;
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0;
  int dev = argc > 1 ? atoi(argv[1]) : 1; int loc = argc > 2 ? atoi(argv[2]) : UM_DEVICE;
  um_manager *m; if (um_manager_create(&o, &m)) return 2;
  if (dev >= um_device_count(m)) return 77;
  um_device *d = um_device_get(m, dev);
  size_t sizes[] = {4096, 100000, 1u << 20, 3u << 20, 16u << 20};
  uint8_t *src = malloc(16u << 20), *pat = malloc(16u << 20), *back = malloc(16u << 20);
  memset(src, 0xAA, 16u << 20); memset(pat, 0x55, 16u << 20);
  for (int r = 0; r < 30; r++)
    for (int si = 0; si < 5; si++) {
      size_t n = sizes[si];
      um_buffer *a, *b, *c; um_event *e1, *e2;
      if (um_alloc(m, d, n, (um_location)loc, 0, &a)) { fails++; continue; }
      /* two async writes queued, then release at once */
      um_copy_from_host(a, 0, src, n, &e1);
      um_fill(a, 0, 0xCC, n, &e2);
      um_release(a);
      if (r % 3 == 0) um_pool_trim(m, 0);
      if (um_alloc(m, d, n, (um_location)loc, 0, &b)) { fails++; continue; }
      um_alloc(m, d, n / 2 + 1, (um_location)loc, 0, &c);
      um_copy_from_host(b, 0, pat, n, NULL);
      um_fill(c, 0, 0x77, n / 2 + 1, NULL);
      um_event_wait(e1); um_event_wait(e2); um_event_release(e1); um_event_release(e2);
      um_device_synchronize(d);
      um_copy_to_host(b, 0, back, n, NULL);
      for (size_t i = 0; i < n; i++) if (back[i] != 0x55) { printf("r %d size %zu: new buffer overwritten at %zu (%#x)\n", r, n, i, back[i]); fails++; break; }
      um_copy_to_host(c, 0, back, n / 2 + 1, NULL);
      for (size_t i = 0; i < n / 2 + 1; i++) if (back[i] != 0x77) { printf("r %d size %zu: second buffer overwritten at %zu (%#x)\n", r, n, i, back[i]); fails++; break; }
      um_release(b); um_release(c);
    }
  free(src); free(pat); free(back);
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(m)), fails);
  return fails != 0;
}
