/* UCX ALONE (no unimem): a passive target of ucp_put_nbx whose writer is
 * killed mid-put. Shows that the target's process can abort inside UCX
 * itself, whatever the target does: over tcp, UCX moves a put as software
 * RMA (active messages the target's ucp_put_handler copies, each answered
 * by an acknowledgement); once the writer is dead, the acknowledgement of a
 * put message still queued at the target cannot be sent, and UCX calls
 * ucs_fatal("unexpected error: Endpoint timeout") from
 * ucp_request_try_send (ucp_request.inl), which aborts. Neither the error
 * handling mode (UCP_ERR_HANDLING_MODE_PEER on both sides, with error
 * callbacks) nor an endpoint of the target's own changes that: the
 * handler's reply path has no error handling.
 *
 * Build (tests/net.cmake builds it as ucx_put_peer_killed):
 *   cc -O2 -o ucx_put_peer_killed tests/net/ucx_put_peer_killed.c -lucp -lucs
 * Run:
 *   UCX_TLS=tcp UCX_NET_DEVICES=lo ./ucx_put_peer_killed [rounds] [own-ep]
 * Each round forks a target and a writer (before either loads UCX), kills
 * the writer a few milliseconds into a 64 MiB put, lets the target progress
 * for 2 s and destroy its worker, and prints how the target ended. With
 * "own-ep" the target also connects to the writer (error mode PEER, an
 * error callback), so the writer's puts arrive on an endpoint the target
 * created. Exit status: 0 when every target survived, 1 when one aborted
 * or hung, 77 when UCX could not start. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define PUT_BYTES (64u << 20)
#define MSG_CAP 4096

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void die(const char *what) {
  fprintf(stderr, "[pid %d] %s\n", (int)getpid(), what);
  _exit(77);
}

static void check(ucs_status_t st, const char *what) {
  if (st != UCS_OK) {
    fprintf(stderr, "[pid %d] %s: %s\n", (int)getpid(), what, ucs_status_string(st));
    _exit(77);
  }
}

/* Length-prefixed messages over a stream socket, waits bounded by 30 s. */
static void msg_send(int fd, const void *p, uint32_t len) {
  if (write(fd, &len, 4) != 4 || (len > 0 && write(fd, p, len) != (ssize_t)len))
    die("write");
}

