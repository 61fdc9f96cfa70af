#!/usr/bin/env python3
"""The caller's loop from Python (bench_loop.c's loop through the binding):
allocate two buffers, copy the input in, run one kernel of the caller's own
(out = 2 * in + 1 over uint32), copy the result out, check it, release both;
at a size that changes every iteration. Side by side in one process, on the
first OpenCL device, every side in unimem's context and on the device's
caller queue (Manager.pyopencl_queue):

  raw              pyopencl alone: pyopencl.Buffer in and out, a non-blocking
                   enqueue_copy in, the kernel, a blocking enqueue_copy out,
                   the check, release() of both.
  unimem_queue     Manager.use_queue(device, queue): alloc, copy_from(wait=
                   False), the kernel inside unimem.access([in, out], ["r",
                   "discard"]) with no done event (the brackets end behind the
                   kernel on the queue), a blocking copy_to, the check, release.
  unimem_events    the same on unimem's own queues: the kernel waits for
                   ac.wait_for and ac.done is its event.
  unimem_unpooled  unimem_queue on a manager with enable_pooling=False (its
                   own context: its own queue and program).
  pool_raw         unimem's pooled buffers, to_pyopencl(), and raw's calls.

Two ranges, 1-64 KiB and 4 KiB-4 MiB: iteration i's size comes from one
seeded log-uniform sequence, a multiple of 4 bytes, the same for every side
and repetition. A repetition runs the sequence once per side, sides taking
turns and turns at going first, after a warm-up pass. Figures: the median
over repetitions of the time per iteration (us), "spread" the
interquartile range, ratio = side / raw.

    PYTHONPATH=build/python python3 bench/bench_loop.py [--quick] [--iters N] [--reps N]
                                                          [--json FILE] [--tsv FILE]

--tsv FILE writes the rows for `unimem bench pyloop` (which runs this
script): one line per row, "table<TAB>name" then key<TAB>value pairs; the
facts on a line whose table is "facts". Exit status: 0 measured, 77 no
OpenCL device or no pyopencl, 1 a wrong result or an error, 2 bad usage.
"""
import argparse
import json
import math
import random
import statistics
import sys
import time

import numpy

import benchstats

try:
    import unimem
except ImportError as e:
    print(f"SKIP: the unimem package is not importable ({e}); set PYTHONPATH=build/python")
    sys.exit(77)
try:
    import pyopencl
except ImportError:
    print("SKIP: pyopencl is not installed (apt-get install python3-pyopencl)")
    sys.exit(77)

SOURCE = """
__kernel void twice_plus_one(__global const uint *in, __global uint *out) {
  size_t i = get_global_id(0);
  out[i] = 2u * in[i] + 1u;
}
"""

RANGES = [("1-64 KiB", 1024, 64 * 1024), ("4 KiB-4 MiB", 4 * 1024, 4 * 1024 * 1024)]
SIDES = ["raw", "unimem_queue", "unimem_events", "unimem_unpooled", "pool_raw"]


