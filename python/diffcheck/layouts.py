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
