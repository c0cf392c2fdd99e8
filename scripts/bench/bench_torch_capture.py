#!/usr/bin/env python3
"""Overhead of `diffcheck.torch.capture` on the forward of the tensor-parallel
example (examples/tp_block.py): per round, one uninstrumented forward and one
captured forward (hooks, every module's output written, the rank file created,
closed and renamed), alternated so both see the same machine; the figure is
the median over rounds of the captured/uninstrumented ratio of the slowest
rank's time. Before each timed forward the page cache is synced to disk, so
that a capture's writeback does not slow the next forward; the time of that
sync after a capture is reported too (what making the taps durable adds).

    .venv/bin/python scripts/bench/bench_torch_capture.py [--size example|medium|large] [-n 2] [--rounds 9] [--backward]
                                                    [--sketch [K]] [--steps N] [--profile FILE]
                                                    [--without sketch writes] [--compile]

--sketch: the capture in sketch mode (every tap a sketch of K = 8 rows,
diffcheck/sketch/__init__.py), against the same uninstrumented forward. The summary
line says whether the fused CPU kernel (diffcheck/sketch/cpu_kernel.py) or torch
ops sketched the taps.

--steps N: a round is N forwards in one capture, each under dct.step(t) (every
tap of every step of a denoising loop, one file), against N uninstrumented
forwards: the file's creation and closing are then shared by N steps.

--compile: the block torch.compile'd (inductor) on both sides: the
compiled forward against the compiled forward captured (diffcheck/torch/compiled.py).

--backward: a training step's worth instead, forward and backward of the sum
of the output, uninstrumented against captured with backward=True (every
module output, its gradient and every parameter's gradient written).

Sizes (tokens = B x S, hidden D, heads, FFN): example 2x16, 64, 8, 256 (the
example as it ships: a forward of a millisecond, so fixed costs dominate);
medium 2x512, 1024, 16, 4096; large 4x1024, 2048, 16, 8192. Runs in the torch
environment (.venv/bin/python, scripts/torch_env.sh).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

# One BLAS thread per rank, as under scripts/mpi_env.sh: torch.set_num_threads
# alone leaves OpenBLAS's own threads, and ranks x threads over the cores
# make every figure noise. Set before torch loads OpenBLAS.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

SIZES = {"example": (2, 16, 64, 8, 256), "medium": (2, 512, 1024, 16, 4096), "large": (4, 1024, 2048, 16, 8192)}


def leave_out(parts):
    """--without: the capture with a part of sketch mode's work replaced by
    nothing (a profile's question: what is left without it), its files then
    hold zeros or lack the sketch taps."""
    from diffcheck import dump, sketch
    if "sketch" in parts:
        def summarize(self, tensor, first_token=0, share=None, hashed=True):
            zero = torch.zeros((), dtype=torch.int64)
            rows = torch.zeros(*tensor.shape[:-2], self.k + 1, tensor.shape[-1], dtype=torch.float64)
            return rows, zero, zero, zero if hashed else None
        sketch.Sketcher.summarize = summarize
    if "writes" in parts:
        dump.RankDump.sketch = lambda self, *args, **kwargs: None


def timed(fn):
    """fn's wall time on the slowest rank (the job waits for it)."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return dt.item()


def settled(fn):
    """fn's time, after the page cache has gone to disk: a captured
    forward's writeback must not land in the next forward's time."""
    os.sync()
    return timed(fn)


class Forwards:
    """The block's forward (or training step) plain and captured, as the
    benchmark's options ask. With --compile: two compiled copies, the captured
    one keeps its (inert) hooks between captures, the plain one never had any
    (the pure compiled forward)."""

    def __init__(self, a, n, rank, out_dir):
        import tp_block
        import diffcheck.torch as dct
        self.a, self.n, self.out_dir, self.tp_block, self.dct = a, n, out_dir, tp_block, dct
        tp_block.B, tp_block.S, tp_block.D, tp_block.HEADS, tp_block.FFN = SIZES[a.size]
        w, x = tp_block.full_weights()
        self.block = tp_block.Block(w, n, rank).float()
        self.x = x.float()
        self.plain_block = self.block
        if a.compile:
            import copy
            self.plain_block = torch.compile(copy.deepcopy(self.block), backend="inductor")
            self.block = torch.compile(self.block, backend="inductor")

    def plain(self):
        a, block = self.a, self.block
        if a.backward:
            block.zero_grad(set_to_none=True)
            block(self.x).sum().backward()
            return
        with torch.no_grad():
            for _ in range(a.steps):
                self.plain_block(self.x)

    def captured(self):
        a, block, dct = self.a, self.block, self.dct
        kw = dict(out=f"{self.out_dir}/tp", mesh=f"tp={self.n}", layouts=self.tp_block.LAYOUTS,
                  derive_depths=not a.no_depths, sketch=a.sketch)
        if a.backward:
            block.zero_grad(set_to_none=True)
            with dct.capture(block, backward=True, **kw):
                block(self.x).sum().backward()
                dct.grads()
            return
        with torch.no_grad(), dct.capture(block, **kw):
            for t in range(a.steps):
                if a.steps > 1:  # one file, every step's taps (a denoising loop's use)
                    dct.step(t)
                block(self.x)


def profiled(fn, profiler):
    """fn, with cProfile on while it runs."""
    def run():
        profiler.enable()
        try:
            fn()
        finally:
            profiler.disable()
    return run


def rank_main(rank, n, a, init, out_dir, results):
    torch.set_num_threads(1)
    leave_out(a.without)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    forwards = Forwards(a, n, rank, out_dir)
    plain, captured = forwards.plain, forwards.captured
    for _ in range(2):  # warm-up: allocator, BLAS, the file system
        settled(plain)
        settled(captured)
    if a.profile and rank == 0:  # where rank 0's captured time goes, over the timed rounds
        import cProfile
        profiler = cProfile.Profile()
        captured = profiled(captured, profiler)
    rows = []
    for r in range(a.rounds):  # pairs, in alternating order
        if r % 2 == 0:
            p, c = settled(plain), settled(captured)
        else:
            c = settled(captured)
            p = settled(plain)
        rows.append((p, c, timed(os.sync)))  # what making this forward's taps durable costs on top
    if a.profile and rank == 0:
        profiler.dump_stats(a.profile)
    if rank == 0:
        size = os.path.getsize(f"{out_dir}/tp.rank0.h5")
        results.put((rows, size))
    dist.destroy_process_group()


def kernel_in_use():
    """Which path sketches the taps: the fused CPU kernel or torch ops (diffcheck/sketch/cpu_kernel.py)."""
    from diffcheck.sketch import cpu_kernel as sketch_cpu
    path = sketch_cpu.loaded_from()
    return f"the fused CPU kernel {path}" if path else "torch ops: no CPU kernel built"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="medium")
    ap.add_argument("-n", type=int, default=2, help="tp ranks (processes over gloo; default 2)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--no-depths", action="store_true", help="derive_depths=False: no rounding counts (their cost)")
    ap.add_argument("--steps", type=int, default=1, metavar="N",
                    help="N forwards in one capture, each a dct.step (a denoising loop), against N uninstrumented "
                         "ones: the capture's own opening and closing shared by N steps (default 1)")
    ap.add_argument("--backward", action="store_true", help="forward and backward, captured with backward=True")
    ap.add_argument("--sketch", type=int, nargs="?", const=8, default=0, metavar="K",
                    help="sketch mode (K rows, default 8) instead of whole tensors")
    ap.add_argument("--profile", metavar="FILE", help="cProfile rank 0's captured forwards into FILE (pstats); "
                    "the profiler's own cost inflates the ratio, so read it for the shares, not the figure")
    ap.add_argument("--without", nargs="+", default=[], choices=["sketch", "writes"],
                    help="with --sketch: leave out the sketches' arithmetic (zeros instead) and/or the sketch taps' "
                         "writes, to see what the rest of the capture costs (a diagnostic, not a capture)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile(backend='inductor') the block: compiled forward against compiled capture")
    ap.add_argument("--dir", default=None, help="where the rank files go (default: a temporary directory)")
    a = ap.parse_args()
    if a.compile and a.backward:
        ap.error("--compile takes no --backward: a compiled model is captured forward only (docs/torch.md)")
    if a.steps < 1 or (a.backward and a.steps != 1):
        ap.error("--steps takes N >= 1, and only without --backward")
    if a.without and not a.sketch:
        ap.error("--without is for sketch mode: give --sketch too")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = a.dir or tmp
        mp.spawn(rank_main, args=(a.n, a, "file://" + os.path.join(tmp, "rendezvous"), out_dir, results),
                 nprocs=a.n)
        rows, size = results.get()
    if os.environ.get("BENCH_ROWS"):
        print("\n".join(f"{p * 1e3:8.1f} {c * 1e3:8.1f} {s * 1e3:7.1f}" for p, c, s in rows))
    ratios = [c / p for p, c, _ in rows]
    durable = [(c + s) / p for p, c, s in rows]
    print(f"size {a.size} {SIZES[a.size]}, tp={a.n}, {a.rounds} rounds{', forward and backward' if a.backward else ''}"
          f"{f', {a.steps} forwards per capture' if a.steps > 1 else ''}"
          f"{f', WITHOUT the sketch mode parts {a.without}' if a.without else ''}"
          f"{f', sketch mode k={a.sketch} ({kernel_in_use()})' if a.sketch else ''}"
          f"{', torch.compile inductor' if a.compile else ''}, torch {torch.__version__}; "
          f"rank 0 writes {size / 2 ** 20 / a.steps:.1f} MiB per {'step' if a.backward else 'forward'}")
    per = f" ({a.steps} forwards)" if a.steps > 1 else ""
    print(f"uninstrumented forward{per}: median {statistics.median(r[0] for r in rows) * 1e3:.1f} ms")
    print(f"captured forward{per}:       median {statistics.median(r[1] for r in rows) * 1e3:.1f} ms "
          f"(+ {statistics.median(r[2] for r in rows) * 1e3:.1f} ms to sync its taps to disk)")
    print(f"ratio captured/uninstrumented: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(f"ratio with the taps synced to disk: median {statistics.median(durable):.3f} "
          f"(min {min(durable):.3f}, max {max(durable):.3f})")


if __name__ == "__main__":
    main()
