#!/usr/bin/env bash
# dct.watch's check before and after a change: the watch_overhead.py study run
# alternately with the Python package of revision REV (a git worktree) and of
# this checkout, 3 times each, for the DP MLP and the TP block at 2 ranks and
# FSDP2 x TP at 4; one "one check" line per run.
#   bash scripts/studies/watch_before_after.sh REV     (issue 73: REV=8543ca4)
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:?give the revision to compare with}
old=$(mktemp -d)
git worktree add -f "$old" "$rev" -q
trap 'git worktree remove --force "$old"' EXIT
source scripts/mpi_env.sh
kernel=$PWD/build/python/libdiffcheck_sketch_cpu.so
for par in "dp 2" "tp 2" "fsdp_tp 4"; do
  set -- $par
  for _ in 1 2 3; do
    for side in before after; do
      pp=$PWD/python
      [[ $side == before ]] && pp=$old/python
      line=$(PYTHONPATH=$pp DIFFCHECK_SKETCH_KERNEL=$kernel timeout 600 .venv/bin/python \
        scripts/studies/watch_overhead.py --parallel "$1" --ranks "$2" --every 1 --rounds 3 --steps 20 2>&1 |
        grep "one check" || true)
      echo "$1 $side $line"
    done
  done
done
