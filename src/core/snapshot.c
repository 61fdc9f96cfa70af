/* um_snapshot_take: every block of the manager's registry (under
 * registry_lock), then every segment of every pool with its extents in
 * address order (the segments' walk, under their lock): a free extent is a
 * free block; a carved one takes the registry's block whose extent it is
 * (its offset and span from the extent, so that a segment's blocks tile it
 * whatever moved in between), or is a block in use that the registry walk
 * did not see yet; a registry block whose extent was not carved any more
 * has gone back meanwhile and is left out. Sorted by device, location,
 * segment and offset. um_snapshot_write: the same as JSON. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* The snapshot, with the room that grows while it is taken. */
typedef struct snap {
  um_snapshot s;
  size_t bcap, scap;
  const void **keys; /* the segments' identities, beside s.segments */
  int dev;
  um_location loc;
  int failed;
  char (*names)[UM_TAG_NAME_MAX]; /* the tags' names, copied */
  int nnames;
  /* The registry's carved blocks: their extent and index in s.blocks,
   * sorted by extent once the registry is walked; matched by the walk. */
  struct carved {
    const void *extent;
    size_t block;
    bool matched;
  } *carved;
  size_t ncarved, ccap;
} snap;

/* The block or segment address a snapshot shows. */
static uint64_t mem_address(const um__mem *mem) {
  return mem->host != NULL ? (uint64_t)(uintptr_t)mem->host : (uint64_t)mem->handle;
}

static um_snapshot_block *new_block(snap *sn) {
  if (sn->s.nblocks == sn->bcap) {
    size_t cap = sn->bcap ? 2 * sn->bcap : 64;
    um_snapshot_block *grown = realloc(sn->s.blocks, cap * sizeof(*grown));
    if (grown == NULL) {
      sn->failed = 1;
      return NULL;
    }
    sn->s.blocks = grown;
    sn->bcap = cap;
  }
  um_snapshot_block *b = &sn->s.blocks[sn->s.nblocks++];
  memset(b, 0, sizeof(*b));
  b->segment = -1;
  return b;
}

static void on_segment(void *ctx, const um__seg_view *v) {
  snap *sn = ctx;
  if (sn->s.nsegments == sn->scap) {
    size_t cap = sn->scap ? 2 * sn->scap : 16;
    um_snapshot_segment *grown = realloc(sn->s.segments, cap * sizeof(*grown));
    const void **keys = realloc(sn->keys, cap * sizeof(*keys));
    if (grown != NULL)
      sn->s.segments = grown;
    if (keys != NULL)
      sn->keys = keys;
    if (grown == NULL || keys == NULL) {
      sn->failed = 1;
      return;
    }
    sn->scap = cap;
  }
  um_snapshot_segment *g = &sn->s.segments[sn->s.nsegments];
  sn->keys[sn->s.nsegments++] = v->key;
  g->device = sn->dev;
  g->loc = sn->loc;
  g->address = mem_address(v->mem);
  g->size = v->size;
  g->committed = v->committed;
  g->virtual_memory = v->virt;
}

static int segment_index(const snap *sn, const void *key) {
  for (size_t i = sn->s.nsegments; i-- > 0;) /* the newest first: where this pool's are */
    if (sn->keys[i] == key)
      return (int)i;
  return -1;
}

static int carved_order(const void *pa, const void *pb) {
  const struct carved *a = pa, *b = pb;
  return (uintptr_t)a->extent < (uintptr_t)b->extent ? -1 : (uintptr_t)a->extent > (uintptr_t)b->extent;
}

/* An extent of the segment key in the walk: a free block, or a carved one
 * (its registry block, or one the registry did not see). */
