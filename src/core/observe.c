/* Observing a manager: tags (a stack per thread), the statistics of each
 * tag per device, scopes (a stack per manager, RMM's push and pop of
 * counters), and what each block is stamped with (tag, thread, birth) for
 * the snapshot (snapshot.c).
 *
 * m->observing is 0 until a tag is used, a scope opens or a history
 * records (history.c); while it is not 0, every allocation (the thread
 * cache's hit included) calls um__obs_alloc and every release
 * um__obs_release: one relaxed load and a branch on the fast paths when it
 * is 0. Tags stay on for the manager's life once used: a tagged buffer
 * must come back through um__obs_release.
 *
 * Tag 0 is "not counted" (the buffer was allocated while no tag had been
 * used), tag 1 the untagged (""), 2 and up the names in their order. */
#include <dlfcn.h>
#include <execinfo.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "core.h"

#define NDIR 6 /* h2d, d2h, d2d, peer, net out, net in */
#define NSLOTS (UM_TAGS_MAX + 2) /* the names, "not counted" and "" */

/* A tag's counts on one device, or (the last row) on all: the all row
 * keeps in_use and peak alone (its allocations and releases are the
 * devices' summed when read), so that an event costs three atomic adds. */
typedef struct tag_ctr {
  atomic_uint_fast64_t allocs, releases, in_use, peak;
  atomic_uint_fast64_t moved[NDIR];
} tag_ctr;

typedef struct scope {
  uint64_t start, allocs, releases, bytes; /* the manager's counts when it began */
  uint64_t outer_peak;                     /* the scope around it: its peak so far */
} scope;

struct um__obs {
  pthread_mutex_t lock; /* names, scopes, turning observing on and off */
  uint64_t id;          /* this manager's, for the threads' stacks */
  uint64_t t0;          /* the manager's creation */
  int ndev;
  _Atomic int ntags;                       /* names made (0 and 1 included) */
  char (*names)[UM_TAG_NAME_MAX];          /* NSLOTS */
  tag_ctr *_Atomic *ctr;                   /* NSLOTS, each ndev + 1 (the last: all devices) */
  bool tags_on;
  int why;                                 /* OBS_* bits */
  /* The bytes in use per device while it observes; and, while a scope is
   * open (scopes_open), the manager's counts of all devices. */
  atomic_int_fast64_t dev_in_use[UM__MAX_DEVICES];
  atomic_int scopes_open;
  atomic_int_fast64_t in_use;
  atomic_uint_fast64_t allocs, releases, bytes;
  atomic_uint_fast64_t scope_peak; /* the innermost scope's peak */
  int nscopes;
  scope scopes[UM_TAG_DEPTH_MAX];
};

enum { OBS_TAGS = 1, OBS_SCOPES = 2, OBS_HISTORY = 4, OBS_ALWAYS = 8 /* um_options.backtraces */ };

static _Atomic uint64_t obs_ids;

/* A thread's tags on one manager. */
typedef struct tag_stack {
  uint64_t mid; /* the manager's id; 0: unused */
  int depth;
  uint16_t tags[UM_TAG_DEPTH_MAX];
} tag_stack;

/* Each thread's stacks, one per manager it tags on, on the heap (the
 * library's thread-local storage is the static kind, of which a library
 * that Python loads has little): made at the thread's first tag, grown when
 * full, freed at its exit. A stack of a manager destroyed since is free
 * again (live_ids: the managers alive, looked at only when the stacks are
 * full). */
typedef struct thread_stacks {
  int n;
  tag_stack s[];
} thread_stacks;
static _Thread_local thread_stacks *stacks;
static pthread_key_t stacks_key;
static pthread_once_t stacks_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *live_ids;
static size_t nlive, live_cap;

static void stacks_key_make(void) { (void)pthread_key_create(&stacks_key, free); }

static bool alive(uint64_t id) {
  for (size_t i = 0; i < nlive; i++)
    if (live_ids[i] == id)
      return true;
  return false;
}

/* A free stack of this thread's (made room for when make), NULL when
 * there is no memory for one. */
