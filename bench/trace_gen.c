/* The generators of bench/traces: allocation traces of the kinds of
 * programs whose sizes change, written in the replay format (a ID BYTES,
 * f ID) from a fixed seed, so that `bench_pool --make-trace FILE --kind K`
 * writes the same file on any machine. Each generator simulates the
 * program's buffers, not its arithmetic:
 *
 *   llm        an inference server: requests arrive at random, each with a
 *              prompt and an answer length; its KV cache holds its tokens
 *              and grows by 16 tokens at a time (a new cache, the old one
 *              freed, as a contiguous cache does); every decoding step
 *              allocates the batch's activations, attention scratch and
 *              logits and frees them at its end.
 *   training   a training loop whose batch size changes every 5-20 steps:
 *              weights, gradients and optimizer state allocated once, then
 *              per step the forward activations of each layer (kept for the
 *              backward pass, a workspace freed at once), the backward
 *              gradients freed in reverse order, optimizer temporaries.
 *   dataframe  a dataframe pipeline: tables of columns whose lengths depend
 *              on the data (1 KiB-64 MiB); filters keep a random share,
 *              joins multiply, group-bys shrink, every operator frees its
 *              inputs once it made its outputs.
 *   vectors    containers that grow: each vector starts small and, when
 *              full, moves to a new buffer 1.25-2x larger (the old one
 *              freed); vectors die at random and new ones start.
 *
 * Every allocation is freed by the end of a trace. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_gen.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

typedef struct gen {
  FILE *f;
  uint64_t s;
  int next_id;
  int nallocs;
} gen;

static uint64_t gen_rand(gen *g) {
  g->s ^= g->s >> 12;
  g->s ^= g->s << 25;
  g->s ^= g->s >> 27;
  return g->s * 2685821657736338717ull;
}

static double gen_unit(gen *g) { return (double)(gen_rand(g) >> 11) / 9007199254740992.0; }

static int gen_range(gen *g, int lo, int hi) { return lo + (int)(gen_rand(g) % (uint64_t)(hi - lo + 1)); }

static double gen_log_uniform(gen *g, double lo, double hi) { return lo * exp(gen_unit(g) * log(hi / lo)); }

static int gen_alloc(gen *g, size_t bytes) {
  int id = g->next_id++;
  fprintf(g->f, "a %d %zu\n", id, bytes < 1 ? (size_t)1 : bytes);
  g->nallocs++;
  return id;
}

static void gen_free(gen *g, int id) { fprintf(g->f, "f %d\n", id); }

/* ------------------------------------------------------------------------ */
/* llm */

#define LLM_SLOTS 16
#define LLM_STEPS 1500
#define LLM_KV_PER_TOKEN (4 * KiB) /* every layer's keys and values of one token */
#define LLM_TOKENS_PER_GROWTH 16

typedef struct llm_req {
  bool live;
  int tokens, left; /* in the cache; still to generate */
  int cap;          /* tokens the cache holds */
  int kv;           /* its id */
} llm_req;

static void llm(gen *g) {
  llm_req r[LLM_SLOTS];
  memset(r, 0, sizeof(r));
  for (int step = 0; step < LLM_STEPS; step++) {
    int batch = 0, longest = 0;
    /* arrivals: on average one request every two steps while there is room */
    for (int i = 0; i < LLM_SLOTS; i++)
      if (!r[i].live && gen_unit(g) < 0.08 && step < LLM_STEPS - 200) {
        int prompt = (int)gen_log_uniform(g, 16, 1024);
        r[i].live = true;
        r[i].tokens = prompt;
        r[i].left = (int)gen_log_uniform(g, 8, 512);
        r[i].cap = (prompt + LLM_TOKENS_PER_GROWTH - 1) / LLM_TOKENS_PER_GROWTH * LLM_TOKENS_PER_GROWTH;
        r[i].kv = gen_alloc(g, (size_t)r[i].cap * LLM_KV_PER_TOKEN);
      }
    for (int i = 0; i < LLM_SLOTS; i++)
      if (r[i].live) {
        batch++;
        if (r[i].tokens > longest)
          longest = r[i].tokens;
      }
    if (batch == 0)
      continue;
    /* one decoding step of the batch */
    int hidden = gen_alloc(g, (size_t)batch * 16 * KiB);
    int scratch = gen_alloc(g, (size_t)batch * (size_t)longest * 64);
    int logits = gen_alloc(g, (size_t)batch * 125 * KiB);
    gen_free(g, scratch);
    gen_free(g, hidden);
    gen_free(g, logits);
    for (int i = 0; i < LLM_SLOTS; i++) {
      if (!r[i].live)
        continue;
      r[i].tokens++;
      if (--r[i].left <= 0 || step == LLM_STEPS - 1) {
        gen_free(g, r[i].kv);
        r[i].live = false;
      } else if (r[i].tokens > r[i].cap) {
        int grown;
        r[i].cap += LLM_TOKENS_PER_GROWTH;
        grown = gen_alloc(g, (size_t)r[i].cap * LLM_KV_PER_TOKEN);
        gen_free(g, r[i].kv);
        r[i].kv = grown;
      }
    }
  }
}

