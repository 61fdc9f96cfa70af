/* DEFECT: with segments on, the trim timer (trim_interval_ms) never gives idle segment memory back.
 * FIXED: the timer sleeps only while the bins and the segments hold nothing it could give back (seg_returnable);
 * it now prints pooled 0 reserved 0 and ends 0 (test_segments: trim_timer_gives_back_*).
 * unimem.h um_options.trim_interval_ms: "trim blocks idle this long"; design.md segment layer: "The trim timer
 * gives back a pool's free memory once nothing was carved from it for an interval". With trim_interval_ms=100,
 * 10 x 16 MiB released and then 2 s (also tried 6 s) idle: 160 MiB stays reserved, trims 0 (OpenCL DEVICE and host);
 * also 50 x 100000 B on OpenCL (6 MiB, trims 0). UNIMEM_SEGMENTS=0: everything back, trims 10 / 50.
 * Args: [device] [location] [bytes] [count]; defaults 1 1 16777216 10. Exit status 1 = still held.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/defect_trim_timer.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/defect_trim_timer
 * Run (from /tmp; binary /tmp/defect_trim_timer):
 *   POCL_DEVICES=pthread ./defect_trim_timer 1 1 ; ./defect_trim_timer 1 1 100000 50 ; ./defect_trim_timer 0 0 ; and each with UNIMEM_SEGMENTS=0
 *
 * What it printed on this tree:
 *   10 x 16777216 released: pooled 167772160 reserved 167772160 segs 10
 *   idle 2 s (trim_interval_ms 100): pooled 167772160 reserved 167772160 segs 10 trims 0  <-- still held
 *   rc=1
 *   50 x 100000 released: pooled 6291456 reserved 6291456 segs 3
 *   idle 2 s (trim_interval_ms 100): pooled 6291456 reserved 6291456 segs 3 trims 0  <-- still held
 *   rc=1
 *   10 x 16777216 released: pooled 167772160 reserved 167772160 segs 1
 *   idle 2 s (trim_interval_ms 100): pooled 167772160 reserved 167772160 segs 1 trims 0  <-- still held
 *   rc=1
 *   --- UNIMEM_SEGMENTS=0:
 *   10 x 16777216 released: pooled 167772160 reserved 167772160 segs 0
 *   idle 2 s (trim_interval_ms 100): pooled 0 reserved 0 segs 0 trims 10
 *   rc=0
 *   50 x 100000 released: pooled 5734400 reserved 5734400 segs 0
 *   idle 2 s (trim_interval_ms 100): pooled 0 reserved 0 segs 0 trims 50
 *   rc=0
 *   10 x 16777216 released: pooled 167772160 reserved 167772160 segs 0
 *   idle 2 s (trim_interval_ms 100): pooled 0 reserved 0 segs 0 trims 10
 *   rc=0
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <unimem.h>
#define U(x) ((unsigned long long)(x))
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 100;
  um_manager *m; um_manager_create(&o, &m);
  int dev = argc > 1 ? atoi(argv[1]) : 1; int loc = argc > 2 ? atoi(argv[2]) : 1;
  size_t sz = argc > 3 ? strtoul(argv[3], 0, 0) : 16u << 20; int n = argc > 4 ? atoi(argv[4]) : 10;
  if (dev >= um_device_count(m)) return 77;
  um_device *d = um_device_get(m, dev);
  um_buffer *b[1000];
  for (int i = 0; i < n; i++) um_alloc(m, d, sz, (um_location)loc, 0, &b[i]);
  for (int i = 0; i < n; i++) um_release(b[i]);
  um_stats s; um_stats_get(m, NULL, &s);
  printf("%d x %zu released: pooled %llu reserved %llu segs %llu\n", n, sz, U(s.bytes_pooled), U(s.bytes_reserved), U(s.segments));
  usleep(2000000);
  um_stats_get(m, NULL, &s);
  printf("idle 2 s (trim_interval_ms 100): pooled %llu reserved %llu segs %llu trims %llu%s\n", U(s.bytes_pooled), U(s.bytes_reserved), U(s.segments), U(s.trims), s.bytes_reserved ? "  <-- still held" : "");
  um_manager_destroy(m);
  return s.bytes_reserved != 0;
}
