/* fork(): SPEC 5 says a child may use unimem only through a new manager,
 * the parent's manager keeps working in the parent, and neither process
 * hangs or crashes. Here a child calls every public function (um_net
 * aside: issue 32 names those) on its parent's handles, and each must
 * answer UM_ESTATE without touching what the parent owns; then children
 * make managers of their own, also while the parent's threads are busy. */
#include "outside.h"

#include <unimem_dlpack.h>

#define FK_N 4096u

/* ASan's allocator is not fork-safe here: a child forked while another
 * thread allocates can block forever in it (seen: threads of the child
 * waiting in SizeClassAllocator64::GetFromAllocator, no unimem frame).
 * The tests that fork from a process with busy threads skip under ASan. */
#if defined(__SANITIZE_ADDRESS__)
#define FK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FK_ASAN 1
#endif
#endif
#ifdef FK_ASAN
#define FK_SKIP_UNDER_ASAN() cr_skip_test("ASan's allocator deadlocks in a child forked while threads allocate")
#else
#define FK_SKIP_UNDER_ASAN() ((void)0)
#endif
/* ThreadSanitizer supports no threads in a child forked from a process
 * with threads: it ends a child that starts one (die_after_fork), and
 * counts the parent's threads, absent in the child, as leaked at its exit.
 * The tests whose child starts threads (a manager of its own) skip. */
#ifdef OS_TSAN
#define FK_SKIP_UNDER_TSAN() cr_skip_test("TSan cannot run threads in a child forked from a process with threads")
#else
#define FK_SKIP_UNDER_TSAN() ((void)0)
#endif

/* A child's checks that go on after a failure, so that one run lists every
 * function that misbehaves; the child fails when any did. */
static int fk_failures;

#define FK_EXPECT(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "[child %d] %s:%d: %s: ", (int)getpid(), __FILE__,       \
              __LINE__, #cond);                                                \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      fk_failures++;                                                           \
    }                                                                          \
  } while (0)

#define FK_ESTATE(call)                                                        \
  do {                                                                         \
    int fk_st_ = (call);                                                       \
    FK_EXPECT(fk_st_ == UM_ESTATE, "%s in a child: %s, not UM_ESTATE", #call,  \
              um_err_name(fk_st_));                                            \
  } while (0)

/* os_reap, but a child still running at the bound has its stacks printed
 * (gdb, where installed) before it is killed: the hang's place. */
static int fk_reap(pid_t pid, unsigned timeout_ms) {
  uint64_t end = os_now_ms() + timeout_ms;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0)
      return -1;
    if (os_now_ms() >= end)
      break;
    os_sleep_ms(2);
  }
  if (access("/usr/bin/gdb", X_OK) == 0) {
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "gdb -p %d -batch -ex 'thread apply all bt 25' 1>&2 2>/dev/null", (int)pid);
    if (system(cmd) != 0)
      fprintf(stderr, "gdb failed\n");
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 124;
}

/* What the parent hands its child. */
typedef struct fk_parent {
  um_manager *m;
  um_device *d;       /* the profile's accelerator */
  um_buffer *b, *c;   /* b holds the pattern of seed 1; c is bracketed */
  um_event *held;     /* a fill of c held behind c's bracket */
  um_event *ended;    /* a fill of b that ended */
  void *tensor;       /* a DLPack export of b (NULL where not possible) */
  char file[64];      /* a file to map */
} fk_parent;

static void fk_parent_start(fk_parent *p) {
  uint8_t h[FK_N];
  void *w = NULL;
  int64_t shape = FK_N;
  memset(p, 0, sizeof(*p));
  p->m = os_manager();
  p->d = os_device(p->m);
  cr_assert_eq(um_alloc(p->m, p->d, FK_N, os_location(), 0, &p->b), UM_OK);
  cr_assert_eq(um_alloc(p->m, p->d, FK_N, os_location(), 0, &p->c), UM_OK);
  cr_assert_eq(um_fill(p->b, 0, 0, FK_N, &p->ended), UM_OK);
  cr_assert_eq(um_event_wait(p->ended), UM_OK);
  os_pattern(h, FK_N, 1);
  cr_assert_eq(um_copy_from_host(p->b, 0, h, FK_N, NULL), UM_OK);
  cr_assert_eq(um_fill(p->c, 0, 5, FK_N, NULL), UM_OK);
  cr_assert_eq(um_access_begin(p->c, UM_MAP_READ_WRITE, &w), UM_OK);
  cr_assert_eq(um_fill(p->c, 0, 6, FK_N, &p->held), UM_OK);
  if (um_dlpack_export(p->b, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, UM_DLPACK_VERSIONED, &p->tensor) != UM_OK)
    p->tensor = NULL;
  snprintf(p->file, sizeof(p->file), "/tmp/um_outside_fork_%d", (int)getpid());
  {
    FILE *f = fopen(p->file, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(h, 1, FK_N, f), FK_N);
    fclose(f);
  }
}

