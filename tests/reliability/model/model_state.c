/* The model's objects: devices, buffers, host areas, operation records, the
 * log of unapplied operations, and what the program knows about which
 * operations have finished. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* ------------------------------------------------------------------------ */
/* Random numbers */

void mdl_rng_seed(mdl_rng *r, uint64_t seed) {
  /* splitmix64 of the seed: any seed, 0 included, gives a nonzero state */
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  r->s = z ? z : 1;
}

uint64_t mdl_rand(mdl_rng *r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

size_t mdl_range(mdl_rng *r, size_t lo, size_t hi) {
  if (hi <= lo)
    return lo;
  return lo + (size_t)(mdl_rand(r) % (uint64_t)(hi - lo + 1));
}

int mdl_pct(mdl_rng *r, unsigned pct) { return mdl_rand(r) % 100u < pct; }

void mdl_fill_random(mdl_rng *r, unsigned char *p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = mdl_rand(r);
    memcpy(p + i, &v, 8);
  }
  if (i < n) {
    uint64_t v = mdl_rand(r);
    memcpy(p + i, &v, n - i);
  }
}

/* ------------------------------------------------------------------------ */
/* Context */

static atomic_uint_fast64_t next_id = 1;

uint64_t mdl_next_id(void) { return atomic_fetch_add(&next_id, 1); }

static void *xmalloc(mdl_ctx *c, size_t n) {
  void *p = malloc(n ? n : 1);
  MDL_CHECK(c, p != NULL, "test out of memory for %zu bytes", n);
  return p;
}

void mdl_ctx_init(mdl_ctx *c, um_manager *m, const mdl_config *cfg, uint64_t seed, int thread) {
  memset(c, 0, sizeof(*c));
  c->m = m;
  c->cfg = *cfg;
  c->seed = seed;
  c->thread = thread;
  c->post_to = -1;
  mdl_rng_seed(&c->rng, seed * 1000003u + (uint64_t)thread);
  snprintf(c->what, sizeof(c->what), "setup");
  mdl_devices_scan(c);
  for (int i = 0; i < cfg->nareas; i++) {
    mdl_area *a = &c->areas[i];
    a->cap = cfg->area_bytes;
    a->mem = xmalloc(c, a->cap);
    a->data = xmalloc(c, a->cap);
    a->known = xmalloc(c, a->cap);
    mdl_fill_random(&c->rng, a->data, a->cap);
    memcpy(a->mem, a->data, a->cap);
    memset(a->known, 1, a->cap);
  }
  c->scratch = xmalloc(c, cfg->max_size > cfg->area_bytes ? cfg->max_size : cfg->area_bytes);
}

void mdl_ctx_free(mdl_ctx *c) {
  for (int i = 0; i < c->cfg.nareas; i++) {
    free(c->areas[i].mem);
    free(c->areas[i].data);
    free(c->areas[i].known);
  }
  for (int i = 0; i < MDL_MAX_BUFS; i++) {
    if (c->bufs[i].shared)
      memset(&c->bufs[i], 0, sizeof(c->bufs[i])); /* the arrays belong to the owner */
    else if (c->bufs[i].data != NULL)
      mdl_buf_detach(c, &c->bufs[i]);
  }
  free(c->scratch);
  c->scratch = NULL;
}

/* ------------------------------------------------------------------------ */
/* Buffers */

/* Memory with a host view: everything on the cpu; elsewhere all but
 * DEVICE memory (pinned, unified, host). */
bool mdl_dev_host_view(const mdl_dev *d, um_location loc) { return d->kind == MDL_CPU || loc != UM_DEVICE; }

mdl_map_style mdl_dev_map_style(const mdl_dev *d, um_location loc) {
  if (mdl_dev_host_view(d, loc))
    return MDL_MAP_POINTER;
  return d->native_map ? MDL_MAP_NATIVE : MDL_MAP_SHADOW;
}

mdl_buf *mdl_buf_slot(mdl_ctx *c) {
  for (int i = 0; i < MDL_MAX_BUFS; i++)
    if (!c->bufs[i].live && c->bufs[i].data == NULL)
      return &c->bufs[i];
  return NULL;
}

mdl_buf *mdl_buf_by_id(mdl_ctx *c, uint64_t id) {
  for (int i = 0; i < MDL_MAX_BUFS; i++)
    if (id != 0 && c->bufs[i].live && c->bufs[i].id == id)
      return &c->bufs[i];
  return NULL;
}

int mdl_live_count(const mdl_ctx *c) {
  int n = 0;
  for (int i = 0; i < MDL_MAX_BUFS; i++)
    n += c->bufs[i].live && !c->bufs[i].shared;
  return n;
}

/* A random live buffer; writable: not a read-only wrap nor shared;
 * unmapped: not mapped now. NULL when none qualifies. */
