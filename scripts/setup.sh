#!/usr/bin/env bash
# Set up diffcheck on Debian 12 or 13 as root: install what is missing (apt-get),
# configure, build, and install `diffcheck` into /usr/local/bin. Idempotent:
# a second run installs nothing and rebuilds only what changed. Only what the
# main job and the Python package need is built (the diffcheck executable);
# the test and bench targets are built with --test-tools (scripts/test.sh).
#   BUILD_DIR (default build), BUILD_TYPE (default RelWithDebInfo)
#   --test-tools: also the tools only the test suite uses (clang for the
#     fuzzers, chromium for the HTML pages, junitparser/xmllint for JUnit),
#     every target of the build tree (unit, MPI and bench programs), the
#     torch environment (--torch) and the MaxText one (scripts/maxtext_env.sh:
#     Python 3.12, jax 0.12, maxtext 0.2.5; <checkout>/.venv-maxtext)
#   --torch: a virtual environment for diffcheck.torch and its tests
#     (scripts/torch_env.sh: torch 2.13.0 CPU, h5py, numpy, transformers,
#     diffusers; DIFFCHECK_VENV, default <checkout>/.venv)
#   --packages-only: install what is missing and stop (scripts/fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
test_tools=0 packages_only=0 torch_env=0
for arg in "$@"; do
  case $arg in
    --test-tools) test_tools=1 torch_env=1 ;;
    --torch) torch_env=1 ;;
    --packages-only) packages_only=1 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libgtest-dev
  libxtensor-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libopenblas-dev librandom123-dev libpng-dev libxxhash-dev libsleef-dev
  python3 python3-h5py python3-numpy python3-venv
)
((test_tools)) && PACKAGES+=(clang libclang-rt-14-dev chromium python3-junitparser libxml2-utils)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

((packages_only)) && exit 0

# The torch environment installs (pip, mostly one core and the network)
# while the build runs; the environment itself exists before configuring,
# which points the build tree's Python tests at it.
torch_log=$(mktemp)
if ((torch_env)); then
  bash scripts/torch_env.sh --venv-only
  bash scripts/torch_env.sh >"$torch_log" 2>&1 &
  torch_pid=$!
  trap 'kill "$torch_pid" 2>/dev/null' EXIT  # a failed build leaves no pip behind
fi
# The MaxText environment (Python 3.12, jax 0.12: scripts/maxtext_env.sh), for the test command, likewise.
maxtext_log=$(mktemp)
if ((test_tools)); then
  bash scripts/maxtext_env.sh >"$maxtext_log" 2>&1 &
  maxtext_pid=$!
  trap 'kill "${torch_pid:-}" "$maxtext_pid" 2>/dev/null' EXIT
fi
BUILD_DIR=${BUILD_DIR:-build}
# The test command's tree is built file by file (no unity batches), so a
# source that leans on another's #include fails in the default run, not
# only in the nightly's plain_build: 219 s against 97 s for build/ on 2
# cores (docs/development.md, "Building"). The demo's one program keeps unity.
unity=ON
((test_tools)) && unity=OFF
bash scripts/configure.sh "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DCMAKE_UNITY_BUILD=$unity
# The demo waits for one program and the Python package's CPU sketch kernel
# (installed beside the package), not for the test binaries; the test
# command builds them all.
targets=(--target diffcheck --target diffcheck_sketch_cpu)
((test_tools)) && targets=()
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
cmake --install "$BUILD_DIR" --prefix /usr/local >/dev/null
if ((torch_env)); then
  wait "$torch_pid" || { cat "$torch_log" >&2; echo "setup: the torch environment failed (above)" >&2; exit 1; }
  trap - EXIT
  cat "$torch_log"
fi
if ((test_tools)); then
  wait "$maxtext_pid" || { cat "$maxtext_log" >&2; echo "setup: the MaxText environment failed (above)" >&2; exit 1; }
  trap - EXIT
  cat "$maxtext_log"
  # transformers 5.15 apart (its string tensor-parallel plans: tests/test_transformers_string_plan.py)
  echo "setup: transformers 5.15 in $(bash scripts/transformers_515.sh)"
fi
rm -f "$torch_log" "$maxtext_log"
# The Python package (import diffcheck) for Debian's python3, checked from
# outside the source tree, as a user's program would import it. The demo
# needs no torch: diffcheck.torch is for the torch environment above.
(cd / && /usr/bin/python3 -c "import diffcheck, diffcheck.dump") ||
  { echo "setup: the diffcheck Python package does not import (see above)" >&2; exit 1; }
echo "setup: $(command -v diffcheck) ready; /usr/bin/python3 -c 'import diffcheck' works"
