#!/usr/bin/env bash
# The main job: set up (if needed), then run the README's command line.
#   bash scripts/demo.sh            -> mpirun -n 16 diffcheck --scenario flux_tp
#   SCENARIO=timestep_broadcast bash scripts/demo.sh [extra diffcheck args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/mpi_env.sh
SCENARIO=${SCENARIO:-flux_tp}
set -x
mpirun -n 16 diffcheck --scenario "$SCENARIO" "$@"
