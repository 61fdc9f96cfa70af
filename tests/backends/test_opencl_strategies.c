/* The transfer engine's strategies on OpenCL, each forced where needed and
 * recognised by its statistics counter: peer (two devices of one context),
 * staged through host (enable_peer = 0), device-local, direct from pinned
 * memory of the same device, pipelined staging through pinned chunks, and
 * direct from pageable memory. Every copy's bytes are checked, with odd
 * offsets and lengths that are not a multiple of the staging chunk. */
#include "opencl_util.h"

#define CHUNK (64u * 1024u)

static um_options options_with(int enable_peer, int use_pinned_staging) {
  um_options o;
  ou_options(&o);
  o.enable_peer = enable_peer;
  o.use_pinned_staging = use_pinned_staging;
  o.staging_chunk_bytes = CHUNK;
  o.pinned_pool_bytes = 4 * CHUNK;
  return o;
}

/* Copy [soff, soff + len) of src to dst at doff (dst filled with 0x33
 * first), blocking or with an event, and check dst's bytes; returns the
 * statistics of the device the copy is counted on, before and after. */
static void copy_and_check(um_manager *m, um_buffer *dst, size_t doff, um_buffer *src, size_t soff, size_t len,
                           unsigned seed, int async, um_device *counted, um_stats *before, um_stats *after) {
  size_t dn = um_buffer_size(dst);
  unsigned char *want = ub_malloc(dn), *got, *srcbytes = ub_malloc(um_buffer_size(src));
  um_event *e = NULL;
  ub_pattern(srcbytes, um_buffer_size(src), seed);
  memset(want, 0x33, dn);
  memcpy(want + doff, srcbytes + soff, len);
  cr_assert_eq(um_fill(dst, 0, 0x33, dn, NULL), UM_OK);
  *before = ut_stats(m, counted);
  cr_assert_eq(um_copy(dst, doff, src, soff, len, async ? &e : NULL), UM_OK, "um_copy: %s", um_last_error());
  if (async)
    ub_wait(e, UM_OK);
  *after = ut_stats(m, counted);
  got = ub_read_all(dst);
  ub_assert_bytes(got, want, dn, "copy of %zu bytes (%s)", len, async ? "async" : "blocking");
  free(want);
  free(got);
  free(srcbytes);
}

/* ------------------------------------------------------------------------ */

/* Default options enable peer access between the two devices of PoCL's one
 * context; a copy between them is one peer copy, counted on the
 * destination's device. */
Test(opencl_strategies, peer_between_two_devices) {
  um_options o = options_with(1, 1);
  ou_env e;
  ou_want_two_devices();
  e = ou_open(&o, 2);
  cr_assert_eq(um_peer_enabled(e.dev[1], e.dev[0]), 1, "enable_peer=1 enables the pair at creation");
  cr_assert_eq(um_peer_enabled(e.dev[0], e.dev[1]), 1);
  for (int async = 0; async <= 1; async++) {
    const size_t n = 5 * CHUNK + 4099, len = n - 1001;
    um_buffer *src = ub_alloc_pattern(e.m, e.dev[0], n, UM_DEVICE, 1);
    um_buffer *dst = ub_alloc(e.m, e.dev[1], n, UM_DEVICE);
    um_stats a, b, sa, sb;
    sa = ut_stats(e.m, e.dev[0]);
    copy_and_check(e.m, dst, 7, src, 993, len, 1, async, e.dev[1], &a, &b);
    sb = ut_stats(e.m, e.dev[0]);
    ou_assert_strategies(a, b, 0, 1, 0, 0, 0);
    cr_assert_eq(b.bytes_peer - a.bytes_peer, len);
    ou_assert_strategies(sa, sb, 0, 0, 0, 0, 0); /* the source's device counts nothing */
    cr_assert_eq(um_release(src), UM_OK);
    cr_assert_eq(um_release(dst), UM_OK);
    /* and the other way */
    src = ub_alloc_pattern(e.m, e.dev[1], n, UM_DEVICE, 2);
    dst = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
    copy_and_check(e.m, dst, 0, src, 11, len, 2, async, e.dev[0], &a, &b);
    ou_assert_strategies(a, b, 0, 1, 0, 0, 0);
    cr_assert_eq(um_release(src), UM_OK);
    cr_assert_eq(um_release(dst), UM_OK);
  }
  ou_close(&e);
}