static tag_stack *free_stack(bool make) {
  thread_stacks *t = stacks, *grown;
  int n = t != NULL ? t->n : 0;
  for (int i = 0; i < n; i++)
    if (t->s[i].mid == 0 || t->s[i].depth == 0)
      return &t->s[i];
  if (!make)
    return NULL;
  pthread_mutex_lock(&live_lock); /* the stacks of managers gone */
  for (int i = 0; i < n; i++)
    if (!alive(t->s[i].mid))
      t->s[i].mid = 0, t->s[i].depth = 0;
  pthread_mutex_unlock(&live_lock);
  for (int i = 0; i < n; i++)
    if (t->s[i].mid == 0)
      return &t->s[i];
  pthread_once(&stacks_once, stacks_key_make);
  grown = realloc(t, sizeof(*t) + (size_t)(n ? 2 * n : 4) * sizeof(tag_stack));
  if (grown == NULL)
    return NULL;
  memset(&grown->s[n], 0, (size_t)(n ? n : 4) * sizeof(tag_stack));
  grown->n = n ? 2 * n : 4;
  stacks = grown;
  (void)pthread_setspecific(stacks_key, grown);
  return &grown->s[n];
}
static _Thread_local uint16_t forced_tag; /* um_alloc_tagged's, for the allocation it makes */
static _Thread_local unsigned thread_no;
static _Atomic unsigned threads_numbered;

unsigned um__thread_number(void) {
  if (thread_no == 0)
    thread_no = atomic_fetch_add(&threads_numbered, 1) + 1;
  return thread_no;
}

int um__obs_create(um_manager *m) {
  um__obs *o = calloc(1, sizeof(*o));
  if (o == NULL)
    return UM_ENOMEM;
  o->names = calloc(NSLOTS, sizeof(*o->names));
  o->ctr = calloc(NSLOTS, sizeof(*o->ctr));
  if (o->names == NULL || o->ctr == NULL) {
    free(o->names);
    free(o->ctr);
    free(o);
    return UM_ENOMEM;
  }
  pthread_mutex_init(&o->lock, NULL);
  o->id = atomic_fetch_add(&obs_ids, 1) + 1;
  pthread_mutex_lock(&live_lock);
  if (nlive == live_cap) {
    uint64_t *grown = realloc(live_ids, (live_cap ? 2 * live_cap : 16) * sizeof(*grown));
    if (grown == NULL) {
      pthread_mutex_unlock(&live_lock);
      free(o->names);
      free(o->ctr);
      free(o);
      return UM_ENOMEM;
    }
    live_ids = grown;
    live_cap = live_cap ? 2 * live_cap : 16;
  }
  live_ids[nlive++] = o->id;
  pthread_mutex_unlock(&live_lock);
  o->t0 = um__now_ns();
  o->ndev = UM__MAX_DEVICES; /* devices may be adopted later */
  m->obs = o;
  if (m->opts.backtraces) { /* every allocation is stamped, from the first */
    o->why = OBS_ALWAYS;
    atomic_store(&m->observing, 1);
  }
  return UM_OK;
}

/* ------------------------------------------------------------------------ */
/* Backtraces (um_options.backtraces) */

/* Where this library is loaded, or 0 where it is part of the program (a
 * static link): its frames are left out of a backtrace only when it is a
 * library of its own. */
static uintptr_t self_base;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static void find_self(void) {
  Dl_info me, prog;
  void *entry = (void *)getauxval(AT_ENTRY);
  if (dladdr((void *)&um_alloc, &me) == 0)
    return;
  if (entry != NULL && dladdr(entry, &prog) != 0 && prog.dli_fbase == me.dli_fbase)
    return;
  self_base = (uintptr_t)me.dli_fbase;
}

/* b's allocation's return addresses, from the first outside this library,
 * at most UM_SNAPSHOT_FRAMES. */
