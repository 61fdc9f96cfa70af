/* Statistics are real: after a known sequence of allocations, releases,
 * pool hits, copies, fills and trims, every field of um_stats has its exact
 * expected value, per device and in total. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* Size classes the sequences below rely on, worked out by hand from the
 * rule "exact up to 8 bytes, then four classes per power of two". */
Test(stats, class_sizes_used_below) {
  cr_assert_eq(ut_class(1), 1);
  cr_assert_eq(ut_class(8), 8);
  cr_assert_eq(ut_class(9), 10);
  cr_assert_eq(ut_class(100), 112);
  cr_assert_eq(ut_class(1000), 1024);
  cr_assert_eq(ut_class(1010), 1024);
  cr_assert_eq(ut_class(1025), 1280);
  cr_assert_eq(ut_class(2048), 2048);
  cr_assert_eq(ut_class(3000), 3072);
  cr_assert_eq(ut_class(4096), 4096);
  cr_assert_eq(ut_class(4097), 5120);
}

/* The sequence on the cpu (device 0 only). */
Test(stats, known_sequence_cpu) {
  um_manager *m = ut_manager();
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a, *b, *c, *a2, *d, *e;
  unsigned char h[4096];
  um_event *ev;
  um_stats want;

  memset(&want, 0, sizeof(want));
  um_stats got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want, "fresh manager");

  memset(h, 0x5c, sizeof(h));
  cr_assert_eq(um_alloc(m, cpu, 1000, UM_HOST, 0, &a), UM_OK);                 /* miss */
  cr_assert_eq(um_alloc(m, cpu, 3000, UM_DEVICE, 0, &b), UM_OK);               /* miss */
  cr_assert_eq(um_alloc(m, cpu, 500, UM_HOST, UM_ALLOC_UNPOOLED, &c), UM_OK);  /* exact */
  cr_assert_eq(um_copy_from_host(a, 0, h, 1000, NULL), UM_OK);                 /* h2d */
  cr_assert_eq(um_copy_to_host(b, 0, h, 3000, NULL), UM_OK);                   /* d2h */
  cr_assert_eq(um_copy(b, 100, a, 0, 1000, NULL), UM_OK);                      /* d2d */
  cr_assert_eq(um_fill(a, 0, 0xab, 1000, NULL), UM_OK);
  cr_assert_eq(um_fill(c, 10, 1, 10, &ev), UM_OK);
  cr_assert_eq(um_event_wait(ev), UM_OK);
  um_event_release(ev);

  want.active_buffers = 3;
  want.bytes_in_use = 4500;
  want.bytes_reserved = 1024 + 3072 + 500;
  want.peak_bytes_in_use = 4500;
  want.allocations = 3;
  want.pool_misses = 2;
  want.device_allocs = 3;
  want.bytes_h2d = 1000;
  want.bytes_d2h = 3000;
  want.bytes_d2d = 1000;
  want.xfer_direct = 2;
  want.xfer_local = 1;
  want.fills = 2;
  got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want, "three live buffers");
  got = ut_stats(m, cpu);
  ut_assert_stats_eq(&got, &want, "three live buffers, device 0");

  cr_assert_eq(um_release(a), UM_OK);
  want.active_buffers = 2;
  want.bytes_in_use = 3500;
  want.bytes_pooled = 1024;
  want.releases = 1;
  want.largest_pooled_block = 1024;
  got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want, "a released");

  cr_assert_eq(um_alloc(m, cpu, 1010, UM_HOST, 0, &a2), UM_OK); /* hit: a's block */
  cr_assert_eq(a2, a);
  want.active_buffers = 3;
  want.bytes_in_use = 4510;
  want.peak_bytes_in_use = 4510;
  want.bytes_pooled = 0;
  want.largest_pooled_block = 0;
  want.allocations = 4;
  want.pool_hits = 1;
  want.hit_rate = 1.0 / 3.0;
  got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want, "a2 from the pool");

  cr_assert_eq(um_release(c), UM_OK); /* unpooled: back to the device */
  cr_assert_eq(um_release(a2), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 100, UM_PINNED, 0, &d), UM_OK); /* miss */
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(d), UM_OK);
  want.active_buffers = 0;
  want.bytes_in_use = 0;
  want.bytes_reserved = 1024 + 3072 + 112;
  want.bytes_pooled = 1024 + 3072 + 112;
  want.allocations = 5;
  want.releases = 5;
  want.pool_misses = 3;
  want.hit_rate = 1.0 / 4.0;
  want.device_allocs = 4;
  want.device_frees = 1;
  want.largest_pooled_block = 3072;
  want.fragmentation = 1.0 - 3072.0 / 4208.0;
  got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want, "all released");
  got = ut_stats(m, cpu);
  ut_assert_stats_eq(&got, &want, "all released, device 0");

  /* Oldest first: a2's block (released first) then b's go; d's stays. */
  cr_assert_eq(um_pool_trim(m, 3100), UM_OK);
  want.bytes_reserved = 112;
  want.bytes_pooled = 112;
  want.device_frees = 3;
  want.trims = 2;
  want.bytes_trimmed = 1024 + 3072;
  want.largest_pooled_block = 112;
  want.fragmentation = 0.0;
  got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want, "trimmed to 3100");

  cr_assert_eq(um_alloc(m, cpu, 100, UM_PINNED, 0, &e), UM_OK); /* hit: d's block */
  cr_assert_eq(e, d);
  cr_assert_eq(um_release(e), UM_OK);
  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  want.bytes_reserved = 0;
  want.bytes_pooled = 0;
  want.allocations = 6;
  want.releases = 6;
  want.pool_hits = 2;
  want.hit_rate = 2.0 / 5.0;
  want.device_frees = 4;
  want.trims = 3;
  want.bytes_trimmed = 1024 + 3072 + 112;
  want.largest_pooled_block = 0;
  got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want, "final");
  got = ut_stats(m, cpu);
  ut_assert_stats_eq(&got, &want, "final, device 0");
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

