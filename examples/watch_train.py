#!/usr/bin/env python3
"""A data-parallel training loop watched live by diffcheck: dct.watch checks, every --every steps, that
the dp replicas of every parameter and its gradient hold the same bits, and names the rank that does not.

    python3 examples/watch_train.py -n 4 [--bug bit_flip | --bug allreduce_skipped] [--steps 20] [--every 1]
    torchrun --nproc-per-node 4 examples/watch_train.py [...]

An MLP (LayerNorm, fc1, GELU, fc2) replicated on every rank; each rank takes its own share of the
batch, the gradients are averaged over the ranks, as across hosts: an all-reduce within each half of
the ranks, then one across the halves between the ranks of the same place in them; then SGD steps.

--bug bit_flip            after step 5's update the last rank's copy of fc1.weight has one bit flipped
    (a chip or memory fault): found at the next check, naming that rank and param/1.weight (fc1's).
--bug allreduce_skipped   at step 3 the across-halves all-reduce is left out by the last place's group
    (ranks 1 and 3 of 4): found at that step, naming those ranks and the gradients (4 ranks or more).

--bug flaky_matmul        the last rank's fc1 (module "1") is off by 1e-3 in one element every other
    call on average: the all-reduce averages it away, so replicas agree, but the rerun check (fc1's
    forward run again every 5th step) names that rank's device and the step: a TRANSIENT fault.

--bug stalled_rank        the last rank stops before step 4's update: the check waits --timeout seconds and
    names it (gloo's monitored barrier).

Exit 1 when the watch finds replicas apart or a transient fault (ReplicasDiffer), 0 after a clean run.
"""
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

D, FFN, ROWS, LR = 64, 256, 32, 0.1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUGS = ("bit_flip", "allreduce_skipped", "flaky_matmul", "stalled_rank")


def model(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(D), nn.Linear(D, FFN), nn.GELU(), nn.Linear(FFN, D)).to(dtype)


def flaky_forward(linear, coin):
    """The bug: a matmul on this rank's device wrong some of the time (one element off by 1e-3, every
    other call on average), standing in for a faulty chip."""
    inner = linear.forward

    def forward(x):
        y = inner(x)
        if coin.random() < 0.5:
            y = y.clone()
            y.view(-1)[11] += 1e-3
        return y
    linear.forward = forward


def work(rank, world, args):
    dtype = DTYPES[args.dtype]
    m = model(dtype)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    # A two-level all-reduce, as across hosts: within each group of `local` ranks, then across the groups.
    local = world // 2 if world >= 4 and world % 2 == 0 else world
    within = [dist.new_group(list(range(h * local, (h + 1) * local))) for h in range(world // local)]
    across = [dist.new_group(list(range(i, world, local))) for i in range(local)]
    if args.bug == "flaky_matmul" and rank == world - 1:
        flaky_forward(m[1], random.Random(5))
    watch = dct.watch(m, opt, mesh=f"dp={world}", every=args.every, out=f"{args.out}/watch", rerun="1", rerun_every=5, timeout=args.timeout) if args.every else None  # noqa: E501  # diffcheck
    found = False
    t0 = time.perf_counter()
    try:
        for step in range(args.steps):
            x = torch.randn(world, ROWS, D, generator=g)[rank].to(dtype)
            loss = ((m(x).float() - x.float()) ** 2).mean()
            loss.backward()
            for p in m.parameters():
                grad = p.grad.float()
                dist.all_reduce(grad, group=within[rank // local])
                if not (args.bug == "allreduce_skipped" and step == 3 and rank % local == local - 1):
                    dist.all_reduce(grad, group=across[rank % local])  # the bug: left out by one group
                p.grad.copy_(grad / world)
            if args.bug == "stalled_rank" and step == 4 and rank == world - 1:
                time.sleep(120)  # the bug: this rank stops answering
            opt.step()
            opt.zero_grad()
            if args.bug == "bit_flip" and step == 5 and rank == world - 1:
                with torch.no_grad():  # the bug: one bit of one weight
                    m[1].weight.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).view(-1)[7] ^= 1 << 3
        if watch is not None:
            watch.close()  # diffcheck
    except dct.RankUnresponsive:  # diffcheck
        raise  # a rank that never came: nothing left to finish with it
    except dct.ReplicasDiffer:  # diffcheck
        found = True
    if rank == 0:
        print(f"{args.steps} steps in {time.perf_counter() - t0:.2f} s; {'replicas apart' if found else 'clean'}")
    if found:
        with open(os.path.join(args.out, f"found.rank{rank}"), "w"):
            pass


def after(args):
    return 1 if any(f.startswith("found.") for f in os.listdir(args.out)) else 0


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/watch_train", n=4, dtypes=DTYPES, sketch=False)
    ap.add_argument("--bug", choices=BUGS, help="the fault to inject")
    ap.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    ap.add_argument("--every", type=int, default=1, help="check every N steps (default 1; 0: no watch)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a check waits for every rank (default 300)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if f.startswith("found."):
            os.remove(os.path.join(a.out, f))
    launch(work, after, a, a.n)
