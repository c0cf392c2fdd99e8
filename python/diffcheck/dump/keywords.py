"""Keyword arguments checked before anything is written: a misspelled one
(`refrence=True`, `layout={...}`) is a TypeError naming it and the nearest
known keyword, not a root attribute of that name in the file (which would
capture nothing of what was meant) or an error from inside h5py."""
import difflib
import numbers

# The root attributes FORMAT.md documents that a writer may set by keyword;
# any other goes in one explicit dict (attrs={...}).
ROOT_ATTRIBUTES = ("scenario", "flags", "dtype", "seed", "producer", "size")
# What the file's layout is made of: set by the capture, never by attrs.
RESERVED_ATTRIBUTES = ("diffcheck_schema", "mesh", "world_size", "rank")


def unexpected(where, name, known):
    """The TypeError for an unknown keyword `name`: its nearest known one, if any is near."""
    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return TypeError(f"{where}: unexpected keyword argument '{name}'{hint} "
                     f"(known: {', '.join(sorted(known))})")


def check_root_keywords(where, given, parameters):
    """Keywords beyond the function's own `parameters` must be documented root attributes."""
    for name in given:
        if name not in ROOT_ATTRIBUTES:
            raise unexpected(where, name, tuple(parameters) + ROOT_ATTRIBUTES)


def root_attributes(where, attrs):
    """attrs={...}: each value a string, a number or a bool (what an HDF5
    attribute holds as one value); names of the file's own layout refused."""
    if attrs is None:
        return {}
    if not isinstance(attrs, dict):
        raise TypeError(f"{where}: attrs is a {type(attrs).__name__}, not a dict of root attributes")
    for k, v in attrs.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"{where}: attrs key {k!r} is not a name")
        if k in RESERVED_ATTRIBUTES:
            raise TypeError(f"{where}: attrs['{k}']: set by the capture itself")
        if not isinstance(v, (str, bool, numbers.Real)):
            raise TypeError(f"{where}: attrs['{k}'] is a {type(v).__name__}: a root attribute is a string, "
                            "a number or a bool")
    return dict(attrs)
