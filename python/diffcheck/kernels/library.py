"""Finding and loading libdiffcheck_sketch_cpu.so (python/kernels/sketch_cpu.c)
through ctypes, framework-free: diffcheck/sketch/cpu_kernel.py wraps it for
torch tensors, diffcheck/jax/host_sketch.py for the shards of JAX arrays on
CPU devices.

Where it is looked for: $DIFFCHECK_SKETCH_KERNEL (a path; "off": not at
all), beside this package (CMake's install puts it there), then the build
tree of a source checkout (<checkout>/build/python, scripts/setup.sh's).
Where it is not found, each caller takes its slower path, and a warning says
so once per process."""
import contextlib
import ctypes
import logging
import os

LIBRARY = "libdiffcheck_sketch_cpu.so"
ENV = "DIFFCHECK_SKETCH_KERNEL"
# The element kinds of diffcheck_sketch_cpu and diffcheck_piece_check, by dtype name.
KINDS = {"float32": 0, "float64": 1, "bfloat16": 2, "float16": 3}

_i32, _i64, _u64, _ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p
_p_u64, _p_i64 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int64)
# name -> (restype, argtypes, required): a library built before an optional one still loads.
_SIGNATURES = {
    "diffcheck_sketch_cpu": (_i32, [_ptr, _i32, _i64, _i64, _i64, _i64, _i64, _ptr, _i32, _ptr], True),
    "diffcheck_piece_bits": (None, [_ptr, _i32, _i64, _i64, _p_u64, _p_i64, _p_i64], True),
    "diffcheck_bytes_hash": (_u64, [_ptr, _i64], False),
    "diffcheck_bytes_hash_portable": (_u64, [_ptr, _i64], False),
    "diffcheck_bytes_hash_wide": (_i32, [], False),
    "diffcheck_watch_rows": (None, [_ptr, _ptr, _ptr, _i64, _ptr], False),
    "diffcheck_piece_check": (None, [_ptr, _i32, _i64, _i32, _p_u64, _p_i64, _p_i64], False),
    # (kernels/h5_dataset.c: diffcheck/dump/h5_direct.py's one call per dataset)
    "diffcheck_h5_write_dataset": (_i32, [_ptr, _i64, ctypes.c_char_p, _i64, _i64, _i64, _i64, _i64, _i32, _ptr,
                                          _ptr, _i32, _i32, ctypes.c_char_p, _ptr, _ptr, _ptr, ctypes.c_char_p, _ptr],
                                   False),
}
_state = {"functions": {}, "tried": False, "path": None}


def _candidates():
    given = os.environ.get(ENV)
    if given:
        return [] if given.lower() == "off" else [given]
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(here)
    return [os.path.join(here, LIBRARY), os.path.join(package, "sketch", LIBRARY),  # the last: an older install
            os.path.join(package, "..", "..", "build", "python", LIBRARY)]


def _load(path):
    library = ctypes.CDLL(path)
    functions = {}
    for name, (restype, argtypes, required) in _SIGNATURES.items():
        f = getattr(library, name, None)
        if f is None:
            if required:
                raise AttributeError(f"{name} is not in it")
            continue
        f.restype, f.argtypes = restype, argtypes
        functions[name] = f
    return functions


def _find():
    _state["tried"] = True
    for path in _candidates():
        if not os.path.exists(path):
            continue
        try:
            _state["functions"] = _load(path)
        except (OSError, AttributeError) as e:
            logging.getLogger("diffcheck").warning("diffcheck: %s does not load (%s): its slower twins serve", path, e)
            continue
        _state["path"] = os.path.abspath(path)
        return
    given = os.environ.get(ENV)
    if given and given.lower() != "off":
        logging.getLogger("diffcheck").warning("diffcheck: %s=%s is not a loadable kernel: its slower twins serve",
                                               ENV, given)
    elif not given:
        # Named once per process, never replaced in silence: the fallbacks are slower
        # (sketches in torch ops or in the XLA program, the watch's CRC-32 in place of XXH3).
        logging.getLogger("diffcheck").warning(
            "diffcheck: the CPU kernel %s was not found (looked in %s): sketches are made without it and "
            "dct.watch hashes with CRC-32; `pip install .` from the checkout builds it, or set %s to "
            "its path (\"off\": do without, and say nothing)", LIBRARY, ", ".join(_candidates()), ENV)


def get(name):
    """The library's function `name` (diffcheck_sketch_cpu, ...), or None
    where the library is not loaded or predates the function."""
    if not _state["tried"]:
        _find()
    return _state["functions"].get(name)


def loaded_from():
    """The library's path, or None where it is not loaded."""
    get("diffcheck_sketch_cpu")
    return _state["path"]


def reset():
    """Look for the library again."""
    _state.update(functions={}, tried=False, path=None)


@contextlib.contextmanager
def without():
    """Within: no kernel, as where the library is not built (the tests compare
    the paths); the library is looked for again after."""
    _state.update(functions={}, tried=True, path=None)
    try:
        yield
    finally:
        reset()
