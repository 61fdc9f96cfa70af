/* Fuzz target: the input is a program of API calls, good and bad ones,
 * run against a manager with the cpu, one or two "fault" devices and a
 * "fault-map" device (tests/support/fault_backend.c). A shadow model knows what
 * every live buffer must hold, byte by byte, and which code every call
 * must answer; any difference aborts.
 *
 * Input layout: byte 0 and 1 configure the manager (debug quarantine,
 * pooling, scrub, staging, worker count, fault devices, device memory);
 * then each operation is one byte (its kind) and its arguments. Reading past the end gives zeros, so
 * every input is a valid program. The manager of a configuration is kept
 * from one input to the next and reset between them (see "Managers").
 *
 * What the model allows: a call whose arguments and state are valid must
 * answer UM_OK, unless a fault was planned or a device lost in this input
 * (then the injected code, UM_ENODEV or UM_ENOMEM, and the bytes it was to
 * write become unknown), or a fault device ran out of its small memory
 * (UM_ENOMEM for allocations). A call with bad arguments must answer one of
 * the codes its faults call for, and change nothing. Asynchronous results
 * are checked in issue order: when one fails or is canceled, the bytes
 * written by it and by everything issued after it become unknown. The
 * statistics (live buffers, bytes in use) must match the model after every
 * call that makes, refuses or releases a buffer (on that buffer's device)
 * and, for every device and in total, at the end of the program.
 *
 * Built two ways: with libFuzzer (tests/reliability/fuzz/CMakeLists.txt, clang,
 * -DUNIMEM_FUZZ_LIBFUZZER), and as a plain program that replays the files
 * named on its command line (the fuzz_corpus CTest test).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_backend.h"

#define NSLOTS 8
#define MAX_EVENTS 16
#define MAX_LOG 256
#define MAX_OPS 200
#define MAX_BUF (64u * 1024u)
#define NSTALE 8

/* ------------------------------------------------------------------------ */
/* Input */

typedef struct input {
  const uint8_t *p;
  size_t n, at;
} input;

static uint8_t u8(input *in) { return in->at < in->n ? in->p[in->at++] : 0; }
static uint16_t u16(input *in) { return (uint16_t)(u8(in) | (u8(in) << 8)); }
static unsigned pick(input *in, unsigned n) { return u8(in) % n; }

/* ------------------------------------------------------------------------ */
/* Model */

typedef struct slot {
  um_buffer *b;
  unsigned gen; /* changes each time the slot gets a new buffer */
  size_t size;
  int dev;
  um_location loc;
  bool readonly;
  unsigned char *expect, *known;
  bool mapped;
  void *map_ptr;
  size_t map_off, map_len;
  um_map_mode map_mode;
} slot;

typedef struct pending {
  um_event *e;
  uint64_t seq;
  bool canceled;
  bool is_batch;
  unsigned char *out; /* what a read brings back */
  unsigned char *want, *want_known;
  size_t len;
} pending;

typedef struct logged {
  uint64_t seq;
  int slot;
  unsigned gen;
  size_t off, len;
} logged;

typedef struct state {
  um_manager *m;
  int ndev;
  um_device *devs[8];
  slot s[NSLOTS];
  pending ev[MAX_EVENTS];
  int nev;
  logged log[MAX_LOG];
  int nlog;
  uint64_t seq;
  um_buffer *stale[NSTALE];
  int stale_dev[NSTALE]; /* the device each was on */
  int nstale;
  um_event *stale_ev[NSTALE]; /* events the program released */
  int nstale_ev;
  void **keep; /* host memory an operation may still touch: freed after destroy */
  int nkeep, capkeep;
  bool faults;   /* a fault was planned or a device lost: failures may happen */
  bool scrub;
  unsigned char *wrap_mem[NSLOTS];
} state;

static unsigned char pattern[MAX_BUF + 256];
/* The model's bytes of each slot, and a whole buffer read back: made once
 * (a calloc and a free of up to 64 KiB each per allocation cost more than
 * the allocation under test). */
static unsigned char slot_expect[NSLOTS][MAX_BUF], slot_known[NSLOTS][MAX_BUF];
static unsigned char readback[MAX_BUF];

#define FAIL(...) fail_at(__LINE__, __VA_ARGS__)

/* FUZZ_TRACE=1 prints every call with its arguments and answer. */
static bool trace;

#define TRACE(...)                                                             \
  do {                                                                         \
    if (trace)                                                                 \
      fprintf(stderr, __VA_ARGS__);                                            \
  } while (0)

static void fail_at(int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "fuzz_api.c:%d: model mismatch: ", line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (last error: %s)\n", um_last_error());
  abort();
}

#define BIT(code) (1u << (unsigned)(-(code)))
#define FAULT_CODES (BIT(UM_EBACKEND) | BIT(UM_ENODEV) | BIT(UM_ENOMEM))

/* A call's answer: UM_OK when no error applies (or a fault's code when
 * faults are possible); else one of the errors that apply. */
static void expect(state *st, int got, unsigned errors, unsigned also_ok_failures, const char *what) {
  TRACE("  %s -> %s (errors 0x%x)\n", what, um_err_name(got), errors);
  if (errors == 0) {
    if (got == UM_OK)
      return;
    if (got < 0 && ((st->faults ? FAULT_CODES : 0u) | also_ok_failures) & BIT(got))
      return;
    FAIL("%s: valid call answered %s", what, um_err_name(got));
  }
  if (got >= 0 || !(errors & BIT(got)))
    FAIL("%s: answered %s, expected one of the codes 0x%x", what, um_err_name(got), errors);
}

static bool live(const state *st, int i) { return st->s[i].b != NULL; }

static void model_unknown(state *st, int i, size_t off, size_t len) { memset(st->s[i].known + off, 0, len); }

static void model_set(state *st, int i, size_t off, const unsigned char *src, size_t len) {
  memcpy(st->s[i].expect + off, src, len);
  memset(st->s[i].known + off, 1, len);
}

static void model_copy(state *st, int d, size_t doff, int s, size_t soff, size_t len) {
  memmove(st->s[d].expect + doff, st->s[s].expect + soff, len);
  memmove(st->s[d].known + doff, st->s[s].known + soff, len);
}

