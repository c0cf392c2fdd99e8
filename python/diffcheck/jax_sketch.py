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


def _bits(x):
    """The piece's bits as uint32 words (16-bit values widened one each)."""
    size = jnp.dtype(x.dtype).itemsize
    if size == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32).reshape(-1)
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)  # 8 bytes: two words each


def bits_hash(x):
    """Two uint32 sums over the piece's words, each word weighted by a function
    of its place (equal bits give equal hashes; only replicas compare them)."""
    words = _bits(x)
    i = jnp.arange(words.shape[0], dtype=jnp.uint32)
    w1 = _fmix32(i * jnp.uint32(0x9E3779B1)) | jnp.uint32(1)
    return jnp.stack([jnp.sum(words * w1, dtype=jnp.uint32), jnp.sum(_fmix32(words ^ i), dtype=jnp.uint32)])


def accumulator(dtype):
    """What a tap is sketched in, as diffcheck.sketch does: float64 for float32
    (and float64) taps, whose errors of 1e-7 a float32 sketch would round
    over; float32 for 16-bit ones. float64 exists only where x64 is on: the
    sketch is traced inside jax.enable_x64, the user's program outside it."""
    return jnp.float32 if jnp.dtype(dtype).itemsize <= 2 else jnp.float64


def sketchable(shape, dtype, k):
    """Floating, at least 2-D, and more global tokens than the sketch has rows."""
    return (len(shape) >= 2 and jnp.issubdtype(dtype, jnp.floating) and shape[-2] > k + 1)


def _block_index(entry, axis_sizes):
    b = jnp.int32(0)
    for a in entry:
        b = b * axis_sizes[a] + jax.lax.axis_index(a)
    return b


def _entry_axes(entry):
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def sketch_pieces(x, spec, mesh, k, seed):
    """(sketch [n, lead..., k+1, width], nan [n], inf [n], hash [n, 2]) of
    every device's piece of x under PartitionSpec `spec`: row r is rank r's."""
    axes = tuple(mesh.axis_names)
    sizes = dict(mesh.shape)
    parts = list(getattr(spec, "partitions", spec))
    parts += [None] * (x.ndim - len(parts))
    token_axes = _entry_axes(parts[x.ndim - 2])
    acc = accumulator(x.dtype)

    def local(piece):
        tokens = piece.shape[-2]
        first = _block_index(token_axes, sizes) * tokens
        r = jnp.concatenate([signs(seed, k, first, tokens), jnp.ones((1, tokens), jnp.int32)]).astype(acc)
        sketch = jnp.einsum("it,...tw->...iw", r, piece.astype(acc))
        nan = jnp.sum(jnp.isnan(piece), dtype=jnp.int32)
        inf = jnp.sum(jnp.isinf(piece), dtype=jnp.int32)
        return sketch[None], nan[None], inf[None], bits_hash(piece)[None]

    stacked = P(axes)
    with jax.enable_x64(acc == jnp.float64):
        return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=(stacked, stacked, stacked, stacked),
                             check_vma=False)(x)


def hash_string(words):
    """16 hex digits of the two uint32 words."""
    a, b = (int(v) & MASK32 for v in np.asarray(words).reshape(-1)[:2])
    return f"{a:08x}{b:08x}"
