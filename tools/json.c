/* Recursive-descent JSON reader (RFC 8259), depth-limited so that a hostile
 * file cannot exhaust the stack. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct parser {
  const char *p;
  const char *start;
  char *err;
  size_t errcap;
  int failed;
} parser;

static void fail(parser *ps, const char *fmt, ...) {
  va_list ap;
  int n;
  if (ps->failed)
    return;
  ps->failed = 1;
  n = snprintf(ps->err, ps->errcap, "offset %ld: ", (long)(ps->p - ps->start));
  if (n < 0 || (size_t)n >= ps->errcap)
    return;
  va_start(ap, fmt);
  vsnprintf(ps->err + n, ps->errcap - (size_t)n, fmt, ap);
  va_end(ap);
}

static void skip_space(parser *ps) {
  while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
    ps->p++;
}

static json_value *new_value(parser *ps, json_type type) {
  json_value *v = calloc(1, sizeof(*v));
  if (v == NULL)
    fail(ps, "out of memory");
  else
    v->type = type;
  return v;
}

/* Append code point cp as UTF-8. */
static size_t put_utf8(char *out, unsigned cp) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

static int hex4(parser *ps, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = ps->p[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (unsigned)(c - 'A' + 10);
    else {
      fail(ps, "bad \\u escape");
      return -1;
    }
  }
  ps->p += 4;
  *out = v;
  return 0;
}

/* A string token; ps->p is at the opening quote. The decoded text is never
 * longer than the source, so one allocation of the source length holds it. */
