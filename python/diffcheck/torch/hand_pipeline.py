"""Pipelines written by hand (`dist.send`/`recv` between stages, a loop over
microbatches: Megatron's p2p and many research codebases), as a schedule's
capture (pipeline.py) has them:

- `stage="pp=1"` (on `dct.capture`, in a `layouts=` entry or on `dct.tap`):
  the tap belongs to that pipeline stage (docs/FORMAT.md, `stage`). Given on
  the capture, every tap of it carries it: outputs, gradients, parameters.
- `microbatches=M`: a module called M times in a step (between `dct.step`
  calls) ran microbatch k on its call k (`name`, `name@1`, ... counting from
  0); those calls are laid together along dimension 0 in microbatch order
  and written as one tap `name` with `microbatches=M`, as the whole batch of
  this rank (the reference's rows). Their gradients likewise. Parameter taps
  are never microbatched.

An output with no batch dimension (a position embedding's `[T, D]`: its
dimension 0 is not the microbatch's rows, learnt from the stage's first
input) is not laid together: it is the same for every microbatch, checked
bitwise, and written once; its gradient is the sum of the microbatches'
(the reference's is the whole batch's). A copy that differs is written as
microbatch 0's with `microbatch_copies_differ` naming the others, which
compare reports as a failure at that tap.

The order across stages is compare's (harness/capture/tap_order.h): forward
from the first stage, gradients from the last.
"""
import re
import weakref

import torch

from diffcheck.torch.data_axes import first_batch, is_parameter_tap

_CALL = re.compile(r"@(\d+)(?=$|/|:)")


def split_call(name):
    """("step0/x/0", 2) from "step0/x@2/0": the tap's name without its call
    number, and the number (0 for a first call)."""
    m = None
    for m in _CALL.finditer(name):
        pass
    if m is None:
        return name, 0
    return name[:m.start()] + name[m.end():], int(m.group(1))


def is_gradient(name):
    return "grad/" in name and not is_parameter_tap(name)


def lay_together(pieces, rows, gradient):
    """(the step's tensor, attributes it adds) from microbatch k's piece at
    pieces[k]: laid together along dimension 0 when each piece has the
    microbatch's `rows` there; otherwise (no batch dimension) the one value
    of every microbatch, or for a gradient their sum."""
    first = pieces[0]
    batched = first.dim() > 0 and (rows is None or first.shape[0] == rows) and \
        all(p.dim() == first.dim() and p.shape[1:] == first.shape[1:] for p in pieces)
    if batched:
        return torch.cat(pieces, 0), {"microbatches": len(pieces)}
    if gradient:
        total = pieces[0].clone()
        for p in pieces[1:]:
            total.add_(p)
        return total, {}
    differ = [k for k, p in enumerate(pieces[1:], 1) if p.shape != first.shape or not torch.equal(p, first)]
    if differ:
        return first, {"microbatch_copies_differ": ",".join(str(k) for k in differ)}
    return first, {}


class HandPipeline:
    """Held by a capture that is not a schedule's: adds the capture's stage to
    every tap and joins the calls of microbatched taps."""

    def __init__(self, capture, stage, microbatches):
        if stage is not None:
            axis, _, coordinate = str(stage).partition("=")
            if axis not in capture.axis_sizes or not coordinate.isdigit() or \
                    int(coordinate) >= capture.axis_sizes[axis]:
                raise ValueError(f"rank {capture.rank}: capture(stage={stage!r}): give '<axis>=<coordinate>' of an "
                                 f"axis of the mesh '{capture.mesh}', e.g. stage='pp=0'")
        if microbatches is not None and (int(microbatches) != microbatches or microbatches < 1):
            raise ValueError(f"rank {capture.rank}: capture(microbatches={microbatches!r}): a count >= 1")
        # a proxy: the capture holds this, and a cycle would leave both to the garbage collector
        self.capture, self.stage = weakref.proxy(capture), stage
        self.microbatches = None if microbatches in (None, 1) else int(microbatches)
        self.rows = None  # a microbatch's rows: dimension 0 of the model's first input
        self._held = {}  # joined name -> [attrs, order, {k: piece}, M, gradient]

    def learn_rows(self, module, args, kwargs):
        if self.rows is None:
            self.rows = first_batch(args, kwargs)

    def staged(self, name, attrs):
        """`attrs` with the capture's stage and microbatch count where the tap has none of its own."""
        if self.stage is not None and "stage" not in attrs:
            attrs = {**attrs, "stage": self.stage}
        if self.microbatches and "microbatches" not in attrs and not is_parameter_tap(name):
            attrs = {**attrs, "microbatches": self.microbatches}
        return attrs

    def hold(self, name, tensor, attrs):
        """A microbatch's piece of a tap: kept until its step's M pieces are
        here, then written laid together; True when held."""
        m = attrs.get("microbatches")
        if not m or int(m) == 1 or is_parameter_tap(name):
            return False
        m, c = int(m), self.capture
        joined, k = split_call(name)
        if k >= m:
            raise ValueError(
                f"rank {c.rank}: tap '{joined}' was called {k + 1} times in one step, more than its "
                f"microbatches={m}: call dct.step(t) at each training step, or give a module that runs more than "
                "once per microbatch its own layout without microbatches")
        entry = self._held.get(joined)
        if entry is None:
            attrs = {a: v for a, v in attrs.items() if a != "microbatches"}
            entry = self._held[joined] = [attrs, c._order, {}, m, is_gradient(joined)]
            c._order += 1
        entry[2][k] = tensor.detach().clone()
        if len(entry[2]) == m:
            del self._held[joined]
            self._write(joined, entry)
        return True

    def _write(self, joined, entry):
        attrs, order, pieces, m, gradient = entry
        whole, more = lay_together([pieces[k] for k in range(m)], self.rows, gradient)
        self.capture._write_values(joined, whole, {**attrs, **more, "order": order})

    def flush(self):
        """At a step's end and at close: a tap that did not get all its microbatches is an error. The
        next step learns its own microbatch rows (a smaller last batch has fewer)."""
        held, self._held, self.rows = self._held, {}, None
        for joined, (_, _, pieces, m, _) in held.items():
            missing = [k for k in range(m) if k not in pieces]
            raise RuntimeError(
                f"rank {self.capture.rank}: tap '{joined}': the step ran microbatches {sorted(pieces)} of it, not "
                f"all {m} (missing {missing}); a module that runs on some microbatches only cannot be laid "
                "together: exclude= it, or give it a layout without microbatches")
