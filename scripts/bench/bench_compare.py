#!/usr/bin/env python3
"""`diffcheck compare` against `h5diff -d` on the same pair of float32 tensors.

Builds (with h5py) a reference of N standard-normal float32 values and a rank
file whose tap equals it except `--off` elements + 1.0 (per-tap atol 1e-5,
rtol 0), then times, alternating and paired, `h5diff -d 1e-5` of the two
datasets and `diffcheck compare` of the rank file with the reference: wall
time (median of K) and peak RSS (from wait4), with `cat` of both files (the
page-cache read floor) in the same alternation. Also the same on an identical
pair, and, with --sizes, diffcheck's peak RSS across tensor sizes.

    /usr/bin/python3 scripts/bench/bench_compare.py                 # 64 Mi elements, K = 5
    /usr/bin/python3 scripts/bench/bench_compare.py --every-element # also every element close, every element wrong
    /usr/bin/python3 scripts/bench/bench_compare.py --sizes 16,256  # memory flat in size (Mi elements)
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("-k", type=int, default=5, help="paired runs (median)")
ap.add_argument("--mi", type=int, default=64, help="elements, in Mi (2^20)")
ap.add_argument("--off", type=int, default=16777, help="elements off by 1.0")
ap.add_argument("--every-element", action="store_true",
                help="also pairs where every element differs: within atol (+1e-6 noise), and wrong (+1.0)")
ap.add_argument("--sizes", default="", help="comma-separated sizes in Mi elements: RSS sweep only")
ap.add_argument("--diffcheck", default=shutil.which("diffcheck") or "build/diffcheck")
ap.add_argument("--before", default=None, metavar="EXE",
                help="another diffcheck (an older build) timed in the same alternation, for before/after")
ap.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
ap.add_argument("--make", nargs=4, metavar=("DIR", "MI", "OFF", "TAG"), help=argparse.SUPPRESS)
a = ap.parse_args()


EVERY_ELEMENT_CLOSE, EVERY_ELEMENT_WRONG = -1, -2  # --off codes of the --every-element pairs


def make_pair(d, mi, off, tag):
    """Writes the pair in a child process: a parent grown by numpy would pass its
    peak RSS on to every command it starts (Linux counts the forked image)."""
    subprocess.run([sys.executable, __file__, "--make", d, str(mi), str(off), tag], check=True)
    return os.path.join(d, f"ref{tag}.h5"), os.path.join(d, f"p{tag}.rank0.h5")


def write_pair(d, mi, off, tag):
    import h5py
    import numpy as np
    n = mi << 20
    rows = 8192 if n % 8192 == 0 else 1
    shape = (rows, n // rows)
    rng = np.random.default_rng(7)
    ref_path, tap_prefix = os.path.join(d, f"ref{tag}.h5"), os.path.join(d, f"p{tag}")
    with h5py.File(ref_path, "w") as f, h5py.File(tap_prefix + ".rank0.h5", "w") as g:
        f.attrs["diffcheck_schema"] = 1
        for k, v in {"diffcheck_schema": 1, "mesh": "dp=1", "world_size": 1, "rank": 0}.items():
            g.attrs[k] = v
        ref = f.create_dataset("reference/x", shape, dtype="f4")
        tap = g.create_dataset("taps/x", shape, dtype="f4")
        tap.attrs["spec"], tap.attrs["atol"], tap.attrs["rtol"] = "", 1e-5, 0.0
        bad = set(rng.choice(n, size=off, replace=False).tolist()) if off > 0 else set()
        step = max(1, (16 << 20) // shape[1])  # write 16 Mi elements at a time
        for r0 in range(0, rows, step):
            blk = rng.standard_normal((min(step, rows - r0), shape[1]), dtype=np.float32)
            ref[r0:r0 + blk.shape[0]] = blk
            flat0 = r0 * shape[1]
            idx = [i - flat0 for i in bad if flat0 <= i < flat0 + blk.size]
            if idx:
                blk.reshape(-1)[idx] += 1.0
            if off == EVERY_ELEMENT_CLOSE:  # a few float32 roundings apart: within atol
                blk = blk + rng.standard_normal(blk.shape, dtype=np.float32) * np.float32(1e-6)
            elif off == EVERY_ELEMENT_WRONG:
                blk = blk + np.float32(1.0)
            tap[r0:r0 + blk.shape[0]] = blk


def run(cmd):
    """Wall seconds, peak RSS MiB and exit status of one run."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode()
    return wall, usage.ru_maxrss / 1024, p.returncode, err


