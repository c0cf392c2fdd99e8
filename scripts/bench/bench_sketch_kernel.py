#!/usr/bin/env python3
"""The CPU sketch kernel (python/kernels/sketch_cpu.c) alone, one thread:
the time to sketch one float32 piece [tokens, width] with k rows, in cache
(the same piece again and again) and out of cache (a new piece each time,
--pieces of them, together beyond the third-level cache). Best of --repeats
passes; GB/s of the piece read.

    PYTHONPATH=python .venv/bin/python scripts/bench/bench_sketch_kernel.py [--widths 512,4096] [--tokens 1024]

To compare two builds, run it twice with DIFFCHECK_SKETCH_KERNEL=PATH (the
library to load) in one session, one after the other."""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from diffcheck.kernels import library  # noqa: E402


def best_per_piece(sketch, pieces, patterns, k, out, repeats):
    """Seconds per piece, the best pass over `pieces` of `repeats`."""
    tokens, width = pieces[0].shape
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in pieces:
            sketch(p.ctypes.data, library.KINDS["float32"], 1, 0, tokens, width, width, patterns.ctypes.data, k,
                   out.ctypes.data)
        best = min(best, (time.perf_counter() - t0) / len(pieces))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="512,4096")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--bytes", type=int, default=256 << 20, help="all the out-of-cache pieces together")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    sketch = library.get("diffcheck_sketch_cpu")
    if sketch is None:
        sys.exit("no sketch kernel found (build it, or give DIFFCHECK_SKETCH_KERNEL=PATH)")
    print(f"kernel {library.loaded_from()}; k = {a.k}, float32, one thread")
    rng = np.random.default_rng(0)
    groups = (a.k + 3) // 4
    patterns = rng.integers(0, 16, (groups, a.tokens), dtype=np.uint8)
    for width in (int(w) for w in a.widths.split(",")):
        size = a.tokens * width * 4
        count = max(2, a.bytes // size)
        pieces = [rng.standard_normal((a.tokens, width), dtype=np.float32) for _ in range(count)]
        out = np.empty((a.k + 1, width))
        hot = best_per_piece(sketch, pieces[:1] * 16, patterns, a.k, out, a.repeats)
        cold = best_per_piece(sketch, pieces, patterns, a.k, out, a.repeats)
        print(f"[{a.tokens}, {width}] ({size >> 20} MiB): in cache {hot * 1e6:.0f} us ({size / hot / 1e9:.1f} GB/s), "
              f"out of cache {cold * 1e6:.0f} us ({size / cold / 1e9:.1f} GB/s; {count} pieces)")


if __name__ == "__main__":
    main()
