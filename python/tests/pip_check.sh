#!/bin/sh
# The package as a Python user installs it, with Debian's tools and no
# registry: an sdist of the source tree (python3 -m build --no-isolation),
# pip install --no-build-isolation of that tree into a venv made with
# --system-site-packages, a wheel built from it, and that wheel installed
# into a second venv. Each install must load the libunimem inside its own
# package, and work.
#
#   pip_check.sh SOURCE_DIR PYTHON        (exit 77: venv, pip or build missing)
set -eu
unset PYTHONPATH  # the suite points it at the build tree: the installs must stand alone
# An ASan build preloads its runtime into every process of the suite: not into the compilers, CMake and pip
# of a user's own build (the package they make is not instrumented).
unset LD_PRELOAD PYTHONMALLOC ASAN_OPTIONS UBSAN_OPTIONS
src=$(cd "$1" && pwd)
python=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
for m in venv pip build setuptools wheel; do
  "$python" -c "import $m" 2>/dev/null || { echo "SKIP: no Python module $m (apt-get install python3-$m)"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$work/log
run() { "$@" >"$log" 2>&1 || { tail -n 40 "$log"; fail "$*"; }; }

# 1. An sdist of the tree (nothing written into the tree but the egg-info, which git ignores).
run "$python" -m build --no-isolation --sdist --outdir "$work/dist" "$src"
sdist=$(ls "$work"/dist/unimem-*.tar.gz)
mkdir "$work/tree" && tar -xzf "$sdist" -C "$work/tree"
tree=$(ls -d "$work"/tree/unimem-*)
echo "sdist: $(basename "$sdist") ($(tar -tzf "$sdist" | wc -l) files)"

check() { # VENV_PYTHON WHAT: the installed package, its libunimem, a round trip, the allocator's library
  (cd "$work" && "$1" - "$2" <<'PY') || fail "the package installed by $2 does not work"
import ctypes, os, sys, sysconfig
import unimem, unimem.torch
site = os.path.realpath(sysconfig.get_paths()["platlib"])
pkg = os.path.realpath(os.path.dirname(unimem.__file__))
assert pkg.startswith(site + os.sep), (pkg, site)
with unimem.Manager(backends="cpu") as m, m.alloc(16, location="host") as b:
    b.copy_from(b"pip-built unimem")
    assert bytes(memoryview(b)) == b"pip-built unimem"
ctypes.CDLL(unimem.torch.library_path()).unimem_torch_live
libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libunimem" in line})
assert libs and all(os.path.realpath(p).startswith(pkg + os.sep) for p in libs), libs
print(sys.argv[1] + ": unimem", unimem.__version__, "from", pkg, "with", [os.path.basename(p) for p in libs])
PY
}

# 2. pip install of the tree into a venv that sees Debian's packages.
run "$python" -m venv --system-site-packages "$work/v1"
run "$work/v1/bin/python" -m pip install --no-build-isolation --no-index "$tree"
check "$work/v1/bin/python" "pip install"

# 3. A wheel of the tree, holding the extension, the allocator and libunimem; installed elsewhere.
run "$python" -m build --no-isolation --wheel --outdir "$work/wheels" "$tree"
wheel=$(ls "$work"/wheels/unimem-*.whl)
"$python" - "$wheel" <<'PY' || fail "the wheel lacks files"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for want in ("unimem/__init__.py", "unimem/__init__.pyi", "unimem/py.typed", "unimem/libunimem.so.0",
             "unimem/libunimem_torch.so", "unimem/_core."):
    assert any(n.startswith(want) for n in names), (want, names)
print("wheel:", sys.argv[1].rsplit("/", 1)[-1], len(names), "files")
PY
run "$python" -m venv --system-site-packages "$work/v2"
run "$work/v2/bin/python" -m pip install --no-index "$wheel"
check "$work/v2/bin/python" "the wheel"
echo "PASS"
