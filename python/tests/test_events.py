"""Asynchronous operations: Events, and the objects they keep alive."""

import gc
import weakref

import numpy
import pytest

import unimem


def test_async_copies_return_events(cpu):
    b = cpu.alloc(16, location="host")
    ev = b.copy_from(b"0123456789abcdef", wait=False)
    assert isinstance(ev, unimem.Event)
    assert ev.wait() is None
    assert ev.done and repr(ev) == "<unimem.Event done, UM_OK>"
    assert ev.wait() is None  # again: the same answer
    out = bytearray(16)
    ev = b.copy_to(out, wait=False)
    ev.wait()
    assert out == b"0123456789abcdef"
    ev = b.fill(7, wait=False)
    ev.wait()
    ev = unimem.copy(out, b, 16, wait=False)
    while not ev.done:
        pass
    assert out == b"\x07" * 16


def test_event_keeps_a_temporary_destination_alive(ocl):
    d = ocl.alloc(1 << 20, device=1)
    d.fill(3)
    dst = numpy.zeros(1 << 20, numpy.uint8)
    ref = weakref.ref(dst)
    ev = d.copy_to(dst, wait=False)
    del dst
    gc.collect()
    assert ref() is not None  # held by the event until it is seen done
    ev.wait()
    assert ref() is None  # let go once done
    src = bytearray(b"\x05" * (1 << 20))
    ev = d.copy_from(src, wait=False)
    with pytest.raises(BufferError):
        src.extend(b"x")  # exported to the copy: cannot move
    ev.wait()
    src.extend(b"x")


def test_pending_events_dropped_at_once(ocl):
    d = ocl.alloc(1 << 20, device=1)
    d.fill(9)
    for _ in range(20):
        # Event and bytearray dropped at once: the drop does not wait, the
        # bytearray lives on until the copy is seen done.
        d.copy_to(bytearray(1 << 20), wait=False)
    out = bytearray(4)
    d.copy_to(out, offset=100)
    assert out == b"\x09" * 4


def test_event_keeps_buffers(cpu):
    b = cpu.alloc(1 << 20)
    ref = weakref.ref(b)
    ev = b.fill(1, wait=False)
    del b
    assert ref() is not None  # until the event is seen done
    ev.wait()
    gc.collect()
    assert ref() is None


def test_failed_async_copy_raises_at_issue(cpu):
    b = cpu.alloc(8)
    with pytest.raises(unimem.OutOfRange):
        b.copy_from(bytes(9), wait=False)


def test_close_waits_for_events(ocl):
    d = ocl.alloc(1 << 20, device=1)
    out = numpy.zeros(1 << 20, numpy.uint8)
    d.fill(4)
    ev = d.copy_to(out, wait=False)
    ocl.close()
    assert ev.done
    ev.wait()
    assert out[0] == 4 and out[-1] == 4
