/* A fault-injecting backend, for tests only (never built into the library,
 * never offered as a device by um_manager_create).
 *
 * It behaves as a discrete device: DEVICE blocks live in memory the core
 * cannot see (um__mem.host == NULL), PINNED blocks have a host view. It
 * comes in two flavours, so that both halves of the backend contract run:
 *
 *   fault_backend         "fault":     xfer + xfer_async (a queue thread per
 *                                      device completes transfers, so the
 *                                      core's native and pipelined paths
 *                                      run), no map (the core keeps a host
 *                                      shadow), peer copies between its
 *                                      devices;
 *   fault_backend_mapped  "fault-map": xfer only (the core runs transfers
 *                                      on its own threads), map/unmap;
 *   fault_backend_queue   "fault-queue": as "fault", but single_queue: every
 *                                      transfer of a device, synchronous
 *                                      ones included, runs on its one
 *                                      in-order queue, with quiet transfers
 *                                      and queue marks (as OpenCL's), so
 *                                      the core's single-queue paths run;
 *   fault_backend_inline  "fault-inline": as "fault-queue", but a transfer
 *                                      submitted to an idle queue runs on
 *                                      the submitting thread, and its done
 *                                      inside xfer_async.
 *
 * Give them to a manager with um__manager_create_ex(opts, extra, n, &m).
 *
 * Faults are planned process-wide, over every fault device together:
 * allocations (mem_alloc calls) and transfers (xfer, xfer_async, and map or
 * unmap calls that move data) are counted from 1 in the order they reach the
 * backend, and the plan names the one that fails. A device can also be
 * "lost": from then on every operation on it fails with UM_ENODEV (blocks
 * are still freed, so the manager can be destroyed).
 *
 * Use: include this header; fault_backend.c is in unimem_test_support, the
 * static library every test links (tests/CMakeLists.txt).
 */
#ifndef UNIMEM_TESTS_FAULT_BACKEND_H
#define UNIMEM_TESTS_FAULT_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "testing.h"

extern const um__backend fault_backend;
extern const um__backend fault_backend_mapped;
/* "fault-queue": the asynchronous flavour as a single in-order queue per
 * device whose callbacks may re-enter (single_queue, callbacks_reenter:
 * the contract OpenCL gives): a batch's copies go in runs, queued quietly,
 * and a queue mark reports the first failure of the quiet transfers queued
 * since the previous mark; synchronous transfers run through the queue,
 * behind what is queued, as blocking calls do on an in-order queue. */
extern const um__backend fault_backend_queue;
/* "fault-inline": "fault-queue" whose idle queue runs a transfer on the
 * submitting thread, its done inside xfer_async (PoCL's "basic" device). */
extern const um__backend fault_backend_inline;

/* The options the fault tests start from: um_options_init's, the cpu
 * backend only (the fault devices come from the create call), no trim
 * timer, errors logged only. */
void fault_test_options(um_options *o);

/* In a test (Criterion, or test_util.h's stand-in): destroy m, which must
 * answer UM_OK, and assert that no fault device block is left and none
 * was leaked at a backend's close. */
#define FAULT_ASSERT_DESTROYED_CLEAN(m)                                                                    \
  do {                                                                                                     \
    fault_counts fault_c_;                                                                                 \
    cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());                                     \
    fault_counts_get(&fault_c_);                                                                           \
    cr_assert_eq(fault_c_.live_blocks, 0);                                                                 \
    cr_assert_eq(fault_c_.leaked_at_close, 0);                                                             \
  } while (0)

/* um__manager_create_ex with both fault backends: device 0 is the cpu, then
 * the "fault" devices, then the "fault-map" devices. */
int fault_manager_create(const um_options *opts, um_manager **out);

/* As fault_manager_create, with async (fault_backend, fault_backend_queue
 * or fault_backend_inline) in the place of "fault". */
int fault_manager_create_with(const um_options *opts, const um__backend *async, um_manager **out);

