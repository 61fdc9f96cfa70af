#!/usr/bin/env bash
# Install what unimem needs to build, test and benchmark on Debian/Ubuntu.
# Does nothing when everything is already there; needs root (or sudo) when
# something is missing.
set -euo pipefail

packages=(
  build-essential cmake gcc clang pkg-config python3 binutils
  libcriterion-dev                       # test framework
  pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo  # OpenCL on the CPU
  libjemalloc-dev libmimalloc-dev        # allocator peers in the benchmarks
  libclang-rt-14-dev                     # sanitizer and fuzzer runtimes for clang
  valgrind doxygen gnuplot-nox           # memcheck, API docs, charts
  python3-dev python3-numpy python3-pytest python3-hypothesis  # the Python package and its tests
  python3-pyopencl python3-torch         # the Python interop tests and examples (CPU torch)
  libucx-dev ucx-utils                   # um_net over UCX, and ucx_perftest as its peer
  libstarpu-dev                          # StarPU, the peer of the low-latency wait benchmark
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "unimem: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "unimem: need root to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
