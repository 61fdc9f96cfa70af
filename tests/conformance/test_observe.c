/* Seeing the memory, on every device profile: tags (nested, given at
 * allocation, per device, with the bytes each moved), scopes (nested peaks
 * and counts), and a snapshot after a known sequence (exact counts, sizes,
 * states and tags; the blocks and free extents of each segment tile it;
 * its JSON). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "profile.h"

/* The statistics of tag name among n entries, or fail. */
static const um_tag_stats *find_tag(const um_tag_stats *t, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(t[i].name, name) == 0)
      return &t[i];
  cr_assert_fail("no tag \"%s\" among %d", name, n);
  return NULL;
}

static void expect_tag(const um_tag_stats *t, int n, const char *name, uint64_t active, uint64_t in_use,
                       uint64_t peak, uint64_t allocs, uint64_t releases) {
  const um_tag_stats *s = find_tag(t, n, name);
  cr_assert_eq(s->active_buffers, active, "%s: %llu buffers, expected %llu", name,
               (unsigned long long)s->active_buffers, (unsigned long long)active);
  cr_assert_eq(s->bytes_in_use, in_use, "%s: %llu in use, expected %llu", name, (unsigned long long)s->bytes_in_use,
               (unsigned long long)in_use);
  cr_assert_eq(s->peak_bytes_in_use, peak, "%s: peak %llu, expected %llu", name,
               (unsigned long long)s->peak_bytes_in_use, (unsigned long long)peak);
  cr_assert_eq(s->allocations, allocs, "%s: %llu allocations", name, (unsigned long long)s->allocations);
  cr_assert_eq(s->releases, releases, "%s: %llu releases", name, (unsigned long long)s->releases);
}

Test(observe, no_tags_before_the_first) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *b;
  cr_assert_eq(um_tag_stats_get(e.m, NULL, NULL, 0), 0);
  cr_assert_eq(um_alloc(e.m, e.dev, 100, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_str_eq(um_buffer_tag(b), "");
  cr_assert_eq(um_tag_stats_get(e.m, NULL, NULL, 0), 0, "an allocation alone makes no tag");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_null(um_buffer_tag(b), "a released buffer has no tag");
  ut_profile_close(&e);
}

/* Nested tags, a tag given at allocation, the untagged, per device. */
Test(observe, tags_known_sequence) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *a, *b, *c, *u, *a2;
  um_tag_stats t[8];
  int n;
  cr_assert_eq(um_tag_push(e.m, "attention"), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 1000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_tag_push(e.m, "kv"), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 3000, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_tag_pop(e.m), UM_OK);
  cr_assert_eq(um_alloc_tagged(e.m, e.dev, 500, UM_DEVICE, 0, "weights", &c), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 2000, UM_DEVICE, 0, &a2), UM_OK); /* the outer tag again */
  cr_assert_eq(um_tag_pop(e.m), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 100, UM_DEVICE, 0, &u), UM_OK);
  cr_assert_str_eq(um_buffer_tag(a), "attention");
  cr_assert_str_eq(um_buffer_tag(b), "kv");
  cr_assert_str_eq(um_buffer_tag(c), "weights");
  cr_assert_str_eq(um_buffer_tag(a2), "attention");
  cr_assert_str_eq(um_buffer_tag(u), "");

  n = um_tag_stats_get(e.m, NULL, t, 8);
  cr_assert_eq(n, 4, "\"\", attention, kv, weights: %d", n);
  cr_assert_str_eq(t[0].name, "", "the untagged first");
  cr_assert_str_eq(t[1].name, "attention", "then in the order of first use");
  cr_assert_str_eq(t[2].name, "kv");
  cr_assert_str_eq(t[3].name, "weights");
  expect_tag(t, n, "", 1, 100, 100, 1, 0);
  expect_tag(t, n, "attention", 2, 3000, 3000, 2, 0);
  expect_tag(t, n, "kv", 1, 3000, 3000, 1, 0);
  expect_tag(t, n, "weights", 1, 500, 500, 1, 0);

  cr_assert_eq(um_release(a2), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  n = um_tag_stats_get(e.m, e.dev, t, 8);
  cr_assert_eq(n, 4);
  expect_tag(t, n, "attention", 1, 1000, 3000, 2, 1);
  expect_tag(t, n, "kv", 0, 0, 3000, 1, 1);
  /* Fewer entries than tags: the count all the same. */
  cr_assert_eq(um_tag_stats_get(e.m, NULL, t, 2), 4);
  /* Another device holds none of them. */
  if (e.dev != um_device_get(e.m, 0)) {
    n = um_tag_stats_get(e.m, um_device_get(e.m, 0), t, 8);
    cr_assert_eq(n, 4);
    expect_tag(t, n, "attention", 0, 0, 0, 0, 0);
  }
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_release(u), UM_OK);
  n = um_tag_stats_get(e.m, NULL, t, 8);
  for (int i = 0; i < n; i++)
    cr_assert_eq(t[i].bytes_in_use, 0, "%s still holds %llu", t[i].name, (unsigned long long)t[i].bytes_in_use);
  ut_profile_close(&e);
}

