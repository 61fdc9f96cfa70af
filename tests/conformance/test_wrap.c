/* Zero-copy buffers over memory unimem does not own: um_wrap_host (the
 * caller's memory, optionally read-only or page-locked) and um_map_file (a
 * file, mmap'd). */
#include <fcntl.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "test_util.h"

static um_manager *m;
static um_device *cpu;

static void setup(void) {
  m = ut_manager();
  cpu = um_device_get(m, 0);
}

static void teardown(void) { cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error()); }

TestSuite(wrap, .init = setup, .fini = teardown);

/* ------------------------------------------------------------------------ */
/* um_wrap_host */

Test(wrap, zero_copy_both_ways) {
  unsigned char *mem = malloc(10000), back[10000], src[10000];
  um_buffer *b, *pooled;
  um_stats s;
  cr_assert_not_null(mem);
  ut_pattern(mem, 10000, 51);
  cr_assert_eq(um_wrap_host(m, mem, 10000, 0, &b), UM_OK);
  cr_assert_eq(um_buffer_host_ptr(b), (void *)mem, "the host view is the caller's pointer");
  cr_assert_eq(um_buffer_size(b), 10000);
  cr_assert_eq(um_buffer_device(b), cpu);
  cr_assert_eq(um_buffer_location(b), UM_HOST);
  cr_assert_eq(um_buffer_valid(b), UM_VALID_HOST | UM_VALID_DEVICE);
  /* the caller's writes are the buffer's contents */
  mem[5] = 0xab;
  cr_assert_eq(um_copy_to_host(b, 0, back, 10000, NULL), UM_OK);
  cr_assert_arr_eq(back, mem, 10000);
  /* and unimem's writes land in the caller's memory */
  ut_pattern(src, 10000, 52);
  cr_assert_eq(um_copy_from_host(b, 100, src, 5000, NULL), UM_OK);
  cr_assert_arr_eq(mem + 100, src, 5000);
  cr_assert_eq(um_fill(b, 9000, 0x66, 1000, NULL), UM_OK);
  cr_assert(ut_all_bytes(mem + 9000, 1000, 0x66));
  cr_assert_eq(um_alloc(m, cpu, 10000, UM_DEVICE, 0, &pooled), UM_OK);
  cr_assert_eq(um_copy(pooled, 0, b, 0, 10000, NULL), UM_OK);
  cr_assert_arr_eq(um_buffer_host_ptr(pooled), mem, 10000);
  cr_assert_eq(um_fill(pooled, 0, 0x12, 10, NULL), UM_OK);
  cr_assert_eq(um_copy(b, 0, pooled, 0, 10, NULL), UM_OK);
  cr_assert(ut_all_bytes(mem, 10, 0x12));
  /* a wrap counts as a live buffer, but reserves nothing from the device */
  s = ut_stats(m, NULL);
  cr_assert_eq(s.active_buffers, 2);
  cr_assert_eq(s.bytes_in_use, 20000);
  cr_assert_eq(s.bytes_reserved, ut_class(10000));
  cr_assert_eq(s.device_allocs, 1);
  cr_assert_eq(um_release(pooled), UM_OK);

  /* release: the caller's memory is intact, not freed, not pooled */
  memcpy(back, mem, 10000);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_arr_eq(mem, back, 10000, "release changed the caller's memory");
  mem[0] = 1; /* still the caller's */
  s = ut_stats(m, NULL);
  cr_assert_eq(s.active_buffers, 0);
  cr_assert_eq(s.bytes_in_use, 0);
  cr_assert_eq(s.bytes_pooled, ut_class(10000), "only the allocated block is pooled");
  cr_assert_eq(s.device_frees, 0);
  cr_assert_eq(um_release(b), UM_ESTATE);
  free(mem); /* ASan would catch a double free by unimem */
}

/* Wrapping the same memory twice, or parts of it, gives independent
 * buffers over the same bytes. */
