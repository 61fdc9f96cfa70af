/* um_net across fork(): a child process may not use its parent's net.
 *
 * A parent P that loaded UCX (it has a net, an endpoint to a target T and
 * an exposed buffer) forks a child C:
 *  - every um_net_* and um_endpoint_* function of include/unimem.h, and
 *    um_release / um_manager_destroy, given a handle of P's, answers
 *    UM_ESTATE in C at once, and nothing C does reaches P's net: after C is
 *    gone, T's put into P's exposed buffer still lands and P's own put and
 *    get still work;
 *  - C's own manager works, but its um_net_create answers UM_ENOTSUP with
 *    the reason (UCX does not survive fork() in the child once loaded);
 *  - children forked while another thread of P exposes and unexposes
 *    buffers never find a lock of the net held (every call bounded);
 *  - a child never waits on UCX's memory hooks: libucm replaces mmap,
 *    munmap and madvise, and its handlers (UCX's registration cache) take a
 *    lock that a thread of P may hold at the fork, so C's pool maps and
 *    unmaps memory past them; P's own maps stay seen by the hooks.
 * Every wait is bounded: C runs under an alarm that names the call that
 * hung; P and T are reaped with a bound. Run once per UCX transport. */
#include <dlfcn.h>
#include <execinfo.h>
#include <sys/mman.h>

#include "outside.h"

#define FK_BYTES (1u << 20)
#define FK_WAIT_MS 60000

/* ------------------------------------------------------------------------ */
/* Helpers of a peer process */

/* A child of a peer that runs threads ends here, without LeakSanitizer's
 * check: the parent's memory that only its threads (absent in the child)
 * referenced would show as leaked. */
static int child_done(void) {
  alarm(0);
  fflush(stdout);
  fflush(stderr);
  _exit(0);
}

/* The step a child is at, named by its alarm when a call hangs. */
static const char *volatile child_step = "start";

/* The child has one thread: the alarm interrupts the call that hung, and
 * the backtrace says where. */
static void child_alarm(int sig) {
  char line[256];
  void *frames[32];
  int n = snprintf(line, sizeof(line), "[pid %d] hung in: %s\n", (int)getpid(), child_step);
  (void)sig;
  if (n > 0)
    (void)!write(2, line, (size_t)n);
  backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
  _exit(124);
}

static void child_bound(unsigned seconds) {
  signal(SIGALRM, child_alarm);
  alarm(seconds);
}

#define CHILD_EXPECT(code, call)                                               \
  do {                                                                         \
    int fk_st_;                                                                \
    child_step = #call;                                                        \
    fk_st_ = (call);                                                           \
    OS_CHECK(fk_st_ == (code), "%s: %s, %s expected", #call,                   \
             um_err_name(fk_st_), um_err_name(code));                          \
  } while (0)

/* A child that starts threads (a manager of its own) under a sanitizer:
 * ThreadSanitizer ends such a child (die_after_fork), and AddressSanitizer
 * (clang 14) does not hold its allocator's lock across fork(), so the
 * child's threads can wait forever inside ASan for a lock that a thread of
 * the parent held (seen here: um_manager_destroy joining engine workers
 * stuck in SizeClassAllocator64::GetFromAllocator). */
#if defined(__SANITIZE_ADDRESS__)
#define FK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FK_ASAN 1
#endif
#endif
#if defined(FK_ASAN) || defined(OS_TSAN)
#define FK_SKIP_IF_CHILD_THREADS_HANG()                                        \
  cr_skip_test("SKIP: a forked child that starts threads deadlocks inside the sanitizer (not unimem); "  \
               "the plain builds run this test")
#else
#define FK_SKIP_IF_CHILD_THREADS_HANG() ((void)0)
#endif

/* ------------------------------------------------------------------------ */
/* The parent's handles in a child */

typedef struct fork_setup {
  int fds[2]; /* P <-> T */
} fork_setup;

