"""A cache of the references of JAX checks (`check(..., reference_cache=DIR)`):
the float64 reference and the one-device yardstick of a program, kept under
a key of what they are computed from, so that runs under other XLA flags are
judged against the references made without them.

The key is a hash of the jax version, the program traced on the one-device
mesh (its jaxpr's text and constants: the function, its shapes and dtypes,
and settings that change the program, as ULYSSES_ATTENTION_CHUNKS does),
and the inputs' bytes. XLA flags and the environment are not in it: they
act when the program is compiled, which is what a flag bisect varies. The
first run computes the references (a bisect's first trial runs the
baseline, without the flags under test) and the next ones read them.
"""
import hashlib
import os
import shutil

import jax
import numpy as np

from diffcheck.jax import one_device as one

CACHED = (".h5", ".one_device.rank0.h5")  # the reference, the yardstick


def key(capture, args, kwargs):
    """The hex key of a capture's references for these inputs."""
    h = hashlib.sha256(f"diffcheck.jax reference 1 jax {jax.__version__}".encode())
    mesh1 = one.one_device_mesh(capture.mesh)
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    args1, kwargs1 = one.to_one_device((args, kwargs), mesh1, widen=False)
    with jax.set_mesh(mesh1):
        closed = jax.make_jaxpr(capture._traced)(*args1, **kwargs1)
    h.update(str(closed.jaxpr).encode())
    for value in list(closed.consts) + leaves:
        if one.is_array(value):
            a = np.ascontiguousarray(one.gathered(value))
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()[:24]


def fetch(cache_dir, key_hex, stem):
    """Copies the cached references to `stem` (.h5 and .one_device.rank0.h5);
    False when the cache has not both."""
    cached = os.path.join(cache_dir, key_hex)
    if not all(os.path.exists(cached + suffix) for suffix in CACHED):
        return False
    for suffix in CACHED:
        os.makedirs(os.path.dirname(os.path.abspath(stem + suffix)), exist_ok=True)
        shutil.copyfile(cached + suffix, stem + suffix)
    return True


def store(cache_dir, key_hex, stem):
    """Keeps the references just written at `stem` (whole or not at all)."""
    os.makedirs(cache_dir, exist_ok=True)
    cached = os.path.join(cache_dir, key_hex)
    for suffix in CACHED:
        shutil.copyfile(stem + suffix, cached + suffix + ".tmp")
    for suffix in CACHED:
        os.replace(cached + suffix + ".tmp", cached + suffix)
