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
