"""Sketch mode for JAX (`capture(..., sketch=True)`): each device's sketch of
its piece of every tap is computed inside the XLA program, and only the
sketches, the NaN/Inf counts and a hash of the piece's bits leave it
(docs/FORMAT.md, "Sketch taps": the same signs as diffcheck.sketch and the
C++ comparator).

A tap's piece on each device is what its sharding says, which XLA chooses:
the program is compiled once with the taps as outputs to read their
shardings (no run), and the sketching program then maps each tap's pieces
with a shard_map over exactly those shardings (unreduced axes included:
each device sketches its partial sum, and the sketches add up). Each
device's results are stacked along a leading axis over all mesh axes, so
device r holds row r."""
import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from diffcheck.dump import SKETCH_KIND  # noqa: F401  # what these sketches are
from diffcheck.dump import sketch_token_dim

MASK32 = 0xFFFFFFFF


def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def signs(seed, k, first_token, tokens):
    """R[i, t] (+1/-1, int32) for rows i < k and global tokens first_token..+tokens,
    in uint32 arithmetic that wraps as FORMAT.md's does."""
    t = first_token.astype(jnp.uint32) + jnp.arange(tokens, dtype=jnp.uint32)
    base = jnp.array([(seed * 0x9E3779B1 + i * 0x85EBCA77) & MASK32 for i in range(k)], dtype=jnp.uint32)
    h = _fmix32(base[:, None] + t[None, :] * jnp.uint32(0xC2B2AE3D))
    return 1 - 2 * (h & 1).astype(jnp.int32)


def _words(x):
    """The piece's bits as uint32 words, [rows, words per row] (16-bit values
    widened one each, 8-byte ones as two words)."""
    size = jnp.dtype(x.dtype).itemsize
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    if size == 2:
        return jax.lax.bitcast_convert_type(rows, jnp.uint16).astype(jnp.uint32)
    words = jax.lax.bitcast_convert_type(rows, jnp.uint32)
    return words.reshape(words.shape[0], -1)


def _odd_weights(n, multiplier):
    return jnp.arange(n, dtype=jnp.uint32) * jnp.uint32(multiplier) | jnp.uint32(1)


def bits_hash(x):
    """32 bits of the piece's bits: each row's words weighted by their column
    and summed, the row sums weighted by their row and summed (wrapping; odd
    weights). Equal bits give equal hashes (only replicas of one run compare
    them); one read of the piece. (A second set of weights for 64 bits cost
    3.6x one set's time in XLA's CPU integer reductions.)"""
    words = _words(x)
    rows = jnp.sum(words * _odd_weights(words.shape[1], 0x9E3779B1)[None, :], axis=1, dtype=jnp.uint32)
    return jnp.sum(rows * _odd_weights(words.shape[0], 0x85EBCA77), dtype=jnp.uint32)[None]


def accumulator(dtype):
    """What a tap is sketched in, as diffcheck.sketch does: float64 for float32
    (and float64) taps, whose errors of 1e-7 a float32 sketch would round
    over; float32 for 16-bit ones. float64 exists only where x64 is on: the
    sketch is traced inside jax.enable_x64, the user's program outside it."""
    return jnp.float32 if jnp.dtype(dtype).itemsize <= 2 else jnp.float64


def sketch_dim(shape, dtype, k):
    """The token dimension (counted from the end) of a floating tap of global
    `shape`: -2 where it holds more tokens than the sketch has rows; else -3
    where that one does (attention's [..., sequence, heads, head_dim], whose
    heads are too few: the format's `sketch_dim`); None: the tap is written
    whole (not floating, under 2-D, or no dimension long enough)."""
    if not jnp.issubdtype(dtype, jnp.floating):
        return None
    return sketch_token_dim(len(shape), lambda dim: shape[dim], k)


def as_tokens_by_width(piece, dim):
    """The piece [lead..., tokens, width...] (tokens at `dim` from the end)
    as [lead..., tokens, width], its width dimensions one (row-major)."""
    d = piece.ndim + dim
    return piece.reshape(*piece.shape[:d + 1], int(np.prod(piece.shape[d + 1:], dtype=np.int64)))


def _block_index(entry, axis_sizes):
    b = jnp.int32(0)
    for a in entry:
        b = b * axis_sizes[a] + jax.lax.axis_index(a)
    return b


