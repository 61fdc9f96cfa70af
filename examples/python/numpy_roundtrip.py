#!/usr/bin/env python3
"""NumPy and unimem sharing memory both ways, without a copy.

    PYTHONPATH=build/python python3 examples/python/numpy_roundtrip.py
"""
import numpy

import unimem

with unimem.Manager(backends="cpu") as m:
    # unimem -> NumPy: a host buffer seen as an array (DLPack; numpy.asarray(b) works too).
    b = m.alloc(1024 * 4, device=0, location="host", zero=True)
    a = numpy.from_dlpack(b).view(numpy.float32)     # NumPy marks DLPack arrays read-only
    b.copy_from(numpy.linspace(0, 1, 1024, dtype=numpy.float32))
    assert a[-1] == 1.0, "the array is the buffer's memory"
    print("unimem -> numpy:", a[:4], "... zero-copy:", a.ctypes.data == b.native()["host"])

    # NumPy -> unimem: an array wrapped as a buffer; unimem's copies and fills write the array.
    x = numpy.zeros(256, dtype=numpy.int32)
    w = unimem.from_dlpack(m, x)
    w.fill(0x01, offset=0, nbytes=4)
    assert x[0] == 0x01010101
    print("numpy -> unimem:", w, "x[0] = %#x" % x[0])

    # Round trip through a device buffer: the wrapped array copied there and back.
    d = m.alloc(x.nbytes, location="device")
    unimem.copy(d, w, x.nbytes)
    w.release()          # NumPy's deleter runs here, once
    out = numpy.empty_like(x)
    d.copy_to(out)
    assert numpy.array_equal(out, x)
    del a
    print("round trip ok")