/* Copies count for the tag of the thread that issued them, by direction. */
Test(observe, tags_count_bytes_moved) {
  ut_env e = ut_profile_open(NULL);
  unsigned char h[4096];
  um_buffer *x, *y;
  um_tag_stats t[4];
  const um_tag_stats *s;
  int n;
  memset(h, 0x3c, sizeof(h));
  cr_assert_eq(um_alloc(e.m, e.dev, 4096, UM_DEVICE, 0, &x), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 4096, UM_DEVICE, 0, &y), UM_OK);
  cr_assert_eq(um_tag_push(e.m, "io"), UM_OK);
  cr_assert_eq(um_copy_from_host(x, 0, h, 4096, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(x, 0, h, 1000, NULL), UM_OK);
  cr_assert_eq(um_copy(y, 0, x, 0, 2048, NULL), UM_OK);
  cr_assert_eq(um_fill(y, 0, 7, 512, NULL), UM_OK);
  cr_assert_eq(um_tag_pop(e.m), UM_OK);
  cr_assert_eq(um_copy_from_host(x, 0, h, 300, NULL), UM_OK); /* untagged */
  cr_assert_eq(um_device_synchronize(e.dev), UM_OK);
  n = um_tag_stats_get(e.m, NULL, t, 4);
  s = find_tag(t, n, "io");
  /* As um_stats counts them, on the host device too. */
  cr_assert_eq(s->bytes_h2d, 4096, "h2d %llu", (unsigned long long)s->bytes_h2d);
  cr_assert_eq(s->bytes_d2h, 1000, "d2h %llu", (unsigned long long)s->bytes_d2h);
  cr_assert_eq(s->bytes_d2d, 2048 + 512, "d2d %llu", (unsigned long long)s->bytes_d2d);
  cr_assert_eq(s->bytes_peer, 0);
  s = find_tag(t, n, "");
  cr_assert_eq(s->bytes_h2d, 300, "the untagged copy: %llu", (unsigned long long)s->bytes_h2d);
  cr_assert_eq(um_release(x), UM_OK);
  cr_assert_eq(um_release(y), UM_OK);
  ut_profile_close(&e);
}

Test(observe, tag_bad_input) {
  ut_env e = ut_profile_open(NULL);
  char longname[UM_TAG_NAME_MAX + 1];
  um_buffer *b = NULL;
  memset(longname, 'x', sizeof(longname) - 1);
  longname[UM_TAG_NAME_MAX] = '\0';
  cr_assert_eq(um_tag_pop(e.m), UM_ESTATE);
  cr_assert_eq(um_tag_push(NULL, "a"), UM_EINVAL);
  cr_assert_eq(um_tag_push(e.m, NULL), UM_EINVAL);
  cr_assert_eq(um_tag_push(e.m, ""), UM_EINVAL);
  cr_assert_eq(um_tag_push(e.m, longname), UM_EINVAL);
  longname[UM_TAG_NAME_MAX - 1] = '\0'; /* the longest that fits */
  cr_assert_eq(um_tag_push(e.m, longname), UM_OK);
  cr_assert_eq(um_tag_pop(e.m), UM_OK);
  for (int i = 0; i < UM_TAG_DEPTH_MAX; i++)
    cr_assert_eq(um_tag_push(e.m, "deep"), UM_OK);
  cr_assert_eq(um_tag_push(e.m, "deep"), UM_EOVERFLOW);
  for (int i = 0; i < UM_TAG_DEPTH_MAX; i++)
    cr_assert_eq(um_tag_pop(e.m), UM_OK);
  cr_assert_eq(um_tag_pop(e.m), UM_ESTATE);
  cr_assert_eq(um_alloc_tagged(e.m, e.dev, 10, UM_DEVICE, 0, "", &b), UM_EINVAL);
  cr_assert_eq(um_alloc_tagged(NULL, e.dev, 10, UM_DEVICE, 0, NULL, &b), UM_EINVAL);
  cr_assert_eq(um_alloc_tagged(e.m, e.dev, 0, UM_DEVICE, 0, "z", &b), UM_EINVAL, "um_alloc's own checks");
  cr_assert_eq(um_tag_stats_get(e.m, NULL, NULL, 1), UM_EINVAL);
  cr_assert_eq(um_tag_stats_get(e.m, NULL, NULL, -1), UM_EINVAL);
  cr_assert_eq(um_tag_stats_get(NULL, NULL, NULL, 0), UM_EINVAL);
  cr_assert_null(um_buffer_tag(NULL));
  ut_profile_close(&e);
}

