/* Each thread's context and the process's fork, for every layer: the one
 * pthread key whose destructor ends a thread's share of every manager it
 * used, and the one set of pthread_atfork handlers. The pool's share is
 * called down (mem/tcache.h); the layers above core/ add theirs
 * (um__thread_part_add), so no layer's thread exit or fork reaches into
 * another's. */
#include <pthread.h>

#include "core.h"

/* The parts above core/: the operation layer's event stash, the net's
 * registry. Written by constructors before any thread runs. */
#define MAX_PARTS 4
static const um__thread_part *parts[MAX_PARTS];
static int nparts;

void um__thread_part_add(const um__thread_part *p) {
  if (nparts < MAX_PARTS)
    parts[nparts++] = p;
}

/* A thread ends: for each manager it used, the pool's blocks go back to the
 * bins first (the parts may release nothing into a cache that is going),
 * then every part's share, then its counters are merged. Under the pool's
 * lifetime lock, so that a manager's destroy does not run meanwhile. */
static void thread_exit(void *unused) {
  um_manager *m;
  um__tcache *tc;
  (void)unused;
  um__tcache_lifetime_lock();
  while ((tc = um__tcache_exit_next(&m)) != NULL) {
    if (m != NULL) {
      um__tcache_exit_give_back(tc, m);
      for (int i = 0; i < nparts; i++)
        if (parts[i]->thread_exit != NULL)
          parts[i]->thread_exit(m, tc);
    }
    um__tcache_exit_leave(tc, m);
  }
  um__tcache_lifetime_unlock();
}

/* fork(): every lock a part holds across the fork is taken before the
 * pool's, which its thread exits take inside theirs; in the child the
 * generation moves before anything else, so that no part's handler sees a
 * parent's manager as its own. */
static void fork_prepare(void) {
  for (int i = nparts - 1; i >= 0; i--)
    if (parts[i]->fork_prepare != NULL)
      parts[i]->fork_prepare();
  um__tcache_fork_prepare();
}

static void fork_parent(void) {
  um__tcache_fork_parent();
  for (int i = 0; i < nparts; i++)
    if (parts[i]->fork_parent != NULL)
      parts[i]->fork_parent();
}

static void fork_child(void) {
  um__fork_child_note();
  um__tcache_fork_child();
  for (int i = 0; i < nparts; i++)
    if (parts[i]->fork_child != NULL)
      parts[i]->fork_child();
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init(void) {
  pthread_key_t key;
  /* Without the key no thread cache is made (the pool then works from its
   * bins): cached blocks would be stranded at thread exit. */
  if (pthread_key_create(&key, thread_exit) == 0)
    um__tcache_use_exit_key(key);
  else
    um__log(NULL, UM_LOG_WARN, "pthread_key_create failed: threads allocate without a cache");
  /* Fails only without memory for the handler list; managers still work,
   * and a child then risks what base/fork.c guards against. */
  if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0)
    um__log(NULL, UM_LOG_WARN, "pthread_atfork failed: a child process of fork() must not use unimem");
}

void um__thread_init(void) { pthread_once(&init_once, init); }
