"""Keyword arguments with no array in them (`enable_dropout=False`,
`model_mode="train"`, a config object) are static: the function sees the
Python value, as a `static_argnames=` of jax.jit would give it, not a tracer
(`if enable_dropout:` in MaxText's decoder raised TracerBoolConversionError).

They travel as a pytree node with no children whose value is its auxiliary
data, so every trace of the capture (jit, make_jaxpr, eval_shape, lower)
holds them static and jit's cache is keyed on them, with no path of its own.
A value that cannot be hashed stays as it was (traced where it has leaves).
"""
import jax
import numpy as np


@jax.tree_util.register_pytree_node_class
class Static:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def tree_flatten(self):
        return (), self.value

    @classmethod
    def tree_unflatten(cls, value, children):
        return cls(value)

    def __repr__(self):
        return f"Static({self.value!r})"


def _holds_arrays(value):
    return any(isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or hasattr(leaf, "aval")
               for leaf in jax.tree_util.tree_leaves(value))


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        return False
    return True


def wrap(kwargs):
    """kwargs with each value that holds no array (and can be hashed) made static."""
    return {k: Static(v) if not isinstance(v, Static) and not _holds_arrays(v) and _hashable(v) else v
            for k, v in kwargs.items()}


def unwrap(kwargs):
    return {k: v.value if isinstance(v, Static) else v for k, v in kwargs.items()}
