#!/usr/bin/env bash
# The MPI tests' teardown under load (issue: mpi_tests_np8 once died of
# SIGPIPE after every gtest had printed OK, beside other MPI jobs): runs
# build/tests/mpi_tests at 8 ranks RUNS times while a 16-rank diffcheck run
# loops beside it, with the test's stdin as CI gives it (STDIN=closed: fd 0
# not open; devnull; inherit), and counts the runs that did not exit 0, with
# the signal that ended them. Each run's mpirun is traced for signals
# and its execs (strace -f -e trace=execve), so a SIGPIPE names the process
# that got it.
#   bash scripts/studies/mpi_teardown_loop.sh [RUNS (default 50)] [STDIN (default closed)]
#   MPIRUN_FLAGS="--stdin none": flags for the tested mpirun (what tests/CMakeLists.txt gives it)
set -uo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-50} mode=${2:-closed}
source scripts/mpi_env.sh
out=$(mktemp -d /tmp/teardown.XXXX)
load() {  # a 16-rank run of the main job, again and again
  while :; do mpirun -n 16 build/diffcheck --scenario flux_tp --out "$out/load.h5" >/dev/null 2>&1 </dev/null; done
}
load &
load_pid=$!
trap 'kill $load_pid 2>/dev/null; pkill -f "diffcheck --scenario flux_tp --out $out" 2>/dev/null' EXIT
failed=0
for i in $(seq "$runs"); do
  cmd=(strace -f -qq --seccomp-bpf -e trace=execve -e signal=SIGPIPE -o "$out/trace.$i" mpirun ${MPIRUN_FLAGS:-} -n 8 build/tests/mpi_tests)
  case $mode in
    closed) "${cmd[@]}" >"$out/run.$i" 2>&1 <&- ;;
    devnull) "${cmd[@]}" >"$out/run.$i" 2>&1 </dev/null ;;
    *) "${cmd[@]}" >"$out/run.$i" 2>&1 ;;
  esac
  rc=$?
  pipes=$(grep -c SIGPIPE "$out/trace.$i")
  if ((rc != 0 || pipes > 0)); then
    failed=$((failed + 1))
    echo "run $i: exit $rc, $pipes SIGPIPE(s):"
    grep SIGPIPE "$out/trace.$i" | head -5
    for pid in $(grep SIGPIPE "$out/trace.$i" | awk '{print $1}' | sort -u); do
      echo "  pid $pid: $(grep -m1 "^$pid execve" "$out/trace.$i" || echo "(no exec: a fork of mpirun or orted)")"
    done
  fi
done
echo "mpi_teardown_loop: $failed of $runs runs failed or saw a SIGPIPE (stdin $mode, mpirun flags '${MPIRUN_FLAGS:-}'; files in $out)"
