/* base/: what every layer uses and that knows no unimem object: errors and
 * logging, options, the fork generation, size classes, the spin of a
 * waiter, page locks, the kind of the calling thread, a latch. */
#ifndef UNIMEM_BASE_H
#define UNIMEM_BASE_H

#ifndef UM__SEES_BASE
#error "base.h: this folder may not include base/ (src/README.md)"
#endif

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "atomic.h"
#include "unimem.h"

/* ------------------------------------------------------------------------ */
/* sizeclass.c: exact up to 8 bytes, then four classes per power of two.
 * Inline (C99 semantics, external definitions in sizeclass.c): they are on
 * every allocation's path. */

inline int um__size_class_of(size_t bytes) {
  int k;
  if (bytes <= 8)
    return bytes == 0 ? 0 : (int)bytes - 1;
  /* bytes in (2^k, 2^(k+1)]: classes 2^k + i * 2^(k-2), i = 1..4. */
  k = 63 - __builtin_clzll((unsigned long long)(bytes - 1));
  return 8 + (k - 3) * 4 + (int)((bytes - 1 - ((size_t)1 << k)) >> (k - 2));
}

inline size_t um__class_size(int cls) {
  int k, i;
  if (cls < 8)
    return (size_t)cls + 1;
  k = (cls - 8) / 4 + 3;
  i = (cls - 8) % 4 + 1;
  return ((size_t)1 << k) + ((size_t)1 << (k - 2)) * (size_t)i;
}


static inline uint64_t um__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* errors.c */
/* Record a failure's detail for um_last_error() (printf format) and return
 * status, so a backend can write: return um__set_error(UM_ENOMEM, "..."). */
