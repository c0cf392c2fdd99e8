"""How much rounding a tap's value went through, learnt from the ops that made
it, for the derived tolerance (docs/tolerances.md) of a run captured without
a one-device yardstick.

While a capture is open, a torch function mode sees every torch op the model
runs and marks each result with two counts along the deepest
path from the capture's inputs to it:

  depth   the terms summed into each element, op after op: a linear or
          matmul its contraction length, a conv in_channels/groups x kernel,
          a norm its normalized size, softmax and reductions the reduced
          size, attention its head size plus its keys;
  steps   the ops that rounded it to its dtype (element-wise ops count one,
          views, copies and exact ops such as relu none), counted in units
          of the result's own dtype: a rounding to another dtype on the way
          counts (u_other / u)^2 of them, the roundings of equal error. A
          float32 loss of bfloat16 logits carries the bfloat16 roundings
          (2^32 float32 ones each), not those of its own last op alone; a
          bfloat16 cast of a float32 value, hardly more than its own one.

Rounding errors of independent ops add in quadrature, so the error of a
value is ~ u sqrt(steps) + u_acc sqrt(depth) relative to its scale: the
derived rule's form (tolerance.h), with these counts as the tap attributes
`rounding_steps` and `reduction_depth`. An op's result takes the largest
counts of its inputs (a residual x + f(x) is as deep as f(x), not twice),
plus its own. A partial sum's global depth is its local one times the ranks
it is summed over (capture() knows that from the layout).

The counts ride on the tensors (an attribute), so they follow the data and
not the order of execution: a branch that does not feed a tap does not add
to it, and a denoising loop's latents carry the depth of every step before.
Ops run outside the capture, and compiled graphs, are not seen: their
results count as exact inputs. A torch.compile'd model given to capture() is
counted by running its eager module once on fake tensors (no data, no side
effects: compiled_counts.py) before its first compiled forward.
"""
import math

import torch
from torch.overrides import TorchFunctionMode

_ATTR = "_diffcheck_rounding"  # (depth, steps, own depth) on a tensor

# Results that are their input's values, moved or viewed: no rounding.
_NO_ROUNDING = frozenset("""
    view view_as reshape reshape_as transpose transpose_ swapaxes permute contiguous __getitem__ __setitem__ split
    split_with_sizes chunk unbind flatten unflatten unsqueeze unsqueeze_ squeeze squeeze_ expand expand_as narrow
    select t t_ T mT H mH movedim moveaxis clone detach detach_ cat concat concatenate stack hstack vstack pad repeat
    repeat_interleave roll flip tile index_select gather take masked_select tril triu diagonal as_strided
    relu relu_ abs neg __neg__ negative maximum minimum clamp clamp_ clip where masked_fill masked_fill_ max min
    amax amin sign dropout __get__ __set__ copy_ zero_ fill_ requires_grad_ cpu cuda
    """.split())
# Casts round only when they narrow.
_CASTS = frozenset("to type float double half bfloat16".split())
# Ops that are several rounded ops in one call.
_ROUNDINGS = {"scaled_dot_product_attention": 3, "multi_head_attention_forward": 5}
_WIDTH = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def _unit(dtype):
    """Unit roundoff of a float dtype, None for others."""
    bits = _WIDTH.get(dtype)
    return 2.0 ** -bits if bits else None


def in_units_of(steps, source, target):
    """`steps` roundings of dtype `source`, as roundings of dtype `target` of the same error."""
    a, b = _unit(source), _unit(target)
    return steps * (a / b) ** 2 if a and b else steps


def counts(tensor):
    """(depth, steps) of a tensor the mode has seen; (0, 0) for one it has not."""
    c = getattr(tensor, _ATTR, None)
    return (c[0], c[1]) if c else (0, 0)


def own_depth(tensor):
    """The depth the op that made `tensor` added by itself (0 if none or unseen)."""
    c = getattr(tensor, _ATTR, None)
    return c[2] if c else 0


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _shape(x, i, default=1):
    return x.shape[i] if isinstance(x, torch.Tensor) and x.dim() > abs(i) - (i < 0) else default


def _arg(args, kwargs, i, name):
    return args[i] if len(args) > i else kwargs.get(name)


