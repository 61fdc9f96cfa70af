"""Seeing the memory from Python: with m.tag(name), m.tag_stats(),
m.snapshot(), with m.history() as h (events in order, h.save as trace-event
JSON), unimem.dump_snapshot in the format PyTorch's memory_viz reads; and
tags dropped at the wrong moment (an exception inside the block, a thread
of its own)."""
import json
import pickle
import threading

import numpy
import pytest

import unimem


@pytest.fixture
def m():
    with unimem.Manager(backends="cpu") as mgr:
        yield mgr


def test_tags_count_what_they_cover(m):
    assert m.tag_stats() == {}
    with m.tag("attention"):
        a = m.alloc(1000)
        with m.tag("kv"):
            b = m.alloc(3000)
        c = m.alloc(500, tag="weights")
    u = m.alloc(100)
    t = m.tag_stats()
    assert list(t) == ["", "attention", "kv", "weights"]
    assert t["attention"]["bytes_in_use"] == 1000 and t["attention"]["active_buffers"] == 1
    assert t["kv"]["bytes_in_use"] == 3000
    assert t["weights"]["bytes_in_use"] == 500
    assert t[""]["bytes_in_use"] == 100
    b.release()
    t = m.tag_stats(device=0)
    assert t["kv"]["bytes_in_use"] == 0 and t["kv"]["peak_bytes_in_use"] == 3000 and t["kv"]["releases"] == 1
    for x in (a, c, u):
        x.release()
    assert all(v["bytes_in_use"] == 0 for v in m.tag_stats().values())


def test_copies_count_for_the_tag(m):
    x = m.alloc(4096)
    with m.tag("io"):
        x.copy_from(numpy.zeros(1024, numpy.float32))
    assert m.tag_stats()["io"]["bytes_h2d"] == 4096  # as m.stats() counts it, on the cpu device too
    x.release()


def test_a_tag_ends_with_its_block_even_on_an_exception(m):
    with pytest.raises(KeyError):
        with m.tag("failing"):
            raise KeyError("x")
    with pytest.raises(unimem.InvalidState):
        m._tag_pop()  # nothing left open
    with pytest.raises(TypeError):
        m.tag(3)
    with pytest.raises(unimem.InvalidArgument):
        with m.tag(""):
            pass


def test_tags_are_per_thread(m):
    seen = {}

    def worker():
        with m.tag("worker"):
            seen["b"] = m.alloc(64)

    with m.tag("main"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        a = m.alloc(32)
    tags = {b["tag"] for b in m.snapshot()["blocks"] if b["state"] == "in_use"}
    assert tags == {"main", "worker"}
    assert m.tag_stats()["worker"]["bytes_in_use"] == 64
    seen["b"].release()
    a.release()


def test_snapshot_after_a_known_sequence(m):
    with m.tag("model"):
        a = m.alloc(1000)
    b = m.alloc(3000)
    c = m.alloc(5000)
    c.release()
    s = m.snapshot()
    live = [k for k in s["blocks"] if k["state"] == "in_use"]
    idle = [k for k in s["blocks"] if k["state"] == "idle"]
    assert sorted(k["size"] for k in live) == [1000, 3000]
    assert [k["tag"] for k in live if k["size"] == 1000] == ["model"]
    assert len(idle) == 1 and idle[0]["size"] == 5120
    for g, seg in enumerate(s["segments"]):
        mine = sorted((k for k in s["blocks"] if k["segment"] == g), key=lambda k: k["offset"])
        at = 0
        for k in mine:
            assert k["offset"] == at
            at += k["capacity"]
        assert at == seg["size"], "the blocks of segment %d tile it" % g
    a.release()
    b.release()


def test_history_of_a_known_program(m, tmp_path):
    out = numpy.empty(256, numpy.float32)
    with m.history(64) as h:
        with m.tag("step"):
            x = m.alloc(1024)
            x.copy_from(numpy.ones(256, numpy.float32))
            x.copy_to(out)
        x.release()
    ev = h.events()
    assert [e["kind"] for e in ev] == ["alloc", "copy", "copy", "release"]
    assert ev[0]["tag"] == "step" and ev[0]["bytes"] == 1024 and ev[0]["how"] in ("pool", "carve", "device")
    assert ev[1]["begin_ns"] <= ev[1]["end_ns"]
    assert ev[3]["in_use"] == 0 and h.dropped == 0
    path = tmp_path / "h.json"
    h.save(path)
    doc = json.loads(path.read_text())
    phases = {"M": ("name", "pid", "args"), "X": ("name", "ts", "dur", "pid", "tid"),
              "i": ("name", "ts", "pid", "tid", "s"), "C": ("name", "ts", "pid", "args")}
    kinds = []
    for e in doc["traceEvents"]:
        assert e["ph"] in phases, e
        for k in phases[e["ph"]]:
            assert k in e, (k, e)
        if e["ph"] in "Xi":
            kinds.append(e["cat"])
    assert kinds == ["alloc", "copy", "copy", "release"]
    with pytest.raises(unimem.InvalidState):
        h.stop()


def test_history_ring_drops_the_oldest(m):
    with m.history(capacity=4) as h:
        for i in range(1, 11):
            m.alloc(i * 100).release()
    ev = h.events()
    assert len(ev) == 4 and h.dropped == 16
    assert [e["bytes"] for e in ev] == [900, 900, 1000, 1000]
    with pytest.raises(unimem.InvalidArgument):
        m.history(capacity=0).start()


def test_dump_snapshot_in_memory_viz_format(m, tmp_path):
    with m.history() as h:
        with m.tag("weights"):
            w = m.alloc(2 << 20)
        a = m.alloc(4096)
        a.release()
    path = tmp_path / "snap.pickle"
    unimem.dump_snapshot(m, path, history=h)
    snap = pickle.loads(path.read_bytes())
    assert set(snap) >= {"segments", "device_traces"}
    blocks = [b for g in snap["segments"] for b in g["blocks"]]
    for g in snap["segments"]:
        assert {"device", "address", "total_size", "allocated_size", "active_size", "stream",
                "segment_type", "blocks"} <= set(g)
        assert sum(b["size"] for b in g["blocks"]) <= g["total_size"]
    for b in blocks:
        assert {"address", "size", "requested_size", "state", "frames"} <= set(b)
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
    live = [b for b in blocks if b["state"] == "active_allocated"]
    assert len(live) == 1 and live[0]["requested_size"] == 2 << 20
    assert live[0]["frames"][0]["name"] == "weights"
    actions = [t["action"] for t in snap["device_traces"][0]]
    assert actions == ["alloc", "alloc", "free_completed"]
    w.release()


def test_oom_snapshot_option():
    assert "oom_snapshot" in unimem.OPTION_NAMES
    with unimem.Manager(backends="cpu", oom_snapshot="/tmp/x-%p.json") as m:
        assert m.snapshot()["blocks"] == []
    with pytest.raises(unimem.InvalidArgument):
        unimem.Manager(backends="cpu", oom_snapshot="x" * 300)


def test_an_exception_is_not_replaced_when_the_manager_closes_inside():
    m = unimem.Manager(backends="cpu")
    with pytest.raises(KeyError):
        with m.tag("t"):
            m.close()
            raise KeyError("mine")
    m2 = unimem.Manager(backends="cpu")
    with pytest.raises(KeyError):
        with m2.history():
            m2.close()
            raise KeyError("mine")
