/* REGRESSION (held): more than one 1 GiB host virtual segment of blocks (1 MiB x 1100, 300 MiB x 5,
 * 1 GiB-64 KiB x 2, 1 GiB+1 x 2, 65537 B x 20000): no overlapping ranges, data intact, trim empties everything.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_virtual_segment_overflow.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_virtual_segment_overflow
 * Run (from /tmp; binary /tmp/regress_virtual_segment_overflow):
 *   ./regress_virtual_segment_overflow
 *
 * What it printed on this tree:
 *   1 MiB x1100      inuse 1153433600 reserved 1153433600 pooled 0 segs 2 segfree 0 ext 1 largest 994050048
 *     trimmed        inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0
 *   1e6 B x1200      inuse 1200000000 reserved 1258291200 pooled 0 segs 2 segfree 0 ext 1 largest 889192448
 *     trimmed        inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0
 *   300 MiB x5       inuse 1572864000 reserved 1572864000 pooled 0 segs 2 segfree 0 ext 2 largest 444596224
 *     trimmed        inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0
 *   1G-64K x2        inuse 2147352576 reserved 2147352576 pooled 0 segs 2 segfree 0 ext 2 largest 65536
 *     trimmed        inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0
 *   1G+1 x2          inuse 2147483650 reserved 2147614720 pooled 0 segs 2 segfree 0 ext 2 largest 2031616
 *     trimmed        inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0
 *   65537 x20000     inuse 1310740000 reserved 1638465536 pooled 65536 segs 2 segfree 65536 ext 2 largest 509067264
 *     trimmed        inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0
 *   destroy UM_OK, 0 failures
 *   rc=0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
#define U(x) ((unsigned long long)(x))
static int fails;
typedef struct { uintptr_t lo, hi; } rg;
static int cmp(const void *a, const void *b) { const rg *x = a, *y = b; return x->lo < y->lo ? -1 : x->lo > y->lo; }
static void dump(um_manager *m, const char *w) {
  um_stats s; um_stats_get(m, NULL, &s);
  printf("%-16s inuse %llu reserved %llu pooled %llu segs %llu segfree %llu ext %llu largest %llu\n", w, U(s.bytes_in_use), U(s.bytes_reserved), U(s.bytes_pooled), U(s.segments), U(s.bytes_segment_free), U(s.free_extents), U(s.largest_free_extent));
  if (s.bytes_reserved < s.bytes_in_use || s.bytes_pooled > s.bytes_reserved || s.bytes_segment_free > s.bytes_pooled) { printf("  INVARIANT BROKEN\n"); fails++; }
}
static void run(um_manager *m, um_device *d, size_t sz, int cnt, const char *name) {
  um_buffer **b = calloc(cnt, sizeof *b); rg *r = calloc(cnt, sizeof *r); int got = 0;
  for (int i = 0; i < cnt; i++) {
    int st = um_alloc(m, d, sz, UM_HOST, 0, &b[i]);
    if (st) { printf("%s: alloc %d failed %s %s\n", name, i, um_err_name(st), um_last_error()); fails++; break; }
    uint8_t *p = um_buffer_host_ptr(b[i]); p[0] = (uint8_t)i; p[sz - 1] = (uint8_t)(i * 3); p[sz / 2] = (uint8_t)(i * 5);
    r[i].lo = (uintptr_t)p; r[i].hi = (uintptr_t)p + sz; got++;
  }
  dump(m, name);
  for (int i = 0; i < got; i++) { uint8_t *p = um_buffer_host_ptr(b[i]); if (p[0] != (uint8_t)i || p[sz - 1] != (uint8_t)(i * 3) || p[sz / 2] != (uint8_t)(i * 5)) { printf("%s: data lost %d\n", name, i); fails++; } }
  qsort(r, got, sizeof *r, cmp);
  for (int i = 1; i < got; i++) if (r[i].lo < r[i - 1].hi) { printf("%s: OVERLAP %#lx..%#lx and %#lx\n", name, (unsigned long)r[i - 1].lo, (unsigned long)r[i - 1].hi, (unsigned long)r[i].lo); fails++; }
  for (int i = 0; i < got; i++) um_release(b[i]);
  um_pool_trim(m, 0);
  dump(m, "  trimmed");
  free(b); free(r);
}
int main(void) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0; snprintf(o.backends, sizeof o.backends, "cpu");
  um_manager *m; um_manager_create(&o, &m); um_device *d = um_device_get(m, 0);
  run(m, d, 1u << 20, 1100, "1 MiB x1100");
  run(m, d, 1000000, 1200, "1e6 B x1200");
  run(m, d, 300u << 20, 5, "300 MiB x5");
  run(m, d, (1u << 30) - 65536, 2, "1G-64K x2");
  run(m, d, (1u << 30) + 1, 2, "1G+1 x2");
  run(m, d, 65537, 20000, "65537 x20000");
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(m)), fails);
  return fails != 0;
}
