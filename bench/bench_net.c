/* um_net put and get between two forked processes, next to ucx_perftest
 * on the same transport in the same run (SPEC §6: put/get of >= 1 MiB at
 * >= 0.9x ucx_perftest).
 *
 *   bench_net [--quick]        (UCX_TLS, UCX_NET_DEVICES pick the transport)
 *
 * unimem: a target process exposes a 64 MiB HOST buffer and does nothing
 * else (its progress thread serves); the issuer measures, per size,
 *  - latency: the median of blocking um_net_put calls (each complete at the
 *    target, so one round trip and the data);
 *  - bandwidth: puts (gets) issued with events from four source buffers,
 *    four in flight, total bytes over total time.
 * ucx_perftest: ucp_put_lat, ucp_put_bw and ucp_get between a server and a
 * client process over 127.0.0.1 (its server busy-polls its worker). Both
 * report MiB/s; the ratio is unimem over ucx_perftest.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "net_bootstrap.h"
#include "unimem.h"

#define TARGET_BYTES (64u << 20)
#define INFLIGHT 4
#define WAIT_MS 60000

static const size_t sizes[] = {4096, 65536, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

typedef struct result {
  double put_lat_us, put_mibs, get_mibs;
} result;

static void die(const char *what, int st) {
  fprintf(stderr, "bench_net: %s: %s (%s)\n", what, um_err_name(st), um_last_error());
  _exit(st == UM_ENOTSUP ? 77 : 1);
}

#define CHECK(call)                                                            \
  do {                                                                         \
    int st_ = (call);                                                          \
    if (st_ != UM_OK)                                                          \
      die(#call, st_);                                                         \
  } while (0)

static void open_net(um_manager **m, um_net **n) {
  CHECK(um_manager_create(NULL, m));
  CHECK(um_net_create(*m, n));
}

static um_endpoint *connect_peer(um_net *n, int fd) {
  unsigned char mine[4096], theirs[4096];
  size_t len = sizeof(mine), tlen = 0;
  um_endpoint *ep;
  CHECK(um_net_address(n, mine, &len));
  if (nb_send(fd, mine, len) != 0 || nb_recv(fd, theirs, sizeof(theirs), &tlen, WAIT_MS) != 0)
    die("address exchange", UM_EBACKEND);
  CHECK(um_net_connect(n, theirs, tlen, &ep));
  return ep;
}

/* The passive side: expose, then wait for the issuer to finish. */
static int run_target(int fd) {
  unsigned char key[4096], msg;
  size_t len = sizeof(key), mlen;
  um_manager *m;
  um_net *n;
  um_buffer *b;
  um_endpoint *ep;
  open_net(&m, &n);
  ep = connect_peer(n, fd);
  CHECK(um_alloc(m, um_device_get(m, 0), TARGET_BYTES, UM_HOST, UM_ALLOC_ZERO, &b));
  CHECK(um_net_expose(b, key, &len));
  if (nb_send(fd, key, len) != 0 || nb_recv(fd, &msg, 1, &mlen, 3600 * 1000) != 0)
    die("key exchange", UM_EBACKEND);
  CHECK(um_endpoint_close(ep));
  CHECK(um_release(b));
  CHECK(um_net_destroy(n));
  CHECK(um_manager_destroy(m));
  return 0;
}

static double put_latency_us(um_endpoint *ep, um_buffer *src, const void *key, size_t klen, size_t n,
                             int iters) {
  double *t = malloc(sizeof(double) * (size_t)iters), med;
  for (int i = 0; i < iters + 2; i++) { /* two warm-up rounds */
    double t0 = bench_now_ns();
    CHECK(um_net_put(ep, src, 0, key, klen, 0, n, NULL));
    if (i >= 2)
      t[i - 2] = bench_now_ns() - t0;
  }
  med = bench_median(t, iters);
  free(t);
  return med / 1e3;
}

/* MiB/s of count transfers of n bytes, INFLIGHT at a time from as many
 * buffers (operations on one buffer run one after another). */