int um__set_error(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Page locks that nest (pagelock.c): mlock [addr, addr + bytes) for one
 * more owner (fresh: the pages are a new mapping of the caller's, which
 * nobody else can have locked), UM_ENOMEM with the reason when refused; and
 * unlock what no other owner, and nobody before unimem, holds locked. */
int um__pagelock_acquire(void *addr, size_t bytes, int fresh);
void um__pagelock_release(void *addr, size_t bytes);

/* The process's fork generation (fork.c): it changes in a child process of
 * fork(). A backend whose vendor library was initialised under another
 * generation declines to open (UM_ENODEV): vendor drivers do not survive
 * fork() in the child. */
unsigned um__process_generation(void);
/* Poll done(arg) until it answers nonzero or ns nanoseconds have passed,
 * with a CPU pause instruction between polls (spin.c), before a blocking
 * wait sleeps: um_options.wait_spin_ns. Returns done's last answer: nonzero
 * when the caller need not sleep, 0 when it should (at once, without a
 * single poll, when ns is 0). done must not block. */
int um__spin_until(uint32_t ns, int (*done)(void *arg), void *arg);
/* The clock of those spins (CLOCK_MONOTONIC, in nanoseconds), and a spin
 * until it reads at least until_ns. */
uint64_t um__spin_clock_ns(void);
void um__spin_to(uint64_t until_ns);
/* The calling thread is the backend's own (not a driver's), calls done()
 * with no lock of the backend held, and may take the backend's
 * non-blocking calls: operations reported done on it are finished right
 * there, as under callbacks_reenter, instead of on one of the core's
 * threads (op.c). Called once, at the start of such a thread. */
void um__thread_completes_inline(void);
/* The same for a while (a waiter's token_reap): sets the calling thread's
 * mark to on and returns what it was, to be set back after. */
bool um__thread_completes_inline_set(bool on);
/* The mark itself (thread.c), read on every completion. initial-exec: the
 * library is linked at start-up, and the general model would cost a
 * __tls_get_addr call. */
extern _Thread_local bool um__completes_inline __attribute__((tls_model("initial-exec")));
/* Log through the options' log callback (stderr when none). */
void um__log(const um_options *opts, um_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void um__clear_error(void);

/* options.c */
/* The longest wait_spin_ns: a second of spinning is already far past any
 * wait it can shorten (a device round trip is tens of microseconds). */
#define UM__WAIT_SPIN_MAX_NS 1000000000u
int um__options_check(const um_options *o);
bool um__backend_selected(const um_options *o, const char *name);


/* fork.c: moves in every child process of fork() (a manager made under
 * another value belongs to an ancestor process and is refused), by
 * um__fork_child_note, which core/thread.c's handler calls first. */
extern atomic_uint um__fork_generation;
void um__fork_child_note(void);

/* fork.c: mmap, munmap and madvise as unimem makes them. In the process
 * that loaded unimem they are the C library's (which UCX's memory hooks may
 * watch, to keep its registration cache right); in a child process of
 * fork() they go to the kernel directly, since a hook there can wait
 * forever on a lock that a thread of the parent held at the fork. */
void *um__os_mmap(void *addr, size_t len, int prot, int flags, int fd, long off);
int um__os_munmap(void *addr, size_t len);
int um__os_madvise(void *addr, size_t len, int advice);

/* Little-endian fields of the blobs and keys, whatever the host's order:
 * n bytes of v at p, and back. */
static inline void um__net_le_put(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t um__net_le_get(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* ------------------------------------------------------------------------ */
/* vendor_lib.c: a vendor library loaded at run time, once per process and
 * kept for it. The user fills the first fields (UM__VENDOR_LIB_INIT); the
 * rest is what the one load found. */
typedef struct um__vendor_entry {
  const char *symbol; /* the exact name the library exports */
  size_t offset;      /* of its function pointer in the table */
  bool required;      /* missing: the library is refused */
} um__vendor_entry;

typedef struct um__vendor_lib {
  const char *what;         /* the messages' first word: "opencl", "cuda", "UCX" */
  const char *env;          /* a variable that names another file (a test double) */
  const char *const *names; /* else these, tried in order; NULL-terminated */
  const um__vendor_entry *entries;
  size_t nentries;
  void *table; /* the struct of function pointers the entries fill */
  size_t table_size;
  /* NULL, or the checks once the entries are in (a call such as cuInit):
   * nonzero refuses the library, with the reason written into failure. */
  int (*after)(struct um__vendor_lib *lib);
  pthread_mutex_t lock;
  atomic_bool done; /* the load ran */
  bool loaded;      /* and found the library usable */
  unsigned generation; /* um__process_generation() at load */
  void *handle;
  char path[256];     /* the file opened (or tried last) */
  char failure[384];  /* why not loaded */
} um__vendor_lib;

#define UM__VENDOR_LIB_INIT(what_, env_, names_, entries_, table_, after_)                               \
  {.what = (what_), .env = (env_), .names = (names_), .entries = (entries_),                             \
   .nentries = sizeof(entries_) / sizeof((entries_)[0]), .table = (table_), .table_size = sizeof(*(table_)), \
   .after = (after_), .lock = PTHREAD_MUTEX_INITIALIZER}

/* Load lib once per process. UM_OK; else code, with what failed (the
 * library, the missing entry point, the after check, a load made before
 * fork()) in um_last_error(). */
int um__vendor_lib_load(um__vendor_lib *lib, int code);

/* ------------------------------------------------------------------------ */
/* One staging chunk's transfer in flight, waited for by the thread that
 * started it (staged.c's pipelined copies, staging.c's network
 * chunks): the starter sets busy, the transfer's done callback
 * (um__chunk_latch_done, a um__done_fn) clears it and keeps the status. */
typedef struct um__chunk_latch {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool busy;
  int status;
} um__chunk_latch;

static inline void um__chunk_latch_init(um__chunk_latch *l) {
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->cond, NULL);
  l->busy = false;
  l->status = UM_OK;
}

static inline void um__chunk_latch_destroy(um__chunk_latch *l) {
  pthread_mutex_destroy(&l->lock);
  pthread_cond_destroy(&l->cond);
}

static inline void um__chunk_latch_done(void *arg, int status) {
  um__chunk_latch *l = arg;
  pthread_mutex_lock(&l->lock);
  l->busy = false;
  l->status = status;
  pthread_cond_signal(&l->cond);
  pthread_mutex_unlock(&l->lock);
}

/* Wait until the transfer (if any) finished; its status, reset to UM_OK
 * for the chunk's next transfer. */
static inline int um__chunk_latch_wait(um__chunk_latch *l) {
  int st;
  pthread_mutex_lock(&l->lock);
  while (l->busy)
    pthread_cond_wait(&l->cond, &l->lock);
  st = l->status;
  l->status = UM_OK;
  pthread_mutex_unlock(&l->lock);
  return st;
}

#endif /* UNIMEM_BASE_H */
