#!/usr/bin/env python3
"""A training loop watched live by diffcheck: dct.watch checks, every --every steps, that the replicas
of every parameter and its gradient hold the same bits, and names the rank that does not.

    python3 examples/watch_train.py -n 4 [--parallel dp|tp|fsdp_tp|hsdp] [--bug bit_flip] [--steps 20] [--every 1]
    torchrun --nproc-per-node 4 examples/watch_train.py [...]

--parallel dp (the default): an MLP (LayerNorm, fc1, GELU, fc2) replicated on every rank; each rank
    takes its own share of the batch, the gradients are averaged over the ranks, as across hosts: an
    all-reduce within each half of the ranks, then one across the halves between the ranks of the same
    place in them; then SGD steps. Mesh dp=n; every tensor has n replicas.
--parallel tp: examples/dtensor_block.py's transformer block under torch's tensor-parallel plan
    (parallelize_module) on mesh tp=n, every rank given the same batch. The LayerNorms are plain
    tensors and the row-parallel biases Replicate DTensors: those are the replicas compared.
--parallel fsdp_tp: the same block, tensor parallel over tp=2 and FSDP2 (fully_shard) over dp=n/2,
    each dp rank with its own share of the batch: the replicas are FSDP2's shards of the LayerNorms
    and of the row-parallel biases across tp.
--parallel hsdp: the same block under FSDP2's hybrid sharding (fully_shard on a dp=2 x fsdp=n/2 mesh):
    every parameter is sharded over fsdp and replicated over dp; each rank its own share of the batch.
The watch takes the replica groups of the DTensors from their placements (no layouts= given).

--bug bit_flip            after step 5's update the last rank's copy of a replicated parameter has one bit
    flipped (a chip or memory fault): found at the next check, naming that rank and the parameter
    (dp: param/1.weight, fc1's; tp and fsdp_tp: param/ln1.weight; hsdp: param/mlp.fc1.weight).
--bug allreduce_skipped   (dp) at step 3 the across-halves all-reduce is left out by the last place's
    group (ranks 1 and 3 of 4): found at that step, naming those ranks and the gradients (4 ranks or more).

--bug dp_grad_unreduced   (hsdp) at step 2 the second dp replica (ranks n/2 to n-1) keeps mlp.fc1.weight's
    gradient unaveraged over dp, on every fsdp shard: one tensor apart in every replica group at once
    ([0, 2] and [1, 3] at 4 ranks), each group named.

--bug flaky_matmul        (dp) the last rank's fc1 (module "1") is off by 1e-3 in one element every other
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
PARALLEL = ("dp", "tp", "fsdp_tp", "hsdp")
BUGS = ("bit_flip", "allreduce_skipped", "dp_grad_unreduced", "flaky_matmul", "stalled_rank")


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


def sharded_block(parallel, world, dtype):
    """(the block, its mesh, this rank's batch share) for --parallel tp, fsdp_tp or hsdp."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    from dtensor_block import block_and_input, plan
    block, _ = block_and_input(dtype)
    rank = dist.get_rank()
    if parallel == "tp":
        parallelize_module(block, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)), plan(False))
        return block, f"tp={world}", 0
    if parallel == "fsdp_tp":
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(block, mesh["tp"], plan(False))
        fully_shard(block, mesh=mesh["dp"])
        return block, f"dp={world // 2},tp=2", rank // 2
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "fsdp"))  # hsdp
    fully_shard(block, mesh=mesh)  # a 2-D mesh: replicated over dp, sharded over fsdp
    return block, f"dp=2,fsdp={world // 2}", rank


def flip_one_bit(p, dtype):
    """The bug: one bit of one element of this rank's piece of p."""
    with torch.no_grad():
        local = p._local_tensor if hasattr(p, "_local_tensor") else p  # a DTensor's own storage
        local.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).view(-1)[7] ^= 1 << 3


FLIPPED = {"dp": "1.weight", "tp": "ln1.weight", "fsdp_tp": "ln1.weight", "hsdp": "mlp.fc1.weight"}


