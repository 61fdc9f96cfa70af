/* Misuse around memory the caller owns (SPEC section 5, amended):
 *  - Wrapped memory may be freed by its owner as soon as um_release of its
 *    wrap returns: releasing a wrap waits for the operations issued on it,
 *    on every path that reads or writes the caller's memory;
 *  - a UM_WRAP_READONLY wrap (and a file mapped for reading) refuses every
 *    write path with UM_ESTATE and changes nothing;
 *  - Files: um_map_file on anything but a regular file (FIFO, socket,
 *    device, directory) answers UM_EINVAL at once and never blocks; a
 *    symbolic link to a regular file is that file.
 * Each test runs in its own process under a timeout: a call that blocks
 * fails its test by the timeout instead of hanging the suite. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fault_backend.h"
#include "misuse_util.h"

static um_manager *m;
static um_device *cpu, *fdev, *fmap;

static void setup(void) {
  um_options o;
  ut_options(&o);
  fault_configure(1, 256u << 20);
  cr_assert_eq(fault_manager_create(&o, &m), UM_OK, "%s", um_last_error());
  cpu = um_device_get(m, 0);
  fdev = um_device_get(m, 1);
  fmap = um_device_get(m, 2);
}

static void teardown(void) {
  mu_gate_open();
  cr_assert_eq(um_manager_destroy(m), UM_OK, "%s", um_last_error());
}

TestSuite(wraps, .init = setup, .fini = teardown, .timeout = 60);
TestSuite(files, .init = setup, .fini = teardown, .timeout = 15);

static um_buffer *alloc_on(um_device *d, size_t n, um_location loc) {
  um_buffer *b = NULL;
  cr_assert_eq(um_alloc(m, d, n, loc, 0, &b), UM_OK, "%s", um_last_error());
  return b;
}

/* ------------------------------------------------------------------------ */
/* Release of a wrap waits for its operations */

/* Opens the gate once um_release(w) has begun (the wrap left the LIVE
 * state): with a correct library the release is then waiting for the held
 * operation; with a release that does not wait, the test sees the
 * operation unfinished when um_release returns. */
typedef struct opener {
  pthread_t t;
  um_buffer *w;
} opener;

static void *open_when_released(void *arg) {
  opener *o = arg;
  struct timespec deadline, now;
  mu_deadline(&deadline, MU_GATE_SECONDS);
  while (atomic_load(&o->w->state) == UM__BUF_LIVE) {
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec > deadline.tv_sec)
      break;
    sched_yield();
  }
  mu_gate_open();
  return NULL;
}

typedef enum {
  INTO_BY_COPY,      /* um_copy(wrap <- buffer) */
  INTO_FROM_HOST,    /* um_copy_from_host(wrap) */
  INTO_BY_FILL,      /* um_fill(wrap) */
  INTO_BY_BATCH,     /* um_copy_batch, wrap as a destination */
  OUT_OF_BY_COPY,    /* um_copy(buffer <- wrap): reads the caller's memory */
  OUT_OF_TO_HOST,    /* um_copy_to_host(wrap) */
  OUT_OF_BY_BATCH    /* um_copy_batch, wrap as a source */
} wrap_path;

