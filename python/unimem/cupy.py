"""unimem as CuPy's memory allocator.

    import cupy, unimem, unimem.cupy
    m = unimem.Manager(backends="cpu,cuda")
    unimem.cupy.set_allocator(m)            # cupy.cuda.set_allocator(...)
    x = cupy.arange(1 << 20)                # memory from unimem's pool

Each CuPy allocation is a unimem Buffer (UM_DEVICE, pooled) on the CUDA
device CuPy has current, wrapped as cupy.cuda.UnownedMemory whose owner
keeps the Buffer. When CuPy drops the memory, the owner ends an access
bracket behind an event recorded on CuPy's current stream and releases the
Buffer: unimem reuses the block only after the work queued there.
set_allocator(None) gives CuPy its own pool back. cupy is imported only
when set_allocator is called.
"""

class _Owner:
    """Keeps a unimem Buffer for CuPy; releases it behind the stream's work."""

    __slots__ = ("buffer", "cupy")

    def __init__(self, buffer, cupy):
        self.buffer = buffer
        self.cupy = cupy

    def __del__(self):
        b, cupy = self.buffer, self.cupy
        if b is None or b.released:
            return
        try:
            with b.access("rw") as ac:
                event = cupy.cuda.Event(disable_timing=True)
                event.record(cupy.cuda.get_current_stream())
                ac.done = event
        except Exception:
            # The bracket took no event (a unimem without CUDA interop): it
            # ended at once, so wait for the stream before the release.
            cupy.cuda.get_current_stream().synchronize()
        finally:
            b.release()


def _cuda_devices(m):
    """{CUDA ordinal: unimem device index} of the manager."""
    out, k = {}, 0
    for dev in m.devices:
        if dev.backend != "cuda":
            continue
        ordinal = m.native(dev.index)["cu_device"]
        out[ordinal if ordinal >= 0 else k] = dev.index
        k += 1
    return out


def allocator(m):
    """The function CuPy calls: size -> cupy.cuda.MemoryPointer."""
    import cupy
    devices = _cuda_devices(m)

    def malloc(size):
        ordinal = cupy.cuda.Device().id
        if ordinal not in devices:
            raise RuntimeError(f"unimem.cupy: the manager has no CUDA device {ordinal}")
        b = m.alloc(max(int(size), 1), device=devices[ordinal], location="device")
        native = b.native()
        ptr = native["cu_ptr"] + native["offset"]
        if native["cu_ptr"] == 0:
            b.release()
            raise RuntimeError("unimem.cupy: this build of unimem gives no CUdeviceptr for CUDA buffers")
        mem = cupy.cuda.UnownedMemory(ptr, size, _Owner(b, cupy), ordinal)
        return cupy.cuda.MemoryPointer(mem, 0)
    return malloc


def set_allocator(m):
    """Route CuPy's allocations through Manager m (None: CuPy's own pool again)."""
    import cupy
    cupy.cuda.set_allocator(None if m is None else allocator(m))
