/* See net_bootstrap.h. */
#include "net_bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait until fd is ready for events or the deadline passes. */
static int wait_fd(int fd, short events, long deadline) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    long left = deadline - now_ms();
    int r;
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    r = poll(&p, 1, (int)left);
    if (r > 0)
      return 0;
    if (r < 0 && errno != EINTR)
      return -1;
  }
}

int nb_pair(int fds[2]) { return socketpair(AF_UNIX, SOCK_STREAM, 0, fds); }

int nb_listen(int *fd, uint16_t *port) {
  struct sockaddr_in a;
  socklen_t alen = sizeof(a);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0)
    return -1;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s, 16) != 0 ||
      getsockname(s, (struct sockaddr *)&a, &alen) != 0) {
    int e = errno;
    close(s);
    errno = e;
    return -1;
  }
  *fd = s;
  *port = ntohs(a.sin_port);
  return 0;
}

int nb_accept(int lfd, int timeout_ms, int *fd) {
  int s;
  if (wait_fd(lfd, POLLIN, now_ms() + timeout_ms) != 0)
    return -1;
  s = accept(lfd, NULL, NULL);
  if (s < 0)
    return -1;
  *fd = s;
  return 0;
}

int nb_connect(uint16_t port, int timeout_ms, int *fd) {
  long deadline = now_ms() + timeout_ms;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  for (;;) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0)
      return -1;
    if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
      *fd = s;
      return 0;
    }
    close(s);
    if (errno != ECONNREFUSED || now_ms() >= deadline) {
      if (errno == ECONNREFUSED)
        errno = ETIMEDOUT;
      return -1;
    }
    usleep(10000);
  }
}

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, unsigned char *p, size_t n, long deadline) {
  while (n > 0) {
    ssize_t r;
    if (wait_fd(fd, POLLIN, deadline) != 0)
      return -1;
    r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0)
      errno = EPIPE;
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

int nb_send(int fd, const void *blob, size_t len) {
  unsigned char head[4];
  if (len > UINT32_MAX) {
    errno = EMSGSIZE;
    return -1;
  }
  for (int i = 0; i < 4; i++)
    head[i] = (unsigned char)(len >> (8 * i));
  if (write_all(fd, head, 4) != 0)
    return -1;
  return write_all(fd, blob, len);
}

int nb_recv(int fd, void *buf, size_t cap, size_t *len, int timeout_ms) {
  long deadline = now_ms() + timeout_ms;
  unsigned char head[4];
  size_t n = 0;
  if (read_all(fd, head, 4, deadline) != 0)
    return -1;
  for (int i = 0; i < 4; i++)
    n |= (size_t)head[i] << (8 * i);
  if (n > cap) {
    errno = EMSGSIZE;
    return -1;
  }
  if (read_all(fd, buf, n, deadline) != 0)
    return -1;
  *len = n;
  return 0;
}
