#!/usr/bin/env python3
"""Is a fault of scale A larger than the difference between two correct runs?

Runs a scenario three times on the same seed and dtype: clean on mesh 1
(-n N1, its default mesh or --mesh1), clean on mesh 2 (-n N2 / --mesh2), and
with --inject FAULT --fault-scale A on mesh 1. Per tap (global tensors, read
from the run files with h5py) it prints

    err     ||clean1 - ref|| / ||ref||        the rounding error of a correct run
    fault   ||faulty1 - clean1|| / ||ref||    what the fault adds
    mesh    ||clean2 - clean1|| / ||ref||     how far two correct runs lie apart

A fault whose `fault` stays below `mesh` on every tap changes the output less
than a correct change of mesh does: no check that compares one run with a
yardstick computed in the same dtype in another order (a one-device run, the
float64 reference) can tell it from a correct run. docs/tolerances.md uses it
for flux_pipeline's text_kv_rotated in bfloat16.

    /usr/bin/python3 scripts/studies/fault_vs_mesh_noise.py --exe build/diffcheck --scenario flux_pipeline \\
        --fault text_kv_rotated --scale 0.0131 --dtype bfloat16 [--seed 1234] [-n1 16 -n2 8 --mesh2 M]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1", OPENBLAS_NUM_THREADS="1")


def mesh_axes(f):
    return [(n, int(s)) for n, s in (p.split("=") for p in f.attrs["mesh"].split(","))]


def global_tensor(f, name):
    """The global tensor of a tap (SCHEMA.md: pieces placed by spec, partial axes summed)."""
    d = f["taps/" + name]
    axes = mesh_axes(f)
    sizes = dict(axes)
    spec = d.attrs.get("spec", "")
    partial = d.attrs.get("partial", "")
    local = d.shape[1:]
    entries = (spec.split(",") if spec else []) + ["-"] * len(local)
    entries = entries[:len(local)]
    split = [[] if e == "-" else e.split("*") for e in entries]
    partial_axes = partial.split("*") if partial else []
    out = np.zeros([l * int(np.prod([sizes[a] for a in s])) for l, s in zip(local, split)])
    data = d[...].astype(np.float64)
    for r in range(d.shape[0]):
        coord, rest = {}, r
        for n, s in reversed(axes):
            coord[n], rest = rest % s, rest // s
        # One piece per block: the lowest rank of its replica group (replica axes at 0).
        used = {a for s in split for a in s} | set(partial_axes)
        if any(coord[n] != 0 for n, _ in axes if n not in used):
            continue
        index = []
        for l, s in zip(local, split):
            b = 0
            for a in s:
                b = b * sizes[a] + coord[a]
            index.append(slice(b * l, (b + 1) * l))
        out[tuple(index)] += data[r]
    return out


def run(a, work, name, n, mesh, extra):
    path = os.path.join(work, name + ".h5")
    args = ["mpirun", "-n", str(n), a.exe, "--scenario", a.scenario, "--dtype", a.dtype, "--seed", str(a.seed),
            "--out", path, *extra]
    if mesh:
        args += ["--mesh", mesh]
    p = subprocess.run(args, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if p.returncode not in (0, 1):
        sys.exit(f"{' '.join(args)} failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return h5py.File(path, "r")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default="diffcheck")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--fault", required=True)
    ap.add_argument("--scale", type=float, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("-n1", type=int, default=16)
    ap.add_argument("-n2", type=int, default=8)
    ap.add_argument("--mesh1")
    ap.add_argument("--mesh2")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        clean1 = run(a, work, "clean1", a.n1, a.mesh1, [])
        clean2 = run(a, work, "clean2", a.n2, a.mesh2, [])
        faulty = run(a, work, "faulty", a.n1, a.mesh1, ["--inject", a.fault, "--fault-scale", repr(a.scale)])
        names = []
        clean1["taps"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        names.sort(key=lambda n: clean1["taps/" + n].attrs.get("order", 0))
        print(f"{a.scenario} {a.dtype} seed {a.seed}: {a.fault} x {a.scale:g} on {clean1.attrs['mesh']}, "
              f"against a clean run on {clean2.attrs['mesh']}")
        print("| tap | err | fault | mesh | fault / mesh |\n|---|---|---|---|---|")
        worst = 0.0
        for n in names:
            if "reference/" + n not in clean1 or n not in clean2["taps"]:
                continue
            ref = clean1["reference/" + n][...]
            norm = np.linalg.norm(ref)
            x1 = global_tensor(clean1, n)
            x2 = global_tensor(clean2, n)
            if norm == 0 or x1.shape != x2.shape:
                continue
            err = np.linalg.norm(x1 - ref) / norm
            fault = np.linalg.norm(global_tensor(faulty, n) - x1) / norm
            mesh = np.linalg.norm(x2 - x1) / norm
            if fault == 0 and mesh == 0:
                continue
            r = fault / mesh if mesh > 0 else float("inf")
            worst = max(worst, r)
            print(f"| {n} | {err:.3g} | {fault:.3g} | {mesh:.3g} | {r:.2f} |")
        print(f"\nlargest fault / mesh over the taps: {worst:.2f}")


if __name__ == "__main__":
    main()
