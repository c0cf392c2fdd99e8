"""Where a capture learns this process's rank and world size (torch.distributed,
else the launcher's environment), and a compiled model's eager module."""
import os

import torch

# Where launchers put a process's rank and the number of processes, most specific first.
_LAUNCHER_ENV = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def compiled_original(model):
    """The eager module inside a torch.compile'd one (OptimizedModule, duck-typed), else None."""
    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, torch.nn.Module) else None


def rank_and_world():
    """(rank, world size): torch.distributed's when it is initialized, else the
    launcher's (mpirun, torchrun, srun), else (0, 1)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    for rank_var, size_var in _LAUNCHER_ENV:
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1