def entry_axes(entry):
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _sketch_sums(r, x, acc):
    """r [k+1, T] (+-1) times x [..., T, W], summed over T in `acc`. (float64
    for float32 taps is exact where a float32 sum would add an error as large
    as a clean float32 tap's own; on XLA's CPU backend a 9-row float64
    product runs at about 1.3 GFLOP/s, the main cost of sketch mode there:
    float32 sums over blocks of 32 tokens cost a sixth of it, but carried an
    error 0.8x that of a tap at rel 1e-7, so they are not used.)"""
    return jnp.einsum("it,...tw->...iw", r.astype(acc), x.astype(acc))


def replica_axes(spec, mesh):
    """The mesh axes of size > 1 that a PartitionSpec neither splits nor sums over."""
    used = set(getattr(spec, "unreduced", ()) or ())
    for entry in getattr(spec, "partitions", spec):
        used.update(entry_axes(entry))
    return [a for a, n in mesh.shape.items() if n > 1 and a not in used]


def token_share(tokens, spec, mesh):
    """(replica axes that share the sketching, tokens each sketches): the
    replicas of a piece split its tokens evenly where they divide them (the
    format's `sketch_shared`); else every replica sketches all ([], tokens)."""
    replicas = replica_axes(spec, mesh)
    n = int(np.prod([mesh.shape[a] for a in replicas])) if replicas else 1
    return (replicas, tokens // n) if replicas and tokens % n == 0 else ([], tokens)


def sketch_pieces(x, spec, mesh, k, seed, dim=-2):
    """(sketch [n, lead..., k+1, width...], nan [n], inf [n], hash [n, 1]) of
    every device's piece of x under PartitionSpec `spec`, its tokens at `dim`
    (from the end): row r is rank r's. Replicas share the sketching of their
    piece's tokens (token_share); each counts and hashes its whole piece (a
    piece without replicas is not hashed)."""
    axes = tuple(mesh.axis_names)
    sizes = dict(mesh.shape)
    parts = list(getattr(spec, "partitions", spec))
    parts += [None] * (x.ndim - len(parts))
    token_axes = entry_axes(parts[x.ndim + dim])
    local_tokens = x.shape[dim] // int(np.prod([sizes[a] for a in token_axes] or [1]))
    shared, share = token_share(local_tokens, spec, mesh)
    hashed = bool(replica_axes(spec, mesh))
    acc = accumulator(x.dtype)

    def local(piece):
        first = _block_index(token_axes, sizes) * piece.shape[dim]
        part = as_tokens_by_width(piece, dim)
        if shared:
            lo = _block_index(shared, sizes) * share
            part = jax.lax.dynamic_slice_in_dim(part, lo, share, axis=part.ndim - 2)
            first = first + lo
        r = jnp.concatenate([signs(seed, k, first, share), jnp.ones((1, share), jnp.int32)])
        sketch = _sketch_sums(r, part, acc)
        # A column whose sum is finite holds no NaN or Inf: the counting pass
        # runs only when one is not (a share's sums say nothing of the rest).
        counts = lambda p: (jnp.sum(jnp.isnan(p), dtype=jnp.int32), jnp.sum(jnp.isinf(p), dtype=jnp.int32))  # noqa: E731
        zero = lambda p: (jnp.int32(0), jnp.int32(0))  # noqa: E731
        finite = jnp.all(jnp.isfinite(sketch[..., k, :])) if not shared else jnp.isfinite(jnp.sum(piece))
        nan, inf = jax.lax.cond(finite, zero, counts, piece)
        words = bits_hash(piece) if hashed else jnp.zeros(1, jnp.uint32)
        sketch = sketch.reshape(*piece.shape[:piece.ndim + dim], k + 1, *piece.shape[piece.ndim + dim + 1:])
        return sketch[None], nan[None], inf[None], words[None]

    stacked = P(axes)
    with jax.enable_x64(acc == jnp.float64):
        out = jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=(stacked, stacked, stacked, stacked),
                            check_vma=False)(x)
    return out, "*".join(shared), hashed


def hash_string(words, hashed=True):
    """8 hex digits of the hash's uint32 word ("-": not hashed, no replica compares it)."""
    if not hashed:
        return "-"
    return f"{int(np.asarray(words).reshape(-1)[0]) & MASK32:08x}"
