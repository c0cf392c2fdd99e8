#!/usr/bin/env python3
"""Sketch mode against whole capture, on the examples as they ship: for each
example, bug and rank count, the same run captured whole and as sketches
(`--sketch`), both compared as the example does (one-device yardstick). Prints

  - the verdict table: exit status and first divergent tap of each mode;
  - the estimate's accuracy on real activations: for every tap with a
    reference in both reports, the sketch's rel L2 estimate against the
    whole capture's exact rel L2 (within 25%? taps whose exact error is 0
    are counted apart);
  - the estimate's accuracy on synthetic errors by shape (random, one token,
    a shared bias, a per-token scale, rank one), 200 each.

    DIFFCHECK_EXE=build/diffcheck .venv/bin/python scripts/studies/sketch_agreement.py [--ranks 1 2 4] [--quick]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
from diffcheck import sketch  # noqa: E402

CASES = {"tp_block": [None, "--bug"], "cfg_denoise": [None, "--bug"],
         "tp_train": [None, "ln_grad_not_reduced", "grad_averaged_twice"]}
PREFIX = {"tp_block": "tp", "cfg_denoise": "cfg", "tp_train": "tp"}


def run(example, n, bug, sketch_mode, out):
    args = [sys.executable, os.path.join(ROOT, "examples", f"{example}.py"), "-n", str(n), "--out", out]
    if bug == "--bug":
        args.append("--bug")
    elif bug:
        args += ["--bug", bug]
    if sketch_mode:
        args.append("--sketch")
    p = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    m = re.search(r"First divergence: tap '([^']+)'", p.stdout)
    subprocess.run([os.environ.get("DIFFCHECK_EXE", "diffcheck"), "compare", f"{out}/{PREFIX[example]}",
                    "--reference", f"{out}/ref.h5", "--json", f"{out}/report.json"], capture_output=True)
    with open(f"{out}/report.json") as f:
        taps = {t["name"]: t["reference"].get("rel_l2") for t in json.load(f)["taps"] if t["reference"]["present"]}
    return p.returncode, m.group(1) if m else "-", taps


def synthetic(rng, k=8, trials=200):
    kinds = ["random", "one token", "shared bias", "per-token scale", "rank one"]
    within = dict.fromkeys(kinds, 0)
    for _ in range(trials):
        tokens, width = int(rng.integers(16, 300)), int(rng.integers(4, 200))
        ref = rng.standard_normal((tokens, width)) + rng.standard_normal(width) * 3
        one = np.zeros(ref.shape)
        one[rng.integers(tokens)] = rng.standard_normal(width)
        errs = [rng.standard_normal(ref.shape), one,
                np.tile(rng.standard_normal(width), (tokens, 1)) + 0.3 * rng.standard_normal(ref.shape),
                (ref - ref.mean(0)) * rng.standard_normal((tokens, 1)),
                np.outer(rng.standard_normal(tokens), rng.standard_normal(width))]
        r = sketch.signs(0, k, 0, tokens).double().numpy()
        for kind, err in zip(kinds, errs):
            x = ref + 1e-3 * err
            sx, sr = (np.vstack([r @ a, a.sum(0)]) for a in (x, ref))
            est = sketch.estimate_rel_l2(sx, sr, k, tokens, 0)
            exact = np.linalg.norm(x - ref) / np.linalg.norm(ref)
            within[kind] += abs(est / exact - 1) <= 0.25
    return {kind: v / trials for kind, v in within.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--quick", action="store_true", help="tp_block only, 4 ranks")
    a = ap.parse_args()
    cases = {"tp_block": CASES["tp_block"]} if a.quick else CASES
    ranks = [4] if a.quick else a.ranks
    agree, total, close, compared, zero = 0, 0, 0, 0, 0
    worst = (0.0, "")
    print(f"{'example':12} {'bug':22} {'ranks':>5}  {'whole: exit, first divergence':45} {'sketch: exit, first divergence':45} same")
    with tempfile.TemporaryDirectory() as tmp:
        for example, bugs in cases.items():
            for bug in bugs:
                for n in ranks:
                    if example == "cfg_denoise" and n not in (1, 2) and n % 2:
                        continue
                    w = run(example, n, bug, False, f"{tmp}/{example}-{n}-w")
                    s = run(example, n, bug, True, f"{tmp}/{example}-{n}-s")
                    same = w[0] == s[0] and w[1] == s[1]
                    agree += same
                    total += 1
                    print(f"{example:12} {str(bug or 'clean'):22} {n:>5}  {w[0]}, {w[1]:42} {s[0]}, {s[1]:42} "
                          f"{'yes' if same else 'NO'}", flush=True)
                    for name, exact in w[2].items():
                        est = s[2].get(name)
                        if est is None or exact is None:
                            continue
                        if exact == 0:
                            zero += 1
                            continue
                        compared += 1
                        off = abs(est / exact - 1)
                        close += off <= 0.25
                        if off > worst[0]:
                            worst = (off, f"{example} {bug or 'clean'} n={n} {name}: exact {exact:.3g}, estimate {est:.3g}")
    print(f"\nverdicts: {agree} of {total} runs give the same exit status and first divergence in both modes")
    print(f"real activations: {close} of {compared} taps' rel L2 estimates within 25% of the exact figure "
          f"({100 * close / max(compared, 1):.2f}%); {zero} taps with an exact error of 0 left out; "
          f"worst {100 * worst[0]:.1f}% off ({worst[1]})")
    rates = synthetic(np.random.default_rng(0))
    print("synthetic errors, share of estimates within 25% (k = 8, 200 each): " +
          ", ".join(f"{kind} {100 * v:.1f}%" for kind, v in rates.items()))


if __name__ == "__main__":
    main()
