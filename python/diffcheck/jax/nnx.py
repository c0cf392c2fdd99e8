"""Flax NNX modules under a capture: the module becomes a pure function of
its state (nnx.split / nnx.merge), so it can be jitted with its taps as
outputs and moved to one device for the references; every submodule's
output is tapped under its path (`blocks.0.attn`; the root is `model`), a
module called again as `path@1`, `path@2`, ..."""
import contextlib
import threading

from diffcheck.jax import taps as jax_taps

_calls = threading.local()
PATH_ATTRIBUTE = "_diffcheck_tap_path"


def is_module(target):
    try:
        from flax import nnx
    except ImportError:
        return False
    return isinstance(target, nnx.Module)


def _path_name(path):
    return ".".join(str(p) for p in path) if path else "model"


@contextlib.contextmanager
def tapping_outputs(module):
    """While the block runs, each submodule of `module` (a merged copy, inside
    the trace) taps its __call__'s output. The classes' __call__ are wrapped
    for the block only; a module's call inside its own (super().__call__)
    is tapped once."""
    from flax import nnx
    classes = {type(m) for _, m in nnx.iter_modules(module)}
    saved = {}

    def wrap(cls, original):
        def __call__(self, *args, **kwargs):
            inside = getattr(_calls, "ids", None)
            if inside is None:
                inside = _calls.ids = set()
            key, name = id(self), getattr(self, PATH_ATTRIBUTE, None)
            if key in inside or name is None:
                return original(self, *args, **kwargs)
            inside.add(key)
            try:
                out = original(self, *args, **kwargs)
            finally:
                inside.discard(key)
            collector = jax_taps.current()
            return out if collector is None else collector.add(name, out, numbered=True)
        return __call__

    try:
        for cls in classes:
            if "__call__" in cls.__dict__:
                saved[cls] = cls.__dict__["__call__"]
                cls.__call__ = wrap(cls, saved[cls])
            else:  # inherits its __call__: wrapped on this class only
                saved[cls] = None
                cls.__call__ = wrap(cls, cls.__call__)
        yield
    finally:
        for cls, original in saved.items():
            if original is None:
                del cls.__call__
            else:
                cls.__call__ = original


def as_function(module, step=None):
    """(fn, state): fn(state, *args, **kwargs) calls a copy of `module` made
    from `state` (or step(copy, *args, **kwargs): a training step), its
    submodules' outputs tapped."""
    from flax import nnx
    # Each submodule carries its path as a static attribute in the graph
    # definition, so copies that nnx transforms (value_and_grad, jit, scan)
    # make inside the step still know their names; the user's objects are
    # left as they were.
    modules = list(nnx.iter_modules(module))
    try:
        for path, m in modules:
            object.__setattr__(m, PATH_ATTRIBUTE, _path_name(path))
        graphdef, state = nnx.split(module)
    finally:
        for _, m in modules:
            object.__delattr__(m, PATH_ATTRIBUTE)

    def run(state, *args, **kwargs):
        m = nnx.merge(graphdef, state)
        with tapping_outputs(m):
            return step(m, *args, **kwargs) if step is not None else m(*args, **kwargs)
    return run, state
