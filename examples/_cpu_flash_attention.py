"""torch's CPU flash-attention kernel, made the CPU kernel of
`aten::_scaled_dot_product_flash_attention` and its backward.

diffusers' ring attention merges the blocks of keys by their log-sum-exp, so
it runs only on a backend that returns one. Of those, `_native_flash` calls
`torch.ops.aten._scaled_dot_product_flash_attention`, which torch's CPU build
implements under another name (`..._for_cpu`, the kernel
`F.scaled_dot_product_attention` uses on the CPU). Registering that kernel
for the CPU is all it takes: the ring, its merge and its backward stay
diffusers' own code, the code being checked. Not diffcheck's business: a
stand-in for a GPU, as `_launch.py` is for a cluster."""
import torch

_library = None


def _forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=None, scale=scale)
    unused = query.new_empty(0)  # the CUDA kernel's sequence offsets and random state: none here
    return out, lse, unused, unused, query.shape[2], key.shape[2], unused, unused, unused


def _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
              dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=scale)


def install():
    """Once per process; the registration lasts as long as it."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("_scaled_dot_product_flash_attention", _forward, "CPU")
        _library.impl("_scaled_dot_product_flash_attention_backward", _backward, "CPU")
