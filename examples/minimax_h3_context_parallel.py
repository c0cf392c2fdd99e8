#!/usr/bin/env python3
"""diffusers' own context parallelism on a small MiniMaxH3Transformer3DModel
(MiniMax-H3: text, video and audio rows in one packed sequence; random
weights, a tiny config), checked by diffcheck with no layouts.

    python3 examples/minimax_h3_context_parallel.py [-n 2] [--ring R] [--train] [--dtype bfloat16]
                                                    [--bug key_all_to_all_skipped|ring_merge_skipped]

MiniMax-H3 packs 8 text, 24 video and 8 audio rows into one sequence of 40
(their places given by index vectors), with one AdaLN table row per
(timestep, modality) chosen per row. Its plan splits the packed sequence at
the first block, the rotary tables and each block's per-row AdaLN indices
alike, and gathers at the two output heads (flux_context_parallel.py says
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

TEXT, VIDEO, AUDIO = 8, 24, 8  # 40 packed rows: divisible by 2 and 4 ranks, no input as long as a rank's share


def build(dtype):
    from diffusers import MiniMaxH3Transformer3DModel
    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(num_attention_heads=4, attention_head_dim=16, hidden_size=64, num_layers=2,
                                        num_refiner_layers=1, ffn_dim=128, in_channels=4, audio_in_channels=8,
                                        text_dim=32, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=32,
                                        rope_freq_dim=2)
    g = torch.Generator().manual_seed(1)
    seq = TEXT + VIDEO + AUDIO
    tags = torch.cat([torch.ones(TEXT), torch.zeros(VIDEO), 2 * torch.ones(AUDIO)]).long()  # 0 video, 1 text, 2 audio
    t, h, w = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(4), indexing="ij")  # the video's grid
    positions = torch.zeros(seq, 3)
    positions[TEXT:TEXT + VIDEO] = torch.stack([t, h, w], -1).reshape(VIDEO, 3).float()
    positions[:TEXT, 0] = torch.arange(float(TEXT))
    positions[TEXT + VIDEO:, 0] = torch.arange(float(AUDIO))
    inputs = {"hidden_states": torch.randn(1, VIDEO, 16, generator=g),
              "audio_hidden_states": torch.randn(1, AUDIO, 8, generator=g),
              "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
              "timestep": torch.tensor([0.5]), "timestep_indices": torch.zeros(seq, dtype=torch.long),
              "token_tags": tags, "position_ids": positions,
              "video_indices": torch.arange(TEXT, TEXT + VIDEO), "audio_indices": torch.arange(TEXT + VIDEO, seq),
              "text_indices": torch.arange(TEXT), "return_dict": False}  # diffusers' CP hooks want a tuple out
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
    a = arguments(__doc__, "dumps/minimax_h3_context_parallel")
    launch(work, after, a, a.n)
