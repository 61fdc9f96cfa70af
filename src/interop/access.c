/* The caller's own device work on unimem memory: native handles,
 * and the bracket um_access_begin / um_access_end.
 *
 * A bracket is an operation (kind UM__OP_ACCESS) on its buffer, published
 * at um_access_begin like any other (so later operations on the buffer wait
 * for it, um_map refuses the buffer, a release defers behind it), and held:
 * it starts only at um_access_end, as a marker on the device's queue that
 * completes after the caller's last command. Nothing blocks the host:
 *  - begin hands the caller a native event standing for "everything issued
 *    on b before is done": the last operation's own token when it runs on
 *    the buffer's device queue, else a gate (a user event) that a gate
 *    operation opens once that operation finished on a host thread;
 *  - end adopts the caller's event and queues the marker behind it and the
 *    begin's event;
 *  - on the cpu device, which has no native events, the gate operation
 *    itself is the caller's wait handle (a um_event).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "interop.h"

/* The device's backend can order device work with the caller's. */
static bool interop(const um_device *d) { return um__dev_has_interop(d); }

static um_buffer *bracket_buffer(const um_event *op) { return op->dst != NULL ? op->dst : op->src; }

static bool writes(um_map_mode mode) { return mode != UM_MAP_READ; }

/* ------------------------------------------------------------------------ */
/* Paths: the bracket and the gate */

static bool plan_access(um_event *op) {
  um_device *d;
  if (op->kind != UM__OP_ACCESS)
    return false;
  d = bracket_buffer(op)->dev;
  op->native_dev = interop(d) ? d : NULL;
  return true;
}

/* On a device without native events the bracket has nothing to run: it is
 * ordered after its gate operation (um__op_start_held). */
static int run_nothing(um_event *op) {
  (void)op;
  return UM_OK;
}

/* The bracket's token: done once what begin handed out and the caller's
 * last command are (a MARKER holds its own references on them: ours go
 * here, whatever the outcome). */
static int start_marker(um_event *op, void *const *after, int nafter, um__done_fn done, void **native) {
  um_device *d = op->native_dev;
  um__xfer x;
  int st;
  memset(&x, 0, sizeof(x));
  /* On a queue of the caller's, a command of that queue, behind the
   * caller's commands there; else a join of the tokens on no queue. */
  x.kind = op->queued_q >= 0 ? UM__XFER_QUEUE_MARK : UM__XFER_MARKER;
  x.queue = op->queued_q;
  x.bytes = bracket_buffer(op)->size; /* how much the caller's work may touch */
  x.wait[0] = op->access.wait;
  x.wait[1] = op->access.done;
  /* Nothing to wait for but the queue's own order: the caller's kernel is
   * queued there already, so the queue's next command completes after it
   * (core/riders.c), and the bracket enqueues nothing. */
  x.ride = x.kind == UM__XFER_QUEUE_MARK && nafter == 0 && x.wait[0] == NULL && x.wait[1] == NULL &&
           um__dev_can_ride(d);
  if (x.ride)
    atomic_store(&op->rides, 1);
  st = um__dev_xfer_async(d, &x, after, nafter, done, op, native);
  if (x.ride && st == UM_OK)
    um__rider_added(op);
  if (op->access.wait_owner != NULL) {
    um__event_token_put(op->access.wait_owner, d, op->access.wait);
    um__event_unref(op->access.wait_owner);
  } else if (op->access.wait != NULL) {
    um__dev_native_release(d, op->access.wait); /* the gate's second owner */
  }
  if (op->access.done != NULL)
    um__dev_native_release(d, op->access.done);
  op->access.wait_owner = NULL;
  op->access.wait = op->access.done = NULL;
  return st;
}

static void account_nothing(const um_event *op) { (void)op; }

const um__path um__path_access = {.name = "access", .plan = plan_access, .run = run_nothing,
                                  .start_native = start_marker, .account = account_nothing,
                                  .inline_bytes = SIZE_MAX, .caller_queue = true};

static bool plan_gate(um_event *op) { return op->kind == UM__OP_GATE; }

static int run_gate(um_event *op) {
  if (op->gate.token != NULL)
    um__dev_gate_open(op->gate.dev, op->gate.token, UM_OK);
  return UM_OK;
}

