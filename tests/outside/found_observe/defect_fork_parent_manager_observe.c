/* DEFECT: in a fork() child, the observe calls given the PARENT's manager are not refused: um_tag_push,
 * um_tag_pop, um_history_start/stop/write, um_snapshot_take, um_scope_push/pop answer UM_OK and
 * um_tag_stats_get returns a count, i.e. they touch the parent's locks and state (which another parent
 * thread may have held at the fork: this program forks while a thread allocates under a tag). Every other
 * entry point answers UM_ESTATE in a child (test_fork.c). What works: the child's own new manager tags,
 * records, writes a history and a snapshot (valid JSON).
 * DEADLOCK: with UNIMEM_BACKENDS=cpu, 7 of 20 children hung in um_history_stop(parent's manager) (the last
 * line they printed is the um_tag_pop one) until alarm(20) killed them ("child killed by signal 14"): the
 * lock that the parent's allocating thread held at the fork is never released in the child.
 * Promises: tests/outside/rules.md "Every non-net public function given a parent's handle in a forked child
 * answers UM_ESTATE; the parent is unharmed"; docs/design.md "fork()": "in a child, every entry point of a
 * parent's manager, buffer or event answers UM_ESTATE instead of touching locks that other threads may have
 * held at the fork"; SPEC.md 5 "Fork: a child process may use unimem after fork() only through a new manager".
 * Build: clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address,undefined -Iinclude
 *   tests/outside/found_observe/defect_fork_parent_manager_observe.c -Lbuild-h -lunimem -Wl,-rpath,$PWD/build-h -lpthread -o /tmp/X
 * Run: POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl /tmp/X ; UNIMEM_BACKENDS=cpu /tmp/X
 * Printed (each of the 20 children; stderr):
 *   child 8053: um_tag_push(m, "child") answered UM_OK (want UM_ESTATE)
 *   child 8053: um_tag_pop(m) answered UM_OK (want UM_ESTATE)
 *   child 8053: um_history_stop(m) answered UM_OK (want UM_ESTATE)
 *   child 8053: um_history_start(m, 10) answered UM_OK (want UM_ESTATE)
 *   child 8053: um_history_write(m, "/tmp/o/fork-parent.json") answered UM_OK (want UM_ESTATE)
 *   child 8053: um_snapshot_take(m, &s) answered UM_OK (want UM_ESTATE)
 *   child 8053: um_tag_stats_get(m, NULL, NULL, 0) answered UM_UNKNOWN (want UM_ESTATE)   [a positive count]
 *   child 8053: um_scope_push(m) answered UM_OK (want UM_ESTATE)
 *   child 8053: um_scope_pop(m, NULL) answered UM_OK (want UM_ESTATE)
 *   (um_history_get and um_alloc_tagged do answer UM_ESTATE)
 *   fork 0..19: child exit 1 / parent: history 65536 events, scope 166102 allocations / FAILED
 * Printed with UNIMEM_BACKENDS=cpu: "fork 3: child killed by signal 14", "fork 9: child killed by signal 14",
 *   ... (7 of 20), those children's last lines "um_tag_pop(m) answered UM_OK (want UM_ESTATE)".
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unimem.h>
static um_manager *m;
static int stopf;
static void *busy(void *p) {
  (void)p;
  static char src[4096];
  um_tag_push(m, "busy");
  while (!__atomic_load_n(&stopf, __ATOMIC_RELAXED)) {
    um_buffer *b;
    int d = um_device_count(m) - 1;
    if (um_alloc(m, um_device_get(m, d), 3000, d ? UM_DEVICE : UM_HOST, 0, &b)) continue;
    um_copy_from_host(b, 0, src, 3000, NULL);
    um_release(b);
  }
  um_tag_pop(m);
  return NULL;
}
#define EXPECT(c) do { if (!(c)) { fprintf(stderr, "child %d: FAIL line %d\n", (int)getpid(), __LINE__); _exit(1); } } while (0)
#define CODE(call, want) do { int rc_ = (call); if (rc_ != (want)) { fprintf(stderr, "child %d: %s answered %s (want %s)\n", (int)getpid(), #call, um_err_name(rc_), #want); fails++; } } while (0)
static int child(um_buffer *pb) {
  alarm(20);
  int fails = 0;
  CODE(um_tag_push(m, "child"), UM_ESTATE);
  CODE(um_tag_pop(m), UM_ESTATE);
  CODE(um_history_stop(m), UM_ESTATE);
  CODE(um_history_start(m, 10), UM_ESTATE);
  um_history_event ev[4];
  CODE(um_history_get(m, ev, 4, NULL, NULL), UM_ESTATE);
  CODE(um_history_write(m, "/tmp/o/fork-parent.json"), UM_ESTATE);
  um_snapshot *s;
  CODE(um_snapshot_take(m, &s), UM_ESTATE);
  CODE(um_tag_stats_get(m, NULL, NULL, 0), UM_ESTATE);
  CODE(um_scope_push(m), UM_ESTATE);
  CODE(um_scope_pop(m, NULL), UM_ESTATE);
  um_buffer *x;
  CODE(um_alloc_tagged(m, um_device_get(m, 0), 10, UM_HOST, 0, "c", &x), UM_ESTATE);
  (void)um_buffer_tag(pb);
  um_manager *c;
  um_options o; um_options_init(&o); snprintf(o.backends, sizeof o.backends, "cpu");
  EXPECT(um_manager_create(&o, &c) == UM_OK);
  EXPECT(um_history_start(c, 100) == UM_OK);
  EXPECT(um_tag_push(c, "child-tag") == UM_OK);
  EXPECT(um_alloc(c, um_device_get(c, 0), 100, UM_HOST, 0, &x) == UM_OK);
  EXPECT(!strcmp(um_buffer_tag(x), "child-tag"));
  EXPECT(um_snapshot_take(c, &s) == UM_OK);
  char p[64]; snprintf(p, sizeof p, "/tmp/o/fork-snap-%d.json", (int)getpid());
  EXPECT(um_snapshot_write(s, p) == UM_OK);
  um_snapshot_free(s);
  um_release(x);
  EXPECT(um_tag_pop(c) == UM_OK);
  EXPECT(um_history_stop(c) == UM_OK);
  size_t n; EXPECT(um_history_get(c, NULL, 0, &n, NULL) == UM_OK && n == 2);
  char q[64]; snprintf(q, sizeof q, "/tmp/o/fork-hist-%d.json", (int)getpid());
  EXPECT(um_history_write(c, q) == UM_OK);
  EXPECT(um_manager_destroy(c) == UM_OK);
  char cmd[256]; snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; [json.load(open(f)) for f in sys.argv[1:]]' %s %s", p, q);
  EXPECT(system(cmd) == 0);
  unlink(p); unlink(q);
  return fails ? 1 : 0;
}
int main(void) {
  if (um_manager_create(NULL, &m) != UM_OK) return 1;
  um_history_start(m, 1 << 16);
  um_tag_push(m, "parent");
  um_scope_push(m);
  um_buffer *pb;
  um_alloc(m, um_device_get(m, 0), 64, UM_HOST, 0, &pb);
  pthread_t t; pthread_create(&t, NULL, busy, NULL);
  int bad = 0;
  for (int i = 0; i < 20; i++) {
    usleep(20000);
    pid_t pid = fork();
    if (pid == 0) _exit(child(pb));
    int st; waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) { bad = 1; printf("fork %d: child %s %d\n", i, WIFSIGNALED(st) ? "killed by signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st)); }
  }
  __atomic_store_n(&stopf, 1, __ATOMIC_SEQ_CST);
  pthread_join(t, NULL);
  um_release(pb);
  um_scope_stats sc;
  if (um_scope_pop(m, &sc) != UM_OK || um_tag_pop(m) != UM_OK || um_history_stop(m) != UM_OK) { bad = 1; printf("parent lost its state\n"); }
  size_t n; um_history_get(m, NULL, 0, &n, NULL);
  printf("parent: history %zu events, scope %llu allocations\n", n, (unsigned long long)sc.allocations);
  if (n < 10) bad = 1;
  um_manager_destroy(m);
  printf(bad ? "FAILED\n" : "ok\n");
  return bad;
}
