#!/usr/bin/env python3
"""torchtitan's llama3 debug model (2 layers) parallelized by torchtitan's
own `parallelize_llama`, checked by diffcheck with no layouts.

    python3 examples/torchtitan_llama.py [-n 2] [--parallel tp|fsdp_tp|pp|cp|fsdp_cp|cp_tp] [--train]
                                         [--dtype bfloat16]
                                         [--balance headtail|none]
                                         [--bug wo_unreduced|rope_shift|wrong_samples|keys_not_gathered]

--parallel tp: tensor and sequence parallelism over tp = n (torchtitan's
plan: column/row-parallel projections, SP norms, loss parallel), and FSDP2
at degree 1, which torchtitan always installs for its mixed precision.
--parallel fsdp_tp: FSDP2 over fsdp = n/2 x TP+SP over tp = 2, each fsdp
rank its own samples (the global batch's share of its data index).
--parallel pp (with --train): torchtitan's own pipeline_llm over pp = n
(its split of the layers into stages, parallelize_llama on each part, its
1F1B schedule), the global batch in 4 microbatches of 1 sample; the capture
is of the schedule, each rank its stage's taps, the microbatches laid
together.
--parallel cp: torchtitan's context parallelism over cp = n (its
apply_cp_to_forward: each layer's FlexAttention gathers the keys and values
over cp), the sequence of 128 x n tokens (FlexAttention's CP wants a
multiple of n x its block of 128) sharded by torchtitan's prepare_context_parallel_input with its
default head-tail load balancer (rank r holds chunks r and 2n-1-r of 2n;
--balance none: contiguous shares).
--parallel cp_tp: CP over cp = 2 x TP+SP over tp = n/2. The sequence-parallel
regions hold each rank's tp share of its cp share (the head-tail chunks
split again): laid out over cp*tp in the chunks' order (`block_order`).
--parallel fsdp_cp: FSDP2 over dp_shard = n/2 x the same over cp = 2, each
data index its own samples. torchtitan gives FSDP2 one flattened mesh of
both (`fsdp`); the capture's mesh, read, is dp = n/2 x cp = 2, and a
DTensor on `fsdp` is laid out over dp*cp.

torchtitan's backend is `partial_dtensor` (DTensors over the model-parallel
axes), its mixed precision policy is FSDP2's (parameters float32, compute in
--dtype), and its loss is its own: cross entropy summed over the tokens,
divided by the global batch's token count, the gradients summed over the
data ranks (FSDP2's division turned off). The capture says nothing of it:
the mesh (fsdp=1,tp=2 or fsdp=2,tp=2: torchtitan installs FSDP2 even at
degree 1) is read from the DTensors' DeviceMesh, the convention ("global")
from FSDP2's divide factor, the data axis (fsdp) from FSDP2's mesh, every
layout from the DTensors, and the run's dtype from its taps. The reference is torchtitan's model built
without parallelism, on the global batch, in float64 (its complex RoPE
table complex128) and in --dtype (the yardstick); one SGD step with --train.

torchtitan's CPU patches live in examples/_torchtitan_cpu.py (no triton, no
CUDA, FlexAttention written out eagerly).

--bug wo_unreduced: layer 0's `attention.wo` output is left unreduced (each
rank's partial sum taken as its share): found at layers.0.attention.wo.
--bug rope_shift: the last rank's RoPE positions are one ahead: found at
layers.0.attention.rope (with pp, at the last rank's first layer).
--bug wrong_samples (fsdp_tp): the last data index trains on the first's
samples (a loader's sharding bug): found at the first tap, tok_embeddings.
--bug keys_not_gathered (cp): layer 0's attention skips the keys' and
values' all-gather (each rank attends to its own tokens only): found at
layers.0.attention.inner_attention.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _torchtitan_cpu  # noqa: E402
from _launch import launch, parser  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

LAYERS = 2
SEQ = 32
CP_BLOCK = 128  # FlexAttention under context parallelism: the queries' length a multiple of cp x its block
B_GLOBAL = 4
LR = 0.1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def config():
    """torchtitan's llama3 debug model's config, cut to LAYERS layers, sequence parallel."""
    from torchtitan.models.llama3 import llama3_configs
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config
    cfg = llama3_configs["debugmodel"](attn_backend="flex")
    cfg.layers = cfg.layers[:LAYERS]
    set_llama3_sharding_config(cfg, enable_sp=True)
    return cfg


def global_batch(seq=SEQ):
    """(tokens, labels, positions) of the global batch, the same in every process."""
    g = torch.Generator().manual_seed(1)
    stream = torch.randint(0, config().vocab_size, (B_GLOBAL, seq + 1), generator=g)
    return stream[:, :-1], stream[:, 1:], torch.arange(seq).repeat(B_GLOBAL, 1)


def forward(model, tokens, positions, masks=None):
    """The model on its tokens; `masks`: the attention masks context parallelism sharded (else made here)."""
    return model(tokens, positions, model.get_attention_masks(positions) if masks is None else masks)


def train_step(model, tokens, labels, positions, optimizer, global_tokens, masks=None):
    """torchtitan's step: the summed cross entropy over the global token count, then the update."""
    from torchtitan.components.loss import CrossEntropyLoss
    optimizer.zero_grad()
    logits = forward(model, tokens, positions, masks)
    loss, _ = CrossEntropyLoss(CrossEntropyLoss.Config())(logits, labels, global_tokens)
    loss.backward()
    optimizer.step()


