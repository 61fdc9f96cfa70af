#!/usr/bin/env python3
"""Device memory allocate + free from Python: unimem's pool next to PyTorch's
caching allocator and CuPy's memory pool, in one process (needs an NVIDIA
GPU; prints one SKIP line and exits 0 without one).

At 1 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB and 1 GiB, each side runs a loop
of PAIRS allocate + free pairs of the size, timed with time.perf_counter_ns;
the sides take turns, one repetition each (the first side moves on by one
each repetition), for REPS repetitions after one untimed warm-up loop each,
so that every side runs warm and sees the same machine:

  - unimem: m.alloc(n, device=D) then b.release(), on a
    Manager(backends="cpu,cuda"): a pool hit (the block of the size comes
    back from the pool each time);
  - torch:  torch.empty(n, dtype=torch.uint8, device="cuda") then del: the
    caching allocator on a warm cache;
  - cupy:   cupy.empty(n, dtype=cupy.uint8) then del: the default memory
    pool, warm.

Every side is measured at the Python level, the interpreter's call and
object costs included on each: the figures compare what a Python program
pays per allocation, not the allocators' C fast paths (for unimem's in C,
against cuMemAlloc and cuMemAllocAsync, see bench/bench_cuda.c). The
cyclic garbage collector is off while a loop runs, for every side.

A figure is the median over the repetitions of the mean ns per pair; spread
is the interquartile range of the repetitions over the median; ratio =
framework / unimem (above 1: unimem is faster). A framework runs only where
it imports and sees a GPU (else a line says why); a size the GPU does not
hold four times over is left out, with a note. The pools are emptied
between sizes.

    PYTHONPATH=build/python python3 bench/bench_gpu_alloc.py [--quick] [--reps R] [--pairs N] [--json FILE]

--quick: 5 repetitions of 200 pairs (default 15 of 5000). --json FILE writes
the report in bench/report.h's layout: {"bench": "gpu_alloc", facts...,
"rows": [{"table": "alloc", "name": "alloc+free 1 KiB", "bytes", "pairs",
"reps", "unimem_ns", "unimem_spread", and per framework measured
"torch_ns", "torch_spread", "ratio_torch" (cupy alike)}, ...]}; the facts:
quick, device, total_bytes, unimem_version, frameworks (each one's version,
or why it did not run) and notes. Exit status 0 (measured or skipped), 1 a
failure.
"""

import argparse
import gc
import json
import statistics
import sys
import time

import unimem

KiB, MiB = 1024, 1024 * 1024
SIZES = [KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB, 1024 * MiB]


