"""Dropping a Python object never blocks on work that the same thread must
unblock: an Event, Buffer, Mapping, DLPack tensor or Manager let go while an
access (a bracket) is open, by the caller, by the garbage collector on
another thread, or at interpreter exit; and Manager.close() inside an open
access is refused, naming it.

Every case runs in a child interpreter under a time bound (a hang fails the
test, not the run), once per device profile: the cpu device, and PoCL's
pthread and basic devices (POCL_DEVICES)."""

import os
import subprocess
import sys
import textwrap

import pytest

# The child's own watchdog prints every thread's stack shortly before the
# parent gives up on it, so a hang says where it hangs.
BOUND_S = float(os.environ.get("UM_DROP_BOUND_S", "60"))

PROFILES = {
    "cpu": ("cpu", None),
    "pocl": ("cpu,opencl", "pthread"),
    "pocl-basic": ("cpu,opencl", "basic"),
}

PRELUDE = '''
import faulthandler, gc, sys, threading, weakref
import numpy
import unimem
faulthandler.dump_traceback_later({watchdog}, exit=True)
BACKENDS = {backends!r}
m = unimem.Manager(backends=BACKENDS)
if BACKENDS != "cpu" and len(m.devices) < 2:
    print("SKIP: no OpenCL device (install pocl-opencl-icd)")
    sys.exit(0)
DEV = len(m.devices) - 1  # the profile's device: the cpu device or PoCL's

def alloc(n=1 << 16, location="device"):
    return m.alloc(n, device=DEV, location=location)

def host(b):
    out = bytearray(b.size)
    b.copy_to(out)
    return bytes(out)

def bounded(fn, what):
    """fn() on a thread, which must end within the bound."""
    errors = []
    def body():
        try:
            fn()
        except BaseException as e:  # reported on the main thread
            errors.append(e)
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join({bound_thread})
    assert not t.is_alive(), what + " did not return"
    if errors:
        raise errors[0]
'''


def run_child(profile, body, expect_done=True):
    backends, pocl = PROFILES[profile]
    env = dict(os.environ)
    env["UNIMEM_OPENCL_PLATFORM"] = "Portable Computing Language"
    if pocl is not None:
        env["POCL_DEVICES"] = pocl
    code = PRELUDE.format(backends=backends, watchdog=max(BOUND_S - 10, BOUND_S / 2),
                          bound_thread=BOUND_S / 4) + textwrap.dedent(body)
    if expect_done:
        code += '\nprint("DONE")\n'
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=BOUND_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung ({BOUND_S:.0f} s):\n{e.stdout}\n{e.stderr}")
    if r.stdout.startswith("SKIP:"):
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    if expect_done:
        assert "DONE" in r.stdout, r.stdout + r.stderr
    return r


@pytest.fixture(params=sorted(PROFILES))
def profile(request):
    return request.param


# ---- Event ------------------------------------------------------------------


def test_event_dropped_inside_the_access(profile):
    run_child(profile, '''
    b = alloc()
    with b.access("rw"):
        b.fill(1, wait=False)  # the Event dies at once: its fill waits for the bracket
        ev = b.fill(2, offset=100, nbytes=100, wait=False)
        del ev
    assert host(b) == b"\\x01" * 100 + b"\\x02" * 100 + b"\\x01" * (b.size - 200)
    ''')


def test_event_dropped_keeps_its_host_memory(profile):
    run_child(profile, '''
    b = alloc()
    b.fill(3)
    src = bytearray(b"\\x07" * 1000)
    out = numpy.zeros(b.size, numpy.uint8)
    ref = weakref.ref(out)
    with b.access("rw"):
        b.copy_from(src, offset=10, wait=False)
        try:
            src.extend(b"x")  # still exported to the copy behind the bracket
            raise AssertionError("the dropped copy let its host memory go")
        except BufferError:
            pass
        del src  # the copy still reads it
        b.copy_to(out, wait=False)
        del out  # and still writes into this one
        gc.collect()
        assert ref() is not None
    m.close()  # waits for the dropped events' copies
    gc.collect()
    assert ref() is None, "the host memory of a finished copy is let go"
    ''')


