"""The layouts Megatron-core says of its own tensor-parallel modules, read at
capture with no `layouts=` (as library_plans.py reads DeepSpeed-Ulysses).

Megatron keeps activations as plain tensors in [sequence, batch, hidden]
order, and describes itself:
  - `ColumnParallelLinear`: its output is split along the last dimension over
    its tensor-parallel group (`tp_group`), unless `gather_output`; with
    `skip_bias_add` its second output is its share of the bias (dimension 0);
  - `RowParallelLinear`: its output is reduced over the group: whole, or
    under sequence parallelism (`sequence_parallel`) reduce-scattered along
    the sequence (dimension 0); its second output is the whole bias (under
    sequence parallelism added to each rank's tokens: its gradient is a
    partial sum over tp until Megatron reduces the bias's gradient). The
    attention and MLP blocks return their last row-parallel layer's pair;
  - `DotProductAttention` (core attention) runs its share of the heads: its
    output [s, b, heads * d] is split along the last dimension, its softmax's
    and dropout's [b, heads, sq, sk] along the heads, as are the query and
    key norms' [s, b, heads, d] of the attention around it;
  - `VocabParallelEmbedding` reduces its lookups: whole, or under sequence
    parallelism (`reduce_scatter_embeddings`) transposed to [s, b, h] and
    reduce-scattered along the sequence. The model at tp=1, its reference,
    returns [b, s, h] there: a transposed pair that no layout describes, so
    the tap is left out, named when the capture closes (the embedding's
    output next to it holds the same values, in the order of both runs);
  - a GPTModel with `parallel_output` returns its logits split along the
    vocabulary (the last dimension), as its output layer computes them;
  - under sequence parallelism every other activation is split along the
    sequence as the reduce-scattered ones are: a tap whose dimension 0 is
    the local sequence length;
  - a parameter with `tensor_model_parallel` is split along its
    `partition_dim` over its module's group (a `partition_stride` other than
    1 interleaves shares, which no spec describes: left out, named); every
    other parameter is whole on every rank, its gradient too (under sequence
    parallelism Megatron all-reduces the norms' gradients, the parameters it
    marks `sequence_parallel`: a rank that missed it differs from the others).

The group's mesh axis is the one whose ranks are the group's (library_plans
.group_axis). Recognised by class name and attributes: nothing of megatron
is imported.
"""
from diffcheck.dump.layouts import spec_at

_COLUMN, _ROW, _CORE, _VOCAB = "ColumnParallelLinear", "RowParallelLinear", "DotProductAttention", "VocabParallelEmbedding"
_ROW_PAIRS = ("SelfAttention", "MLP")  # blocks that return their row-parallel layer's (output, bias)


def _group_size(group):
    return group.size() if hasattr(group, "size") else 1