/* Known bytes must match. Eight bytes at a time (a known flag is 0 or 1,
 * so flag * 0xFF masks its byte), 64 to a comparison: a byte-wise loop
 * here, with the fuzzer's callback on each comparison, cost a third of
 * every input. The byte-wise loop finds the byte to report. Without
 * ASan's check of every 8-byte load (which made this loop 8% of the
 * fuzzer's time): one check of each whole range first, which still finds
 * a read, a mapping or a model array shorter than len. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUZZ_ASAN 1
#endif
#endif
#if !defined(FUZZ_ASAN) && defined(__SANITIZE_ADDRESS__)
#define FUZZ_ASAN 1
#endif
#ifdef FUZZ_ASAN
#include <sanitizer/asan_interface.h>
#define NO_ASAN __attribute__((no_sanitize("address")))
#else
#define NO_ASAN
#endif

static NO_ASAN size_t model_first_diff(const unsigned char *got, const unsigned char *want,
                                       const unsigned char *known, size_t len) {
  size_t k = 0;
  for (; len - k >= 64; k += 64) {
    uint64_t diff = 0;
    for (size_t w = k; w < k + 64; w += 8) {
      uint64_t g, e, f;
      memcpy(&g, got + w, 8);
      memcpy(&e, want + w, 8);
      memcpy(&f, known + w, 8);
      diff |= (g ^ e) & (f * 0xFFu);
    }
    if (diff != 0)
      break;
  }
  return k;
}

static void model_check(int i, size_t off, const unsigned char *got, const unsigned char *want,
                        const unsigned char *known, size_t len, const char *what) {
  size_t k;
#ifdef FUZZ_ASAN
  if (len > 0 && (__asan_region_is_poisoned((void *)(uintptr_t)got, len) != NULL ||
                  __asan_region_is_poisoned((void *)(uintptr_t)want, len) != NULL ||
                  __asan_region_is_poisoned((void *)(uintptr_t)known, len) != NULL)) {
    volatile unsigned char sink = 0;
    for (k = 0; k < len; k++) /* ASan reports the first bad byte */
      sink ^= got[k] ^ want[k] ^ known[k];
    (void)sink;
  }
#endif
  k = model_first_diff(got, want, known, len);
  for (; k < len; k++)
    if (known[k] && got[k] != want[k])
      FAIL("%s: slot %d byte %zu is 0x%02x, the model says 0x%02x", what, i, off + k, got[k], want[k]);
}

static void keep(state *st, void *p) {
  if (st->nkeep == st->capkeep) {
    int cap = st->capkeep ? 2 * st->capkeep : 32;
    void **grown = realloc(st->keep, (size_t)cap * sizeof(*grown));
    if (grown == NULL)
      abort();
    st->keep = grown;
    st->capkeep = cap;
  }
  st->keep[st->nkeep++] = p;
}

/* Record a write for the taint rule: needed while events are pending, or
 * for the asynchronous operation about to become one. */
static void log_write(state *st, int i, size_t off, size_t len, bool async) {
  if (st->nev == 0 && !async) {
    st->nlog = 0;
    return;
  }
  if (st->nlog == MAX_LOG) {
    /* Full: forget the oldest half by tainting it now (conservative). */
    for (int k = 0; k < st->nlog; k++)
      if (live(st, st->log[k].slot) && st->s[st->log[k].slot].gen == st->log[k].gen)
        model_unknown(st, st->log[k].slot, st->log[k].off, st->log[k].len);
    st->nlog = 0;
  }
  st->log[st->nlog++] = (logged){st->seq, i, st->s[i].gen, off, len};
}

/* The operation with sequence number seq failed or will not run: the bytes
 * written by it and by every later operation are unknown, and later reads
 * cannot be checked. */
static void taint_from(state *st, uint64_t seq) {
  for (int k = 0; k < st->nlog; k++) {
    logged *l = &st->log[k];
    if (l->seq >= seq && live(st, l->slot) && st->s[l->slot].gen == l->gen)
      model_unknown(st, l->slot, l->off, l->len);
  }
  for (int k = 0; k < st->nev; k++)
    if (st->ev[k].seq > seq && st->ev[k].want_known != NULL)
      memset(st->ev[k].want_known, 0, st->ev[k].len);
}

static void event_forget(state *st, int k) {
  pending *p = &st->ev[k];
  free(p->want);
  free(p->want_known);
  if (p->out != NULL)
    free(p->out);
  st->ev[k] = st->ev[--st->nev];
}

/* Release the pending event k's handle, which must answer UM_ESTATE from
 * then on (op_stale). */
static void event_release(state *st, int k) {
  um_event *e = st->ev[k].e;
  expect(st, um_event_release(e), 0, 0, "um_event_release");
  st->stale_ev[st->nstale_ev < NSTALE ? st->nstale_ev++ : (int)(st->seq % NSTALE)] = e;
}

/* Wait for the pending event k and check its outcome. */
static void event_finish(state *st, int k, bool release) {
  pending *p = &st->ev[k];
  int got = um_event_wait(p->e);
  TRACE("  event of seq %llu -> %s\n", (unsigned long long)p->seq, um_err_name(got));
  if (p->canceled) {
    if (got != UM_ECANCELED)
      FAIL("a canceled operation answered %s", um_err_name(got));
  } else if (got != UM_OK) {
    if (!st->faults || !(FAULT_CODES & BIT(got)))
      FAIL("an asynchronous operation answered %s", um_err_name(got));
    taint_from(st, p->seq);
  } else if (p->out != NULL) {
    model_check(-1, 0, p->out, p->want, p->want_known, p->len, "asynchronous read");
  }
  if (um_event_query(p->e) != got)
    FAIL("query after wait disagrees");
  if (release)
    event_release(st, k);
  event_forget(st, k);
}

/* Finish every pending event, oldest first. The writes logged for them
 * can no longer be tainted; those of the operation being issued (seq, when
 * add_event drains to make room for its event) still can: a cancel of it
 * must make them unknown. */
static void drain(state *st) {
  int kept = 0;
  while (st->nev > 0) {
    int oldest = 0;
    for (int k = 1; k < st->nev; k++)
      if (st->ev[k].seq < st->ev[oldest].seq)
        oldest = k;
    event_finish(st, oldest, true);
  }
  for (int k = 0; k < st->nlog; k++)
    if (st->log[k].seq == st->seq)
      st->log[kept++] = st->log[k];
  st->nlog = kept;
}

/* Finish events issued before seq, oldest first, then the one wanted. */
static void finish_in_order(state *st, uint64_t seq) {
  for (;;) {
    int oldest = -1;
    for (int k = 0; k < st->nev; k++)
      if (st->ev[k].seq <= seq && (oldest < 0 || st->ev[k].seq < st->ev[oldest].seq))
        oldest = k;
    if (oldest < 0)
      return;
    event_finish(st, oldest, true);
  }
}

static void add_event(state *st, um_event *e, bool batch, unsigned char *out, size_t len, const unsigned char *want,
                      const unsigned char *want_known) {
  pending *p;
  if (st->nev == MAX_EVENTS)
    drain(st);
  p = &st->ev[st->nev++];
  memset(p, 0, sizeof(*p));
  p->e = e;
  p->seq = st->seq;
  p->is_batch = batch;
  p->out = out;
  p->len = len;
  if (out != NULL) {
    p->want = malloc(len);
    p->want_known = malloc(len);
    if (p->want == NULL || p->want_known == NULL)
      abort();
    memcpy(p->want, want, len);
    memcpy(p->want_known, want_known, len);
  }
}

