"""Manager: options (one keyword per um_options field), devices, stats,
trim, close, the log and on_oom callbacks."""

import gc
import os
import re
import subprocess
import sys
import textwrap
import weakref

import pytest

import unimem
from conftest import header_macro, header_text, opencl_manager


def header_option_fields():
    text = header_text()
    body = text[text.index("typedef struct um_options {"):text.index("} um_options;")]
    # Comments first, across lines: a comment's continuation line may end
    # like a declaration ("... after a report;").
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for line in body.splitlines()[1:]:
        line = line.strip()
        m = re.match(r"^[\w\s\*]+?\**\s*(\w+)(\[\d+\])?;$", line)
        if m:
            fields.append(m.group(1))
    return fields


def header_stats_fields():
    return re.findall(r"XX\(\w+,\s*(\w+),", header_macro("UM_STATS_FIELDS"))


def test_one_keyword_per_option_field_of_the_header():
    fields = header_option_fields()
    assert len(fields) == 25
    assert list(unimem.OPTION_NAMES) == fields
    with unimem.Manager(backends="cpu") as m:
        assert list(m.options) == fields


def test_every_keyword_reaches_the_manager():
    def log(ctx, level, msg):
        pass

    def oom(ctx, device, nbytes):
        return False

    ctx = object()
    opts = dict(
        enable_pooling=False, max_pool_bytes=123456, max_pool_bytes_per_class=65536,
        trim_interval_ms=0, max_concurrent_transfers=3, use_pinned_staging=2,
        staging_chunk_bytes=1 << 16, pinned_pool_bytes=1 << 20, enable_peer=False,
        trim_on_pressure=False, scrub=True, debug=True, huge_pages=False,
        device_limit_bytes=1 << 30, net_timeout_ms=1234, wait_spin_ns=50000, backends="cpu", log_level="debug", log=log,
        log_ctx=ctx, on_oom=oom, oom_ctx=ctx, segments=False, oom_snapshot="/tmp/oom-%p.json",
        backtraces=True)
    assert set(opts) == set(unimem.OPTION_NAMES)
    with unimem.Manager(**opts) as m:
        assert m.options == opts
    with unimem.Manager(backends="cpu", log_level=2) as m:
        assert m.options["log_level"] == "info"
        assert m.options["log"] is None and m.options["oom_ctx"] is None


def test_environment_applies_under_keywords(monkeypatch):
    monkeypatch.setenv("UNIMEM_MAX_POOL_BYTES", "4m")
    with unimem.Manager(backends="cpu") as m:
        assert m.options["max_pool_bytes"] == 4 << 20
    with unimem.Manager(backends="cpu", max_pool_bytes=5) as m:
        assert m.options["max_pool_bytes"] == 5


def test_bad_keywords():
    with pytest.raises(TypeError, match="unexpected keyword argument 'pool'"):
        unimem.Manager(pool=True)
    with pytest.raises(TypeError, match="keyword arguments only"):
        unimem.Manager("cpu")
    with pytest.raises(TypeError, match="backends must be a str"):
        unimem.Manager(backends=1)
    with pytest.raises(TypeError, match="enable_pooling must be a bool"):
        unimem.Manager(enable_pooling="no")
    with pytest.raises(TypeError, match="max_pool_bytes must be an int"):
        unimem.Manager(max_pool_bytes=1.5)
    with pytest.raises(TypeError, match="log must be callable"):
        unimem.Manager(log=3)
    with pytest.raises(TypeError, match="log_level must be a str or an int"):
        unimem.Manager(log_level=None)


