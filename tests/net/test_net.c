/* um_net data path between forked processes: put and get of 4 KiB to
 * 64 MiB between two and three processes, ordering with local copies on the
 * same buffer, and device buffers (PoCL) through pinned staging.
 *
 * CTest runs this file once per UCX transport here (UCX_TLS=tcp over lo,
 * posix, sysv, cma): tests/CMakeLists.txt. */
#include "net_util.h"

#define BIG (64u << 20)

/* Sizes of the two-process test; odd ones cross staging chunks and steps
 * at unaligned places. */
static const size_t sizes[] = {4096, 65536 + 3, 1u << 20, (16u << 20) + 5, BIG};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
/* Where the issuer writes into the target's buffer: not page aligned. */
#define PUT_OFF 123

/* ------------------------------------------------------------------------ */
/* Two processes: the target exposes a buffer and waits; the issuer puts a
 * pattern per size, the target checks it, the issuer gets it back. */

static int two_target(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  nt_peer p;
  um_buffer *b;
  um_endpoint *ep;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), BIG + PUT_OFF, UM_HOST, 0, &b));
  nt_send_key(fd, b);
  for (size_t k = 0; k < NSIZES; k++) {
    size_t bad;
    nt_expect(fd, 'p');
    /* Nothing was called on this side: the progress thread took the put. */
    bad = nt_mismatch((char *)um_buffer_host_ptr(b) + PUT_OFF, sizes[k], (unsigned)k + 1, 0);
    NT_CHECK(bad == sizes[k], "size %zu: byte %zu differs", sizes[k], bad);
    nt_signal(fd, 'k');
  }
  nt_expect(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(b));
  nt_close(&p);
  return 0;
}

static int two_issuer(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  unsigned char key[4096];
  size_t klen;
  nt_peer p;
  um_buffer *src, *dst;
  um_endpoint *ep;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  klen = nt_recv(fd, key, sizeof(key));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), BIG, UM_HOST, 0, &src));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), BIG, UM_HOST, 0, &dst));
  for (size_t k = 0; k < NSIZES; k++) {
    size_t n = sizes[k], bad;
    um_event *e = NULL;
    nt_fill(um_buffer_host_ptr(src), n, (unsigned)k + 1, 0);
    /* Blocking for even sizes, with an event for odd ones. */
    if (k % 2 == 0) {
      NT_OK(um_net_put(ep, src, 0, key, klen, PUT_OFF, n, NULL));
    } else {
      NT_OK(um_net_put(ep, src, 0, key, klen, PUT_OFF, n, &e));
      NT_OK(um_event_wait(e));
      um_event_release(e);
    }
    nt_signal(fd, 'p');
    nt_expect(fd, 'k');
    memset(um_buffer_host_ptr(dst), 0, n);
    NT_OK(um_net_get(ep, dst, 0, key, klen, PUT_OFF, n, NULL));
    bad = nt_mismatch(um_buffer_host_ptr(dst), n, (unsigned)k + 1, 0);
    NT_CHECK(bad == n, "get of %zu bytes: byte %zu differs", n, bad);
  }
  nt_signal(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(src));
  NT_OK(um_release(dst));
  nt_close(&p);
  return 0;
}

Test(net, two_processes_put_get, .timeout = 280) {
  int fds[2];
  pid_t pids[2];
  cr_assert_eq(nb_pair(fds), 0);
  pids[0] = nt_spawn(two_target, 0, fds);
  pids[1] = nt_spawn(two_issuer, 1, fds);
  close(fds[0]);
  close(fds[1]);
  nt_reap_all(pids, 2, 270);
}

/* ------------------------------------------------------------------------ */
/* The same with buffers of um_net_alloc: the target exposes one (on
 * shared memory, a segment the issuer maps), the issuer puts from one for
 * even sizes and from a buffer of um_alloc for odd ones, and gets into
 * one. The target's um_net_destroy is refused while its buffer lives. */

