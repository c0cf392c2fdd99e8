#!/usr/bin/env python3
"""Two training steps of a tensor- and sequence-parallel transformer block, checked by diffcheck.

    mpirun -n 2 python3 examples/tp_train.py [--bug ln_grad_not_reduced | --bug grad_averaged_twice]
    python3 examples/tp_train.py -n 2 [--bug ...]        # torch.multiprocessing over gloo

Megatron's sequence parallelism over the tp ranks: outside attention and the
MLP each rank holds its share of the tokens (the LayerNorms run there); the
tokens are all-gathered before the column-parallel layers (q, k, v, fc1) and
the row-parallel layers' partial sums are reduce-scattered back to shares of
tokens (the backward does the opposite). The LayerNorm weights and the
row-parallel biases are replicated, but each rank computes their gradient
from its own tokens: after backward those gradients are all-reduced over tp,
then SGD steps. The loss is the squared error over all tokens divided by
their number, each rank adding its own tokens' share.

The reference is the same block at tp = 1 in float64, in one process, trained
the same two steps; the same in the run's dtype, captured beside it, is each
tap's yardstick. diffcheck taps every module output, its gradient, every
parameter's gradient before the step and every parameter after it.

--bug ln_grad_not_reduced   the LayerNorm gradients are not all-reduced: each
    rank steps its replica with its own tokens' gradient; diffcheck names
    step0/param_grad/ln1.weight (replicas differ, and the reference), every
    forward tap of step 0 passing.
--bug grad_averaged_twice   the replicated parameters' gradients are averaged
    over tp (the all-reduce divides by the ranks) though the loss already is
    a mean over every rank's tokens: step0/param_grad/ln1.weight again, its
    replicas equal and 1/tp of the reference.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, S, D, HEADS, FFN, STEPS, LR = 2, 16, 64, 8, 256, 2, 0.5
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUGS = ("ln_grad_not_reduced", "grad_averaged_twice")
LAYOUTS = {"ln[12]": "-,tp,-", "attn.[qkv]": "-,-,tp", "attn.core": "-,-,tp", "mlp.fc1": "-,-,tp", "mlp.act": "-,-,tp", "*.matmul": (None, "tp"), "param*/*.[qkv].weight": "tp,-", "param*/*.[qkv].bias": "tp", "param*/*.fc1.weight": "tp,-", "param*/*.fc1.bias": "tp", "param*/*.matmul.weight": "-,tp", "param*": None, "*": "-,tp,-"}  # noqa: E501  # diffcheck


def wide(x):
    """gloo (torch 1.13) sums and moves no bfloat16: such tensors travel as float32."""
    return x.float() if x.dtype == torch.bfloat16 else x


class GatherTokens(torch.autograd.Function):
    """Forward: every rank's tokens (all-gather, dim 1). Backward: the summed gradient of this rank's tokens."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(wide(x)) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, wide(x).contiguous())
        return torch.cat(parts, 1).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return ReduceScatterTokens.forward(ctx, g)


class ReduceScatterTokens(torch.autograd.Function):
    """Forward: the sum over ranks of this rank's tokens (reduce-scatter, dim 1). Backward: all-gather."""

    @staticmethod
    def forward(ctx, x):
        total = wide(x).clone()
        dist.all_reduce(total)  # gloo has no reduce-scatter
        share = x.shape[1] // dist.get_world_size()
        return total[:, dist.get_rank() * share:(dist.get_rank() + 1) * share].to(x.dtype).contiguous()

    @staticmethod
    def backward(ctx, g):
        return GatherTokens.forward(ctx, g)


def gather_tokens(x, tp):
    return GatherTokens.apply(x) if tp > 1 else x


def reduce_scatter_tokens(x, tp):
    return ReduceScatterTokens.apply(x) if tp > 1 else x


class ColumnParallelLinear(nn.Linear):
    """This rank's output columns."""

    def __init__(self, weight, bias, tp, rank):
        rows = weight.shape[0] // tp
        super().__init__(weight.shape[1], rows)
        with torch.no_grad():
            self.weight.copy_(weight[rank * rows:(rank + 1) * rows])
            self.bias.copy_(bias[rank * rows:(rank + 1) * rows])


class RowParallelLinear(nn.Module):
    """This rank's input columns: a partial sum (`matmul`), reduce-scattered to shares of tokens, then the bias."""

    def __init__(self, weight, bias, tp, rank):
        super().__init__()
        cols = weight.shape[1] // tp
        self.matmul = nn.Linear(cols, weight.shape[0], bias=False)
        with torch.no_grad():
            self.matmul.weight.copy_(weight[:, rank * cols:(rank + 1) * cols])
        self.bias = nn.Parameter(bias.clone())
        self.tp = tp

    def forward(self, x):
        return reduce_scatter_tokens(self.matmul(x), self.tp) + self.bias


