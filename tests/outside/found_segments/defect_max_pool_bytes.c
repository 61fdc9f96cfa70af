/* DEFECT: with segments on (the default) max_pool_bytes does not bound the idle bytes the pool keeps.
 * FIXED: the bins and the segments' free bytes count together against max_pool_bytes (segment.c over_cap,
 * pool.c claim); it now prints bytes_pooled 67108864 in every row and ends 0 (test_segments: max_pool_bytes_*).
 * SPEC.md section 4 "Pool": "Bounded by max_pool_bytes and per class"; unimem.h um_options: max_pool_bytes =
 * "idle bytes kept in all pools together"; um_stats.bytes_pooled = "bytes idle in the pool".
 * With max_pool_bytes = 64 MiB, releasing 40 x 16 MiB leaves bytes_pooled = 640 MiB (host RSS 720 MiB;
 * also on the OpenCL device); UNIMEM_SEGMENTS=0 keeps exactly 64 MiB. Exit status 1 = over the cap.
 * Args: [device index] [location]; defaults 0 0 (host).
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/defect_max_pool_bytes.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/defect_max_pool_bytes
 * Run (from /tmp; binary /tmp/defect_max_pool_bytes):
 *   ./defect_max_pool_bytes ; UNIMEM_SEGMENTS=0 ./defect_max_pool_bytes ; POCL_DEVICES=pthread ./defect_max_pool_bytes 1 1
 *
 * What it printed on this tree:
 *   40 x 16777216 released: bytes_pooled 671088640 (max_pool_bytes 67108864) reserved 671088640 segments 1 segfree 671088640 rss 720 MiB  <-- OVER max_pool_bytes
 *   100 x 3145728 released: bytes_pooled 671088640 (max_pool_bytes 67108864) reserved 671088640 segments 1 segfree 671088640 rss 720 MiB  <-- OVER max_pool_bytes
 *   2000 x 200000 released: bytes_pooled 458752000 (max_pool_bytes 67108864) reserved 458752000 segments 1 segfree 391774208 rss 520 MiB  <-- OVER max_pool_bytes
 *   rc=1
 *   --- UNIMEM_SEGMENTS=0:
 *   40 x 16777216 released: bytes_pooled 67108864 (max_pool_bytes 67108864) reserved 67108864 segments 0 segfree 0 rss 144 MiB
 *   100 x 3145728 released: bytes_pooled 67108864 (max_pool_bytes 67108864) reserved 67108864 segments 0 segfree 0 rss 144 MiB
 *   2000 x 200000 released: bytes_pooled 66945024 (max_pool_bytes 67108864) reserved 66945024 segments 0 segfree 0 rss 396 MiB
 *   rc=0
 *   --- OpenCL: ./defect_max_pool_bytes 1 1
 *   40 x 16777216 released: bytes_pooled 671088640 (max_pool_bytes 67108864) reserved 671088640 segments 40 segfree 671088640 rss 80 MiB  <-- OVER max_pool_bytes
 *   100 x 3145728 released: bytes_pooled 671088640 (max_pool_bytes 67108864) reserved 671088640 segments 40 segfree 671088640 rss 80 MiB  <-- OVER max_pool_bytes
 *   2000 x 200000 released: bytes_pooled 467664896 (max_pool_bytes 67108864) reserved 467664896 segments 223 segfree 400687104 rss 83 MiB  <-- OVER max_pool_bytes
 *   rc=1
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <unimem.h>
#define U(x) ((unsigned long long)(x))
static long rss_mib(void) { long a, r; FILE *f = fopen("/proc/self/statm", "r"); if (fscanf(f, "%ld %ld", &a, &r) != 2) r = 0; fclose(f); return r * sysconf(_SC_PAGESIZE) >> 20; }
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0;
  o.max_pool_bytes = 64u << 20;
  um_manager *m; um_manager_create(&o, &m);
  int dev = argc > 1 ? atoi(argv[1]) : 0; int loc = argc > 2 ? atoi(argv[2]) : 0;
  if (dev >= um_device_count(m)) return 77;
  um_device *d = um_device_get(m, dev);
  size_t sz[] = {16u << 20, 3u << 20, 200000};
  int cnt[] = {40, 100, 2000};
  int fails = 0;
  for (int t = 0; t < 3; t++) {
    um_buffer **b = calloc(cnt[t], sizeof *b);
    for (int i = 0; i < cnt[t]; i++) { if (um_alloc(m, d, sz[t], (um_location)loc, 0, &b[i])) { puts("alloc failed"); return 2; } if (loc != UM_DEVICE) memset(um_buffer_host_ptr(b[i]), 1, sz[t]); }
    for (int i = 0; i < cnt[t]; i++) um_release(b[i]);
    free(b);
    um_stats s; um_stats_get(m, NULL, &s);
    printf("%d x %zu released: bytes_pooled %llu (max_pool_bytes %llu) reserved %llu segments %llu segfree %llu rss %ld MiB%s\n", cnt[t], sz[t], U(s.bytes_pooled), U(o.max_pool_bytes), U(s.bytes_reserved), U(s.segments), U(s.bytes_segment_free), rss_mib(),
           s.bytes_pooled > o.max_pool_bytes ? "  <-- OVER max_pool_bytes" : "");
    if (s.bytes_pooled > o.max_pool_bytes) fails++;
  }
  um_manager_destroy(m);
  return fails != 0;
}
