/* DEFECT: on the host device (device 0) um_tag_stats counts uploads (um_copy_from_host) and downloads
 * (um_copy_to_host) as bytes_d2d, while um_stats_get counts the same copies as bytes_h2d / bytes_d2h and the
 * history records each as one copy (path "memcpy"): the two counters of one copy disagree.
 * Promises (unimem.h): um_tag_stats bytes_h2d "copied host to device", bytes_d2h "copied device to host",
 * bytes_d2d "copied or filled within one device"; um_stats bytes_h2d "bytes copied host to device".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/defect_tag_host_device_directions.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: UNIMEM_BACKENDS=cpu /tmp/X ; POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X [same on device 0]
 * Printed (both backends):
 *   device 0, 1000 up + 700 down + 300 copy within:
 *   um_stats  : h2d 1000 d2h 700 d2d 300
 *   tag "io"  : h2d 0 d2h 0 d2d 2000 peer 0
 *   history   : copy path "memcpy" 1000 bytes; copy path "memcpy" 700 bytes; copy path "memcpy" 300 bytes;
 *   FAIL: tag stats disagree with um_stats on device 0
 */
#include <stdio.h>
#include <string.h>
#include <unimem.h>
#define U(x) ((unsigned long long)(x))
int main(void) {
  um_manager *m;
  um_manager_create(NULL, &m);
  um_device *h = um_device_get(m, 0);
  static char host[4096];
  um_buffer *a, *b;
  um_alloc(m, h, 4096, UM_HOST, 0, &a);
  um_alloc(m, h, 4096, UM_HOST, 0, &b);
  um_stats s0, s1;
  um_stats_get(m, h, &s0);
  um_history_start(m, 100);
  um_tag_push(m, "io");
  um_copy_from_host(a, 0, host, 1000, NULL);
  um_copy_to_host(a, 0, host, 700, NULL);
  um_copy(b, 0, a, 0, 300, NULL);
  um_tag_pop(m);
  um_history_stop(m);
  um_stats_get(m, h, &s1);
  um_tag_stats t[4];
  int c = um_tag_stats_get(m, h, t, 4), i;
  for (i = 0; i < c && strcmp(t[i].name, "io"); i++) {}
  if (i == c) { printf("no tag io\n"); return 1; }
  printf("device 0, 1000 up + 700 down + 300 copy within:\n");
  printf("um_stats  : h2d %llu d2h %llu d2d %llu\n", U(s1.bytes_h2d - s0.bytes_h2d), U(s1.bytes_d2h - s0.bytes_d2h), U(s1.bytes_d2d - s0.bytes_d2d));
  printf("tag \"io\"  : h2d %llu d2h %llu d2d %llu peer %llu\n", U(t[i].bytes_h2d), U(t[i].bytes_d2h), U(t[i].bytes_d2d), U(t[i].bytes_peer));
  um_history_event ev[100]; size_t n = 0;
  um_history_get(m, ev, 100, &n, NULL);
  printf("history   :");
  for (size_t k = 0; k < n && k < 100; k++)
    if (ev[k].kind == UM_HIST_COPY) printf(" copy path \"%s\" %llu bytes;", ev[k].path ? ev[k].path : "(null)", U(ev[k].bytes));
  printf("\n");
  int bad = t[i].bytes_h2d != s1.bytes_h2d - s0.bytes_h2d || t[i].bytes_d2h != s1.bytes_d2h - s0.bytes_d2h;
  if (bad) printf("FAIL: tag stats disagree with um_stats on device 0\n"); else printf("ok\n");
  um_release(a); um_release(b);
  um_manager_destroy(m);
  return bad;
}
