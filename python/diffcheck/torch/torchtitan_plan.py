"""torchtitan's context parallelism read as layouts, with no `layouts=`.

torchtitan (0.3.0, `partial_dtensor` backend) applies context parallelism
by wrapping each layer's inner attention (`apply_cp_to_forward`): with
FlexAttention the wrapper all-gathers the keys and values over the cp group
(`flex_cp_allgather(k, v, 1, pg_name)`); with SDPA it hands q, k and v to
torch's context-parallel dispatcher as DTensors on the cp mesh. Everything
else runs on this rank's tokens as plain tensors: the trainer shards the
tokens, labels and positions before the model sees them
(`prepare_context_parallel_input`), by default with torch's head-tail load
balancer (rank r of n holds the sequence's chunks r and 2n-1-r of 2n).

So, read from the wrappers' closures (their group) and the model's
`positions` argument (which tokens this rank holds):
- every activation whose dimension 1 is the local sequence length is split
  there over the cp axis (library_plans.py's sequence rule), and the inner
  attention's output ([batch, heads, tokens, head_dim]) at dimension 2;
- with head-tail balancing, such a tap holds two streams, the head in rank
  order and the tail in reverse (`streams "head:S/2,tail:S/2:reversed"`,
  docs/FORMAT.md);
- positions that are neither this rank's contiguous share nor its head-tail
  share (the `ptrr` balancer, per-document positions) are refused by name,
  to be given layouts;
- under tensor parallelism with sequence parallelism, the sequence-parallel
  regions split each rank's cp share again over tp: split over "cp*tp",
  with the head-tail chunks' order said in `block_order` (rank (c, t) of
  n x T holds the t-th T-th of [chunk c, chunk 2n-1-c]);
- the cp axis is no data axis: its ranks hold the same samples (torchtitan's
  mesh folds cp into FSDP2's `dp_shard_cp`, which data_axes.py would
  otherwise read as one).
Recognised by the wrapper's name and closure (nothing of torchtitan is
imported).
"""
from diffcheck.dump.layouts import rank_coords
from diffcheck.torch.hook_closures import closure_values


def _cp_forward(fn, depth=0):
    """torchtitan's `cp_forward` in `fn` or the functions it wraps (with tensor parallelism, Module.parallelize
    wraps it again: `forward_with_redistribution` around a partial of local_map's wrapper of it), or None."""
    if fn is None or depth > 4:
        return None
    if getattr(fn, "__name__", None) == "cp_forward" and getattr(fn, "__closure__", None) is not None:
        return fn
    inner = [getattr(fn, "func", None), *getattr(fn, "args", ()), *closure_values(fn)]  # a partial's too
    for value in inner:
        if callable(value) and not isinstance(value, type):
            found = _cp_forward(value, depth + 1)
            if found is not None:
                return found
    return None


