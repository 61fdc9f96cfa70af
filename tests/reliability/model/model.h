/* Model-based randomized test of the public API (tests/reliability/test_model.c runs
 * it): random programs of allocations, wraps, releases, copies of every
 * kind, fills, batches, mappings, cancels, event waits and releases, trims
 * and deliberately bad calls, checked against a byte-exact shadow model of
 * every live buffer and every host staging area, with the statistics
 * invariants checked after every step.
 *
 * The model applies operations in issue order. The library only orders the
 * operations of one buffer, so the program keeps to the caller's side of
 * the contract: host memory handed to an asynchronous call is not touched
 * (nor handed to a conflicting call) until that call is known to be done.
 *
 * An operation the program may cancel (a "candidate") is kept in the log
 * unapplied until its fate is known: um_event_cancel answered UM_OK (it
 * never runs) or UM_EBUSY (it runs), or the program chose not to cancel it.
 *
 * Files: model_state.c (model objects, the log, completion), model_check.c
 * (content and statistics checks), model_steps.c (valid operations),
 * model_events.c (events, cancels, the worker gate), model_bad.c (bad input),
 * model_buffers.c (allocations, wraps, releases, mappings), model_run.c (the
 * program: one thread or several). */
#ifndef UNIMEM_TEST_MODEL_H
#define UNIMEM_TEST_MODEL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "testing.h"

#define MDL_MAX_DEVS 8
#define MDL_MAX_BUFS 20       /* live buffers of one program, shared ones included */
#define MDL_MAX_AREAS 6       /* host staging areas of one program */
#define MDL_MAX_OPS 384       /* operation records in flight or unapplied */
#define MDL_MAX_EVENTS 40     /* events the program holds */
#define MDL_MAX_BATCH 8       /* operations in one um_copy_batch */
#define MDL_MAX_STALE 16      /* released handles kept for stale-use checks */
#define MDL_MAX_WRAPS_GONE 64 /* released wraps whose memory is watched */
#define MDL_POISON 0xA5       /* written over a wrap's memory after its release */

/* ------------------------------------------------------------------------ */
/* Random numbers: xorshift64*, one generator per program (per thread). */

typedef struct mdl_rng {
  uint64_t s;
} mdl_rng;

void mdl_rng_seed(mdl_rng *r, uint64_t seed);
uint64_t mdl_rand(mdl_rng *r);
/* Uniform in [lo, hi]. */
size_t mdl_range(mdl_rng *r, size_t lo, size_t hi);
/* 1 with probability pct / 100. */
int mdl_pct(mdl_rng *r, unsigned pct);
void mdl_fill_random(mdl_rng *r, unsigned char *p, size_t n);

/* ------------------------------------------------------------------------ */
/* Devices */

typedef enum { MDL_CPU, MDL_OPENCL, MDL_TEST, MDL_OTHER } mdl_dev_kind;

typedef struct mdl_dev {
  um_device *d;
  um_device_info info;
  mdl_dev_kind kind; /* MDL_TEST: a test backend (test-discrete, fault) */
  bool native_map;   /* the backend maps device memory (else the core keeps a shadow) */
  um_location locs[UM_LOCATION_COUNT]; /* the locations it offers */
  int nlocs;
} mdl_dev;

/* ------------------------------------------------------------------------ */
/* Buffers and host areas */

typedef enum { MDL_ALLOC = 0, MDL_WRAP = 1, MDL_WRAP_RO = 2 } mdl_buf_kind;

/* How um_map reaches a buffer's bytes, which decides the coherence state
 * um_buffer_valid reports (src/buffer.c draws the state machine). */
typedef enum { MDL_MAP_POINTER, MDL_MAP_NATIVE, MDL_MAP_SHADOW } mdl_map_style;

typedef struct mdl_buf {
  bool live;
  bool shared;   /* a read-only source shared by the threads: never written, mapped or released here */
  uint64_t id;   /* unique in the run, also across threads */
  um_buffer *h;
  int dev;       /* index into the program's devices */
  um_location loc;
  mdl_buf_kind kind;
  unsigned flags;
  bool pooled;   /* its block is a size class from the pool */
  size_t size;
  unsigned char *data;  /* expected bytes */
  unsigned char *known; /* 1 where the expected byte is defined */
  unsigned char *wrap_mem;  /* MDL_WRAP*: the caller memory wrapped */
  unsigned char *wrap_base; /* what to free: wrap_mem may be offset into it */
  bool host_view;
  mdl_map_style map_style;
  unsigned valid; /* expected um_buffer_valid */
  /* the open mapping */
  bool mapped;
  um_map_mode map_mode;
  size_t map_off, map_len;
  unsigned char *map_ptr;
  unsigned char *map_written; /* 1 for each mapped byte the program wrote */
  int map_age; /* steps left before the program unmaps it */
} mdl_buf;

