#!/usr/bin/env python3
"""diffusers' own context parallelism on a small FluxTransformer2DModel
(random weights, a tiny config), checked by diffcheck.

    python3 examples/flux_context_parallel.py [-n 2] [--ring R] [--train] [--dtype bfloat16]
                                              [--bug key_all_to_all_skipped|ring_merge_skipped]

Every rank builds the same model and hands it to diffusers:
`model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=N/R, ring_degree=R))`.
diffusers' plan for FLUX splits the image and text tokens over the ranks at
the model's input and gathers them at proj_out. Inside each attention,
Ulysses all-to-alls trade the sequence split for a head split and back, and
ring attention gathers the other ranks' keys and values and merges the
blocks by their log-sum-exp (LSE). The reference is the same model
unsharded in float64, in one process.

On the CPU, Ulysses runs on diffusers' `native` attention backend and ring
attention on `_native_flash` (_diffusers_parallel.py says why).

Faults in diffusers' attention (monkeypatched here); diffcheck names the
first attention's output:
  key_all_to_all_skipped  Ulysses: the keys' all-to-all is skipped, so each
                          rank's heads attend to the wrong keys.
  ring_merge_skipped      ring: each block's output replaces the running one
                          instead of merging with it by the LSE, so each
                          rank's queries see one block of keys.
--train: a training step (backward=True, SGD) instead of a forward.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch  # noqa: E402
from _diffusers_parallel import DTYPES, arguments, parallelize, step  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, IMG, TXT = 1, 32, 8  # tokens: divisible by the ranks (diffusers splits both streams)
# No layouts: diffcheck reads them from the hooks enable_parallelism installs (python/diffcheck/torch/
# diffusers_plan.py). The tokens each rank holds as [its text, its image] (the rotary tables, inside a
# single-stream block) are compared stream by stream: `name[text]`, `name[image]`.


def build(dtype):
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
    g = torch.Generator().manual_seed(1)
    inputs = {"hidden_states": torch.randn(B, IMG, 16, generator=g),
              "encoder_hidden_states": torch.randn(B, TXT, 32, generator=g),
              "pooled_projections": torch.randn(B, 32, generator=g), "timestep": torch.tensor([0.5] * B),
              "img_ids": torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(8.0),
                                                    indexing="ij"), -1).reshape(IMG, 3),
              "txt_ids": torch.zeros(TXT, 3), "return_dict": False}  # diffusers' CP hooks want a tuple out
    return model.to(dtype), {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                             for k, v in inputs.items()}


def work(rank, world, args):
    model, inputs = build(DTYPES[args.dtype])
    parallelize(model, world, args.ring, args.bug, args.mend_ring_backward)
    sgd = (lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) if args.train else None
    opt = sgd(model) if sgd else None
    common = {"backward": args.train}  # diffcheck
    with dct.capture(model, f"{args.out}/sp", f"sp={world}", optimizer=opt, **common):  # diffcheck
        step(model, inputs, opt, sharded=True)
    # Rank 0: the unsharded model in float64, and in the run's dtype (each tap's yardstick).
    dct.references(build, f"{args.out}/ref", dtype=DTYPES[args.dtype], step=step, optimizer=sgd, **common)  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/sp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    a = arguments(__doc__, "dumps/flux_context_parallel")
    launch(work, after, a, a.n)
