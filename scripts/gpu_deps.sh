#!/usr/bin/env bash
# Packs what the test suite needs and a GPU machine lacks into .gpu-deps/
# (ignored by git), for a machine that has no Debian packages and cannot
# fetch any: Criterion's headers and library, and every shared library
# Criterion needs beyond the C library. Run it here, on the Debian machine
# where libcriterion-dev is installed; carry .gpu-deps with the working
# tree; scripts/gpu_check.sh finds it there and uses it.
#
# Layout: .gpu-deps/include/criterion/..., .gpu-deps/lib/libcriterion.so*
# (found by CMake through CMAKE_PREFIX_PATH), and .gpu-deps/fallback/ with
# Criterion's own dependencies: gpu_check.sh puts on LD_LIBRARY_PATH only
# those the other machine's loader does not already find, so that its own
# copies (of libz or libcrypto, say) stay in use wherever it has them.
#
# Usage: scripts/gpu_deps.sh [DIR]   (default .gpu-deps)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.gpu-deps}
hdr=/usr/include/criterion
lib=$(ldconfig -p | awk '/libcriterion\.so\.[0-9]+ .*x86-64/ {print $NF; exit}')
if [ ! -d "$hdr" ] || [ -z "$lib" ]; then
  echo "gpu_deps: Criterion is not installed here (apt-get install libcriterion-dev)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib" "$dest/fallback"
cp -r "$hdr" "$dest/include/"
soname=$(basename "$lib")
cp -L "$lib" "$dest/lib/$soname"
ln -s "$soname" "$dest/lib/libcriterion.so"
# Criterion's dependencies, all but the C library and the loader.
ldd "$lib" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r dep; do
  case $(basename "$dep") in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) continue ;;
  esac
  cp -L "$dep" "$dest/fallback/$(basename "$dep")"
done
echo "gpu_deps: $dest: Criterion $soname and $(ls "$dest/fallback" | wc -l) libraries it needs ($(du -sh "$dest" | cut -f1))"