/* The statistics of device dev (all devices: dev < 0) must count the
 * model's live buffers and their bytes. */
static void check_stats(state *st, int dev) {
  um_stats s;
  uint64_t n = 0, bytes = 0;
  for (int i = 0; i < NSLOTS; i++)
    if (live(st, i) && (dev < 0 || st->s[i].dev == dev)) {
      n++;
      bytes += st->s[i].size;
    }
  if (um_stats_get(st->m, dev < 0 ? NULL : st->devs[dev], &s) != UM_OK)
    FAIL("um_stats_get");
  if (s.active_buffers != n || s.bytes_in_use != bytes)
    FAIL("stats of device %d: %llu buffers, %llu bytes in use; the model holds %llu, %llu", dev,
         (unsigned long long)s.active_buffers, (unsigned long long)s.bytes_in_use, (unsigned long long)n,
         (unsigned long long)bytes);
}

/* ------------------------------------------------------------------------ */
/* Arguments */

static size_t size_arg(input *in) {
  switch (pick(in, 8)) {
  case 0: return 1 + pick(in, 64);
  case 1:
  case 2: return 1 + u16(in) % 4096;
  case 3:
  case 4: return 1 + u16(in) % (16 * 1024);
  case 5: return 1 + ((size_t)u16(in) % MAX_BUF);
  case 6: return 4096u << pick(in, 5); /* 4 KiB .. 64 KiB: exact classes */
  default: return 0;                   /* refused */
  }
}

/* off/len over a buffer of size; most are valid. */
static void range_arg(input *in, size_t size, size_t *off, size_t *len) {
  unsigned k = pick(in, 10);
  if (size == 0)
    size = 1;
  if (k < 7) {
    *off = u16(in) % size;
    *len = 1 + u16(in) % (size - *off);
  } else if (k == 7) {
    *off = u16(in) % (size + 1);
    *len = size - *off + 1 + pick(in, 16);
  } else if (k == 8) {
    *off = SIZE_MAX - pick(in, 4);
    *len = 1 + pick(in, 8);
  } else {
    *off = u16(in) % size;
    *len = 0;
  }
}

static unsigned range_errors(size_t size, size_t off, size_t len) {
  if (len == 0)
    return BIT(UM_EINVAL);
  if (off > size || len > size - off)
    return BIT(UM_ERANGE);
  return 0;
}

/* A live slot, or -1. */
static int live_slot(state *st, input *in) {
  int i = (int)pick(in, NSLOTS);
  for (int k = 0; k < NSLOTS; k++, i = (i + 1) % NSLOTS)
    if (live(st, i))
      return i;
  return -1;
}

static int free_slot(state *st, input *in) {
  int i = (int)pick(in, NSLOTS);
  for (int k = 0; k < NSLOTS; k++, i = (i + 1) % NSLOTS)
    if (!live(st, i))
      return i;
  return -1;
}

static bool readable_whole(const state *st, int i) { return !st->s[i].mapped; }

/* ------------------------------------------------------------------------ */
/* Operations */

static void give_slot(state *st, int i, um_buffer *b, size_t size, int dev, um_location loc, bool ro) {
  slot *s = &st->s[i];
  s->b = b;
  s->gen++;
  s->size = size;
  s->dev = dev;
  s->loc = loc;
  s->readonly = ro;
  s->mapped = false;
  s->expect = slot_expect[i]; /* what it holds counts only where known */
  s->known = slot_known[i];
  memset(s->known, 0, size);
}

static void drop_slot(state *st, int i) {
  slot *s = &st->s[i];
  int k = st->nstale < NSTALE ? st->nstale++ : (int)(s->gen % NSTALE);
  st->stale[k] = s->b;
  st->stale_dev[k] = s->dev;
  s->expect = s->known = NULL;
  s->b = NULL;
  s->mapped = false;
}

static void op_alloc(state *st, input *in) {
  int i = free_slot(st, in);
  int dev = (int)pick(in, (unsigned)st->ndev);
  unsigned lsel = pick(in, 6);
  um_location loc = lsel < 4 ? (um_location)lsel : UM_DEVICE;
  size_t size = size_arg(in);
  unsigned fsel = pick(in, 8), flags = 0, errors = 0, ok_failures = 0;
  um_device_info info;
  um_buffer *b = NULL;
  int got;
  if (i < 0)
    return;
  if (fsel == 1 || fsel == 3)
    flags |= UM_ALLOC_ZERO;
  if (fsel == 2 || fsel == 3)
    flags |= UM_ALLOC_UNPOOLED;
  if (fsel == 4)
    flags = 0x40;
  if (lsel == 5)
    loc = (um_location)7;
  um_device_info_get(st->devs[dev], &info);
  if (size == 0 || flags == 0x40 || (unsigned)loc > UM_UNIFIED)
    errors |= BIT(UM_EINVAL);
  else if (!(info.locations & (1u << loc)))
    errors |= BIT(UM_ENOTSUP);
  if (dev != 0 || loc == UM_PINNED)
    ok_failures |= BIT(UM_ENOMEM); /* small fault devices fill up; mlock limits */
  TRACE("alloc slot %d dev %d loc %d size %zu flags 0x%x\n", i, dev, (int)loc, size, flags);
  got = um_alloc(st->m, st->devs[dev], size, loc, flags, &b);
  expect(st, got, errors, ok_failures, "um_alloc");
  if (got != UM_OK) {
    if (b != NULL)
      FAIL("um_alloc failed but wrote *out");
    check_stats(st, dev);
    return;
  }
  if (um_buffer_size(b) != size || um_buffer_device(b) != st->devs[dev] || um_buffer_location(b) != loc)
    FAIL("getters of a new buffer");
  give_slot(st, i, b, size, dev, loc, false);
  if ((flags & UM_ALLOC_ZERO) || st->scrub) {
    memset(st->s[i].expect, 0, size);
    memset(st->s[i].known, 1, size);
  }
  check_stats(st, dev);
}

static void op_wrap(state *st, input *in) {
  int i = free_slot(st, in);
  size_t size = 1 + u16(in) % 8192;
  bool ro = pick(in, 2) != 0;
  unsigned char *mem;
  um_buffer *b = NULL;
  int got;
  if (i < 0)
    return;
  mem = malloc(size);
  if (mem == NULL)
    abort();
  memcpy(mem, pattern + (size_t)pick(in, 200), size);
  keep(st, mem); /* released operations may still read it: freed at the reset */
  TRACE("wrap slot %d size %zu ro %d\n", i, size, ro);
  got = um_wrap_host(st->m, mem, size, ro ? UM_WRAP_READONLY : 0, &b);
  expect(st, got, 0, 0, "um_wrap_host");
  give_slot(st, i, b, size, 0, UM_HOST, ro);
  model_set(st, i, 0, mem, size);
  check_stats(st, 0);
}