def test_event_dropped_behind_a_chain_of_brackets(profile):
    run_child(profile, '''
    x, y, z = alloc(), alloc(), alloc()
    x.fill(4)
    with x.access("rw"):
        unimem.copy(y, x, x.size, wait=False)  # y waits for x's bracket
        unimem.copy(z, y, y.size, wait=False)  # z for y's copy
        y.fill(5, nbytes=10, wait=False)
    assert host(z) == b"\\x04" * z.size
    assert host(y) == b"\\x05" * 10 + b"\\x04" * (y.size - 10)
    ''')


def test_event_dropped_by_the_collector_on_another_thread(profile):
    run_child(profile, '''
    b = alloc()
    gc.disable()
    with b.access("rw"):
        cycle = [b.fill(6, wait=False)]
        cycle.append(cycle)  # only the collector frees it
        del cycle
        bounded(gc.collect, "gc.collect() on another thread")
        plain = [b.fill(7, nbytes=8, wait=False)]
        bounded(plain.clear, "dropping an Event on another thread")
    gc.enable()
    assert host(b) == b"\\x07" * 8 + b"\\x06" * (b.size - 8)
    ''')


def test_event_dropped_at_interpreter_exit(profile):
    # Left open at exit: the access, an Event behind it dropped by an atexit
    # handler while the access is still open, another in a cycle, a mapping
    # and a tensor; the interpreter must still exit.
    r = run_child(profile, '''
    import atexit
    b, y, z = alloc(), alloc(), alloc(location="host")
    mp = y.map("rw")
    view = mp.__enter__()
    tensor = numpy.from_dlpack(z)
    ac = b.access("rw").__enter__()
    holder = [b.fill(8, wait=False)]
    cycle = [b.fill(9, wait=False)]
    cycle.append(cycle)
    del cycle
    def drop():
        holder.clear()
        gc.collect()
        print("DROPPED", ac.open, flush=True)
    atexit.register(drop)
    ''', expect_done=False)
    assert "DROPPED True" in r.stdout


# ---- Manager ------------------------------------------------------------------


def test_close_inside_an_access_is_refused(profile):
    run_child(profile, '''
    b, other = alloc(), alloc()
    with b.access("rw"):
        ev = b.fill(1, wait=False)
        try:
            m.close()
            raise AssertionError("close() inside an access returned")
        except unimem.InvalidState as e:
            assert "access" in str(e) and repr(b) in str(e), str(e)
        assert not m.closed
        other.fill(2)  # the manager still works
        ac2 = other.access("r").__enter__()
        try:
            bounded(m.close, "close() on another thread")
            raise AssertionError("close() on another thread inside an access returned")
        except unimem.InvalidState as e:
            assert "2 accesses" in str(e), str(e)
        ac2.end()
    m.close()  # the access is over: the fill finishes, close() waits for it
    assert ev.done and b.released
    ''')


def test_manager_exit_inside_an_access(profile):
    run_child(profile, '''
    b = alloc()
    ac = b.access("rw").__enter__()
    try:
        with m:
            b.fill(1, wait=False)
        raise AssertionError("the with block closed a manager with an open access")
    except unimem.InvalidState:
        pass
    ac.end()
    m.close()
    ''')


def test_manager_dropped_with_live_objects(profile):
    run_child(profile, '''
    b, y, z = alloc(), alloc(), alloc(location="host")
    mref = weakref.ref(m)
    mp = y.map("w")
    view = mp.__enter__()
    tensor = numpy.from_dlpack(z)
    ac = b.access("rw").__enter__()
    ev = b.fill(1, wait=False)
    del m, ev, b, y, z  # the objects keep the Manager object
    gc.collect()
    assert mref() is not None
    del mp, view
    gc.collect()
    ac.end()
    del ac, tensor
    gc.collect()
    assert mref() is None
    ''')


