"""How diffcheck/dump/__init__.py writes a dataset and scalar attributes: the file
h5py's `create_dataset(name, data=a)` and `obj.attrs[k] = v` make (int64,
float64, variable-length UTF-8 strings; contiguous layout, no times), at a
fraction of their cost. A sketch capture writes a dozen small taps of a
dozen attributes each per forward: through h5py's high-level calls, that
was most of its writing.

Three ways, the same file: a dataset and its attributes in one C call
(kernels/h5_dataset.c, where the kernel library is loaded), HDF5's C
functions called one at a time (diffcheck/dump/h5_direct.py), or, where
those cannot be found, h5py's low-level API. Types and property lists are
made once, by h5py.
"""
import ctypes
import functools

import h5py
import numpy as np

from diffcheck.dump import h5_direct

_MADE = {}


def _made():
    """The scalar dataspace, each attribute kind's file type, NumPy type
    and memory type, a dataset creation list as create_dataset makes it (no
    times), link creation lists that make intermediate groups (per name
    encoding), and the file and memory types of each array dtype (filled as met)."""
    if not _MADE:
        text = h5py.string_dtype("utf-8")  # the file's type is h5py's logical one, memory's its object type
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_obj_track_times(False)
        lcpl = {}
        for coding in (h5py.h5t.CSET_ASCII, h5py.h5t.CSET_UTF8):
            lcpl[coding] = h5py.h5p.create(h5py.h5p.LINK_CREATE)
            lcpl[coding].set_create_intermediate_group(True)
            lcpl[coding].set_char_encoding(coding)
        _MADE.update(
            scalar=h5py.h5s.create(h5py.h5s.SCALAR), dcpl=dcpl, lcpl=lcpl, types={},
            kinds={str: (h5py.h5t.py_create(text, logical=True), text, h5py.h5t.py_create(text)),
                   int: (h5py.h5t.STD_I64LE, np.int64, h5py.h5t.NATIVE_INT64),
                   float: (h5py.h5t.IEEE_F64LE, np.float64, h5py.h5t.NATIVE_DOUBLE)})
        # kernels/h5_dataset.c's file and memory type of each kind (a string's memory type: a C string's)
        kinds = _MADE["kinds"]
        _MADE["table"] = (ctypes.c_int64 * 6)(kinds[int][0].id, kinds[int][2].id, kinds[float][0].id,
                                              kinds[float][2].id, kinds[str][0].id, kinds[str][0].id)
    return _MADE


_CODES = {int: 0, float: 1, str: 2}  # kernels/h5_dataset.c's ATTRIBUTE_*


@functools.lru_cache(maxsize=None)
def _array_types(n):
    """ctypes' array types of n kinds, ints and floats, made once: a type
    made per dataset is a reference cycle of its own (the type and its attributes)."""
    return ctypes.c_int32 * n, ctypes.c_int64 * n, ctypes.c_double * n


def _packed(attrs, made):
    """The attributes as kernels/h5_dataset.c reads them (its arguments
    from `count` on); None where one is not an int, float or str, or holds
    what a C string cannot (those go the other ways, which say why)."""
    n = len(attrs)
    kinds, ints, floats = (array_type() for array_type in _array_types(n))
    names, strings = [], []
    try:
        for i, (name, value) in enumerate(attrs.items()):
            kind = _kind(value)
            if kind is None or "\0" in name:
                return None
            kinds[i] = _CODES[kind]
            names.append(name.encode())
            if kind is int:
                ints[i] = int(value)
            elif kind is float:
                floats[i] = float(value)
            else:
                strings.append(value.encode("utf-8"))
    except OverflowError:  # an int beyond int64: h5py's way says so
        return None
    return n, b"\0".join(names) + b"\0", kinds, ints, floats, b"\0".join(strings) + b"\0", made["table"]


