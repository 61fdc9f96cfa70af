/* Peer access between devices: a matrix per manager, filled by asking the
 * backend. Devices of different backends never have peer access; copies
 * between them are staged through host memory. */
#include "device.h"

static int check_pair(const um_device *a, const um_device *b) {
  if (!um__device_ok(a) || !um__device_ok(b))
    return um__set_error(UM_EINVAL, "peer: NULL or not a device");
  if (a->m != b->m)
    return um__set_error(UM_EINVAL, "peer: devices of different managers");
  return UM_OK;
}

int um_peer_possible(const um_device *a, const um_device *b) {
  int st = check_pair(a, b);
  if (st != UM_OK)
    return st;
  if (a == b)
    return 1;
  return um__dev_peer_possible(a, b);
}

int um_peer_enable(um_device *a, um_device *b) {
  um_manager *m;
  int st = check_pair(a, b);
  if (st != UM_OK)
    return st;
  if (a == b)
    return UM_OK;
  m = a->m;
  if (um__process_changed(m))
    return um__manager_check_process(m);
  pthread_mutex_lock(&m->peer_lock);
  if (m->peer[a->index * UM__MAX_DEVICES + b->index]) {
    pthread_mutex_unlock(&m->peer_lock);
    return UM_OK;
  }
  if (um_peer_possible(a, b) != 1) {
    pthread_mutex_unlock(&m->peer_lock);
    return um__set_error(UM_ENOTSUP, "peer access from device %d (%s) to device %d (%s) is not possible",
                         a->index, a->info.name, b->index, b->info.name);
  }
  st = um__dev_peer_enable(a, b);
  if (st == UM_OK)
    m->peer[a->index * UM__MAX_DEVICES + b->index] = 1;
  pthread_mutex_unlock(&m->peer_lock);
  return st;
}

int um_peer_enabled(const um_device *a, const um_device *b) {
  um_manager *m;
  int st = check_pair(a, b);
  unsigned char v;
  if (st != UM_OK)
    return st;
  if (a == b)
    return 1;
  m = a->m;
  pthread_mutex_lock(&m->peer_lock);
  v = m->peer[a->index * UM__MAX_DEVICES + b->index];
  pthread_mutex_unlock(&m->peer_lock);
  return v ? 1 : 0;
}
