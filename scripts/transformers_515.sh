#!/usr/bin/env bash
# transformers 5.15.1 apart from the torch environment's 5.24: the last 5.x
# whose tensor-parallel plans ("colwise", "rowwise", ...) keep plain tensors
# (5.24 shards DTensors). examples/transformers_string_plan.py and
# tests/test_transformers_string_plan.py run with this folder first on
# PYTHONPATH; everything else comes from the torch environment. Idempotent.
# Called by `scripts/setup.sh --test-tools`; on its own:
#   bash scripts/transformers_515.sh     (prints the folder)
#   DIFFCHECK_TRANSFORMERS_515   where (default <checkout>/.transformers-5.15)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=${DIFFCHECK_TRANSFORMERS_515:-$root/.transformers-5.15}
py=${DIFFCHECK_VENV:-$root/.venv}/bin/python
# transformers 5.15 wants tokenizers <= 0.23.0 and huggingface-hub < 2 (the torch environment has newer).
PINS=(transformers==5.15.1 tokenizers==0.22.2)
# pip's expected complaints about the second install: the torch environment's versions beside these, and
# the bin/ folder the first install made (both put commands there)
EXPECTED="^WARNING: Location .* is ignored\|requires .* which is not installed\|dependency resolver"
EXPECTED+="\|^WARNING: Target directory .* already exists"
if [[ ! -f $dir/.complete ]]; then
  rm -rf "$dir"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install -q --progress-bar off --target "$dir" --no-deps "${PINS[@]}" 2>&1 |
    grep -v "^WARNING: Location .* is ignored" >&2 || true
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install -q --progress-bar off --target "$dir" "huggingface-hub>=1.5,<2" \
    httpx 2>&1 | grep -v "$EXPECTED" >&2 || true  # (stdout is the folder alone: setup.sh prints it)
  (cd / && PYTHONPATH=$dir "$py" -c "import transformers; assert transformers.__version__ == '5.15.1'") ||
    { echo "transformers_515: $dir does not import transformers 5.15.1 (see above)" >&2; exit 1; }
  touch "$dir/.complete"
fi
echo "$dir"
