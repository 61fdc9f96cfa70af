/* interop/: the caller's brackets and native handles, DLPack. */
#ifndef UNIMEM_INTEROP_H
#define UNIMEM_INTEROP_H

#ifndef UM__SEES_INTEROP
#error "interop.h: this folder may not include interop/ (src/README.md)"
#endif

#include "ops.h"

/* access.c: take b's open bracket (b's lock held; NULL when none) and end
 * it behind what the caller queued so far (a release); end every bracket
 * left open (manager destroy). */
um_event *um__access_take_locked(um_buffer *b);
void um__access_end_taken(um_event *op);
void um__access_end_all(um_manager *m);

/* access.c: the caller's bracket and the gate */
extern const um__path um__path_access, um__path_gate;

#endif /* UNIMEM_INTEROP_H */
