"""Layouts that parallel libraries say of their own modules, read at capture
with no `layouts=` from the user (as dtensor_plan.py reads a DTensor plan).

DeepSpeed-Ulysses (`deepspeed.sequence.layer.DistributedAttention`): its
query, key and value arrive split along the sequence; an all-to-all over its
process group (`spg`) scatters them along `scatter_idx` (the heads) and
gathers them along `gather_idx` (the sequence), so its local attention
(`local_attn`) runs the whole sequence on its share of the heads; a second
all-to-all gathers the heads back and scatters the sequence again. So:
  - the DistributedAttention's output is split along dimension `gather_idx`;
  - its local attention's output (the first tensor it returns) is split
    along dimension `scatter_idx`;
over the mesh axis whose ranks through this one are the process group's.
Every other activation of a Ulysses model is split along the sequence as
the attention's input is: a tap whose sequence dimension is the local
sequence length (that dimension of the model's first tensor input) is
split there over that axis, on top of its layout, as data_axes.py splits
the batch. The sequence dimension is one of the first two of DeepSpeed's
[b, s, h, d] or [s, b, h, d]: `gather_idx` where it is one of them, else
`scatter_idx` (the two swapped: a bug the attention's own taps then show,
with the rest of the model still laid out right). Recognised by class name and those attributes (no import of
deepspeed).

yunchang's USP (`yunchang.LongContextAttention`: Ulysses inside ring): its
query, key and value arrive split along the sequence over the ring and the
Ulysses groups together (`ring_pg`, `ulysses_pg`), rank by rank in the
order of the ranks; its output is split the same way, along `gather_idx`,
over both axes (major to minor in the mesh's order); the rest of the model
along the sequence as for DeepSpeed. Its attention runs inside ring
functions, no module: nothing of it is tapped inside.

Megatron-core's tensor- and sequence-parallel layers and parameters:
megatron_plan.py, asked from here; transformers' own tensor-parallel layers
(5.x with plain tensors): transformers_plan.py, likewise.
"""
from diffcheck.dump.layouts import is_dtensor, spec_at
from diffcheck.torch.diffusers_plan import DiffusersContextParallel
from diffcheck.torch.megatron_plan import MegatronLayouts
from diffcheck.torch.mesh_aliases import group_axis
from diffcheck.torch.torchtitan_plan import TitanContextParallel
from diffcheck.torch.transformers_plan import TransformersLayouts


def _is_ulysses(module):
    return (type(module).__name__ == "DistributedAttention"
            and all(hasattr(module, a) for a in ("local_attn", "spg", "scatter_idx", "gather_idx")))


def _sequence_dimension(m):
    for idx in (m.gather_idx, m.scatter_idx):
        if int(idx) in (0, 1):
            return int(idx)
    return int(m.gather_idx)


def _is_usp(module):
    return (type(module).__name__ in ("LongContextAttention", "LongContextAttentionQKVPacked")
            and all(hasattr(module, a) for a in ("ring_pg", "ulysses_pg", "gather_idx")))


def _usp_axes(module, axis_sizes, rank, where):
    """The mesh axes of a USP module's ring and Ulysses groups (a group of one
    rank, or none, names no axis), in the mesh's order: its sequence split."""
    import torch.distributed as dist
    axes = []
    for group in (module.ring_pg, module.ulysses_pg):
        if group is not None and dist.get_world_size(group) > 1:
            axes.append(group_axis(group, axis_sizes, rank, where))
    return "*".join(a for a in axis_sizes if a in axes)


_WHY = {"streams_sketch": "in sketch mode: each rank holds its share of several streams or blocks out of rank "
                          "order (diffusers' [text, image], torch's head-tail balancing), which a sketch of the "
                          "whole reference cannot compare stream by stream",
        "titan_sp": "torchtitan's context parallelism, head-tail balanced, with sequence parallelism over an odd "
                    "tp degree: each rank's tp share of its cp share straddles a head and a tail chunk, which no "
                    "block order describes",
        "transposed": "Megatron's VocabParallelEmbedding under sequence parallelism returns [s, b, h], the "
                      "reference's (tp=1) [b, s, h]: a transposed pair no layout describes (the embedding's "
                      "output holds the same values in the order of both)"}


