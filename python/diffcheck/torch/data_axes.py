"""Data axes: the mesh axes whose ranks hold different samples (data
parallelism, FSDP's shard axis, HSDP's replicate and shard axes). A capture's
activation taps are split along their batch dimension (dimension 0) over them,
major to minor, on top of whatever a DTensor plan or `layouts=` says of the
other dimensions; the reference then runs the global batch (the data-parallel
ranks' samples laid together in rank order), and each tap's pieces laid
together are its global tensor.

Where they come from: `capture(data_axes=("dp",))`, else FSDP2's mesh
(`fully_shard`: every axis of the meshes its parameter groups are sharded or
replicated on), else DistributedDataParallel's process group (the one mesh
axis of its size). None found: no data axes (every rank the same batch, the
special case).

The batch dimension: a tap is split over the data axes when its dimension 0
is the local batch, the size of dimension 0 of the model's first tensor
input; any other tap (a rotary table, a timestep vector of another length) is
left as its layout says. Parameter taps are never split (their layouts are
their own: FSDP's placements, the plan's, `param` patterns).

Loss scaling (the module-output gradients, `grad/<tap>`): with
"local_mean" (default; each rank's loss the mean over its own samples, the
parameter gradients averaged over the data axes), each rank's output
gradients are D times those of the global batch's mean loss (D the data
axes' ranks): they are written divided by D. With "global" (the loss summed
and divided by the global count, torchtitan's convention) they are written as
they are. Not given, it is read from the trainer: FSDP2 with its division
turned off (`set_gradient_divide_factor(1.0)`, as torchtitan does) sums the
data ranks' gradients, which is right only for a loss already divided by
the global count: "global"; otherwise (FSDP2's average, DDP's) "local_mean".
The convention, and where it came from, goes in the file's root attribute
`loss_scale`.
"""
import re
import sys

LOSS_SCALES = ("local_mean", "global")
_PARAMETER_TAP = re.compile(r"(^|/)param(_grad)?/")


def fsdp_mesh_axes(model):
    """The axis names of the meshes FSDP2 (`fully_shard`) spreads `model`'s
    parameters over, in mesh order; () when FSDP2 is not there."""
    # Only where FSDP2 is loaded already (a model it sharded has loaded it): importing it costs a
    # capture ~40 MiB of modules (tests/test_e2e_torch.py holds a capture's peak memory).
    fsdp = sys.modules.get("torch.distributed.fsdp")
    FSDPModule = getattr(fsdp, "FSDPModule", None)
    if FSDPModule is None:
        return ()
    axes = []
    for m in model.modules() if hasattr(model, "modules") else ():
        if not isinstance(m, FSDPModule):
            continue
        for group in getattr(m._get_fsdp_state(), "_fsdp_param_groups", []):
            for name in group.mesh_info.mesh.mesh_dim_names or ():
                if name not in axes:
                    axes.append(name)
    return tuple(axes)


