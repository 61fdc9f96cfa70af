/* Tag names and allocation sites with quotes, backslashes, newlines, tabs, control bytes, UTF-8 and bytes
 * (those that are not UTF-8: defect_json_invalid_utf8.c) must leave um_snapshot_write and um_history_write valid JSON (python3 json.load), must
 * come back unchanged in um_buffer_tag / um_snapshot_block.tag / um_history_event.tag, and `unimem view`
 * must turn the history into a page with no outside references (http://, https://, <script src=,
 * <link href=), and (when chromium exists) a page whose <body> gets data-status="ok".
 * Promises: um_snapshot_write "Write s as JSON"; um_history_write "Write the recording as Chrome trace-event
 * JSON"; guide: "`unimem view history.json -o page.html` turns it into one self-contained page (no network,
 * no outside scripts or fonts)"; um_tag_push "name is copied".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_json_names.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run (from /work/main): POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X ; UNIMEM_BACKENDS=cpu /tmp/X
 * Printed (both backends): unimem view: /tmp/o/names.html / ok   (chromium: <body data-status="ok" ...>)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unimem.h>
static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static char longest[63];
static const char *names[] = {
  "quote\"inside", "back\\slash", "new\nline", "tab\there", "ctl\x01\x1f\x7f", "utf8 \xc3\xa9\xe6\xbc\xa2\xf0\x9f\x99\x82",
  /* bytes that are not UTF-8: defect_json_invalid_utf8.c */ "</script><script>alert(1)</script>", "\\u0000", "&lt;&amp;'\"",
  longest, /* 58 'x' and a 4-byte character: 62 bytes, the longest name but one byte (main fills it) */
};
#define NN (int)(sizeof names / sizeof names[0])
static int sh(const char *cmd) { int r = system(cmd); return r == -1 ? -1 : WEXITSTATUS(r); }
int main(void) {
  um_manager *m;
  memset(longest, 'x', 58);
  memcpy(longest + 58, "\xf0\x9f\x99\x82", 5);
  CHECK(um_manager_create(NULL, &m) == UM_OK, "create");
  int nd = um_device_count(m);
  um_buffer *b[NN][2];
  static char host[256];
  CHECK(um_history_start(m, 10000) == UM_OK, "history");
  for (int i = 0; i < NN; i++) {
    CHECK(um_tag_push(m, names[i]) == UM_OK, "push %d", i);
    for (int d = 0; d < 2; d++) {
      um_device *dev = um_device_get(m, d < nd ? d : 0);
      CHECK(um_alloc_at(m, dev, 100 + i, d ? UM_DEVICE : UM_HOST, 0, &b[i][d], "site \"q\" \\ \n\x02.c", 7) == UM_OK, "alloc");
      CHECK(um_copy_from_host(b[i][d], 0, host, 64, NULL) == UM_OK, "copy");
      const char *t = um_buffer_tag(b[i][d]);
      CHECK(t && !strcmp(t, names[i]), "tag %d came back as '%s'", i, t ? t : "(null)");
    }
    CHECK(um_tag_pop(m) == UM_OK, "pop");
  }
  for (int i = 0; i < NN; i += 2) um_release(b[i][0]);
  um_snapshot *s;
  CHECK(um_snapshot_take(m, &s) == UM_OK, "snapshot");
  int seen = 0;
  for (size_t k = 0; k < s->nblocks; k++)
    for (int i = 0; i < NN; i++) if (s->blocks[k].tag && !strcmp(s->blocks[k].tag, names[i])) { seen++; break; }
  CHECK(seen >= NN, "snapshot blocks with our tags %d", seen);
  CHECK(um_snapshot_write(s, "/tmp/o/names-snap.json") == UM_OK, "snapshot_write");
  um_snapshot_free(s);
  um_history_stop(m);
  CHECK(um_history_write(m, "/tmp/o/names-hist.json") == UM_OK, "history_write");
  um_history_event ev[10000]; size_t n;
  um_history_get(m, ev, 10000, &n, NULL);
  int hs = 0;
  for (size_t k = 0; k < n; k++) for (int i = 0; i < NN; i++) if (ev[k].tag && !strcmp(ev[k].tag, names[i])) { hs++; break; }
  CHECK(hs >= NN * 4, "history events with our tags %d", hs);
  CHECK(sh("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' /tmp/o/names-snap.json") == 0, "snapshot JSON invalid");
  CHECK(sh("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' /tmp/o/names-hist.json") == 0, "history JSON invalid");
  /* names round-trip through the JSON */
  CHECK(sh("python3 - <<'PY'\nimport json\nd=json.load(open('/tmp/o/names-snap.json'))\nts={b.get('tag') for b in d['blocks']}\n"
           "want=['quote\"inside','back\\\\slash','new\\nline','tab\\there','utf8 \\u00e9\\u6f22\\U0001f642']\n"
           "miss=[w for w in want if w not in ts]\nprint('snapshot tags missing:',miss) if miss else None\nraise SystemExit(1 if miss else 0)\nPY") == 0,
        "names did not round-trip through the snapshot JSON");
  { char cmd[1024]; snprintf(cmd, sizeof cmd, "%s view /tmp/o/names-hist.json -o /tmp/o/names.html", getenv("UNIMEM_TOOL") ? getenv("UNIMEM_TOOL") : "build-h/tools/unimem"); CHECK(sh(cmd) == 0, "unimem view failed"); }
  CHECK(sh("grep -v 'http://www.w3.org/2000/svg' /tmp/o/names.html | grep -E -i -c 'https?://|<script[^>]+src=|<link[^>]+href='  > /tmp/o/names.ext; test $(cat /tmp/o/names.ext) = 0") == 0,
        "page has outside references (grep -Ei 'https?://|<script src|<link href' /tmp/o/names.html; the SVG namespace string excepted)");
  CHECK(sh("grep -c 'alert(1)</script>' /tmp/o/names.html > /dev/null") != 0, "tag name injected raw into the page");
  if (sh("test -x /usr/bin/chromium") == 0)
    CHECK(sh("timeout 60 /usr/bin/chromium --headless --no-sandbox --disable-gpu --dump-dom file:///tmp/o/names.html 2>/dev/null | grep -q 'data-status=\"ok\"'") == 0,
          "chromium: body has no data-status=\"ok\"");
  for (int i = 0; i < NN; i++) { if (i % 2) um_release(b[i][0]); um_release(b[i][1]); }
  CHECK(um_manager_destroy(m) == UM_OK, "destroy");
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
