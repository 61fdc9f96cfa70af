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
