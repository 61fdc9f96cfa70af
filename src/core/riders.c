/* Riders: a bracket's end on a queue of the caller's that enqueues nothing
 * (um__xfer.ride). The caller's kernel is on that queue already, so the
 * next command anyone queues there completes after it; the backend reports
 * the bracket done once such a command has (a blocking download, the
 * small entries before a watched one). Nothing may wait for a rider that
 * no command follows, so every wait that one may hold up kicks first: the
 * device gives its riders a command of their own (queue_kick).
 *
 * Two sides meet here. A waiter counts itself in rider_waiters and then
 * kicks; a bracket end adds its rider and then reads rider_waiters (both
 * sequentially consistent, as the backend's count of riders is): either
 * the waiter's kick sees the rider, or the end sees the waiter and kicks
 * itself. Waits for one operation (registration behind it, a thread on
 * its condition) meet under the operation's lock instead (ops/held.c).
 */
#include "core.h"

void um__riders_kick(um_manager *m) {
  int n = um__ndevices(m);
  for (int i = 0; i < n; i++)
    um__dev_kick_riders(m->devices[i]);
}

void um__riders_wait_begin(um_manager *m) {
  atomic_fetch_add(&m->rider_waiters, 1);
  um__riders_kick(m);
}

void um__riders_wait_end(um_manager *m) { atomic_fetch_sub_explicit(&m->rider_waiters, 1, memory_order_release); }

bool um__riders_waited(um_manager *m) { return atomic_load(&m->rider_waiters) != 0; }