static void release_waits(wrap_path path, um_device *other_dev, unsigned wrap_flags) {
  const size_t n = 8u << 20;
  unsigned char *mem = mu_malloc(n), *pattern = mu_malloc(n), *out = mu_malloc(n);
  um_buffer *other = alloc_on(other_dev, n, other_dev == cpu ? UM_HOST : UM_DEVICE), *w = NULL;
  um_event *e = NULL;
  um_copy_op op;
  opener o;
  int writes = path <= INTO_BY_BATCH, st, q;
  bool batch = path == INTO_BY_BATCH || path == OUT_OF_BY_BATCH, complete = true, idle;
  ut_pattern(pattern, n, 41);
  memset(mem, writes ? 0 : 0x5c, n);
  memset(out, 0, n);
  cr_assert_eq(um_copy_from_host(other, 0, pattern, n, NULL), UM_OK);
  cr_assert_eq(um_wrap_host(m, mem, n, wrap_flags, &w), UM_OK, "%s", um_last_error());
  mu_gate_close(m);
  switch (path) {
  case INTO_BY_COPY: cr_assert_eq(um_copy(w, 0, other, 0, n, &e), UM_OK); break;
  case INTO_FROM_HOST: cr_assert_eq(um_copy_from_host(w, 0, pattern, n, &e), UM_OK); break;
  case INTO_BY_FILL: cr_assert_eq(um_fill(w, 0, 0x5c, n, &e), UM_OK); break;
  case INTO_BY_BATCH:
    op = (um_copy_op){.dst = w, .src = other, .bytes = n};
    cr_assert_eq(um_copy_batch(m, &op, 1, &e), UM_OK);
    break;
  case OUT_OF_BY_COPY: cr_assert_eq(um_copy(other, 0, w, 0, n, &e), UM_OK); break;
  case OUT_OF_TO_HOST: cr_assert_eq(um_copy_to_host(w, 0, out, n, &e), UM_OK); break;
  case OUT_OF_BY_BATCH:
    op = (um_copy_op){.host_dst = out, .src = w, .bytes = n};
    cr_assert_eq(um_copy_batch(m, &op, 1, &e), UM_OK);
    break;
  }
  o.w = w;
  cr_assert_eq(pthread_create(&o.t, NULL, open_when_released, &o), 0);
  /* No assertion until the opener is joined: it reads o and w. */
  st = um_release(w);
  q = um_event_query(e);
  /* The wrap's own count of operations not finished (a batch's event
   * completes just after its last member, so for batches this is the
   * figure that says whether the release waited). */
  pthread_mutex_lock(&w->lock);
  idle = w->pending == 0;
  pthread_mutex_unlock(&w->lock);
  if (path == INTO_BY_FILL)
    complete = ut_all_bytes(mem, n, 0x5c);
  else if (writes)
    complete = memcmp(mem, pattern, n) == 0;
  if (idle) {
    /* The owner takes its memory back; under ASan, a late access by the
     * operation would be a use after free. */
    memset(mem, 0xee, n);
    free(mem);
  } /* else: kept, the operation still runs on it */
  pthread_join(o.t, NULL);
  cr_assert_eq(st, UM_OK, "%s", um_err_name(st));
  cr_assert(idle, "um_release of a wrap returned while operations on the caller's memory were pending");
  if (!batch)
    cr_assert_eq(q, UM_OK, "um_release of a wrap returned while an operation on the caller's memory was %s",
                 q == UM_EAGAIN ? "still pending" : um_err_name(q));
  cr_assert(complete, "um_release of a wrap returned before the write into it was complete");
  cr_assert_eq(um_event_wait(e), UM_OK);
  cr_assert_eq(um_event_release(e), UM_OK);
  if (path == OUT_OF_BY_COPY) {
    cr_assert_eq(um_copy_to_host(other, 0, out, n, NULL), UM_OK);
    cr_assert(ut_all_bytes(out, n, 0x5c), "the copy read memory the owner had taken back");
  } else if (path == OUT_OF_TO_HOST || path == OUT_OF_BY_BATCH) {
    cr_assert(ut_all_bytes(out, n, 0x5c), "the copy read memory the owner had taken back");
  }
  cr_assert_eq(um_release(other), UM_OK);
  free(pattern);
  free(out);
}

Test(wraps, release_waits_copy_into) { release_waits(INTO_BY_COPY, cpu, 0); }
Test(wraps, release_waits_copy_from_host_into) { release_waits(INTO_FROM_HOST, cpu, 0); }
Test(wraps, release_waits_fill) { release_waits(INTO_BY_FILL, cpu, 0); }
Test(wraps, release_waits_batch_into) { release_waits(INTO_BY_BATCH, cpu, 0); }
Test(wraps, release_waits_copy_out_of) { release_waits(OUT_OF_BY_COPY, cpu, 0); }
Test(wraps, release_waits_copy_to_host_out_of) { release_waits(OUT_OF_TO_HOST, cpu, 0); }
Test(wraps, release_waits_batch_out_of) { release_waits(OUT_OF_BY_BATCH, cpu, 0); }
/* The same against device memory (the fault device's queue or staging) and
 * with a page-locked wrap. */
