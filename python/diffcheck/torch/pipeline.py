"""Captures of a torch.distributed.pipelining schedule (`dct.capture(schedule,
out, mesh="pp=2")`): each rank taps the modules of its own stages, and the
taps say so (the `stage` attribute: only the ranks at that coordinate of the
pipeline axis hold them, docs/FORMAT.md).

Microbatches. The schedule calls each stage's module once per microbatch
(`forward_one_chunk`, `backward_one_chunk`); every call of a module is held
under the same tap name with its microbatch index, and when `schedule.step()`
returns the calls are laid together along the first dimension in microbatch
order and written as one tap with `microbatches=M`: the tap is then the whole
batch of this rank, as a run without microbatches (or the reference) has it,
and a report names the microbatch of an element. Calls outside a chunk (the
stage's shape inference at set-up) are not taps.

Gradients of module outputs are those of the step's loss: a schedule that
scales the gradients by its microbatch count (`scale_grads`, torch's default)
computes each microbatch's backward from the microbatch's own loss, M times
the share it has of the step's, so those taps are divided by M (exact for a
power of two). Parameter gradients are tapped when the optimizer steps, after
the schedule's scaling.

Data axes (`data_axes=("dp",)`: each pipeline replica its own samples): a
tap laid together from its microbatches is split over them on its batch
dimension, as data_axes.py splits any capture's.

Order. Taps are ordered as the data flows through the pipeline, whichever
rank holds them: forward stage by stage, then backward from the last stage to
the first, then the parameters; so the first divergence is the first tap the
fault reached.
"""
import torch

from diffcheck.dump.layouts import is_dtensor
from diffcheck.torch.data_axes import first_batch, with_data_axes
from diffcheck.torch.dtensor_plan import mesh_of_model
from diffcheck.torch import pipeline_sketch
from diffcheck.torch.hand_pipeline import lay_together
from diffcheck.torch.mesh_aliases import split_for_context_parallel

_FORWARD, _BACKWARD, _OTHER = 0, 1, 2
_PHASE_SPAN, _STAGE_SPAN = 1_000_000, 10_000


def is_schedule(obj):
    """A torch.distributed.pipelining schedule (duck-typed: its stage(s) and microbatch count)."""
    return hasattr(obj, "_n_microbatches") and (hasattr(obj, "_stage") or hasattr(obj, "_stages"))


def schedule_stages(schedule):
    return list(schedule._stages) if hasattr(schedule, "_stages") else [schedule._stage]