/* Three devices (the cpu and two discrete test devices): each figure lands
 * on the device it belongs to, the total is their sum, and the peak of the
 * total is the peak of the sum. */
Test(stats, known_sequence_per_device) {
  um_manager *m = ut_manager_disc();
  um_device *cpu = um_device_get(m, 0), *d0 = um_device_get(m, 1), *d1 = um_device_get(m, 2);
  um_buffer *x, *y, *z, *q;
  unsigned char h[4096], back[4096];
  void *p;
  um_stats want_cpu, want_d0, want_d1, want_all, got;

  ut_pattern(h, sizeof(h), 1);
  cr_assert_eq(um_alloc(m, cpu, 4096, UM_HOST, 0, &x), UM_OK);
  cr_assert_eq(um_alloc(m, d0, 4096, UM_DEVICE, 0, &y), UM_OK);
  cr_assert_eq(um_alloc(m, d0, 2048, UM_DEVICE, UM_ALLOC_UNPOOLED, &z), UM_OK);
  cr_assert_eq(um_alloc(m, d1, 4000, UM_DEVICE, 0, &q), UM_OK);
  cr_assert_eq(um_copy_from_host(y, 0, h, 4096, NULL), UM_OK); /* d0: h2d */
  cr_assert_eq(um_copy(x, 0, y, 0, 4096, NULL), UM_OK);        /* d0 -> cpu: d2h on d0 */
  cr_assert_eq(um_copy(y, 0, x, 0, 4096, NULL), UM_OK);        /* cpu -> d0: h2d on d0 */
  cr_assert_eq(um_copy(z, 0, y, 2048, 2048, NULL), UM_OK);     /* d0 local */
  cr_assert_eq(um_copy_to_host(z, 0, back, 2048, NULL), UM_OK); /* d0: d2h */
  cr_assert_arr_eq(back, h + 2048, 2048);
  cr_assert_eq(um_copy(q, 0, y, 0, 4000, NULL), UM_OK); /* d0 -> d1, no peer: staged */
  cr_assert_eq(um_fill(y, 0, 7, 4096, NULL), UM_OK);    /* d0 fill */
  cr_assert_eq(um_map(y, UM_MAP_READ, 0, 16, &p), UM_OK); /* d0: fetch of 4096 */
  cr_assert(ut_all_bytes(p, 16, 7));
  cr_assert_eq(um_unmap(y, p), UM_OK);
  cr_assert_eq(um_copy_to_host(q, 0, back, 4000, NULL), UM_OK); /* d1: d2h */
  cr_assert_arr_eq(back, h, 4000);

  memset(&want_cpu, 0, sizeof(want_cpu));
  want_cpu.active_buffers = 1;
  want_cpu.bytes_in_use = 4096;
  want_cpu.bytes_reserved = 4096;
  want_cpu.peak_bytes_in_use = 4096;
  want_cpu.allocations = 1;
  want_cpu.pool_misses = 1;
  want_cpu.device_allocs = 1;

  memset(&want_d0, 0, sizeof(want_d0));
  want_d0.active_buffers = 2;
  want_d0.bytes_in_use = 4096 + 2048;
  want_d0.bytes_reserved = 4096 + 2048;
  want_d0.peak_bytes_in_use = 4096 + 2048;
  want_d0.allocations = 2;
  want_d0.pool_misses = 1;
  want_d0.device_allocs = 2;
  want_d0.bytes_h2d = 4096 + 4096;        /* from host, and from the cpu buffer */
  want_d0.bytes_d2h = 4096 + 2048 + 4096; /* to the cpu buffer, to host, the map's fetch */
  want_d0.bytes_d2d = 2048;
  want_d0.xfer_direct = 1 + 1 + 1 + 1 + 1; /* h2d, d0->cpu, cpu->d0, d2h, fetch */
  want_d0.xfer_local = 1;
  want_d0.fills = 1;

  memset(&want_d1, 0, sizeof(want_d1));
  want_d1.active_buffers = 1;
  want_d1.bytes_in_use = 4000;
  want_d1.bytes_reserved = 4096;
  want_d1.peak_bytes_in_use = 4000;
  want_d1.allocations = 1;
  want_d1.pool_misses = 1;
  want_d1.device_allocs = 1;
  want_d1.bytes_d2h = 4000;
  want_d1.bytes_peer = 4000;
  want_d1.xfer_direct = 1;
  want_d1.xfer_staged = 1;

  want_all = want_cpu;
#define ADD_(type, name, desc) want_all.name = want_cpu.name + want_d0.name + want_d1.name;
  UM_STATS_FIELDS(ADD_)
#undef ADD_
  want_all.hit_rate = 0.0;
  want_all.peak_bytes_in_use = 4096 + 6144 + 4000;

  got = ut_stats(m, cpu);
  ut_assert_stats_eq(&got, &want_cpu, "live, cpu");
  got = ut_stats(m, d0);
  ut_assert_stats_eq(&got, &want_d0, "live, discrete 0");
  got = ut_stats(m, d1);
  ut_assert_stats_eq(&got, &want_d1, "live, discrete 1");
  got = ut_stats(m, NULL);
  ut_assert_stats_eq(&got, &want_all, "live, total");

  /* Release everything: each block goes back to its own device's pool
   * (the unpooled one to its device). */
  cr_assert_eq(um_release(z), UM_OK);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  cr_assert_eq(um_release(q), UM_OK);
  want_cpu.active_buffers = 0, want_cpu.bytes_in_use = 0, want_cpu.releases = 1;
  want_cpu.bytes_pooled = 4096, want_cpu.largest_pooled_block = 4096;
  want_d0.active_buffers = 0, want_d0.bytes_in_use = 0, want_d0.releases = 2;
  want_d0.bytes_reserved = 4096, want_d0.device_frees = 1;
  want_d0.bytes_pooled = 4096, want_d0.largest_pooled_block = 4096;
  want_d1.active_buffers = 0, want_d1.bytes_in_use = 0, want_d1.releases = 1;
  want_d1.bytes_pooled = 4096, want_d1.largest_pooled_block = 4096;
  got = ut_stats(m, cpu);
  ut_assert_stats_eq(&got, &want_cpu, "released, cpu");
  got = ut_stats(m, d0);
  ut_assert_stats_eq(&got, &want_d0, "released, discrete 0");
  got = ut_stats(m, d1);
  ut_assert_stats_eq(&got, &want_d1, "released, discrete 1");
  got = ut_stats(m, NULL);
  cr_assert_eq(got.active_buffers, 0);
  cr_assert_eq(got.bytes_in_use, 0);
  cr_assert_eq(got.releases, 4);
  cr_assert_eq(got.bytes_pooled, 3 * 4096);
  cr_assert_eq(got.bytes_reserved, 3 * 4096);
  cr_assert_eq(got.largest_pooled_block, 4096);
  cr_assert_eq(got.fragmentation, 1.0 - 4096.0 / (3.0 * 4096.0));
  cr_assert_eq(got.peak_bytes_in_use, 4096 + 6144 + 4000);
  cr_assert_eq(got.device_frees, 1);

  cr_assert_eq(um_pool_trim(m, 0), UM_OK);
  got = ut_stats(m, NULL);
  cr_assert_eq(got.trims, 3);
  cr_assert_eq(got.bytes_trimmed, 3 * 4096);
  cr_assert_eq(got.bytes_reserved, 0);
  cr_assert_eq(got.device_frees, got.device_allocs);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  cr_assert_eq(atomic_load(&ut_disc_live_blocks), 0);
}

