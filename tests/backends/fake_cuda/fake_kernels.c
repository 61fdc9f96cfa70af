/* The fake driver's registry of kernels (see fake_kernels.h): the kernels
 * of the tests' and the example's PTX (axpb, fill, add over int32), and the
 * cuda backend's own gate kernel (unimem_gate_wait), which it launches
 * where the driver has no stream memory operations. */
#include "fake_kernels.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Parameters                                                                */

static uint64_t arg_u64(const fake_launch *l, int i) {
  uint64_t v;
  memcpy(&v, l->args + l->offset[i], sizeof(v));
  return v;
}

static uint32_t arg_u32(const fake_launch *l, int i) {
  uint32_t v;
  memcpy(&v, l->args + l->offset[i], sizeof(v));
  return v;
}

void fake_launch_args(fake_launch *l, void **params) {
  size_t at = 0;
  for (int i = 0; i < l->kernel->nparams; i++) {
    size_t size = l->kernel->param_size[i];
    at = (at + size - 1) / size * size; /* natural alignment, as the ABI */
    l->offset[i] = at;
    memcpy(l->args + at, params[i], size);
    at += size;
  }
}

/* Elements a 1-D kernel over n elements touches: threads past n do
 * nothing, as the PTX's bounds check says. */
static size_t covered(const fake_launch *l, uint32_t n) { return l->threads < n ? l->threads : n; }

/* ------------------------------------------------------------------------ */
/* The kernels                                                               */

/* axpb(int *x, int a, int b, unsigned n): x[i] = a * x[i] + b, wrapping as
 * the GPU's 32-bit arithmetic does. */
static int axpb_ranges(const fake_launch *l, fake_range *out) {
  out[0] = (fake_range){(uintptr_t)arg_u64(l, 0), 4 * covered(l, arg_u32(l, 3)), 1};
  return 1;
}

static void axpb_run(const fake_launch *l) {
  uint32_t *x = (uint32_t *)(uintptr_t)arg_u64(l, 0);
  uint32_t a = arg_u32(l, 1), b = arg_u32(l, 2);
  for (size_t i = 0; i < covered(l, arg_u32(l, 3)); i++)
    x[i] = a * x[i] + b;
}

/* fill(int *x, int v, unsigned n): x[i] = v. */
static int fill_ranges(const fake_launch *l, fake_range *out) {
  out[0] = (fake_range){(uintptr_t)arg_u64(l, 0), 4 * covered(l, arg_u32(l, 2)), 1};
  return 1;
}

static void fill_run(const fake_launch *l) {
  uint32_t *x = (uint32_t *)(uintptr_t)arg_u64(l, 0);
  for (size_t i = 0; i < covered(l, arg_u32(l, 2)); i++)
    x[i] = arg_u32(l, 1);
}

/* add(const int *a, const int *b, int *c, unsigned n): c[i] = a[i] + b[i]. */
static int add_ranges(const fake_launch *l, fake_range *out) {
  size_t bytes = 4 * covered(l, arg_u32(l, 3));
  out[0] = (fake_range){(uintptr_t)arg_u64(l, 0), bytes, 0};
  out[1] = (fake_range){(uintptr_t)arg_u64(l, 1), bytes, 0};
  out[2] = (fake_range){(uintptr_t)arg_u64(l, 2), bytes, 1};
  return 3;
}

static void add_run(const fake_launch *l) {
  const uint32_t *a = (const uint32_t *)(uintptr_t)arg_u64(l, 0);
  const uint32_t *b = (const uint32_t *)(uintptr_t)arg_u64(l, 1);
  uint32_t *c = (uint32_t *)(uintptr_t)arg_u64(l, 2);
  for (size_t i = 0; i < covered(l, arg_u32(l, 3)); i++)
    c[i] = a[i] + b[i];
}

/* unimem_gate_wait(const volatile unsigned *word, unsigned value): spins
 * until (int)(*word - value) >= 0. The word is host memory written by the
 * host without a driver call, so the stream's thread polls it. */
static int gate_ranges(const fake_launch *l, fake_range *out) {
  (void)l;
  (void)out;
  return 0;
}

static int gate_ready(const fake_launch *l) {
  const uint32_t *word = (const uint32_t *)(uintptr_t)arg_u64(l, 0);
  return (int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - arg_u32(l, 1)) >= 0;
}

static void gate_run(const fake_launch *l) { (void)l; }

/* spin_fill(int *x, const unsigned *word, int v, unsigned n): fill once the
 * host word is not 0. Only the fake runs it (its tests' own, to hold a
 * kernel that uses memory while it waits). */