/* The names run out at UM_TAGS_MAX. */
Test(observe, tag_names_run_out) {
  ut_env e = ut_profile_open(NULL);
  char name[32];
  int i;
  for (i = 0; i < UM_TAGS_MAX; i++) {
    snprintf(name, sizeof(name), "t%d", i);
    cr_assert_eq(um_tag_push(e.m, name), UM_OK, "name %d", i);
    cr_assert_eq(um_tag_pop(e.m), UM_OK);
  }
  cr_assert_eq(um_tag_push(e.m, "one more"), UM_ENOMEM);
  cr_assert_eq(um_tag_push(e.m, "t7"), UM_OK, "a name in use still works");
  cr_assert_eq(um_tag_pop(e.m), UM_OK);
  cr_assert_eq(um_tag_stats_get(e.m, NULL, NULL, 0), UM_TAGS_MAX + 1);
  ut_profile_close(&e);
}

/* Nested scopes: each one's peak and counts; the inner peak counts in the
 * outer. */
Test(observe, scopes_nested) {
  ut_env e = ut_profile_open(NULL);
  um_buffer *keep, *a, *b, *c;
  um_scope_stats s;
  cr_assert_eq(um_scope_pop(e.m, &s), UM_ESTATE);
  cr_assert_eq(um_alloc(e.m, e.dev, 700, UM_DEVICE, 0, &keep), UM_OK); /* before any scope */
  cr_assert_eq(um_scope_push(e.m), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 1000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 2000, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_scope_push(e.m), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 5000, UM_DEVICE, 0, &c), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  cr_assert_eq(um_scope_pop(e.m, &s), UM_OK);
  cr_assert_eq(s.bytes_in_use_start, 1700);
  cr_assert_eq(s.bytes_in_use_end, 1700);
  cr_assert_eq(s.peak_bytes_in_use, 6700, "inner peak %llu", (unsigned long long)s.peak_bytes_in_use);
  cr_assert_eq(s.allocations, 1);
  cr_assert_eq(s.releases, 1);
  cr_assert_eq(s.bytes_allocated, 5000);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_scope_pop(e.m, &s), UM_OK);
  cr_assert_eq(s.bytes_in_use_start, 700);
  cr_assert_eq(s.bytes_in_use_end, 700);
  cr_assert_eq(s.peak_bytes_in_use, 6700, "outer peak %llu: the inner one's", (unsigned long long)s.peak_bytes_in_use);
  cr_assert_eq(s.allocations, 3);
  cr_assert_eq(s.releases, 3);
  cr_assert_eq(s.bytes_allocated, 8000);
  cr_assert_eq(um_scope_pop(e.m, NULL), UM_ESTATE);
  cr_assert_eq(um_scope_push(NULL), UM_EINVAL);
  cr_assert_eq(um_release(keep), UM_OK);
  ut_profile_close(&e);
}

/* Count the snapshot's blocks of state st on device dev. */
static int count_state(const um_snapshot *s, int dev, um_block_state st) {
  int n = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    n += s->blocks[i].device == dev && s->blocks[i].state == st;
  return n;
}

/* The blocks and free extents of every segment tile it: in offset order,
 * each starts where the one before ended, the last ends at its size. */
static void expect_tiled(const um_snapshot *s) {
  for (size_t g = 0; g < s->nsegments; g++) {
    uint64_t at = 0;
    for (size_t i = 0; i < s->nblocks; i++) {
      const um_snapshot_block *b = &s->blocks[i];
      if (b->segment != (int)g)
        continue;
      cr_assert_eq(b->offset, at, "segment %zu: a block at %llu, expected %llu", g, (unsigned long long)b->offset,
                   (unsigned long long)at);
      at += b->capacity;
    }
    cr_assert_eq(at, s->segments[g].size, "segment %zu: its blocks end at %llu of %llu", g, (unsigned long long)at,
                 (unsigned long long)s->segments[g].size);
  }
}

static int count_in_file(const char *path, const char *what) {
  FILE *f = fopen(path, "r");
  char *text;
  long len;
  int n = 0;
  cr_assert_not_null(f);
  fseek(f, 0, SEEK_END);
  len = ftell(f);
  rewind(f);
  text = calloc(1, (size_t)len + 1);
  cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
    n++;
  free(text);
  return n;
}