/* Batches and asynchronous copies are counted like blocking ones, once
 * each, when they complete. */
Test(stats, async_and_batch_counted_once) {
  um_manager *m = ut_manager();
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a, *b;
  size_t big = 1u << 20;
  unsigned char *h = malloc(big), *back = malloc(big);
  um_copy_op ops[3];
  um_event *e1, *e2, *e3;
  um_stats s;
  cr_assert_not_null(h);
  cr_assert_not_null(back);
  ut_pattern(h, big, 3);
  cr_assert_eq(um_alloc(m, cpu, big, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, big, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, h, big, &e1), UM_OK);
  cr_assert_eq(um_copy(b, 0, a, 0, big, &e2), UM_OK);
  cr_assert_eq(um_fill(a, 0, 0, 4096, &e3), UM_OK);
  cr_assert_eq(um_event_wait(e1), UM_OK);
  cr_assert_eq(um_event_wait(e2), UM_OK);
  cr_assert_eq(um_event_wait(e3), UM_OK);
  um_event_release(e1);
  um_event_release(e2);
  um_event_release(e3);
  ops[0] = (um_copy_op){.dst = a, .host_src = h, .bytes = 4096};
  ops[1] = (um_copy_op){.host_dst = back, .src = b, .bytes = big};
  ops[2] = (um_copy_op){.dst = a, .dst_off = 4096, .src = b, .src_off = 4096, .bytes = 100};
  cr_assert_eq(um_copy_batch(m, ops, 3, NULL), UM_OK);
  cr_assert_arr_eq(back, h, big);
  cr_assert_eq(um_device_synchronize(cpu), UM_OK);
  s = ut_stats(m, NULL);
  cr_assert_eq(s.bytes_h2d, big + 4096);
  cr_assert_eq(s.bytes_d2h, big);
  cr_assert_eq(s.bytes_d2d, big + 100);
  cr_assert_eq(s.xfer_direct, 3);
  cr_assert_eq(s.xfer_local, 2);
  cr_assert_eq(s.fills, 1);
  cr_assert_eq(s.bytes_peer + s.xfer_peer + s.xfer_pipelined + s.xfer_staged, 0);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
  free(h);
  free(back);
}

