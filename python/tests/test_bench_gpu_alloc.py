"""bench/bench_gpu_alloc.py without a GPU: --quick against the fake CUDA
driver of the build tree (unimem's rows, a note for the sizes the fake's
memory does not hold, a line for each framework that did not run, the JSON
report), and the SKIP line where there is no CUDA driver at all. The
figures against the fake mean nothing; that every row is there, measured,
does."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR, build_dir

SCRIPT = os.path.join(SOURCE_DIR, "bench", "bench_gpu_alloc.py")
MiB = 1 << 20


def fake_driver():
    fake = os.path.join(build_dir() or "", "tests", "libfakecuda_full.so")
    if not os.path.exists(fake):
        pytest.skip(f"SKIP: no fake CUDA driver at {fake} (the CUDA backend is built where cuda.h is found)")
    return fake


def run_bench(env_extra, *args):
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, SCRIPT, "--quick", *args], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# The fake's memory (FAKE_CUDA_TOTAL_MEM, default 256 MiB) decides which
# sizes fit four times over with 64 MiB to spare.
@pytest.mark.parametrize("total_mem, measured, left_out", [
    (None, ["1 KiB", "64 KiB", "1 MiB", "16 MiB"], "256 MiB, 1 GiB"),
    (4 * 256 * MiB + 64 * MiB, ["1 KiB", "64 KiB", "1 MiB", "16 MiB", "256 MiB"], "1 GiB"),
])
def test_quick_against_the_fake_driver(tmp_path, total_mem, measured, left_out):
    env = {"UNIMEM_CUDA_LIBRARY": fake_driver()}
    if total_mem is not None:
        env["FAKE_CUDA_TOTAL_MEM"] = str(total_mem)
    report = tmp_path / "gpu_alloc.json"
    out = run_bench(env, "--json", str(report))
    lines = out.splitlines()
    gib = (total_mem or 256 * MiB) / (1 << 30)
    assert lines[0].startswith(f"bench_gpu_alloc: Fake CUDA Device 0, {gib:.1f} GiB; unimem "), out
    assert lines[0].endswith(" (--quick)")
    assert f"note: sizes left out (they do not fit the GPU's memory four times over): {left_out}" in lines
    assert any(line.startswith("allocate + free from Python, median ns per pair over 5 alternating "
                               "repetitions of 200 pairs") for line in lines), out

    doc = json.loads(report.read_text())
    frameworks_run = doc["measured"][1:]
    assert doc["measured"][0] == "unimem"
    for name in ("torch", "cupy"):
        # Each framework either ran (a version line) or says why it did not.
        if name in frameworks_run:
            assert f"{name}: {doc['frameworks'][name]}" in lines
        else:
            assert f"{name}: not measured: {doc['frameworks'][name]}" in lines

    header = next(i for i, line in enumerate(lines) if line.startswith("size "))
    assert lines[header].split()[:3] == ["size", "unimem", "ns"]
    rows = lines[header + 1:]
    assert [" ".join(r.split()[:2]) for r in rows] == measured, out
    for row in rows:
        m = re.match(r"^\d+ [KMG]iB +(\d+) +(\d+\.\d)%", row)
        assert m and int(m.group(1)) > 0, row

    assert doc["bench"] == "gpu_alloc" and doc["quick"] is True and doc["device"] == "Fake CUDA Device 0"
    assert [r["name"] for r in doc["rows"]] == [f"alloc+free {s}" for s in measured]
    for r in doc["rows"]:
        assert r["table"] == "alloc" and r["pairs"] == 200 and r["reps"] == 5
        assert r["unimem_ns"] > 0 and r["unimem_spread"] >= 0
        for name in ("torch", "cupy"):
            assert (f"{name}_ns" in r) == (name in frameworks_run)
            assert (f"ratio_{name}" in r) == (name in frameworks_run)


def test_without_a_cuda_driver_one_skip_line():
    out = run_bench({"UNIMEM_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"})
    lines = out.splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("SKIP: unimem finds no CUDA device (no NVIDIA GPU or driver, or a build without "
                               "the CUDA backend); bench_gpu_alloc compares against it (torch: ")