Test(observe, snapshot_known_sequence) {
  ut_env e = ut_profile_open(NULL);
  int dev = um_device_info_get(e.dev, &(um_device_info){0}) == UM_OK ? 0 : -1;
  um_buffer *a, *b, *c;
  um_snapshot *s;
  um_stats st;
  uint64_t in_use = 0;
  char path[128];
  for (int i = 0; i < um_device_count(e.m); i++)
    if (um_device_get(e.m, i) == e.dev)
      dev = i;
  cr_assert_eq(um_tag_push(e.m, "model"), UM_OK);
  cr_assert_eq(um_alloc_at(e.m, e.dev, 1000, UM_DEVICE, 0, &a, "net.c", 12), UM_OK);
  cr_assert_eq(um_tag_pop(e.m), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 3000, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 5000, UM_DEVICE, 0, &c), UM_OK);
  cr_assert_eq(um_release(c), UM_OK); /* idle in the pool */
  cr_assert_eq(um_snapshot_take(e.m, &s), UM_OK);

  cr_assert_eq(count_state(s, dev, UM_BLOCK_IN_USE), 2);
  cr_assert_eq(count_state(s, dev, UM_BLOCK_IDLE), 1);
  cr_assert_eq(count_state(s, dev, UM_BLOCK_RELEASED), 0);
  for (size_t i = 0; i < s->nblocks; i++) {
    const um_snapshot_block *k = &s->blocks[i];
    if (k->state == UM_BLOCK_IN_USE) {
      in_use += k->size;
      cr_assert_neq(k->thread, 0);
      cr_assert_eq(k->loc, UM_DEVICE);
      if (k->size == 1000) {
        cr_assert_str_eq(k->tag, "model");
        cr_assert_str_eq(k->site_file, "net.c");
        cr_assert_eq(k->site_line, 12);
        cr_assert_geq(k->capacity, 1000);
      } else {
        cr_assert_eq(k->size, 3000);
        cr_assert_str_eq(k->tag, "");
        cr_assert_null(k->site_file);
      }
    } else if (k->state == UM_BLOCK_IDLE) {
      cr_assert_eq(k->size, ut_class(5000), "an idle block shows its capacity: %llu", (unsigned long long)k->size);
      cr_assert_null(k->tag);
    }
    if (i > 0) /* in order: device, location, segment */
      cr_assert(s->blocks[i - 1].device < k->device ||
                (s->blocks[i - 1].device == k->device && (s->blocks[i - 1].loc < k->loc ||
                                                          (s->blocks[i - 1].loc == k->loc &&
                                                           s->blocks[i - 1].segment <= k->segment))));
  }
  cr_assert_eq(in_use, 4000);
  cr_assert_eq(um_stats_get(e.m, NULL, &st), UM_OK);
  cr_assert_eq(st.bytes_in_use, in_use, "the snapshot agrees with the statistics");
  cr_assert_eq(st.segments, s->nsegments, "every segment: %llu and %zu", (unsigned long long)st.segments,
               s->nsegments);
  expect_tiled(s);

  snprintf(path, sizeof(path), "/tmp/unimem-test-snapshot-%ld.json", (long)getpid());
  cr_assert_eq(um_snapshot_write(s, path), UM_OK);
  cr_assert_eq(count_in_file(path, "\"state\": \"in_use\""), 2);
  cr_assert_eq(count_in_file(path, "\"state\": \"idle\""), 1);
  cr_assert_eq(count_in_file(path, "\"tag\": \"model\""), 1);
  cr_assert_eq(count_in_file(path, "\"site\": \"net.c:12\""), 1);
  cr_assert_eq(count_in_file(path, "\"state\": \"free\""), count_state(s, dev, UM_BLOCK_FREE) +
                                                               (dev != 0 ? count_state(s, 0, UM_BLOCK_FREE) : 0));
  unlink(path);
  cr_assert_eq(um_snapshot_write(s, "/nonexistent/dir/x.json"), UM_EBACKEND);
  cr_assert_eq(um_snapshot_write(NULL, path), UM_EINVAL);
  um_snapshot_free(s);
  um_snapshot_free(NULL);
  cr_assert_eq(um_snapshot_take(e.m, NULL), UM_EINVAL);

  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  /* Nothing in use: the blocks are idle or free extents. */
  cr_assert_eq(um_snapshot_take(e.m, &s), UM_OK);
  cr_assert_eq(count_state(s, dev, UM_BLOCK_IN_USE), 0);
  cr_assert_eq(count_state(s, dev, UM_BLOCK_IDLE), 3);
  expect_tiled(s);
  um_snapshot_free(s);
  ut_profile_close(&e);
}

