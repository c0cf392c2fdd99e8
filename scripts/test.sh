#!/usr/bin/env bash
# The whole test suite: set up (if needed), build, run ctest — in three trees:
#   build/           everything (unit, MPI at 1-16 ranks, end-to-end drivers)
#   build-sanitize/  clang, ASan+UBSan: the unit tests, the MPI tests at 1, 4
#                    and 16 ranks, and 20 s of libFuzzer per target
#                    (DIFFCHECK_FUZZ; scripts/fuzz.sh)
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

# One tree for the sanitized tests and the fuzzers (scripts/configure_sanitized.sh),
# each library compiled once: the step took 329 s in a clean clone's suite where
# the two trees' steps took 302 + 166 s (2 cores, docs/development.md).
sanitized() {
  bash scripts/configure_sanitized.sh build-sanitize &&
    cmake --build build-sanitize -j "$jobs" --target unit_tests mpi_tests fuzz_parsers fuzz_reader >/dev/null &&
    (cd build-sanitize && ctest --output-on-failure -j "$jobs")
}
step "unit and MPI tests (1, 4, 16 ranks) under ASan+UBSan, and 20 s of fuzzing per target (build-sanitize/, clang)" sanitized

if ((${#failed[@]})); then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all passed"