/* What P hands its child (copied by fork). */
typedef struct parent_state {
  os_peer p;
  um_endpoint *ep;
  um_buffer *exposed, *other;
  unsigned char taddr[4096], tkey[4096];
  size_t taddr_len, tkey_len;
} parent_state;

/* In C: every function of the net, given P's handles, is refused. */
static int child_uses_parent(int idx, void *arg) {
  parent_state *s = arg;
  unsigned char blob[4096];
  size_t len = sizeof(blob);
  um_endpoint *ep = NULL;
  um_buffer *b = NULL;
  um_event *ev = NULL;
  um_net *n = NULL;
  (void)idx;
  child_bound(20);
  CHILD_EXPECT(UM_ESTATE, um_net_create(s->p.m, &n));
  CHILD_EXPECT(UM_ESTATE, um_net_address(s->p.net, blob, &len));
  CHILD_EXPECT(UM_ESTATE, um_net_connect(s->p.net, s->taddr, s->taddr_len, &ep));
  len = sizeof(blob);
  CHILD_EXPECT(UM_ESTATE, um_net_expose(s->exposed, blob, &len));
  len = sizeof(blob);
  CHILD_EXPECT(UM_ESTATE, um_net_expose(s->other, blob, &len));
  CHILD_EXPECT(UM_ESTATE, um_net_unexpose(s->exposed));
  CHILD_EXPECT(UM_ESTATE, um_net_alloc(s->p.net, 4096, 0, &b));
  CHILD_EXPECT(UM_ESTATE, um_net_put(s->ep, s->other, 0, s->tkey, s->tkey_len, 0, 4096, NULL));
  CHILD_EXPECT(UM_ESTATE, um_net_put(s->ep, s->other, 0, s->tkey, s->tkey_len, 0, 4096, &ev));
  CHILD_EXPECT(UM_ESTATE, um_net_get(s->ep, s->other, 0, s->tkey, s->tkey_len, 0, 4096, NULL));
  CHILD_EXPECT(UM_ESTATE, um_net_get(s->ep, s->other, 0, s->tkey, s->tkey_len, 0, 4096, &ev));
  CHILD_EXPECT(UM_ESTATE, um_endpoint_close(s->ep));
  CHILD_EXPECT(UM_ESTATE, um_net_destroy(s->p.net));
  CHILD_EXPECT(UM_ESTATE, um_release(s->exposed));
  CHILD_EXPECT(UM_ESTATE, um_manager_destroy(s->p.m));
  OS_CHECK(n == NULL && ep == NULL && b == NULL && ev == NULL, "a refused call wrote its output");
  /* Twice: a refusal changes nothing either. */
  CHILD_EXPECT(UM_ESTATE, um_net_unexpose(s->exposed));
  CHILD_EXPECT(UM_ESTATE, um_net_destroy(s->p.net));
  return child_done();
}

