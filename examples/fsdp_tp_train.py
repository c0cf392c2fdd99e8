#!/usr/bin/env python3
"""A training step of a block sharded two ways at once, checked by diffcheck:
tensor parallel over tp (torch's parallelize_module, examples/dtensor_block.py's
plan) and FSDP2 over dp (fully_shard), on a dp=2 x tp=2 mesh of 4 gloo ranks.

    python3 examples/fsdp_tp_train.py [-n 4] [--parallel fsdp_tp|fsdp|hsdp] [--bug sum_not_mean|wrong_samples]

--parallel fsdp: FSDP2 alone over dp = n (each rank its own samples);
--parallel hsdp: FSDP2's hybrid sharding on a dp=2 x fsdp=n/2 mesh, every
parameter replicated over dp and sharded over fsdp, each of the n ranks its
own samples (both axes are data axes, read from FSDP2's mesh).

Each dp rank trains on its own samples, as a data-parallel job does: the
global batch's share of its dp index (the tp ranks of one dp index share
theirs). The loss is each rank's mean over its own samples, and FSDP2
averages the gradients over dp. The reference is the unsharded block in
float64 on the global batch, one SGD step, in one process. The capture has
`backward=True` and `optimizer=` and no `layouts=` and no data-parallel word:
the data axis (dp) is read from FSDP2's mesh, so every activation tap is
split over dp on its batch dimension on top of the plan's tp layouts; the
output gradients are divided by dp (each rank's mean loss is dp times the
global batch's: loss_scale="local_mean", the default); every parameter and
parameter gradient has the placements FSDP2 and the plan gave it (FSDP2
over tp is (_StridedShard(0), Shard(0)): dimension 0 split tp-major, then dp).

--bug sum_not_mean breaks FSDP2's reduction (monkeypatched): the dp ranks'
gradients are summed, not averaged (twice the gradient on 2 dp ranks).
diffcheck names the first parameter gradient tapped, every forward tap and
output gradient passing.
--bug wrong_samples: the data loader gives the last dp index the samples of
the first (a sharding bug of the loader): diffcheck names the first tap, on
the ranks of that dp index.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402
from dtensor_block import Block, block_and_input, plan  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

LR = 0.1
B_GLOBAL = 4  # samples in the global batch: a share of 4 // dp for each dp index
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def train_step(model, x, optimizer):
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def break_fsdp_average():
    """The injected fault, in FSDP2's own reduction (monkeypatched): the dp
    ranks' gradients reduce-scattered as a sum, the division by dp lost."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives
    _fsdp_collectives._get_gradient_divide_factors = (
        lambda *a, **k: (None, None, dist.ReduceOp.SUM, dist.ReduceOp.SUM))


def sharded(block, world, parallel):
    """The block sharded as --parallel says: (the capture's mesh, the data-parallel ranks, this rank's data index)."""
    import torch.distributed as dist
    rank = dist.get_rank()
    if parallel == "fsdp":
        fully_shard(block, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)))
        return f"dp={world}", world, rank
    if parallel == "hsdp":  # a 2-D mesh: replicated over dp, sharded over fsdp
        fully_shard(block, mesh=init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "fsdp")))
        return f"dp=2,fsdp={world // 2}", world, rank
    tp = 2
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    parallelize_module(block, mesh["tp"], plan(False))
    fully_shard(block, mesh=mesh["dp"])
    return f"dp={world // tp},tp={tp}", world // tp, rank // tp


def work(rank, world, args):
    dtype = DTYPES[args.dtype]
    block, x = block_and_input(dtype, batch=B_GLOBAL)  # x: the global batch, the same in every process
    weights = {k: v.clone() for k, v in block.state_dict().items()}  # the unsharded block's
    mesh, dp, dp_index = sharded(block, world, args.parallel)
    if args.bug == "wrong_samples" and dp_index == dp - 1:
        dp_index = 0  # the bug: the loader hands this data index another one's share
    share = B_GLOBAL // dp
    local_x = x[dp_index * share:(dp_index + 1) * share]
    if args.bug == "sum_not_mean":
        break_fsdp_average()
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    with dct.capture(block, out=f"{args.out}/run", mesh=mesh, backward=True,  # diffcheck
                     optimizer=opt, sketch=args.sketch):  # diffcheck
        train_step(block, local_x, opt)

    def unsharded(dt):
        model = Block()
        model.load_state_dict(weights)
        return model.to(dt), (x.to(dt),)
    # Rank 0: the unsharded block's step in float64, and in --dtype (each tap's yardstick).
    dct.references(unsharded, f"{args.out}/ref", dtype=dtype, step=lambda m, x, optimizer: train_step(m, *x, optimizer), optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=LR), backward=True, sketch=args.sketch)  # noqa: E501  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/run", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/fsdp_tp_train", n=4, dtypes=DTYPES)  # -n: a multiple of 2 (dp = n / 2, tp = 2)
    ap.add_argument("--bug", choices=["sum_not_mean", "wrong_samples"],
                    help="sum_not_mean: FSDP2 sums the dp ranks' gradients; wrong_samples: the last dp index "
                         "trains on the first's samples")
    ap.add_argument("--parallel", choices=["fsdp_tp", "fsdp", "hsdp"], default="fsdp_tp",
                    help="FSDP2 x TP on dp=n/2 x tp=2 (default), FSDP2 alone on dp=n, or HSDP on dp=2 x fsdp=n/2")
    a = ap.parse_args()
    data = a.n if a.parallel != "fsdp_tp" else a.n // 2
    if a.n % 2 or a.n < 2 or B_GLOBAL % data:
        ap.error(f"-n must be a multiple of 2 whose data-parallel ranks ({data}) divide the global batch of "
                 f"{B_GLOBAL}")
    launch(work, after, a, a.n)
