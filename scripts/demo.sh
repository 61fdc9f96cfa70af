#!/usr/bin/env bash
# The main job: build unimem (Release, in build-demo, nothing installed),
# show the devices of this machine, run the benchmarks on them and write the
# report and the chart.
#
#   scripts/demo.sh [--full]
#
# Default: the quick benchmarks (about a minute). --full: the full sizes
# and repetitions (several minutes). Output in out/ at the top of the tree:
#   out/bench.txt   the tables, as printed
#   out/bench.json  the full report (versions, machine, devices, every row)
#   out/bench.svg   the chart (when gnuplot is installed)
# Installs what is missing first (scripts/deps.sh: apt-get on Debian/Ubuntu,
# as root or through sudo). Environment: UNIMEM_* options as for any unimem program,
# JOBS (parallel build jobs, default: the number of CPUs).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
build=$root/build-demo
out=$root/out
mode=--quick
case "${1:-}" in
  "") ;;
  --full) mode="" ;;
  -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/demo.sh [--full]" >&2; exit 2 ;;
esac

scripts/deps.sh || echo "demo: scripts/deps.sh could not install everything; trying anyway" >&2

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
if [ -z "${CC:-}" ] && ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1 &&
   ! command -v clang >/dev/null 2>&1; then
  missing+=("a C compiler (gcc or clang)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "demo: missing: ${missing[*]}." >&2
  echo "demo: on Debian/Ubuntu, scripts/deps.sh installs everything unimem needs" >&2
  echo "      (or: apt-get install build-essential cmake)." >&2
  exit 1
fi
command -v gnuplot >/dev/null 2>&1 ||
  echo "demo: note: gnuplot is not installed (apt-get install gnuplot-nox): the chart is skipped" >&2

jobs=${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
echo "== configure and build (Release, $build)"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DUNIMEM_BUILD_TESTS=OFF \
  -DUNIMEM_BUILD_EXAMPLES=OFF -DUNIMEM_BUILD_BENCH=ON -DUNIMEM_BUILD_TOOLS=ON >"$build/demo-configure.log" 2>&1 ||
  { cat "$build/demo-configure.log"; echo "demo: configure failed (log above)" >&2; exit 1; }
cmake --build "$build" --target unimem_tool -j "$jobs" >"$build/demo-build.log" 2>&1 ||
  { tail -n 40 "$build/demo-build.log"; echo "demo: build failed (full log: $build/demo-build.log)" >&2; exit 1; }
tool=$build/tools/unimem

echo
echo "== unimem info"
"$tool" info

mkdir -p "$out"
echo
echo "== unimem bench all ${mode:---full sizes}"
status=0
# shellcheck disable=SC2086
"$tool" bench all $mode --json "$out/bench.json" --plot "$out/bench.svg" | tee "$out/bench.txt" ||
  status=$?

echo
echo "== where the results are"
echo "tables:      $out/bench.txt"
[ -s "$out/bench.json" ] && echo "full report: $out/bench.json"
[ -s "$out/bench.svg" ] && echo "chart:       $out/bench.svg"
echo "the unimem command: $tool (unimem --help; man docs/unimem.1)"
if [ "$status" -ne 0 ]; then
  echo "demo: a benchmark failed (exit status $status); see the tables above" >&2
fi
exit "$status"