def test_bad_values_raise_the_codes():
    cases = [
        (dict(max_concurrent_transfers=0), unimem.InvalidArgument),  # the library's check
        (dict(use_pinned_staging=3), unimem.InvalidArgument),
        (dict(staging_chunk_bytes=100), unimem.InvalidArgument),
        (dict(max_pool_bytes=-1), unimem.InvalidArgument),
        (dict(max_pool_bytes=1 << 64), unimem.Overflow),
        (dict(trim_interval_ms=1 << 32), unimem.Overflow),
        (dict(wait_spin_ns=1000000001), unimem.InvalidArgument),  # over 1 s
        (dict(wait_spin_ns=1 << 32), unimem.Overflow),
        (dict(max_concurrent_transfers=1 << 31), unimem.Overflow),
        (dict(backends="x" * 128), unimem.InvalidArgument),
        (dict(backends="cpu\0"), unimem.InvalidArgument),
        (dict(log_level="loud"), unimem.InvalidArgument),
        (dict(log_level=4), unimem.InvalidArgument),
    ]
    for kwargs, cls in cases:
        with pytest.raises(cls) as info:
            unimem.Manager(backends="cpu", **kwargs) if "backends" not in kwargs else unimem.Manager(**kwargs)
        assert type(info.value) is cls, kwargs


def test_devices(cpu):
    devs = cpu.devices
    assert isinstance(devs, list) and len(devs) == 1
    d = devs[0]
    assert isinstance(d, unimem.Device)
    assert (d.index, d.backend) == (0, "cpu")
    assert d.total_bytes > 0 and d.name
    assert d.locations == ("host", "device", "pinned", "unified")
    assert tuple(d) == (d.index, d.name, d.backend, d.total_bytes, d.locations)
    devs.clear()
    assert len(cpu.devices) == 1  # a copy each time


def test_opencl_devices():
    m = opencl_manager()
    try:
        assert [d.index for d in m.devices] == list(range(len(m.devices)))
        assert {d.backend for d in m.devices[1:]} == {"opencl"}
        assert "device" in m.devices[1].locations
    finally:
        m.close()


def test_stats_has_every_field_of_the_header(cpu):
    s = cpu.stats()
    assert list(s) == header_stats_fields()
    assert [name for name, _ in unimem.stats_fields()] == list(s)
    assert isinstance(s["hit_rate"], float) and isinstance(s["fragmentation"], float)
    assert all(isinstance(v, int) for k, v in s.items() if k not in ("hit_rate", "fragmentation"))


def test_stats_after_a_known_sequence(cpu):
    b = cpu.alloc(1000, location="host")
    b.copy_from(bytes(1000))
    b.release()
    c = cpu.alloc(1000, location="host")  # the same block, from the pool
    s = cpu.stats(device=0)
    assert (s["allocations"], s["releases"], s["active_buffers"]) == (2, 1, 1)
    assert (s["pool_hits"], s["pool_misses"], s["bytes_in_use"]) == (1, 1, 1000)
    assert s["hit_rate"] == 0.5
    assert cpu.stats(cpu.devices[0]) == cpu.stats(0) == cpu.stats(None) == cpu.stats()
    c.release()
    assert cpu.stats()["bytes_pooled"] > 0
    cpu.trim()
    s = cpu.stats()
    assert (s["bytes_pooled"], s["trims"]) == (0, 1)


def test_stats_bad_device(cpu):
    with pytest.raises(unimem.NoDevice):
        cpu.stats(1)
    with pytest.raises(unimem.NoDevice):
        cpu.stats(-1)
    with pytest.raises(TypeError):
        cpu.stats("0")
    with pytest.raises(unimem.InvalidArgument, match="keep_bytes must not be negative"):
        cpu.trim(-1)


def test_close_is_idempotent_and_final():
    m = unimem.Manager(backends="cpu")
    assert not m.closed and repr(m) == "<unimem.Manager open, 1 device(s)>"
    b = m.alloc(8)
    m.close()
    m.close()
    assert m.closed and b.released
    assert repr(m) == "<unimem.Manager closed, 1 device(s)>"
    for call in (lambda: m.alloc(8), m.stats, m.trim, lambda: b.fill(0), m.__enter__):
        with pytest.raises(unimem.InvalidState):
            call()
    assert len(m.devices) == 1 and m.options["backends"] == "cpu"


def test_context_manager():
    with unimem.Manager(backends="cpu") as m:
        b = m.alloc(8)
    assert m.closed and b.released


