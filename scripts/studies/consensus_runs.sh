#!/usr/bin/env bash
# The consensus of run against run at 9 to 32 runs: copies (links) of two
# runs of examples/jax_reshard.py without a reference, one clean
# (dp=1,fsdp=2,tp=2) and one with its fault (dp=2,tp=2), the clean ones a
# bare majority; `diffcheck compare R0 --against R1 ...` with each binary
# given (default: the installed one and this tree's build/diffcheck), timed;
# for the old one, build 091f973 and give its binary.
#   bash scripts/studies/consensus_runs.sh [BINARY...]
# (issue 64: every subset of the runs was tried, 9.8 s at 25 runs, and at 32
# a 32-bit mask overflowed into "the runs part into ;".)
set -euo pipefail
cd "$(dirname "$0")/../.."
binaries=("$@")
((${#binaries[@]})) || binaries=("$(command -v diffcheck)" build/diffcheck)
export DIFFCHECK_EXE=${DIFFCHECK_EXE:-$PWD/build/diffcheck}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=${PYTHON:-.venv/bin/python}
"$py" examples/jax_reshard.py --mesh dp=1,fsdp=2,tp=2 --bug --no-reference --out "$work/clean" >/dev/null
"$py" examples/jax_reshard.py --mesh dp=2,tp=2 --bug --no-reference --out "$work/bad" >/dev/null
for n in 9 15 21 25 32; do
  clean=$((n / 2 + 1))
  against=()
  for ((i = 0; i < n; i++)); do
    src=$work/clean
    ((i >= clean)) && src=$work/bad
    mkdir -p "$work/$n/$i"
    for f in "$src"/run.rank*.h5; do ln -s "$f" "$work/$n/$i/${f##*/}"; done
    ((i > 0)) && against+=(--against "$work/$n/$i/run")
  done
  for exe in "${binaries[@]}"; do
    start=$(date +%s.%N)
    verdict=$("$exe" compare "$work/$n/0/run" "${against[@]}" 2>&1 | grep -m1 -E "Odd one out|No consensus" | cut -c1-90 || true)
    printf '%2d runs (%d clean)  %-28s %6.2f s  %s\n' "$n" "$clean" "$exe" "$(echo "$(date +%s.%N) - $start" | bc)" "$verdict"
  done
done
