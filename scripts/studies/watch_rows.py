#!/usr/bin/env python3
"""One dct.watch check's rows (a hash per parameter and gradient) made one
tensor at a time (hashing.hash_row, as before issue 73) against one call to
the kernel library for all (hashing.CheckRows), in one process: the median
of 20 of each, paired, for N small tensors (the per-tensor cost) and for a
DP MLP's 12 large ones (memory bound: the same either way).

    PYTHONPATH=python .venv/bin/python scripts/studies/watch_rows.py [--small 300]"""
import argparse
import statistics
import time

import torch

from diffcheck.watch import hashing


def median_ms(f, repeats=20):
    f()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=300, help="tensors of 256 floats in the first set")
    args = ap.parse_args()
    torch.manual_seed(0)
    sets = {f"{args.small} tensors of 256 floats": [torch.randn(256) for _ in range(args.small)],
            "12 tensors of a width-1024 MLP (16.8 M floats)":
                [torch.randn(4096, 1024), torch.randn(4096), torch.randn(1024, 4096)] + [torch.randn(1024)] * 3}
    sets["12 tensors of a width-1024 MLP (16.8 M floats)"] *= 2
    for name, tensors in sets.items():
        plan = hashing.CheckRows(len(tensors), sums=False)
        one_by_one, fused = [], []
        for _ in range(3):  # paired rounds
            one_by_one.append(median_ms(lambda: [hashing.hash_row(t, False) for t in tensors]))
            fused.append(median_ms(lambda: plan.fill(tensors)))
        a, b = statistics.median(one_by_one), statistics.median(fused)
        print(f"{name}: one by one {a:.3f} ms, one call {b:.3f} ms ({a / b:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