def parallelize(model, world, args):
    """torchtitan's own parallelize_llama: (data degree, this rank's data index)."""
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.llama3 import parallelize_llama
    tp = world if args.parallel == "tp" else 2
    dp = world // tp
    backend = "partial_dtensor"
    dims = ParallelDims(dp_replicate=1, dp_shard=dp, cp=1, tp=tp, pp=1, ep=1, world_size=world,
                        spmd_backend=backend)
    parallelism = ParallelismConfig(spmd_backend=backend, tensor_parallel_degree=tp, data_parallel_shard_degree=dp,
                                    enable_sequence_parallel=True)
    set_spmd_backend(backend)  # as torchtitan's Trainer does
    training = TrainingConfig(mixed_precision_param=args.dtype, mixed_precision_reduce="float32")
    parallelize_llama(model, parallel_dims=dims, training=training, parallelism=parallelism,
                      compile_config=CompileConfig(), ac_config=None, dump_folder=args.out)
    rank = torch.distributed.get_rank()
    return dp, rank // tp


def pipelined(model, world, args, cfg):
    """torchtitan's own pipeline_llm: (its schedule, this rank's model parts, first stage here, last stage here)."""
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.llama3 import parallelize_llama
    backend = "partial_dtensor"
    set_spmd_backend(backend)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=world, ep=1, world_size=world,
                        spmd_backend=backend)
    parallelism = ParallelismConfig(spmd_backend=backend, pipeline_parallel_degree=world,
                                    pipeline_parallel_schedule="1F1B", pipeline_parallel_microbatch_size=1)
    training = TrainingConfig(mixed_precision_param=args.dtype, mixed_precision_reduce="float32",
                              local_batch_size=B_GLOBAL)
    schedule, parts, first, last = pipeline_llm(
        model, parallel_dims=dims, training=training, parallelism=parallelism, compile_config=CompileConfig(),
        ac_config=None, dump_folder=args.out, device=torch.device("cpu"), model_config=cfg,
        parallelize_fn=parallelize_llama, loss_fn=CrossEntropyLoss(CrossEntropyLoss.Config()))
    return schedule, parts, first, last


def pipeline_step(schedule, parts, first, last, tokens, labels, positions, opt):
    """torchtitan's pipelined step: every stage gets the positions and masks, the last the labels."""
    opt.zero_grad()
    masks = parts[0].get_attention_masks(positions)
    schedule.step(*((tokens,) if first else ()), positions=positions, attention_masks=masks,
                  **({"target": labels, "losses": []} if last else {}),
                  loss_kwargs={"global_valid_tokens": labels.numel()})
    opt.step()


def leave_wo_unreduced(model):
    """The injected fault: layer 0's attention.wo output keeps each rank's
    partial sum, taken as its share of the reduced output."""
    from torch.distributed.tensor import DTensor, Shard
    wo = model.layers["0"].attention.wo
    reduce = wo._redistribute_outputs

    def unreduced(parallel_dims, outputs):
        good = reduce(parallel_dims, outputs)
        local = outputs.to_local()
        for axis, placement in enumerate(good.placements):
            if isinstance(placement, Shard):
                size, index = good.device_mesh.size(axis), good.device_mesh.get_local_rank(axis)
                local = local.chunk(size, dim=placement.dim)[index]
        return DTensor.from_local(local.contiguous(), good.device_mesh, good.placements)
    wo._redistribute_outputs = unreduced


