/* DEFECT: um_tag_push accepts any bytes as a name, but um_snapshot_write and um_history_write copy bytes
 * that are not UTF-8 raw into the file, which then is not JSON (RFC 8259 JSON text is UTF-8): python3's
 * json.load fails with UnicodeDecodeError. (Python's `with m.tag(...)` cannot produce such a name, C can;
 * so can a site_file path of um_alloc_at.) Escaping them (\u00ff) or replacing them (U+FFFD) would do.
 * Promises (unimem.h): um_snapshot_write "Write s as JSON to path"; um_history_write "Write the recording
 * as Chrome trace-event JSON"; um_tag_push refuses only "NULL, not a manager, empty name or one of
 * UM_TAG_NAME_MAX bytes or more".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/defect_json_invalid_utf8.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: UNIMEM_BACKENDS=cpu /tmp/X
 * Printed:
 *   push "latin1 caf\xe9" = UM_OK
 *   snapshot: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 in position ...: invalid continuation byte
 *   FAIL: snapshot file is not JSON
 *   history: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 in position ...
 *   FAIL: history file is not JSON
 */
#include <stdio.h>
#include <stdlib.h>
#include <unimem.h>
static int load(const char *what, const char *path) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys\ntry: json.load(open(sys.argv[1]))\nexcept Exception as e: print(\"%s: %%s: %%s\" %% (type(e).__name__, e)); sys.exit(1)' %s", what, path);
  int r = system(cmd);
  return r == 0;
}
int main(void) {
  um_manager *m;
  um_manager_create(NULL, &m);
  int bad = 0;
  um_history_start(m, 100);
  int rc = um_tag_push(m, "latin1 caf\xe9");
  printf("push \"latin1 caf\\xe9\" = %s\n", um_err_name(rc));
  um_buffer *b;
  um_alloc(m, um_device_get(m, 0), 64, UM_HOST, 0, &b);
  um_tag_pop(m);
  um_history_stop(m);
  um_snapshot *s;
  um_snapshot_take(m, &s);
  um_snapshot_write(s, "/tmp/o/utf8-snap.json");
  um_snapshot_free(s);
  um_history_write(m, "/tmp/o/utf8-hist.json");
  if (!load("snapshot", "/tmp/o/utf8-snap.json")) { bad = 1; printf("FAIL: snapshot file is not JSON\n"); }
  if (!load("history", "/tmp/o/utf8-hist.json")) { bad = 1; printf("FAIL: history file is not JSON\n"); }
  um_release(b);
  um_manager_destroy(m);
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