static int alloc_target(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  nt_peer p;
  um_buffer *b;
  um_endpoint *ep;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  NT_OK(um_net_alloc(p.net, BIG + PUT_OFF, UM_ALLOC_ZERO, &b));
  NT_CHECK(um_buffer_device(b) == um_device_get(p.m, 0) && um_buffer_location(b) == UM_HOST,
           "a HOST buffer of device 0");
  {
    static const unsigned char zero[4096];
    for (size_t off = 0; off < BIG + PUT_OFF; off += sizeof(zero)) {
      size_t n = BIG + PUT_OFF - off < sizeof(zero) ? BIG + PUT_OFF - off : sizeof(zero);
      NT_CHECK(memcmp((char *)um_buffer_host_ptr(b) + off, zero, n) == 0, "UM_ALLOC_ZERO: at %zu", off);
    }
  }
  nt_send_key(fd, b);
  for (size_t k = 0; k < NSIZES; k++) {
    size_t bad;
    nt_expect(fd, 'p');
    bad = nt_mismatch((char *)um_buffer_host_ptr(b) + PUT_OFF, sizes[k], (unsigned)k + 11, 0);
    NT_CHECK(bad == sizes[k], "size %zu: byte %zu differs", sizes[k], bad);
    nt_signal(fd, 'k');
  }
  nt_expect(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_CHECK(um_net_destroy(p.net) == UM_EBUSY, "destroy with a live buffer of um_net_alloc");
  NT_OK(um_release(b));
  nt_close(&p);
  return 0;
}

static int alloc_issuer(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  unsigned char key[4096];
  size_t klen;
  nt_peer p;
  um_buffer *src_net, *src_pool, *dst;
  um_endpoint *ep;
  um_stats before, after;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  klen = nt_recv(fd, key, sizeof(key));
  NT_OK(um_net_alloc(p.net, BIG, 0, &src_net));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), BIG, UM_HOST, 0, &src_pool));
  NT_OK(um_net_alloc(p.net, BIG, 0, &dst));
  NT_OK(um_stats_get(p.m, um_device_get(p.m, 0), &before));
  for (size_t k = 0; k < NSIZES; k++) {
    size_t n = sizes[k], bad;
    um_buffer *src = k % 2 == 0 ? src_net : src_pool;
    um_event *e = NULL;
    nt_fill(um_buffer_host_ptr(src), n, (unsigned)k + 11, 0);
    NT_OK(um_net_put(ep, src, 0, key, klen, PUT_OFF, n, &e));
    NT_OK(um_event_wait(e));
    um_event_release(e);
    nt_signal(fd, 'p');
    nt_expect(fd, 'k');
    memset(um_buffer_host_ptr(dst), 0, n);
    NT_OK(um_net_get(ep, dst, 0, key, klen, PUT_OFF, n, NULL));
    bad = nt_mismatch(um_buffer_host_ptr(dst), n, (unsigned)k + 11, 0);
    NT_CHECK(bad == n, "get of %zu bytes: byte %zu differs", n, bad);
  }
  NT_OK(um_stats_get(p.m, um_device_get(p.m, 0), &after));
  {
    uint64_t total = 0;
    for (size_t k = 0; k < NSIZES; k++)
      total += sizes[k];
    NT_CHECK(after.bytes_net_out - before.bytes_net_out == total && after.bytes_net_in - before.bytes_net_in == total &&
                 after.xfer_net - before.xfer_net == 2 * NSIZES,
             "net statistics: out %llu, in %llu, transfers %llu",
             (unsigned long long)(after.bytes_net_out - before.bytes_net_out),
             (unsigned long long)(after.bytes_net_in - before.bytes_net_in),
             (unsigned long long)(after.xfer_net - before.xfer_net));
    NT_CHECK(after.active_buffers == 3 && after.bytes_in_use == 3ull * BIG, "three live buffers: %llu, %llu bytes",
             (unsigned long long)after.active_buffers, (unsigned long long)after.bytes_in_use);
  }
  nt_signal(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(src_net));
  NT_OK(um_release(src_pool));
  NT_OK(um_release(dst));
  NT_OK(um_stats_get(p.m, um_device_get(p.m, 0), &after));
  NT_CHECK(after.active_buffers == 0 && after.bytes_in_use == 0 && after.releases == 3 && after.allocations == 3,
           "all released: %llu live, %llu bytes", (unsigned long long)after.active_buffers,
           (unsigned long long)after.bytes_in_use);
  nt_close(&p);
  return 0;
}

Test(net, two_processes_net_alloc, .timeout = 280) {
  int fds[2];
  pid_t pids[2];
  cr_assert_eq(nb_pair(fds), 0);
  pids[0] = nt_spawn(alloc_target, 0, fds);
  pids[1] = nt_spawn(alloc_issuer, 1, fds);
  close(fds[0]);
  close(fds[1]);
  nt_reap_all(pids, 2, 270);
}

/* ------------------------------------------------------------------------ */
/* Three processes in a ring: each puts into the next one's buffer and gets
 * from the previous one's, all at once. */