/* ------------------------------------------------------------------------ */
/* training */

#define TR_LAYERS 12
#define TR_STEPS 160

static void training(gen *g) {
  static const int batches[] = {8, 16, 24, 32, 48, 64};
  int weights[TR_LAYERS], grads[TR_LAYERS], moments[TR_LAYERS];
  size_t wbytes[TR_LAYERS], per_sample[TR_LAYERS];
  int act[TR_LAYERS];
  int batch = 32, until = 0;
  for (int l = 0; l < TR_LAYERS; l++) {
    wbytes[l] = (size_t)gen_log_uniform(g, 256.0 * KiB, 4.0 * MiB);
    per_sample[l] = (size_t)gen_log_uniform(g, 4.0 * KiB, 48.0 * KiB);
    weights[l] = gen_alloc(g, wbytes[l]);
    grads[l] = gen_alloc(g, wbytes[l]);
    moments[l] = gen_alloc(g, 2 * wbytes[l]);
  }
  for (int step = 0; step < TR_STEPS; step++) {
    if (step >= until) {
      batch = batches[gen_range(g, 0, (int)(sizeof(batches) / sizeof(batches[0])) - 1)];
      until = step + gen_range(g, 5, 20);
    }
    int input = gen_alloc(g, (size_t)batch * 12 * KiB);
    for (int l = 0; l < TR_LAYERS; l++) {
      int ws = gen_alloc(g, (size_t)batch * per_sample[l] / 2 + 4 * KiB);
      act[l] = gen_alloc(g, (size_t)batch * per_sample[l]);
      gen_free(g, ws);
    }
    int loss = gen_alloc(g, (size_t)batch * 4);
    int grad_out = gen_alloc(g, (size_t)batch * per_sample[TR_LAYERS - 1]);
    gen_free(g, loss);
    for (int l = TR_LAYERS - 1; l >= 0; l--) {
      int grad_in = gen_alloc(g, (size_t)batch * (l > 0 ? per_sample[l - 1] : 12 * KiB));
      int tmp = gen_alloc(g, wbytes[l]); /* this layer's weight gradient, added into grads */
      gen_free(g, tmp);
      gen_free(g, act[l]);
      gen_free(g, grad_out);
      grad_out = grad_in;
    }
    gen_free(g, grad_out);
    gen_free(g, input);
    for (int l = 0; l < TR_LAYERS; l++) { /* the optimizer's temporaries */
      int t = gen_alloc(g, wbytes[l]);
      gen_free(g, t);
    }
  }
  for (int l = 0; l < TR_LAYERS; l++) {
    gen_free(g, moments[l]);
    gen_free(g, grads[l]);
    gen_free(g, weights[l]);
  }
}

/* ------------------------------------------------------------------------ */
/* dataframe */

#define DF_COLS_MAX 8
#define DF_QUERIES 120

typedef struct df_table {
  int ncols;
  size_t rows;
  int col[DF_COLS_MAX];
  size_t width[DF_COLS_MAX];
} df_table;

static void df_make(gen *g, df_table *t, size_t rows, int ncols, const size_t *widths) {
  t->rows = rows < 128 ? 128 : rows;
  t->ncols = ncols;
  for (int c = 0; c < ncols; c++) {
    size_t bytes;
    t->width[c] = widths != NULL ? widths[c] : (gen_unit(g) < 0.5 ? 8 : 4);
    bytes = t->rows * t->width[c];
    if (bytes > 64 * MiB) /* 1 KiB-64 MiB columns */
      t->rows = 64 * MiB / t->width[c], bytes = 64 * MiB;
    t->col[c] = gen_alloc(g, bytes);
  }
}

static void df_drop(gen *g, df_table *t) {
  for (int c = 0; c < t->ncols; c++)
    gen_free(g, t->col[c]);
  t->ncols = 0;
}

