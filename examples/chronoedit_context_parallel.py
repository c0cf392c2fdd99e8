#!/usr/bin/env python3
"""diffusers' own context parallelism on a small ChronoEditTransformer3DModel
(ChronoEdit: Wan 2.1's video DiT with its own temporal rotary table; random
weights, a tiny config), checked by diffcheck as wan_context_parallel.py
checks Wan: the same blocks, plan, faults and command line, and the same
diffcheck lines (they are wan_context_parallel.py's).

    python3 examples/chronoedit_context_parallel.py [-n 2] [--ring R] [--train] [--dtype bfloat16]
                                                    [--bug key_all_to_all_skipped|ring_merge_skipped]

Faults found at the first self-attention's output, blocks.0.attn1.to_out.0.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wan_context_parallel as wan  # noqa: E402
from _launch import launch  # noqa: E402
from _diffusers_parallel import arguments  # noqa: E402

wan.MODEL = ("ChronoEditTransformer3DModel", {"num_layers": 2, "rope_max_seq_len": 64})  # at import: every rank

if __name__ == "__main__":
    a = arguments(__doc__, "dumps/chronoedit_context_parallel")
    launch(wan.work, wan.after, a, a.n)
