"""unimem as PyTorch's CUDA allocator.

    import torch, unimem.torch
    unimem.torch.use_unimem_allocator()     # before the first CUDA tensor
    x = torch.randn(1024, 1024, device="cuda")   # memory from unimem's pool

PyTorch (2.0 on) loads libunimem_torch.so, which sits next to this module,
through torch.cuda.memory.CUDAPluggableAllocator with the functions
unimem_torch_alloc / unimem_torch_free. The blocks come from one unimem
manager of the process (options from the UNIMEM_* environment), pooled; a
freed block goes back to the pool only after the work queued on the stream
it was freed on (an event recorded there ends unimem's access bracket).
PyTorch allows the allocator to be changed only before CUDA memory is first
allocated.

stats() gives unimem's statistics of that manager; live_blocks() the
blocks PyTorch holds. torch is imported only when these are called.
"""

import ctypes
import os

from . import _core

ALLOC_FN = "unimem_torch_alloc"
FREE_FN = "unimem_torch_free"


def library_path():
    """The path of libunimem_torch.so (next to the package's extension)."""
    path = os.path.join(os.path.dirname(os.path.abspath(_core.__file__)), "libunimem_torch.so")
    if not os.path.exists(path):
        raise FileNotFoundError(f"unimem.torch: {path} is missing (build the unimem_torch target)")
    return path


_lib = None


def _library():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path())
        lib.unimem_torch_alloc.restype = ctypes.c_void_p
        lib.unimem_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.unimem_torch_free.restype = None
        lib.unimem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.unimem_torch_stats.restype = ctypes.c_int
        lib.unimem_torch_stats.argtypes = [ctypes.c_void_p]
        lib.unimem_torch_live.restype = ctypes.c_size_t
        lib.unimem_torch_last_error.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def use_unimem_allocator():
    """Make unimem PyTorch's CUDA allocator (torch.cuda.memory.change_current_allocator).
    Returns the CUDAPluggableAllocator. RuntimeError when this PyTorch has no
    pluggable allocators (before 2.0) or no CUDA."""
    import torch
    memory = getattr(torch.cuda, "memory", None)
    pluggable = getattr(memory, "CUDAPluggableAllocator", None)
    if pluggable is None:
        raise RuntimeError(f"unimem.torch: PyTorch {torch.__version__} has no "
                           "torch.cuda.memory.CUDAPluggableAllocator (PyTorch 2.0 or later)")
    if not torch.cuda.is_available():
        raise RuntimeError("unimem.torch: PyTorch sees no CUDA device")
    allocator = pluggable(library_path(), ALLOC_FN, FREE_FN)
    memory.change_current_allocator(allocator)
    return allocator


def stats():
    """unimem's statistics of the allocator's manager, as Manager.stats() gives them."""
    names = [name for name, _ in _core.stats_fields()]
    # The C struct: each field is uint64_t or double (hit_rate, fragmentation), 8 bytes.
    fields = [(name, ctypes.c_double if name in ("hit_rate", "fragmentation") else ctypes.c_uint64)
              for name in names]
    struct = type("um_stats", (ctypes.Structure,), {"_fields_": fields})()
    lib = _library()
    st = lib.unimem_torch_stats(ctypes.byref(struct))
    if st != 0:
        raise RuntimeError(f"unimem.torch: {lib.unimem_torch_last_error().decode(errors='replace')}")
    return {name: getattr(struct, name) for name in names}


def live_blocks():
    """Blocks PyTorch holds from the allocator now."""
    return _library().unimem_torch_live()


def last_error():
    """The reason of this thread's last failed allocation ("" when none)."""
    return _library().unimem_torch_last_error().decode(errors="replace")