const um__path um__path_gate = {.name = "gate", .plan = plan_gate, .run = run_gate,
                                .account = account_nothing, .inline_bytes = SIZE_MAX};

/* ------------------------------------------------------------------------ */
/* Begin */

/* dep is bound for the very queue of the caller's that the bracket is on,
 * but not queued there yet (it follows work elsewhere, and is queued once
 * that has finished). A gate for it would sit in the queue ahead of it and
 * wait for it forever: the host waits for dep instead, and the caller's
 * kernel needs nothing. Refused where dep waits for an open bracket. */
static int wait_bound_here(um_event *dep) {
  if (um__op_waits_bracket(dep)) /* dep stays the caller's */
    return um__set_error(UM_ESTATE, "um_access_begin: the buffer's last operation waits for an open bracket, and "
                                    "is bound for this thread's queue: end that bracket first");
  (void)um__event_wait_internal(dep); /* its failure is the buffer's next reader's to see */
  um__event_unref(dep);
  return UM_OK;
}

/* The caller's wait handle for "what was issued on b before the bracket is
 * done" (dep, a reference, consumed on success): dep's own token on b's
 * device queue; else a gate opened by a gate operation behind dep; on a
 * device without native events, that gate operation itself. */
static int make_wait(um_event *op, um_event *dep, void **wait) {
  um_device *d = bracket_buffer(op)->dev;
  um_event *gate;
  void *tok;
  int st;
  *wait = NULL;
  if (dep == NULL)
    return UM_OK;
  if (op->queued_q >= 0 && um__op_queued_before(dep, op)) {
    um__event_unref(dep); /* on the thread's queue already: it runs first */
    return UM_OK;
  }
  if (op->queued_q >= 0 && dep->native_dev == d && dep->queued_q == op->queued_q)
    return wait_bound_here(dep);
  if (op->native_dev != NULL && dep->native_dev == d)
    um__rider_token(dep); /* a bracket's end riding on another queue of d */
  if (op->native_dev != NULL && (tok = um__op_token_borrow(dep, d)) != NULL) {
    op->access.wait = tok;
    op->access.wait_owner = dep; /* keeps dep's reference until the end */
    *wait = um__dev_token_native(d, tok);
    return UM_OK;
  }
  if ((gate = um__event_new(d->m, UM__OP_GATE)) == NULL)
    return um__set_error(UM_ENOMEM, "um_access_begin: out of memory for a gate");
  if (op->native_dev != NULL && (st = um__dev_gate_new(d, &gate->gate.token)) != UM_OK) {
    um__event_unref(gate);
    return st;
  }
  gate->gate.dev = d;
  um__path_plan(gate);
  um__event_ref(gate); /* the bracket's, until its end */
  op->access.gate = gate;
  op->access.wait = gate->gate.token;
  if (op->native_dev != NULL) {
    *wait = um__dev_token_native(d, gate->gate.token);
  } else {
    um__event_ref(gate); /* the caller's handle's, until the end */
    atomic_store_explicit(&gate->caller_holds, true, memory_order_relaxed);
    *wait = gate;
  }
  um__op_issue_after(gate, &dep, 1);
  return UM_OK;
}

/* b's bracket state from 0 to 1 (being opened), under its lock. */
static int reserve(um_buffer *b, const char *who) {
  int st = UM_OK;
  pthread_mutex_lock(&b->lock);
  if (b->access_state != 0)
    st = um__set_error(UM_ESTATE, "%s: buffer %p is already in a bracket", who, (void *)b);
  else if (b->mapped)
    st = um__set_error(UM_ESTATE, "%s: buffer %p is mapped", who, (void *)b);
  else
    b->access_state = 1;
  pthread_mutex_unlock(&b->lock);
  return st;
}

static void set_open(um_buffer *b, um_event *op) {
  pthread_mutex_lock(&b->lock);
  b->access_state = op != NULL ? 2 : 0;
  b->access_op = op;
  pthread_mutex_unlock(&b->lock);
}

static um_event *take_open_locked(um_buffer *b);
static void end_implicitly(um_event *op);

/* The bracket is open; unless b was released while it was being opened
 * (that release could not end it): then it ends as a release would. */
