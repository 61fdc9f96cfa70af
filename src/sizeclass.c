/* Size classes: sizes 1..8 are exact; above, every power of two 2^k (k >= 3)
 * is split into four classes 2^k * (1 + i/4), i = 1..4. A request just
 * above one class boundary is rounded up to the next, which is larger by
 * 2^k / 4 <= request / 4: the waste is always below 25% of the request (the
 * seeds' power-of-two classes waste up to 50%). mimalloc uses the same four
 * steps per doubling for the same reason. */
#include "internal.h"

static inline int floor_log2(size_t x) {
  return (int)(sizeof(size_t) * 8 - 1) - __builtin_clzl((unsigned long)x);
}

int um__size_class_of(size_t bytes) {
  int k;
  size_t step, idx;
  if (bytes <= 8)
    return bytes == 0 ? 0 : (int)bytes - 1;
  /* bytes in (2^k, 2^(k+1)]: classes 2^k + step * i, step = 2^(k-2). */
  k = floor_log2(bytes - 1);
  step = (size_t)1 << (k - 2);
  idx = (bytes - ((size_t)1 << k) + step - 1) / step; /* 1..4 */
  return 8 + (k - 3) * 4 + (int)idx - 1;
}

size_t um__class_size(int cls) {
  int k, i;
  if (cls < 8)
    return (size_t)cls + 1;
  k = (cls - 8) / 4 + 3;
  i = (cls - 8) % 4 + 1;
  return ((size_t)1 << k) + ((size_t)1 << (k - 2)) * (size_t)i;
}
