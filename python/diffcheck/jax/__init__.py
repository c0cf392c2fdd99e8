"""Capture a JAX program's taps as diffcheck files, their layouts read from
the shardings the arrays have (never written by hand).

    import diffcheck.jax as dcj

    def block(params, x):                   # a plain, jitted or shard_map'd function, or an nnx.Module
        h = dcj.tap("h", x @ params["w1"])  # anywhere in the function's own trace; x when no capture runs
        return h @ params["w2"]

    report = dcj.check(jax.jit(block), params, x, out="dumps/block", mesh=mesh)

check() runs the function on the mesh (one rank file per device,
`<out>.rank<R>.h5`, R the device's place in the mesh), then on one device in
float64 (the reference, `<out>.reference.h5`) and in the run's dtype (the
one-device yardstick beside it), and returns `diffcheck compare`'s report
(a Divergence, an AssertionError, when a check fails). The function takes
its mesh from the context (`jax.set_mesh`, which the capture sets): the
references run it on a mesh of the same axis names with every size 1.

The three runs one at a time: `with dcj.capture(fn, out, mesh) as run:
run(*args)`, with reference=True or one_device=True. An nnx.Module's
submodule outputs are taps under their paths (`blocks.0.attn`). See
docs/jax.md.
"""
import contextlib
import os

import jax

from diffcheck import __version__
from diffcheck.jax import host_taps as jax_host_taps
from diffcheck.jax import nnx as jax_nnx
from diffcheck.jax import taps as jax_taps
from diffcheck.jax import one_device as one
from diffcheck.jax import remat_taps
from diffcheck.jax import static_kwargs
from diffcheck.compare import DiffcheckError, Divergence, InputError, compare  # noqa: F401
from diffcheck.dump import RankDump, ReferenceDump
from diffcheck.jax.layouts import LayoutError, array_layout, mesh_string  # noqa: F401
from diffcheck.jax.reference_cache import fetch as reference_cache_fetch, key as reference_cache_key
from diffcheck.jax.reference_cache import store as reference_cache_store
from diffcheck.jax.rounding import output_depths
from diffcheck.jax import closed_over
from diffcheck.jax.sketch_run import SketchRun, call_signature
from diffcheck.jax.taps import TapError  # noqa: F401
from diffcheck.dump.keywords import check_root_keywords, root_attributes

ONE_DEVICE_SUFFIX = ".one_device"
REFERENCE_SUFFIX = ".reference"
_CAPTURE_PARAMETERS = ("out", "mesh", "reference", "one_device", "include", "exclude", "derive_depths", "jit",
                       "step", "backward", "sketch", "sketch_seed", "unroll", "attrs", "build")
DEFAULT_SKETCH_ROWS = 8  # as diffcheck.torch's


def tap(name, x, spec=None):
    """Records `x` (an array or a pytree of them: `name/<key path>`) as tap
    `name` in the capture running the function; returns `x`. Outside a
    capture it does nothing, so the call can stay in code that runs unchecked.
    spec: inside a shard_map body, the PartitionSpec of the global value
    (as out_specs would give it) when x varies over the mesh axes; the axes it
    varies over that spec leaves out are partial sums. Elsewhere the layout
    is the array's sharding."""
    collector = jax_taps.current()
    return x if collector is None else collector.add(name, x, spec=spec)


