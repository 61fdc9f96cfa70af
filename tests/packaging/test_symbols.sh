#!/bin/sh
# The shared library exports the um_ API and nothing else, its SONAME
# follows the major version, and it does not link any vendor library
# (OpenCL, CUDA and UCX are loaded at run time). The static library's
# global symbols are all um_ or um__ names, so that a program linking it
# statically never meets one of its own names.
#
#   test_symbols.sh LIBRARY MAJOR [STATIC_LIBRARY]
set -eu
lib=$1
major=$2
static=${3:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in nm readelf; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool is not installed" >&2; exit 77; }
done

# Every defined dynamic symbol is um_*, or one the linker itself defines.
exported=$(nm -D --defined-only "$lib" | awk '{ print $NF }')
[ -n "$exported" ] || fail "no exported symbols in $lib"
others=$(echo "$exported" | grep -Ev '^um_' | grep -Ev '^(_init|_fini|_edata|_end|__bss_start)$' || true)
[ -z "$others" ] || fail "exported beyond the um_ API: $(echo "$others" | tr '\n' ' ')"
# ... and none of the internal um__ names.
internal=$(echo "$exported" | grep -E '^um__' || true)
[ -z "$internal" ] || fail "internal symbols exported: $(echo "$internal" | tr '\n' ' ')"
echo "exported: $(echo "$exported" | grep -c '^um_') um_ functions, nothing else"

dyn=$(readelf -d "$lib")
echo "$dyn" | grep -q "Library soname: \[libunimem.so.$major\]" ||
  fail "SONAME is not libunimem.so.$major: $(echo "$dyn" | grep SONAME)"
if echo "$dyn" | grep NEEDED | grep -Eiq 'libOpenCL|libcuda|libnvidia|libucp|libucs|libuct'; then
  fail "links a vendor library: $(echo "$dyn" | grep NEEDED | tr '\n' ' ')"
fi
echo "SONAME libunimem.so.$major; NEEDED: $(echo "$dyn" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')"
if [ -n "$static" ]; then
  globals=$(nm -g --defined-only "$static" | awk 'NF == 3 { print $3 }' | sort -u)
  foreign=$(echo "$globals" | grep -Ev '^um_' || true)
  [ -z "$foreign" ] || fail "$static defines global names outside um_/um__: $(echo "$foreign" | tr '\n' ' ')"
  echo "static: $(echo "$globals" | grep -c '^um') global names, all um_ or um__"
fi
echo "PASS"
