#!/usr/bin/env bash
# The whole test suite: set up (if needed), build, run ctest — in three trees:
#   build/           everything (unit, MPI at 1-16 ranks, end-to-end drivers)
#   build-sanitize/  the unit tests and the MPI tests at 1, 4 and 16 ranks under
#                    ASan+UBSan (DIFFCHECK_SANITIZE)
#   build-fuzz/      30 s of libFuzzer per target (clang; scripts/fuzz.sh)
# The full nightly matrix (ctest label nightly, scripts/nightly.sh) is left out.
# With arguments, only build/'s ctest runs, with them (e.g. -L nightly, -R flux).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test-tools
source scripts/mpi_env.sh
jobs=$(nproc)
if (($#)); then
  cd "${BUILD_DIR:-build}"
  exec ctest --output-on-failure -j "$jobs" "$@"
fi

failed=()
step() {  # name command...
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  if "$@"; then echo "== $name: passed in $((SECONDS - t0)) s"; else
    echo "== $name: FAILED after $((SECONDS - t0)) s"
    failed+=("$name")
  fi
}

step "tests (build/)" bash -c "cd '${BUILD_DIR:-build}' && ctest --output-on-failure -j $jobs -LE nightly"

# -O0 -g1: the sanitizers need no optimisation and their stack traces only
# line tables; the tree builds in 200 s instead of 317 s at -O1 -g (2 cores),
# and its tests take 30 s instead of 24.
sanitized() {
  bash scripts/configure.sh build-sanitize -DDIFFCHECK_SANITIZE=ON -DDIFFCHECK_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1" &&
    cmake --build build-sanitize -j "$jobs" --target unit_tests mpi_tests >/dev/null &&
    (cd build-sanitize && ctest --output-on-failure -j "$jobs")
}
step "unit tests and MPI tests (1, 4, 16 ranks) under ASan+UBSan (build-sanitize/)" sanitized

fuzzed() {
  CC=clang CXX=clang++ bash scripts/configure.sh build-fuzz -DDIFFCHECK_FUZZ=ON -DDIFFCHECK_BENCH=OFF &&
    cmake --build build-fuzz -j "$jobs" --target fuzz_parsers fuzz_reader >/dev/null &&
    (cd build-fuzz && ctest --output-on-failure -j "$jobs" -L fuzz)
}
step "fuzzing, 30 s per target (build-fuzz/)" fuzzed

if ((${#failed[@]})); then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all passed"