static void record_frames(um_buffer *b) {
  void *raw[UM_SNAPSHOT_FRAMES + 32];
  int n = backtrace(raw, (int)(sizeof(raw) / sizeof(raw[0]))), k = 0;
  pthread_once(&self_once, find_self);
  for (Dl_info i; self_base != 0 && k < n && dladdr(raw[k], &i) != 0 && (uintptr_t)i.dli_fbase == self_base;)
    k++;
  n -= k;
  if (n > UM_SNAPSHOT_FRAMES)
    n = UM_SNAPSHOT_FRAMES;
  /* One array per descriptor, kept from life to life (a snapshot may be
   * reading it: snapshot.c), freed with the manager. */
  if (b->frames == NULL && (b->frames = malloc(UM_SNAPSHOT_FRAMES * sizeof(void *))) == NULL)
    n = 0;
  if (n > 0)
    memcpy(b->frames, raw + k, (size_t)n * sizeof(void *));
  b->nframes = n;
}

void um__obs_frames_free(um_manager *m) {
  pthread_mutex_lock(&m->registry_lock);
  for (um_buffer *b = m->all_buffers; b != NULL; b = b->all_next) {
    free(b->frames);
    b->frames = NULL;
    b->nframes = 0;
  }
  pthread_mutex_unlock(&m->registry_lock);
}

void um__obs_destroy(um_manager *m) {
  um__obs *o = m->obs;
  if (o == NULL)
    return;
  pthread_mutex_lock(&live_lock);
  for (size_t i = 0; i < nlive; i++)
    if (live_ids[i] == o->id) {
      live_ids[i] = live_ids[--nlive];
      break;
    }
  pthread_mutex_unlock(&live_lock);
  for (int i = 0; i < NSLOTS; i++)
    free(atomic_load_explicit(&o->ctr[i], memory_order_relaxed));
  free(o->ctr);
  free(o->names);
  pthread_mutex_destroy(&o->lock);
  free(o);
  m->obs = NULL;
}

uint64_t um__obs_t0(const um_manager *m) { return m->obs->t0; }

/* Turn one reason to observe on or off (o->lock held); the caches see a
 * change at their next call. */
static void set_why_locked(um_manager *m, int bit, bool on) {
  um__obs *o = m->obs;
  int before = o->why;
  o->why = on ? o->why | bit : o->why & ~bit;
  if ((before != 0) == (o->why != 0))
    return;
  if (o->why != 0) { /* from here on the manager's own counts */
    um_stats s;
    for (int i = 0; i < um__ndevices(m); i++)
      atomic_store(&o->dev_in_use[i], um_stats_get(m, m->devices[i], &s) == UM_OK ? (int64_t)s.bytes_in_use : 0);
  }
  atomic_store(&m->observing, o->why != 0);
}

void um__obs_history(um_manager *m, bool on) {
  pthread_mutex_lock(&m->obs->lock);
  set_why_locked(m, OBS_HISTORY, on);
  pthread_mutex_unlock(&m->obs->lock);
}

/* The index of name, made when new; UM_ENOMEM (negative) when the table is full. */
static int tag_index(um_manager *m, const char *name) {
  um__obs *o = m->obs;
  int n = atomic_load_explicit(&o->ntags, memory_order_acquire), i;
  for (i = 2; i < n; i++)
    if (strcmp(o->names[i], name) == 0)
      return i;
  pthread_mutex_lock(&o->lock);
  n = atomic_load_explicit(&o->ntags, memory_order_relaxed);
  for (i = 2; i < n; i++)
    if (strcmp(o->names[i], name) == 0)
      break;
  if (i >= n) {
    int first = n == 0 ? 1 : n; /* the first name makes "" (1) too */
    if (first + (n == 0) >= NSLOTS) {
      pthread_mutex_unlock(&o->lock);
      return UM_ENOMEM;
    }
    for (int k = first; k <= first + (n == 0); k++) {
      tag_ctr *c = calloc((size_t)o->ndev + 1, sizeof(*c));
      if (c == NULL) {
        pthread_mutex_unlock(&o->lock);
        return UM_ENOMEM;
      }
      atomic_store_explicit(&o->ctr[k], c, memory_order_release);
    }
    i = first + (n == 0);
    snprintf(o->names[i], UM_TAG_NAME_MAX, "%s", name);
    atomic_store_explicit(&o->ntags, i + 1, memory_order_release);
    if (!o->tags_on) {
      o->tags_on = true;
      set_why_locked(m, OBS_TAGS, true);
    }
  }
  pthread_mutex_unlock(&o->lock);
  return i;
}