def _cp_group(module):
    """The process group of torchtitan's context-parallel wrapper on `module`'s forward, or None."""
    forward = _cp_forward(module.__dict__.get("forward"))
    if forward is None:
        return None
    cells = {}
    for name, cell in zip(forward.__code__.co_freevars, forward.__closure__):
        try:
            cells[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    if isinstance(cells.get("pg_name"), str):  # FlexAttention: flex_cp_allgather over the named group
        import torch.distributed as dist
        return dist.distributed_c10d._resolve_process_group(cells["pg_name"])
    mesh = cells.get("mesh")  # SDPA: torch's dispatcher on this mesh
    return mesh.get_group() if hasattr(mesh, "get_group") else None


def context_parallel_modules(model):
    """[(path, inner attention module, its cp group)] of torchtitan's wrappers in `model`."""
    found = []
    for path, m in model.named_modules() if hasattr(model, "named_modules") else ():
        group = _cp_group(m)
        if group is not None:
            found.append((path, m, group))
    return found


class TitanContextParallel:
    """Built by LibraryLayouts; `active` where the model carries torchtitan's wrappers."""

    def __init__(self, model, axis_sizes, rank, group_axis):
        self.rank, self.axis, self.inner, self.streams, self.axis_sizes = rank, None, set(), None, axis_sizes
        found = context_parallel_modules(model)
        self.active = bool(found)
        if not found:
            return
        axes = {group_axis(group, axis_sizes, rank, f"rank {rank}: torchtitan's context parallelism on "
                                                     f"'{path or 'model'}'") for path, _, group in found}
        if len(axes) != 1 or None in axes:
            raise ValueError(f"rank {rank}: torchtitan's context parallelism runs over {sorted(map(str, axes))}: "
                             "one mesh axis (not the whole world of a larger mesh) must be its group")
        self.axis = axes.pop()
        self.degree = axis_sizes[self.axis]
        self.index = rank_coords(rank, axis_sizes)[self.axis]
        self.inner = {id(m) for _, m, _ in found}
        self.said = f"from torchtitan's context parallelism (its group: axis '{self.axis}')"

    def within_sequence_parallel(self, attrs, shape, local_length):
        """Whether a tap's sequence dimension (1) is split again over another
        axis (tensor parallelism's sequence-parallel regions: a DTensor's
        Shard(1) on tp) inside this rank's cp share: sequence_parallel_attrs
        lays it out."""
        spec = (attrs.get("spec") or "").split(",")
        if local_length is None or len(shape) < 2 or len(spec) != len(shape) or spec[1] in ("", "-"):
            return False
        axes = spec[1].split("*")
        if self.axis in axes:
            return False
        blocks = 1
        for a in axes:
            blocks *= self.axis_sizes.get(a, 1)
        return shape[1] * blocks == local_length  # a share of this rank's tokens, not another dimension split

    def sequence_parallel_attrs(self, attrs):
        """`attrs` of a tap within_sequence_parallel: its sequence dimension
        split over cp, then over the tensor-parallel axes, in the order the
        tokens lie (`block_order`, docs/FORMAT.md, where head-tail balanced);
        None where no such order exists (an odd tp degree splits a chunk pair
        across its head and tail)."""
        spec = attrs["spec"].split(",")
        tp_axes = spec[1].split("*")
        t_size = 1
        for a in tp_axes:
            t_size *= self.axis_sizes[a]
        spec[1] = "*".join([self.axis] + tp_axes)
        out = {**attrs, "spec": ",".join(spec)}
        if self.streams is None:  # contiguous shares: rank (c, t) holds block c * T + t, in order
            return out
        if t_size % 2:
            return None
        half, n = t_size // 2, self.degree
        order = [c * half + t if t < half else (2 * n - 1 - c) * half + t - half
                 for c in range(n) for t in range(t_size)]
        return {**out, "block_order": "1:" + ",".join(map(str, order))}

    def learn(self, args, kwargs, local_length):
        """From the model's call: which of the sequence's tokens this rank holds (`positions`)."""
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        where = f"rank {self.rank}: torchtitan's context parallelism over '{self.axis}'"
        if positions is None or not hasattr(positions, "shape") or positions.shape[-1] != local_length:
            raise ValueError(f"{where}: the model was called without positions of its {local_length} tokens, so "
                             "which tokens this rank holds cannot be told: pass positions (as torchtitan's trainer "
                             "does) or give the taps layouts")
        rows = positions.reshape(-1, local_length)
        if not bool((rows == rows[:1]).all()):  # positions that restart per document differ from sample to sample
            raise ValueError(f"{where}: this rank's samples hold different positions (positions that restart per "
                             "document?), so which of the sequence's tokens it holds cannot be told from them: give "
                             "the taps layouts")
        row = [int(p) for p in rows[0].tolist()]
        n, r, length = self.degree, self.index, local_length
        if row == list(range(r * length, (r + 1) * length)):
            self.streams = None
            return
        half = length // 2
        head = list(range(r * half, (r + 1) * half))
        tail = list(range((2 * n - 1 - r) * half, (2 * n - r) * half))
        if length % 2 == 0 and row == head + tail:
            self.streams = f"head:{half * n},tail:{half * n}:reversed"
            return
        raise ValueError(f"{where}: this rank's positions ({row[:4]} ... {row[-2:]}) are neither its contiguous "
                         f"share of the sequence nor its head-tail share (torch's _HeadTailLoadBalancer), so no layout "
                         "read from torchtitan describes its tokens (the 'ptrr' balancer, or positions that restart "
                         "per document): give the taps layouts")


def context_axes(model, axis_sizes, rank, group_axis):
    """The mesh axes torchtitan's context parallelism runs over (not data axes), or ()."""
    found = context_parallel_modules(model)
    axes = []
    for path, _, group in found:
        try:
            axis = group_axis(group, axis_sizes, rank, path)
        except ValueError:
            continue  # named when the capture opens (TitanContextParallel)
        if axis is not None and axis not in axes:
            axes.append(axis)
    return tuple(axes)
