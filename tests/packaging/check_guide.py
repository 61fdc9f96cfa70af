#!/usr/bin/env python3
"""Compile and run every C example of docs/guide.md.

The guide's first ```c block is the setup the others share (headers, the
manager m, the devices cpu and gpu, setup()). A block that defines functions
or types is kept at file scope; any other block is a fragment and becomes the
body of a function of its own. main() runs setup(), every fragment in the
guide's order, and um_manager_destroy(), which must report no leak; an
example that returns anything but UM_OK fails the run.

A block that uses OpenCL (includes <CL/cl.h>, calls a cl* function or names
a cl_* type) is built only when --opencl-library gives the ICD loader to
link (and --opencl-include the directory of CL/cl.h, if it is not a default
one); otherwise it is left out, and the output says how many were. Such
blocks look for an OpenCL device themselves when they run.

  check_guide.py GUIDE CC OUT_DIR INCLUDE_DIR LIBRARY
                 [--opencl-library=LIB] [--opencl-include=DIR] [FLAGS...]
"""
import re
import subprocess
import sys

# A type, an #include, or a function definition: "[static] type [*]name(...) {".
FILE_SCOPE = re.compile(r"^(typedef\b|#include\b|(static\s+)?[A-Za-z_]\w*[\s\*]+[A-Za-z_]\w*\([^;]*\)\s*\{\s*$)",
                        re.M)
# OpenCL: its header, a call of a cl* function, or a cl_* type (not a member
# such as um_device_native's cl_queue), outside strings and comments.
OPENCL = re.compile(r"CL/cl\.h|\bcl[A-Z]\w*\s*\(|(?<![.>])\bcl_[a-z_]+\b")
STRINGS_AND_COMMENTS = re.compile(r'"(?:\\.|[^"\\\n])*"|/\*.*?\*/', re.S)


def uses_opencl(block):
    return OPENCL.search(STRINGS_AND_COMMENTS.sub("", block)) is not None


def split_flags(args):
    """--opencl-library / --opencl-include out of the compiler flags."""
    opencl, flags = {}, []
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("--opencl-library", "--opencl-include"):
            if value:
                opencl[key[len("--opencl-"):]] = value
        elif arg:
            flags.append(arg)
    return opencl, flags


def main():
    guide, cc, out_dir, include, library = sys.argv[1:6]
    opencl, flags = split_flags(sys.argv[6:])
    text = open(guide, encoding="utf-8").read()
    blocks = re.findall(r"^```c\n(.*?)^```", text, re.S | re.M)
    if len(blocks) < 2:
        sys.exit("check_guide: no C examples found in %s" % guide)
    parts, calls, left_out = [blocks[0]], [], 0
    for n, block in enumerate(blocks[1:], start=1):
        if "library" not in opencl and uses_opencl(block):
            left_out += 1
        elif FILE_SCOPE.search(block):
            parts.append("/* example %d */\n%s" % (n, block))
        else:
            body = "".join("  " + line + "\n" for line in block.splitlines())
            parts.append("/* example %d */\nstatic int guide_example_%d(void) {\n%s  return 0;\n}\n" % (n, n, body))
            calls.append(n)
    main_fn = ["int main(void) {", "  int st, failed = 0;", "  if (setup() != UM_OK)", "    return 1;"]
    for n in calls:
        main_fn.append('  if ((st = guide_example_%d()) != UM_OK)' % n)
        main_fn.append('    failed++, fprintf(stderr, "example %d returned %%s\\n", um_err_name(st));' % n)
    main_fn += ["  st = um_manager_destroy(m);",
                '  printf("guide: %d examples compiled, %d run, %d OpenCL examples left out; '
                'um_manager_destroy: %%s\\n", um_err_name(st));' % (len(blocks) - left_out, len(calls), left_out),
                "  return st == UM_OK && failed == 0 ? 0 : 1;", "}"]
    source = out_dir + "/guide_examples.c"
    with open(source, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n" + "\n".join(main_fn) + "\n")
    exe = out_dir + "/guide_examples"
    cmd = [cc, "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror",
           "-Wno-unused-function", "-I" + include]
    cmd += ["-I" + opencl["include"]] if "include" in opencl else []
    cmd += [source, library] + ([opencl["library"]] if "library" in opencl else [])
    cmd += ["-lpthread", "-ldl", "-o", exe] + flags
    print(" ".join(cmd))
    if subprocess.call(cmd) != 0:
        sys.exit("check_guide: the examples do not compile (source: %s)" % source)
    sys.exit(run(exe))


# LeakSanitizer's exit-time check stops every thread with ptrace; now and
# then its tracer crashes on a thread of the OpenCL driver's
# (google/sanitizers#1353: "Tracer caught signal 11", "LeakSanitizer has
# encountered a fatal error"), after the examples all passed. That one
# crash, and only after the examples' own success line, earns one rerun,
# said out loud; any other failure fails.
LSAN_TRACER_CRASH = "LeakSanitizer has encountered a fatal error"


def run(exe):
    for attempt in (1, 2):
        proc = subprocess.run([exe], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        passed = "um_manager_destroy: UM_OK" in proc.stdout and "returned" not in proc.stderr
        if proc.returncode == 0 or attempt == 2 or not passed or LSAN_TRACER_CRASH not in proc.stderr:
            return proc.returncode
        print("check_guide: the examples passed but LeakSanitizer's tracer crashed at exit; running once more")
    return 1


if __name__ == "__main__":
    main()
