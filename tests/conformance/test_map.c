/* um_map / um_unmap: on the cpu a mapping is a pointer into the buffer; on
 * a device with no host view (the discrete test backend) the core keeps a
 * host shadow and moves data only when the coherence state says so:
 *
 *   DEVICE --map(read modes: fetch)--> HOST|DEVICE, (writing modes) HOST
 *   HOST --unmap (write back the mapped range)--> HOST|DEVICE
 *   HOST|DEVICE --map(read): no transfer
 *   any --copy into / fill--> DEVICE
 *   WRITE_DISCARD of the whole buffer: no fetch
 *
 * The suites map and shadow run on the cpu profile alone (their devices are
 * their own); map_device runs on every profile's device (profile.h): on a
 * device with no host view (OpenCL, CUDA) the backend maps a DEVICE buffer
 * (HOST|DEVICE while mapped for reading, HOST while mapped for a writing
 * mode, DEVICE after unmap); PINNED and UNIFIED buffers, and DEVICE buffers
 * of a device with a host view, are mapped as a pointer into that view and
 * the state stays HOST|DEVICE. backends/test_opencl_map.c checks how the
 * OpenCL backend does it (its own map, no shadow, no transfer).
 */
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "profile.h"

#define BOTH (UM_VALID_HOST | UM_VALID_DEVICE)

/* ------------------------------------------------------------------------ */
/* cpu: one memory, the mapping is a pointer */

static void cpu_profile_only(void) { ut_profile_only("cpu"); }

TestSuite(map, .init = cpu_profile_only);

Test(map, cpu_host_view) {
  um_manager *m = ut_manager();
  um_device *cpu = um_device_get(m, 0);
  for (int loc = 0; loc < UM_LOCATION_COUNT; loc++) {
    um_buffer *b;
    void *p = NULL;
    char *h;
    um_stats before, after;
    cr_assert_eq(um_alloc(m, cpu, 4096, (um_location)loc, 0, &b), UM_OK);
    h = um_buffer_host_ptr(b);
    cr_assert_not_null(h, "cpu buffers always have a host view");
    cr_assert_eq(um_buffer_valid(b), BOTH);
    before = ut_stats(m, NULL);
    for (int mode = UM_MAP_READ; mode <= UM_MAP_WRITE_DISCARD; mode++) {
      cr_assert_eq(um_map(b, (um_map_mode)mode, 100, 200, &p), UM_OK);
      cr_assert_eq(p, h + 100);
      cr_assert_eq(um_buffer_valid(b), BOTH);
      if (mode != UM_MAP_READ)
        memset(p, mode, 200);
      cr_assert_eq(um_unmap(b, p), UM_OK);
      cr_assert_eq(um_buffer_valid(b), BOTH);
      if (mode != UM_MAP_READ)
        cr_assert(ut_all_bytes(h + 100, 200, (unsigned char)mode), "writes through the map");
    }
    after = ut_stats(m, NULL);
    ut_assert_stats_eq(&after, &before, "mapping moves no data on the cpu");
    cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

Test(map, cpu_state_transitions) {
  um_manager *m = ut_manager();
  um_device *cpu = um_device_get(m, 0);
  um_buffer *b, *other;
  unsigned char host[64];
  void *p = NULL, *q = NULL;
  um_event *e = NULL;
  um_copy_op op;
  memset(host, 0x42, sizeof(host));
  cr_assert_eq(um_alloc(m, cpu, 1024, UM_DEVICE, UM_ALLOC_ZERO, &b), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 1024, UM_HOST, UM_ALLOC_ZERO, &other), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 0, 1024, &p), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 1, &q), UM_ESTATE, "map twice");
  /* every operation on a mapped buffer is refused, as source or destination */
  cr_assert_eq(um_copy_from_host(b, 0, host, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_copy_from_host(b, 0, host, 64, &e), UM_ESTATE);
  cr_assert_eq(um_copy_to_host(b, 0, host, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(b, 0, other, 0, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(other, 0, b, 0, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(b, 0, b, 512, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(b, 0, 1, 64, NULL), UM_ESTATE);
  op = (um_copy_op){.dst = other, .src = b, .bytes = 64};
  cr_assert_eq(um_copy_batch(m, &op, 1, NULL), UM_ESTATE);
  cr_assert_null(e);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(other), 1024, 0), "a refused op wrote");
  memset(p, 0x5a, 1024);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_unmap(b, p), UM_ESTATE, "unmap twice");
  /* unmapped: operations work again and see what the mapping wrote */
  cr_assert_eq(um_copy_to_host(b, 0, host, 64, NULL), UM_OK);
  cr_assert(ut_all_bytes(host, 64, 0x5a));
  cr_assert_eq(um_copy(other, 0, b, 0, 1024, NULL), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(other), 1024, 0x5a));
  /* release of a mapped buffer is allowed and ends the mapping */
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 16, &p), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_unmap(b, p), UM_ESTATE);
  cr_assert_eq(um_release(other), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).active_buffers, 0);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* A mapping sees every operation issued before it, even those still
 * running on worker threads. */
