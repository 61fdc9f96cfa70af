/* um_map_file: files as zero-copy HOST buffers, read-only and read-write,
 * bad input, statistics, and a sparse file past 4 GiB. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h" /* Criterion, or its stand-in under TSan */
#include "unimem.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define GiB ((uint64_t)1024 * MiB)

static um_manager *m;
static um_device *cpu;
static char dir[256];
static char path[300];

static void setup(void) {
  um_options o;
  const char *tmp = getenv("TMPDIR");
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  cr_assert_eq(um_manager_create(&o, &m), UM_OK);
  cpu = um_device_get(m, 0);
  snprintf(dir, sizeof(dir), "%s/unimem-mapfile-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
  snprintf(path, sizeof(path), "%s/data.bin", dir);
}

static void teardown(void) {
  unlink(path);
  rmdir(dir);
  cr_assert_eq(um_manager_destroy(m), UM_OK);
}

TestSuite(mapfile, .init = setup, .fini = teardown);

static unsigned char pattern_at(uint64_t pos) { return (unsigned char)((pos * 131u + 7u) ^ (pos >> 12)); }

/* A file of n bytes holding pattern_at(i) at position i. */
static void write_pattern_file(const char *p, size_t n) {
  unsigned char *data = malloc(n);
  int fd;
  cr_assert_not_null(data);
  for (size_t i = 0; i < n; i++)
    data[i] = pattern_at(i);
  fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, data, n), (ssize_t)n);
  close(fd);
  free(data);
}

static void read_file_at(const char *p, uint64_t off, void *out, size_t n) {
  int fd = open(p, O_RDONLY);
  cr_assert_geq(fd, 0);
  cr_assert_eq(pread(fd, out, n, (off_t)off), (ssize_t)n);
  close(fd);
}

Test(mapfile, read_only_is_zero_copy_and_exact) {
  const size_t n = 100000; /* not a multiple of the page size */
  um_buffer *b = NULL;
  unsigned char *view, out[300];
  void *mapped = NULL;
  write_pattern_file(path, n);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &b), UM_OK);
  cr_assert_eq(um_buffer_size(b), n);
  cr_assert_eq(um_buffer_device(b), cpu);
  cr_assert_eq(um_buffer_location(b), UM_HOST);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST | UM_VALID_DEVICE);
  view = um_buffer_host_ptr(b);
  cr_assert_not_null(view);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(view[i], pattern_at(i), "byte %zu", i);
  cr_assert_eq(um_copy_to_host(b, n - sizeof(out), out, sizeof(out), NULL), UM_OK);
  for (size_t i = 0; i < sizeof(out); i++)
    cr_assert_eq(out[i], pattern_at(n - sizeof(out) + i));
  /* Mapping is the view itself: no copy. */
  cr_assert_eq(um_map(b, UM_MAP_READ, 4096, 10, &mapped), UM_OK);
  cr_assert_eq(mapped, view + 4096);
  cr_assert_eq(um_unmap(b, mapped), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
}

Test(mapfile, read_only_refuses_writes) {
  um_buffer *b = NULL, *dst = NULL;
  unsigned char byte = 1;
  void *mapped = NULL;
  write_pattern_file(path, 8192);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &b), UM_OK);
  cr_assert_eq(um_copy_from_host(b, 0, &byte, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(b, 0, 0, 16, NULL), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 0, 16, &mapped), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_READ_WRITE, 0, 16, &mapped), UM_ESTATE);
  cr_assert_eq(um_map(b, UM_MAP_WRITE_DISCARD, 0, 16, &mapped), UM_ESTATE);
  cr_assert_eq(um_alloc(m, cpu, 8192, UM_DEVICE, 0, &dst), UM_OK);
  cr_assert_eq(um_copy(b, 0, dst, 0, 16, NULL), UM_ESTATE);
  /* Reading out of it works. */
  cr_assert_eq(um_copy(dst, 0, b, 0, 8192, NULL), UM_OK);
  cr_assert_eq(((unsigned char *)um_buffer_host_ptr(dst))[8191], pattern_at(8191));
  cr_assert_eq(um_release(dst), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  /* The file is unchanged. */
  read_file_at(path, 0, &byte, 1);
  cr_assert_eq(byte, pattern_at(0));
}

