/* REGRESSION (held): 6 threads alloc / async copy in / copy out / compare / release on the OpenCL device while a
 * thread calls um_pool_trim(m, 0) every 1 ms; after all, trim leaves reserved 0, segments 0. Arg: location.
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_opencl_mt_trim.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_opencl_mt_trim
 * Run (from /tmp; binary /tmp/regress_opencl_mt_trim):
 *   POCL_DEVICES=pthread ./regress_opencl_mt_trim 1 (and 2, 3)
 *
 * What it printed on this tree:
 *   ops 1358; after trim reserved 0 segs 0 pooled 0
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   ops 1752; after trim reserved 0 segs 0 pooled 0
 *   destroy UM_OK, 0 failures
 *   rc=0
 *   ops 2587; after trim reserved 0 segs 0 pooled 0
 *   destroy UM_OK, 0 failures
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
static um_manager *M; static um_device *D; static int LOC = UM_DEVICE; static atomic_int fails, stop; static atomic_long ops;
static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *worker(void *arg) {
  uint64_t s = 1000 + (uint64_t)(intptr_t)arg * 77;
  enum { K = 8 }; um_buffer *b[K] = {0}; size_t n[K]; uint8_t *h[K] = {0};
  double end = now() + 6;
  while (now() < end && atomic_load(&fails) < 5) {
    int k = (int)(rng(&s) % K);
    if (b[k]) {
      uint8_t *back = malloc(n[k]);
      int st = um_copy_to_host(b[k], 0, back, n[k], NULL);
      if (st) { printf("to_host %s %s\n", um_err_name(st), um_last_error()); atomic_fetch_add(&fails, 1); }
      else if (memcmp(back, h[k], n[k])) { size_t i = 0; while (back[i] == h[k][i]) i++; printf("WRONG DATA size %zu at %zu\n", n[k], i); atomic_fetch_add(&fails, 1); }
      free(back); free(h[k]); um_release(b[k]); b[k] = NULL;
    } else {
      n[k] = rng(&s) % 4 ? 1 + rng(&s) % 20000 : 1 + rng(&s) % (4u << 20);
      int z = rng(&s) % 3 == 0;
      int st = um_alloc(M, D, n[k], (um_location)LOC, z ? UM_ALLOC_ZERO : 0, &b[k]);
      if (st) { printf("alloc %zu %s %s\n", n[k], um_err_name(st), um_last_error()); atomic_fetch_add(&fails, 1); b[k] = NULL; continue; }
      h[k] = malloc(n[k]);
      if (z) { um_copy_to_host(b[k], 0, h[k], n[k], NULL); for (size_t i = 0; i < n[k]; i++) if (h[k][i]) { printf("NOT ZERO size %zu at %zu\n", n[k], i); atomic_fetch_add(&fails, 1); break; } }
      for (size_t i = 0; i < n[k]; i++) h[k][i] = (uint8_t)(rng(&s) >> 13);
      um_event *e; st = um_copy_from_host(b[k], 0, h[k], n[k], &e);
      if (st) { printf("from_host %s\n", um_err_name(st)); atomic_fetch_add(&fails, 1); }
      else { if (rng(&s) % 2) { um_event_wait(e); } um_event_release(e); }
      /* host memory h[k] stays valid until the later copy_to_host */
    }
    atomic_fetch_add(&ops, 1);
  }
  for (int k = 0; k < K; k++) if (b[k]) { uint8_t one; um_copy_to_host(b[k], 0, &one, 1, NULL); um_release(b[k]); free(h[k]); }
  return NULL;
}
static void *trimmer(void *a) { (void)a; while (!atomic_load(&stop)) { um_pool_trim(M, 0); usleep(1000); } return NULL; }
int main(int argc, char **argv) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0;
  if (argc > 1) LOC = atoi(argv[1]);
  if (um_manager_create(&o, &M) || um_device_count(M) < 2) return 77;
  D = um_device_get(M, 1);
  pthread_t t[6], tr; pthread_create(&tr, NULL, trimmer, NULL);
  for (int i = 0; i < 6; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < 6; i++) pthread_join(t[i], NULL);
  atomic_store(&stop, 1); pthread_join(tr, NULL);
  um_pool_trim(M, 0);
  um_stats s; um_stats_get(M, NULL, &s);
  printf("ops %ld; after trim reserved %llu segs %llu pooled %llu\n", atomic_load(&ops), (unsigned long long)s.bytes_reserved, (unsigned long long)s.segments, (unsigned long long)s.bytes_pooled);
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(M)), atomic_load(&fails));
  return atomic_load(&fails) != 0;
}