Test(map, cpu_map_waits_for_pending) {
  um_manager *m = ut_manager();
  um_device *cpu = um_device_get(m, 0);
  const size_t n = 8u << 20;
  unsigned char *src = malloc(n);
  um_buffer *b;
  um_event *e1, *e2;
  void *p;
  cr_assert_not_null(src);
  ub_pattern(src, n, 21);
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e1), UM_OK);
  cr_assert_eq(um_fill(b, n - 4096, 0x33, 4096, &e2), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, n, &p), UM_OK);
  cr_assert_eq(um_event_query(e1), UM_OK);
  cr_assert_eq(um_event_query(e2), UM_OK);
  cr_assert_arr_eq(p, src, n - 4096);
  cr_assert(ut_all_bytes((char *)p + n - 4096, 4096, 0x33));
  cr_assert_eq(um_unmap(b, p), UM_OK);
  um_event_release(e1);
  um_event_release(e2);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(src);
}

/* ------------------------------------------------------------------------ */
/* Discrete test device: the shadow state machine */

static um_manager *m;
static um_device *cpu, *disc, *disc2;

static void disc_setup(void) {
  um_device_info info;
  ut_profile_only("cpu");
  m = ut_manager_disc();
  cpu = um_device_get(m, 0);
  disc = um_device_get(m, 1);
  disc2 = um_device_get(m, 2);
  cr_assert_eq(um_device_info_get(disc, &info), UM_OK);
  cr_assert_str_eq(info.backend, "test-discrete");
  cr_assert_eq(info.index, 1);
  cr_assert_eq(info.locations, (1u << UM_DEVICE) | (1u << UM_HOST));
}

static void disc_teardown(void) {
  cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());
  cr_assert_eq(atomic_load(&ut_disc_live_blocks), 0);
}

TestSuite(shadow, .init = disc_setup, .fini = disc_teardown, .timeout = 60);

static uint64_t d2h(void) { return ut_stats(m, disc).bytes_d2h; }
static uint64_t h2d(void) { return ut_stats(m, disc).bytes_h2d; }

