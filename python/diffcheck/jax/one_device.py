"""The reference runs of a JAX capture: the same function on one device, on a
mesh of the same axis names with every size 1 (so shard_map, reshard and
out_sharding= in the function work unchanged), its inputs gathered whole and,
for the float64 reference, widened."""
import numpy as np

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def one_device_mesh(mesh):
    """A mesh of `mesh`'s axis names and types, every size 1, on this process's first device."""
    device = jax.local_devices()[0]
    shape = (1,) * len(mesh.axis_names)
    kwargs = {"axis_types": mesh.axis_types} if getattr(mesh, "axis_types", None) is not None else {}
    return Mesh(np.array([device]).reshape(shape), mesh.axis_names, **kwargs)


def gathered(x):
    """The whole value of an array as numpy (all processes take part when the
    array spans processes: jax's process_allgather is collective)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _spec_without_reductions(sharding, ndim):
    if isinstance(sharding, NamedSharding):
        spec = sharding.spec
        return P(*list(getattr(spec, "partitions", spec))[:ndim])
    return P()


def is_array(x):
    return isinstance(x, (jax.Array, np.ndarray))


def is_key(x):
    """A typed PRNG key array (an nnx.Rngs' state): numpy cannot hold it, its key data can."""
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_one_device(tree, mesh1, widen):
    """Every array leaf of `tree` whole on mesh1's device, with its
    PartitionSpec (its axes have size 1 there); floating leaves as float64
    when `widen` (call inside jax.enable_x64). A PRNG key array moves as
    its key data, wrapped again with its implementation. Other leaves as
    they are."""
    def move(x):
        if is_key(x):
            return jax.random.wrap_key_data(move(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        if not is_array(x):
            return x
        a = gathered(x)
        if widen and np.issubdtype(a.dtype, np.floating) or widen and a.dtype.name == "bfloat16":
            a = a.astype(np.float64)
        return jax.device_put(a, NamedSharding(mesh1, _spec_without_reductions(getattr(x, "sharding", None),
                                                                                a.ndim)))
    return jax.tree_util.tree_map(move, tree)


def gather_everywhere(tree):
    """The array leaves as whole numpy arrays (collective across processes)."""
    return jax.tree_util.tree_map(lambda x: gathered(jax.random.key_data(x)) if is_key(x) else
                                  gathered(x) if is_array(x) else x, tree)


def run_dtype(tree):
    """The first floating dtype among the array leaves ('float32', 'bfloat16'), else None."""
    for leaf in jax.tree_util.tree_leaves(tree):
        dt = getattr(leaf, "dtype", None)
        if dt is not None and jax.dtypes.issubdtype(dt, np.floating):  # bfloat16 too; a PRNG key is none
            return dt.name
    return None


def warn_narrow_reference(narrow, total, path):
    """A "float64 reference" whose taps are not float64 is said, once: the
    model cast its values to its own dtype (MaxText's config dtype), so the
    reference is no more precise than the run; compare holds those taps to
    the derived rule instead of a noise floor."""
    if not narrow:
        return
    import warnings
    names = ", ".join(f"{n} ({d})" for n, d in narrow[:3]) + (", ..." if len(narrow) > 3 else "")
    warnings.warn(f"{path}: {len(narrow)} of {total} reference taps are not float64 ({names}): the model computes "
                  "in its own dtype under jax.enable_x64; give it float64 (its dtype setting) for a reference more "
                  "precise than the run", stacklevel=4)


def rebuilt(build, step, mesh1, dtype):
    """The function of the model `build(mesh1, dtype)` makes (nnx.as_function):
    a module that owns its mesh cannot run on another, so the references run
    one built for theirs; the run's state (moved to mesh1 by the caller)
    replaces the one it was built with."""
    from diffcheck.jax import nnx as jax_nnx
    import jax.numpy as jnp
    model = build(mesh1, jnp.dtype(dtype))
    if not jax_nnx.is_module(model):
        raise TypeError(f"build(mesh, {dtype}) returned a {type(model).__name__}, not an nnx.Module")
    return jax_nnx.as_function(model, step)[0]


def name_an_owned_mesh(error, path):
    """JAX's refusal of a program that holds the sharded mesh, run on the
    references' one-device mesh, raised again with its cause and the fix."""
    text = str(error)
    if not ("should match the mesh" in text or "incompatible devices" in text or "should match the aval mesh" in text):
        return
    raise ValueError(f"{path}: the references run the program on a one-device mesh, but it holds the sharded mesh "
                     "inside an object diffcheck does not reach (it swaps the mesh, its NamedShardings and arrays "
                     "that the function reads from closures, globals and its object's attributes, and the mesh a "
                     "shard_map made before keeps: docs/jax.md, \"The references\"), such as a model built for "
                     "that mesh before the capture. Build it inside the function from the context's mesh "
                     "(jax.sharding.get_abstract_mesh()), "
                     "or for an nnx.Module give dcj.check(..., build=lambda mesh, dtype: Model(..., mesh, dtype)): "
                     "the references' model is built on their mesh and takes the run's state. JAX said: "
                     f"{text.splitlines()[0][:300]}") from error
