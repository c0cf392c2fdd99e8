#!/usr/bin/env python3
"""Run against run on the torch examples (issue 53), no reference anywhere:
examples/tp_block.py (tp = 1, 2, 4) and examples/cfg_denoise.py (1, 2 and 4
ranks: cfg=1; cfg=2; cfg=2,sp=2), float32 and bfloat16, whole and sketch.

  - false positives: the three clean runs compared with each other
    (`diffcheck compare A --against B --against C`): a failure is a false
    positive;
  - detection: the example's --bug in the run on one mesh (each mesh where
    the bug shows: tp_block's bias on every rank shows at tp > 1,
    cfg_denoise's timestep broadcast on more than one rank), with the clean
    runs of the other two: the bugged run must leave the consensus, at the
    example's first tap (tp_block attn.out, cfg_denoise step1/time_embed.mlp.0;
    cfg_denoise in bfloat16 a step late, as docs/usage.md says);
  - sketch and whole agree: the same odd run out at the same tap.

    .venv/bin/python scripts/studies/torch_against_meshes.py [--exe build/diffcheck] [--examples tp_block cfg_denoise]

Needs torch (scripts/torch_env.sh). Prints the tables in markdown.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = {  # name: (prefix inside --out, the bug's first tap, rank counts)
    "tp_block": ("tp", "attn.out", (1, 2, 4)),
    "cfg_denoise": ("cfg", "step1/time_embed.mlp.0", (1, 2, 4)),
}
# Named a step late, as docs/usage.md says: in bfloat16 step 1's error is
# err/tol 0.70 under two runs' bounds (against a float64 reference it fails there).
LATE = {("cfg_denoise", "bfloat16"): "step2/time_embed.mlp.0"}


def capture(a, example, n, dtype, sketch, bug):
    prefix, _, _ = EXAMPLES[example]
    out = os.path.join(a.work, f"{example}_{n}_{dtype}_{'sketch' if sketch else 'whole'}_{'bug' if bug else 'clean'}")
    if not os.path.exists(out):
        cmd = [sys.executable, os.path.join(ROOT, "examples", f"{example}.py"), "-n", str(n), "--out", out,
               "--no-reference", "--dtype", dtype] + (["--sketch"] if sketch else []) + (["--bug"] if bug else [])
        p = subprocess.run(cmd, capture_output=True, text=True, env=a.env, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return os.path.join(out, prefix)


def compare(a, runs):
    report = os.path.join(a.work, "report.json")
    if os.path.exists(report):
        os.remove(report)
    cmd = [a.exe, "compare", runs[0], "--json", report]
    for r in runs[1:]:
        cmd += ["--against", r]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    with open(report) as f:
        return p.returncode, json.load(f)


def worst_ratio(report):
    return max([float(t["reference"]["worst_ratio"]) for t in report["taps"]
                if t["reference"].get("present") and t["reference"].get("worst_ratio") is not None] or [0.0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=os.environ.get("DIFFCHECK_EXE") or shutil.which("diffcheck") or "build/diffcheck")
    ap.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    a = ap.parse_args()
    a.exe = os.path.abspath(a.exe)
    a.env = dict(os.environ, DIFFCHECK_EXE=a.exe, PYTHONPATH=os.path.join(ROOT, "python"), OPENBLAS_NUM_THREADS="1",
                 OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    clean_rows, bug_rows = [], []
    with tempfile.TemporaryDirectory(prefix="dc_torch_against_") as work:
        a.work = work
        for example in a.examples:
            _, first_tap, meshes = EXAMPLES[example]
            for dtype in a.dtypes:
                for sketch in (False, True):
                    mode = "sketch" if sketch else "whole"
                    clean = {n: capture(a, example, n, dtype, sketch, False) for n in meshes}
                    code, rep = compare(a, [clean[n] for n in meshes])
                    clean_rows.append((example, dtype, mode, code, worst_ratio(rep)))
                    print(f"clean {example} {dtype} {mode}: exit {code}, worst err/tol {worst_ratio(rep):.3g}",
                          flush=True)
                    for bugged in meshes[1:]:  # the bug shows on more than one rank
                        runs = [clean[n] if n != bugged else capture(a, example, n, dtype, sketch, True)
                                for n in meshes]
                        code, rep = compare(a, runs)
                        standing = rep.get("consensus", {}).get("runs", [])
                        odd = [meshes[i] for i, r in enumerate(standing) if "leaves_at" in r]
                        tap = [r["leaves_at"]["tap"] for r in standing if "leaves_at" in r]
                        late = LATE.get((example, dtype))
                        found = code == 1 and odd == [bugged] and tap in ([first_tap], [late])
                        bug_rows.append({"example": example, "dtype": dtype, "mode": mode, "bug_on": bugged,
                                         "odd": odd, "tap": tap[0] if tap else None, "found": found,
                                         "first": found and tap == [first_tap]})
                        print(f"bug {example} {dtype} {mode} on {bugged} ranks: exit {code}, odd run {odd} at "
                              f"{tap}: {'FOUND' if found else 'MISSED'}"
                              f"{'' if not found or tap == [first_tap] else ' (a step late, as documented)'}",
                              flush=True)
    print("\n| example | dtype | mode | exit (3 clean runs) | worst err/tol |\n|---|---|---|---|---|")
    for e, d, m, c, w in clean_rows:
        print(f"| {e} | {d} | {m} | {c} | {w:.3g} |")
    print("\n| example | dtype | bug on (ranks) | whole: odd run, tap | sketch: odd run, tap | found in both | agree |")
    print("|---|---|---|---|---|---|---|")
    agree_all = True
    for r in bug_rows:
        if r["mode"] != "whole":
            continue
        s = next(x for x in bug_rows if x["mode"] == "sketch" and x["example"] == r["example"]
                 and x["dtype"] == r["dtype"] and x["bug_on"] == r["bug_on"])
        agree = r["odd"] == s["odd"] and r["tap"] == s["tap"]
        agree_all &= agree
        print(f"| {r['example']} | {r['dtype']} | {r['bug_on']} | {r['odd']} {r['tap']} | {s['odd']} {s['tap']} | "
              f"{'yes' if r['found'] and s['found'] else 'NO'} | {'yes' if agree else 'NO'} |")
    fp = sum(1 for row in clean_rows if row[3] != 0)
    found = sum(r["found"] for r in bug_rows)
    first = sum(r["first"] for r in bug_rows)
    print(f"\n{fp} false positives of {len(clean_rows)} clean triples; {found} of {len(bug_rows)} bugs named "
          f"({first} at the first tap, {found - first} a step late as documented); "
          f"sketch and whole {'agree on every bug' if agree_all else 'DISAGREE'}; {time.monotonic() - t0:.0f} s")
    return 0 if fp == 0 and found == len(bug_rows) and agree_all else 1


if __name__ == "__main__":
    sys.exit(main())