static void dataframe(gen *g) {
  for (int q = 0; q < DF_QUERIES; q++) {
    df_table a, b, out;
    size_t rows = (size_t)gen_log_uniform(g, 256, 2.0e6);
    df_make(g, &a, rows, gen_range(g, 2, DF_COLS_MAX), NULL);
    int ops = gen_range(g, 2, 6);
    for (int k = 0; k < ops; k++) {
      double r = gen_unit(g);
      int mask = gen_alloc(g, a.rows); /* one byte per row */
      if (r < 0.45) { /* filter: keep a share of the rows */
        df_make(g, &out, (size_t)((double)a.rows * gen_log_uniform(g, 0.01, 0.9)), a.ncols, a.width);
      } else if (r < 0.7) { /* join with a second table */
        df_make(g, &b, (size_t)gen_log_uniform(g, 256, 5.0e5), gen_range(g, 1, 3), NULL);
        int hash = gen_alloc(g, b.rows * 16);
        int ncols = a.ncols + b.ncols > DF_COLS_MAX ? DF_COLS_MAX : a.ncols + b.ncols;
        size_t widths[DF_COLS_MAX];
        for (int c = 0; c < ncols; c++)
          widths[c] = c < a.ncols ? a.width[c] : b.width[c - a.ncols];
        df_make(g, &out, (size_t)((double)a.rows * gen_log_uniform(g, 0.2, 3.0)), ncols, widths);
        gen_free(g, hash);
        df_drop(g, &b);
      } else { /* group by: few rows, a hash table on the way */
        int hash = gen_alloc(g, a.rows * 12);
        df_make(g, &out, (size_t)((double)a.rows * gen_log_uniform(g, 0.001, 0.2)), gen_range(g, 1, a.ncols), NULL);
        gen_free(g, hash);
      }
      gen_free(g, mask);
      df_drop(g, &a);
      a = out;
    }
    df_drop(g, &a);
  }
}

/* ------------------------------------------------------------------------ */
/* vectors */

#define VEC_LIVE 24
#define VEC_STEPS 12000

static void vectors(gen *g) {
  int id[VEC_LIVE];
  size_t cap[VEC_LIVE], len[VEC_LIVE], limit[VEC_LIVE];
  double factor[VEC_LIVE];
  for (int i = 0; i < VEC_LIVE; i++)
    id[i] = -1;
  for (int step = 0; step < VEC_STEPS; step++) {
    int i = gen_range(g, 0, VEC_LIVE - 1);
    if (id[i] < 0) { /* a new vector: its element size, growth factor, final length */
      cap[i] = (size_t)gen_log_uniform(g, 64, 4096);
      len[i] = 0;
      limit[i] = (size_t)gen_log_uniform(g, 4.0 * KiB, 32.0 * MiB);
      factor[i] = 1.25 + 0.25 * (double)gen_range(g, 0, 3); /* 1.25, 1.5, 1.75, 2 */
      id[i] = gen_alloc(g, cap[i]);
      continue;
    }
    len[i] += (size_t)((double)cap[i] * gen_log_uniform(g, 0.1, 0.8));
    if (len[i] > limit[i] || gen_unit(g) < 0.01) { /* done with it */
      gen_free(g, id[i]);
      id[i] = -1;
    } else if (len[i] > cap[i]) {
      int grown;
      while (cap[i] < len[i])
        cap[i] = (size_t)((double)cap[i] * factor[i]);
      grown = gen_alloc(g, cap[i]);
      gen_free(g, id[i]);
      id[i] = grown;
    }
  }
  for (int i = 0; i < VEC_LIVE; i++)
    if (id[i] >= 0)
      gen_free(g, id[i]);
}

/* ------------------------------------------------------------------------ */

typedef struct kind {
  const char *name;
  uint64_t seed;
  void (*fn)(gen *);
  const char *what;
} kind;

static const kind kinds[] = {
    {"llm", 20261201u, llm, "an inference server: KV caches growing by 16 tokens, per-step activations"},
    {"training", 20261202u, training, "training whose batch size changes every 5-20 steps"},
    {"dataframe", 20261203u, dataframe, "dataframe operators with data-dependent column sizes (1 KiB-64 MiB)"},
    {"vectors", 20261204u, vectors, "vectors that grow by 1.25-2x"},
};

const char *um_trace_gen_kinds(void) { return "llm, training, dataframe, vectors"; }

int um_trace_gen_write(const char *kind_name, const char *path) {
  const kind *k = NULL;
  gen g;
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
    if (strcmp(kinds[i].name, kind_name) == 0)
      k = &kinds[i];
  if (k == NULL) {
    fprintf(stderr, "bench pool: no trace kind '%s' (%s, mixed)\n", kind_name, um_trace_gen_kinds());
    return 2;
  }
  memset(&g, 0, sizeof(g));
  g.s = k->seed;
  g.f = fopen(path, "w");
  if (g.f == NULL) {
    fprintf(stderr, "bench pool: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  fprintf(g.f, "# unimem allocation trace: bench_pool --make-trace FILE --kind %s (seed %llu)\n", k->name,
          (unsigned long long)k->seed);
  fprintf(g.f, "# %s; bench/trace_gen.c says what is simulated.\n", k->what);
  fprintf(g.f, "# a ID BYTES: allocate; f ID: free.\n");
  k->fn(&g);
  return fclose(g.f) == 0 ? 0 : 1;
}
