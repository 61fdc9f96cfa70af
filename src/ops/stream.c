/* Streaming: a source larger than a device's memory goes through the device
 * in chunks, two device buffers taking turns.
 *
 * Order of one step k (chunk k sits in buffer k & 1):
 *   wait for the copy of chunk k;
 *   issue the copy of chunk k+1 into the other buffer (asynchronous);
 *   call fn on chunk k while that copy runs;
 *   report progress.
 * The other buffer is free to overwrite when step k starts: fn on chunk k-1
 * has returned, and any operation fn issued on it is ordered before the new
 * copy by the buffer's own operation chain (op.c). So at most two chunks
 * of device memory are held, whatever the length of the source.
 */
#include <string.h>

#include "ops.h"

static int check_args(um_buffer *src, size_t off, size_t bytes, um_device *dev, size_t chunk_bytes,
                      um_chunk_fn fn) {
  int st;
  if (src == NULL || fn == NULL || !um__device_ok(dev))
    return um__set_error(UM_EINVAL, "um_stream: NULL argument or not a device");
  if ((st = um__buffer_check_live(src)) != UM_OK)
    return st;
  if (um__process_changed(src->m))
    return um__manager_check_process(src->m);
  if (dev->m != src->m)
    return um__set_error(UM_EINVAL, "um_stream: device and buffer belong to different managers");
  if (bytes == 0 || chunk_bytes == 0)
    return um__set_error(UM_EINVAL, "um_stream: zero %s", bytes == 0 ? "length" : "chunk size");
  if (off > src->size || bytes > src->size - off)
    return um__set_error(UM_ERANGE, "um_stream: range [%zu, +%zu) outside a buffer of %zu bytes",
                         off, bytes, src->size);
  return UM_OK;
}

/* Whether a wait for what was issued on b would pass through an open
 * bracket (um_stream waits for its copies from src and for its chunks). */
static bool waits_bracket(um_buffer *b) {
  bool waits;
  pthread_mutex_lock(&b->lock);
  waits = um__buffer_waits_bracket_locked(b, false);
  pthread_mutex_unlock(&b->lock);
  return waits;
}

/* Wait for a chunk's copy, or refuse it when the wait would pass through
 * an open bracket (one opened since the start, by fn or another thread):
 * the copy is canceled, so that it never touches src after um_stream. */
static int wait_copy(um_event *copy) {
  int st;
  if (um__op_waits_bracket(copy)) {
    st = um_event_cancel(copy) == UM_OK ? UM_ESTATE : um_event_wait(copy);
    if (st == UM_ESTATE)
      st = um__set_error(UM_ESTATE, "um_stream: a chunk's copy waits for an open um_access_begin bracket");
  } else {
    st = um_event_wait(copy);
  }
  um_event_release(copy);
  return st;
}

int um_stream(um_buffer *src, size_t off, size_t bytes, um_device *dev, size_t chunk_bytes,
              um_chunk_fn fn, um_progress_fn progress, void *user) {
  um_buffer *buf[2] = {NULL, NULL};
  um_event *copy[2] = {NULL, NULL};
  size_t chunk, nchunks;
  int nbufs, st;

  if ((st = check_args(src, off, bytes, dev, chunk_bytes, fn)) != UM_OK)
    return st;
  if (waits_bracket(src))
    return um__op_bracket_error(src);
  chunk = chunk_bytes < bytes ? chunk_bytes : bytes;
  nchunks = bytes / chunk + (bytes % chunk != 0);
  nbufs = nchunks > 1 ? 2 : 1;
  for (int i = 0; i < nbufs; i++)
    if ((st = um_alloc(src->m, dev, chunk, UM_DEVICE, 0, &buf[i])) != UM_OK)
      goto done;

  st = um_copy(buf[0], 0, src, off, chunk, &copy[0]);
  for (size_t k = 0; st == UM_OK && k < nchunks; k++) {
    int s = (int)(k & 1);
    size_t pos = k * chunk;
    size_t n = bytes - pos < chunk ? bytes - pos : chunk;
    int r;
    st = wait_copy(copy[s]);
    copy[s] = NULL;
    if (st != UM_OK)
      break;
    if (k + 1 < nchunks) {
      size_t next = pos + chunk;
      size_t next_n = bytes - next < chunk ? bytes - next : chunk;
      st = um_copy(buf[s ^ 1], 0, src, off + next, next_n, &copy[s ^ 1]);
      if (st != UM_OK)
        break;
    }
    r = fn(user, buf[s], off + pos, n);
    if (r != 0) {
      st = r;
      break;
    }
    if (progress != NULL)
      progress(user, (uint64_t)(pos + n), (uint64_t)bytes);
  }

done:
  /* A copy still in flight (fn stopped the stream, or a copy failed) ends
   * before its buffer goes back, or is canceled when it waits for an open
   * bracket; every operation fn issued on the chunks ends too: nothing
   * touches the source after um_stream returns. */
  for (int i = 0; i < 2; i++) {
    int s;
    if (copy[i] != NULL && (s = wait_copy(copy[i])) == UM_ESTATE && st == UM_OK)
      st = s;
  }
  /* A chunk whose operations (fn's) wait for an open bracket is released
   * without the wait: its block goes back once they have run. */
  for (int i = 0; i < nbufs; i++) {
    if (buf[i] == NULL || um__buffer_check_live(buf[i]) != UM_OK)
      continue; /* not allocated, or fn released it against the contract */
    if (!waits_bracket(buf[i]))
      um__buffer_wait_idle(buf[i]);
    um_release(buf[i]);
  }
  return st;
}
