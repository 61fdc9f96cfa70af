#!/usr/bin/env python3
"""unimem as the frameworks' GPU allocator, next to their own (needs an
NVIDIA GPU; skips, saying why, without one).

For each framework present (PyTorch >= 2.0, CuPy, Numba), the same small
workload runs twice, each in a process of its own (an allocator can only be
chosen before the first CUDA allocation): with the framework's own
allocator and with unimem's. The results must match; the table gives the
time, and the allocation statistics each side keeps.

  - torch: a 4-layer MLP trained 200 steps with SGD on fixed data
    (deterministic algorithms): the losses must be equal;
  - cupy: 200 rounds of allocate / compute / free of mixed sizes: the
    checksums must be equal;
  - numba: a kernel over device arrays allocated and freed 200 times.

    PYTHONPATH=build/python python3 bench/bench_frameworks.py [--check NAME] [--steps N]

--check NAME runs one framework and exits 1 unless the results match (the
gpu tests run it: python -m pytest python/tests -m gpu), or 77 with a SKIP
line when the framework fails its workload with its own allocator (a
broken install: numba-cuda against a NumPy it does not support, say). Exit 0 and a SKIP
line where there is no GPU or no framework.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import unimem

HERE = os.path.abspath(__file__)
SKIPPED = 77  # --check: the framework cannot run here at all


def have_gpu():
    with unimem.Manager(backends="cpu,cuda") as m:
        return any(d.backend == "cuda" for d in m.devices)


# ---- The workloads, run in child processes -------------------------------------


def child_torch(use_unimem, steps):
    import torch
    if use_unimem:
        import unimem.torch
        unimem.torch.use_unimem_allocator()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 512, generator=gen).to(dev)
    y = torch.randint(0, 10, (256,), generator=gen).to(dev)
    losses = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    out = {"seconds": time.perf_counter() - t0, "result": losses}
    if use_unimem:
        import unimem.torch
        s = unimem.torch.stats()
        out["stats"] = {k: s[k] for k in ("allocations", "pool_hits", "hit_rate", "peak_bytes_in_use",
                                          "bytes_reserved", "device_allocs")}
    else:
        s = torch.cuda.memory_stats()
        out["stats"] = {k: s.get(k) for k in ("allocation.all.allocated", "segment.all.allocated",
                                              "allocated_bytes.all.peak", "reserved_bytes.all.peak")}
    return out


def child_cupy(use_unimem, steps):
    import cupy
    m = None
    if use_unimem:
        import unimem.cupy
        m = unimem.Manager(backends="cpu,cuda")
        unimem.cupy.set_allocator(m)
    rng = cupy.random.RandomState(3)
    total = 0.0
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        n = 1 << (10 + i % 12)
        a = rng.standard_normal(n, dtype=cupy.float32)
        b = cupy.sqrt(cupy.abs(a)) * 2 + 1
        total += float(b.sum())
        del a, b
    cupy.cuda.Device().synchronize()
    out = {"seconds": time.perf_counter() - t0, "result": [round(total, 2)]}
    if m is not None:
        s = m.stats()
        out["stats"] = {k: s[k] for k in ("allocations", "pool_hits", "hit_rate", "peak_bytes_in_use",
                                          "device_allocs")}
    else:
        pool = cupy.get_default_memory_pool()
        out["stats"] = {"used_bytes": pool.used_bytes(), "total_bytes": pool.total_bytes()}
    return out


def child_numba(use_unimem, steps):
    import numpy
    from numba import cuda
    if use_unimem:
        import unimem.numba
        cuda.set_memory_manager(unimem.numba.memory_manager_class())

    @cuda.jit
    def axpb(x, a, b):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = a * x[i] + b

    total = 0.0
    t0 = time.perf_counter()
    for i in range(steps):
        n = 1 << (10 + i % 10)
        d = cuda.to_device(numpy.arange(n, dtype=numpy.float32))
        axpb[(n + 255) // 256, 256](d, 2.0, 1.0)
        total += float(d.copy_to_host().sum())
        del d
    cuda.synchronize()
    out = {"seconds": time.perf_counter() - t0, "result": [total]}
    if use_unimem:
        import unimem.numba
        s = unimem.numba.manager().stats()
        out["stats"] = {k: s[k] for k in ("allocations", "pool_hits", "hit_rate", "device_allocs")}
    else:
        out["stats"] = {}
    return out


CHILDREN = {"torch": child_torch, "cupy": child_cupy, "numba": child_numba}
CHECK_LINE = {"torch": "torch: losses match", "cupy": "cupy: results match", "numba": "numba: results match"}


# ---- The parent ------------------------------------------------------------------


def run_child(name, use_unimem, steps):
    cmd = [sys.executable, HERE, "--child", name, "unimem" if use_unimem else "own", "--steps", str(steps)]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{name} ({'unimem' if use_unimem else 'own'} allocator) failed:\n{r.stdout}{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def importable(name):
    r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True)
    return r.returncode == 0


class FrameworkBroken(Exception):
    """The framework fails its workload with its own allocator: it cannot be
    compared here, whatever unimem does."""


def compare(name, steps):
    try:
        own = run_child(name, False, steps)
    except RuntimeError as e:
        raise FrameworkBroken(str(e).strip().splitlines()[-1]) from e
    mine = run_child(name, True, steps)
    a, b = own["result"], mine["result"]
    match = len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(a, b))
    print(f"{name:<6} own allocator {own['seconds'] * 1e3:9.1f} ms   unimem {mine['seconds'] * 1e3:9.1f} ms   "
          f"ratio {mine['seconds'] / own['seconds']:.2f}")
    print(f"       own stats:    {own['stats']}")
    print(f"       unimem stats: {mine['stats']}")
    if match:
        print(CHECK_LINE[name])
    else:
        print(f"{name}: results DIFFER: own {a[-3:]} unimem {b[-3:]}")
    return match


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", choices=sorted(CHILDREN), help="one framework; exit 1 unless results match")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--child", nargs=2, metavar=("NAME", "ALLOCATOR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](args.child[1] == "unimem", args.steps)))
        return 0
    if not have_gpu():
        print("SKIP: no CUDA device here (bench_frameworks needs an NVIDIA GPU and its driver)")
        return 0
    names = [args.check] if args.check else sorted(CHILDREN)
    ok = True
    for name in names:
        module = {"torch": "torch", "cupy": "cupy", "numba": "numba"}[name]
        if not importable(module):
            print(f"SKIP: {module} is not installed")
            ok = ok and not args.check
            continue
        try:
            ok = compare(name, args.steps) and ok
        except FrameworkBroken as e:
            print(f"SKIP: {name} fails with its own allocator, so it cannot be compared here: {e}")
            if args.check:
                return SKIPPED
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
