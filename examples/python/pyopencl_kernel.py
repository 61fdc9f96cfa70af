#!/usr/bin/env python3
"""A pyopencl kernel on unimem buffers, ordered with unimem's own copies
through the access bracket: nothing waits on the host until the result is
read back.

    POCL_DEVICES=pthread PYTHONPATH=build/python python3 examples/python/pyopencl_kernel.py

Exits 0 with a SKIP line where there is no OpenCL device or no pyopencl.
"""
import sys

import numpy

import unimem

try:
    import pyopencl
except ImportError:
    print("SKIP: pyopencl is not installed (apt-get install python3-pyopencl)")
    sys.exit(0)

SOURCE = """
__kernel void saxpy(__global float *y, __global const float *x, float a) {
  size_t i = get_global_id(0); y[i] = a * x[i] + y[i];
}
"""

with unimem.Manager(backends="cpu,opencl") as m:
    gpu = next((d.index for d in m.devices if d.backend == "opencl"), None)
    if gpu is None:
        print("SKIP: no OpenCL device (install pocl-opencl-icd)")
        sys.exit(0)
    queue = m.pyopencl_queue(gpu)            # the caller's queue, in unimem's context
    program = pyopencl.Program(queue.context, SOURCE).build()

    n = 1 << 20
    x = numpy.arange(n, dtype=numpy.float32)
    y = numpy.ones(n, dtype=numpy.float32)
    bx = m.alloc(x.nbytes, device=gpu)
    by = m.alloc(y.nbytes, device=gpu)
    bx.copy_from(x, wait=False)              # unimem's copies, not waited for
    by.copy_from(y, wait=False)

    with bx.access("r") as ax, by.access("rw") as ay:
        done = program.saxpy(queue, (n,), None, by.to_pyopencl(), bx.to_pyopencl(), numpy.float32(2),
                             wait_for=ax.wait_for + ay.wait_for)   # after the copies
        ax.done = ay.done = done                                   # unimem's next work waits for it

    out = numpy.empty_like(y)
    by.copy_to(out)                          # ordered after the kernel
    assert numpy.array_equal(out, 2 * x + 1)
    print(f"saxpy on {m.devices[gpu].name}: ok ({n} elements)")
