#!/usr/bin/env python3
"""yunchang's USP (Ulysses inside ring attention, the basis of xDiT:
yunchang.LongContextAttention), checked by diffcheck with no layouts.

    python3 examples/yunchang_usp.py -n 4 [--ring 2] [--bug swapped_indices] [--dtype bfloat16]

A pre-norm attention block on [batch, sequence, model] activations, each rank
holding its share of the sequence in rank order (sp = the ranks = ring x
ulysses, yunchang's set_seq_parallel_pg with the Ulysses groups the low
ranks). The attention is yunchang's with torch's math kernel, the one that
runs on a CPU; it has no backward in yunchang 0.6.4, so this is a forward.

diffcheck reads the layout from the LongContextAttention (its ring and
Ulysses process groups and gather_idx): its output split along the
sequence over both axes, and every other activation as the block's input.
The reference is the same block on the whole sequence in one process, its
attention torch's SDPA over every head under the same name.

--bug swapped_indices   LongContextAttention built with scatter_idx and
    gather_idx swapped: found at `attn`, its shape not the reference's.

Found with it: --ring 2 fails at `attn` (rel L2 ~4e-3, err/tol ~2.5e4) with
no bug injected. yunchang 0.6.4's torch-math kernel returns each block's
log-sum-exp as zeros (yunchang/kernels/attention.py), so the ring's merge
weighs the blocks of keys equally instead of by their softmax mass: ring
attention on that kernel is wrong, Ulysses alone (--ring 1) is right.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402
from _sequence_block import DTYPES, HEADS, S, Block, SdpaAttention, data, weights  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

BUGS = ("swapped_indices",)


def work(rank, world, args):
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType
    ring, ulysses = args.ring, world // args.ring
    set_seq_parallel_pg(ulysses, ring, rank, world, use_ulysses_low=True)
    dtype = DTYPES[args.dtype]
    scatter, gather = (1, 2) if args.bug == "swapped_indices" else (2, 1)  # heads, sequence
    attn = LongContextAttention(scatter_idx=scatter, gather_idx=gather, attn_type=AttnType.TORCH_MATH)
    block = weights(Block(attn).double()).to(dtype)
    x = data()[:, rank * S // world:(rank + 1) * S // world].to(dtype)
    with dct.capture(block, f"{args.out}/usp", mesh=f"ring={ring},ulysses={ulysses}"), torch.no_grad():  # diffcheck
        block(x)
    dct.references(lambda dt: (weights(Block(SdpaAttention()).double()).to(dt), (data().to(dt),)), f"{args.out}/ref", dtype=dtype)  # noqa: E501  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/usp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/yunchang_usp", n=4, dtypes=DTYPES, sketch=False)
    ap.add_argument("--ring", type=int, default=1, help="ring degree; ulysses = n / ring (default 1)")
    ap.add_argument("--bug", choices=BUGS, help="the sequence-parallel bug to inject")
    a = ap.parse_args()
    if a.n % a.ring or HEADS % (a.n // a.ring) or S % a.n:
        ap.error(f"-n {a.n} --ring {a.ring}: ulysses = n / ring must divide the {HEADS} heads, n the {S} tokens")
    launch(work, after, a, a.n)