class MegatronLayouts:
    """Open with a capture: the layouts of the Megatron modules found in the model."""

    def __init__(self, model, axis_sizes, rank, group_axis):
        self.rank = rank
        self._of = {}  # id(module) -> callable(tensor, rest) -> (attrs, what says so) or None
        self._params = {}  # id(parameter) -> attrs, or a reason it is left out
        self.axis = None  # the tensor-parallel axis
        self.tp_size = 1
        self.sequence_parallel = False
        self.transposed = []  # taps left out: [s, b, h] here, [b, s, h] in the reference
        for path, m in model.named_modules():
            kind = type(m).__name__
            group = getattr(m, "tp_group", None) if kind in (_COLUMN, _ROW, _VOCAB) else \
                getattr(getattr(m, "pg_collection", None), "tp", None) if kind == _CORE else None
            if group is None or _group_size(group) < 2:
                continue
            where = f"rank {rank}: Megatron {kind} '{path or 'model'}'"
            axis = group_axis(group, axis_sizes, rank, where)
            if self.axis not in (None, axis):
                raise ValueError(f"{where}: its tensor-parallel group is axis '{axis}', another module's '{self.axis}': "
                                 "give the taps layouts")
            self.axis = axis
            self.sequence_parallel |= bool(getattr(m, "sequence_parallel", False))
            self._of[id(m)] = self._rule(kind, m, axis)
            for name, p in m.named_parameters(recurse=False):
                if getattr(p, "tensor_model_parallel", False):
                    self._params[id(p)] = self._param_rule(p, axis, f"{path}.{name}" if path else name)
        if self.axis is None:
            return
        self.tp_size = axis_sizes[self.axis]
        for m in model.modules():
            kind = type(m).__name__
            if kind in _ROW_PAIRS:
                inner = next((c for c in m.modules() if type(c).__name__ == _ROW and id(c) in self._of), None)
                if inner is not None:
                    self._of[id(m)] = self._of[id(inner)]
            elif kind == _CORE and id(m) in self._of:  # its softmax's and dropout's [b, heads, sq, sk]
                for inner in (getattr(m, "scale_mask_softmax", None), getattr(m, "attention_dropout", None)):
                    if inner is not None:
                        self._of[id(inner)] = self._heads(1, f"from Megatron's {_CORE}: its probabilities")
            if hasattr(m, "q_layernorm") and id(getattr(m, "linear_qkv", None)) in self._of:  # [s, b, heads, d]
                for inner in (m.q_layernorm, m.k_layernorm):
                    if inner is not None:
                        self._of[id(inner)] = self._heads(2, f"from Megatron's {kind}: its query's or key's heads")
            elif hasattr(m, "output_layer") and getattr(m, "parallel_output", False) and id(m.output_layer) in self._of:
                width = getattr(m.output_layer, "output_size_per_partition", None)
                self._of[id(m)] = self._logits(width)

    @property
    def active(self):
        return self.axis is not None

    def _rule(self, kind, m, axis):
        said = f"from Megatron's {kind}"

        def split(dim, ndim):
            return {"spec": spec_at(axis, dim, ndim)}

        if kind == _COLUMN:
            gathered = bool(getattr(m, "gather_output", False))

            def column(tensor, rest):
                if rest in ("", "/0"):
                    return ({}, f"{said} (gather_output)") if gathered else \
                        (split(-1, tensor.dim()), f"{said}: split along its output features over '{axis}'")
                return (split(0, tensor.dim()), f"{said}: its share of the bias") if rest == "/1" else None
            return column
        if kind == _ROW:
            sequence = bool(getattr(m, "sequence_parallel", False))
            if getattr(m, "explicit_expert_comm", False):
                return lambda tensor, rest: None  # an expert's: reduced elsewhere, not said here

            def row(tensor, rest):
                if rest in ("", "/0"):
                    return (split(0, tensor.dim()), f"{said}: reduce-scattered along the sequence over '{axis}'") \
                        if sequence else ({}, f"{said}: all-reduced over '{axis}'")
                if rest != "/1":
                    return None
                if sequence:  # added to each rank's share of the sequence: its gradient a partial sum over tp
                    return {"_grad_partial": axis}, f"{said}: the whole bias, used on this rank's tokens"
                return {}, f"{said}: the whole bias"
            return row
        if kind == _CORE:
            return lambda tensor, rest: (split(-1, tensor.dim()), f"{said}: its share of the heads over '{axis}'") \
                if rest in ("", "/0") else None
        scattered = bool(getattr(m, "reduce_scatter_embeddings", False))

        def vocab(tensor, rest):
            if scattered:
                return {"_untapped": "transposed"}, f"{said} (reduce_scatter_embeddings): [s, b, h] here"
            return {}, f"{said}: all-reduced over '{axis}'"
        return vocab

    def _heads(self, dim, said):
        axis = self.axis

        def heads(tensor, rest):
            if rest in ("", "/0") and tensor.dim() == 4:
                entries = ["-"] * 4
                entries[dim] = axis
                return {"spec": ",".join(entries)}, f"{said}, split over '{axis}'"
            return None
        return heads

    def _logits(self, width):
        axis = self.axis

        def logits(tensor, rest):
            if rest in ("", "/0") and tensor.dim() and tensor.shape[-1] == width:
                entries = ["-"] * tensor.dim()
                entries[-1] = axis
                return {"spec": ",".join(entries)}, "from Megatron's GPTModel (parallel_output): split along the vocabulary"
            return None
        return logits

    def _param_rule(self, p, axis, name):
        stride = int(getattr(p, "partition_stride", 1))
        dim = int(getattr(p, "partition_dim", 0))
        if stride != 1:
            return f"partition_stride {stride} (interleaved shares, which no spec describes)"
        entries = ["-"] * p.dim()
        entries[dim] = axis
        return {"spec": ",".join(entries)}

    def layout(self, module, tensor, rest):
        rule = self._of.get(id(module))
        return rule(tensor, rest) if rule is not None else None

    def parameter(self, p):
        """(attrs or None: whole, reason it is left out or None) of a parameter tap."""
        said = self._params.get(id(p))
        if said is None:
            return None, None
        return (None, said) if isinstance(said, str) else (dict(said), None)

    def local_length(self, value):
        """The local sequence length from the model's first tensor input: token
        ids [b, s] (a GPTModel's), s / tp of them; activations [s/tp, b, h]
        (a bare block's), their dimension 0."""
        if not hasattr(value, "shape") or value.dim() < 1:
            return None
        if not value.is_floating_point() and value.dim() >= 2:
            return int(value.shape[1]) // self.tp_size
        return int(value.shape[0])
