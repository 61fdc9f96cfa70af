#!/usr/bin/env python3
"""Doxygen input filter for unimem's public headers (docs/Doxyfile runs it).

The headers keep the plain C comment style of the project (libuv's, not
Javadoc's); this filter shows them to Doxygen as documentation, so that the
header text stays the single source of the API reference:

- a comment on its own lines before a declaration becomes its documentation
  (/** ... */), a comment after code on the same line documents that member
  (/**< ... */), and the file's first comment documents the file;
- a comment followed by a blank line is a section heading, and a line of
  dashes a separator: both stay plain comments;
- inside converted comments, characters Doxygen would read as markup
  (<, >, @, \\, &) are escaped, because the comments are prose;
- one comment over several declarations (no blank line between them)
  documents each of them (a member group);
- X-macro lists (UM_ERRNO_MAP, UM_STATS_FIELDS) used inside an enum or a
  struct are expanded, each member documented with the description string
  of its list entry, so that the reference lists every status code and
  statistic with its meaning.

Line numbers are kept: expansions stay on the line of the macro use.
Usage: doxygen_filter.py FILE (writes the filtered text on stdout).
"""
import os
import re
import sys

ESCAPES = {"<": "\\<", ">": "\\>", "@": "\\@", "\\": "\\\\", "&": "\\&"}


def escape_prose(text):
    return "".join(ESCAPES.get(c, c) for c in text)


def xmacro_lists(src):
    """{list name: [entry args]} for every '#define NAME(XX) XX(...) ...'."""
    lists = {}
    for m in re.finditer(r"^#define\s+(\w+)\((\w+)\)\s*\\\n((?:.*\\\n)*.*)$", src, re.M):
        name, param, body = m.group(1), m.group(2), m.group(3)
        entries = re.findall(re.escape(param) + r"\(([^()]*)\)", body)
        if entries:
            lists[name] = [split_args(e) for e in entries]
    return lists


def split_args(text):
    args, cur, quoted = [], "", False
    for c in text:
        if c == '"':
            quoted = not quoted
        if c == "," and not quoted:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
    args.append(cur.strip())
    return args


def helper_macros(src):
    """{name: (params, body)} for one-line function-like macros."""
    helpers = {}
    for m in re.finditer(r"^#define\s+(\w+)\(([^)]*)\)\s+(.*[^\\\s])\s*$", src, re.M):
        helpers[m.group(1)] = ([p.strip() for p in m.group(2).split(",")], m.group(3))
    return helpers


def expand(params, body, args):
    """Substitute args for params in body, with ## pasting."""
    values = dict(zip(params, args))
    out = re.sub(r"\b(\w+)\b", lambda m: values.get(m.group(1), m.group(1)), body)
    return re.sub(r"\s*##\s*", "", out)


def expand_xmacros(src):
    lists, helpers = xmacro_lists(src), helper_macros(src)
    used = set()

    def replace(m):
        indent, lst, helper = m.group(1), m.group(2), m.group(3)
        if lst not in lists or helper not in helpers:
            return m.group(0)
        used.add(helper)
        params, body = helpers[helper]
        members = []
        for args in lists[lst]:
            doc = next((a[1:-1] for a in reversed(args) if a.startswith('"')), "")
            members.append("%s /**< %s */" % (expand(params, body, args), escape_prose(doc)))
        return indent + " ".join(members)

    src = re.sub(r"^(\s*)(\w+)\((\w+)\)[ \t]*$", replace, src, flags=re.M)
    # The helper macros exist only to be expanded: hide them, keep the lines.
    for helper in used:
        src = re.sub(r"^#(define|undef)\s+" + helper + r"\b.*$", "", src, flags=re.M)
    return src


def declaration_run(src, pos):
    """When the text from pos up to the next blank line or comment holds two
    or more top-level declarations and nothing else (no braces, no
    preprocessor lines), the offset where the last one ends; else None."""
    stops = [x for x in (src.find("\n\n", pos), src.find("/*", pos), src.find("//", pos)) if x >= 0]
    run = src[pos:min(stops) if stops else len(src)]
    if "{" in run or re.search(r"^\s*#", run, re.M):
        return None
    if run.count(";") < 2:
        return None
    return pos + run.rindex(";") + 1


def convert_comments(src, name):
    out, i, n, first = [], 0, len(src), True
    while i < n:
        c = src[i]
        if c in "\"'":  # string or character literal
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
            continue
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(src[i:j])
            i = j
            continue
        if not src.startswith("/*", i):
            out.append(c)
            i += 1
            continue
        end = src.find("*/", i + 2)
        end = n - 2 if end < 0 else end
        body = src[i + 2:end]
        line_start = src.rfind("\n", 0, i) + 1
        trailing = src[line_start:i].strip() != ""
        after = src[end + 2:]
        rest_of_line, _, next_lines = after.partition("\n")
        heading = not trailing and (next_lines.startswith("\n") or next_lines.strip() == "")
        separator = re.fullmatch(r"\s*-+\s*", body) is not None
        if body.startswith("*") or body.startswith("!") or separator or (heading and not first):
            out.append(src[i:end + 2])
        elif trailing:
            out.append("/**<" + escape_prose(body) + "*/")
        elif first:
            out.append("/** \\file " + name + escape_prose(body) + "*/")
        else:
            group_end = declaration_run(src, end + 2)
            if group_end is None:
                out.append("/**" + escape_prose(body) + "*/")
            else:
                # One comment over several declarations: a member group, so
                # that every member gets the text (DISTRIBUTE_GROUP_DOC).
                out.append("/**@{*/ /**" + escape_prose(body) + "*/")
                out.append(src[end + 2:group_end] + " /**@}*/")
                i = group_end
                first = False
                continue
        first = False
        i = end + 2
    return "".join(out)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        src = f.read()
    sys.stdout.write(convert_comments(expand_xmacros(src), os.path.basename(sys.argv[1])))


if __name__ == "__main__":
    main()