def sizes_of(lo, hi, n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        out.append(max(4, s - s % 4))
    return out


class Side:
    """One manager's device, queue and kernel."""

    def __init__(self, m, dev):
        self.m = m
        self.dev = dev
        self.queue = m.pyopencl_queue(dev)
        self.kernel = pyopencl.Program(self.queue.context, SOURCE).build().twice_plus_one


def check(out, x, k, side):
    if not numpy.array_equal(out[:k], 2 * x[:k] + 1):
        raise RuntimeError(f"{side}: wrong result at {k * 4} bytes")


def run_raw(s, sizes, x, out):
    ctx, q, kern = s.queue.context, s.queue, s.kernel
    mf = pyopencl.mem_flags
    for n in sizes:
        k = n // 4
        bin_ = pyopencl.Buffer(ctx, mf.READ_WRITE, n)
        bout = pyopencl.Buffer(ctx, mf.READ_WRITE, n)
        pyopencl.enqueue_copy(q, bin_, x[:k], is_blocking=False)
        kern(q, (k,), None, bin_, bout)
        pyopencl.enqueue_copy(q, out[:k], bout, is_blocking=True)
        check(out, x, k, "raw")
        bin_.release()
        bout.release()


def run_unimem(s, sizes, x, out, name):
    """unimem_queue and unimem_unpooled (the thread's queue is the caller
    queue: the brackets end behind the kernel with no event), or
    unimem_events (unimem's own queues: the kernel's event ends them)."""
    m, dev, q, kern = s.m, s.dev, s.queue, s.kernel
    events = name == "unimem_events"
    for n in sizes:
        k = n // 4
        a = m.alloc(n, device=dev)
        b = m.alloc(n, device=dev)
        a.copy_from(x[:k], wait=False)
        with unimem.access([a, b], ["r", "discard"]) as ac:
            done = kern(q, (k,), None, a.to_pyopencl(), b.to_pyopencl(), wait_for=ac.wait_for)
            if events:
                ac.done = done
                q.flush()  # unimem's own queue waits for the kernel's event
        b.copy_to(out[:k])
        check(out, x, k, name)
        a.release()
        b.release()


def run_pool_raw(s, sizes, x, out):
    m, dev, q, kern = s.m, s.dev, s.queue, s.kernel
    for n in sizes:
        k = n // 4
        a = m.alloc(n, device=dev)
        b = m.alloc(n, device=dev)
        ca, cb = a.to_pyopencl(), b.to_pyopencl()
        pyopencl.enqueue_copy(q, ca, x[:k], is_blocking=False)
        kern(q, (k,), None, ca, cb)
        pyopencl.enqueue_copy(q, out[:k], cb, is_blocking=True)
        check(out, x, k, "pool_raw")
        del ca, cb
        a.release()
        b.release()


def spread(v):
    return benchstats.spread(v, method="inclusive")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--json")
    ap.add_argument("--tsv")
    a = ap.parse_args()
    iters = a.iters if a.iters is not None else (30 if a.quick else 400)
    reps = a.reps if a.reps is not None else (3 if a.quick else 7)
    if iters < 1 or reps < 1:
        print("bench_loop.py: --iters and --reps must be at least 1", file=sys.stderr)
        return 2

    m = unimem.Manager(backends="cpu,opencl")
    dev = next((d.index for d in m.devices if d.backend == "opencl"), None)
    if dev is None:
        print("SKIP: no OpenCL device (install pocl-opencl-icd)")
        m.close()
        return 77
    mu = unimem.Manager(backends="cpu,opencl", enable_pooling=False)
    pooled, unpooled = Side(m, dev), Side(mu, dev)
    device_name = m.devices[dev].name
    x = numpy.arange(RANGES[-1][2] // 4, dtype=numpy.uint32)
    out = numpy.empty_like(x)

    runs = {
        "raw": (pooled, run_raw),
        "unimem_queue": (pooled, lambda *v: run_unimem(*v, "unimem_queue")),
        "unimem_events": (pooled, lambda *v: run_unimem(*v, "unimem_events")),
        "unimem_unpooled": (unpooled, lambda *v: run_unimem(*v, "unimem_unpooled")),
        "pool_raw": (pooled, run_pool_raw),
    }
    # unimem_queue's manager puts this thread's copies on the caller queue;
    # the others run on unimem's own queues (use_queue None between turns).
    on_queue = {"unimem_queue": m, "unimem_unpooled": mu}

    rows = []
    print(f"bench_loop.py: the caller's loop from Python on {device_name}, "
          f"{iters} iterations x {reps} repetitions (us per iteration: median, spread)")
    print(f"{'sizes':<13}" + "".join(f"{s:>22}" for s in SIDES))
    print(f"{'':<13}" + "".join(f"{'median spread ratio':>22}" for s in SIDES))
    try:
        for ri, (rname, lo, hi) in enumerate(RANGES):
            sizes = sizes_of(lo, hi, iters, 1000 + ri)
            times = {s: [] for s in SIDES}
            for side in SIDES:  # warm-up: pools, programs, pyopencl's caches
                sd, fn = runs[side]
                if side in on_queue:
                    on_queue[side].use_queue(dev, sd.queue)
                fn(sd, sizes[: max(10, iters // 10)], x, out)
                if side in on_queue:
                    on_queue[side].use_queue(dev, None)
            for r in range(reps):
                order = SIDES[r % len(SIDES):] + SIDES[: r % len(SIDES)]
                for side in order:
                    sd, fn = runs[side]
                    if side in on_queue:
                        on_queue[side].use_queue(dev, sd.queue)
                    t0 = time.perf_counter()
                    fn(sd, sizes, x, out)
                    t = time.perf_counter() - t0
                    if side in on_queue:
                        on_queue[side].use_queue(dev, None)
                    times[side].append(t / iters * 1e6)
            med = {s: statistics.median(times[s]) for s in SIDES}
            row = {"table": "pyloop", "name": rname, "lo_bytes": lo, "hi_bytes": hi}
            for s in SIDES:
                row[s + "_us"] = med[s]
                row[s + "_spread_us"] = spread(times[s])
                if s != "raw":
                    row[s + "_ratio"] = med[s] / med["raw"]
            row["pooling_gain"] = med["unimem_unpooled"] / med["unimem_queue"]
            rows.append(row)
            cells = ""
            for s in SIDES:
                ratio = "" if s == "raw" else f"{med[s] / med['raw']:.2f}x"
                cells += f"{med[s]:>10.1f} {spread(times[s]):>5.1f} {ratio:>5}"
            print(f"{rname:<13}{cells}")
        print("ratio = side / raw; pooling gain (unpooled / unimem_queue): "
              + ", ".join(f"{r['name']} {r['pooling_gain']:.2f}x" for r in rows))
    except (RuntimeError, unimem.Error) as e:
        print(f"bench_loop.py: {e}", file=sys.stderr)
        return 1
    finally:
        mu.close()
        m.close()

    facts = {"device": device_name, "iters": iters, "reps": reps,
             "quick": bool(a.quick), "python": sys.version.split()[0], "pyopencl": pyopencl.VERSION_TEXT}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "pyloop", **facts, "rows": rows}, f)
            f.write("\n")
    if a.tsv:
        with open(a.tsv, "w") as f:
            f.write("facts\t" + "".join(f"\t{k}\t{v}" for k, v in facts.items()) + "\n")
            for r in rows:
                f.write(f"{r['table']}\t{r['name']}"
                        + "".join(f"\t{k}\t{v}" for k, v in r.items() if k not in ("table", "name")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
