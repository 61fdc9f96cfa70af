#!/usr/bin/env python3
"""The layers of src/, read from the code: which folder's functions use which.

Every function, macro and global variable of src/ is found with Universal Ctags; a name used
inside a function's (or a macro's) body in another file is an edge from the
user's folder to the definer's. Calls through a function pointer (a hook, the
backend table, the path table) are not edges: that is how a lower layer
reaches a higher one without depending on it.

  scripts/layers.py                  the folder graph, in words
  scripts/layers.py --check          exit 1 on a call cycle between folders, a
                                     call up the order in src/README.md, or a
                                     function over 80 lines
  scripts/layers.py --files FOLDER   the file-level edges leaving FOLDER
  scripts/layers.py --markdown       the drawing for docs/design.md
  scripts/layers.py --update-design  rewrite that drawing in docs/design.md
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
DESIGN = os.path.join(ROOT, "docs", "design.md")
BEGIN = "<!-- layers: made by scripts/layers.py --update-design; do not edit -->"
END = "<!-- end of layers -->"


def order_from_readme():
    """The folders bottom to top, from src/README.md's "Order:" line."""
    path = os.path.join(SRC, "README.md")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*Order:\s*(.*)$", line)
            if m:
                return m.group(1).replace("<", " ").split()
    return []


def folder_of(rel):
    """src/ops/op.c -> ops; src/net/ucx/x.c -> net/ucx; src/types.h -> ."""
    parts = rel.split("/")[1:-1]
    if not parts:
        return "."
    if len(parts) >= 2 and parts[0] == "net" and parts[1] == "ucx":
        return "net/ucx"
    if parts[0] == "backend" and len(parts) >= 2:
        return "backend"
    return parts[0]


def sources():
    out = []
    for d, _, files in os.walk(SRC):
        for f in files:
            if f.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(d, f), ROOT))
    return sorted(out)


def tags(files):
    cmd = ["ctags", "--output-format=json", "--fields=+neK", "--fields-C=+{properties}", "--language-force=C", "--c-kinds=fdv", "-f", "-"]
    try:
        res = subprocess.run(cmd + files, cwd=ROOT, capture_output=True, text=True, check=True)
    except FileNotFoundError:
        sys.exit("layers.py: needs Universal Ctags (apt-get install universal-ctags)")
    out = []
    for line in res.stdout.splitlines():
        t = json.loads(line)
        if t.get("_type") == "tag" and t.get("kind") in ("function", "macro", "variable"):
            out.append(t)
    return out


COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'", re.S)
# A name, unless it follows . or -> (a member of the same name).
IDENT = re.compile(r"(?<![.>\w])\s*([A-Za-z_][A-Za-z0-9_]*)")


