#!/usr/bin/env python3
"""PyTorch's CUDA memory from unimem's pool (PyTorch 2.0 or later with a GPU;
exits 0 with a SKIP line otherwise). Also: CPU tensors and unimem buffers
sharing memory through DLPack, which works everywhere.

    PYTHONPATH=build/python python3 examples/python/torch_allocator.py
"""
import sys

import unimem

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed (apt-get install python3-torch)")
    sys.exit(0)

# DLPack, on the CPU: a unimem buffer as a tensor and back, zero-copy.
with unimem.Manager(backends="cpu") as m:
    b = m.alloc(16 * 4, device=0, zero=True)
    t = torch.from_dlpack(b).view(torch.float32)
    t += 1.5
    w = unimem.from_dlpack(m, t)           # the same memory again
    assert w.native()["host"] == b.native()["host"]
    w.release()
    del t
    print("dlpack with torch: ok")

if not hasattr(torch.cuda, "memory") or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
    print(f"SKIP: PyTorch {torch.__version__} has no CUDAPluggableAllocator (2.0 or later)")
    sys.exit(0)
if not torch.cuda.is_available():
    print("SKIP: no CUDA device")
    sys.exit(0)

import unimem.torch  # noqa: E402

unimem.torch.use_unimem_allocator()        # before the first CUDA tensor
x = torch.randn(1024, 1024, device="cuda")
y = (x @ x).relu().sum()
torch.cuda.synchronize()
s = unimem.torch.stats()
print(f"torch on unimem: sum={y.item():.3f}, {s['allocations']} allocations, pool hit rate {s['hit_rate']:.2f}, "
      f"{unimem.torch.live_blocks()} blocks held")
