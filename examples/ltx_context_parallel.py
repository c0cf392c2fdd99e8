#!/usr/bin/env python3
"""diffusers' own context parallelism on a small LTXVideoTransformer3DModel
(LTX-Video; random weights, a tiny config), checked by diffcheck with no
layouts.

    python3 examples/ltx_context_parallel.py [-n 2] [--ring R] [--train] [--dtype bfloat16]
                                             [--bug key_all_to_all_skipped|ring_merge_skipped]

LTX's plan splits the video tokens, the text and its mask at the model's
input and the rotary tables alike (`split_output`), and gathers at
proj_out (flux_context_parallel.py says the rest, and the faults). The text
carries no padding mask: with one, diffusers 0.42.1 stops inside its
Ulysses attention, diffcheck or not (`The size of tensor a (2) must match
the size of tensor b (4) at non-singleton dimension 1`: the mask is
broadcast over all 4 heads, the attention runs on each rank's 2), and on a
ring its CPU backend `_native_flash` takes no mask. The reference is the
same model unsharded in float64.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch  # noqa: E402
from _diffusers_parallel import DTYPES, arguments, parallelize, step  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, F, H, W, TXT = 1, 2, 4, 4, 8  # 2 frames of 4 x 4 patches (32 tokens) and 8 text tokens


def build(dtype, masked=False):
    from diffusers import LTXVideoTransformer3DModel
    torch.manual_seed(0)
    model = LTXVideoTransformer3DModel(in_channels=16, out_channels=16, num_attention_heads=4, attention_head_dim=16,
                                       cross_attention_dim=64, num_layers=2, caption_channels=32)
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(B, TXT)
    mask[:, -2:] = 0  # the text's padding
    inputs = {"hidden_states": torch.randn(B, F * H * W, 16, generator=g),
              "encoder_hidden_states": torch.randn(B, TXT, 32, generator=g), "timestep": torch.tensor([500] * B),
              "encoder_attention_mask": mask if masked else None, "num_frames": F, "height": H,
              "width": W, "return_dict": False}  # diffusers' CP hooks want a tuple out
    return model.to(dtype), {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                             for k, v in inputs.items()}


def work(rank, world, args):
    make = functools.partial(build, masked=False)  # masked=True: diffusers' Ulysses stops (above)
    model, inputs = make(DTYPES[args.dtype])
    parallelize(model, world, args.ring, args.bug, args.mend_ring_backward)
    sgd = (lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) if args.train else None
    opt = sgd(model) if sgd else None
    with dct.capture(model, f"{args.out}/sp", f"sp={world}", optimizer=opt, backward=args.train):  # diffcheck
        step(model, inputs, opt, sharded=True)
    # Rank 0: the unsharded model in float64, and in the run's dtype (each tap's yardstick).
    dct.references(make, f"{args.out}/ref", dtype=DTYPES[args.dtype], step=step, optimizer=sgd, backward=args.train)  # noqa: E501  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/sp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    a = arguments(__doc__, "dumps/ltx_context_parallel")
    launch(work, after, a, a.n)
