"""DLPack both ways (SPEC §9): Buffer.__dlpack__ / __dlpack_device__ as the
array API standard has them, consumed by NumPy and PyTorch zero-copy, and
unimem.from_dlpack of NumPy arrays, PyTorch tensors, unimem buffers and raw
capsules, each producer's deleter run exactly once."""

import gc
import sys
import weakref

import numpy
import pytest

import unimem
from conftest import opencl_manager
from dlpack_producer import Producer, capsule_name, host_bytes

try:
    import torch
except ImportError:  # python3-torch (Debian) installs it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="SKIP: PyTorch is not installed (apt-get install python3-torch)")


# ---- Export ------------------------------------------------------------------


def test_numpy_from_dlpack_shares_the_memory(cpu):
    b = cpu.alloc(4096, location="device", zero=True)
    a = numpy.from_dlpack(b)
    assert a.dtype == numpy.uint8 and a.shape == (4096,)
    assert a.ctypes.data == b.native()["host"], "zero-copy: the buffer's own memory"
    b.fill(0x5A, 100, 10)
    assert list(a[98:112]) == [0, 0] + [0x5A] * 10 + [0, 0]
    b.copy_from(bytes(range(16)), offset=4000)
    assert bytes(a[4000:4016]) == bytes(range(16))


def test_capsule_names_and_versions(cpu):
    b = cpu.alloc(64)
    assert capsule_name(b.__dlpack__()) == "dltensor"
    assert capsule_name(b.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(b.__dlpack__(max_version=(1, 7))) == "dltensor_versioned"
    assert capsule_name(b.__dlpack__(max_version=(2, 0))) == "dltensor_versioned"
    assert capsule_name(b.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(b.__dlpack__(max_version=None, stream=None, dl_device=(1, 0), copy=False)) == "dltensor"
    assert capsule_name(b.__dlpack__(stream=-1)) == "dltensor"
    gc.collect()
    assert cpu.stats()["active_buffers"] == 1, "unconsumed capsules deleted their tensors"


def test_dlpack_device(cpu):
    assert cpu.alloc(16).__dlpack_device__() == (1, 0)
    for loc in ("host", "pinned", "unified"):
        try:
            b = cpu.alloc(16, location=loc)
        except unimem.Error:
            continue
        assert b.__dlpack_device__() == (1, 0)


def test_bad_dlpack_arguments(cpu):
    b = cpu.alloc(64)
    with pytest.raises(TypeError):
        b.__dlpack__(None)  # keyword-only
    with pytest.raises(TypeError):
        b.__dlpack__(max_version=1)
    with pytest.raises(TypeError):
        b.__dlpack__(max_version=(1, "0"))
    with pytest.raises(TypeError):
        b.__dlpack__(stream="s")
    with pytest.raises(ValueError):
        b.__dlpack__(stream=1)  # no streams on the CPU
    with pytest.raises(TypeError):
        b.__dlpack__(dl_device=1)
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(1, 5))
    with pytest.raises(TypeError):
        b.__dlpack__(nosuch=1)
    b.release()
    with pytest.raises(unimem.InvalidState):
        b.__dlpack__()
    with pytest.raises(unimem.InvalidState):
        b.__dlpack_device__()
    assert cpu.stats()["active_buffers"] == 0


def test_copy_true_gives_separate_memory(cpu):
    b = cpu.alloc(32)
    b.fill(1)
    w = unimem.from_dlpack(cpu, b.__dlpack__(max_version=(1, 0), copy=True))
    assert bytes(numpy.asarray(w)) == b"\x01" * 32
    b.fill(2)
    assert bytes(numpy.asarray(w)) == b"\x01" * 32, "a copy"
    w.release()
    b.release()
    gc.collect()
    assert cpu.stats()["active_buffers"] == 0


def test_released_while_numpy_holds_it_stays_alive(cpu):
    b = cpu.alloc(1 << 16)
    b.fill(9)
    a = numpy.from_dlpack(b)
    b.release()
    assert b.released
    assert cpu.stats()["active_buffers"] == 1
    assert int(a.sum()) == 9 * (1 << 16), "the memory is still the array's"
    del a
    gc.collect()
    assert cpu.stats()["active_buffers"] == 0


def test_close_while_numpy_holds_it_defers_the_destroy():
    m = unimem.Manager(backends="cpu")
    b = m.alloc(1024)
    b.fill(3)
    a = numpy.from_dlpack(b)
    m.close()
    assert m.closed and b.released
    assert int(a[1023]) == 3
    del a, b
    gc.collect()  # the deleter gives the last handle up: the manager is destroyed, no leak reported


def test_unconsumed_capsule_releases_its_hold(cpu):
    b = cpu.alloc(64)
    cap = b.__dlpack__()
    b.release()
    assert cpu.stats()["active_buffers"] == 1
    del cap
    gc.collect()
    assert cpu.stats()["active_buffers"] == 0


def test_read_only_buffer_exports_versioned_only(cpu):
    src = Producer(host_bytes(16, 4), versioned=True, flags=1)
    ro = unimem.from_dlpack(cpu, src.capsule())
    with pytest.raises(BufferError, match="read-only"):
        ro.__dlpack__()
    view = memoryview(ro)
    assert view.readonly
    with pytest.raises(TypeError):
        view[0] = 1
    view.release()
    with pytest.raises(unimem.InvalidState):
        ro.fill(1)
    again = unimem.from_dlpack(cpu, ro.__dlpack__(max_version=(1, 0)))
    with pytest.raises(unimem.InvalidState):
        again.fill(1)
    again.release()
    ro.release()
    gc.collect()
    assert src.deleted == 1


def test_opencl_device_buffers(ocl):
    d = ocl.alloc(4096, device=1)
    assert d.__dlpack_device__() == (4, 0)
    if len(ocl.devices) > 2:
        assert ocl.alloc(64, device=2).__dlpack_device__() == (4, 1)
    with pytest.raises(BufferError):
        d.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(ValueError):
        d.__dlpack__(stream=3)
    d.copy_from(bytes(range(256)) * 16)
    # The host copy dl_device=(1, 0) asks for, readable by NumPy.
    host = numpy.from_dlpack(unimem.from_dlpack(ocl, d.__dlpack__(dl_device=(1, 0))))
    assert bytes(host) == bytes(range(256)) * 16
    # The cl_mem itself, imported back onto the same device.
    w = unimem.from_dlpack(ocl, d)
    assert w.device.index == 1 and w.location == "device"
    assert w.native()["cl_mem"] == d.native()["cl_mem"]
    w.fill(0xEE, 0, 4)
    out = bytearray(4)
    d.copy_to(out)
    assert out == b"\xee" * 4


# ---- Consumers: PyTorch ----------------------------------------------------------


@needs_torch
def test_torch_from_dlpack_shares_the_memory(cpu):
    b = cpu.alloc(64)
    b.fill(0)
    t = torch.from_dlpack(b)
    assert t.dtype == torch.uint8 and t.shape == (64,)
    assert t.data_ptr() == b.native()["host"]
    t[3] = 200  # PyTorch writes, unimem reads
    out = bytearray(4)
    b.copy_to(out)
    assert out == bytes([0, 0, 0, 200])
    b.fill(7, 10, 2)  # unimem writes, PyTorch reads
    assert t[10:12].tolist() == [7, 7]
    b.release()
    assert t[3].item() == 200
    del t
    gc.collect()
    assert cpu.stats()["active_buffers"] == 0


# ---- Import ------------------------------------------------------------------------


def test_from_dlpack_of_numpy_is_zero_copy_and_lets_go_once(cpu):
    x = numpy.arange(256, dtype=numpy.float64)
    before = sys.getrefcount(x)
    w = unimem.from_dlpack(cpu, x)
    assert w.size == x.nbytes and w.location == "host" and w.device.index == 0
    assert w.native()["host"] == x.ctypes.data
    assert sys.getrefcount(x) == before + 1, "the tensor holds the array"
    w.copy_from(numpy.full(256, 2.5))
    assert x[255] == 2.5
    x[0] = -1.0
    assert numpy.frombuffer(memoryview(w), numpy.float64)[0] == -1.0
    w.release()
    assert sys.getrefcount(x) == before, "the deleter ran exactly once"


@needs_torch
def test_from_dlpack_of_torch_is_zero_copy_and_lets_go_once(cpu):
    # What PyTorch's export holds while a consumer has the tensor is its own
    # business: the C++ tensor alone (1.13: the Python object's count is
    # unchanged), or the Python object too (2.11: one more reference until
    # the deleter runs). What unimem owes is the same on both: zero copy,
    # the producer kept alive while the buffer is, and the deleter run
    # exactly once at the release.
    t = torch.arange(64, dtype=torch.int32)
    before = sys.getrefcount(t)
    w = unimem.from_dlpack(cpu, t)
    assert w.native()["host"] == t.data_ptr() and w.size == 256
    w.fill(0, 0, 4)
    assert t[0].item() == 0
    t[63] = -5
    assert numpy.frombuffer(memoryview(w), numpy.int32)[63] == -5
    assert sys.getrefcount(t) - before in (0, 1)
    w.release()
    gc.collect()
    # A deleter never run leaves PyTorch's reference (2.11) or its C++
    # tensor (1.13, the weak reference below) behind; one run twice drops a
    # reference PyTorch did not take (2.11), or frees its C++ tensor twice
    # (1.13: the ASan build runs this test).
    assert sys.getrefcount(t) == before, "the release ran PyTorch's deleter exactly once"
    w.release()
    assert sys.getrefcount(t) == before, "a second release is no second deleter"

    # The producer outlives its Python name while the buffer holds it, and
    # is freed once both sides let go. PyTorch keeps a tensor's Python
    # object alive as long as its C++ tensor lives, so the weak reference
    # dies exactly when PyTorch's export was let go, on either version.
    t = torch.arange(64, dtype=torch.int32)
    gone = weakref.ref(t)
    w = unimem.from_dlpack(cpu, t)
    t[5] = 42
    del t
    gc.collect()
    assert gone() is not None, "the buffer keeps the producer's tensor"
    assert numpy.frombuffer(memoryview(w), numpy.int32)[5] == 42
    w.release()
    gc.collect()
    assert gone() is None, "the release let go of the producer's tensor"


def test_from_dlpack_of_a_unimem_buffer(cpu):
    b = cpu.alloc(128)
    w = unimem.from_dlpack(cpu, b)
    assert w.native()["host"] == b.native()["host"]
    b.release()
    w.fill(1)
    assert cpu.stats()["active_buffers"] == 2
    w.release()
    gc.collect()
    assert cpu.stats()["active_buffers"] == 0


def test_from_dlpack_of_raw_capsules_runs_each_deleter_once(cpu):
    for versioned in (False, True):
        p = Producer(host_bytes(100, 1), versioned=versioned)
        cap = p.capsule()
        w = unimem.from_dlpack(cpu, cap)
        assert capsule_name(cap).startswith("used_")
        assert w.size == 100 and p.deleted == 0
        del cap
        gc.collect()
        assert p.deleted == 0, "the buffer owns the tensor, not the capsule"
        w.release()
        assert p.deleted == 1
        w.release()
        assert p.deleted == 1


def test_from_dlpack_objects_with_dlpack_methods(cpu):
    p = Producer(host_bytes(8, 6), versioned=True, shape=[2, 4])
    w = unimem.from_dlpack(cpu, p)
    assert bytes(memoryview(w)) == b"\x06" * 8
    w.release()
    assert p.deleted == 1


def test_from_dlpack_closing_the_manager_runs_the_deleter(cpu):
    p = Producer(host_bytes(8))
    m = unimem.Manager(backends="cpu")
    w = unimem.from_dlpack(m, p.capsule())
    m.close()
    assert w.released and p.deleted == 1


@pytest.mark.parametrize("change, error", [
    (dict(strides=[2]), unimem.NotSupported),                   # every other byte
    (dict(shape=[4, 2], strides=[1, 4]), unimem.NotSupported),  # Fortran order
    (dict(device=(7, 0)), unimem.NotSupported),                 # Vulkan
    (dict(device=(2, 0)), unimem.NoDevice),                     # CUDA, on a cpu-only manager
    (dict(device=(4, 0)), unimem.NoDevice),                     # OpenCL, idem
    (dict(dtype=(1, 4, 1)), unimem.NotSupported),               # half bytes
    (dict(dtype=(1, 0, 1)), unimem.InvalidArgument),
    (dict(shape=[0]), unimem.InvalidArgument),
    (dict(shape=[-8]), unimem.InvalidArgument),
    (dict(data=0), unimem.InvalidArgument),
    (dict(shape=[2 ** 62, 4]), unimem.Overflow),
    (dict(versioned=True, version=(2, 0)), unimem.NotSupported),
])
def test_from_dlpack_bad_tensors(cpu, change, error):
    p = Producer(host_bytes(8), **change)
    cap = p.capsule()
    with pytest.raises(error):
        unimem.from_dlpack(cpu, cap)
    assert not capsule_name(cap).startswith("used_"), "a tensor refused stays the producer's"
    assert p.deleted == 0
    assert cpu.stats()["active_buffers"] == 0


def test_from_dlpack_bad_arguments(cpu):
    with pytest.raises(TypeError):
        unimem.from_dlpack(numpy.zeros(3), cpu)
    with pytest.raises(TypeError):
        unimem.from_dlpack(cpu, [1, 2, 3])
    with pytest.raises(TypeError):
        unimem.from_dlpack(cpu)
    with pytest.raises(unimem.NotSupported):
        unimem.from_dlpack(cpu, numpy.zeros(8)[::2])
    cap = cpu.alloc(8).__dlpack__()
    unimem.from_dlpack(cpu, cap).release()
    with pytest.raises(BufferError):
        unimem.from_dlpack(cpu, cap)

    class Liar:
        def __dlpack__(self, **kwargs):
            return 42
    with pytest.raises(TypeError):
        unimem.from_dlpack(cpu, Liar())
    m = unimem.Manager(backends="cpu")
    m.close()
    with pytest.raises(unimem.InvalidState):
        unimem.from_dlpack(m, numpy.zeros(8))


def test_opencl_import_needs_an_opencl_manager():
    m = opencl_manager()
    try:
        d = m.alloc(256, device=1)
        with unimem.Manager(backends="cpu") as other:
            with pytest.raises(unimem.NoDevice):
                unimem.from_dlpack(other, d)
        assert m.stats()["active_buffers"] == 1, "the refused tensor was deleted by its capsule"
    finally:
        m.close()
