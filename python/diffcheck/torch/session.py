"""A capture session: the `Capture` context manager `dct.capture()` returns,
and the functions that reach the open captures of this process (tap, grads,
params, step). diffcheck/torch/__init__.py is the public face."""
import os

import torch

from diffcheck import __version__
from diffcheck.dump import RankDump, ReferenceDump, mesh_size, mesh_sizes
from diffcheck.dump.layouts import layout_attrs
from diffcheck.dump.keywords import check_root_keywords, root_attributes, unexpected
from diffcheck.torch.math_mode import math_mode
from diffcheck.torch import rounding
from diffcheck.torch.data_axes import first_batch, is_ddp, settle_data_axes
from diffcheck.torch.backward import Gradients
from diffcheck.dump.writer import BackgroundWriter
from diffcheck.torch.capture_writing import TORCH_DTYPES, TapWriting
from diffcheck.torch.capture_hooks import ModuleHooks
from diffcheck.torch.staging import HostStaging
from diffcheck.sketch import DEFAULT_ROWS
from diffcheck.torch.sketch_capture import SketchTaps
from diffcheck.torch.drill_down import drill_down_taps
from diffcheck.torch.dtensor_plan import PlanLayouts, check_mesh_axes
from diffcheck.torch.library_plans import LibraryLayouts
from diffcheck.torch import compiled
from diffcheck.torch.compiled_counts import CompiledCounts
from diffcheck.torch.pipeline import PipelineTaps, StageModules, is_schedule, read_mesh, schedule_stages
from diffcheck.torch.hand_pipeline import HandPipeline
from diffcheck.torch.launch import compiled_original, rank_and_world

_active = []  # open captures of this process, innermost last
_CAPTURE_PARAMETERS = ("out", "mesh", "layouts", "include", "exclude", "inputs", "reference", "one_device",
                       "rename", "rank", "world_size", "attrs", "derive_depths", "backward", "optimizer",
                       "sketch", "sketch_seed", "only", "pipeline_axis", "data_axes", "loss_scale", "stage",
                       "microbatches")
# What a one-device capture adds to `out`: diffcheck compare finds
# <reference without .h5>.one_device.rank0.h5 beside the reference by itself.
ONE_DEVICE_SUFFIX = ".one_device"
_TAP_ATTRIBUTES = ("reduction_depth", "rounding_steps", "atol", "rtol", "stage", "microbatches", "streams",
                   "block_order")
# The suite's CPU twin of a device model's whole-tap copies (staging.py):
# True sends every tap through the host staging pool, unpinned.
_CPU_TWIN_OF_DEVICE_COPIES = False


