"""The training half of a capture (`dct.capture(..., backward=True)`): the
gradient of each tapped module output, every parameter's gradient before the
optimizer step and every parameter after it.

Names, under the step's prefix like every tap (`step<t>/`):
  grad/<output tap>        the gradient of a module output, tapped when the
                           autograd engine computes it (backward order)
  param_grad/<parameter>   p.grad, when the optimizer steps (or dct.grads())
  param/<parameter>        p after the step (or dct.params())

Layouts. A module output's gradient has the output's layout, except that the
gradient of a partial sum is replicated over its partial axes (each part's
gradient is the sum's gradient), and a layout pattern that begins with
`grad/` names its own: a replicated output that each rank uses on its own
tokens (sequence or context parallelism: a timestep embedding) has a
gradient that is a partial sum over those ranks until someone reduces it
(`{"grad/time_embed*": (None, "sp")}`). A parameter and its gradient are looked up
in the capture's layouts by their tap names (`param/<name>`,
`param_grad/<name>`: a pattern such as "param*/attn.q.weight" covers both);
one no pattern matches takes what a library says of it (Megatron's partition
attributes, megatron_plan.py), else is replicated. A tied parameter (one Parameter under
several names) is tapped under every name it has. A gradient the user reduces after
backward (a sequence-parallel LayerNorm weight's, a data-parallel one) is
tapped after that reduction when the optimizer steps, so a layout need not
say `partial` for it.
"""
import fnmatch
import math
import warnings

import torch

from diffcheck.torch import rounding

GRAD, PARAM_GRAD, PARAM = "grad/", "param_grad/", "param/"


