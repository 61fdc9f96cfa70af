/* UNIMEM_TRACE_FILE records a program's allocations and releases in the
 * replay format of bench/traces: exact lines after a known sequence (ids
 * from 1, reused once released; sizes as asked; device, location, thread,
 * time in order), a wrap not recorded, two threads numbered apart, the
 * second manager's file suffixed, and a path that cannot be written
 * leaving the program working and unrecorded. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

typedef struct line {
  char kind;
  unsigned id, dev, loc, thread;
  size_t bytes;
  unsigned long long ns;
} line;

/* The trace's lines (comments skipped); the count. */
static int read_trace(const char *path, line *out, int cap) {
  char text[256];
  int n = 0;
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "no trace at %s", path);
  while (fgets(text, sizeof(text), f) != NULL) {
    line l = {0};
    if (text[0] == '#')
      continue;
    cr_assert_lt(n, cap);
    if (text[0] == 'a')
      cr_assert_eq(sscanf(text, "a %u %zu %u %u %u %llu", &l.id, &l.bytes, &l.dev, &l.loc, &l.thread, &l.ns), 6,
                   "bad line: %s", text);
    else
      cr_assert_eq(sscanf(text, "f %u %u %u %u %llu", &l.id, &l.dev, &l.loc, &l.thread, &l.ns), 5, "bad line: %s",
                   text);
    l.kind = text[0];
    out[n++] = l;
  }
  fclose(f);
  return n;
}

static void expect(const line *l, char kind, unsigned id, size_t bytes, unsigned loc) {
  cr_assert_eq(l->kind, kind);
  cr_assert_eq(l->id, id, "%c: id %u, expected %u", kind, l->id, id);
  if (kind == 'a')
    cr_assert_eq(l->bytes, bytes);
  cr_assert_eq(l->dev, 0);
  cr_assert_eq(l->loc, loc);
}

static char *trace_path(const char *name) {
  static char path[256];
  snprintf(path, sizeof(path), "/tmp/unimem-test-trace-%ld-%s", (long)getpid(), name);
  return path;
}

Test(trace, a_known_sequence) {
  char *path = trace_path("known");
  line l[16];
  um_manager *m;
  um_device *cpu;
  um_buffer *a, *b, *c, *w;
  char host[64];
  int n;
  cr_assert_eq(setenv("UNIMEM_TRACE_FILE", path, 1), 0);
  m = ut_manager();
  cpu = um_device_get(m, 0);
  cr_assert_eq(um_alloc(m, cpu, 1000, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 5, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 1000, UM_HOST, 0, &a), UM_OK); /* a pool hit, id 1 again */
  cr_assert_eq(um_alloc(m, cpu, 3 << 20, UM_HOST, UM_ALLOC_UNPOOLED, &c), UM_OK);
  cr_assert_eq(um_wrap_host(m, host, sizeof(host), 0, &w), UM_OK);
  cr_assert_eq(um_release(w), UM_OK); /* a wrap is no allocation */
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(a), UM_ESTATE); /* refused: not recorded */
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  n = read_trace(path, l, 16);
  cr_assert_eq(n, 8);
  expect(&l[0], 'a', 1, 1000, UM_HOST);
  expect(&l[1], 'a', 2, 5, UM_DEVICE);
  expect(&l[2], 'f', 1, 0, UM_HOST);
  expect(&l[3], 'a', 1, 1000, UM_HOST);
  expect(&l[4], 'a', 3, 3 << 20, UM_HOST);
  expect(&l[5], 'f', 3, 0, UM_HOST);
  expect(&l[6], 'f', 2, 0, UM_DEVICE);
  expect(&l[7], 'f', 1, 0, UM_HOST);
  for (int i = 1; i < n; i++) {
    cr_assert_geq(l[i].ns, l[i - 1].ns, "times in order");
    cr_assert_eq(l[i].thread, l[0].thread, "one thread");
  }
  unlink(path);
}

