#!/usr/bin/env python3
"""diffcheck.dump's dataset writes alone, as a sketch capture makes them:
--files rank files, each call one small dataset per tap and file (a sketch
[9, 128] float64 with a sketch tap's 10 attributes) under `step<N>/`.
Prints the time per dataset (median over the calls) of each way
diffcheck/dump/hdf5_writes.py has, in turn, in one process:

  one call    the dataset and its attributes in one C call (kernels/h5_dataset.c)
  per call    HDF5's C functions one at a time through ctypes (h5_direct.py)
  low level   h5py's low-level API

    PYTHONPATH=python .venv/bin/python scripts/bench/bench_h5_writes.py [--calls 40] [--rounds 3]
"""
import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from diffcheck.dump import h5_direct, hdf5_writes  # noqa: E402
from diffcheck.kernels import library  # noqa: E402

ATTRS = {"spec": "-,tp", "order": 3, "dtype": "float32", "reduction_depth": 1024, "sketch": "rademacher1",
         "sketch_seed": 0, "sketch_tokens": 1024, "nan_count": 0, "inf_count": 0, "bits_hash": "0123456789abcdef"}


@contextlib.contextmanager
def way(name):
    saved = dict(h5_direct._state)
    try:
        with (library.without() if name != "one call" else contextlib.nullcontext()):
            if name == "low level":
                h5_direct._state.update(lib=None, tried=True)
            yield
    finally:
        h5_direct._state.update(saved)


def per_dataset(calls, files, taps):
    """Microseconds per dataset, median over the calls."""
    sketch = np.random.default_rng(0).standard_normal((9, 128))
    with tempfile.TemporaryDirectory() as tmp:
        handles = [h5py.File(os.path.join(tmp, f"r{r}.h5"), "w", track_order=True) for r in range(files)]
        for f in handles:
            f.create_group("taps", track_order=True)
        times = []
        for call in range(calls):
            t0 = time.perf_counter()
            for f in handles:
                for tap in range(taps):
                    hdf5_writes.write_dataset(f, f"taps/step{call}/tap{tap}", sketch, ATTRS)
            times.append((time.perf_counter() - t0) / (files * taps) * 1e6)
        for f in handles:
            f.close()
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--taps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="the ways in turn, this many times")
    args = ap.parse_args()
    ways = ["one call", "per call", "low level"]
    if library.get("diffcheck_h5_write_dataset") is None:
        print(f"no kernel library with kernels/h5_dataset.c ({library.ENV}, or build it): the other two ways only")
        ways.remove("one call")
    results = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name in ways:
            with way(name):
                results[name].append(per_dataset(args.calls, args.files, args.taps))
    print(f"h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version}; {args.files} files x {args.taps} taps a call, "
          f"{args.calls} calls; a [9, 128] float64 dataset of {len(ATTRS)} attributes")
    for name, values in results.items():
        print(f"{name:10s} {' '.join(f'{v:6.1f}' for v in values)} us a dataset (rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
