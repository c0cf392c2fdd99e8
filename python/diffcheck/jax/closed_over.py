"""The references of a function that reads the sharded run's arrays, mesh or
shardings from outside its arguments: a weight closed over (`def f(x): return
x @ w`), a global `mesh` passed to `shard_map(..., mesh=mesh)` or to
`NamedSharding(mesh, ...)` inside it. On the references' one-device mesh JAX
refuses them ("context mesh ... should match the aval mesh", with Explicit
axes; "incompatible devices"), and a closed-over float32 weight would stay
float32 in the float64 reference.

While the references run, each such value that the function reads from a
closure cell or a module global, or that the functions it reaches read so,
is swapped for its twin: the mesh for the one-device mesh, a NamedSharding
for the same spec on it, an array for its whole value on the one device
(widened to float64 for the reference, as the inputs are); a dict, list or
tuple holding them for a copy holding the twins. Everything is put back
after, whatever happens. What is reached: closure cells and the globals a
function's code names (its nested functions' too), functions found there,
a bound method's object's attributes; and the mesh a jax.shard_map made
before the capture keeps (mesh=, or the first context mesh it saw: JAX's
wrapper keeps that in its closure). Not reached: values held inside other
objects (a module built for the sharded mesh): JAX's refusal then names them
(one_device.name_an_owned_mesh)."""
import contextlib
import types

import jax
from jax.sharding import Mesh, NamedSharding

from diffcheck.jax import one_device as one

_MAX_DEPTH = 8
_LIBRARIES = ("jax", "jaxlib", "flax", "numpy", "optax", "diffcheck", "ml_dtypes", "functools", "builtins")


def _is_library(f):
    module = getattr(f, "__module__", None) or ""
    return module.split(".", 1)[0] in _LIBRARIES


class _Twins:
    """The one-device twin of each value that needs one (None: it needs none)."""

    def __init__(self, mesh, mesh1, widen):
        self.mesh, self.mesh1, self.widen = mesh, mesh1, widen
        self.device = mesh1.devices.flat[0]

    def _moves(self, x):
        """An array moves if it is elsewhere than the one device, or is floating and the reference widens."""
        if set(x.sharding.device_set) != {self.device}:
            return True
        return self.widen and not one.is_key(x) and jax.dtypes.issubdtype(x.dtype, jax.numpy.floating) \
            and x.dtype != jax.numpy.float64

    def leaf(self, v):
        if isinstance(v, Mesh) and v == self.mesh:
            return self.mesh1
        if isinstance(v, NamedSharding) and v.mesh == self.mesh:
            return NamedSharding(self.mesh1, v.spec)
        if isinstance(v, jax.Array) and self._moves(v):
            with jax.enable_x64(self.widen or bool(jax.config.jax_enable_x64)):
                return one.to_one_device(v, self.mesh1, self.widen)
        return None

    def of(self, v):
        twin = self.leaf(v)
        if twin is not None:
            return twin
        if type(v) in (dict, list, tuple) or (isinstance(v, tuple) and hasattr(v, "_fields")):
            items = v.items() if isinstance(v, dict) else enumerate(v)
            twins = {k: self.of(x) for k, x in items}
            if all(t is None for t in twins.values()):
                return None
            if isinstance(v, dict):
                return {k: (v[k] if t is None else t) for k, t in twins.items()}
            values = [v[i] if t is None else t for i, t in twins.items()]
            return type(v)(*values) if hasattr(v, "_fields") else type(v)(values)
        return None


def _names(code):
    """The global names a code object and its nested functions' code read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _function(v):
    """The Python function behind v (a jitted one's, a bound method's), or None."""
    v = getattr(v, "__wrapped__", v)
    if isinstance(v, types.MethodType):
        v = v.__func__
    return v if isinstance(v, types.FunctionType) and not _is_library(v) else None


class _Swap:
    def __init__(self, twins):
        self.twins, self.undo, self.seen = twins, [], set()

    def value(self, v, put, depth):
        """Swap v where `put` puts it, or walk into it if it is a function."""
        twin = self.twins.of(v)
        if twin is not None:
            put(twin)
            return
        if type(v) in (dict, list, tuple):  # functions held in a container (a table of shard_maps)
            for item in (v.values() if isinstance(v, dict) else v):
                self.walk(item, depth + 1)
            return
        self.walk(v, depth + 1)

    def walk(self, v, depth=0):
        if depth > _MAX_DEPTH or id(v) in self.seen:
            return
        self.seen.add(id(v))
        self._shard_map_mesh(v)
        owner = getattr(v, "__self__", None)
        if isinstance(v, types.MethodType) and hasattr(owner, "__dict__") and not _is_library(type(owner)):
            for name, attr in list(vars(owner).items()):
                self.value(attr, self._setter(owner, name, attr), depth)
        f = _function(v)
        if f is None:
            return
        for cell in f.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value(content, self._cell_setter(cell, content), depth)
        globals_ = f.__globals__
        for name in _names(f.__code__):
            if name in globals_:
                self.value(globals_[name], self._global_setter(globals_, name), depth)

    def _shard_map_mesh(self, v, depth=0):
        """A jax.shard_map made before the capture keeps its mesh in its
        closure: the one given (mesh=), or the context's at its first call
        (JAX's wrapper assigns it to a `nonlocal mesh`, so a shard_map made
        once without mesh= runs on the first mesh it saw). For the references
        that cell holds the one-device mesh (a given Mesh) or nothing (the
        context's again); put back after."""
        if not isinstance(v, types.FunctionType) or depth > 3:
            return
        names, cells = v.__code__.co_freevars, v.__closure__ or ()
        if "mesh" in names and (v.__module__ or "").endswith("shard_map"):
            cell = cells[names.index("mesh")]
            mesh = self.twins.mesh
            held = cell.cell_contents if cell.cell_contents is not None else None
            if isinstance(held, Mesh) and held == mesh:
                self._cell_setter(cell, held)(self.twins.mesh1)
            elif held is not None and held == mesh.abstract_mesh:
                self._cell_setter(cell, held)(None)
            return
        for cell in cells:
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self._shard_map_mesh(inner, depth + 1)

    def _cell_setter(self, cell, old):
        def put(new):
            cell.cell_contents = new
            self.undo.append(lambda: setattr(cell, "cell_contents", old))
        return put

    def _global_setter(self, globals_, name):
        old = globals_[name]

        def put(new):
            globals_[name] = new
            self.undo.append(lambda: globals_.__setitem__(name, old))
        return put

    def _setter(self, owner, name, old):
        def put(new):
            setattr(owner, name, new)
            self.undo.append(lambda: setattr(owner, name, old))
        return put


@contextlib.contextmanager
def swapped(fn, mesh, mesh1, widen):
    """Within: what `fn` reads of the sharded run from outside its arguments
    (the mesh, its NamedShardings, its arrays) is the one-device twin;
    yields the number of values swapped."""
    swap = _Swap(_Twins(mesh, mesh1, widen))
    try:
        swap.walk(fn)
        yield len(swap.undo)
    finally:
        for undo in reversed(swap.undo):
            undo()
