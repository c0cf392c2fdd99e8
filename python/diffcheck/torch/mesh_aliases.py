"""DeviceMesh dimensions that are several of the capture's axes flattened.

torchtitan builds its meshes from one world mesh and hands FSDP2 a
flattened one: under context parallelism FSDP2 shards over `fsdp`, the data
ranks and the cp ranks together (dp_shard x cp), while the capture's mesh
has the two as axes of their own ("dp=2,cp=2"): the tokens are split over
cp alone, the samples over dp alone. A DTensor on `fsdp` is then laid out
over "dp*cp" (docs/FORMAT.md: axes joined with `*`, major first).

`flattened_aliases` reads, for each DeviceMesh dimension of the model's
DTensor parameters whose name the capture's mesh lacks, the ranks along it
through this rank, and names the capture's axes that enumerate exactly those
ranks in that order. `split_for_context_parallel` makes the capture's mesh
when none is given: the DTensors' mesh, with the axis that holds
torchtitan's cp group split into a data part and `cp`.
"""
import itertools

from diffcheck.dump.layouts import is_dtensor, rank_coords


def _rank_of(coords, axis_sizes):
    r = 0
    for a, n in axis_sizes.items():
        r = r * n + coords[a]
    return r


def axes_along(ranks, axis_sizes, rank, ordered=True):
    """The capture's axes, joined major first ("dp*cp"), whose ranks through
    `rank` are `ranks` in that order; ordered=False: the same set of ranks,
    the axes in mesh order. None where no such axes are."""
    coords = rank_coords(rank, axis_sizes)
    names = [a for a, n in axis_sizes.items() if n > 1]
    want = list(ranks) if ordered else sorted(ranks)
    choose = itertools.permutations if ordered else itertools.combinations  # the first chosen is the major one
    for k in range(1, len(names) + 1):
        for chosen in choose(names, k):
            line = [_rank_of({**coords, **dict(zip(chosen, values))}, axis_sizes)
                    for values in itertools.product(*(range(axis_sizes[a]) for a in chosen))]
            if (line if ordered else sorted(line)) == want:
                return "*".join(chosen)
    return None


def group_axis(group, axis_sizes, rank, where):
    """The mesh axis whose ranks through `rank` are `group`'s (None: the
    whole world); ValueError naming the group's ranks when no axis is."""
    import torch.distributed as dist
    world = 1
    for n in axis_sizes.values():
        world *= n
    ranks = sorted(dist.get_process_group_ranks(group)) if group is not None else list(range(world))
    coords = rank_coords(rank, axis_sizes)
    for axis, size in axis_sizes.items():
        if [_rank_of({**coords, axis: v}, axis_sizes) for v in range(size)] == ranks:
            return axis
    raise ValueError(f"{where}: its process group holds ranks {ranks}, which no axis of the mesh "
                     f"{','.join(f'{a}={n}' for a, n in axis_sizes.items())} spans through rank {rank}: "
                     "name the axes so that one of them is that group")


def _lines(device_mesh, rank):
    """{dimension name: the ranks along it through `rank`} of a DeviceMesh."""
    names = tuple(getattr(device_mesh, "mesh_dim_names", None) or ())
    grid = device_mesh.mesh
    where = (grid == rank).nonzero()
    if not names or where.numel() == 0:
        return {}
    at = where[0].tolist()
    out = {}
    for d, name in enumerate(names):
        index = list(at)
        index[d] = slice(None)
        out[name] = grid[tuple(index)].tolist()
    return out


def flattened_aliases(model, axis_sizes, rank):
    """{DeviceMesh dimension name: the capture's axes it flattens} for the
    model's DTensor parameters' dimensions the capture's mesh does not name."""
    aliases, seen = {}, set()
    parameters = getattr(model, "parameters", None)
    for p in parameters() if parameters else ():
        if not is_dtensor(p) or id(p.device_mesh) in seen:
            continue
        seen.add(id(p.device_mesh))
        for name, ranks in _lines(p.device_mesh, rank).items():
            if name in axis_sizes or name in aliases:
                continue
            joined = axes_along(ranks, axis_sizes, rank)
            if joined is not None:
                aliases[name] = joined
    return aliases


def with_aliases(attrs, aliases):
    """`attrs` with aliased axis names in spec and partial replaced by the capture's axes."""
    if not aliases:
        return attrs
    out = dict(attrs)
    for key in ("spec", "partial"):
        value = attrs.get(key)
        if value:
            out[key] = ",".join("*".join(aliases.get(a, a) for a in entry.split("*")) for entry in value.split(","))
    return out


def split_for_context_parallel(mesh, model, rank):
    """`mesh` ("fsdp=4", read from the DTensors) with torchtitan's cp group
    made an axis of its own where no axis is it ("dp=2,cp=2"); else `mesh`."""
    from diffcheck.dump import mesh_sizes
    from diffcheck.torch.torchtitan_plan import context_parallel_modules
    found = context_parallel_modules(model)
    if not mesh or not found:
        return mesh
    import torch.distributed as dist
    group = sorted(dist.get_process_group_ranks(found[0][2]))
    sizes = mesh_sizes(mesh)
    coords = rank_coords(rank, sizes)
    for axis, n in sizes.items():
        line = [_rank_of({**coords, axis: v}, sizes) for v in range(n)]
        c = len(group)
        if line == group or c >= n or n % c or not set(group) <= set(line):
            continue
        at = line.index(group[0])
        if line[at:at + c] == group:  # cp the minor part of the axis
            parts = [("dp", n // c), ("cp", c)]
        elif line[at::n // c][:c] == group:  # cp the major part
            parts = [("cp", c), ("dp", n // c)]
        else:
            continue
        if any(name in sizes for name, _ in parts):
            return mesh
        axes = []
        for a, k in sizes.items():
            axes += parts if a == axis else [(a, k)]
        return ",".join(f"{a}={k}" for a, k in axes)
    return mesh