def read_loss_scale(model):
    """(convention, where it was read) when capture() was given none: see the module's docstring."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    FSDPModule = getattr(fsdp, "FSDPModule", None)
    factors = set()
    for m in model.modules() if FSDPModule is not None and hasattr(model, "modules") else ():
        if isinstance(m, FSDPModule):
            factors.update(g.gradient_divide_factor for g in getattr(m._get_fsdp_state(), "_fsdp_param_groups", []))
    if factors == {1.0}:
        return "global", "read from FSDP2: its gradients summed, set_gradient_divide_factor(1.0)"
    return "local_mean", "the default" if not factors else "read from FSDP2: its gradients averaged"


def is_ddp(model):
    parallel = sys.modules.get("torch.nn.parallel")  # loaded where DDP could be (never imported here)
    ddp = getattr(parallel, "DistributedDataParallel", None)
    return ddp is not None and isinstance(model, ddp)


def ddp_axis(model, axis_sizes):
    """The mesh axis DistributedDataParallel's process group spans (the one axis
    of its size), or () when `model` is no DDP or no axis alone matches."""
    if not is_ddp(model):
        return ()
    size = model.process_group.size()
    matching = [a for a, n in axis_sizes.items() if n == size]
    return (matching[0],) if len(matching) == 1 else ()


def resolve(given, model, axis_sizes, where, rank=0, aliases=None):
    """The capture's data axes: `given` (checked against the mesh), or read
    from the model. ValueError naming the axes the mesh lacks."""
    if given is None:
        axes = fsdp_mesh_axes(model) or ddp_axis(model, axis_sizes)
        axes = tuple(a for name in axes for a in (aliases or {}).get(name, name).split("*"))  # flattened
        if axes:  # torchtitan folds context parallelism into FSDP2's mesh: its ranks hold the same samples
            from diffcheck.torch.mesh_aliases import group_axis
            from diffcheck.torch.torchtitan_plan import context_axes
            cp = context_axes(model, axis_sizes, rank, group_axis)
            axes = tuple(a for a in axes if a not in cp)
        return tuple(a for a in axes if axis_sizes.get(a, 1) > 1)
    axes = (given,) if isinstance(given, str) else tuple(given)
    missing = [a for a in axes if a not in axis_sizes]
    if missing:
        raise ValueError(f"{where}: data_axes {list(axes)}: the mesh has no axis "
                         f"{', '.join(repr(a) for a in missing)} ({', '.join(axis_sizes)})")
    return axes


def degree(axes, axis_sizes):
    """D: the number of data-parallel ranks (the product of the data axes' sizes)."""
    d = 1
    for a in axes:
        d *= axis_sizes[a]
    return d


def is_parameter_tap(name):
    return _PARAMETER_TAP.search(name) is not None


def with_data_axes(attrs, shape, axes, local_batch):
    """`attrs` with the data axes prepended to dimension 0's spec entry, where
    dimension 0 is the local batch and the spec names no data axis already."""
    if not axes or local_batch is None or not shape or shape[0] != local_batch:
        return attrs
    spec = attrs.get("spec")
    entries = spec.split(",") if spec else ["-"] * len(shape)
    if len(entries) != len(shape):
        return attrs  # the layout check names the mismatch
    named = {a for e in entries for a in e.split("*")}
    if named & set(axes):
        return attrs  # the user's (or the plan's) spec says it already
    first = [a for a in entries[0].split("*") if a != "-"]
    entries[0] = "*".join(list(axes) + first)
    return {**attrs, "spec": ",".join(entries)}


def first_batch(args, kwargs):
    """The size of dimension 0 of a call's first tensor input (positional first), or None."""
    for value in list(args) + list(kwargs.values()):
        if hasattr(value, "shape") and hasattr(value, "dim") and value.dim() >= 1:
            return int(value.shape[0])
    return None


def settle_data_axes(given, loss_scale, whole, model, axis_sizes, rank, root_attrs, aliases=None):
    """(data axes, the divisor of the output gradients) of a capture; the
    convention recorded in `root_attrs["loss_scale"]`. A reference, one-device
    or pipeline capture (whole, or microbatched by its schedule) has none."""
    if loss_scale is not None and loss_scale not in LOSS_SCALES:
        raise ValueError(f"rank {rank}: capture(loss_scale={loss_scale!r}): one of {', '.join(LOSS_SCALES)}")
    if whole:
        return (), 1
    axes = resolve(given, model, axis_sizes, f"rank {rank}: capture()", rank, aliases)
    if not axes:
        return (), 1
    source = "as given"
    if loss_scale is None:
        loss_scale, source = read_loss_scale(model)
    d = degree(axes, axis_sizes)
    divisor = d if loss_scale == "local_mean" else 1
    root_attrs.setdefault("loss_scale", f"{loss_scale} ({source}; data axes {','.join(axes)}: output gradients "
                                        + (f"divided by {d})" if divisor > 1 else "as they are)"))
    return axes, divisor
