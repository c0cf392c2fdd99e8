#!/usr/bin/env python3
"""A transformer block parallelized with torch's own DTensor plan, checked by
diffcheck with no `layouts=`.

    python3 examples/dtensor_block.py -n 2 [--dtensor-output] [--bug missing_allreduce]
    mpirun -n 2 python3 examples/dtensor_block.py

The block is written unsharded (nn.Linear everywhere) and split over the tp
ranks by `parallelize_module`: q, k, v and fc1 ColwiseParallel, the
attention's output projection and fc2 RowwiseParallel, torchtitan's way. By
default the plan hands plain local tensors on (`use_local_output=True`);
--dtensor-output has the column-parallel layers hand DTensors on instead. Either way
diffcheck reads each tap's layout from the plan and the parameters'
placements (docs/torch.md, "DTensor plans").

--bug missing_allreduce breaks torch's RowwiseParallel (monkeypatched here):
its output is handed on as this rank's partial sum, never all-reduced.
diffcheck names `attn.out`, the first row-parallel layer, as the first
divergence. The reference is the unsharded block in float64, in one process.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser, require_dtype  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, S, D, HEAD_DIM, FFN = 2, 16, 64, 8, 256
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class CoreAttention(nn.Module):
    """softmax(q k^T / sqrt(d)) v over the heads this rank holds (as many as its q's width says)."""

    def forward(self, q, k, v):
        def split(t):
            return t.view(t.shape[0], t.shape[1], -1, HEAD_DIM).transpose(1, 2)
        o = torch.softmax(split(q) @ split(k).transpose(-1, -2) / HEAD_DIM ** 0.5, dim=-1) @ split(v)
        return o.transpose(1, 2).reshape(q.shape)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        # k without a bias: softmax ignores a shift shared by every key, so
        # its gradient is zero in exact arithmetic and rounding noise alone in
        # float32, with no scale to hold it to (fsdp_tp_train.py trains it).
        self.q, self.v, self.out = (nn.Linear(D, D) for _ in range(3))
        self.k = nn.Linear(D, D, bias=False)
        self.core = CoreAttention()

    def forward(self, x):
        return self.out(self.core(self.q(x), self.k(x), self.v(x)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(D, FFN), nn.GELU(), nn.Linear(FFN, D)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def block_and_input(dtype, seed=0, batch=B):
    """The same weights and input (`batch` sequences) in every process."""
    torch.manual_seed(seed)
    block = Block().double()
    for p in block.parameters():
        nn.init.normal_(p, std=p.shape[-1] ** -0.5 if p.dim() > 1 else 0.1)
    return block.to(dtype), torch.randn(batch, S, D, dtype=torch.float64).to(dtype)


def plan(dtensor_output):
    """dtensor_output: the column-parallel layers hand DTensors on (the
    residual stream stays plain, so the row-parallel ones hand on tensors)."""
    col, row = ColwiseParallel(use_local_output=not dtensor_output), RowwiseParallel()
    return {"attn.q": col, "attn.k": col, "attn.v": col, "attn.out": row, "mlp.fc1": col, "mlp.fc2": row}


def break_rowwise():
    """The injected fault: RowwiseParallel hands its partial sums on as if all-reduced."""
    def no_reduce(output_layouts, use_local_output, mod, outputs, device_mesh):
        return outputs.to_local() if use_local_output else outputs
    RowwiseParallel._prepare_output_fn = staticmethod(no_reduce)


def work(rank, world, args):
    dtype = DTYPES[args.dtype]
    if args.bug == "missing_allreduce":
        break_rowwise()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    block, x = block_and_input(dtype)
    weights = {k: v.clone() for k, v in block.state_dict().items()}  # the unsharded block's
    parallelize_module(block, mesh, plan(args.dtensor_output))
    with torch.no_grad(), dct.capture(block, out=f"{args.out}/tp", mesh=f"tp={world}", sketch=args.sketch):  # diffcheck
        block(x)

    def unsharded(dt):
        model = Block()
        model.load_state_dict(weights)
        return model.to(dt), (x.to(dt),)
    # Rank 0: the unsharded block in float64, and in --dtype (each tap's yardstick).
    dct.references(unsharded, f"{args.out}/ref", dtype=dtype, sketch=args.sketch)  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/tp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/dtensor_block", dtypes=DTYPES)
    ap.add_argument("--bug", choices=["missing_allreduce"], help="break torch's RowwiseParallel")
    ap.add_argument("--dtensor-output", action="store_true", help="ColwiseParallel(use_local_output=False)")
    a = ap.parse_args()
    require_dtype(ap, a.dtype, DTYPES[a.dtype])
    launch(work, after, a, a.n)
