#!/usr/bin/env python3
"""The JAX tolerance matrix (issue 70): examples/jax_reshard.py clean on every
mesh of 8 devices over its four axes (dp x fsdp x sp x tp, powers of two: 20
meshes) in float32 and bfloat16, judged by the default workflow (the float64
reference and the one-device yardstick beside it); and --bug on each mesh,
which must fail exactly where dp has size 2 (the reduction over dp left out),
at `result`. Prints one line per cell: the verdict, the first divergence and
the largest err/tol of a clean run (its margin), then the counts.

    .venv/bin/python scripts/studies/jax_tolerance_matrix.py [--dtypes float32 bfloat16] [--no-bug] [--shard-map]

--shard-map: the program like it whose reductions are written by hand, each
device's partial product reduce-scattered over (fsdp, sp) and all-reduced
over dp in the run's dtype (the program of issue 70's two false FAILs).

Exit 1 on a false FAIL or a misplaced bug. Needs diffcheck (DIFFCHECK_EXE or
on PATH) and the torch environment's jax (scripts/torch_env.sh)."""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AXES = ("dp", "fsdp", "sp", "tp")


def meshes(devices=8):
    sizes = [1, 2, 4, 8]
    for combo in itertools.product(sizes, repeat=len(AXES)):
        n = 1
        for s in combo:
            n *= s
        if n == devices:
            yield ",".join(f"{a}={s}" for a, s in zip(AXES, combo))


def run(mesh, dtype, bug, exe, extra=()):
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env["DIFFCHECK_EXE"] = exe
        p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "jax_reshard.py"), "--mesh", mesh,
                            "--dtype", dtype, "--out", tmp, *(["--bug"] if bug else []), *extra],
                           capture_output=True, text=True, timeout=600, env=env)
        if p.returncode not in (0, 1):
            raise RuntimeError(f"{mesh} {dtype}: exit {p.returncode}: {p.stderr[-2000:]}")
        report = os.path.join(tmp, "report.json")
        subprocess.run([exe, "compare", os.path.join(tmp, "run"), "--reference", os.path.join(tmp, "run.reference.h5"),
                        "--json", report], capture_output=True, text=True)
        worst = 0.0
        if os.path.exists(report):
            with open(report) as f:
                rep = json.load(f)
            worst = max((float(t["reference"].get("margin", t["reference"].get("worst_ratio", 0))) for t in rep["taps"]
                         if t["reference"].get("present")), default=0.0)
    first = next((line.split("'")[1] for line in p.stdout.splitlines() if line.startswith("First divergence")), None)
    return p.returncode == 0, first, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--no-bug", action="store_true", help="clean runs only")
    ap.add_argument("--shard-map", action="store_true",
                    help="the example's reductions written by hand (psum_scatter over fsdp, sp; psum over dp)")
    args = ap.parse_args()
    exe = os.environ.get("DIFFCHECK_EXE") or shutil.which("diffcheck") or os.path.join(ROOT, "build", "diffcheck")
    false_fails, misplaced, cells = [], [], 0
    for mesh, dtype in itertools.product(meshes(), args.dtypes):
        extra = ["--shard-map"] if args.shard_map else []
        ok, first, worst = run(mesh, dtype, False, exe, extra)
        cells += 1
        print(f"{mesh:28s} {dtype:9s} clean: {'PASS' if ok else 'FAIL at ' + str(first):24s} "
              f"largest err/tol {worst:.3g}", flush=True)
        if not ok:
            false_fails.append((mesh, dtype, first))
        if args.no_bug:
            continue
        dp2 = "dp=2" in mesh.split(",")
        ok, first, _ = run(mesh, dtype, True, exe, extra)
        expected = (False, "result") if dp2 else (True, None)
        print(f"{'':28s} {'':9s} --bug: {'PASS' if ok else 'FAIL at ' + str(first)}"
              f"{'' if (ok, first) == expected else '   <- expected ' + ('FAIL at result' if dp2 else 'PASS')}",
              flush=True)
        if (ok, first) != expected:
            misplaced.append((mesh, dtype, first))
    print(f"{cells} clean cells: {len(false_fails)} false FAIL(s) {false_fails or ''}; "
          f"--bug cells misplaced: {len(misplaced)} {misplaced or ''}")
    return 1 if false_fails or misplaced else 0


if __name__ == "__main__":
    sys.exit(main())
