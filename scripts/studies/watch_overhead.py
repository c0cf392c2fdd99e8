#!/usr/bin/env python3
"""What dct.watch costs a training step (issue 63's target: at most 1% at
every=1), on 2 gloo ranks (--ranks).

--parallel dp (default): an MLP of width --width (fc1 4x wider), --rows rows
per rank, SGD after an all-reduce of the gradients.
--parallel tp, fsdp_tp, hsdp: examples/watch_train.py's transformer block
(examples/dtensor_block.py, at its size) under torch's tensor-parallel plan,
FSDP2 x tensor parallelism, or FSDP2's hybrid sharding, as that example
trains it (--width and --rows do not apply).

Paired: each round times --steps steps without a watch and --steps steps
under dct.watch(every=E) for each E of --every, in an order that rotates; the
median of --rounds ratios per E is printed (rank 0). These machines are
noisy beyond 1%, so the check is also timed where it runs, against the
step's own time: its share at every=E is its time / (E x a step's), and the
hashes alone are timed too (the check's exchange is the rest).

    PYTHONPATH=python .venv/bin/python scripts/studies/watch_overhead.py [--parallel fsdp_tp] [--every 1,10,100]
        [--exchange-every auto]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import diffcheck.torch as dct
from diffcheck.watch.hashing import bits_hash

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def model_and_input(args, world):
    """(model, this rank's input, the watch's mesh) of --parallel."""
    torch.manual_seed(0)
    if args.parallel == "dp":
        d = args.width
        model = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        return model, torch.randn(args.rows, d), f"dp={world}"
    sys.path.insert(0, EXAMPLES)
    from watch_train import sharded_block
    model, mesh, share = sharded_block(args.parallel, world, torch.float32)
    return model, torch.randn(world, 2, 16, model.ln1.normalized_shape[0])[share], mesh


def rank_main(rank, world, init, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model, x, mesh = model_and_input(args, world)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def steps(n):
        for _ in range(n):
            ((model(x) - x) ** 2).mean().backward()
            for p in model.parameters() if args.parallel == "dp" else ():  # the others reduce their own
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            opt.zero_grad()

    def timed(every):
        """The steps alone: the watch's making (a group, the hosts) and its last check at close() are once a job."""
        w = dct.watch(model, opt, mesh=mesh, every=every, out=os.path.join(out, "w"),
                      exchange_every=args.exchange_every) if every else None
        dist.barrier()
        t0 = time.perf_counter()
        steps(args.steps)
        if w is not None and args.exchange_every != 1:
            w.close()  # the checks still kept are exchanged (and the check after the last step, timed too)
        dist.barrier()
        seconds = time.perf_counter() - t0
        if w is not None:
            w.close(check=False)
        return seconds

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
    check_costs(rank, model, opt, mesh, out, args, steps, ratios)
    dist.destroy_process_group()


def check_costs(rank, model, opt, mesh, out, args, steps, ratios):
    """The check itself, timed where it runs (its share of a step at every=E is its time / (E x a step's)),
    and the hashes alone; rank 0 prints them with the paired ratios."""
    w = dct.watch(model, opt, mesh=mesh, every=1, out=os.path.join(out, "w"), exchange_every=args.exchange_every)
    check_times, parts = [], {"rows": [], "exchange": []}

    def timed(work, into):
        def timed_work(*a, **k):
            t0 = time.perf_counter()
            try:
                return work(*a, **k)
            finally:
                into.append(time.perf_counter() - t0)
        return timed_work
    w.check = timed(w.check, check_times)
    # its parts: the rows (every tensor's piece and hash: CheckRows.fill) and the exchanges (with any report)
    for rows in w._rows.values():
        rows.fill = timed(rows.fill, parts["rows"])
    w._exchange_kept = timed(w._exchange_kept, parts["exchange"])
    t0 = time.perf_counter()
    steps(args.steps)
    watched = time.perf_counter() - t0
    w.close(check=False)
    batch = w._batches.size
    step_s = (watched - sum(check_times)) / args.steps
    local = [getattr(p, "_local_tensor", p) for p in model.parameters()]  # a DTensor's piece on this rank
    grads = [getattr(p.grad, "_local_tensor", p.grad) if p.grad is not None else q
             for p, q in zip(model.parameters(), local)]
    t0 = time.perf_counter()
    for _ in range(10):
        for p, g in zip(local, grads):
            bits_hash(p), bits_hash(g)
    hash_s = (time.perf_counter() - t0) / 10
    if rank == 0:
        for e, r in ratios.items():
            print(f"every={e}: median {statistics.median(r):.4f}x of the steps without a watch ({args.rounds} rounds)")
        # the mean: with exchange_every above 1 most checks only hash, every N-th also exchanges
        check_s = statistics.mean(check_times)
        print(f"one check (hashes, exchange, compare): mean {check_s * 1e3:.2f} ms (median "
              f"{statistics.median(check_times) * 1e3:.2f} ms; exchange_every={args.exchange_every}, "
              f"{batch} checks an exchange at the end); a step without it "
              f"{step_s * 1e3:.0f} ms: " + ", ".join(f"every={e}: +{100 * check_s / (e * step_s):.2f}%"
                                                     for e in (1, 2, 5, 10, 20, 50, 100)))
        n = len(check_times)
        print(f"of a check, mean: its rows (pieces and hashes) {sum(parts['rows']) / n * 1e3:.3f} ms, the exchanges "
              f"{sum(parts['exchange']) / n * 1e3:.3f} ms ({len(parts['exchange'])} in {n} checks, each "
              f"{statistics.median(parts['exchange'] or [0]) * 1e3:.2f} ms median, the job's first "
              f"{(parts['exchange'] or [0])[0] * 1e3:.2f} ms), the rest "
              f"{(sum(check_times) - sum(parts['rows']) - sum(parts['exchange'])) / n * 1e3:.3f} ms")
        print(f"hashing every parameter and gradient once: {hash_s * 1e3:.1f} ms "
              f"({sum(p.numel() for p in local) / 1e6:.2f} M parameters on a rank)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--every", default="1,10,100")
    ap.add_argument("--parallel", choices=("dp", "tp", "fsdp_tp", "hsdp"), default="dp")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--exchange-every", type=lambda v: v if v == "auto" else int(v), default=1,
                    help="dct.watch's exchange_every: N checks' hashes sent together, or auto (default 1)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(a.ranks, "file://" + os.path.join(tmp, "rdv"), a, tmp), nprocs=a.ranks)