static int fork_parent(int idx, void *arg) {
  fork_setup *k = arg;
  int fd = k->fds[idx];
  parent_state s;
  unsigned char mine[4096];
  size_t len = sizeof(mine);
  um_buffer *back;
  pid_t c;
  int rc;
  memset(&s, 0, sizeof(s));
  if ((rc = os_peer_open(&s.p, 20000)) != 0) {
    os_send(fd, "x", 1);
    return rc;
  }
  os_send(fd, "g", 1);
  OS_OK(um_net_address(s.p.net, mine, &len));
  os_send(fd, mine, len);
  s.taddr_len = os_recv(fd, s.taddr, sizeof(s.taddr), FK_WAIT_MS);
  OS_OK(um_net_connect(s.p.net, s.taddr, s.taddr_len, &s.ep));
  OS_OK(um_alloc(s.p.m, um_device_get(s.p.m, 0), FK_BYTES, UM_HOST, 0, &s.exposed));
  OS_OK(um_alloc(s.p.m, um_device_get(s.p.m, 0), FK_BYTES, UM_HOST, 0, &s.other));
  OS_OK(um_alloc(s.p.m, um_device_get(s.p.m, 0), FK_BYTES, UM_HOST, 0, &back));
  memset(um_buffer_host_ptr(s.exposed), 0, FK_BYTES);
  len = sizeof(mine);
  OS_OK(um_net_expose(s.exposed, mine, &len));
  os_send(fd, mine, len);
  s.tkey_len = os_recv(fd, s.tkey, sizeof(s.tkey), FK_WAIT_MS);
  /* A put before the fork: the endpoint is up and in use. */
  os_pattern(um_buffer_host_ptr(s.other), FK_BYTES, 0x11);
  OS_OK(um_net_put(s.ep, s.other, 0, s.tkey, s.tkey_len, 0, FK_BYTES, NULL));
  c = os_spawn(child_uses_parent, 0, &s);
  rc = os_reap(c, 30000);
  OS_CHECK(rc == 0, "the child ended with status %d (124: a call hung)", rc);
  /* Nothing of the child's reached this net: T's put into the exposed
   * buffer lands, and this side's own put and get work. */
  os_send(fd, "c", 1);
  os_expect(fd, 'p', FK_WAIT_MS);
  OS_CHECK(os_pattern_diff(um_buffer_host_ptr(s.exposed), FK_BYTES, 0x71) == SIZE_MAX,
           "T's put after the child did not land");
  os_pattern(um_buffer_host_ptr(s.other), FK_BYTES, 0x50);
  OS_OK(um_net_put(s.ep, s.other, 0, s.tkey, s.tkey_len, 0, FK_BYTES, NULL));
  OS_OK(um_net_get(s.ep, back, 0, s.tkey, s.tkey_len, 0, FK_BYTES, NULL));
  OS_CHECK(os_pattern_diff(um_buffer_host_ptr(back), FK_BYTES, 0x50) == SIZE_MAX, "get after the child");
  os_send(fd, "d", 1);
  os_expect(fd, 'q', FK_WAIT_MS);
  OS_OK(um_endpoint_close(s.ep));
  OS_OK(um_release(s.exposed));
  OS_OK(um_release(s.other));
  OS_OK(um_release(back));
  os_peer_close(&s.p);
  return 0;
}

/* T: connects to P, exposes a buffer, and puts into P's once P's child is
 * gone. */
static int fork_target(int idx, void *arg) {
  fork_setup *k = arg;
  int fd = k->fds[idx];
  unsigned char mine[4096], theirs[4096], pkey[4096];
  size_t len = sizeof(mine), tlen, pklen;
  um_endpoint *ep;
  um_buffer *b, *src;
  char go = 0;
  os_peer p;
  OS_CHECK(os_recv(fd, &go, 1, FK_WAIT_MS) == 1, "no word from P");
  if (go != 'g')
    return OS_SKIP;
  OS_CHECK(os_peer_open(&p, 20000) == 0, "P has UCX, T has not");
  tlen = os_recv(fd, theirs, sizeof(theirs), FK_WAIT_MS);
  OS_OK(um_net_address(p.net, mine, &len));
  os_send(fd, mine, len);
  OS_OK(um_net_connect(p.net, theirs, tlen, &ep));
  pklen = os_recv(fd, pkey, sizeof(pkey), FK_WAIT_MS);
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), FK_BYTES, UM_HOST, 0, &b));
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), FK_BYTES, UM_HOST, 0, &src));
  len = sizeof(mine);
  OS_OK(um_net_expose(b, mine, &len));
  os_send(fd, mine, len);
  os_expect(fd, 'c', FK_WAIT_MS);
  os_pattern(um_buffer_host_ptr(src), FK_BYTES, 0x71);
  OS_OK(um_net_put(ep, src, 0, pkey, pklen, 0, FK_BYTES, NULL));
  os_send(fd, "p", 1);
  os_expect(fd, 'd', FK_WAIT_MS);
  OS_CHECK(os_pattern_diff(um_buffer_host_ptr(b), FK_BYTES, 0x50) == SIZE_MAX, "P's put after its child");
  os_send(fd, "q", 1);
  OS_OK(um_endpoint_close(ep));
  OS_OK(um_release(b));
  OS_OK(um_release(src));
  os_peer_close(&p);
  return 0;
}

