"""torchtitan 0.3.0 on a CPU with gloo: five patches, each torchtitan's
business and not diffcheck's (diffcheck runs its model as it is).

1. `torchtitan.models.common` imports its expert-parallel triton kernels at
   import time; there is no triton on a CPU machine. Those kernels serve only
   expert parallelism (MoE), which a dense llama3 never calls: a stand-in
   module takes their names and raises if one is ever called.
2. `ParallelDims` builds its meshes on "cuda" when no accelerator is found
   (`torchtitan.tools.utils.device_type`); on this machine they are "cpu".
3. Its attention is FlexAttention under torch.compile, and torch's
   FlexAttention has no backward on the CPU. `_compiled_flex_attn` is
   replaced by the same attention written out eagerly (scores, the
   BlockMask's mask made dense, softmax in float32, the log-sum-exp aux),
   so the run, the reference and the yardstick all compute it the same way.
4. torchtitan turns FSDP2's gradient division off (`set_gradient_divide_factor(1.0)`:
   its loss is already divided by the global token count), which makes FSDP2
   reduce with PREMUL_SUM, an op gloo does not have. FSDP2's own
   `set_force_sum_reduction_for_comms(True)` reduces with SUM and scales by
   the same factor (1) after: the same gradients.
5. It makes its BlockMasks with `torch.compile(create_block_mask)`. On the
   CPU, Inductor's code for it fails to compile (`operands to '?:' have
   different types`) once a second batch size makes the shapes dynamic (a
   data rank's share, then the reference's whole batch); torch's own
   create_block_mask, uncompiled, makes the same masks.
"""
import importlib.util
import sys
import types

import torch

_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
_KERNEL_NAMES = ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                 "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                 "reduce_topk_slots_kernel", "topk_scores_grad_kernel")


def _needs_triton(*_args, **_kwargs):
    raise RuntimeError("torchtitan's expert-parallel kernels need triton, which this CPU machine does not have")


def eager_flex_attention(q, k, v, *, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                         return_aux=None, kernel_options=None):
    """FlexAttention's math on (batch, heads, length, head_dim) tensors, eagerly."""
    from torch.nn.attention.flex_attention import AuxOutput, create_mask
    if score_mod is not None:
        raise NotImplementedError("the eager CPU stand-in of FlexAttention takes no score_mod")
    if enable_gqa and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)).float() * scale
    if block_mask is not None:
        mask = create_mask(block_mask.mask_mod, q.shape[0], None, q.shape[2], k.shape[2], device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1).to(q.dtype) @ v
    lse = torch.logsumexp(scores, dim=-1) if return_aux is not None and return_aux.lse else None
    return out, AuxOutput(lse=lse)


def import_torchtitan():
    """Imports torchtitan's llama3 with the patches in place."""
    if importlib.util.find_spec("triton") is None and _KERNELS not in sys.modules:
        stand_in = types.ModuleType(_KERNELS)
        for name in _KERNEL_NAMES:
            setattr(stand_in, name, _needs_triton)
        sys.modules[_KERNELS] = stand_in
    import torchtitan.distributed.fsdp as titan_fsdp
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.models.llama3  # noqa: F401
    from torchtitan.models.common.attention import FlexAttention
    if not torch.cuda.is_available():
        parallel_dims.device_type = "cpu"
        FlexAttention._compiled_flex_attn = staticmethod(eager_flex_attention)
        import torchtitan.models.common.attention as titan_attention
        from torch.nn.attention.flex_attention import create_block_mask
        titan_attention._compiled_create_block_mask = create_block_mask
        titan_fsdp.disable_fsdp_gradient_division = _divide_by_one_with_sums(titan_fsdp.disable_fsdp_gradient_division)


def _divide_by_one_with_sums(disable_division):
    def patched(model):
        disable_division(model)
        from torch.distributed.fsdp import FSDPModule
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return patched
