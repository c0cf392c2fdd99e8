#!/usr/bin/env python3
"""diffusers' own tensor parallelism on a small FluxTransformer2DModel (random
weights, a tiny config), checked by diffcheck.

    python3 examples/flux_tensor_parallel.py [-n 2] [--train] [--dtype bfloat16]
                                             [--bug packed_rows_split_plainly]

Every rank builds the same model and hands it to diffusers:
`model.enable_parallelism(config=TensorParallelConfig(tp_degree=N))`, which
applies FLUX's `_tp_plan` with torch's parallelize_module: q, k, v and the
MLPs' first layers column-parallel, the attention outputs and the MLPs'
second layers row-parallel, and a single-stream block's fused output
projection (its input is [attention, MLP]) row-parallel block by block
(diffusers' PackedRowwiseParallel). The capture has no `layouts=`: the
layouts come from the plan, and from it the modules that wrap a
column-parallel layer (GELU(proj), a single block's attention, the q/k norms
on its heads: python/diffcheck/torch/dtensor_plan.py); the fused projection's
packed weight, split block by block, which its DTensor does not say, is
compared block by block (`param/...proj_out.weight[0]`, `[1]`: the `streams`
attribute, docs/FORMAT.md). The reference is the same model unsharded in
float64.

diffusers refuses tensor parallelism on a CPU device (its supported list is
cuda, neuron, tpu, xpu); the example adds "cpu" to that list, and, as for
context parallelism, says torch.accelerator has 1 device.

--bug packed_rows_split_plainly: the fused projection's weight split in
plain halves of its columns rather than block by block (diffusers' packed
blocks ignored), so each rank multiplies its [attention, MLP] pieces by the
wrong columns. diffcheck names single_transformer_blocks.0.proj_out.
--train: a training step (backward=True, SGD) instead of a forward. It does
not pass, and not for a fault of diffcheck's: the q/k norms' weights are
plain (replicated) parameters applied to each rank's heads, so each rank's
gradient of them is a partial sum, which nothing in diffusers' plan reduces;
diffcheck names param_grad/transformer_blocks.0.attn.norm_q.weight, its
replicas differing, and after the update the replicas of those weights have
drifted apart (docs/torch.md).

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402
from _diffusers_parallel import DTYPES, step  # noqa: E402
from flux_context_parallel import build  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck



def parallelize(model, world, bug):
    from diffusers import TensorParallelConfig
    from diffusers.hooks import tensor_parallel
    from diffusers.utils import logging
    logging.set_verbosity_error()
    tensor_parallel._SUPPORTED_TP_DEVICES += ("cpu",)  # see above
    torch.accelerator.device_count = lambda: 1  # the CPU build says 0
    if bug:  # every packed projection split as one block
        tensor_parallel._packed_blocks = lambda style, module, path: [1]
    model.enable_parallelism(config=TensorParallelConfig(tp_degree=world))


def work(rank, world, args):
    model, inputs = build(DTYPES[args.dtype])
    parallelize(model, world, args.bug)
    sgd = (lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) if args.train else None
    opt = sgd(model) if sgd else None
    with dct.capture(model, f"{args.out}/tp", f"tp={world}", optimizer=opt, backward=args.train):  # diffcheck
        step(model, inputs, opt)
    # Rank 0: the unsharded model in float64, and in the run's dtype (each tap's yardstick).
    dct.references(build, f"{args.out}/ref", dtype=DTYPES[args.dtype], step=step, optimizer=sgd, backward=args.train)  # noqa: E501  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/tp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/flux_tensor_parallel", dtypes=DTYPES, sketch=False, train=True)
    ap.add_argument("--bug", choices=["packed_rows_split_plainly"], help="break diffusers' packed row split")
    a = ap.parse_args()
    launch(work, after, a, a.n)
