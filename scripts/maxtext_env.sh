#!/usr/bin/env bash
# The MaxText environment: a Python 3.12 virtual environment where
# examples/jax_maxtext.py runs MaxText's own decoder under diffcheck.jax
# (MaxText 0.2.5 needs Python >= 3.12; it brings jax 0.12 and flax 0.12.12,
# the current releases, beside the torch environment's jax 0.10.2).
# Idempotent: a second run installs nothing. Called by
# `scripts/setup.sh --test-tools`; on its own: bash scripts/maxtext_env.sh
#   DIFFCHECK_MAXTEXT_VENV   where (default <checkout>/.venv-maxtext)
#
# MaxText's wheel declares every dependency under accelerator extras (cuda12,
# tpu), so it is installed without them, beside what its decoder, config and
# trainer import on a CPU (listed below; found by importing them).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${DIFFCHECK_MAXTEXT_VENV:-$root/.venv-maxtext}
# What is tested (docs/jax.md, "Versions"): keep the pins together.
REQUIREMENTS=(jax[cpu]==0.12.0.1 flax==0.12.12 optax==0.2.8 h5py numpy
  omegaconf packaging pathwaysutils jinja2 qwix aqtp tokamax huggingface_hub transformers==5.24.0 grain drjax
  pillow tiktoken sentencepiece sympy pydantic)
MAXTEXT=maxtext==0.2.5

python_312() {
  local cand
  for cand in python3.12 /usr/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 python3; do
    command -v "$cand" >/dev/null 2>&1 || [[ -x $cand ]] || continue
    if "$cand" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$cand"
      return
    fi
  done
  return 1
}

if [[ ! -x $venv/bin/python ]]; then
  base=$(python_312) || { echo "maxtext_env: no Python 3.12 (PATH, /usr/bin, ~/.pyenv): MaxText needs it" >&2; exit 1; }
  echo "maxtext_env: creating $venv with $base ($("$base" --version 2>&1))"
  "$base" -m venv "$venv"
fi
py=$venv/bin/python
if ! (cd / && "$py" -c 'import jax, flax, maxtext, h5py; assert jax.__version__ == "0.12.0.1"' 2>/dev/null); then
  echo "maxtext_env: installing MaxText 0.2.5 and jax 0.12 into $venv (a minute or two)"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install -q --progress-bar off "${REQUIREMENTS[@]}" 2>&1 |
    grep -v "^WARNING: Location .* is ignored" || true
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install -q --progress-bar off --no-deps "$MAXTEXT" 2>&1 |
    grep -v "^WARNING: Location .* is ignored" || true
fi
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root/python" >"$site/diffcheck-checkout.pth"
(cd / && "$py" -c "import maxtext.models.models, maxtext.trainers.pre_train.train, diffcheck.jax" >/dev/null 2>&1) ||
  { (cd / && "$py" -c "import maxtext.models.models, maxtext.trainers.pre_train.train, diffcheck.jax") 2>&1 | tail -5;
    echo "maxtext_env: the MaxText environment $venv does not import (see above)" >&2; exit 1; }
echo "maxtext_env: $py ready: jax $("$py" -c 'import jax; print(jax.__version__)'), maxtext 0.2.5"