static void on_extent(void *ctx, const void *key, const void *extent, size_t off, size_t size, bool free) {
  snap *sn = ctx;
  int seg = segment_index(sn, key);
  struct carved want = {.extent = extent}, *c = NULL;
  um_snapshot_block *b;
  if (seg < 0)
    return;
  if (!free && sn->ncarved > 0)
    c = bsearch(&want, sn->carved, sn->ncarved, sizeof(*sn->carved), carved_order);
  if (c != NULL && !c->matched) {
    c->matched = true;
    b = &sn->s.blocks[c->block];
  } else {
    if ((b = new_block(sn)) == NULL)
      return;
    b->state = free ? UM_BLOCK_FREE : UM_BLOCK_IN_USE; /* carved after the registry walk */
    b->size = size;
    b->tag = free ? NULL : "";
  }
  b->device = sn->dev;
  b->loc = sn->loc;
  b->segment = seg;
  b->offset = off;
  b->address = sn->s.segments[seg].address + off;
  b->capacity = size;
  if (b->state == UM_BLOCK_FREE || b->state == UM_BLOCK_IDLE)
    b->size = size;
}

/* The registry's carved blocks whose extent the walk did not find carved:
 * gone back meanwhile. */
static void drop_unmatched(snap *sn) {
  bool *gone;
  size_t k = 0;
  if (sn->ncarved == 0 || (gone = calloc(sn->s.nblocks, sizeof(*gone))) == NULL)
    return;
  for (size_t i = 0; i < sn->ncarved; i++)
    gone[sn->carved[i].block] = !sn->carved[i].matched;
  for (size_t i = 0; i < sn->s.nblocks; i++)
    if (!gone[i])
      sn->s.blocks[k++] = sn->s.blocks[i];
  sn->s.nblocks = k;
  free(gone);
}

/* What the snapshot shows of a descriptor, copied while its owner may be
 * changing it (a pool hit or a release takes no lock the snapshot holds). */
typedef struct desc_copy {
  int state;
  unsigned gen, obs_gen;
  int device, loc, kind;
  size_t size, capacity;
  uint64_t address, idle_since_ns, born_ns;
  void *carved;
  const char *site_file;
  int site_line, nframes;
  uint16_t tag;
  uint32_t thread;
  void *frames[UM_SNAPSHOT_FRAMES];
} desc_copy;

#define RACY(x) (*(const volatile __typeof__(x) *)&(x))

/* Each field read once (no second read between a bound's check and its
 * use), none through a pointer that the owner may free (the frames' array
 * lives as long as the descriptor, the device as long as the manager). The
 * reads race with the owner on purpose and are validated by gen and state
 * around them (the caller), so ThreadSanitizer is told not to watch them. */
__attribute__((no_sanitize("thread"))) static void copy_fields(um_buffer *b, desc_copy *c) {
  um__mem mem = {RACY(b->mem.host), RACY(b->mem.handle), NULL, RACY(b->mem.carved)};
  void **frames = RACY(b->frames);
  c->device = RACY(b->dev)->index;
  c->loc = (int)RACY(b->loc);
  c->kind = (int)RACY(b->kind);
  c->size = RACY(b->size);
  c->capacity = RACY(b->capacity);
  c->address = mem_address(&mem);
  c->carved = mem.carved;
  c->idle_since_ns = RACY(b->idle_since_ns);
  c->site_file = RACY(b->site_file);
  c->site_line = RACY(b->site_line);
  c->obs_gen = RACY(b->obs_gen);
  atomic_thread_fence(memory_order_acquire); /* the stamp after the gen it was made for (um__obs_alloc) */
  c->tag = RACY(b->tag);
  c->thread = RACY(b->obs_thread);
  c->born_ns = RACY(b->born_ns);
  c->nframes = RACY(b->nframes);
  if (frames == NULL || c->nframes < 0)
    c->nframes = 0;
  if (c->nframes > UM_SNAPSHOT_FRAMES)
    c->nframes = UM_SNAPSHOT_FRAMES;
  for (int k = 0; k < c->nframes; k++)
    c->frames[k] = RACY(frames[k]);
}

