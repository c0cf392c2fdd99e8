"""The layouts of a DTensor-parallelized model's plain outputs, with no
`layouts=` from the user.

A model parallelized with torch's `parallelize_module` and the plan's
default `use_local_output=True` returns plain local tensors: the placements
are gone by the time a forward hook sees the output. Four sources give
them back, most trusted first:

1. what the plan declares: the output placements a parallel style's forward
   hook redistributes to (ColwiseParallel's Shard(-1), RowwiseParallel's
   Replicate or Shard(1), PrepareModuleOutput's desired layouts). Declared,
   not observed: a plan whose redistribution is skipped (a missing
   all-reduce) is then held to what it promised, and found;
2. what a Linear's or an Embedding's DTensor weight implies (libraries
   that parallelize without torch's styles, transformers' tensor-parallel
   plans among them): an output whose last dimension is the weight's local
   share of its output features is sharded there, over the axes that split
   them; one with all of them is replicated (a row-parallel layer's
   reduction, a gathered column-parallel one);
3. what the DTensor said when it became local: `DTensor.to_local` is watched
   while the capture is open, and each local tensor it returns remembers its
   placements and mesh;
4. what the module's input was: a module whose output has the shape of an
   input with a known layout (an activation, a dropout, a residual add) keeps
   that layout; an input that is a view of such a tensor splitting its
   sharded last dimension into heads has the heads sharded (a per-head norm
   after a column-parallel projection, Qwen3's q_norm and k_norm).
5. what its children's outputs were: a module whose output has the shape of
   the sharded output of the child that ran last of those with that shape
   keeps its layout (a wrapper of a column-parallel layer that applies an
   activation, diffusers' GELU(proj); an attention whose output is its heads
   merged, the shape of its value projection's).

An output with none of these whose input is sharded or partial has a layout
no one can know here: `UnknownLayout` names the tap and asks for a layout.
An output with none of these and only replicated (or plain) inputs is
replicated, as every tap no layout matches.
"""
import functools
import sys

import torch
from torch.utils.weak import WeakIdKeyDictionary

from diffcheck.dump.layouts import is_dtensor, placement_attrs
from diffcheck.torch.hook_closures import closure_values
from diffcheck.torch.mesh_aliases import flattened_aliases
from diffcheck.torch.transformers_plan import has_tensor_parallel_layers


def _dtensor_types():
    """(DTensor, Placement, ParallelStyle) of this torch, or None where it has
    none or the program never imported it (then no model has a DTensor plan:
    importing torch.distributed.tensor here would cost every capture its
    tens of MiB)."""
    if "torch.distributed.tensor" not in sys.modules:
        return None
    try:
        from torch.distributed.tensor import DTensor, Placement
        from torch.distributed.tensor.parallel import ParallelStyle
    except ImportError:  # a torch built without distributed
        return None
    return DTensor, Placement, ParallelStyle


class UnknownLayout(ValueError):
    pass


