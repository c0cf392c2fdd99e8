"""HDF5's C functions called directly (ctypes) for what diffcheck/dump/__init__.py
writes most often: a tap's dataset and its dozen scalar attributes.

Why: a sketch capture writes a dozen small taps per forward, and through
h5py each attribute costs some 45 us and each dataset some 230 us, over
half of it h5py's own bookkeeping (a Python object and a weak registry
entry per handle). The same C calls cost some 15 us and 120 us, and ctypes
lets go of the interpreter lock while they run.

The functions are looked up through h5py's own extension module, so they
are those of the very library h5py loaded (a wheel's bundled HDF5, or
Debian's): handles are interchangeable (an h5py object's `.id` is the C
library's hid_t), and the types and property lists are made by h5py once,
then passed by handle. Every call is made holding h5py's lock, as h5py's
own are (its HDF5 is not built thread-safe). Where the functions cannot be
found, `available()` is False and diffcheck.dump uses h5py's low-level API, which
writes the same file (the suite compares both with h5py's high-level calls).

Where the CPU kernel library is loaded (diffcheck/kernels), a dataset and its
attributes go in ONE call (kernels/h5_dataset.c, given these functions'
addresses): 88-97 us a sketch dataset of 10 attributes against 117-122 us
one call at a time (the ctypes calls and the Python around them; h5py's
low-level API 185-191 us; scripts/bench/bench_h5_writes.py); the same file
(the suite compares all three ways).
"""
import ctypes
import functools

from diffcheck.kernels import library

H5P_DEFAULT = 0  # hid_t 0 in every HDF5 since 1.8, as H5S_ALL
H5S_ALL = 0
_state = {"lib": None, "tried": False}


def _library():
    if not _state["tried"]:
        _state["tried"] = True
        try:
            import h5py.defs
            lib = ctypes.CDLL(h5py.defs.__file__)  # resolves through h5py's own dependencies
            hid, herr = ctypes.c_int64, ctypes.c_int
            signatures = {
                "H5Screate_simple": (hid, [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p]),
                "H5Sclose": (herr, [hid]),
                "H5Dcreate2": (hid, [hid, ctypes.c_char_p, hid, hid, hid, hid, hid]),
                "H5Dwrite": (herr, [hid, hid, hid, hid, hid, ctypes.c_void_p]),
                "H5Dclose": (herr, [hid]),
                "H5Acreate2": (hid, [hid, ctypes.c_char_p, hid, hid, hid, hid]),
                "H5Awrite": (herr, [hid, hid, ctypes.c_void_p]),
                "H5Aclose": (herr, [hid]),
            }
            for name, (restype, argtypes) in signatures.items():
                f = getattr(lib, name)
                f.restype, f.argtypes = restype, argtypes
            if ctypes.sizeof(hid) != 8 or h5py.version.hdf5_version_tuple < (1, 10, 0):
                raise OSError("hid_t is 64-bit from HDF5 1.10 on")
            _state["lib"] = lib
        except (OSError, AttributeError, ImportError):
            _state["lib"] = None
    return _state["lib"]


def available():
    """The direct calls can be made (else: h5py's low-level API)."""
    return _library() is not None


class _Functions(ctypes.Structure):
    """kernels/h5_dataset.c's table of HDF5 functions, by address."""
    _fields_ = [(name, ctypes.c_void_p) for name in ("screate_simple", "sclose", "dcreate2", "dwrite", "dclose",
                                                       "acreate2", "awrite", "aclose")]


def one_call():
    """(kernels/h5_dataset.c's function, the table of h5py's HDF5 functions
    it calls) where both are there: a dataset and its attributes in one C
    call (write_dataset_at_once); else None."""
    write = library.get("diffcheck_h5_write_dataset")
    lib = _library()
    if write is None or lib is None:
        return None
    if _state.get("table") is None or _state["table"][0] is not lib:
        names = ("H5Screate_simple", "H5Sclose", "H5Dcreate2", "H5Dwrite", "H5Dclose", "H5Acreate2", "H5Awrite",
                 "H5Aclose")
        table = _Functions(*(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names))
        _state["table"] = (lib, table, ctypes.addressof(table))
    return write, _state["table"][2]


class AttributesFailed(Exception):
    """Attribute `index` of a dataset written at once could not be (the dataset exists)."""

    def __init__(self, index):
        super().__init__(index)
        self.index = index


def write_dataset_at_once(call, loc, name, file_type, memory_type, space_scalar, lcpl, dcpl, array, packed):
    """create_dataset and write_attribute in one C call (call: one_call());
    `packed`: the attributes as kernels/h5_dataset.c reads them (count,
    names, kinds, ints, floats, strings, types: hdf5_writes.py packs them).
    Failed where the dataset could not be made, AttributesFailed where an
    attribute could not be."""
    write, table = call
    dims = _dims_type(array.ndim)(*array.shape) if array.shape else None
    rc = write(table, loc, name, file_type, memory_type, space_scalar, lcpl, dcpl, array.ndim, dims,
               array.ctypes.data, int(array.size > 0), *packed)
    if rc < 0:
        raise Failed("diffcheck_h5_write_dataset")
    if rc > 0:
        raise AttributesFailed(rc - 1)


def lock():
    """h5py's lock, to hold around direct calls."""
    from h5py import _objects
    return _objects.phil


class Failed(Exception):
    """A direct call returned an error; the caller repeats the operation
    through h5py, which raises with HDF5's own message."""


@functools.lru_cache(maxsize=None)
def _dims_type(ndim):
    """ctypes' array type of `ndim` hsize_t, made once: a type made per
    dataset is a reference cycle of its own (the type and its attributes)."""
    return ctypes.c_uint64 * ndim


def create_dataset(loc, name, file_type, memory_type, space_scalar, lcpl, dcpl, array):
    """The handle of a new dataset `name` (bytes) under `loc` holding the
    C-contiguous `array`; every other argument a handle. The caller closes
    it (close_dataset)."""
    lib = _library()
    if array.shape:
        dims = _dims_type(array.ndim)(*array.shape)
        space = lib.H5Screate_simple(array.ndim, dims, None)
        if space < 0:
            raise Failed("H5Screate_simple")
    else:
        space = None
    try:
        dataset = lib.H5Dcreate2(loc, name, file_type, space_scalar if space is None else space, lcpl, dcpl,
                                 H5P_DEFAULT)
    finally:
        if space is not None:
            lib.H5Sclose(space)
    if dataset < 0:
        raise Failed("H5Dcreate2")
    if array.size and lib.H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.ctypes.data) < 0:
        lib.H5Dclose(dataset)
        raise Failed("H5Dwrite")
    return dataset


def close_dataset(dataset):
    _library().H5Dclose(dataset)


_MEMORY = {int: ctypes.c_int64, float: ctypes.c_double, str: ctypes.c_char_p}


def write_attribute(obj, name, file_type, memory_type, space_scalar, kind, value):
    """A new scalar attribute `name` (bytes) of `obj` holding `value`, an
    int (int64), float (float64) or str (a variable-length UTF-8 string,
    memory_type its C pointer type)."""
    lib = _library()
    attribute = lib.H5Acreate2(obj, name, file_type, space_scalar, H5P_DEFAULT, H5P_DEFAULT)
    if attribute < 0:
        raise Failed("H5Acreate2")
    try:
        held = _MEMORY[kind](value.encode("utf-8") if kind is str else value)
        if lib.H5Awrite(attribute, memory_type, ctypes.byref(held)) < 0:
            raise Failed("H5Awrite")
    finally:
        lib.H5Aclose(attribute)

