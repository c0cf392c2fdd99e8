"""Sketch mode on CPU devices: each device's piece of a tap is sketched on
the host by the C kernel (python/kernels/sketch_cpu.c, the one diffcheck.torch
uses), reading the shard's own buffer in place, instead of in an XLA program.

Why: on XLA's CPU backend the sketching program cost 0.4x the forward of
scripts/studies/jax_tap_outputs.py's block (float64 sums at about 1.3
GFLOP/s, slow integer reductions for the hashes), while the taps as plain
outputs cost 0.02x; a CPU device's shard is host memory already, and the
kernel sums in float64 in one read at several GB/s. The pieces go to a pool
of threads (ctypes lets go of the GIL), one job per tap and device.

The sketch is the format's (docs/FORMAT.md, "Sketch taps"): the same signs,
the same token shares among replicas as the XLA program (sketch.py), summed
in float64 for every dtype (the program sums 16-bit taps in float32). The
bits hash is XXH3 of the piece's bytes, 16 hex digits; only replicas of one
run compare it. The XLA program stays for accelerators and where the kernel
is not built; the suite checks the two agree (tests/test_jax_sketch.py)."""
import collections
import concurrent.futures
import ctypes
import os
import threading

import numpy as np

from diffcheck.jax import sketch as jax_sketch
from diffcheck.kernels import library

GROUP_ROWS = 4  # sign rows per pattern byte, as the kernel takes them
PATTERN_CACHE_BYTES = 64 << 20  # the sign patterns kept between calls, at most
_pool = {"executor": None}


def available(mesh):
    """The host path serves: every device of the mesh a CPU, the kernel loaded
    (DIFFCHECK_SKETCH_KERNEL=off: the XLA program)."""
    return (all(d.platform == "cpu" for d in mesh.devices.flat)
            and library.get("diffcheck_sketch_cpu") is not None and library.get("diffcheck_piece_check") is not None)


def takes(dtype):
    return str(dtype) in library.KINDS


def _fmix32(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


class _Kept:
    """The sign patterns made, newest last, up to PATTERN_CACHE_BYTES: a
    capture asks for the same ones every call (seed, rows and each device's
    tokens), and making them anew cost a sixth of the host sketches' time
    (scripts/studies/jax_tap_outputs.py). Read-only arrays; the pool's
    threads share them under a lock."""

    def __init__(self):
        self.arrays, self.bytes, self.lock = collections.OrderedDict(), 0, threading.Lock()

    def get(self, key):
        with self.lock:
            found = self.arrays.get(key)
            if found is not None:
                self.arrays.move_to_end(key)
            return found

    def put(self, key, array):
        array.flags.writeable = False
        with self.lock:
            if key not in self.arrays and array.nbytes <= PATTERN_CACHE_BYTES:
                self.arrays[key] = array
                self.bytes += array.nbytes
                while self.bytes > PATTERN_CACHE_BYTES:
                    self.bytes -= self.arrays.popitem(last=False)[1].nbytes
        return array


_kept = _Kept()


def sign_patterns(seed, k, first, tokens):
    """The kernel's pattern bytes [ceil(k/4), tokens] for global tokens
    first..first+tokens-1 (read-only, kept between calls)."""
    key = (seed, k, first, tokens)
    found = _kept.get(key)
    return found if found is not None else _kept.put(key, _made_patterns(seed, k, first, tokens))


def _made_patterns(seed, k, first, tokens):
    """Bit b of group g set where row 4g+b's sign (FORMAT.md) is -1, i.e.
    where its hash is odd."""
    groups = (k + GROUP_ROWS - 1) // GROUP_ROWS
    t = (np.uint32(first & jax_sketch.MASK32) + np.arange(tokens, dtype=np.uint32)) * np.uint32(0xC2B2AE3D)
    rows = np.array([(seed * 0x9E3779B1 + i * 0x85EBCA77) & jax_sketch.MASK32 for i in range(k)], dtype=np.uint32)
    with np.errstate(over="ignore"):
        odd = (_fmix32(rows[:, None] + t[None, :]) & np.uint32(1)).astype(np.uint8)
    odd = np.concatenate([odd, np.zeros((groups * GROUP_ROWS - k, tokens), np.uint8)])
    weights = (1 << np.arange(GROUP_ROWS, dtype=np.uint8))[None, :, None]
    return np.ascontiguousarray((odd.reshape(groups, GROUP_ROWS, tokens) * weights).sum(1, dtype=np.uint8))


def _check(piece, kind, hash_it):
    h, nan, inf = ctypes.c_uint64(), ctypes.c_int64(), ctypes.c_int64()
    library.get("diffcheck_piece_check")(piece.ctypes.data, kind, piece.size, int(hash_it), ctypes.byref(h),
                                         ctypes.byref(nan), ctypes.byref(inf))
    return nan.value, inf.value, f"{h.value:016x}" if hash_it else "-"


def sketch_piece(piece, first, share_lo, share, k, seed, hashed, dim=-2):
    """(sketch [lead..., k+1, width...] float64, nan, inf, bits hash) of one
    device's piece [..., tokens, width...] (a C-ordered array, its tokens at
    `dim` from the end): its tokens share_lo..share_lo+share-1 sketched, their
    first global token `first` (the piece's own first plus share_lo);
    counted, and hashed if `hashed`, whole."""
    kind = library.KINDS[str(piece.dtype)]
    shape = piece.shape
    piece = jax_sketch.as_tokens_by_width(piece, dim)  # a view: the piece is C-ordered
    tokens, width = piece.shape[-2:]
    lead = int(np.prod(piece.shape[:-2], dtype=np.int64))
    out = np.empty((lead, k + 1, width), np.float64)
    if share and width and lead:
        start = piece.ctypes.data + share_lo * width * piece.itemsize
        patterns = sign_patterns(seed, k, first, share)
        # lead matrices tokens * width apart; the share's tokens a row of width apart
        rc = library.get("diffcheck_sketch_cpu")(start, kind, lead, tokens * width, share, width, width,
                                                 patterns.ctypes.data, k, out.ctypes.data)
        if rc != 0:
            raise MemoryError(f"diffcheck: the CPU sketch kernel could not allocate its buckets ({piece.shape})")
    else:
        out.fill(0)
    if hashed or not np.isfinite(out[:, k]).all():  # finite column sums over the whole piece: no NaN, no Inf
        nan, inf, words = _check(piece, kind, hashed)
    else:
        nan, inf, words = 0, 0, "-"
    return out.reshape(*shape[:len(shape) + dim], k + 1, *shape[len(shape) + dim + 1:]), nan, inf, words


def _executor():
    if _pool["executor"] is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        _pool["executor"] = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                                  thread_name_prefix="diffcheck-sketch")
    return _pool["executor"]