def test_close_with_live_objects(profile):
    run_child(profile, '''
    b, y, z = alloc(), alloc(), alloc(location="host")
    mp = y.map("w")
    view = mp.__enter__()
    tensor = numpy.from_dlpack(z)
    out = bytearray(b.size)
    b.fill(2, wait=False)
    ev = b.copy_to(out, wait=False)
    m.close()
    assert ev.done and out == b"\\x02" * b.size
    view[0] = 1
    del mp, view, tensor
    gc.collect()
    ''')


# ---- Buffer, Mapping, DLPack ----------------------------------------------------


def test_buffer_released_or_dropped_inside_an_access(profile):
    run_child(profile, '''
    x, y = alloc(), alloc()
    x.fill(1)
    with x.access("rw"):
        unimem.copy(y, x, x.size, wait=False)
        y.fill(2, wait=False)
        y.release()  # its operations wait for x's bracket
        with alloc() as w:
            w.fill(3, wait=False)
        v = alloc()
        unimem.copy(v, x, x.size, wait=False)
        del v
        x.release()  # inside its own access: ends with it
        assert x.released and y.released
    m.close()
    ''')


def test_imported_buffer_released_behind_an_access(profile):
    run_child(profile, '''
    n = 4096
    x = alloc(n)
    x.fill(5)
    a1, a2 = numpy.zeros(n, numpy.uint8), numpy.zeros(n, numpy.uint8)
    w1, w2 = unimem.from_dlpack(m, a1), unimem.from_dlpack(m, a2)
    a3 = numpy.zeros(n, numpy.uint8)
    w3 = unimem.from_dlpack(m, a3)
    with x.access("rw"):
        ev1 = unimem.copy(w1, x, n, wait=False)  # a wrap's release waits for its copies
        w1.release()  # the Event still held: deferred until it is seen done
        assert w1.released
        ev = unimem.copy(w2, x, n, wait=False)
        del w2, ev
        gc.collect()
        with w3:
            unimem.copy(w3, x, n, wait=False)
    ev1.wait()
    m.close()
    assert (a1 == 5).all() and (a2 == 5).all() and (a3 == 5).all()
    ''')


def test_mapping_dropped_inside_an_access(profile):
    run_child(profile, '''
    x, y, z = alloc(), alloc(), alloc()
    y.fill(0)
    z.fill(0)
    mp = y.map("rw")
    view = mp.__enter__()
    view[0] = 9
    mz = z.map("w")
    vz = mz.__enter__()
    keep = numpy.frombuffer(vz, numpy.uint8)  # outlives the with block
    keep[1] = 8
    with x.access("rw"):
        x.fill(1, wait=False)
        del mp, view  # the mapping ends when dropped
        try:
            mz.__exit__(None, None, None)
            raise AssertionError("the exit with a view alive did not raise")
        except BufferError:
            pass  # keep outlives it: the mapping stays until keep goes
        del keep, vz, mz  # the last view ends it
        gc.collect()
    assert host(y)[0] == 9 and host(z)[1] == 8
    ''')


def test_dlpack_tensor_dropped_inside_an_access(profile):
    run_child(profile, '''
    x, y = alloc(location="host"), alloc(location="host")
    y.fill(3)
    before = numpy.from_dlpack(x)
    with x.access("rw"):
        x.fill(1, wait=False)
        try:
            numpy.from_dlpack(x)  # refused: the export would wait for the bracket
        except BufferError:
            pass
        t = numpy.from_dlpack(y)
        assert t[0] == 3
        del t, before  # the deleters run here
        caps = y.__dlpack__()
        del caps  # a capsule nobody consumed
        x.release()  # x is exported no more: ends with the access
    assert y.manager.stats()["active_buffers"] >= 1
    m.close()
    ''')


def test_imported_buffer_dropped_by_its_consumer_inside_an_access(profile):
    # A buffer imported from a unimem tensor (from_dlpack of a Buffer), its
    # copy behind an open access, the import and the original dropped.
    run_child(profile, '''
    n = 4096
    x, src = alloc(n), alloc(n, location="host")
    x.fill(6)
    w = unimem.from_dlpack(m, src)
    with x.access("rw"):
        ev = unimem.copy(w, x, n, wait=False)
        del ev, w, src
        gc.collect()
    m.close()
    ''')
