"""Buffer.view: typed views (dtype, shape, strides, offset) that NumPy and PyTorch take through DLPack and
NumPy through __array_interface__, zero-copy, with the buffer held while they live."""
import gc

import numpy
import pytest

import unimem

KINDS = [numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64,
         numpy.float16, numpy.float32, numpy.float64, numpy.complex64, numpy.complex128, numpy.bool_]


def filled(m, data):
    b = m.alloc(max(data.nbytes, 1), location="host")
    b.copy_from(data.tobytes())
    return b


@pytest.mark.parametrize("dtype", KINDS, ids=lambda d: numpy.dtype(d).name)
def test_every_number_type_round_trips_through_numpy(cpu, dtype):
    data = (numpy.arange(24) % 2).astype(dtype) if dtype is numpy.bool_ else numpy.arange(24).astype(dtype)
    b = filled(cpu, data)
    v = b.view(dtype, (2, 3, 4))
    assert (v.dtype, v.shape, v.ndim, v.offset) == (numpy.dtype(dtype), (2, 3, 4), 3, 0)
    # DLPack's bool (code 6) is newer than NumPy 1.24's from_dlpack: the array interface serves it there.
    old_bool = dtype is numpy.bool_ and tuple(int(x) for x in numpy.__version__.split(".")[:2]) < (1, 25)
    for a in ([] if old_bool else [numpy.from_dlpack(v)]) + [numpy.asarray(v)]:
        assert a.dtype == numpy.dtype(dtype) and a.shape == (2, 3, 4)
        assert (a == data.reshape(2, 3, 4)).all()
        assert a.__array_interface__["data"][0] == b.native()["host"]  # the buffer's memory


def test_torch_takes_the_types_it_has(cpu):
    torch = pytest.importorskip("torch")
    data = numpy.arange(12, dtype=numpy.float32)
    b = filled(cpu, data)
    # (bool, DLPack code 6, is newer than PyTorch 1.13's from_dlpack)
    for dt, tdt in (("float32", torch.float32), ("int16", torch.int16), ("uint8", torch.uint8),
                    ("float64", torch.float64), ("complex64", torch.complex64), ("int64", torch.int64)):
        n = 48 // numpy.dtype(dt).itemsize
        t = torch.from_dlpack(b.view(dt, (n,)))
        assert t.dtype == tdt and t.shape == (n,)
        assert t.data_ptr() == b.native()["host"]
    t = torch.from_dlpack(b.view("float32", (3, 4)))
    assert t[2, 1].item() == 9.0
    t[0, 0] = 42  # writes reach the buffer
    assert numpy.frombuffer(bytes(memoryview(b)), numpy.float32)[0] == 42


def test_strides_and_offsets_are_numpys(cpu):
    data = numpy.arange(64, dtype=numpy.int32)
    b = filled(cpu, data)
    want = numpy.ndarray((4, 3), numpy.int32, buffer=data, offset=8, strides=(32, 4))
    v = b.view("int32", (4, 3), strides=(32, 4), offset=8)
    assert v.strides == (32, 4)
    for a in (numpy.from_dlpack(v), numpy.asarray(v)):
        assert a.strides == (32, 4) and (a == want).all()
    col = b.view(numpy.int32, (8,), strides=(32,), offset=4)  # every eighth element from the second
    assert list(numpy.from_dlpack(col)) == list(range(1, 64, 8))
    assert b.view("int32", (4, 4)).strides == (16, 4)  # C order when none are given
    one = b.view("int32", (4, 1), strides=(16, 2))  # a dimension of one: its stride (even a partial one) is moot
    assert one.strides == (16, 4) and list(numpy.from_dlpack(one)[:, 0]) == [0, 4, 8, 12]
    assert b.view("int32").shape == (64,) and b.view("int32", offset=16).shape == (60,)


def test_empty_views(cpu):
    b = cpu.alloc(16, location="host")
    for shape in ((0,), (3, 0), (0, 5)):
        a = numpy.from_dlpack(b.view("float32", shape))
        assert a.shape == shape and a.size == 0
    assert numpy.asarray(b.view("uint8", (0,), offset=16)).shape == (0,)