/* The same pair asked for explicitly: um_peer_enable succeeds. */
Test(opencl_strategies, peer_enable_explicit) {
  um_options o = options_with(0, 1);
  ou_env e;
  um_buffer *src, *dst;
  um_stats a, b;
  ou_want_two_devices();
  e = ou_open(&o, 2);
  cr_assert_eq(um_peer_enabled(e.dev[1], e.dev[0]), 0);
  cr_assert_eq(um_peer_possible(e.dev[1], e.dev[0]), 1);
  cr_assert_eq(um_peer_enable(e.dev[1], e.dev[0]), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_peer_enabled(e.dev[1], e.dev[0]), 1);
  src = ub_alloc_pattern(e.m, e.dev[0], 100000, UM_DEVICE, 2);
  dst = ub_alloc(e.m, e.dev[1], 100000, UM_DEVICE);
  copy_and_check(e.m, dst, 1, src, 2, 99990, 2, 1, e.dev[1], &a, &b);
  ou_assert_strategies(a, b, 0, 1, 0, 0, 0);
  cr_assert_eq(um_release(src), UM_OK);
  cr_assert_eq(um_release(dst), UM_OK);
  ou_close(&e);
}

/* enable_peer = 0: the copy between the two devices is staged through host
 * memory, in chunks (the length is not a multiple of the chunk). */
Test(opencl_strategies, staged_through_host_without_peer) {
  um_options o = options_with(0, 1);
  ou_env e;
  ou_want_two_devices();
  e = ou_open(&o, 2);
  cr_assert_eq(um_peer_enabled(e.dev[1], e.dev[0]), 0);
  for (int async = 0; async <= 1; async++) {
    static const size_t lens[] = {1, CHUNK, CHUNK + 1, 7 * CHUNK + 333};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
      size_t len = lens[k], n = len + 64;
      um_buffer *src = ub_alloc_pattern(e.m, e.dev[0], n, UM_DEVICE, 3);
      um_buffer *dst = ub_alloc(e.m, e.dev[1], n, UM_DEVICE);
      um_stats a, b;
      copy_and_check(e.m, dst, 31, src, 17, len, 3, async, e.dev[1], &a, &b);
      ou_assert_strategies(a, b, 0, 0, 0, 0, 1);
      cr_assert_eq(b.bytes_peer - a.bytes_peer, len);
      cr_assert_eq(um_release(src), UM_OK);
      cr_assert_eq(um_release(dst), UM_OK);
    }
  }
  ou_close(&e);
}

/* Two buffers of one device: a device-local copy (clEnqueueCopyBuffer),
 * also between disjoint ranges of one buffer; overlapping ranges of one
 * buffer are staged through the host (memmove semantics). */
OU_TEST_1_AND_2(opencl_strategies, device_local) {
  ou_env e = ou_open(NULL, 1);
  const size_t n = 3 * CHUNK + 5;
  for (int async = 0; async <= 1; async++) {
    um_buffer *src = ub_alloc_pattern(e.m, e.dev[0], n, UM_DEVICE, 4);
    um_buffer *dst = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
    um_stats a, b;
    unsigned char *want = ub_malloc(n), *got;
    um_event *ev = NULL;
    copy_and_check(e.m, dst, 3, src, 1, n - 9, 4, async, e.dev[0], &a, &b);
    ou_assert_strategies(a, b, 1, 0, 0, 0, 0);
    cr_assert_eq(b.bytes_d2d - a.bytes_d2d, n - 9);

    /* disjoint ranges of one buffer */
    ub_pattern(want, n, 4);
    memcpy(want + n / 2 + 1, want + 1, n / 2 - 3);
    a = ut_stats(e.m, e.dev[0]);
    cr_assert_eq(um_copy(src, n / 2 + 1, src, 1, n / 2 - 3, async ? &ev : NULL), UM_OK);
    if (async)
      ub_wait(ev, UM_OK);
    b = ut_stats(e.m, e.dev[0]);
    ou_assert_strategies(a, b, 1, 0, 0, 0, 0);
    got = ub_read_all(src);
    ub_assert_bytes(got, want, n, "disjoint ranges of one buffer");
    free(got);

    /* overlapping ranges of one buffer */
    memmove(want + 100, want + 1, n - 200);
    a = ut_stats(e.m, e.dev[0]);
    cr_assert_eq(um_copy(src, 100, src, 1, n - 200, async ? &ev : NULL), UM_OK);
    if (async)
      ub_wait(ev, UM_OK);
    b = ut_stats(e.m, e.dev[0]);
    ou_assert_strategies(a, b, 0, 0, 0, 0, 1);
    got = ub_read_all(src);
    ub_assert_bytes(got, want, n, "overlapping ranges of one buffer");
    free(got);
    free(want);
    cr_assert_eq(um_release(src), UM_OK);
    cr_assert_eq(um_release(dst), UM_OK);
  }
  ou_close(&e);
}

/* A PINNED buffer of the same device as the source or destination: one
 * direct transfer whatever the size (no staging). */
