"""Run against run with no reference, over the built-in scenarios (issue 53):

  - false positives: each scenario clean on three meshes (of 1 to 8 ranks:
    the default, another of its batch size and one of another where there
    are; runs of another dp hold another batch and are compared on the
    samples they share), float32 and bfloat16; every pair compared with `diffcheck compare A --against B`
    (each tolerance the sum of both runs' bounds). A pair judged wrong is a
    false positive; the worst err/tol over the pair's taps says how close a
    clean pair came.
  - mesh faults: each fault that shows on some meshes only (`diffcheck list`:
    takes_effect_when is not "always"), injected on a mesh where it shows,
    compared with two clean runs on meshes where it does not, of its batch
    size first (`--against B --against C`): found means exit 1 with the faulty run named
    as the one that leaves the consensus, at the fault's documented first tap.

    /usr/bin/python3 scripts/studies/against_meshes.py --exe build/diffcheck [--ranks 2 4 8] [--scenario S ...]

Prints both tables in markdown; --json keeps every row.
"""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1")


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def planned_meshes(a, scenario, size, fault=None, flags=()):
    """(mesh, expected) of every mesh of each rank count that the size allows,
    the largest rank count first. Runs against runs need not have as many
    ranks: only the global tensors must agree."""
    out = []
    for n in sorted(a.ranks, reverse=True):
        path = os.path.join(a.work, "plan.json")
        cmd = [a.exe, "sweep-mesh", "--scenario", scenario, "-n", str(n), "--dry-run", "--json", path, "--size", size]
        if fault:
            cmd += ["--inject", fault]
        for f in flags:
            cmd += ["--flag", f]
        if subprocess.run(cmd, capture_output=True, text=True, env=ENV).returncode != 0:
            continue
        with open(path) as f:
            out += [(r["mesh"], r.get("expected", "PASS")) for r in json.load(f)["rows"]]
    return out


def ranks_of(mesh):
    n = 1
    for kv in mesh.split(","):
        n *= int(kv.split("=")[1])
    return n


def run(a, scenario, size, mesh, dtype, fault=None, flags=()):
    """One run's file, or None when it crashed or was refused (exit 2)."""
    out = os.path.join(a.work, f"{scenario}_{mesh.replace(',', '_').replace('=', '')}_{dtype}_{fault or 'clean'}.h5")
    if os.path.exists(out):
        return out
    cmd = ["mpirun", "-n", str(ranks_of(mesh)), a.exe, "--scenario", scenario, "--mesh", mesh, "--dtype", dtype,
           "--size", size, "--out", out, "--reference-cache", os.path.join(a.work, "cache")]
    if fault:
        cmd += ["--inject", fault]
    for f in flags:
        cmd += ["--flag", f]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    return out if p.returncode in (0, 1) and os.path.exists(out) else None


def compare(a, first, *others):
    path = os.path.join(a.work, "report.json")
    if os.path.exists(path):
        os.remove(path)
    cmd = [a.exe, "compare", first, "--json", path]
    for o in others:
        cmd += ["--against", o]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    report = None
    if os.path.exists(path):
        with open(path) as f:
            report = json.load(f)
    return p.returncode, report, p.stdout + p.stderr


def worst_ratio(report):
    out = 0.0
    for t in (report or {}).get("taps", []):
        r = t.get("reference", {}).get("worst_ratio")
        if r is not None:
            out = max(out, float(r))
    return out


def axis(mesh, name):
    return dict(kv.split("=") for kv in mesh.split(",")).get(name)


BATCH_AXES = ("dp", "cfg")  # the scenarios' batch: dp samples (and flux_pipeline's cfg branches)


def same_batch(mesh, other):
    return all(axis(mesh, x) == axis(other, x) for x in BATCH_AXES)


def same_batch_first(mesh, others):
    """`others`, those with `mesh`'s batch axes first: only meshes of one dp
    (and cfg) size compute one global tensor in the scenarios."""
    return sorted(others, key=lambda m: not same_batch(mesh, m))


def three_meshes(meshes, default):
    """The default mesh, another of its batch and one of another batch where there are."""
    names = [m for m, _ in meshes]
    first = default if default in names else names[0]
    alike = [m for m in names if m != first and same_batch(first, m)]
    other = [m for m in names if not same_batch(first, m)]
    picked = [first] + alike[:1] + other[:1]
    return picked + [m for m in names if m not in picked][:3 - len(picked)]


def false_positives(a, s, size, rows):
    default = s["default_mesh"].get(str(max(a.ranks)))
    meshes = three_meshes(planned_meshes(a, s["name"], size), default)
    for dtype in a.dtypes:
        files = {m: run(a, s["name"], size, m, dtype) for m in meshes}
        for m1, m2 in itertools.combinations(meshes, 2):
            if not files[m1] or not files[m2]:
                continue
            code, rep, _ = compare(a, files[m1], files[m2])
            rows.append({"scenario": s["name"], "dtype": dtype, "a": m1, "b": m2, "exit": code,
                         "worst_err_over_tol": worst_ratio(rep)})
            print(f"clean {s['name']} {dtype} {m1} vs {m2}: exit {code}, worst err/tol {worst_ratio(rep):.3g}",
                  flush=True)


