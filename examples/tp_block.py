#!/usr/bin/env python3
"""A Megatron-style tensor-parallel transformer block, checked by diffcheck.

    mpirun -n 4 python3 examples/tp_block.py [--bug]
    python3 examples/tp_block.py -n 4 [--bug]          # torch.multiprocessing over gloo

The attention heads and the MLP's hidden units are split over the tp ranks:
q, k, v and fc1 are column-parallel (each rank computes its own columns),
the attention's output projection and fc2 are row-parallel (each rank a
partial sum, all-reduced, then the bias). The reference is the same block at
tp = 1 in float64, in one process; the same block at tp = 1 in float32,
captured beside it, is the yardstick that diffcheck compare finds there and
holds each tap to (the error a correct run in float32 has). --bug adds the row-parallel bias on every
rank before the all-reduce, so the sum holds it tp times: diffcheck names
`attn.out` (the first row-parallel layer) as the first divergence, and its
partial sums `attn.out.matmul` as still right.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser, require_dtype  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, S, D, HEADS, FFN = 2, 16, 64, 8, 256  # as shipped; --tokens, --dim, --heads, --ffn change them
SEED = 0  # --seed: of the weights and the input
SDPA = False  # --sdpa: the attention core is torch's F.scaled_dot_product_attention
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def set_size(args):
    """The block's size from the command line (every process: spawned ones import this file afresh)."""
    global S, D, HEADS, FFN, SEED, SDPA
    SEED, SDPA = args.seed, args.sdpa
    if args.tokens % B or args.dim % args.heads or args.heads % max(args.world, 1) or args.ffn % max(args.world, 1):
        raise SystemExit(f"tp_block: --tokens must be a multiple of {B}, --dim of --heads, and --heads and --ffn "
                         f"of the ranks{f' ({args.world})' if args.world else ''}")
    S, D, HEADS, FFN = args.tokens // B, args.dim, args.heads, args.ffn
LAYOUTS = {"attn.[qkv]": "-,-,tp", "attn.core": "-,-,tp", "mlp.fc1": "-,-,tp", "mlp.act": "-,-,tp", "*.matmul": (None, "tp")}  # noqa: E501  # diffcheck


def full_weights():
    """The unsharded weights and input, the same in every process (float64)."""
    g = torch.Generator().manual_seed(SEED)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    w = {}
    for name, (n_out, n_in) in {"q": (D, D), "k": (D, D), "v": (D, D), "out": (D, D),
                                "fc1": (FFN, D), "fc2": (D, FFN)}.items():
        w[name] = (randn(n_out, n_in, scale=n_in ** -0.5), randn(n_out, scale=0.1))
    return w, randn(B, S, D)


def all_reduce(y):
    """In place. gloo (torch 1.13) has no bfloat16 sum: that one is summed in
    float32 and rounded once, as NCCL's reduction of two pieces would."""
    if y.dtype == torch.bfloat16:
        wide = y.float()
        dist.all_reduce(wide)
        y.copy_(wide)
    else:
        dist.all_reduce(y)


