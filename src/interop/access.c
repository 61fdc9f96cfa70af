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
  st = um__dev_xfer_async(d, &x, after, nafter, done, op, native);
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
  um__op_issue_after(gate, dep);
  return UM_OK;
}

/* b's bracket state from 0 to 1 (being opened), under its lock. */
static int reserve(um_buffer *b) {
  int st = UM_OK;
  pthread_mutex_lock(&b->lock);
  if (b->access_state != 0)
    st = um__set_error(UM_ESTATE, "um_access_begin: buffer %p is already in a bracket", (void *)b);
  else if (b->mapped)
    st = um__set_error(UM_ESTATE, "um_access_begin: buffer %p is mapped", (void *)b);
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
static int open_or_end(um_buffer *b, um_event *op) {
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
  return um__set_error(UM_ESTATE, "um_access_begin: buffer %p was released meanwhile", (void *)b);
}

static int check_begin(um_buffer *b, um_map_mode mode, void **wait_native, uint32_t *gen) {
  int st = um__buffer_check_owner(b, gen);
  if (st != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  if (wait_native == NULL)
    return um__set_error(UM_EINVAL, "um_access_begin: NULL wait_native");
  if ((unsigned)mode > UM_MAP_WRITE_DISCARD)
    return um__set_error(UM_EINVAL, "um_access_begin: unknown mode %d", (int)mode);
  if (b->readonly && writes(mode))
    return um__set_error(UM_ESTATE, "um_access_begin: buffer %p is a read-only wrap", (void *)b);
  return UM_OK;
}

int um_access_begin(um_buffer *b, um_map_mode mode, void **wait_native) {
  um_event *op, *dep = NULL;
  uint32_t gen;
  int st;
  if ((st = check_begin(b, mode, wait_native, &gen)) != UM_OK || (st = reserve(b)) != UM_OK)
    return st;
  if ((op = um__event_new(b->m, UM__OP_ACCESS)) == NULL) {
    set_open(b, NULL);
    return um__set_error(UM_ENOMEM, "um_access_begin: out of memory for an operation");
  }
  op->access.mode = mode;
  if (writes(mode))
    op->dst = b, op->dst_gen = gen;
  else
    op->src = b, op->src_gen = gen;
  um__bracket_open(op); /* before it is published: what follows sees it open */
  if ((st = um__op_hold(op, &dep)) != UM_OK) {
    set_open(b, NULL);
    return st;
  }
  if ((st = make_wait(op, dep, wait_native)) != UM_OK) {
    /* Published already: it completes at once, after dep. */
    set_open(b, NULL);
    um__bracket_close(op);
    um__op_start_held(op, dep);
    return st;
  }
  return open_or_end(b, op);
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
static int adopt_done(um_buffer *b, void *done_native, void **done) {
  um_device *d = b->dev;
  *done = NULL;
  if (done_native == NULL)
    return UM_OK;
  if (!interop(d))
    return um__set_error(UM_EINVAL, "um_access_end: device %d (%s) has no native events: pass NULL",
                         d->index, d->info.name);
  return um__dev_token_adopt(d, done_native, done);
}

int um_access_end(um_buffer *b, void *done_native) {
  um_event *op;
  void *done;
  int st;
  if ((st = um__buffer_check_live(b)) != UM_OK)
    return st;
  if (um__process_changed(b->m))
    return um__manager_check_process(b->m);
  pthread_mutex_lock(&b->lock);
  st = b->access_state == 2 ? UM_OK : um__set_error(UM_ESTATE, "um_access_end: no bracket open on %p", (void *)b);
  pthread_mutex_unlock(&b->lock);
  if (st != UM_OK || (st = adopt_done(b, done_native, &done)) != UM_OK)
    return st;
  pthread_mutex_lock(&b->lock);
  op = take_open_locked(b);
  pthread_mutex_unlock(&b->lock);
  if (op == NULL) { /* another thread ended it meanwhile */
    if (done != NULL)
      um__dev_native_release(b->dev, done);
    return um__set_error(UM_ESTATE, "um_access_end: no bracket open on %p", (void *)b);
  }
  finish(op, done);
  return UM_OK;
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
