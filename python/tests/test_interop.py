"""The caller's own kernels on unimem buffers from Python (SPEC §8): native
handles, pyopencl objects over them, and the access bracket (Buffer.access,
unimem.access over several buffers) ordering a pyopencl kernel between
unimem's own copies, result checked; Buffer.release_after holding a block
back from the pool until a pyopencl event completed."""

import gc
import time

import numpy
import pytest

import unimem

try:
    import pyopencl
except ImportError:  # python3-pyopencl (Debian) installs it
    pyopencl = None

needs_pyopencl = pytest.mark.skipif(
    pyopencl is None, reason="SKIP: pyopencl is not installed (apt-get install python3-pyopencl)")

KERNELS = """
__kernel void axpb(__global float *x, float a, float b) {
  size_t i = get_global_id(0); x[i] = a * x[i] + b;
}
__kernel void add(__global const float *a, __global const float *b, __global float *c) {
  size_t i = get_global_id(0); c[i] = a[i] + b[i];
}
"""


def test_native_handles(cpu):
    n = cpu.native(0)
    assert n["backend"] == "cpu" and n["cu_device"] == -1
    assert set(n) == {"backend", "cl_platform", "cl_device", "cl_context", "cl_queue", "cu_device", "cu_context",
                      "cu_stream"}
    b = cpu.alloc(64)
    bn = b.native()
    assert set(bn) == {"host", "cl_mem", "svm", "cu_ptr", "offset"}
    assert bn["host"] == numpy.asarray(b).ctypes.data and bn["cl_mem"] is None and bn["cu_ptr"] == 0
    with pytest.raises(unimem.NoDevice):
        cpu.native(5)
    b.release()
    with pytest.raises(unimem.InvalidState):
        b.native()


def test_opencl_native_handles(ocl):
    n = ocl.native(1)
    assert n["backend"] == "opencl"
    assert n["cl_context"] and n["cl_queue"] and n["cl_device"] and n["cl_platform"]
    assert ocl.alloc(256, device=1).native()["cl_mem"]


def test_access_on_the_cpu_device(cpu):
    b = cpu.alloc(1 << 20)
    ev = b.fill(1, wait=False)
    with b.access("rw") as ac:
        assert ac.open
        assert ac.wait_event is None, "the cpu device's wait happens at the beginning"
        assert ac.wait_for == []
        numpy.asarray(b)[:] = 5  # the caller's own work, on the host
    assert not ac.open
    ev.wait()
    assert int(numpy.asarray(b)[-1]) == 5


def test_access_misuse(cpu):
    b = cpu.alloc(64)
    ac = b.access("r")
    with pytest.raises(unimem.InvalidState):
        ac.done = None  # not begun
    with ac:
        with pytest.raises(unimem.InvalidState):
            b.access("rw").__enter__()  # a second bracket on b
        with pytest.raises(unimem.InvalidState):
            b.map("r")
        with pytest.raises(TypeError):
            ac.done = "event"
        with pytest.raises(unimem.InvalidState):
            ac.__enter__()
    with pytest.raises(unimem.InvalidState):
        ac.__enter__()
    ac.end()  # ended already: nothing
    with pytest.raises(unimem.InvalidArgument):
        b.access("x")
    with pytest.raises(TypeError):
        b.access(1)
    # A done event on the cpu device (which has none): the bracket ends, the error says why.
    class FakeEvent:
        int_ptr = 12345
    with pytest.raises(unimem.InvalidArgument):
        with b.access("rw") as ac2:
            with pytest.raises(TypeError):
                ac2.done = 12345  # a bare address is refused
            ac2.done = FakeEvent()
    assert not ac2.open
    with b.access("rw"):
        pass


def test_release_inside_an_access_waits_for_its_end(cpu):
    b = cpu.alloc(64)
    with b.access("rw"):
        b.release()
        assert b.released
        assert cpu.stats()["active_buffers"] == 1
    assert cpu.stats()["active_buffers"] == 0


def test_access_dropped_open_ends(cpu):
    b = cpu.alloc(64)
    ac = b.access("rw")
    ac.__enter__()
    del ac
    gc.collect()
    b.fill(1)  # would wait forever behind a bracket left open


