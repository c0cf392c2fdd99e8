#!/usr/bin/env python3
"""diffusers' own context parallelism on a small QwenImageTransformer2DModel
(random weights, a tiny config), checked by diffcheck with no layouts.

    python3 examples/qwenimage_context_parallel.py [-n 2] [--ring R] [--train] [--dtype bfloat16]
                                                   [--bug key_all_to_all_skipped|ring_merge_skipped]

Qwen-Image's plan splits the image and the text tokens (and the text mask)
at the first block's input, its rotary tables alike, and gathers at
proj_out; each attention runs on [its text, its image] tokens of a rank
(flux_context_parallel.py says the rest, and the faults; the same hooks,
read by python/diffcheck/torch/diffusers_plan.py). The text carries a
padding mask (its last 2 tokens masked), except with --ring: ring attention
runs on diffusers' `_native_flash` backend on the CPU, which takes no mask
(`attn_mask is not supported for native flash attention`). The reference
is the same model unsharded in float64.

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

B, H, W, TXT = 1, 4, 8, 12  # 32 image and 12 text tokens: divisible by 2 and 4 ranks, no local length a whole one


def build(dtype, masked=True):
    from diffusers import QwenImageTransformer2DModel
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(patch_size=1, in_channels=16, out_channels=16, num_layers=2,
                                        attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                        axes_dims_rope=(4, 6, 6))
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(B, TXT, dtype=torch.long)
    mask[:, -2:] = 0  # the text's padding
    inputs = {"hidden_states": torch.randn(B, H * W, 16, generator=g),
              "encoder_hidden_states": torch.randn(B, TXT, 32, generator=g),
              "encoder_hidden_states_mask": mask if masked else None, "timestep": torch.tensor([0.5] * B),
              "img_shapes": [[(1, H, W)]] * B, "return_dict": False}  # diffusers' CP hooks want a tuple out
    return model.to(dtype), {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                             for k, v in inputs.items()}


def work(rank, world, args):
    make = functools.partial(build, masked=args.ring == 1)
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
    a = arguments(__doc__, "dumps/qwenimage_context_parallel")
    launch(work, after, a, a.n)
