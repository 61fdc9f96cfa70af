/* Bytes moved per direction and per device for a tag: uploads, downloads, copies within a device, fills,
 * copies host-buffer <-> OpenCL buffer (device 0 <-> device 1), batches, async copies; per-device tag stats
 * must add up to the all-devices ones, and agree with um_stats_get's per-device counters.
 * Promises (unimem.h): um_tag_stats bytes_h2d "copied host to device", bytes_d2h "copied device to host",
 * bytes_d2d "copied or filled within one device", bytes_peer "copied between devices"; um_tag_stats_get
 * "Copies count for the device of their destination (a download: its source)"; um_tag_push "this thread's
 * allocations, copies, fills ... count for tag name".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_tag_bytes_moved.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X ; also UNIMEM_BACKENDS=cpu /tmp/X
 * Printed (cpu,opencl):
 *   tag mv all: h2d 3016 d2h 4703 d2d 350 peer 0
 *   tag mv dev 1: h2d 3016 d2h 4703 d2d 350 peer 0 | um_stats delta h2d 3016 d2h 4703 d2d 300 peer 0
 *   tag mv dev 0: h2d 0 d2h 0 d2d 0 peer 0 | um_stats delta h2d 0 d2h 0 d2d 0 peer 0
 *   ok
 * (copies between a device-0 HOST buffer and an OpenCL buffer count as h2d/d2h of the OpenCL device, in
 * the tag and in um_stats alike. With UNIMEM_BACKENDS=cpu everything lands in the tag's d2d while um_stats
 * says h2d 1016 d2h 703: defect_tag_host_device_directions.c; this program checks only the total there.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
static int bad;
#define U(x) ((unsigned long long)(x))
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static int find(um_tag_stats *t, int n, const char *name) { for (int i = 0; i < n; i++) if (!strcmp(t[i].name, name)) return i; return -1; }
int main(void) {
  um_manager *m;
  CHECK(um_manager_create(NULL, &m) == UM_OK, "create");
  int nd = um_device_count(m);
  um_device *h = um_device_get(m, 0), *g = um_device_get(m, nd - 1);
  printf("devices %d, second %s\n", nd, nd > 1 ? "opencl" : "(none, device 0 twice)");
  enum { N = 1 << 16 };
  char *host = calloc(1, N);
  um_buffer *a, *b, *hb;
  CHECK(um_alloc(m, g, N, UM_DEVICE, 0, &a) == UM_OK, "a");
  CHECK(um_alloc(m, g, N, UM_DEVICE, 0, &b) == UM_OK, "b");
  CHECK(um_alloc(m, h, N, UM_HOST, 0, &hb) == UM_OK, "hb");
  um_stats s0g, s0h; um_stats_get(m, g, &s0g); um_stats_get(m, h, &s0h);
  CHECK(um_tag_push(m, "mv") == UM_OK, "push");
  CHECK(um_copy_from_host(a, 0, host, 1000, NULL) == UM_OK, "h2d");           /* g: h2d 1000 */
  CHECK(um_copy_to_host(a, 0, host, 700, NULL) == UM_OK, "d2h");              /* g: d2h 700 */
  CHECK(um_copy(b, 0, a, 0, 300, NULL) == UM_OK, "d2d");                      /* g: d2d 300 */
  CHECK(um_fill(b, 0, 7, 50, NULL) == UM_OK, "fill");                         /* g: d2d 50 */
  um_event *e;
  CHECK(um_copy_from_host(a, 0, host, 11, &e) == UM_OK, "async h2d");         /* g: h2d 11 */
  um_event_wait(e); um_event_release(e);
  um_copy_op ops[2] = {{.dst = a, .host_src = host, .bytes = 5}, {.host_dst = host, .src = b, .bytes = 3}};
  CHECK(um_copy_batch(m, ops, 2, NULL) == UM_OK, "batch");                    /* g: h2d 5, d2h 3 */
  CHECK(um_copy(hb, 0, a, 0, 4000, NULL) == UM_OK, "g->h");                   /* counts for h */
  CHECK(um_copy(a, 0, hb, 0, 2000, NULL) == UM_OK, "h->g");                   /* counts for g */
  CHECK(um_tag_pop(m) == UM_OK, "pop");
  um_tag_stats all[8], tg[8], th[8];
  int c = um_tag_stats_get(m, NULL, all, 8), cg = um_tag_stats_get(m, g, tg, 8), ch = um_tag_stats_get(m, h, th, 8);
  int i = find(all, c, "mv"), ig = find(tg, cg, "mv"), ih = find(th, ch, "mv");
  CHECK(i >= 0 && ig >= 0 && ih >= 0, "tag missing");
  if (i < 0 || ig < 0 || ih < 0) return 1;
  um_stats s1g, s1h; um_stats_get(m, g, &s1g); um_stats_get(m, h, &s1h);
  printf("tag mv all: h2d %llu d2h %llu d2d %llu peer %llu\n", U(all[i].bytes_h2d), U(all[i].bytes_d2h), U(all[i].bytes_d2d), U(all[i].bytes_peer));
  printf("tag mv dev %d: h2d %llu d2h %llu d2d %llu peer %llu | um_stats delta h2d %llu d2h %llu d2d %llu peer %llu\n", nd - 1,
         U(tg[ig].bytes_h2d), U(tg[ig].bytes_d2h), U(tg[ig].bytes_d2d), U(tg[ig].bytes_peer),
         U(s1g.bytes_h2d - s0g.bytes_h2d), U(s1g.bytes_d2h - s0g.bytes_d2h), U(s1g.bytes_d2d - s0g.bytes_d2d), U(s1g.bytes_peer - s0g.bytes_peer));
  if (nd > 1)
    printf("tag mv dev 0: h2d %llu d2h %llu d2d %llu peer %llu | um_stats delta h2d %llu d2h %llu d2d %llu peer %llu\n",
           U(th[ih].bytes_h2d), U(th[ih].bytes_d2h), U(th[ih].bytes_d2d), U(th[ih].bytes_peer),
           U(s1h.bytes_h2d - s0h.bytes_h2d), U(s1h.bytes_d2h - s0h.bytes_d2h), U(s1h.bytes_d2d - s0h.bytes_d2d), U(s1h.bytes_peer - s0h.bytes_peer));
  uint64_t tot = all[i].bytes_h2d + all[i].bytes_d2h + all[i].bytes_d2d + all[i].bytes_peer;
  CHECK(tot == 1000 + 700 + 300 + 50 + 11 + 5 + 3 + 4000 + 2000, "total moved %llu, want 8069", U(tot));
  if (nd > 1) {
    CHECK(all[i].bytes_h2d == tg[ig].bytes_h2d + th[ih].bytes_h2d && all[i].bytes_d2h == tg[ig].bytes_d2h + th[ih].bytes_d2h &&
          all[i].bytes_d2d == tg[ig].bytes_d2d + th[ih].bytes_d2d && all[i].bytes_peer == tg[ig].bytes_peer + th[ih].bytes_peer,
          "per-device sums differ from all");
    CHECK(tg[ig].bytes_h2d >= 1016 && tg[ig].bytes_d2h >= 703 && tg[ig].bytes_d2d == 350, "device %d: h2d %llu d2h %llu d2d %llu (want >=1016, >=703, 350)",
          nd - 1, U(tg[ig].bytes_h2d), U(tg[ig].bytes_d2h), U(tg[ig].bytes_d2d));
    /* the 4000-byte copy from a (device 1) into hb (a HOST buffer of device 0) counts as a download of
     * device 1 (d2h 4000 there, as um_stats_get counts it), the 2000 into a as an upload of device 1 */
    CHECK(tg[ig].bytes_h2d == 1016 + 2000 && tg[ig].bytes_d2h == 703 + 4000, "device 1 h2d %llu d2h %llu", U(tg[ig].bytes_h2d), U(tg[ig].bytes_d2h));
    CHECK(tg[ig].bytes_h2d == s1g.bytes_h2d - s0g.bytes_h2d && tg[ig].bytes_d2h == s1g.bytes_d2h - s0g.bytes_d2h &&
          tg[ig].bytes_peer == s1g.bytes_peer - s0g.bytes_peer, "tag and um_stats disagree on device %d", nd - 1);
  }
  um_release(a); um_release(b); um_release(hb); free(host);
  CHECK(um_manager_destroy(m) == UM_OK, "destroy");
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