static void op_release(state *st, input *in) {
  int i = live_slot(st, in);
  if (i < 0)
    return;
  TRACE("release slot %d\n", i);
  expect(st, um_release(st->s[i].b), 0, 0, "um_release");
  drop_slot(st, i);
  check_stats(st, st->s[i].dev);
}

/* The shared checks of copies and fills on a live destination. */
static unsigned dst_errors(const state *st, int i, size_t off, size_t len) {
  unsigned e = range_errors(st->s[i].size, off, len);
  if (e & BIT(UM_EINVAL))
    return e;
  if (st->s[i].readonly)
    e |= BIT(UM_ESTATE);
  if (st->s[i].mapped)
    e |= BIT(UM_ESTATE);
  return e;
}

static unsigned src_errors(const state *st, int i, size_t off, size_t len) {
  unsigned e = range_errors(st->s[i].size, off, len);
  if (st->s[i].mapped && !(e & BIT(UM_EINVAL)))
    e |= BIT(UM_ESTATE);
  return e;
}

static void op_h2d(state *st, input *in) {
  int i = live_slot(st, in);
  size_t off, len, poff;
  bool async;
  unsigned errors;
  um_event *e = NULL;
  int got;
  if (i < 0)
    return;
  range_arg(in, st->s[i].size, &off, &len);
  poff = pick(in, 251);
  async = pick(in, 2) != 0;
  errors = dst_errors(st, i, off, len);
  st->seq++;
  TRACE("h2d slot %d off %zu len %zu from pattern+%zu async %d seq %llu\n", i, off, len, poff, async,
        (unsigned long long)st->seq);
  got = um_copy_from_host(st->s[i].b, off, pattern + poff, len, async ? &e : NULL);
  expect(st, got, errors, 0, "um_copy_from_host");
  if (got != UM_OK) {
    if (errors == 0)
      model_unknown(st, i, off, len);
    return;
  }
  model_set(st, i, off, pattern + poff, len);
  log_write(st, i, off, len, async);
  if (async)
    add_event(st, e, false, NULL, 0, NULL, NULL);
}

static void op_d2h(state *st, input *in) {
  int i = live_slot(st, in);
  size_t off, len;
  bool async;
  unsigned errors;
  um_event *e = NULL;
  unsigned char *out;
  int got;
  if (i < 0)
    return;
  range_arg(in, st->s[i].size, &off, &len);
  async = pick(in, 2) != 0;
  errors = src_errors(st, i, off, len);
  if (!async && st->faults)
    drain(st);
  out = malloc(errors ? 16 : len);
  if (out == NULL)
    abort();
  st->seq++;
  TRACE("d2h slot %d off %zu len %zu async %d seq %llu\n", i, off, len, async, (unsigned long long)st->seq);
  got = um_copy_to_host(st->s[i].b, off, out, len, async ? &e : NULL);
  expect(st, got, errors, 0, "um_copy_to_host");
  if (got != UM_OK) {
    free(out);
    return;
  }
  if (async) {
    add_event(st, e, false, out, len, st->s[i].expect + off, st->s[i].known + off);
  } else {
    model_check(i, off, out, st->s[i].expect + off, st->s[i].known + off, len, "um_copy_to_host");
    free(out);
  }
}

static void op_copy(state *st, input *in) {
  int d = live_slot(st, in), s = live_slot(st, in);
  size_t doff, soff, len, len2;
  bool async;
  unsigned errors;
  um_event *e = NULL;
  int got;
  if (d < 0 || s < 0)
    return;
  range_arg(in, st->s[d].size, &doff, &len);
  range_arg(in, st->s[s].size, &soff, &len2);
  if (pick(in, 4) != 0)
    len = len2 < len ? len2 : len; /* mostly both sides fit */
  async = pick(in, 2) != 0;
  errors = dst_errors(st, d, doff, len) | src_errors(st, s, soff, len);
  if (errors & BIT(UM_EINVAL))
    errors = BIT(UM_EINVAL);
  st->seq++;
  TRACE("copy slot %d off %zu <- slot %d off %zu len %zu async %d seq %llu\n", d, doff, s, soff, len, async, (unsigned long long)st->seq);
  got = um_copy(st->s[d].b, doff, st->s[s].b, soff, len, async ? &e : NULL);
  expect(st, got, errors, 0, "um_copy");
  if (got != UM_OK) {
    if (errors == 0)
      model_unknown(st, d, doff, len);
    return;
  }
  model_copy(st, d, doff, s, soff, len);
  log_write(st, d, doff, len, async);
  if (async)
    add_event(st, e, false, NULL, 0, NULL, NULL);
}

static void op_fill(state *st, input *in) {
  int i = live_slot(st, in);
  size_t off, len;
  int v;
  bool async;
  unsigned errors;
  um_event *e = NULL;
  int got;
  if (i < 0)
    return;
  range_arg(in, st->s[i].size, &off, &len);
  v = (int)u8(in) - (pick(in, 8) == 0 ? 512 : 0); /* the value is taken modulo 256 */
  async = pick(in, 2) != 0;
  errors = dst_errors(st, i, off, len);
  st->seq++;
  TRACE("fill slot %d off %zu len %zu v %d async %d seq %llu\n", i, off, len, v, async, (unsigned long long)st->seq);
  got = um_fill(st->s[i].b, off, v, len, async ? &e : NULL);
  expect(st, got, errors, 0, "um_fill");
  if (got != UM_OK) {
    if (errors == 0)
      model_unknown(st, i, off, len);
    return;
  }
  memset(st->s[i].expect + off, (unsigned char)v, len);
  memset(st->s[i].known + off, 1, len);
  log_write(st, i, off, len, async);
  if (async)
    add_event(st, e, false, NULL, 0, NULL, NULL);
}

static bool mode_writes(um_map_mode m) { return m != UM_MAP_READ; }