Test(net_fork, parent_handles_refused_in_child, .timeout = 180) {
  fork_setup k;
  pid_t pp, pt;
#ifdef OS_TSAN
  /* Open: under TSan, on every transport, a put issued after the peer's
   * own put can make no progress until net_timeout_ms (about half the
   * runs; the same without the fork), never in the other builds. */
  cr_skip_test("under TSan a put after the peer's put stalls in about half the runs (open, not a fork defect)");
#endif
  cr_assert_eq(nb_pair(k.fds), 0);
  /* T first: forked by this process, which never loads UCX. */
  pt = os_spawn(fork_target, 1, &k);
  pp = os_spawn(fork_parent, 0, &k);
  os_expect_peer(pp, 150000, "parent P");
  os_expect_peer(pt, 30000, "target T");
}

/* ------------------------------------------------------------------------ */
/* A child's own net, after the parent loaded UCX */

/* In C: its own manager works; its net is refused with the reason. */
static int child_own_net(int idx, void *arg) {
  um_options o;
  um_manager *m;
  um_buffer *b;
  um_net *n = NULL;
  int st;
  (void)idx;
  (void)arg;
  child_bound(20);
  os_options(&o);
  child_step = "um_manager_create";
  OS_OK(um_manager_create(&o, &m));
  child_step = "um_net_create";
  st = um_net_create(m, &n);
  OS_CHECK(st == UM_ENOTSUP && n == NULL, "um_net_create in the child: %s", um_err_name(st));
  OS_CHECK(strstr(um_last_error(), "fork") != NULL, "the reason does not name fork(): %s", um_last_error());
  child_step = "the child's own buffers";
  OS_OK(um_alloc(m, um_device_get(m, 0), FK_BYTES, UM_HOST, 0, &b));
  memset(um_buffer_host_ptr(b), 1, FK_BYTES);
  OS_OK(um_release(b));
  child_step = "um_manager_destroy";
  OS_OK(um_manager_destroy(m));
  return child_done();
}

/* P loads UCX (a net, then, with destroyed != 0, none left), forks C. */
static int own_net_parent(int idx, void *arg) {
  int destroyed = idx, rc;
  os_peer p;
  pid_t c;
  (void)arg;
  if ((rc = os_peer_open(&p, 20000)) != 0)
    return rc;
  if (destroyed)
    OS_OK(um_net_destroy(p.net));
  c = os_spawn(child_own_net, 0, NULL);
  rc = os_reap(c, 30000);
  OS_CHECK(rc == 0, "the child ended with status %d (124: a call hung)", rc);
  if (!destroyed)
    OS_OK(um_net_destroy(p.net));
  OS_OK(um_manager_destroy(p.m));
  return 0;
}

Test(net_fork, child_net_refused_after_parent_loaded_ucx, .timeout = 120) {
  FK_SKIP_IF_CHILD_THREADS_HANG();
  os_expect_peer(os_spawn(own_net_parent, 0, NULL), 60000, "parent with a net");
  os_expect_peer(os_spawn(own_net_parent, 1, NULL), 60000, "parent whose net was destroyed");
}

/* ------------------------------------------------------------------------ */
/* Forks while another thread works the net */

typedef struct churn {
  um_buffer *b;
  atomic_int stop;
  atomic_int rounds;
} churn;

static void *churn_main(void *arg) {
  churn *c = arg;
  unsigned char key[4096];
  while (!atomic_load(&c->stop)) {
    size_t len = sizeof(key);
    if (um_net_expose(c->b, key, &len) == UM_OK)
      (void)um_net_unexpose(c->b);
    atomic_fetch_add(&c->rounds, 1);
  }
  return NULL;
}

/* In C: its own manager's buffers are released (no net lock of P's is
 * taken), its net is refused, and a release of P's buffer too. */
