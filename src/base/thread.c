/* The kind of the calling thread: whether it is a backend's own reporting
 * thread, on which operations reported done finish right there (op.c
 * reads the mark). */
#include "base.h"

_Thread_local bool um__completes_inline;

void um__thread_completes_inline(void) { um__completes_inline = true; }

bool um__thread_completes_inline_set(bool on) {
  bool was = um__completes_inline;
  um__completes_inline = on;
  return was;
}