def _kind(value):
    """int, float or str for a value written through the fast paths; None for any other (h5py's own way)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int
    if isinstance(value, (float, np.floating)):
        return float
    return str if isinstance(value, str) else None


def _encoded(name):
    try:
        return name.encode("ascii"), h5py.h5t.CSET_ASCII
    except UnicodeEncodeError:
        return name.encode("utf8"), h5py.h5t.CSET_UTF8


def set_attrs(obj, attrs):
    """Scalar attributes `attrs` of `obj` (an h5py object), new ones (they
    are created, never rewritten), written as `obj.attrs[k] = v` writes them."""
    with h5_direct.lock():
        _attrs(obj.id, attrs)


def _attrs(oid, attrs):
    """Under h5py's lock: attributes of the object with low-level id `oid`."""
    made = _made()
    direct = h5_direct.available()
    for name, value in attrs.items():
        kind = _kind(value)
        if kind is not None and direct:
            file_type, dtype, memory = made["kinds"][kind]
            try:
                # A string's memory type is a C string (h5py's is a Python object's, for NumPy object arrays).
                h5_direct.write_attribute(oid.id, name.encode(), file_type.id,
                                          (file_type if kind is str else memory).id, made["scalar"].id, kind,
                                          value if kind is str else dtype(value).item())
                continue
            except h5_direct.Failed:
                if isinstance(oid, _Handle):
                    raise ValueError(f"attribute '{name}' = {value!r} could not be written") from None
                # h5py repeats it below, and raises with HDF5's message
        if isinstance(oid, _Handle):
            raise TypeError(f"attribute '{name}' = {value!r}: a tap's attributes are ints, floats and strings")
        if kind is None:  # a bool, an array: h5py's own way
            owner = h5py.Group(oid) if isinstance(oid, h5py.h5g.GroupID) else h5py.Dataset(oid)
            owner.attrs[name] = value
            continue
        file_type, dtype, memory = made["kinds"][kind]
        h5py.h5a.create(oid, name.encode(), file_type, made["scalar"]).write(np.asarray(value, dtype=dtype),
                                                                          mtype=memory)

def write_dataset(loc, name, array, attrs):
    """The dataset `name` (a path below `loc`, an h5py group or file:
    intermediate groups are made) holding `array`, with scalar attributes
    `attrs`. h5py's ValueError or TypeError where it cannot be made (the
    name taken)."""
    made = _made()
    key = array.dtype.str
    types = made["types"].get(key)
    if types is None:
        types = made["types"][key] = (h5py.h5t.py_create(array.dtype, logical=1), h5py.h5t.py_create(array.dtype))
    encoded, coding = _encoded(name)
    array = array if array.flags.c_contiguous else array.copy(order="C")  # (ascontiguousarray makes a 0-d array 1-d)
    with h5_direct.lock():
        if h5_direct.available():
            at_once = h5_direct.one_call()
            packed = _packed(attrs, made) if at_once else None
            if packed is not None:
                try:
                    h5_direct.write_dataset_at_once(at_once, loc.id.id, encoded, types[0].id, types[1].id,
                                                    made["scalar"].id, made["lcpl"][coding].id, made["dcpl"].id,
                                                    array, packed)
                    return
                except h5_direct.AttributesFailed as e:
                    name, value = list(attrs.items())[e.index]
                    raise ValueError(f"attribute '{name}' = {value!r} could not be written") from None
                except h5_direct.Failed:
                    pass  # made again below, one call at a time, and then by h5py with HDF5's message
            try:
                handle = h5_direct.create_dataset(loc.id.id, encoded, types[0].id, types[1].id, made["scalar"].id,
                                                  made["lcpl"][coding].id, made["dcpl"].id, array)
            except h5_direct.Failed:
                handle = None  # h5py repeats it, and raises with HDF5's message
            if handle is not None:
                try:
                    _attrs(_Handle(handle), attrs)
                finally:
                    h5_direct.close_dataset(handle)
                return
        space = h5py.h5s.create_simple(array.shape) if array.shape else made["scalar"]
        dsid = h5py.h5d.create(loc.id, encoded, types[0], space, dcpl=made["dcpl"], lcpl=made["lcpl"][coding])
        if array.size:
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, array, mtype=types[1])
        _attrs(dsid, attrs)


class _Handle:
    """A dataset's C handle where _attrs expects an h5py id (its `.id`); its
    attributes take the fast kinds only (a tap's do)."""

    def __init__(self, handle):
        self.id = handle