/* After the child: everything of the parent as it was, and working. */
static void fk_parent_check_and_end(fk_parent *p, const um_stats *before) {
  uint8_t h[FK_N];
  um_stats s;
  cr_assert_eq(um_stats_get(p->m, NULL, &s), UM_OK);
  cr_assert_eq(s.active_buffers, before->active_buffers, "the child's calls changed the parent's buffers");
  cr_assert_eq(s.allocations, before->allocations);
  cr_assert_eq(s.releases, before->releases);
  cr_assert_eq(um_event_query(p->held), UM_EAGAIN, "the child's calls ran or ended the parent's held fill");
  cr_assert_eq(um_event_query(p->ended), UM_OK, "the child released the parent's event");
  cr_assert_eq(um_copy_to_host(p->b, 0, h, FK_N, NULL), UM_OK);
  cr_assert_eq(os_pattern_diff(h, FK_N, 1), SIZE_MAX, "the parent's buffer changed");
  cr_assert_eq(um_access_end(p->c, NULL), UM_OK, "the parent's bracket is still open");
  cr_assert_eq(um_event_wait(p->held), UM_OK);
  cr_assert_eq(um_copy_to_host(p->c, 0, h, FK_N, NULL), UM_OK);
  cr_assert_eq(h[0], 6);
  cr_assert_eq(h[FK_N - 1], 6);
  if (p->tensor != NULL)
    ((um_dl_managed_tensor_versioned *)p->tensor)->deleter(p->tensor);
  cr_assert_eq(um_event_release(p->held), UM_OK);
  cr_assert_eq(um_event_release(p->ended), UM_OK);
  cr_assert_eq(um_release(p->b), UM_OK);
  cr_assert_eq(um_release(p->c), UM_OK);
  cr_assert_eq(um_manager_destroy(p->m), UM_OK);
  unlink(p->file);
}

/* The child: every function on the parent's handles. */
static int fk_child_calls(int idx, void *arg) {
  fk_parent *p = (fk_parent *)arg;
  uint8_t h[FK_N];
  um_buffer *x = NULL;
  um_event *e = NULL;
  void *v = NULL;
  (void)idx;
  memset(h, 9, sizeof(h));
  /* manager */
  FK_ESTATE(um_alloc(p->m, p->d, FK_N, UM_HOST, 0, &x));
  FK_ESTATE(um_alloc_array(p->m, p->d, 4, FK_N / 4, UM_HOST, 0, &x));
  FK_ESTATE(um_wrap_host(p->m, h, FK_N, 0, &x));
  FK_ESTATE(um_map_file(p->m, p->file, UM_MAP_READ, &x));
  FK_ESTATE(um_pool_trim(p->m, 0));
  {
    um_copy_op op;
    memset(&op, 0, sizeof(op));
    op.dst = p->b;
    op.host_src = h;
    op.bytes = FK_N;
    FK_ESTATE(um_copy_batch(p->m, &op, 1, NULL));
    FK_ESTATE(um_copy_batch(p->m, &op, 1, &e));
  }
  /* devices */
  FK_ESTATE(um_device_synchronize(p->d));
  FK_ESTATE(um_device_synchronize(um_device_get(p->m, 0)));
  {
    int st = um_peer_enable(p->d, um_device_get(p->m, 0));
    FK_EXPECT(st == UM_ESTATE || (p->d == um_device_get(p->m, 0) && st == UM_OK), "um_peer_enable: %s",
              um_err_name(st));
  }
  /* buffers */
  FK_ESTATE(um_buffer_retain(p->b));
  FK_ESTATE(um_copy_from_host(p->b, 0, h, FK_N, NULL));
  FK_ESTATE(um_copy_from_host(p->b, 0, h, FK_N, &e));
  FK_ESTATE(um_copy_to_host(p->b, 0, h, FK_N, NULL));
  FK_ESTATE(um_copy_to_host(p->b, 0, h, FK_N, &e));
  FK_ESTATE(um_copy(p->b, 0, p->c, 0, FK_N, NULL));
  FK_ESTATE(um_copy(p->b, 0, p->c, 0, FK_N, &e));
  FK_ESTATE(um_fill(p->b, 0, 7, FK_N, NULL));
  FK_ESTATE(um_fill(p->b, 0, 7, FK_N, &e));
  FK_ESTATE(um_map(p->b, UM_MAP_READ_WRITE, 0, FK_N, &v));
  FK_ESTATE(um_unmap(p->b, v));
  FK_ESTATE(um_access_begin(p->b, UM_MAP_READ_WRITE, &v));
  FK_ESTATE(um_access_end(p->c, NULL));
  {
    int64_t shape = FK_N;
    void *t = NULL;
    FK_ESTATE(um_dlpack_export(p->b, 0, 1, &shape, NULL, UM_DL_UINT, 8, 1, 0, &t));
    if (p->tensor != NULL) {
      FK_ESTATE(um_dlpack_import(p->m, p->tensor, UM_DLPACK_VERSIONED, &x));
      /* the deleter of a parent's tensor in a child: no crash, and nothing
       * in the parent (checked there) */
      ((um_dl_managed_tensor_versioned *)p->tensor)->deleter(p->tensor);
    }
  }
  /* events */
  FK_ESTATE(um_event_wait(p->held));
  FK_ESTATE(um_event_query(p->held));
  FK_ESTATE(um_event_cancel(p->held));
  FK_ESTATE(um_event_native(p->held, &v));
  FK_ESTATE(um_event_wait(p->ended));
  FK_ESTATE(um_event_release(p->ended));
  /* releases last */
  FK_ESTATE(um_release(p->b));
  FK_ESTATE(um_release(p->c));
  FK_ESTATE(um_manager_destroy(p->m));
  FK_EXPECT(x == NULL && e == NULL, "an out-parameter written by a refused call");
  return fk_failures ? 1 : 0;
}