class ColumnParallelLinear(nn.Module):
    """This rank's output columns: x W[rows]^T + b[rows]."""

    def __init__(self, weight, bias, tp, rank):
        super().__init__()
        rows = weight.shape[0] // tp
        self.weight = nn.Parameter(weight[rank * rows:(rank + 1) * rows].clone())
        self.bias = nn.Parameter(bias[rank * rows:(rank + 1) * rows].clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's input columns: a partial sum (`matmul`), all-reduced over tp, then the bias."""

    def __init__(self, weight, bias, tp, rank, bug):
        super().__init__()
        cols = weight.shape[1] // tp
        self.matmul = nn.Linear(cols, weight.shape[0], bias=False)
        self.matmul.weight = nn.Parameter(weight[:, rank * cols:(rank + 1) * cols].clone())
        self.bias = nn.Parameter(bias.clone())
        self.tp, self.bug = tp, bug
        # --bug-scale A: each rank's share of the bias, so that the sum holds
        # it 1 + A (tp - 1) times (A = 1: every rank adds all of it)
        self.share = (1 + (bug or 0) * (tp - 1)) / tp

    def forward(self, x):
        y = self.matmul(x)
        if self.bug:
            y = y + (self.bias if self.share == 1 else self.share * self.bias)  # the bug: the bias before the sum
        if self.tp > 1:
            all_reduce(y)
        return y if self.bug else y + self.bias


class CoreAttention(nn.Module):
    """softmax(q k^T / sqrt(d)) v over this rank's heads."""

    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def forward(self, q, k, v):
        def split(t):
            return t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)
        if SDPA:
            o = F.scaled_dot_product_attention(split(q), split(k), split(v), scale=(D // HEADS) ** -0.5)
        else:
            o = torch.softmax(split(q) @ split(k).transpose(-1, -2) / (D // HEADS) ** 0.5, dim=-1) @ split(v)
        return o.transpose(1, 2).reshape(q.shape)


class Attention(nn.Module):
    def __init__(self, w, tp, rank, bug):
        super().__init__()
        self.q, self.k, self.v = (ColumnParallelLinear(*w[n], tp, rank) for n in "qkv")
        self.core = CoreAttention(HEADS // tp)
        self.out = RowParallelLinear(*w["out"], tp, rank, bug)

    def forward(self, x):
        return self.out(self.core(self.q(x), self.k(x), self.v(x)))


class MLP(nn.Module):
    def __init__(self, w, tp, rank, bug):
        super().__init__()
        self.fc1 = ColumnParallelLinear(*w["fc1"], tp, rank)
        self.act = nn.GELU()
        self.fc2 = RowParallelLinear(*w["fc2"], tp, rank, bug)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, w, tp=1, rank=0, bug=False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = Attention(w, tp, rank, bug)
        self.mlp = MLP(w, tp, rank, bug)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def work(rank, world, args):
    """Every rank: its shard of the block in --dtype; rank 0 also the reference and the one-device run."""
    args.world = world
    set_size(args)
    dtype = DTYPES[args.dtype]
    w, x = full_weights()
    block = Block(w, world, rank, args.bug and args.bug_scale).to(dtype)
    with dct.capture(block, out=f"{args.out}/tp", mesh=f"tp={world}", layouts=LAYOUTS, sketch=args.sketch):  # diffcheck
        block(x.to(dtype))  # diffcheck
    if not args.no_reference:  # rank 0: the unsharded block in float64, and in --dtype (each tap's yardstick)
        dct.references(lambda dt: (Block(w).to(dt), (x.to(dt),)), f"{args.out}/ref", dtype=dtype, sketch=args.sketch)  # noqa: E501  # diffcheck


def after(args):
    if args.no_reference:  # compared with other runs: examples/tp_block_meshes.py
        print(f"captured {args.out}/tp with no reference: diffcheck compare {args.out}/tp --against OTHER_RUN")
        return 0
    return dct.verdict(f"{args.out}/tp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/tp_block", n=4, dtypes=DTYPES)
    ap.add_argument("--bug", action="store_true", help="add the row-parallel bias on every rank")
    ap.add_argument("--bug-scale", type=float, default=1.0, metavar="A",
                    help="with --bug: the sum holds the bias 1 + A (tp - 1) times (default 1: tp times)")
    ap.add_argument("--no-reference", action="store_true",
                    help="capture the sharded run only, for `diffcheck compare RUN --against OTHER_RUN`")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    ap.add_argument("--tokens", type=int, default=B * S, help=f"tokens, {B} sequences of tokens/{B} (default {B * S})")
    ap.add_argument("--dim", type=int, default=D, help=f"model width D (default {D})")
    ap.add_argument("--heads", type=int, default=HEADS, help=f"attention heads (default {HEADS})")
    ap.add_argument("--ffn", type=int, default=None, help=f"MLP width (default 4 D; {FFN} as shipped)")
    ap.add_argument("--sdpa", action="store_true", help="the attention core as F.scaled_dot_product_attention "
                                                        "(default: softmax and matrix products written out)")
    a = ap.parse_args()
    require_dtype(ap, a.dtype, DTYPES[a.dtype])
    a.ffn = a.ffn or 4 * a.dim
    a.world = 0  # known in work()
    set_size(a)
    launch(work, after, a, a.n)
