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

With --split SAMPLES it runs `bench_transfer --split SAMPLES` instead:
the per-copy event case alone, unimem's and raw's samples interleaved,
each timed over its issue and over the whole sample (docs/benchmarks.md,
"Small operations"). It prints for each build, over its invocations: unimem's
issue time over raw's in the same invocation (a ratio, so that the
machine's mode of the moment, which both sides share, cancels), and the
added nanoseconds per copy of the issue and of the whole sample, with the
count of invocations whose whole sample added at most 300 ns. Telling two
builds apart, this is the sharper tool: on two shared CPUs an A/A of one
binary under the default mode differed by 0.23 us at the median of 72
runs, while --split 30 saw a 220 ns change of raw's issue in 10 of 10
alternations.

Usage:
  bench/small_ab.py [-n N] [--split SAMPLES] NAME=BUILD_DIR [NAME=BUILD_DIR ...]
  bench/small_ab.py -n 20 head=build-rel
  bench/small_ab.py -n 30 before=/tmp/wt-base/build-rel after=build-rel
  bench/small_ab.py -n 12 --split 30 before=/tmp/wt-base/build-rel after=build-rel

BUILD_DIR is a CMake build of the repository (bench/bench_transfer in it).
POCL_DEVICES defaults to "pthread" (one PoCL CPU device), as in
docs/benchmarks.md. Without an OpenCL device bench_transfer has nothing to
measure: this says so ("small_ab: skipped") and exits 0.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

RUNS = re.compile(r"\(runs[^:]*: (.*)\)")
SPLIT = re.compile(r"^  (unimem|raw|added) +issue +([-+]?\d+) \(issuing thread's CPU +([-+]?\d+)\) +whole +([-+]?\d+)$",
                   re.M)
SKIPPED = 77  # bench_transfer: no OpenCL device


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


def parse_split(output):
    """{side: (issue, cpu, whole)} of one `--split` invocation, or None."""
    sides = {m.group(1): tuple(int(m.group(k)) for k in (2, 3, 4)) for m in SPLIT.finditer(output)}
    return sides if len(sides) == 3 else None


def split_summary(name, invocations, samples):
    """The --split figures of one build, over its invocations."""
    ratios = [inv["unimem"][0] / inv["raw"][0] for inv in invocations]
    issue = [inv["added"][0] for inv in invocations]
    whole = [inv["added"][2] for inv in invocations]
    n = len(invocations)
    return "\n".join([
        "%s: --split %d, %d invocation%s" % (name, samples, n, "" if n == 1 else "s"),
        "  issue, unimem / raw:    median %.3f (min %.3f, max %.3f)" % (
            statistics.median(ratios), min(ratios), max(ratios)),
        "  added ns, issue:        median %+.0f (min %+d, max %+d)" % (statistics.median(issue), min(issue),
                                                                       max(issue)),
        "  added ns, whole sample: median %+.0f (min %+d, max %+d), %d of %d at or under 300" % (
            statistics.median(whole), min(whole), max(whole), sum(1 for v in whole if v <= 300), n),
    ])


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
    ap.add_argument("--split", type=int, metavar="SAMPLES",
                    help="run bench_transfer --split SAMPLES (the per-copy event case, paired) instead of --small")
    ap.add_argument("builds", nargs="+", help="NAME=BUILD_DIR")
    args = ap.parse_args()
    if args.n < 1 or (args.split is not None and args.split < 1):
        sys.exit("small_ab: -n and --split want a count of at least 1")
    builds = []
    for spec in args.builds:
        name, sep, path = spec.partition("=")
        exe = os.path.join(path, "bench", "bench_transfer")
        if not sep or not os.access(exe, os.X_OK):
            sys.exit("small_ab: %r: want NAME=BUILD_DIR with bench/bench_transfer built" % spec)
        builds.append((name, exe))
    env = dict(os.environ)
    env.setdefault("POCL_DEVICES", "pthread")
    results = {name: {"event": [], "batch": [], "invocations": [], "split": []} for name, _ in builds}
    mode = ["--small"] if args.split is None else ["--split", str(args.split)]
    for i in range(args.n):
        for name, exe in builds:
            done = subprocess.run([exe] + mode, capture_output=True, text=True, env=env)
            if done.returncode == SKIPPED:
                print("small_ab: skipped: %s found no OpenCL device (%s)" % (exe, done.stderr.strip()))
                return
            if args.split is not None:
                sides = parse_split(done.stdout)
                if done.returncode != 0 or sides is None:
                    sys.exit("small_ab: %s failed (exit %d):\n%s" % (exe, done.returncode, done.stderr))
                results[name]["split"].append(sides)
                continue
            event, batch = parse(done.stdout)
            if done.returncode != 0 or not event or not batch:
                sys.exit("small_ab: %s failed (exit %d):\n%s" % (exe, done.returncode, done.stderr))
            results[name]["event"] += event
            results[name]["batch"] += batch
            results[name]["invocations"].append(statistics.median(event))
        print("invocation %d of %d done" % (i + 1, args.n), file=sys.stderr)
    for name, _ in builds:
        r = results[name]
        if args.split is not None:
            print(split_summary(name, r["split"], args.split))
            continue
        print("%s:" % name)
        print("  " + spread(r["event"], lambda v: v <= 0.3, "event added us, runs:       "))
        print("  " + spread(r["invocations"], lambda v: v <= 0.3, "event added us, invocations:"))
        print("  " + spread(r["batch"], lambda v: v >= 0.9, "batch ratio, runs:          "))


if __name__ == "__main__":
    main()
