"""The nightly's matrix: every scenario x mesh of N ranks (or its default
mesh, --quick) x dtype x flag combination, clean, then every fault armed
with the flags it needs. Used by scripts/nightly.py."""
import itertools
import json
import os
import shutil
import subprocess
import sys

DTYPES = ("float32", "bfloat16")


def run_json(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")
    return json.loads(res.stdout)


def slug(text):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text.replace("=", "")) or "defaults"


def flag_text(flags):
    return " ".join(flags) if flags else "defaults"


def variants(scenario, quick):
    """(kind, label, flags, fault) of one scenario: clean flag combinations, then faults."""
    specs = scenario["flags"]
    if quick:
        combos = [[], [f"{f['name']}={f['matrix_values'][-1]}" for f in specs
                       if f["matrix_values"][-1] != f["default"]]]
        combos = [c for i, c in enumerate(combos) if c not in combos[:i]]
    else:
        combos = []
        for values in itertools.product(*[f["matrix_values"] for f in specs]):
            combos.append([f"{f['name']}={v}" for f, v in zip(specs, values) if v != f["default"]])
    out = [("clean", flag_text(c), c, "") for c in combos]
    for f in scenario["faults"]:
        out.append(("fault", f"inject {f['name']}" + (f" + {' '.join(f['needs_flags'])}" if f["needs_flags"] else ""),
                    list(f["needs_flags"]), f["name"]))
    return out


def meshes(exe, scenario, n, quick, tmp):
    if quick:
        return [scenario["default_mesh"][str(n)]] if str(n) in scenario["default_mesh"] else []
    path = os.path.join(tmp, f"{scenario['name']}.plan.json")
    size = ["--size", matrix_size(scenario)] if matrix_size(scenario) else []
    res = subprocess.run([exe, "sweep-mesh", "--scenario", scenario["name"], "-n", str(n), "--dry-run",
                          "--json", path, *size], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"sweep-mesh --dry-run of {scenario['name']}: {res.stderr.strip()}")
    with open(path) as f:
        return [r["mesh"] for r in json.load(f)["rows"]]


def matrix_size(scenario):
    """The size preset the matrix runs: a pipeline's "tiny" (the matrix is about
    meshes, flags and faults; its own tests run the default size), else the default."""
    return "tiny" if "tiny" in scenario.get("sizes", []) else None


def plan(exe, scenarios, args, night):
    cells = []
    tmp = os.path.join(night, "plan")
    os.makedirs(tmp, exist_ok=True)
    for s in scenarios:
        ms = meshes(exe, s, args.n, args.quick, tmp)
        for dtype in (DTYPES[:1] if args.quick else DTYPES):
            for kind, label, flags, fault in variants(s, args.quick):
                vdir = os.path.join("cells", s["name"], dtype, slug(label))
                for m in ms:
                    cells.append({"scenario": s["name"], "dtype": dtype, "kind": kind, "variant": label,
                                  "flags": flags, "fault": fault, "mesh": m, "size": matrix_size(s),
                                  "dir": vdir, "stem": slug(m)})
    shutil.rmtree(tmp, ignore_errors=True)
    return cells


def injected_regressions():
    """DIFFCHECK_NIGHTLY_INJECT: scenario -> fault, for testing the nightly."""
    out = {}
    for item in os.environ.get("DIFFCHECK_NIGHTLY_INJECT", "").replace(" ", ",").split(","):
        if item:
            s, _, f = item.partition(":")
            if not f:
                sys.exit(f"nightly: DIFFCHECK_NIGHTLY_INJECT entries are scenario:fault, not '{item}'")
            out[s] = f
    return out
