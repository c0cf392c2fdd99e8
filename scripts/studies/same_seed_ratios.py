#!/usr/bin/env python3
"""How close a clean sharded run's error stays to the one-device run's on the
same inputs: the ground for k_same_inputs (docs/tolerances.md).

For every scenario, dtype and seed: the unperturbed one-device error of that
seed (`diffcheck calibrate --runs 1 --seed S`: its floors are run 0's), then
the clean sharded run on the same seed under that file; per tap the ratio of
the run's rel L2 error to the one-device run's, the same for the
column-mean error (check/column_error.h) where the tap has one, and the
tap's err/tol under the limits the run applied (over 1: a false positive).
Prints the worst of each per scenario and dtype as a markdown table, and
writes every figure to --json.

    /usr/bin/python3 scripts/studies/same_seed_ratios.py --exe build/diffcheck [-n 16] [--seeds 100]
        [--first-seed 2] [--scenario S]... [--dtype D]... [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1",
           OPENBLAS_NUM_THREADS="1")
SCENARIOS = ["dit_ulysses", "flux_pipeline", "flux_tp", "timestep_broadcast", "unreduced_reshard",
             "usp_attention", "vae_patch_decode"]


def sh(args):
    p = subprocess.run(args, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


def ratios(a, work, sc, dtype, seed):
    """Per tap: (ratio of rel L2 errors, tap, kind) for one seed; kind "rel_l2" or "column_mean"."""
    cal, js = os.path.join(work, "cal.json"), os.path.join(work, "r.json")
    code, out = sh([a.exe, "calibrate", "--scenario", sc, "--dtype", dtype, "-n", "2", "--seed", str(seed),
                    "--runs", "1", "-o", cal])
    if code != 0:
        sys.exit(f"calibrate {sc} {dtype} seed {seed} failed ({code}):\n{out}")
    if os.path.exists(js):
        os.remove(js)
    code, out = sh(["mpirun", "-n", str(a.n), a.exe, "--scenario", sc, "--dtype", dtype, "--seed", str(seed),
                    "--tolerances", cal, "--out", os.path.join(work, "run.h5"), "--json", js])
    if code not in (0, 1) or not os.path.exists(js):
        sys.exit(f"run {sc} {dtype} seed {seed} failed ({code}):\n{out[-3000:]}")
    with open(js) as f:
        report = json.load(f)
    for t in report["taps"]:
        ref = t["reference"]
        floor = ref.get("noise_floor", {}).get("rel_l2_as_is", ref.get("noise_floor", {}).get("rel_l2"))
        if not ref.get("present") or floor is None:
            continue
        floor, err = float(floor), float(ref["rel_l2"])
        yield ratio(err, floor), t["name"], "rel_l2"
        nf = ref.get("noise_floor", {})
        column_floor = nf.get("column_mean_as_is", nf.get("column_mean"))
        if column_floor is not None and ref.get("column_mean") is not None:
            yield ratio(float(ref["column_mean"]), float(column_floor)), t["name"], "column_mean"
        # What the run's limits made of it: the tap's err/tol (a tap of few
        # numbers or columns keeps k_norm x the floor, not k_same x run 0's).
        yield float(ref["margin"]), t["name"], "err_over_tol"


def ratio(err, floor):
    return err / floor if floor > 0 else (0.0 if err == 0 else float("inf"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default="diffcheck")
    ap.add_argument("-n", type=int, default=16, help="ranks of every sharded run (its default mesh)")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--first-seed", type=int, default=2)
    ap.add_argument("--scenario", action="append", help="default: every scenario")
    ap.add_argument("--dtype", action="append", help="default: float32 and bfloat16")
    ap.add_argument("--json", help="write every ratio here")
    a = ap.parse_args()
    rows, t0 = [], time.time()
    print("| scenario | dtype | seeds | worst ratio, sharded / one-device rel L2 (tap, seed) | "
          "worst ratio of column means (tap, seed) | worst err/tol of the run's limits (tap, seed) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for sc in a.scenario or SCENARIOS:
            for dtype in a.dtype or ["float32", "bfloat16"]:
                worst = {"rel_l2": (0.0, None, None), "column_mean": (0.0, None, None),
                         "err_over_tol": (0.0, None, None)}
                for seed in range(a.first_seed, a.first_seed + a.seeds):
                    for r, tap, kind in ratios(a, work, sc, dtype, seed):
                        rows.append({"scenario": sc, "dtype": dtype, "seed": seed, "tap": tap, "kind": kind,
                                     "ratio": r})
                        if r > worst[kind][0]:
                            worst[kind] = (r, tap, seed)
                cells = [f"{r:.3f} ({tap}, seed {seed})" if tap else "-" for r, tap, seed in worst.values()]
                print(f"| {sc} | {dtype} | {a.seeds} | {cells[0]} | {cells[1]} | {cells[2]} |", flush=True)
    for kind in ("rel_l2", "column_mean"):
        some = [r for r in rows if r["kind"] == kind]
        print(f"{kind}: {len(some)} tap comparisons, {sum(r['ratio'] >= 2 for r in some)} at 2x or more",
              file=sys.stderr)
    fails = [r for r in rows if r["kind"] == "err_over_tol" and not r["ratio"] <= 1]
    print(f"err/tol: {len(fails)} taps over their limit (false positives)", file=sys.stderr)
    print(f"in {time.time() - t0:.0f} s", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
