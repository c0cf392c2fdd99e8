#!/usr/bin/env bash
# Fuzz diffcheck's parsers and its activation-file reader with libFuzzer
# (Debian's clang, with AddressSanitizer and UndefinedBehaviorSanitizer).
#
#   scripts/fuzz.sh [--seconds S] [--merge]
#       build build-sanitize/ (clang) and run every target for S seconds (default
#       60) from tests/fuzz/corpus/<target>; --merge adds the inputs that found
#       new coverage to that corpus (minimised), for committing.
#   scripts/fuzz.sh --binary B --corpus DIR [--seconds S] [--merge]
#       run one built target (what the test suite does).
#
# Exit 0: no crash, leak, sanitizer report or timeout (10 s per input). On a
# finding, libFuzzer's report is printed, the input is kept as
# ./crash-* / ./timeout-* / ./oom-* / ./leak-*, and the exit status is 1.
# Inputs on which HDF5 itself loops forever or crashes, and the reader's
# guard steps in (exit 2 in the tool), are kept as ./hdf5-guarded-* and
# counted, not failed.
# Reproduce one: <binary> <file>.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=60 merge=0 binary="" corpus=""
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    --binary) binary=$2; shift 2 ;;
    --corpus) corpus=$2; shift 2 ;;
    -h|--help) sed -n '2,/^[^#]/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

run_one() {  # binary corpus
  local bin=$1 seeds=$2 scratch log name
  name=$(basename "$bin")
  scratch=$(mktemp -d /tmp/diffcheck-fuzz-corpus.XXXXXX)
  log=$(mktemp /tmp/diffcheck-fuzz-log.XXXXXX)
  # Where fuzz_reader writes each input's file: one place for every session,
  # removed here (a session ended by the guard's _exit cannot clean up).
  export DIFFCHECK_FUZZ_SCRATCH
  DIFFCHECK_FUZZ_SCRATCH=$(mktemp -d /dev/shm/diffcheck-fuzz.XXXXXX)
  trap 'rm -rf "$scratch" "$log" "$DIFFCHECK_FUZZ_SCRATCH"' RETURN
  echo "fuzz: $name for ${seconds} s from $seeds ($(ls "$seeds" | wc -l) inputs)"
  local start=$SECONDS left=$seconds rc execs=0 stalls=0 runs=0
  # A guarded HDF5 failure (exit 3, see fuzz_reader.cpp) ends a libFuzzer
  # session: count it and fuzz on for the time that is left. Memory: the
  # resident limit (2 GiB) stands; a single huge malloc is let through, as
  # glibc does, so that the reader's guard (512 MiB of growth) sees what the
  # tool would do with it.
  while ((left > 0)); do
    rc=0 runs=$((runs + 1))
    # New inputs go to the scratch directory (first); the committed corpus is read only.
    "$bin" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1048576 -print_final_stats=1 \
      -artifact_prefix="$PWD/" "$scratch" "$seeds" >"$log" 2>&1 || rc=$?
    execs=$((execs + $(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || echo 0)))
    if ((rc == 3)); then
      stalls=$((stalls + 1))
      grep 'guarded' "$log" | sed 's/^/  /'
    elif ((rc)); then
      cat "$log"
      echo "fuzz: $name FOUND A DEFECT (exit $rc); input kept in $PWD as crash-*, timeout-*, oom-* or leak-*" >&2
      return 1
    fi
    left=$((seconds - (SECONDS - start)))
    ((rc == 3)) || break
  done
  grep -E '^stat::|DONE' "$log" | sed 's/^/  /' || true
  echo "fuzz: $name: 0 defects in $((SECONDS - start)) s, about $execs executions in $runs session(s);" \
       "$stalls HDF5 failure(s) (hang or crash inside libhdf5) ended by the reader's guard; $(ls "$scratch" | wc -l) new inputs"
  if ((merge)); then
    "$bin" -merge=1 "$seeds" "$scratch" >"$log" 2>&1 || { cat "$log"; return 1; }
    echo "fuzz: merged into $seeds ($(ls "$seeds" | wc -l) inputs, $(du -sh "$seeds" | cut -f1))"
  fi
}

if [[ -n $binary ]]; then
  [[ -n $corpus ]] || { echo "fuzz.sh: --binary needs --corpus" >&2; exit 2; }
  run_one "$binary" "$corpus"
  exit
fi

bash "$root/scripts/setup.sh" --packages-only --test-tools  # clang
build=${FUZZ_BUILD_DIR:-$root/build-sanitize}
bash "$root/scripts/configure_sanitized.sh" "$build"
cmake --build "$build" -j "$(nproc)" --target fuzz_parsers fuzz_reader
status=0
for t in parsers reader; do
  run_one "$build/tests/fuzz/fuzz_$t" "$root/tests/fuzz/corpus/$t" || status=1
done
exit $status
