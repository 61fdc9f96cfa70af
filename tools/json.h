/* A small JSON reader for the unimem command: it checks the reports the
 * benchmarks write before they are merged into one file, and finds the
 * figures the chart plots. Whole documents only, UTF-8 passed through. */
#ifndef UNIMEM_TOOL_JSON_H
#define UNIMEM_TOOL_JSON_H

#include <stddef.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
  json_type type;
  double number;  /* JSON_NUMBER; JSON_BOOL: 0 or 1 */
  char *string;   /* JSON_STRING */
  size_t count;   /* JSON_ARRAY, JSON_OBJECT: number of items */
  char **keys;    /* JSON_OBJECT */
  struct json_value **items;
} json_value;

/* Parse text; NULL on a syntax error, with a message in err. */
json_value *json_parse(const char *text, char *err, size_t errcap);
void json_free(json_value *v);
/* Member of an object by key, or NULL. */
const json_value *json_get(const json_value *obj, const char *key);
/* The text of a string member, or NULL. */
const char *json_get_string(const json_value *obj, const char *key);

#endif
