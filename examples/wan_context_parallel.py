#!/usr/bin/env python3
"""diffusers' own context parallelism on a small WanTransformer3DModel (the
video DiT of Wan 2.1; random weights, a tiny config), checked by diffcheck.

    python3 examples/wan_context_parallel.py [-n 2] [--ring R] [--train] [--dtype bfloat16]
                                             [--bug key_all_to_all_skipped|ring_merge_skipped]

Every rank builds the same model and hands it to diffusers, as
flux_context_parallel.py does. diffusers' plan for Wan splits the video
tokens at the first block's input and the rotary tables alike, leaves the
text whole (each rank's cross-attention sees all of it) and gathers the
tokens at proj_out. The self-attention runs Ulysses, ring or both; the
cross-attention runs unsharded. The reference is the same model unsharded
in float64, in one process. On the CPU, Ulysses runs on diffusers' `native`
attention backend and ring attention on `_native_flash` (_diffusers_parallel.py).

Faults in diffusers' attention (monkeypatched), found at the first
self-attention's output, blocks.0.attn1.to_out.0:
  key_all_to_all_skipped  Ulysses: the keys' all-to-all is skipped.
  ring_merge_skipped      ring: the blocks of keys not merged by their LSE.
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

FRAMES, SIDE, TXT = 2, 8, 12  # 2 x 4 x 4 = 32 video tokens after the 1x2x2 patches: divisible by the ranks
# The model class and what its config adds: chronoedit_context_parallel.py and helios_context_parallel.py
# build their Wan-based models alike.
MODEL = ("WanTransformer3DModel", {"num_layers": 2, "rope_max_seq_len": 64})


def build(dtype):
    import diffusers
    torch.manual_seed(0)
    name, extra = MODEL
    model = getattr(diffusers, name)(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16,
                                     in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=128, **extra)
    g = torch.Generator().manual_seed(1)
    inputs = {"hidden_states": torch.randn(1, 4, FRAMES, SIDE, SIDE, generator=g),
              "encoder_hidden_states": torch.randn(1, TXT, 32, generator=g),
              "timestep": torch.tensor([500])}
    return model.to(dtype), {**{k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()},
                             "return_dict": False}  # diffusers' CP hooks want a tuple out


def work(rank, world, args):
    model, inputs = build(DTYPES[args.dtype])
    parallelize(model, world, args.ring, args.bug, args.mend_ring_backward)
    sgd = (lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) if args.train else None
    opt = sgd(model) if sgd else None
    with dct.capture(model, f"{args.out}/sp", f"sp={world}", backward=args.train,  # diffcheck
                     optimizer=opt):  # diffcheck
        step(model, inputs, opt, sharded=True)
    # Rank 0: the unsharded model in float64, and in the run's dtype (each tap's yardstick).
    dct.references(build, f"{args.out}/ref", dtype=DTYPES[args.dtype], step=step, optimizer=sgd, backward=args.train)  # noqa: E501  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/sp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    a = arguments(__doc__, "dumps/wan_context_parallel")
    launch(work, after, a, a.n)
