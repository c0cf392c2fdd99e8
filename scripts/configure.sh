#!/usr/bin/env bash
# Configure a build tree the way the scripts build on 2 cores:
#   bash scripts/configure.sh BUILD_DIR [cmake -D... options]
# - Ninja for a new tree (a tree configured before keeps its generator: CMake
#   refuses to change it): it starts a library's compiles while the library
#   below it still links, where Make waits, and that idle core cost 40 of
#   the sanitizer tree's 170 s;
# - a unity build (CMAKE_UNITY_BUILD): a folder's sources compiled in a few
#   translation units, each heavy header (fmt, spdlog, json, CLI11, gtest)
#   parsed once per batch instead of once per file: the whole build/ tree in
#   about half the time. Sources with flags of their own (the AVX2 kernels,
#   scans.cpp at -O3, blas.cpp) stay on their own; a plain
#   `cmake -S . -B DIR` still builds file by file;
# - RelWithDebInfo at -g1 (line tables: stack traces keep file and line,
#   a debugger loses local variables), unless a -D option sets the flags:
#   full -g cost 17% of the build.
# docs/development.md ("Building") has the figures.
set -euo pipefail
dir=${1:?usage: configure.sh BUILD_DIR [cmake options]}
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
generator=()
if [[ ! -f $dir/CMakeCache.txt ]] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")
for a in "$@"; do
  [[ $a == -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=* ]] && flags=()
done
exec cmake -S "$root" -B "$dir" "${generator[@]}" -DCMAKE_UNITY_BUILD=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}" "$@" >/dev/null
