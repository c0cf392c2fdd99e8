#!/usr/bin/env python3
"""How many trials `diffcheck bisect` needs to find a 2-flag interaction among
n flags, over every position of the pair, against 2^n for exhaustive search.
Each trial is a real child process (a shell that fails when both flags are in
XLA_FLAGS).

    /usr/bin/python3 scripts/studies/bisect_trials.py [--exe diffcheck] 8 16
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--exe", default="diffcheck")
ap.add_argument("sizes", nargs="*", type=int, default=[8, 16])
a = ap.parse_args()
print("| flags | pairs tried | trials min | median | max | exhaustive 2^n |\n|---|---|---|---|---|---|")
with tempfile.TemporaryDirectory() as tmp:
    for n in a.sizes:
        counts = []
        for i, j in itertools.combinations(range(n), 2):
            job = os.path.join(tmp, "job.sh")
            with open(job, "w") as f:
                f.write(f'f=" $XLA_FLAGS "; case "$f" in *" F{i} "*) case "$f" in *" F{j} "*) exit 1;; esac;; esac; exit 0\n')
            js = os.path.join(tmp, "b.json")
            subprocess.run([a.exe, "bisect", "--env", "XLA_FLAGS", "--cache", "", "--json", js,
                            "--flags", ",".join(f"F{k}" for k in range(n)), "--", "sh", job],
                           capture_output=True, check=False)
            r = json.load(open(js))
            assert r["minimal"] == [f"F{i}", f"F{j}"], r
            counts.append(len(r["trials"]))
        print(f"| {n} | {len(counts)} | {min(counts)} | {statistics.median(counts):g} | {max(counts)} | {2 ** n} |")
