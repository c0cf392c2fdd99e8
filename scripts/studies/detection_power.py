#!/usr/bin/env python3
"""Detection power of the derived and the calibrated tolerances.

For every scenario and dtype it calibrates (`diffcheck calibrate`) once on
--calibration-seed, or with --same-seed on each run's own seed (what
`--tolerance calibrated` does within a run), then
  - false positives: runs the clean scenario on its default mesh for --seeds
    other seeds under the calibration file (and, with --derived-too, under the
    derived rule) and counts failures, with the worst clean err/tol seen;
  - detection: for every fault of continuous size (`diffcheck list`: its
    --fault-scale), the smallest scale A that is still caught (exit 1), found
    by bisection on log A, under each rule.
Prints markdown tables (docs/tolerances.md holds them) and writes --json.

    /usr/bin/python3 scripts/studies/detection_power.py --exe build/diffcheck [-n 16] [--seeds 100]
        [--scenario S]... [--dtype D]... [--same-seed] [--no-detection] [--no-false-positives] [--json FILE]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1",
           OPENBLAS_NUM_THREADS="1")


def sh(args):
    p = subprocess.run(args, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


class Runner:
    def __init__(self, a, work):
        self.a, self.work, self.runs = a, work, 0

    def calibrate(self, sc, dtype, run_seed):
        """The tolerance file for runs on run_seed: calibrated on that seed with --same-seed, else on one seed."""
        seed = run_seed if self.a.same_seed else self.a.calibration_seed
        path = os.path.join(self.work, f"{sc}.{dtype}.{seed}.tolerances.json")
        if not os.path.exists(path):
            code, out = sh([self.a.exe, "calibrate", "--scenario", sc, "--dtype", dtype, "-n", str(self.a.calibrate_ranks),
                            "--seed", str(seed), "--runs", str(self.a.runs), "-o", path])
            if code != 0:
                sys.exit(f"calibrate {sc} {dtype} failed ({code}):\n{out}")
        return path

    def run(self, sc, dtype, rule, seed=None, fault=None, scale=None, flags=()):
        """Exit code and the worst err/tol over the taps (clean runs)."""
        js = os.path.join(self.work, "r.json")
        if os.path.exists(js):
            os.remove(js)
        args = ["mpirun", "-n", str(self.a.n), self.a.exe, "--scenario", sc, "--dtype", dtype,
                "--out", os.path.join(self.work, "run.h5"), "--json", js]
        if rule != "derived":
            args += ["--tolerances", rule]
        if seed is not None:
            args += ["--seed", str(seed)]
        if fault:
            args += ["--inject", fault, "--fault-scale", f"{scale:.17g}"]
        for f in flags:
            args += ["--flag", f]
        code, out = sh(args)
        self.runs += 1
        if code not in (0, 1):
            sys.exit(f"{' '.join(args)} failed ({code}):\n{out[-3000:]}")
        worst, tap = 0.0, None
        if os.path.exists(js):
            with open(js) as f:
                rep = json.load(f)
            for t in rep["taps"]:
                ref = t["reference"]
                if ref["present"]:
                    m = float(ref.get("margin", ref["worst_ratio"]))
                    if m > worst or tap is None:
                        worst, tap = m, t["name"]
        return code, worst, tap


def scalable_faults(exe):
    code, out = sh([exe, "list", "--json"])
    if code != 0:
        sys.exit(out)
    return {s["name"]: [(f["name"], f["needs_flags"]) for f in s["faults"] if f.get("scalable")]
            for s in json.loads(out)}


def smallest_caught(r, sc, dtype, rule, fault, flags, seed, ratio=1.1):
    """Smallest A caught, by bisection on log A (None if A = 1 passes)."""
    caught = lambda a: r.run(sc, dtype, rule, seed=seed, fault=fault, scale=a, flags=flags)[0] == 1
    if not caught(1.0):
        return None
    hi, lo = 1.0, 0.5
    while caught(lo):
        hi, lo = lo, lo / 4
        if lo < 1e-12:
            return lo
    while hi / lo > ratio:
        mid = math.sqrt(hi * lo)
        if caught(mid):
            hi = mid
        else:
            lo = mid
    return hi


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default="diffcheck")
    ap.add_argument("-n", type=int, default=16, help="ranks of every run (its default mesh)")
    ap.add_argument("--scenario", action="append", help="default: every scenario")
    ap.add_argument("--dtype", action="append", help="default: float32 and bfloat16")
    ap.add_argument("--seeds", type=int, default=100, help="clean runs per scenario and dtype")
    ap.add_argument("--first-seed", type=int, default=2)
    ap.add_argument("--calibration-seed", type=int, default=1)
    ap.add_argument("--same-seed", action="store_true",
                    help="calibrate on each run's own seed, as --tolerance calibrated does (its rel L2 limit is then "
                         "k_same_inputs x the unperturbed one-device error); default: one calibration on "
                         "--calibration-seed for every run")
    ap.add_argument("--detection-seed", type=int, default=1234, help="seed of the runs with a fault")
    ap.add_argument("--runs", type=int, default=8, help="calibration runs")
    ap.add_argument("--calibrate-ranks", type=int, default=2)
    ap.add_argument("--derived-too", action="store_true", help="count the derived rule's false positives too")
    ap.add_argument("--no-detection", action="store_true")
    ap.add_argument("--no-false-positives", action="store_true")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    faults = scalable_faults(a.exe)
    scenarios = a.scenario or sorted(faults)
    dtypes = a.dtype or ["float32", "bfloat16"]
    result = {"false_positives": [], "detection": []}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        r = Runner(a, work)
        if not a.no_false_positives:
            print(f"| scenario | dtype | clean runs (seeds {a.first_seed}..{a.first_seed + a.seeds - 1}) | "
                  f"false positives, calibrated | worst clean err/tol, calibrated (tap) |"
                  + (" false positives, derived | worst clean err/tol, derived |" if a.derived_too else ""))
            print("|---|---|---|---|---|" + ("---|---|" if a.derived_too else ""))
            for sc in scenarios:
                for dt in dtypes:
                    fp, worst, wtap, fpd, worstd = 0, 0.0, None, 0, 0.0
                    for seed in range(a.first_seed, a.first_seed + a.seeds):
                        code, w, tap = r.run(sc, dt, r.calibrate(sc, dt, seed), seed=seed)
                        fp += code == 1
                        if w >= worst:
                            worst, wtap = w, f"{tap}, seed {seed}"
                        if a.derived_too:
                            code, w, _ = r.run(sc, dt, "derived", seed=seed)
                            fpd += code == 1
                            worstd = max(worstd, w)
                    row = {"scenario": sc, "dtype": dt, "runs": a.seeds, "false_positives": fp,
                           "worst_clean": worst, "worst_tap": wtap}
                    line = f"| {sc} | {dt} | {a.seeds} | {fp} | {worst:.3f} ({wtap}) |"
                    if a.derived_too:
                        row.update(false_positives_derived=fpd, worst_clean_derived=worstd)
                        line += f" {fpd} | {worstd:.3f} |"
                    result["false_positives"].append(row)
                    print(line, flush=True)
        if not a.no_detection:
            print("\n| scenario | fault | dtype | smallest A caught, derived | smallest A caught, calibrated | derived / calibrated |")
            print("|---|---|---|---|---|---|")
            for sc in scenarios:
                for fault, needs in faults.get(sc, []):
                    for dt in dtypes:
                        tol = r.calibrate(sc, dt, a.detection_seed)
                        ad = smallest_caught(r, sc, dt, "derived", fault, needs, a.detection_seed)
                        ac = smallest_caught(r, sc, dt, tol, fault, needs, a.detection_seed)
                        gain = ad / ac if ad and ac else None
                        result["detection"].append({"scenario": sc, "fault": fault, "dtype": dt, "derived": ad,
                                                    "calibrated": ac, "gain": gain})
                        fmt = lambda x: "not caught at 1" if x is None else f"{x:.3g}"
                        print(f"| {sc} | {fault} | {dt} | {fmt(ad)} | {fmt(ac)} | "
                              f"{'-' if gain is None else f'{gain:.1f}x'} |", flush=True)
        result["runs"] = r.runs
        result["seconds"] = time.time() - t0
    print(f"\n{result['runs']} runs in {result['seconds']:.0f} s", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