def paired(ref, tap, expect):
    # h5diff's status also reflects the attributes the two datasets differ in,
    # so only diffcheck's verdict is checked.
    # cat of both files into /dev/null: reading them from the page cache, the
    # floor any comparator of these files has (issue 24's yardstick).
    h5 = ["h5diff", "-d", "1e-5", tap, ref, "/taps/x", "/reference/x"]
    dc = [a.diffcheck, "compare", tap, "--reference", ref]
    cat = ["cat", tap, ref]
    cmds = (("cat", cat), ("h5diff", h5), ("diffcheck", dc))
    if a.before:
        cmds += (("before", [a.before, "compare", tap, "--reference", ref]),)
    rows = {name: [] for name, _ in cmds}
    for name, cmd in cmds:  # warm the page cache
        run(cmd)
    for _ in range(a.k):
        for name, cmd in cmds:
            wall, rss, rc, err = run(cmd)
            if name in ("diffcheck", "before") and rc != expect:
                sys.exit(f"{name}: exit {rc}, expected {expect}\n{err}")
            rows[name].append((wall, rss))
    for name, r in rows.items():
        print(f"  {name:9}  wall median {statistics.median(w for w, _ in r):6.3f} s   "
              f"peak RSS {max(m for _, m in r):7.1f} MiB")
    for name, yardstick in [("diffcheck", "h5diff"), ("diffcheck", "cat")] + ([("before", "cat")] if a.before else []):
        ratios = [d[0] / y[0] for d, y in zip(rows[name], rows[yardstick])]
        print(f"  {name} / {yardstick} wall: median of paired ratios {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if a.make:
    write_pair(a.make[0], int(a.make[1]), int(a.make[2]), a.make[3])
    sys.exit(0)

d = a.dir or tempfile.mkdtemp(prefix="bench_compare_")
if a.dir:
    os.makedirs(a.dir, exist_ok=True)  # a directory named but not yet made
try:
    if a.sizes:
        for mi in (int(s) for s in a.sizes.split(",")):
            ref, tap = make_pair(d, mi, min(a.off, mi << 10), f"_{mi}")
            _, rss, rc, err = run([a.diffcheck, "compare", tap, "--reference", ref])
            if rc != 1:
                sys.exit(f"diffcheck: exit {rc}, expected 1\n{err}")
            print(f"  {mi:5} Mi elements ({mi * 4} MiB float32): diffcheck peak RSS {rss:7.1f} MiB")
            os.remove(ref), os.remove(tap)
    else:
        print(f"{a.mi} Mi float32 elements, {a.off} off by 1.0, atol 1e-5; {a.k} paired runs")
        ref, tap = make_pair(d, a.mi, a.off, "")
        paired(ref, tap, expect=1)
        print("identical pair")
        ref, tap = make_pair(d, a.mi, 0, "_same")
        paired(ref, tap, expect=0)
        if a.every_element:
            print("every element differs, within atol")
            ref, tap = make_pair(d, a.mi, EVERY_ELEMENT_CLOSE, "_close")
            paired(ref, tap, expect=0)
            print("every element differs, by 1.0 (fails)")
            ref, tap = make_pair(d, a.mi, EVERY_ELEMENT_WRONG, "_wrong")
            paired(ref, tap, expect=1)
finally:
    if not a.dir:
        shutil.rmtree(d)
