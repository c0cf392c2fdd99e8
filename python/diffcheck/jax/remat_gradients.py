"""The gradients of taps inside a jax.checkpoint body (backward=True): the
checkpoint made a custom_vjp whose backward rematerialises the body itself.

jax.checkpoint's backward traces its body again in a trace of its own, so a
tap's cotangent made there cannot leave the compiled program. Here:

- the forward runs the body once, as the checkpoint would, its taps
  collected and returned beside its output (remat_taps.py adopts them), and
  keeps only the body's inputs;
- the backward runs the body again under jax.vjp, with each tapped floating
  value given a zero as an extra input (x + 0, the tap's `eps`). The
  cotangent of that input is the tap's gradient, and it is made in the
  backward's own trace, the captured function's, where it is recorded as
  `grad/<name>` and leaves with the other taps.

The output's cotangent is the checkpoint's (the same body, the same vjp);
what is saved becomes the inputs alone, as jax.checkpoint's default policy.
Arguments that are not arrays (a flag, a config, the checkpoint's static
positions) are closed over, not differentiated."""
import jax
import jax.numpy as jnp
import numpy as np

from diffcheck.jax import taps as jax_taps


def _split(args, kwargs, static):
    """(the array leaves of args and kwargs, rebuild(leaves) -> (args, kwargs)):
    static positions and leaves that are not arrays stay as they are."""
    n = len(args)
    static = {i % n for i in static if -n <= i < n}
    held = [None if i in static else a for i, a in enumerate(args)]
    leaves, tree = jax.tree_util.tree_flatten((held, kwargs))
    dynamic = [isinstance(v, (jax.Array, np.ndarray)) for v in leaves]

    def rebuild(arrays):
        it = iter(arrays)
        full = [next(it) if d else v for v, d in zip(leaves, dynamic)]
        a, kw = jax.tree_util.tree_unflatten(tree, full)
        return tuple(args[i] if i in static else a[i] for i in range(n)), kw
    return [v for v, d in zip(leaves, dynamic) if d], rebuild


def _floating(v):
    return hasattr(v, "dtype") and jnp.issubdtype(v.dtype, jnp.floating)


def call(fun, static, outer, args, kwargs):
    """fun(*args, **kwargs) as jax.checkpoint(fun) would run it, its taps
    adopted by `outer` and their gradients recorded when a backward runs."""
    snapshot = dict(outer.calls)  # the numbering the body's taps start from (the backward's run names them alike)
    arrays, rebuild = _split(args, kwargs, static)
    made = {}  # the forward's collector, once traced

    def forward(arrays):
        inner = outer.inner()
        inner.gradients_by_recompute = True  # remat_gradients records them: not "not taken"
        a, kw = rebuild(arrays)
        with jax_taps.collecting(inner):
            out = fun(*a, **kw)
        made["inner"] = inner
        return out, inner.body_values()

    @jax.custom_vjp
    def body(arrays):
        return forward(arrays)

    def body_fwd(arrays):
        return forward(arrays), arrays

    def body_bwd(arrays, cotangents):
        tapped = [(name, v) for name, v in made["inner"].values
                  if v is not jax_taps.HOSTED and _floating(v) and outer.wanted(name)]
        eps = {name: jnp.zeros(v.shape, v.dtype) for name, v in tapped}

        def perturbed(arrays, eps):
            a, kw = rebuild(arrays)
            with jax_taps.collecting(jax_taps.Perturbing(outer, snapshot, eps)):
                return fun(*a, **kw)
        _, pullback = jax.vjp(perturbed, arrays, eps)
        d_arrays, d_eps = pullback(cotangents[0])
        for name, _ in tapped:
            outer.root._record(f"grad/{name}", d_eps[name])
        return (d_arrays,)
    body.defvjp(body_fwd, body_bwd)

    out, values = body(arrays)
    outer.adopt(made["inner"], values)
    return out