static int churn_child(int idx, void *arg) {
  churn *c = arg;
  um_options o;
  um_manager *m;
  um_buffer *b;
  um_net *n = NULL;
  unsigned char key[4096];
  size_t len = sizeof(key);
  (void)idx;
  child_bound(20);
  os_options(&o);
  child_step = "um_manager_create";
  OS_OK(um_manager_create(&o, &m));
  child_step = "um_alloc / um_release in the child";
  for (int i = 0; i < 16; i++) {
    OS_OK(um_alloc(m, um_device_get(m, 0), 4096u << (i % 8), UM_HOST, 0, &b));
    OS_OK(um_release(b));
  }
  OS_OK(um_alloc(m, um_device_get(m, 0), 4096, UM_HOST, 0, &b));
  CHILD_EXPECT(UM_ESTATE, um_net_expose(b, key, &len)); /* no net of its own */
  CHILD_EXPECT(UM_ESTATE, um_net_unexpose(b));
  OS_OK(um_release(b));
  CHILD_EXPECT(UM_ENOTSUP, um_net_create(m, &n));
  CHILD_EXPECT(UM_ESTATE, um_release(c->b));
  child_step = "um_manager_destroy";
  OS_OK(um_manager_destroy(m));
  return child_done();
}

static int churn_parent(int idx, void *arg) {
  churn c;
  os_peer p;
  pthread_t t;
  int rc;
  (void)idx;
  (void)arg;
  if ((rc = os_peer_open(&p, 20000)) != 0)
    return rc;
  memset(&c, 0, sizeof(c));
  OS_OK(um_alloc(p.m, um_device_get(p.m, 0), FK_BYTES, UM_HOST, 0, &c.b));
  OS_CHECK(pthread_create(&t, NULL, churn_main, &c) == 0, "pthread_create");
  for (int i = 0; i < 24; i++) {
    int before = atomic_load(&c.rounds);
    pid_t ch = os_spawn(churn_child, i, &c);
    rc = os_reap(ch, 30000);
    OS_CHECK(rc == 0, "child %d ended with status %d (124: a call hung)", i, rc);
    uint64_t end = os_now_ms() + 20000;
    while (atomic_load(&c.rounds) < before + 2 && os_now_ms() < end) /* the thread is in its loop */
      os_sleep_ms(1);
    OS_CHECK(atomic_load(&c.rounds) >= before + 2, "the exposing thread hung");
  }
  atomic_store(&c.stop, 1);
  pthread_join(t, NULL);
  OS_OK(um_release(c.b));
  os_peer_close(&p);
  return 0;
}

Test(net_fork, fork_while_the_net_is_busy, .timeout = 240) {
  FK_SKIP_IF_CHILD_THREADS_HANG();
  os_expect_peer(os_spawn(churn_parent, 0, NULL), 200000, "parent forking while it exposes");
}

/* ------------------------------------------------------------------------ */
/* A child's memory maps and UCX's memory hooks */

/* libucm's API (ucm/api/ucm.h), reached through dlopen: the event is
 * UCS_BIT(17) there, the one UCX's registration cache listens to. */
typedef void (*fk_ucm_cb)(int event, void *ev, void *arg);
typedef int (*fk_ucm_set_fn)(int events, int priority, fk_ucm_cb cb, void *arg);
#define FK_UCM_VM_UNMAPPED (1 << 17)

/* Like UCX's registration cache: every unmap takes one lock. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int hook_calls;

static void hook_event(int event, void *ev, void *arg) {
  (void)event;
  (void)ev;
  (void)arg;
  pthread_mutex_lock(&hook_lock);
  atomic_fetch_add(&hook_calls, 1);
  pthread_mutex_unlock(&hook_lock);
}

static atomic_int hold_state; /* 1: the lock is held, 2: let it go */

static void *hold_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&hook_lock);
  atomic_store(&hold_state, 1);
  while (atomic_load(&hold_state) != 2)
    os_sleep_ms(1);
  pthread_mutex_unlock(&hook_lock);
  return NULL;
}

/* Blocks of every way host memory is mapped: carved from a segment (a new
 * manager reserves one), mapped alone (64 MiB), unmapped by a trim. */
