"""`diffcheck sweep-mesh --no-reference` over the built-in scenarios (issue 53):
every mesh of N ranks runs with no reference, and the meshes' runs are
compared with each other.

  - clean: each scenario, float32 and bfloat16: a mesh judged wrong is a
    false positive;
  - faults: each fault, injected on every mesh; where the meshes the fault
    does not reach are more than half, each mesh it reaches must leave the
    consensus at its first tap (across meshes) and the others pass; where
    they are not, no mesh can be told wrong, which the table says.

    /usr/bin/python3 scripts/studies/sweep_no_reference.py --exe build/diffcheck [-n 4 8] [--scenario S ...]

Prints both tables in markdown; --json keeps every row.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1")
SIZES = {"flux_pipeline": "tiny"}  # the default pipeline is 28 steps: minutes per mesh


def sweep(a, scenario, n, dtype="float32", fault=None, flags=()):
    path = os.path.join(a.work, "sweep.json")
    if os.path.exists(path):
        os.remove(path)
    cmd = [a.exe, "sweep-mesh", "--scenario", scenario, "-n", str(n), "--no-reference", "--dtype", dtype,
           "--size", SIZES.get(scenario, "default"), "--json", path]
    if fault:
        cmd += ["--inject", fault]
    for f in flags:
        cmd += ["--flag", f]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if not os.path.exists(path):
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}, no JSON: {p.stdout[-400:]} {p.stderr[-400:]}")
    with open(path) as f:
        return p.returncode, json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=shutil.which("diffcheck") or "build/diffcheck")
    ap.add_argument("-n", type=int, nargs="+", default=[4, 8], help="rank counts to sweep")
    ap.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    ap.add_argument("--json", help="write every row here")
    a = ap.parse_args()
    a.exe = os.path.abspath(a.exe)
    t0 = time.monotonic()
    clean, faults = [], []
    listing = json.loads(subprocess.run([a.exe, "list", "--json"], capture_output=True, text=True, env=ENV).stdout)
    with tempfile.TemporaryDirectory(prefix="diffcheck_sweep_noref_") as work:
        a.work = work
        for s in listing:
            if a.scenario and s["name"] not in a.scenario:
                continue
            for n in a.n:
                for dtype in ("float32", "bfloat16"):
                    code, rep = sweep(a, s["name"], n, dtype)
                    wrong = [r["mesh"] for r in rep["rows"] if r["verdict"] != "PASS"]
                    clean.append({"scenario": s["name"], "ranks": n, "dtype": dtype, "meshes": len(rep["rows"]),
                                  "false_positives": wrong, "exit": code})
                    print(f"clean {s['name']} n={n} {dtype}: {len(rep['rows'])} meshes, exit {code}, "
                          f"judged wrong: {wrong or 'none'}", flush=True)
                for f in s["faults"]:
                    code, rep = sweep(a, s["name"], n, "float32", f["name"], f["needs_flags"])
                    rows = rep["rows"]
                    expected = [str(r.get("expected", "")) for r in rows]
                    undecidable = any(e.startswith("any") for e in expected)
                    many = [int(m.group(1)) for e in expected for m in [re.search(r"reaches (\d+) of", e)] if m]
                    reached = many[0] if many else sum(e.startswith("FAIL") for e in expected)
                    crashed = sum(r["verdict"] == "CRASHED" for r in rows)
                    named = [r["mesh"] for r in rows if r["verdict"] == "FAIL"]
                    met = all(r.get("as_expected", False) for r in rows)
                    faults.append({"scenario": s["name"], "fault": f["name"], "ranks": n, "meshes": len(rows),
                                   "reached": reached, "crashed": crashed, "named": named,
                                   "undecidable": undecidable and crashed < len(rows), "as_documented": met,
                                   "first_tap": f["first_tap_across_meshes"]})
                    print(f"fault {s['name']} {f['name']} n={n}: {len(rows)} meshes, reached {reached}, "
                          f"crashed {crashed}, named {len(named)}{', undecidable' if undecidable else ''}, "
                          f"{'as documented' if met else 'NOT as documented'}", flush=True)
    print("\n| scenario | ranks | dtype | meshes | judged wrong (false positives) |\n|---|---|---|---|---|")
    for r in clean:
        print(f"| {r['scenario']} | {r['ranks']} | {r['dtype']} | {r['meshes']} | {len(r['false_positives'])} |")
    print("\n| scenario | fault | ranks | meshes | reached | failed (named or split) | result |")
    print("|---|---|---|---|---|---|---|")
    for r in faults:
        result = ("crashes there (as documented)" if r["crashed"] == r["meshes"] and r["as_documented"] else
                  "the fault reaches half or more: no mesh can be told wrong" if r["undecidable"] else
                  "each mesh reached named, the others pass" if r["as_documented"] else "NOT as documented")
        print(f"| {r['scenario']} | {r['fault']} | {r['ranks']} | {r['meshes']} | {r['reached']} | "
              f"{len(r['named'])} | {result} |")
    fp = sum(len(r["false_positives"]) for r in clean)
    decided = [r for r in faults if not r["undecidable"]]
    print(f"\n{fp} false positives over {sum(r['meshes'] for r in clean)} clean mesh runs; "
          f"{sum(r['as_documented'] for r in decided)} of {len(decided)} decidable fault sweeps as documented "
          f"({len(faults) - len(decided)} undecidable); {time.monotonic() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"clean": clean, "faults": faults}, f, indent=1)
    return 0 if fp == 0 and all(r["as_documented"] for r in decided) else 1


if __name__ == "__main__":
    sys.exit(main())