def test_pyopencl_needs_opencl_memory(cpu):
    with pytest.raises(unimem.NotSupported):
        cpu.alloc(64).to_pyopencl()
    with pytest.raises(unimem.NotSupported):
        cpu.pyopencl_queue(0)


@needs_pyopencl
def test_pyopencl_kernel_between_unimem_copies(ocl):
    n = 1 << 18
    queue = ocl.pyopencl_queue(1)
    assert queue.context.int_ptr == ocl.native(1)["cl_context"]
    prog = pyopencl.Program(queue.context, KERNELS).build()
    x = numpy.arange(n, dtype=numpy.float32)
    y = numpy.full(n, 0.5, dtype=numpy.float32)
    a, b, c = (ocl.alloc(x.nbytes, device=1) for _ in range(3))
    assert a.to_pyopencl().int_ptr == a.native()["cl_mem"]
    ev_a = a.copy_from(x, wait=False)  # nothing waits on the host from here on
    ev_b = b.copy_from(y, wait=False)
    with a.access("rw") as ac:
        done = prog.axpb(queue, (n,), None, a.to_pyopencl(), numpy.float32(3), numpy.float32(1),
                         wait_for=ac.wait_for)
        ac.done = done
    with a.access("r") as ra, b.access("r") as rb, c.access("discard") as wc:
        done = prog.add(queue, (n,), None, a.to_pyopencl(), b.to_pyopencl(), c.to_pyopencl(),
                        wait_for=ra.wait_for + rb.wait_for + wc.wait_for)
        ra.done = rb.done = wc.done = done
    out = numpy.empty_like(x)
    c.copy_to(out)  # ordered after the kernel by unimem
    assert numpy.array_equal(out, 3 * x + 1 + 0.5)
    ev_a.wait()
    ev_b.wait()


@needs_pyopencl
def test_pyopencl_wait_event_of_a_pending_copy(ocl):
    n = 1 << 22  # large enough that the copy is still queued when the access begins
    queue = ocl.pyopencl_queue(1)
    prog = pyopencl.Program(queue.context, KERNELS).build()
    a = ocl.alloc(n * 4, device=1)
    src = numpy.ones(n, dtype=numpy.float32)
    for _ in range(3):
        ev = a.copy_from(src, wait=False)
        with a.access("rw") as ac:
            if ac.wait_event is not None:
                assert ac.wait_for[0].int_ptr == ac.wait_event
            ac.done = prog.axpb(queue, (n,), None, a.to_pyopencl(), numpy.float32(2), numpy.float32(0),
                                wait_for=ac.wait_for)
        ev.wait()
        out = numpy.empty(n, numpy.float32)
        a.copy_to(out)
        assert numpy.all(out == 2.0)
    # end(done=...) instead of the with block's exit.
    ac = a.access("rw").__enter__()
    e = prog.axpb(queue, (n,), None, a.to_pyopencl(), numpy.float32(1), numpy.float32(1), wait_for=ac.wait_for)
    ac.end(done=e)
    assert not ac.open
    a.copy_to(out)
    assert numpy.all(out == 3.0)


@needs_pyopencl
def test_pyopencl_buffer_of_an_imported_tensor(ocl):
    """A cl_mem made with pyopencl in unimem's context, imported through a
    DLPack producer, computed on and read back."""
    from dlpack_producer import Producer
    queue = ocl.pyopencl_queue(1)
    n = 1024
    mem = pyopencl.Buffer(queue.context, pyopencl.mem_flags.READ_WRITE, size=n * 4)
    pyopencl.enqueue_copy(queue, mem, numpy.arange(n, dtype=numpy.float32)).wait()
    p = Producer(numpy.zeros(1, numpy.uint8), shape=[n], dtype=(2, 32, 1), device=(4, 0), data=mem.int_ptr)
    w = unimem.from_dlpack(ocl, p.capsule())
    assert w.device.index == 1 and w.size == n * 4
    out = numpy.empty(n, numpy.float32)
    w.copy_to(out)
    assert numpy.array_equal(out, numpy.arange(n, dtype=numpy.float32))
    w.release()
    assert p.deleted == 1


# ---- unimem.access over several buffers, Buffer.release_after -------------------------------------------


