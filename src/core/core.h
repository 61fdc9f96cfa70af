/* core/: the manager, buffer objects and their states, statistics,
 * mapped files. */
#ifndef UNIMEM_CORE_H
#define UNIMEM_CORE_H

#ifndef UM__SEES_CORE
#error "core.h: this folder may not include core/ (src/README.md)"
#endif

#include <stdio.h>

#include "tcache.h"

/* buffer.c: a buffer over memory someone else owns (a DLPack producer's),
 * on device d at loc: mem as d's backend knows such memory (a host view, or
 * a cl_mem / CUdeviceptr handle with host NULL). Never pooled; released
 * like a wrap (its release waits for its operations), and on_return(ctx)
 * runs exactly once when the memory goes back (also at manager destroy for
 * a buffer never released). */
int um__wrap_foreign(um_manager *m, um_device *d, um_location loc, const um__mem *mem, size_t bytes,
                     void (*on_return)(void *ctx), void *ctx, um_buffer **out);

/* trace.c: UNIMEM_TRACE_FILE's recording of allocations and releases
 * (m->trace, NULL when off). open at create, before any thread cache;
 * close at destroy; alloc once b is live; release once b is released and
 * before its block goes back. */
typedef struct um__trace um__trace;
/* pattern with "%p" as the process id, and ".n" appended for n > 1. */
void um__expand_path(const char *pattern, int n, char *out, size_t cap);
void um__trace_open(um_manager *m);
void um__trace_close(um_manager *m);
void um__trace_alloc(um_manager *m, um_buffer *b);
void um__trace_release(um_manager *m, um_buffer *b);

/* observe.c: tags, scopes and what observing stamps on blocks (and
 * history.c's switch). create after the devices, destroy last; alloc once
 * b is live and release once it is released, both while m->observing
 * (which a tag keeps on for good, so a tagged buffer is always uncounted). */
typedef struct um__obs um__obs;
int um__obs_create(um_manager *m);
void um__obs_destroy(um_manager *m);
void um__obs_alloc(um_buffer *b, int how);
/* The backtraces of every buffer still registered go (at destroy). */
void um__obs_frames_free(um_manager *m);
void um__obs_release(um_buffer *b);
/* The tag this thread's work on m counts for now (0: tags off). */
uint16_t um__obs_tag_now(um_manager *m);
/* m is a manager of this process: UM_OK, else UM_EINVAL or (a fork child
 * given its parent's) UM_ESTATE, with the message; fn names the call. */
int um__obs_check(um_manager *m, const char *fn);
const char *um__obs_tag_name(const um_manager *m, uint16_t tag);
bool um__obs_tag_known(const um_manager *m, uint16_t tag);
/* snapshot.c: s as a JSON string (quoted and escaped), or null. */
void um__json_string(FILE *f, const char *s);
/* An allocation site as "file:line", or null when file is NULL. */
void um__json_site(FILE *f, const char *file, int line);
/* Directions of um__obs_moved, as um_tag_stats lists them. */
enum { UM__DIR_H2D, UM__DIR_D2H, UM__DIR_D2D, UM__DIR_PEER, UM__DIR_NET_OUT, UM__DIR_NET_IN };
void um__obs_moved(um_manager *m, uint16_t tag, const um_device *d, int dir, uint64_t bytes);
void um__obs_history(um_manager *m, bool on);
uint64_t um__obs_t0(const um_manager *m);
/* history.c: whether m records; an event into its ring; the ring freed
 * (at destroy). */
bool um__hist_on(um_manager *m);
void um__hist_put(um_manager *m, const um_history_event *e);
void um__hist_destroy(um_manager *m);
/* observe.c: an operation of ops/ finished (op->obs_tag or recording):
 * its event, times since the manager's creation. */
void um__obs_event(um_manager *m, um_history_event *e);
/* A number per thread, 1, 2, ... in the order threads first ask. */
unsigned um__thread_number(void);

/* thread.c: each thread's context and the process's fork, for every
 * layer. A layer above core/ adds its share at load time (a constructor:
 * no lock is taken to read the list): a thread leaving m, after the pool's
 * blocks went back and before its counters are merged (tc is the thread's
 * cache for m); and fork's three moments, prepare in the reverse order of
 * addition, parent and child in the order. */
typedef struct um__thread_part {
  void (*thread_exit)(um_manager *m, um__tcache *tc);
  void (*fork_prepare)(void);
  void (*fork_parent)(void);
  void (*fork_child)(void);
} um__thread_part;
void um__thread_part_add(const um__thread_part *p);
/* Once per process, before the first manager's first thread cache: the
 * thread-exit key and the fork handlers. */
void um__thread_init(void);

/* manager.c */
int um__manager_create_ex(const um_options *opts, const um__backend *const *extra, int nextra,
                          um_manager **out);


/* buffer_state.c */
int um__buffer_check_live(const um_buffer *b);
/* um__buffer_check_live, and b's generation for a check under its lock. */
int um__buffer_check_owner(const um_buffer *b, uint32_t *gen);
/* An operation on b finished (b's lock held): drop it from b's chain;
 * *drop_last says the chain's reference to op must be dropped, *retire
 * that b was released meanwhile and must now be retired (both after the
 * lock is released). */
void um__buffer_op_finish_locked(um_buffer *b, um_event *op, bool *drop_last, bool *retire);
/* Block until every operation issued on b has finished. */
void um__buffer_wait_idle(um_buffer *b);
/* The same under b's lock, which the wait drops and takes again. */
void um__buffer_wait_idle_locked(um_buffer *b);
/* A released buffer with nothing pending: its block goes to this thread's
 * cache (tc, when not NULL and the class has a slot), the quarantine
 * (debug), or its owner. */
void um__buffer_retire(um_buffer *b, um__tcache *tc);
/* UM_WRAP_PIN: register a live wrap with the other backends; whether d's
 * backend registered it (d may DMA from and to it directly). */
void um__wrap_register_devices(um_buffer *b);
/* um__wrap_registered: above, before um__path_dma_ready. */

/* (buffer_state.c) Whether d's backend registered b, a UM_WRAP_PIN wrap. */
bool um__wrap_registered(const um_buffer *b, const um_device *d);

/* riders.c: waits that a bracket's end riding on its queue's next command
 * may hold up (um__xfer.ride). Every device's riders get a command now. */
void um__riders_kick(um_manager *m);
/* A wait begins (counted, and every device kicked) and ends. */
void um__riders_wait_begin(um_manager *m);
void um__riders_wait_end(um_manager *m);
/* Whether a wait is under way: a rider added now must kick itself. */
bool um__riders_waited(um_manager *m);

#endif /* UNIMEM_CORE_H */