typedef struct mdl_area {
  unsigned char *mem;   /* what the library reads and writes */
  unsigned char *data;  /* expected bytes */
  unsigned char *known;
  size_t cap;
} mdl_area;

/* ------------------------------------------------------------------------ */
/* Operation records */

typedef enum { MDL_H2B, MDL_B2H, MDL_B2B, MDL_FILL } mdl_op_kind;
typedef enum { MDL_FATE_RUN = 0, MDL_FATE_UNKNOWN = 1, MDL_FATE_CANCELED = 2 } mdl_fate;

typedef struct mdl_op {
  bool used;
  uint64_t seq;
  mdl_op_kind kind;
  mdl_buf *dst, *src;      /* model buffers; NULL once applied */
  uint64_t dst_id, src_id; /* 0 for the host side */
  int dev_dst;             /* device of dst (fills are counted there) */
  mdl_area *area;          /* host side, or NULL */
  size_t dst_off, src_off, bytes; /* the host side's offset is in the area */
  unsigned char value;
  mdl_fate fate;
  bool cancel_planned; /* a candidate: decided at issue whether to ask for its cancel */
  bool cancel_tried;
  bool applied;   /* effect in the model (or dropped, when canceled) */
  bool data_done; /* its bytes have landed (or it was canceled) */
  bool event_done;/* its event answers its final status */
  int refs;       /* event records that name it */
} mdl_op;

typedef struct mdl_event {
  um_event *e;
  mdl_op *ops[MDL_MAX_BATCH];
  int nops;
  bool group;      /* from um_copy_batch: never cancelable */
  bool done_known; /* a wait or query gave the final status */
} mdl_event;

/* A wrap released: its memory must not change any more (src/buffer.c:
 * releasing a wrap waits for its operations, SPEC section 5). */
typedef struct mdl_wrap_gone {
  unsigned char *mem;
  size_t size;
  uint64_t id;
} mdl_wrap_gone;

/* ------------------------------------------------------------------------ */
/* The program's counters per device: what the statistics must say. */

typedef struct mdl_counts {
  uint64_t live, in_use, allocations, releases, pooled_requests, fills;
  uint64_t capacity_live; /* bytes of the blocks of live non-wrap buffers */
  uint64_t blocks_live;   /* live non-wrap buffers */
  uint64_t peak;
} mdl_counts;

/* Run configuration, chosen from the seed. */
typedef struct mdl_config {
  um_options opts;
  size_t max_size;      /* largest buffer */
  size_t area_bytes;    /* size of each host area */
  int nareas;
  bool threads;         /* one of several threads: no gate, no stale handles */
  bool exact_peak;      /* one thread allocates: peaks are exact */
  bool pinned_ok;       /* mlock budget allows cpu PINNED buffers */
  uint64_t pinned_budget; /* bytes of live cpu PINNED blocks at most */
  uint64_t mlock_limit;   /* RLIMIT_MEMLOCK (UINT64_MAX: none) */
  uint64_t max_live_bytes;/* live buffer bytes of one program at most */
  bool generous_pool;   /* limits far above what the program holds */
} mdl_config;

struct mdl_shared;

typedef struct mdl_ctx {
  um_manager *m;
  mdl_dev devs[MDL_MAX_DEVS];
  int ndevs;
  mdl_config cfg;
  mdl_rng rng;
  uint64_t seed;
  int thread;           /* 0 for the single-threaded program */
  uint64_t step;        /* index of the current step (the "op" of the report) */
  char what[160];       /* the current step, for failure messages */
  bool trace;

  mdl_buf bufs[MDL_MAX_BUFS];
  mdl_area areas[MDL_MAX_AREAS];
  mdl_op ops[MDL_MAX_OPS];
  mdl_op *log[MDL_MAX_OPS]; /* unapplied, in issue order */
  int nlog;
  mdl_event events[MDL_MAX_EVENTS];
  int nevents;
  uint64_t seq;

  um_buffer *stale[MDL_MAX_STALE];
  int nstale;
  mdl_wrap_gone gone[MDL_MAX_WRAPS_GONE];
  int ngone;

  mdl_counts counts[MDL_MAX_DEVS];
  uint64_t in_use_total, peak_total;
  uint64_t pinned_live;  /* bytes of cpu PINNED blocks and pinned wraps live */
  bool no_block;         /* inside a gated burst: nothing may wait */
  mdl_buf *focus;        /* inside a gated burst: the anchor's buffer, picked often */
  unsigned char *scratch;/* read-back buffer, cfg.max_size bytes */

  struct mdl_shared *sh; /* the threaded program's shared state, or NULL */
  int post_to;           /* >= 0: hand the next asynchronous call's event to that thread */
  uint64_t cancels_ok, cancels_busy, checks;
} mdl_ctx;

