#!/usr/bin/env python3
"""Megatron-core's own GPTModel under tensor parallelism (and sequence
parallelism with --sp), checked by diffcheck with no layouts.

    python3 examples/megatron_gpt.py -n 2 [--sp] [--train] [--bug ...] [--dtype bfloat16]
    torchrun --nproc-per-node 2 examples/megatron_gpt.py [...]

A tiny GPT (2 layers, hidden 64, 4 heads, RoPE, vocabulary 128) from
Megatron's local layer spec, tp = the ranks. diffcheck reads its layouts from
what Megatron says of itself: its parallel layers' kinds (column-parallel
outputs split along the features, row-parallel ones reduced, or under
sequence parallelism reduce-scattered along the sequence), its parameters'
`tensor_model_parallel` and `partition_dim`, and its tp group. The
reference is the same GPTModel built by Megatron at tp=1 with the run's
weights gathered, in one process. The training step runs under Megatron's
DistributedDataParallel and finalize_model_grads; its optimizer allocates on
CUDA, so torch's SGD steps on the gradients Megatron's would take.

--bug row_reduction_dropped    layer 0's attention projection (a
    RowParallelLinear) leaves out its reduction: each rank keeps its partial
    sum. Found at decoder.layers.0.self_attention.linear_proj.
--bug sp_gather_wrong_dim      (--sp) layer 0's linear_fc1 gathers its
    sequence-parallel input along the batch, not the sequence, into the
    buffer of the whole sequence: its tokens scrambled, found at
    decoder.layers.0.mlp.linear_fc1.
--bug sp_norm_grads_not_reduced  (--sp --train) the step syncs the
    data-parallel gradients (Megatron DDP's finish_grad_sync) but not
    finalize_model_grads' all-reduce over tp of those Megatron marks
    `sequence_parallel` (the norms', the row-parallel biases'): found at the
    first such param_grad/ tap.

Megatron on a CPU needs three patches of Megatron's (examples/_megatron_cpu.py),
none of the math. The lines diffcheck adds end in `# diffcheck`; exit 1 when
it finds a divergence.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402
from _megatron_cpu import patch_megatron_for_cpu  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, S, VOCAB, LR = 2, 16, 128, 0.5
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUGS = ("row_reduction_dropped", "sp_gather_wrong_dim", "sp_norm_grads_not_reduced")


def gpt(tp, sp, dtype):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, tensor_model_parallel_size=tp,
                               sequence_parallel=sp, use_cpu_initialization=True, params_dtype=dtype,
                               bf16=dtype == torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0)
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                    max_sequence_length=S, position_embedding_type="rope")


def batch(train):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, S), generator=g)
    inputs = {"input_ids": ids, "position_ids": torch.arange(S).expand(B, S),
              "attention_mask": torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), 1)}  # True: masked out
    if train:
        inputs["labels"] = torch.roll(ids, -1, dims=1)
    return inputs


def gathered_weights(model, tp):
    """Every parameter whole (its tensor-parallel shares laid together), on every rank."""
    whole = {}
    for name, p in model.named_parameters():
        if getattr(p, "tensor_model_parallel", False):
            parts = [torch.empty_like(p) for _ in range(tp)]
            dist.all_gather(parts, p.detach().contiguous())
            whole[name] = torch.cat(parts, dim=p.partition_dim).double()
        else:
            whole[name] = p.detach().double().clone()
    return whole


def inject(model, bug, rank, tp):
    layer = model.decoder.layers[0]
    if bug == "row_reduction_dropped":
        without_reduction(layer.self_attention.linear_proj, rank, tp)
    elif bug == "sp_gather_wrong_dim":
        gathered_along_batch(layer.mlp.linear_fc1)


def without_reduction(linear, rank, tp):
    """A RowParallelLinear with its reduction left out: each rank keeps its
    partial sum (under SP, its share of the sequence of it)."""
    import megatron.core.tensor_parallel.layers as layers
    inner = linear.forward

    def forward(*args, **kwargs):
        saved = layers.reduce_scatter_to_sequence_parallel_region, layers.reduce_from_tensor_model_parallel_region
        layers.reduce_scatter_to_sequence_parallel_region = lambda t, group=None, **kw: t.chunk(tp)[rank]
        layers.reduce_from_tensor_model_parallel_region = lambda t, group=None, **kw: t
        try:
            return inner(*args, **kwargs)
        finally:
            layers.reduce_scatter_to_sequence_parallel_region, layers.reduce_from_tensor_model_parallel_region = saved
    linear.forward = forward


def gathered_along_batch(linear):
    """A sequence-parallel ColumnParallelLinear whose input is all-gathered
    along the batch (dimension 1) into the buffer of the whole sequence: the
    shape it expects, the tokens scrambled."""
    from torch.distributed.nn.functional import all_gather
    inner = linear.forward

    def forward(x, *args, **kwargs):
        linear.sequence_parallel = False  # gathered here
        try:
            gathered = torch.cat(all_gather(x), dim=1)  # [s/tp, tp*b, h], read as the [s, b, h] it expects
            return inner(gathered.reshape(-1, *x.shape[1:]), *args, **kwargs)
        finally:
            linear.sequence_parallel = True
    linear.forward = forward


def work(rank, world, args):
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    patch_megatron_for_cpu()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)  # every rank draws the whole weights and keeps its share (use_cpu_initialization)
    model = gpt(world, args.sp, dtype)
    inject(model, args.bug, rank, world)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)  # grads into main_grad
    inputs = batch(args.train)
    opt = torch.optim.SGD(model.parameters(), lr=LR)  # Megatron's own optimizer allocates on CUDA
    whole = gathered_weights(model, world)
    with dct.capture(model, f"{args.out}/megatron", mesh=f"tp={world}", backward=args.train, optimizer=opt if args.train else None):  # noqa: E501  # diffcheck
        out = ddp(**inputs)
        if args.train:
            out.float().mean().backward()
            if args.bug == "sp_norm_grads_not_reduced":
                ddp.finish_grad_sync()  # the data-parallel reduction only, not the sequence-parallel one
            else:
                finalize_model_grads([ddp])  # also all-reduces the grads of the sequence-parallel region over tp
            for p in model.parameters():  # as Megatron's optimizer takes them
                p.grad = p.main_grad
            opt.step()
    parallel_state.destroy_model_parallel()  # the reference: Megatron's model at tp=1, in one process
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    dct.references(lambda dt: (reference(whole, dt), batch(args.train)), f"{args.out}/ref", dtype=dtype, backward=args.train, step=reference_step if args.train else None, optimizer=(lambda m: torch.optim.SGD(m.parameters(), lr=LR)) if args.train else None)  # noqa: E501  # diffcheck


def reference(whole, dtype):
    model = gpt(1, False, torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(whole[name].float())
    return dct.to_dtype(model, dtype)  # diffcheck


def reference_step(model, inputs, optimizer):
    model(**inputs).float().mean().backward()
    optimizer.step()


def after(args):
    return dct.verdict(f"{args.out}/megatron", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/megatron_gpt", dtypes=DTYPES, sketch=False, train=True)
    ap.add_argument("--sp", action="store_true", help="Megatron's sequence parallelism over the tp ranks")
    ap.add_argument("--bug", choices=BUGS, help="the tensor-parallel bug to inject")
    a = ap.parse_args()
    if a.bug in ("sp_gather_wrong_dim", "sp_norm_grads_not_reduced") and not a.sp:
        ap.error(f"--bug {a.bug} needs --sp")
    if a.bug == "sp_norm_grads_not_reduced" and not a.train:
        ap.error("--bug sp_norm_grads_not_reduced needs --train")
    launch(work, after, a, a.n)
