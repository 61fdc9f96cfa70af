"""Manager.wrap_host and Manager.map_file: a Buffer over another object's memory or a file, zero-copy, with
the object held exported until the wrap's release has returned."""
import gc
import os
import weakref

import numpy
import pytest

import unimem


def test_a_wrap_is_the_objects_memory(cpu):
    ba = bytearray(b"hello world!")
    w = cpu.wrap_host(ba)
    assert (w.size, w.location, w.device.index, w.has_host_view) == (12, "host", 0, True)
    w.fill(ord("A"), 0, 5)
    assert ba == bytearray(b"AAAAA world!")
    ba[11] = ord("?")
    assert bytes(memoryview(w)) == b"AAAAA world?"
    w.copy_from(b"xy", offset=5)
    assert ba == bytearray(b"AAAAAxyorld?")
    out = bytearray(3)
    w.copy_to(out, offset=9)
    assert out == b"ld?"
    assert numpy.from_dlpack(w).__array_interface__["data"][0] == w.native()["host"]


def test_the_object_stays_exported_until_the_release_returned(cpu):
    ba = bytearray(16)
    w = cpu.wrap_host(ba)
    with pytest.raises(BufferError):
        ba.append(1)  # a bytearray cannot be resized while exported
    w.release()
    ba.append(1)
    assert len(ba) == 17


def test_a_dropped_object_lives_while_the_wrap_does(cpu):
    a = numpy.arange(8, dtype=numpy.uint8)
    gone = weakref.ref(a)
    w = cpu.wrap_host(a)
    del a
    gc.collect()
    assert gone() is not None  # the wrap holds it
    w.fill(7)
    assert bytes(memoryview(w)) == b"\x07" * 8
    w.release()
    gc.collect()
    assert gone() is None


def test_a_pending_copy_keeps_the_object_until_it_ends(ocl):
    src = bytearray(b"\x03" * (1 << 20))
    w = ocl.wrap_host(src)
    d = ocl.alloc(1 << 20, device=1)
    d.fill(9)
    ev = unimem.copy(w, d, 1 << 20, wait=False)  # device -> the wrap, queued
    assert isinstance(ev, unimem.Event)
    w.release()  # deferred while the copy is in flight: src stays exported
    assert w.released
    with pytest.raises(BufferError):
        src.append(0)
    ev.wait()  # the copy ended: the deferred release ran, the export went
    assert src == bytearray(b"\t" * (1 << 20))
    src.append(0)
    d.release()


def test_read_only_objects_and_the_readonly_flag(cpu):
    r = cpu.wrap_host(b"abcdef")
    assert memoryview(r).readonly
    with pytest.raises(unimem.InvalidState, match="read-only"):
        r.fill(0)
    with pytest.raises(unimem.InvalidState, match="read-only"):
        r.copy_from(b"zz")
    out = bytearray(6)
    r.copy_to(out)
    assert out == b"abcdef"
    r.release()
    ba = bytearray(b"writable")
    ro = cpu.wrap_host(ba, readonly=True)
    with pytest.raises(unimem.InvalidState):
        ro.fill(0)
    assert memoryview(ro).readonly and ba == bytearray(b"writable")
    ro.release()
    with pytest.raises((BufferError, TypeError)):
        cpu.wrap_host(b"bytes", readonly=False)  # writable asked of read-only memory


def test_refusals(cpu):
    a = numpy.arange(16, dtype=numpy.float32)
    with pytest.raises(unimem.InvalidArgument, match="not C-contiguous"):
        cpu.wrap_host(a[::2])
    with pytest.raises(unimem.InvalidArgument, match="no bytes"):
        cpu.wrap_host(bytearray())
    with pytest.raises(TypeError):
        cpu.wrap_host(12)
    ba = bytearray(4)
    cpu.close()
    with pytest.raises(unimem.InvalidState):
        cpu.wrap_host(ba)
    ba.append(0)  # the refused wrap left nothing exported


def test_close_lets_the_objects_go(cpu):
    ba = bytearray(32)
    w = cpu.wrap_host(ba)
    cpu.close()
    assert w.released
    ba.append(1)  # the export went with the wrap
    del w


def test_map_file_read_and_write(cpu, tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 100)
    r = cpu.map_file(str(path))
    assert (r.size, r.location) == (100, "host")
    assert memoryview(r).readonly and bytes(memoryview(r))[:3] == b"xxx"
    with pytest.raises(unimem.InvalidState, match="read-only"):
        r.fill(0)
    r.release()
    w = cpu.map_file(path, "rw")  # a path-like object too
    w.fill(ord("y"), 0, 3)
    w.copy_from(b"zz", offset=98)
    w.release()
    assert path.read_bytes() == b"yyy" + b"x" * 95 + b"zz"


def test_map_file_refusals(cpu, tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(unimem.InvalidArgument):
        cpu.map_file(str(empty))
    with pytest.raises(unimem.InvalidArgument, match="not a regular file"):
        cpu.map_file(str(tmp_path))
    with pytest.raises(unimem.NoDevice, match="cannot open"):
        cpu.map_file(str(tmp_path / "missing"))
    with pytest.raises(unimem.InvalidArgument):
        cpu.map_file(str(empty) + "x", "sideways")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(unimem.InvalidArgument):
        cpu.map_file(str(tmp_path / "fifo"))  # at once, without blocking on the open
