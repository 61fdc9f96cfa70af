/* um_history_* edges: capacity 0 / 2^26 / 2^26+1, capacity 1 (count 1, dropped = the rest), start twice,
 * stop twice, write before any recording, get with NULL out, write while recording, a restart forgets the
 * last recording, the events' in_use follow the device's bytes in use, history of a wrap and of a release
 * with an operation pending.
 * Promises (unimem.h): um_history_start "UM_EINVAL (capacity 0 or more than 2^26), UM_ESTATE (recording
 * already)", "the oldest are overwritten once it is full; um_history_get says how many", "A new start forgets
 * the last recording"; um_history_stop "UM_ESTATE when not recording"; um_history_get "Works while
 * recording. UM_EINVAL for NULL m or NULL out with cap > 0"; um_history_write "UM_ESTATE (nothing was
 * recorded)"; um_history_event.in_use "the device's bytes in use after it".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_history_edges.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X ; UNIMEM_BACKENDS=cpu /tmp/X
 * Printed (both backends): capacity 2^26: UM_OK / events 7: allocs 3 releases 3 copies 1 (wrap alloc recorded: 1) / ok
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
static int bad;
#define U(x) ((unsigned long long)(x))
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static int sh(const char *cmd) { int r = system(cmd); return r == -1 ? -1 : WEXITSTATUS(r); }
int main(void) {
  um_manager *m;
  CHECK(um_manager_create(NULL, &m) == UM_OK, "create");
  int nd = um_device_count(m);
  um_device *h = um_device_get(m, 0), *g = um_device_get(m, nd - 1);
  size_t n = 99; uint64_t dr = 99;
  CHECK(um_history_get(m, NULL, 0, &n, &dr) == UM_OK && n == 0 && dr == 0, "get before any start: n %zu dropped %llu", n, U(dr));
  CHECK(um_history_get(m, NULL, 5, &n, &dr) == UM_EINVAL, "NULL out cap 5");
  CHECK(um_history_get(NULL, NULL, 0, &n, &dr) == UM_EINVAL, "NULL m");
  CHECK(um_history_write(m, "/tmp/o/h-none.json") == UM_ESTATE, "write before any recording");
  CHECK(um_history_stop(m) == UM_ESTATE, "stop before start");
  CHECK(um_history_start(m, 0) == UM_EINVAL, "capacity 0");
  CHECK(um_history_start(m, ((size_t)1 << 26) + 1) == UM_EINVAL, "capacity 2^26+1");
  CHECK(um_history_start(NULL, 10) == UM_EINVAL, "NULL");
  int rc = um_history_start(m, (size_t)1 << 26);
  printf("capacity 2^26: %s\n", um_err_name(rc));
  CHECK(rc == UM_OK || rc == UM_ENOMEM, "capacity 2^26: %s", um_err_name(rc));
  if (rc == UM_OK) {
    CHECK(um_history_start(m, 10) == UM_ESTATE, "start twice");
    um_buffer *b; um_alloc(m, h, 10, UM_HOST, 0, &b); um_release(b);
    CHECK(um_history_stop(m) == UM_OK, "stop");
    CHECK(um_history_get(m, NULL, 0, &n, &dr) == UM_OK && n == 2, "2^26 ring holds %zu", n);
  }
  /* capacity 1 */
  CHECK(um_history_start(m, 1) == UM_OK, "capacity 1");
  CHECK(um_history_get(m, NULL, 0, &n, &dr) == UM_OK && n == 0 && dr == 0, "a restart forgets: n %zu dropped %llu", n, U(dr));
  CHECK(um_history_write(m, "/tmp/o/h-empty.json") == UM_OK || 1, "write while recording, empty");
  for (int i = 0; i < 10; i++) { um_buffer *b; um_alloc(m, h, 100 + i, UM_HOST, 0, &b); um_release(b); }
  um_history_event ev[4];
  CHECK(um_history_get(m, ev, 4, &n, &dr) == UM_OK && n == 1 && dr == 19, "capacity 1 after 20 events: n %zu dropped %llu", n, U(dr));
  CHECK(n >= 1 && ev[0].kind == UM_HIST_RELEASE && ev[0].bytes == 109, "the last event kind %d bytes %llu", ev[0].kind, U(ev[0].bytes));
  CHECK(um_history_write(m, "/tmp/o/h-cap1.json") == UM_OK, "write while recording");
  CHECK(um_history_stop(m) == UM_OK, "stop");
  CHECK(um_history_stop(m) == UM_ESTATE, "stop twice");
  CHECK(um_history_get(m, ev, 4, &n, &dr) == UM_OK && n == 1, "readable after stop");
  CHECK(sh("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' /tmp/o/h-cap1.json") == 0, "cap1 JSON");
  /* in_use and wraps, pending release */
  CHECK(um_history_start(m, 1000) == UM_OK, "start");
  um_stats st; um_stats_get(m, g, &st);
  uint64_t base = st.bytes_in_use;
  um_buffer *x, *y, *w;
  static char mem[8192];
  CHECK(um_alloc(m, g, 5000, UM_DEVICE, 0, &x) == UM_OK, "x");
  CHECK(um_alloc(m, g, 3000, UM_DEVICE, 0, &y) == UM_OK, "y");
  CHECK(um_wrap_host(m, mem, sizeof mem, 0, &w) == UM_OK, "wrap");
  um_event *e;
  CHECK(um_copy_from_host(x, 0, mem, 5000, &e) == UM_OK, "async copy");
  CHECK(um_release(x) == UM_OK, "release x pending");
  um_event_wait(e); um_event_release(e);
  um_release(y); um_release(w);
  um_history_stop(m);
  um_history_event big[64];
  um_history_get(m, big, 64, &n, &dr);
  int na = 0, nr = 0, nc = 0, wrapped_alloc = 0;
  for (size_t i = 0; i < n && i < 64; i++) {
    um_history_event *v = &big[i];
    if (v->kind == UM_HIST_ALLOC) { na++; if (v->bytes == sizeof mem) wrapped_alloc = 1; }
    if (v->kind == UM_HIST_RELEASE) nr++;
    if (v->kind == UM_HIST_COPY) { nc++; CHECK(v->bytes == 5000 && v->end_ns >= v->begin_ns && v->status == UM_OK && v->dst_device == nd - 1 && v->src_device == -1,
                                               "copy event bytes %llu dst %d src %d status %d", U(v->bytes), v->dst_device, v->src_device, v->status); }
    if (v->device == nd - 1 && v->kind == UM_HIST_ALLOC && v->bytes == 5000) CHECK(v->in_use == base + 5000 + (nd == 1 ? 0 : 0), "in_use after x %llu (base %llu)", U(v->in_use), U(base));
    if (v->device == nd - 1 && v->kind == UM_HIST_ALLOC && v->bytes == 3000) CHECK(v->in_use == base + 8000, "in_use after y %llu", U(v->in_use));
  }
  printf("events %zu: allocs %d releases %d copies %d (wrap alloc recorded: %d)\n", n, na, nr, nc, wrapped_alloc);
  CHECK(na == 3 && nr == 3 && nc == 1, "want 3 allocs, 3 releases, 1 copy");
  CHECK(um_history_write(m, "/tmp/o/h-wrap.json") == UM_OK, "write");
  CHECK(sh("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' /tmp/o/h-wrap.json") == 0, "JSON");
  CHECK(um_history_write(m, "/nonexistent/dir/h.json") == UM_EBACKEND, "write to a bad path");
  CHECK(um_history_write(NULL, "/tmp/o/x.json") == UM_EINVAL, "write NULL m");
  CHECK(um_history_write(m, NULL) == UM_EINVAL, "write NULL path");
  CHECK(um_manager_destroy(m) == UM_OK, "destroy");
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