OU_TEST_1_AND_2(opencl_strategies, direct_from_pinned_of_the_same_device) {
  um_options o = options_with(1, 2); /* staging forced: pinned still goes direct */
  ou_env e = ou_open(&o, 1);
  const size_t n = 9 * CHUNK + 77;
  for (int async = 0; async <= 1; async++) {
    um_buffer *pin = ub_alloc(e.m, e.dev[0], n, UM_PINNED);
    um_buffer *dev = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
    um_stats a, b;
    ub_pattern(um_buffer_host_ptr(pin), n, 5);
    copy_and_check(e.m, dev, 5, pin, 3, n - 10, 5, async, e.dev[0], &a, &b);
    ou_assert_strategies(a, b, 0, 0, 1, 0, 0);
    /* and device -> pinned */
    {
      unsigned char *want = ub_malloc(n), *devbytes = ub_read_all(dev);
      um_event *ev = NULL;
      memcpy(want, um_buffer_host_ptr(pin), n);
      memcpy(want + 1, devbytes + 2, n - 4);
      a = ut_stats(e.m, e.dev[0]);
      cr_assert_eq(um_copy(pin, 1, dev, 2, n - 4, async ? &ev : NULL), UM_OK);
      if (async)
        ub_wait(ev, UM_OK);
      b = ut_stats(e.m, e.dev[0]);
      ou_assert_strategies(a, b, 0, 0, 1, 0, 0);
      ub_assert_bytes(um_buffer_host_ptr(pin), want, n, "device -> pinned");
      free(want);
      free(devbytes);
    }
    cr_assert_eq(um_release(pin), UM_OK);
    cr_assert_eq(um_release(dev), UM_OK);
  }
  ou_close(&e);
}

/* Pageable host memory larger than one staging chunk, staging forced
 * (PoCL's devices are host memory, where staging is off by default):
 * pipelined through pinned chunks, both directions, with lengths of one
 * chunk plus one byte, an exact multiple, and a ragged tail. */
OU_TEST_1_AND_2(opencl_strategies, pipelined_staging_of_pageable_memory) {
  um_options o = options_with(1, 2);
  ou_env e = ou_open(&o, 1);
  static const size_t lens[] = {CHUNK + 1, 4 * CHUNK, 13 * CHUNK + 4321};
  for (int async = 0; async <= 1; async++) {
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
      size_t len = lens[k], n = len + 10;
      um_buffer *dev = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
      unsigned char *src = ub_malloc(len), *back = ub_malloc(len + 2), *all;
      um_event *ev = NULL;
      um_stats a, b;
      ub_pattern(src, len, (unsigned)k + 6);
      cr_assert_eq(um_fill(dev, 0, 0x44, n, NULL), UM_OK);
      a = ut_stats(e.m, e.dev[0]);
      cr_assert_eq(um_copy_from_host(dev, 3, src, len, async ? &ev : NULL), UM_OK, "%s", um_last_error());
      if (async)
        ub_wait(ev, UM_OK);
      b = ut_stats(e.m, e.dev[0]);
      ou_assert_strategies(a, b, 0, 0, 0, 1, 0);
      cr_assert_eq(b.bytes_h2d - a.bytes_h2d, len);
      all = ub_read_all(dev);
      for (size_t i = 0; i < 3; i++)
        cr_assert_eq(all[i], 0x44);
      ub_assert_bytes(all + 3, src, len, "pipelined H2D of %zu bytes", len);
      for (size_t i = len + 3; i < n; i++)
        cr_assert_eq(all[i], 0x44);
      free(all);

      memset(back, 0xEE, len + 2);
      a = ut_stats(e.m, e.dev[0]);
      cr_assert_eq(um_copy_to_host(dev, 3, back + 1, len, async ? &ev : NULL), UM_OK, "%s", um_last_error());
      if (async)
        ub_wait(ev, UM_OK);
      b = ut_stats(e.m, e.dev[0]);
      ou_assert_strategies(a, b, 0, 0, 0, 1, 0);
      cr_assert_eq(b.bytes_d2h - a.bytes_d2h, len);
      cr_assert_eq(back[0], 0xEE);
      cr_assert_eq(back[len + 1], 0xEE);
      ub_assert_bytes(back + 1, src, len, "pipelined D2H of %zu bytes", len);
      cr_assert_eq(um_release(dev), UM_OK);
      free(src);
      free(back);
    }
  }
  ou_close(&e);
}

/* The default (use_pinned_staging = 1) on a device whose memory is host
 * memory, and staging turned off (0): pageable memory goes in one direct
 * call; at or below one chunk it is direct in every mode. */