Test(wrap, overlapping_wraps) {
  unsigned char mem[4096];
  um_buffer *a, *b;
  void *p = NULL;
  memset(mem, 0, sizeof(mem));
  cr_assert_eq(um_wrap_host(m, mem, 4096, 0, &a), UM_OK);
  cr_assert_eq(um_wrap_host(m, mem + 1024, 1024, UM_WRAP_READONLY, &b), UM_OK);
  cr_assert_neq(a, b);
  cr_assert_eq(um_fill(a, 1024, 0x44, 1024, NULL), UM_OK);
  cr_assert_eq(um_map(b, UM_MAP_READ, 0, 1024, &p), UM_OK);
  cr_assert_eq(p, (void *)(mem + 1024));
  cr_assert_eq(um_unmap(b, p), UM_OK);
  cr_assert(ut_all_bytes(mem + 1024, 1024, 0x44));
  cr_assert_eq(um_fill(b, 0, 0, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_release(a), UM_OK);
}

Test(wrap, readonly_enforced) {
  unsigned char mem[256], host[256];
  um_buffer *ro, *rw;
  void *p = NULL;
  memset(mem, 0x31, sizeof(mem));
  memset(host, 0x32, sizeof(host));
  cr_assert_eq(um_wrap_host(m, mem, sizeof(mem), UM_WRAP_READONLY, &ro), UM_OK);
  cr_assert_eq(um_alloc(m, cpu, 256, UM_HOST, 0, &rw), UM_OK);
  cr_assert_eq(um_copy_from_host(ro, 0, host, 256, NULL), UM_ESTATE);
  cr_assert_eq(um_copy(ro, 0, rw, 0, 256, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(ro, 0, 0, 256, NULL), UM_ESTATE);
  cr_assert_eq(um_map(ro, UM_MAP_WRITE, 0, 256, &p), UM_ESTATE);
  cr_assert_eq(um_map(ro, UM_MAP_READ_WRITE, 0, 256, &p), UM_ESTATE);
  cr_assert_eq(um_map(ro, UM_MAP_WRITE_DISCARD, 0, 256, &p), UM_ESTATE);
  cr_assert(ut_all_bytes(mem, 256, 0x31));
  /* reads work */
  cr_assert_eq(um_map(ro, UM_MAP_READ, 0, 256, &p), UM_OK);
  cr_assert_eq(p, (void *)mem);
  cr_assert_eq(um_unmap(ro, p), UM_OK);
  cr_assert_eq(um_copy(rw, 0, ro, 0, 256, NULL), UM_OK);
  cr_assert(ut_all_bytes(um_buffer_host_ptr(rw), 256, 0x31));
  cr_assert_eq(um_copy_to_host(ro, 0, host, 256, NULL), UM_OK);
  cr_assert(ut_all_bytes(host, 256, 0x31));
  cr_assert_eq(um_release(ro), UM_OK);
  cr_assert_eq(um_release(rw), UM_OK);
}

static int can_lock_mib(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  struct rlimit rl;
  if (syscall(SYS_capget, &hdr, data) == 0 && (data[0].effective & (1u << CAP_IPC_LOCK)))
    return 1;
  return getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
         (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= ut_vmlck() + (2u << 20));
}

Test(wrap, pin_locks_and_unlocks) {
  UT_SKIP_UNLESS_MLOCK_WORKS();
  const size_t n = 1u << 20;
  unsigned char *mem;
  um_buffer *b;
  uint64_t base;
  if (!can_lock_mib())
    cr_skip_test("this process may not lock 2 MiB (no CAP_IPC_LOCK, RLIMIT_MEMLOCK too low)");
  mem = aligned_alloc(4096, n);
  cr_assert_not_null(mem);
  memset(mem, 0x21, n);
  base = ut_vmlck();
  cr_assert_eq(um_wrap_host(m, mem, n, UM_WRAP_PIN, &b), UM_OK, "%s", um_last_error());
  cr_assert_geq(ut_vmlck(), base + n, "UM_WRAP_PIN did not lock the pages");
  cr_assert_eq(um_buffer_host_ptr(b), (void *)mem);
  cr_assert_eq(um_fill(b, 0, 0x22, 100, NULL), UM_OK);
  cr_assert(ut_all_bytes(mem, 100, 0x22));
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(ut_vmlck(), base, "release did not unlock the wrapped pages");
  cr_assert(ut_all_bytes(mem + 100, n - 100, 0x21), "release changed the caller's memory");
  /* read-only and pinned together */
  cr_assert_eq(um_wrap_host(m, mem, n, UM_WRAP_PIN | UM_WRAP_READONLY, &b), UM_OK);
  cr_assert_geq(ut_vmlck(), base + n);
  cr_assert_eq(um_fill(b, 0, 0, 1, NULL), UM_ESTATE);
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(ut_vmlck(), base);
  free(mem);
}

/* Pinning refused by the limit is an error of the wrap, not a crash; the
 * caller's memory is left as it was. */
Test(wrap, pin_refused) {
  UT_SKIP_UNLESS_MLOCK_WORKS();
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  struct rlimit rl = {64 * 1024, 64 * 1024};
  const size_t n = 1u << 20;
  unsigned char *mem = aligned_alloc(4096, n);
  um_buffer *b = (um_buffer *)(uintptr_t)0x99;
  um_stats before = ut_stats(m, NULL), after;
  cr_assert_not_null(mem);
  memset(mem, 0x17, n);
  cr_assert_eq(syscall(SYS_capget, &hdr, data), 0);
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  data[0].permitted &= ~(1u << CAP_IPC_LOCK);
  cr_assert_eq(syscall(SYS_capset, &hdr, data), 0);
  cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
  cr_assert_eq(um_wrap_host(m, mem, n, UM_WRAP_PIN, &b), UM_ENOMEM);
  cr_assert_not_null(strstr(um_last_error(), "mlock"), "%s", um_last_error());
  cr_assert_eq(b, (um_buffer *)(uintptr_t)0x99);
  after = ut_stats(m, NULL);
  ut_assert_stats_eq(&after, &before, "a refused wrap");
  cr_assert(ut_all_bytes(mem, n, 0x17));
  free(mem);
}

/* ------------------------------------------------------------------------ */
/* um_map_file */

static char tmpdir[64];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/unimem-wrap-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void write_file(const char *path, const void *data, size_t n) {
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, data, n), (ssize_t)n);
  cr_assert_eq(close(fd), 0);
}

