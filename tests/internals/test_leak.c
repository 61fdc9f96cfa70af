/* Leak report: um_manager_destroy with buffers never released returns
 * UM_ELEAK, logs one line per buffer (size, device, and the allocation site
 * when it was recorded), and frees them all the same. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* um_alloc and um_alloc_array record their callers' sites in this file. */
#define UNIMEM_TRACK_SITES
#include "test_util.h"
#include "testing.h"

#define MAX_LINES 64

typedef struct log_capture {
  pthread_mutex_t lock;
  int n;
  um_log_level level[MAX_LINES];
  char line[MAX_LINES][512];
} log_capture;

static log_capture cap = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void capture(void *ctx, um_log_level level, const char *msg) {
  log_capture *c = ctx;
  pthread_mutex_lock(&c->lock);
  if (c->n < MAX_LINES) {
    c->level[c->n] = level;
    snprintf(c->line[c->n], sizeof(c->line[0]), "%s", msg);
    c->n++;
  }
  pthread_mutex_unlock(&c->lock);
}

static um_manager *create(int with_disc) {
  um_options o;
  um_manager *m = NULL;
  const um__backend *extra[] = {&ut_disc_backend};
  ut_options(&o);
  o.log = capture;
  o.log_ctx = &cap;
  o.log_level = UM_LOG_WARN;
  cr_assert_eq(um__manager_create_ex(&o, extra, with_disc ? 1 : 0, &m), UM_OK);
  cap.n = 0; /* only what destroy says */
  return m;
}

/* Lines that report one leaked buffer. */
static int leak_lines(void) {
  int n = 0;
  for (int i = 0; i < cap.n; i++)
    if (strstr(cap.line[i], "was never released") != NULL)
      n++;
  return n;
}

/* The line that reports the buffer of this size, or NULL. */
static const char *line_for(size_t bytes) {
  char key[64];
  snprintf(key, sizeof(key), " of %zu bytes ", bytes);
  for (int i = 0; i < cap.n; i++)
    if (strstr(cap.line[i], key) != NULL)
      return cap.line[i];
  return NULL;
}

Test(leak, clean_manager_is_ok) {
  um_manager *m = create(0);
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a, *b;
  cr_assert_eq(um_alloc(m, cpu, 100, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 200, UM_DEVICE, UM_ALLOC_UNPOOLED, &b), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  /* idle pool blocks are not leaks */
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  cr_assert_eq(cap.n, 0, "a clean manager logged: %s", cap.n ? cap.line[0] : "");
}

Test(leak, empty_manager_is_ok) {
  um_manager *m = create(0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  cr_assert_eq(cap.n, 0);
}

Test(leak, one_line_per_buffer) {
  um_manager *m = create(1);
  um_device *cpu = um_device_get(m, 0), *disc = um_device_get(m, 1);
  um_buffer *a, *b, *c, *d, *kept;
  char mem[333];
  const char *l;
  cr_assert_eq(um_alloc_at(m, cpu, 1111, UM_HOST, 0, &a, NULL, 0), UM_OK);
  cr_assert_eq(um_alloc_at(m, cpu, 2222, UM_PINNED, UM_ALLOC_UNPOOLED, &b, NULL, 0), UM_OK);
  cr_assert_eq(um_alloc_at(m, disc, 4444, UM_DEVICE, 0, &c, NULL, 0), UM_OK);
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), 0, &d), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 5555, UM_HOST, 0, &kept), UM_OK);
  cr_assert_eq(um_release(kept), UM_OK); /* released: not reported */
  (void)a, (void)b, (void)c, (void)d;

  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_not_null(strstr(um_last_error(), "4 buffer(s)"), "%s", um_last_error());
  cr_assert_eq(leak_lines(), 4, "one line per leaked buffer");
  cr_assert_null(line_for(5555), "a released buffer was reported");

  cr_assert_not_null(l = line_for(1111));
  cr_assert_not_null(strstr(l, "(host)"), "%s", l);
  cr_assert_not_null(strstr(l, "device 0"), "%s", l);
  cr_assert_not_null(l = line_for(2222));
  cr_assert_not_null(strstr(l, "(pinned)"), "%s", l);
  cr_assert_not_null(strstr(l, "device 0"), "%s", l);
  cr_assert_not_null(l = line_for(4444));
  cr_assert_not_null(strstr(l, "(device)"), "%s", l);
  cr_assert_not_null(strstr(l, "device 1 (test-discrete 0)"), "%s", l);
  cr_assert_not_null(l = line_for(333));
  cr_assert_not_null(strstr(l, "device 0"), "%s", l);
  for (int i = 0; i < cap.n; i++)
    cr_assert_eq(cap.level[i], UM_LOG_ERROR, "%s", cap.line[i]);
  /* the summary */
  int summary = 0;
  for (int i = 0; i < cap.n; i++)
    if (strstr(cap.line[i], "4 buffer(s)") && strstr(cap.line[i], "8110 bytes"))
      summary++;
  cr_assert_eq(summary, 1);
  cr_assert_eq(atomic_load(&ut_disc_live_blocks), 0, "leaked blocks were freed");
}