Test(wraps, release_waits_device_into) { release_waits(INTO_BY_COPY, fdev, 0); }
Test(wraps, release_waits_device_out_of) { release_waits(OUT_OF_BY_COPY, fdev, 0); }
Test(wraps, release_waits_mapped_device_into) { release_waits(INTO_BY_COPY, fmap, 0); }
Test(wraps, release_waits_pinned_wrap_into) { release_waits(INTO_BY_COPY, cpu, UM_WRAP_PIN); }
Test(wraps, release_waits_pinned_wrap_out_of) { release_waits(OUT_OF_BY_COPY, fdev, UM_WRAP_PIN); }

/* ------------------------------------------------------------------------ */
/* Read-only memory: every write path answers UM_ESTATE */

static void expect_write_refused(um_buffer *ro, const unsigned char *mem, size_t n) {
  unsigned char *keep = mu_malloc(n), src[64];
  um_buffer *h = alloc_on(cpu, n, UM_HOST), *d = alloc_on(fdev, n, UM_DEVICE), *dm = alloc_on(fmap, n, UM_DEVICE);
  void *p = MU_SENTINEL;
  um_event *e = MU_SENTINEL;
  um_copy_op ops[2];
  memcpy(keep, mem, n);
  memset(src, 0x77, sizeof(src));
  cr_assert_eq(um_fill(h, 0, 0x33, n, NULL), UM_OK);
  cr_assert_eq(um_fill(d, 0, 0x44, n, NULL), UM_OK);
  cr_assert_eq(um_fill(dm, 0, 0x55, n, NULL), UM_OK);
  MU_FAILS(m, UM_ESTATE, um_copy_from_host(ro, 0, src, sizeof(src), NULL));
  MU_FAILS(m, UM_ESTATE, um_copy_from_host(ro, 0, src, sizeof(src), &e));
  MU_FAILS(m, UM_ESTATE, um_copy(ro, 0, h, 0, 64, NULL));
  MU_FAILS(m, UM_ESTATE, um_copy(ro, 0, d, 0, 64, &e));
  MU_FAILS(m, UM_ESTATE, um_copy(ro, 0, dm, 0, 64, NULL));
  MU_FAILS(m, UM_ESTATE, um_copy(ro, 0, ro, 64, 64, &e));
  MU_FAILS(m, UM_ESTATE, um_fill(ro, 0, 0, n, NULL));
  MU_FAILS(m, UM_ESTATE, um_fill(ro, 1, 0, 1, &e));
  MU_FAILS(m, UM_ESTATE, um_map(ro, UM_MAP_WRITE, 0, n, &p));
  MU_FAILS(m, UM_ESTATE, um_map(ro, UM_MAP_READ_WRITE, 0, 1, &p));
  MU_FAILS(m, UM_ESTATE, um_map(ro, UM_MAP_WRITE_DISCARD, 0, n, &p));
  ops[0] = (um_copy_op){.dst = h, .host_src = src, .bytes = 64}; /* good: must not run */
  ops[1] = (um_copy_op){.dst = ro, .host_src = src, .bytes = 64};
  MU_FAILS(m, UM_ESTATE, um_copy_batch(m, ops, 2, NULL));
  ops[1] = (um_copy_op){.dst = ro, .src = d, .bytes = 64};
  MU_FAILS(m, UM_ESTATE, um_copy_batch(m, ops, 2, &e));
  ops[1] = (um_copy_op){.dst = ro, .src = h, .bytes = 64};
  MU_FAILS(m, UM_ESTATE, um_copy_batch(m, &ops[1], 1, NULL));
  cr_assert_eq(p, MU_SENTINEL);
  cr_assert_eq(e, MU_SENTINEL);
  cr_assert_arr_eq(mem, keep, n, "read-only memory was written");
  cr_assert(ut_all_bytes(um_buffer_host_ptr(h), n, 0x33), "the good op of a refused batch ran");
  /* Reading works on every path. */
  cr_assert_eq(um_map(ro, UM_MAP_READ, 0, n, &p), UM_OK);
  cr_assert_arr_eq(p, keep, n);
  cr_assert_eq(um_unmap(ro, p), UM_OK);
  cr_assert_eq(um_copy(d, 0, ro, 0, n, NULL), UM_OK);
  cr_assert_eq(um_copy(h, 0, d, 0, n, NULL), UM_OK);
  cr_assert_arr_eq(um_buffer_host_ptr(h), keep, n);
  cr_assert_eq(um_release(h), UM_OK);
  cr_assert_eq(um_release(d), UM_OK);
  cr_assert_eq(um_release(dm), UM_OK);
  free(keep);
}

