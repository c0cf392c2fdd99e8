#!/usr/bin/env python3
"""diffusers' own context parallelism on a small Flux2Transformer2DModel
(FLUX.2; random weights, a tiny config), checked by diffcheck with no layouts.

    python3 examples/flux2_context_parallel.py [-n 2] [--ring R] [--train] [--dtype bfloat16]
                                               [--bug key_all_to_all_skipped|ring_merge_skipped]

FLUX.2's plan splits the image and the text tokens and their position ids
at the model's input and gathers at proj_out (flux_context_parallel.py says
the rest, and the faults). The reference is the same model unsharded in
float64.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch  # noqa: E402
from _diffusers_parallel import DTYPES, arguments, parallelize, step  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, H, W, TXT = 1, 4, 10, 12  # 40 image and 12 text tokens: divisible by 2 and 4 ranks, no length a feature width


def build(dtype):
    from diffusers import Flux2Transformer2DModel
    torch.manual_seed(0)
    model = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                    attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                    timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)
    g = torch.Generator().manual_seed(1)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.zeros(1), torch.arange(float(H)),
                                         torch.arange(float(W)), indexing="ij"), -1).reshape(1, H * W, 4)
    txt_ids = torch.zeros(1, TXT, 4)
    txt_ids[..., 3] = torch.arange(float(TXT))
    inputs = {"hidden_states": torch.randn(B, H * W, 16, generator=g),
              "encoder_hidden_states": torch.randn(B, TXT, 32, generator=g), "timestep": torch.tensor([0.5] * B),
              "img_ids": img_ids.expand(B, -1, -1), "txt_ids": txt_ids.expand(B, -1, -1),
              "return_dict": False}  # diffusers' CP hooks want a tuple out
    return model.to(dtype), {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                             for k, v in inputs.items()}


def work(rank, world, args):
    model, inputs = build(DTYPES[args.dtype])
    parallelize(model, world, args.ring, args.bug, args.mend_ring_backward)
    sgd = (lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) if args.train else None
    opt = sgd(model) if sgd else None
    with dct.capture(model, f"{args.out}/sp", f"sp={world}", optimizer=opt, backward=args.train):  # noqa: E501  # diffcheck
        step(model, inputs, opt, sharded=True)
    # Rank 0: the unsharded model in float64, and in the run's dtype (each tap's yardstick).
    dct.references(build, f"{args.out}/ref", dtype=DTYPES[args.dtype], step=step, optimizer=sgd, backward=args.train)  # noqa: E501  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/sp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    a = arguments(__doc__, "dumps/flux2_context_parallel")
    launch(work, after, a, a.n)
