#!/bin/sh
# Install the build tree into a temporary prefix and import the installed
# unimem package from there: the extension must load the installed
# libunimem (through its RPATH), not the build tree's.
#
#   install_check.sh BUILD_DIR PYTHON
set -eu
build=$1
python=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/unimem-pyinstall-XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "install"; }
init=$(find "$prefix" -path '*/unimem/__init__.py' | head -n 1)
[ -n "$init" ] || fail "no unimem/__init__.py under $prefix"
site=$(dirname "$(dirname "$init")")
ext=$(find "$site/unimem" -name '_core*.so' | head -n 1)
[ -n "$ext" ] || fail "no unimem/_core*.so next to $init"
echo "installed: ${site#"$prefix"/}/unimem ($(basename "$ext"))"

cd "$work"
PYTHONPATH=$site "$python" - "$prefix" <<'PY' || fail "the installed package does not work"
import os, sys
import unimem
prefix = os.path.realpath(sys.argv[1])
assert os.path.realpath(unimem.__file__).startswith(prefix), unimem.__file__
with unimem.Manager(backends="cpu") as m, m.alloc(16, location="host") as b:
    b.copy_from(b"installed unimem")
    assert bytes(memoryview(b)) == b"installed unimem"
import ctypes, unimem.torch, unimem.cupy, unimem.numba  # noqa: F401  (the allocators' modules)
torch_lib = unimem.torch.library_path()
assert os.path.realpath(torch_lib).startswith(prefix), torch_lib
ctypes.CDLL(torch_lib).unimem_torch_live  # loads, with the installed libunimem
libs = [line.split()[-1] for line in open("/proc/self/maps") if "libunimem.so" in line]
assert libs and all(os.path.realpath(p).startswith(prefix) for p in libs), libs
print("imported", unimem.__file__, "version", unimem.__version__, "with", sorted(set(libs))[0])
PY
echo "PASS"
