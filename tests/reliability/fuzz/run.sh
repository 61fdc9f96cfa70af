#!/usr/bin/env bash
# Build the libFuzzer target (clang, ASan+UBSan) and fuzz the API for a
# bounded time, starting from the kept corpus.
#
#   tests/reliability/fuzz/run.sh [SECONDS]      default 60
#
# Environment: UNIMEM_FUZZ_BUILD_DIR (default build-fuzz in the source
# tree), JOBS (build parallelism, default 2), FUZZ_FLAGS (extra libFuzzer
# flags), FUZZ_WORKERS (fuzzing processes, default the number of cores, at
# most 8). New inputs go to a scratch directory, not to the kept corpus; to
# refresh the corpus, merge: fuzz_api -merge=1 tests/reliability/fuzz/corpus DIR.
#
# One process keeps about one core busy, but much of an input's time is
# thread hand-offs (a device's queue thread, the core's workers), during
# which the other core idles: a second process on 2 cores nearly doubles
# the executions (one process 4,233-4,785/s, two 4,523 + 4,658/s, in 60 s
# runs side by side on 2 shared cores). With more than one worker,
# libFuzzer's -jobs runs them at once on a shared scratch corpus (each
# picks up what the others found), each its log in a scratch directory;
# the logs are printed one after the other, then the totals:
#   stat::workers: W
#   stat::number_of_executed_units_all_workers: N
#   stat::average_exec_per_sec_all_workers: N / SECONDS
# With one worker the last lines are libFuzzer's own final statistics
# (stat::number_of_executed_units, stat::average_exec_per_sec, ...). The
# exit status is non-zero when any worker failed (a crash, a leak, a
# timeout, a model mismatch).
set -euo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${UNIMEM_FUZZ_BUILD_DIR:-$root/build-fuzz}

cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DUNIMEM_BUILD_FUZZ=ON -DUNIMEM_BUILD_TESTS=OFF -DUNIMEM_BUILD_BENCH=OFF \
  -DUNIMEM_BUILD_TOOLS=OFF -DUNIMEM_BUILD_EXAMPLES=OFF \
  -DUNIMEM_ENABLE_OPENCL=OFF -DUNIMEM_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" --target fuzz_api -j"${JOBS:-2}"

# New inputs are files: on tmpfs where there is one (creating a thousand
# files a minute on ext4 took 7% of the run).
tmp=${TMPDIR:-/tmp}
[ -d /dev/shm ] && [ -w /dev/shm ] && tmp=/dev/shm
# One scratch directory: new/ the inputs found (libFuzzer reads its corpus
# directories recursively, so the workers' logs stay out of it: logs/).
work=$(mktemp -d -p "$tmp" --suffix=.unimem-fuzz)
trap 'rm -rf "$work"' EXIT
scratch=$work/new
logs=$work/logs
mkdir "$scratch" "$logs"
echo "fuzzing for ${secs}s from $(ls "$root/tests/reliability/fuzz/corpus" | wc -l) corpus inputs"
# -detect_leaks=0: libFuzzer's leak check after every input. An input that
# ends with more mallocs than frees (the first one of a configuration makes
# its manager, which is kept; event slabs and thread caches grow) is run
# twice and then LeakSanitizer scans the whole heap (600 MB here): that was
# a third of the run's time. What stays: LeakSanitizer at the end of the
# run (exit status 1 on a leak), the harness's own checks after every input
# (no buffer, no byte in use or pooled, no fault device block left) and at
# every destroy (um_manager_destroy finds no leak), and the fuzz_corpus
# replay under ASan. FUZZ_FLAGS=-detect_leaks=1 turns it back on (later
# flags win).
# ASan's quarantine of freed memory: 64 MiB instead of 256. An input frees
# a few MiB at most, so a use after free is still caught within the input
# that freed and the next dozens; with 256 MiB the allocator kept handing
# out fresh pages (page faults and a cold cache: 15% more time per input,
# RSS 600 MiB instead of 240). Options given in ASAN_OPTIONS win.
export ASAN_OPTIONS="quarantine_size_mb=64${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
workers=${FUZZ_WORKERS:-$(nproc 2>/dev/null || echo 1)}
case $workers in '' | *[!0-9]*) workers=1 ;; esac
[ "$workers" -lt 1 ] && workers=1
[ "$workers" -gt 8 ] && workers=8
flags=(-max_total_time="$secs" -max_len=4096 -timeout=30 -rss_limit_mb=4096 -print_final_stats=1
  -detect_leaks=0 -artifact_prefix="$build/")
if [ "$workers" -eq 1 ]; then
  # shellcheck disable=SC2086
  "$build/tests/fuzz/fuzz_api" "${flags[@]}" ${FUZZ_FLAGS:-} "$scratch" "$root/tests/reliability/fuzz/corpus"
  exit 0
fi
echo "$workers workers (libFuzzer -jobs=$workers -workers=$workers), their logs below"
rc=0
# shellcheck disable=SC2086
(cd "$logs" && "$build/tests/fuzz/fuzz_api" -jobs="$workers" -workers="$workers" "${flags[@]}" ${FUZZ_FLAGS:-} \
  "$scratch" "$root/tests/reliability/fuzz/corpus") >"$logs/parent.log" 2>&1 || rc=$?
total=0
for log in "$logs"/fuzz-*.log; do
  echo "=== worker ${log##*/fuzz-}"
  cat "$log"
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  total=$((total + ${n:-0}))
done
if [ "$rc" -ne 0 ]; then
  echo "=== libFuzzer's parent (exit $rc)"
  cat "$logs/parent.log"
fi
echo "stat::workers: $workers"
echo "stat::number_of_executed_units_all_workers: $total"
[ "$secs" -gt 0 ] && echo "stat::average_exec_per_sec_all_workers: $((total / secs))"
exit "$rc"