Test(wraps, readonly_every_write_path) {
  const unsigned flags[] = {UM_WRAP_READONLY, UM_WRAP_READONLY | UM_WRAP_PIN};
  for (int i = 0; i < 2; i++) {
    unsigned char *mem = mu_malloc(4096);
    um_buffer *ro = NULL;
    ut_pattern(mem, 4096, 51 + (uint64_t)i);
    cr_assert_eq(um_wrap_host(m, mem, 4096, flags[i], &ro), UM_OK, "%s", um_last_error());
    expect_write_refused(ro, mem, 4096);
    cr_assert_eq(um_release(ro), UM_OK);
    free(mem);
  }
}

/* ------------------------------------------------------------------------ */
/* Files */

static char dir[256];

static void make_dir(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof(dir), "%s/unimem-misuse-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static const char *in_dir(const char *name) {
  static char path[2][320];
  static int turn;
  turn ^= 1;
  snprintf(path[turn], sizeof(path[0]), "%s/%s", dir, name);
  return path[turn];
}

static void remove_dir(void) {
  const char *names[] = {"fifo", "file", "empty", "link", "fifo-link", "dangling", "socket", "sub"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    unlink(in_dir(names[i]));
    rmdir(in_dir(names[i]));
  }
  rmdir(dir);
}

static void write_file(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  cr_assert_eq(write(fd, data, n), (ssize_t)n);
  close(fd);
}

/* um_map_file(path, mode) is refused with exactly code, at once. */
static void expect_map_file(const char *path, um_map_mode mode, int code) {
  um_buffer *b = MU_SENTINEL;
  MU_FAILS(m, code, um_map_file(m, path, mode, &b));
  cr_assert_eq(b, MU_SENTINEL);
}

static const um_map_mode all_modes[] = {UM_MAP_READ, UM_MAP_WRITE, UM_MAP_READ_WRITE, UM_MAP_WRITE_DISCARD};

/* A FIFO with no writer: open(O_RDONLY) would block until one comes. */
Test(files, fifo_read_never_blocks) {
  make_dir();
  cr_assert_eq(mkfifo(in_dir("fifo"), 0600), 0, "mkfifo: %s", strerror(errno));
  expect_map_file(in_dir("fifo"), UM_MAP_READ, UM_EINVAL);
  remove_dir();
}

Test(files, fifo_writable_modes) {
  make_dir();
  cr_assert_eq(mkfifo(in_dir("fifo"), 0600), 0, "mkfifo: %s", strerror(errno));
  for (int i = 1; i < 4; i++)
    expect_map_file(in_dir("fifo"), all_modes[i], UM_EINVAL);
  remove_dir();
}

Test(files, symlink_to_fifo_never_blocks) {
  make_dir();
  cr_assert_eq(mkfifo(in_dir("fifo"), 0600), 0, "mkfifo: %s", strerror(errno));
  cr_assert_eq(symlink(in_dir("fifo"), in_dir("fifo-link")), 0);
  expect_map_file(in_dir("fifo-link"), UM_MAP_READ, UM_EINVAL);
  remove_dir();
}

Test(files, directory) {
  make_dir();
  cr_assert_eq(mkdir(in_dir("sub"), 0700), 0);
  for (int i = 0; i < 4; i++) {
    expect_map_file(in_dir("sub"), all_modes[i], UM_EINVAL);
    expect_map_file("/", all_modes[i], UM_EINVAL);
  }
  remove_dir();
}

