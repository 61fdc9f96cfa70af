"""unimem: allocate, pool, move and inspect memory on the host CPU, OpenCL
devices and NVIDIA GPUs, from Python.

    import numpy, unimem

    with unimem.Manager(backends="cpu,opencl") as m:
        print(m.devices)                        # [Device(index=0, ...), ...]
        with m.alloc(4096, device=1) as b:      # device memory, pooled
            b.copy_from(numpy.arange(1024, dtype=numpy.float32))
            out = numpy.empty(1024, numpy.float32)
            ev = b.copy_to(out, wait=False)     # an Event
            ev.wait()
            with b.map("r") as view:            # a memoryview
                first = bytes(view[:4])
        print(m.stats()["pool_hits"])

Host-visible buffers (Buffer.has_host_view) support the buffer protocol:
``numpy.asarray(b)`` and ``memoryview(b)`` share the buffer's memory. A
buffer released, or whose manager is closed, while such views live keeps its
memory until the last view is gone. Failures raise ``unimem.Error``
subclasses carrying the C code, its name and the library's message.

DLPack both ways: ``numpy.from_dlpack(b)`` / ``torch.from_dlpack(b)`` share a
buffer's memory; ``unimem.from_dlpack(m, x)`` wraps a NumPy array's or a
tensor's. Your own kernels on a buffer: ``b.to_pyopencl()``,
``m.pyopencl_queue(device)`` and ``with b.access("rw") as ac:`` (ac.wait_for,
ac.done); over several buffers at once ``with unimem.access([a, b, c],
["r", "r", "rw"]) as ac:``; ``b.release_after(event)`` gives a buffer back
once the caller's event completed. Frameworks' allocators: unimem.torch, unimem.cupy, unimem.numba.

Names: Manager, Buffer, Event, Mapping, Access, Device, access, copy, from_dlpack,
Error and one subclass per C status code, stats_fields, OPTION_NAMES,
__version__.
"""

import atexit as _atexit

from . import _core
from ._core import (  # noqa: F401  (the package's API)
    OPTION_NAMES,
    Access,
    Buffer,
    Device,
    Event,
    Manager,
    Mapping,
    access,
    copy,
    from_dlpack,
    stats_fields,
)

__version__ = _core.__version__


class Error(Exception):
    """A unimem failure: ``code`` (the negative UM_E* value), ``name``
    ("UM_EINVAL") and ``message`` (the library's detail)."""

    def __init__(self, code, name, message):
        super().__init__(code, name, message)
        self.code = code
        self.name = name
        self.message = message

    def __str__(self):
        return f"{self.name}: {self.message}"


# Built-in exceptions a subclass also derives from, so that code written for
# them (except ValueError, except MemoryError) catches unimem's too.
_ALSO = {
    "InvalidArgument": (ValueError,),
    "OutOfRange": (ValueError,),
    "Overflow": (OverflowError,),
    "OutOfMemory": (MemoryError,),
}


def _make_errors():
    """One Error subclass per code of the C library's UM_ERRNO_MAP."""
    classes = {}
    for code, c_name, py_name, text in _core._errors():
        cls = type(py_name, (Error,) + _ALSO.get(py_name, ()), {
            "__doc__": f"{c_name} ({code}): {text}.",
            "__module__": __name__,
            "code": code,
        })
        classes[code] = cls
        globals()[py_name] = cls
    _core._set_error_classes(Error, classes)
    return tuple(cls.__name__ for cls in classes.values())


_ERROR_NAMES = _make_errors()
_atexit.register(_core._shutdown)

__all__ = [
    "Manager", "Buffer", "Event", "Mapping", "Access", "Device", "access", "copy", "from_dlpack", "Error",
    "stats_fields", "OPTION_NAMES", "__version__",
] + list(_ERROR_NAMES)
