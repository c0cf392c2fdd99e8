#!/usr/bin/env bash
# Configure the sanitized tree (default build-sanitize/): Debian's clang,
# ASan+UBSan on every library, libFuzzer's coverage on ours. It holds the
# sanitized unit and MPI tests and the fuzz targets (scripts/test.sh builds
# and runs both; scripts/fuzz.sh fuzzes longer), each library compiled once.
#   bash scripts/configure_sanitized.sh [BUILD_DIR]
# -O1 -g1: line tables for the sanitizers' stack traces, and libFuzzer's
# usual optimisation. A tree configured before with another compiler (GCC
# built build-sanitize/ until the trees merged) is removed first: CMake
# cannot change a tree's compiler.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir=${1:-$root/build-sanitize}
if [[ -f $dir/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang' "$dir/CMakeCache.txt"; then
  echo "configure_sanitized: $dir was configured with another compiler; starting it afresh"
  rm -rf "$dir"
fi
CC=clang CXX=clang++ exec bash "$root/scripts/configure.sh" "$dir" -DDIFFCHECK_FUZZ=ON -DDIFFCHECK_BENCH=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1"