def test_log_callback_receives_messages_in_python():
    # Backend loading happens once per process: a fresh interpreter.
    script = textwrap.dedent("""
        import unimem
        got = []
        m = unimem.Manager(backends="cpu,opencl", log_level="info", log_ctx="ctx",
                           log=lambda ctx, level, text: got.append((ctx, level, text)))
        assert len(m.devices) == 1, m.devices
        assert got and got[0][:2] == ("ctx", "info"), got
        assert "backend opencl skipped" in got[0][2], got
        m.close()
        print("ok")
    """)
    env = dict(os.environ, UNIMEM_OPENCL_LIBRARY="/nonexistent/libOpenCL.so.1")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n"
    assert "backend opencl skipped" not in r.stderr  # went to Python, not to stderr


def test_on_oom_is_asked_and_can_free_memory():
    calls = []
    m = unimem.Manager(backends="cpu,opencl", device_limit_bytes=1 << 20, oom_ctx="ctx",
                       on_oom=lambda ctx, dev, n: calls.append((ctx, dev.index, n)))
    if len(m.devices) < 2:
        m.close()
        pytest.skip("no OpenCL device (POCL_DEVICES=\"pthread pthread\")")
    with m:
        with pytest.raises(unimem.OutOfMemory) as info:
            m.alloc(2 << 20, device=1)
        assert "device_limit_bytes" in info.value.message
        assert calls == [("ctx", 1, 2 << 20)]

    held = []

    def free_one(ctx, dev, n):
        held.pop().release()
        return True

    with unimem.Manager(backends="cpu,opencl", device_limit_bytes=1 << 20, on_oom=free_one) as m:
        held.append(m.alloc(600 << 10, device=1))
        b = m.alloc(600 << 10, device=1)  # fits once free_one released the first
        assert not held and b.size == 600 << 10


def oom_manager(on_oom, ctx):
    m = unimem.Manager(backends="cpu,opencl", device_limit_bytes=1 << 20, on_oom=on_oom, oom_ctx=ctx)
    if len(m.devices) < 2:
        m.close()
        pytest.skip("no OpenCL device (POCL_DEVICES=\"pthread pthread\")")
    return m


def test_on_oom_may_close_the_manager():
    def close_it(box, dev, n):
        box[0].close()  # releases box[1]: its memory is free again
        return True

    box = []
    m = oom_manager(close_it, box)
    box += [m, m.alloc(600 << 10, device=1)]
    with pytest.raises(unimem.InvalidState, match="closed while allocating"):
        m.alloc(600 << 10, device=1)  # the retry succeeds, into a closed manager
    assert m.closed and box[1].released

    box.clear()
    m = oom_manager(close_it, box)
    box.append(m)
    with pytest.raises(unimem.OutOfMemory):
        m.alloc(2 << 20, device=1)  # more than the limit: the retry fails too
    assert m.closed


def test_on_oom_may_allocate():
    inner = []

    def alloc_inside(box, dev, n):
        inner.append(box[0].alloc(64, device=dev))  # a nested allocation on this thread
        return False

    box = []
    with oom_manager(alloc_inside, box) as m:
        box.append(m)
        with pytest.raises(unimem.OutOfMemory):
            m.alloc(2 << 20, device=1)
        assert inner[0].size == 64 and inner[0].device.index == 1
    box.clear()


def test_on_oom_exception_is_unraisable_and_declines():
    def broken(ctx, dev, n):
        raise RuntimeError("from on_oom")

    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with unimem.Manager(backends="cpu,opencl", device_limit_bytes=1 << 20, on_oom=broken) as m:
            if len(m.devices) < 2:
                pytest.skip("no OpenCL device")
            with pytest.raises(unimem.OutOfMemory):
                m.alloc(2 << 20, device=1)
    finally:
        sys.unraisablehook = old
    assert len(seen) == 1 and isinstance(seen[0].exc_value, RuntimeError)


def test_callback_cycle_is_collected():
    # manager -> log_ctx (a list) -> manager and buffer -> manager.
    box = []
    m2 = unimem.Manager(backends="cpu", log=lambda ctx, level, text: ctx.append(text), log_ctx=box)
    box.append(m2)
    b = m2.alloc(8)
    box.append(b)
    ref = weakref.ref(b)
    del m2, b, box
    gc.collect()
    assert ref() is None