/* The events of a known sequence, in order, with their fields. */
Test(observe, history_known_sequence) {
  ut_env e = ut_profile_open(NULL);
  unsigned char h[1000];
  um_history_event ev[16];
  size_t n;
  uint64_t dropped;
  um_buffer *a;
  memset(h, 1, sizeof(h));
  cr_assert_eq(um_history_start(e.m, 0), UM_EINVAL);
  cr_assert_eq(um_history_stop(e.m), UM_ESTATE);
  cr_assert_eq(um_history_write(e.m, "/dev/null"), UM_ESTATE, "nothing recorded yet");
  cr_assert_eq(um_history_start(e.m, 16), UM_OK);
  cr_assert_eq(um_history_start(e.m, 16), UM_ESTATE);
  cr_assert_eq(um_tag_push(e.m, "step"), UM_OK);
  cr_assert_eq(um_alloc_at(e.m, e.dev, 1000, UM_DEVICE, 0, &a, "model.c", 7), UM_OK);
  cr_assert_eq(um_copy_from_host(a, 0, h, 1000, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(a, 0, h, 600, NULL), UM_OK);
  cr_assert_eq(um_tag_pop(e.m), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  cr_assert_eq(um_history_get(e.m, ev, 16, &n, &dropped), UM_OK);
  cr_assert_eq(n, 4, "%zu events", n);
  cr_assert_eq(dropped, 0);
  cr_assert_eq(ev[0].kind, UM_HIST_ALLOC);
  cr_assert_eq(ev[0].bytes, 1000);
  cr_assert_eq(ev[0].in_use, 1000);
  cr_assert_str_eq(ev[0].tag, "step");
  cr_assert_str_eq(ev[0].site_file, "model.c");
  cr_assert_eq(ev[0].site_line, 7);
  cr_assert_neq(ev[0].thread, 0);
  cr_assert_eq(ev[1].kind, UM_HIST_COPY);
  cr_assert_eq(ev[1].bytes, 1000);
  cr_assert_eq(ev[1].src_device, -1);
  cr_assert_str_eq(ev[1].tag, "step");
  cr_assert_not_null(ev[1].path);
  cr_assert_leq(ev[1].begin_ns, ev[1].end_ns);
  cr_assert_eq(ev[2].kind, UM_HIST_COPY);
  cr_assert_eq(ev[2].bytes, 600);
  cr_assert_eq(ev[2].dst_device, -1);
  cr_assert_eq(ev[3].kind, UM_HIST_RELEASE);
  cr_assert_eq(ev[3].in_use, 0);
  cr_assert_eq(ev[3].address, ev[0].address);
  for (size_t i = 1; i < n; i++)
    cr_assert_leq(ev[i - 1].end_ns, ev[i].end_ns, "in the order they happened");
  /* Nothing more once stopped; the recording stays readable. */
  cr_assert_eq(um_alloc(e.m, e.dev, 10, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_history_get(e.m, NULL, 0, &n, NULL), UM_OK);
  cr_assert_eq(n, 4);
  ut_profile_close(&e);
}

/* How each allocation was served: the first from the device, the same
 * size again from the pool, another size beside it from the free extent of
 * the first's segment where the pool keeps segments (else the device), an
 * unpooled one from the device. */
Test(observe, history_allocation_how) {
  ut_env e = ut_profile_open(NULL);
  um_history_event ev[16];
  um_buffer *a, *b, *c;
  um_snapshot *s;
  um_device_info info;
  size_t n;
  int in_segment = 0;
  cr_assert_eq(um_device_info_get(e.dev, &info), UM_OK);
  cr_assert_eq(um_history_start(e.m, 16), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 1000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 1000, UM_DEVICE, 0, &a), UM_OK);
  cr_assert_eq(um_snapshot_take(e.m, &s), UM_OK);
  for (size_t i = 0; i < s->nsegments; i++)
    in_segment |= s->segments[i].device == info.index && s->segments[i].loc == UM_DEVICE &&
                  s->segments[i].size >= 64 * 1024;
  um_snapshot_free(s);
  cr_assert_eq(um_alloc(e.m, e.dev, 3000, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 1000, UM_DEVICE, UM_ALLOC_UNPOOLED, &c), UM_OK);
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  cr_assert_eq(um_history_get(e.m, ev, 16, &n, NULL), UM_OK);
  cr_assert_eq(n, 5, "%zu events", n);
  cr_assert_eq(ev[0].kind, UM_HIST_ALLOC);
  cr_assert_eq(ev[0].how, UM_HIST_DEVICE, "the first block calls the device");
  cr_assert_eq(ev[1].kind, UM_HIST_RELEASE);
  cr_assert_eq(ev[2].how, UM_HIST_POOL, "the same size again is a hit");
  cr_assert_eq(ev[2].address, ev[0].address);
  cr_assert_eq(ev[3].how, in_segment ? UM_HIST_CARVE : UM_HIST_DEVICE, "another size: how %d (segment %d)",
               ev[3].how, in_segment);
  cr_assert_eq(ev[4].how, UM_HIST_DEVICE, "unpooled");
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(c), UM_OK);
  ut_profile_close(&e);
}

/* A full ring keeps the newest events and counts the others. */
Test(observe, history_ring_overwrites_the_oldest) {
  ut_env e = ut_profile_open(NULL);
  um_history_event ev[8];
  size_t n;
  uint64_t dropped;
  um_buffer *b;
  cr_assert_eq(um_history_start(e.m, 4), UM_OK);
  for (int i = 1; i <= 10; i++) {
    cr_assert_eq(um_alloc(e.m, e.dev, (size_t)i * 100, UM_DEVICE, 0, &b), UM_OK);
    cr_assert_eq(um_release(b), UM_OK);
  }
  cr_assert_eq(um_history_get(e.m, ev, 8, &n, &dropped), UM_OK);
  cr_assert_eq(n, 4);
  cr_assert_eq(dropped, 16);
  cr_assert_eq(ev[0].kind, UM_HIST_ALLOC);
  cr_assert_eq(ev[0].bytes, 900);
  cr_assert_eq(ev[3].kind, UM_HIST_RELEASE);
  cr_assert_eq(ev[3].bytes, 1000);
  /* A new start forgets the old recording. */
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  cr_assert_eq(um_history_start(e.m, 8), UM_OK);
  cr_assert_eq(um_history_get(e.m, ev, 8, &n, &dropped), UM_OK);
  cr_assert_eq(n, 0);
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  ut_profile_close(&e);
}

/* Trims are in the history with the bytes the statistics count. */
Test(observe, history_trims) {
  ut_env e = ut_profile_open(NULL);
  um_history_event ev[64];
  um_buffer *b[4];
  um_stats before, after;
  uint64_t trimmed = 0;
  size_t n;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(um_alloc(e.m, e.dev, (size_t)(i + 1) << 16, UM_DEVICE, 0, &b[i]), UM_OK);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(um_release(b[i]), UM_OK);
  cr_assert_eq(um_stats_get(e.m, NULL, &before), UM_OK);
  cr_assert_eq(um_history_start(e.m, 64), UM_OK);
  cr_assert_eq(um_pool_trim(e.m, 0), UM_OK);
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  cr_assert_eq(um_stats_get(e.m, NULL, &after), UM_OK);
  cr_assert_eq(um_history_get(e.m, ev, 64, &n, NULL), UM_OK);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(ev[i].kind, UM_HIST_TRIM);
    trimmed += ev[i].bytes;
  }
  cr_assert_gt(after.bytes_trimmed, before.bytes_trimmed, "the trim gave memory back");
  cr_assert_eq(trimmed, after.bytes_trimmed - before.bytes_trimmed, "%llu in the history, %llu counted",
               (unsigned long long)trimmed, (unsigned long long)(after.bytes_trimmed - before.bytes_trimmed));
  ut_profile_close(&e);
}