static int hooked_child(int idx, void *arg) {
  static const size_t sizes[] = {4096, 1u << 20, 3u << 20, 64u << 20};
  um_options o;
  um_manager *m = NULL;
  um_buffer *b = NULL;
  (void)idx;
  (void)arg;
  child_bound(20);
  os_options(&o);
  child_step = "um_manager_create with the hooks' lock held by a thread of the parent";
  OS_OK(um_manager_create(&o, &m));
  for (int round = 0; round < 2; round++) {
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
      child_step = "um_alloc / um_release with the hooks' lock held by a thread of the parent";
      OS_OK(um_alloc(m, um_device_get(m, 0), sizes[i], UM_HOST, 0, &b));
      void *host = NULL;
      OS_OK(um_map(b, UM_MAP_WRITE_DISCARD, 0, sizes[i], &host));
      memset(host, 0x5a, sizes[i]);
      OS_OK(um_unmap(b, host));
      OS_OK(um_release(b));
    }
    child_step = "um_pool_trim(0) with the hooks' lock held by a thread of the parent";
    OS_OK(um_pool_trim(m, 0));
  }
  child_step = "um_manager_destroy with the hooks' lock held by a thread of the parent";
  OS_OK(um_manager_destroy(m));
  return child_done();
}

static int hooked_parent(int idx, void *arg) {
  um_options o;
  um_manager *m = NULL;
  um_buffer *b = NULL;
  pthread_t t;
  void *ucm;
  fk_ucm_set_fn set;
  int before, rc;
  (void)idx;
  (void)arg;
  /* Hooks that patch each library's calls, as UCX installs them here. */
  setenv("UCX_MEM_MMAP_HOOK_MODE", "reloc", 0);
  ucm = dlopen("libucs.so.0", RTLD_NOW | RTLD_GLOBAL) != NULL ? dlopen("libucm.so.0", RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (ucm == NULL) {
    fprintf(stderr, "SKIP: no libucs and libucm here (%s)\n", dlerror());
    return OS_SKIP;
  }
  set = (fk_ucm_set_fn)dlsym(ucm, "ucm_set_event_handler");
  OS_CHECK(set != NULL, "libucm has no ucm_set_event_handler");
  OS_CHECK(set(FK_UCM_VM_UNMAPPED, 1000, hook_event, NULL) == 0,
           "ucm_set_event_handler refused");
  os_options(&o);
  OS_OK(um_manager_create(&o, &m));
  /* The parent's unmaps are seen by the hooks (its registration cache
   * needs them): a 64 MiB block is mapped on its own, and unmapped. */
  before = atomic_load(&hook_calls);
  OS_OK(um_alloc(m, um_device_get(m, 0), 64u << 20, UM_HOST, 0, &b));
  OS_OK(um_release(b));
  OS_OK(um_pool_trim(m, 0));
  OS_CHECK(atomic_load(&hook_calls) >= before + 1,
           "the parent's unmap of a 64 MiB block reached the hooks %d times, at least once expected",
           atomic_load(&hook_calls) - before);
  for (int i = 0; i < 3; i++) {
    pid_t ch;
    atomic_store(&hold_state, 0);
    OS_CHECK(pthread_create(&t, NULL, hold_main, NULL) == 0, "pthread_create");
    while (atomic_load(&hold_state) != 1)
      os_sleep_ms(1);
    ch = os_spawn(hooked_child, i, NULL);
    rc = os_reap(ch, 30000);
    atomic_store(&hold_state, 2);
    pthread_join(t, NULL);
    OS_CHECK(rc == 0, "child %d ended with status %d (124: a call hung on the hooks' lock)", i, rc);
  }
  OS_OK(um_manager_destroy(m));
  return 0;
}

Test(net_fork, child_maps_past_the_memory_hooks, .timeout = 120) {
  FK_SKIP_IF_CHILD_THREADS_HANG();
  os_expect_peer(os_spawn(hooked_parent, 0, NULL), 100000, "parent holding the memory hooks' lock");
}
