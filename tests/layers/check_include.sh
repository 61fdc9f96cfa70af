#!/bin/sh
# The include rule holds: a file compiled with base/'s view of the tree
# (cmake/layers.cmake: its include directory and UM__SEES_BASE) cannot
# include a header of ops/, even by a relative path, and the same file
# compiles with ops/'s view. Usage: check_include.sh CC SOURCE_DIR
set -u
cc=$1
top=$2
src=$top/tests/layers/forbidden_include.c
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if "$cc" -fsyntax-only -I"$top/include" -I"$top/src/base" -DUM__SEES_BASE "$src" >"$out" 2>&1; then
  echo "FAIL: base/ compiled an #include of ops/ops.h"
  exit 1
fi
if ! grep -q "may not include" "$out"; then
  echo "FAIL: the forbidden include failed, but not with the layer's message:"
  cat "$out"
  exit 1
fi
views=""
for f in base backend device mem core ops; do
  views="$views -I$top/src/$f -DUM__SEES_$(echo $f | tr a-z A-Z)"
done
# shellcheck disable=SC2086
if ! "$cc" -fsyntax-only -D_GNU_SOURCE -I"$top/include" -I"$top/src" $views "$src" >"$out" 2>&1; then
  echo "FAIL: with ops/'s view the same include does not compile:"
  cat "$out"
  exit 1
fi
echo "ok: base/ cannot include ops/ops.h; ops/ can"
