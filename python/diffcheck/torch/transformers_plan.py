"""The layouts transformers' own tensor-parallel layers say of their modules,
read at capture with no `layouts=` (as megatron_plan.py reads Megatron's).

transformers 5.x before it sharded weights as DTensors (5.15 is tested; its
`tp_plan` strings, "colwise", "rowwise", "packed_colwise", ...) keeps every
weight and activation a plain local tensor. Each planned module gets forward
hooks from a `TensorParallelLayer` (transformers.integrations.tensor_parallel)
bound to the plan's device mesh, and the layer says what it does:
  - `ColwiseParallel`: the weight split on dimension -2 (a bias on -1), the
    output split on its last dimension, or whole with `gather_output`;
  - `RowwiseParallel`: the weight split on dimension -1, the output
    all-reduced (whole), the bias whole;
  - `EmbeddingParallel`: the weight split on `embedding_dim_sharding`, the
    lookups reduced (whole);
  - `AllReduceParallel`: the output all-reduced (whole);
  - `SequenceParallel`: the output reduce-scattered along `sequence_dim`;
  - `ReplicatedWithGradAllReduce` (a per-head norm between a column- and a
    row-parallel layer): its weight whole, its gradient all-reduced; its
    output is laid out as its input, which the DTensor plan's reader
    (dtensor_plan.py, source 4) follows from the projection's output viewed
    as heads;
  - `PackedColwiseParallel` / `PackedRowwiseParallel` split each of the
    packed blocks (gate and up side by side) on its own: a rank's share is
    [its gate, its up], which no spec describes, so the packed weight and the
    packed column-parallel output are left out, named when the capture
    closes; the mixture-of-experts layers likewise (their experts' split is
    their own).
The mesh axis is the one whose ranks are the layer's device mesh's group
(library_plans.group_axis): transformers' 1-D mesh has no axis names.
Recognised by class name through the layer's base class, read from the hook
closures: nothing of transformers is imported.
"""

from diffcheck.dump.layouts import spec_at
from diffcheck.torch.hook_closures import closure_values

_WHOLE_OUTPUT = ("RowwiseParallel", "PackedRowwiseParallel", "EmbeddingParallel", "AllReduceParallel")
_PACKED = ("PackedColwiseParallel", "PackedRowwiseParallel")
_OWN_SPLIT = ("GroupedGemmParallel", "RouterParallel", "RouterParallelMegaMoe", "MoeTensorParalellExperts",
              "MoeTensorParalellMegaMoeExperts", "MoeIdentityExpertParallel", "MlaKvAProjParallel")


def _is_tp_layer(obj):
    return any(c.__name__ == "TensorParallelLayer" and c.__module__.startswith("transformers")
               for c in type(obj).__mro__)


def tensor_parallel_layer(module):
    """(transformers' TensorParallelLayer on `module`, its device mesh), or None."""
    for hook in list(module._forward_hooks.values()) + list(module._forward_pre_hooks.values()):
        values = list(closure_values(hook))
        for value in values:
            layer = getattr(value, "__self__", None)
            if layer is not None and _is_tp_layer(layer):
                mesh = next((v for v in values if hasattr(v, "get_group") and hasattr(v, "mesh")), None)
                return layer, mesh if mesh is not None else getattr(layer, "device_mesh", None)
    return None


def has_tensor_parallel_layers(model):
    return any(tensor_parallel_layer(m) is not None for m in model.modules())



class TransformersLayouts:
    """Open with a capture: the layouts of the transformers tensor-parallel modules found in the model."""

    def __init__(self, model, axis_sizes, rank, group_axis):
        self._of = {}  # id(module) -> (layer kind, layer, axis, what says so)
        self._params = {}  # id(parameter) -> (attrs, None) or (None, why it is left out)
        for path, m in model.named_modules():
            found = tensor_parallel_layer(m)
            if found is None:
                continue
            layer, mesh = found
            kind = type(layer).__name__
            where = f"rank {rank}: transformers {kind} on '{path or 'model'}'"
            axis = group_axis(mesh.get_group() if mesh is not None else None, axis_sizes, rank, where)
            said = f"from transformers' {kind} (its mesh: axis '{axis}')"
            self._of[id(m)] = (kind, layer, axis, said)
            for name, p in m.named_parameters(recurse=False):
                self._params[id(p)] = self._parameter(kind, layer, axis, name, p)

    @property
    def active(self):
        return bool(self._of)

    @staticmethod
    def _parameter(kind, layer, axis, name, p):
        if kind in _PACKED:
            return None, f"transformers' {kind}: each packed block split on its own (a rank holds [its gate, " \
                         "its up]), which no spec describes"
        if kind in _OWN_SPLIT:
            return None, f"transformers' {kind}: its own split of the experts, which no spec describes"
        if kind == "ColwiseParallel":
            return {"spec": spec_at(axis, -1 if p.dim() == 1 else -2, p.dim())}, None
        if kind == "RowwiseParallel" and p.dim() > 1:
            return {"spec": spec_at(axis, -1, p.dim())}, None
        if kind == "EmbeddingParallel":
            return {"spec": spec_at(axis, int(getattr(layer, "embedding_dim_sharding", 0)), p.dim())}, None
        return {}, None  # whole on every rank

    def parameter(self, p):
        """(attrs, None), (None, why) left out, or (None, None) where no layer says."""
        return self._params.get(id(p), (None, None))

    def layout(self, module, tensor, rest):
        """(attrs, what says so) of a planned module's output, or None."""
        entry = self._of.get(id(module))
        if entry is None or tensor.dim() == 0:
            return None
        kind, layer, axis, said = entry
        if kind in _PACKED[:1] or kind in _OWN_SPLIT:
            return {"_untapped": f"transformers' {kind}: its output holds each rank's share of every packed "
                                 "block side by side, which no layout describes"}, said
        if kind == "ColwiseParallel":
            gathered = getattr(layer, "gather_output", False)
            return ({} if gathered else {"spec": spec_at(axis, -1, tensor.dim())}), said
        if kind in _WHOLE_OUTPUT:
            return {}, said
        if kind == "SequenceParallel":
            dim = int(getattr(layer, "sequence_dim", 1))
            return ({"spec": spec_at(axis, dim, tensor.dim())} if -tensor.dim() <= dim < tensor.dim() else {}), said
        return None  # ReplicatedWithGradAllReduce: as its input (dtensor_plan.py)
