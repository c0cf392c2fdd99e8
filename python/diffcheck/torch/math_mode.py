"""The math a PyTorch run does beyond its tensors' dtype, as one root
attribute (`math`, docs/FORMAT.md): TF32 matmuls and convolutions, the
float32 matmul precision, autocast. A float32 tap computed with TF32 inputs
carries 10-bit mantissas' rounding, 2^13 times float32's; an autocast tap
bfloat16's. Recorded when a capture starts, so that a report can tell a
yardstick of the run's own math from one of its storage dtype."""
import torch

def _autocast_dtype(device):
    """The autocast dtype in force for `device` ("cpu", "cuda"), or None."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        try:
            on = torch.is_autocast_enabled(device)
        except TypeError:
            on = None
        if on is not None:
            return torch.get_autocast_dtype(device) if on else None
    if device == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def math_mode(device=None):
    """`name=value` pairs separated by spaces, as the `flags` attribute is
    written; `device` ("cpu", "cuda": the model's) tells the reader which
    settings apply (TF32 and the matmul precision are CUDA's)."""
    parts = [f"device={device}"] if device else []
    parts += [f"float32_matmul_precision={torch.get_float32_matmul_precision()}",
             f"tf32_matmul={int(bool(torch.backends.cuda.matmul.allow_tf32))}",
             f"tf32_cudnn={int(bool(torch.backends.cudnn.allow_tf32))}"]
    for device in ("cpu", "cuda"):
        dtype = _autocast_dtype(device)
        parts.append(f"autocast_{device}={str(dtype).removeprefix('torch.') if dtype is not None else 'off'}")
    return " ".join(parts)
