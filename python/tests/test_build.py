"""The tests exercise the package of the build tree, under the sanitizer
of the build when it has one."""

import os

import unimem


def test_package_comes_from_the_build_tree():
    build = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    if build:
        assert os.path.realpath(unimem.__file__).startswith(os.path.realpath(build))
    assert unimem._core.__file__.endswith(".so")


def test_sanitizer_runtime_is_loaded_in_sanitizer_builds():
    with open("/proc/self/maps") as f:
        maps = f.read()
    if os.environ.get("UM_EXPECT_ASAN") == "1":
        assert "libclang_rt.asan" in maps or "libasan.so" in maps
    else:
        assert "libclang_rt.asan" not in maps and "libasan.so" not in maps


def test_everything_public_is_documented():
    import inspect
    assert unimem.__doc__ and "numpy.asarray" in unimem.__doc__
    for name in unimem.__all__:
        obj = getattr(unimem, name)
        if name != "__version__":
            assert obj.__doc__, name
    for cls in (unimem.Manager, unimem.Buffer, unimem.Event, unimem.Mapping, unimem.Access):
        for attr, value in vars(cls).items():
            if attr.startswith("__") and attr not in ("__enter__", "__exit__", "__array__", "__dlpack__",
                                                      "__dlpack_device__"):
                continue
            assert value.__doc__, f"{cls.__name__}.{attr}"
            if callable(value) and attr not in ("__enter__", "__exit__"):
                inspect.signature(value)  # a usable text signature
    assert str(inspect.signature(unimem.copy)) == "(dst, src, nbytes, dst_offset=0, src_offset=0, wait=True)"
    assert str(inspect.signature(unimem.from_dlpack)) == "(m, obj)"
    assert str(inspect.signature(unimem.Buffer.__dlpack__)) == \
        "(self, /, *, stream=None, max_version=None, dl_device=None, copy=None)"
    for mod in ("torch", "cupy", "numba"):
        module = __import__("unimem." + mod, fromlist=["_"])
        assert module.__doc__ and mod in module.__doc__.lower()