Test(trace, a_buffer_released_by_destroy_is_recorded) {
  char *path = trace_path("leak");
  line l[4];
  um_manager *m;
  um_buffer *a;
  cr_assert_eq(setenv("UNIMEM_TRACE_FILE", path, 1), 0);
  m = ut_manager();
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 64, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_ELEAK);
  cr_assert_eq(read_trace(path, l, 4), 2);
  expect(&l[0], 'a', 1, 64, UM_HOST);
  expect(&l[1], 'f', 1, 0, UM_HOST);
  unlink(path);
}

typedef struct worker {
  um_manager *m;
  int rounds;
} worker;

static void *work(void *p) {
  worker *w = p;
  for (int i = 0; i < w->rounds; i++) {
    um_buffer *b;
    cr_assert_eq(um_alloc(w->m, um_device_get(w->m, 0), (size_t)(16 + i), UM_HOST, 0, &b), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
  }
  return NULL;
}

/* Two threads: each event once, each thread's own number, every release
 * of an id that is live, and ids never above the most live at once. */
Test(trace, two_threads) {
  enum { ROUNDS = 2000 };
  char *path = trace_path("threads");
  static line l[4 * ROUNDS + 8];
  bool live[8] = {false};
  unsigned threads[2] = {0, 0};
  int n, per[2] = {0, 0};
  pthread_t t[2];
  worker w;
  cr_assert_eq(setenv("UNIMEM_TRACE_FILE", path, 1), 0);
  w.m = ut_manager();
  w.rounds = ROUNDS;
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, work, &w), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  cr_assert_eq(um_manager_destroy(w.m), UM_OK);
  n = read_trace(path, l, 4 * ROUNDS + 8);
  cr_assert_eq(n, 4 * ROUNDS);
  for (int i = 0; i < n; i++) {
    int k = 0;
    if (threads[0] != 0 && threads[0] != l[i].thread) {
      k = 1;
      cr_assert(threads[1] == 0 || threads[1] == l[i].thread, "a third thread number %u", l[i].thread);
    }
    threads[k] = l[i].thread;
    per[k]++;
    cr_assert(l[i].id >= 1 && l[i].id <= 2, "id %u: at most two live at once", l[i].id);
    cr_assert_eq(live[l[i].id], l[i].kind == 'f', "line %d: %c of id %u", i, l[i].kind, l[i].id);
    live[l[i].id] = l[i].kind == 'a';
  }
  cr_assert_neq(threads[0], threads[1]);
  cr_assert_eq(per[0], 2 * ROUNDS);
  cr_assert_eq(per[1], 2 * ROUNDS);
  unlink(path);
}

/* The second manager recording in a process writes PATH.2; %p is the
 * process id. */
Test(trace, the_second_manager_and_the_process_id) {
  char pattern[256], first[200], second[300];
  line l[4];
  um_manager *m1, *m2;
  um_buffer *a;
  snprintf(pattern, sizeof(pattern), "/tmp/unimem-test-trace-%%p-two");
  snprintf(first, sizeof(first), "/tmp/unimem-test-trace-%ld-two", (long)getpid());
  snprintf(second, sizeof(second), "%s.2", first);
  cr_assert_eq(setenv("UNIMEM_TRACE_FILE", pattern, 1), 0);
  m1 = ut_manager();
  m2 = ut_manager();
  cr_assert_eq(um_alloc(m2, um_device_get(m2, 0), 8, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m2), UM_OK);
  cr_assert_eq(um_manager_destroy(m1), UM_OK);
  cr_assert_eq(read_trace(first, l, 4), 0, "the first manager allocated nothing");
  cr_assert_eq(read_trace(second, l, 4), 2);
  expect(&l[0], 'a', 1, 8, UM_HOST);
  unlink(first);
  unlink(second);
}

/* A path that cannot be written: logged, nothing recorded, the program
 * works as without the variable. */
Test(trace, an_unwritable_path) {
  um_manager *m;
  um_buffer *a;
  cr_assert_eq(setenv("UNIMEM_TRACE_FILE", "/nonexistent-dir/trace.txt", 1), 0);
  m = ut_manager();
  cr_assert_eq(um_alloc(m, um_device_get(m, 0), 8, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  cr_assert_eq(access("/nonexistent-dir/trace.txt", F_OK), -1);
}