Test(shadow, state_machine) {
  const size_t n = 8192;
  unsigned char src[8192], back[8192];
  um_buffer *b;
  unsigned char *p;
  uint64_t r0, w0;

  ub_pattern(src, n, 31);
  cr_assert_eq(um_alloc(m, disc, n, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_null(um_buffer_host_ptr(b), "a discrete buffer has no host view");
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE, "fresh buffer");
  cr_assert_eq(um_copy_from_host(b, 0, src, n, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);

  /* map READ: the shadow is fetched (the whole buffer) */
  r0 = d2h(), w0 = h2d();
  cr_assert_eq(um_map(b, UM_MAP_READ, 100, 1000, (void **)&p), UM_OK);
  cr_assert_eq(d2h() - r0, n, "map READ of a device-only buffer fetches it");
  cr_assert_eq(um_buffer_valid(b), BOTH);
  cr_assert_arr_eq(p, src + 100, 1000);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_buffer_valid(b), BOTH);
  cr_assert_eq(h2d(), w0, "unmap after READ writes nothing back");

  /* map READ again: the shadow is current, no transfer */
  r0 = d2h();
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, n, (void **)&p), UM_OK);
  cr_assert_eq(d2h(), r0, "second map READ fetched again");
  cr_assert_arr_eq(p, src, n);
  cr_assert_eq(um_unmap(b, p), UM_OK);

  /* map WRITE: no fetch (the shadow is current), only HOST is valid */
  r0 = d2h(), w0 = h2d();
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 2000, 3000, (void **)&p), UM_OK);
  cr_assert_eq(d2h(), r0);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST);
  memset(p, 0xc3, 3000);
  /* unmap: the mapped range (and only it) goes back to the device */
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(h2d() - w0, 3000, "write-back of the mapped length");
  cr_assert_eq(um_buffer_valid(b), BOTH);
  memset(src + 2000, 0xc3, 3000);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert_arr_eq(back, src, n, "device copy after write-back");

  /* a copy into the buffer makes the device copy the only current one */
  ub_pattern(src, n, 32);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
  r0 = d2h();
  cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 0, 16, (void **)&p), UM_OK);
  cr_assert_eq(d2h() - r0, n, "READ_WRITE of a device-only buffer fetches");
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST);
  cr_assert_arr_eq(p, src, 16);
  p[0] ^= 0xff;
  w0 = h2d();
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(h2d() - w0, 16);
  src[0] ^= 0xff;

  /* fill: device only again */
  cr_assert_eq(um_fill(b, 4096, 0x99, 4096, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_DEVICE);
  memset(src + 4096, 0x99, 4096);

  /* WRITE_DISCARD of the whole buffer: nothing fetched */
  r0 = d2h(), w0 = h2d();
  cr_assert_eq(um_map(b, UM_MAP_WRITE_DISCARD, 0, n, (void **)&p), UM_OK);
  cr_assert_eq(d2h(), r0, "WRITE_DISCARD of the whole buffer fetched");
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST);
  memset(p, 0x11, n);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(h2d() - w0, n);
  cr_assert_eq(um_buffer_valid(b), BOTH);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert(ut_all_bytes(back, n, 0x11));

  /* WRITE_DISCARD of part of a device-only buffer fetches: only the
   * mapped range is written back, but the rest of the shadow must be
   * current for the reads that follow without a fetch. */
  cr_assert_eq(um_fill(b, 0, 0x22, n, NULL), UM_OK);
  r0 = d2h();
  cr_assert_eq(um_map(b, UM_MAP_WRITE_DISCARD, 0, 100, (void **)&p), UM_OK);
  cr_assert_eq(d2h() - r0, n, "partial WRITE_DISCARD of a device-only buffer fetches");
  memset(p, 0x33, 100);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, n, (void **)&p), UM_OK);
  cr_assert(ut_all_bytes(p, 100, 0x33));
  cr_assert(ut_all_bytes(p + 100, n - 100, 0x22));
  cr_assert_eq(um_unmap(b, p), UM_OK);

  cr_assert_eq(um_release(b), UM_OK);
}

/* Same state rules, the usual refusals. */
Test(shadow, map_refusals) {
  um_buffer *b;
  void *p, *q;
  unsigned char host[64];
  cr_assert_eq(um_alloc(m, disc, 4096, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_unmap(b, host), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 0, 4096, &p), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 1, &q), UM_ESTATE);
  cr_assert_eq(um_copy_from_host(b, 0, host, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_copy_to_host(b, 0, host, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(b, 0, 0, 64, NULL), UM_ESTATE);
  cr_assert_eq(um_unmap(b, (char *)p + 1), UM_EINVAL);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST);
  /* release of a mapped buffer: allowed, the shadow goes with it */
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_unmap(b, p), UM_ESTATE);
}

/* A map waits for operations still running on a worker thread before it
 * fetches. */
Test(shadow, map_after_async) {
  const size_t n = 4u << 20;
  unsigned char *src = malloc(n);
  um_buffer *b;
  um_event *e;
  void *p;
  cr_assert_not_null(src);
  ub_pattern(src, n, 33);
  cr_assert_eq(um_alloc(m, disc, n, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, src, n, &e), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, n, &p), UM_OK);
  cr_assert_eq(um_event_query(e), UM_OK);
  cr_assert_arr_eq(p, src, n);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  um_event_release(e);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
}

