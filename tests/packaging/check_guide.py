#!/usr/bin/env python3
"""Compile and run every C example of docs/guide.md.

The guide's first ```c block is the setup the others share (headers, the
manager m, the devices cpu and gpu, setup()). A block that defines functions
or types is kept at file scope; any other block is a fragment and becomes the
body of a function of its own. main() runs setup(), every fragment in the
guide's order, and um_manager_destroy(), which must report no leak.

  check_guide.py GUIDE CC OUT_DIR INCLUDE_DIR LIBRARY [FLAGS...]
"""
import re
import subprocess
import sys

# A type, an #include, or a function definition: "[static] type [*]name(...) {".
FILE_SCOPE = re.compile(r"^(typedef\b|#include\b|(static\s+)?[A-Za-z_]\w*[\s\*]+[A-Za-z_]\w*\([^;]*\)\s*\{\s*$)",
                        re.M)


def main():
    guide, cc, out_dir, include, library = sys.argv[1:6]
    flags = [f for f in sys.argv[6:] if f]
    text = open(guide, encoding="utf-8").read()
    blocks = re.findall(r"^```c\n(.*?)^```", text, re.S | re.M)
    if len(blocks) < 2:
        sys.exit("check_guide: no C examples found in %s" % guide)
    parts, calls = [blocks[0]], []
    for n, block in enumerate(blocks[1:], start=1):
        if FILE_SCOPE.search(block):
            parts.append("/* example %d */\n%s" % (n, block))
        else:
            body = "".join("  " + line + "\n" for line in block.splitlines())
            parts.append("/* example %d */\nstatic int guide_example_%d(void) {\n%s  return 0;\n}\n" % (n, n, body))
            calls.append(n)
    main_fn = ["int main(void) {", "  int st;", "  if (setup() != UM_OK)", "    return 1;"]
    for n in calls:
        main_fn.append('  if ((st = guide_example_%d()) != UM_OK)' % n)
        main_fn.append('    fprintf(stderr, "example %d returned %%s\\n", um_err_name(st));' % n)
    main_fn += ["  st = um_manager_destroy(m);",
                '  printf("guide: %d examples compiled, %d run; um_manager_destroy: %%s\\n", um_err_name(st));'
                % (len(blocks), len(calls)),
                "  return st == UM_OK ? 0 : 1;", "}"]
    source = out_dir + "/guide_examples.c"
    with open(source, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n" + "\n".join(main_fn) + "\n")
    exe = out_dir + "/guide_examples"
    cmd = [cc, "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror",
           "-Wno-unused-function", "-I" + include, source, library, "-lpthread", "-ldl", "-o", exe] + flags
    print(" ".join(cmd))
    if subprocess.call(cmd) != 0:
        sys.exit("check_guide: the examples do not compile (source: %s)" % source)
    sys.exit(subprocess.call([exe]))


if __name__ == "__main__":
    main()