def work(rank, world, args):
    _torchtitan_cpu.import_torchtitan()
    cfg = config()
    torch.manual_seed(0)
    model = cfg.build()
    model.init_states(buffer_device=None)
    weights = {k: v.clone() for k, v in model.state_dict().items()}  # the unparallelized model's
    if args.parallel == "pp":
        run_pipelined(model, world, args, cfg)
    elif "cp" in args.parallel:
        run_context_parallel(model, world, args)
    else:
        run_parallelized(model, world, args)

    tokens, labels, positions = global_batch(CP_BLOCK * cp_degree(world, args) if "cp" in args.parallel else SEQ)

    def unparallelized(dt):
        reference = cfg.build()
        reference.load_state_dict(weights)
        return dct.to_dtype(reference, dt), (tokens, positions) if not args.train else (tokens, labels, positions)
    step = (lambda m, b, optimizer: train_step(m, *b, optimizer, labels.numel())) if args.train else (
        lambda m, b: forward(m, *b))
    # Rank 0: the unparallelized model on the global batch in float64, and in --dtype (the yardstick).
    dct.references(unparallelized, f"{args.out}/ref", dtype=DTYPES[args.dtype], step=step, backward=args.train, optimizer=(lambda m: torch.optim.SGD(m.parameters(), lr=LR)) if args.train else None)  # noqa: E501  # diffcheck


def run_pipelined(model, world, args, cfg):
    schedule, parts, first, last = pipelined(model, world, args, cfg)
    tokens, labels, positions = global_batch()
    if args.bug == "rope_shift" and torch.distributed.get_rank() == world - 1:  # the bug: its positions one ahead
        layer = next(iter(parts[0].layers.values()))
        layer.attention.rope.register_forward_pre_hook(lambda m, a: (a[0], a[1], a[2] + 1))
    opt = torch.optim.SGD([p for part in parts for p in part.parameters()], lr=LR)
    with dct.capture(schedule, f"{args.out}/titan", backward=True, optimizer=opt):  # diffcheck
        pipeline_step(schedule, parts, first, last, tokens, labels, positions, opt)


