#!/usr/bin/env python3
"""DeepSpeed-Ulysses sequence parallelism (deepspeed.sequence.layer.DistributedAttention
around scaled-dot-product attention), checked by diffcheck with no layouts.

    python3 examples/deepspeed_ulysses.py -n 2 [--train] [--bug ...] [--dtype bfloat16]
    torchrun --nproc-per-node 4 examples/deepspeed_ulysses.py [...]

A pre-norm attention block on [batch, sequence, model] activations, each rank
holding its share of the sequence (sp = the ranks). DistributedAttention's
all-to-all turns the query, key and value [b, s/sp, heads, d] into
[b, s, heads/sp, d] for the local attention and the result back.

diffcheck reads the layouts from the DistributedAttention (its scatter_idx,
gather_idx and process group): its output split along the sequence, its
local attention's along the heads, and every other activation along the
sequence as its input is. The reference is the same block on the whole
sequence in one process, its attention the local one over every head.

--bug swapped_indices   the DistributedAttention is built with scatter_idx and
    gather_idx swapped: the local attention sees other shapes, found at
    attn.local_attn as a shape that is not the reference's.
--bug kv_heads_rolled   rank 1 rolls its key's heads by one before the
    attention (a head permutation slip of a GQA port): found at
    attn.local_attn.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402
from _sequence_block import DTYPES, HEADS, S, Block, SdpaAttention, data, weights  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

LR = 0.5
BUGS = ("swapped_indices", "kv_heads_rolled")


class WholeAttention(nn.Module):
    """The reference's attention: the local attention over every head, under the same names."""

    def __init__(self):
        super().__init__()
        self.local_attn = SdpaAttention()

    def forward(self, q, k, v, *batch_dim_idx):
        return self.local_attn(q, k, v)


def work(rank, world, args):
    import deepspeed
    import deepspeed.ops
    from deepspeed.sequence.layer import DistributedAttention
    # deepspeed's, not diffcheck's: on a CPU its init compiles a shared-memory all-reduce (a C++ op, built
    # under ~/.cache/torch_extensions behind a lock that a killed build leaves behind, hanging the next
    # run); the all-to-alls of DistributedAttention do not use it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed("gloo")
    dtype = DTYPES[args.dtype]
    scatter, gather = (1, 2) if args.bug == "swapped_indices" else (2, 1)  # heads, sequence
    attn = DistributedAttention(SdpaAttention(), dist.group.WORLD, scatter_idx=scatter, gather_idx=gather)
    block = weights(Block(attn, attn_args=(0,)).double()).to(dtype)  # batch_dim_idx 0: [b, s, heads, d]
    block.roll_keys = args.bug == "kv_heads_rolled" and rank == 1
    x = data()[:, rank * S // world:(rank + 1) * S // world].to(dtype)
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    with dct.capture(block, f"{args.out}/ulysses", mesh=f"sp={world}", backward=args.train, optimizer=opt if args.train else None):  # noqa: E501  # diffcheck
        out = block(x)
        if args.train:
            (out.float() ** 2).sum().backward()
            for p in block.parameters():  # the sequence's shares of every weight's gradient
                dist.all_reduce(p.grad)
            opt.step()
    dct.references(lambda dt: (weights(Block(WholeAttention()).double()).to(dt), (data().to(dt),)), f"{args.out}/ref", dtype=dtype, step=reference_step if args.train else None, optimizer=(lambda m: torch.optim.SGD(m.parameters(), lr=LR)) if args.train else None, backward=args.train)  # noqa: E501  # diffcheck


def reference_step(model, inputs, optimizer):
    (model(inputs[0]).float() ** 2).sum().backward()
    optimizer.step()


def after(args):
    return dct.verdict(f"{args.out}/ulysses", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/deepspeed_ulysses", dtypes=DTYPES, sketch=False, train=True)
    ap.add_argument("--bug", choices=BUGS, help="the sequence-parallel bug to inject")
    a = ap.parse_args()
    if HEADS % a.n or S % a.n:
        ap.error(f"-n {a.n}: the {HEADS} heads and {S} tokens must split evenly")
    launch(work, after, a, a.n)
