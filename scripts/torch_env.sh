#!/usr/bin/env bash
# The torch environment: a virtual environment where diffcheck.torch, its
# tests, examples and benchmarks run, with the torch users run (2.x) and the
# parallel libraries they check (transformers, diffusers). Idempotent: a
# second run installs nothing. Called by `scripts/setup.sh --torch` (and
# --test-tools); on its own: bash scripts/torch_env.sh
#   DIFFCHECK_VENV   where (default <checkout>/.venv)
#   --venv-only      make the (empty) environment and stop: setup.sh then
#                    configures the build against it while the packages install
#
# The interpreter: torch 2.13.0's CPU build lies on this project's machines
# for CPython 3.11 (pip takes it from the local wheel folder), so a Python
# 3.11 is preferred: Debian 12's python3, else a python3.11 on PATH (Debian
# 13's python3 is 3.13; pyenv's 3.11 serves there). With no 3.11 at all,
# pip fetches torch 2.13.0 for the python3 there is, from the package index.
# The venv sees the checkout's python/ through a .pth file, so the tests and
# examples always import this tree's diffcheck (and its build's CPU kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${DIFFCHECK_VENV:-$root/.venv}
# What is tested (README "Supported torch" and "Supported JAX"): keep the pins together.
# jax and jaxlib pinned together are jax[cpu] (diffcheck.jax, docs/jax.md).
REQUIREMENTS=(torch==2.13.0 h5py numpy transformers==5.24.0 diffusers==0.42.1 accelerate deepspeed==0.19.8 yunchang==0.6.4
  megatron-core==0.16.1 spmd_types==0.2.3 tyro==1.0.17 einops
  jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8
  junitparser lizard==1.24.3 pyflakes==4.1.0 import-linter==2.17)  # junitparser: the suite reads its JUnit reports as a
# dashboard would; lizard and pyflakes: the house rules (tests/test_house_rules.py) measure functions
# with the one and look for unused imports and undefined names with the other; import-linter: the
# Python package's layers (tests/test_python_layering.py)
# torchtitan without its trainer's dependencies (datasets, wandb, tensorboard, torchdata): the
# example builds and parallelizes its model, which imports only spmd_types, tyro and einops (above).
NO_DEPS=(torchtitan==0.3.0)

python_311() {
  local cand
  for cand in /usr/bin/python3 python3.11 /usr/bin/python3.11 python3; do
    command -v "$cand" >/dev/null 2>&1 || continue
    if "$cand" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      echo "$cand"
      return
    fi
  done
  echo /usr/bin/python3
}

if [[ ! -x $venv/bin/python ]]; then
  base=$(python_311)
  echo "torch_env: creating $venv with $base ($("$base" --version 2>&1))"
  "$base" -m venv "$venv"
fi
[[ ${1:-} == --venv-only ]] && exit 0
py=$venv/bin/python
if ! "$py" - "${REQUIREMENTS[@]}" "${NO_DEPS[@]}" <<'EOF' 2>/dev/null; then
import sys
from importlib.metadata import version, PackageNotFoundError
for req in sys.argv[1:]:
    name, _, want = req.partition("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if want and have.split("+")[0] != want:
        sys.exit(1)
EOF
  echo "torch_env: installing ${REQUIREMENTS[*]} into $venv (a minute or two)"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install -q --progress-bar off "${REQUIREMENTS[@]}" 2>&1 |
    grep -v "^WARNING: Location .* is ignored" || true
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install -q --progress-bar off --no-deps "${NO_DEPS[@]}" 2>&1 |
    grep -v "^WARNING: Location .* is ignored" || true
fi
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root/python" >"$site/diffcheck-checkout.pth"
(cd / && "$py" -c "import torch, h5py, transformers, diffusers, junitparser, diffcheck.torch") ||
  { echo "torch_env: the torch environment $venv does not import (see above)" >&2; exit 1; }
echo "torch_env: $py ready: torch $("$py" -c 'import torch; print(torch.__version__)'), diffcheck.torch from $root/python"
