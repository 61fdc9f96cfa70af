"""NumPy's own DLPack tests (numpy/core/tests/test_dlpack.py, the version Debian ships) with unimem as the
producer: each array a test hands to numpy.from_dlpack is first copied into a unimem host buffer and handed
over as a typed view of the same dtype, shape and strides (Buffer.view), so numpy.from_dlpack reads unimem's
export and the test's own assertions check it. The tests that call ndarray.__dlpack__ themselves (NumPy as
the producer: refcounts, streams, read-only arrays, its device) are NumPy's alone and are left out."""
import ctypes

import numpy
import pytest

import unimem

suite = pytest.importorskip("numpy.core.tests.test_dlpack")

OURS = ["test_strides_not_multiple_of_itemsize", "test_dtype_passthrough", "test_invalid_dtype",
        "test_invalid_byte_swapping", "test_non_contiguous", "test_higher_dims", "test_ndim0",
        "test_size1dims_arrays", "test_from_dlpack_refcount"]


class Producer:
    """x's bytes in a unimem buffer, as a view with x's layout."""

    made = 0

    def __init__(self, m, x):
        lo = hi = 0
        for n, s in zip(x.shape, x.strides):
            if n > 1:
                lo, hi = (lo + (n - 1) * s, hi) if s < 0 else (lo, hi + (n - 1) * s)
        span = hi - lo + x.itemsize if x.size else 0
        self.buffer = m.alloc(max(span, 1), location="host")
        if span:
            start = x.__array_interface__["data"][0] + lo
            ctypes.memmove(self.buffer.native()["host"], start, span)
        try:
            self.view = self.buffer.view(x.dtype, x.shape, x.strides, -lo)
        except unimem.InvalidArgument as e:  # the producer's refusal, as DLPack producers give it
            raise BufferError(str(e)) from e
        Producer.made += 1

    def __dlpack__(self, stream=None):
        return self.view.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.view.__dlpack_device__()


@pytest.fixture
def through_unimem(monkeypatch):
    m = unimem.Manager(backends="cpu")
    original = numpy.from_dlpack

    def from_dlpack(x, *args, **kwargs):
        if isinstance(x, numpy.ndarray):
            x = Producer(m, x)
        return original(x, *args, **kwargs)

    monkeypatch.setattr(numpy, "from_dlpack", from_dlpack)
    Producer.made = 0
    yield
    monkeypatch.undo()
    m.close()


def cases():
    for name in OURS:
        fn = getattr(suite.TestDLPack, name)
        marks = getattr(fn, "pytestmark", [])
        params = [mk for mk in marks if mk.name == "parametrize"]
        if params:
            argname, values = params[0].args[0], params[0].args[1]
            for v in values:
                yield pytest.param(name, {argname: v}, id=f"{name}[{getattr(v, '__name__', v)}]")
        else:
            yield pytest.param(name, {}, id=name)


@pytest.mark.parametrize("name,kwargs", list(cases()))
def test_numpys_dlpack_test_with_unimem_producing(through_unimem, name, kwargs):
    if name == "test_from_dlpack_refcount":
        pytest.skip("counts references to NumPy's own producer, which the harness replaces")
    getattr(suite.TestDLPack(), name)(**kwargs)
    assert Producer.made > 0 or name in ("test_strides_not_multiple_of_itemsize", "test_invalid_dtype",
                                         "test_invalid_byte_swapping")
