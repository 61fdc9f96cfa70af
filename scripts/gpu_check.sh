#!/usr/bin/env bash
# The CUDA backend on a machine with an NVIDIA GPU, in one command:
#   1. what the machine is (nvidia-smi, the driver, the toolkit);
#   2. a Release build with -DUNIMEM_ENABLE_CUDA=ON (cuda.h from CUDA_HOME,
#      default /usr/local/cuda), and readelf -d of libunimem.so: no CUDA or
#      OpenCL library may be NEEDED;
#   3. ctest -L "gpu|cuda": the GPU tests (test_cuda_gpu, the backend-level
#      real-driver case) and the fake-driver tests; on a machine with a GPU
#      a skipped GPU test is a failure here;
#   3b. the caller's own kernels (SPEC §8) on the GPU, verbosely: the PTX
#      kernel tests (test_cuda_kernels_gpu), the backend's interop
#      operations (gpu_cuda_interop_real) and examples/cuda_kernels.c; then
#      again with CUDA_DEVICE_MAX_CONNECTIONS=1, every stream on one
#      hardware queue, where a gate's cuStreamWaitValue32 blocking work the
#      gate's opener waits for would show as a hang (each test has a
#      timeout);
#   4. the whole test suite;
#   5. bench_cuda, full: the figures for the CUDA section of
#      docs/benchmarks.md (table and JSON);
#   6. a summary, and exit status 0 only when every stage passed.
# Everything goes to ${OUT:-out}/ (logs, JSON, the summary). Needs no
# network: what is not installed is reported, not fetched.
#
# Usage: scripts/gpu_check.sh [--no-full]   (--no-full: skip stage 4)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${UNIMEM_GPU_BUILD:-$root/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
full=1
[ "${1:-}" = "--no-full" ] && full=0
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

results=()
failed=0
record() { # stage status detail
  results+=("$(printf '%-22s %-8s %s' "$1" "$2" "$3")")
  [ "$2" = "FAIL" ] && failed=1
  return 0
}

echo "== 1. machine" | tee "$out/machine.txt"
{
  date -u
  uname -a
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
    nvidia-smi topo -m 2>/dev/null
  else
    echo "nvidia-smi: not found"
  fi
  echo "libcuda.so.1: $(ldconfig -p 2>/dev/null | grep -m1 'libcuda.so.1' || echo 'not in the ld cache')"
  echo "CUDA_HOME: $CUDA_HOME"
  ls -l "$CUDA_HOME/include/cuda.h" 2>&1
  "$CUDA_HOME/bin/nvcc" --version 2>/dev/null | tail -2 || echo "nvcc: not found"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "cc: $(cc --version 2>/dev/null | head -1)"
  echo "ulimit -l: $(ulimit -l)"
} 2>&1 | tee -a "$out/machine.txt"
gpu_present=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu_present=1
fi
record "machine" "info" "GPU present: $([ $gpu_present = 1 ] && nvidia-smi -L | head -1 || echo no)"

echo "== 2. build ($build, Release, CUDA on)"
tests=ON
if [ ! -f /usr/include/criterion/criterion.h ] && [ ! -f /usr/local/include/criterion/criterion.h ]; then
  tests=OFF
  echo "Criterion (libcriterion-dev) is not installed: the tests cannot be built here; only the benchmark runs"
fi
if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DUNIMEM_ENABLE_CUDA=ON \
     -DUNIMEM_BUILD_TESTS=$tests >"$out/configure.log" 2>&1 &&
   cmake --build "$build" -j"$jobs" >"$out/build.log" 2>&1; then
  record "build" "ok" "tests $tests; $(grep -m1 'unimem backends' "$out/configure.log" | sed 's/^-- //')"
else
  tail -30 "$out/configure.log" "$out/build.log" 2>/dev/null
  record "build" "FAIL" "see configure.log / build.log"
fi
lib=$(ls "$build"/libunimem.so.* 2>/dev/null | head -1)
if [ -n "$lib" ]; then
  readelf -d "$lib" >"$out/readelf.txt" 2>&1
  if grep -E "NEEDED.*(libcuda|libcudart|libOpenCL)" "$out/readelf.txt"; then
    record "readelf -d" "FAIL" "libunimem.so names a vendor library as NEEDED"
  else
    record "readelf -d" "ok" "$(grep NEEDED "$out/readelf.txt" | sed -E 's/.*\[(.*)\]/\1/' | tr '\n' ' ')"
  fi