/* The trace-event file of a known recording: its events with the fields
 * the format needs (the Python suite parses it as JSON). */
Test(observe, history_trace_events) {
  ut_env e = ut_profile_open(NULL);
  char path[128];
  um_buffer *a;
  cr_assert_eq(um_history_start(e.m, 64), UM_OK);
  cr_assert_eq(um_alloc_tagged(e.m, e.dev, 4096, UM_DEVICE, 0, "act\"ivations", &a), UM_OK);
  cr_assert_eq(um_fill(a, 0, 0, 4096, NULL), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  snprintf(path, sizeof(path), "/tmp/unimem-test-history-%ld.json", (long)getpid());
  cr_assert_eq(um_history_write(e.m, path), UM_OK);
  cr_assert_eq(count_in_file(path, "\"traceEvents\""), 1);
  cr_assert_eq(count_in_file(path, "\"cat\": \"alloc\", \"ph\": \"i\""), 1);
  cr_assert_eq(count_in_file(path, "\"cat\": \"release\", \"ph\": \"i\""), 1);
  cr_assert_eq(count_in_file(path, "\"cat\": \"fill\", \"ph\": \"X\""), 1);
  cr_assert_eq(count_in_file(path, "\"name\": \"in use\", \"ph\": \"C\""), 2);
  /* The allocation and the release; the fill was issued outside any tag. */
  cr_assert_eq(count_in_file(path, "\"tag\": \"act\\\"ivations\""), 2, "the tag escaped");
  cr_assert_geq(count_in_file(path, "\"name\": \"process_name\""), 1);
  unlink(path);
  cr_assert_eq(um_history_write(e.m, "/nonexistent/dir/h.json"), UM_EBACKEND);
  cr_assert_eq(um_history_write(e.m, NULL), UM_EINVAL);
  ut_profile_close(&e);
}

/* Out of memory on a capped device: the report names the tags that hold
 * the most, the history has the failure, and the snapshot is written. */
Test(observe, oom_explains_itself) {
  um_options o;
  ut_env e;
  char path[200], want[300];
  um_buffer *a, *b = NULL;
  um_history_event ev[8];
  size_t n;
  ut_profile_options(&o);
  o.device_limit_bytes = 1u << 20;
  o.enable_pooling = 0;
  snprintf(path, sizeof(path), "/tmp/unimem-test-oom-%ld.json", (long)getpid());
  snprintf(o.oom_snapshot, sizeof(o.oom_snapshot), "/tmp/unimem-test-oom-%%p.json");
  e = ut_profile_open(&o);
  ut_profile_need_cap(&e, 1u << 20);
  cr_assert_eq(um_history_start(e.m, 8), UM_OK);
  cr_assert_eq(um_alloc_tagged(e.m, e.dev, 700u << 10, UM_DEVICE, 0, "weights", &a), UM_OK);
  cr_assert_eq(um_alloc(e.m, e.dev, 700u << 10, UM_DEVICE, 0, &b), UM_ENOMEM);
  cr_assert_not_null(strstr(um_last_error(), "the most in use by tag: weights 716800 bytes"), "%s", um_last_error());
  snprintf(want, sizeof(want), "a snapshot is in %s", path);
  cr_assert_not_null(strstr(um_last_error(), want), "%s", um_last_error());
  cr_assert_eq(count_in_file(path, "\"tag\": \"weights\""), 1);
  cr_assert_eq(count_in_file(path, "\"state\": \"in_use\""), 1);
  unlink(path);
  cr_assert_eq(um_history_get(e.m, ev, 8, &n, NULL), UM_OK);
  cr_assert_eq(n, 2);
  cr_assert_eq(ev[1].kind, UM_HIST_OOM);
  cr_assert_eq(ev[1].bytes, 700u << 10);
  cr_assert_eq(ev[1].status, UM_ENOMEM);
  cr_assert_eq(um_release(a), UM_OK);
  ut_profile_close(&e);
}

/* Threads with tags of their own allocate and release while another takes
 * snapshots and the history records: every count exact afterwards (and,
 * under ThreadSanitizer, no race). */
typedef struct obs_worker {
  um_manager *m;
  um_device *dev;
  char tag[16];
  int rounds;
} obs_worker;

static void *obs_work(void *arg) {
  obs_worker *w = arg;
  um_buffer *b;
  if (um_tag_push(w->m, w->tag) != UM_OK)
    return (void *)1;
  for (int i = 0; i < w->rounds; i++) {
    if (um_alloc(w->m, w->dev, 100 + (size_t)(i % 7) * 1000, UM_DEVICE, 0, &b) != UM_OK)
      return (void *)1;
    if (um_release(b) != UM_OK)
      return (void *)1;
  }
  return um_tag_pop(w->m) == UM_OK ? NULL : (void *)1;
}

Test(observe, threads_tags_snapshots_history) {
  ut_env e = ut_profile_open(NULL);
  enum { NW = 3, ROUNDS = 400 };
  obs_worker w[NW];
  pthread_t t[NW];
  um_tag_stats ts[8];
  size_t n;
  uint64_t dropped;
  int nt;
  cr_assert_eq(um_history_start(e.m, 1024), UM_OK);
  for (int i = 0; i < NW; i++) {
    w[i] = (obs_worker){.m = e.m, .dev = e.dev, .rounds = ROUNDS};
    snprintf(w[i].tag, sizeof(w[i].tag), "worker%d", i);
    cr_assert_eq(pthread_create(&t[i], NULL, obs_work, &w[i]), 0);
  }
  for (int k = 0; k < 20; k++) {
    um_snapshot *s;
    cr_assert_eq(um_snapshot_take(e.m, &s), UM_OK);
    expect_tiled(s);
    um_snapshot_free(s);
  }
  for (int i = 0; i < NW; i++) {
    void *rc;
    cr_assert_eq(pthread_join(t[i], &rc), 0);
    cr_assert_null(rc, "worker %d failed", i);
  }
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  cr_assert_eq(um_history_get(e.m, NULL, 0, &n, &dropped), UM_OK);
  cr_assert_eq(n + dropped, (uint64_t)NW * ROUNDS * 2, "every allocation and release recorded: %zu + %llu", n,
               (unsigned long long)dropped);
  nt = um_tag_stats_get(e.m, NULL, ts, 8);
  for (int i = 0; i < NW; i++) {
    const um_tag_stats *s = find_tag(ts, nt, w[i].tag);
    cr_assert_eq(s->allocations, ROUNDS);
    cr_assert_eq(s->releases, ROUNDS);
    cr_assert_eq(s->bytes_in_use, 0);
    cr_assert_eq(s->peak_bytes_in_use, 6100, "%s: peak %llu", w[i].tag, (unsigned long long)s->peak_bytes_in_use);
  }
  ut_profile_close(&e);
}

/* A map is in the history, with its bytes and its status. */
Test(observe, history_map) {
  ut_env e = ut_profile_open(NULL);
  um_history_event ev[8];
  um_buffer *b;
  void *p;
  size_t n;
  cr_assert_eq(um_alloc(e.m, e.dev, 8192, UM_DEVICE, 0, &b), UM_OK);
  cr_assert_eq(um_history_start(e.m, 8), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 0, 4096, &p), UM_OK);
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert_eq(um_history_stop(e.m), UM_OK);
  cr_assert_eq(um_history_get(e.m, ev, 8, &n, NULL), UM_OK);
  cr_assert_geq(n, 1);
  cr_assert_eq(ev[0].kind, UM_HIST_MAP);
  cr_assert_eq(ev[0].bytes, 4096);
  cr_assert_eq(ev[0].status, UM_OK);
  cr_assert_leq(ev[0].begin_ns, ev[0].end_ns);
  for (size_t i = 1; i < n; i++) /* an unmap that copies back is a copy */
    cr_assert_eq(ev[i].kind, UM_HIST_COPY);
  cr_assert_eq(um_release(b), UM_OK);
  ut_profile_close(&e);
}

