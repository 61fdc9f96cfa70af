"""UNIMEM_TRACE_FILE records a Python program's allocations and releases
(the variable is read when a Manager is created), in the replay format of
bench/traces."""
import os
import subprocess
import sys


def test_a_python_program_is_recorded(tmp_path):
    path = tmp_path / "py-trace.txt"
    program = (
        "import unimem\n"
        "with unimem.Manager(backends='cpu') as m:\n"
        "    a = m.alloc(1000)\n"
        "    b = m.alloc(5, location='host')\n"
        "    a.release()\n"
        "    with m.alloc(1000) as c:\n"
        "        pass\n"
        "    b.release()\n"
    )
    env = dict(os.environ, UNIMEM_TRACE_FILE=str(path))
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=60)
    lines = [l.split() for l in path.read_text().splitlines() if not l.startswith("#")]
    assert [l[:3] for l in lines] == [
        ["a", "1", "1000"],
        ["a", "2", "5"],
        ["f", "1", "0"],  # f ID DEVICE ...
        ["a", "1", "1000"],
        ["f", "1", "0"],
        ["f", "2", "0"],
    ]
    # a ID BYTES DEVICE LOCATION ...: device 0; 'device' is location 1, 'host' 0
    assert [l[3:5] for l in lines if l[0] == "a"] == [["0", "1"], ["0", "0"], ["0", "1"]]