/* Round trips through the device, blocking and asynchronous, at offsets. */
Test(shadow, copy_round_trips) {
  const size_t n = 1u << 20;
  unsigned char *src = malloc(n), *back = malloc(n);
  um_buffer *b;
  um_event *e1, *e2;
  cr_assert_not_null(src);
  cr_assert_not_null(back);
  ub_pattern(src, n, 34);
  cr_assert_eq(um_alloc(m, disc, n, UM_DEVICE, UM_ALLOC_ZERO, &b), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert(ut_all_bytes(back, n, 0), "UM_ALLOC_ZERO on a discrete device");
  cr_assert_eq(um_copy_from_host(b, 0, src, n, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert_arr_eq(back, src, n);
  cr_assert_eq(um_copy_from_host(b, 7, src + 1000, 5000, &e1), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, &e2), UM_OK);
  cr_assert_eq(um_event_wait(e2), UM_OK);
  cr_assert_eq(um_event_query(e1), UM_OK);
  memmove(src + 7, src + 1000, 5000);
  cr_assert_arr_eq(back, src, n);
  /* a device-local copy within the buffer (overlapping) */
  cr_assert_eq(um_copy(b, 10, b, 0, 100000, NULL), UM_OK);
  memmove(src + 10, src, 100000);
  cr_assert_eq(um_copy_to_host(b, 0, back, n, NULL), UM_OK);
  cr_assert_arr_eq(back, src, n);
  um_event_release(e1);
  um_event_release(e2);
  cr_assert_eq(um_release(b), UM_OK);
  free(src);
  free(back);
}

/* um_copy between the cpu and the discrete device both ways, and between
 * two discrete devices (no peer access: staged through host memory). */
Test(shadow, copy_between_devices) {
  const size_t n = 6u << 20; /* more than one 4 MiB staging chunk */
  unsigned char *src = malloc(n), *back = malloc(n);
  um_buffer *h, *d, *d2, *h2;
  um_event *e;
  um_stats s;
  cr_assert_not_null(src);
  cr_assert_not_null(back);
  ub_pattern(src, n, 35);
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, 0, &h), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, n, UM_HOST, UM_ALLOC_ZERO, &h2), UM_OK);
  cr_assert_eq(um_alloc(m, disc, n, UM_DEVICE, 0, &d), UM_OK);
  cr_assert_eq(um_alloc(m, disc2, n, UM_DEVICE, 0, &d2), UM_OK);
  cr_assert_eq(um_copy_from_host(h, 0, src, n, NULL), UM_OK);
  cr_assert_eq(um_copy(d, 0, h, 0, n, NULL), UM_OK);      /* cpu -> discrete */
  cr_assert_eq(um_buffer_valid(d), UM_VALID_DEVICE);
  cr_assert_eq(um_copy(d2, 0, d, 0, n, &e), UM_OK);       /* discrete -> discrete */
  cr_assert_eq(um_event_wait(e), UM_OK);
  um_event_release(e);
  cr_assert_eq(um_copy(h2, 0, d2, 0, n, NULL), UM_OK);    /* discrete -> cpu */
  cr_assert_arr_eq(um_buffer_host_ptr(h2), src, n);
  /* partial, at offsets */
  cr_assert_eq(um_copy(d, 3, h2, 1000, 12345, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(d, 0, back, n, NULL), UM_OK);
  memmove(src + 3, (unsigned char *)um_buffer_host_ptr(h2) + 1000, 12345);
  cr_assert_arr_eq(back, src, n);
  cr_assert_eq(um_device_synchronize(disc), UM_OK);
  s = ut_stats(m, disc2);
  cr_assert_eq(s.xfer_staged, 1);
  cr_assert_eq(s.bytes_peer, n);
  cr_assert_eq(um_release(h), UM_OK);
  cr_assert_eq(um_release(h2), UM_OK);
  cr_assert_eq(um_release(d), UM_OK);
  cr_assert_eq(um_release(d2), UM_OK);
  free(src);
  free(back);
}

/* ------------------------------------------------------------------------ */
/* The profile's device */

#define N (200000u + 13u)

/* The state a buffer is in: without a host view, what the backend's map
 * gives (no_view); with one, HOST|DEVICE always. */
static unsigned state_of(um_buffer *b, unsigned no_view) {
  return um_buffer_host_ptr(b) == NULL ? no_view : BOTH;
}