class PlanLayouts:
    """Open while a capture of a model with DTensor parameters or plan hooks is."""

    def __init__(self, model, axis_names):
        self.types = _dtensor_types()
        self.axis_names = axis_names
        self.active = self.types is not None and _is_parallelized(model, self.types)
        self._seen = WeakIdKeyDictionary()  # local tensor -> attrs (from to_local, or tapped)
        self._declared = {}  # id(module) -> (placements, mesh) of its plan's output
        self._resolved, self._order = {}, 0  # id(module) -> (order, shape, attrs) of its latest output
        self._to_local = None
        if self.active:
            for module in model.modules():
                declared = _declared_output(module, self.types)
                if declared is not None:
                    self._declared[id(module)] = (declared, _module_mesh(module, self.types[0]))

    # -- to_local is watched while the capture is open ------------------------

    def __enter__(self):
        if not self.active:
            return self
        DTensor = self.types[0]
        original = DTensor.to_local
        seen, names = self._seen, self.axis_names

        @functools.wraps(original)
        def to_local(dtensor, *args, **kwargs):
            local = original(dtensor, *args, **kwargs)
            try:
                _note(seen, local, (placement_attrs(dtensor.placements, dtensor.device_mesh, dtensor.dim(), names),
                                    dtensor.device_mesh))
            except (ValueError, TypeError):
                pass  # a placement with no diffcheck layout: left to the other sources
            return local
        self._to_local = original
        DTensor.to_local = to_local
        return self

    def __exit__(self, *exc):
        if self._to_local is not None:
            self.types[0].to_local = self._to_local
            self._to_local = None
        return False

    # -- a module output's layout ---------------------------------------------

    def layout(self, module, output, inputs, where):
        """attrs ({"spec", "partial"}) of `output`, a plain tensor that module
        returned from `inputs`; None: replicated."""
        if not self.active:
            return None
        attrs = self._resolve(module, output, inputs, where)
        self._order += 1
        self._resolved[id(module)] = (self._order, tuple(output.shape), attrs)
        return attrs

    def _resolve(self, module, output, inputs, where):
        seen = self._seen.get(output)
        declared = self._declared.get(id(module))
        if declared is not None:
            placements, mesh = declared
            mesh = mesh if mesh is not None else (seen[1] if seen else None)
            if mesh is not None and len(placements) == mesh.ndim:
                attrs = placement_attrs(placements, mesh, output.dim(), self.axis_names)
                self._seen[output] = (attrs, mesh)
                return attrs
        implied = _implied_by_weight(module, output, self.types[0], self.axis_names)
        if implied is not None:
            self._seen[output] = (implied, None)
            return implied
        if seen is not None:
            return seen[0]
        known = [(t, self._seen[t]) for t in _tensors(inputs) if t in self._seen]
        known += [(t, viewed) for t in _tensors(inputs) if t not in self._seen
                  for viewed in [self._view_layout(t)] if viewed is not None]
        for tensor, (attrs, mesh) in known:
            if tensor.shape == output.shape:
                self._seen[output] = (attrs, mesh)
                return attrs
        wrapped = self._wrapped_child(module, output)
        if wrapped is not None:
            self._seen[output] = (wrapped, None)
            return wrapped
        sharded = [attrs for _, (attrs, _) in known if attrs.get("spec") or attrs.get("partial")]
        if sharded:
            raise UnknownLayout(
                f"{where}: its input is laid out {_describe(sharded[0])} (a DTensor plan's), but how its output "
                f"(shape {tuple(output.shape)}) is laid out cannot be told from the plan: give it a layout, "
                "e.g. layouts={'<tap>': '-,-,tp'}")
        return None

    def _wrapped_child(self, module, output):
        """Source 5: the layout of the output of `module`'s child that ran
        last of those with `output`'s shape, where it is sharded — a module
        that wraps a column-parallel layer and applies something elementwise
        (diffusers' GELU(proj), an attention whose heads leave merged as its
        value projection's). None where no such child is sharded."""
        ran = [self._resolved[id(c)] for c in module.children() if id(c) in self._resolved]
        same = [r for r in ran if r[1] == tuple(output.shape)]
        if not same:
            return None
        attrs = max(same)[2]
        return attrs if attrs and (attrs.get("spec") or attrs.get("partial")) else None

    def _view_layout(self, tensor):
        """(attrs, mesh) of a view that splits the last dimension of a tensor
        with a known layout into (heads, head width) — q_proj's output viewed
        as heads before a per-head norm (Qwen3's q_norm) — when that
        dimension alone is sharded: the heads carry its axes. None otherwise."""
        base = tensor._base
        if base is None or base not in self._seen:
            return None
        attrs, mesh = self._seen[base]
        entries = (attrs.get("spec") or "").split(",") if attrs.get("spec") else []
        if attrs.get("partial") or tensor.dim() != base.dim() + 1 or tuple(tensor.shape[:-2]) != tuple(base.shape[:-1]) \
                or tensor.shape[-2] * tensor.shape[-1] != base.shape[-1]:
            return None
        if not entries:
            return ({"spec": None}, mesh)
        if len(entries) != base.dim() or any(e != "-" for e in entries[:-1]):
            return None
        return ({"spec": ",".join(entries[:-1] + [entries[-1], "-"])}, mesh)

    def remember(self, tensor, attrs):
        """A tapped tensor's layout, for the modules it feeds."""
        if self.active and isinstance(tensor, torch.Tensor) and tensor not in self._seen:
            _note(self._seen, tensor, (attrs, None))


def _note(seen, tensor, value):
    """seen[tensor] = value, and the same for the tensor it is a whole view of:
    under autograd DTensor.to_local returns a view of the local tensor, and a
    later view (q_proj's output as heads) has that local tensor as its base."""
    seen[tensor] = value
    base = tensor._base
    if base is not None and base.shape == tensor.shape and base not in seen:
        seen[base] = value