def test_access_over_several_buffers_on_the_cpu_device(cpu):
    a, b, c = (cpu.alloc(1 << 20) for _ in range(3))
    evs = [x.fill(i + 1, wait=False) for i, x in enumerate((a, b, c))]
    with unimem.access([a, b, c], ["r", "r", "rw"]) as ac:
        assert ac.open and ac.wait_event is None, "the cpu device's wait happens at the beginning"
        assert int(numpy.asarray(a)[-1]) == 1 and int(numpy.asarray(b)[-1]) == 2, "the fills are done"
        numpy.asarray(c)[:] = numpy.asarray(a) + numpy.asarray(b)
        with pytest.raises(unimem.InvalidState):
            b.access("r").__enter__()  # in a bracket already
    assert not ac.open
    for ev in evs:
        ev.wait()
    assert int(numpy.asarray(c)[0]) == 3
    with unimem.access([a, a, b], "r"):  # a twice: one bracket
        pass
    with unimem.access((a,)):  # modes default to "rw"
        pass


def test_access_over_several_buffers_misuse(cpu):
    a, b = cpu.alloc(64), cpu.alloc(64)
    gone = cpu.alloc(64)
    gone.release()
    with pytest.raises(unimem.InvalidArgument):
        unimem.access([], "r")
    with pytest.raises(TypeError):
        unimem.access([a, "b"], "r")
    with pytest.raises(unimem.InvalidArgument):
        unimem.access([a, b], ["r"])  # one mode for two buffers
    with pytest.raises(unimem.InvalidArgument):
        unimem.access([a, b], ["r", "x"])
    with pytest.raises(unimem.InvalidState):
        unimem.access([a, gone, b], "r").__enter__()
    with b.map("r"):
        with pytest.raises(unimem.InvalidState):
            unimem.access([a, b], "r").__enter__()  # all or nothing: a is not left open
        with a.access("rw"):
            pass
    other = unimem.Manager(backends="cpu")
    try:
        with pytest.raises(unimem.InvalidArgument):
            unimem.access([a, other.alloc(64)], "r").__enter__()
    finally:
        other.close()
    # Released inside: the release waits for the access's end, as for one buffer.
    with unimem.access([a, b], "rw"):
        b.release()
        assert b.released and cpu.stats()["active_buffers"] == 2
    assert cpu.stats()["active_buffers"] == 1
    ac = unimem.access([a], "rw")
    ac.__enter__()
    del ac
    gc.collect()
    a.fill(1)  # the dropped access ended


def test_release_after_on_the_cpu_device(cpu):
    b = cpu.alloc(64)

    class FakeEvent:
        int_ptr = 12345

    with pytest.raises(TypeError):
        b.release_after(12345)  # a bare address is refused
    with pytest.raises(unimem.InvalidArgument):
        b.release_after(FakeEvent())  # no native events on the cpu device
    assert not b.released
    with b.map("r"):
        with pytest.raises(unimem.InvalidState):
            b.release_after(FakeEvent())  # a mapping reaches it
    b.release_after(None)  # release()
    assert b.released and cpu.stats()["active_buffers"] == 0
    with pytest.raises(unimem.InvalidState):
        b.release_after(FakeEvent())


@needs_pyopencl
def test_pyopencl_sgemm_step_over_three_buffers(ocl):
    """c = a @ b + c with one wait for three pending uploads and one done."""
    n = 64
    queue = ocl.pyopencl_queue(1)
    prog = pyopencl.Program(queue.context, """
__kernel void sgemm(__global const float *a, __global const float *b, __global float *c, int n) {
  int i = get_global_id(0), j = get_global_id(1); float s = 0.0f;
  for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
  c[i * n + j] += s;
}
""").build()
    rng = numpy.random.default_rng(7)
    ha, hb, hc = (rng.integers(-4, 5, (n, n)).astype(numpy.float32) for _ in range(3))
    a, b, c = (ocl.alloc(ha.nbytes, device=1) for _ in range(3))
    evs = [x.copy_from(h, wait=False) for x, h in ((a, ha), (b, hb), (c, hc))]
    with unimem.access([a, b, c], ["r", "r", "rw"]) as ac:
        assert len(ac.wait_for) <= 1, "one event for the three"
        ac.done = prog.sgemm(queue, (n, n), None, a.to_pyopencl(), b.to_pyopencl(), c.to_pyopencl(),
                             numpy.int32(n), wait_for=ac.wait_for)
    out = numpy.empty_like(hc)
    c.copy_to(out)  # ordered after the kernel by unimem
    assert numpy.array_equal(out, ha @ hb + hc)
    for ev in evs:
        ev.wait()


