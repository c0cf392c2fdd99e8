#!/usr/bin/env python3
"""What dct.watch costs a data-parallel training step (issue 63's target: at
most 1% at every=1), on 2 gloo ranks: an MLP of width --width (fc1 4x wider),
--rows rows per rank, SGD after an all-reduce of the gradients.

Paired: each round times --steps steps without a watch and --steps steps
under dct.watch(every=E) for each E of --every, in an order that rotates; the
median of --rounds ratios per E is printed (rank 0). These machines are
noisy beyond 1%, so the check is also timed where it runs, against the
step's own time: its share at every=E is its time / (E x a step's), and the
hashes alone are timed too (the check's exchange is the rest).

    PYTHONPATH=python .venv/bin/python scripts/studies/watch_overhead.py [--every 1,10,100]
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import diffcheck.torch as dct
from diffcheck.watch import bits_hash


def rank_main(rank, world, init, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    d = args.width
    model = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.rows, d)

    def steps(n):
        for _ in range(n):
            ((model(x) - x) ** 2).mean().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            opt.zero_grad()

    def timed(every):
        dist.barrier()
        t0 = time.perf_counter()
        if every == 0:
            steps(args.steps)
        else:
            with dct.watch(model, opt, mesh=f"dp={world}", every=every, out=os.path.join(out, "w")):
                steps(args.steps)
        dist.barrier()
        return time.perf_counter() - t0

    everies = [0] + [int(e) for e in args.every.split(",")]
    for e in everies:
        timed(e)  # warm-up
    ratios = {e: [] for e in everies[1:]}
    for i in range(args.rounds):
        order = everies[i % len(everies):] + everies[:i % len(everies)]
        t = {e: timed(e) for e in order}
        for e in ratios:
            ratios[e].append(t[e] / t[0])
        if rank == 0:
            print(f"round {i}: {args.steps} steps {t[0]:.2f} s; " +
                  ", ".join(f"every={e}: {t[e] / t[0]:.4f}x" for e in ratios), flush=True)
    # The check itself, timed where it runs: its share of a step at every=E is its time / (E x a step's).
    w = dct.watch(model, opt, mesh=f"dp={world}", every=1, out=os.path.join(out, "w"))
    check_times = []
    inner = w.check

    def timed_check(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            check_times.append(time.perf_counter() - t0)
    w.check = timed_check
    t0 = time.perf_counter()
    steps(args.steps)
    watched = time.perf_counter() - t0
    w.close(check=False)
    step_s = (watched - sum(check_times)) / args.steps
    params = [p for p in model.parameters()]
    t0 = time.perf_counter()
    for _ in range(10):
        for p in params:
            bits_hash(p), bits_hash(p.grad if p.grad is not None else p)
    hash_s = (time.perf_counter() - t0) / 10
    if rank == 0:
        for e, r in ratios.items():
            print(f"every={e}: median {statistics.median(r):.4f}x of the steps without a watch ({args.rounds} rounds)")
        check_s = statistics.median(check_times)
        print(f"one check (hashes, barrier, all-gather, compare): median {check_s * 1e3:.1f} ms; a step without it "
              f"{step_s * 1e3:.0f} ms: " + ", ".join(f"every={e}: +{100 * check_s / (e * step_s):.2f}%"
                                                     for e in (1, 2, 5, 10, 20, 50, 100)))
        print(f"hashing every parameter and gradient once: {hash_s * 1e3:.1f} ms "
              f"({sum(p.numel() for p in params) / 1e6:.1f} M parameters)")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--every", default="1,10,100")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(2, "file://" + os.path.join(tmp, "rdv"), a, tmp), nprocs=2)
