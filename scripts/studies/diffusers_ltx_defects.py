#!/usr/bin/env python3
"""Two defects of diffusers 0.42.1's context parallelism on LTX-Video, shown
with no diffcheck in the process: examples/ltx_context_parallel.py's model
built and parallelized (Ulysses over 2 gloo ranks) and run as is.

  1. a forward with a text mask stops in the attention (the mask broadcast
     over all heads, the attention running on each rank's share of them);
  2. a training step with no mask stops in TemplatedUlyssesAttention's
     backward (the cross-attention's key and value gradients reshaped with
     the query's length).

    .venv/bin/python scripts/studies/diffusers_ltx_defects.py      (about 10 s; prints each outcome)"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from _launch import launch, parser  # noqa: E402
from _diffusers_parallel import parallelize, step  # noqa: E402
import ltx_context_parallel as ltx  # noqa: E402


def attempt(rank, what, run):
    try:
        run()
        said = "ran"
    except RuntimeError as e:
        said = f"stopped: {str(e).splitlines()[0]}"
    if rank == 0:
        print(f"{what}: {said}", flush=True)


def work(rank, world, args):
    def forward_with_mask():
        model, inputs = ltx.build(torch.float32, masked=True)
        parallelize(model, world, 1)
        step(model, inputs, None, sharded=True)

    def training_step():
        model, inputs = ltx.build(torch.float32, masked=False)
        parallelize(model, world, 1)
        step(model, inputs, torch.optim.SGD(model.parameters(), lr=0.1), sharded=True)
    attempt(rank, "Ulysses forward with a text mask", forward_with_mask)
    attempt(rank, "Ulysses training step, no mask", training_step)


if __name__ == "__main__":
    a = parser(__doc__, "/tmp/diffusers_ltx_defects", sketch=False).parse_args()
    launch(work, lambda _: 0, a, a.n)