def size_text(n):
    for unit, name in ((1024 * MiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


# ---- The sides: one loop of pairs each, returning ns per pair ----------------------
# Each side's loop is written out in full, as a program would write it: a
# shared loop calling a per-side function would add a Python call to every
# pair of every side.


class UnimemSide:
    name = "unimem"

    def __init__(self, m, device):
        self.m, self.device = m, device

    def loop(self, n, pairs):
        alloc, device = self.m.alloc, self.device
        t0 = time.perf_counter_ns()
        for _ in range(pairs):
            b = alloc(n, device=device)
            b.release()
            del b
        return (time.perf_counter_ns() - t0) / pairs

    def empty_pool(self):
        self.m.trim()


class TorchSide:
    name = "torch"

    def __init__(self, torch):
        self.torch = torch

    def loop(self, n, pairs):
        empty, uint8 = self.torch.empty, self.torch.uint8
        t0 = time.perf_counter_ns()
        for _ in range(pairs):
            t = empty(n, dtype=uint8, device="cuda")
            del t
        return (time.perf_counter_ns() - t0) / pairs

    def empty_pool(self):
        self.torch.cuda.empty_cache()


class CupySide:
    name = "cupy"

    def __init__(self, cupy):
        self.cupy = cupy

    def loop(self, n, pairs):
        empty, uint8 = self.cupy.empty, self.cupy.uint8
        t0 = time.perf_counter_ns()
        for _ in range(pairs):
            a = empty(n, dtype=uint8)
            del a
        return (time.perf_counter_ns() - t0) / pairs

    def empty_pool(self):
        self.cupy.get_default_memory_pool().free_all_blocks()


def open_torch():
    """(side, version) or (None, why not)."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken installation
        return None, f"not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return None, f"PyTorch {torch.__version__} sees no CUDA device"
    return TorchSide(torch), f"PyTorch {torch.__version__}"


def open_cupy():
    try:
        import cupy
    except Exception as e:
        return None, f"not importable ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # cupy.cuda.runtime.CUDARuntimeError without a driver
        return None, f"CuPy {cupy.__version__} sees no CUDA device ({e})"
    if count == 0:
        return None, f"CuPy {cupy.__version__} sees no CUDA device"
    return CupySide(cupy), f"CuPy {cupy.__version__}"


# ---- Measuring -------------------------------------------------------------------


def spread(samples, median):
    """Interquartile range of the samples over their median."""
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / median if median > 0 else 0.0


def measure_size(sides, n, pairs, reps):
    """{side name: (median ns per pair, spread)} at size n."""
    samples = {s.name: [] for s in sides}
    for s in sides:
        s.loop(n, pairs)  # warm-up: the pool or cache holds a block of n
    for k in range(reps):
        for s in sides[k % len(sides):] + sides[:k % len(sides)]:
            gc.collect()
            gc.disable()
            try:
                samples[s.name].append(s.loop(n, pairs))
            finally:
                gc.enable()
    out = {}
    for name, v in samples.items():
        med = statistics.median(v)
        out[name] = (med, spread(v, med))
    for s in sides:
        s.empty_pool()
    return out


def row_of(n, pairs, reps, figures):
    row = {"table": "alloc", "name": f"alloc+free {size_text(n)}", "bytes": n, "pairs": pairs, "reps": reps}
    um_ns = figures["unimem"][0]
    for name, (ns, sp) in figures.items():
        row[f"{name}_ns"] = round(ns, 1)
        row[f"{name}_spread"] = round(sp, 4)
        if name != "unimem":
            row[f"ratio_{name}"] = round(ns / um_ns, 3)
    return row


def print_table(rows, names):
    head = f"{'size':<9}" + "".join(f"{n + ' ns':>13} {'spread':>7}" for n in names)
    head += "".join(f"{n + '/unimem':>14}" for n in names[1:])
    print(head)
    for r in rows:
        line = f"{size_text(r['bytes']):<9}"
        line += "".join(f"{r[n + '_ns']:>13.0f} {100 * r[n + '_spread']:>6.1f}%" for n in names)
        line += "".join(f"{r['ratio_' + n]:>13.2f}x" for n in names[1:])
        print(line)


# ---- The run -----------------------------------------------------------------------


def cuda_device(m):
    """unimem's first CUDA device (CUDA ordinal 0), or None."""
    return next((d for d in m.devices if d.backend == "cuda"), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 repetitions of 200 pairs")
    ap.add_argument("--reps", type=int, help="repetitions per side and size (>= 5; default 15, --quick 5)")
    ap.add_argument("--pairs", type=int, help="allocate + free pairs per repetition (default 5000, --quick 200)")
    ap.add_argument("--json", metavar="FILE", help="write the report as JSON")
    args = ap.parse_args()
    reps = args.reps or (5 if args.quick else 15)
    pairs = args.pairs or (200 if args.quick else 5000)
    if reps < 5 or pairs < 1:
        ap.error("--reps must be >= 5 and --pairs >= 1")

    m = unimem.Manager(backends="cpu,cuda", trim_interval_ms=0)
    try:
        dev = cuda_device(m)
        opened = {"torch": open_torch(), "cupy": open_cupy()}
        if dev is None:
            why = "; ".join(f"{k}: {v[1]}" for k, v in opened.items())
            print("SKIP: unimem finds no CUDA device (no NVIDIA GPU or driver, or a build without the CUDA "
                  f"backend); bench_gpu_alloc compares against it ({why})")
            return 0
        sides = [UnimemSide(m, dev.index)] + [side for side, _ in opened.values() if side is not None]
        names = [s.name for s in sides]
        fits = [n for n in SIZES if 4 * n + 64 * MiB <= dev.total_bytes]
        notes = []
        if len(fits) < len(SIZES):
            notes.append("sizes left out (they do not fit the GPU's memory four times over): "
                         + ", ".join(size_text(n) for n in SIZES if n not in fits))
        print(f"bench_gpu_alloc: {dev.name}, {dev.total_bytes / (1 << 30):.1f} GiB; unimem {unimem.__version__}"
              f"{' (--quick)' if args.quick else ''}")
        for k, (side, text) in opened.items():
            print(f"{k}: {text}" if side is not None else f"{k}: not measured: {text}")
        for text in notes:
            print(f"note: {text}")
        print(f"allocate + free from Python, median ns per pair over {reps} alternating repetitions of "
              f"{pairs} pairs; spread = IQR / median; ratio = framework / unimem (above 1: unimem faster)")
        rows = []
        for n in fits:
            rows.append(row_of(n, pairs, reps, measure_size(sides, n, pairs, reps)))
        print_table(rows, names)
        if args.json:
            report = {"bench": "gpu_alloc", "quick": args.quick, "device": dev.name, "total_bytes": dev.total_bytes,
                      "unimem_version": unimem.__version__,
                      "frameworks": {k: text for k, (_, text) in opened.items()},
                      "measured": names, "notes": notes, "rows": rows}
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1)
                f.write("\n")
    finally:
        m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