#define RING 3
#define RING_BYTES ((4u << 20) + 1)

typedef struct ring_links {
  int fd[RING][2]; /* link i joins process i ([0]) and process i+1 ([1]) */
} ring_links;

static int ring_peer(int idx, void *arg) {
  ring_links *l = arg;
  int next = l->fd[idx][0], prev = l->fd[(idx + RING - 1) % RING][1];
  unsigned char key[4096];
  size_t klen, bad;
  nt_peer p;
  um_buffer *b, *got;
  um_endpoint *to_next, *to_prev;
  um_event *e[2];
  nt_open(&p, 20000);
  /* Address exchange in a fixed order on each link: the lower index first. */
  to_next = idx == 0 ? nt_connect(&p, next) : NULL;
  to_prev = nt_connect(&p, prev);
  if (to_next == NULL)
    to_next = nt_connect(&p, next);
  /* [0, n) receives the previous process's put; [n, 2n) holds our pattern. */
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), 2 * RING_BYTES, UM_HOST, 0, &b));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), RING_BYTES, UM_HOST, 0, &got));
  nt_fill((char *)um_buffer_host_ptr(b) + RING_BYTES, RING_BYTES, 100u + (unsigned)idx, 0);
  nt_send_key(prev, b); /* the previous one puts here and gets from here */
  klen = nt_recv(next, key, sizeof(key));
  NT_OK(um_net_put(to_next, b, RING_BYTES, key, klen, 0, RING_BYTES, &e[0]));
  NT_OK(um_net_get(to_next, got, 0, key, klen, RING_BYTES, RING_BYTES, &e[1]));
  NT_OK(um_event_wait(e[0]));
  NT_OK(um_event_wait(e[1]));
  um_event_release(e[0]);
  um_event_release(e[1]);
  bad = nt_mismatch(um_buffer_host_ptr(got), RING_BYTES, 100u + (unsigned)(idx + 1) % RING, 0);
  NT_CHECK(bad == RING_BYTES, "get from the next process: byte %zu differs", bad);
  nt_signal(next, 'd'); /* our put into next is complete */
  nt_expect(prev, 'd');
  bad = nt_mismatch(um_buffer_host_ptr(b), RING_BYTES, 100u + (unsigned)(idx + RING - 1) % RING, 0);
  NT_CHECK(bad == RING_BYTES, "put from the previous process: byte %zu differs", bad);
  /* Nobody leaves while a neighbour may still read from it. */
  nt_signal(next, 'q');
  nt_signal(prev, 'q');
  nt_expect(next, 'q');
  nt_expect(prev, 'q');
  NT_OK(um_endpoint_close(to_next));
  NT_OK(um_endpoint_close(to_prev));
  NT_OK(um_release(b));
  NT_OK(um_release(got));
  nt_close(&p);
  return 0;
}

Test(net, three_processes_ring, .timeout = 200) {
  ring_links l;
  pid_t pids[RING];
  for (int i = 0; i < RING; i++)
    cr_assert_eq(nb_pair(l.fd[i]), 0);
  for (int i = 0; i < RING; i++)
    pids[i] = nt_spawn(ring_peer, i, &l);
  for (int i = 0; i < RING; i++) {
    close(l.fd[i][0]);
    close(l.fd[i][1]);
  }
  nt_reap_all(pids, RING, 190);
}

/* ------------------------------------------------------------------------ */
/* Ordering with local copies on the same buffer: a put sends what the copy
 * issued before it wrote, a copy issued after a put does not change what
 * the put sends, and a copy to host after a get reads what the get brought. */

#define ORD_BYTES (1u << 20) /* above the inline-copy size: copies run on workers */

static int order_target(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  nt_peer p;
  um_buffer *b;
  um_endpoint *ep;
  size_t bad;
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), 2 * ORD_BYTES, UM_HOST, UM_ALLOC_ZERO, &b));
  nt_send_key(fd, b);
  nt_expect(fd, 'p');
  bad = nt_mismatch(um_buffer_host_ptr(b), ORD_BYTES, 1, 0);
  NT_CHECK(bad == ORD_BYTES, "first put: byte %zu differs", bad);
  bad = nt_mismatch((char *)um_buffer_host_ptr(b) + ORD_BYTES, ORD_BYTES, 2, ORD_BYTES);
  NT_CHECK(bad == ORD_BYTES, "second put: byte %zu differs", bad);
  nt_signal(fd, 'k');
  nt_expect(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(b));
  nt_close(&p);
  return 0;
}