Test(mapfile, read_write_reaches_the_file) {
  const size_t n = 3 * 4096 + 17;
  um_buffer *b = NULL;
  unsigned char *view, got[64];
  const unsigned char msg[] = "written through unimem";
  void *mapped = NULL;
  write_pattern_file(path, n);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ_WRITE, &b), UM_OK);
  view = um_buffer_host_ptr(b);
  view[0] = 0xAB;                                                   /* through the view */
  cr_assert_eq(um_copy_from_host(b, 5000, msg, sizeof(msg), NULL), UM_OK); /* a copy */
  cr_assert_eq(um_fill(b, n - 10, 0x5A, 10, NULL), UM_OK);          /* a fill */
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 100, 4, &mapped), UM_OK);    /* a mapping */
  memcpy(mapped, "MAPD", 4);
  cr_assert_eq(um_unmap(b, mapped), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);

  read_file_at(path, 0, got, 1);
  cr_assert_eq(got[0], 0xAB);
  read_file_at(path, 5000, got, sizeof(msg));
  cr_assert_eq(memcmp(got, msg, sizeof(msg)), 0);
  read_file_at(path, n - 10, got, 10);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(got[i], 0x5A);
  read_file_at(path, 100, got, 4);
  cr_assert_eq(memcmp(got, "MAPD", 4), 0);
  read_file_at(path, 1, got, 1); /* untouched bytes stay */
  cr_assert_eq(got[0], pattern_at(1));
}

Test(mapfile, write_modes_map_shared) {
  um_buffer *b = NULL;
  unsigned char got;
  write_pattern_file(path, 4096);
  cr_assert_eq(um_map_file(m, path, UM_MAP_WRITE, &b), UM_OK);
  ((unsigned char *)um_buffer_host_ptr(b))[7] = 0xEE;
  cr_assert_eq(um_release(b), UM_OK);
  read_file_at(path, 7, &got, 1);
  cr_assert_eq(got, 0xEE);
  cr_assert_eq(um_map_file(m, path, UM_MAP_WRITE_DISCARD, &b), UM_OK);
  cr_assert_eq(((unsigned char *)um_buffer_host_ptr(b))[7], 0xEE); /* contents kept */
  cr_assert_eq(um_release(b), UM_OK);
}

Test(mapfile, bad_input) {
  um_buffer *b = (um_buffer *)0x1;
  int fd;
  write_pattern_file(path, 4096);
  cr_assert_eq(um_map_file(NULL, path, UM_MAP_READ, &b), UM_EINVAL);
  cr_assert_eq(um_map_file(m, NULL, UM_MAP_READ, &b), UM_EINVAL);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, NULL), UM_EINVAL);
  cr_assert_eq(um_map_file(m, path, (um_map_mode)4, &b), UM_EINVAL);
  cr_assert_eq(um_map_file(m, path, (um_map_mode)-1, &b), UM_EINVAL);
  cr_assert_eq(b, (um_buffer *)0x1, "out written on failure");
  /* a directory, a missing file, an empty file */
  cr_assert_eq(um_map_file(m, dir, UM_MAP_READ, &b), UM_EINVAL);
  cr_assert_eq(um_map_file(m, "/nonexistent/unimem/file", UM_MAP_READ, &b), UM_ENODEV);
  cr_assert(um_last_error()[0] != '\0', "no detail in um_last_error()");
  fd = open(path, O_TRUNC | O_WRONLY);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &b), UM_EINVAL);
  cr_assert_eq(b, (um_buffer *)0x1);
}

Test(mapfile, ranges_and_release) {
  um_buffer *b = NULL;
  unsigned char out[8];
  void *mapped;
  write_pattern_file(path, 1000);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &b), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 993, out, 8, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_to_host(b, 992, out, 8, NULL), UM_OK);
  cr_assert_eq(um_copy_to_host(b, SIZE_MAX, out, 8, NULL), UM_ERANGE);
  cr_assert_eq(um_map(b, UM_MAP_READ, 1000, 1, &mapped), UM_ERANGE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(b), UM_ESTATE);
  cr_assert_eq(um_buffer_size(b), 0);
  cr_assert_null(um_buffer_host_ptr(b));
  cr_assert_eq(um_copy_to_host(b, 0, out, 8, NULL), UM_ESTATE);
}