static void op_map(state *st, input *in) {
  int i = live_slot(st, in);
  unsigned msel;
  um_map_mode mode;
  size_t off, len;
  unsigned errors = 0;
  void *p = NULL;
  int got;
  if (i < 0)
    return;
  msel = pick(in, 5);
  mode = msel < 4 ? (um_map_mode)msel : (um_map_mode)9;
  range_arg(in, st->s[i].size, &off, &len);
  if (msel == 4 || len == 0)
    errors |= BIT(UM_EINVAL);
  else {
    errors |= range_errors(st->s[i].size, off, len);
    if (st->s[i].readonly && mode_writes(mode))
      errors |= BIT(UM_ESTATE);
    if (st->s[i].mapped)
      errors |= BIT(UM_ESTATE);
  }
  if (st->faults)
    drain(st);
  TRACE("map slot %d mode %d off %zu len %zu\n", i, (int)mode, off, len);
  got = um_map(st->s[i].b, mode, off, len, &p);
  expect(st, got, errors, 0, "um_map");
  if (got != UM_OK)
    return;
  if (mode != UM_MAP_WRITE_DISCARD)
    model_check(i, off, p, st->s[i].expect + off, st->s[i].known + off, len, "um_map");
  st->s[i].mapped = true;
  st->s[i].map_ptr = p;
  st->s[i].map_off = off;
  st->s[i].map_len = len;
  st->s[i].map_mode = mode;
  if (mode_writes(mode)) {
    /* Write a pattern through the mapping; the model takes it at unmap.
     * A host view is the buffer itself: those bytes change at once. */
    size_t poff = pick(in, 200);
    memcpy(p, pattern + poff, len);
    model_unknown(st, i, off, len);
    memcpy(st->s[i].expect + off, pattern + poff, len); /* remembered, known at unmap */
  }
}

static void op_unmap(state *st, input *in) {
  int i = live_slot(st, in);
  bool wrong = pick(in, 8) == 0;
  slot *s;
  int got;
  unsigned errors = 0;
  char other;
  if (i < 0)
    return;
  s = &st->s[i];
  if (!s->mapped)
    errors = BIT(UM_ESTATE);
  else if (wrong)
    errors = BIT(UM_EINVAL);
  TRACE("unmap slot %d wrong %d\n", i, wrong);
  got = um_unmap(s->b, wrong ? (void *)&other : s->map_ptr);
  expect(st, got, errors, 0, "um_unmap");
  if (!s->mapped || wrong)
    return;
  s->mapped = false;
  if (mode_writes(s->map_mode)) {
    if (got == UM_OK)
      memset(s->known + s->map_off, 1, s->map_len);
    else
      model_unknown(st, i, s->map_off, s->map_len);
  }
}

static void op_batch(state *st, input *in) {
  um_copy_op ops[4];
  unsigned n = 1 + pick(in, 4), errors = 0;
  unsigned char *outs[4] = {NULL, NULL, NULL, NULL};
  int dsts[4], srcs[4];
  um_event *e = NULL;
  bool async = pick(in, 2) != 0;
  int got;
  memset(ops, 0, sizeof(ops));
  for (unsigned k = 0; k < n; k++) {
    unsigned kind = pick(in, 3);
    int d = live_slot(st, in), s = live_slot(st, in);
    size_t off, len, off2, len2;
    dsts[k] = srcs[k] = -1;
    if (d < 0 || s < 0)
      return;
    range_arg(in, st->s[d].size, &off, &len);
    range_arg(in, st->s[s].size, &off2, &len2);
    len = len2 < len ? len2 : len;
    if (kind == 0) { /* host -> buffer */
      ops[k] = (um_copy_op){.dst = st->s[d].b, .dst_off = off, .host_src = pattern + pick(in, 200), .bytes = len};
      errors |= dst_errors(st, d, off, len);
      dsts[k] = d;
    } else if (kind == 1) { /* buffer -> host */
      outs[k] = malloc(len == 0 || range_errors(st->s[s].size, off2, len) ? 16 : len);
      if (outs[k] == NULL)
        abort();
      ops[k] = (um_copy_op){.host_dst = outs[k], .src = st->s[s].b, .src_off = off2, .bytes = len};
      errors |= src_errors(st, s, off2, len);
      srcs[k] = s;
    } else {
      ops[k] = (um_copy_op){.dst = st->s[d].b, .dst_off = off, .src = st->s[s].b, .src_off = off2, .bytes = len};
      errors |= dst_errors(st, d, off, len) | src_errors(st, s, off2, len);
      dsts[k] = d;
      srcs[k] = s;
    }
    ops[k].dst_off = ops[k].dst ? ops[k].dst_off : 0;
    (void)off;
  }
  if (!async && st->faults)
    drain(st);
  st->seq++;
  TRACE("batch of %u async %d seq %llu\n", n, async, (unsigned long long)st->seq);
  got = um_copy_batch(st->m, ops, n, async ? &e : NULL);
  expect(st, got, errors, 0, "um_copy_batch");
  if (errors != 0 || (got != UM_OK && !async)) {
    /* refused before issuing anything, or failed: the writes are unknown */
    if (errors == 0)
      for (unsigned k = 0; k < n; k++)
        if (dsts[k] >= 0)
          model_unknown(st, dsts[k], ops[k].dst_off, ops[k].bytes);
    for (unsigned k = 0; k < n; k++)
      free(outs[k]);
    return;
  }
  /* In issue order; reads are checked now (blocking) or kept out of the
   * check (asynchronous batch: their order against the batch's other
   * operations on other buffers is free). */
  for (unsigned k = 0; k < n; k++) {
    if (outs[k] != NULL) {
      if (!async)
        model_check(srcs[k], ops[k].src_off, outs[k], st->s[srcs[k]].expect + ops[k].src_off,
                    st->s[srcs[k]].known + ops[k].src_off, ops[k].bytes, "batch read");
    } else if (ops[k].host_src != NULL) {
      model_set(st, dsts[k], ops[k].dst_off, ops[k].host_src, ops[k].bytes);
      log_write(st, dsts[k], ops[k].dst_off, ops[k].bytes, async);
    } else {
      model_copy(st, dsts[k], ops[k].dst_off, srcs[k], ops[k].src_off, ops[k].bytes);
      log_write(st, dsts[k], ops[k].dst_off, ops[k].bytes, async);
    }
  }
  for (unsigned k = 0; k < n; k++) {
    if (outs[k] == NULL)
      continue;
    if (async)
      keep(st, outs[k]); /* written by the batch until it completes */
    else
      free(outs[k]);
  }
  if (async)
    add_event(st, e, true, NULL, 0, NULL, NULL);
}