def run_parallelized(model, world, args):
    dp, data_index = parallelize(model, world, args)
    tokens, labels, positions = global_batch()
    if args.bug == "wrong_samples" and data_index == dp - 1:
        data_index = 0  # the bug: the loader hands this data index another one's share
    share = slice(data_index * (B_GLOBAL // dp), (data_index + 1) * (B_GLOBAL // dp))
    local = tokens[share], labels[share], positions[share]
    if args.bug == "rope_shift" and torch.distributed.get_rank() == world - 1:  # the bug: its positions one ahead
        model.layers["0"].attention.rope.register_forward_pre_hook(lambda m, a: (a[0], a[1], a[2] + 1))
    if args.bug == "wo_unreduced":
        leave_wo_unreduced(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR) if args.train else None
    with dct.capture(model, f"{args.out}/titan", backward=args.train, optimizer=opt):  # diffcheck
        if args.train:
            train_step(model, *local, opt, labels.numel())
        else:
            with torch.no_grad():
                forward(model, local[0], local[2])


def cp_degree(world, args):
    return 2 if args.parallel in ("fsdp_cp", "cp_tp") else world


def cp_tp_degree(world, args):
    """cp x tp: the ranks that hold the same samples (torchtitan's batch mesh: dp major, then cp, then tp)."""
    return cp_degree(world, args) * (2 if args.parallel == "cp_tp" else 1)


def context_parallelize(model, world, args):
    """torchtitan's own parallelize_llama with context parallelism over cp (and FSDP2 over the rest): the cp
    mesh."""
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.llama3 import parallelize_llama
    backend = "partial_dtensor"
    set_spmd_backend(backend)
    cp, tp = cp_degree(world, args), cp_tp_degree(world, args) // cp_degree(world, args)
    dp = world // (cp * tp)
    dims = ParallelDims(dp_replicate=1, dp_shard=dp, cp=cp, tp=tp, pp=1, ep=1, world_size=world,
                        spmd_backend=backend)
    parallelism = ParallelismConfig(spmd_backend=backend, context_parallel_degree=cp, tensor_parallel_degree=tp,
                                    data_parallel_shard_degree=dp, enable_sequence_parallel=True)
    training = TrainingConfig(mixed_precision_param=args.dtype, mixed_precision_reduce="float32")
    if args.bug == "keys_not_gathered":  # the bug: layer 0's attention is left out of torchtitan's wrapping
        import torchtitan.models.llama3.parallelize as titan_parallelize
        wrap = titan_parallelize.apply_cp_to_forward
        titan_parallelize.apply_cp_to_forward = lambda modules, mesh: wrap(list(modules)[1:], mesh)
    parallelize_llama(model, parallel_dims=dims, training=training, parallelism=parallelism,
                      compile_config=CompileConfig(), ac_config=None, dump_folder=args.out)
    if args.bug == "keys_not_gathered":
        titan_parallelize.apply_cp_to_forward = wrap
    return dims.get_mesh("cp")


def run_context_parallel(model, world, args):
    from torchtitan.distributed.context_parallel.api import prepare_context_parallel_input
    mesh = context_parallelize(model, world, args)
    cp = cp_degree(world, args)
    tokens, labels, positions = global_batch(CP_BLOCK * cp)
    same = cp_tp_degree(world, args)  # the ranks of one data index (torchtitan's batch mesh: cp, tp the minor axes)
    dp, data_index = world // same, torch.distributed.get_rank() // same
    share = slice(data_index * (B_GLOBAL // dp), (data_index + 1) * (B_GLOBAL // dp))
    tokens, labels, positions = tokens[share], labels[share], positions[share]
    # torchtitan's trainer's sharding of the batch: tokens, labels, positions and the attention masks
    local, local_labels, extra = prepare_context_parallel_input(
        tokens, labels, {"positions": positions, "attention_masks": model.get_attention_masks(positions)}, mesh,
        torch.device("cpu"), None if args.balance == "none" else args.balance)
    opt = torch.optim.SGD(model.parameters(), lr=LR) if args.train else None
    with dct.capture(model, f"{args.out}/titan", backward=args.train, optimizer=opt):  # diffcheck
        if args.train:
            train_step(model, local, local_labels, extra["positions"], opt, labels.numel() * dp,
                       extra["attention_masks"])
        else:
            with torch.no_grad():
                forward(model, local, extra["positions"], extra["attention_masks"])


def after(args):
    return dct.verdict(f"{args.out}/titan", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/torchtitan_llama", n=2, dtypes=DTYPES, sketch=False, train=True)
    ap.add_argument("--bug", choices=["wo_unreduced", "rope_shift", "wrong_samples", "keys_not_gathered"],
                    help="wo_unreduced: layer 0's attention output unreduced; rope_shift: the last rank's "
                         "positions one ahead; wrong_samples (fsdp_tp): the last data index reads the first's; "
                         "keys_not_gathered (cp): layer 0's attention sees its own tokens' keys only")
    ap.add_argument("--parallel", choices=["tp", "fsdp_tp", "pp", "cp", "fsdp_cp", "cp_tp"], default="tp",
                    help="TP+SP over tp = n (default), FSDP2 over fsdp = n/2 x TP+SP over tp = 2, torchtitan's "
                         "pipeline over pp = n (1F1B, with --train), its context parallelism over cp = n, or FSDP2 "
                         "over n/2 x CP over 2, or CP over 2 x TP+SP over n/2")
    ap.add_argument("--balance", choices=["headtail", "none"], default="headtail",
                    help="--parallel cp: torchtitan's load balancer (default headtail, its default) or none")
    a = ap.parse_args()
    if (a.bug == "keys_not_gathered") != (a.bug is not None and "cp" in a.parallel) and a.bug is not None:
        ap.error("--bug keys_not_gathered is a fault of --parallel cp, and --parallel cp has no other --bug")
    if a.parallel in ("fsdp_tp", "fsdp_cp", "cp_tp") and (a.n % 2 or B_GLOBAL % (a.n // 2)):
        ap.error(f"--parallel {a.parallel}: -n must be even with n/2 dividing the global batch of {B_GLOBAL}")
    if a.parallel == "pp" and (not a.train or a.bug == "wo_unreduced"):
        ap.error("--parallel pp runs torchtitan's pipelined training step: give --train (and no --bug wo_unreduced)")
    if a.bug == "wrong_samples" and a.parallel != "fsdp_tp":
        ap.error("--bug wrong_samples needs data parallelism: --parallel fsdp_tp")
    launch(work, after, a, a.n)