static int spin_fill_ranges(const fake_launch *l, fake_range *out) {
  out[0] = (fake_range){(uintptr_t)arg_u64(l, 0), 4 * covered(l, arg_u32(l, 3)), 1};
  return 1;
}

static int spin_fill_ready(const fake_launch *l) {
  return __atomic_load_n((const uint32_t *)(uintptr_t)arg_u64(l, 1), __ATOMIC_ACQUIRE) != 0;
}

static void spin_fill_run(const fake_launch *l) {
  uint32_t *x = (uint32_t *)(uintptr_t)arg_u64(l, 0);
  for (size_t i = 0; i < covered(l, arg_u32(l, 3)); i++)
    x[i] = arg_u32(l, 2);
}

static const fake_kernel registry[] = {
    {"axpb", 4, {8, 4, 4, 4}, axpb_ranges, NULL, axpb_run},
    {"fill", 3, {8, 4, 4, 0}, fill_ranges, NULL, fill_run},
    {"add", 4, {8, 8, 8, 4}, add_ranges, NULL, add_run},
    {"unimem_gate_wait", 2, {8, 4, 0, 0}, gate_ranges, gate_ready, gate_run},
    {"spin_fill", 4, {8, 8, 4, 4}, spin_fill_ranges, spin_fill_ready, spin_fill_run},
};

const fake_kernel *fake_kernel_find(const char *name) {
  for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++)
    if (strcmp(registry[i].name, name) == 0)
      return &registry[i];
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Reading PTX                                                               */

static const char *skip_space(const char *p) {
  while (*p != '\0' && isspace((unsigned char)*p))
    p++;
  return p;
}

/* Copy the identifier at p into out; returns the character after it. */
static const char *read_name(const char *p, char *out, size_t cap) {
  size_t n = 0;
  while (*p != '\0' && (isalnum((unsigned char)*p) || *p == '_' || *p == '$')) {
    if (n + 1 < cap)
      out[n++] = *p;
    p++;
  }
  out[n] = '\0';
  return p;
}

/* Bytes of a PTX scalar type (".u64", ".b32", ...), 0 when unknown. */
static size_t type_size(const char *p) {
  unsigned long bits;
  if (p[0] != '.' || strchr("usbf", p[1]) == NULL || !isdigit((unsigned char)p[2]))
    return 0;
  bits = strtoul(p + 2, NULL, 10);
  return bits == 8 || bits == 16 || bits == 32 || bits == 64 ? bits / 8 : 0;
}

/* The parameter list at p ("(.param .u64 x, .param .u32 n)") against k's;
 * returns 1 when the sizes match. */
static int params_match(const char *p, const fake_kernel *k, char *why, size_t why_len) {
  int n = 0;
  p = skip_space(p);
  if (*p != '(') {
    snprintf(why, why_len, "%s: no parameter list", k->name);
    return 0;
  }
  for (p = skip_space(p + 1); *p != ')'; p = skip_space(p)) {
    size_t size;
    if (strncmp(p, ".param", 6) != 0) {
      snprintf(why, why_len, "%s: parameter %d is not a .param", k->name, n);
      return 0;
    }
    size = type_size(skip_space(p + 6));
    if (n >= k->nparams || size != k->param_size[n]) {
      snprintf(why, why_len, "%s: parameter %d differs from the fake kernel's", k->name, n);
      return 0;
    }
    n++;
    while (*p != '\0' && *p != ',' && *p != ')')
      p++;
    if (*p == ',')
      p++;
    else if (*p == '\0')
      break;
  }
  if (n != k->nparams) {
    snprintf(why, why_len, "%s: %d parameters, the fake kernel has %d", k->name, n, k->nparams);
    return 0;
  }
  return 1;
}

int fake_ptx_entries(const char *image, const fake_kernel **out, int max, char *why, size_t why_len) {
  int n = 0;
  const char *p = image;
  snprintf(why, why_len, "no .entry in the image");
  while ((p = strstr(p, ".entry")) != NULL) {
    char name[64];
    const fake_kernel *k;
    p = read_name(skip_space(p + 6), name, sizeof(name));
    if ((k = fake_kernel_find(name)) == NULL) {
      snprintf(why, why_len, "kernel %s is not one the fake driver can run", name);
      return 0;
    }
    if (!params_match(p, k, why, why_len))
      return 0;
    if (n == max) {
      snprintf(why, why_len, "more than %d kernels in one image", max);
      return 0;
    }
    out[n++] = k;
  }
  return n;
}
