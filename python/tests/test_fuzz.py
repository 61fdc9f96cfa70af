"""Fuzzing the binding with hypothesis.

MisuseMachine: random sequences of every call (DLPack export and import,
access brackets and native handles included) with arguments of every kind
(wrong types, negative and huge ints, None, released buffers, closed
managers, buffers of closed managers, double release, views and events
outliving everything). Nothing may crash the interpreter (the ASan build
runs this too), and every failure must be one of the documented exception
types.

ModelMachine: valid copies, fills and mappings between host objects and
buffers on every device, checked byte for byte against a bytearray model.
"""

import gc
import os

import numpy
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

import unimem

ALLOWED = (unimem.Error, TypeError, ValueError, BufferError, OverflowError, ImportError)

HAVE_OPENCL = None
try:
    import pyopencl  # noqa: F401
    HAVE_PYOPENCL = True
except ImportError:
    HAVE_PYOPENCL = False


def have_opencl():
    global HAVE_OPENCL
    if HAVE_OPENCL is None:
        with unimem.Manager(backends="cpu,opencl") as m:
            HAVE_OPENCL = len(m.devices) > 1
    return HAVE_OPENCL


def attempt(fn, *args, **kwargs):
    """Call fn; an allowed exception is an answer, anything else fails."""
    try:
        return fn(*args, **kwargs)
    except ALLOWED:
        return None


junk = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=4), st.binary(max_size=4),
    st.integers(-(2 ** 70), 2 ** 70), st.integers(-3, 300), st.just(object()), st.just([1, 2]),
    st.just(numpy.int64(3)), st.just(numpy.float32(1.0)))
# Sizes that never make a huge allocation succeed: small, or refused
# outright (negative, beyond the library's 2**62 cap, beyond 64 bits).
sizes = st.one_of(st.integers(1, 4096), st.integers(-(2 ** 70), 0), st.integers(2 ** 62 + 1, 2 ** 70),
                  junk.filter(lambda v: not isinstance(v, (int, numpy.integer)) or isinstance(v, bool)))
offsets = st.one_of(st.integers(0, 4200), st.integers(-(2 ** 70), 2 ** 70), junk)
maybe = lambda s: st.one_of(st.just(None), s)  # noqa: E731
locations = st.one_of(st.sampled_from(["host", "device", "pinned", "unified"]), junk)
modes = st.one_of(st.sampled_from(["r", "w", "rw", "discard"]), junk)


def host_objects():
    def numpy_array(n, dtype, strided, readonly):
        a = numpy.zeros(n * 2 if strided else n, dtype)
        a = a[::2] if strided else a
        a.flags.writeable = not readonly
        return a

    return st.one_of(
        st.binary(max_size=80), st.binary(max_size=80).map(bytearray),
        st.builds(numpy_array, st.integers(0, 40), st.sampled_from([numpy.uint8, numpy.float64, numpy.int16]),
                  st.booleans(), st.booleans()),
        st.binary(max_size=80).map(lambda b: memoryview(b)[::2]), junk)