def xla_flags_attribute():
    """XLA_FLAGS as the files' `flags` attribute (`name=value` separated by spaces)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return " ".join(f.lstrip("-") if "=" in f else f"{f.lstrip('-')}=true" for f in flags) or None


def _context_mesh(where):
    mesh = jax.sharding.get_mesh()
    if not isinstance(mesh, jax.sharding.Mesh) or mesh.empty:
        raise ValueError(f"{where}: no mesh: pass mesh= (a jax.sharding.Mesh) or capture inside "
                         "`with jax.set_mesh(mesh):`")
    return mesh


def _unjitted(fn):
    """(the Python function, whether it was jitted) of a jax.jit-wrapped function."""
    if hasattr(fn, "lower") and hasattr(fn, "__wrapped__"):
        return fn.__wrapped__, True
    return fn, False


class Capture:
    """The context `capture()` returns: call it as the function. Files are
    written as each call ends and get their names when the block ends
    cleanly (none is left under its name when it raised)."""

    def __init__(self, target, out, mesh=None, *, reference=False, one_device=False, include=None, exclude=None,
                 derive_depths=True, jit=None, step=None, backward=False, sketch=False, sketch_seed=0, unroll=False,
                 attrs=None, build=None, **root_attrs):
        check_root_keywords("capture()", root_attrs, _CAPTURE_PARAMETERS)
        extra = root_attributes("capture()", attrs)
        if reference and one_device:
            raise ValueError("capture(): reference=True (float64) and one_device=True (the run's dtype) are two "
                             "captures: make one of each")
        self.mesh = mesh if mesh is not None else _context_mesh("capture()")
        if not isinstance(self.mesh, jax.sharding.Mesh):
            raise TypeError(f"capture(): mesh is a {type(self.mesh).__name__}, not a jax.sharding.Mesh")
        self.out, self.reference, self.one_device = os.fspath(out), reference, one_device
        self.include = [include] if isinstance(include, str) else list(include or ["*"])
        self.exclude = [exclude] if isinstance(exclude, str) else list(exclude or [])
        self.derive_depths = derive_depths and not reference and not one_device
        self.backward, self.unroll = bool(backward), bool(unroll)
        self.module = jax_nnx.is_module(target)
        if self.module:
            self.fn, self.state = jax_nnx.as_function(target, step)
            jitted = True
        else:
            if step is not None:
                raise ValueError("capture(step=...) is for an nnx.Module: a function is its own step")
            if not callable(target):
                raise TypeError(f"capture(): {type(target).__name__} is neither a function nor an nnx.Module")
            (self.fn, jitted), self.state = _unjitted(target), None
        self.jitted = jitted if jit is None else bool(jit)
        # build(mesh, dtype): the references' model for a module that owns its mesh (one_device.rebuilt)
        self._build = (build, step) if build is not None and (reference or one_device) and self.module else None
        if build is not None and not self.module:
            raise ValueError("capture(build=...) makes the references' nnx.Module on their mesh: give it with a module")
        self._jit = jax.jit(self._traced)
        self.root_attrs = {"producer": f"diffcheck.jax {__version__} (jax {jax.__version__})",
                           "flags": xla_flags_attribute(), **extra, **root_attrs}
        self._writers, self._calls, self._step, self._depths = None, 0, "", {}
        self._depths_of = None  # the arguments' signature the depths are of
        self._host = jax_host_taps.HostSink()  # taps inside shard_map bodies
        # Sketch mode: the sharded run's taps as sketches made in the program
        # (the references keep whole tensors, which the comparator sketches).
        self.sketches = None
        if sketch and not (reference or one_device):
            self.sketches = SketchRun(self, DEFAULT_SKETCH_ROWS if sketch is True else sketch, sketch_seed)
            self.root_attrs["sketch_rows"] = self.sketches.k

    # -- running --------------------------------------------------------------

    def _traced(self, *args, **kwargs):
        collector = jax_taps.Collector(self.include, self.exclude, self.backward, self.unroll, self._host)
        with jax_taps.collecting(collector), remat_taps.taps_through_checkpoints(), \
                (jax.disable_jit() if self.unroll else contextlib.nullcontext()):
            result = self.fn(*args, **static_kwargs.unwrap(kwargs))
        outputs = collector.outputs()
        self._left_out = collector.left_out() or getattr(self, "_left_out", None)  # said in the files (__exit__)
        return result, outputs

    def _run(self, mesh, args, kwargs):
        with jax.set_mesh(mesh):
            result, taps = (self._jit if self.jitted else self._traced)(*args, **kwargs)
        rows = sorted((jax_taps.index_of(key), key.split(":", 1)[1], v) for key, v in taps.items())
        self._derive_depths(mesh, args, kwargs, [n for _, n, _ in rows])
        return result, self._with_hosted(rows, mesh)

    def _with_hosted(self, rows, mesh):
        """[(name, value)] of the call's taps in the order they were made:
        rows [(index, name, value)] of the program's outputs, and the blocks
        that shard_map bodies handed over (a HostedBlocks value; a body run
        per step gives `name@k` of its k-th value)."""
        mine = [r for r, d in enumerate(mesh.devices.flat) if d.process_index == jax.process_index()]
        merged = [(i, 0, name, v) for i, name, v in rows]
        for name, blocks in self._host.take().items():
            tap = self._host.taps[name]
            for k, pieces in jax_host_taps.pieces(tap, blocks, mesh, mine):
                merged.append((tap.index, k, f"{name}@{k}" if k else name, jax_host_taps.HostedBlocks(tap, pieces)))
        return [(name, v) for _, _, name, v in sorted(merged, key=lambda r: r[:2])]

    def _derive_depths(self, mesh, args, kwargs, names, signature=None):
        """Each tap's depths, derived once per signature of the arguments (`signature`: already made)."""
        if not self.derive_depths:
            return
        signature = call_signature(args, kwargs)[0] if signature is None else signature
        if signature != self._depths_of:  # a contraction's length is its argument's: other shapes, other depths
            self._depths, self._depths_of = {}, signature
        if any(n not in self._depths for n in names):
            with jax.set_mesh(mesh):
                closed = jax.make_jaxpr(self._traced)(*args, **kwargs)
            depths = output_depths(closed, dict(mesh.shape))[-len(names):] if names else []
            self._depths.update(zip(names, depths))

    def __call__(self, *args, **kwargs):
        """Runs the function once under the capture and returns its result."""
        args = (self.state, *args) if self.module else args
        kwargs = static_kwargs.wrap(kwargs)  # a Python bool or string keyword is static (static_kwargs.py)
        if self.reference or self.one_device:
            return self._call_one_device(args, kwargs)
        if self.sketches is not None:
            return self._call_sketched(args, kwargs)
        result, taps = self._run(self.mesh, args, kwargs)
        self._open(args)
        for name, value in taps:
            self._write_whole(name, value)
        self._calls += 1
        return result

    def _write_whole(self, name, value):
        if isinstance(value, jax_host_taps.HostedBlocks):
            spec, partial, pieces = value.layout(self.mesh)
        else:
            spec, partial, pieces = array_layout(value, self.mesh, f"tap '{name}'")
        depth, steps = self._depths.get(name, (None, None))
        for rank, piece in pieces.items():
            self._writer(rank).write_tap(self._named(name), piece, spec=spec, partial=partial,
                                         reduction_depth=depth or None,
                                         rounding_steps=max(steps, 1) if steps is not None else None)

    def _call_sketched(self, args, kwargs):
        result, taps = self.sketches.run(args, kwargs)
        self._derive_depths(self.mesh, args, kwargs, [name for name, *_ in taps], self.sketches.signature)
        self._open(args)
        ranks = {d.id: r for r, d in enumerate(self.mesh.devices.flat)}
        rows = [(jax_taps.index_of(key), name, (kind, value, key)) for name, kind, value, key in taps]
        for name, row in self._with_hosted(rows, self.mesh):
            kind, value, key = ("whole", row, None) if isinstance(row, jax_host_taps.HostedBlocks) else row
            if kind == "whole":
                self._write_whole(name, value)
            else:
                self.sketches.write(name, value, key, self._writer, self._named(name),
                                    self._depths.get(name, (None, None)), ranks)
        self._calls += 1
        return result

    def _call_one_device(self, args, kwargs):
        mesh1 = one.one_device_mesh(self.mesh)
        if jax.process_index() != 0:  # the whole inputs are gathered by every process; one runs them
            one.gather_everywhere((args, kwargs))
            self._calls += 1
            return None
        # x64 for the reference; the yardstick keeps the program's own setting (a global jax_enable_x64)
        with jax.enable_x64(bool(self.reference) or bool(jax.config.jax_enable_x64)):
            if self._build is not None:  # the model built anew on the one-device mesh, its state the run's
                self.fn, self._build = one.rebuilt(*self._build, mesh1, "float64" if self.reference else
                                                   one.run_dtype(args)), None
            args1, kwargs1 = one.to_one_device((args, kwargs), mesh1, widen=self.reference)
            self._open(args)
            try:
                # what the function reads of the run from outside its arguments: the one-device twins
                with closed_over.swapped(self.fn, self.mesh, mesh1, widen=bool(self.reference)):
                    result, taps = self._run(mesh1, args1, kwargs1)
            except (ValueError, TypeError) as e:
                one.name_an_owned_mesh(e, self.path)
                raise
            narrow, run_width = [], jax.numpy.dtype(one.run_dtype(args) or "float32").itemsize
            for name, value in taps:
                value = value.whole() if isinstance(value, jax_host_taps.HostedBlocks) else one.gathered(value)
                if self.reference:
                    self._writer(0).reference(self._named(name), value)
                    # no wider than the run (a float32 reference of a bfloat16 run is wider: compare.cpp agrees)
                    if value.dtype != "float64" and jax.dtypes.issubdtype(value.dtype, jax.numpy.floating) \
                            and value.dtype.itemsize <= run_width:
                        narrow.append((name, value.dtype.name))
                else:
                    self._writer(0).write_tap(self._named(name), value)
            one.warn_narrow_reference(narrow, len(taps), self.path)
        self._calls += 1
        return result

    def step(self, t):
        """Later taps are named `step<t>/...` (t=None: no prefix)."""
        self._step = "" if t is None else f"step{int(t)}/"

    def _named(self, name):
        if not self._step and self._calls:
            return f"step{self._calls}/{name}"  # a later call of the capture: its own names
        return self._step + name

    # -- files ----------------------------------------------------------------

    @property
    def path(self):
        """The reference file, or the first rank file's prefix."""
        stem = self.out[:-3] if self.out.endswith(".h5") else self.out
        if self.reference:
            return stem + ".h5"
        return stem + ONE_DEVICE_SUFFIX if self.one_device else self.out

    def _open(self, args):
        if self._writers is not None:
            return
        attrs = {"dtype": one.run_dtype(args), **self.root_attrs}
        self._writers = {}
        if self.reference:
            self._writers[0] = ReferenceDump(self.path, **attrs)
        elif self.one_device:
            mesh1 = ",".join(f"{a}=1" for a in self.mesh.axis_names)
            self._writers[0] = RankDump(self.path, mesh1, 0, **attrs)
        else:
            mesh, ranks = mesh_string(self.mesh), {d.id: r for r, d in enumerate(self.mesh.devices.flat)}
            for d in self.mesh.devices.flat:
                if d.process_index == jax.process_index():
                    self._writers[ranks[d.id]] = RankDump(self.out, mesh, ranks[d.id], **attrs)

    def _writer(self, rank):
        return self._writers[rank]

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        writers, self._writers = self._writers or {}, None
        if self.sketches is not None:
            self.sketches.release()
        for w in writers.values():
            if exc_type is None and getattr(self, "_left_out", None):  # the report says what was not tapped
                w.set_root_attrs(left_out=self._left_out)
            w.abandon() if exc_type is not None else w.close()
        return False


