#!/usr/bin/env bash
# The MPI tests' teardown under load (mpi_tests_np8 once went red with
# "SIGPIPE***Exception" after every gtest had printed OK, beside other MPI
# jobs). Runs build/tests/mpi_tests at 8 ranks RUNS times while a 16-rank
# diffcheck run loops beside it, each mpirun traced for its failed writes and
# its signals (strace -f -Z -y), and counts the runs that did not exit 0 and
# the runs in which mpirun wrote into a closed pipe (EPIPE: the race).
#
# What it shows: at the job's end mpirun (OpenMPI 4.1) writes one byte, a
# signal number ("\21": SIGCHLD, a late child), into libevent's signal pipe
# after the event base has closed its other end; the write fails with EPIPE
# and the kernel sends mpirun SIGPIPE. While ORTE's own SIGPIPE handler is
# installed, nothing happens; once finalize has put SIGPIPE back to its
# default, mpirun dies of it, after the job passed. Started with SIGPIPE
# ignored (inherited through exec), the write just fails.
#
#   bash scripts/studies/mpi_teardown_loop.sh [RUNS (default 50)] [as-tests|default]
#     as-tests (default): mpirun started as tests/CMakeLists.txt starts it (SIGPIPE ignored)
#     default: SIGPIPE at its default, as before
set -uo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-50} mode=${2:-as-tests}
source scripts/mpi_env.sh
out=$(mktemp -d /tmp/teardown.XXXX)
load() {  # the main job at 16 ranks, again and again
  while :; do mpirun -n 16 build/diffcheck --scenario flux_tp --out "$out/load.h5" >/dev/null 2>&1 </dev/null; done
}
load &
load_pid=$!
trap 'kill $load_pid 2>/dev/null; pkill -f "diffcheck --scenario flux_tp --out $out" 2>/dev/null' EXIT
launch=(mpirun)
[[ $mode == as-tests ]] && launch=(sh -c "trap '' PIPE; exec \"\$0\" \"\$@\"" mpirun)
failed=0 raced=0
for i in $(seq "$runs"); do
  strace -f -qq -Z -y -e trace=write -e signal=SIGPIPE -o "$out/trace.$i" \
    "${launch[@]}" -n 8 build/tests/mpi_tests >"$out/run.$i" 2>&1 </dev/null
  rc=$?
  grep -q "EPIPE" "$out/trace.$i" && raced=$((raced + 1))
  if ((rc != 0)); then
    failed=$((failed + 1))
    echo "run $i: exit $rc"
    grep -B1 "SIGPIPE" "$out/trace.$i" | head -4
  fi
done
echo "mpi_teardown_loop ($mode): $failed of $runs runs failed; in $raced of them mpirun wrote into a closed pipe (files in $out)"
