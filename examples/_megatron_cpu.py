"""Megatron-core on a CPU with gloo ranks: patches of Megatron's, not
diffcheck's (examples/megatron_gpt.py). None of them touches the math:

1. Megatron's torch-norm wrapper refuses sequence parallelism without apex or
   Transformer Engine; here it builds torch's own LayerNorm or RMSNorm and
   marks its parameters `sequence_parallel`, as apex's FusedLayerNorm does
   (the mark that tells Megatron to all-reduce their gradients over tp).
2. Megatron allocates its collectives' outputs on `torch.cuda.current_device()`:
   here that is the CPU.
3. Megatron forks its CUDA RNG tracker around dropout; with no CUDA there is
   no state to fork (the example's dropout is 0)."""
import contextlib

import torch


def patch_megatron_for_cpu():
    from megatron.core.tensor_parallel import random as megatron_random
    from megatron.core.transformer import torch_norm

    def norm(cls, config, hidden_size, eps=1e-5, **ignored):
        kind = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        built = kind(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in built.parameters():
            p.sequence_parallel = config.sequence_parallel
        return built
    torch_norm.WrappedTorchNorm.__new__ = norm
    torch.cuda.current_device = lambda: torch.device("cpu")
    megatron_random.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