static void op_event(state *st, input *in) {
  unsigned what = pick(in, 4);
  int k;
  if (st->nev == 0)
    return;
  k = (int)pick(in, (unsigned)st->nev);
  TRACE("event op %u on seq %llu\n", what, (unsigned long long)st->ev[k].seq);
  switch (what) {
  case 0: /* wait, in issue order */
    finish_in_order(st, st->ev[k].seq);
    break;
  case 1: { /* query */
    int got = um_event_query(st->ev[k].e);
    if (got != UM_EAGAIN && got != UM_OK && got != UM_ECANCELED && !(st->faults && (FAULT_CODES & BIT(got))))
      FAIL("um_event_query answered %s", um_err_name(got));
    if (st->ev[k].canceled && got != UM_EAGAIN && got != UM_ECANCELED)
      FAIL("query of a canceled operation answered %s", um_err_name(got));
    break;
  }
  case 2: { /* cancel */
    int got = um_event_cancel(st->ev[k].e);
    TRACE("  um_event_cancel -> %s\n", um_err_name(got));
    if (got == UM_OK) {
      if (st->ev[k].canceled || st->ev[k].is_batch)
        FAIL("canceled twice, or a batch canceled");
      st->ev[k].canceled = true;
      taint_from(st, st->ev[k].seq);
      if (st->ev[k].want_known)
        memset(st->ev[k].want_known, 0, st->ev[k].len);
    } else if (got != UM_EBUSY) {
      FAIL("um_event_cancel answered %s", um_err_name(got));
    }
    break;
  }
  default: /* release without waiting: the outcome stays unknown */
    taint_from(st, st->ev[k].seq);
    event_release(st, k);
    if (st->ev[k].out != NULL) {
      keep(st, st->ev[k].out);
      st->ev[k].out = NULL;
    }
    event_forget(st, k);
    break;
  }
}

/* A released handle answers UM_ESTATE to everything, until the library
 * gives its object to a later allocation (without the debug quarantine)
 * or operation: handles the program holds again are skipped. */
static void stale_buffer(state *st, input *in) {
  um_buffer *b;
  int k;
  char tmp[16];
  void *p = NULL;
  if (st->nstale == 0)
    return;
  k = (int)pick(in, (unsigned)st->nstale);
  b = st->stale[k];
  for (int i = 0; i < NSLOTS; i++)
    if (st->s[i].b == b)
      return;
  switch (pick(in, 6)) {
  case 0:
    expect(st, um_release(b), BIT(UM_ESTATE), 0, "stale um_release");
    check_stats(st, st->stale_dev[k]);
    break;
  case 1: expect(st, um_copy_from_host(b, 0, pattern, 1, NULL), BIT(UM_ESTATE), 0, "stale copy"); break;
  case 2: expect(st, um_copy_to_host(b, 0, tmp, 1, NULL), BIT(UM_ESTATE), 0, "stale read"); break;
  case 3: expect(st, um_fill(b, 0, 0, 1, NULL), BIT(UM_ESTATE), 0, "stale fill"); break;
  case 4: expect(st, um_map(b, UM_MAP_READ, 0, 1, &p), BIT(UM_ESTATE), 0, "stale map"); break;
  default:
    if (um_buffer_size(b) != 0 || um_buffer_host_ptr(b) != NULL)
      FAIL("getters of a stale handle");
    break;
  }
}

static void stale_event(state *st, input *in) {
  um_event *e;
  if (st->nstale_ev == 0)
    return;
  e = st->stale_ev[pick(in, (unsigned)st->nstale_ev)];
  for (int k = 0; k < st->nev; k++)
    if (st->ev[k].e == e)
      return;
  TRACE("stale event %p\n", (void *)e);
  switch (pick(in, 4)) {
  case 0: expect(st, um_event_wait(e), BIT(UM_ESTATE), 0, "stale um_event_wait"); break;
  case 1: expect(st, um_event_query(e), BIT(UM_ESTATE), 0, "stale um_event_query"); break;
  case 2: expect(st, um_event_cancel(e), BIT(UM_ESTATE), 0, "stale um_event_cancel"); break;
  default: expect(st, um_event_release(e), BIT(UM_ESTATE), 0, "stale um_event_release"); break;
  }
}

static void op_stale(state *st, input *in) {
  if (pick(in, 4) == 3)
    stale_event(st, in);
  else
    stale_buffer(st, in);
}

static void op_verify(state *st, input *in) {
  int i = live_slot(st, in);
  int got;
  if (i < 0 || !readable_whole(st, i))
    return;
  if (st->faults)
    drain(st);
  TRACE("verify slot %d\n", i);
  got = um_copy_to_host(st->s[i].b, 0, readback, st->s[i].size, NULL);
  expect(st, got, 0, 0, "read back");
  if (got == UM_OK)
    model_check(i, 0, readback, st->s[i].expect, st->s[i].known, st->s[i].size, "read back");
}

static void op_fault(state *st, input *in) {
  unsigned what = pick(in, 8);
  uint64_t nth = 0;
  fault_counts c;
  fault_counts_get(&c);
  if (what < 3) {
    nth = c.allocs + 1 + pick(in, 4);
    fault_fail_alloc(nth, what == 2);
  } else if (what < 7) {
    nth = c.xfers + 1 + pick(in, 8);
    fault_fail_xfer(nth, what == 6, UM_EBACKEND, what >= 5);
  } else {
    int dev = 1 + (int)pick(in, (unsigned)(st->ndev - 1));
    fault_lose(st->devs[dev]);
  }
  TRACE("fault plan %u: %s %llu\n", what, what < 3 ? "allocation" : what < 7 ? "transfer" : "device lost",
        (unsigned long long)nth);
  st->faults = true;
}

static void op_misc(state *st, input *in) {
  switch (pick(in, 5)) {
  case 0: expect(st, um_pool_trim(st->m, (uint64_t)pick(in, 4) << 14), 0, 0, "um_pool_trim"); break;
  case 1: {
    int dev = (int)pick(in, (unsigned)st->ndev);
    expect(st, um_device_synchronize(st->devs[dev]), 0, 0, "um_device_synchronize");
    break;
  }
  case 2: {
    uint64_t f, t;
    int dev = (int)pick(in, (unsigned)st->ndev);
    expect(st, um_device_memory(st->devs[dev], &f, &t), 0, 0, "um_device_memory");
    break;
  }
  case 3: fault_disarm(); break;
  default: {
    /* bad arguments of every kind: nothing may change */
    um_buffer *b = NULL;
    expect(st, um_alloc(st->m, st->devs[0], 0, UM_HOST, 0, &b), BIT(UM_EINVAL), 0, "zero size");
    expect(st, um_alloc_array(st->m, st->devs[0], SIZE_MAX / 3, 5, UM_HOST, 0, &b), BIT(UM_EOVERFLOW), 0,
           "overflow");
    expect(st, um_alloc(st->m, st->devs[0], (size_t)1 << 63, UM_HOST, 0, &b), BIT(UM_ENOMEM), 0, "huge");
    expect(st, um_copy_batch(st->m, NULL, 1, NULL), BIT(UM_EINVAL), 0, "NULL batch");
    expect(st, um_release(NULL), BIT(UM_EINVAL), 0, "NULL release");
    expect(st, um_event_wait(NULL), BIT(UM_EINVAL), 0, "NULL event");
    if (b != NULL)
      FAIL("a refused allocation wrote *out");
    check_stats(st, 0);
    break;
  }
  }
}