def work(rank, world, args):
    dtype = DTYPES[args.dtype]
    g = torch.Generator().manual_seed(1)
    if args.parallel == "dp":
        m, mesh, share, shares, rerun = model(dtype), f"dp={world}", rank, world, "1"
    else:
        m, mesh, share = sharded_block(args.parallel, world, dtype)
        shares, rerun = {"tp": 1, "fsdp_tp": world // 2, "hsdp": world}[args.parallel], "mlp.fc1"
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    # A two-level all-reduce, as across hosts: within each group of `local` ranks, then across the groups.
    local = world // 2 if world >= 4 and world % 2 == 0 else world
    within = [dist.new_group(list(range(h * local, (h + 1) * local))) for h in range(world // local)]
    across = [dist.new_group(list(range(i, world, local))) for i in range(local)]
    if args.bug == "flaky_matmul" and rank == world - 1:
        flaky_forward(m[1], random.Random(5))
    watch = dct.watch(m, opt, mesh=mesh, every=args.every, out=f"{args.out}/watch", rerun=rerun, rerun_every=5, timeout=args.timeout, on_mismatch=args.on_mismatch, exchange_every=args.exchange_every) if args.every else None  # noqa: E501  # diffcheck
    found = False
    t0 = time.perf_counter()
    try:
        for step in range(args.steps):
            if args.parallel == "dp":
                x = torch.randn(shares, ROWS, D, generator=g)[share].to(dtype)
            else:
                x = torch.randn(shares, 2, 16, D, generator=g)[share].to(dtype)
            loss = ((m(x).float() - x.float()) ** 2).mean()
            loss.backward()
            for p in m.parameters() if args.parallel == "dp" else ():  # DTensor plans and FSDP2 reduce their own
                grad = p.grad.float()
                dist.all_reduce(grad, group=within[rank // local])
                if not (args.bug == "allreduce_skipped" and step == 3 and rank % local == local - 1):
                    dist.all_reduce(grad, group=across[rank % local])  # the bug: left out by one group
                p.grad.copy_(grad / world)
            if args.bug == "dp_grad_unreduced" and step == 2 and rank >= world // 2:  # the bug: not averaged over dp
                p = dict(m.named_parameters())["mlp.fc1.weight"]
                (p.grad._local_tensor if hasattr(p.grad, "_local_tensor") else p.grad).mul_(2)
            if args.bug == "stalled_rank" and step == 4 and rank == world - 1:
                time.sleep(120)  # the bug: this rank stops answering
            opt.step()
            opt.zero_grad()
            if args.bug == "bit_flip" and step == 5 and rank == world - 1:
                flip_one_bit(dict(m.named_parameters())[FLIPPED[args.parallel]], dtype)
        if watch is not None:
            watch.close()  # diffcheck
    except dct.ReplicasDiffer:  # diffcheck  (a stalled rank, dct.RankUnresponsive, is no finding: it goes on up)
        found = True
    if rank == 0:
        print(f"{args.steps} steps in {time.perf_counter() - t0:.2f} s; {'replicas apart' if found else 'clean'}")
        if watch is not None:
            print(f"{watch.checks} checks of {len(watch.replicated)} parameters with replicas and their gradients: "
                  + ", ".join(watch.replicated) + f"; {watch.check_seconds:.3f} s of checks")
            if args.on_mismatch == "warn":
                print(f"{len(watch.findings)} finding(s) reported: "
                      + ", ".join(f"{f['tensor']} at steps {f['step']}-{f['last_step']}" for f in watch.findings))
    if found:
        with open(os.path.join(args.out, f"found.rank{rank}"), "w"):
            pass


def after(args):
    return 1 if any(f.startswith("found.") or f.startswith("watch.") for f in os.listdir(args.out)) else 0


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/watch_train", n=4, dtypes=DTYPES, sketch=False)
    ap.add_argument("--parallel", choices=PARALLEL, default="dp", help="how the model is sharded (default dp)")
    ap.add_argument("--bug", choices=BUGS, help="the fault to inject")
    ap.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    ap.add_argument("--every", type=int, default=1, help="check every N steps (default 1; 0: no watch)")
    ap.add_argument("--on-mismatch", choices=("stop", "warn"), default="stop",
                    help="stop: the first finding ends the job (exit 1); warn: it goes on, each finding reported "
                         "once until it changes (default stop)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a check waits for every rank (default 300)")
    ap.add_argument("--exchange-every", type=lambda v: v if v == "auto" else int(v), default=1,
                    help="checks whose hashes travel together: N, or auto (the watch picks N so that the exchange "
                         "costs at most 0.25%% of the steps; a finding then comes up to N-1 checks late). Default 1")
    a = ap.parse_args()
    if a.parallel != "dp" and a.bug in ("allreduce_skipped", "flaky_matmul"):
        ap.error(f"--bug {a.bug} is a fault of --parallel dp's own all-reduce and MLP")
    if a.parallel != "hsdp" and a.bug == "dp_grad_unreduced":
        ap.error("--bug dp_grad_unreduced is a fault of --parallel hsdp's reduction over dp")
    if a.parallel in ("fsdp_tp", "hsdp") and (a.n < 2 or a.n % 2):
        ap.error(f"--parallel {a.parallel}: -n must be a multiple of 2")
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if f.startswith("found."):
            os.remove(os.path.join(a.out, f))
    launch(work, after, a, a.n)