Test(fork, child_calls_every_function_on_parent_handles, .timeout = 120) {
  fk_parent p;
  um_stats before;
  pid_t pid;
  fk_parent_start(&p);
  cr_assert_eq(um_stats_get(p.m, NULL, &before), UM_OK);
  pid = os_spawn(fk_child_calls, 0, &p);
  os_expect_peer(pid, 30000, "the child calling the parent's handles");
  fk_parent_check_and_end(&p, &before);
}

/* A child's stream on the parent's buffer: fn must never run. */
static int fk_chunk(void *user, um_buffer *chunk, size_t off, size_t bytes) {
  (void)user;
  (void)chunk;
  (void)off;
  (void)bytes;
  fprintf(stderr, "[child] um_stream ran fn on a parent's buffer\n");
  return 1;
}

static int fk_child_stream(int idx, void *arg) {
  fk_parent *p = (fk_parent *)arg;
  (void)idx;
  FK_ESTATE(um_stream(p->b, 0, FK_N, p->d, 1024, fk_chunk, NULL, NULL));
  return fk_failures ? 1 : 0;
}

Test(fork, child_streams_parent_buffer, .timeout = 60) {
  fk_parent p;
  um_stats before;
  fk_parent_start(&p);
  cr_assert_eq(um_stats_get(p.m, NULL, &before), UM_OK);
  os_expect_peer(os_spawn(fk_child_stream, 0, &p), 30000, "the child");
  fk_parent_check_and_end(&p, &before);
}

/* The read-only functions on the parent's handles: no crash, no hang; the
 * codes are free (the header names none for a child). */
static int fk_child_getters(int idx, void *arg) {
  fk_parent *p = (fk_parent *)arg;
  um_device_info di;
  um_device_native dn;
  um_buffer_native bn;
  um_options o;
  um_stats s;
  uint64_t fr, tot;
  int32_t dt, did;
  (void)idx;
  fprintf(stderr, "[child] um_device_count %d\n", um_device_count(p->m));
  fprintf(stderr, "[child] um_device_get %p\n", (void *)um_device_get(p->m, 0));
  fprintf(stderr, "[child] um_manager_options %s\n", um_err_name(um_manager_options(p->m, &o)));
  fprintf(stderr, "[child] um_stats_get %s\n", um_err_name(um_stats_get(p->m, NULL, &s)));
  fprintf(stderr, "[child] um_device_info_get %s\n", um_err_name(um_device_info_get(p->d, &di)));
  fprintf(stderr, "[child] um_device_memory %s\n", um_err_name(um_device_memory(p->d, &fr, &tot)));
  fprintf(stderr, "[child] um_device_native_get %s\n", um_err_name(um_device_native_get(p->d, &dn)));
  fprintf(stderr, "[child] um_buffer_native_get %s\n", um_err_name(um_buffer_native_get(p->b, &bn)));
  fprintf(stderr, "[child] um_dlpack_device %s\n", um_err_name(um_dlpack_device(p->b, &dt, &did)));
  fprintf(stderr, "[child] um_peer_enabled %d um_peer_possible %d\n", um_peer_enabled(p->d, p->d),
          um_peer_possible(p->d, um_device_get(p->m, 0)));
  fprintf(stderr, "[child] size %zu valid %u loc %d host %p dev %p\n", um_buffer_size(p->b),
          um_buffer_valid(p->b), (int)um_buffer_location(p->b), um_buffer_host_ptr(p->b),
          (void *)um_buffer_device(p->b));
  return 0;
}