Test(mapfile, statistics) {
  um_buffer *b = NULL;
  um_stats s0, s1, s2;
  write_pattern_file(path, 12345);
  cr_assert_eq(um_stats_get(m, cpu, &s0), UM_OK);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &b), UM_OK);
  cr_assert_eq(um_stats_get(m, cpu, &s1), UM_OK);
  cr_assert_eq(s1.allocations, s0.allocations + 1);
  cr_assert_eq(s1.active_buffers, s0.active_buffers + 1);
  cr_assert_eq(s1.bytes_in_use, s0.bytes_in_use + 12345);
  cr_assert_eq(s1.bytes_reserved, s0.bytes_reserved, "a file takes nothing from the device");
  cr_assert_eq(s1.pool_hits + s1.pool_misses, s0.pool_hits + s0.pool_misses, "files are not pooled");
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_stats_get(m, cpu, &s2), UM_OK);
  cr_assert_eq(s2.releases, s0.releases + 1);
  cr_assert_eq(s2.active_buffers, s0.active_buffers);
  cr_assert_eq(s2.bytes_in_use, s0.bytes_in_use);
  cr_assert_eq(s2.bytes_pooled, s0.bytes_pooled, "a file never enters the pool");
}

Test(mapfile, asynchronous_copies_out_of_a_file) {
  const size_t n = 2 * MiB + 3;
  um_buffer *b = NULL, *dst = NULL;
  um_event *e = NULL;
  unsigned char *host;
  write_pattern_file(path, n);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &b), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, n, UM_DEVICE, 0, &dst), UM_OK);
  cr_assert_eq(um_copy(dst, 0, b, 0, n, &e), UM_OK);
  /* Releasing the file while its copy may be in flight is safe. */
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_event_wait(e), UM_OK);
  um_event_release(e);
  host = um_buffer_host_ptr(dst);
  for (size_t i = 0; i < n; i += 4093)
    cr_assert_eq(host[i], pattern_at(i));
  cr_assert_eq(host[n - 1], pattern_at(n - 1));
  cr_assert_eq(um_release(dst), UM_OK);
}

/* A sparse 5 GiB file: every size and offset on the path is 64-bit. */
#define BIG_SIZE (5 * GiB)
#define NEAR_END (BIG_SIZE - 4096 - 100)
#define ACROSS_4G (4 * GiB - 50)

static int make_sparse_big_file(void) {
  unsigned char tail[4096], edge[100];
  int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
  cr_assert_geq(fd, 0);
  if (ftruncate(fd, (off_t)BIG_SIZE) != 0) {
    close(fd);
    return -1;
  }
  for (size_t i = 0; i < sizeof(tail); i++)
    tail[i] = pattern_at(NEAR_END + i);
  for (size_t i = 0; i < sizeof(edge); i++)
    edge[i] = pattern_at(ACROSS_4G + i);
  cr_assert_eq(pwrite(fd, tail, sizeof(tail), (off_t)NEAR_END), (ssize_t)sizeof(tail));
  cr_assert_eq(pwrite(fd, edge, sizeof(edge), (off_t)ACROSS_4G), (ssize_t)sizeof(edge));
  close(fd);
  return 0;
}