def _implied_by_weight(module, output, DTensor, axis_names):
    """The layout of a Linear's or an Embedding's plain output from its
    DTensor weight (source 2 above), or None."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, DTensor) or output.dim() == 0:
        return None
    if isinstance(module, torch.nn.Linear):
        feature_dim = 0
    elif isinstance(module, torch.nn.Embedding):
        feature_dim = 1
    else:
        return None
    whole, local = weight.shape[feature_dim], weight.to_local().shape[feature_dim]
    width = output.shape[-1]
    if width == whole:
        return {"spec": None}
    if width != local:
        return None
    names = list(getattr(weight.device_mesh, "mesh_dim_names", None) or axis_names or [])
    axes = [n for n, p in zip(names, weight.placements) if p.is_shard() and p.dim % weight.dim() == feature_dim]
    if not axes:
        return None
    return {"spec": ",".join(["-"] * (output.dim() - 1) + ["*".join(axes)])}


def _tensors(inputs):
    for x in inputs if isinstance(inputs, (tuple, list)) else (inputs,):
        if isinstance(x, torch.Tensor):
            yield x


def _describe(attrs):
    parts = [f"spec '{attrs['spec']}'"] if attrs.get("spec") else []
    parts += [f"partial over '{attrs['partial']}'"] if attrs.get("partial") else []
    return ", ".join(parts)


def _is_parallelized(model, types):
    DTensor = types[0]
    if any(isinstance(p, DTensor) for p in model.parameters()):
        return True
    # transformers' own layers (transformers_plan.py) say their outputs; the views after them are read here
    return any(_declared_output(m, types) is not None for m in model.modules()) or has_tensor_parallel_layers(model)


def _module_mesh(module, DTensor):
    for p in module.parameters(recurse=False):
        if isinstance(p, DTensor):
            return p.device_mesh
    return None


def _declared_output(module, types):
    """The output placements a parallel style's forward hook on `module`
    redistributes to, or None. Read from the hook: torch's Colwise and
    Rowwise styles bind theirs as the first argument of a functools.partial,
    PrepareModuleOutput keeps them on the style as desired_output_layouts."""
    _, Placement, ParallelStyle = types
    for hook in module._forward_hooks.values():
        for value in closure_values(hook):
            if isinstance(value, functools.partial):
                for arg in value.args:
                    if _placements(arg, Placement):
                        return tuple(arg)
                value = getattr(value.func, "__self__", None)
            if isinstance(value, ParallelStyle):
                desired = getattr(value, "desired_output_layouts", None)
                if desired is not None and len(desired) == 1 and _placements(desired, Placement):
                    return tuple(desired)
    return None


def _placements(value, Placement):
    return isinstance(value, tuple) and value and all(isinstance(p, Placement) for p in value)


def check_mesh_axes(model, axes, mesh, rank):
    """The DTensor parameters' mesh axes must be the capture's, or several of
    them flattened (mesh_aliases.py): checked when the capture starts, not at
    the first tap that names an axis (after a whole forward and backward were
    captured). Returns the flattened ones' {name: the capture's axes}."""
    from diffcheck.dump import mesh_sizes
    aliases = flattened_aliases(model, mesh_sizes(mesh), rank)
    parameters = getattr(model, "named_parameters", None)
    for name, p in (parameters() if parameters else ()):
        if not is_dtensor(p):
            continue
        names = tuple(getattr(p.device_mesh, "mesh_dim_names", None) or ())
        missing = [n for n in names if n not in axes and n not in aliases]
        if missing:
            sizes = ",".join(f"{n}={k}" for n, k in zip(names, p.device_mesh.shape))
            raise ValueError(f"rank {rank}: parameter '{name}' is a DTensor on the mesh ({sizes}) but the "
                             f"capture's mesh '{mesh}' has no axis {', '.join(repr(m) for m in missing)}: "
                             f"name the capture's axes as the DeviceMesh does (mesh=\"{sizes}\", with any "
                             "other axes of the job)")
    return aliases


def mesh_of_model(model, world):
    """The mesh string ("fsdp=2,tp=2") of the named DeviceMesh the model's
    DTensor parameters lie on, where it spans all `world` ranks; else None."""
    for p in model.parameters():
        if not is_dtensor(p):
            continue
        names = tuple(getattr(p.device_mesh, "mesh_dim_names", None) or ())
        shape = tuple(p.device_mesh.shape)
        size = 1
        for k in shape:
            size *= k
        if names and len(names) == len(shape) and size == world:
            return ",".join(f"{n}={k}" for n, k in zip(names, shape))
    return None