Test(fork, child_reads_parent_handles, .timeout = 60) {
  fk_parent p;
  um_stats before;
  fk_parent_start(&p);
  cr_assert_eq(um_stats_get(p.m, NULL, &before), UM_OK);
  os_expect_peer(os_spawn(fk_child_getters, 0, &p), 30000, "the child");
  fk_parent_check_and_end(&p, &before);
}

/* A child's own manager, with the profile's backends: it is made (vendor
 * drivers loaded before the fork may decline to open: the cpu device at
 * least), and everything works on it. */
static int fk_child_own(int idx, void *arg) {
  um_options o;
  um_manager *m = NULL;
  um_buffer *b = NULL, *c = NULL;
  uint8_t h[FK_N];
  um_event *e = NULL;
  int n;
  (void)arg;
  os_options(&o);
  OS_OK(um_manager_create(&o, &m));
  n = um_device_count(m);
  OS_CHECK(n >= 1, "%d devices", n);
  for (int di = 0; di < n; di++) {
    um_device *d = um_device_get(m, di);
    OS_OK(um_alloc(m, d, FK_N, UM_DEVICE, 0, &b));
    OS_OK(um_alloc(m, d, FK_N, UM_HOST, 0, &c));
    os_pattern(h, FK_N, (uint32_t)(idx + di));
    OS_OK(um_copy_from_host(b, 0, h, FK_N, &e));
    OS_OK(um_event_wait(e));
    OS_OK(um_event_release(e));
    OS_OK(um_copy(c, 0, b, 0, FK_N, NULL));
    memset(h, 0, sizeof(h));
    OS_OK(um_copy_to_host(c, 0, h, FK_N, NULL));
    OS_CHECK(os_pattern_diff(h, FK_N, (uint32_t)(idx + di)) == SIZE_MAX, "device %d: bytes lost", di);
    OS_OK(um_device_synchronize(d));
    OS_OK(um_release(b));
    OS_OK(um_release(c));
  }
  OS_OK(um_manager_destroy(m));
  return 0;
}

Test(fork, child_makes_its_own_manager, .timeout = 120) {
  fk_parent p;
  um_stats before;
  FK_SKIP_UNDER_TSAN();
  fk_parent_start(&p);
  cr_assert_eq(um_stats_get(p.m, NULL, &before), UM_OK);
  os_expect_peer(os_spawn(fk_child_own, 1, &p), 30000, "the child's own manager");
  fk_parent_check_and_end(&p, &before);
}

/* No manager in the parent before the fork: the child's manager may open
 * every backend. */
Test(fork, child_manager_without_parent_manager, .timeout = 120) {
  os_expect_peer(os_spawn(fk_child_own, 2, NULL), 30000, "the child's own manager");
}

/* Children forked while two parent threads allocate, copy and release in
 * a loop (the pool's locks and thread caches busy at the fork): each
 * child's own manager works, none deadlocks; the parent's threads go on. */
typedef struct fk_busy {
  um_manager *m;
  atomic_int stop;
  atomic_long rounds;
  atomic_int error;
} fk_busy;

static void *fk_busy_main(void *arg) {
  fk_busy *bz = (fk_busy *)arg;
  uint8_t h[256];
  memset(h, 3, sizeof(h));
  while (!atomic_load(&bz->stop)) {
    um_buffer *b = NULL;
    size_t n = 64u + (size_t)(atomic_load(&bz->rounds) % 64) * 64u;
    um_event *e = NULL;
    if (um_alloc(bz->m, os_device(bz->m), n, UM_DEVICE, 0, &b) != UM_OK) {
      atomic_store(&bz->error, 1);
      break;
    }
    if (um_copy_from_host(b, 0, h, sizeof(h) < n ? sizeof(h) : n, &e) != UM_OK || um_event_wait(e) != UM_OK)
      atomic_store(&bz->error, 2);
    um_event_release(e);
    um_release(b);
    atomic_fetch_add(&bz->rounds, 1);
  }
  return NULL;
}