def stripped_lines(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        text = f.read()
    # Keep the line count: a comment or string becomes as many newlines.
    text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n") + " ", text)
    return text.split("\n")


MAX_FUNCTION_LINES = 80


def long_functions(files):
    out = []
    for t in tags(files):
        n = t.get("end", t["line"]) - t["line"] + 1
        if t["kind"] == "function" and n > MAX_FUNCTION_LINES:
            out.append(f"function {t['name']} ({t['path']}:{t['line']}) is {n} lines, over {MAX_FUNCTION_LINES}")
    return out


def graph():
    files = sources()
    defs = {}    # name -> set of files defining it (static ones can repeat)
    bodies = []  # (file, name, first line, last line)
    local = {}   # file -> names only it sees (its static functions)
    for t in tags(files):
        static = "static" in t.get("properties", "").split(",")
        if static and t["path"].endswith(".c"):
            local.setdefault(t["path"], set()).add(t["name"])
        else:
            defs.setdefault(t["name"], set()).add(t["path"])
        end = t.get("end", t["line"])
        bodies.append((t["path"], t["name"], t["line"], end))
    lines = {f: stripped_lines(f) for f in files}
    edges = {}   # (from file, to file) -> set of names
    for f, name, first, last in bodies:
        seen = set()
        for ln in lines[f][first - 1:last]:
            for ident in IDENT.findall(ln):
                if ident == name or ident in seen or ident not in defs or ident in local.get(f, ()):
                    continue
                seen.add(ident)
                where = defs[ident]
                if f in where:
                    continue
                # A name defined in several other files (a static helper of
                # the same name) is not a reference to any of them.
                if len(where) != 1:
                    continue
                (g,) = where
                edges.setdefault((f, g), set()).add(ident)
    return files, edges


def folder_edges(edges):
    out = {}
    for (f, g), names in edges.items():
        a, b = folder_of(f), folder_of(g)
        if a != b:
            out.setdefault((a, b), {}).setdefault((f, g), set()).update(names)
    return out


def cycles(nodes, fedges):
    """Strongly connected components with more than one folder (Tarjan)."""
    succ = {n: sorted({b for (a, b) in fedges if a == n}) for n in nodes}
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return comps


def describe(fe, detail_from=None):
    out = []
    for (a, b) in sorted(fe):
        n = sum(len(v) for v in fe[(a, b)].values())
        out.append(f"{a} -> {b}: {n} name(s)")
        if detail_from in (a, "*"):
            for (f, g), names in sorted(fe[(a, b)].items()):
                out.append(f"    {f} -> {g}: {', '.join(sorted(names))}")
    return out


def problems(files, fe, order):
    nodes = sorted({folder_of(f) for f in files})
    found = []
    for comp in cycles(nodes, fe):
        found.append("cycle between folders: " + " <-> ".join(comp))
    rank = {n: i for i, n in enumerate(order)}
    for (a, b) in sorted(fe):
        if a in rank and b in rank and rank[b] > rank[a]:
            for (f, g), names in sorted(fe[(a, b)].items()):
                found.append(f"call up the order: {f} -> {g} ({', '.join(sorted(names))})")
    for n in nodes:
        if order and n not in rank and n != ".":
            found.append(f"folder {n} is not in src/README.md's Order line")
    return found


def markdown(files, fe, order):
    """A drawing of the layers, top to bottom, each with its files and the
    folders it uses."""
    nodes = sorted({folder_of(f) for f in files})
    ranked = [n for n in reversed(order) if n in nodes] + [n for n in nodes if n not in order]
    by_folder = {}
    for f in files:
        # Named from the layer's folder: backend/'s cuda/load.c and opencl/load.c.
        folder = folder_of(f)
        by_folder.setdefault(folder, []).append(os.path.relpath(f, "src/" + folder))
    width = max(len(n) for n in ranked) + 2
    out = ["```"]
    for n in ranked:
        uses = sorted({b for (a, b) in fe if a == n}, key=lambda x: ranked.index(x) if x in ranked else 99)
        counts = [f"{'types.h' if b == '.' else b} ({sum(len(v) for v in fe[(n, b)].values())})" for b in uses]
        label = "src/" if n == "." else n + "/"
        out.append(f"{label:<{width}} uses: {', '.join(counts) if counts else 'nothing of unimem'}")
        names = sorted(by_folder[n])
        row = "  "
        for name in names:
            if len(row) + len(name) + 1 > 76:
                out.append(" " * width + row.rstrip())
                row = "  "
            row += name + " "
        out.append(" " * width + row.rstrip())
    found = problems(files, fe, order)
    out.append("")
    out.append("cycles and calls up the order: " + ("none (no exceptions)" if not found else str(len(found))))
    out.append("```")
    return "\n".join(out)


def main(argv):
    files, edges = graph()
    fe = folder_edges(edges)
    order = order_from_readme()
    if "--files" in argv:
        print("\n".join(describe(fe, argv[argv.index("--files") + 1])))
        return 0
    if "--markdown" in argv:
        print(markdown(files, fe, order))
        return 0
    if "--update-design" in argv:
        with open(DESIGN, encoding="utf-8") as f:
            text = f.read()
        i, j = text.find(BEGIN), text.find(END)
        if i < 0 or j < 0:
            sys.exit(f"layers.py: {DESIGN} has no {BEGIN} ... {END} section")
        text = text[:i + len(BEGIN)] + "\n" + markdown(files, fe, order) + "\n" + text[j:]
        with open(DESIGN, "w", encoding="utf-8") as f:
            f.write(text)
        return 0
    found = problems(files, fe, order)
    if "--check" in argv:
        found += long_functions(files)
        if not order:
            print("layers.py: src/README.md has no Order: line")
            return 1
        for p in found:
            print(p)
        with open(DESIGN, encoding="utf-8") as f:
            text = f.read()
        i, j = text.find(BEGIN), text.find(END)
        if i >= 0 and j >= 0 and text[i + len(BEGIN):j].strip() != markdown(files, fe, order).strip():
            print("docs/design.md's drawing is not the code's: run scripts/layers.py --update-design")
            found.append("drawing")
        print(f"layers.py: {len(found)} problem(s) in {len(files)} files" if found else
              f"layers.py: no cycle, no call up the order, no function over {MAX_FUNCTION_LINES} lines "
              f"in {len(files)} files")
        return 1 if found else 0
    print("\n".join(describe(fe)))
    for p in found:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
