#!/usr/bin/env python3
"""Tolerance margins of the built-in scenarios: for each scenario and dtype,
the largest clean-run error as a fraction of its tolerance (must be < 1), and
for each fault the first divergent tap with its error / tolerance (> 1) or the
replica check that caught it.

    /usr/bin/python3 scripts/studies/tolerance_margins.py [-n RANKS] [--tolerance derived|calibrated]
        [--set flag=value]... [SCENARIO ...]

err/tol is the tap's margin: the larger of its element-wise and (for
calibrated tolerances) norm-wise and column-mean ratios.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1",
           OPENBLAS_NUM_THREADS="1")


def run(exe, n, scenario, dtype, fault, tmp, flags=(), extra=()):
    out, js = os.path.join(tmp, "run.h5"), os.path.join(tmp, "r.json")
    args = ["mpirun", "-n", str(n), exe, "--scenario", scenario, "--dtype", dtype, "--out", out,
            "--json", js, *extra]
    if fault:
        args += ["--inject", fault]
    if os.path.exists(js):
        os.remove(js)
    for f in flags:
        args += ["--flag", f]
    p = subprocess.run(args, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if p.returncode not in (0, 1):
        sys.exit(f"{' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    if not os.path.exists(js):  # the code under test crashed: no report
        return p.returncode, {"taps": [], "first_divergence": {"tap": "CRASHED", "checks": []}}
    with open(js) as f:
        return p.returncode, json.load(f)


def margin(tap):
    ref = tap["reference"]
    return float(ref.get("margin", ref["worst_ratio"]))


def worst_clean(report):
    taps = [t for t in report["taps"] if t["reference"]["present"]]
    t = max(taps, key=margin)
    return margin(t), t["name"], t["reference"]["rtol"]


def faults_of(exe, scenario):
    p = subprocess.run([exe, "list", "--json"], capture_output=True, text=True, check=True)
    return [(f["name"], f["needs_flags"]) for s in json.loads(p.stdout) if s["name"] == scenario for f in s["faults"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--exe", default="diffcheck")
    ap.add_argument("--set", action="append", default=[], help="flag=value for every run")
    ap.add_argument("--tolerance", default="derived", choices=["derived", "calibrated"])
    ap.add_argument("scenarios", nargs="*", default=["timestep_broadcast"])
    a = ap.parse_args()
    print("| scenario | dtype | clean: worst err/tol (tap) | fault | exit | first divergence | checks | err/tol there |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for sc in a.scenarios:
            for dtype in ("float32", "bfloat16"):
                extra = ["--tolerance", a.tolerance]
                code, rep = run(a.exe, a.n, sc, dtype, None, tmp, a.set, extra)
                ratio, tap, _ = worst_clean(rep)
                clean = f"{ratio:.3f} ({tap})" + ("" if code == 0 else " FAILED")
                for fault, needs in faults_of(a.exe, sc):
                    code, rep = run(a.exe, a.n, sc, dtype, fault, tmp, a.set + needs, extra)
                    fd = rep["first_divergence"] or {}
                    t = next((t for t in rep["taps"] if t["name"] == fd.get("tap")), None)
                    r = margin(t) if t and t["reference"]["present"] else "-"
                    print(f"| {sc} | {dtype} | {clean} | {fault} | {code} | {fd.get('tap', '-')} | "
                          f"{','.join(fd.get('checks', []))} | {r if isinstance(r, str) else f'{r:.3g}'} |")


if __name__ == "__main__":
    main()
