/* Out of memory with device_limit_bytes on the OpenCL device (and an impossible size on the host): the
 * UM_ENOMEM message names what was asked, the device and the tags that hold the most; the oom_snapshot file
 * ("%p" expanded to the process id) exists and parses as JSON; UNIMEM_OOM_SNAPSHOT does the same; the
 * history records an UM_HIST_OOM event with the bytes asked; an unwritable oom_snapshot path still gives
 * UM_ENOMEM. Options through the environment: UNIMEM_DEVICE_LIMIT_BYTES is set by this program.
 * Promises: um_options.oom_snapshot "\"\": off; else um_alloc's UM_ENOMEM writes a snapshot there
 * (um_snapshot_write; \"%p\": the process id) before it returns"; guide: "the failure's um_last_error() says
 * what was asked for, on which device, what is in use, reserved and idle there, the largest free extent,
 * the device's own free and total memory, the tags that hold the most and where the snapshot went";
 * UM_HIST_OOM "um_alloc answered UM_ENOMEM (bytes: asked)".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_oom_snapshot.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X   (also UNIMEM_BACKENDS=cpu: host part only)
 * Printed (cpu,opencl): after 19 buffers: UM_ENOMEM
 *   message: um_alloc: 114688 bytes on pthread-...: the device gave no new segment (opencl: ... would pass device_limit_bytes
 *   (8388608 bytes, 8388608 in use)), ... Held there: 7929856 bytes in use by 19 buffer(s), 8388608 reserved, 262144 idle ...;
 *   the most in use by tag: weights 6291456 bytes, activations 1638400 bytes; a snapshot is in /tmp/o/oom-1820-1820.json
 *   host 2^50: UM_ENOMEM ... a snapshot is in /tmp/o/oom-1820-1820.json
 *   unwritable snapshot path: UM_ENOMEM, ... no snapshot written to /nonexistent-dir/oom-1820.json (um_snapshot_write: cannot write ...)
 *   ok
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <unimem.h>
static int bad;
#define U(x) ((unsigned long long)(x))
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static int json_ok(const char *p) { char c[512]; snprintf(c, sizeof c, "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert \"blocks\" in d and \"segments\" in d' %s", p); return system(c) == 0; }
int main(void) {
  char path[256], want[256];
  snprintf(want, sizeof want, "/tmp/o/oom-%d-%d.json", (int)getpid(), (int)getpid());
  unlink(want);
  um_options o; um_options_init(&o);
  o.device_limit_bytes = 8 << 20;
  snprintf(o.oom_snapshot, sizeof o.oom_snapshot, "/tmp/o/oom-%%p-%%p.json");
  um_manager *m;
  CHECK(um_manager_create(&o, &m) == UM_OK, "create");
  int nd = um_device_count(m);
  um_history_start(m, 1000);
  if (nd > 1) {
    um_device *g = um_device_get(m, 1);
    um_buffer *b[64]; int n = 0, rc = UM_OK;
    um_tag_push(m, "weights");
    for (int i = 0; i < 3; i++) if ((rc = um_alloc(m, g, 2 << 20, UM_DEVICE, 0, &b[n])) == UM_OK) n++;
    um_tag_pop(m);
    um_tag_push(m, "activations");
    for (int i = 0; i < 60 && rc == UM_OK; i++) if ((rc = um_alloc(m, g, 100 << 10, UM_DEVICE, 0, &b[n])) == UM_OK) n++;
    const char *msg = um_last_error();
    printf("after %d buffers: %s\nmessage: %s\n", n, um_err_name(rc), msg);
    CHECK(rc == UM_ENOMEM, "expected UM_ENOMEM");
    CHECK(strstr(msg, "weights") && strstr(msg, "activations"), "message does not name both tags");
    CHECK(strstr(msg, want) != NULL, "message does not name %s", want);
    CHECK(access(want, F_OK) == 0 && json_ok(want), "snapshot %s missing or not JSON", want);
    um_tag_pop(m);
    for (int i = 0; i < n; i++) um_release(b[i]);
  }
  /* host: impossible size */
  unlink(want);
  um_buffer *x;
  int rc = um_alloc_tagged(m, um_device_get(m, 0), (size_t)1 << 50, UM_HOST, 0, "huge", &x);
  printf("host 2^50: %s\nmessage: %s\n", um_err_name(rc), um_last_error());
  CHECK(rc == UM_ENOMEM, "host huge");
  CHECK(access(want, F_OK) == 0 && json_ok(want), "host oom snapshot %s missing or not JSON", want);
  um_history_stop(m);
  um_history_event ev[1000]; size_t ne;
  um_history_get(m, ev, 1000, &ne, NULL);
  int oom = 0;
  for (size_t i = 0; i < ne; i++) if (ev[i].kind == UM_HIST_OOM) { oom++; if (ev[i].device == 0) CHECK(ev[i].bytes == (uint64_t)1 << 50 && !strcmp(ev[i].tag, "huge"), "oom event bytes %llu tag %s", U(ev[i].bytes), ev[i].tag); }
  CHECK(oom == (nd > 1 ? 2 : 1), "%d oom events", oom);
  CHECK(um_manager_destroy(m) == UM_OK, "destroy");
  /* environment, unwritable path */
  setenv("UNIMEM_OOM_SNAPSHOT", "/nonexistent-dir/oom-%p.json", 1);
  um_options_init(&o);
  CHECK(!strcmp(o.oom_snapshot, "/nonexistent-dir/oom-%p.json"), "env not applied: '%s'", o.oom_snapshot);
  CHECK(um_manager_create(&o, &m) == UM_OK, "create 2");
  rc = um_alloc(m, um_device_get(m, 0), (size_t)1 << 50, UM_HOST, 0, &x);
  printf("unwritable snapshot path: %s, message: %s\n", um_err_name(rc), um_last_error());
  CHECK(rc == UM_ENOMEM, "still UM_ENOMEM");
  um_manager_destroy(m);
  snprintf(path, sizeof path, "/tmp/o/oom-env-%d.json", (int)getpid()); unlink(path);
  setenv("UNIMEM_OOM_SNAPSHOT", "/tmp/o/oom-env-%p.json", 1);
  CHECK(um_manager_create(NULL, &m) == UM_OK, "create 3");
  rc = um_alloc(m, um_device_get(m, 0), (size_t)1 << 50, UM_HOST, 0, &x);
  CHECK(rc == UM_ENOMEM && access(path, F_OK) == 0 && json_ok(path), "env snapshot %s", path);
  um_manager_destroy(m);
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