/* ------------------------------------------------------------------------ */
/* Managers, kept from one input to the next.
 *
 * Creating a manager (its devices' pools, its transfer workers, the fault
 * devices' queue threads) costs about 1.3 ms in the fuzzing build and
 * destroying it 0.8 ms, several times a whole input. So each
 * configuration (the input's first two bytes) gets one manager, kept for
 * later inputs, at most NMANAGERS of them (the least recently used is
 * destroyed to make room). Between inputs a kept manager goes back to what
 * a new one looks like from outside: nothing live or pending, no idle
 * block in the pool or the debug quarantine, no pinned staging chunk,
 * every fault device working, no fault planned. reset_manager does it and
 * checks it, so that one input cannot change the next and a leak across
 * inputs stops the fuzzer at the input that made it.
 *
 * Configuration: c0 bit 0 debug quarantine, 1 pooling off, 2 scrub, 3 no
 * pinned staging, 4 two transfer workers instead of one (bit 5 is not
 * read: a third and fourth worker added threads and lock contention, not
 * paths), 6 two devices per fault backend; c1 bit
 * 0 small pool, 1 small pool classes, 2 small fault devices, 3-4 the
 * asynchronous fault flavour: 0 "fault" (its queue thread completes
 * transfers, the core's workers finish them), 1 "fault-queue" (one
 * in-order queue per device: a batch's copies go quietly in runs behind
 * queue marks, completions re-enter the core on the queue thread), 2 and 3
 * "fault-inline" (as "fault-queue", but an idle queue runs a transfer and
 * its completion on the submitting thread, inside the core's call, as
 * PoCL's "basic" device does).
 *
 * Only the options that shape the manager when it is made (debug and
 * pooling: the thread caches; workers; devices, their flavour and their
 * memory) choose the kept manager: 96 of them. Scrub, pinned staging and the pool's
 * limits are read where they are used (an allocation, a transfer, a
 * reservation), so apply_options sets them on the kept manager for each
 * input, when it holds nothing: no block pooled or reserved, no staging
 * chunk, nothing running (reset_manager checks it). With the ten bits in
 * the key, 128 kept managers of 512 configurations were evicted and made
 * again 1,300 times a minute, 5% of the time.
 *
 * One input in 256 (by a hash of all its bytes) ends by destroying its
 * manager instead of the reset: the destroy path with the pool, the thread
 * caches, the quarantine and the staging chunks still full, and
 * operations whose events were released unwaited still running. It pays
 * for the destroy and the next creation, about 2 ms, ten inputs' time. A
 * hash, not a configuration bit: a mutant almost never keeps it, so the
 * share stays 1/256 (with "bit 7 of c0 and of c1" the inputs that had it
 * bred, and took from 0.1% to 6% of the executions of a run).
 *
 * Staging chunks of 16 KiB, two of them kept: transfers of more than
 * 16 KiB to and from the fault devices are pipelined, those above 32 KiB
 * reuse a chunk (wait for its previous DMA), and a second pipelined
 * transfer at the same time allocates chunks beyond the pool's bound. Each
 * chunk is two thread hand-offs (the device's queue thread, then the
 * waiter): with 4 KiB chunks, reading a 64 KiB buffer back cost 16 of
 * them, and read-backs were a third of the fuzzer's time. */

#define NMANAGERS 128

typedef struct kept_manager {
  um_manager *m;
  unsigned config;
  uint64_t last_use;
} kept_manager;

static kept_manager kept[NMANAGERS];
static uint64_t inputs_run, managers_made, managers_evicted, managers_ended;

/* How often an input found its manager kept (libFuzzer: at exit). */
static void print_summary(FILE *to, const char *what) {
  fprintf(to, "fuzz_api: %llu inputs %s, %llu managers made (%llu evicted, %llu destroyed by inputs)\n",
          (unsigned long long)inputs_run, what, (unsigned long long)managers_made,
          (unsigned long long)managers_evicted, (unsigned long long)managers_ended);
}

#ifdef UNIMEM_FUZZ_LIBFUZZER
static void print_summary_at_exit(void) { print_summary(stderr, "run"); }
#endif

static void quiet(void *ctx, um_log_level level, const char *msg) { (void)ctx, (void)level, (void)msg; }

/* The manager's key: the bits of c0 and c1 that shape a manager, with the
 * flavour (c1 bits 3-4) as 0, 1 or 2 (3 is "fault-inline" as 2 is: one
 * manager for both, so 32 x 3 = 96 keys). */
static unsigned config_of(uint8_t c0, uint8_t c1) {
  unsigned flavour = (c1 >> 3) & 3u;
  return (c0 & 0x53u) | (unsigned)(c1 & 4u) << 7 | (flavour < 2 ? flavour : 2u) << 10;
}

/* The asynchronous fault flavour of a configuration. */
static const um__backend *async_flavour(unsigned config) {
  static const um__backend *const flavours[] = {&fault_backend, &fault_backend_queue, &fault_backend_inline};
  return flavours[config >> 10];
}

/* The options read at their use, set for this input (see above). */
static void apply_options(um_manager *m, uint8_t c0, uint8_t c1) {
  m->opts.scrub = (c0 & 4) != 0;
  m->opts.use_pinned_staging = !(c0 & 8);
  m->opts.max_pool_bytes = (c1 & 1) ? 64 * 1024 : 8u << 20;
  m->opts.max_pool_bytes_per_class = (c1 & 2) ? 16 * 1024 : 4u << 20;
}

static um_manager *manager_create(unsigned config) {
  um_options o;
  um_manager *m = NULL;
  um_options_init(&o);
  snprintf(o.backends, sizeof(o.backends), "cpu");
  o.debug = config & 1;
  o.enable_pooling = !(config & 2);
  o.max_concurrent_transfers = 1 + (int)((config >> 4) & 1);
  o.trim_interval_ms = 0;
  o.staging_chunk_bytes = 16384;
  o.pinned_pool_bytes = 32768;
  o.log = quiet;
  fault_configure((config & 64) ? 2 : 1, (config & 0x200) ? 128u * 1024u : 1u << 20);
  if (fault_manager_create_with(&o, async_flavour(config), &m) != UM_OK)
    FAIL("manager");
  return m;
}

/* Destroy a manager that holds nothing: it must find no leak, and no
 * fault device block may be left (every other kept manager holds none
 * between inputs). */
