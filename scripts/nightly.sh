#!/usr/bin/env bash
# The nightly regression matrix: every scenario x 16-rank mesh x dtype x flag
# combination must pass, every fault must be caught at its documented tap.
# Writes results/nightly/<date>/{summary.json,junit.xml,index.html}; resumable.
# Options: scripts/nightly/nightly.py --help (e.g. --quick for the CI-sized matrix);
# the night's modules are in scripts/nightly/ (its README.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/mpi_env.sh"
exec /usr/bin/python3 "$here/nightly/nightly.py" "$@"