static double bandwidth_mibs(um_endpoint *ep, um_buffer **bufs, const void *key, size_t klen, size_t n,
                             int count, int get) {
  um_event *ev[INFLIGHT] = {NULL};
  double t0 = bench_now_ns();
  for (int i = 0; i < count; i++) {
    int s = i % INFLIGHT;
    if (ev[s] != NULL) {
      CHECK(um_event_wait(ev[s]));
      um_event_release(ev[s]);
    }
    if (get)
      CHECK(um_net_get(ep, bufs[s], 0, key, klen, (size_t)s * n % (TARGET_BYTES - n + 1), n, &ev[s]));
    else
      CHECK(um_net_put(ep, bufs[s], 0, key, klen, (size_t)s * n % (TARGET_BYTES - n + 1), n, &ev[s]));
  }
  for (int s = 0; s < INFLIGHT; s++)
    if (ev[s] != NULL) {
      CHECK(um_event_wait(ev[s]));
      um_event_release(ev[s]);
    }
  return (double)n * count / (1024.0 * 1024.0) / ((bench_now_ns() - t0) / 1e9);
}

static int iterations(size_t n, int quick) {
  size_t budget = quick ? (64u << 20) : (512u << 20);
  size_t k = budget / n;
  return k < 8 ? 8 : k > 2000 ? 2000 : (int)k;
}

static int run_issuer(int fd, int quick, int out) {
  unsigned char key[4096], q = 'q';
  size_t klen = 0;
  um_manager *m;
  um_net *n;
  um_endpoint *ep;
  um_buffer *bufs[INFLIGHT];
  result r[NSIZES];
  open_net(&m, &n);
  ep = connect_peer(n, fd);
  if (nb_recv(fd, key, sizeof(key), &klen, WAIT_MS) != 0)
    die("key exchange", UM_EBACKEND);
  for (int s = 0; s < INFLIGHT; s++)
    CHECK(um_alloc(m, um_device_get(m, 0), TARGET_BYTES, UM_HOST, UM_ALLOC_ZERO, &bufs[s]));
  for (size_t k = 0; k < NSIZES; k++) {
    int it = iterations(sizes[k], quick);
    r[k].put_lat_us = put_latency_us(ep, bufs[0], key, klen, sizes[k], it < 200 ? it : 200);
    r[k].put_mibs = bandwidth_mibs(ep, bufs, key, klen, sizes[k], it, 0);
    r[k].get_mibs = bandwidth_mibs(ep, bufs, key, klen, sizes[k], it, 1);
  }
  if (write(out, r, sizeof(r)) != (ssize_t)sizeof(r))
    die("result pipe", UM_EBACKEND);
  (void)nb_send(fd, &q, 1);
  CHECK(um_endpoint_close(ep));
  for (int s = 0; s < INFLIGHT; s++)
    CHECK(um_release(bufs[s]));
  CHECK(um_net_destroy(n));
  CHECK(um_manager_destroy(m));
  return 0;
}