/* After unmap the device holds the data. A backend that maps a DEVICE
 * buffer itself (OpenCL) leaves it there alone; where the core keeps a host
 * shadow instead (the fault backend, CUDA) the shadow stays valid too. */
static void assert_state_after_unmap(um_buffer *b) {
  if (strncmp(ut_profile(), "pocl", 4) == 0)
    cr_assert_eq(um_buffer_valid(b), state_of(b, UM_VALID_DEVICE));
  else
    cr_assert(um_buffer_valid(b) & UM_VALID_DEVICE, "valid 0x%x after unmap", um_buffer_valid(b));
}

static um_buffer *device_buffer_with(ut_env *e, unsigned seed, unsigned char *bytes) {
  um_buffer *b = ub_alloc(e->m, e->dev, N, UM_DEVICE);
  ub_pattern(bytes, N, seed);
  cr_assert_eq(um_copy_from_host(b, 0, bytes, N, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(b), state_of(b, UM_VALID_DEVICE));
  return b;
}

Test(map_device, device_buffer_read_mapping) {
  ut_env e = ut_profile_open(NULL);
  unsigned char *bytes = ub_malloc(N);
  um_buffer *b = device_buffer_with(&e, 1, bytes);
  void *p = NULL;
  cr_assert_eq(um_map(b, UM_MAP_READ, 1001, 5000, &p), UM_OK, "%s", um_last_error());
  cr_assert_not_null(p);
  cr_assert_eq(um_buffer_valid(b), BOTH);
  ub_assert_bytes(p, bytes + 1001, 5000, "mapped for reading");
  cr_assert_eq(um_unmap(b, p), UM_OK);
  assert_state_after_unmap(b);
  cr_assert_eq(um_release(b), UM_OK);
  free(bytes);
  ut_profile_close(&e);
}

/* Each writing mode: HOST while mapped, DEVICE after unmap, and the device
 * holds what was written through the mapping (and only there). */
Test(map_device, device_buffer_writing_modes) {
  static const um_map_mode modes[] = {UM_MAP_WRITE, UM_MAP_READ_WRITE, UM_MAP_WRITE_DISCARD};
  ut_env e = ut_profile_open(NULL);
  for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
    unsigned char *bytes = ub_malloc(N), *got;
    um_buffer *b = device_buffer_with(&e, 2 + (unsigned)k, bytes);
    size_t off = 333 + k, len = 70001;
    unsigned char *p = NULL;
    cr_assert_eq(um_map(b, modes[k], off, len, (void **)&p), UM_OK, "mode %d: %s", (int)modes[k],
                 um_last_error());
    cr_assert_eq(um_buffer_valid(b), state_of(b, UM_VALID_HOST), "mode %d", (int)modes[k]);
    if (modes[k] == UM_MAP_READ_WRITE)
      ub_assert_bytes(p, bytes + off, len, "read-write mapping shows the device's bytes");
    for (size_t i = 0; i < len; i++)
      p[i] = (unsigned char)(bytes[off + i] ^ 0x5A);
    cr_assert_eq(um_unmap(b, p), UM_OK);
    assert_state_after_unmap(b);
    for (size_t i = 0; i < len; i++)
      bytes[off + i] ^= 0x5A;
    got = ub_read_all(b);
    ub_assert_bytes(got, bytes, N, "after unmap of mode %d", (int)modes[k]);
    free(got);
    free(bytes);
    cr_assert_eq(um_release(b), UM_OK);
  }
  ut_profile_close(&e);
}

/* The whole buffer, and a map right after asynchronous writes sees them. */
Test(map_device, map_sees_earlier_async_operations) {
  ut_env e = ut_profile_open(NULL);
  unsigned char *bytes = ub_malloc(N), *src = ub_malloc(N), *want = ub_malloc(N);
  um_buffer *b = device_buffer_with(&e, 7, bytes);
  um_event *e1 = NULL, *e2 = NULL;
  void *p = NULL;
  ub_pattern(src, N, 8);
  memcpy(want, src, N);
  memset(want + 10, 0x77, 100);
  cr_assert_eq(um_copy_from_host(b, 0, src, N, &e1), UM_OK);
  cr_assert_eq(um_fill(b, 10, 0x77, 100, &e2), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, N, &p), UM_OK);
  ub_assert_bytes(p, want, N, "the mapping waits for the operations issued before it");
  cr_assert_eq(um_event_query(e1), UM_OK);
  cr_assert_eq(um_event_query(e2), UM_OK);
  um_event_release(e1);
  um_event_release(e2);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(bytes);
  free(src);
  free(want);
  ut_profile_close(&e);
}