def _packed_blocks(module, p):
    """What diffusers' packing says of parameter `p` of `module`
    (`_tp_packed_row_blocks` / `_tp_packed_col_blocks`: a fused projection
    whose blocks are split one by one under tensor parallelism, [its share of
    the attention's, its share of the MLP's] on each rank, while its DTensor
    says one plain Shard): ({"streams": "0:64,1:256"}, None), each block a
    stream (docs/FORMAT.md); (None, why) where the DTensor splits more than
    that dimension; (None, None) where nothing is packed here (a plain
    parameter under context parallelism is whole; a row-packed layer's bias
    is replicated)."""
    if not is_dtensor(p):
        return None, None
    for attr in ("_tp_packed_row_blocks", "_tp_packed_col_blocks"):
        blocks = getattr(module, attr, None)
        if not blocks or len(blocks) < 2:
            continue
        shards = [pl.dim % p.dim() for pl in p.placements if pl.is_shard() or hasattr(pl, "split_factor")]
        along = [d for d in set(shards) if p.shape[d] == sum(blocks)]
        if not shards:
            return None, None
        if len(set(shards)) == 1 and along:
            return {"streams": ",".join(f"{i}:{int(b)}" for i, b in enumerate(blocks))}, None
        return None, f"diffusers' packed projection ({attr} {list(blocks)}): each block split on its own, " \
                     "along a dimension its DTensor also splits otherwise, which no spec describes"
    return None, None