/* A consistent copy of b: the same life (gen) and state before and after
 * the fields were read; false when b kept changing (it moves: the
 * segments' walk shows its extent whatever it became). */
static bool copy_descriptor(um_buffer *b, desc_copy *c) {
  for (int tries = 0; tries < 8; tries++) {
    c->state = atomic_load_explicit(&b->state, memory_order_acquire);
    c->gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    if (c->state == UM__BUF_HUSK)
      return true;
    copy_fields(b, c);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&b->gen, memory_order_relaxed) == c->gen &&
        atomic_load_explicit(&b->state, memory_order_relaxed) == c->state)
      return true;
  }
  return false;
}

static void add_buffer(snap *sn, um_buffer *b, uint64_t now) {
  desc_copy c;
  um_snapshot_block *o;
  if (!copy_descriptor(b, &c) || c.state == UM__BUF_HUSK || (o = new_block(sn)) == NULL)
    return;
  o->device = c.device;
  o->loc = (um_location)c.loc;
  o->state = c.state == UM__BUF_LIVE       ? UM_BLOCK_IN_USE
             : c.state == UM__BUF_RELEASED ? UM_BLOCK_RELEASED
                                           : UM_BLOCK_IDLE;
  o->wrapped = c.kind == UM__KIND_WRAPPED;
  o->capacity = c.capacity != 0 ? c.capacity : c.size;
  o->address = c.address;
  if (c.carved != NULL) { /* placed by the segments' walk */
    if (sn->ncarved == sn->ccap) {
      size_t cap = sn->ccap ? 2 * sn->ccap : 64;
      struct carved *grown = realloc(sn->carved, cap * sizeof(*grown));
      if (grown == NULL) {
        sn->failed = 1;
        return;
      }
      sn->carved = grown;
      sn->ccap = cap;
    }
    sn->carved[sn->ncarved++] = (struct carved){c.carved, (size_t)(o - sn->s.blocks), false};
  }
  if (o->state == UM_BLOCK_IDLE) {
    o->size = o->capacity;
    o->age_ns = c.idle_since_ns != 0 && c.idle_since_ns <= now ? now - c.idle_since_ns : 0;
    return;
  }
  o->size = c.size;
  o->site_file = c.site_file;
  o->site_line = c.site_line;
  o->tag = "";
  if (c.obs_gen == c.gen && c.born_ns != 0) {
    o->thread = c.thread;
    o->age_ns = c.born_ns <= now ? now - c.born_ns : 0;
    if (c.tag > 1 && c.tag - 2 < sn->nnames)
      o->tag = sn->names[c.tag - 2];
    o->nframes = c.nframes;
    memcpy(o->frames, c.frames, (size_t)c.nframes * sizeof(void *));
  }
}

static int block_order(const void *pa, const void *pb) {
  const um_snapshot_block *a = pa, *b = pb;
  if (a->device != b->device)
    return a->device < b->device ? -1 : 1;
  if (a->loc != b->loc)
    return a->loc < b->loc ? -1 : 1;
  if (a->segment != b->segment)
    return a->segment < b->segment ? -1 : 1;
  if (a->segment >= 0 && a->offset != b->offset)
    return a->offset < b->offset ? -1 : 1;
  if (a->address != b->address)
    return a->address < b->address ? -1 : 1;
  return 0;
}

/* The names of tags 2 and up, copied (the snapshot may outlive m). */
static int copy_names(snap *sn, um_manager *m) {
  int n = 0;
  while (n + 2 < UM_TAGS_MAX + 2 && um__obs_tag_known(m, (uint16_t)(n + 2)))
    n++;
  if (n == 0)
    return UM_OK;
  if ((sn->names = calloc((size_t)n, sizeof(*sn->names))) == NULL)
    return UM_ENOMEM;
  for (int i = 0; i < n; i++)
    snprintf(sn->names[i], UM_TAG_NAME_MAX, "%s", um__obs_tag_name(m, (uint16_t)(i + 2)));
  sn->nnames = n;
  return UM_OK;
}

