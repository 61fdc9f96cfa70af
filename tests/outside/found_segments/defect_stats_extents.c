/* DEFECT (statistics): largest_free_extent and free_extents count the uncommitted address space of the host's
 * FIXED: a virtual segment's free extents count only where they hold committed memory; it now prints
 * 0 inconsistent and ends 0 (test_segments: free_extents_count_memory_not_address_space).
 * 1 GiB virtual segments while bytes_segment_free ("free bytes inside segments (in bytes_pooled)") does not:
 * largest_free_extent (1 GiB) > bytes_segment_free (0) > ... and > bytes_reserved; free_extents = 1 while
 * bytes_segment_free = 0. A client computing e.g. largest_free_extent / bytes_segment_free gets nonsense.
 * Exit status 1 = an inconsistent step.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/defect_stats_extents.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/defect_stats_extents
 * Run (from /tmp; binary /tmp/defect_stats_extents):
 *   ./defect_stats_extents
 *
 * What it printed on this tree:
 *   empty          reserved 0 pooled 0 bytes_segment_free 0 free_extents 0 largest_free_extent 0
 *   alloc 64 KiB   reserved 65536 pooled 0 bytes_segment_free 0 free_extents 1 largest_free_extent 1073676288  <-- inconsistent
 *   alloc 4 MiB    reserved 4259840 pooled 0 bytes_segment_free 0 free_extents 2 largest_free_extent 1069547520  <-- inconsistent
 *   release 4 MiB  reserved 4259840 pooled 4194304 bytes_segment_free 4194304 free_extents 2 largest_free_extent 1073741824  <-- inconsistent
 *   release 64 KiB reserved 4259840 pooled 4259840 bytes_segment_free 4194304 free_extents 2 largest_free_extent 1073741824  <-- inconsistent
 *   trim           reserved 0 pooled 0 bytes_segment_free 0 free_extents 0 largest_free_extent 0
 *   4 inconsistent
 *   rc=1
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unimem.h>
#define U(x) ((unsigned long long)(x))
static int fails;
static void check(um_manager *m, const char *w) {
  um_stats s; um_stats_get(m, NULL, &s);
  int bad = s.largest_free_extent > s.bytes_segment_free || (s.free_extents != 0) != (s.bytes_segment_free != 0) || s.largest_free_extent > s.bytes_reserved;
  printf("%-14s reserved %llu pooled %llu bytes_segment_free %llu free_extents %llu largest_free_extent %llu%s\n", w, U(s.bytes_reserved), U(s.bytes_pooled), U(s.bytes_segment_free), U(s.free_extents), U(s.largest_free_extent), bad ? "  <-- inconsistent" : "");
  fails += bad;
}
int main(void) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0; snprintf(o.backends, sizeof o.backends, "cpu");
  um_manager *m; um_manager_create(&o, &m); um_device *d = um_device_get(m, 0);
  um_buffer *a, *b;
  check(m, "empty");
  um_alloc(m, d, 65536, UM_HOST, 0, &a); check(m, "alloc 64 KiB");
  um_alloc(m, d, 4u << 20, UM_HOST, 0, &b); check(m, "alloc 4 MiB");
  um_release(b); check(m, "release 4 MiB");
  um_release(a); check(m, "release 64 KiB");
  um_pool_trim(m, 0); check(m, "trim");
  um_manager_destroy(m);
  printf("%d inconsistent\n", fails);
  return fails != 0;
}
