#!/bin/sh
# Install a built tree into a temporary prefix, check what is there, and
# build and run a consumer program against it both ways: find_package(unimem)
# (shared and static targets) and pkg-config (shared and static). The
# installed unimem command runs against the installed shared library and,
# run from elsewhere, replays the allocation trace installed beside it.
#
#   test_install.sh BUILD_DIR SOURCE_DIR C_COMPILER [EXTRA_CFLAGS]
#
# EXTRA_CFLAGS carries the sanitizer flags of a sanitizer build, whose
# libraries need the same runtime in the consumer. Exit 0 on success, 1 on
# the first failure (with what failed), 77 when a needed tool is missing.
set -eu

build=$1
src=$2
cc=$3
extra=${4:-}

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "--- $*"; }

for tool in cmake pkg-config readelf; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool is not installed" >&2; exit 77; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/unimem-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

major=$(sed -n 's/^#define UM_VERSION_MAJOR \([0-9]*\).*/\1/p' "$src/include/unimem_version.h")
minor=$(sed -n 's/^#define UM_VERSION_MINOR \([0-9]*\).*/\1/p' "$src/include/unimem_version.h")
[ -n "$major" ] && [ -n "$minor" ] || fail "cannot read the version from unimem_version.h"

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "install"; }

libso=$(find "$prefix" -name "libunimem.so.$major" | head -n 1)
[ -n "$libso" ] || fail "no libunimem.so.$major installed"
libdir=$(dirname "$libso")
for f in "$prefix/include/unimem.h" "$prefix/include/unimem_version.h" "$libdir/libunimem.so" \
         "$libdir/libunimem.a" "$libdir/cmake/unimem/unimemConfig.cmake" \
         "$libdir/cmake/unimem/unimemConfigVersion.cmake" "$libdir/cmake/unimem/unimemTargets.cmake" \
         "$libdir/pkgconfig/unimem.pc" "$prefix/bin/unimem"; do
  [ -e "$f" ] || fail "missing after install: ${f#"$prefix"/}"
done
traces=$(find "$prefix" -path "*/unimem/traces/mixed.txt" | head -n 1)
[ -n "$traces" ] || fail "no unimem/traces/mixed.txt installed"
echo "installed: headers, libunimem.so.$major, libunimem.a, CMake package, unimem.pc, bin/unimem, ${traces#"$prefix"/}"

step "installed unimem --version"
"$prefix/bin/unimem" --version | grep -q "^unimem $major\.$minor\." || fail "bin/unimem --version"

step "the unimem command links the shared library, and installed loads the installed one"
for t in "$build/tools/unimem" "$prefix/bin/unimem"; do
  [ -e "$t" ] || continue
  readelf -d "$t" | grep -q "(NEEDED).*\[libunimem\.so\.$major\]" ||
    { readelf -d "$t" | grep NEEDED; fail "$t does not link libunimem.so.$major"; }
done
loaded=$(env -u LD_LIBRARY_PATH ldd "$prefix/bin/unimem" | awk '/libunimem\.so/ { print $3 }')
[ -n "$loaded" ] && [ "$(readlink -f "$loaded")" = "$(readlink -f "$libso")" ] ||
  { ldd "$prefix/bin/unimem"; fail "bin/unimem does not load $libso"; }
# The traces' directory in the source tree is not built into the command
# (sanitizers keep source file names: the check is for the traces only).
if readelf -p .rodata "$prefix/bin/unimem" | grep -qF "$src/bench/traces"; then
  fail "bin/unimem holds the source tree's $src/bench/traces"
fi

step "installed unimem bench pool --quick, from another directory, replays the installed trace"
(cd "$work" && env -u UNIMEM_TRACE_DIR -u LD_LIBRARY_PATH "$prefix/bin/unimem" bench pool --quick) >"$work/pool.log" 2>&1 ||
  { cat "$work/pool.log"; fail "installed unimem bench pool --quick"; }
want="Trace replay: $(cd "$(dirname "$traces")" && pwd -P)/mixed.txt"
grep -qxF "$want" "$work/pool.log" || { cat "$work/pool.log"; fail "the installed command did not replay $traces"; }
grep -q "^  mixed, calls only " "$work/pool.log" || { cat "$work/pool.log"; fail "no trace-replay row"; }
echo "$want"

