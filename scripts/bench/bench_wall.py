#!/usr/bin/env python3
"""Wall time of a command over K runs (median, min, max); exit status checked.

    /usr/bin/python3 scripts/bench/bench_wall.py -k 5 -- mpirun -n 16 diffcheck --scenario flux_tp
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("-k", type=int, default=5)
ap.add_argument("--expect", type=int, default=0, help="expected exit status")
ap.add_argument("cmd", nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1")
env.setdefault("OPENBLAS_NUM_THREADS", "1")
times = []
for i in range(a.k):
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                       stdin=subprocess.DEVNULL)
    times.append(time.monotonic() - t0)
    if p.returncode != a.expect:
        sys.exit(f"run {i}: exit {p.returncode} (expected {a.expect}):\n{p.stderr.decode()}")
print(f"{' '.join(cmd)}\n  {a.k} runs: median {statistics.median(times):.2f} s, "
      f"min {min(times):.2f} s, max {max(times):.2f} s")