OU_TEST_1_AND_2(opencl_strategies, direct_from_pageable_memory) {
  for (int mode = 0; mode <= 2; mode++) {
    um_options o = options_with(1, mode);
    ou_env e = ou_open(&o, 1);
    static const size_t lens[] = {1, CHUNK, 3 * CHUNK + 1};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
      size_t len = lens[k];
      int staged = mode == 2 && len > CHUNK;
      um_buffer *dev = ub_alloc(e.m, e.dev[0], len, UM_DEVICE);
      unsigned char *src = ub_malloc(len), *back = ub_malloc(len);
      um_stats a, b;
      ub_pattern(src, len, (unsigned)(k + 9));
      a = ut_stats(e.m, e.dev[0]);
      cr_assert_eq(um_copy_from_host(dev, 0, src, len, NULL), UM_OK);
      cr_assert_eq(um_copy_to_host(dev, 0, back, len, NULL), UM_OK);
      b = ut_stats(e.m, e.dev[0]);
      if (staged)
        ou_assert_strategies(a, b, 0, 0, 0, 2, 0);
      else
        ou_assert_strategies(a, b, 0, 0, 2, 0, 0);
      ub_assert_bytes(back, src, len, "use_pinned_staging=%d, %zu bytes", mode, len);
      cr_assert_eq(um_release(dev), UM_OK);
      free(src);
      free(back);
    }
    ou_close(&e);
  }
}

/* UNIMEM_USE_PINNED_STAGING takes 0, 1 and 2 ("always"). */
Test(opencl_strategies, staging_option_from_the_environment) {
  um_options o;
  setenv("UNIMEM_USE_PINNED_STAGING", "always", 1);
  um_options_init(&o);
  cr_assert_eq(o.use_pinned_staging, 2);
  setenv("UNIMEM_USE_PINNED_STAGING", "off", 1);
  um_options_init(&o);
  cr_assert_eq(o.use_pinned_staging, 0);
  unsetenv("UNIMEM_USE_PINNED_STAGING");
  um_options_init(&o);
  cr_assert_eq(o.use_pinned_staging, 1);
  o.use_pinned_staging = 3;
  {
    um_manager *m = NULL;
    cr_assert_eq(um_manager_create(&o, &m), UM_EINVAL);
  }
}

/* A batch mixing every strategy between two devices: the counters add up
 * to one per copy and the bytes are right. */
Test(opencl_strategies, batch_of_every_strategy) {
  um_options o = options_with(1, 2);
  ou_env e;
  const size_t n = 6 * CHUNK + 123;
  um_buffer *d0, *d0b, *d1, *pin;
  unsigned char *host = ub_malloc(n), *out = ub_malloc(n), *got;
  um_copy_op ops[5];
  um_stats a0, b0, a1, b1;
  ou_want_two_devices();
  e = ou_open(&o, 2);
  d0 = ub_alloc_pattern(e.m, e.dev[0], n, UM_DEVICE, 20);
  d0b = ub_alloc(e.m, e.dev[0], n, UM_DEVICE);
  d1 = ub_alloc(e.m, e.dev[1], n, UM_DEVICE);
  pin = ub_alloc(e.m, e.dev[0], n, UM_PINNED);
  ub_pattern(host, n, 21);
  ub_pattern(um_buffer_host_ptr(pin), n, 22);
  memset(ops, 0, sizeof(ops));
  ops[0] = (um_copy_op){.dst = d0b, .src = d0, .bytes = n};          /* local */
  ops[1] = (um_copy_op){.dst = d1, .src = d0, .bytes = n};           /* peer */
  ops[2] = (um_copy_op){.dst = d0, .host_src = host, .bytes = n};    /* pipelined, after 0 and 1 */
  ops[3] = (um_copy_op){.host_dst = out, .src = d1, .bytes = n};     /* pipelined, after 1 */
  ops[4] = (um_copy_op){.dst = pin, .src = d0b, .bytes = n};         /* direct, after 0 */
  a0 = ut_stats(e.m, e.dev[0]);
  a1 = ut_stats(e.m, e.dev[1]);
  cr_assert_eq(um_copy_batch(e.m, ops, 5, NULL), UM_OK, "%s", um_last_error());
  b0 = ut_stats(e.m, e.dev[0]);
  b1 = ut_stats(e.m, e.dev[1]);
  ou_assert_strategies(a0, b0, 1, 0, 1, 1, 0);
  ou_assert_strategies(a1, b1, 0, 1, 0, 1, 0);
  {
    unsigned char *want = ub_malloc(n);
    ub_pattern(want, n, 20);
    ub_assert_bytes(out, want, n, "device 1 got device 0's bytes");
    ub_assert_bytes(um_buffer_host_ptr(pin), want, n, "pinned got device 0's first bytes");
    got = ub_read_all(d0);
    ub_assert_bytes(got, host, n, "device 0 got the host's bytes after being copied");
    free(got);
    free(want);
  }
  cr_assert_eq(um_release(d0), UM_OK);
  cr_assert_eq(um_release(d0b), UM_OK);
  cr_assert_eq(um_release(d1), UM_OK);
  cr_assert_eq(um_release(pin), UM_OK);
  free(host);
  free(out);
  ou_close(&e);
}
