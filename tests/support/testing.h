/* What the tests that look inside the library see of it: every layer's
 * header (src/README.md). The test targets link unimem_internals, which
 * gives them every layer's include directory and UM__SEES_ definition. */
#ifndef UNIMEM_TESTING_H
#define UNIMEM_TESTING_H

#include "interop.h"
#include "net.h"

#endif /* UNIMEM_TESTING_H */