def capture(target, out, mesh=None, **kwargs):
    """The capture of one run of `target` (a function, jitted or not, or an
    nnx.Module): `with capture(fn, out, mesh) as run: run(*args)`.

    out        prefix of the rank files (`<out>.rank<R>.h5`); with
               reference=True the reference file (`<out>.h5`), with
               one_device=True `<out>.one_device.rank0.h5` beside it
    mesh       the jax.sharding.Mesh the arrays live on (default: the
               context's, jax.set_mesh); the references take its axis names
    reference  the function on one device in float64: /reference/<tap>
    one_device the function on one device in the run's dtype: the yardstick
               compare holds each tap's error to
    include, exclude   globs on tap names (without `@k`)
    derive_depths      mark each tap with the sums and roundings the
               program makes it with (read from its jaxpr)
    jit        run jitted (default: when the target is jitted or a module)
    step       an nnx.Module's training step, step(model, *args): called
               on the module instead of its __call__
    sketch     True (8 rows) or k: each device's taps as linear sketches
               computed inside the XLA program (docs/FORMAT.md, "Sketch
               taps"); only they leave it. sketch_seed: the signs' seed
    unroll     trace inner jax.jit calls inline and lax.scan bodies step by
               step (jax.disable_jit while tracing), so taps inside them
               leave too, a step's tap numbered name@k; the compiled program
               then has the scan unrolled
    backward   also tap the gradient of each tap that a jax.grad (or
               nnx.value_and_grad) inside the function computes, as
               `grad/<tap>`; tap the parameters' gradients and values
               yourself as `param_grad` and `param` (pytrees)
    scenario, flags, dtype, seed, producer, size; attrs={...}   root attributes
    """
    return Capture(target, out, mesh, **kwargs)