int um_snapshot_take(um_manager *m, um_snapshot **out) {
  snap *sn;
  uint64_t now;
  int st = um__obs_check(m, "um_snapshot_take");
  if (st != UM_OK)
    return st;
  if (out == NULL)
    return um__set_error(UM_EINVAL, "um_snapshot_take: NULL out");
  if ((sn = calloc(1, sizeof(*sn))) == NULL || copy_names(sn, m) != UM_OK) {
    free(sn);
    return um__set_error(UM_ENOMEM, "um_snapshot_take: out of memory");
  }
  now = um__now_ns();
  pthread_mutex_lock(&m->registry_lock);
  for (um_buffer *b = m->all_buffers; b != NULL && !sn->failed; b = b->all_next)
    add_buffer(sn, b, now);
  pthread_mutex_unlock(&m->registry_lock);
  if (sn->ncarved > 1)
    qsort(sn->carved, sn->ncarved, sizeof(*sn->carved), carved_order);
  for (int i = 0; i < um__ndevices(m) && !sn->failed; i++)
    for (int l = 0; l < UM_LOCATION_COUNT; l++) {
      sn->dev = i;
      sn->loc = (um_location)l;
      um__seg_walk(&m->devices[i]->pools[l], on_segment, on_extent, sn);
    }
  if (!sn->failed)
    drop_unmatched(sn);
  free(sn->keys);
  sn->keys = NULL;
  free(sn->carved);
  sn->carved = NULL;
  if (sn->failed) {
    um_snapshot_free(&sn->s);
    return um__set_error(UM_ENOMEM, "um_snapshot_take: out of memory");
  }
  if (sn->s.nblocks > 1)
    qsort(sn->s.blocks, sn->s.nblocks, sizeof(*sn->s.blocks), block_order);
  sn->s.time_ns = now - um__obs_t0(m);
  *out = &sn->s;
  return UM_OK;
}

void um_snapshot_free(um_snapshot *s) {
  snap *sn = (snap *)s; /* s is the first member */
  if (s == NULL)
    return;
  free(sn->s.blocks);
  free(sn->s.segments);
  free(sn->keys);
  free(sn->carved);
  free(sn->names);
  free(sn);
}

/* The length of the UTF-8 sequence at p (1-4), or 0 where p does not
 * start a well-formed one (RFC 3629: no overlong forms, no surrogates,
 * nothing past U+10FFFF). */
static int utf8_length(const unsigned char *p) {
  if (p[0] < 0x80)
    return 1;
  if (p[0] >= 0xc2 && p[0] <= 0xdf)
    return (p[1] & 0xc0) == 0x80 ? 2 : 0;
  if (p[0] >= 0xe0 && p[0] <= 0xef) {
    unsigned lo = p[0] == 0xe0 ? 0xa0 : 0x80, hi = p[0] == 0xed ? 0x9f : 0xbf;
    return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 ? 3 : 0;
  }
  if (p[0] >= 0xf0 && p[0] <= 0xf4) {
    unsigned lo = p[0] == 0xf0 ? 0x90 : 0x80, hi = p[0] == 0xf4 ? 0x8f : 0xbf;
    return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 && (p[3] & 0xc0) == 0x80 ? 4 : 0;
  }
  return 0;
}

/* s as a JSON string (quoted, escaped; a byte that is not UTF-8 becomes
 * U+FFFD, so that the file stays JSON), or null. */
void um__json_string(FILE *f, const char *s) {
  if (s == NULL) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    int n = utf8_length(p);
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(f, "\\u%04x", *p);
    else if (n == 0)
      fputs("\\ufffd", f);
    else
      fwrite(p, 1, (size_t)n, f);
    p += n > 0 ? n : 1;
  }
  fputc('"', f);
}

