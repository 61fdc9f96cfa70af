"""A DLPack producer written with ctypes, for the tests: tensors of any
shape, strides, device, flags and version, over memory the test owns, in a
capsule, with a deleter that counts its calls (so that "exactly once" is
checked), and the capsule's name as a consumer leaves it."""

import ctypes

import numpy

LEGACY = b"dltensor"
VERSIONED = b"dltensor_versioned"


class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32), ("dtype", DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", Version), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", Tensor)]


assert ctypes.sizeof(Managed) == 64 and ctypes.sizeof(ManagedVersioned) == 80

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def capsule_name(capsule):
    return _capsule_name(capsule).decode()


class Producer:
    """One tensor over `memory` (a numpy array kept alive here). deleted
    counts deleter calls. Fields can be changed before capsule()."""

    def __init__(self, memory, shape=None, strides=None, device=(1, 0), dtype=(1, 8, 1), versioned=False,
                 flags=0, version=(1, 0), byte_offset=0, data=None):
        self.memory = memory
        self.deleted = 0
        shape = list(shape if shape is not None else [memory.nbytes])
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = (ctypes.c_int64 * len(strides))(*strides) if strides is not None else None
        self._deleter = DELETER(self._delete)
        t = Tensor()
        t.data = data if data is not None else memory.ctypes.data
        t.device = Device(*device)
        t.ndim = len(shape)
        t.dtype = DType(*dtype)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if strides is not None else None
        t.byte_offset = byte_offset
        self.versioned = versioned
        if versioned:
            self.managed = ManagedVersioned(Version(*version), None, self._deleter, flags, t)
        else:
            self.managed = Managed(t, None, self._deleter)

    def _delete(self, ptr):
        assert ptr == ctypes.addressof(self.managed)
        self.deleted += 1

    def capsule(self):
        return _new_capsule(ctypes.addressof(self.managed), VERSIONED if self.versioned else LEGACY, None)

    def __dlpack__(self, stream=None, max_version=None):
        return self.capsule()


def host_bytes(n, value=0):
    return numpy.full(n, value, dtype=numpy.uint8)
