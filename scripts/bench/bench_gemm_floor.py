#!/usr/bin/env python3
"""flux1-dev at tp=4 against its GEMM floor, paired.

Alternates `mpirun -n 4 flux1dev_gemm_floor` (../shared/bench: only the GEMMs
an ideal run must do, OpenBLAS at one thread per rank) and
`mpirun -n 4 diffcheck --scenario flux_tp --size flux1-dev --mesh tp=4 --profile`,
K times each; prints both medians, the median of the paired ratios, and the
profile of the median diffcheck run.

    /usr/bin/python3 scripts/bench/bench_gemm_floor.py -k 3 -- --reference-cache off   # first runs
    /usr/bin/python3 scripts/bench/bench_gemm_floor.py -k 3 --warm                      # cached references
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("-k", type=int, default=3)
ap.add_argument("--diffcheck", default=os.path.join(HERE, "..", "..", "build", "diffcheck"))
ap.add_argument("--floor-source", default=os.path.join(HERE, "..", "..", "..", "shared", "bench", "flux1dev_gemm_floor.c"))
ap.add_argument("--warm", action="store_true",
                help="run diffcheck once first with a fresh reference cache, so the timed runs read their references")
ap.add_argument("--no-profile", action="store_true", help="for builds before --profile existed")
ap.add_argument("args", nargs=argparse.REMAINDER, help="extra diffcheck arguments after --")
a = ap.parse_args()
extra = a.args[1:] if a.args[:1] == ["--"] else a.args
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1", OPENBLAS_NUM_THREADS="1")
work = tempfile.mkdtemp(prefix="diffcheck_bench_floor_")
floor = os.path.join(work, "floor")
subprocess.run(["mpicc", "-O2", "-o", floor, a.floor_source, "-lopenblas"], check=True)
cmd_floor = ["mpirun", "-n", "4", floor]
cmd_dc = ["mpirun", "-n", "4", a.diffcheck, "--scenario", "flux_tp", "--size", "flux1-dev", "--mesh", "tp=4",
          "--out", os.path.join(work, "run.h5")] + ([] if a.no_profile else ["--profile"])
if a.warm:
    cmd_dc += ["--reference-cache", os.path.join(work, "cache")]
cmd_dc += extra


def timed(cmd):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return dt, p.stdout


try:
    if a.warm:
        dt, _ = timed(cmd_dc)
        print(f"warm-up (computes and caches the references): {dt:.1f} s", flush=True)
    floors, runs, outs = [], [], []
    for i in range(a.k):
        f, _ = timed(cmd_floor)
        d, out = timed(cmd_dc)
        floors.append(f)
        runs.append(d)
        outs.append(out)
        print(f"pair {i}: floor {f:.1f} s, diffcheck {d:.1f} s, ratio {d / f:.2f}", flush=True)
    ratios = [d / f for d, f in zip(runs, floors)]
    print(f"{' '.join(cmd_dc)}\n  floor median {statistics.median(floors):.1f} s, diffcheck median "
          f"{statistics.median(runs):.1f} s, paired ratio median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
    median_run = sorted(range(a.k), key=lambda i: runs[i])[a.k // 2]
    out = outs[median_run]
    print(out[out.find("\nProfile"):].rstrip() if "\nProfile" in out else "(no profile)")
finally:
    shutil.rmtree(work, ignore_errors=True)
