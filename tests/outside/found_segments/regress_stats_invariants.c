/* REGRESSION (held, except the largest_free_extent check: see defect_stats_extents.c): single thread, random
 * alloc/release/trim steps (ZERO, UNPOOLED flags); after every step checks: active_buffers, bytes_in_use exact;
 * reserved >= in_use; segment_free <= pooled <= reserved; reserved - pooled >= in_use;
 * largest_free_extent <= bytes_segment_free (skip with NOLFE=1); free_extents == 0 iff segment_free == 0;
 * allocations - releases == active; hits + misses + unpooled == allocations; 0 <= fragmentation <= 1;
 * after releasing all and um_pool_trim(m,0): reserved, pooled, segments, extents all 0. Arg: steps.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_stats_invariants.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_stats_invariants
 * Run (from /tmp; binary /tmp/regress_stats_invariants):
 *   NOLFE=1 ./regress_stats_invariants 4000 ; UNIMEM_SEGMENTS=0 NOLFE=1 ./regress_stats_invariants 4000 ; ./regress_stats_invariants 300
 *
 * What it printed on this tree:
 *   end after trim: active 0 inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0 lpb 0 hits 1790 miss 2 allocs 1988 rel 1988 trims 66 btrim 4720295936 dallocs 198 dfrees 198
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   end after trim: active 0 inuse 0 reserved 0 pooled 0 segs 0 segfree 0 ext 0 largest 0 lpb 0 hits 806 miss 986 allocs 1988 rel 1988 trims 986 btrim 6420174980 dallocs 1182 dfrees 1182
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   step 0 after alloc: !(s.largest_free_extent <= s.bytes_segment_free)
 *     stats: active 1 inuse 3046 reserved 65536 pooled 62464 segs 1 segfree 62464 ext 1 largest 1073738752 lpb 62464 hits 0 miss 1 allocs 1 rel 0 trims 0 btrim 0 dallocs 1 dfrees 0
 *   step 1 after alloc: !(s.largest_free_extent <= s.bytes_segment_free)
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>

#define N 64
static int fails;
static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
#define U(x) ((unsigned long long)(x))
static void dump(const char *w, const um_stats *s) {
  fprintf(stderr, "%s: active %llu inuse %llu reserved %llu pooled %llu segs %llu segfree %llu ext %llu largest %llu lpb %llu hits %llu miss %llu allocs %llu rel %llu trims %llu btrim %llu dallocs %llu dfrees %llu\n",
          w, U(s->active_buffers), U(s->bytes_in_use), U(s->bytes_reserved), U(s->bytes_pooled), U(s->segments), U(s->bytes_segment_free),
          U(s->free_extents), U(s->largest_free_extent), U(s->largest_pooled_block), U(s->pool_hits), U(s->pool_misses), U(s->allocations), U(s->releases), U(s->trims), U(s->bytes_trimmed), U(s->device_allocs), U(s->device_frees));
}
static void inv(um_manager *m, um_device *d, int step, const char *what, uint64_t live, uint64_t inuse, uint64_t unpooled_allocs) {
  um_stats s, a;
  um_stats_get(m, d, &s);
  um_stats_get(m, NULL, &a);
  char why[512] = "";
#define CHK(c) do { if (!(c)) { snprintf(why + strlen(why), sizeof why - strlen(why), " !(" #c ")"); } } while (0)
  CHK(s.active_buffers == live);
  CHK(s.bytes_in_use == inuse);
  CHK(s.bytes_reserved >= s.bytes_in_use);
  CHK(s.bytes_pooled <= s.bytes_reserved);
  CHK(s.bytes_segment_free <= s.bytes_pooled);
  CHK(s.bytes_reserved - s.bytes_pooled >= s.bytes_in_use);
  if (!getenv("NOLFE")) CHK(s.largest_free_extent <= s.bytes_segment_free);
  CHK((s.free_extents == 0) == (s.bytes_segment_free == 0));
  CHK(s.largest_free_extent * s.free_extents >= s.bytes_segment_free);
  CHK(s.fragmentation >= 0.0 && s.fragmentation <= 1.0);
  CHK(s.largest_pooled_block <= s.bytes_pooled);
  CHK(s.allocations - s.releases == s.active_buffers);
  CHK(s.pool_hits + s.pool_misses + unpooled_allocs == s.allocations);
  CHK(s.segments > 0 || s.bytes_segment_free == 0);
  CHK(a.bytes_reserved == s.bytes_reserved && a.segments == s.segments && a.bytes_segment_free == s.bytes_segment_free && a.free_extents == s.free_extents);
  CHK(s.peak_bytes_in_use >= s.bytes_in_use);
  if (why[0]) {
    if (fails < 10) { fprintf(stderr, "step %d after %s:%s\n", step, what, why); dump("  stats", &s); }
    fails++;
  }
}

int main(int argc, char **argv) {
  um_options o; um_options_init(&o);
  o.trim_interval_ms = 0;
  snprintf(o.backends, sizeof o.backends, "cpu");
  int steps = argc > 1 ? atoi(argv[1]) : 20000;
  um_manager *m; if (um_manager_create(&o, &m)) return 2;
  um_device *d = um_device_get(m, 0);
  um_buffer *b[N] = {0}; size_t n[N] = {0};
  uint64_t s = 88172645463325252ull, live = 0, inuse = 0, unp = 0;
  for (int i = 0; i < steps; i++) {
    int k = (int)(rng(&s) % N);
    uint64_t r = rng(&s) % 1000;
    const char *what;
    if (r < 5) { um_pool_trim(m, 0); what = "trim0"; }
    else if (r < 10) { um_pool_trim(m, rng(&s) % (64u << 20)); what = "trimK"; }
    else if (b[k]) {
      uint8_t *p = um_buffer_host_ptr(b[k]);
      for (size_t j = 0; j < n[k]; j += 4093) if (p[j] != (uint8_t)(k + j)) { fprintf(stderr, "corrupt\n"); fails++; break; }
      um_release(b[k]); b[k] = NULL; live--; inuse -= n[k]; what = "release";
    } else {
      size_t sz; uint64_t q = rng(&s) % 10;
      if (q < 5) sz = 1 + rng(&s) % 8192; else if (q < 8) sz = 1 + rng(&s) % (2u << 20); else sz = 1 + rng(&s) % (48u << 20);
      unsigned fl = 0;
      if (rng(&s) % 5 == 0) fl |= UM_ALLOC_ZERO;
      if (rng(&s) % 10 == 0) fl |= UM_ALLOC_UNPOOLED;
      int st = um_alloc(m, d, sz, UM_HOST, fl, &b[k]);
      if (st) { fprintf(stderr, "alloc %zu failed %s\n", sz, um_err_name(st)); fails++; b[k] = NULL; continue; }
      uint8_t *p = um_buffer_host_ptr(b[k]);
      if (fl & UM_ALLOC_ZERO) for (size_t j = 0; j < sz; j++) if (p[j]) { fprintf(stderr, "step %d NOT ZERO %zu at %zu\n", i, sz, j); fails++; break; }
      for (size_t j = 0; j < sz; j += 4093) p[j] = (uint8_t)(k + j);
      if (fl & UM_ALLOC_UNPOOLED) unp++;
      n[k] = sz; live++; inuse += sz; what = (fl & UM_ALLOC_UNPOOLED) ? "alloc-unpooled" : "alloc";
    }
    inv(m, d, i, what, live, inuse, unp);
  }
  for (int k = 0; k < N; k++) if (b[k]) { um_release(b[k]); live--; inuse -= n[k]; inv(m, d, -1, "final release", live, inuse, unp); }
  um_pool_trim(m, 0);
  um_stats st; um_stats_get(m, NULL, &st);
  dump("end after trim", &st);
  if (st.bytes_reserved || st.segments || st.bytes_pooled || st.free_extents || st.bytes_segment_free) { fprintf(stderr, "NOT EMPTY after trim\n"); fails++; }
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(m)), fails);
  return fails != 0;
}