class LibraryLayouts:
    """Open with a capture: the layouts of the library modules found in the model."""

    def __init__(self, model, axis_sizes, rank):
        self._of = {}  # id(module) -> (axis, dimension, what says so, only the first output)
        self.sequence = None  # (axis, dimension) of a Ulysses model's sequence split
        self.local_length = None  # learnt from the model's first input (learn_length)
        self._length_of = None  # how, where not that dimension of it (Megatron's token ids)
        self.left_out = []  # (tap, why): taps no layout describes
        for path, m in model.named_modules():
            if _is_ulysses(m):
                where = f"rank {rank}: DeepSpeed DistributedAttention '{path or 'model'}'"
                axis = group_axis(m.spg, axis_sizes, rank, where)
                said = f"DeepSpeed's DistributedAttention (scatter_idx {m.scatter_idx}, gather_idx {m.gather_idx}, " \
                       f"its group: axis '{axis}')"
                self._of[id(m)] = (axis, int(m.gather_idx), f"from {said}", False)
                self._of[id(m.local_attn)] = (axis, int(m.scatter_idx), f"from {said}: its local attention", True)
                sequence = (axis, _sequence_dimension(m))
                self._sequence(sequence, where)
            elif _is_usp(m):
                where = f"rank {rank}: yunchang {type(m).__name__} '{path or 'model'}'"
                axes = _usp_axes(m, axis_sizes, rank, where)
                if axes:
                    said = f"from yunchang's {type(m).__name__} (gather_idx {m.gather_idx}, its ring and Ulysses " \
                           f"groups: '{axes}')"
                    self._of[id(m)] = (axes, int(m.gather_idx), said, True)
                    self._sequence((axes, _sequence_dimension(m)), where)
        self.cp = DiffusersContextParallel(model, axis_sizes, rank)  # diffusers_plan.py
        self.megatron = MegatronLayouts(model, axis_sizes, rank, group_axis)  # megatron_plan.py
        self.transformers = TransformersLayouts(model, axis_sizes, rank, group_axis)  # transformers_plan.py
        if self.megatron.active and self.megatron.sequence_parallel:  # [s, b, h], s split over tp
            self._sequence((self.megatron.axis, 0), f"rank {rank}: Megatron's sequence parallelism")
            self._length_of = self.megatron.local_length
        self.titan = TitanContextParallel(model, axis_sizes, rank, group_axis)  # torchtitan_plan.py
        if self.titan.active:  # [b, s, ...] split over cp (an inner attention's [b, heads, s, d]: layout())
            self._sequence((self.titan.axis, 1), f"rank {rank}: torchtitan's context parallelism")

    def _sequence(self, sequence, where):
        if self.sequence not in (None, sequence):
            raise ValueError(f"{where}: its sequence is split as '{sequence[0]}' at dimension {sequence[1]}, "
                             f"another attention's as '{self.sequence[0]}' at dimension {self.sequence[1]}: give "
                             "the taps layouts")
        self.sequence = sequence

    def __bool__(self):
        return bool(self._of) or self.cp.active or self.megatron.active or self.transformers.active or \
            self.titan.active

    def attach(self, model):
        """The hooks the capture keeps while it is open (their handles)."""
        handles = []
        if self.sequence is not None:  # the local sequence length, from the model's first input
            handles.append(model.register_forward_pre_hook(self.learn_length, with_kwargs=True))
        if self.cp.active:
            for module, hook, pre in self.cp.hooks_on(model):
                handles.append(module.register_forward_pre_hook(hook, with_kwargs=True) if pre else
                               module.register_forward_hook(hook))
        return handles

    def attrs(self, name, attrs, shape, pattern):
        """A tap's attributes with what the libraries imply (a user's pattern wins); None: not tapped."""
        if "_untapped" in attrs:  # a value no layout describes
            self.left_out.append((name, attrs["_untapped"]))
            return None
        attrs = {k: v for k, v in attrs.items() if k != "_grad_partial"}  # its gradient's (backward.py)
        if self.titan.active and self.titan.within_sequence_parallel(attrs, shape, self.local_length):
            said = self.titan.sequence_parallel_attrs(attrs)  # a tp share of a cp share (torchtitan_plan.py)
            if said is None:
                self.left_out.append((name, "titan_sp"))
            return said
        attrs = self.with_sequence(attrs, shape)
        if self.cp.active and pattern is None:
            attrs = self.cp.attrs(name, attrs, shape)
        return attrs

    def untapped(self):
        """The warning for taps not tapped (no layout describes them), or None."""
        said = []
        for why in sorted({why for _, why in self.left_out}):
            names = sorted({name for name, w in self.left_out if w == why})
            said.append(f"{len(names)} tap(s) were not tapped: {_WHY.get(why, why)}: {', '.join(names[:5])}"
                        f"{', ...' if len(names) > 5 else ''}")
        return "; ".join(said) or None

    def sketch_leaves_out(self, name, attrs):
        """Whether a sketch capture leaves tap `name` out: one whose pieces
        hold shares of several streams (`streams`), while its reference is
        sketched whole (named when the capture closes)."""
        if not attrs.get("streams") and not attrs.get("block_order"):
            return False
        self.left_out.append((name, "streams_sketch"))
        return True

    def parameter(self, name, p, module=None):
        """The layout a library says of parameter tap `name` (of parameter `p`,
        of `module`): (attrs, None), (None, None) where none says, (None, why)
        where it is left out (named when the capture closes)."""
        packed, why = _packed_blocks(module, p)
        if why is not None:
            self.left_out.append((name, why))
            return None, why
        if packed is not None:  # a DTensor that says Shard(d), its pieces block by block: a stream each
            return packed, None
        if self.cp.active:  # diffusers' context parallelism: a replicated parameter's gradient summed over it
            return self.cp.parameter(name, p), None
        if not (self.megatron.active or self.transformers.active):
            return None, None
        attrs, why = (self.megatron if self.megatron.active else self.transformers).parameter(p)
        if why is not None:
            self.left_out.append((name, why))
        return attrs, why

    def learn_length(self, module, args, kwargs):
        """A forward pre-hook on the model: the local sequence length."""
        if self.local_length is None:
            for value in list(args) + list(kwargs.values()):
                if self._length_of is not None:
                    if hasattr(value, "shape"):
                        self.local_length = self._length_of(value)
                        return
                    continue
                if hasattr(value, "shape") and hasattr(value, "dim") and value.dim() > self.sequence[1]:
                    self.local_length = int(value.shape[self.sequence[1]])
                    break
        if self.titan.active and self.local_length is not None:  # which tokens: each call's positions
            self.titan.learn(args, kwargs, self.local_length)

    def with_sequence(self, attrs, shape):
        """`attrs` with the sequence axis at the sequence dimension, where that
        dimension is the local sequence length and the spec does not say it."""
        if self.sequence is None or self.local_length is None:
            return attrs
        axis, dim = self.sequence
        if len(shape) <= dim or shape[dim] != self.local_length:
            return attrs
        spec = attrs.get("spec")
        entries = spec.split(",") if spec else ["-"] * len(shape)
        named = {a for e in entries for a in e.split("*")} | set((attrs.get("partial") or "").split("*"))
        if len(entries) != len(shape) or any(a in named for a in axis.split("*")) or entries[dim] != "-":
            return attrs  # the layout check names a mismatch; a spec that says it stands
        entries[dim] = axis
        return {**attrs, "spec": ",".join(entries), **self._streams()}

    def _streams(self):
        """The sequence's streams (torchtitan's head-tail balancing), as attributes."""
        return {"streams": self.titan.streams} if self.titan.active and self.titan.streams else {}

    def layout(self, module, tensor, rest):
        """(attrs, what says so) for the output `tensor` (at `rest` within the
        module's output) of `module`, or None where no library says."""
        if self.cp.active:
            said = self.cp.output_layout(module, tensor, rest)
            if said is not None:
                return said
        for reader in (self.megatron, self.transformers):
            said = reader.layout(module, tensor, rest) if reader.active else None
            if said is not None:
                return said
        if id(module) in self.titan.inner and rest in ("", "/0") and tensor.dim() > 2 and \
                tensor.shape[1] != self.local_length and tensor.shape[2] == self.local_length:
            return {"spec": spec_at(self.titan.axis, 2, tensor.dim()), **self._streams()}, self.titan.said
        entry = self._of.get(id(module))
        if entry is None:
            return None
        axis, dim, said, first_only = entry
        if first_only and rest not in ("", "/0"):
            return None
        if not -tensor.dim() <= dim < tensor.dim():
            return None
        return {"spec": spec_at(axis, dim, tensor.dim())}, said