def check(target, *args, out, mesh=None, kwargs=None, reference=True, one_device=True, reference_cache=None,
          compare_args=(), build=None, **capture_kwargs):
    """Runs `target(*args, **kwargs)` on the mesh, on one device in float64
    and in its own dtype, and compares: returns the JSON report of `diffcheck
    compare`; raises Divergence (an AssertionError) when a check fails.
    reference_cache=DIR: the two one-device runs are read from DIR when a run
    of the same program on the same inputs made them (reference_cache.py:
    XLA flags are not in the key, so runs under other flags are judged against
    the references made without them, as a flag bisect's first trial makes
    them), and kept there otherwise. build(mesh, dtype): for an nnx.Module
    that owns its mesh (a shard_map(mesh=...), sharding constraints on its
    config's mesh), the references' model, built on their one-device mesh
    in their dtype ("float64", then the run's); its state is the run's,
    moved (never drawn again). Every process of a multi-process job
    calls it; process 0 runs the references and the compare (the others
    return None)."""
    kwargs = kwargs or {}
    with capture(target, out, mesh, **capture_kwargs) as run:
        run(*args, **kwargs)
    stem = out + REFERENCE_SUFFIX
    shared = {k: v for k, v in capture_kwargs.items() if k in ("include", "exclude", "jit", "step", "backward",
                                                                 "sketch_seed", "unroll")}
    mesh = run.mesh
    cache_key = None
    if reference_cache is not None:
        if not (reference and one_device) or jax.process_count() > 1:
            raise ValueError("check(reference_cache=...) keeps the reference and the one-device run of one process: "
                             "give reference=True, one_device=True, and run one process")
        cache_key = reference_cache_key(run, (run.state, *args) if run.module else args, kwargs)
    if cache_key is None or not reference_cache_fetch(os.fspath(reference_cache), cache_key, stem):
        if reference:
            with capture(target, stem, mesh, reference=True, build=build, **shared) as ref:
                ref(*args, **kwargs)
        if one_device:
            with capture(target, stem, mesh, one_device=True, build=build, **shared) as yardstick:
                yardstick(*args, **kwargs)
        if cache_key is not None:
            reference_cache_store(os.fspath(reference_cache), cache_key, stem)
    if jax.process_index() != 0:
        return None
    return compare(out, reference=stem + ".h5" if reference else None, args=compare_args)


def verdict(target, *args, **check_kwargs):
    """check(target, *args, **check_kwargs) as the end of a checking
    program: the report printed (on process 0), and the exit status
    returned, 0 when every check passes, 1 when one fails (an input error
    still raises)."""
    try:
        report = check(target, *args, **check_kwargs)
    except Divergence as e:
        print(e.output, end="", flush=True)
        return 1
    if report is not None:
        print(report["console"], end="", flush=True)
    return 0
