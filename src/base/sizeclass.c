/* Size classes: sizes 1..8 are exact; above, every power of two 2^k (k >= 3)
 * is split into four classes 2^k * (1 + i/4), i = 1..4. A request just
 * above one class boundary is rounded up to the next, which is larger by
 * 2^k / 4 <= request / 4: the waste is always below 25% of the request (the
 * seeds' power-of-two classes waste up to 50%). mimalloc uses the same four
 * steps per doubling for the same reason. */
#include "base.h"

/* The definitions are inline in base.h (the allocation fast path needs
 * them without a call); these are the external definitions C99 asks one
 * translation unit to provide. */
extern inline int um__size_class_of(size_t bytes);
extern inline size_t um__class_size(int cls);