/* m is a manager this process may use (a fork child answers UM_ESTATE
 * for its parent's, touching nothing of it). */
int um__obs_check(um_manager *m, const char *fn) {
  if (!um__manager_ok(m))
    return um__set_error(UM_EINVAL, "%s: NULL or not a manager", fn);
  if (um__process_changed(m))
    return um__manager_check_process(m);
  return UM_OK;
}

static int check_name(um_manager *m, const char *name, const char *fn) {
  int st = um__obs_check(m, fn);
  if (st != UM_OK)
    return st;
  if (name == NULL)
    return um__set_error(UM_EINVAL, "%s: NULL name", fn);
  if (*name == '\0')
    return um__set_error(UM_EINVAL, "%s: an empty tag name", fn);
  if (strlen(name) >= UM_TAG_NAME_MAX)
    return um__set_error(UM_EINVAL, "%s: a tag name of %zu bytes (at most %d)", fn, strlen(name),
                         UM_TAG_NAME_MAX - 1);
  return UM_OK;
}

/* This thread's stack for m; made when make (NULL: none, or no memory). */
static tag_stack *stack_of(const um__obs *o, bool make) {
  tag_stack *t;
  for (int i = 0; stacks != NULL && i < stacks->n; i++)
    if (stacks->s[i].mid == o->id)
      return &stacks->s[i];
  if (!make || (t = free_stack(true)) == NULL)
    return NULL;
  t->mid = o->id;
  t->depth = 0;
  return t;
}

int um_tag_push(um_manager *m, const char *name) {
  int st = check_name(m, name, "um_tag_push"), i;
  tag_stack *s;
  if (st != UM_OK)
    return st;
  if ((s = stack_of(m->obs, true)) == NULL)
    return um__set_error(UM_ENOMEM, "um_tag_push: no memory for this thread's tags");
  if (s->depth == UM_TAG_DEPTH_MAX)
    return um__set_error(UM_EOVERFLOW, "um_tag_push: %d tags open on this thread", UM_TAG_DEPTH_MAX);
  if ((i = tag_index(m, name)) < 0)
    return um__set_error(i, "um_tag_push: %d tag names in use", UM_TAGS_MAX);
  s->tags[s->depth++] = (uint16_t)i;
  return UM_OK;
}

int um_tag_pop(um_manager *m) {
  tag_stack *s;
  int st = um__obs_check(m, "um_tag_pop");
  if (st != UM_OK)
    return st;
  if ((s = stack_of(m->obs, false)) == NULL || s->depth == 0)
    return um__set_error(UM_ESTATE, "um_tag_pop: no tag of this thread is open on the manager");
  s->depth--;
  return UM_OK;
}

/* The tag this thread's work on m counts for now: 0 while tags are off. */
uint16_t um__obs_tag_now(um_manager *m) {
  um__obs *o = m->obs;
  tag_stack *s;
  if (!o->tags_on)
    return 0;
  if (forced_tag != 0)
    return forced_tag;
  s = stack_of(o, false);
  return s != NULL && s->depth > 0 ? s->tags[s->depth - 1] : 1;
}

int um_alloc_tagged(um_manager *m, um_device *d, size_t bytes, um_location loc, unsigned flags, const char *tag,
                    um_buffer **out) {
  int st, i;
  if (tag == NULL) {
    if ((st = um__obs_check(m, "um_alloc_tagged")) != UM_OK)
      return st;
    return um_alloc(m, d, bytes, loc, flags, out);
  }
  if ((st = check_name(m, tag, "um_alloc_tagged")) != UM_OK)
    return st;
  /* um_alloc's own refusals first: a call refused makes no name. */
  if (out == NULL || !um__device_ok(d) || d->m != m || bytes == 0 || !um__loc_valid((int)loc) ||
      (flags & ~(unsigned)(UM_ALLOC_UNPOOLED | UM_ALLOC_ZERO)) != 0 || !(d->info.locations & (1u << loc)))
    return um_alloc(m, d, bytes, loc, flags, out);
  if ((i = tag_index(m, tag)) < 0)
    return um__set_error(i, "um_alloc_tagged: %d tag names in use", UM_TAGS_MAX);
  forced_tag = (uint16_t)i;
  st = um_alloc(m, d, bytes, loc, flags, out);
  forced_tag = 0;
  return st;
}

