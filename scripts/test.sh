#!/usr/bin/env bash
# The whole unimem test suite, as CI runs it:
#   1. gcc, Debug, -Wall -Wextra -Werror: every CTest test (cpu, OpenCL on
#      PoCL with one and two devices, the CUDA loader against a fake driver,
#      packaging, the tool, the examples, the fuzz corpus replay);
#   2. clang, Release, -Werror: the same tests;
#   3. ASan+UBSan (clang) and 4. TSan (clang): the same tests;
#   5. a bounded libFuzzer run (clang);
#   6. valgrind memcheck over the core tests;
#   7. the API reference (Doxygen, warnings are errors).
# Tests that need an NVIDIA GPU carry the label "gpu" and say why they skip.
# Usage: scripts/test.sh [--fast]   (--fast: stage 1 only)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scripts/deps.sh || exit 1

jobs=2
fast=0
[ "${1:-}" = "--fast" ] && fast=1
fuzz_seconds=${UNIMEM_FUZZ_SECONDS:-60}

total_pass=0 total_fail=0 total_skip=0
failed_stages=()

# Configure, build, run ctest in one build directory; add its counts.
stage() {
  local name=$1 dir=$2; shift 2
  echo
  echo "=== $name ==="
  local start=$SECONDS
  if ! cmake -S "$root" -B "$dir" "$@" >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; failed_stages+=("$name: configure"); return
  fi
  if ! cmake --build "$dir" -j"$jobs" >"$dir.build.log" 2>&1; then
    grep -E "error:|warning:|Error [0-9]" "$dir.build.log" | head -40
    failed_stages+=("$name: build"); return
  fi
  local log="$dir.ctest.log"
  (cd "$dir" && ctest -j"$jobs" --output-on-failure --timeout 600) >"$log" 2>&1
  local rc=$?
  grep -E "Test +#|tests passed|Skipped|Failed|\*\*\*" "$log" | sed 's/^/  /'
  local summary pass fail total skip
  summary=$(grep -E "tests passed, [0-9]+ tests? failed out of" "$log" | tail -1)
  total=$(echo "$summary" | sed -E 's/.*out of ([0-9]+).*/\1/')
  fail=$(echo "$summary" | sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/')
  skip=$(grep -c "\*\*\*Skipped" "$log")
  [ -n "$total" ] || { total=0; fail=1; }
  pass=$((total - fail - skip))
  total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail)); total_skip=$((total_skip + skip))
  if [ $rc -ne 0 ] || [ "$fail" -ne 0 ]; then
    failed_stages+=("$name: $fail failed"); sed -n '/The following tests FAILED/,$p' "$log"
    # What each failed test printed (--output-on-failure puts it after the
    # test's line), its last 40 lines, so that a failure seen only here can
    # be read without the machine.
    awk '/Test +#[0-9]+:/ { if (n) flush(); on = ($0 ~ /\*\*\*(Failed|Timeout|Exception)|Failed +[0-9.]+ sec/); n = 0;
                            if (on) { print "  --- output of" substr($0, index($0, ":") + 1) } next }
         /tests passed, / { if (n) flush(); on = 0 }
         on { buf[n++ % 40] = $0 }
         function flush(  i, k) { k = n > 40 ? n - 40 : 0; for (i = k; i < n; i++) print "  | " buf[i % 40]; n = 0 }
         END { if (n) flush() }' "$log"
  fi
  # A sanitizer report in a test that passed (LeakSanitizer reports when a
  # Criterion test process exits, after the test was counted) fails the
  # stage too: every test's output is in LastTest.log.
  local reports
  reports=$(grep -cE "ERROR: (LeakSanitizer|AddressSanitizer)|WARNING: ThreadSanitizer|runtime error:" \
            "$dir/Testing/Temporary/LastTest.log" 2>/dev/null)
  if [ "${reports:-0}" -ne 0 ]; then
    failed_stages+=("$name: $reports sanitizer report(s)")
    grep -nE -A12 "ERROR: (LeakSanitizer|AddressSanitizer)|WARNING: ThreadSanitizer|runtime error:" \
      "$dir/Testing/Temporary/LastTest.log" | head -60
  fi
  # Say loudly why GPU tests skipped.
  (cd "$dir" && ctest -L gpu -V 2>/dev/null | grep -iE "skip" | sort -u | head -5 | sed 's/^/  gpu: /')
  echo "  ($name: $pass passed, $fail failed, $skip skipped, $((SECONDS - start)) s)"
}

mkdir -p build-ci
stage "gcc Debug -Werror" build-ci/gcc -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=gcc
if [ $fast -eq 0 ]; then
  stage "clang Release -Werror" build-ci/clang -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang
  stage "ASan+UBSan (clang)" build-ci/asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DUNIMEM_SANITIZE=address
  stage "TSan (clang)" build-ci/tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DUNIMEM_SANITIZE=thread

  echo; echo "=== libFuzzer, ${fuzz_seconds} s ==="
  if tests/reliability/fuzz/run.sh "$fuzz_seconds" >build-ci/fuzz.log 2>&1; then
    grep -E "^Done|number_of_executed_units|average_exec_per_sec|^stat::workers" build-ci/fuzz.log | sed 's/^/  /'
    total_pass=$((total_pass + 1))
  else
    tail -40 build-ci/fuzz.log; total_fail=$((total_fail + 1)); failed_stages+=("fuzz")
  fi

  echo; echo "=== valgrind memcheck ==="
  if tests/reliability/valgrind.sh build-ci/gcc; then total_pass=$((total_pass + 1)); else total_fail=$((total_fail + 1)); failed_stages+=("valgrind"); fi

  echo; echo "=== API reference (doxygen, warnings are errors) ==="
  if (cd "$root" && doxygen docs/Doxyfile >build-ci/doxygen.log 2>&1); then
    echo "  docs/api generated, no warnings"; total_pass=$((total_pass + 1))
  else
    cat build-ci/doxygen.log | tail -20; total_fail=$((total_fail + 1)); failed_stages+=("doxygen")
  fi
fi

echo
if [ ${#failed_stages[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed_stages[@]}"
fi
echo "unimem: $total_pass passed, $total_fail failed, $total_skip skipped"
[ $total_fail -eq 0 ] && [ ${#failed_stages[@]} -eq 0 ]
