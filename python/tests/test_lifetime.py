"""Lifetimes: views outliving their buffer and manager, close() with live
objects, several threads working on one manager."""

import gc
import threading
import weakref

import numpy
import pytest

import unimem


def test_view_outlives_buffer_and_manager():
    m = unimem.Manager(backends="cpu")
    b = m.alloc(4096, location="host")
    b.fill(0x5A)
    arr = numpy.asarray(b)
    mv = memoryview(b)[100:200]
    mref = weakref.ref(m)
    b.release()
    m.close()
    del b, m
    gc.collect()
    assert mref() is not None  # the views keep the manager object, and its memory
    assert arr[0] == 0x5A and arr.sum() == 0x5A * 4096 and bytes(mv) == b"\x5a" * 100
    arr[:] = 1  # still writable, still ours
    assert mv[0] == 1
    del arr
    gc.collect()
    assert mref() is not None
    mv.release()
    gc.collect()
    assert mref() is None


def test_close_with_live_views_frees_later():
    m = unimem.Manager(backends="cpu")
    b = m.alloc(64, location="pinned")
    keep = m.alloc(64)
    arr = numpy.asarray(b)
    arr[:] = 3
    m.close()
    assert b.released and keep.released
    with pytest.raises(unimem.InvalidState, match="manager is closed"):
        keep.copy_to(bytearray(64))
    with pytest.raises(BufferError, match="released"):
        numpy.asarray(b)
    assert arr.tolist() == [3] * 64
    del arr  # now the manager's C side is destroyed


def test_event_and_mapping_outlive_close(ocl):
    d = ocl.alloc(256, device=1)
    d.fill(8)
    mapping = d.map("rw")
    view = mapping.__enter__()
    other = ocl.alloc(1 << 20, device=2)
    ev = other.fill(9, wait=False)
    ocl.close()
    assert d.released and other.released and not mapping.ended
    assert ev.done
    ev.wait()
    view[0] = 1
    mapping.__exit__(None, None, None)
    assert mapping.ended


def test_many_threads_one_manager():
    m = unimem.Manager(backends="cpu,opencl")
    devices = [d.index for d in m.devices]
    errors = []

    def work(seed):
        rng = numpy.random.default_rng(seed)
        try:
            for i in range(200):
                dev = devices[i % len(devices)]
                b = m.alloc(int(rng.integers(1, 8192)), device=dev)
                data = rng.integers(0, 255, b.size, dtype=numpy.uint8)
                b.copy_from(data)
                out = numpy.empty_like(data)
                ev = b.copy_to(out, wait=False)
                ev.wait()
                assert numpy.array_equal(out, data)
                b.release()
        except Exception as e:  # reported below, with the thread's seed
            errors.append((seed, e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m.close()
    assert errors == []


def test_release_and_close_race_with_copies():
    """Copies run without the GIL while other threads release the buffer and
    close the manager: the copies finish or fail with InvalidState, never
    touch freed memory."""
    for round_ in range(20):
        m = unimem.Manager(backends="cpu")
        bufs = [m.alloc(1 << 16, location="host") for _ in range(4)]
        src = numpy.ones(1 << 16, numpy.uint8)
        outcomes = []
        start = threading.Barrier(3)

        def copier():
            start.wait()
            for _ in range(50):
                for b in bufs:
                    try:
                        b.copy_from(src)
                        outcomes.append("ok")
                    except unimem.InvalidState:
                        outcomes.append("state")

        def releaser():
            start.wait()
            for b in bufs[:2]:
                b.release()

        threads = [threading.Thread(target=copier), threading.Thread(target=releaser)]
        for t in threads:
            t.start()
        start.wait()
        if round_ % 2:
            m.close()
        for t in threads:
            t.join()
        m.close()
        assert set(outcomes) <= {"ok", "state"} and len(outcomes) == 200
        assert all(b.released for b in bufs)


def test_weakref_to_buffer(cpu):
    b = cpu.alloc(8)
    r = weakref.ref(b)
    assert r() is b
    del b
    assert r() is None


def test_close_while_async_copies_are_being_issued():
    """close() runs while another thread is inside an asynchronous copy
    (without the GIL): the copy's event must still be counted when the
    buffer is unpinned, so the manager is destroyed only after it."""
    for opencl, wait_each in ((False, False), (False, True), (True, False), (True, True)):
        for _ in range(10):
            m = unimem.Manager(backends="cpu,opencl" if opencl else "cpu")
            dev = len(m.devices) - 1
            b = m.alloc(1 << 16, device=dev)
            src = bytearray(1 << 16)
            events, started = [], threading.Event()

            def issue():
                try:
                    while True:
                        ev = b.copy_from(src, wait=False)
                        if wait_each:  # nothing left for close() to wait for
                            ev.wait()
                        else:
                            events.append(ev)
                        started.set()
                except unimem.InvalidState:
                    started.set()

            t = threading.Thread(target=issue)
            t.start()
            started.wait()
            m.close()
            t.join()
            for ev in events:
                ev.wait()
                assert ev.done
