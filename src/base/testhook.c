/* The test build's hook (testhook.h); compiled into unimem_testing only. */
#include <stdatomic.h>

#include "base.h"
#include "testhook.h"

_Atomic(um__test_hook_fn) um__test_hook;
