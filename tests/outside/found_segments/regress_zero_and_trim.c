/* REGRESSION (held): UM_ALLOC_ZERO gives zeroed memory when carved from dirty freed memory, after um_pool_trim
 * (madvise-given-back granules), and after merges; live buffers straddling 64 KiB granules next to freed
 * neighbours keep their data across um_pool_trim(m, 0).
 *
 * Build (from /work/main, after `cmake --build build-h`):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude tests/outside/found_segments/regress_zero_and_trim.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/regress_zero_and_trim
 * Run (from /tmp; binary /tmp/regress_zero_and_trim):
 *   ./regress_zero_and_trim
 *
 * What it printed on this tree:
 *   destroy UM_OK, 0 failures
 *   rc=0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
static int fails;
static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
static void zchk(um_buffer *b, size_t n, const char *w) {
  uint8_t *p = um_buffer_host_ptr(b);
  for (size_t i = 0; i < n; i++) if (p[i]) { printf("NOT ZERO (%s) size %zu at %zu = %#x\n", w, n, i, p[i]); fails++; return; }
}
int main(void) {
  um_options o; um_options_init(&o); o.trim_interval_ms = 0; snprintf(o.backends, sizeof o.backends, "cpu");
  um_manager *m; um_manager_create(&o, &m); um_device *d = um_device_get(m, 0);
  uint64_t s = 42;
  /* 1: dirty then zero, various sizes, with and without trim between */
  size_t sizes[] = {1, 7, 100, 4096, 65535, 65536, 65537, 1u << 20, (1u << 20) + 1, 3u << 20, 17u << 20, 64u << 20};
  for (int trim = 0; trim < 3; trim++)
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
      um_buffer *a[8], *z;
      for (int k = 0; k < 8; k++) { um_alloc(m, d, sizes[si], UM_HOST, 0, &a[k]); memset(um_buffer_host_ptr(a[k]), 0xA5, sizes[si]); }
      for (int k = 0; k < 8; k++) um_release(a[k]);
      if (trim == 1) um_pool_trim(m, 0);
      if (trim == 2) um_pool_trim(m, sizes[si] * 3);
      for (int k = 0; k < 8; k++) { if (um_alloc(m, d, sizes[si], UM_HOST, UM_ALLOC_ZERO, &a[k])) { fails++; a[k] = NULL; continue; } zchk(a[k], sizes[si], trim ? "after trim" : "reuse"); }
      /* a different size in the freed space, zeroed */
      for (int k = 0; k < 8; k++) if (a[k]) { memset(um_buffer_host_ptr(a[k]), 0x5A, sizes[si]); um_release(a[k]); }
      size_t n2 = sizes[si] * 2 + 3;
      if (um_alloc(m, d, n2, UM_HOST, UM_ALLOC_ZERO, &z) == 0) { zchk(z, n2, "merged"); um_release(z); }
    }
  /* 2: live buffers straddling granules; free neighbours; trim; live data intact */
  for (int round = 0; round < 20; round++) {
    enum { K = 200 };
    um_buffer *b[K]; size_t n[K];
    for (int k = 0; k < K; k++) {
      n[k] = 1 + rng(&s) % (round % 2 ? 200000 : 50000);
      um_alloc(m, d, n[k], UM_HOST, 0, &b[k]);
      memset(um_buffer_host_ptr(b[k]), (k * 7 + round) & 0xff ? (k * 7 + round) & 0xff : 1, n[k]);
    }
    for (int k = 0; k < K; k += 2) { um_release(b[k]); b[k] = NULL; }
    um_pool_trim(m, 0);
    for (int k = 1; k < K; k += 2) {
      uint8_t *p = um_buffer_host_ptr(b[k]); uint8_t want = (k * 7 + round) & 0xff ? (k * 7 + round) & 0xff : 1;
      for (size_t i = 0; i < n[k]; i++) if (p[i] != want) { printf("LIVE DATA LOST round %d k %d size %zu at %zu = %#x want %#x\n", round, k, n[k], i, p[i], want); fails++; break; }
    }
    /* refill holes with zeroed blocks */
    for (int k = 0; k < K; k += 2) { n[k] = 1 + rng(&s) % 70000; um_alloc(m, d, n[k], UM_HOST, UM_ALLOC_ZERO, &b[k]); zchk(b[k], n[k], "hole refill"); }
    for (int k = 0; k < K; k++) um_release(b[k]);
    if (round % 3 == 0) um_pool_trim(m, 0);
  }
  printf("destroy %s, %d failures\n", um_err_name(um_manager_destroy(m)), fails);
  return fails != 0;
}
