"""Buffer.map: modes, write-back, mappings outliving their with block."""

import ctypes

import numpy
import pytest

import unimem


def test_map_modes_on_a_device_buffer(ocl):
    d = ocl.alloc(64, device=1)
    d.copy_from(bytes(range(64)))
    with d.map("r") as view:
        assert isinstance(view, memoryview) and view.readonly
        assert bytes(view) == bytes(range(64))
        with pytest.raises(TypeError):
            view[0] = 1
    with d.map("rw", offset=8, nbytes=8) as view:
        assert (view.nbytes, view.readonly) == (8, False)
        assert bytes(view) == bytes(range(8, 16))
        view[:] = b"\xee" * 8
    out = bytearray(64)
    d.copy_to(out)  # the write reached the device
    assert out[8:16] == b"\xee" * 8 and out[16] == 16
    with d.map("discard") as view:
        numpy.frombuffer(view, numpy.uint8)[:] = 1
    with d.map("w", offset=60) as view:
        assert bytes(view) == b"\x01" * 4  # "w" fetches the current contents
        view[0] = 2
    d.copy_to(out)
    assert out == b"\x01" * 60 + b"\x02" + b"\x01" * 3


def test_map_of_a_host_buffer_is_its_memory(cpu):
    b = cpu.alloc(16, location="host", zero=True)
    with b.map() as view:
        view[0] = 9
        assert numpy.asarray(b)[0] == 9


def test_map_arguments(cpu):
    b = cpu.alloc(16)
    cases = [
        (lambda: b.map("x"), unimem.InvalidArgument),
        (lambda: b.map("r", 16), unimem.OutOfRange),
        (lambda: b.map("r", 8, 9), unimem.OutOfRange),
        (lambda: b.map("r", 0, 0), unimem.InvalidArgument),
        (lambda: b.map("r", -1), unimem.InvalidArgument),
    ]
    for call, cls in cases:
        with pytest.raises(cls) as info:
            call()
        assert type(info.value) is cls
    with pytest.raises(TypeError):
        b.map(1)


def test_one_mapping_at_a_time(cpu):
    b = cpu.alloc(16)
    with b.map("r"):
        with pytest.raises(unimem.InvalidState, match="already mapped"):
            b.map("r")
    with b.map("r"):
        pass


def test_a_view_that_outlives_the_block_is_a_buffer_error_at_its_exit(ocl):
    d = ocl.alloc(16, device=1)
    d.fill(0)
    mapping = d.map("rw")
    with pytest.raises(BufferError, match="views made from the mapping .* outlive its with block"):
        with mapping as view:
            arr = numpy.frombuffer(view, numpy.uint8)
            arr[:] = 5
    assert not mapping.ended  # arr still points into the mapped memory
    with pytest.raises(unimem.InvalidState):
        d.map("r")
    out = bytearray(16)
    arr[0] = 6
    del arr
    assert mapping.ended  # the last view is gone: unmapped, written back
    d.copy_to(out)
    assert out == b"\x06" + b"\x05" * 15
    with pytest.raises(unimem.InvalidState, match="has ended"):
        mapping.__enter__()
    with pytest.raises(BufferError, match="has ended"):
        memoryview(mapping)


def test_views_released_inside_the_block_end_it_at_the_exit(ocl):
    d = ocl.alloc(16, device=1)
    d.fill(0)
    with d.map("rw") as view:
        arr = numpy.frombuffer(view, numpy.uint8)
        part = view[4:8]
        arr[:] = 7
        del arr
        part.release()
    out = bytearray(16)
    d.copy_to(out)  # unmapped at the exit: the copy works
    assert out == b"\x07" * 16


def test_two_views_outliving_the_block_and_an_exception_leaving_it(ocl):
    d = ocl.alloc(16, device=1)
    with pytest.raises(BufferError, match="views made from the mapping .* outlive its with block"):
        with d.map("w") as view:
            a, b = numpy.frombuffer(view, numpy.uint8), numpy.frombuffer(view, numpy.uint8)
    del a, b
    with d.map("r"):  # the last view's release ended it
        pass
    # The block's own exception goes on; the mapping ends with the view.
    with pytest.raises(KeyError):
        with d.map("w") as view:
            c = numpy.frombuffer(view, numpy.uint8)
            raise KeyError("the body's")
    with pytest.raises(unimem.InvalidState):
        d.map("r")
    del c
    with d.map("r"):
        pass


def test_mapping_without_with_ends_when_dropped(cpu):
    b = cpu.alloc(16)
    m = b.map("r")
    assert m.nbytes == 16 and m.buffer is b and not m.ended
    assert bytes(memoryview(m)) == bytes(memoryview(b))
    del m
    with b.map("r"):
        pass


def test_read_mapping_refuses_writable_views(cpu):
    b = cpu.alloc(16)
    m = b.map("r")
    with pytest.raises(TypeError, match="not writable"):
        (ctypes.c_char * 16).from_buffer(m)  # asks for a writable buffer: refused
    with pytest.raises(TypeError, match="read-only"):
        memoryview(m)[0] = 1
    m.__exit__(None, None, None)
    assert m.ended


def test_release_while_mapped_is_deferred(ocl):
    d = ocl.alloc(16, device=1)
    d.fill(1)
    with d.map("rw") as view:
        d.release()
        assert d.released
        view[0] = 2  # still mapped memory
        assert ocl.stats()["active_buffers"] == 1
    assert ocl.stats()["active_buffers"] == 0
