/* unimem view: a history (um_history_write) as one self-contained HTML
 * page: tools/view_page.html, carried in the program (cmake/embed.cmake),
 * with the file's JSON in its data element. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

extern const char tool_view_page[]; /* view_page.c, made from view_page.html */

const char tool_view_help[] =
    "NAME\n"
    "    unimem view - draw a recorded history as one HTML page\n"
    "\n"
    "SYNOPSIS\n"
    "    unimem view FILE [-o PAGE]\n"
    "\n"
    "DESCRIPTION\n"
    "    Reads FILE, a history that um_history_write wrote (Chrome trace-event\n"
    "    JSON; `unimem stats --history FILE` records one, and so does Python's\n"
    "    `with m.history() as h: ... h.save(FILE)`), and writes one page that\n"
    "    needs no network, no scripts and no fonts from elsewhere: memory in use\n"
    "    over time per device, stacked by tag; the block map at an instant chosen\n"
    "    on the timeline (the peak at first; hover a block for its size, tag,\n"
    "    site and age); the copy lanes per device and direction with their\n"
    "    bandwidth; and the largest live blocks at that instant.\n"
    "\n"
    "OPTIONS\n"
    "    -o PAGE        where the page goes (default: FILE with .html in place of\n"
    "                   a .json ending, or appended).\n"
    "    -h, --help     this text.\n"
    "\n"
    "EXIT STATUS\n"
    "    0  the page was written; 1 FILE cannot be read, is not a history, or the\n"
    "    page cannot be written; 2 bad usage.\n";

/* The whole of path, NUL-terminated; NULL with a message. */
static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t cap = 0, n = 0;
  if (f == NULL) {
    fprintf(stderr, "unimem view: cannot read %s: %s\n", path, strerror(errno));
    return NULL;
  }
  for (;;) {
    if (n + 65536 + 1 > cap) {
      char *grown = realloc(buf, cap = 2 * cap + 65536 + 1);
      if (grown == NULL) {
        free(buf);
        fclose(f);
        fprintf(stderr, "unimem view: out of memory reading %s\n", path);
        return NULL;
      }
      buf = grown;
    }
    size_t got = fread(buf + n, 1, 65536, f);
    n += got;
    if (got == 0)
      break;
  }
  fclose(f);
  buf[n] = '\0';
  *len = n;
  return buf;
}

/* The JSON into the page's data element: "</" written as "<\/" (the same
 * string to JSON), so that nothing in it ends the element. */
static void put_data(FILE *out, const char *json, size_t len) {
  for (size_t i = 0; i < len; i++) {
    fputc(json[i], out);
    if (json[i] == '<' && i + 1 < len && json[i + 1] == '/')
      fputc('\\', out);
  }
}

int tool_view(int argc, char **argv) {
  const char *in = NULL, *page = NULL, *mark;
  char defpage[4096];
  size_t len;
  char *json;
  FILE *out;
  int bad;
  for (int i = 1; i < argc; i++) {
    if (tool_is_help(argv[i])) {
      fputs(tool_view_help, stdout);
      return 0;
    } else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
      page = argv[++i];
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "unimem view: unknown option '%s' (unimem view --help)\n", argv[i]);
      return 2;
    } else if (in == NULL) {
      in = argv[i];
    } else {
      fprintf(stderr, "unimem view: one FILE only (unimem view --help)\n");
      return 2;
    }
  }
  if (in == NULL) {
    fprintf(stderr, "unimem view: which history? (unimem view FILE [-o PAGE])\n");
    return 2;
  }
  if (page == NULL) {
    size_t n = strlen(in);
    if (n > 5 && strcmp(in + n - 5, ".json") == 0)
      snprintf(defpage, sizeof(defpage), "%.*s.html", (int)(n - 5), in);
    else
      snprintf(defpage, sizeof(defpage), "%s.html", in);
    page = defpage;
  }
  if ((json = read_all(in, &len)) == NULL)
    return 1;
  if (strstr(json, "\"traceEvents\"") == NULL || strstr(json, "unimem history") == NULL) {
    fprintf(stderr, "unimem view: %s is not a history of um_history_write (no \"traceEvents\")\n", in);
    free(json);
    return 1;
  }
  if ((mark = strstr(tool_view_page, "@DATA@")) == NULL) {
    fprintf(stderr, "unimem view: the page template has no data mark\n");
    free(json);
    return 1;
  }
  if ((out = fopen(page, "w")) == NULL) {
    fprintf(stderr, "unimem view: cannot write %s: %s\n", page, strerror(errno));
    free(json);
    return 1;
  }
  fwrite(tool_view_page, 1, (size_t)(mark - tool_view_page), out);
  put_data(out, json, len);
  fputs(mark + strlen("@DATA@"), out);
  free(json);
  bad = ferror(out) | fclose(out);
  if (bad) {
    fprintf(stderr, "unimem view: writing %s failed\n", page);
    return 1;
  }
  printf("unimem view: %s\n", page);
  return 0;
}