const char *um_buffer_tag(const um_buffer *b) {
  if (um__buffer_check_live(b) != UM_OK || um__process_changed(b->m))
    return NULL;
  return um__obs_tag_name(b->m, b->tag);
}

bool um__obs_tag_known(const um_manager *m, uint16_t tag) {
  return tag < atomic_load_explicit(&m->obs->ntags, memory_order_acquire);
}

const char *um__obs_tag_name(const um_manager *m, uint16_t tag) {
  return tag <= 1 ? "" : m->obs->names[tag];
}

/* An allocation of bytes into tag rows c (its device's) and all (all devices'). */
static void tag_in(tag_ctr *c, tag_ctr *all, uint64_t bytes) {
  atomic_fetch_add_explicit(&c->allocs, 1, memory_order_relaxed);
  um__atomic_max_relaxed(&c->peak, atomic_fetch_add_explicit(&c->in_use, bytes, memory_order_relaxed) + bytes);
  um__atomic_max_relaxed(&all->peak, atomic_fetch_add_explicit(&all->in_use, bytes, memory_order_relaxed) + bytes);
}

static void tag_out(tag_ctr *c, tag_ctr *all, uint64_t bytes) {
  atomic_fetch_add_explicit(&c->releases, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&c->in_use, bytes, memory_order_relaxed);
  atomic_fetch_sub_explicit(&all->in_use, bytes, memory_order_relaxed);
}

/* A block's event: an allocation or a release of b at now_ns, into the history. */
static void block_event(um_buffer *b, um_history_kind kind, int how, int64_t dev_in_use, uint64_t now_ns) {
  um_history_event e = {.kind = kind, .device = b->dev->index, .src_device = -1, .dst_device = -1,
                        .loc = b->loc, .how = how, .bytes = b->size,
                        .address = b->mem.host != NULL ? (uint64_t)(uintptr_t)b->mem.host : (uint64_t)b->mem.handle,
                        .in_use = dev_in_use > 0 ? (uint64_t)dev_in_use : 0};
  e.thread = um__thread_number();
  e.tag = um__obs_tag_name(b->m, b->tag);
  e.site_file = b->site_file;
  e.site_line = b->site_line;
  e.begin_ns = e.end_ns = now_ns - b->m->obs->t0;
  um__hist_put(b->m, &e);
}

void um__obs_alloc(um_buffer *b, int how) {
  um_manager *m = b->m;
  um__obs *o = m->obs;
  int64_t dev_now;
  b->tag = um__obs_tag_now(m);
  b->obs_thread = um__thread_number();
  b->born_ns = um__now_ns();
  b->nframes = 0;
  if (__builtin_expect(m->opts.backtraces, 0))
    record_frames(b);
  /* Last, ordered after the stamp: a snapshot reading it (snapshot.c) takes
   * the stamp as this life's only when obs_gen is gen. */
  __atomic_store_n(&b->obs_gen, atomic_load_explicit(&b->gen, memory_order_relaxed), __ATOMIC_RELEASE);
  if (b->tag != 0) {
    tag_ctr *c = atomic_load_explicit(&o->ctr[b->tag], memory_order_acquire);
    tag_in(&c[b->dev->index], &c[o->ndev], b->size);
  }
  dev_now = atomic_fetch_add_explicit(&o->dev_in_use[b->dev->index], (int64_t)b->size, memory_order_relaxed) +
            (int64_t)b->size;
  if (atomic_load_explicit(&o->scopes_open, memory_order_relaxed) != 0) {
    int64_t now = atomic_fetch_add_explicit(&o->in_use, (int64_t)b->size, memory_order_relaxed) + (int64_t)b->size;
    atomic_fetch_add_explicit(&o->allocs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&o->bytes, b->size, memory_order_relaxed);
    if (now > 0)
      um__atomic_max_relaxed(&o->scope_peak, (uint64_t)now);
  }
  if (um__hist_on(m))
    block_event(b, UM_HIST_ALLOC, how, dev_now, b->born_ns);
}