fi

if [ "$tests" = ON ] && [ -d "$build" ]; then
  echo "== 3. ctest -L \"gpu|cuda\""
  (cd "$build" && ctest -L "gpu|cuda" --output-on-failure -V --timeout 600) >"$out/ctest-gpu.log" 2>&1
  rc=$?
  grep -E "Test +#|tests passed|SKIP|Synthesis" "$out/ctest-gpu.log" | sed 's/^/  /'
  summary=$(grep -E "tests passed" "$out/ctest-gpu.log" | tail -1)
  skipped=$(grep -cE "\*\*\*Skipped|\[SKIP\]" "$out/ctest-gpu.log")
  if [ $rc -ne 0 ]; then
    record "ctest gpu|cuda" "FAIL" "$summary"
  elif [ $gpu_present = 1 ] && [ "$skipped" -gt 0 ]; then
    record "ctest gpu|cuda" "FAIL" "$summary; $skipped skip(s) although a GPU is present"
  else
    record "ctest gpu|cuda" "ok" "$summary; $skipped skip(s)"
  fi

  echo "== 3b. interop: the caller's own kernels on the GPU"
  interop='^(test_cuda_kernels_gpu|gpu_cuda_interop_real|example_cuda_kernels)$'
  for conns in default 1; do
    log="$out/ctest-interop-$conns.log"
    if [ $conns = default ]; then
      (cd "$build" && ctest -R "$interop" --output-on-failure -V --timeout 300) >"$log" 2>&1
    else
      (cd "$build" && CUDA_DEVICE_MAX_CONNECTIONS=$conns ctest -R "$interop" --output-on-failure -V \
         --timeout 300) >"$log" 2>&1
    fi
    rc=$?
    grep -E "Test +#|tests passed|SKIP|PASS:|elements" "$log" | sed 's/^/  /'
    skipped=$(grep -cE "\*\*\*Skipped" "$log")
    summary=$(grep -E "tests passed" "$log" | tail -1)
    if [ $rc -ne 0 ]; then
      record "interop ($conns conn)" "FAIL" "$summary; see $(basename "$log")"
    elif [ $gpu_present = 1 ] && [ "$skipped" -gt 0 ]; then
      record "interop ($conns conn)" "FAIL" "$summary; $skipped skip(s) although a GPU is present"
    else
      record "interop ($conns conn)" "ok" "$summary; $skipped skip(s)"
    fi
  done

  if [ $full = 1 ]; then
    echo "== 4. the whole test suite"
    (cd "$build" && ctest -j"$jobs" --output-on-failure --timeout 600) >"$out/ctest-all.log" 2>&1
    rc=$?
    grep -E "tests passed|FAILED|\*\*\*" "$out/ctest-all.log" | sed 's/^/  /' | head -40
    record "ctest (all)" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(grep -E 'tests passed' "$out/ctest-all.log" | tail -1)"
  fi
else
  record "ctest" "FAIL" "not built (tests $tests)"
fi

echo "== 5. bench_cuda"
if [ -x "$build/bench/bench_cuda" ]; then
  "$build/bench/bench_cuda" --json "$out/bench_cuda.json" 2>&1 | tee "$out/bench_cuda.txt"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) record "bench_cuda" "ok" "bench_cuda.txt, bench_cuda.json" ;;
    77) record "bench_cuda" "$([ $gpu_present = 1 ] && echo FAIL || echo skip)" "$(grep -m1 skipped "$out/bench_cuda.txt")" ;;
    *) record "bench_cuda" "FAIL" "exit status $rc" ;;
  esac
else
  record "bench_cuda" "FAIL" "not built"
fi
if [ -x "$build/tools/unimem" ]; then
  "$build/tools/unimem" info >"$out/unimem-info.txt" 2>&1 || true
fi

echo
echo "== summary (also in $out/summary.txt)"
printf '%s\n' "${results[@]}" | tee "$out/summary.txt"
exit $failed
