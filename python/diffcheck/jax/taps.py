"""Where `diffcheck.jax.tap(name, x)` puts its value while a capture runs the
function: taps of the function's own trace (the jitted function's, or
concrete arrays when it runs eagerly) become extra outputs of the compiled
program, so they leave it with the result, with no host round trip per tap.

A value of an inner trace cannot leave that way. Inside a shard_map body,
each device hands its block to the host (host_taps.py); a jax.checkpoint
body made while the capture traces returns its taps as extra outputs
(remat_taps.py). Elsewhere (the body of a lax.scan or an inner jax.jit
outside shard_map) such a tap is reported by name, never dropped in silence. A pytree is
tapped leaf by leaf, `name/<key path>`."""
import contextlib
import fnmatch
import re
import threading
import warnings

import jax
from jax._src import core as jax_core

from diffcheck.jax import host_taps as jax_host_taps

_state = threading.local()


class TapError(ValueError):
    """A tap the capture cannot take as asked (the message names it)."""


def _key_name(key):
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def leaves_with_names(name, tree):
    """[(tap name, leaf)] of a value: an array is itself, a pytree its leaves
    under `name/a.b.0`."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    if len(flat) == 1 and not flat[0][0]:
        return [(name, flat[0][1])]
    out = []
    for path, leaf in flat:
        keys = [_key_name(k) for k in path]
        if len(keys) > 1 and keys[-1] == "value":  # an nnx Variable's array: named as the variable
            keys.pop()
        out.append((f"{name}/{'.'.join(keys)}", leaf))
    return out


class Collector:
    """The taps of one traced (or eager) call, in the order they were made."""

    def __init__(self, include, exclude, backward=False, unroll=False, host=None):
        """unroll: the function is traced with inner jits inline and scans
        step by step (jax.disable_jit), so a tap made again in a later step
        is numbered `name@k`, not refused. host: the capture's HostSink, for
        taps inside shard_map bodies."""
        self.include, self.exclude, self.backward, self.unroll = include, exclude, backward, unroll
        self.host = host
        self.values, self.names, self.unseen, self.calls, self.hosted = [], set(), [], {}, set()
        self.trace = None
        self.root = self  # the captured function's collector (an inner one's: remat_taps.py)
        self.remat_gradients = []  # taps inside jax.checkpoint bodies whose gradients are not taken
        self.gradients_by_recompute = False  # a checkpoint body's, whose gradients remat_gradients.py takes

    def wanted(self, name):
        base = re.sub(r"@\d+", "", name)
        return (any(fnmatch.fnmatchcase(base, p) for p in self.include)
                and not any(fnmatch.fnmatchcase(base, p) for p in self.exclude))

    def add(self, name, x, numbered=False, spec=None):
        """Records tap `name`; returns x (with backward=True, its floating
        leaves wrapped so that their gradients are tapped as `grad/<name>`
        when a jax.grad inside the function computes them).
        numbered: a module's output, `name@k` when the name is taken (its k-th call).
        spec: the layout of a value inside a shard_map body (host_taps.py)."""
        name = numbered_name(self, name, numbered)
        self._record(name, x, spec)
        if not self.backward or name.startswith("grad/") or self.gradients_by_recompute:
            return x
        if self.root is not self:  # inside a jax.checkpoint body: its gradient is made where no tap leaves
            self.root.remat_gradients += [n for n, _ in leaves_with_names(name, x) if self.wanted(n)]
            return x
        leaves, tree = jax.tree_util.tree_flatten(x)
        named = leaves_with_names(name, x)
        # A value inside a shard_map body: its forward only (its gradient is the body's transpose's).
        wrapped = [_gradient_tap(self.root, n, leaf) if self.wanted(n) and n not in self.hosted else leaf
                   for (n, _), leaf in zip(named, leaves)]
        return jax.tree_util.tree_unflatten(tree, wrapped)

    def _record(self, name, x, spec=None):
        for leaf_name, leaf in leaves_with_names(name, x):
            if leaf_name in self.names:
                raise TapError(f"tap '{leaf_name}' is made twice in one call: tap names must be unique "
                               "(a value in a loop: name it per step, e.g. f'block{i}/out')")
            self.names.add(leaf_name)
            if not self.wanted(leaf_name):
                continue
            leaf = self._primal(leaf)
            inner = isinstance(leaf, jax_core.Tracer) and leaf._trace is not self.trace
            if inner and self.host is not None and jax_host_taps.manual_axes():
                self.host.emit(len(self.values), leaf_name, leaf, spec, TapError)
                self.values.append((leaf_name, HOSTED))
                self.hosted.add(leaf_name)
                continue
            if spec is not None:
                raise TapError(f"tap '{leaf_name}': spec= is for a value inside a shard_map body; elsewhere the "
                               "layout is read from the array's sharding")
            if inner:
                self.unseen.append(leaf_name)
                continue
            if not hasattr(leaf, "shape"):
                raise TapError(f"tap '{leaf_name}' is a {type(leaf).__name__}, not an array")
            self.values.append((leaf_name, leaf))

    def inner(self):
        """The collector of a jax.checkpoint body traced inside this one's call
        (remat_taps.py): the same names and numbering, values of its own."""
        sub = Collector(self.include, self.exclude, self.backward, self.unroll, self.host)
        sub.names, sub.calls, sub.hosted, sub.root = self.names, self.calls, self.hosted, self.root
        return sub

    def body_values(self):
        """The values tapped in a checkpoint body, which it returns as outputs."""
        return [v for _, v in self.values if v is not HOSTED]

    def adopt(self, inner, values):
        """An inner collector's taps, their values as the checkpoint returned them (in this trace)."""
        returned = iter(values)
        for name, v in inner.values:
            if v is not HOSTED:
                v = self._primal(next(returned))  # under jax.grad: the forward's value
                if isinstance(v, jax_core.Tracer) and v._trace is not self.trace:
                    self.unseen.append(name)
                    continue
            self.values.append((name, v))
        self.unseen += inner.unseen

    def _primal(self, x):
        """A value under jax.grad or jax.jvp inside the captured function:
        its primal, the forward's value, when that belongs to the capture's trace."""
        while isinstance(x, jax_core.Tracer) and x._trace is not self.trace and hasattr(x, "primal"):
            x = x.primal
        return x

    def outputs(self):
        """The taps as one pytree output: keys sort in execution order (jax
        flattens a dict by its sorted keys), and carry the names."""
        if self.unseen:
            inner = ("jax.checkpoint" if self.unroll else "lax.scan, jax.checkpoint or an inner jax.jit")
            raise TapError(
                f"tap{'s' if len(self.unseen) > 1 else ''} {', '.join(repr(n) for n in self.unseen[:5])} "
                f"{'are' if len(self.unseen) > 1 else 'is'} inside a body JAX traces on its own ({inner}): "
                "this capture takes taps from the captured function's own trace, where they leave the compiled "
                "program as outputs (or, inside a shard_map body, from each device). Tap the value where the "
                "body returns it" + ("" if self.unroll else "; or capture(..., unroll=True): inner "
                "jits traced inline and scans step by step, each step's tap numbered name@k"))
        if self.remat_gradients:  # never a silent gap
            warnings.warn(f"diffcheck.jax: {self.left_out()}", stacklevel=4)
        return {f"{i:06d}:{name}": v for i, (name, v) in enumerate(self.values) if v is not HOSTED}

    def left_out(self):
        """What the capture could not tap, and why (warned, and written in the files' root `left_out`), or None."""
        names = self.remat_gradients
        if not names:
            return None
        return (f"the gradients of {len(names)} tap(s) inside jax.checkpoint bodies are not tapped (the backward "
                f"recomputes a body in a trace of its own): {', '.join('grad/' + n for n in names[:5])}"
                f"{', ...' if len(names) > 5 else ''}; their forward values are")