/* um__manager_create_ex with the "fault-queue" backend only: device 0 is
 * the cpu, then its devices. */
int fault_manager_create_queue(const um_options *opts, um_manager **out);

/* Devices each fault backend opens per manager (default 1, at most 4) and
 * the memory of each (default 256 MiB; allocations beyond it answer
 * UM_ENOMEM, as a full device would). Read when a manager is created. */
void fault_configure(int devices_per_backend, uint64_t total_bytes);

/* Counters back to zero and no fault armed (live block counts stay). */
void fault_reset(void);

/* Fail the nth allocation from now on (counted from 1 since the last reset)
 * with UM_ENOMEM. sticky: every later one fails too, until fault_disarm. */
void fault_fail_alloc(uint64_t nth, bool sticky);

/* Fail the nth transfer with status. at_submit: an asynchronous transfer is
 * refused by xfer_async itself (done is never called) instead of failing
 * when it runs (done reports status). sticky: as for allocations. */
void fault_fail_xfer(uint64_t nth, bool sticky, int status, bool at_submit);

/* No fault armed any more (counting goes on). */
void fault_disarm(void);

/* While paused, nothing is counted and nothing fails (for checks that read
 * buffers back in the middle of a fault run). */
void fault_pause(bool paused);

/* Device lost: every later operation on d fails with UM_ENODEV, including
 * transfers already queued on it. Returns UM_EINVAL when d is not a fault
 * device. */
int fault_lose(um_device *d);

/* The lost device d works again (for a harness that keeps its manager
 * from one test input to the next). Nothing else about d changes: its
 * blocks, data and queue are as they were. UM_EINVAL when d is not a fault
 * device. */
int fault_restore(um_device *d);

/* Hold d's queue (asynchronous flavour): while held, transfers queued on
 * it wait and none starts, so a test can issue more behind them; the
 * queued ones run, in order, once it is let go (held false). A device
 * being closed runs its queue, held or not; um_device_synchronize waits
 * for it. UM_EINVAL when d is not a device of the asynchronous flavour. */
int fault_hold(um_device *d, bool held);

/* Keep back the report of d's next transfer that reports (its done): it
 * runs in its turn, and the transfers behind it run and report, but its
 * done is called only by fault_release_report, on that caller's thread
 * (a device whose reports come out of order: OpenCL's callbacks run on
 * any of its threads). The kept report must be released before d's
 * manager is destroyed. UM_EINVAL when d is not of the asynchronous
 * flavour. */
int fault_hold_report(um_device *d);
/* Make the report fault_hold_report kept: true, or false when none is
 * kept (yet: its transfer has not run). */
bool fault_release_report(um_device *d);
/* How many reports d's transfers have made (a kept one once released). */
uint64_t fault_reports(um_device *d);

/* The next queue mark submitted to a fault-queue device is refused
 * (UM_EBACKEND, "fault: queue mark refused"), the transfers queued ahead
 * of it untouched. fault_reset disarms it. */
void fault_refuse_next_mark(void);
/* Whether the refusal fault_refuse_next_mark armed has happened. */
bool fault_mark_refused(void);

/* Whether d is a device of one of the fault backends. */
bool fault_is_device(const um_device *d);

typedef struct fault_counts {
  uint64_t allocs;          /* mem_alloc calls counted since the reset */
  uint64_t xfers;           /* transfers counted since the reset */
  uint64_t injected_allocs; /* of those, failed by the plan */
  uint64_t injected_xfers;
  uint64_t live_blocks;     /* blocks allocated and not freed, all devices */
  uint64_t live_bytes;
  uint64_t leaked_at_close; /* blocks still live when a backend was closed */
  uint64_t synchronizes;    /* synchronize calls, all devices, never reset */
} fault_counts;

void fault_counts_get(fault_counts *out);

/* Bytes of d's memory now held (allocated and not freed); 0 for a device
 * that is not a fault device. */
uint64_t fault_device_live_bytes(const um_device *d);

#endif /* UNIMEM_TESTS_FAULT_BACKEND_H */