static int fk_child_small(int idx, void *arg) {
  um_options o;
  um_manager *m = NULL;
  um_buffer *b = NULL;
  (void)arg;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  OS_OK(um_manager_create(&o, &m));
  for (int i = 0; i < 100; i++) {
    OS_OK(um_alloc(m, um_device_get(m, 0), 64u + (size_t)(i + idx) * 8u, UM_HOST, 0, &b));
    OS_OK(um_fill(b, 0, 1, 64, NULL));
    OS_OK(um_release(b));
  }
  OS_OK(um_manager_destroy(m));
  return 0;
}

Test(fork, children_forked_while_parent_threads_allocate, .timeout = 180) {
  fk_busy bz;
  pthread_t th[2];
  FK_SKIP_UNDER_ASAN();
  FK_SKIP_UNDER_TSAN();
  bz.m = os_manager();
  atomic_store(&bz.stop, 0);
  atomic_store(&bz.rounds, 0);
  atomic_store(&bz.error, 0);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, fk_busy_main, &bz), 0);
  for (int k = 0; k < 30; k++) {
    pid_t pid = os_spawn(fk_child_small, k, NULL);
    int rc = fk_reap(pid, 20000);
    if (rc != 0) {
      atomic_store(&bz.stop, 1);
      cr_assert_fail("child %d of 30 ended with %d (124: a hang, 134: abort)", k, rc);
    }
  }
  atomic_store(&bz.stop, 1);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  cr_assert_eq(atomic_load(&bz.error), 0, "the parent's threads failed");
  cr_assert_gt(atomic_load(&bz.rounds), 0);
  cr_assert_eq(um_manager_destroy(bz.m), UM_OK);
}

/* A child that ends with exit() (atexit handlers, library destructors)
 * rather than _exit, holding the parent's manager and buffers: no hang. */
Test(fork, child_exits_with_exit, .timeout = 60) {
  fk_parent p;
  um_stats before;
  pid_t pid;
  fk_parent_start(&p);
  cr_assert_eq(um_stats_get(p.m, NULL, &before), UM_OK);
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    exit(0);
  }
  cr_assert_eq(os_reap(pid, 20000), 0, "a child's exit() with a parent's manager (124: hang)");
  fk_parent_check_and_end(&p, &before);
}

/* A grandchild: the child forks again after making its own manager; the
 * grandchild makes one more. */
static int fk_child_forks(int idx, void *arg) {
  um_options o;
  um_manager *m = NULL;
  um_buffer *b = NULL;
  pid_t pid;
  int rc;
  (void)idx;
  (void)arg;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  OS_OK(um_manager_create(&o, &m));
  OS_OK(um_alloc(m, um_device_get(m, 0), 4096, UM_HOST, 0, &b));
  fflush(stderr);
  pid = fork();
  OS_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    OS_CHECK(um_release(b) == UM_ESTATE, "the grandchild released its parent's buffer");
    os_child_exit(fk_child_own(3, NULL));
  }
  rc = fk_reap(pid, 20000);
  OS_CHECK(rc == 0, "the grandchild ended with %d", rc);
  OS_OK(um_release(b));
  OS_OK(um_manager_destroy(m));
  return 0;
}

Test(fork, grandchild, .timeout = 120) {
  um_manager *m;
  FK_SKIP_UNDER_ASAN();
  FK_SKIP_UNDER_TSAN();
  m = os_manager();
  os_expect_peer(os_spawn(fk_child_forks, 0, NULL), 40000, "the child");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A fork while the parent's fill of 256 MiB runs: the child's own manager
 * works; the parent's fill ends with UM_OK. */
Test(fork, fork_during_a_large_fill, .timeout = 120) {
  um_manager *m;
  um_buffer *b = NULL;
  um_event *e = NULL;
  FK_SKIP_UNDER_TSAN();
  m = os_manager();
  const size_t big = 256u << 20;
  cr_assert_eq(um_alloc(m, os_device(m), big, os_location(), 0, &b), UM_OK);
  cr_assert_eq(um_fill(b, 0, 0x33, big, &e), UM_OK);
  os_expect_peer(os_spawn(fk_child_small, 0, NULL), 30000, "the child");
  cr_assert_eq(um_event_wait(e), UM_OK);
  {
    uint8_t h[16];
    cr_assert_eq(um_copy_to_host(b, big - 16, h, 16, NULL), UM_OK);
    cr_assert_eq(h[15], 0x33);
  }
  cr_assert_eq(um_event_release(e), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
