/* Atomics whose names state their memory order (after mimalloc's atomic.h),
 * so that every access says why it is safe. */
#ifndef UNIMEM_ATOMIC_H
#define UNIMEM_ATOMIC_H

#ifndef UM__SEES_BASE
#error "atomic.h: this folder may not include it (src/README.md)"
#endif

#include <stdatomic.h>
#include <stdint.h>

#define um__atomic_load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define um__atomic_load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define um__atomic_store_relaxed(p, v)                                         \
  atomic_store_explicit((p), (v), memory_order_relaxed)
#define um__atomic_store_release(p, v)                                         \
  atomic_store_explicit((p), (v), memory_order_release)
#define um__atomic_add_relaxed(p, v)                                           \
  atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define um__atomic_sub_relaxed(p, v)                                           \
  atomic_fetch_sub_explicit((p), (v), memory_order_relaxed)
#define um__atomic_add_acq_rel(p, v)                                           \
  atomic_fetch_add_explicit((p), (v), memory_order_acq_rel)
#define um__atomic_sub_acq_rel(p, v)                                           \
  atomic_fetch_sub_explicit((p), (v), memory_order_acq_rel)
#define um__atomic_cas_acq_rel(p, expected, desired)                           \
  atomic_compare_exchange_strong_explicit((p), (expected), (desired),          \
                                          memory_order_acq_rel,                \
                                          memory_order_acquire)

/* Tell the core that this is a spin loop: on x86 PAUSE keeps the loop from
 * flooding the memory pipeline and gives the sibling hyperthread the core;
 * aarch64's YIELD is the same hint. */
static inline void um__cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Raise *p to v if v is larger (a peak gauge). */
static inline void um__atomic_max_relaxed(atomic_uint_fast64_t *p, uint64_t v) {
  uint_fast64_t cur = atomic_load_explicit(p, memory_order_relaxed);
  while (cur < v && !atomic_compare_exchange_weak_explicit(
                        p, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
  }
}

#endif /* UNIMEM_ATOMIC_H */
