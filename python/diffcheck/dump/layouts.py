"""The layouts a capture is given: `{glob: layout}` entries turned into tap
attributes, and a tap's layout checked against its tensor and the mesh
before anything is written (docs/FORMAT.md: spec and partial)."""


def layout_attrs(value, tap_attributes):
    """A layout entry -> tap attributes: "spec", (spec, partial) or a dict of
    spec, partial and `tap_attributes`."""
    if value is None or isinstance(value, str):
        return {"spec": value}
    if isinstance(value, tuple) and len(value) == 2:
        return {"spec": value[0], "partial": value[1]}
    if isinstance(value, dict):
        unknown = set(value) - {"spec", "partial", *tap_attributes}
        if unknown:
            raise ValueError(f"layout {value!r}: unknown keys {sorted(unknown)} "
                             f"({', '.join(('spec', 'partial') + tuple(tap_attributes))})")
        return dict(value)
    raise ValueError(f"layout {value!r}: give a spec string, a (spec, partial) pair or a dict")


def check_layout(where, attrs, ndim, axes, mesh):
    """ValueError starting with `where` when the spec does not have one entry
    per dimension or names an axis the mesh does not have."""
    spec, partial = attrs.get("spec"), attrs.get("partial")
    if spec:
        entries = spec.split(",")
        if len(entries) != ndim:
            raise ValueError(f"{where}: spec '{spec}' has {len(entries)} entries for {ndim} dimensions")
        used = [a for e in entries if e != "-" for a in e.split("*")]
    else:
        used = []
    used += partial.split("*") if partial else []
    unknown = [a for a in used if a not in axes]
    if unknown:
        raise ValueError(f"{where}: axis '{unknown[0]}' is not in the mesh '{mesh}'")


def rank_coords(rank, axis_sizes):
    """{axis: coordinate} of `rank` on a mesh {axis: size} (last axis fastest, docs/FORMAT.md)."""
    coords = {}
    for axis, size in reversed(list(axis_sizes.items())):
        coords[axis] = rank % size
        rank //= size
    return coords


def block_index(entry, rank, axis_sizes):
    """The block of a dimension whose spec entry is `entry` ("-", "sp" or
    "cfg*sp", major first) that `rank` holds."""
    if not entry or entry == "-":
        return 0
    coords, block = rank_coords(rank, axis_sizes), 0
    for axis in entry.split("*"):
        block = block * axis_sizes[axis] + coords[axis]
    return block


def replica_axes(attrs, axis_sizes):
    """The mesh axes of size > 1 a tap's layout names in neither spec nor
    partial, in mesh order: its pieces are equal along them (a pipeline
    stage's axis, attribute `stage`, is not one: the other stages hold other taps)."""
    used = {attrs["stage"].split("=")[0]} if attrs.get("stage") else set()
    for part in ((attrs.get("spec") or "").split(",") + [attrs.get("partial") or ""]):
        used.update(a for a in part.split("*") if a and a != "-")
    return [a for a, n in axis_sizes.items() if a not in used and n > 1]


def spec_entry(spec, dim, ndim):
    """The spec entry of dimension `dim` (negative: from the end); "-" for a replicated tensor."""
    if not spec:
        return "-"
    entries = spec.split(",")
    return entries[dim % ndim] if len(entries) == ndim else "-"


def global_length(shape, spec, dim, axis_sizes):
    """The global tensor's length along `dim` of a piece of `shape` laid out
    by `spec` (the piece's length times the ranks its entry splits it over)."""
    entry = spec_entry(spec, dim, len(shape))
    shards = 1
    for axis in ([] if entry == "-" else entry.split("*")):
        shards *= axis_sizes[axis]
    return shape[dim] * shards


def spec_at(axis, dim, ndim):
    """The spec of a tensor of `ndim` dimensions split over `axis` on dimension `dim` (negative: from the end)."""
    entries = ["-"] * ndim
    entries[dim % ndim] = axis
    return ",".join(entries)


def is_dtensor(tensor):
    """A torch DTensor (duck-typed: `to_local()`, `placements`)."""
    return getattr(tensor, "placements", None) is not None and hasattr(tensor, "to_local")


def dtensor_layout(tensor, axis_names=None):
    """(local tensor, {"spec", "partial"}) of a torch DTensor (duck-typed:
    `to_local()`, `placements`, `device_mesh`), or None for another tensor."""
    if not is_dtensor(tensor):
        return None
    return tensor.to_local(), placement_attrs(tensor.placements, tensor.device_mesh, tensor.dim(), axis_names)


def placement_attrs(placements, mesh, ndim, axis_names=None):
    """{"spec", "partial"} of a tensor of `ndim` dimensions placed on a device
    mesh: Shard(d) puts the mesh dimension's axis on d, Replicate leaves it
    out, Partial makes it a partial-sum axis. Axis names: the device mesh's
    `mesh_dim_names`, else `axis_names`, else dim0, dim1, ..."""
    names = list(getattr(mesh, "mesh_dim_names", None) or axis_names or
                 [f"dim{i}" for i in range(len(placements))])
    if len(names) != len(placements):
        raise ValueError(f"a DTensor on a {len(placements)}-dimensional device mesh, but the axis names are {names}")
    entries, strided, partial = [[] for _ in range(ndim)], [[] for _ in range(ndim)], []
    for name, p in zip(names, placements):
        if getattr(p, "split_factor", None) is not None and hasattr(p, "dim"):  # is_shard() says False
            # _StridedShard (FSDP2 over tensor parallelism): this axis splits
            # each of the chunks the later axes make, so it is the minor one.
            strided[p.dim % ndim].append(name)
        elif p.is_shard():
            entries[p.dim % ndim].append(name)
        elif p.is_partial():
            partial.append(name)
        elif not p.is_replicate():
            raise ValueError(f"a DTensor placement {p!r} on mesh axis '{name}' has no diffcheck layout")
    entries = [e + s for e, s in zip(entries, strided)]
    spec = ",".join("*".join(e) or "-" for e in entries)
    attrs = {"spec": spec if any(entries) else None}
    if partial:
        attrs["partial"] = "*".join(partial)
    return attrs