static void read_file(const char *path, void *data, size_t n) {
  int fd = open(path, O_RDONLY);
  struct stat sb;
  cr_assert_geq(fd, 0);
  cr_assert_eq(fstat(fd, &sb), 0);
  cr_assert_eq((size_t)sb.st_size, n, "the file changed size");
  cr_assert_eq(read(fd, data, n), (ssize_t)n);
  close(fd);
}

Test(wrap, map_file_read_only) {
  const size_t n = 100000;
  unsigned char *data = malloc(n), *back = malloc(n);
  char path[128];
  um_buffer *f, *dst;
  void *p;
  cr_assert_not_null(data);
  cr_assert_not_null(back);
  make_tmpdir();
  snprintf(path, sizeof(path), "%s/ro.bin", tmpdir);
  ut_pattern(data, n, 61);
  write_file(path, data, n);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &f), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_buffer_size(f), n);
  cr_assert_eq(um_buffer_location(f), UM_HOST);
  cr_assert_eq(um_buffer_device(f), cpu);
  cr_assert_not_null(um_buffer_host_ptr(f));
  cr_assert_arr_eq(um_buffer_host_ptr(f), data, n, "zero-copy view of the file");
  cr_assert_eq(um_copy_to_host(f, 0, back, n, NULL), UM_OK);
  cr_assert_arr_eq(back, data, n);
  cr_assert_eq(um_alloc(m, cpu, n, UM_DEVICE, 0, &dst), UM_OK);
  cr_assert_eq(um_copy(dst, 0, f, 0, n, NULL), UM_OK);
  cr_assert_arr_eq(um_buffer_host_ptr(dst), data, n);
  cr_assert_eq(um_release(dst), UM_OK);
  /* read-only: every write is refused */
  cr_assert_eq(um_copy_from_host(f, 0, back, 10, NULL), UM_ESTATE);
  cr_assert_eq(um_fill(f, 0, 0, 10, NULL), UM_ESTATE);
  cr_assert_eq(um_map(f, UM_MAP_WRITE, 0, 10, &p), UM_ESTATE);
  cr_assert_eq(um_map(f, UM_MAP_READ, 10, 10, &p), UM_OK);
  cr_assert_eq(p, (char *)um_buffer_host_ptr(f) + 10);
  cr_assert_eq(um_unmap(f, p), UM_OK);
  cr_assert_eq(ut_stats(m, NULL).bytes_in_use, n);
  cr_assert_eq(um_release(f), UM_OK);
  read_file(path, back, n);
  cr_assert_arr_eq(back, data, n, "a read-only mapping changed the file");
  cr_assert_eq(ut_stats(m, NULL).bytes_in_use, 0);
  unlink(path);
  rmdir(tmpdir);
  free(data);
  free(back);
}

