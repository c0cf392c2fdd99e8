#!/usr/bin/env python3
"""False positives of sketch mode: each example, clean, in sketch mode
(`--sketch`, its one-device yardstick) over many seeds of its weights and
inputs, in float32 and bfloat16. Prints each combination's count of runs
judged wrong and the worst err/tol of a clean run (how close it came).

    DIFFCHECK_EXE=build/diffcheck .venv/bin/python scripts/studies/sketch_false_positives.py [--seeds 100] [-n 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = {"tp_block": "tp", "cfg_denoise": "cfg"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--examples", nargs="+", default=sorted(PREFIX))
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    failures = 0
    for example in a.examples:
        for dtype in ("float32", "bfloat16"):
            wrong, worst = [], (0.0, None)
            with tempfile.TemporaryDirectory() as tmp:
                for seed in range(a.seeds):
                    out = os.path.join(tmp, str(seed))
                    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", f"{example}.py"), "-n", str(a.n),
                                        "--sketch", "--seed", str(seed), "--dtype", dtype, "--out", out],
                                       capture_output=True, text=True, env=env)
                    if p.returncode not in (0, 1):
                        raise SystemExit(f"{example} seed {seed} {dtype}: exit {p.returncode}\n{p.stderr[-2000:]}")
                    subprocess.run([os.environ.get("DIFFCHECK_EXE", "diffcheck"), "compare", f"{out}/{PREFIX[example]}",
                                    "--reference", f"{out}/ref.h5", "--json", f"{out}/r.json"], capture_output=True)
                    with open(f"{out}/r.json") as f:
                        report = json.load(f)
                    for t in report["taps"]:
                        m = t["reference"].get("margin", 0) if t["reference"]["present"] else 0
                        if m > worst[0]:
                            worst = (m, f"seed {seed} {t['name']}")
                    if p.returncode == 1:
                        wrong.append(seed)
                    subprocess.run(["rm", "-rf", out])
            failures += len(wrong)
            print(f"{example:12} {dtype:9} {a.n} ranks: {len(wrong)} of {a.seeds} clean runs judged wrong"
                  f"{' (seeds ' + ', '.join(map(str, wrong)) + ')' if wrong else ''}; worst err/tol {worst[0]:.3f} "
                  f"({worst[1]})", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