/* An allocation site as a JSON string "file:line", or null. */
void um__json_site(FILE *f, const char *file, int line) {
  char site[4200];
  if (file == NULL) {
    fputs("null", f);
    return;
  }
  snprintf(site, sizeof(site), "%s:%d", file, line);
  um__json_string(f, site);
}

static const char *const state_names[] = {"in_use", "released", "idle", "free"};
static const char *const loc_names[] = {"host", "device", "pinned", "unified"};

int um_snapshot_write(const um_snapshot *s, const char *path) {
  FILE *f;
  int bad;
  if (s == NULL || path == NULL)
    return um__set_error(UM_EINVAL, "um_snapshot_write: NULL argument");
  f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
  if (f == NULL)
    return um__set_error(UM_EBACKEND, "um_snapshot_write: cannot write %s: %s", path, strerror(errno));
  fprintf(f, "{\"format\": \"unimem snapshot 1\", \"time_ns\": %llu,\n \"segments\": [",
          (unsigned long long)s->time_ns);
  for (size_t i = 0; i < s->nsegments; i++) {
    const um_snapshot_segment *g = &s->segments[i];
    fprintf(f,
            "%s\n  {\"index\": %zu, \"device\": %d, \"location\": \"%s\", \"address\": %llu, \"size\": %llu, "
            "\"committed\": %llu, \"virtual\": %s}",
            i ? "," : "", i, g->device, loc_names[g->loc], (unsigned long long)g->address,
            (unsigned long long)g->size, (unsigned long long)g->committed, g->virtual_memory ? "true" : "false");
  }
  fputs("],\n \"blocks\": [", f);
  for (size_t i = 0; i < s->nblocks; i++) {
    const um_snapshot_block *b = &s->blocks[i];
    fprintf(f,
            "%s\n  {\"device\": %d, \"location\": \"%s\", \"state\": \"%s\", \"segment\": %d, \"offset\": %llu, "
            "\"address\": %llu, \"size\": %llu, \"capacity\": %llu, \"tag\": ",
            i ? "," : "", b->device, loc_names[b->loc], state_names[b->state], b->segment,
            (unsigned long long)b->offset, (unsigned long long)b->address, (unsigned long long)b->size,
            (unsigned long long)b->capacity);
    um__json_string(f, b->tag);
    fprintf(f, ", \"thread\": %u, \"age_ns\": %llu, \"site\": ", b->thread, (unsigned long long)b->age_ns);
    um__json_site(f, b->site_file, b->site_line);
    fputs(", \"frames\": [", f);
    for (int k = 0; k < b->nframes; k++) { /* the address, and its symbol where the loader knows one */
      Dl_info info;
      char frame[600];
      if (dladdr(b->frames[k], &info) != 0 && info.dli_sname != NULL)
        snprintf(frame, sizeof(frame), "%p %s+0x%lx", b->frames[k], info.dli_sname,
                 (unsigned long)((uintptr_t)b->frames[k] - (uintptr_t)info.dli_saddr));
      else if (dladdr(b->frames[k], &info) != 0 && info.dli_fname != NULL)
        snprintf(frame, sizeof(frame), "%p %s+0x%lx", b->frames[k], info.dli_fname,
                 (unsigned long)((uintptr_t)b->frames[k] - (uintptr_t)info.dli_fbase));
      else
        snprintf(frame, sizeof(frame), "%p", b->frames[k]);
      fputs(k ? ", " : "", f);
      um__json_string(f, frame);
    }
    fprintf(f, "], \"wrapped\": %s}", b->wrapped ? "true" : "false");
  }
  fputs("]}\n", f);
  bad = ferror(f);
  if (f != stdout)
    bad |= fclose(f);
  else
    bad |= fflush(f);
  if (bad)
    return um__set_error(UM_EBACKEND, "um_snapshot_write: writing %s failed", path);
  return UM_OK;
}