def mesh_of_schedule(schedule, model, world, axis):
    """The mesh string of a schedule's run where it can be read: the pipeline
    axis (its stages' process group) outermost, as torchtitan and Megatron
    lay it, then the named DeviceMesh of the stages' DTensor parameters where
    the two span the world ("pp=2,fsdp=1"); "pp=N" when the stages hold no
    DTensor and the pipeline is the world; else None."""
    stage = schedule_stages(schedule)[0]
    pp = int(getattr(stage, "group_size", 0) or 0)
    if pp < 1 or world % pp:
        return None
    inner = mesh_of_model(model, world // pp)
    if inner is not None:
        return f"{axis}={pp},{inner}"
    has_dtensor = any(is_dtensor(p) for p in model.parameters())
    return f"{axis}={pp}" if pp == world and not has_dtensor else None


def read_mesh(model, schedule, world, rank, axis):
    """A capture's mesh when none is given: one rank's ("dp=1"), or the one the
    model's DTensors (a schedule's stages and group) say; else refused by name."""
    mesh = (mesh_of_schedule(schedule, model, world, axis) if schedule is not None
            else split_for_context_parallel(mesh_of_model(model, world), model, rank)) or \
        ("dp=1" if world == 1 else None)
    if mesh is None:
        raise ValueError(f"rank {rank}: capture(mesh=...) is needed with {world} ranks, "
                         "e.g. mesh='tp=4' (the axes your layouts name)")
    return mesh


class StageModules(torch.nn.Module):
    """The modules of this rank's stages as one model: their module paths and
    parameter names as in the whole model (each stage's module is the whole
    model with the other stages' layers deleted, torchtitan's way), without
    the stage roots, which no whole model has."""

    def __init__(self, submods):
        super().__init__()
        self._submods = list(submods)  # a plain list: not registered, so no prefix

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        for m in self._submods:
            for path, module in m.named_modules():
                if path:
                    yield path, module

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        for m in self._submods:
            for path, p in m.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield path, p

    def parameters(self, recurse=True):
        for _, p in self.named_parameters():
            yield p


class PipelineTaps:
    """Held by a Capture of a schedule: wraps the stages' chunk calls and the
    schedule's step while the capture is open."""

    def __init__(self, capture, schedule, axis):
        c = capture
        if axis not in c.axis_sizes:
            raise ValueError(f"rank {c.rank}: capture of a pipeline schedule: the mesh '{c.mesh}' has no axis "
                             f"'{axis}' (pipeline_axis=): name the pipeline's mesh axis, e.g. mesh='{axis}=2'")
        self.capture, self.schedule, self.axis = c, schedule, axis
        self.stages = schedule_stages(schedule)
        self.n_stages = self.stages[0].num_stages
        self.microbatches = int(schedule._n_microbatches)
        self.grad_scale = self.microbatches if getattr(schedule, "scale_grads", False) else 1
        after = 1
        names = list(c.axis_sizes)
        for name in reversed(names[names.index(axis) + 1:]):
            after *= c.axis_sizes[name]
        coordinate = (c.rank // after) % c.axis_sizes[axis]
        self.stage_attr = f"{axis}={coordinate}"
        self._chunk = None  # (phase, stage index, microbatch) while a chunk runs
        # tap name -> [attrs, order, {microbatch: its rows}, the step's tap laid together or None,
        #              its microbatches' sketches (sketch mode, pipeline_sketch.py) or None]
        self._held = {}
        self._complex = {}  # tap name -> a complex output's real view (capture_hooks.complex_view)
        self._next = {}  # (phase, stage key) -> next local position
        self._saved = []
        self._hooks = []
        self._steps = 0  # schedule.step() calls begun
        self.rows = None  # a microbatch's rows: dimension 0 of a stage's first input in a chunk

    # -- the schedule's calls ---------------------------------------------

    def attach(self):
        for stage in self.stages:
            for method, phase in (("forward_one_chunk", _FORWARD), ("backward_one_chunk", _BACKWARD),
                                  ("backward_weight_one_chunk", _BACKWARD)):
                self._wrap(stage, method, self._in_chunk(stage, getattr(stage, method), phase))
        self._wrap(self.schedule, "step", self._stepping(self.schedule.step))
        for stage in self.stages:
            self._hooks.append(stage.submod.register_forward_pre_hook(self._learn_rows, with_kwargs=True))

    def _learn_rows(self, module, args, kwargs):
        if self.rows is None and self._chunk is not None:
            self.rows = first_batch(args, kwargs)

    def detach(self):
        for obj, name, had, old in reversed(self._saved):
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)
        self._saved = []
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._chunk = None

    def _wrap(self, obj, name, fn):
        had = name in obj.__dict__
        self._saved.append((obj, name, had, obj.__dict__.get(name)))
        setattr(obj, name, fn)

    def _in_chunk(self, stage, inner, phase):
        c = self.capture
        calls = {}  # microbatch -> the capture's call numbering within it

        def run(chunk_id, *args, **kwargs):
            was, was_calls = self._chunk, c._calls
            self._chunk = (phase, stage.stage_index, int(chunk_id))
            if phase == _FORWARD:
                c._calls = calls.setdefault((c._step, int(chunk_id)), {})
            try:
                return inner(chunk_id, *args, **kwargs)
            finally:
                self._chunk, c._calls = was, was_calls
        return run

    def _stepping(self, inner):
        def step(*args, **kwargs):
            self._steps += 1  # each step's taps after the last one's, phase by phase
            self.rows = None  # each step's microbatches their own rows (a smaller last batch has fewer)
            try:
                return inner(*args, **kwargs)
            finally:
                if self.capture._thread is not None:
                    self.flush()
        return step

    # -- taps ---------------------------------------------------------------

    def in_setup(self):
        """A module call outside any chunk: the stage's shape inference, not a tap."""
        return self._chunk is None

    def hold(self, name, tensor, attrs):
        """A tap made inside a chunk: copied into its place in the step's tap
        (one copy: microbatch m's rows of a buffer made at the first call,
        whole microbatches alike) until the step ends; True when held."""
        if self._chunk is None:
            return False
        phase, stage_index, mb = self._chunk
        entry = self._held.get(name)
        value = tensor.detach()
        if getattr(tensor, "_diffcheck_complex", False):
            self._complex[name] = True
        batched = value.dim() and (self.rows is None or value.shape[0] == self.rows)
        if entry is None:
            # the schedule's stage index beside the rank's `stage`: one rank may hold several (interleaved, zbv)
            attrs = dict(attrs, pipeline_stage=stage_index)
            sketched = None
            if self.capture.sketches is not None and batched and not self._complex.get(name):
                sketched = pipeline_sketch.start(self.capture.sketches, self.capture, attrs, value,
                                                 self.microbatches, self.stage_attr)
            entry = self._held[name] = [attrs, self._position(phase, stage_index), {}, None, sketched]
        pieces = entry[2]
        if mb in pieces:  # a zero-bubble schedule's weight pass hands the same gradient again
            return True
        scale = self.grad_scale if phase == _BACKWARD else 1
        if entry[4] is not None:  # sketch mode: this microbatch's piece sketched now, not copied (pipeline_sketch.py)
            entry[4].add(mb, value, scale)
            pieces[mb] = True
            return True
        if batched and entry[3] is None and not pieces:
            entry[3] = value.new_empty((value.shape[0] * self.microbatches, *value.shape[1:]))
        whole = entry[3]
        rows = value.shape[0] if value.dim() else 0
        if batched and whole is not None and rows * self.microbatches == whole.shape[0] and \
                value.shape[1:] == whole.shape[1:]:
            place = whole[mb * rows:(mb + 1) * rows]
            place.copy_(value)
        else:  # a microbatch of another shape: kept apart, laid together at the step's end
            entry[3] = None
            place = value.clone()
        if scale != 1:
            place.div_(scale)
        pieces[mb] = place
        return True

    def order_of_other(self):
        """The place of a tap made outside chunks (parameters at the optimizer's step)."""
        return self._position(_OTHER, self.stages[0].stage_index)

    def _position(self, phase, stage_index):
        key = stage_index if phase != _BACKWARD else self.n_stages - 1 - stage_index
        n = self._next.get((self._steps, phase, key), 0)
        self._next[(self._steps, phase, key)] = n + 1
        return (self._steps * 3 + phase) * _PHASE_SPAN + key * _STAGE_SPAN + n

    def flush(self):
        """The step's held taps, each with its microbatches laid together in order."""
        held, self._held = self._held, {}
        complex_views, self._complex = self._complex, {}
        c = self.capture
        for name, (attrs, order, pieces, laid, sketched) in sorted(held.items(), key=lambda kv: kv[1][1]):
            missing = [m for m in range(self.microbatches) if m not in pieces]
            if missing or len(pieces) != self.microbatches:
                raise RuntimeError(
                    f"rank {c.rank}: tap '{name}' of stage {self.stage_attr}: the step ran microbatches "
                    f"{sorted(pieces)} of it, not all {self.microbatches} (missing {missing}); a module that "
                    "runs on some microbatches only cannot be laid together: exclude= it")
            if sketched is not None:  # its microbatches' sketches put together
                summary, tokens = sketched.summary(name, c.rank)
                more = {"microbatches": self.microbatches, "order": order, "stage": self.stage_attr}
                c.sketches.add(name, summary, {**sketched.attrs, **more}, sketched.logical, tokens, sketched.shared,
                               sketched.dim)
                continue
            if laid is not None:
                whole, more = laid, {"microbatches": self.microbatches}
                if c.data_axes:  # each data-parallel replica its own samples: the step's rows split over them
                    attrs = with_data_axes(attrs, tuple(whole.shape), c.data_axes, self.rows * self.microbatches)
            else:  # no batch dimension (hand_pipeline.lay_together): one value, or a gradient's sum
                whole, more = lay_together([pieces[m] for m in range(self.microbatches)], self.rows,
                                           name.startswith(c._step + "grad/"))
            if complex_views.get(name):
                whole._diffcheck_complex = True
            c._write_values(name, whole, {**attrs, **more, "order": order, "stage": self.stage_attr})
