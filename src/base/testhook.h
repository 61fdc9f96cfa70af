/* Test points: places where a test build lets a test run its own code, to
 * widen a race window or to observe an internal step exactly instead of by
 * timing. The library that ships is built without UNIMEM_TEST_HOOKS and
 * the points expand to nothing; the test suite links unimem_testing, the
 * same sources built with it (CMakeLists.txt). */
#ifndef UNIMEM_TESTHOOK_H
#define UNIMEM_TESTHOOK_H

#ifndef UM__SEES_BASE
#error "testhook.h: this folder may not include it (src/README.md)"
#endif

typedef enum um__test_point {
  /* An operation counted itself finished (engine.inflight went down) and
   * the completing thread is about to touch the engine for the last time.
   * arg: the manager. */
  UM__TP_INFLIGHT_DONE = 0,
  /* A worker thread starts an operation (the tests of
   * max_concurrent_transfers count them), and is done with it. arg: the
   * operation. */
  UM__TP_WORKER_RUN,
  UM__TP_WORKER_DONE,
  /* um_release of a wrap is about to wait for the operations issued on it.
   * arg: the buffer. */
  UM__TP_WRAP_RELEASE_WAIT,
  /* A bracket (held.c's um__op_hold) is about to lock its buffer to
   * publish itself. arg: the operation. */
  UM__TP_HOLD_CHECKED,
  /* A copy or fill passed its argument checks and is about to lock its
   * buffers to publish itself. arg: the operation. */
  UM__TP_OP_CHECKED,
  /* um_map passed its argument checks, before taking the buffer's lock.
   * arg: the buffer. */
  UM__TP_MAP_CHECKED,
  /* An issuer borrowed its dependencies' tokens and is about to call the
   * backend's xfer_async with them. arg: the operation. */
  UM__TP_NATIVE_START,
  /* An idle block was put in its bin, and the bin's lock dropped (pool.c).
   * arg: the buffer (descriptor of the block). */
  UM__TP_POOL_PUT,
  /* A thread cache was made, before its thread uses it (tcache.c). arg:
   * the cache (a test may turn its asym off, to run the CAS take). */
  UM__TP_TCACHE_NEW,
  /* A waiter's spin (um_options.wait_spin_ns, spin.c) polls once, before
   * the poll. arg: the poll's argument. */
  UM__TP_WAIT_POLL,
  /* On a device that runs commands inside the submitting call (PoCL's
   * basic device), a call that submits is about to take the backend's
   * submit lock (opencl/devices.c). arg: the backend's device. */
  UM__TP_SUBMIT_INLINE,
  /* On a CPU device with wait_spin_ns (opencl/devices.c, ocl_settle): the device's
   * settle time is set when it opens (arg: its uint32_t nanoseconds, which
   * a test may change); a spinning wait of the device saw its command end
   * (arg: the backend's device); a blocking call waits before it submits,
   * since that was less than the settle time ago (arg: the device). */
  UM__TP_SETTLE_TIME,
  UM__TP_SPUN_END,
  UM__TP_SETTLE,
  /* A CUDA stream watcher is about to sleep until its next token (cuda/transfers.c,
   * after its spin when wait_spin_ns is set). arg: the watcher. */
  UM__TP_CUDA_WATCH_SLEEP,
  /* A block is about to go back to its device's backend (block.c), its
   * bytes still in bytes_reserved. arg: the device it is accounted to. */
  UM__TP_BLOCK_FREE,
  /* The sole thread of a manager (tcache.h, "A release without a locked
   * instruction") read a buffer's state inside its section, and is about
   * to change it (when it read LIVE). arg: the buffer. */
  UM__TP_SOLE_RELEASE,
  /* The OpenCL backend puts its last reference on a token's event (opencl/transfers.c,
   * ocl_native_release: at once on a thread that reports a walk, else
   * by the device's next walk, its full list, a free of its memory or its
   * close). arg: the cl_event. */
  UM__TP_TOKEN_RELEASED,
  UM__TP_COUNT
} um__test_point;

#ifdef UNIMEM_TEST_HOOKS
typedef void (*um__test_hook_fn)(um__test_point point, void *arg);
/* Set by a test; NULL when none. */
extern _Atomic(um__test_hook_fn) um__test_hook;
#define UM__TEST_POINT(point, arg)                                             \
  do {                                                                         \
    um__test_hook_fn hook_ = atomic_load(&um__test_hook);                      \
    if (hook_ != NULL)                                                         \
      hook_((point), (void *)(arg));                                           \
  } while (0)
#else
#define UM__TEST_POINT(point, arg) ((void)0)
#endif

#endif /* UNIMEM_TESTHOOK_H */
