#!/usr/bin/env bash
# valgrind memcheck over the test suite, or the part of it that fits in
# about five minutes on two cores (Criterion runs every test in its own
# child process, and each child pays valgrind's start-up).
#
#   tests/reliability/valgrind.sh BUILD_DIR [TEST...]
#
# BUILD_DIR is a normal (not sanitizer) build with the tests built. With no
# TEST named, runs the default set below: the fault-injection, misuse and
# stress tests, the fuzz corpus replay, the seeds' tests, the map,
# leak-report, bad-input, statistics, asynchronous, wrap and streaming
# tests, DLPack (cpu and PoCL), and the CUDA backend against the fake
# driver (those that exist
# in BUILD_DIR); tests that time a timer (the pool's trim timer) are left
# out: valgrind slows them past their deadlines.
# TEST=all runs every test_* executable. Fails (exit 1) on any memcheck
# error, on memory definitely lost, or on a failing test; prints one
# summary line per test and "valgrind: N programs, 0 errors, 0 bytes
# definitely lost" at the end.
set -uo pipefail
build=${1:?usage: tests/reliability/valgrind.sh BUILD_DIR [TEST...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(test_faults test_misuse test_stress fuzz_corpus stress_standalone test_seeds
         test_map test_leak test_errors test_stats test_async test_wrap test_stream
         test_fakecuda_api test_dlpack test_opencl_dlpack)
elif [ "${tests[0]}" = all ]; then
  tests=(fuzz_corpus)
  for t in "$build"/tests/test_*; do
    [ -x "$t" ] && tests+=("$(basename "$t")")
  done
fi
command -v valgrind >/dev/null || { echo "valgrind: not installed (apt-get install valgrind)"; exit 1; }

logs=$(mktemp -d)
supp=()
for s in "$root"/tests/reliability/valgrind/*.supp; do
  [ -f "$s" ] && supp+=("--suppressions=$s")
done
# PoCL builds kernels by running the toolchain (ld, clang): those children
# are not unimem's and are not traced (traced, ld's own leaks fail the link).
vg=(valgrind --tool=memcheck --trace-children=yes
    --trace-children-skip='*/ld,*/ld.*,*/*-ld,*/*-ld.*,*/clang,*/clang-*,*/llvm-*' --leak-check=full
    --errors-for-leak-kinds=definite --show-leak-kinds=definite --track-fds=no
    --error-exitcode=99 --log-file="$logs/%q{UM_VG_TEST}.%p.log" "${supp[@]}")

status=0 programs=0
for t in "${tests[@]}"; do
  if [ "$t" = fuzz_corpus ]; then
    cmd=("$build/tests/fuzz_api_replay" "$root"/tests/reliability/fuzz/corpus/*)
  else
    cmd=("$build/tests/$t" --jobs=1)
  fi
  if [ ! -x "${cmd[0]}" ]; then
    echo "  $t: not built in $build, skipped"
    continue
  fi
  start=$SECONDS
  UM_VG_TEST=$t "${vg[@]}" "${cmd[@]}" >"$logs/$t.out" 2>&1
  rc=$?
  programs=$((programs + 1))
  errs=$(cat "$logs/$t".*.log | sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' | awk '{s += $1} END {print s + 0}')
  lost=$(cat "$logs/$t".*.log | sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' | tr -d , |
         awk '{s += $1} END {print s + 0}')
  nproc=$(ls "$logs/$t".*.log | wc -l)
  echo "  $t: exit $rc, $nproc processes, $errs errors, $lost bytes definitely lost ($((SECONDS - start)) s)"
  if [ "$rc" -ne 0 ] || [ "$errs" -ne 0 ] || [ "$lost" -ne 0 ]; then
    status=1
    tail -20 "$logs/$t.out"
    grep -l -E "ERROR SUMMARY: [1-9]|definitely lost: [1-9]" "$logs/$t".*.log | head -3 | xargs -r cat | head -80
  fi
done
if [ $status -eq 0 ]; then
  echo "valgrind: $programs programs, 0 errors, 0 bytes definitely lost"
  rm -rf "$logs"
else
  echo "valgrind: FAILED (logs in $logs)"
fi
exit $status