/* um_options.backtraces: each allocation's return addresses, from the
 * caller of unimem on, in the snapshot and its JSON; none without it. */
static __attribute__((noinline)) int alloc_here(um_manager *m, um_device *d, um_buffer **out) {
  volatile int rc = um_alloc(m, d, 4096, UM_DEVICE, 0, out); /* a store after the call: no tail call in Release */
  return rc;
}

Test(observe, backtraces) {
  um_options o;
  ut_env e;
  um_buffer *a;
  um_snapshot *s;
  char path[128];
  int found = 0;
  ut_profile_options(&o);
  o.backtraces = 1;
  e = ut_profile_open(&o);
  cr_assert_eq(alloc_here(e.m, e.dev, &a), UM_OK);
  cr_assert_eq(um_snapshot_take(e.m, &s), UM_OK);
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].state == UM_BLOCK_IN_USE) {
      const um_snapshot_block *b = &s->blocks[i];
      found++;
      cr_assert_geq(b->nframes, 2, "%d frames", b->nframes);
      cr_assert_leq(b->nframes, UM_SNAPSHOT_FRAMES);
      /* One is in alloc_here (the first, where unimem is a library of its
       * own; the tests link it into the program, whose frames stay). */
      int in_caller = 0;
      for (int k = 0; k < b->nframes; k++)
        in_caller += (uintptr_t)b->frames[k] > (uintptr_t)alloc_here &&
                     (uintptr_t)b->frames[k] < (uintptr_t)alloc_here + 256;
      char seen[1024] = "";
      for (int k = 0; k < b->nframes; k++)
        snprintf(seen + strlen(seen), sizeof(seen) - strlen(seen), " %p", b->frames[k]);
      cr_assert_geq(in_caller, 1, "no frame in alloc_here (%p) among%s", (void *)alloc_here, seen);
      cr_assert_eq(b->thread != 0 && b->age_ns > 0, 1, "stamped from the manager's creation");
    }
  cr_assert_eq(found, 1);
  snprintf(path, sizeof(path), "/tmp/unimem-test-frames-%ld.json", (long)getpid());
  cr_assert_eq(um_snapshot_write(s, path), UM_OK);
  cr_assert_eq(count_in_file(path, "\"frames\": [\"0x"), 1);
  unlink(path);
  um_snapshot_free(s);
  cr_assert_eq(um_release(a), UM_OK);
  ut_profile_close(&e);

  e = ut_profile_open(NULL); /* without the option */
  cr_assert_eq(alloc_here(e.m, e.dev, &a), UM_OK);
  cr_assert_eq(um_snapshot_take(e.m, &s), UM_OK);
  for (size_t i = 0; i < s->nblocks; i++)
    cr_assert_eq(s->blocks[i].nframes, 0);
  um_snapshot_free(s);
  cr_assert_eq(um_release(a), UM_OK);
  ut_profile_close(&e);
}
