#!/usr/bin/env python3
"""The piece check of diffcheck.jax's host sketch (kernels/sketch_cpu.c's
diffcheck_piece_check: a replicated piece's XXH3 hash and its exact NaN and
Inf counts in one read) against XXH3 alone on the same bytes, in cache
(4 MiB) and out of it (32 MiB); with --jax, each tap's host jobs (its pieces
sketched, then hashed and counted) of scripts/studies/jax_tap_outputs.py's
block at 1024 tokens on 8 CPU devices, one thread, per call.

Two kernel builds are compared by running this with DIFFCHECK_SKETCH_KERNEL=PATH,
one after the other (docs/jax.md quotes both):

    PYTHONPATH=python .venv/bin/python scripts/bench/bench_piece_check.py [--jax] [--repeats 30]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from diffcheck.jax import host_sketch  # noqa: E402
from diffcheck.kernels import library  # noqa: E402
from diffcheck.sketch import cpu_kernel  # noqa: E402


def median_seconds(work, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pieces(repeats):
    xxh3 = cpu_kernel.bytes_hash_function()
    if xxh3 is None:
        sys.exit("bench_piece_check: the kernel library is not loaded (build it: scripts/setup.sh --test-tools)")
    kind = library.KINDS["float32"]
    for mib in (4, 32):
        a = np.random.default_rng(0).standard_normal(mib << 18).astype(np.float32)
        alone = median_seconds(lambda: xxh3(a.ctypes.data, a.nbytes), repeats)
        both = median_seconds(lambda: host_sketch._check(a, kind, True), repeats)
        counts = median_seconds(lambda: host_sketch._check(a, kind, False), repeats)
        print(f"{mib} MiB float32: XXH3 alone {a.nbytes / alone / 1e9:.1f} GB/s, hash and counts "
              f"{a.nbytes / both / 1e9:.1f} GB/s, counts alone {a.nbytes / counts / 1e9:.1f} GB/s", flush=True)


def jax_jobs(repeats):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    sys.path.insert(0, os.path.join(HERE, "..", "studies"))
    import jax
    from diffcheck.jax import sketch as jax_sketch
    from jax_tap_outputs import block_inputs, with_tap_outputs
    mesh, inputs = block_inputs(1024, 1024)
    with jax.set_mesh(mesh):
        taps = jax.block_until_ready(jax.jit(with_tap_outputs)(*inputs)[1])
    sketched = checked = 0.0
    for key, v in sorted(taps.items()):
        dim = jax_sketch.sketch_dim(v.shape, v.dtype, 8)
        shards = [np.asarray(s.data) for s in v.addressable_shards]
        share = jax_sketch.token_share(shards[0].shape[dim], v.sharding.spec, mesh)[1]
        hashed = bool(jax_sketch.replica_axes(v.sharding.spec, mesh))
        kind = library.KINDS[str(v.dtype)]
        s = median_seconds(lambda: [host_sketch.sketch_piece(p, 0, 0, share, 8, 0, False, dim) for p in shards],
                           repeats)
        c = median_seconds(lambda: [host_sketch._check(jax_sketch.as_tokens_by_width(p, dim), kind, True)
                                    for p in shards], repeats) if hashed else 0.0
        sketched, checked = sketched + s, checked + c
        print(f"  {key.split(':', 1)[1]} {tuple(v.shape)}: sketches {s * 1e3:.2f} ms"
              + (f", hash and counts {c * 1e3:.2f} ms (replicated)" if hashed else ""), flush=True)
    print(f"a call's host jobs, one thread: sketches {sketched * 1e3:.1f} ms, hash and counts {checked * 1e3:.1f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--jax", action="store_true", help="also the study block's host jobs (needs jax)")
    args = ap.parse_args()
    pieces(args.repeats)
    if args.jax:
        jax_jobs(max(3, args.repeats // 6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
