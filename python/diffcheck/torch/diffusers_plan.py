"""diffusers' context parallelism read as layouts (`model.enable_parallelism(
config=ContextParallelConfig(...))`), with no `layouts=` from the user.

enable_parallelism installs, on the modules its `_cp_plan` names, hooks
that split an input (`ContextParallelInput(split_dim)`: before the module
runs) or an output (`split_output=True`: a rotary table), and hooks that
gather an output (`ContextParallelOutput(gather_dim)`: `proj_out`). Read
from those hooks (their plan entries and their flattened mesh):

- a tap whose dimension d is the local length of a split along d (the full
  length the split hook saw, over the context-parallel degree) is split
  there over the context-parallel axis; an output the plan splits is split
  as it says;
- any other activation is replicated (a timestep embedding, a modulation,
  what was computed before the split or after the gather);
- the gradient of a replicated activation that each rank uses on its own
  tokens is a partial sum over that axis; after the gather (the gathered
  output and all that follows it) gradients are whole;
- a length that is both a split's local length and the length of an input
  the plan leaves whole (Wan's text at 4 ranks: 8 of 32 video tokens, 8 text
  tokens) cannot tell a split tap from a whole one: a tap of that length is
  refused by name, to be given a layout;
- a tap whose dimension d is the local text length plus the local image
  length holds each rank's text and image tokens side by side (a joint
  sequence: each rank's share of each stream, concatenated; the single-stream
  blocks, FLUX's rotary tables): it is split there with `streams`
  "text:T,image:I" (docs/FORMAT.md), text first, as every diffusers model
  with a `_cp_plan` concatenates them (`torch.cat([encoder_hidden_states,
  hidden_states])`, `torch.cat((txt_ids, img_ids))`), and compared stream by
  stream. In sketch mode such a tap is not tapped (its reference is one
  sketch of the whole), and the capture names it in one warning at its end.

A user's `layouts=` entry always wins (it is asked first). The axis is the
capture's mesh axis (or axes, major to minor) whose ranks through this rank
are the context-parallel mesh's.
"""
import itertools

from diffcheck.dump.layouts import is_dtensor, spec_at
from diffcheck.torch.data_axes import is_parameter_tap
from diffcheck.torch.mesh_aliases import axes_along


def _is_text(key):
    """Whether a split input of the plan is the text stream (`encoder_hidden_states`, `txt_ids`)."""
    return "encoder" in key or "txt" in key or "text" in key


def _hooks(module, kind):
    registry = getattr(module, "_diffusers_hook", None)
    return [h for h in getattr(registry, "hooks", {}).values() if type(h).__name__ == kind]