class Gradients:
    """Attached to a Capture: registers the tensor hooks of output gradients
    and taps parameters; `optimizer`'s step is wrapped while the capture is open."""

    def __init__(self, capture, optimizer=None):
        self.capture, self.optimizer = capture, optimizer
        self._step_was = None
        self._deepest = (0, 0, 0)
        self._param_grads_tapped = False  # by the optimizer's step or dct.grads()
        self._grads_seen = False  # a module output's gradient came: a backward ran  # forward counts: depth, steps, rows (for gradients' derived tolerance)

    # -- module outputs -----------------------------------------------------

    def watch(self, name, tensor, attrs, pattern=None):
        """`tensor` (tap `name`, layout `attrs`, set by `pattern`) was just computed: tap its gradient when
        backward reaches it."""
        if not (tensor.requires_grad and torch.is_grad_enabled()):
            return
        c = self.capture
        step = c._step
        grad_name = step + GRAD + name[len(step):]
        grad_pattern, layout = self._grad_layout(grad_name[len(step):])
        if layout is None:
            # a partial sum's gradient is replicated; it is the stage's, and microbatched as its output
            layout = {k: v for k, v in attrs.items() if k in ("spec", "stage", "microbatches", "_untapped")}
            if "_grad_partial" in attrs:  # a library's whole value used on each rank's own tokens
                layout["partial"] = attrs["_grad_partial"]
            grad_pattern = f"{pattern}, its output's" if pattern else None
        depth, steps = rounding.counts(tensor)
        steps = rounding.in_units_of(steps, tensor.dtype, torch.float64)  # one unit for every dtype
        rows = tensor.numel() // max(tensor.shape[-1], 1) if tensor.dim() else 1
        d, s, r = self._deepest
        self._deepest = (max(d, depth), max(s, steps), max(r, rows))

        def hook(grad):
            self._grads_seen = True
            if c._grad_divisor != 1:  # each rank's mean loss over its own samples: D x the global batch's
                grad = grad / c._grad_divisor
            if c._thread is not None:  # a backward after the capture closed writes nothing
                c._write_now(grad_name, grad, self._with_counts(layout, grad.dtype), grad_pattern)
        tensor.register_hook(hook)

    def _with_counts(self, layout, dtype):
        """A gradient's counts are not seen (the autograd engine runs in C++):
        it is held as deep as the deepest forward value plus a sum over the
        tokens (a weight's gradient sums over every row), its roundings those
        of the forward twice over, in units of its own dtype."""
        if not self.capture.derive_depths or "reduction_depth" in layout:
            return layout
        depth, steps, rows = self._deepest
        steps = rounding.in_units_of(2 * steps, torch.float64, dtype)
        return {**layout, "reduction_depth": max(depth + rows, 1), "rounding_steps": max(math.ceil(steps), 1)}

    # -- parameters ---------------------------------------------------------

    def grads(self):
        """Every parameter's .grad (or, where none, the `main_grad` that Megatron's
        DistributedDataParallel accumulates into), as `param_grad/<name>`."""
        self._parameters(PARAM_GRAD, lambda p: p.grad if p.grad is not None else getattr(p, "main_grad", None))

    def params(self):
        """Every parameter's value, as `param/<name>`."""
        self._parameters(PARAM, lambda p: p.detach())

    def at_close(self):
        """A training step with a hand-written update (no optimizer=, no
        dct.grads()): the parameter gradients still there are tapped now; if
        none are, a warning says that none were tapped (never a silent gap)."""
        if self._param_grads_tapped:
            return
        c = self.capture
        if any(p.grad is not None for p in c.model.parameters()):
            self.grads()
            return
        what = ("a backward ran, but no parameter holds a gradient now (the update cleared them)"
                if self._grads_seen else "no backward ran in it")
        warnings.warn(f"rank {c.rank}: capture(backward=True) of {c.path}: no parameter gradient was tapped: "
                      f"{what}. Give optimizer= or call dct.grads() where the gradients are reduced", stacklevel=3)

    def _parameters(self, kind, value):
        c = self.capture
        if kind == PARAM_GRAD:
            self._param_grads_tapped = True
        # A parameter under several names (tied: an output head that is the
        # token embedding) is tapped under each, so a pipeline stage that holds
        # it under one of them finds its reference.
        modules = dict(c.model.named_modules(remove_duplicate=False))  # a parameter's module (packed layers)
        for path, p in c.model.named_parameters(remove_duplicate=False):
            tensor = value(p)
            if tensor is None:
                continue
            name = kind + c._renamed(path)
            if any(fnmatch.fnmatchcase(name, glob) for glob in c.exclude if glob.startswith("param")):
                continue  # exclude= names parameter taps by their tap names (param/..., param_grad/...)
            pattern, layout = self._param_layout(name, tensor)
            if pattern is None and c._library is not None:  # what a library says of them (library_plans.py)
                said, why = c._library.parameter(name, p, modules.get(path.rpartition(".")[0]))
                if why is not None:
                    continue
                if said is not None:
                    pattern, layout = "from the library's plan (library_plans.py)", {**layout, **said}
            c._write_now(c._step + name, tensor, layout, pattern)

    def _grad_layout(self, name):
        """(the pattern, the layout) a `grad/` pattern of the capture gives gradient tap `name`; (None, None):
        none does."""
        for pattern, attrs in self.capture.layouts:
            if pattern.startswith(GRAD) and fnmatch.fnmatchcase(name, pattern):
                return pattern, dict(attrs)
        return None, None

    def _param_layout(self, name, tensor):
        """(the pattern, the layout it gives the parameter tap; none: whole); a
        gradient's with its counts, a layout named for it or not (a sum over
        every token: without a depth the derived rule holds it to one rounding).
        Only a pattern that names parameter taps (it starts with "param":
        "param*", "param_grad/blocks.*") is theirs: a catch-all "*" meant for
        activations is not."""
        c = self.capture
        pattern, layout = next(((pattern, dict(attrs)) for pattern, attrs in c.layouts
                                if pattern.startswith("param") and fnmatch.fnmatchcase(name, pattern)), (None, {}))
        return pattern, self._with_counts(layout, tensor.dtype) if name.startswith(PARAM_GRAD) else layout

    # -- the optimizer ------------------------------------------------------

    def wrap_optimizer(self):
        """optimizer.step() taps the gradients before it and the parameters after it."""
        opt = self.optimizer
        if opt is None:
            return
        self._step_was = opt.__dict__.get("step")  # an instance's own step, if it had one
        inner = opt.step

        def step(*args, **kwargs):
            self.grads()
            out = inner(*args, **kwargs)
            self.params()
            return out
        opt.step = step

    def unwrap_optimizer(self):
        opt = self.optimizer
        if opt is None or "step" not in opt.__dict__:
            return
        if self._step_was is None:
            del opt.step
        else:
            opt.step = self._step_was
