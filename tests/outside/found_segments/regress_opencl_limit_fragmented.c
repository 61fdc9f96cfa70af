/* REGRESSION (held): device_limit_bytes = 8 MiB on the OpenCL device; fill with 100000-byte buffers until
 * UM_ENOMEM, free every other, ask 2 MiB: UM_ENOMEM with a message naming free bytes / extents / largest;
 * live data intact, holes refill, after releasing all a 7 MiB buffer fits, 9 MiB answers UM_ENOMEM.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_opencl_limit_fragmented.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_opencl_limit_fragmented
 * Run (from /tmp; binary /tmp/regress_opencl_limit_fragmented):
 *   POCL_DEVICES=pthread ./regress_opencl_limit_fragmented
 *
 * What it printed on this tree (library before commit 58ad4a5, which lengthened the UM_ENOMEM text):
 *   after 72 x 100000: UM_ENOMEM: um_alloc: 114688 bytes on pthread-skylake-avx512-AMD EPYC: the device gave no new segment (opencl: 114688 bytes on pthread-skylake-avx512-AMD EPYC would pass device_limit_bytes (8388608 bytes, 8388608 in use)), and the 131072 free bytes of its 4 segments lie in 4 extents, the largest 32768 bytes
 *   full                   inuse 7200000 reserved 8388608 pooled 131072 segs 4 segfree 131072 ext 4 largest 32768 dallocs 4 dfrees 0 oomr 1
 *   half released          inuse 3600000 reserved 8388608 pooled 4259840 segs 4 segfree 131072 ext 4 largest 32768 dallocs 4 dfrees 0 oomr 1
 *   2 MiB in fragmented pool: UM_ENOMEM: um_alloc: 2097152 bytes on pthread-skylake-avx512-AMD EPYC: the device gave no new segment (opencl: 2097152 bytes on pthread-skylake-avx512-AMD EPYC would pass device_limit_bytes (8388608 bytes, 8388608 in use)), and the 4259840 free bytes of its 4 segments lie in 40 extents, the largest 114688 bytes
 *   after big              inuse 3600000 reserved 8388608 pooled 4259840 segs 4 segfree 4259840 ext 40 largest 114688 dallocs 4 dfrees 0 oomr 2
 *   refilled 36 of 36 holes
 *   all released           inuse 0 reserved 8388608 pooled 8388608 segs 4 segfree 131072 ext 4 largest 32768 dallocs 4 dfrees 0 oomr 2
 *   7 MiB after release: UM_OK: 
 *   7M                     inuse 7340032 reserved 8388608 pooled 1048576 segs 1 segfree 1048576 ext 1 largest 1048576 dallocs 5 dfrees 4 oomr 2
 *   9 MiB over limit: UM_ENOMEM: opencl: 9437184 bytes on pthread-skylake-avx512-AMD EPYC would pass device_limit_bytes (8388608 bytes, 0 in use)
 *   trim                   inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0 dallocs 5 dfrees 5 oomr 3
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
static void dump(um_manager *m, um_device *d, const char *w) {
  um_stats s; um_stats_get(m, d, &s);
  printf("%-22s inuse %llu reserved %llu pooled %llu segs %llu segfree %llu ext %llu largest %llu dallocs %llu dfrees %llu oomr %llu\n",
          w, U(s.bytes_in_use), U(s.bytes_reserved), U(s.bytes_pooled), U(s.segments), U(s.bytes_segment_free),
          U(s.free_extents), U(s.largest_free_extent), U(s.device_allocs), U(s.device_frees), U(s.oom_retries));
}
static int check(um_buffer *b, size_t n, uint8_t v) {
  uint8_t *h = malloc(n); int bad = 0;
  if (um_copy_to_host(b, 0, h, n, NULL)) bad = 1;
  else for (size_t i = 0; i < n; i++) if (h[i] != v) { bad = 1; break; }
  free(h); return bad;
}
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0; o.device_limit_bytes = 8u << 20;
  size_t bs = argc > 1 ? strtoul(argv[1], 0, 0) : 100000;
  um_manager *m; if (um_manager_create(&o, &m) || um_device_count(m) < 2) return 77;
  um_device *d = um_device_get(m, 1);
  enum { K = 4096 }; static um_buffer *b[K]; int nb = 0, st;
  uint8_t *pat = malloc(8u << 20);
  while (nb < K) {
    st = um_alloc(m, d, bs, UM_DEVICE, 0, &b[nb]);
    if (st) { printf("after %d x %zu: %s: %s\n", nb, bs, um_err_name(st), um_last_error()); break; }
    memset(pat, nb & 0xff, bs);
    um_copy_from_host(b[nb], 0, pat, bs, NULL); nb++;
  }
  dump(m, d, "full");
  for (int i = 0; i < nb; i += 2) { um_release(b[i]); b[i] = NULL; }
  dump(m, d, "half released");
  um_buffer *big = NULL;
  st = um_alloc(m, d, 2u << 20, UM_DEVICE, 0, &big);
  printf("2 MiB in fragmented pool: %s: %s\n", um_err_name(st), st ? um_last_error() : "");
  if (!st) { memset(pat, 0xEE, 2u << 20); um_copy_from_host(big, 0, pat, 2u << 20, NULL); }
  dump(m, d, "after big");
  for (int i = 1; i < nb; i += 2) if (check(b[i], bs, i & 0xff)) { printf("WRONG DATA in live block %d\n", i); fails++; }
  if (!st) { if (check(big, 2u << 20, 0xEE)) { printf("WRONG DATA in big\n"); fails++; } um_release(big); }
  /* refill the holes */
  int refilled = 0;
  for (int i = 0; i < nb; i += 2) { if (um_alloc(m, d, bs, UM_DEVICE, 0, &b[i]) == 0) { memset(pat, i & 0xff, bs); um_copy_from_host(b[i], 0, pat, bs, NULL); refilled++; } else b[i] = NULL; }
  printf("refilled %d of %d holes\n", refilled, (nb + 1) / 2);
  for (int i = 0; i < nb; i++) if (b[i] && check(b[i], bs, i & 0xff)) { printf("WRONG DATA block %d after refill\n", i); fails++; }
  for (int i = 0; i < nb; i++) if (b[i]) um_release(b[i]);
  dump(m, d, "all released");
  st = um_alloc(m, d, 7u << 20, UM_DEVICE, 0, &big);
  printf("7 MiB after release: %s: %s\n", um_err_name(st), st ? um_last_error() : "");
  dump(m, d, "7M");
  if (!st) { memset(pat, 0x3C, 7u << 20); um_copy_from_host(big, 0, pat, 7u << 20, NULL); if (check(big, 7u << 20, 0x3C)) { fails++; puts("WRONG 7M"); } um_release(big); } else fails++;
  st = um_alloc(m, d, 9u << 20, UM_DEVICE, 0, &big);
  printf("9 MiB over limit: %s: %s\n", um_err_name(st), st ? um_last_error() : "");
  if (st != UM_ENOMEM) fails++; else {}
  if (!st) um_release(big);
  um_pool_trim(m, 0); dump(m, d, "trim");
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(m)), fails);
  free(pat);
  return fails != 0;
}