Test(map_device, misuse_of_a_device_mapping) {
  ut_env e = ut_profile_open(NULL);
  unsigned char *bytes = ub_malloc(N);
  um_buffer *b = device_buffer_with(&e, 9, bytes);
  void *p = NULL, *q = NULL;
  char tmp[16];
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, N + 1, &p), UM_ERANGE);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 0, &p), UM_EINVAL);
  cr_assert_eq(um_unmap(b, tmp), UM_ESTATE, "not mapped");
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 16, 32, &p), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 8, &q), UM_ESTATE, "already mapped");
  cr_assert_eq(um_copy_from_host(b, 0, tmp, sizeof(tmp), NULL), UM_ESTATE, "operations wait for unmap");
  cr_assert_eq(um_unmap(b, tmp), UM_EINVAL, "not the pointer um_map returned");
  cr_assert_eq(um_buffer_valid(b), state_of(b, UM_VALID_HOST));
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_unmap(b, p), UM_ESTATE);
  /* releasing a mapped buffer unmaps it */
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 8, &p), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  free(bytes);
  ut_profile_close(&e);
}

/* One location with a host view: every mode maps the view itself, and the
 * bytes written through it are what a read and a device copy see. */
static void host_view_of(ut_env *e, um_location loc) {
  um_buffer *b = ub_alloc(e->m, e->dev, N, loc), *d;
  unsigned char *host = um_buffer_host_ptr(b), *p = NULL, *got, *dev_bytes, *bytes = ub_malloc(N);
  cr_assert_not_null(host);
  ub_pattern(bytes, N, 10 + (unsigned)loc);
  cr_assert_eq(um_copy_from_host(b, 0, bytes, N, NULL), UM_OK);
  cr_assert_eq(um_buffer_valid(b), BOTH);
  for (int mode = UM_MAP_READ; mode <= UM_MAP_WRITE_DISCARD; mode++) {
    cr_assert_eq(um_map(b, (um_map_mode)mode, 1000, 4000, (void **)&p), UM_OK);
    cr_assert_eq(p, host + 1000, "location %d: the mapping is the host view", (int)loc);
    cr_assert_eq(um_buffer_valid(b), BOTH);
    if (mode != UM_MAP_READ) {
      memset(p, mode, 4000);
      memset(bytes + 1000, mode, 4000);
    }
    cr_assert_eq(um_unmap(b, p), UM_OK);
    cr_assert_eq(um_buffer_valid(b), BOTH);
  }
  got = ub_read_all(b);
  ub_assert_bytes(got, bytes, N, "location %d after writes through mappings", (int)loc);
  ub_assert_bytes(host, bytes, N, "location %d host view", (int)loc);
  d = ub_alloc(e->m, e->dev, N, UM_DEVICE);
  cr_assert_eq(um_copy(d, 0, b, 0, N, NULL), UM_OK);
  dev_bytes = ub_read_all(d);
  ub_assert_bytes(dev_bytes, bytes, N, "device copy of location %d", (int)loc);
  free(dev_bytes);
  cr_assert_eq(um_release(d), UM_OK);
  free(got);
  free(bytes);
  cr_assert_eq(um_release(b), UM_OK);
}

/* PINNED and UNIFIED: the mapping is the host view itself. */
Test(map_device, host_views_of_pinned_and_unified) {
  ut_env e = ut_profile_open(NULL);
  um_device_info info;
  int tested = 0;
  cr_assert_eq(um_device_info_get(e.dev, &info), UM_OK);
  for (int loc = UM_PINNED; loc <= UM_UNIFIED; loc++) {
    if (info.locations & (1u << loc)) {
      host_view_of(&e, (um_location)loc);
      tested++;
    }
  }
  ut_profile_close(&e);
  if (strcmp(info.backend, "opencl") == 0)
    cr_assert_gt(tested, 0, "PINNED is always offered by the OpenCL backend");
}
