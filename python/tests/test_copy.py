"""Copies and fills: host objects of every kind, ranges, contiguity,
read-only destinations, overlap, device buffers without host view."""

import array

import numpy
import pytest

import unimem


def test_copy_from_and_to_every_host_kind(cpu):
    b = cpu.alloc(32, location="host", zero=True)
    sources = [b"0123456789abcdef", bytearray(b"0123456789abcdef"), memoryview(b"0123456789abcdef"),
               numpy.frombuffer(b"0123456789abcdef", numpy.uint8), array.array("b", b"0123456789abcdef")]
    for src in sources:
        b.fill(0)
        b.copy_from(src, offset=8)
        assert bytes(memoryview(b)) == bytes(8) + b"0123456789abcdef" + bytes(8)
    for make in (lambda: bytearray(16), lambda: numpy.zeros(16, numpy.uint8),
                 lambda: numpy.zeros((2, 2), numpy.float32), lambda: array.array("b", bytes(16))):
        out = make()
        b.copy_to(out, offset=8)
        assert bytes(memoryview(out).cast("B")) == b"0123456789abcdef"


def test_ranges_are_checked(cpu):
    b = cpu.alloc(16, location="host")
    cases = [
        (lambda: b.copy_from(bytes(17)), unimem.OutOfRange),
        (lambda: b.copy_from(bytes(8), offset=9), unimem.OutOfRange),
        (lambda: b.copy_from(bytes(1), offset=16), unimem.OutOfRange),
        (lambda: b.copy_from(bytes(1), offset=1 << 63), unimem.OutOfRange),
        (lambda: b.copy_to(numpy.zeros(3, numpy.float64)), unimem.OutOfRange),
        (lambda: b.copy_to(bytearray(4), offset=13), unimem.OutOfRange),
        (lambda: b.copy_from(bytes(1), offset=-1), unimem.InvalidArgument),
        (lambda: b.copy_from(bytes(1), offset=1 << 64), unimem.Overflow),
        (lambda: b.copy_from(b""), unimem.InvalidArgument),  # zero bytes, as in C
        (lambda: b.fill(0, offset=16), unimem.OutOfRange),
        (lambda: b.fill(0, offset=8, nbytes=9), unimem.OutOfRange),
        (lambda: b.fill(0, nbytes=0), unimem.InvalidArgument),
        (lambda: b.fill(256), unimem.InvalidArgument),
        (lambda: b.fill(-1), unimem.InvalidArgument),
    ]
    for call, cls in cases:
        with pytest.raises(cls) as info:
            call()
        assert type(info.value) is cls
        assert info.value.code == cls.code


def test_numpy_ranges_and_offsets(cpu):
    b = cpu.alloc(64, location="host")
    a = numpy.arange(8, dtype=numpy.float64)  # 64 bytes
    b.copy_from(a)
    out = numpy.zeros(4, numpy.float64)
    b.copy_to(out, offset=32)
    assert out.tolist() == [4.0, 5.0, 6.0, 7.0]
    with pytest.raises(unimem.OutOfRange):
        b.copy_to(out, offset=40)
    with pytest.raises(unimem.OutOfRange):
        b.copy_from(numpy.zeros(9))


def test_non_contiguous_is_refused_clearly(cpu):
    b = cpu.alloc(64, location="host")
    strided = numpy.arange(16, dtype=numpy.int32)[::2]
    with pytest.raises(BufferError, match=r"copy_from\(\): the numpy.ndarray is not C-contiguous"):
        b.copy_from(strided)
    with pytest.raises(BufferError, match="not C-contiguous"):
        b.copy_to(numpy.zeros((4, 4), numpy.int32).T)
    with pytest.raises(BufferError, match="not C-contiguous"):
        unimem.copy(b, memoryview(bytes(16))[::2], 8)


def test_read_only_destination_is_refused(cpu):
    b = cpu.alloc(8, location="host")
    ro = numpy.zeros(8, numpy.uint8)
    ro.flags.writeable = False
    for dst in (bytes(8), ro, memoryview(bytearray(8)).toreadonly()):
        with pytest.raises(BufferError, match=r"copy_to\(\): the destination .* is read-only"):
            b.copy_to(dst)
    with pytest.raises(BufferError, match="read-only"):
        unimem.copy(bytes(8), b, 8)


