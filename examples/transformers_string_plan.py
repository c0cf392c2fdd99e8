#!/usr/bin/env python3
"""A small Qwen3 from transformers 5.x before DTensor weights (5.15: its
`tp_plan` strings on plain tensors), on its own tensor-parallel plan,
checked by diffcheck with no `layouts=`.

    PYTHONPATH=<transformers 5.15> python3 examples/transformers_string_plan.py [-n 2] [--train] [--dtype bfloat16]

transformers 5.15 loads the model with `distributed_config=
DistributedConfig(tp_size=n)` and its plan: q/k/v, gate and up "colwise",
o and down "rowwise", the per-head q_norm and k_norm
"replicated_with_grad_allreduce", lm_head "colwise_gather_output". Every
weight and activation stays a plain local tensor; diffcheck reads the
layouts from transformers' own tensor-parallel layers on each module
(python/diffcheck/torch/transformers_plan.py). The reference is the same
checkpoint unsharded in float64, in one process. --train: a training step
(backward=True, SGD) instead of a forward. The suite installs transformers
5.15.1 apart (scripts/transformers_515.sh) and puts it first on PYTHONPATH.

--bug missing_allreduce: transformers' RowwiseParallel hands each rank's
partial sum on unreduced (monkeypatched here): diffcheck names the first
row-parallel layer, `model.layers.0.self_attn.o_proj`.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402
from llama_tp import run  # noqa: E402  (a forward, or a training step with the model's own loss)

import diffcheck.torch as dct  # noqa: E402  # diffcheck

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def string_plans():
    """transformers' DistributedConfig where it has the 5.x string plans, else None."""
    try:
        from transformers.distributed import DistributedConfig
        from transformers.integrations import tensor_parallel
    except ImportError:
        return None
    import transformers
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    # 5.16 on keep the weights as DTensors (llama_tp.py): its plan is no longer these strings' layers, and
    # --bug's patch of RowwiseParallel would break nothing there
    return DistributedConfig if hasattr(tensor_parallel, "TensorParallelLayer") and major_minor <= (5, 15) else None


def break_rowwise():
    """The fault: RowwiseParallel's output skips its all-reduce (the bias still added)."""
    from transformers.integrations import tensor_parallel as tp

    def unreduced(self, mod, outputs, device_mesh):
        bias = getattr(mod, "_bias", None)
        return outputs if bias is None else outputs + bias
    tp.RowwiseParallel._prepare_output_fn = unreduced


def save_model(path):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=8, max_position_embeddings=64)
    Qwen3ForCausalLM(config).save_pretrained(path)


def work(rank, world, args):
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))  # transformers reads them
    if args.bug == "missing_allreduce":
        break_rowwise()
    model = Qwen3ForCausalLM.from_pretrained(args.checkpoint, distributed_config=string_plans()(tp_size=world),
                                             dtype=DTYPES[args.dtype])
    ids = torch.arange(32).reshape(2, 16) % 128
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if args.train else None
    with dct.capture(model, out=f"{args.out}/tp", mesh=f"tp={world}", backward=args.train, optimizer=opt):  # diffcheck
        run(model, ids, opt)
    # Rank 0: the unsharded model in float64, and in --dtype (each tap's yardstick).
    dct.references(lambda dt: (Qwen3ForCausalLM.from_pretrained(args.checkpoint, dtype=dt), (ids,)), f"{args.out}/ref", dtype=DTYPES[args.dtype], step=lambda m, i, optimizer=None: run(m, *i, optimizer), optimizer=(lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) if args.train else None, backward=args.train)  # noqa: E501  # diffcheck


def after(args):
    return dct.verdict(f"{args.out}/tp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/transformers_string_plan", dtypes=DTYPES, sketch=False, train=True)
    ap.add_argument("--bug", choices=["missing_allreduce"], help="break transformers' RowwiseParallel")
    a = ap.parse_args()
    if string_plans() is None:
        import transformers
        sys.exit(f"transformers_string_plan: transformers {transformers.__version__} has no string tensor-parallel "
                 "plans on plain tensors (5.x up to 5.15 has): run scripts/transformers_515.sh and put the folder "
                 "it prints first on PYTHONPATH")
    with tempfile.TemporaryDirectory() as checkpoint:
        a.checkpoint = checkpoint
        save_model(checkpoint)
        launch(work, after, a, a.n)