static void manager_destroy(kept_manager *k) {
  fault_counts fc;
  int got = um_manager_destroy(k->m);
  if (got != UM_OK)
    FAIL("um_manager_destroy answered %s", um_err_name(got));
  fault_counts_get(&fc);
  if (fc.live_blocks != 0 || fc.leaked_at_close != 0)
    FAIL("%llu device blocks left after destroy, %llu leaked at close", (unsigned long long)fc.live_blocks,
         (unsigned long long)fc.leaked_at_close);
  k->m = NULL;
}

/* The kept manager of this configuration, made when there is none. */
static kept_manager *manager_for(unsigned config) {
  kept_manager *lru = &kept[0];
  for (int i = 0; i < NMANAGERS; i++) {
    if (kept[i].m != NULL && kept[i].config == config) {
      kept[i].last_use = inputs_run;
      return &kept[i];
    }
    if (kept[i].m == NULL || (lru->m != NULL && kept[i].last_use < lru->last_use))
      lru = &kept[i];
  }
  if (lru->m != NULL) {
    manager_destroy(lru);
    managers_evicted++;
  }
  lru->m = manager_create(config);
  managers_made++;
  lru->config = config;
  lru->last_use = inputs_run;
  return lru;
}

/* Everything the program holds goes back: events (in issue order),
 * mappings, buffers. Then the model holds nothing, and neither may the
 * manager's statistics. */
static void wind_down(state *st) {
  int got;
  drain(st);
  fault_disarm();
  for (int i = 0; i < NSLOTS; i++) {
    if (!live(st, i))
      continue;
    if (st->s[i].mapped) {
      got = um_unmap(st->s[i].b, st->s[i].map_ptr);
      expect(st, got, 0, 0, "final unmap");
      st->s[i].mapped = false;
    }
    expect(st, um_release(st->s[i].b), 0, 0, "final release");
    drop_slot(st, i);
  }
  check_stats(st, -1);
}

/* Back to a new manager's state, and check that it is: no buffer, no
 * byte in use, pooled or held from a device, and no fault device block
 * anywhere. Operations whose events the program released unwaited may
 * still run, and so may their deferred releases: wait for them first. */
static void reset_manager(state *st) {
  um_stats s;
  fault_counts fc;
  if (um_device_synchronize(st->devs[0]) != UM_OK)
    FAIL("um_device_synchronize of the cpu");
  for (int i = 1; i < st->ndev; i++) {
    if (fault_restore(st->devs[i]) != UM_OK)
      FAIL("device %d is not a fault device", i);
    expect(st, um_device_synchronize(st->devs[i]), 0, 0, "um_device_synchronize");
  }
  um__quarantine_flush(st->m);
  for (int i = 0; i < st->ndev; i++)
    um__staging_free_all(st->devs[i]);
  expect(st, um_pool_trim(st->m, 0), 0, 0, "um_pool_trim");
  if (um_stats_get(st->m, NULL, &s) != UM_OK)
    FAIL("um_stats_get");
  if (s.active_buffers != 0 || s.bytes_in_use != 0 || s.bytes_pooled != 0 || s.bytes_reserved != 0)
    FAIL("after the reset: %llu buffers, %llu bytes in use, %llu pooled, %llu reserved",
         (unsigned long long)s.active_buffers, (unsigned long long)s.bytes_in_use,
         (unsigned long long)s.bytes_pooled, (unsigned long long)s.bytes_reserved);
  fault_counts_get(&fc);
  if (fc.live_blocks != 0)
    FAIL("%llu device blocks left after the reset", (unsigned long long)fc.live_blocks);
}

/* Whether the input ends by destroying its manager: FNV-1a of its bytes,
 * top byte 0. */
static bool ends_by_destroy(const uint8_t *data, size_t size) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < size; i++)
    h = (h ^ data[i]) * 16777619u;
  return (h >> 24) == 0;
}

/* The manager's reset, or its destroy. Without coverage, as are the
 * library's paths that make and destroy managers (coverage_ignore.txt). */
static void end_input(state *st, kept_manager *k, bool destroy) {
  if (destroy) {
    manager_destroy(k);
    managers_ended++;
  } else {
    reset_manager(st);
  }
}

static void run_program(state *st, input *in) {
  int ops = 0;
  while (in->at < in->n && ops++ < MAX_OPS) {
    switch (pick(in, 20)) {
    case 0:
    case 1:
    case 2: op_alloc(st, in); break;
    case 3: op_wrap(st, in); break;
    case 4:
    case 5: op_release(st, in); break;
    case 6:
    case 7: op_h2d(st, in); break;
    case 8: op_d2h(st, in); break;
    case 9:
    case 10: op_copy(st, in); break;
    case 11: op_fill(st, in); break;
    case 12: op_map(st, in); break;
    case 13: op_unmap(st, in); break;
    case 14: op_batch(st, in); break;
    case 15: op_event(st, in); break;
    case 16: op_stale(st, in); break;
    case 17: op_verify(st, in); break;
    case 18: op_fault(st, in); break;
    default: op_misc(st, in); break;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool init;
  input in = {data, size, 0};
  state *st;
  kept_manager *k;
  uint8_t c0, c1;

  if (!init) {
    for (size_t i = 0; i < sizeof(pattern); i++)
      pattern[i] = (unsigned char)(i * 131u + (i >> 9) * 7u + 1u);
    trace = getenv("FUZZ_TRACE") != NULL;
#ifdef UNIMEM_FUZZ_LIBFUZZER
    atexit(print_summary_at_exit);
#endif
    init = true;
  }
  inputs_run++;
  st = calloc(1, sizeof(*st));
  if (st == NULL)
    abort();
  c0 = u8(&in);
  c1 = u8(&in);
  st->scrub = (c0 & 4) != 0;
  fault_reset();
  k = manager_for(config_of(c0, c1));
  st->m = k->m;
  apply_options(st->m, c0, c1);
  st->ndev = um_device_count(st->m);
  for (int i = 0; i < st->ndev; i++)
    st->devs[i] = um_device_get(st->m, i);

  run_program(st, &in);
  wind_down(st);
  end_input(st, k, ends_by_destroy(data, size));
  /* Nothing runs any more: memory an operation could write is free. */
  for (int i = 0; i < st->nkeep; i++)
    free(st->keep[i]);
  free(st->keep);
  free(st);
  return 0;
}

#ifndef UNIMEM_FUZZ_LIBFUZZER
/* Replay: run each file named on the command line, then destroy the kept
 * managers (each must find nothing leaked). */
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    static uint8_t buf[1 << 16];
    size_t len;
    if (f == NULL) {
      fprintf(stderr, "fuzz_api: cannot open %s\n", argv[i]);
      return 1;
    }
    len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, len);
  }
  for (int i = 0; i < NMANAGERS; i++)
    if (kept[i].m != NULL)
      manager_destroy(&kept[i]);
  print_summary(stdout, "replayed, no mismatch");
  return 0;
}
#endif
