#!/usr/bin/env python3
"""diffusers' own context parallelism on a small LTX2VideoTransformer3DModel
(LTX-2: video and audio streams with cross-attention between them; random
weights, a tiny config), checked by diffcheck with no layouts.

    python3 examples/ltx2_context_parallel.py [-n 2] [--ring R] [--dtype bfloat16]
                                              [--bug key_all_to_all_skipped|ring_merge_skipped]

LTX-2's plan splits the video tokens, the text and its mask at the model's
input and the video rotary tables, and gathers at proj_out; the audio stream
stays whole on every rank.

diffusers 0.42.1's plan misses the rotary tables of the audio-video
cross-attention (`cross_attn_rope`, built from the video's coordinates), so
the first block stops in `audio_to_video_attn` ("The size of tensor a (16)
must match the size of tensor b (32)"): mend_cross_attn_rope() adds them to
the plan, split as `rope`'s are. That is diffusers', not diffcheck's.

What runs, and what diffcheck says (docs/torch.md):
  Ulysses, forward: clean; the Ulysses fault found at transformer_blocks.0.attn1.to_out.0.
  a ring: the audio stream's video-to-audio attention differs between the
    ranks by rounding (72 ULP): each rank merges the video's key blocks in
    its own order, so the replicated audio is no longer bitwise replicated
    (the reference agrees within tolerance); a replica FAIL, rightly.
  --train on Ulysses stops in diffusers' Ulysses backward (as LTX-Video's
    does: ltx_context_parallel.py).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch  # noqa: E402
from _diffusers_parallel import DTYPES, arguments, parallelize, step  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, F, H, W, TXT, AUDIO, AUDIO_TXT = 1, 2, 4, 4, 8, 12, 6  # 32 video tokens, 8 text; 12 audio frames, 6 text


def build(dtype):
    from diffusers import LTX2VideoTransformer3DModel
    torch.manual_seed(0)
    model = LTX2VideoTransformer3DModel(in_channels=16, out_channels=16, num_attention_heads=4, attention_head_dim=16,
                                        cross_attention_dim=64, audio_in_channels=8, audio_out_channels=8,
                                        audio_num_attention_heads=4, audio_attention_head_dim=8,
                                        audio_cross_attention_dim=32, num_layers=2, caption_channels=32)
    g = torch.Generator().manual_seed(1)
    inputs = {"hidden_states": torch.randn(B, F * H * W, 16, generator=g),
              "audio_hidden_states": torch.randn(B, AUDIO, 8, generator=g),
              "encoder_hidden_states": torch.randn(B, TXT, 32, generator=g),
              "audio_encoder_hidden_states": torch.randn(B, AUDIO_TXT, 32, generator=g),
              "timestep": torch.tensor([500] * B), "encoder_attention_mask": None,  # the plan's hook wants it named
              "num_frames": F, "height": H, "width": W, "audio_num_frames": AUDIO,
              "return_dict": False}  # diffusers' CP hooks want a tuple out
    return model.to(dtype), {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                             for k, v in inputs.items()}


def mend_cross_attn_rope(model):
    """diffusers': the audio-video cross-attention's rotary tables split as the video's own."""
    from diffusers.models._modeling_parallel import ContextParallelInput
    split = ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)
    model._cp_plan = {**type(model)._cp_plan, "cross_attn_rope": {0: split, 1: split}}


def work(rank, world, args):
    model, inputs = build(DTYPES[args.dtype])
    mend_cross_attn_rope(model)
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
    a = arguments(__doc__, "dumps/ltx2_context_parallel")
    launch(work, after, a, a.n)
