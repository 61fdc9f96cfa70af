"""Errors: one class per code of UM_ERRNO_MAP, carrying code, name, message."""

import re

import pytest

import unimem
from conftest import header_macro

NAMES = {
    "EINVAL": "InvalidArgument", "ERANGE": "OutOfRange", "EOVERFLOW": "Overflow",
    "ENOMEM": "OutOfMemory", "ENODEV": "NoDevice", "ENOTSUP": "NotSupported",
    "ESTATE": "InvalidState", "EAGAIN": "Again", "ECANCELED": "Canceled",
    "EBUSY": "Busy", "EBACKEND": "BackendError", "ELEAK": "Leak",
}


def header_codes():
    rows = re.findall(r'XX\((\w+),\s*(-?\d+),\s*"([^"]*)"\)', header_macro("UM_ERRNO_MAP"))
    return [(name, int(value), text) for name, value, text in rows if name != "OK"]


def test_one_class_per_code_of_the_header():
    codes = header_codes()
    assert len(codes) == 12
    assert {name for name, _, _ in codes} == set(NAMES)
    for name, value, text in codes:
        cls = getattr(unimem, NAMES[name])
        assert issubclass(cls, unimem.Error)
        assert cls.code == value
        assert cls.__doc__ == f"UM_{name} ({value}): {text}."
        assert NAMES[name] in unimem.__all__
    assert [row[:3] for row in unimem._core._errors()] == [
        (value, "UM_" + name, NAMES[name]) for name, value, _ in codes]


def test_error_carries_code_name_message():
    e = unimem.Error(-1, "UM_EINVAL", "bad")
    assert (e.code, e.name, e.message) == (-1, "UM_EINVAL", "bad")
    assert e.args == (-1, "UM_EINVAL", "bad")
    assert str(e) == "UM_EINVAL: bad"


def test_builtin_bases():
    assert issubclass(unimem.InvalidArgument, ValueError)
    assert issubclass(unimem.OutOfRange, ValueError)
    assert issubclass(unimem.Overflow, OverflowError)
    assert issubclass(unimem.OutOfMemory, MemoryError)
    assert not issubclass(unimem.InvalidState, ValueError)


def test_raised_error_has_the_library_message(cpu):
    b = cpu.alloc(16, location="host")
    with pytest.raises(unimem.OutOfRange) as info:
        b.copy_from(bytes(17))
    e = info.value
    assert (e.code, e.name) == (-2, "UM_ERANGE")
    assert "outside" in e.message and "16 bytes" in e.message
    assert str(e) == "UM_ERANGE: " + e.message
