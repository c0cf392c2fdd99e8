#!/usr/bin/env python3
"""Detection power of diffcheck.torch's tolerances on examples/tp_block.py:
the smallest bug scale A (`--bug --bug-scale A`: the row-parallel sum holds
the bias 1 + A (tp - 1) times instead of once) that each way of judging
still catches, found by bisection on log A, per dtype:

  default       `diffcheck compare` as the example runs it: the one-device
                run captured beside the reference is found and is the yardstick
  noise floor   `--noise-floor` naming that one-device dump (issue 43's
                comparison: the default must catch within 2x of it)
  derived       `--noise-floor off`: the rule from each tap's dtype and its
                rounding counts (a user who captured no one-device run)
  run vs run    no reference at all (issue 53): `--against` a clean run of
                the example on another mesh (--against-n ranks), each
                tolerance the sum of both runs' derived bounds

Caught means exit 1 with the first divergence at attn.out (where the bug
is). Each A is one run of the example; the three judgements read its files.

    .venv/bin/python scripts/studies/torch_detection_power.py [--tokens 128] [--dim 512] [-n 2] [--dtypes float32 bfloat16]

Needs diffcheck on PATH (or DIFFCHECK_EXE) and torch (the torch environment, scripts/torch_env.sh).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "tp_block.py")
WAYS = {"default": (), "noise floor": ("--noise-floor", "{floor}"), "derived": ("--noise-floor", "off"),
        "run vs run": ("--against", "{clean}")}


def judged(exe, out, way, clean):
    """(caught, first divergence) of the files in `out` under `way`."""
    extra = [x.format(floor=os.path.join(out, "ref.one_device"), clean=os.path.join(clean, "tp")) for x in WAYS[way]]
    report = os.path.join(out, "report.json")
    reference = [] if way == "run vs run" else ["--reference", os.path.join(out, "ref.h5")]
    res = subprocess.run([exe, "compare", os.path.join(out, "tp"), *reference, "--json", report, *extra],
                         capture_output=True, text=True)
    if res.returncode not in (0, 1):
        raise RuntimeError(f"compare ({way}) exited {res.returncode}: {res.stderr.strip()}")
    with open(report) as f:
        first = (json.load(f).get("first_divergence") or {}).get("tap")
    return res.returncode == 1 and first == "attn.out", first


def run(a, env, dtype, scale, out, n=None):
    """The example with the bug at `scale` (None: clean) on `n` ranks (default -n)."""
    shutil.rmtree(out, ignore_errors=True)
    bug = [] if scale is None else ["--bug", "--bug-scale", repr(scale)]
    cmd = [sys.executable, EXAMPLE, "-n", str(n or a.n), "--out", out, "--tokens", str(a.tokens), "--dim", str(a.dim),
           "--dtype", dtype, *bug]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if not os.path.exists(os.path.join(out, "ref.h5")):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-1000:]}")


def smallest_caught(a, env, dtype, work):
    """{way: smallest A caught} by bisection on log A between --low and --high."""
    cache = {}
    clean = os.path.join(work, "clean")
    run(a, env, dtype, None, clean, a.against_n)

    def verdicts(scale):
        if scale not in cache:
            out = os.path.join(work, "run")
            run(a, env, dtype, scale, out)
            cache[scale] = {way: judged(a.exe, out, way, clean)[0] for way in WAYS}
        return cache[scale]

    result = {}
    for way in WAYS:
        lo, hi = a.low, a.high
        if not verdicts(hi)[way]:
            result[way] = math.inf
            continue
        if verdicts(lo)[way]:
            result[way] = lo
            continue
        while hi / lo > 1 + a.precision:  # caught at hi, not at lo
            mid = math.sqrt(lo * hi)
            mid = float(f"{mid:.3g}")
            if mid in (lo, hi):
                break
            if verdicts(mid)[way]:
                hi = mid
            else:
                lo = mid
        result[way] = hi
    return result, len(cache)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("-n", type=int, default=2, help="ranks (tp)")
    ap.add_argument("--against-n", type=int, default=4, help="ranks of the clean run the run vs run way compares with")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--low", type=float, default=1e-6)
    ap.add_argument("--high", type=float, default=1.0)
    ap.add_argument("--precision", type=float, default=0.15, help="stop when hi/lo is within 1 + this")
    ap.add_argument("--exe", default=os.environ.get("DIFFCHECK_EXE") or shutil.which("diffcheck") or "diffcheck")
    a = ap.parse_args()
    env = dict(os.environ, DIFFCHECK_EXE=a.exe, PYTHONPATH=os.path.join(ROOT, "python"), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    print(f"tp_block, {a.tokens} tokens, D {a.dim}, tp={a.n}: smallest bug scale A caught at attn.out\n")
    print(f"| dtype | default (one-device found) | --noise-floor ONE_DEVICE | derived (--noise-floor off) | "
          f"run vs run (tp={a.against_n}, no reference) | default / noise floor | run vs run / derived | "
          f"run vs run / default | runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="dc_detect_") as work:
        for dtype in a.dtypes:
            r, runs = smallest_caught(a, env, dtype, work)
            def ratio(x, y):
                return r[x] / r[y] if math.isfinite(r[y]) and r[y] > 0 else math.nan
            print(f"| {dtype} | {r['default']:.3g} | {r['noise floor']:.3g} | {r['derived']:.3g} | "
                  f"{r['run vs run']:.3g} | {ratio('default', 'noise floor'):.2f} | {ratio('run vs run', 'derived'):.2f} "
                  f"| {ratio('run vs run', 'default'):.2f} | {runs} |", flush=True)
    print(f"\n{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
