/* REGRESSION (held): 8 threads allocate random sizes 1 B - 64 MiB on the host with segments, write a pattern over
 * the whole buffer, check it before release, check explicitly that no two live buffers' host ranges overlap,
 * check UM_ALLOC_ZERO blocks read zero; optional trimmer thread calls um_pool_trim(m, 0) every 2 ms.
 * Args: [trimmer 0/1] [seconds]. Exit 1 = corruption/overlap/non-zero.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_mt_integrity.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_mt_integrity
 * Run (from /tmp; binary /tmp/regress_mt_integrity):
 *   ./regress_mt_integrity 1 6 ; UNIMEM_SEGMENTS=0 ./regress_mt_integrity 1 4
 *
 * What it printed on this tree:
 *   allocs 1887 trims 2230 reserved 3735552 pooled 3735552 inuse 0 segs 2 segfree 2818048
 *   after trim: reserved 0 pooled 0 segs 0 segfree 0 extents 0 largest 0 active 0
 *   destroy UM_OK failures 0
 *   rc=0
 *   allocs 1300 trims 1555 reserved 8388608 pooled 8388608 inuse 0 segs 0 segfree 0
 *   after trim: reserved 0 pooled 0 segs 0 segfree 0 extents 0 largest 0 active 0
 *   destroy UM_OK failures 0
 *   rc=0
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <unimem.h>

#define NT 8
#define SLOTS 16
#define MAXLIVE (NT * SLOTS)
static um_manager *M;
static um_device *D;
static double DURATION = 8.0;
static atomic_int failures;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uintptr_t lo, hi; int used; } reg[MAXLIVE];
static int do_trim = 0;
static atomic_long allocs, trims_done;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static int reg_add(int idx, uintptr_t lo, size_t n) {
  int bad = 0;
  pthread_mutex_lock(&reg_lock);
  for (int i = 0; i < MAXLIVE; i++)
    if (reg[i].used && lo < reg[i].hi && reg[i].lo < lo + n) {
      fprintf(stderr, "OVERLAP: new [%#lx,+%zu) with live [%#lx,%#lx)\n", (unsigned long)lo, n,
              (unsigned long)reg[i].lo, (unsigned long)reg[i].hi);
      bad = 1;
    }
  reg[idx].lo = lo; reg[idx].hi = lo + n; reg[idx].used = 1;
  pthread_mutex_unlock(&reg_lock);
  return bad;
}
static void reg_del(int idx) { pthread_mutex_lock(&reg_lock); reg[idx].used = 0; pthread_mutex_unlock(&reg_lock); }

static size_t pick_size(uint64_t *s) {
  uint64_t r = rng(s) % 100;
  if (r < 50) return 1 + rng(s) % 4096;
  if (r < 80) return 1 + rng(s) % (1u << 20);
  if (r < 95) return (1u << 20) + rng(s) % (8u << 20);
  return 1 + rng(s) % (64u << 20);
}
static inline uint64_t pat(uint64_t seed, size_t i) { return (seed * 0x9E3779B97F4A7C15ull) ^ (i * 0xD6E8FEB86659FD93ull); }
static void fill(uint8_t *p, size_t n, uint64_t seed) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) { uint64_t v = pat(seed, i); memcpy(p + i, &v, 8); }
  for (; i < n; i++) p[i] = (uint8_t)(pat(seed, i & ~7ul) >> (8 * (i & 7)));
}
static size_t check(const uint8_t *p, size_t n, uint64_t seed) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) { uint64_t v = pat(seed, i), w; memcpy(&w, p + i, 8); if (v != w) return i; }
  for (; i < n; i++) if (p[i] != (uint8_t)(pat(seed, i & ~7ul) >> (8 * (i & 7)))) return i;
  return SIZE_MAX;
}

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  uint64_t s = 0x1234567ull + (uint64_t)t * 7919;
  um_buffer *b[SLOTS] = {0}; size_t n[SLOTS] = {0}; uint64_t sd[SLOTS] = {0}; int zero[SLOTS] = {0};
  double end = now() + DURATION;
  while (now() < end && atomic_load(&failures) < 5) {
    int k = (int)(rng(&s) % SLOTS);
    if (b[k]) {
      uint8_t *p = um_buffer_host_ptr(b[k]);
      size_t off = check(p, n[k], sd[k]);
      if (off != SIZE_MAX) {
        fprintf(stderr, "T%d CORRUPT buf %p size %zu at off %zu (zero=%d)\n", t, (void *)p, n[k], off, zero[k]);
        atomic_fetch_add(&failures, 1);
      }
      reg_del(t * SLOTS + k);
      int st = um_release(b[k]);
      if (st != UM_OK) { fprintf(stderr, "release %s\n", um_err_name(st)); atomic_fetch_add(&failures, 1); }
      b[k] = NULL;
    } else {
      size_t sz = pick_size(&s);
      unsigned fl = (rng(&s) % 4 == 0) ? UM_ALLOC_ZERO : 0;
      int st = um_alloc(M, D, sz, UM_HOST, fl, &b[k]);
      if (st != UM_OK) { fprintf(stderr, "alloc %zu: %s %s\n", sz, um_err_name(st), um_last_error()); atomic_fetch_add(&failures, 1); b[k] = NULL; continue; }
      atomic_fetch_add(&allocs, 1);
      uint8_t *p = um_buffer_host_ptr(b[k]);
      if (!p) { fprintf(stderr, "no host ptr\n"); atomic_fetch_add(&failures, 1); continue; }
      if (reg_add(t * SLOTS + k, (uintptr_t)p, sz)) atomic_fetch_add(&failures, 1);
      if (fl & UM_ALLOC_ZERO) {
        for (size_t i = 0; i < sz; i++) if (p[i]) { fprintf(stderr, "T%d NOT ZERO size %zu at %zu val %u\n", t, sz, i, p[i]); atomic_fetch_add(&failures, 1); break; }
      }
      n[k] = sz; sd[k] = rng(&s); zero[k] = !!fl;
      fill(p, sz, sd[k]);
    }
  }
  for (int k = 0; k < SLOTS; k++) if (b[k]) {
    uint8_t *p = um_buffer_host_ptr(b[k]);
    if (check(p, n[k], sd[k]) != SIZE_MAX) { fprintf(stderr, "final CORRUPT\n"); atomic_fetch_add(&failures, 1); }
    reg_del(t * SLOTS + k); um_release(b[k]);
  }
  return NULL;
}
static atomic_int stop_trim;
static void *trimmer(void *a) { (void)a; while (!atomic_load(&stop_trim)) { um_pool_trim(M, 0); atomic_fetch_add(&trims_done, 1); usleep(2000); } return NULL; }

int main(int argc, char **argv) {
  um_options o; um_options_init(&o);
  o.trim_interval_ms = 0;
  if (argc > 1) do_trim = atoi(argv[1]);
  if (argc > 2) DURATION = atof(argv[2]);
  snprintf(o.backends, sizeof o.backends, "cpu");
  if (um_manager_create(&o, &M) != UM_OK) { puts("create failed"); return 2; }
  D = um_device_get(M, 0);
  pthread_t th[NT], tr;
  if (do_trim) pthread_create(&tr, NULL, trimmer, NULL);
  for (int i = 0; i < NT; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
  atomic_store(&stop_trim, 1);
  if (do_trim) pthread_join(tr, NULL);
  um_stats s; um_stats_get(M, NULL, &s);
  printf("allocs %ld trims %ld reserved %llu pooled %llu inuse %llu segs %llu segfree %llu\n", atomic_load(&allocs), atomic_load(&trims_done),
         (unsigned long long)s.bytes_reserved, (unsigned long long)s.bytes_pooled, (unsigned long long)s.bytes_in_use,
         (unsigned long long)s.segments, (unsigned long long)s.bytes_segment_free);
  um_pool_trim(M, 0);
  um_stats_get(M, NULL, &s);
  printf("after trim: reserved %llu pooled %llu segs %llu segfree %llu extents %llu largest %llu active %llu\n",
         (unsigned long long)s.bytes_reserved, (unsigned long long)s.bytes_pooled, (unsigned long long)s.segments,
         (unsigned long long)s.bytes_segment_free, (unsigned long long)s.free_extents, (unsigned long long)s.largest_free_extent,
         (unsigned long long)s.active_buffers);
  int st = um_manager_destroy(M);
  printf("destroy %s failures %d\n", um_err_name(st), atomic_load(&failures));
  return atomic_load(&failures) ? 1 : 0;
}