Test(leak, allocation_site_explicit) {
  um_manager *m = create(0);
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a, *b;
  const char *l;
  cr_assert_eq(um_alloc_at(m, cpu, 777, UM_HOST, 0, &a, "solver.c", 42), UM_OK);
  cr_assert_eq(um_alloc_array_at(m, cpu, 10, 99, UM_DEVICE, 0, &b, "mesh.c", 7), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_eq(leak_lines(), 2);
  cr_assert_not_null(l = line_for(777));
  cr_assert_not_null(strstr(l, "allocated at solver.c:42"), "%s", l);
  cr_assert_not_null(l = line_for(990));
  cr_assert_not_null(strstr(l, "allocated at mesh.c:7"), "%s", l);
}

/* With UNIMEM_TRACK_SITES (defined at the top of this file) um_alloc
 * records the caller's own file and line. */
Test(leak, allocation_site_macro) {
  um_manager *m = create(0);
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a, *b;
  char want_a[512], want_b[512];
  const char *l;
  int line_a = __LINE__ + 1;
  cr_assert_eq(um_alloc(m, cpu, 1234, UM_HOST, 0, &a), UM_OK);
  int line_b = __LINE__ + 1;
  cr_assert_eq(um_alloc_array(m, cpu, 3, 1000, UM_HOST, UM_ALLOC_ZERO, &b), UM_OK);
  snprintf(want_a, sizeof(want_a), "allocated at %s:%d", __FILE__, line_a);
  snprintf(want_b, sizeof(want_b), "allocated at %s:%d", __FILE__, line_b);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_eq(leak_lines(), 2);
  cr_assert_not_null(l = line_for(1234));
  cr_assert_not_null(strstr(l, want_a), "%s, expected %s", l, want_a);
  cr_assert_not_null(l = line_for(3000));
  cr_assert_not_null(strstr(l, want_b), "%s, expected %s", l, want_b);
}

/* A leaked buffer can still have operations in flight, or be mapped:
 * destroy waits for the operations, ends the mapping, and frees it. */
Test(leak, leaked_busy_and_mapped) {
  um_manager *m = create(1);
  um_device *cpu = um_device_get(m, 0), *disc = um_device_get(m, 1);
  const size_t n = 8u << 20;
  unsigned char *src = malloc(n), *dst = malloc(n);
  um_buffer *busy, *mapped, *shadowed;
  um_event *e1, *e2;
  void *p, *q;
  cr_assert_not_null(src);
  cr_assert_not_null(dst);
  ut_pattern(src, n, 41);
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, 0, &busy), UM_OK);
  cr_assert_eq(um_copy_from_host(busy, 0, src, n, &e1), UM_OK);
  cr_assert_eq(um_copy_to_host(busy, 0, dst, n, &e2), UM_OK);
  um_event_release(e1);
  um_event_release(e2);
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &mapped), UM_OK);
  cr_assert_eq(um_map(mapped, UM_MAP_WRITE, 0, 4096, &p), UM_OK);
  cr_assert_eq(um_alloc(m, disc, 4096, UM_DEVICE, 0, &shadowed), UM_OK);
  cr_assert_eq(um_map(shadowed, UM_MAP_READ_WRITE, 0, 4096, &q), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_eq(leak_lines(), 3);
  cr_assert_arr_eq(dst, src, n, "destroy waited for the leaked buffer's copies");
  cr_assert_eq(atomic_load(&ut_disc_live_blocks), 0);
  free(src);
  free(dst);
}

/* Without a log callback the report goes to stderr; the status is the
 * same. */
Test(leak, default_log_goes_to_stderr) {
  um_manager *m = ut_manager();
  um_buffer *a;
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 64, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
}
