"""The fused CPU sketch (python/kernels/sketch_cpu.c, built by CMake as
libdiffcheck_sketch_cpu.so) through ctypes: a float32 or float64 tap on the
CPU sketched in one pass, summed in float64, where the torch-ops path of
diffcheck/sketch/__init__.py makes three passes. Same sketch, same verdicts (the
suite checks the two agree); where the library is not found the torch-ops
path serves, and a warning says so once.

Where it is looked for: $DIFFCHECK_SKETCH_KERNEL (a path; "off": not at
all), beside this package (CMake's install puts it there), then the build
tree of a source checkout (<checkout>/build/python, scripts/setup.sh's).
"""
import contextlib
import ctypes
import logging
import os

import torch

LIBRARY = "libdiffcheck_sketch_cpu.so"
ENV = "DIFFCHECK_SKETCH_KERNEL"
GROUP_ROWS = 4  # sign rows per pattern byte, as the kernel takes them
_PATTERN_CACHE_LIMIT = 64
_state = {"function": None, "bits": None, "bytes_hash": None, "watch_rows": None, "tried": False, "path": None}
_PATTERNS = {}


def _candidates():
    given = os.environ.get(ENV)
    if given:
        return [] if given.lower() == "off" else [given]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, LIBRARY), os.path.join(here, "..", "..", "..", "build", "python", LIBRARY)]


def function():
    """The kernel's entry point, or None (the torch-ops path then)."""
    if not _state["tried"]:
        _state["tried"] = True
        for path in _candidates():
            if not os.path.exists(path):
                continue
            try:
                library = ctypes.CDLL(path)
                f, b = library.diffcheck_sketch_cpu, library.diffcheck_piece_bits
            except (OSError, AttributeError) as e:
                logging.getLogger("diffcheck").warning("diffcheck: %s does not load (%s): sketches use torch ops",
                                                       path, e)
                continue
            f.restype = ctypes.c_int32
            f.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]
            b.restype = None
            b.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                          ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int64),
                          ctypes.POINTER(ctypes.c_int64)]
            _state["function"], _state["bits"], _state["path"] = f, b, os.path.abspath(path)
            h = getattr(library, "diffcheck_bytes_hash", None)  # absent from a library built before it
            if h is not None:
                h.restype, h.argtypes = ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_int64]
                _state["bytes_hash"] = h
            rows = getattr(library, "diffcheck_watch_rows", None)  # likewise
            if rows is not None:
                rows.restype = None
                rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
                _state["watch_rows"] = rows
            break
        given = os.environ.get(ENV)
        if _state["function"] is None and given and given.lower() != "off":
            logging.getLogger("diffcheck").warning("diffcheck: %s=%s is not a loadable kernel: sketches use torch ops",
                                                   ENV, os.environ[ENV])
        elif _state["function"] is None and not given:
            # Named once per process, never replaced in silence: the fallbacks are slower
            # (sketches in torch ops, the watch's CRC-32 in place of XXH3).
            logging.getLogger("diffcheck").warning(
                "diffcheck: the CPU kernel %s was not found (looked in %s): sketches use torch ops and "
                "dct.watch hashes with CRC-32; `pip install .` from the checkout builds it, or set %s to "
                "its path (\"off\": do without, and say nothing)", LIBRARY, ", ".join(_candidates()), ENV)
    return _state["function"]


def loaded_from():
    """The library's path, or None where the torch-ops path serves."""
    function()
    return _state["path"]


def reset():
    """Look for the library again."""
    _state.update(function=None, bits=None, bytes_hash=None, watch_rows=None, tried=False, path=None)


@contextlib.contextmanager
def torch_ops_only():
    """Within: sketches take the torch-ops path, as without the library (the
    tests compare the two); the library is looked for again after."""
    _state.update(function=None, bits=None, bytes_hash=None, watch_rows=None, tried=True, path=None)
    try:
        yield
    finally:
        reset()


