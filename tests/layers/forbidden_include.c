/* Compiled by the test layers_include as if it were a file of base/: it
 * includes a header of ops/ by a relative path, which must not compile. */
#include "../../src/ops/ops.h"

int main(void) { return 0; }
