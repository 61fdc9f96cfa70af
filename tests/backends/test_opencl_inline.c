/* A device that runs commands inside the call that submits them: PoCL's
 * basic device.
 *
 * The basic device has no thread of its own: a command runs inside the
 * clEnqueue* call that submits it, on the caller's thread. A command
 * submitted while the one before it on the queue is still running on
 * another thread is left for that thread to run, and PoCL 3.1 gets that
 * wrong twice: a blocking read submitted then returns before it has read
 * anything, and the thread that finishes the earlier command deadlocks
 * when it goes on to run the later one (pocl_basic_notify runs it with its
 * event locked). The model test found both (tests/test_model.c with
 * several threads: wrong bytes, and hangs). The backend now submits to
 * such a device under one lock (opencl/devices.c's submit_lock), so no command is
 * ever submitted while another runs.
 *
 * The test stops a long write in the middle of its memcpy, on the thread
 * that submitted it: the source's middle page is inaccessible, and the
 * fault handler waits there until the other thread's blocking read either
 * returned (the defect: its bytes are stale) or reached the submit lock
 * (the test point UM__TP_SUBMIT_INLINE), then opens the page.
 */
#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "opencl_util.h"

#define BIG ((size_t)64 << 20)
#define SMALL 4096

static char *trap;   /* the page of the write's source that stops it */
static size_t page;
static sem_t a_inside;  /* the write's command is running, stopped */
static sem_t b_arrived; /* the read reached the submit lock, or returned */
static _Thread_local bool is_reader;

static void on_trap(int sig, siginfo_t *si, void *uctx) {
  struct timespec until;
  (void)uctx;
  if ((char *)si->si_addr < trap || (char *)si->si_addr >= trap + page) {
    signal(sig, SIG_DFL); /* not ours: crash as without the handler */
    return;
  }
  sem_post(&a_inside);
  /* Bounded only so that a broken build fails instead of hanging here. */
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 20;
  while (sem_timedwait(&b_arrived, &until) != 0 && errno == EINTR)
    ;
  mprotect(trap, page, PROT_READ | PROT_WRITE);
}

static void hook(um__test_point point, void *arg) {
  (void)arg;
  if (point == UM__TP_SUBMIT_INLINE && is_reader)
    sem_post(&b_arrived);
}

typedef struct reader {
  um_buffer *b;
  unsigned char got[SMALL];
  int st;
} reader;

static void *read_while_a_runs(void *arg) {
  reader *r = arg;
  is_reader = true;
  while (sem_wait(&a_inside) != 0)
    ;
  r->st = um_copy_to_host(r->b, 0, r->got, SMALL, NULL);
  sem_post(&b_arrived);
  return NULL;
}

typedef struct writer {
  um_buffer *b;
  const char *src;
  int st;
} writer;

static void *write_big(void *arg) {
  writer *w = arg;
  w->st = um_copy_from_host(w->b, 0, w->src, BIG, NULL);
  return NULL;
}

Test(opencl_inline, blocking_read_during_another_threads_command_reads_its_bytes, .timeout = 60) {
  const char *kind = getenv("UNIMEM_TEST_POCL_DEVICE");
  unsigned char want[SMALL];
  struct sigaction sa, old;
  pthread_t ta, tb;
  reader r;
  writer w;
  char *src;
  ou_env e;
  if (kind == NULL || strcmp(kind, "basic") != 0)
    cr_skip_test("SKIP: runs on PoCL's basic device (UNIMEM_TEST_POCL_DEVICE=basic, the _basic "
                 "CTest entry): other devices run commands on their own threads");
  ou_want_devices(1);
  e = ou_open(NULL, 1);
  page = (size_t)sysconf(_SC_PAGESIZE);

  /* The read's buffer holds known bytes; the write goes to another one. */
  memset(&r, 0, sizeof(r));
  r.b = ub_alloc(e.m, e.dev[0], SMALL, UM_DEVICE);
  ub_pattern(want, SMALL, 7);
  cr_assert_eq(um_copy_from_host(r.b, 0, want, SMALL, NULL), UM_OK, "%s", um_last_error());
  memset(r.got, 0xee, SMALL);
  w.b = ub_alloc(e.m, e.dev[0], BIG, UM_DEVICE);
  src = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(src, MAP_FAILED);
  ub_pattern(src, BIG, 3);
  w.src = src;
  trap = src + BIG / 2;
  cr_assert_eq(mprotect(trap, page, PROT_NONE), 0);

  cr_assert_eq(sem_init(&a_inside, 0, 0), 0);
  cr_assert_eq(sem_init(&b_arrived, 0, 0), 0);
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_trap;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGSEGV, &sa, &old), 0);
  atomic_store(&um__test_hook, hook);

  cr_assert_eq(pthread_create(&tb, NULL, read_while_a_runs, &r), 0);
  cr_assert_eq(pthread_create(&ta, NULL, write_big, &w), 0);
  /* The read first: with the defect, the writer's thread never returns. */
  cr_assert_eq(pthread_join(tb, NULL), 0);
  cr_assert_eq(r.st, UM_OK, "%s", um_last_error());
  ub_assert_bytes(r.got, want, SMALL,
                  "the blocking read returned before its command ran (another thread's "
                  "command was running on the device)");
  cr_assert_eq(pthread_join(ta, NULL), 0);
  cr_assert_eq(w.st, UM_OK);
  atomic_store(&um__test_hook, NULL);
  sigaction(SIGSEGV, &old, NULL);

  {
    unsigned char *back = ub_read_all(w.b);
    ub_assert_bytes(back, src, BIG, "the stopped write");
    free(back);
  }
  munmap(src, BIG);
  cr_assert_eq(um_release(r.b), UM_OK);
  cr_assert_eq(um_release(w.b), UM_OK);
  sem_destroy(&a_inside);
  sem_destroy(&b_arrived);
  ou_close(&e);
}