class MisuseMachine(RuleBasedStateMachine):
    managers = Bundle("managers")
    buffers = Bundle("buffers")

    def __init__(self):
        super().__init__()
        self.keep = []  # views, events, mappings: dropped by drop_something

    @initialize(target=managers)
    def first_manager(self):
        return unimem.Manager(backends="cpu")

    @rule(target=managers, opencl=st.booleans())
    def new_manager(self, opencl):
        return unimem.Manager(backends="cpu,opencl" if opencl and have_opencl() else "cpu")

    @rule(target=buffers, m=managers, nbytes=sizes, device=st.one_of(st.integers(-1, 3), junk),
          location=locations, zero=junk)
    def alloc(self, m, nbytes, device, location, zero):
        return attempt(m.alloc, nbytes, device=device, location=location, zero=zero)

    @rule(target=buffers, m=managers, nbytes=st.integers(1, 512), device=st.integers(0, 2))
    def alloc_valid(self, m, nbytes, device):
        if m.closed or device >= len(m.devices):
            return None
        return m.alloc(nbytes, device=device)

    @rule(b=buffers)
    def release(self, b):
        if b is not None:
            b.release()

    @rule(m=managers)
    def close(self, m):
        try:
            m.close()
        except unimem.InvalidState:
            # close() refuses while an access is open (its text names the
            # buffer); the model must then hold one open.
            assert any(isinstance(o, unimem.Access) and o.open for o in self.keep), "refused with no access open"

    @rule(b=buffers, obj=host_objects(), offset=offsets, wait=junk)
    def copy_from(self, b, obj, offset, wait):
        if b is not None:
            self.keep.append(attempt(b.copy_from, obj, offset=offset, wait=wait))

    @rule(b=buffers, obj=host_objects(), offset=offsets, wait=st.booleans())
    def copy_to(self, b, obj, offset, wait):
        if b is not None:
            self.keep.append(attempt(b.copy_to, obj, offset, wait))

    @rule(dst=st.one_of(buffers, host_objects()), src=st.one_of(buffers, host_objects()), nbytes=offsets,
          dst_offset=offsets, src_offset=offsets, wait=st.booleans())
    def copy(self, dst, src, nbytes, dst_offset, src_offset, wait):
        self.keep.append(attempt(unimem.copy, dst, src, nbytes, dst_offset=dst_offset, src_offset=src_offset,
                                 wait=wait))

    @rule(b=buffers, byte=st.one_of(st.integers(-2, 260), junk), offset=offsets, nbytes=maybe(offsets),
          wait=st.booleans())
    def fill(self, b, byte, offset, nbytes, wait):
        if b is not None:
            self.keep.append(attempt(b.fill, byte, offset=offset, nbytes=nbytes, wait=wait))

    @rule(b=buffers, mode=modes, offset=offsets, nbytes=maybe(offsets), enter=st.booleans())
    def map(self, b, mode, offset, nbytes, enter):
        if b is None:
            return
        mapping = attempt(b.map, mode, offset, nbytes)
        if mapping is not None and enter:
            self.keep.append(attempt(mapping.__enter__))
        self.keep.append(mapping)

    @rule(b=buffers, kind=st.sampled_from(["memoryview", "numpy", "slice"]))
    def view(self, b, kind):
        if b is None:
            return
        make = {"memoryview": memoryview, "numpy": numpy.asarray, "slice": lambda o: memoryview(o)[1:]}[kind]
        self.keep.append(attempt(make, b))

    @rule(b=buffers, stream=st.one_of(st.sampled_from([None, -1, 0, 1, 2]), junk),
          max_version=st.one_of(st.sampled_from([None, (1, 0), (0, 8), (2, 5), (1, 2 ** 70), (2 ** 70, 0)]), junk),
          dl_device=st.one_of(st.sampled_from([None, (1, 0), (4, 0), (2, 0), (1, 2 ** 40)]), junk),
          copy=st.one_of(st.sampled_from([None, True, False]), junk), consume=st.sampled_from(["keep", "unimem", "numpy"]))
    def dlpack_export(self, b, stream, max_version, dl_device, copy, consume):
        if b is None:
            return
        attempt(b.__dlpack_device__)
        cap = attempt(b.__dlpack__, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        if cap is None:
            return
        if consume == "unimem":
            self.keep.append(attempt(unimem.from_dlpack, b.manager, cap))
        elif consume == "numpy":
            try:  # NumPy refuses device memory with RuntimeError or BufferError
                self.keep.append(numpy.from_dlpack(b))
            except (RuntimeError,) + ALLOWED:
                pass
        self.keep.append(cap)

    @rule(target=buffers, m=managers, obj=st.one_of(buffers, host_objects(), junk))
    def from_dlpack(self, m, obj):
        return attempt(unimem.from_dlpack, m, obj)

    @rule(m=st.one_of(managers, junk), obj=st.one_of(buffers, junk))
    def from_dlpack_junk(self, m, obj):
        self.keep.append(attempt(unimem.from_dlpack, m, obj))

    @rule(b=buffers, mode=modes, done=st.one_of(st.none(), st.integers(-2, 2), junk), how=st.sampled_from(
        ["with", "end", "open", "twice"]))
    def access(self, b, mode, done, how):
        if b is None:
            return
        ac = attempt(b.access, mode)
        if ac is None:
            return
        if attempt(ac.__enter__) is None:
            return
        attempt(setattr, ac, "done", done)
        if how == "end":
            attempt(ac.end)
        elif how == "twice":
            attempt(ac.__enter__)
            attempt(ac.__exit__, None, None, None)
        elif how == "with":
            attempt(ac.__exit__, None, None, None)
        else:
            self.keep.append(ac)  # ended when dropped
        attempt(b.native)
        if HAVE_PYOPENCL:
            self.keep.append(attempt(b.to_pyopencl))

    @rule(m=managers, device=st.one_of(st.integers(-1, 3), junk))
    def native(self, m, device):
        attempt(m.native, device)

    @rule(data=st.data())
    def use_something(self, data):
        if not self.keep:
            return
        obj = data.draw(st.sampled_from(self.keep))
        if isinstance(obj, unimem.Event):
            attempt(obj.wait)
            assert obj.done
        elif isinstance(obj, unimem.Mapping):
            attempt(obj.__exit__, None, None, None)
        elif isinstance(obj, unimem.Access):
            attempt(obj.end)
        elif isinstance(obj, unimem.Buffer):
            attempt(obj.fill, 1)
        elif isinstance(obj, memoryview) and not obj.readonly and obj.nbytes:
            obj[0] = obj[obj.nbytes - 1]  # the memory is still there
        elif isinstance(obj, numpy.ndarray) and obj.size and obj.flags.writeable:
            obj[:] = obj.sum() % 256

    @rule(data=st.data())
    def drop_something(self, data):
        if self.keep:
            self.keep.pop(data.draw(st.integers(0, len(self.keep) - 1)))

    @rule(m=managers, device=maybe(st.one_of(st.integers(-1, 3), junk)), keep=offsets)
    def stats_and_trim(self, m, device, keep):
        s = attempt(m.stats, device)
        assert s is None or len(s) == len(unimem.stats_fields())
        attempt(m.trim, keep)

    @rule()
    def collect(self):
        gc.collect()

    def teardown(self):
        self.keep.clear()
        gc.collect()


class ModelMachine(RuleBasedStateMachine):
    """One buffer per device and location, each mirrored by a bytearray."""

    SIZE = 256

    def __init__(self):
        super().__init__()
        self.m = unimem.Manager(backends="cpu,opencl")
        self.bufs, self.models = [], []
        for dev in self.m.devices:
            for loc in dev.locations:
                self.bufs.append(self.m.alloc(self.SIZE, device=dev.index, location=loc, zero=True))
                self.models.append(bytearray(self.SIZE))
        self.pending = []

    def ranges(self, data, n=None):
        n = data.draw(st.integers(1, self.SIZE)) if n is None else n
        return n, data.draw(st.integers(0, self.SIZE - n))

    def index(self, data):
        return data.draw(st.integers(0, len(self.bufs) - 1))

    @rule(data=st.data(), wait=st.booleans(), payload=st.binary(min_size=1, max_size=256))
    def copy_from(self, data, wait, payload):
        i = self.index(data)
        _, off = self.ranges(data, len(payload))
        src = numpy.frombuffer(bytearray(payload), numpy.uint8)  # a temporary the event must keep
        ev = self.bufs[i].copy_from(src, offset=off, wait=wait)
        self.models[i][off:off + len(payload)] = payload
        if ev is not None:
            self.pending.append(ev)

    @rule(data=st.data())
    def copy_to(self, data):
        i = self.index(data)
        n, off = self.ranges(data)
        out = numpy.empty(n, numpy.uint8)
        self.bufs[i].copy_to(out, offset=off)
        assert out.tobytes() == bytes(self.models[i][off:off + n])

    @rule(data=st.data(), wait=st.booleans())
    def buffer_to_buffer(self, data, wait):
        i, j = self.index(data), self.index(data)
        n, soff = self.ranges(data)
        doff = data.draw(st.integers(0, self.SIZE - n))
        ev = unimem.copy(self.bufs[i], self.bufs[j], n, dst_offset=doff, src_offset=soff, wait=wait)
        self.models[i][doff:doff + n] = self.models[j][soff:soff + n]
        if ev is not None:
            self.pending.append(ev)

    @rule(data=st.data(), byte=st.integers(0, 255), wait=st.booleans())
    def fill(self, data, byte, wait):
        i = self.index(data)
        n, off = self.ranges(data)
        ev = self.bufs[i].fill(byte, offset=off, nbytes=n, wait=wait)
        self.models[i][off:off + n] = bytes([byte]) * n
        if ev is not None:
            self.pending.append(ev)

    @rule(data=st.data(), byte=st.integers(0, 255))
    def map_write(self, data, byte):
        i = self.index(data)
        n, off = self.ranges(data)
        with self.bufs[i].map("rw", off, n) as view:
            assert bytes(view) == bytes(self.models[i][off:off + n])
            view[:] = bytes([byte]) * n
        self.models[i][off:off + n] = bytes([byte]) * n

    @rule()
    def wait_all(self):
        for ev in self.pending:
            ev.wait()
        self.pending.clear()

    @invariant()
    def host_views_match(self):
        for b, model in zip(self.bufs, self.models):
            if b.has_host_view and not self.pending:
                assert bytes(memoryview(b)) == bytes(model)

    def teardown(self):
        self.m.close()


# UNIMEM_PY_FUZZ_SCALE=10 runs ten times as many sequences (a deeper hunt
# than CTest's default).
SCALE = max(1, int(os.environ.get("UNIMEM_PY_FUZZ_SCALE", "1")))
TestMisuse = MisuseMachine.TestCase
TestMisuse.settings = settings(max_examples=150 * SCALE, stateful_step_count=40)
TestModel = ModelMachine.TestCase
TestModel.settings = settings(max_examples=60 * SCALE, stateful_step_count=30)


def test_opencl_present_for_the_fuzzers():
    if not have_opencl():
        pytest.skip("no OpenCL device: the fuzzers ran on the cpu device only")
