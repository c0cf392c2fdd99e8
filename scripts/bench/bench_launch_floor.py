#!/usr/bin/env python3
"""A diffcheck run against the launch floor, paired.

Alternates `mpirun -n N build/launch_floor` (a bare MPI program: 50 small
all-to-alls) and `mpirun -n N diffcheck --scenario S [ARGS]`, K times each,
and prints both medians and the median of the paired ratios.

    /usr/bin/python3 scripts/bench/bench_launch_floor.py                      # flux_tp, 16 ranks
    /usr/bin/python3 scripts/bench/bench_launch_floor.py -- --mesh dp=16,tp=1
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("-n", type=int, default=16)
ap.add_argument("-k", type=int, default=5)
ap.add_argument("--scenario", default="flux_tp")
ap.add_argument("--build", default="build")
ap.add_argument("--diffcheck", default=None)
ap.add_argument("args", nargs=argparse.REMAINDER, help="extra diffcheck arguments after --")
a = ap.parse_args()
extra = a.args[1:] if a.args[:1] == ["--"] else a.args
dc = a.diffcheck or os.path.join(a.build, "diffcheck")
floor = os.path.join(a.build, "launch_floor")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1",
           OPENBLAS_NUM_THREADS="1")
mpirun = shutil.which("mpirun") or "mpirun"
cmds = {"floor": [mpirun, "-n", str(a.n), floor],
        "diffcheck": [mpirun, "-n", str(a.n), dc, "--scenario", a.scenario, "--out",
                      "/tmp/bench_launch_floor.h5", *extra]}


def run(cmd):
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL)
    if p.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr.decode()}")
    return time.monotonic() - t0


for cmd in cmds.values():  # warm-up
    run(cmd)
times = {k: [] for k in cmds}
for _ in range(a.k):
    for k, cmd in cmds.items():
        times[k].append(run(cmd))
ratios = [d / f for d, f in zip(times["diffcheck"], times["floor"])]
print(f"{' '.join(cmds['diffcheck'])}")
for k, t in times.items():
    print(f"  {k:9} median {statistics.median(t):6.2f} s (min {min(t):.2f}, max {max(t):.2f})")
print(f"  diffcheck / floor: median of {a.k} paired ratios {statistics.median(ratios):.2f}")