/* unimem's figures: two forked processes. 0, or 77 when UCX is missing. */
static int measure_unimem(int quick, result *r) {
  int fds[2], pipefd[2], status, rc = 0;
  pid_t t, i;
  if (nb_pair(fds) != 0 || pipe(pipefd) != 0)
    return 1;
  fflush(stdout);
  if ((t = fork()) == 0)
    _exit(run_target(fds[0]));
  if ((i = fork()) == 0)
    _exit(run_issuer(fds[1], quick, pipefd[1]));
  close(pipefd[1]);
  if (read(pipefd[0], r, sizeof(result) * NSIZES) != (ssize_t)(sizeof(result) * NSIZES))
    rc = 1;
  close(pipefd[0]);
  waitpid(i, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
    rc = 77;
  waitpid(t, &status, 0);
  close(fds[0]);
  close(fds[1]);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* ucx_perftest */

/* Run ucx_perftest's client against a server started for it; parse its
 * "Final:" line. Returns 0, or -1 when it could not run. */
static int perftest_run(const char *test, size_t n, int iters, double *p50_us, double *mibs) {
  static int seq;
  char port[16], size[32], count[32], warm[32], out[16384];
  int port_num = 20000 + (int)((getpid() * 31 + seq++ * 7) % 20000), rc = -1;
  pid_t server;
  snprintf(port, sizeof(port), "%d", port_num);
  snprintf(size, sizeof(size), "%zu", n);
  snprintf(count, sizeof(count), "%d", iters);
  snprintf(warm, sizeof(warm), "%d", iters / 10 + 1);
  fflush(stdout); /* a child's freopen would flush our buffer into its output */
  if ((server = fork()) == 0) {
    if (freopen("/dev/null", "w", stdout) == NULL || freopen("/dev/null", "w", stderr) == NULL)
      _exit(127);
    execlp("ucx_perftest", "ucx_perftest", "-p", port, (char *)NULL);
    _exit(127);
  }
  for (int attempt = 0; attempt < 50 && rc != 0; attempt++) {
    int pfd[2], status;
    size_t got = 0;
    ssize_t r;
    pid_t client;
    usleep(100000); /* the server listens first */
    if (pipe(pfd) != 0)
      break;
    if ((client = fork()) == 0) {
      dup2(pfd[1], 1);
      dup2(pfd[1], 2);
      close(pfd[0]);
      execlp("ucx_perftest", "ucx_perftest", "127.0.0.1", "-p", port, "-t", test, "-s", size, "-n", count,
             "-w", warm, (char *)NULL);
      _exit(127);
    }
    close(pfd[1]);
    while (got < sizeof(out) - 1 && (r = read(pfd[0], out + got, sizeof(out) - 1 - got)) > 0)
      got += (size_t)r;
    out[got] = '\0';
    close(pfd[0]);
    waitpid(client, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
      break; /* not installed */
    char *f = strstr(out, "Final:");
    double it, p50, avg, overall, bw_avg, bw_overall;
    if (f != NULL && sscanf(f, "Final: %lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &overall, &bw_avg,
                            &bw_overall) == 6) {
      *p50_us = p50;
      *mibs = bw_overall;
      rc = 0;
    }
  }
  kill(server, SIGTERM);
  waitpid(server, NULL, 0);
  return rc;
}

int um_bench_net_main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0, rc;
  result um[NSIZES];
  const char *tls = getenv("UCX_TLS");
  rc = measure_unimem(quick, um);
  if (rc == 77) {
    printf("bench_net: UCX is not available here: skipped\n");
    return 77;
  }
  if (rc != 0) {
    fprintf(stderr, "bench_net: the unimem measurement failed\n");
    return 1;
  }
  printf("um_net vs ucx_perftest, UCX_TLS=%s, two processes on this machine\n", tls ? tls : "(UCX's choice)");
  printf("%10s | %10s %10s %6s | %10s %10s %6s | %12s %12s\n", "bytes", "put MiB/s", "perftest",
         "ratio", "get MiB/s", "perftest", "ratio", "put lat us", "perftest us");
  for (size_t k = 0; k < NSIZES; k++) {
    int it = iterations(sizes[k], quick);
    double p50 = -1, put_bw = -1, get_bw = -1, lat = -1, unused;
    if (perftest_run("ucp_put_bw", sizes[k], it, &unused, &put_bw) != 0 ||
        perftest_run("ucp_get", sizes[k], it, &unused, &get_bw) != 0 ||
        perftest_run("ucp_put_lat", sizes[k], it < 200 ? it : 200, &p50, &unused) != 0)
      printf("(ucx_perftest did not run for %zu bytes)\n", sizes[k]);
    lat = p50;
    printf("%10zu | %10.1f %10.1f %6.2f | %10.1f %10.1f %6.2f | %12.1f %12.1f\n", sizes[k], um[k].put_mibs,
           put_bw, put_bw > 0 ? um[k].put_mibs / put_bw : 0, um[k].get_mibs, get_bw,
           get_bw > 0 ? um[k].get_mibs / get_bw : 0, um[k].put_lat_us, lat);
  }
  printf("put lat: unimem's is one blocking um_net_put, complete at the target (admission, data, "
         "flush); ucx_perftest's is half a put ping-pong (50th percentile)\n");
  return 0;
}

#ifndef UM_BENCH_NO_MAIN
int main(int argc, char **argv) { return um_bench_net_main(argc, argv); }
#endif
