#!/usr/bin/env python3
"""Flag-combination table for a scenario, in the shape of seeds/000's bisection
table: every subset of the given boolean flags, median wall time of K runs and
the verdict.

    /usr/bin/python3 scripts/flag_table.py --scenario dit_ulysses -n 16 \\
        --flags async_a2a,overlap,fuse_qkv_a2a --set ulysses_chunks=2 --inject a2a_read_before_wait
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--scenario", required=True)
ap.add_argument("-n", type=int, default=16)
ap.add_argument("--flags", required=True, help="comma-separated boolean flags")
ap.add_argument("--set", action="append", default=[], help="flag=value applied to every run")
ap.add_argument("--inject", default="")
ap.add_argument("-k", type=int, default=3, help="timed runs per row")
ap.add_argument("--exe", default="diffcheck")
a = ap.parse_args()
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1")
env.setdefault("OPENBLAS_NUM_THREADS", "1")
flags = a.flags.split(",")
print(f"{a.scenario}, {a.n} ranks, {' '.join(a.set)}{', inject ' + a.inject if a.inject else ''}; "
      f"median of {a.k} runs\n")
print("| flags | wall s | correct? | first divergence |\n|---|---|---|---|")
with tempfile.TemporaryDirectory() as tmp:
    for k in range(len(flags) + 1):
        for on in itertools.combinations(flags, k):
            args = ["mpirun", "-n", str(a.n), a.exe, "--scenario", a.scenario, "--out",
                    f"{tmp}/r.h5", "--json", f"{tmp}/r.json"]
            for f in a.set:
                args += ["--flag", f]
            for f in on:
                args += ["--flag", f"{f}=true"]
            if a.inject:
                args += ["--inject", a.inject]
            times = []
            for _ in range(a.k):
                t0 = time.monotonic()
                p = subprocess.run(args, capture_output=True, env=env, stdin=subprocess.DEVNULL)
                times.append(time.monotonic() - t0)
            if p.returncode == 2:
                verdict, first = "error", p.stderr.decode().strip().splitlines()[-1]
            else:
                r = json.load(open(f"{tmp}/r.json"))
                fd = r["first_divergence"]
                verdict = "✓" if r["pass"] else ("NaN" if fd and "nonfinite" in fd["checks"] else "✗")
                first = "-" if not fd else f"{fd['tap']} ({','.join(fd['checks'])})"
            print(f"| {' + '.join(on) or 'baseline (none)'} | {statistics.median(times):.2f} | {verdict} | {first} |")
