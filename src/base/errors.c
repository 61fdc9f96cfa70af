/* Status codes, their texts, and the thread-local detail of the last
 * failure. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"

static _Thread_local char last_error[1024];

/* Every status code with its name and text, from unimem.h's list. */
static const struct status_entry {
  int code;
  const char *name;
  const char *text;
} statuses[] = {
#define UM_STATUS_ENTRY_(name, value, text) {UM_##name, "UM_" #name, text},
    UM_ERRNO_MAP(UM_STATUS_ENTRY_)
#undef UM_STATUS_ENTRY_
};

static const struct status_entry *status_find(int status) {
  for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++)
    if (statuses[i].code == status)
      return &statuses[i];
  return NULL;
}

const char *um_strerror(int status) {
  const struct status_entry *e = status_find(status);
  return e != NULL ? e->text : "unknown status";
}

const char *um_err_name(int status) {
  const struct status_entry *e = status_find(status);
  return e != NULL ? e->name : "UM_UNKNOWN";
}

const char *um_last_error(void) { return last_error; }

int um__set_error(int status, const char *fmt, ...) {
  /* Formatted aside first: an argument may be um_last_error() itself, when
   * a caller adds its context to a lower layer's reason. */
  char text[sizeof(last_error)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  memcpy(last_error, text, sizeof(last_error));
  return status;
}

void um__clear_error(void) { last_error[0] = '\0'; }

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void um__log(const um_options *opts, um_log_level level, const char *fmt,
             ...) {
  char msg[768];
  va_list ap;
  if (opts != NULL && level > opts->log_level)
    return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (opts != NULL && opts->log != NULL) {
    opts->log(opts->log_ctx, level, msg);
    return;
  }
  fprintf(stderr, "unimem %s: %s\n",
          level_names[(unsigned)level < 4 ? (unsigned)level : 3], msg);
}

unsigned um_version(void) { return UM_VERSION_HEX; }

const char *um_version_string(void) { return UM_VERSION_STRING; }