static int open_or_end(um_buffer *b, um_event *op, const char *who) {
  um_event *late = NULL;
  pthread_mutex_lock(&b->lock);
  b->access_state = 2;
  b->access_op = op;
  if (atomic_load(&b->state) != UM__BUF_LIVE)
    late = take_open_locked(b);
  pthread_mutex_unlock(&b->lock);
  if (late == NULL)
    return UM_OK;
  end_implicitly(late);
  return um__set_error(UM_ESTATE, "%s: buffer %p was released meanwhile", who, (void *)b);
}

static int check_begin(um_buffer *b, um_map_mode mode, void **wait_native, uint32_t *gen, const char *who) {
  int st = um__buffer_check_owner(b, gen);
  if (st != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if (wait_native == NULL)
    return um__set_error(UM_EINVAL, "%s: NULL wait_native", who);
  if ((unsigned)mode > UM_MAP_WRITE_DISCARD)
    return um__set_error(UM_EINVAL, "%s: unknown mode %d", who, (int)mode);
  if (b->readonly && writes(mode))
    return um__set_error(UM_ESTATE, "%s: buffer %p is a read-only wrap", who, (void *)b);
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Lists of buffers: um_access_begin_n and um_access_end_n, of which the
 * one-buffer calls are the list of one */

/* One entry of a list, in the caller's order. The first occurrence of a
 * buffer (first == its index) carries the buffer's bracket: the strongest
 * mode of its occurrences, its generation, the bracket being opened or
 * ended, and the handle it gives the caller (begin) or the token of the
 * caller's done event (end); skip: released (end); locked: its lock is
 * held (end). */
typedef struct entry {
  um_buffer *b;
  um_map_mode mode;
  uint32_t gen;
  bool skip, locked;
  size_t first;
  um_event *op;
  void *handle;
  um_device *dev; /* end: the device whose token handle is */
} entry;

/* An entry by address: a list's buffers in address order, the first
 * occurrence of each first (locks are taken in that order). */
typedef struct key {
  uintptr_t addr;
  size_t i;
} key;

#define INLINE_ENTRIES 4

typedef struct blist {
  entry *e;
  key *by_addr;
  size_t n;
  entry e_space[INLINE_ENTRIES];
  key k_space[INLINE_ENTRIES];
} blist;

static int key_cmp(const void *pa, const void *pb) {
  const key *a = pa, *b = pb;
  if (a->addr != b->addr)
    return a->addr < b->addr ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

static int list_init(blist *l, um_buffer *const *bufs, size_t n, const char *who) {
  l->n = n;
  l->e = l->e_space;
  l->by_addr = l->k_space;
  if (n > INLINE_ENTRIES) {
    if (n > SIZE_MAX / (sizeof(entry) + sizeof(key)) ||
        (l->e = malloc(n * (sizeof(entry) + sizeof(key)))) == NULL)
      return um__set_error(UM_ENOMEM, "%s: out of memory for a list of %zu buffers", who, n);
    l->by_addr = (key *)(void *)(l->e + n);
  }
  for (size_t i = 0; i < n; i++) {
    l->e[i] = (entry){.b = bufs[i], .mode = UM_MAP_READ, .first = i};
    l->by_addr[i] = (key){(uintptr_t)bufs[i], i};
  }
  if (n > 1)
    qsort(l->by_addr, n, sizeof(key), key_cmp);
  for (size_t j = 1; j < n; j++)
    if (l->by_addr[j].addr == l->by_addr[j - 1].addr)
      l->e[l->by_addr[j].i].first = l->e[l->by_addr[j - 1].i].first;
  return UM_OK;
}

static void list_free(blist *l) {
  if (l->e != l->e_space)
    free(l->e);
}

/* The entries that carry a buffer's bracket. */
#define FOR_EACH_BUFFER(l, x)                                                                           \
  for (entry *x = (l)->e; x < (l)->e + (l)->n; x++)                                                     \
    if (x->first == (size_t)(x - (l)->e))

/* The mode of one bracket serving both a and b: reading and writing read
 * the current contents; writing the whole range or part of it keeps what
 * it does not write. */
static um_map_mode stronger(um_map_mode a, um_map_mode b) {
  if (a == b)
    return a;
  if (a == UM_MAP_READ || b == UM_MAP_READ || a == UM_MAP_READ_WRITE || b == UM_MAP_READ_WRITE)
    return UM_MAP_READ_WRITE;
  return UM_MAP_WRITE; /* WRITE and WRITE_DISCARD */
}

/* ------------------------------------------------------------------------ */
/* The one wait handle of several brackets (um_access_begin_n): a marker on
 * the device behind every bracket's wait token, or on a device without
 * native events a gate operation behind every bracket's gate operation. The
 * brackets share it, and the last of them to end lets it go. */

typedef struct um__access_join {
  atomic_int brackets; /* not ended yet */
  um_device *dev;
  void *token;     /* the marker's token */
  um_event *event; /* the gate operation (no native events) */
} um__access_join;

/* A join marker is counted in flight (the manager's destroy waits for it);
 * its report does nothing else. */
static void join_done(void *arg, int status) {
  (void)status;
  um__engine_op_done(arg);
}

static int join_marker(um_device *d, void *const *after, int n, void **token) {
  um__xfer x;
  int st;
  memset(&x, 0, sizeof(x));
  x.kind = UM__XFER_MARKER;
  um__engine_op_begin(d->m);
  if ((st = um__dev_xfer_async(d, &x, after, n, join_done, d->m, token)) != UM_OK)
    um__engine_op_done(d->m);
  return st;
}

/* Tokens per marker: markers join at most this many (a chain beyond). */
#define JOIN_TOKENS 8

/* A token done once the wait tokens of the list's brackets are: markers of
 * up to JOIN_TOKENS tokens, each after the one before. */
static int join_tokens(um_device *d, blist *l, void **out) {
  void *after[JOIN_TOKENS], *acc = NULL, *next = NULL;
  entry *x = l->e, *end = l->e + l->n;
  int st = UM_OK;
  while (st == UM_OK && x < end) {
    int n = 0;
    if (acc != NULL)
      after[n++] = acc;
    for (; x < end && n < JOIN_TOKENS; x++)
      if (x->first == (size_t)(x - l->e) && x->handle != NULL)
        after[n++] = x->op->access.wait;
    if (n > (acc != NULL)) {
      st = join_marker(d, after, n, &next);
      if (acc != NULL)
        um__dev_native_release(d, acc); /* the marker holds its own */
      acc = st == UM_OK ? next : NULL;
    }
  }
  *out = acc;
  return st;
}

/* A gate operation that completes once the brackets' gate operations have,
 * held for the caller as make_wait holds one. */
static int join_gates(um_device *d, blist *l, int count, um_event **out) {
  um_event **after = malloc((size_t)count * sizeof(*after)), *g = NULL;
  int n = 0;
  if (after == NULL || (g = um__event_new(d->m, UM__OP_GATE)) == NULL) {
    free(after);
    return um__set_error(UM_ENOMEM, "um_access_begin_n: out of memory for a gate");
  }
  g->gate.dev = d;
  um__path_plan(g);
  um__event_ref(g); /* the caller's handle's, until the last bracket ends */
  atomic_store_explicit(&g->caller_holds, true, memory_order_relaxed);
  FOR_EACH_BUFFER(l, x) {
    if (x->handle != NULL) {
      um__event_ref(x->op->access.gate); /* consumed by the registration */
      after[n++] = x->op->access.gate;
    }
  }
  um__op_issue_after(g, after, n);
  free(after);
  *out = g;
  return UM_OK;
}

/* One bracket sharing j ended; the last lets the handle go. */
static void join_drop(um__access_join *j) {
  bool held = true;
  if (j == NULL || atomic_fetch_sub(&j->brackets, 1) != 1)
    return;
  if (j->token != NULL)
    um__dev_native_release(j->dev, j->token);
  if (j->event != NULL && atomic_compare_exchange_strong(&j->event->caller_holds, &held, false))
    um__event_unref(j->event);
  free(j);
}

/* The list's one wait handle: none when no bracket has one, a bracket's own
 * when one has, else a join that all the brackets share. */
static int join_waits(blist *l, void **wait) {
  um_device *d = l->e[0].b->dev;
  um__access_join *j;
  void *only = NULL;
  int count = 0, brackets = 0, st;
  FOR_EACH_BUFFER(l, x) {
    brackets++;
    if (x->handle != NULL)
      count++, only = x->handle;
  }
  if (count <= 1) {
    *wait = only;
    return UM_OK;
  }
  if ((j = calloc(1, sizeof(*j))) == NULL)
    return um__set_error(UM_ENOMEM, "um_access_begin_n: out of memory for a wait handle");
  j->dev = d;
  atomic_init(&j->brackets, brackets);
  st = l->e[0].op->native_dev != NULL ? join_tokens(d, l, &j->token) : join_gates(d, l, count, &j->event);
  if (st != UM_OK) {
    free(j);
    return st;
  }
  FOR_EACH_BUFFER(l, x) {
    x->op->access.join = j;
  }
  *wait = j->token != NULL ? um__dev_token_native(d, j->token) : (void *)j->event;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Begin, over a list */

/* Entry i, with mode: checked, and reserved where it is its buffer's first
 * occurrence (a later one strengthens the first's mode). */
static int check_entry(blist *l, size_t i, um_map_mode mode, void **wait, const char *who) {
  entry *x = &l->e[i], *f = &l->e[x->first];
  int st = check_begin(x->b, mode, wait, &x->gen, who);
  if (st == UM_OK && x->b->dev != l->e[0].b->dev)
    st = um__set_error(UM_EINVAL, "%s: buffer %p (entry %zu) is on device %d, entry 0 on device %d", who,
                       (void *)x->b, i, x->b->dev->index, l->e[0].b->dev->index);
  if (st != UM_OK)
    return st;
  if (f != x) {
    f->mode = stronger(f->mode, mode);
    return UM_OK;
  }
  x->mode = mode;
  return reserve(x->b, who);
}

/* The reserved bracket of x, published and held, with its wait handle;
 * still being opened (state 1). On failure it is no bracket (state 0). */
static int open_entry(entry *x, const char *who) {
  um_buffer *b = x->b;
  um_event *op, *dep = NULL;
  int st;
  if ((op = um__event_new(b->m, UM__OP_ACCESS)) == NULL) {
    set_open(b, NULL);
    return um__set_error(UM_ENOMEM, "%s: out of memory for an operation", who);
  }
  op->access.mode = x->mode;
  if (writes(x->mode))
    op->dst = b, op->dst_gen = x->gen;
  else
    op->src = b, op->src_gen = x->gen;
  um__bracket_open(op); /* before it is published: what follows sees it open */
  if ((st = um__op_hold(op, &dep)) != UM_OK) {
    set_open(b, NULL);
    return st;
  }
  if ((st = make_wait(op, dep, &x->handle)) != UM_OK) {
    /* Published already: it completes at once, after dep. */
    set_open(b, NULL);
    um__bracket_close(op);
    um__op_start_held(op, dep);
    return st;
  }
  x->op = op;
  return UM_OK;
}

/* A bracket that a failing begin opened (state 1): it ends as a release
 * would end it. */
static void end_opened(um_buffer *b, um_event *op) {
  pthread_mutex_lock(&b->lock);
  b->access_state = 2;
  b->access_op = op;
  op = take_open_locked(b);
  pthread_mutex_unlock(&b->lock);
  end_implicitly(op);
}

/* A begin failed before publishing: the brackets opened end, the buffers
 * reserved from entry upto on are let go. */
static void abandon(blist *l, size_t upto) {
  FOR_EACH_BUFFER(l, x) {
    if (x->op != NULL)
      end_opened(x->b, x->op);
    else if ((size_t)(x - l->e) >= upto)
      set_open(x->b, NULL);
  }
}

/* Every bracket opened is open; when one of the buffers was released
 * meanwhile (its bracket ended), the others end too. */
static int publish(blist *l, const char *who) {
  int st = UM_OK;
  FOR_EACH_BUFFER(l, x) {
    if (open_or_end(x->b, x->op, who) != UM_OK)
      st = UM_ESTATE, x->op = NULL;
  }
  if (st == UM_OK)
    return UM_OK;
  FOR_EACH_BUFFER(l, x) {
    um_event *op;
    if (x->op == NULL)
      continue;
    pthread_mutex_lock(&x->b->lock);
    op = take_open_locked(x->b);
    pthread_mutex_unlock(&x->b->lock);
    if (op != NULL)
      end_implicitly(op);
  }
  return um__set_error(UM_ESTATE, "%s: a buffer of the list was released meanwhile: no bracket is open", who);
}

static int begin_list(um_buffer *const *bufs, const um_map_mode *modes, size_t n, void **wait, const char *who) {
  blist l;
  size_t i;
  int st;
  if ((st = list_init(&l, bufs, n, who)) != UM_OK)
    return st;
  for (i = 0; i < n && (st = check_entry(&l, i, modes[i], wait, who)) == UM_OK; i++)
    ;
  if (st != UM_OK) {
    for (size_t j = 0; j < i; j++)
      if (l.e[j].first == j)
        set_open(l.e[j].b, NULL);
    list_free(&l);
    return st;
  }
  for (i = 0; i < n && st == UM_OK; i++)
    if (l.e[i].first == i)
      st = open_entry(&l.e[i], who);
  if (st == UM_OK && (st = join_waits(&l, wait)) != UM_OK)
    i = n;
  if (st != UM_OK)
    abandon(&l, i);
  else
    st = publish(&l, who);
  list_free(&l);
  return st;
}

int um_access_begin(um_buffer *b, um_map_mode mode, void **wait_native) {
  return begin_list(&b, &mode, 1, wait_native, "um_access_begin");
}

int um_access_begin_n(um_buffer *const *bufs, const um_map_mode *modes, size_t n, void **wait_native) {
  if (bufs == NULL || modes == NULL || wait_native == NULL || n == 0)
    return um__set_error(UM_EINVAL, "um_access_begin_n: NULL bufs, modes or wait_native, or n == 0");
  return begin_list(bufs, modes, n, wait_native, "um_access_begin_n");
}

/* ------------------------------------------------------------------------ */
/* End */

/* Start the held bracket, after done (an adopted token, or NULL) and its
 * wait. When the wait is a gate, the bracket starts only once the gate
 * operation ran (the earlier operation finished): a token of the bracket's
 * existing before that earlier operation is even queued would let a later
 * operation wait for it on the same in-order queue, ahead of it (a
 * deadlock). */
static void finish(um_event *op, void *done) {
  um_device *d = op->native_dev;
  um_event *gate = op->access.gate;
  um__access_join *join = op->access.join;
  um__bracket_close(op); /* what waits for it now waits for device work only */
  op->access.done = done;
  if (gate != NULL)
    um__event_ref(gate); /* consumed by the registration */
  um__op_start_held(op, gate);
  if (gate != NULL) {
    bool held = true;
    if (d == NULL && atomic_compare_exchange_strong(&gate->caller_holds, &held, false))
      um__event_unref(gate); /* the caller's handle dies with the bracket */
    um__event_unref(gate);   /* the bracket's */
  }
  join_drop(join);
}

/* Take b's open bracket, with its lock held; NULL when none is open. */
static um_event *take_open_locked(um_buffer *b) {
  um_event *op = b->access_state == 2 ? b->access_op : NULL;
  if (op != NULL) {
    b->access_state = 0;
    b->access_op = NULL;
    /* The caller's writes are on the device: its copy is the current one. */
    if (writes(op->access.mode) && b->mem.host == NULL)
      b->valid = UM_VALID_DEVICE;
  }
  return op;
}

/* The caller's done event as a token of b's device. */
static int adopt_done(um_buffer *b, void *done_native, void **done, const char *who) {
  um_device *d = b->dev;
  *done = NULL;
  if (done_native == NULL)
    return UM_OK;
  if (!interop(d))
    return um__set_error(UM_EINVAL, "%s: device %d (%s) has no native events: pass NULL", who, d->index,
                         d->info.name);
  return um__dev_token_adopt(d, done_native, done);
}

/* Before anything ends: every buffer of the list is released (skipped: its
 * release ended its bracket) or has a bracket open, and one has. */
static int check_end(blist *l, const char *who) {
  int open = 0, st;
  FOR_EACH_BUFFER(l, x) {
    bool is_open, gone;
    if ((st = um__buffer_check_owner(x->b, &x->gen)) != UM_OK) {
      if (st != UM_ESTATE)
        return st;
      x->skip = true;
      continue;
    }
    if (um__process_changed(x->b->m))
      return um__manager_check_process(x->b->m);
    pthread_mutex_lock(&x->b->lock);
    /* Released since the check (its release ended the bracket): skipped,
     * as a buffer released before the call is. */
    gone = atomic_load(&x->b->state) != UM__BUF_LIVE || atomic_load(&x->b->gen) != x->gen;
    is_open = x->b->access_state == 2;
    pthread_mutex_unlock(&x->b->lock);
    if (gone) {
      x->skip = true;
      continue;
    }
    if (!is_open)
      return um__set_error(UM_ESTATE, "%s: no bracket open on %p", who, (void *)x->b);
    open++;
  }
  if (open == 0)
    return um__set_error(UM_ESTATE, "%s: no bracket open: %s released", who,
                         l->n > 1 ? "every buffer of the list was" : "the buffer was");
  return UM_OK;
}

/* The adopted tokens of the brackets that do not end here. */
static void drop_tokens(blist *l) {
  FOR_EACH_BUFFER(l, x) {
    if (x->op == NULL && x->handle != NULL)
      um__dev_native_release(x->dev, x->handle);
    if (x->op == NULL)
      x->handle = NULL;
  }
}

/* done, adopted once per buffer whose bracket ends. */
static int adopt_all(blist *l, void *done_native, const char *who) {
  int st = UM_OK;
  FOR_EACH_BUFFER(l, x) {
    x->dev = x->b->dev;
    if (!x->skip && st == UM_OK)
      st = adopt_done(x->b, done_native, &x->handle, who);
  }
  if (st != UM_OK)
    drop_tokens(l);
  return st;
}

/* Under every buffer's lock at once (in address order): each bracket is
 * taken, unless one that was open is no more (another thread ended it:
 * then nothing is taken) or its buffer was released meanwhile (skipped:
 * the release ended it). The tokens of what is not taken go. */
static int take_all(blist *l, const char *who) {
  int st = UM_OK, taken = 0;
  for (size_t k = 0; k < l->n; k++) {
    entry *x = &l->e[l->by_addr[k].i];
    if (x->first != l->by_addr[k].i || x->skip)
      continue;
    pthread_mutex_lock(&x->b->lock);
    x->locked = true;
    if (atomic_load(&x->b->state) != UM__BUF_LIVE || atomic_load(&x->b->gen) != x->gen)
      x->skip = true;
    else if (x->b->access_state != 2 && st == UM_OK)
      st = um__set_error(UM_ESTATE, "%s: no bracket open on %p (ended meanwhile)", who, (void *)x->b);
  }
  FOR_EACH_BUFFER(l, x) {
    if (!x->skip && st == UM_OK && (x->op = take_open_locked(x->b)) != NULL)
      taken++;
  }
  for (size_t k = l->n; k-- > 0;) {
    entry *x = &l->e[l->by_addr[k].i];
    if (x->first == l->by_addr[k].i && x->locked)
      pthread_mutex_unlock(&x->b->lock);
  }
  drop_tokens(l);
  if (st == UM_OK && taken == 0)
    st = um__set_error(UM_ESTATE, "%s: no bracket open: released meanwhile", who);
  return st;
}

static int end_list(um_buffer *const *bufs, size_t n, void *done_native, const char *who) {
  blist l;
  int st;
  if ((st = list_init(&l, bufs, n, who)) != UM_OK)
    return st;
  if ((st = check_end(&l, who)) == UM_OK && (st = adopt_all(&l, done_native, who)) == UM_OK &&
      (st = take_all(&l, who)) == UM_OK) {
    FOR_EACH_BUFFER(&l, x) {
      if (x->op != NULL)
        finish(x->op, x->handle);
    }
  }
  list_free(&l);
  return st;
}

int um_access_end(um_buffer *b, void *done_native) { return end_list(&b, 1, done_native, "um_access_end"); }

int um_access_end_n(um_buffer *const *bufs, size_t n, void *done_native) {
  if (bufs == NULL || n == 0)
    return um__set_error(UM_EINVAL, "um_access_end_n: NULL bufs, or n == 0");
  return end_list(bufs, n, done_native, "um_access_end_n");
}

/* A release, or the manager's destroy, ends an open bracket behind what
 * the caller queued on its queue so far. */
static void end_implicitly(um_event *op) {
  um_device *d = bracket_buffer(op)->dev;
  void *done = NULL;
  if (op->native_dev != NULL && um__dev_caller_marker(d, &done) != UM_OK)
    done = NULL; /* no marker: the bracket ends behind its own wait only */
  finish(op, done);
}

um_event *um__access_take_locked(um_buffer *b) { return take_open_locked(b); }

void um__access_end_taken(um_event *op) { end_implicitly(op); }

void um__access_end_all(um_manager *m) {
  for (um_buffer *b = m->all_buffers; b != NULL; b = b->all_next) {
    um_event *op;
    pthread_mutex_lock(&b->lock);
    op = take_open_locked(b);
    pthread_mutex_unlock(&b->lock);
    if (op != NULL) {
      um__log(&m->opts, UM_LOG_WARN, "buffer %p: a bracket was still open at um_manager_destroy",
              (void *)b);
      end_implicitly(op);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* A release ordered after the caller's event: b's open bracket, or one
 * opened for the purpose, ends behind the event; then the release, whose
 * block waits for b's last operation, that bracket. */

/* x->op: b's open bracket, taken, or a READ bracket opened and taken at
 * once. A wrap whose release would wait through another buffer's open
 * bracket is refused first, with nothing changed (um_release's rule). */
static int bracket_for_release(entry *x, const char *who) {
  um_buffer *b = x->b;
  int st = UM_OK;
  pthread_mutex_lock(&b->lock);
  if (b->kind == UM__KIND_WRAPPED && um__buffer_waits_bracket_locked(b, true))
    st = um__set_error(UM_ESTATE,
                       "%s: wrap %p: its operations wait for an open um_access_begin bracket of another "
                       "buffer, and its release would wait for them: end that bracket first",
                       who, (void *)b);
  else
    x->op = take_open_locked(b);
  pthread_mutex_unlock(&b->lock);
  if (st != UM_OK || x->op != NULL || (st = reserve(b, who)) != UM_OK || (st = open_entry(x, who)) != UM_OK)
    return st;
  set_open(b, NULL); /* never open to the caller: it ends here */
  return UM_OK;
}

int um_release_after(um_buffer *b, void *native_event) {
  static const char who[] = "um_release_after";
  entry x = {.b = b, .mode = UM_MAP_READ};
  void *done = NULL;
  int st;
  if (native_event == NULL)
    return um_release(b);
  if ((st = um__buffer_check_owner(b, &x.gen)) != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if ((st = adopt_done(b, native_event, &done, who)) != UM_OK)
    return st;
  if ((st = bracket_for_release(&x, who)) != UM_OK) {
    um__dev_native_release(b->dev, done);
    return st;
  }
  finish(x.op, done);
  return um_release(b);
}

/* ------------------------------------------------------------------------ */
/* Native handles */

int um_device_native_get(um_device *d, um_device_native *out) {
  if (!um__device_ok(d) || out == NULL)
    return um__set_error(UM_EINVAL, "um_device_native_get: NULL argument or not a device");
  memset(out, 0, sizeof(*out));
  out->cu_device = -1;
  snprintf(out->backend, sizeof(out->backend), "%s", um__dev_backend_name(d));
  um__dev_device_native(d, out);
  return UM_OK;
}

int um_buffer_native_get(um_buffer *b, um_buffer_native *out) {
  int st = um__buffer_check_live(b);
  if (st != UM_OK)
    return st;
  if (out == NULL)
    return um__set_error(UM_EINVAL, "um_buffer_native_get: NULL out");
  memset(out, 0, sizeof(*out));
  /* UM_HOST blocks come from the cpu device on every device (block.c). */
  if (b->loc != UM_HOST)
    um__dev_mem_native(b->dev, &b->mem, b->loc, out);
  out->host = b->mem.host;
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* What the layers below call up into: a release ends its buffer's bracket,
 * a manager's destroy every bracket (mem.h, "Calls up"); the paths. */

__attribute__((constructor)) static void register_upcalls(void) {
  um__upcall.brackets = (__typeof__(um__upcall.brackets)){
      .take_locked = um__access_take_locked, .end_taken = um__access_end_taken, .end_all = um__access_end_all};
  um__path_add(&um__path_access);
  um__path_add(&um__path_gate);
}