@needs_pyopencl
def test_pyopencl_release_after_a_user_event(ocl):
    queue = ocl.pyopencl_queue(1)
    size = 1 << 16
    x = ocl.alloc(size, device=1)
    mem = x.native()["cl_mem"], x.native()["offset"]
    ev = pyopencl.UserEvent(queue.context)
    x.release_after(ev)
    assert x.released and ocl.stats()["active_buffers"] == 0
    y = ocl.alloc(size, device=1)
    assert (y.native()["cl_mem"], y.native()["offset"]) != mem, "x's block waits for the event"
    y.release()
    ev.set_status(pyopencl.command_execution_status.COMPLETE)
    deadline = time.monotonic() + 10
    while True:  # until the manager has seen the event (its completion callback)
        hits = ocl.stats()["pool_hits"]
        got = [ocl.alloc(size, device=1) for _ in range(2)]
        if mem in [(g.native()["cl_mem"], g.native()["offset"]) for g in got]:
            break
        for g in got:
            g.release()
        assert time.monotonic() < deadline, "x's block never came back to the pool"
        time.sleep(0.002)
    assert ocl.stats()["pool_hits"] == hits + 2, "both from the pool"
    for g in got:
        g.release()
    with pytest.raises(TypeError):
        got[0].release_after(ev.int_ptr)  # ints are refused before anything else


@needs_pyopencl
def test_pyopencl_loop_on_the_callers_queue(ocl):
    """Manager.use_queue: the caller's loop on one pyopencl queue, with no
    wait_for and no done event between unimem's copies and the kernel."""
    queue = ocl.pyopencl_queue(1)
    prog = pyopencl.Program(queue.context, KERNELS).build()
    ocl.use_queue(1, queue)
    try:
        for r in range(50):
            n = 100 + 37 * r
            x = numpy.arange(n, dtype=numpy.float32) + r
            a = ocl.alloc(x.nbytes, device=1)
            a.copy_from(x, wait=False)
            with a.access("rw") as ac:
                assert ac.wait_for == [], "the upload is queued on the same queue"
                prog.axpb(queue, (n,), None, a.to_pyopencl(), numpy.float32(2), numpy.float32(1))
            out = numpy.empty_like(x)
            a.copy_to(out)
            assert numpy.array_equal(out, 2 * x + 1), r
            a.release()
    finally:
        ocl.use_queue(1, None)
    with pytest.raises(TypeError):
        ocl.use_queue(1, 12345)
    with pytest.raises(unimem.NotSupported):
        ocl.use_queue(0, queue)


@needs_pyopencl
def test_to_pyopencl_has_the_buffers_exact_size(ocl):
    a = ocl.alloc(1000, device=1)  # a 1 KiB block
    assert a.to_pyopencl().size == 1000
    b = ocl.alloc(1024, device=1)
    assert b.to_pyopencl().size == 1024
    a.release()
    with pytest.raises(unimem.InvalidState):
        a.to_pyopencl()
    b.release()


@needs_pyopencl
def test_to_pyopencl_is_made_once_and_dropped_at_release(ocl):
    import sys
    a = ocl.alloc(1000, device=1)
    v = a.to_pyopencl()
    assert a.to_pyopencl() is v, "the same object on every call"
    held = sys.getrefcount(v)
    a.release()
    assert sys.getrefcount(v) == held - 1, "the buffer's reference goes at release"
    with pytest.raises(unimem.InvalidState):
        a.to_pyopencl()
    # The next owner of the pooled block gets a view of its own.
    b = ocl.alloc(1000, device=1)
    w = b.to_pyopencl()
    assert w is not v and w.size == 1000
    del b  # dropped without release(): the view goes with the Buffer
    assert sys.getrefcount(w) == 2
    # A deferred release (a live export pins the buffer): refused at once.
    c = ocl.alloc(64, device=1)
    x = c.to_pyopencl()
    held = sys.getrefcount(x)
    with c.map("r"):
        c.release()
        assert c.released
        with pytest.raises(unimem.InvalidState):
            c.to_pyopencl()
        assert sys.getrefcount(x) == held, "kept until the handle goes"
    assert sys.getrefcount(x) == held - 1
