/* Open brackets: the slots of the brackets that are open (um_access_begin
 * to um_access_end, access.c) and the marks that say which operations wait
 * for one, so that a blocking call that would wait for um_access_end is
 * refused instead. Apart from op.c because it is its own small protocol
 * (slots, epochs, marks) that an operation meets only while some bracket
 * is open: one relaxed load otherwise.
 */
#include "op_internal.h"

/* ------------------------------------------------------------------------ */
/* Open brackets: which operations wait for one
 *
 * A bracket (access.c) is held from um_access_begin to um_access_end: what
 * follows it, on its buffer or through other buffers' operations however
 * many, cannot finish before the caller ends it, so a blocking call whose
 * wait would pass through it is refused (um__buffer_waits_bracket_locked).
 * Each open bracket has a slot, one bit; an operation is marked when it is
 * published with the bits its unfinished predecessors carry (a bracket
 * also with its own), and it waits for an open bracket while one of its
 * bits is open. Marks are added only while some bracket is open: otherwise
 * an operation pays one relaxed load.
 *
 * A slot is free again as soon as its bracket ends, while operations
 * marked with it may still be in flight: each slot keeps the epoch at
 * which its bracket opened (a count of openings), each marked operation
 * the epoch it read when it was published (before anything else), and a
 * mark counts only when its slot opened no later than that: a later
 * bracket of the same slot cannot be one that the operation follows. The
 * last slot is shared by the brackets beyond the others: its mark counts
 * while any of them is open. */
#define SHARED_SLOT 63

static uint64_t slot_bit(int k) { return (uint64_t)1 << k; }

/* The marks of op, among marks, that name the bracket now in their slot. */
static uint64_t marks_current(const um_event *op, uint64_t marks) {
  uint64_t current = 0;
  for (; marks != 0; marks &= marks - 1) {
    int k = __builtin_ctzll(marks);
    if (atomic_load_explicit(&op->m->slot_epoch[k], memory_order_acquire) <= op->mark_epoch)
      current |= slot_bit(k);
  }
  return current;
}

void um__bracket_open(um_event *op) {
  um_manager *m = op->m;
  uint64_t open, epoch;
  int k;
  pthread_mutex_lock(&m->bracket_lock);
  open = um__atomic_load_relaxed(&m->brackets_open);
  for (k = 0; k < SHARED_SLOT && (open & slot_bit(k)); k++)
    ;
  if (k != SHARED_SLOT || m->bracket_shared++ == 0) {
    /* The slot's epoch before the counter's (release): whoever reads the
     * counter at this value or later sees it. */
    epoch = um__atomic_load_relaxed(&m->bracket_epoch) + 1;
    atomic_store_explicit(&m->slot_epoch[k], epoch, memory_order_relaxed);
    atomic_store_explicit(&m->bracket_epoch, epoch, memory_order_release);
  } else {
    epoch = um__atomic_load_relaxed(&m->slot_epoch[k]);
  }
  op->access.slot = k;
  op->bracket_marks = slot_bit(k);
  op->mark_epoch = epoch;
  /* Seen by every later operation on the bracket's buffer: they read it
   * under the buffer's lock, taken after the bracket is published. */
  atomic_fetch_or_explicit(&m->brackets_open, slot_bit(k), memory_order_release);
  pthread_mutex_unlock(&m->bracket_lock);
  um__engine_wake_drains(m); /* a synchronize draining stops waiting for it */
}

void um__bracket_close(um_event *op) {
  um_manager *m = op->m;
  int k = op->access.slot;
  pthread_mutex_lock(&m->bracket_lock);
  if (k != SHARED_SLOT || --m->bracket_shared == 0)
    atomic_fetch_and_explicit(&m->brackets_open, ~slot_bit(k), memory_order_relaxed);
  pthread_mutex_unlock(&m->bracket_lock);
}

/* Whether op, unfinished, waits for an open bracket other than those of
 * the bits in ignore. */
static bool marks_open(const um_event *op, uint64_t ignore) {
  uint64_t open = um__atomic_load_relaxed(&op->m->brackets_open) & ~ignore & op->bracket_marks;
  return open != 0 && atomic_load_explicit(&op->state, memory_order_acquire) != UM__EV_DONE &&
         marks_current(op, open) != 0;
}

bool um__op_waits_bracket(const um_event *op) { return marks_open(op, 0); }

bool um__buffer_waits_bracket_locked(const um_buffer *b, bool own_ends) {
  uint64_t own = 0;
  if (b->access_state != 0) {
    if (!own_ends || b->access_state != 2)
      return true;
    /* (A bracket of the shared slot ignores the others of that slot.) */
    own = slot_bit(b->access_op->access.slot);
  }
  return b->last != NULL && marks_open(b->last, own);
}

/* Under op's buffers' locks, as it is published: the marks of its
 * unfinished predecessors deps[0..n) that name open brackets. The epoch is
 * read first: a slot opened again after it cannot be one op follows. */
void um__marks_inherit(um_event *op, um_event *const *deps, int n) {
  um_manager *m = op->m;
  uint64_t epoch = atomic_load_explicit(&m->bracket_epoch, memory_order_acquire);
  uint64_t open = um__atomic_load_relaxed(&m->brackets_open), marks = 0;
  for (int i = 0; i < n; i++)
    marks |= marks_current(deps[i], deps[i]->bracket_marks & open);
  if (marks != 0) {
    op->bracket_marks |= marks;
    op->mark_epoch = epoch; /* a bracket's own mark holds at it too */
  }
}

int um__op_bracket_error(const um_buffer *b) {
  if (b->access_state != 0)
    return um__set_error(UM_ESTATE,
                         "buffer %p is inside an open um_access_begin bracket: a blocking call would wait for "
                         "um_access_end; pass an event, or end the bracket first",
                         (const void *)b);
  return um__set_error(UM_ESTATE,
                       "buffer %p: its operations wait for an open um_access_begin bracket (of another buffer, "
                       "through the operations they follow): a blocking call would wait for that "
                       "um_access_end; pass an event, or end the bracket first",
                       (const void *)b);
}

/* ------------------------------------------------------------------------ */
/* What the layers below call up into (mem.h, "Calls up") */

__attribute__((constructor)) static void register_upcalls(void) {
  um__upcall.ops.waits_bracket_locked = um__buffer_waits_bracket_locked;
}