/* ------------------------------------------------------------------------ */
/* Failures: print the seed, the thread, the step and what it was doing,
 * then fail the test (test_model.c). */

void mdl_fail_at(const mdl_ctx *c, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
/* Provided by the test file: end the test as failed with msg. */
void mdl_fail_hook(const char *msg) __attribute__((noreturn));

#define MDL_CHECK(c, cond, ...)                                                \
  do {                                                                         \
    if (!(cond))                                                               \
      mdl_fail_at((c), __FILE__, __LINE__, __VA_ARGS__);                       \
  } while (0)

/* A call's status must be want. */
#define MDL_EXPECT_ST(c, st, want, call)                                       \
  do {                                                                         \
    int st_ = (st), want_ = (want);                                            \
    MDL_CHECK((c), st_ == want_, "%s returned %s, expected %s (%s)", (call),   \
              um_err_name(st_), um_err_name(want_), um_last_error());          \
  } while (0)

/* ------------------------------------------------------------------------ */
/* model_state.c */

void mdl_ctx_init(mdl_ctx *c, um_manager *m, const mdl_config *cfg, uint64_t seed, int thread);
void mdl_ctx_free(mdl_ctx *c);
uint64_t mdl_next_id(void);
mdl_buf *mdl_buf_slot(mdl_ctx *c);          /* a free slot, or NULL */
mdl_buf *mdl_pick_buf(mdl_ctx *c, bool writable, bool unmapped);
int mdl_live_count(const mdl_ctx *c);
mdl_buf *mdl_buf_by_id(mdl_ctx *c, uint64_t id); /* the live buffer, or NULL */
void mdl_buf_attach(mdl_ctx *c, mdl_buf *b, size_t size); /* model arrays */
void mdl_buf_detach(mdl_ctx *c, mdl_buf *b);
bool mdl_dev_host_view(const mdl_dev *d, um_location loc);
mdl_map_style mdl_dev_map_style(const mdl_dev *d, um_location loc);
size_t mdl_capacity(const mdl_ctx *c, const mdl_buf *b);
void mdl_count_in(mdl_ctx *c, const mdl_buf *b);
void mdl_count_out(mdl_ctx *c, const mdl_buf *b);

mdl_op *mdl_op_new(mdl_ctx *c, mdl_op_kind kind);
/* Record an issued operation: appended to the log, applied at once unless
 * a candidate (then fate stays MDL_FATE_UNKNOWN until resolved). */
void mdl_op_issued(mdl_ctx *c, mdl_op *op, bool candidate);
void mdl_op_not_issued(mdl_ctx *c, mdl_op *op);
void mdl_log_flush(mdl_ctx *c);
/* Completion knowledge: data_done spreads to the earlier operations on the
 * same buffers (the library orders them). */
void mdl_mark_data_done(mdl_ctx *c, mdl_op *op);
void mdl_mark_event_done(mdl_ctx *c, mdl_op *op);
/* Every operation on buffer id has finished (um_map waited for them). */
void mdl_fence_buffer(mdl_ctx *c, uint64_t id);
/* Every operation has finished (um_device_synchronize). */
void mdl_fence_all(mdl_ctx *c);
/* A blocking operation on buffer id returned: the operations issued on it
 * before have moved their bytes (their events may still be finishing). */
void mdl_fence_data(mdl_ctx *c, uint64_t id);
void mdl_ops_collect(mdl_ctx *c);
bool mdl_area_busy(const mdl_ctx *c, const mdl_area *a, bool for_write);
void mdl_apply(mdl_ctx *c, mdl_op *op);

/* ------------------------------------------------------------------------ */
/* model_check.c */

/* Read [off, off + len) of b back (a blocking copy, a mapping or the host
 * view) and compare with the model. */
void mdl_verify_range(mdl_ctx *c, mdl_buf *b, size_t off, size_t len);
void mdl_verify_buf(mdl_ctx *c, mdl_buf *b);
void mdl_verify_area(mdl_ctx *c, mdl_area *a);
void mdl_compare(mdl_ctx *c, const char *what, const unsigned char *got, const unsigned char *want,
                 const unsigned char *known, size_t n, size_t base);
void mdl_check_getters(mdl_ctx *c, mdl_buf *b);
/* Statistics invariants that hold at any moment of this program. */
void mdl_check_stats(mdl_ctx *c);
/* Those that hold only when nothing runs (after um_device_synchronize). */
void mdl_check_stats_quiet(mdl_ctx *c, const mdl_counts *counts, int ncounts_devs);
void mdl_check_wraps_gone(mdl_ctx *c, bool free_them);
um_stats mdl_stats(mdl_ctx *c, int dev); /* dev -1: total */

/* ------------------------------------------------------------------------ */
/* model_steps.c */

void mdl_step_alloc(mdl_ctx *c);
void mdl_step_wrap(mdl_ctx *c);
void mdl_step_release(mdl_ctx *c, mdl_buf *b);
void mdl_step_release_realloc(mdl_ctx *c);
void mdl_step_copy_from_host(mdl_ctx *c);
void mdl_step_copy_to_host(mdl_ctx *c);
void mdl_step_copy(mdl_ctx *c);
void mdl_step_fill(mdl_ctx *c);
void mdl_step_batch(mdl_ctx *c);
void mdl_step_map(mdl_ctx *c);
void mdl_step_unmap(mdl_ctx *c, mdl_buf *b);
void mdl_step_trim(mdl_ctx *c);
void mdl_step_refresh_area(mdl_ctx *c);
void mdl_step_verify(mdl_ctx *c);
void mdl_sync(mdl_ctx *c);
/* Make area usable: for writing (nothing pending on it) or for reading
 * (nothing pending writes it); false when that would need a wait and the
 * program may not wait now. */
bool mdl_area_ready(mdl_ctx *c, mdl_area *a, bool for_write);
mdl_area *mdl_pick_area(mdl_ctx *c, bool for_write);
size_t mdl_pick_len(mdl_ctx *c, size_t max);
/* Up to want valid batch members (um_copy_op and its record, not issued);
 * returns how many. */
int mdl_batch_fill(mdl_ctx *c, um_copy_op *ops, mdl_op **mops, int want);
/* Finish the op's issue: blocking (done NULL) or with an event. */
void mdl_issued_status(mdl_ctx *c, mdl_op **ops, int nops, int st, bool blocking, bool candidate,
                       const char *call);

/* ------------------------------------------------------------------------ */
/* model_events.c */

void mdl_event_add(mdl_ctx *c, um_event *e, mdl_op **ops, int nops, bool group);
void mdl_step_event(mdl_ctx *c);
void mdl_step_cancel(mdl_ctx *c);
/* Decide the fate of every candidate (cancel it or let it run). */
void mdl_resolve_all(mdl_ctx *c);
void mdl_event_wait(mdl_ctx *c, mdl_event *ev);
void mdl_event_drop(mdl_ctx *c, int i);
int mdl_event_expect(const mdl_event *ev);
void mdl_gate_install(void);
void mdl_gate_uninstall(void);
void mdl_gate_close(void);
void mdl_gate_open(mdl_ctx *c);

/* ------------------------------------------------------------------------ */
/* model_bad.c */

void mdl_step_bad(mdl_ctx *c);

/* ------------------------------------------------------------------------ */
/* model_run.c */

typedef struct mdl_result {
  uint64_t steps;
  double seconds;
  uint64_t cancels_ok, cancels_busy, checks;
  um_stats final; /* the manager's figures at the end: which paths ran */
} mdl_result;

/* Choose the run's options and limits from the seed. */
void mdl_config_pick(mdl_config *cfg, uint64_t seed, const char *backends, bool threads);
/* Describe the manager's devices into c (mdl_ctx_init calls it). */
void mdl_devices_scan(mdl_ctx *c);
/* One program of steps on m (single thread). */
mdl_result mdl_run_single(um_manager *m, const mdl_config *cfg, uint64_t seed, uint64_t steps,
                          bool trace);
/* The text printed after a failure to replay it (the test sets it). */
extern const char *mdl_replay_hint;
/* Where each program is (seed, thread, op), printed when the process dies
 * without a check failing first; async-signal-safe. */
void mdl_progress_print(void);
void mdl_progress_note(const mdl_ctx *c);
/* Grows with every step of every program: the hang watchdog reads it. */
uint64_t mdl_progress_ticks(void);
/* The building blocks of both programs. */
void mdl_one_step(mdl_ctx *c);
void mdl_checkpoint(mdl_ctx *c);
void mdl_end_program(mdl_ctx *c);
void mdl_check_empty(mdl_ctx *c);
double mdl_now_s(void);

/* ------------------------------------------------------------------------ */
/* model_threads.c */

/* Hand e (an operation that will not be canceled) to thread c->post_to;
 * false when its mailbox is full. */
bool mdl_mail_post(mdl_ctx *c, um_event *e);
void mdl_mail_step(mdl_ctx *c);
/* nthreads programs on m at once, with shared read-only sources and
 * events handed between threads. */
mdl_result mdl_run_threads(um_manager *m, const mdl_config *cfg, uint64_t seed, uint64_t steps,
                           int nthreads, bool trace);

/* model_buffers.c: a live buffer with random contents on device dev (a
 * read-only wrap when dev < 0), marked shared. */
mdl_buf *mdl_make_shared(mdl_ctx *c, int dev);

#endif /* UNIMEM_TEST_MODEL_H */