Test(wrap, map_file_read_write) {
  const size_t n = 3 * 4096 + 17;
  unsigned char *data = malloc(n), *back = malloc(n), patch[5000];
  char path[128];
  um_buffer *f;
  void *p;
  cr_assert_not_null(data);
  cr_assert_not_null(back);
  make_tmpdir();
  snprintf(path, sizeof(path), "%s/rw.bin", tmpdir);
  ut_pattern(data, n, 62);
  write_file(path, data, n);
  for (int mode = UM_MAP_WRITE; mode <= UM_MAP_WRITE_DISCARD; mode++) {
    cr_assert_eq(um_map_file(m, path, (um_map_mode)mode, &f), UM_OK, "%s", um_last_error());
    cr_assert_arr_eq(um_buffer_host_ptr(f), data, n, "mode %d maps the file's contents", mode);
    ut_pattern(patch, sizeof(patch), 63 + (uint64_t)mode);
    cr_assert_eq(um_copy_from_host(f, 1000, patch, sizeof(patch), NULL), UM_OK);
    memcpy(data + 1000, patch, sizeof(patch));
    cr_assert_eq(um_fill(f, n - 17, mode, 17, NULL), UM_OK);
    memset(data + n - 17, mode, 17);
    cr_assert_eq(um_map(f, UM_MAP_READ_WRITE, 0, 4, &p), UM_OK);
    memcpy(p, "UNIM", 4);
    memcpy(data, "UNIM", 4);
    cr_assert_eq(um_unmap(f, p), UM_OK);
    cr_assert_eq(um_release(f), UM_OK);
    /* the writes reached the file */
    read_file(path, back, n);
    cr_assert_arr_eq(back, data, n, "mode %d: the file lacks the writes", mode);
  }
  unlink(path);
  rmdir(tmpdir);
  free(data);
  free(back);
}

Test(wrap, map_file_errors) {
  char path[128];
  um_buffer *f = (um_buffer *)(uintptr_t)0x42;
  um_stats before = ut_stats(m, NULL), after;
  make_tmpdir();
  snprintf(path, sizeof(path), "%s/empty.bin", tmpdir);
  write_file(path, "", 0);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &f), UM_EINVAL, "an empty file");
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ_WRITE, &f), UM_EINVAL, "an empty file");
  unlink(path);
  cr_assert_eq(um_map_file(m, path, UM_MAP_READ, &f), UM_ENODEV, "a missing file");
  cr_assert_neq(um_last_error()[0], '\0');
  cr_assert_eq(um_map_file(m, tmpdir, UM_MAP_READ, &f), UM_EINVAL, "a directory");
  cr_assert_eq(f, (um_buffer *)(uintptr_t)0x42);
  after = ut_stats(m, NULL);
  ut_assert_stats_eq(&after, &before, "failed um_map_file calls");
  rmdir(tmpdir);
}
