"""Taps inside jax.checkpoint (jax.remat) bodies, as JAX LLM and DiT code wraps
every layer (MaxText's decoder layers, flax's nn.remat).

A checkpoint's body is traced on its own, so a value tapped there cannot
leave the compiled program as an output of the captured function. While a
capture traces, `jax.checkpoint` and `jax.remat` are replaced by a version
whose body also returns the values tapped in it: they leave the checkpoint
as its outputs, in the captured function's trace, and go on as any tap does.
The checkpoint's recomputation is unchanged (its outputs are what it saves;
a tapped value is then kept for the backward as an output would be).

Inside a shard_map body the original serves: each device hands its blocks
over (host_taps.py), the body's recomputation included.

What is covered: a checkpoint made while the capture traces (jax.checkpoint
called in the function, flax linen's nn.remat, which calls jax.remat when
the module is applied). A function made with jax.checkpoint before the
capture began (nnx.remat at a module's definition) keeps the original: its
taps are refused by name, as before.

Gradients (backward=True): a checkpoint's backward traces its body again in
a trace of its own, where a tap's cotangent cannot leave. So with
backward=True the checkpoint is made a custom_vjp with the same
rematerialisation, spelt out: its forward runs the body (keeping only its
inputs), its backward runs the body again under jax.vjp, with a zero added
to each tapped value as an extra input; that input's cotangent is the tap's
gradient, made in the backward's own transpose, in the captured function's
trace, where it leaves as `grad/<name>` (remat_gradients.py). The values
computed are the same; the checkpoint's policy (what it saves) becomes
"save nothing but the inputs"."""
import contextlib
import functools

import jax

from diffcheck.jax import host_taps as jax_host_taps
from diffcheck.jax import remat_gradients
from diffcheck.jax import taps as jax_taps

_NAMES = ("checkpoint", "remat")


def _checkpoint_with_taps(original):
    def checkpoint(fun=None, **options):
        if fun is None:  # functools.partial(jax.checkpoint, policy=...) style, called with options only
            return functools.partial(checkpoint, **options)
        remat_plain = original(fun, **options)
        # The body's collector is its first argument, static: a new trace per call (jax caches a body's
        # trace by its arguments, and each call's taps must be made again). The user's static positions
        # move up by one (a negative one counts from the end, which stays).
        static = options.get("static_argnums", ())
        static = (static,) if isinstance(static, int) else tuple(static)
        moved = (0,) + tuple(d + 1 if d >= 0 else d for d in static)
        remat_with_taps = original(_body_with_taps(fun), **{**options, "static_argnums": moved})

        @functools.wraps(fun)
        def run(*args, **kwargs):
            outer = jax_taps.current()
            if getattr(outer, "perturbing", False):
                # a checkpoint nested in a body run again for its taps' gradients (remat_gradients.py): run
                # inline, its taps perturbed in the rerun's trace (a jax.checkpoint here would cache its body's
                # trace, keyed by the function, with this rerun's perturbations in it)
                return fun(*args, **kwargs)
            if outer is None or jax_host_taps.manual_axes():  # inside a shard_map body each device hands its taps over
                return remat_plain(*args, **kwargs)
            if outer.backward:  # the taps' gradients too: the rematerialisation spelt out (remat_gradients.py)
                return remat_gradients.call(fun, static, outer, args, kwargs)
            inner = outer.inner()
            out, values = remat_with_taps(inner, *args, **kwargs)
            outer.adopt(inner, values)
            return out
        return run
    return checkpoint


def _body_with_taps(fun):
    @functools.wraps(fun)
    def body(collector, *args, **kwargs):
        with jax_taps.collecting(collector):
            out = fun(*args, **kwargs)
        return out, collector.body_values()
    return body


@contextlib.contextmanager
def taps_through_checkpoints():
    """While a capture traces: jax.checkpoint and jax.remat made in it pass their bodies' taps out."""
    was = {name: getattr(jax, name) for name in _NAMES}
    patched = _checkpoint_with_taps(was["checkpoint"])
    for name in _NAMES:
        setattr(jax, name, patched)
    try:
        yield
    finally:
        for name, f in was.items():
            setattr(jax, name, f)