class DiffusersContextParallel:
    """Built by LibraryLayouts when the model carries diffusers' context-parallel hooks."""

    def __init__(self, model, axis_sizes, rank):
        self.rank = rank
        self.splits, self.outputs, self.gathers = [], {}, set()  # (module, plan); id -> {index: dim}; ids
        mesh = None
        for _, m in model.named_modules():
            for hook in _hooks(m, "ContextParallelSplitHook"):
                self.splits.append((m, hook.metadata))
                mesh = hook.parallel_config._flattened_mesh
                for key, cpm in hook.metadata.items():
                    if getattr(cpm, "split_output", False):
                        self.outputs.setdefault(id(m), {})[int(key)] = int(cpm.split_dim)
            for hook in _hooks(m, "ContextParallelGatherHook"):
                self.gathers.add(id(m))
                mesh = hook.parallel_config._flattened_mesh
        self.active = mesh is not None
        if not self.active:
            return
        ranks = mesh.mesh.flatten().tolist()
        self.degree = len(ranks)
        self.axis = axes_along(ranks, axis_sizes, rank, ordered=False)
        if self.axis is None:
            raise ValueError(f"rank {rank}: diffusers' context parallelism runs over ranks {sorted(ranks)}, which no "
                             f"axis of the mesh {','.join(f'{a}={n}' for a, n in axis_sizes.items())} spans through "
                             f"rank {rank}: name the mesh's axes so that one (or a few together) is that group")
        self.lengths = {}  # dimension -> the local lengths of the splits along it
        self.keyed = {}  # dimension -> {input name: its local length} (text and image streams told apart)
        self.after_gather = False  # set once a gathered output is made in this forward
        self.whole_gradients = set()  # taps made after a gather: their gradients are whole
        self.whole_lengths = set()  # dimension 1 of the model's inputs the plan does not split

    def hooks_on(self, model):
        """(module, pre-hook or forward hook, is_pre) to register while the capture is open."""
        out = [(model, self._forward_starts, True)]
        for m, plan in self.splits:
            out.append((m, self._learn_split(plan), True))
        for m in self._gather_modules(model):
            out.append((m, self._gathered, True))  # before its own tap: the gathered output is "after" too
        return out

    def _gather_modules(self, model):
        return [m for m in model.modules() if id(m) in self.gathers]

    def _forward_starts(self, module, args, kwargs):
        """The model's own call: the lengths of its inputs the plan leaves whole (dimension 1 of 3-D ones and up)."""
        self.after_gather = False
        split = {k for _, plan in self.splits for k in plan if _ is module}
        for key, v in list(enumerate(args)) + list(kwargs.items()):
            if key not in split and hasattr(v, "shape") and getattr(v, "dim", lambda: 0)() >= 3:
                self.whole_lengths.add(int(v.shape[1]))

    def _gathered(self, module, args, kwargs):
        self.after_gather = True

    def _learn_split(self, plan):
        names = None

        def learn(module, args, kwargs):
            nonlocal names
            if names is None:
                import inspect
                names = list(inspect.signature(type(module).forward).parameters)[1:]
            for key, cpm in plan.items():
                if getattr(cpm, "split_output", False):
                    continue
                value = kwargs.get(key) if isinstance(key, str) and key in kwargs else \
                    args[names.index(key)] if isinstance(key, str) and key in names and names.index(key) < len(args) \
                    else None
                for v in value if isinstance(value, (list, tuple)) else (value,):
                    if hasattr(v, "shape") and v.dim() > cpm.split_dim and \
                            (cpm.expected_dims is None or v.dim() == cpm.expected_dims):
                        local = int(v.shape[cpm.split_dim]) // self.degree
                        self.lengths.setdefault(int(cpm.split_dim), set()).add(local)
                        if isinstance(key, str):
                            self.keyed.setdefault(int(cpm.split_dim), {})[key] = local
        return learn

    def output_layout(self, module, tensor, rest):
        """A split output's layout (the plan's), or None."""
        split = self.outputs.get(id(module))
        if split is None:
            return None
        index = int(rest.lstrip("/").split("/")[0]) if rest.lstrip("/") else 0
        dim = split.get(index)
        # a complex table (its real view, capture_hooks.complex_view): its layout names its own dimensions
        ndim = tensor.dim() - (1 if getattr(tensor, "_diffcheck_complex", False) else 0)
        if dim is None or not -ndim <= dim < ndim:
            return None
        self.lengths.setdefault(dim % ndim, set()).add(int(tensor.shape[dim % ndim]))
        return {"spec": spec_at(self.axis, dim, ndim)}, "from diffusers' context-parallel plan (split_output)"

    def parameter(self, name, p):
        """What the plan says of parameter tap `name`: a replicated parameter's
        gradient (`param_grad/`) covers each rank's own tokens, and the training
        step sums it over the ranks (as DDP would) in its dtype before the
        optimizer, where it is read: `reduced` (docs/FORMAT.md). None: nothing."""
        if "/param_grad/" in "/" + name and not is_dtensor(p):
            return {"reduced": self.axis}
        return None

    def _streams(self, dim, length):
        """`streams` ("text:T,image:I", global lengths) where `length` is a
        rank's text share beside its image share of the inputs split along
        dimension `dim`, else None."""
        keyed = self.keyed.get(dim, {})
        text = [k for k in keyed if _is_text(k)]
        image = [k for k in keyed if not _is_text(k)]
        for t, i in itertools.product(text, image):
            if keyed[t] + keyed[i] == length:
                return f"text:{keyed[t] * self.degree},image:{keyed[i] * self.degree}"
        return None

    def attrs(self, name, attrs, shape):
        """`attrs` of a tap no layout pattern set, as the plan implies; None: not tapped (a joint sequence)."""
        if is_parameter_tap(name):
            return attrs
        spec = attrs.get("spec")
        entries = spec.split(",") if spec else ["-"] * len(shape)
        if len(entries) != len(shape):
            return attrs
        if self.axis not in entries:
            for dim, locals_ in sorted(self.lengths.items()):
                if dim < len(shape) and entries[dim] == "-" and shape[dim] in locals_:
                    if dim == 1 and shape[dim] in self.whole_lengths:
                        raise ValueError(
                            f"rank {self.rank}: tap '{name}' (shape {tuple(shape)}): its dimension 1 of {shape[dim]} is both a "
                            "context-parallel split's local length and the length of an input the plan leaves "
                            "whole, so whether it is split cannot be told: give it a layout (layouts={'" + name +
                            "': '-," + self.axis + ",-'} if split, None if whole)")
                    entries[dim] = self.axis
                    break
                streams = self._streams(dim, shape[dim]) if dim < len(shape) and entries[dim] == "-" else None
                if streams is not None:
                    entries[dim] = self.axis
                    attrs = {**attrs, "streams": streams}
                    break
        if self.axis not in entries and len(shape) == 2 and entries[0] == "-" and \
                shape[0] in self.lengths.get(1, ()) and shape[0] not in self.whole_lengths:
            # a tokens-first table ([tokens, features]: FLUX.2's rotary tables, from position ids
            # [batch, tokens, n] split on their tokens and indexed down to them): split as its tokens
            entries[0] = self.axis
        elif self.axis not in entries and len(shape) == 2 and entries[0] == "-" and self._streams(1, shape[0]):
            entries[0] = self.axis  # the same table of a joint sequence (FLUX.2's, text and image ids together)
            attrs = {**attrs, "streams": self._streams(1, shape[0])}
        attrs = {**attrs, "spec": ",".join(entries)} if self.axis in entries else attrs
        if "/grad/" not in "/" + name:
            if self.after_gather:
                self.whole_gradients.add(name)
            return attrs
        forward = name.replace("grad/", "", 1)  # step<t>/grad/x -> step<t>/x
        if self.axis in entries or forward in self.whole_gradients or attrs.get("partial"):
            return attrs
        return {**attrs, "partial": self.axis}  # a replicated value each rank used on its own tokens
