#!/bin/sh
# static_parts.sh CORE_BINARY FULL_BINARY: both run clean, and the static
# link really left the operation layer out of the first and put it and the
# brackets into the second (static_parts.c says why it matters).
set -eu
core=$1
full=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v nm >/dev/null 2>&1 || { echo "SKIP: nm is not installed" >&2; exit 77; }
"$core" || fail "$core"
"$full" || fail "$full"
if nm "$core" | grep -q ' um__engine_start$'; then fail "$core links the engine: nothing tests a part left out"; fi
nm "$full" | grep -q ' um__engine_start$' || fail "$full lacks the engine"
nm "$full" | grep -q ' um__access_take_locked$' || fail "$full lacks the brackets"
echo "PASS: a static link carries the parts it calls, and works with or without the operation layer"