static int order_issuer(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  unsigned char key[4096];
  unsigned char *p1 = malloc(ORD_BYTES), *p2 = malloc(ORD_BYTES), *back = malloc(2 * ORD_BYTES);
  size_t klen, bad;
  nt_peer p;
  um_buffer *src, *dst;
  um_endpoint *ep;
  um_event *e[6];
  NT_CHECK(p1 && p2 && back, "malloc");
  nt_fill(p1, ORD_BYTES, 1, 0);
  nt_fill(p2, ORD_BYTES, 2, ORD_BYTES);
  nt_open(&p, 20000);
  ep = nt_connect(&p, fd);
  klen = nt_recv(fd, key, sizeof(key));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), ORD_BYTES, UM_HOST, UM_ALLOC_ZERO, &src));
  NT_OK(um_alloc(p.m, um_device_get(p.m, 0), 2 * ORD_BYTES, UM_HOST, UM_ALLOC_ZERO, &dst));
  /* Four operations on src issued before any is waited for: each put
   * sends what the copy before it wrote, and the second copy waits for
   * the first put to have read src. */
  NT_OK(um_copy_from_host(src, 0, p1, ORD_BYTES, &e[0]));
  NT_OK(um_net_put(ep, src, 0, key, klen, 0, ORD_BYTES, &e[1]));
  NT_OK(um_copy_from_host(src, 0, p2, ORD_BYTES, &e[2]));
  NT_OK(um_net_put(ep, src, 0, key, klen, ORD_BYTES, ORD_BYTES, &e[3]));
  /* Operations on different buffers are not ordered: the remote range is
   * complete once the second put is. */
  NT_OK(um_event_wait(e[3]));
  /* Two on dst: the copy to host reads what the get brought. */
  NT_OK(um_net_get(ep, dst, 0, key, klen, 0, 2 * ORD_BYTES, &e[4]));
  NT_OK(um_copy_to_host(dst, 0, back, 2 * ORD_BYTES, &e[5]));
  NT_OK(um_event_wait(e[5]));
  for (int i = 0; i < 6; i++) {
    NT_OK(um_event_wait(e[i]));
    um_event_release(e[i]);
  }
  bad = nt_mismatch(back, ORD_BYTES, 1, 0);
  NT_CHECK(bad == ORD_BYTES, "get then copy to host: byte %zu differs", bad);
  bad = nt_mismatch(back + ORD_BYTES, ORD_BYTES, 2, ORD_BYTES);
  NT_CHECK(bad == ORD_BYTES, "get then copy to host (second half): byte %zu differs", bad);
  nt_signal(fd, 'p');
  nt_expect(fd, 'k');
  nt_signal(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(src));
  NT_OK(um_release(dst));
  nt_close(&p);
  free(p1);
  free(p2);
  free(back);
  return 0;
}

Test(net, ordering_with_local_copies, .timeout = 200) {
  int fds[2];
  pid_t pids[2];
  cr_assert_eq(nb_pair(fds), 0);
  pids[0] = nt_spawn(order_target, 0, fds);
  pids[1] = nt_spawn(order_issuer, 1, fds);
  close(fds[0]);
  close(fds[1]);
  nt_reap_all(pids, 2, 190);
}

/* ------------------------------------------------------------------------ */
/* Device buffers on PoCL: a DEVICE buffer of process A (no host view: it
 * goes through pinned staging chunks) is put into an OpenCL buffer of
 * process B (PINNED: exposed directly), and got back into another DEVICE
 * buffer. Statistics count the staging copies exactly. */

#define DEV_BYTES ((1u << 20) + 4097) /* 5 staging chunks of 256 KiB, the last short */

/* The first OpenCL device of p's manager, or exit with NT_SKIP. */
static um_device *nt_opencl_device(nt_peer *p) {
  for (int i = 1; i < um_device_count(p->m); i++) {
    um_device_info info;
    NT_OK(um_device_info_get(um_device_get(p->m, i), &info));
    if (strcmp(info.backend, "opencl") == 0)
      return um_device_get(p->m, i);
  }
  fprintf(stderr, "[pid %d] no OpenCL device here\n", (int)getpid());
  nt_exit(NT_SKIP);
  return NULL;
}

static void nt_open_opencl(nt_peer *p) {
  um_options o;
  nt_options(&o, "cpu,opencl", 20000);
  nt_open_opts(p, &o);
}