def takes(x):
    """The kernel sketches x (a [lead, tokens, width] view): a plain tensor
    (a subclass's data_ptr need not be its values: an AsyncCollectiveTensor,
    what a tensor-parallel plan's async all-reduce hands on, is a wrapper
    whose collective has not finished), on the CPU, float32 or float64, its
    columns adjacent in memory."""
    return (type(x) is torch.Tensor and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and (x.shape[-1] <= 1 or x.stride(-1) == 1) and function() is not None)


def patterns(sign_rows, k):
    """The kernel's pattern bytes [ceil(k/4), tokens] of sign rows [k+1, tokens]
    (rows < k are +-1): bit b of group g set where row 4g+b is -1. Cached
    with the sign rows they come from."""
    key = id(sign_rows)
    hit = _PATTERNS.get(key)
    if hit is not None and hit[0] is sign_rows:
        return hit[1]
    if len(_PATTERNS) >= _PATTERN_CACHE_LIMIT:
        _PATTERNS.clear()
    tokens = sign_rows.shape[1]
    groups = (k + GROUP_ROWS - 1) // GROUP_ROWS
    bits = torch.zeros(groups * GROUP_ROWS, tokens, dtype=torch.uint8)
    bits[:k] = (sign_rows[:k] < 0).to(torch.uint8)
    weights = (1 << torch.arange(GROUP_ROWS, dtype=torch.uint8))[None, :, None]
    packed = (bits.reshape(groups, GROUP_ROWS, tokens) * weights).sum(1, dtype=torch.uint8).contiguous()
    _PATTERNS[key] = (sign_rows, packed)
    return packed


def sketch(x, sign_rows, k):
    """The float64 sketch [lead, k+1, width] of x [lead, tokens, width] with
    sign rows [k+1, tokens] (the torch path's, rows < k used); None if the
    kernel could not allocate its buckets."""
    lead, tokens, width = x.shape
    out = torch.empty(lead, k + 1, width, dtype=torch.float64)
    if x.numel() == 0:
        return out.zero_()
    pattern_bytes = patterns(sign_rows, k)
    rc = function()(x.data_ptr(), int(x.dtype == torch.float64), lead, x.stride(0), tokens, x.stride(1), width,
                    pattern_bytes.data_ptr(), k, out.data_ptr())
    return out if rc == 0 else None


def takes_bits(x):
    """piece_bits serves x: a contiguous float32 or float64 CPU tensor whose
    rows (last dimension) are whole 8-byte words, as bits_hash reads them;
    a plain tensor, as takes() says."""
    return (type(x) is torch.Tensor and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.is_contiguous()
            and x.numel() > 0 and (x.shape[-1] * x.element_size()) % 8 == 0 and function() is not None)


def piece_bits(x):
    """(nan, inf, hash) of x in one read, as int64 tensors: the exact NaN and
    Inf counts and diffcheck.sketch's bits_hash (a 64-bit two's-complement value)."""
    width = x.shape[-1] if x.dim() else 1
    h, nan, inf = ctypes.c_uint64(), ctypes.c_int64(), ctypes.c_int64()
    _state["bits"](x.data_ptr(), x.element_size(), x.numel() // width, width, ctypes.byref(h), ctypes.byref(nan),
                   ctypes.byref(inf))
    signed = h.value - (1 << 64) if h.value >= 1 << 63 else h.value
    return (torch.tensor(nan.value, dtype=torch.int64), torch.tensor(inf.value, dtype=torch.int64),
            torch.tensor(signed, dtype=torch.int64))


def bytes_hash_function():
    """XXH3's 64-bit hash of a buffer (address, bytes) -> int, from the
    library, or None where it is not loaded (dct.watch then takes zlib's CRC-32)."""
    function()
    return _state["bytes_hash"]


def watch_rows_function():
    """The watch's rows of many buffers in one call (pointers, bytes,
    elements, n, rows out: all int64 arrays) -> None, or None where the
    library is not loaded (or predates it)."""
    function()
    return _state["watch_rows"]