class CoreAttention(nn.Module):
    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def forward(self, q, k, v):
        def split(t):
            return t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)
        o = torch.softmax(split(q) @ split(k).transpose(-1, -2) / (D // HEADS) ** 0.5, dim=-1) @ split(v)
        return o.transpose(1, 2).reshape(q.shape)


class Attention(nn.Module):
    def __init__(self, w, tp, rank):
        super().__init__()
        self.q, self.k, self.v = (ColumnParallelLinear(*w[n], tp, rank) for n in "qkv")
        self.core = CoreAttention(HEADS // tp)
        self.out = RowParallelLinear(*w["out"], tp, rank)

    def forward(self, x):
        return self.out(self.core(self.q(x), self.k(x), self.v(x)))


class MLP(nn.Module):
    def __init__(self, w, tp, rank):
        super().__init__()
        self.fc1 = ColumnParallelLinear(*w["fc1"], tp, rank)
        self.act = nn.GELU()
        self.fc2 = RowParallelLinear(*w["fc2"], tp, rank)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Takes and returns this rank's share of the tokens."""

    def __init__(self, w, tp=1, rank=0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.mlp = Attention(w, tp, rank), MLP(w, tp, rank)
        self.tp = tp

    def forward(self, x):
        x = x + self.attn(gather_tokens(self.ln1(x), self.tp))
        return x + self.mlp(gather_tokens(self.ln2(x), self.tp))


def full_weights():
    """The unsharded weights, the input and the target, the same in every process (float64)."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    w = {}
    for name, (n_out, n_in) in {"q": (D, D), "k": (D, D), "v": (D, D), "out": (D, D),
                                "fc1": (FFN, D), "fc2": (D, FFN)}.items():
        w[name] = (randn(n_out, n_in, scale=n_in ** -0.5), randn(n_out, scale=0.1))
    return w, randn(B, S, D), randn(B, S, D)


def reduce_replicated_grads(block, tp, bug):
    """After backward: the gradients of the replicated parameters (LayerNorms, row-parallel biases), summed over tp."""
    if tp == 1:
        return
    for name, p in block.named_parameters():
        if not (name.startswith("ln") or name.endswith("out.bias") or name.endswith("fc2.bias")):
            continue
        if bug == "ln_grad_not_reduced" and name.startswith("ln"):
            continue  # the bug: this rank keeps its own tokens' gradient
        total = wide(p.grad).clone()
        dist.all_reduce(total)
        if bug == "grad_averaged_twice":
            total /= tp  # the bug: an average, though the loss already is a mean over every rank's tokens
        p.grad.copy_(total)


def work(rank, world, args):
    """Every rank: its shard, two steps in --dtype; rank 0 also the reference and the one-device run."""
    dtype = DTYPES[args.dtype]
    w, x, target = full_weights()
    share = slice(rank * S // world, (rank + 1) * S // world)
    block = Block(w, world, rank).to(dtype)
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    with dct.capture(block, out=f"{args.out}/tp", mesh=f"tp={world}", layouts=LAYOUTS, backward=True, optimizer=opt, sketch=args.sketch):  # noqa: E501  # diffcheck
        run(block, opt, x[:, share].to(dtype), target[:, share].to(dtype), world, args.bug)
    # Rank 0: the unsharded block's two steps in float64, and in --dtype (each tap's yardstick).
    dct.references(lambda dt: (Block(w).to(dt), (x.to(dt), target.to(dt))), f"{args.out}/ref", dtype=dtype, step=lambda m, xt, optimizer: run(m, optimizer, *xt, 1), optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=LR), backward=True, sketch=args.sketch)  # noqa: E501  # diffcheck


def run(block, opt, x, target, tp, bug=None):
    """Two SGD steps on a fixed batch; the loss: squared error over all tokens / their number (this rank's share)."""
    for i in range(STEPS):
        dct.step(i)  # diffcheck
        loss = ((block(x) - target) ** 2).sum() / target.shape[0] / S / D
        loss.backward()
        reduce_replicated_grads(block, tp, bug)
        opt.step()
        opt.zero_grad()


def after(args):
    return dct.verdict(f"{args.out}/tp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/tp_train", dtypes=DTYPES)
    ap.add_argument("--bug", choices=BUGS, help="the gradient reduction's bug to inject")
    a = ap.parse_args()
    launch(work, after, a, a.n)