def numbered_name(collector, name, numbered):
    """A module's output (numbered) is `name@k` at its k-th call; with unroll, so is a name made again."""
    again = collector.unroll and any(n == name or n.startswith(name + "/") for n in collector.names)
    if numbered or again:
        collector.calls[name] = k = collector.calls.get(name, 0 if again else -1) + 1
        name = f"{name}@{k}" if k else name
    return name


class Perturbing:
    """The collector of a checkpoint body run again for its taps' gradients
    (remat_gradients.py): it records nothing, and returns each tapped leaf
    plus its zero `eps[leaf name]` (the extra input whose cotangent is the
    tap's gradient). Names are numbered as the forward's were."""

    backward = False
    perturbing = True

    def __init__(self, like, calls, eps):
        self.include, self.exclude, self.unroll = like.include, like.exclude, like.unroll
        self.calls, self.names, self.eps = dict(calls), set(), eps

    def add(self, name, x, numbered=False, spec=None):
        name = numbered_name(self, name, numbered)
        named = leaves_with_names(name, x)
        self.names.update(n for n, _ in named)
        leaves, tree = jax.tree_util.tree_flatten(x)
        return jax.tree_util.tree_unflatten(tree, [leaf + self.eps[n] if n in self.eps else leaf
                                                   for (n, _), leaf in zip(named, leaves)])


def _gradient_tap(collector, name, x):
    """x as it is, whose cotangent, when a gradient flows back through it,
    is tapped as `grad/<name>` (the transpose runs in the function's own
    trace, so the gradient leaves with the other taps)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.floating):
        return x

    @jax.custom_vjp
    def identity(v):
        return v

    def forward(v):
        return v, None

    def backward(_, g):
        collector._record(f"grad/{name}", g)
        return (g,)
    identity.defvjp(forward, backward)
    return identity(x)


HOSTED = object()  # a value list entry: the tap leaves from each device (host_taps.py)


def index_of(key):
    """The tap's place in the order taps were made, from its outputs() key."""
    return int(key.split(":", 1)[0])


@contextlib.contextmanager
def collecting(collector):
    """Taps made while the block runs go to `collector`; its trace is the one current now."""
    collector.trace = jax_core.trace_ctx.trace
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(collector)
    try:
        yield collector
    finally:
        stack.pop()


def current():
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None
