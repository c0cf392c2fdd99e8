"""The fused CPU sketch (python/kernels/sketch_cpu.c, built by CMake as
libdiffcheck_sketch_cpu.so, loaded by diffcheck/kernels/library.py) for
torch tensors: a float32 or float64 tap on the CPU sketched in one pass,
summed in float64, where the torch-ops path of diffcheck/sketch/__init__.py
makes three passes. Same sketch, same verdicts (the suite checks the two
agree); where the library is not found the torch-ops path serves, and a
warning says so once. Where it is looked for: diffcheck/kernels/library.py
($DIFFCHECK_SKETCH_KERNEL, "off": not at all).
"""
import ctypes

import torch

from diffcheck.kernels import library

LIBRARY, ENV = library.LIBRARY, library.ENV
GROUP_ROWS = 4  # sign rows per pattern byte, as the kernel takes them
_PATTERN_CACHE_LIMIT = 64
_PATTERNS = {}


def function():
    """The kernel's entry point, or None (the torch-ops path then)."""
    return library.get("diffcheck_sketch_cpu")


loaded_from, reset = library.loaded_from, library.reset
torch_ops_only = library.without  # within: sketches take the torch-ops path, as without the library


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
    library.get("diffcheck_piece_bits")(x.data_ptr(), x.element_size(), x.numel() // width, width, ctypes.byref(h),
                                        ctypes.byref(nan), ctypes.byref(inf))
    signed = h.value - (1 << 64) if h.value >= 1 << 63 else h.value
    return (torch.tensor(nan.value, dtype=torch.int64), torch.tensor(inf.value, dtype=torch.int64),
            torch.tensor(signed, dtype=torch.int64))


def bytes_hash_function():
    """XXH3's 64-bit hash of a buffer (address, bytes) -> int, from the
    library, or None where it is not loaded (dct.watch then takes zlib's CRC-32)."""
    return library.get("diffcheck_bytes_hash")


def watch_rows_function():
    """The watch's rows of many buffers in one call (pointers, bytes,
    elements, n, rows out: all int64 arrays) -> None, or None where the
    library is not loaded (or predates it)."""
    return library.get("diffcheck_watch_rows")
