/* Spin-then-sleep waits (um_options.wait_spin_ns).
 *
 * A blocking call whose operation finishes within microseconds pays more
 * for going to sleep and being woken (a futex wait and wake, a thread
 * switch on each side: tens of microseconds on this kind of machine) than
 * for the operation. Polling instead, for a bounded time, returns as soon
 * as the work is done, at the price of a CPU kept busy meanwhile; CUDA's
 * cudaDeviceScheduleSpin and StarPU's drivers make the same trade. A zero
 * budget never polls: an idle process, and a default one waiting, burn no
 * CPU. */
#include <stdatomic.h>
#include <time.h>

#include "base.h"
#include "atomic.h"
#include "testhook.h"

uint64_t um__spin_clock_ns(void) { return um__now_ns(); }

void um__spin_to(uint64_t until_ns) {
  while (um__now_ns() < until_ns)
    um__cpu_pause();
}

int um__spin_until(uint32_t ns, int (*done)(void *arg), void *arg) {
  uint64_t deadline;
  if (ns == 0)
    return 0;
  deadline = um__now_ns() + ns;
  for (;;) {
    int r;
    UM__TEST_POINT(UM__TP_WAIT_POLL, arg);
    if ((r = done(arg)) != 0)
      return r;
    um__cpu_pause();
    /* The clock is read on every round: with a TSC clock source it costs
     * about as much as the poll, and it keeps the budget exact for polls
     * of any cost (a driver query takes a lock). */
    if (um__now_ns() >= deadline)
      return 0;
  }
}
