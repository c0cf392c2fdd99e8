#!/usr/bin/env python3
"""`diffcheck compare` of a run file with many ranks and small taps: the cost
that grows with the rank count (layouts, replica groups, block owners).

Writes (with h5py) a run file of 10 taps of 4x4 float32 per rank on mesh
dp=P (a replicated tap, a dp-sharded tap with a reference, ...) and times
`diffcheck compare` on it, median of K, for each rank count.

    /usr/bin/python3 scripts/bench/bench_compare_ranks.py --ranks 1024,8192,65536
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
ap.add_argument("--ranks", default="1024,4096,8192")
ap.add_argument("-k", type=int, default=3)
ap.add_argument("--diffcheck", default=shutil.which("diffcheck") or "build/diffcheck")
a = ap.parse_args()


def write(path, p):
    import h5py
    import numpy as np
    with h5py.File(path, "w") as f:
        for k, v in {"diffcheck_schema": 1, "mesh": f"dp={p}", "world_size": p}.items():
            f.attrs[k] = v
        base = np.arange(16, dtype=np.float32).reshape(4, 4)
        for t in range(10):
            sharded = t % 2 == 1
            data = np.broadcast_to(base, (p, 4, 4)).copy()
            if sharded:
                data += np.arange(p, dtype=np.float32)[:, None, None]
            ds = f.create_dataset(f"taps/t{t}", data=data)
            ds.attrs["spec"] = "dp" if sharded else ""
            ds.attrs["order"] = t
            if sharded:
                f.create_dataset(f"reference/t{t}", data=data.reshape(p * 4, 4).astype(np.float64))


d = tempfile.mkdtemp(prefix="bench_ranks_")
try:
    for p in (int(x) for x in a.ranks.split(",")):
        path = os.path.join(d, f"run{p}.h5")
        subprocess.run([sys.executable, "-c", f"import runpy,sys; sys.argv=['x']; "
                        f"exec(open({__file__!r}).read().split('d = tempfile')[0]); write({path!r}, {p})"],
                       check=True)
        times = []
        for _ in range(a.k):
            t0 = time.monotonic()
            r = subprocess.run([a.diffcheck, "compare", path], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
            times.append(time.monotonic() - t0)
            if r.returncode != 0:
                sys.exit(f"{p} ranks: exit {r.returncode}\n{r.stderr.decode()}")
        print(f"  {p:6} ranks x 10 taps of 4x4: median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f})")
        os.remove(path)
finally:
    shutil.rmtree(d)