mdl_buf *mdl_pick_buf(mdl_ctx *c, bool writable, bool unmapped) {
  mdl_buf *cand[MDL_MAX_BUFS], *f = c->focus;
  int n = 0;
  if (f != NULL && f->live && !(writable && (f->kind == MDL_WRAP_RO || f->shared)) && !(unmapped && f->mapped) &&
      mdl_pct(&c->rng, 60))
    return f;
  for (int i = 0; i < MDL_MAX_BUFS; i++) {
    mdl_buf *b = &c->bufs[i];
    if (!b->live || (writable && (b->kind == MDL_WRAP_RO || b->shared)) || (unmapped && b->mapped))
      continue;
    cand[n++] = b;
  }
  return n ? cand[mdl_range(&c->rng, 0, (size_t)n - 1)] : NULL;
}

void mdl_buf_attach(mdl_ctx *c, mdl_buf *b, size_t size) {
  b->size = size;
  b->data = xmalloc(c, size);
  b->known = xmalloc(c, size);
  memset(b->known, 0, size);
}

void mdl_buf_detach(mdl_ctx *c, mdl_buf *b) {
  (void)c;
  free(b->data);
  free(b->known);
  memset(b, 0, sizeof(*b));
}

/* A block's capacity: the bytes unpooled; pooled, its class's size, but
 * for a block of more than UM__SEG_SMALL bytes carved from a segment
 * (segments on, a location the device carves), which takes its size
 * rounded up to the granule or the device's carving alignment. UM_HOST
 * blocks of every device are the cpu device's. */
size_t mdl_capacity(const mdl_ctx *c, const mdl_buf *b) {
  const um_device *d;
  size_t r;
  if (b->kind != MDL_ALLOC)
    return 0;
  if (!b->pooled)
    return b->size;
  d = b->loc == UM_HOST ? um_device_get(c->m, 0) : c->devs[b->dev].d;
  if (!c->cfg.opts.segments || b->size <= UM__SEG_SMALL || !(d->carve_locations & (1u << b->loc)))
    return um__class_size(um__size_class_of(b->size));
  r = d->carve_align > ((size_t)64 << 10) ? d->carve_align : (size_t)64 << 10;
  return (b->size + r - 1) / r * r;
}

void mdl_count_in(mdl_ctx *c, const mdl_buf *b) {
  mdl_counts *k = &c->counts[b->dev];
  k->live++;
  k->allocations++;
  k->in_use += b->size;
  k->capacity_live += mdl_capacity(c, b);
  k->blocks_live += b->kind == MDL_ALLOC;
  if (k->in_use > k->peak)
    k->peak = k->in_use;
  c->in_use_total += b->size;
  if (c->in_use_total > c->peak_total)
    c->peak_total = c->in_use_total;
}

void mdl_count_out(mdl_ctx *c, const mdl_buf *b) {
  mdl_counts *k = &c->counts[b->dev];
  k->live--;
  k->releases++;
  k->in_use -= b->size;
  k->capacity_live -= mdl_capacity(c, b);
  k->blocks_live -= b->kind == MDL_ALLOC;
  c->in_use_total -= b->size;
}

/* ------------------------------------------------------------------------ */
/* Operation records and the log */

mdl_op *mdl_op_new(mdl_ctx *c, mdl_op_kind kind) {
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < MDL_MAX_OPS; i++) {
      mdl_op *op = &c->ops[i];
      if (!op->used) {
        memset(op, 0, sizeof(*op));
        op->used = true;
        op->kind = kind;
        op->dev_dst = -1;
        return op;
      }
    }
    MDL_CHECK(c, !c->no_block, "no free operation record inside a gated burst");
    mdl_sync(c); /* everything finishes and is applied: records come free */
  }
  mdl_fail_at(c, __FILE__, __LINE__, "no free operation record even after a synchronize");
}

void mdl_op_not_issued(mdl_ctx *c, mdl_op *op) {
  (void)c;
  memset(op, 0, sizeof(*op));
}

void mdl_op_issued(mdl_ctx *c, mdl_op *op, bool candidate) {
  op->seq = ++c->seq;
  op->dst_id = op->dst ? op->dst->id : 0;
  op->src_id = op->src ? op->src->id : 0;
  op->dev_dst = op->dst ? op->dst->dev : -1;
  op->fate = candidate ? MDL_FATE_UNKNOWN : MDL_FATE_RUN;
  op->cancel_planned = candidate && mdl_pct(&c->rng, 70);
  MDL_CHECK(c, c->nlog < MDL_MAX_OPS, "log overflow");
  c->log[c->nlog++] = op;
  mdl_log_flush(c);
}