void um__obs_release(um_buffer *b) {
  um__obs *o = b->m->obs;
  int64_t dev_now = atomic_fetch_sub_explicit(&o->dev_in_use[b->dev->index], (int64_t)b->size,
                                              memory_order_relaxed) - (int64_t)b->size;
  if (atomic_load_explicit(&o->scopes_open, memory_order_relaxed) != 0) {
    atomic_fetch_add_explicit(&o->releases, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&o->in_use, (int64_t)b->size, memory_order_relaxed);
  }
  if (um__hist_on(b->m))
    block_event(b, UM_HIST_RELEASE, 0, dev_now, um__now_ns());
  b->nframes = 0;
  if (b->tag != 0) {
    tag_ctr *c = atomic_load_explicit(&o->ctr[b->tag], memory_order_acquire);
    tag_out(&c[b->dev->index], &c[o->ndev], b->size);
    b->tag = 0;
  }
}

void um__obs_event(um_manager *m, um_history_event *e) {
  e->thread = e->thread != 0 ? e->thread : um__thread_number();
  e->begin_ns = e->begin_ns >= m->obs->t0 ? e->begin_ns - m->obs->t0 : 0;
  e->end_ns = e->end_ns >= m->obs->t0 ? e->end_ns - m->obs->t0 : e->begin_ns;
  um__hist_put(m, e);
}

/* Idle memory went back to device d (mem/'s trims, through the upcall). */
static void trimmed(um_device *d, uint64_t bytes) {
  um_history_event e = {.kind = UM_HIST_TRIM, .device = d->index, .src_device = -1, .dst_device = -1,
                        .bytes = bytes, .tag = ""};
  e.begin_ns = e.end_ns = um__now_ns();
  if (um__hist_on(d->m))
    um__obs_event(d->m, &e);
}

__attribute__((constructor)) static void register_upcalls(void) { um__upcall.obs.trimmed = trimmed; }

/* Bytes moved by an operation of tag on device d (its destination's, or a
 * download's source's), in direction dir (UM__DIR_*). */
void um__obs_moved(um_manager *m, uint16_t tag, const um_device *d, int dir, uint64_t bytes) {
  um__obs *o = m->obs;
  tag_ctr *c;
  if (tag == 0 || dir < 0 || dir >= NDIR)
    return;
  c = atomic_load_explicit(&o->ctr[tag], memory_order_acquire);
  atomic_fetch_add_explicit(&c[d->index].moved[dir], bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&c[o->ndev].moved[dir], bytes, memory_order_relaxed);
}

int um_tag_stats_get(um_manager *m, um_device *d, um_tag_stats *out, int cap) {
  um__obs *o;
  int n, col;
  int st = um__obs_check(m, "um_tag_stats_get");
  if (st != UM_OK)
    return st;
  if (cap < 0 || (out == NULL && cap > 0))
    return um__set_error(UM_EINVAL, "um_tag_stats_get: NULL out or a negative cap");
  if (d != NULL && (!um__device_ok(d) || d->m != m))
    return um__set_error(UM_EINVAL, "um_tag_stats_get: not a device of this manager");
  o = m->obs;
  col = d != NULL ? d->index : o->ndev;
  n = atomic_load_explicit(&o->ntags, memory_order_acquire);
  n = n > 0 ? n - 1 : 0; /* index 0 is no tag */
  for (int i = 0; i < n && i < cap; i++) {
    const tag_ctr *rows = atomic_load_explicit(&o->ctr[i + 1], memory_order_acquire), *c = &rows[col];
    um_tag_stats *t = &out[i];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", um__obs_tag_name(m, (uint16_t)(i + 1)));
    t->bytes_in_use = atomic_load_explicit(&c->in_use, memory_order_relaxed);
    t->peak_bytes_in_use = atomic_load_explicit(&c->peak, memory_order_relaxed);
    for (int k = d != NULL ? col : 0; k < (d != NULL ? col + 1 : um__ndevices(m)); k++) {
      t->allocations += atomic_load_explicit(&rows[k].allocs, memory_order_relaxed);
      t->releases += atomic_load_explicit(&rows[k].releases, memory_order_relaxed);
    }
    t->active_buffers = t->allocations - t->releases;
    t->bytes_h2d = atomic_load_explicit(&c->moved[UM__DIR_H2D], memory_order_relaxed);
    t->bytes_d2h = atomic_load_explicit(&c->moved[UM__DIR_D2H], memory_order_relaxed);
    t->bytes_d2d = atomic_load_explicit(&c->moved[UM__DIR_D2D], memory_order_relaxed);
    t->bytes_peer = atomic_load_explicit(&c->moved[UM__DIR_PEER], memory_order_relaxed);
    t->bytes_net_out = atomic_load_explicit(&c->moved[UM__DIR_NET_OUT], memory_order_relaxed);
    t->bytes_net_in = atomic_load_explicit(&c->moved[UM__DIR_NET_IN], memory_order_relaxed);
  }
  return n;
}