def mesh_fault(a, s, size, f, rows):
    flags = list(f["needs_flags"])
    plan = planned_meshes(a, s["name"], size, f["name"], flags)
    shows = [m for m, e in plan if e.startswith("FAIL")]
    quiet = same_batch_first(shows[0], [m for m, e in plan if e == "PASS"]) if shows else []
    row = {"scenario": s["name"], "fault": f["name"], "first_tap": f["first_tap"], "shows_on": f["takes_effect_when"]}
    # A wrong mesh with two quiet meshes, of its batch first (runs of
    # another batch compare on the samples they share).
    if shows:
        quiet = same_batch_first(shows[0], quiet)[:2]
    if not shows or not quiet:
        row["result"] = f"not testable at {a.ranks} ranks ({len(shows)} meshes show it, {len(quiet)} do not)"
        rows.append(row)
        return
    bad = run(a, s["name"], size, shows[0], "float32", f["name"], flags)
    clean = [run(a, s["name"], size, m, "float32", None, flags) for m in quiet]
    if not bad or not all(clean):
        row["result"] = "a run crashed or was refused"
        rows.append(row)
        return
    code, rep, text = compare(a, bad, *clean)
    runs = (rep or {}).get("consensus", {}).get("runs", [])
    leaves = [r.get("leaves_at", {}).get("tap") for r in runs]
    named = bool(runs) and leaves[0] is not None and all(x is None for x in leaves[1:])
    first = ((rep or {}).get("first_divergence") or {}).get("tap")
    row.update(wrong_mesh=shows[0], clean_meshes=quiet, exit=code, leaves_at=leaves[0] if runs else first,
               named="yes" if named else "n/a (two runs)" if len(quiet) == 1 else "NO",
               found=code == 1 and (named or len(quiet) == 1))
    if code == 2:
        row["result"] = "refused: " + text.strip().splitlines()[-1][:160]
    rows.append(row)
    print(f"fault {s['name']} {f['name']} on {shows[0]} vs {quiet}: exit {code}, odd run leaves at "
          f"{row['leaves_at']!r} (documented {f['first_tap']!r}): {'FOUND' if row['found'] else 'MISSED'}"
          f"{'' if code != 2 else ' (' + row['result'] + ')'}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=shutil.which("diffcheck") or "build/diffcheck")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8], help="rank counts the meshes are drawn from")
    ap.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--no-false-positives", action="store_true")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--json", help="write every row here")
    a = ap.parse_args()
    a.exe = os.path.abspath(a.exe)
    t0 = time.monotonic()
    fp_rows, fault_rows = [], []
    with tempfile.TemporaryDirectory(prefix="diffcheck_against_") as work:
        a.work = work
        for s in run_json([a.exe, "list", "--json"]):
            if a.scenario and s["name"] not in a.scenario:
                continue
            size = "tiny" if "tiny" in s.get("sizes", []) else "default"
            if not a.no_false_positives:
                false_positives(a, s, size, fp_rows)
            if not a.no_faults:
                for f in s["faults"]:
                    if f["takes_effect_when"] != "always":
                        mesh_fault(a, s, size, f, fault_rows)
    print(f"\nmeshes of {a.ranks} ranks, {time.monotonic() - t0:.0f} s\n")
    if fp_rows:
        print("| scenario | dtype | pairs | judged wrong | worst err/tol of a clean pair |\n|---|---|---|---|---|")
        for (scen, dtype), group in itertools.groupby(fp_rows, key=lambda r: (r["scenario"], r["dtype"])):
            group = list(group)
            print(f"| {scen} | {dtype} | {len(group)} | {sum(r['exit'] != 0 for r in group)} | "
                  f"{max(r['worst_err_over_tol'] for r in group):.3g} |")
    if fault_rows:
        print("\n| scenario | fault | shows on | wrong mesh | clean meshes | first divergent tap (no reference) | "
              "documented | wrong run named |\n|---|---|---|---|---|---|---|---|")
        for r in fault_rows:
            if "result" in r:
                print(f"| {r['scenario']} | {r['fault']} | {r['shows_on']} | - | - | - | {r['first_tap']} | "
                      f"{r['result']} |")
                continue
            print(f"| {r['scenario']} | {r['fault']} | {r['shows_on']} | {r['wrong_mesh']} | "
                  f"{', '.join(r['clean_meshes'])} | {r['leaves_at']} | {r['first_tap']} | "
                  f"{r['named'] if r['found'] else 'NOT FOUND'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"false_positives": fp_rows, "mesh_faults": fault_rows}, f, indent=1)
    return 1 if any(r["exit"] != 0 for r in fp_rows) or any(r.get("found") is False for r in fault_rows) else 0


if __name__ == "__main__":
    sys.exit(main())
