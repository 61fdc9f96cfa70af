"""unimem as Numba's CUDA memory manager (an External Memory Management
plugin, NBEP 7).

    import unimem.numba
    from numba import cuda
    cuda.set_memory_manager(unimem.numba.memory_manager_class())
    # or: NUMBA_CUDA_MEMORY_MANAGER=unimem.numba python ...

Device allocations are unimem Buffers (UM_DEVICE, pooled) of one manager
per process (options from the UNIMEM_* environment) on the context's CUDA
device; pinned host memory stays Numba's own (HostOnlyCUDAMemoryManager). A
block goes back to unimem's pool when Numba's finalizer runs, which Numba
defers until its pending deallocations are flushed. numba is imported only when the class is asked for (or
when Numba loads this module through NUMBA_CUDA_MEMORY_MANAGER).
"""

import ctypes

from . import _core

_manager = None


def manager():
    """The process's unimem Manager for Numba (made on first use)."""
    global _manager
    if _manager is None or _manager.closed:
        _manager = _core.Manager()
    return _manager


def _device_index(m, ordinal):
    k = 0
    for dev in m.devices:
        if dev.backend != "cuda":
            continue
        native = m.native(dev.index)["cu_device"]
        if (native if native >= 0 else k) == ordinal:
            return dev.index
        k += 1
    raise RuntimeError(f"unimem.numba: the manager has no CUDA device {ordinal}")


class _Event:
    """A CUevent for Access.done."""

    def __init__(self, ptr):
        self.ptr = ptr


def _finalizer(buffer, context):
    """Numba's finalizer of one block. cuMemFree, which Numba would call,
    waits for the device; unimem's release does not: the bracket ends behind
    an event on the legacy default stream (after the work of every blocking
    stream, as Numba's are), or, where the bracket takes no event, after a
    synchronisation."""
    def finalize():
        if buffer.released:
            return
        from numba import cuda
        try:
            event = cuda.event(timing=False)
            event.record(stream=0)
            with buffer.access("rw") as ac:
                ac.done = _Event(event.handle.value)
        except Exception:
            context.synchronize()
        finally:
            buffer.release()
    return finalize


def memory_manager_class():
    """The numba.cuda.HostOnlyCUDAMemoryManager subclass whose device memory
    comes from unimem (Numba's own code keeps the pinned host memory)."""
    from numba import cuda
    from numba.cuda.cudadrv import driver

    class UnimemMemoryManager(cuda.HostOnlyCUDAMemoryManager):
        """Numba's CUDA device memory from unimem's pools."""

        def initialize(self):
            self.m = manager()
            self.device = _device_index(self.m, self.context.device.id)

        def memalloc(self, size):
            b = self.m.alloc(max(int(size), 1), device=self.device, location="device")
            native = b.native()
            if native["cu_ptr"] == 0:
                b.release()
                raise RuntimeError("unimem.numba: this build of unimem gives no CUdeviceptr for CUDA buffers")
            ptr = driver.c_void_p(native["cu_ptr"] + native["offset"])
            return driver.MemoryPointer(self.context, ptr, size, finalizer=_finalizer(b, self.context))

        def get_memory_info(self):
            s = self.m.stats(self.device)
            total = self.m.devices[self.device].total_bytes
            return cuda.MemoryInfo(free=max(total - s["bytes_reserved"], 0), total=total)

        def get_ipc_handle(self, memory):
            # The handle names the whole driver allocation the block lies in;
            # the receiver adds the offset.
            base, _ = driver.device_extents(memory)
            handle = driver.drvapi.cu_ipc_mem_handle()
            driver.driver.cuIpcGetMemHandle(ctypes.byref(handle), base)
            return driver.IpcHandle(memory, handle, memory.size, self.context.device.get_device_identity(),
                                    offset=memory.handle.value - base)

        def reset(self):
            super().reset()
            self.m.trim(0)

        @property
        def interface_version(self):
            return 1

    return UnimemMemoryManager


def __getattr__(name):
    # NUMBA_CUDA_MEMORY_MANAGER=unimem.numba: Numba imports this module and
    # takes _numba_memory_manager from it; numba is imported only then.
    if name == "_numba_memory_manager":
        return memory_manager_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