class Capture(ModuleHooks, TapWriting):
    """The context manager `capture()` returns. Its hooks are on the model
    from `__enter__` to `__exit__`, and gone after it also when the block
    raised; the file gets its name only when the block ended cleanly."""

    def __init__(self, model, out, mesh=None, *, layouts=None, include=None, exclude=None, inputs=False,
                 reference=False, one_device=False, rename=None, rank=None, world_size=None, attrs=None,
                 derive_depths=True, backward=False, optimizer=None, sketch=False, sketch_seed=0, only=None,
                 pipeline_axis="pp", data_axes=None, loss_scale=None, stage=None, microbatches=None,
                 **root_attrs):
        check_root_keywords("capture()", root_attrs, _CAPTURE_PARAMETERS)
        schedule = model if is_schedule(model) else None
        # DistributedDataParallel: its module is captured (taps and parameters under the model's own names,
        # as the reference has them); the wrapper tells the data axis.
        ddp = model if is_ddp(model) else None
        model = ddp.module if ddp is not None else model
        if schedule is not None:
            if reference or one_device:
                raise ValueError("capture() of a pipeline schedule is the sharded run's: capture the whole model "
                                 "for reference=True or one_device=True (dct.references)")
            model = StageModules(stage.submod for stage in schedule_stages(schedule))
        extra_attrs = root_attributes("capture()", attrs)
        if one_device and (reference or mesh is not None or layouts or rank is not None or world_size is not None):
            raise ValueError("capture(one_device=True) is the unsharded model in the run's dtype, in one process: "
                             "give it no reference=, mesh=, layouts=, rank= or world_size=")
        self.model, self.out, self.reference_mode, self.inputs = model, os.fspath(out), reference, inputs
        self.one_device = one_device
        self.include = [include] if isinstance(include, str) else list(include or ["*"])
        self.exclude = [exclude] if isinstance(exclude, str) else list(exclude or [])
        self.rename = dict(rename or {})
        self.layouts = [(pattern, layout_attrs(v, _TAP_ATTRIBUTES)) for pattern, v in (layouts or {}).items()]
        env_rank, env_world = (0, 1) if one_device else rank_and_world()
        self.rank = env_rank if rank is None else rank
        self.world = env_world if world_size is None else world_size
        if not 0 <= self.rank < self.world:
            raise ValueError(f"capture(): rank {self.rank} is not one of the {self.world} ranks (0 to {self.world - 1})")
        if not reference:
            mesh = mesh if mesh is not None else read_mesh(self.model, schedule, self.world, self.rank, pipeline_axis)
            if mesh_size(mesh) != self.world:
                raise ValueError(f"rank {self.rank}: mesh '{mesh}' has {mesh_size(mesh)} ranks but this run has "
                                 f"{self.world} (from torch.distributed or the launcher; pass rank= and world_size=)")
        self.mesh = mesh
        self.axis_sizes = mesh_sizes(mesh) if mesh else {}
        self.axes = set(self.axis_sizes)
        # {DeviceMesh dimension: the mesh's axes it flattens} (mesh_aliases.py)
        self.aliases = {} if reference or one_device else check_mesh_axes(self.model, self.axes, self.mesh, self.rank)
        # (a pipeline schedule's microbatches have their own layout: pipeline.py)
        # (a schedule's taps get theirs when its microbatches are laid together: pipeline.py)
        self.data_axes, self._grad_divisor = settle_data_axes(
            data_axes, loss_scale, reference or one_device, ddp or self.model, self.axis_sizes, self.rank, root_attrs,
            self.aliases)
        self._local_batch = None  # learnt from the model's first input (data_axes.first_batch)
        # The sharded run's taps get the counts of rounding.py (the reference
        # and the one-device run are not held to a derived tolerance).
        self.derive_depths = derive_depths and not reference and not one_device
        if isinstance(root_attrs.get("dtype"), torch.dtype):  # dtype=torch.bfloat16 as dtype="bfloat16"
            given = root_attrs["dtype"]
            root_attrs["dtype"] = TORCH_DTYPES.get(given, str(given).replace("torch.", ""))
        self._dtype_given = "dtype" in root_attrs  # else the taps' (TapWriting.close_writer)
        self.root_attrs = {"producer": f"diffcheck.torch {__version__}", "dtype": self._model_dtype(),
                           "math": math_mode(self._model_device()), **extra_attrs, **root_attrs}
        self._writer, self._thread, self._handles, self._calls, self._step = None, None, [], {}, ""
        self._plan = None  # a DTensor plan's layouts (dtensor_plan.py), while the capture is open
        self._library = None  # what parallel libraries say of their modules (library_plans.py), likewise
        self._slots = []  # of its hooks in compiled graphs (compiled.py)
        self._counts = CompiledCounts(self)  # a compiled model's rounding counts (compiled_counts.py)
        self._staging = None  # see _staged
        self._host_staging = None  # a device model's (staging.py)
        self._order = 0  # the next tap's place in execution order
        if optimizer is not None and not backward:
            raise ValueError("capture(optimizer=...) taps the parameters around its step: give backward=True too")
        self.gradients = Gradients(self, optimizer) if backward else None
        if sketch is True:
            sketch = DEFAULT_ROWS
        self.sketches = SketchTaps(self, sketch, sketch_seed) if sketch else None
        if self.sketches is not None:
            self.root_attrs.setdefault("sketch_rows", self.sketches.rows)
        self.only = None if only is None else drill_down_taps(only)
        self.pipeline = None if schedule is None else PipelineTaps(self, schedule, pipeline_axis)
        # a pipeline written by hand (hand_pipeline.py); a schedule's stages and microbatches are its own
        self.hand = None if schedule is not None or reference or one_device else \
            HandPipeline(self, stage, microbatches)

    # -- naming -------------------------------------------------------------

    def _model_device(self):
        for p in self.model.parameters():
            return p.device.type
        return None

    def _learn_local_batch(self, module, args, kwargs):
        # Each forward's own (a loader's last batch is smaller: its taps are this rank's samples too)
        batch = first_batch(args, kwargs)
        if batch is not None:
            self._local_batch = batch

    def tap(self, name, tensor, spec=None, partial=None, **attrs):
        """A value that is not a module output (latents between steps): this
        rank's piece, with its layout (or the layouts' pattern for `name`)."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"rank {self.rank}: tap '{name}' is a {type(tensor).__name__}, not a tensor")
        for k in attrs:
            if k not in _TAP_ATTRIBUTES:
                raise unexpected(f"rank {self.rank}: tap '{name}'", k, ("spec", "partial") + _TAP_ATTRIBUTES)
        full = self._numbered(name)
        explicit = {k: v for k, v in dict(spec=spec, partial=partial, **attrs).items() if v is not None}
        with rounding.paused():
            self._write(full, tensor, (name,), explicit or None)

    def step(self, t):
        """Later taps are named `step<t>/...`; t=None: no prefix. Calls are numbered afresh."""
        if self.sketches is not None and self._thread is not None:
            self.sketches.flush()
        if self.hand is not None and self._thread is not None:
            with rounding.paused():
                self.hand.flush()
        self._step = "" if t is None else f"step{int(t)}/"
        self._calls = {}

    # -- hooks --------------------------------------------------------------

    def __enter__(self):
        if self.reference_mode:
            self._writer = ReferenceDump(self.path, **self.root_attrs)
        else:
            self._writer = RankDump(self._rank_prefix, self.mesh, self.rank, **self.root_attrs)
        # A model on a device copies its whole taps home asynchronously
        # (staging.py): several may be in flight; otherwise one at a time.
        on_device = self._model_device() not in (None, "cpu") or _CPU_TWIN_OF_DEVICE_COPIES
        self._host_staging = HostStaging(pinned=False if _CPU_TWIN_OF_DEVICE_COPIES else None) if on_device else None
        self._thread = BackgroundWriter(queued=self._host_staging.slots if on_device else 1)
        try:
            # A torch.compile'd model (OptimizedModule): the eager model's
            # modules, under the eager names; whether their hooks fire inside
            # the compiled graph is checked when the capture closes.
            eager = compiled_original(self.model)
            self._selected_paths, self._fired, self._compiled_calls = set(), set(), []
            if eager is not None:
                if self.gradients is not None:
                    raise ValueError(f"rank {self.rank}: capture(backward=True) of a torch.compile'd model: the "
                                     "gradient taps need the eager model's tensors; capture model._orig_mod")
                # Compiled before (and maybe run): its graphs have none of
                # these hooks, and Dynamo does not always guard on hooks
                # added later. Compiled afresh, the graphs hold them, and
                # later captures find their hooks in the same slots.
                compiled.first_capture(self.model)
                self._handles += self._counts.attach(self.model, eager, self.derive_depths,
                                                     ran=lambda: self._compiled_calls.append(1))
            if self.data_axes:  # the local batch: dimension 0 of the model's first tensor input
                self._handles.append(self.model.register_forward_pre_hook(self._learn_local_batch, with_kwargs=True))
            if self.hand is not None:  # a microbatch's rows: dimension 0 of the model's first input
                self._handles.append(self.model.register_forward_pre_hook(self.hand.learn_rows, with_kwargs=True))
            self._add_hooks(eager or self.model, keep=eager is not None)
            if not (self.reference_mode or self.one_device):
                self._plan = PlanLayouts(eager or self.model, list(self.axis_sizes)).__enter__()
                self._library = LibraryLayouts(eager or self.model, self.axis_sizes, self.rank)
                self._handles += self._library.attach(self.model)
            if self.derive_depths:
                rounding.hold()
                self._ledger_held = True
            if self.gradients is not None:
                self.gradients.wrap_optimizer()
            if self.pipeline is not None:
                self.pipeline.attach()
        except BaseException:
            self._close(failed=True)
            raise
        _active.append(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        self._close(failed=exc_type is not None)
        return False

    def _close(self, failed):
        unseen = None
        if not failed and compiled_original(self.model) is not None and self._compiled_calls:
            unseen = sorted(set(self._selected_paths) - self._fired)
        if unseen:  # never a silent partial file
            failed = True
            compiled.forget(self.model)
        if self.pipeline is not None:
            if not failed and self._thread is not None:
                with rounding.paused():
                    self.pipeline.flush()  # chunks run outside schedule.step()
            self.pipeline.detach()
        if self.hand is not None and not failed and self._thread is not None:
            with rounding.paused():
                self.hand.flush()
        for h in self._handles:
            h.remove()
        self._handles = []
        compiled.release(self._slots)
        self._slots = []
        if self._plan is not None:
            self._plan.__exit__(None, None, None)
            self._plan = None
        if self._library is not None and self._library.untapped():  # never a silent gap
            import warnings
            warnings.warn(f"rank {self.rank}: {self.path}: {self._library.untapped()}", stacklevel=3)
        if self.gradients is not None:
            self.gradients.unwrap_optimizer()
            if not failed and self._thread is not None:
                with rounding.paused():
                    self.gradients.at_close()
        if getattr(self, "_ledger_held", False):
            self._ledger_held = False
            rounding.release()
        if self in _active:
            _active.remove(self)
        thread, self._thread = self._thread, None
        error = None
        if thread is not None:
            try:
                thread.close()  # the last whole tap written, or the failed write's error
            except BaseException as e:
                error = e
            # The sketches still held are written here, the writer thread done:
            # handed to it, each write would wait for the interpreter lock
            # this thread holds (a few ms per capture).
            if self.sketches is not None and not failed and error is None:
                try:
                    self.sketches.flush(inline=True)
                except BaseException as e:
                    error = e
        writer, self._writer, self._staging = self._writer, None, None
        if writer is not None:
            writer.abandon() if failed or error else self.close_writer(writer)
        if error is not None and not failed:  # else the block's own exception is the one to see
            raise error
        if unseen:
            raise RuntimeError(
                f"rank {self.rank}: capture of a torch.compile'd model saw {len(self._fired)} of "
                f"{len(self._selected_paths)} module outputs: the compiled graph ran {len(unseen)} modules without "
                f"their hooks ({', '.join(unseen[:5])}{', ...' if len(unseen) > 5 else ''}), so {self.path} was not "
                "written. A module that did not run: exclude= it. A graph compiled outside any capture (new "
                "shapes since the last one) has no hooks: the next capture of this model compiles it afresh. Or "
                "capture the eager model (model._orig_mod)")

    @property
    def path(self):
        """The file this capture writes."""
        if self.reference_mode:
            return self.out if self.out.endswith(".h5") else self.out + ".h5"
        return f"{self._rank_prefix}.rank{self.rank}.h5"

    @property
    def _rank_prefix(self):
        if not self.one_device:
            return self.out
        return (self.out[:-3] if self.out.endswith(".h5") else self.out) + ONE_DEVICE_SUFFIX


def capture(model, out, mesh=None, **kwargs):
    """Taps every selected module's output of `model` while the block runs.

    out       prefix of the rank file (`<out>.rank<R>.h5`), or of the
              reference file (`<out>.h5`) with reference=True
    mesh      "cfg=2,sp=2": named axes whose product is the world size
              (default: one rank's "dp=1", or the named DeviceMesh of the
              model's DTensor parameters where it spans every rank)
    layouts   {glob on tap names: spec | (spec, partial) | {attrs}}
    include, exclude   globs on module paths (default: every module);
              an exclude glob starting with "param" leaves out the
              parameter taps it matches ("param*/blocks.*.weight")
    inputs    also tap each module's positional tensor inputs (`<path>:in/<i>`)
    reference write the global tensors as /reference/<name> (one process,
              the unsharded model, best in float64)
    one_device  the unsharded model in the run's own dtype and math, in one
              process, written beside the reference (out: the reference's
              prefix) as <out>.one_device.rank0.h5: compare finds it there and
              holds each tap to what this run's error is (a measured noise floor)
    rename    {module path prefix in this model: its name in the other one}
    backward  also tap the gradient of each tapped module output
              (`grad/<tap>`, when backward computes it) and, with optimizer=
              or dct.grads()/dct.params(), every parameter's gradient before
              the step (`param_grad/<name>`) and value after it
              (`param/<name>`); see diffcheck/torch/backward.py for their layouts
    optimizer the training run's optimizer (backward=True): its step() taps
              the gradients before it and the parameters after it
    derive_depths  mark each tap with the rounding its value went through
              (python/diffcheck/torch/rounding.py), for the tolerance diffcheck
              derives when no one-device run is there; False: none
              (then every tap is held as one rounding of its dtype)
    pipeline_axis  for a torch.distributed.pipelining schedule given as
              `model`: the mesh axis of its stages (default "pp"); each
              rank taps its own stages' modules, every microbatch's call
              laid together per tap (diffcheck/torch/pipeline.py)
    data_axes the mesh axes whose ranks hold different samples ("dp",
              or ("dp", "fsdp") for HSDP): each activation tap whose
              dimension 0 is the local batch is split over them, on top of
              its layout (diffcheck/torch/data_axes.py); default: FSDP2's
              mesh axes, else DDP's, else none (every rank the same batch)
    stage     a pipeline written by hand: this rank's stage ("pp=1") for
              every tap (docs/torch.md, "Pipelines written by hand")
    microbatches  with stage: a module called M times in a step ran
              microbatch k on call k; the calls are laid together
              (diffcheck/torch/hand_pipeline.py)
    loss_scale  with data axes, how the loss was scaled: "local_mean"
              (each rank's mean over its own samples; the output gradients
              are written divided by the data-parallel degree) or "global"
              (summed and divided by the global count); default: "global"
              where FSDP2 sums the gradients (set_gradient_divide_factor(1.0),
              torchtitan's), else "local_mean" (diffcheck/torch/data_axes.py)
    rank, world_size   override what torch.distributed or the launcher say
    scenario, flags, dtype, seed, producer, size   root attributes of the file
    attrs     {name: str | number | bool}: other root attributes
    Any other keyword is a TypeError naming the nearest known one.
    """
    return Capture(model, out, mesh, **kwargs)


def tap(name, tensor, spec=None, partial=None, **attrs):
    """Records a value that is not a module output in the innermost open
    capture; outside a capture it does nothing, so the call can stay in code
    that also runs unchecked."""
    if _active:
        _active[-1].tap(name, tensor, spec=spec, partial=partial, **attrs)


def grads():
    """Taps every parameter's gradient (`param_grad/<name>`) in the innermost
    open capture with backward=True, where the user's own reductions are done
    (what optimizer= does before each step)."""
    with rounding.paused():
        for c in _active[-1:]:
            if c.gradients is not None:
                c.gradients.grads()


def params():
    """Taps every parameter (`param/<name>`) in the innermost open capture with
    backward=True (what optimizer= does after each step)."""
    with rounding.paused():
        for c in _active[-1:]:
            if c.gradients is not None:
                c.gradients.params()


def unhook(model):
    """Removes the hooks that captures of a torch.compile'd model leave on its
    modules (they do nothing between captures, but each costs a call per
    forward; diffcheck/torch/compiled.py). The model recompiles on its next call."""
    compiled.unhook(model)
    eager = compiled_original(model)
    if eager is not None:
        compiled.unhook(eager)


def step(t):
    """Names later taps of every open capture `step<t>/...` (t=None: none)."""
    for c in _active:
        c.step(t)