Test(files, character_device) {
  for (int i = 0; i < 4; i++) {
    expect_map_file("/dev/null", all_modes[i], UM_EINVAL);
    expect_map_file("/dev/zero", all_modes[i], UM_EINVAL);
  }
}

Test(files, socket) {
  struct sockaddr_un addr;
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  make_dir();
  cr_assert_geq(s, 0);
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  cr_assert_lt(strlen(in_dir("socket")), sizeof(addr.sun_path), "temporary path too long for a socket");
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", in_dir("socket"));
  cr_assert_eq(bind(s, (struct sockaddr *)&addr, sizeof(addr)), 0, "bind: %s", strerror(errno));
  cr_assert_eq(listen(s, 1), 0);
  for (int i = 0; i < 4; i++)
    expect_map_file(in_dir("socket"), all_modes[i], UM_EINVAL);
  close(s);
  remove_dir();
}

Test(files, empty_and_sizeless_files) {
  make_dir();
  write_file(in_dir("empty"), "", 0);
  for (int i = 0; i < 4; i++)
    expect_map_file(in_dir("empty"), all_modes[i], UM_EINVAL);
  /* /proc files are regular and say they hold nothing */
  expect_map_file("/proc/self/status", UM_MAP_READ, UM_EINVAL);
  remove_dir();
}

Test(files, dangling_symlink) {
  make_dir();
  cr_assert_eq(symlink(in_dir("nothing-here"), in_dir("dangling")), 0);
  expect_map_file(in_dir("dangling"), UM_MAP_READ, UM_ENODEV);
  remove_dir();
}

/* A symbolic link to a regular file is that file, for reading and for
 * writing through. */
Test(files, symlink_to_regular_file) {
  unsigned char data[10000], back[10000], patch[100];
  um_buffer *b = NULL;
  int fd;
  make_dir();
  ut_pattern(data, sizeof(data), 61);
  write_file(in_dir("file"), data, sizeof(data));
  cr_assert_eq(symlink(in_dir("file"), in_dir("link")), 0);
  cr_assert_eq(um_map_file(m, in_dir("link"), UM_MAP_READ, &b), UM_OK, "%s", um_last_error());
  cr_assert_eq(um_buffer_size(b), sizeof(data));
  cr_assert_arr_eq(um_buffer_host_ptr(b), data, sizeof(data));
  cr_assert_eq(um_release(b), UM_OK);
  cr_assert_eq(um_map_file(m, in_dir("link"), UM_MAP_READ_WRITE, &b), UM_OK, "%s", um_last_error());
  memset(patch, 0xab, sizeof(patch));
  cr_assert_eq(um_copy_from_host(b, 500, patch, sizeof(patch), NULL), UM_OK);
  cr_assert_eq(um_release(b), UM_OK);
  fd = open(in_dir("file"), O_RDONLY);
  cr_assert_geq(fd, 0);
  cr_assert_eq(read(fd, back, sizeof(back)), (ssize_t)sizeof(back));
  close(fd);
  memcpy(data + 500, patch, sizeof(patch));
  cr_assert_arr_eq(back, data, sizeof(data), "the write through the link did not reach the file");
  remove_dir();
}

/* A file mapped for reading is read-only memory like a read-only wrap. */
Test(files, read_mapping_refuses_every_write) {
  unsigned char data[4096], back[4096];
  um_buffer *b = NULL;
  int fd;
  make_dir();
  ut_pattern(data, sizeof(data), 62);
  write_file(in_dir("file"), data, sizeof(data));
  cr_assert_eq(um_map_file(m, in_dir("file"), UM_MAP_READ, &b), UM_OK, "%s", um_last_error());
  expect_write_refused(b, um_buffer_host_ptr(b), sizeof(data));
  cr_assert_eq(um_release(b), UM_OK);
  fd = open(in_dir("file"), O_RDONLY);
  cr_assert_geq(fd, 0);
  cr_assert_eq(read(fd, back, sizeof(back)), (ssize_t)sizeof(back));
  close(fd);
  cr_assert_arr_eq(back, data, sizeof(data), "the file changed");
  remove_dir();
}