Test(mapfile, sparse_file_past_4_gib, .timeout = 120) {
  um_buffer *b = NULL, *dev = NULL;
  unsigned char *view, out[4096], edge[100];
  void *mapped = NULL;
  um_stats s;
  if (sizeof(size_t) < 8)
    cr_skip_test("32-bit build: a 5 GiB file does not fit the address space");
  if (make_sparse_big_file() != 0)
    cr_skip_test("the file system of %s refuses a sparse 5 GiB file: %s", dir, strerror(errno));

  /* read-only */
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &b), UM_OK);
  cr_assert_eq((uint64_t)um_buffer_size(b), BIG_SIZE);
  cr_assert_eq(um_stats_get(m, cpu, &s), UM_OK);
  cr_assert_eq(s.bytes_in_use, BIG_SIZE);
  view = um_buffer_host_ptr(b);
  for (size_t i = 0; i < sizeof(out); i++)
    cr_assert_eq(view[NEAR_END + i], pattern_at(NEAR_END + i), "view byte %zu past the end mark", i);
  cr_assert_eq(view[1 * GiB], 0, "holes read as zero");
  cr_assert_eq(um_copy_to_host(b, NEAR_END, out, sizeof(out), NULL), UM_OK);
  for (size_t i = 0; i < sizeof(out); i++)
    cr_assert_eq(out[i], pattern_at(NEAR_END + i));
  cr_assert_eq(um_copy_to_host(b, ACROSS_4G, edge, sizeof(edge), NULL), UM_OK);
  for (size_t i = 0; i < sizeof(edge); i++)
    cr_assert_eq(edge[i], pattern_at(ACROSS_4G + i), "byte %zu across the 4 GiB mark", i);
  /* the last byte, and one past it */
  cr_assert_eq(um_copy_to_host(b, BIG_SIZE - 1, out, 1, NULL), UM_OK);
  cr_assert_eq(out[0], 0);
  cr_assert_eq(um_copy_to_host(b, BIG_SIZE - 1, out, 2, NULL), UM_ERANGE);
  cr_assert_eq(um_copy_to_host(b, BIG_SIZE, out, 1, NULL), UM_ERANGE);
  /* a mapping and a device copy from past 4 GiB */
  cr_assert_eq(um_map(b, UM_MAP_READ, NEAR_END, sizeof(out), &mapped), UM_OK);
  cr_assert_eq(mapped, view + NEAR_END);
  cr_assert_eq(um_unmap(b, mapped), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, sizeof(out), UM_DEVICE, 0, &dev), UM_OK);
  cr_assert_eq(um_copy(dev, 0, b, NEAR_END, sizeof(out), NULL), UM_OK);
  cr_assert_eq(memcmp(um_buffer_host_ptr(dev), view + NEAR_END, sizeof(out)), 0);
  cr_assert_eq(um_release(b), UM_OK);

  /* read-write: writes past 4 GiB land in the file at the right offsets */
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ_WRITE, &b), UM_OK);
  cr_assert_eq((uint64_t)um_buffer_size(b), BIG_SIZE);
  view = um_buffer_host_ptr(b);
  view[4 * GiB + 123] = 0x42;
  cr_assert_eq(um_copy_from_host(b, 4 * GiB + 1000, "past four", 9, NULL), UM_OK);
  cr_assert_eq(um_fill(b, BIG_SIZE - 16, 0x77, 16, NULL), UM_OK);
  cr_assert_eq(um_copy(b, 4 * GiB + 2000, dev, 0, 64, NULL), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_WRITE, 4 * GiB + 3000, 4, &mapped), UM_OK);
  memcpy(mapped, "W4GB", 4);
  cr_assert_eq(um_unmap(b, mapped), UM_OK);
  cr_assert_eq(um_copy_to_host(b, 4 * GiB + 1000, out, 9, NULL), UM_OK);
  cr_assert_eq(memcmp(out, "past four", 9), 0);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(dev), UM_OK);

  read_file_at(path, 4 * GiB + 123, out, 1);
  cr_assert_eq(out[0], 0x42);
  read_file_at(path, 4 * GiB + 1000, out, 9);
  cr_assert_eq(memcmp(out, "past four", 9), 0);
  read_file_at(path, BIG_SIZE - 16, out, 16);
  for (int i = 0; i < 16; i++)
    cr_assert_eq(out[i], 0x77);
  read_file_at(path, 4 * GiB + 2000, out, 64);
  for (size_t i = 0; i < 64; i++)
    cr_assert_eq(out[i], pattern_at(NEAR_END + i));
  read_file_at(path, 4 * GiB + 3000, out, 4);
  cr_assert_eq(memcmp(out, "W4GB", 4), 0);
  read_file_at(path, (uint64_t)4 * GiB + 122, out, 1); /* neighbours untouched */
  cr_assert_eq(out[0], 0);
}