static int read_full(int fd, void *p, size_t n) {
  struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
  for (char *c = p; n > 0;) {
    ssize_t r;
    if (poll(&pf, 1, 30000) <= 0)
      return -1;
    if ((r = read(fd, c, n)) <= 0)
      return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

static uint32_t msg_recv(int fd, void *p, uint32_t cap) {
  uint32_t len;
  if (read_full(fd, &len, 4) != 0 || len > cap || read_full(fd, p, len) != 0)
    die("read");
  return len;
}

static void open_worker(ucp_context_h *ctx, ucp_worker_h *w) {
  ucp_params_t prm;
  ucp_worker_params_t wp;
  memset(&prm, 0, sizeof(prm));
  prm.field_mask = UCP_PARAM_FIELD_FEATURES;
  prm.features = UCP_FEATURE_RMA;
  check(ucp_init(&prm, NULL, ctx), "ucp_init");
  memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  check(ucp_worker_create(*ctx, &wp, w), "ucp_worker_create");
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st) {
  (void)ep;
  fprintf(stderr, "[pid %d] %s endpoint: error callback: %s\n", (int)getpid(), (const char *)arg,
          ucs_status_string(st));
}

static ucp_ep_h connect_peer(ucp_worker_h w, const void *addr, const char *who) {
  ucp_ep_params_t ep;
  ucp_ep_h h;
  memset(&ep, 0, sizeof(ep));
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = addr;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = (void *)who;
  check(ucp_ep_create(w, &ep, &h), "ucp_ep_create (error mode PEER)");
  return h;
}

/* ------------------------------------------------------------------------ */

/* The target: maps a buffer, hands its address and key to the writer,
 * then only progresses its worker. */
static int target(int wfd, int ctl, int own_ep) {
  ucp_context_h ctx;
  ucp_worker_h w;
  ucp_mem_map_params_t mp;
  ucp_mem_h memh;
  ucp_address_t *addr;
  ucp_ep_h ep = NULL;
  size_t alen, klen;
  void *key, *buf = calloc(1, PUT_BYTES);
  unsigned char peer[MSG_CAP];
  uint64_t raddr = (uint64_t)(uintptr_t)buf, stop = UINT64_MAX;
  open_worker(&ctx, &w);
  memset(&mp, 0, sizeof(mp));
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = buf;
  mp.length = PUT_BYTES;
  check(ucp_mem_map(ctx, &mp, &memh), "ucp_mem_map");
  check(ucp_rkey_pack(ctx, memh, &key, &klen), "ucp_rkey_pack");
  check(ucp_worker_get_address(w, &addr, &alen), "ucp_worker_get_address");
  msg_send(wfd, addr, (uint32_t)alen);
  msg_send(wfd, &raddr, 8);
  msg_send(wfd, key, (uint32_t)klen);
  (void)msg_recv(wfd, peer, sizeof(peer)); /* the writer's address */
  if (own_ep)
    ep = connect_peer(w, peer, "target's");
  for (;;) { /* progress; 2 s after the kill, stop */
    struct pollfd pf = {.fd = ctl, .events = POLLIN, .revents = 0};
    char c;
    ucp_worker_progress(w);
    if (stop == UINT64_MAX && poll(&pf, 1, 0) > 0 && read(ctl, &c, 1) == 1)
      stop = now_ms() + 2000;
    if (now_ms() >= stop)
      break;
  }
  if (ep != NULL) {
    ucp_request_param_t prm;
    ucs_status_ptr_t req;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    req = ucp_ep_close_nbx(ep, &prm);
    for (uint64_t end = now_ms() + 2000; UCS_PTR_IS_PTR(req) && now_ms() < end;) {
      ucp_worker_progress(w);
      if (ucp_request_check_status(req) != UCS_INPROGRESS) {
        ucp_request_free(req);
        req = NULL;
      }
    }
  }
  ucp_rkey_buffer_release(key);
  ucp_worker_release_address(w, addr);
  ucp_mem_unmap(ctx, memh);
  ucp_worker_destroy(w);
  ucp_cleanup(ctx);
  free(buf);
  return 0;
}

/* The writer: puts 64 MiB into the target, flushes, again, until killed. */
static __attribute__((noreturn)) void writer(int tfd, int ctl) {
  ucp_context_h ctx;
  ucp_worker_h w;
  ucp_address_t *addr;
  ucp_rkey_h rkey;
  ucp_ep_h ep;
  size_t alen;
  unsigned char taddr[MSG_CAP], key[MSG_CAP];
  uint64_t raddr;
  void *src = malloc(PUT_BYTES);
  memset(src, 0x5a, PUT_BYTES);
  open_worker(&ctx, &w);
  (void)msg_recv(tfd, taddr, sizeof(taddr));
  (void)msg_recv(tfd, &raddr, 8);
  (void)msg_recv(tfd, key, sizeof(key));
  check(ucp_worker_get_address(w, &addr, &alen), "ucp_worker_get_address");
  msg_send(tfd, addr, (uint32_t)alen);
  ep = connect_peer(w, taddr, "writer's");
  check(ucp_ep_rkey_unpack(ep, key, &rkey), "ucp_ep_rkey_unpack");
  for (int first = 1;; first = 0) {
    ucp_request_param_t prm;
    ucs_status_ptr_t put, flush;
    memset(&prm, 0, sizeof(prm));
    put = ucp_put_nbx(ep, src, PUT_BYTES, raddr, rkey, &prm);
    flush = ucp_ep_flush_nbx(ep, &prm);
    if (first)
      msg_send(ctl, "p", 1); /* putting: kill me */
    while (UCS_PTR_IS_PTR(flush) && ucp_request_check_status(flush) == UCS_INPROGRESS)
      ucp_worker_progress(w);
    if (UCS_PTR_IS_PTR(put))
      ucp_request_free(put);
    if (UCS_PTR_IS_PTR(flush))
      ucp_request_free(flush);
  }
}

/* ------------------------------------------------------------------------ */

static pid_t spawn(int (*fn)(int, int, int), int a, int b, int c) {
  pid_t pid = fork();
  if (pid < 0)
    die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    _exit(fn(a, b, c));
  }
  return pid;
}

static int writer3(int a, int b, int c) {
  (void)c;
  writer(a, b);
}

/* How the target ended: its exit code, 128 + signal, 124 when hung. */
static int reap(pid_t pid, unsigned timeout_ms) {
  int status;
  for (uint64_t end = now_ms() + timeout_ms;;) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (now_ms() >= end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return 124;
    }
    usleep(2000);
  }
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 10, own_ep = argc > 2 && strcmp(argv[2], "own-ep") == 0;
  int aborted = 0, hung = 0, survived = 0;
  printf("UCX %s; target %s; %d rounds\n", ucp_get_version_string(),
         own_ep ? "with its own endpoint (error mode PEER)" : "passive", rounds);
  for (int r = 0; r < rounds; r++) {
    int tw[2], ct[2], cw[2], rc;
    uint32_t len = 0;
    char c = 0;
    pid_t t, w;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, tw) || socketpair(AF_UNIX, SOCK_STREAM, 0, ct) ||
        socketpair(AF_UNIX, SOCK_STREAM, 0, cw))
      die("socketpair");
    t = spawn(target, tw[0], ct[1], own_ep);
    w = spawn(writer3, tw[1], cw[1], 0);
    if (read_full(cw[0], &len, 4) != 0 || len != 1 || read_full(cw[0], &c, 1) != 0 || c != 'p') {
      kill(w, SIGKILL), kill(t, SIGKILL);
      return 77;
    }
    usleep((useconds_t)(2000 + 5000 * (r % 8)));
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    if (write(ct[0], "k", 1) != 1)
      die("write");
    rc = reap(t, 20000);
    printf("round %d: target %s (status %d)\n", r,
           rc == 0 ? "survived" : rc == 128 + SIGABRT ? "aborted in UCX" : rc == 124 ? "hung" : "failed", rc);
    fflush(stdout);
    aborted += rc == 128 + SIGABRT;
    hung += rc == 124;
    survived += rc == 0;
    for (int i = 0; i < 2; i++)
      close(tw[i]), close(ct[i]), close(cw[i]);
  }
  printf("survived %d, aborted %d, hung %d of %d\n", survived, aborted, hung, rounds);
  return survived == rounds ? 0 : 1;
}
