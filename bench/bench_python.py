#!/usr/bin/env python3
"""Per-call cost of the unimem Python binding (SPEC §6: a copy through the
binding adds at most 2 µs over the C call).

For each case, the same loop of copies runs in this process through the
binding (b.copy_from / b.copy_to in a Python for loop) and through the C API
(python_helper.c, timed in C, loaded with ctypes so that no ctypes call lands
inside the loop), one repetition of each in turn. Each figure is the median
over the repetitions of the mean time per call; "added" is binding minus C;
"spread" is the larger interquartile range of the two sides' repetitions.
On a shared, loaded machine the OpenCL rows (tens of µs, thread wake-ups)
vary by more than the binding costs; the cpu rows measure the binding.

    PYTHONPATH=build/python python3 bench/bench_python.py [--quick] [--helper PATH]

The helper is bench/libunimem_pybench.so of the build tree (found next to
the package's build directory, or given with --helper). Cases on an OpenCL
device run where one exists (PoCL: POCL_DEVICES=pthread).

Then DLPack (SPEC §6: numpy.from_dlpack of a host buffer copies nothing):
numpy.from_dlpack, torch.from_dlpack (where PyTorch is installed) and
unimem.from_dlpack of a 1 GiB buffer whose pages are all touched, each timed
with the growth of the process's resident memory, next to numpy's own copy
of the same bytes. --dlpack-only runs only that part. Last, typed views
(Buffer.view) against the uint8 export reshaped by hand (--views-only).
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

import unimem
from benchstats import spread

LOCATIONS = {"host": 0, "device": 1, "pinned": 2, "unified": 3}
MODES = {"copy_from": 0, "copy_to": 1, "copy_from+wait": 2}
TARGET_NS = 2000.0


def find_helper(path):
    if path:
        return path
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(unimem.__file__))))
    candidate = os.path.join(build, "bench", "libunimem_pybench.so")
    if not os.path.exists(candidate):
        sys.exit(f"bench_python: no C helper at {candidate}; build the target unimem_pybench or pass --helper")
    return candidate


def c_rep(helper, backends, device, location, mode, nbytes, iterations):
    """One repetition on the C side: mean ns per call."""
    out = ctypes.c_double()
    st = helper.pybench_copy(backends.encode(), device, LOCATIONS[location], MODES[mode], nbytes,
                             iterations, 1, ctypes.byref(out))
    if st != 0:
        raise RuntimeError(f"C side of {mode} {nbytes} B failed with status {st}")
    return out.value


def python_call(b, mode):
    if mode == "copy_from":
        return b.copy_from
    if mode == "copy_to":
        return b.copy_to

    def call(obj, copy=b.copy_from):
        copy(obj, wait=False).wait()
    return call


def measure(helper, backends, device, location, mode, nbytes, iterations, reps):
    """Medians of the C side and of the binding, their repetitions taken in
    turn so that both see the same load on a shared machine."""
    c_samples, py_samples = [], []
    with unimem.Manager(backends=backends) as m, m.alloc(nbytes, device=device, location=location) as b:
        host = bytearray(nbytes)
        call = python_call(b, mode)
        loop = range(iterations)
        for _ in range(iterations // 10 + 1):  # warm up
            call(host)
        for _ in range(reps):
            c_samples.append(c_rep(helper, backends, device, location, mode, nbytes, iterations))
            t0 = time.perf_counter_ns()
            for _ in loop:
                call(host)
            py_samples.append((time.perf_counter_ns() - t0) / iterations)
    return c_samples, py_samples


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(fn):
    """(result, seconds, resident growth in bytes) of one call."""
    rss = rss_bytes()
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, rss_bytes() - rss


def dlpack_rows(nbytes):
    """from_dlpack of an nbytes host buffer: time and resident growth."""
    import numpy
    try:
        import torch
    except ImportError:
        torch = None
    mib = nbytes / (1 << 20)
    print(f"\nDLPack of a {mib:.0f} MiB host buffer, every page touched: time and resident-memory growth")
    print(f"{'call':<38}{'time':>14}{'RSS growth':>14}  verdict (zero-copy: < 1 MiB growth)")
    with unimem.Manager(backends="cpu") as m, m.alloc(nbytes, device=0, location="host") as b:
        b.fill(0x11)
        rows = []
        a, t, grown = timed(lambda: numpy.from_dlpack(b))
        assert a.ctypes.data == b.native()["host"] and a[-1] == 0x11
        rows.append(("numpy.from_dlpack(b)", t, grown))
        if torch is not None:
            tt, t, grown = timed(lambda: torch.from_dlpack(b))
            assert tt.data_ptr() == b.native()["host"]
            rows.append(("torch.from_dlpack(b)", t, grown))
            del tt
        del a
        c, t, grown = timed(lambda: numpy.array(memoryview(b)))
        rows.append(("numpy.array(memoryview(b)) (a copy)", t, grown))
        del c
    x = numpy.ones(nbytes, numpy.uint8)  # NumPy's arrays from DLPack are read-only: a fresh one
    with unimem.Manager(backends="cpu") as m:
        w, t, grown = timed(lambda: unimem.from_dlpack(m, x))
        assert w.native()["host"] == x.ctypes.data
        rows.append(("unimem.from_dlpack(m, array)", t, grown))
        w.release()
    del x
    for name, t, grown in rows:
        copied = "copy" in name
        verdict = "the copy, for scale" if copied else ("ok" if grown < (1 << 20) else "OVER")
        print(f"{name:<38}{t * 1e6:>11.1f} µs{grown / (1 << 20):>10.2f} MiB  {verdict}")


def view_rows(reps, iterations):
    """Typed views (Buffer.view): a 32 x 32 float32 array from a host buffer, as a typed view and as the
    uint8 export reshaped by hand (what a consumer did before views existed). ns per call, median of reps."""
    import numpy
    try:
        import torch
    except ImportError:
        torch = None
    with unimem.Manager(backends="cpu") as m, m.alloc(4096, location="host") as b:
        f32 = numpy.dtype(numpy.float32)
        cases = [("b.view(f32, (32, 32))", lambda: b.view(f32, (32, 32))),
                 ("numpy.from_dlpack(b.view(...))", lambda: numpy.from_dlpack(b.view(f32, (32, 32)))),
                 ("numpy.from_dlpack(b).view().reshape()",
                  lambda: numpy.from_dlpack(b).view(numpy.float32).reshape(32, 32)),
                 ("numpy.asarray(b.view(...))", lambda: numpy.asarray(b.view(f32, (32, 32))))]
        if torch is not None:
            cases += [("torch.from_dlpack(b.view(...))", lambda: torch.from_dlpack(b.view(f32, (32, 32)))),
                      ("torch.from_dlpack(b).view().reshape()",
                       lambda: torch.from_dlpack(b).view(torch.float32).reshape(32, 32))]
        print(f"typed views: ns per call, median of {reps} runs of {iterations}")
        for name, fn in cases:
            samples = []
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                for _ in range(iterations):
                    fn()
                samples.append((time.perf_counter_ns() - t0) / iterations)
            print(f"  {name:<40}{statistics.median(samples):>8.0f}  spread {spread(samples):.0f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    ap.add_argument("--helper", help="path of libunimem_pybench.so")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per case (default 9, quick 3)")
    ap.add_argument("--dlpack-only", action="store_true", help="only the DLPack rows")
    ap.add_argument("--views-only", action="store_true", help="only the typed views' rows")
    ap.add_argument("--dlpack-bytes", type=int, default=0, help="buffer size of the DLPack rows (default 1 GiB, "
                    "quick 64 MiB)")
    args = ap.parse_args()
    dlpack_bytes = args.dlpack_bytes or ((64 if args.quick else 1024) << 20)
    if args.dlpack_only:
        dlpack_rows(dlpack_bytes)
        return
    if args.views_only:
        view_rows(args.reps or (3 if args.quick else 9), 2000 if args.quick else 20000)
        return
    helper = ctypes.CDLL(find_helper(args.helper))
    helper.pybench_copy.restype = ctypes.c_int
    helper.pybench_copy.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_size_t,
                                    ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    reps = args.reps or (3 if args.quick else 9)
    scale = 20 if args.quick else 1

    cases = [("cpu", 0, "device", mode, n, 200000) for mode in MODES for n in (8, 4096)]
    with unimem.Manager(backends="cpu,opencl") as m:
        if len(m.devices) > 1:
            cases += [("cpu,opencl", 1, "device", mode, n, 5000)
                      for mode in ("copy_from", "copy_to") for n in (8, 4096)]

    print(f"unimem {unimem.__version__}, Python {sys.version.split()[0]}; median of {reps} runs, "
          f"ns per call (blocking unless +wait)")
    print(f"{'device':<12}{'call':<16}{'bytes':>6}{'C':>9}{'binding':>9}{'added':>8}{'spread':>8}  "
          f"target: added <= 2000")
    worst = None
    for backends, device, location, mode, nbytes, iterations in cases:
        iterations = max(100, iterations // scale)
        c_samples, py_samples = measure(helper, backends, device, location, mode, nbytes, iterations, reps)
        c, py = statistics.median(c_samples), statistics.median(py_samples)
        added = py - c
        noise = max(spread(c_samples), spread(py_samples))
        if added <= TARGET_NS:
            verdict = "ok"
        elif noise >= added:
            verdict = "noise (spread >= added: rerun on an idle machine)"
        else:
            verdict = "OVER"
        if not verdict.startswith("noise"):
            worst = added if worst is None else max(worst, added)
        name = "cpu" if device == 0 else f"opencl:{device}"
        print(f"{name:<12}{mode:<16}{nbytes:>6}{c:>9.0f}{py:>9.0f}{added:>8.0f}{noise:>8.0f}  {verdict}")
    if worst is not None:
        print(f"largest added cost among the measurable rows: {worst:.0f} ns per call "
              f"({'within' if worst <= TARGET_NS else 'over'} the 2 µs target)")
    dlpack_rows(dlpack_bytes)
    view_rows(reps, 2000 if args.quick else 20000)


if __name__ == "__main__":
    main()
