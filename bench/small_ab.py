#!/usr/bin/python3
"""Repeat issue 13's small-operation targets and summarise their spread.

Each invocation of `bench_transfer --small` prints three runs of each
target (a run: the median of 15 interleaved samples of unimem and raw
OpenCL). One invocation is too noisy on a shared 2-vCPU machine to say
whether a target holds, so this runs it N times per build, alternating the
builds given (an A/B of two commits runs them in turn, so that the
machine's drift hits both alike), and prints for each build:

  - the per-copy event's added microseconds over the raw call: median and
    quartiles of all runs, the share of runs at or under 0.3 us, and the
    same of each invocation's median (what one invocation reports);
  - the batch's ratio (raw time / unimem time): median and quartiles, and
    the share of runs at or over 0.9.

Usage:
  bench/small_ab.py [-n N] NAME=BUILD_DIR [NAME=BUILD_DIR ...]
  bench/small_ab.py -n 20 head=build-rel
  bench/small_ab.py -n 30 before=/tmp/wt-base/build-rel after=build-rel

BUILD_DIR is a CMake build of the repository (bench/bench_transfer in it).
POCL_DEVICES defaults to "pthread" (one PoCL CPU device), as in
docs/benchmarks.md.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

RUNS = re.compile(r"\(runs[^:]*: (.*)\)")


def parse(output):
    """(event added us per run, batch ratio per run) of one invocation."""
    event, batch = [], []
    for line in output.splitlines():
        m = RUNS.search(line)
        if m is None:
            continue
        pairs = [tuple(float(v) for v in item.split("/")) for item in m.group(1).split()]
        if "event" in line:
            event += [added for _, added in pairs]
        elif "batch" in line:
            batch += [ratio for ratio, _ in pairs]
    return event, batch


def spread(values, good, label):
    values = sorted(values)
    n = len(values)
    ok = sum(1 for v in values if good(v))
    return "%s median %.3f (q1 %.3f, q3 %.3f), %d of %d %s" % (
        label, statistics.median(values), values[n // 4], values[(3 * n) // 4], ok, n,
        "met")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20, help="invocations per build (default 20)")
    ap.add_argument("builds", nargs="+", help="NAME=BUILD_DIR")
    args = ap.parse_args()
    builds = []
    for spec in args.builds:
        name, sep, path = spec.partition("=")
        exe = os.path.join(path, "bench", "bench_transfer")
        if not sep or not os.access(exe, os.X_OK):
            sys.exit("small_ab: %r: want NAME=BUILD_DIR with bench/bench_transfer built" % spec)
        builds.append((name, exe))
    env = dict(os.environ)
    env.setdefault("POCL_DEVICES", "pthread")
    results = {name: {"event": [], "batch": [], "invocations": []} for name, _ in builds}
    for i in range(args.n):
        for name, exe in builds:
            done = subprocess.run([exe, "--small"], capture_output=True, text=True, env=env)
            event, batch = parse(done.stdout)
            if done.returncode != 0 or not event or not batch:
                sys.exit("small_ab: %s failed (exit %d):\n%s" % (exe, done.returncode, done.stderr))
            results[name]["event"] += event
            results[name]["batch"] += batch
            results[name]["invocations"].append(statistics.median(event))
        print("invocation %d of %d done" % (i + 1, args.n), file=sys.stderr)
    for name, _ in builds:
        r = results[name]
        print("%s:" % name)
        print("  " + spread(r["event"], lambda v: v <= 0.3, "event added us, runs:       "))
        print("  " + spread(r["invocations"], lambda v: v <= 0.3, "event added us, invocations:"))
        print("  " + spread(r["batch"], lambda v: v >= 0.9, "batch ratio, runs:          "))


if __name__ == "__main__":
    main()
