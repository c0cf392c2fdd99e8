"""A JAX array's layout in diffcheck's terms (docs/FORMAT.md), read from the
sharding the array actually has, never written by hand:

- each `PartitionSpec` entry is a `spec` entry: None -> "-", an axis -> its
  name, a tuple of axes -> "a*b" (major first, as JAX and FORMAT.md agree);
- the spec's unreduced axes (`P(..., unreduced={"tp"})`) are `partial`;
- every other mesh axis is a replica axis (diffcheck checks those bitwise);
- a device's rank is its place in the mesh's device array, the last axis
  fastest, as FORMAT.md numbers ranks.

Each shard's own index is checked against the block its rank's coordinates
give, so a file never claims a layout the devices do not hold."""
import numpy as np


class LayoutError(ValueError):
    """A tap whose layout cannot be read from its sharding (the message names it)."""


def mesh_string(mesh):
    """'dp=2,tp=4' of a jax.sharding.Mesh (its axes in order)."""
    return ",".join(f"{name}={int(size)}" for name, size in mesh.shape.items())


def device_ranks(mesh):
    """{device id: rank} over the mesh's device array, last axis fastest."""
    return {d.id: r for r, d in enumerate(mesh.devices.flat)}


def _entry_axes(entry):
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)):
        return tuple(entry)
    return None  # P.UNCONSTRAINED and anything else: not a layout


def spec_strings(pspec, ndim, mesh_axes, where):
    """(spec, partial) strings of a PartitionSpec over an array of `ndim`
    dimensions on a mesh with `mesh_axes`; LayoutError naming `where` when it
    is not one FORMAT.md can say."""
    entries = list(getattr(pspec, "partitions", None) or getattr(pspec, "_partitions", None) or ())
    if not hasattr(pspec, "partitions") and not hasattr(pspec, "_partitions"):
        entries = list(pspec)  # jax before unreduced axes: a tuple
    if len(entries) > ndim:
        raise LayoutError(f"{where}: its PartitionSpec {pspec} has {len(entries)} entries for {ndim} dimensions")
    entries += [None] * (ndim - len(entries))
    used, parts = [], []
    for d, entry in enumerate(entries):
        axes = _entry_axes(entry)
        if axes is None:
            raise LayoutError(f"{where}: dimension {d} of its PartitionSpec {pspec} is {entry!r}, not a mesh axis "
                              "or None: its layout cannot be known (give the tap's array a concrete sharding)")
        parts.append("*".join(axes) if axes else "-")
        used += axes
    partial = sorted(getattr(pspec, "unreduced", ()) or ())
    used += partial
    unknown = [a for a in used if a not in mesh_axes]
    if unknown:
        raise LayoutError(f"{where}: its PartitionSpec {pspec} names {unknown[0]!r}, not an axis of the mesh "
                          f"({', '.join(mesh_axes)})")
    if len(set(used)) != len(used):
        raise LayoutError(f"{where}: its PartitionSpec {pspec} uses a mesh axis twice")
    spec = ",".join(parts)
    return ("" if all(p == "-" for p in parts) else spec), "*".join(partial)


def block_index(spec, rank, mesh_sizes):
    """Per dimension, the block a rank holds under a spec string (FORMAT.md)."""
    names, sizes = list(mesh_sizes), list(mesh_sizes.values())
    coords = dict(zip(names, np.unravel_index(rank, sizes) if sizes else ()))
    out = []
    for entry in (spec.split(",") if spec else []):
        b = 0
        for axis in ([] if entry == "-" else entry.split("*")):
            b = b * mesh_sizes[axis] + int(coords[axis])
        out.append(b)
    return out


def _shard_start(index, shape):
    return [0 if s.start is None else int(s.start) for s in index] + [0] * (len(shape) - len(index))


def _indices_without_partial(sharding, shape):
    """{device: index} of a NamedSharding whose spec has unreduced axes (JAX
    gives none for those: each device holds a whole-shaped block of its
    partial sum), else None (the shards' own indices serve)."""
    from jax.sharding import NamedSharding, PartitionSpec
    spec = getattr(sharding, "spec", None)
    if not isinstance(sharding, NamedSharding) or not getattr(spec, "unreduced", None):
        return None
    return NamedSharding(sharding.mesh, PartitionSpec(*spec.partitions)).devices_indices_map(shape)


def _this_process():
    import jax
    return jax.process_index()


def _process_of(mesh, device_id):
    for d in mesh.devices.flat:
        if d.id == device_id:
            return d.process_index
    return None


def array_layout(x, mesh, where):
    """(spec, partial, {rank: this device's piece}) of a jax.Array on `mesh`,
    for the devices this process holds. LayoutError naming `where` when its
    sharding is not a NamedSharding on the capture's mesh (a fully replicated
    array's layout is read from any sharding)."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        raise LayoutError(f"{where}: a {type(x).__name__}, not a jax.Array: it has no sharding to read")
    ranks = device_ranks(mesh)
    mesh_axes = list(mesh.shape)
    from jax.sharding import NamedSharding
    if isinstance(sharding, NamedSharding):
        if tuple(sharding.mesh.axis_names) != tuple(mesh_axes) or dict(sharding.mesh.shape) != dict(mesh.shape):
            raise LayoutError(f"{where}: sharded over the mesh {mesh_string(sharding.mesh)}, not the capture's "
                              f"mesh {mesh_string(mesh)}")
        spec, partial = spec_strings(sharding.spec, x.ndim, mesh_axes, where)
    elif getattr(sharding, "is_fully_replicated", False):
        spec, partial = "", ""
    else:
        raise LayoutError(f"{where}: its sharding is a {type(sharding).__name__}, not a NamedSharding: its layout "
                          "cannot be read (reshard it with jax.sharding.NamedSharding(mesh, PartitionSpec(...)))")
    pieces = {}
    local_shape = None
    indices = _indices_without_partial(sharding, x.shape)
    for shard in x.addressable_shards:
        rank = ranks.get(shard.device.id)
        if rank is None:
            raise LayoutError(f"{where}: held by device {shard.device}, which is not in the capture's mesh")
        local_shape = shard.data.shape
        want = block_index(spec, rank, dict(mesh.shape))
        got = _shard_start(indices[shard.device] if indices else shard.index, x.shape)
        blocks = [g // max(n, 1) for g, n in zip(got, local_shape)]
        if want and blocks != want:
            raise LayoutError(f"{where}: rank {rank} (device {shard.device}) holds block {blocks}, but its "
                              f"layout '{spec}' puts block {want} there")
        pieces[rank] = shard.data
    mine = [r for d, r in ranks.items() if _process_of(mesh, d) == _this_process()]
    if sorted(pieces) != sorted(mine):
        raise LayoutError(f"{where}: held by {len(pieces)} of the mesh's {len(mine)} devices (an array on one "
                          "device, or on another mesh's): every device of the mesh must hold its piece")
    if local_shape is not None and spec:
        for d, entry in enumerate(spec.split(",")):
            n = int(np.prod([mesh.shape[a] for a in entry.split("*")])) if entry != "-" else 1
            if local_shape[d] * n != x.shape[d]:
                raise LayoutError(f"{where}: dimension {d} ({x.shape[d]}) is not split evenly over '{entry}' "
                                  "(diffcheck's format holds pieces of one shape)")
    return spec, partial, pieces