def test_a_view_holds_its_buffer(cpu):
    b = filled(cpu, numpy.arange(4, dtype=numpy.float64))
    v = b.view("float64")
    a = numpy.asarray(v)
    del v
    b.release()  # deferred: the array's base is the view
    assert b.released and cpu.stats()["active_buffers"] == 1
    assert list(a) == [0.0, 1.0, 2.0, 3.0]
    del a
    gc.collect()
    assert cpu.stats()["active_buffers"] == 0
    with pytest.raises(unimem.InvalidState):
        b.view("float64")


def test_a_dlpack_array_outlives_its_view(cpu):
    b = filled(cpu, numpy.arange(4, dtype=numpy.int64))
    a = numpy.from_dlpack(b.view("int64", (2, 2)))
    gc.collect()
    b.release()
    assert cpu.stats()["active_buffers"] == 1 and a[1, 1] == 3
    del a
    gc.collect()
    assert cpu.stats()["active_buffers"] == 0


def test_read_only_wraps_give_read_only_arrays(cpu):
    w = cpu.wrap_host(numpy.arange(8, dtype=numpy.float32).tobytes())
    v = w.view("float32")
    a = numpy.asarray(v)
    assert not a.flags.writeable and a[7] == 7
    with pytest.raises(BufferError, match="read-only"):
        v.__dlpack__()  # a legacy capsule cannot say read-only
    cap = v.__dlpack__(max_version=(1, 0))
    assert cap is not None
    del a, v, cap
    w.release()


def test_copy_true_is_a_copy(cpu):
    b = filled(cpu, numpy.arange(8, dtype=numpy.int16))
    v = b.view("int16", (2, 4))


    class Copied:  # NumPy takes objects with __dlpack__, not capsules
        def __dlpack__(self, stream=None):
            return v.__dlpack__(copy=True)

        def __dlpack_device__(self):
            return v.__dlpack_device__()

    c = numpy.from_dlpack(Copied())
    b.fill(0)
    assert c.shape == (2, 4) and c[1, 3] == 7 and numpy.asarray(v)[1, 3] == 0


def test_device_memory_views(ocl):
    d = ocl.alloc(64, device=1)
    v = d.view("float32", (4, 4))
    assert v.__dlpack_device__()[0] == 4  # OpenCL
    with pytest.raises(AttributeError, match="not host-visible"):
        v.__array_interface__
    with pytest.raises((BufferError, RuntimeError)):
        numpy.from_dlpack(v)  # NumPy reads host memory only


def test_refusals(cpu):
    b = cpu.alloc(64, location="host")
    cases = [
        (lambda: b.view("O"), unimem.InvalidArgument, "not a number"),
        (lambda: b.view("datetime64[s]"), unimem.InvalidArgument, "not a number"),
        (lambda: b.view([("a", "i4"), ("b", "f4")]), unimem.InvalidArgument, "not a number"),
        (lambda: b.view(">f4" if numpy.little_endian else "<f4"), unimem.InvalidArgument, "byte order"),
        (lambda: b.view("float32", (-1,)), unimem.InvalidArgument, "negative"),
        (lambda: b.view("float32", (4, 4), strides=(16,)), unimem.InvalidArgument, "1 strides for 2"),
        (lambda: b.view("float32", (4,), strides=(6,)), unimem.InvalidArgument, "whole number"),
        (lambda: b.view("float32", (17,)), unimem.OutOfRange, "byte 68"),
        (lambda: b.view("float32", (4,), strides=(24,)), unimem.OutOfRange, "byte 76"),
        (lambda: b.view("float32", offset=2), unimem.InvalidArgument, "give a shape"),
        (lambda: b.view("float32", (1,), offset=65), unimem.OutOfRange, ""),
        (lambda: b.view("not a dtype"), TypeError, ""),
        (lambda: b.view("float32", "x"), TypeError, ""),
    ]
    for call, cls, text in cases:
        with pytest.raises(cls, match=text):
            call()
    assert b.view("float32", (4,), strides=(16,)).strides == (16,)  # the last element ends at byte 52
    b.release()
    assert cpu.stats()["active_buffers"] == 0  # no refused view held it
