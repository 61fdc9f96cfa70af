"""Buffer: allocation, attributes, the buffer protocol (zero-copy), release
deferred while views live."""

import array

import numpy
import pytest

import unimem


@pytest.mark.parametrize("location", ["host", "device", "pinned", "unified"])
def test_alloc_every_location_of_the_cpu(cpu, location):
    b = cpu.alloc(100, location=location, zero=True)
    assert (b.size, b.location, b.device.index) == (100, location, 0)
    assert b.has_host_view and not b.released and b.manager is cpu
    assert bytes(memoryview(b)) == bytes(100)
    assert repr(b) == f"<unimem.Buffer 100 bytes, device 0, {location}>"
    b.release()
    assert b.released and not b.has_host_view
    assert repr(b) == f"<unimem.Buffer 100 bytes, device 0, {location}, released>"
    assert (b.size, b.location) == (100, location)


def test_alloc_arguments(cpu):
    assert cpu.alloc(nbytes=8, device=cpu.devices[0], location="host", zero=False).size == 8
    assert cpu.alloc(8, 0, "host", True).size == 8
    cases = [
        (lambda: cpu.alloc(0), unimem.InvalidArgument),
        (lambda: cpu.alloc(-1), unimem.InvalidArgument),
        (lambda: cpu.alloc(1 << 64), unimem.Overflow),
        (lambda: cpu.alloc(1 << 62 + 1), unimem.OutOfMemory),
        (lambda: cpu.alloc(8, device=1), unimem.NoDevice),
        (lambda: cpu.alloc(8, device=-1), unimem.NoDevice),
        (lambda: cpu.alloc(8, device=1 << 80), unimem.NoDevice),
        (lambda: cpu.alloc(8, location="gpu"), unimem.InvalidArgument),
    ]
    for call, cls in cases:
        with pytest.raises(cls) as info:
            call()
        assert type(info.value) is cls
    for call in (lambda: cpu.alloc(), lambda: cpu.alloc(8.0), lambda: cpu.alloc("8"),
                 lambda: cpu.alloc(8, location=1), lambda: cpu.alloc(8, device="0"),
                 lambda: cpu.alloc(8, size=8), lambda: cpu.alloc(8, 0, "host", False, 1),
                 lambda: cpu.alloc(8, nbytes=8)):
        with pytest.raises(TypeError):
            call()


def test_host_location_on_a_device(ocl):
    # SPEC 5: "host" is every device's: pageable host memory with a view.
    with ocl.alloc(8, device=1, location="host") as b:
        assert b.device.index == 1 and b.location == "host"
        numpy.asarray(b)[:] = 9
        out = bytearray(8)
        b.copy_to(out)
        assert out == bytearray([9] * 8)


def test_not_supported_location(ocl):
    info = [d for d in ocl.devices if d.index == 1][0]
    if "unified" in info.locations:
        pytest.skip("this OpenCL device has fine-grained SVM")
    with pytest.raises(unimem.NotSupported):
        ocl.alloc(8, device=1, location="unified")


def test_numpy_and_memoryview_share_the_memory(cpu):
    b = cpu.alloc(16, location="host", zero=True)
    a = numpy.asarray(b)
    assert a.dtype == numpy.uint8 and a.shape == (16,) and a.flags.writeable
    v = memoryview(b)
    assert (v.format, v.itemsize, v.nbytes, v.readonly) == ("B", 1, 16, False)
    a[3] = 42
    assert v[3] == 42
    v[5] = 7
    assert a[5] == 7
    out = bytearray(16)
    b.copy_to(out)
    assert out[3] == 42 and out[5] == 7
    b.copy_from(bytes(range(16)))
    assert a.tolist() == list(range(16)) and v.tolist() == list(range(16))
    c = b.__array__(copy=True)
    c[0] = 99
    assert a[0] == 0 and b.__array__()[0] == 0 and b.__array__(numpy.uint8).dtype == numpy.uint8
    f = numpy.frombuffer(b, dtype=numpy.float32)
    f[0] = 1.5
    assert numpy.frombuffer(bytes(v[:4]), numpy.float32)[0] == 1.5


def test_no_host_view_is_a_clear_buffer_error(ocl):
    d = ocl.alloc(64, device=1)
    assert not d.has_host_view
    with pytest.raises(BufferError, match="has no host view; use copy_to"):
        memoryview(d)
    with pytest.raises(BufferError, match="has no host view"):
        numpy.asarray(d)  # not an object array holding the Buffer
    with pytest.raises(BufferError, match="has no host view"):
        numpy.frombuffer(d, numpy.uint8)
    d.release()
    with pytest.raises(BufferError, match="was released"):
        numpy.asarray(d)


def test_opencl_host_visible_locations(ocl):
    for location in ("pinned", "unified"):
        b = ocl.alloc(32, device=1, location=location, zero=True)
        assert b.has_host_view
        a = numpy.asarray(b)
        a[:] = 9
        out = bytearray(32)
        b.copy_to(out)
        assert out == bytes([9]) * 32


def test_release_waits_for_live_views(cpu):
    b = cpu.alloc(64, location="host")
    b.fill(5)
    view = numpy.asarray(b)
    mv = memoryview(b)
    before = cpu.stats()
    b.release()
    assert b.released
    # The block is not back in the pool: no release counted, still in use.
    s = cpu.stats()
    assert (s["releases"], s["active_buffers"]) == (before["releases"], 1)
    other = cpu.alloc(64, location="host")  # may not take b's block
    other.fill(9)
    assert view.tolist() == [5] * 64 and mv.tolist() == [5] * 64
    with pytest.raises(unimem.InvalidState):
        b.fill(1)
    with pytest.raises(BufferError, match="released"):
        memoryview(b)
    del view
    assert cpu.stats()["releases"] == before["releases"]
    mv.release()
    s = cpu.stats()
    assert (s["releases"], s["active_buffers"]) == (before["releases"] + 1, 1)


def test_release_twice_and_context_manager(cpu):
    b = cpu.alloc(8)
    b.release()
    b.release()
    with cpu.alloc(8) as c:
        assert not c.released
    assert c.released
    with pytest.raises(unimem.InvalidState, match="was released"):
        c.copy_from(b"x")
    with pytest.raises(unimem.InvalidState):
        c.__enter__()


def test_buffer_dropped_is_released(cpu):
    cpu.alloc(8)
    s = cpu.stats()
    assert (s["allocations"], s["releases"], s["active_buffers"]) == (1, 1, 0)


def test_buffers_cannot_be_made_directly():
    with pytest.raises(TypeError):
        unimem.Buffer()
    with pytest.raises(TypeError):
        unimem.Event()
    with pytest.raises(TypeError):
        unimem.Mapping()


def test_array_module_objects(cpu):
    b = cpu.alloc(16, location="host")
    b.copy_from(array.array("i", [1, 2, 3, 4]))
    out = array.array("i", [0, 0, 0, 0])
    b.copy_to(out)
    assert out.tolist() == [1, 2, 3, 4]