static char *parse_string(parser *ps) {
  const char *q = ps->p + 1;
  size_t cap = 0;
  char *out, *w;
  while (*q && *q != '"') {
    if (*q == '\\' && q[1])
      q++;
    q++;
  }
  if (*q != '"') {
    fail(ps, "unterminated string");
    return NULL;
  }
  cap = (size_t)(q - ps->p);
  out = malloc(cap + 1);
  if (out == NULL) {
    fail(ps, "out of memory");
    return NULL;
  }
  w = out;
  ps->p++;
  while (*ps->p != '"') {
    unsigned char c = (unsigned char)*ps->p;
    if (c < 0x20) {
      fail(ps, "control character in a string");
      free(out);
      return NULL;
    }
    if (c != '\\') {
      *w++ = (char)c;
      ps->p++;
      continue;
    }
    ps->p++;
    switch (*ps->p++) {
    case '"': *w++ = '"'; break;
    case '\\': *w++ = '\\'; break;
    case '/': *w++ = '/'; break;
    case 'b': *w++ = '\b'; break;
    case 'f': *w++ = '\f'; break;
    case 'n': *w++ = '\n'; break;
    case 'r': *w++ = '\r'; break;
    case 't': *w++ = '\t'; break;
    case 'u': {
      unsigned cp, lo;
      if (hex4(ps, &cp) != 0) {
        free(out);
        return NULL;
      }
      if (cp >= 0xD800 && cp < 0xDC00 && ps->p[0] == '\\' && ps->p[1] == 'u') {
        ps->p += 2;
        if (hex4(ps, &lo) != 0) {
          free(out);
          return NULL;
        }
        if (lo >= 0xDC00 && lo < 0xE000)
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      /* A \uXXXX escape takes 6 source bytes and yields at most 3 (or 12
       * for a pair yielding 4): the buffer suffices. */
      w += put_utf8(w, cp);
      break;
    }
    default:
      fail(ps, "bad escape");
      free(out);
      return NULL;
    }
  }
  ps->p++;
  *w = '\0';
  return out;
}

static json_value *parse_value(parser *ps, int depth);

static int push_item(parser *ps, json_value *v, json_value *item, char *key) {
  json_value **items = realloc(v->items, (v->count + 1) * sizeof(*items));
  if (items == NULL) {
    fail(ps, "out of memory");
    return -1;
  }
  v->items = items;
  if (v->type == JSON_OBJECT) {
    char **keys = realloc(v->keys, (v->count + 1) * sizeof(*keys));
    if (keys == NULL) {
      fail(ps, "out of memory");
      return -1;
    }
    v->keys = keys;
    v->keys[v->count] = key;
  }
  v->items[v->count++] = item;
  return 0;
}

static json_value *parse_container(parser *ps, int depth, json_type type) {
  char close = type == JSON_ARRAY ? ']' : '}';
  json_value *v = new_value(ps, type);
  if (v == NULL)
    return NULL;
  ps->p++;
  skip_space(ps);
  if (*ps->p == close) {
    ps->p++;
    return v;
  }
  for (;;) {
    char *key = NULL;
    json_value *item;
    skip_space(ps);
    if (type == JSON_OBJECT) {
      if (*ps->p != '"') {
        fail(ps, "expected a key");
        break;
      }
      if ((key = parse_string(ps)) == NULL)
        break;
      skip_space(ps);
      if (*ps->p != ':') {
        fail(ps, "expected ':'");
        free(key);
        break;
      }
      ps->p++;
    }
    item = parse_value(ps, depth + 1);
    if (item == NULL) {
      free(key);
      break;
    }
    if (push_item(ps, v, item, key) != 0) {
      json_free(item);
      free(key);
      break;
    }
    skip_space(ps);
    if (*ps->p == ',') {
      ps->p++;
      continue;
    }
    if (*ps->p == close) {
      ps->p++;
      return v;
    }
    fail(ps, "expected ',' or '%c'", close);
    break;
  }
  json_free(v);
  return NULL;
}

static json_value *parse_number(parser *ps) {
  const char *q = ps->p;
  char *end;
  json_value *v;
  /* JSON's grammar is stricter than strtod's: check it first. */
  if (*q == '-')
    q++;
  if (*q == '0')
    q++;
  else if (*q >= '1' && *q <= '9')
    while (*q >= '0' && *q <= '9')
      q++;
  else {
    fail(ps, "unexpected character '%c'", *ps->p ? *ps->p : '?');
    return NULL;
  }
  if (*q == '.') {
    q++;
    if (!(*q >= '0' && *q <= '9')) {
      fail(ps, "bad number");
      return NULL;
    }
    while (*q >= '0' && *q <= '9')
      q++;
  }
  if (*q == 'e' || *q == 'E') {
    q++;
    if (*q == '+' || *q == '-')
      q++;
    if (!(*q >= '0' && *q <= '9')) {
      fail(ps, "bad exponent");
      return NULL;
    }
    while (*q >= '0' && *q <= '9')
      q++;
  }
  if ((v = new_value(ps, JSON_NUMBER)) == NULL)
    return NULL;
  v->number = strtod(ps->p, &end);
  ps->p = q;
  return v;
}

static json_value *parse_value(parser *ps, int depth) {
  json_value *v;
  if (depth > JSON_MAX_DEPTH) {
    fail(ps, "nested too deeply");
    return NULL;
  }
  skip_space(ps);
  switch (*ps->p) {
  case '{': return parse_container(ps, depth, JSON_OBJECT);
  case '[': return parse_container(ps, depth, JSON_ARRAY);
  case '"':
    if ((v = new_value(ps, JSON_STRING)) != NULL && (v->string = parse_string(ps)) == NULL) {
      free(v);
      v = NULL;
    }
    return v;
  case 't':
  case 'f':
  case 'n': {
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
      size_t len = strlen(words[i]);
      if (strncmp(ps->p, words[i], len) == 0) {
        ps->p += len;
        if ((v = new_value(ps, i == 2 ? JSON_NULL : JSON_BOOL)) != NULL)
          v->number = i == 0;
        return v;
      }
    }
    fail(ps, "unknown word");
    return NULL;
  }
  default: return parse_number(ps);
  }
}

json_value *json_parse(const char *text, char *err, size_t errcap) {
  parser ps = {text, text, err, errcap, 0};
  json_value *v;
  if (errcap > 0)
    err[0] = '\0';
  v = parse_value(&ps, 0);
  if (v == NULL)
    return NULL;
  skip_space(&ps);
  if (*ps.p != '\0') {
    fail(&ps, "text after the document");
    json_free(v);
    return NULL;
  }
  return v;
}

void json_free(json_value *v) {
  if (v == NULL)
    return;
  for (size_t i = 0; i < v->count; i++) {
    json_free(v->items[i]);
    if (v->keys)
      free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->string);
  free(v);
}

const json_value *json_get(const json_value *obj, const char *key) {
  if (obj == NULL || obj->type != JSON_OBJECT)
    return NULL;
  for (size_t i = 0; i < obj->count; i++)
    if (strcmp(obj->keys[i], key) == 0)
      return obj->items[i];
  return NULL;
}

const char *json_get_string(const json_value *obj, const char *key) {
  const json_value *v = json_get(obj, key);
  return v != NULL && v->type == JSON_STRING ? v->string : NULL;
}