def _reduced(args, out):
    """Elements summed per result element of a reduction: input size / result size."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    y = next(_tensors(out), None)
    if x is None or y is None:
        return 0
    return max(x.numel() // max(y.numel(), 1), 1)


def op_depth(name, args, kwargs, out):
    """Terms summed into each element of `name`'s result."""
    if name == "linear":
        return _shape(_arg(args, kwargs, 1, "weight"), -1)
    # Tensors are read by position or by keyword: libraries call F.* both ways
    # (diffusers: scaled_dot_product_attention(query=..., key=..., value=...)).
    first = _arg(args, kwargs, 0, "input")
    if name in ("matmul", "__matmul__", "mm", "bmm", "dot", "inner", "mv"):
        return _shape(first, -1)
    if name == "__rmatmul__":
        return _shape(args[1], -1) if len(args) > 1 else 1
    if name in ("addmm", "baddbmm", "addbmm", "addmv"):
        return _shape(args[1], -1) if len(args) > 1 else 1
    if name.startswith("conv_transpose"):
        w = _arg(args, kwargs, 1, "weight")
        return math.prod(w.shape[2:]) * w.shape[0] if isinstance(w, torch.Tensor) else 1
    if name.startswith("conv"):
        w = _arg(args, kwargs, 1, "weight")
        return math.prod(w.shape[1:]) if isinstance(w, torch.Tensor) else 1
    if name in ("layer_norm", "rms_norm"):
        shape = _arg(args, kwargs, 1, "normalized_shape")
        return math.prod(shape) if shape else 1
    if name == "group_norm":
        x, groups = first, _arg(args, kwargs, 1, "num_groups") or 1
        return max(x.numel() // max(x.shape[0] * groups, 1), 1)
    if name in ("softmax", "log_softmax", "_softmax", "cumsum", "cumprod", "logcumsumexp"):
        dim = _arg(args, kwargs, 1, "dim")
        return _shape(first, dim if isinstance(dim, int) else -1)
    if name == "scaled_dot_product_attention":  # q k^T over the head size, then p v over the keys
        return _shape(_arg(args, kwargs, 0, "query"), -1) + _shape(_arg(args, kwargs, 1, "key"), -2)
    if name == "multi_head_attention_forward":  # in-projection, q k^T, p v over the keys, out-projection
        embed, heads, key = _arg(args, kwargs, 3, "embed_dim_to_check"), _arg(args, kwargs, 4, "num_heads"), args[1]
        return 2 * embed + embed // max(heads, 1) + _shape(key, 0)
    if name in ("einsum", "tensordot"):
        xs = [t for t in _tensors(args)]
        return max((t.numel() for t in xs), default=1) // max(next(_tensors(out)).numel(), 1) or 1
    if name in ("sum", "mean", "nansum", "nanmean", "var", "std", "var_mean", "std_mean", "norm", "logsumexp",
                "prod", "count_nonzero"):
        return _reduced(args, out)
    return 0


def roundings(name, args, out):
    """How many times `name` rounds its result to its dtype."""
    if name in _NO_ROUNDING:
        return 0
    if name in _CASTS:
        src = next(_tensors(args), None)
        dst = next(_tensors(out), None)
        return int(src is not None and dst is not None and _WIDTH.get(dst.dtype, 0) < _WIDTH.get(src.dtype, 0))
    return _ROUNDINGS.get(name, 1)


class RoundingLedger(TorchFunctionMode):
    """The mode: marks every result with its counts."""

    def __init__(self):
        super().__init__()
        self.paused = False  # the capture's own ops (copies for the writer) are not the model's

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():  # Dynamo traces this mode: the graph gets the op alone, no break
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if self.paused:
            return out
        # Integer results are marked too: a value may pass through its bits
        # (an emulated TF32 rounding, a quantizer) and come back as floats.
        results = list(_tensors(out))
        if not results:
            return out
        name = getattr(func, "__name__", "")
        depth = steps = 0
        dtype = results[0].dtype
        for t in _tensors((args, kwargs)):
            d, s = counts(t)
            depth, steps = max(depth, d), max(steps, in_units_of(s, t.dtype, dtype))
        own = op_depth(name, args, kwargs, out)
        mark = (depth + own, steps + roundings(name, args, out), own)
        for t in results:
            try:
                setattr(t, _ATTR, mark)
            except (AttributeError, RuntimeError):  # a tensor subclass that takes no attributes
                pass
        return out


# One ledger for every open capture of the process (nested captures share it:
# two modes would count each op twice).
_ledger = {"mode": None, "users": 0}


def active():
    """The ledger in force, or None outside a counting capture."""
    return _ledger["mode"]


def hold():
    """A capture that counts opened: the ledger on (the first one starts it)."""
    if _ledger["users"] == 0:
        _ledger["mode"] = RoundingLedger()
        _ledger["mode"].__enter__()
    _ledger["users"] += 1


def release():
    """That capture closed: the ledger off when it was the last."""
    _ledger["users"] -= 1
    if _ledger["users"] == 0:
        mode, _ledger["mode"] = _ledger["mode"], None
        mode.__exit__(None, None, None)


def _top_mode():
    """The innermost torch function mode, where this torch can say and can pop
    it (else None: the ledger then stays on the stack, paused)."""
    o = torch.overrides
    if not all(hasattr(o, f) for f in ("_get_current_function_mode", "_pop_mode", "_push_mode")):
        return None
    return o._get_current_function_mode()


class paused:
    """The capture's own tensor ops (sketches, copies for the writer) are not
    the model's. The ledger also leaves the mode stack meanwhile where it is on
    top: a paused mode still costs each of those ops a trip through Python
    (tens of them per tap, a sketch's slices and sums)."""

    def __enter__(self):
        self.mode = _ledger["mode"]
        self.was = self.mode.paused if self.mode else None
        self.popped = False
        if self.mode:
            self.mode.paused = True
            if _top_mode() is self.mode:
                torch.overrides._pop_mode()
                self.popped = True

    def __exit__(self, *exc):
        if self.mode:
            if self.popped:
                torch.overrides._push_mode(self.mode)
            self.mode.paused = self.was
        return False