def test_non_buffer_objects_are_type_errors(cpu):
    b = cpu.alloc(8, location="host")
    for obj in (None, 1, "text", [1, 2], object()):
        with pytest.raises(TypeError, match="buffer protocol"):
            b.copy_from(obj)
        with pytest.raises(TypeError, match="buffer protocol"):
            b.copy_to(obj)
    with pytest.raises(TypeError, match="dst or src must be a unimem.Buffer"):
        unimem.copy(bytearray(8), bytes(8), 8)


def test_overlap_with_the_buffer_itself(cpu):
    b = cpu.alloc(16, location="host")
    b.copy_from(bytes(range(16)))
    with pytest.raises(unimem.InvalidArgument, match="overlaps"):
        b.copy_from(memoryview(b)[0:8], offset=4)
    with pytest.raises(unimem.InvalidArgument, match="overlaps"):
        b.copy_to(memoryview(b)[4:12], offset=0)
    b.copy_from(memoryview(b)[0:8], offset=8)  # disjoint ranges of one buffer are fine
    assert bytes(memoryview(b)) == bytes(range(8)) * 2
    unimem.copy(b, b, 8, dst_offset=4, src_offset=0)  # overlapping within a buffer: memmove
    assert bytes(memoryview(b)) == bytes(range(4)) + bytes(range(8)) + bytes(range(4, 8))


def test_unimem_copy_every_pairing(cpu):
    a = cpu.alloc(16, location="host")
    c = cpu.alloc(16, location="device")
    a.copy_from(bytes(range(16)))
    unimem.copy(c, a, 8, dst_offset=8, src_offset=4)
    out = bytearray(16)
    unimem.copy(out, c, 8, dst_offset=2, src_offset=8)
    assert out == bytes(2) + bytes(range(4, 12)) + bytes(6)
    unimem.copy(a, b"\xff" * 20, 4, dst_offset=12, src_offset=16)
    assert bytes(memoryview(a))[12:] == b"\xff" * 4
    unimem.copy(dst=a, src=c, nbytes=16, wait=True)
    with pytest.raises(unimem.OutOfRange, match="outside the 4 bytes of the source"):
        unimem.copy(a, bytes(4), 8)
    with pytest.raises(unimem.OutOfRange, match="destination"):
        unimem.copy(bytearray(4), a, 2, dst_offset=3)
    with pytest.raises(unimem.OutOfRange):
        unimem.copy(a, c, 8, src_offset=9)
    with pytest.raises(unimem.InvalidArgument):
        unimem.copy(a, c, 0)
    with pytest.raises(TypeError, match="missing required argument 'nbytes'"):
        unimem.copy(a, c)


def test_copy_between_managers_is_refused(cpu):
    with unimem.Manager(backends="cpu") as other:
        a, b = cpu.alloc(8), other.alloc(8)
        with pytest.raises(unimem.InvalidArgument, match="different managers"):
            unimem.copy(a, b, 8)


def test_fill(cpu):
    b = cpu.alloc(16, location="host")
    b.fill(0xAB)
    b.fill(1, offset=4, nbytes=4)
    b.fill(2, 12)
    assert bytes(memoryview(b)) == b"\xab" * 4 + b"\x01" * 4 + b"\xab" * 4 + b"\x02" * 4
    with pytest.raises(TypeError):
        b.fill(1.0)
    with pytest.raises(TypeError):
        b.fill(b"x")


def test_device_buffers_round_trip(ocl):
    data = numpy.arange(1024, dtype=numpy.float32)
    for dev in (1, 2):
        d = ocl.alloc(data.nbytes, device=dev)
        d.copy_from(data)
        out = numpy.empty_like(data)
        d.copy_to(out)
        assert numpy.array_equal(out, data)
        d.fill(0, offset=16, nbytes=16)
        d.copy_to(out)
        assert out[4:8].tolist() == [0.0] * 4 and out[8] == 8.0
    d1, d2 = ocl.alloc(4096, device=1), ocl.alloc(4096, device=2)
    d1.copy_from(data)
    unimem.copy(d2, d1, 4096)  # between two devices
    host = ocl.alloc(4096, location="host")
    unimem.copy(host, d2, 4096)
    assert numpy.array_equal(numpy.frombuffer(host, numpy.float32), data)
    s = ocl.stats()
    assert s["bytes_h2d"] >= 2 * 4096 and s["bytes_d2h"] >= 2 * 4096
