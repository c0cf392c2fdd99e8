#!/usr/bin/env python3
"""A small Llama from transformers (random weights) on its own tensor-parallel
plan (`tp_plan="auto"`, DTensor), checked by diffcheck with no `layouts=`.

    python3 examples/llama_tp.py [-n 2] [--train] [--sketch] [--dtype bfloat16]

The model is written to a temporary checkpoint and loaded on every rank with
transformers' plan (q/k/v, gate and up column-parallel, o and down
row-parallel, the embedding and lm_head split over tp); each tap's layout
comes from the parameters' placements (docs/torch.md, "DTensor plans"). The
reference is the same checkpoint unsharded in float64, in one process.
--train: a training step (backward=True, SGD) instead of a forward.

--bug missing_allreduce breaks transformers' own RowwiseParallel
(monkeypatched here): each rank's partial sum of o_proj and down_proj is
handed on as if it were the reduced output. diffcheck names the first
row-parallel layer, `model.layers.0.self_attn.o_proj`. (A fault tried
before, the row-parallel bias kept in the local forward, did not change this
model's result on the CPU: transformers hides the bias there.)

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys
import tempfile

import torch
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def break_rowwise():
    """The fault: transformers' RowwiseParallel skips its reduction (forward and training paths alike)."""
    from torch.distributed.tensor import DTensor, Replicate
    from transformers.distributed import tensor_parallel as tp

    def unreduced(self, module, output, mesh):
        local = output.to_local() if isinstance(output, DTensor) else output
        bias = module._parameters.get("bias")
        if bias is not None and self.should_use_local_tensors(module):
            local = local + (bias.to_local() if isinstance(bias, DTensor) else bias)
        return local if self.use_local_output else DTensor.from_local(local, mesh, [Replicate()], run_check=False)

    tp.RowwiseParallel.transform_output_post_forward = unreduced


def save_model(path):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,  # 4 ranks: 4 KV heads
                         mlp_bias=True)  # no attention bias: k's would have a zero gradient (docs/torch.md, Limits)
    LlamaForCausalLM(config).save_pretrained(path)


def work(rank, world, args):
    from transformers import LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    # transformers applies tp_plan only where these say there are several
    # processes; without them it loads the whole model on every rank, silently.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if args.bug == "missing_allreduce":
        break_rowwise()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    model = LlamaForCausalLM.from_pretrained(args.checkpoint, tp_plan="auto", device_mesh=mesh,
                                             dtype=DTYPES[args.dtype])
    if world > 1 and not hasattr(model.model.layers[0].mlp.down_proj.weight, "placements"):
        raise SystemExit("llama_tp: transformers did not apply its tensor-parallel plan")
    ids = torch.arange(32).reshape(2, 16) % 128
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if args.train else None
    with dct.capture(model, out=f"{args.out}/tp", mesh=f"tp={world}", backward=args.train,  # diffcheck
                     optimizer=opt, sketch=args.sketch):  # diffcheck
        run(model, ids, opt)
    # Rank 0: the unsharded model in float64, and in --dtype (each tap's yardstick).
    dct.references(lambda dt: (LlamaForCausalLM.from_pretrained(args.checkpoint, dtype=dt), (ids,)), f"{args.out}/ref", dtype=DTYPES[args.dtype], step=lambda m, i, optimizer=None: run(m, *i, optimizer), optimizer=(lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) if args.train else None, backward=args.train, sketch=args.sketch)  # noqa: E501  # diffcheck


def run(model, ids, opt):
    if opt is None:
        with torch.no_grad():
            model(ids)
        return
    model(ids, labels=ids).loss.backward()
    opt.step()


def after(args):
    return dct.verdict(f"{args.out}/tp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/llama_tp", dtypes=DTYPES, train=True)
    ap.add_argument("--bug", choices=["missing_allreduce"], help="break transformers' RowwiseParallel")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as checkpoint:
        a.checkpoint = checkpoint
        save_model(checkpoint)
        launch(work, after, a, a.n)