/* um_stats_json: one object with every field, exact values, snprintf-like
 * length and truncation. */
static const char *const field_names[] = {
#define NAME_(type, name, desc) #name,
    UM_STATS_FIELDS(NAME_)
#undef NAME_
};

Test(stats, json) {
  um_manager *m = ut_manager();
  um_device *cpu = um_device_get(m, 0);
  um_buffer *a, *b;
  um_stats s;
  char *buf, small[10];
  int n;
  size_t nfields = sizeof(field_names) / sizeof(field_names[0]);
  size_t colons = 0, commas = 0;

  cr_assert_eq(um_alloc(m, cpu, 1000, UM_HOST, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 1000, UM_HOST, 0, &a), UM_OK); /* hit */
  cr_assert_eq(um_alloc(m, cpu, 3000, UM_HOST, 0, &b), UM_OK); /* miss */
  cr_assert_eq(um_release(b), UM_OK);
  s = ut_stats(m, NULL);

  n = um_stats_json(&s, NULL, 0);
  cr_assert_gt(n, 0);
  buf = malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(um_stats_json(&s, buf, (size_t)n + 1), n);
  cr_assert_eq(strlen(buf), (size_t)n);
  cr_assert_eq(buf[0], '{');
  cr_assert_eq(buf[n - 1], '}');
  for (size_t i = 0; i < nfields; i++) {
    char key[64];
    snprintf(key, sizeof(key), "\"%s\":", field_names[i]);
    cr_assert_not_null(strstr(buf, key), "%s missing from %s", key, buf);
  }
  for (int i = 0; i < n; i++) {
    colons += buf[i] == ':';
    commas += buf[i] == ',';
  }
  cr_assert_eq(colons, nfields, "%s", buf);
  cr_assert_eq(commas, nfields - 1, "%s", buf);
  cr_assert_eq(strncmp(buf, "{\"active_buffers\":1,\"bytes_in_use\":1000,", 40), 0, "%s", buf);
  cr_assert_not_null(strstr(buf, "\"allocations\":3,"), "%s", buf);
  cr_assert_not_null(strstr(buf, "\"pool_hits\":1,\"pool_misses\":2,\"hit_rate\":0.333333,"), "%s", buf);
  cr_assert_not_null(strstr(buf, "\"bytes_pooled\":3072,"), "%s", buf);
  cr_assert_not_null(strstr(buf, "\"bytes_reserved\":4096,"), "%s", buf);
  cr_assert_not_null(strstr(buf, "\"fragmentation\":0.000000,"), "%s", buf);
  cr_assert_not_null(strstr(buf, "\"fills\":0,"), "%s", buf);
  cr_assert_not_null(strstr(buf, "\"xfer_net\":0,"), "%s", buf);
  cr_assert_not_null(strstr(buf, "\"largest_free_extent\":0}"), "%s", buf);

  /* truncated output: same length returned, NUL-terminated prefix */
  memset(small, 'x', sizeof(small));
  cr_assert_eq(um_stats_json(&s, small, sizeof(small)), n);
  cr_assert_eq(strlen(small), sizeof(small) - 1);
  cr_assert_eq(strncmp(small, buf, sizeof(small) - 1), 0);
  cr_assert_eq(um_stats_json(&s, small, 1), n);
  cr_assert_eq(small[0], '\0');

  free(buf);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}
