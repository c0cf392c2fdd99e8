#!/usr/bin/env python3
"""diffusers' own context parallelism on a small HeliosTransformer3DModel
(Helios: a Wan-based video DiT; random weights, a tiny width), checked by
diffcheck as wan_context_parallel.py checks Wan: the same command line,
faults and diffcheck lines (they are wan_context_parallel.py's).

    python3 examples/helios_context_parallel.py [-n 2] [--ring R] [--dtype bfloat16]
                                                [--bug key_all_to_all_skipped|ring_merge_skipped]

Helios's plan is unlike Wan's: each attention and feed-forward splits its
own input and gathers its own output, so the values between them are whole
on every rank. Its plan names blocks 0 to 39 one by one, so the model has 40
blocks (diffusers refuses fewer: "'2' is not a submodule of 'ModuleList'").
Faults found at the first self-attention's output, blocks.0.attn1.to_out.0.

--train runs, and FAILS, rightly: the parameters applied to the whole
values between the modules (the modulation tables, the patch embedding) get
the whole gradient on every rank, and the gradients of those values mix a
whole part (the residual path) with each rank's own tokens' part (the split
path), so no one reduction of the ranks' gradients is the model's, and the
sum the example makes (as DDP would) is not (docs/torch.md: diffusers'
context parallelism is for inference, and Helios's plan only so).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wan_context_parallel as wan  # noqa: E402
from _launch import launch  # noqa: E402
from _diffusers_parallel import arguments  # noqa: E402

# 40 blocks (its plan's), rotary parts of the 16-wide heads, no multi-term memory patches: at import, every rank
wan.MODEL = ("HeliosTransformer3DModel", {"num_layers": 40, "rope_dim": (4, 6, 6), "has_multi_term_memory_patch": False})

if __name__ == "__main__":
    a = arguments(__doc__, "dumps/helios_context_parallel")
    launch(wan.work, wan.after, a, a.n)