/* ------------------------------------------------------------------------ */
/* Scopes */

static uint64_t in_use_now(const um__obs *o) {
  int64_t v = atomic_load_explicit(&o->in_use, memory_order_relaxed);
  return v > 0 ? (uint64_t)v : 0;
}

int um_scope_push(um_manager *m) {
  um__obs *o;
  scope *s;
  int st = um__obs_check(m, "um_scope_push");
  if (st != UM_OK)
    return st;
  o = m->obs;
  pthread_mutex_lock(&o->lock);
  if (o->nscopes == UM_TAG_DEPTH_MAX) {
    pthread_mutex_unlock(&o->lock);
    return um__set_error(UM_EOVERFLOW, "um_scope_push: %d scopes open", UM_TAG_DEPTH_MAX);
  }
  set_why_locked(m, OBS_SCOPES, true); /* first: the devices' bytes in use are counted from here */
  if (o->nscopes == 0) { /* the manager's count, from the devices' */
    int64_t sum = 0;
    for (int i = 0; i < um__ndevices(m); i++)
      sum += atomic_load_explicit(&o->dev_in_use[i], memory_order_relaxed);
    atomic_store_explicit(&o->in_use, sum, memory_order_relaxed);
    atomic_store_explicit(&o->scopes_open, 1, memory_order_relaxed);
  }
  s = &o->scopes[o->nscopes++];
  s->outer_peak = atomic_load_explicit(&o->scope_peak, memory_order_relaxed);
  s->start = in_use_now(o);
  s->allocs = atomic_load_explicit(&o->allocs, memory_order_relaxed);
  s->releases = atomic_load_explicit(&o->releases, memory_order_relaxed);
  s->bytes = atomic_load_explicit(&o->bytes, memory_order_relaxed);
  atomic_store_explicit(&o->scope_peak, s->start, memory_order_relaxed);
  pthread_mutex_unlock(&o->lock);
  return UM_OK;
}

int um_scope_pop(um_manager *m, um_scope_stats *out) {
  um__obs *o;
  scope *s;
  uint64_t peak;
  int st = um__obs_check(m, "um_scope_pop");
  if (st != UM_OK)
    return st;
  o = m->obs;
  pthread_mutex_lock(&o->lock);
  if (o->nscopes == 0) {
    pthread_mutex_unlock(&o->lock);
    return um__set_error(UM_ESTATE, "um_scope_pop: no scope is open");
  }
  s = &o->scopes[--o->nscopes];
  peak = atomic_load_explicit(&o->scope_peak, memory_order_relaxed);
  if (out != NULL) {
    out->bytes_in_use_start = s->start;
    out->bytes_in_use_end = in_use_now(o);
    out->peak_bytes_in_use = peak;
    out->allocations = atomic_load_explicit(&o->allocs, memory_order_relaxed) - s->allocs;
    out->releases = atomic_load_explicit(&o->releases, memory_order_relaxed) - s->releases;
    out->bytes_allocated = atomic_load_explicit(&o->bytes, memory_order_relaxed) - s->bytes;
  }
  atomic_store_explicit(&o->scope_peak, peak > s->outer_peak ? peak : s->outer_peak, memory_order_relaxed);
  if (o->nscopes == 0) {
    atomic_store_explicit(&o->scopes_open, 0, memory_order_relaxed);
    set_why_locked(m, OBS_SCOPES, false);
  }
  pthread_mutex_unlock(&o->lock);
  return UM_OK;
}