static int dev_target(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  unsigned char blob[4096];
  size_t len = sizeof(blob), bad;
  nt_peer p;
  um_device *cl;
  um_buffer *pinned, *devbuf;
  um_endpoint *ep;
  nt_open_opencl(&p);
  cl = nt_opencl_device(&p);
  ep = nt_connect(&p, fd);
  NT_OK(um_alloc(p.m, cl, DEV_BYTES, UM_DEVICE, 0, &devbuf));
  NT_CHECK(um_net_expose(devbuf, blob, &len) == UM_ENOTSUP, "expose of a DEVICE buffer");
  NT_OK(um_alloc(p.m, cl, DEV_BYTES, UM_PINNED, UM_ALLOC_ZERO, &pinned));
  nt_send_key(fd, pinned);
  nt_expect(fd, 'p');
  bad = nt_mismatch(um_buffer_host_ptr(pinned), DEV_BYTES, 7, 0);
  NT_CHECK(bad == DEV_BYTES, "put from a device buffer: byte %zu differs", bad);
  nt_signal(fd, 'k');
  nt_expect(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(pinned));
  NT_OK(um_release(devbuf));
  nt_close(&p);
  return 0;
}

static int dev_issuer(int idx, void *arg) {
  int fd = ((int *)arg)[idx];
  unsigned char key[4096], *host = malloc(DEV_BYTES), *back = malloc(DEV_BYTES);
  size_t klen, bad;
  nt_peer p;
  um_device *cl;
  um_buffer *src, *dst;
  um_endpoint *ep;
  um_event *e[2];
  um_stats before, after;
  NT_CHECK(host && back, "malloc");
  nt_fill(host, DEV_BYTES, 7, 0);
  nt_open_opencl(&p);
  cl = nt_opencl_device(&p);
  ep = nt_connect(&p, fd);
  klen = nt_recv(fd, key, sizeof(key));
  NT_OK(um_alloc(p.m, cl, DEV_BYTES, UM_DEVICE, 0, &src));
  NT_OK(um_alloc(p.m, cl, DEV_BYTES, UM_DEVICE, 0, &dst));
  NT_CHECK(um_buffer_host_ptr(src) == NULL, "a PoCL DEVICE buffer has no host view");
  NT_OK(um_stats_get(p.m, cl, &before));
  /* The put is ordered after the copy that fills src. */
  NT_OK(um_copy_from_host(src, 0, host, DEV_BYTES, &e[0]));
  NT_OK(um_net_put(ep, src, 0, key, klen, 0, DEV_BYTES, &e[1]));
  NT_OK(um_event_wait(e[1]));
  NT_OK(um_event_wait(e[0]));
  um_event_release(e[0]);
  um_event_release(e[1]);
  nt_signal(fd, 'p');
  nt_expect(fd, 'k');
  NT_OK(um_net_get(ep, dst, 0, key, klen, 0, DEV_BYTES, NULL));
  NT_OK(um_copy_to_host(dst, 0, back, DEV_BYTES, NULL));
  bad = nt_mismatch(back, DEV_BYTES, 7, 0);
  NT_CHECK(bad == DEV_BYTES, "get into a device buffer: byte %zu differs", bad);
  NT_OK(um_stats_get(p.m, cl, &after));
  /* copy in + the put's staging out; the get's staging in + copy out. */
  NT_CHECK(after.bytes_h2d - before.bytes_h2d == 2ull * DEV_BYTES, "bytes_h2d moved by %llu",
           (unsigned long long)(after.bytes_h2d - before.bytes_h2d));
  NT_CHECK(after.bytes_d2h - before.bytes_d2h == 2ull * DEV_BYTES, "bytes_d2h moved by %llu",
           (unsigned long long)(after.bytes_d2h - before.bytes_d2h));
  nt_signal(fd, 'q');
  NT_OK(um_endpoint_close(ep));
  NT_OK(um_release(src));
  NT_OK(um_release(dst));
  nt_close(&p);
  free(host);
  free(back);
  return 0;
}

Test(net, opencl_device_buffers, .timeout = 200) {
  int fds[2];
  pid_t pids[2];
  cr_assert_eq(nb_pair(fds), 0);
  pids[0] = nt_spawn(dev_target, 0, fds);
  pids[1] = nt_spawn(dev_issuer, 1, fds);
  close(fds[0]);
  close(fds[1]);
  nt_reap_all(pids, 2, 190);
}
