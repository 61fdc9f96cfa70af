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

Seeing the memory: ``with m.tag("attention"):``, ``m.tag_stats()``,
``m.snapshot()``, ``with m.history() as h: ...; h.save("h.json")`` (then
``unimem view h.json``), ``unimem.dump_snapshot(m, "s.pickle")`` for
PyTorch's memory_viz page.

Names: Manager, Buffer, Event, Mapping, Access, Device, access, copy, from_dlpack,
Tag, History, dump_snapshot, memory_viz_snapshot,
Error and one subclass per C status code, stats_fields, OPTION_NAMES,
__version__.
"""

import atexit as _atexit

from . import _core
from ._core import (  # noqa: F401  (the package's API)
    OPTION_NAMES,
    Access,
    ArrayView,
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


class Tag:
    """``with m.tag(name):`` -- this thread's work on m counts for tag name
    inside the block (um_tag_push / um_tag_pop)."""

    __slots__ = ("_m", "name")

    def __init__(self, m, name):
        self._m = m
        self.name = name

    def __enter__(self):
        """Open the tag (um_tag_push)."""
        self._m._tag_push(self.name)
        return self

    def __exit__(self, *exc):
        """Close it (um_tag_pop), whatever ended the block; an exception
        that ends it is not replaced by a failure of the pop (the manager
        closed inside the block)."""
        try:
            self._m._tag_pop()
        except Error:
            if exc[0] is None:
                raise
        return False


class History:
    """``with m.history(capacity) as h:`` records m's events (allocations,
    releases, trims, copies, fills, brackets, net transfers, out-of-memory)
    while the block runs; afterwards ``h.events()`` lists them, ``h.dropped``
    counts those the full ring overwrote, ``h.save(path)`` writes Chrome
    trace-event JSON (ui.perfetto.dev, chrome://tracing, ``unimem view``).
    ``start()`` and ``stop()`` do the same without a block."""

    def __init__(self, m, capacity):
        self._m = m
        self.capacity = capacity
        self.dropped = 0

    def start(self):
        """Begin recording (um_history_start); the History itself."""
        self._m._history_start(self.capacity)
        return self

    def stop(self):
        """Stop recording (um_history_stop); the events stay readable."""
        self._m._history_stop()

    def __enter__(self):
        """start()"""
        return self.start()

    def __exit__(self, *exc):
        """stop(); an exception that ends the block is not replaced by a
        failure of the stop."""
        try:
            self.stop()
        except Error:
            if exc[0] is None:
                raise
        return False

    def events(self):
        """The recorded events, oldest first, as dicts (um_history_event's
        fields: kind, device, src_device, dst_device, location, status, how,
        thread, tag, path, begin_ns, end_ns, bytes, address, in_use, site)."""
        events, self.dropped = self._m._history_events()
        return events

    def save(self, path):
        """Write the recording as Chrome trace-event JSON to path."""
        self._m._history_save(str(path))


_core._set_observe_classes(Tag, History)

_TORCH_STATE = {"in_use": "active_allocated", "released": "active_pending_free", "idle": "inactive",
                "free": "inactive"}
_TORCH_ACTION = {"alloc": "alloc", "release": "free_completed", "trim": "segment_free", "oom": "oom"}


def memory_viz_snapshot(m, history=None):
    """m's memory now in the snapshot format PyTorch's memory_viz page reads
    (torch.cuda.memory._snapshot()): {"segments": [...], "device_traces":
    [...]} -- a segment per unimem segment (and one per block of its own),
    its blocks in address order with state active_allocated (in use),
    active_pending_free (released, operations running) or inactive (idle
    in the pool, free extent); a block's frames name its tag and site. With
    a History, device_traces holds its allocations, releases, trims and
    out-of-memory per device."""
    snap = m.snapshot()
    segments = []
    for i, g in enumerate(snap["segments"]):
        segments.append({"device": g["device"], "address": g["address"], "total_size": g["size"], "stream": 0,
                         "segment_type": "large" if g["size"] > (1 << 20) else "small", "segment_pool_id": (0, 0),
                         "is_expandable": bool(g["virtual"]), "frames": [], "blocks": [], "_index": i})

    def frames(b):
        out = []
        if b.get("site"):
            file, _, line = b["site"].rpartition(":")
            out.append({"filename": file, "line": int(line) if line.isdigit() else 0, "name": b.get("tag") or ""})
        elif b.get("tag"):
            out.append({"filename": "??", "line": 0, "name": b["tag"]})
        return out

    for b in snap["blocks"]:
        block = {"address": b["address"], "size": b["capacity"], "requested_size": b["size"],
                 "state": _TORCH_STATE[b["state"]], "frames": frames(b)}
        if b["segment"] >= 0:
            segments[b["segment"]]["blocks"].append(block)
        else:
            segments.append({"device": b["device"], "address": b["address"], "total_size": b["capacity"],
                             "stream": 0, "segment_type": "large" if b["capacity"] > (1 << 20) else "small",
                             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [block]})
    for g in segments:
        g.pop("_index", None)
        g["blocks"].sort(key=lambda k: k["address"])
        g["allocated_size"] = sum(k["size"] for k in g["blocks"] if k["state"] == "active_allocated")
        g["active_size"] = sum(k["size"] for k in g["blocks"] if k["state"] != "inactive")
        g["requested_size"] = sum(k["requested_size"] for k in g["blocks"] if k["state"] == "active_allocated")
    ndev = max([g["device"] for g in segments] + [d.index for d in m.devices]) + 1
    traces = [[] for _ in range(ndev)]
    if history is not None:
        for e in history.events():
            action = _TORCH_ACTION.get(e["kind"])
            if action is None:
                continue
            entry = {"action": action, "addr": e["address"], "size": e["bytes"], "stream": 0,
                     "time_us": e["end_ns"] // 1000, "frames": frames(e)}
            if action == "oom":
                entry["device_free"] = 0
            traces[e["device"]].append(entry)
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"unimem": __version__}}


def dump_snapshot(m, path, history=None):
    """Write memory_viz_snapshot(m, history) to path as a pickle, the file
    PyTorch's memory_viz page (pytorch.org/memory_viz) opens."""
    import pickle

    with open(path, "wb") as f:
        pickle.dump(memory_viz_snapshot(m, history), f)


_ERROR_NAMES = _make_errors()
_atexit.register(_core._shutdown)

__all__ = [
    "Manager", "Buffer", "ArrayView", "Event", "Mapping", "Access", "Device", "access", "copy", "from_dlpack", "Error",
    "stats_fields", "OPTION_NAMES", "__version__", "Tag", "History", "dump_snapshot", "memory_viz_snapshot",
] + list(_ERROR_NAMES)