step "the header alone, strict C11"
printf '#include <unimem.h>\nint main(void) { return um_version() == UM_VERSION_HEX ? 0 : 1; }\n' >"$work/strict.c"
# shellcheck disable=SC2086
"$cc" -std=c11 -pedantic -Wall -Wextra -Werror $extra -I"$prefix/include" -c "$work/strict.c" -o "$work/strict.o" ||
  fail "unimem.h does not compile alone with -std=c11 -pedantic -Werror"

step "find_package(unimem $major.$minor): shared and static targets"
cmake -S "$src/tests/packaging/consumer" -B "$work/fp" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" \
  -DUNIMEM_WANT="$major.$minor" >"$work/fp.log" 2>&1 || { cat "$work/fp.log"; fail "find_package configure"; }
grep -q "found unimem $major\.$minor" "$work/fp.log" || { cat "$work/fp.log"; fail "find_package found the wrong unimem"; }
cmake --build "$work/fp" >"$work/fp-build.log" 2>&1 || { cat "$work/fp-build.log"; fail "find_package build"; }
"$work/fp/consumer_shared" || fail "consumer_shared (find_package) did not run"
"$work/fp/consumer_static" || fail "consumer_static (find_package) did not run"
# The shared consumer really uses the installed shared library.
ldd "$work/fp/consumer_shared" | grep -q "$libdir/libunimem.so.$major" ||
  { ldd "$work/fp/consumer_shared"; fail "consumer_shared does not load $libso"; }
# The static one carries the library inside.
if ldd "$work/fp/consumer_static" | grep -q libunimem; then fail "consumer_static needs libunimem.so"; fi

step "find_package(unimem $((major + 1)).0) is refused (SameMajorVersion)"
if cmake -S "$src/tests/packaging/consumer" -B "$work/fp-next" -DCMAKE_PREFIX_PATH="$prefix" \
     -DCMAKE_C_COMPILER="$cc" -DUNIMEM_WANT="$((major + 1)).0" >"$work/fp-next.log" 2>&1; then
  fail "find_package accepted version $((major + 1)).0"
fi

step "pkg-config unimem: shared and static"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion unimem)" = "$major.$minor.$(sed -n 's/^#define UM_VERSION_PATCH \([0-9]*\).*/\1/p' "$src/include/unimem_version.h")" ] ||
  fail "pkg-config --modversion says $(pkg-config --modversion unimem)"
# The .pc file finds its prefix from where it lies (relocatable).
pc_include=$(pkg-config --variable=includedir unimem)
[ "$(cd "$pc_include" && pwd -P)" = "$(cd "$prefix/include" && pwd -P)" ] ||
  fail "pkg-config's includedir $pc_include is not $prefix/include"
pc_libdir=$(pkg-config --variable=libdir unimem)
[ "$(cd "$pc_libdir" && pwd -P)" = "$(cd "$libdir" && pwd -P)" ] ||
  fail "pkg-config's libdir $pc_libdir is not $libdir"
# shellcheck disable=SC2046,SC2086
"$cc" $extra $(pkg-config --cflags unimem) "$src/tests/packaging/consumer/consumer.c" -o "$work/pc_shared" \
  $(pkg-config --libs unimem) -Wl,-rpath,"$libdir" || fail "build with pkg-config --libs"
"$work/pc_shared" || fail "pc_shared did not run"
# shellcheck disable=SC2046,SC2086
"$cc" $extra $(pkg-config --cflags unimem) "$src/tests/packaging/consumer/consumer.c" -o "$work/pc_static" \
  $(pkg-config --static --libs-only-L unimem) -Wl,-Bstatic $(pkg-config --libs-only-l unimem) -Wl,-Bdynamic \
  $(pkg-config --static --libs-only-l unimem | sed 's/-lunimem//') || fail "build with pkg-config --static"
"$work/pc_static" || fail "pc_static did not run"
if ldd "$work/pc_static" | grep -q libunimem; then fail "pc_static needs libunimem.so"; fi

echo "PASS: install, the installed command (shared library, traces), find_package (shared, static, version check),"
echo "      pkg-config (shared, static)"