def _coordinates(mesh):
    """device id -> {axis: index} in the mesh."""
    where = {}
    for idx in np.ndindex(mesh.devices.shape):
        where[mesh.devices[idx].id] = dict(zip(mesh.axis_names, idx))
    return where


def _block(axes, where, sizes):
    """The block index along mesh axes `axes` (major first) of the device at
    coordinates `where`, as sketch.py's _block_index computes it in the program."""
    b = 0
    for a in axes:
        b = b * sizes[a] + where[a]
    return b


def sketch_array(x, mesh, k, seed, dim=-2):
    """Futures of every addressable shard's (device id, sketch, nan, inf,
    hash) of the array x, its tokens at `dim` (from the end), sketched as
    sketch.sketch_pieces would under x's own sharding; and (replica axes
    sharing the tokens, hashed)."""
    spec = x.sharding.spec
    coords = _coordinates(mesh)
    shards = x.addressable_shards
    local_tokens = shards[0].data.shape[dim]
    shared, share = jax_sketch.token_share(local_tokens, spec, mesh)
    hashed = bool(jax_sketch.replica_axes(spec, mesh))
    sizes = dict(mesh.shape)
    parts = list(getattr(spec, "partitions", spec))
    token_axes = jax_sketch.entry_axes((parts + [None] * x.ndim)[x.ndim + dim])
    jobs = []
    for shard in shards:
        data = shard.data
        piece = np.asarray(data)  # a CPU device's buffer, read in place
        if not piece.flags.c_contiguous:
            piece = np.ascontiguousarray(piece)
        # (shard.index is refused for an unreduced sharding: the blocks from the device's coordinates)
        where = coords[shard.device.id]
        first = _block(token_axes, where, sizes) * local_tokens
        lo = _block(shared, where, sizes) * share  # the replica's share of the piece's tokens

        def job(device=shard.device.id, piece=piece, first=first + lo, lo=lo, data=data):
            # (data: the device's array held until its buffer is read)
            return (device, *sketch_piece(piece, first, lo, share, k, seed, hashed, dim))
        jobs.append(_executor().submit(job))
    return jobs, "*".join(shared), hashed
