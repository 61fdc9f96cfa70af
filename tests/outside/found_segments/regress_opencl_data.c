/* REGRESSION (held): OpenCL (PoCL pthread) device 1: random-size buffers (1 B - 6 MiB, some UM_ALLOC_ZERO) written
 * with two um_copy_from_host calls, read back with um_copy_to_host and compared; periodic um_pool_trim.
 * Arg: location (1 DEVICE, 2 PINNED, 3 UNIFIED). "min offset alignment" prints SIZE_MAX because
 * um_buffer_native.offset is 0 (the cl_mem is the sub-buffer itself; see regress_opencl_subbuffers.c).
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_opencl_data.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_opencl_data
 * Run (from /tmp; binary /tmp/regress_opencl_data):
 *   POCL_DEVICES=pthread ./regress_opencl_data 1 (and 2, 3)
 *
 * What it printed on this tree:
 *   all released         inuse 0 reserved 6291456 pooled 6291456 segs 3 segfree 2998208 ext 8 largest 1382656 hits 725 miss 32 dallocs 32 dfrees 29
 *   trimmed              inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0 hits 725 miss 32 dallocs 32 dfrees 32
 *   min offset alignment 18446744073709551615
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   all released         inuse 0 reserved 6291456 pooled 6291456 segs 3 segfree 2998208 ext 8 largest 1382656 hits 725 miss 32 dallocs 32 dfrees 29
 *   trimmed              inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0 hits 725 miss 32 dallocs 32 dfrees 32
 *   min offset alignment 18446744073709551615
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   all released         inuse 0 reserved 6291456 pooled 6291456 segs 3 segfree 2998208 ext 8 largest 1382656 hits 725 miss 32 dallocs 32 dfrees 29
 *   trimmed              inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0 hits 725 miss 32 dallocs 32 dfrees 32
 *   min offset alignment 18446744073709551615
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
static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
static void dump(um_manager *m, um_device *d, const char *w) {
  um_stats s; um_stats_get(m, d, &s);
  printf("%-20s inuse %llu reserved %llu pooled %llu segs %llu segfree %llu ext %llu largest %llu hits %llu miss %llu dallocs %llu dfrees %llu\n",
          w, U(s.bytes_in_use), U(s.bytes_reserved), U(s.bytes_pooled), U(s.segments), U(s.bytes_segment_free),
          U(s.free_extents), U(s.largest_free_extent), U(s.pool_hits), U(s.pool_misses), U(s.device_allocs), U(s.device_frees));
}
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0;
  int loc = argc > 1 ? atoi(argv[1]) : UM_DEVICE;
  um_manager *m; int st = um_manager_create(&o, &m);
  if (st) { printf("create %s\n", um_err_name(st)); return 2; }
  printf("devices %d\n", um_device_count(m));
  if (um_device_count(m) < 2) return 77;
  um_device *d = um_device_get(m, 1);
  um_device_info inf; um_device_info_get(d, &inf); printf("dev1 %s %s total %llu locs %#x\n", inf.name, inf.backend, U(inf.total_bytes), inf.locations);
  uint64_t s = 7;
  enum { K = 24 };
  um_buffer *b[K] = {0}; size_t n[K]; uint8_t *h[K] = {0};
  size_t minoff_align = SIZE_MAX;
  for (int it = 0; it < 1500; it++) {
    int k = (int)(rng(&s) % K);
    if (b[k]) {
      uint8_t *back = malloc(n[k]);
      st = um_copy_to_host(b[k], 0, back, n[k], NULL);
      if (st) { printf("copy_to_host %s %s\n", um_err_name(st), um_last_error()); fails++; }
      else if (memcmp(back, h[k], n[k])) { size_t i = 0; while (back[i] == h[k][i]) i++; printf("WRONG DATA it %d size %zu at %zu\n", it, n[k], i); fails++; }
      free(back); free(h[k]); h[k] = NULL;
      um_release(b[k]); b[k] = NULL;
    } else {
      uint64_t q = rng(&s) % 10;
      n[k] = q < 6 ? 1 + rng(&s) % 5000 : q < 9 ? 1 + rng(&s) % (1u << 20) : 1 + rng(&s) % (6u << 20);
      unsigned fl = rng(&s) % 4 == 0 ? UM_ALLOC_ZERO : 0;
      st = um_alloc(m, d, n[k], (um_location)loc, fl, &b[k]);
      if (st) { printf("alloc %zu %s %s\n", n[k], um_err_name(st), um_last_error()); fails++; b[k] = NULL; continue; }
      um_buffer_native nat; um_buffer_native_get(b[k], &nat);
      if (nat.offset) { size_t a = nat.offset & -nat.offset; if (a < minoff_align) minoff_align = a; }
      h[k] = malloc(n[k]);
      if (fl) {
        st = um_copy_to_host(b[k], 0, h[k], n[k], NULL);
        for (size_t i = 0; i < n[k]; i++) if (h[k][i]) { printf("NOT ZERO it %d size %zu at %zu\n", it, n[k], i); fails++; break; }
      }
      for (size_t i = 0; i < n[k]; i++) h[k][i] = (uint8_t)rng(&s);
      /* write in two parts, at an offset */
      size_t cut = n[k] / 3;
      st = um_copy_from_host(b[k], 0, h[k], cut, NULL);
      st |= um_copy_from_host(b[k], cut, h[k] + cut, n[k] - cut, NULL);
      if (st) { printf("copy_from_host %s %s\n", um_err_name(st), um_last_error()); fails++; }
    }
    if (it % 300 == 299) um_pool_trim(m, 0);
  }
  dump(m, d, "before end");
  for (int k = 0; k < K; k++) if (b[k]) { free(h[k]); um_release(b[k]); }
  dump(m, d, "all released");
  um_pool_trim(m, 0);
  dump(m, d, "trimmed");
  printf("min offset alignment %zu\n", minoff_align);
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(m)), fails);
  return fails != 0;
}
