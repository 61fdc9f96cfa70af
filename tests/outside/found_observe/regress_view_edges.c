/* `unimem view` on what is not a history (a snapshot file, text, an empty file, a missing file, a
 * directory) exits 1; on a history with 0 events (an empty recording, um_history_write of a ring that
 * holds none) and on a huge one (2e5+ events) it writes one self-contained page in reasonable time (no
 * http(s):// but the SVG namespace, no <script src=, no <link href=), which chromium (when present) renders
 * with <body data-status="ok">; `unimem stats --history FILE` writes a history that view accepts.
 * Promises: `unimem help view`: "EXIT STATUS 0 the page was written; 1 FILE cannot be read, is not a
 * history, or the page cannot be written"; guide: "one self-contained page (no network, no outside scripts
 * or fonts)"; um_history_write "UM_ESTATE (nothing was recorded)".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/regress_view_edges.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run (from /work/main): POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X
 * Printed (cpu,opencl):
 *   um_history_write of an empty recording: UM_OK
 *   empty recording: <body data-status="ok" data-instant-us="0" data-blocks="0" data-lanes="0">
 *   view {"traceEvents": []}: exit 1            [a hand-made empty trace counts as "not a history"]
 *   huge: 200000 events, view exit 0 in 1.3 s    [json 99603666 bytes, page 99616144 bytes]
 *   huge: <body data-status="ok" data-instant-us="1842792.079" data-blocks="1" data-lanes="2">
 *   stats --history: <body data-status="ok" data-instant-us="138703.601" data-blocks="7" data-lanes="2">
 *   ok
 * Note: the 200000-event page is ~100 MB (the trace embedded whole) and chromium --headless took 3 min 16 s
 * wall (44 s user, 2 shared CPUs) to reach data-status="ok"; with a 120 s limit it printed no body.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unimem.h>
static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad = 1; printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static int sh(const char *fmt, const char *a) { char c[1024]; snprintf(c, sizeof c, fmt, a, a, a); int r = system(c); return r == -1 ? -1 : WEXITSTATUS(r); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void page_ok(const char *html, const char *what) {
  CHECK(sh("grep -v 'http://www.w3.org/2000/svg' %s | grep -q -E -i 'https?://|<script[^>]+src=|<link[^>]+href=|@import|url\\(http'", html) != 0, "%s: outside reference in %s", what, html);
  if (system("test -x /usr/bin/chromium") == 0) {
    char c[512];
    snprintf(c, sizeof c, "timeout 400 /usr/bin/chromium --headless --no-sandbox --disable-gpu --dump-dom file://%s 2>/dev/null | grep -o '<body[^>]*>' | head -1", html);
    FILE *p = popen(c, "r"); char line[512] = "";
    if (p) { if (!fgets(line, sizeof line, p)) line[0] = 0; pclose(p); }
    printf("%s: %s", what, line[0] ? line : "(no body)\n");
    CHECK(strstr(line, "data-status=\"ok\"") != NULL, "%s: chromium body %s", what, line);
  }
}
int main(void) {
  const char *tool = getenv("UNIMEM_TOOL") ? getenv("UNIMEM_TOOL") : "build-h/tools/unimem";
  char cmd[512];
  FILE *f = fopen("/tmp/o/v-text.json", "w"); fputs("hello, not json\n", f); fclose(f);
  f = fopen("/tmp/o/v-empty.json", "w"); fclose(f);
  f = fopen("/tmp/o/v-other.json", "w"); fputs("{\"a\": [1, 2, 3]}\n", f); fclose(f);
  f = fopen("/tmp/o/v-zero.json", "w"); fputs("{\"traceEvents\": []}\n", f); fclose(f);
  um_manager *m; um_manager_create(NULL, &m);
  um_snapshot *s; um_snapshot_take(m, &s); um_snapshot_write(s, "/tmp/o/v-snap.json"); um_snapshot_free(s);
  const char *notes[] = {"/tmp/o/v-text.json", "/tmp/o/v-empty.json", "/tmp/o/v-other.json", "/tmp/o/v-snap.json", "/tmp/o/does-not-exist.json", "/tmp/o"};
  for (int i = 0; i < 6; i++) {
    snprintf(cmd, sizeof cmd, "%s view %s -o /tmp/o/v-x.html > /tmp/o/v.out 2>&1", tool, notes[i]);
    int r = system(cmd); r = WEXITSTATUS(r);
    CHECK(r == 1, "view %s exited %d (want 1)", notes[i], r);
  }
  snprintf(cmd, sizeof cmd, "%s view > /dev/null 2>&1", tool);
  CHECK(WEXITSTATUS(system(cmd)) == 2, "no FILE: want 2");
  /* 0 events: a recording that saw nothing */
  um_history_start(m, 16); um_history_stop(m);
  int rc = um_history_write(m, "/tmp/o/v-none.json");
  printf("um_history_write of an empty recording: %s\n", um_err_name(rc));
  if (rc == UM_OK) {
    snprintf(cmd, sizeof cmd, "%s view /tmp/o/v-none.json -o /tmp/o/v-none.html > /dev/null", tool);
    CHECK(WEXITSTATUS(system(cmd)) == 0, "view of an empty recording");
    page_ok("/tmp/o/v-none.html", "empty recording");
  }
  snprintf(cmd, sizeof cmd, "%s view /tmp/o/v-zero.json -o /tmp/o/v-zero.html > /tmp/o/v.out 2>&1", tool);
  int zr = WEXITSTATUS(system(cmd));
  printf("view {\"traceEvents\": []}: exit %d\n", zr);
  if (zr == 0) page_ok("/tmp/o/v-zero.html", "traceEvents []");
  /* huge */
  int nd = um_device_count(m);
  um_history_start(m, 1 << 19);
  static char src[256];
  um_tag_push(m, "huge");
  for (int i = 0; i < 50000; i++) {
    um_buffer *b; int d = i % nd;
    char nm[16]; snprintf(nm, sizeof nm, "t%d", i % 50);
    um_alloc_tagged(m, um_device_get(m, d), 64 + (i % 1000) * 64, d ? UM_DEVICE : UM_HOST, 0, nm, &b);
    um_copy_from_host(b, 0, src, 64, NULL);
    um_fill(b, 0, 0, 32, NULL);
    um_release(b);
  }
  um_tag_pop(m);
  um_history_stop(m);
  size_t n; um_history_get(m, NULL, 0, &n, NULL);
  CHECK(um_history_write(m, "/tmp/o/v-huge.json") == UM_OK, "write huge");
  double t0 = now();
  snprintf(cmd, sizeof cmd, "%s view /tmp/o/v-huge.json -o /tmp/o/v-huge.html > /dev/null", tool);
  rc = WEXITSTATUS(system(cmd));
  double dt = now() - t0;
  printf("huge: %zu events, view exit %d in %.1f s\n", n, rc, dt);
  system("ls -la /tmp/o/v-huge.json /tmp/o/v-huge.html | awk '{print \"  \" $5, $9}'");
  CHECK(rc == 0 && dt < 60, "view of %zu events: exit %d, %.1f s", n, rc, dt);
  page_ok("/tmp/o/v-huge.html", "huge");
  um_manager_destroy(m);
  /* unimem stats --history */
  snprintf(cmd, sizeof cmd, "%s stats --history /tmp/o/v-stats.json > /tmp/o/v-stats.out 2>&1 && %s view /tmp/o/v-stats.json -o /tmp/o/v-stats.html > /dev/null", tool, tool);
  CHECK(system(cmd) == 0, "stats --history then view");
  CHECK(sh("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' %s", "/tmp/o/v-stats.json") == 0, "stats history JSON");
  page_ok("/tmp/o/v-stats.html", "stats --history");
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