static void copy_bytes(unsigned char *dd, unsigned char *dk, const unsigned char *sd,
                       const unsigned char *sk, size_t n) {
  memmove(dd, sd, n);
  memmove(dk, sk, n);
}

void mdl_apply(mdl_ctx *c, mdl_op *op) {
  if (op->fate == MDL_FATE_RUN) {
    switch (op->kind) {
    case MDL_H2B:
      copy_bytes(op->dst->data + op->dst_off, op->dst->known + op->dst_off, op->area->data + op->src_off,
                 op->area->known + op->src_off, op->bytes);
      break;
    case MDL_B2H:
      copy_bytes(op->area->data + op->dst_off, op->area->known + op->dst_off, op->src->data + op->src_off,
                 op->src->known + op->src_off, op->bytes);
      break;
    case MDL_B2B:
      copy_bytes(op->dst->data + op->dst_off, op->dst->known + op->dst_off, op->src->data + op->src_off,
                 op->src->known + op->src_off, op->bytes);
      break;
    case MDL_FILL:
      memset(op->dst->data + op->dst_off, op->value, op->bytes);
      memset(op->dst->known + op->dst_off, 1, op->bytes);
      c->counts[op->dev_dst].fills++;
      break;
    }
  }
  /* A canceled operation never touches its memory, but the program learns
   * that it is over only as it learns it of the others (a wait, a fence):
   * what the program does next must not depend on the cancel's timing, or
   * a seed would not replay. */
  op->applied = true;
  op->dst = op->src = NULL;
}

void mdl_log_flush(mdl_ctx *c) {
  int done = 0;
  while (done < c->nlog && c->log[done]->fate != MDL_FATE_UNKNOWN)
    mdl_apply(c, c->log[done++]);
  if (done > 0) {
    memmove(c->log, c->log + done, (size_t)(c->nlog - done) * sizeof(c->log[0]));
    c->nlog -= done;
  }
}

/* ------------------------------------------------------------------------ */
/* Completion */

static bool shares_buffer(const mdl_op *a, const mdl_op *b) {
  uint64_t ai[2] = {a->dst_id, a->src_id}, bi[2] = {b->dst_id, b->src_id};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      if (ai[i] != 0 && ai[i] == bi[j])
        return true;
  return false;
}

/* An operation finished: so did every operation issued before it on one of
 * its buffers (each buffer's operations run in issue order), and,
 * transitively, those before them (a canceled operation too: it completes,
 * as UM_ECANCELED, only after what it waited for). */
void mdl_mark_data_done(mdl_ctx *c, mdl_op *op) {
  mdl_op *work[MDL_MAX_OPS];
  int n = 0;
  if (op->data_done)
    return;
  op->data_done = true;
  work[n++] = op;
  while (n > 0) {
    mdl_op *x = work[--n];
    for (int i = 0; i < MDL_MAX_OPS; i++) {
      mdl_op *p = &c->ops[i];
      if (p->used && !p->data_done && p->seq < x->seq && shares_buffer(p, x)) {
        p->data_done = true;
        work[n++] = p;
      }
    }
  }
}

void mdl_mark_event_done(mdl_ctx *c, mdl_op *op) {
  op->event_done = true;
  mdl_mark_data_done(c, op);
}

void mdl_fence_buffer(mdl_ctx *c, uint64_t id) {
  for (int i = 0; i < MDL_MAX_OPS; i++) {
    mdl_op *p = &c->ops[i];
    if (p->used && p->seq != 0 && (p->dst_id == id || p->src_id == id))
      mdl_mark_event_done(c, p);
  }
}

void mdl_fence_data(mdl_ctx *c, uint64_t id) {
  mdl_op probe;
  memset(&probe, 0, sizeof(probe));
  probe.seq = UINT64_MAX;
  probe.dst_id = id;
  mdl_mark_data_done(c, &probe);
}

void mdl_fence_all(mdl_ctx *c) {
  for (int i = 0; i < MDL_MAX_OPS; i++)
    if (c->ops[i].used && c->ops[i].seq != 0) {
      c->ops[i].event_done = true;
      c->ops[i].data_done = true;
    }
}

void mdl_ops_collect(mdl_ctx *c) {
  for (int i = 0; i < MDL_MAX_OPS; i++) {
    mdl_op *p = &c->ops[i];
    if (p->used && p->applied && p->data_done && p->refs == 0)
      memset(p, 0, sizeof(*p));
  }
}

bool mdl_area_busy(const mdl_ctx *c, const mdl_area *a, bool for_write) {
  for (int i = 0; i < MDL_MAX_OPS; i++) {
    const mdl_op *p = &c->ops[i];
    if (p->used && p->area == a && !p->data_done && (for_write || p->kind == MDL_B2H))
      return true;
  }
  return false;
}

