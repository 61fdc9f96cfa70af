"""Shared fixtures of the unimem Python tests (run through CTest with the
build tree's package on PYTHONPATH; see python/tests/tests.cmake)."""

import os

import pytest
from hypothesis import HealthCheck, settings

import unimem

# No example database: nothing is written next to the sources, and every
# run explores afresh (a failure prints its reproducing example).
settings.register_profile(
    "unimem", database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("unimem")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (python -m pytest python/tests -m gpu); "
                            "skips, saying why, where there is none")


def cuda_manager():
    """A manager with a CUDA device, or a skip saying why there is none."""
    m = unimem.Manager(backends="cpu,cuda")
    if not any(d.backend == "cuda" for d in m.devices):
        m.close()
        pytest.skip("SKIP (gpu): no CUDA device here (needs an NVIDIA GPU and its driver, libcuda.so.1)")
    return m


def build_dir():
    """The build tree (PYTHONPATH's first entry is <build>/python), or None."""
    first = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    return os.path.dirname(os.path.abspath(first)) if first else None

SOURCE_DIR = os.environ.get(
    "UM_SOURCE_DIR",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


@pytest.fixture
def cpu():
    """A cpu-only manager, closed afterwards."""
    m = unimem.Manager(backends="cpu")
    yield m
    m.close()


def opencl_manager():
    """A manager with PoCL's devices (POCL_DEVICES="pthread pthread" gives
    two), or a skip saying why there is none."""
    m = unimem.Manager(backends="cpu,opencl")
    if len(m.devices) < 2:
        m.close()
        pytest.skip("no OpenCL device (install pocl-opencl-icd; POCL_DEVICES=\"pthread pthread\")")
    return m


@pytest.fixture
def ocl():
    m = opencl_manager()
    yield m
    m.close()


def header_text():
    with open(os.path.join(SOURCE_DIR, "include", "unimem.h")) as f:
        return f.read()


def header_macro(name):
    """The body of a #define NAME(XX) X-macro list of unimem.h."""
    text = header_text()
    start = text.index(f"#define {name}(XX)")
    lines = []
    for line in text[start:].splitlines():
        lines.append(line)
        if not line.rstrip().endswith("\\"):
            break
    return "\n".join(lines)
