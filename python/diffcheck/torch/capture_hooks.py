"""The hooking half of a capture (diffcheck/torch/session.py's Capture): which
modules get hooks, what their taps are called (module paths, `@k` for a
module called again, `step<t>/`, `rename=`), and what a hook does with the
output it is handed (compiled.py hands it over, eagerly or from a compiled
graph). A mixin: the state it uses is the Capture's."""
import fnmatch
import functools

import torch

from diffcheck.torch import compiled
from diffcheck.torch import rounding

ROOT_NAME = "model"


def _flatten(obj, name):
    """(name, tensor) pairs of a module's output: containers get /index or /key;
    a complex tensor as its real view (a trailing dimension of 2: real and
    imaginary parts; complex_view() says so), so a rotary table is checked too."""
    if isinstance(obj, torch.Tensor):
        if obj.is_complex():
            real = torch.view_as_real(obj.resolve_conj())
            real._diffcheck_complex = True
            yield name, real
            return
        yield name, obj
    elif isinstance(obj, dict):  # also transformers' ModelOutput
        for k, v in obj.items():
            yield from _flatten(v, f"{name}/{str(k).replace('/', '.')}")
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{name}/{i}")


def complex_view(tensor):
    """Whether a tap's tensor is a complex output's real view (_flatten)."""
    return getattr(tensor, "_diffcheck_complex", False)


class ModuleHooks:
    def _renamed(self, path):
        for old, new in sorted(self.rename.items(), key=lambda kv: -len(kv[0])):  # the longest prefix wins
            if path == old or path.startswith(old + "."):
                rest = path[len(old):].lstrip(".")
                return ".".join(part for part in (new, rest) if part) or ROOT_NAME
        return path

    def _numbered(self, name, advance=True):
        """`name` on its first call in this step, `name@k` on the (k+1)-th."""
        k = self._calls.get(name, 0)
        if advance:
            self._calls[name] = k + 1
        return self._step + (name if k == 0 else f"{name}@{k}")

    def _selected(self, path):
        return (any(fnmatch.fnmatchcase(path, p) for p in self.include)
                and not any(fnmatch.fnmatchcase(path, p) for p in self.exclude))

    def _layout_for(self, *names):
        for pattern, attrs in self.layouts:
            if any(fnmatch.fnmatchcase(n, pattern) for n in names):
                return pattern, attrs
        return None, {}

    def _record(self, path, pairs, inputs=False, module=None, args=()):
        """A module call's output (or, before it runs, its inputs: `<path>:in`),
        as (name suffix, tensor) pairs (`_flatten(value, "")`)."""
        if self._counts.counting:  # the fake forward of a compiled model: its counts, nothing written
            self._counts.note(self._numbered(path, advance=not inputs)[len(self._step):], pairs, inputs)
            return
        self._fired.add(path)
        if self.pipeline is not None and self.pipeline.in_setup():  # a stage's shape inference: no tap
            return
        with rounding.paused():
            self._record_now(path, pairs, inputs, module, args)

    def _record_now(self, path, pairs, inputs, module, args):
        plain = path + (":in" if inputs else "")
        base = self._numbered(path, advance=not inputs) + (":in" if inputs else "")
        numbered = base[len(self._step):]
        plan = self._plan if self._plan is not None and self._plan.active and not inputs else None
        library = self._library if self._library and not inputs else None
        for rest, tensor in pairs:
            name = base + rest
            # What a library (library_plans.py) or a DTensor plan says of a plain output, asked only where no
            # layout pattern matches.
            inferred = None if plan is None and library is None else functools.partial(
                self._inferred, plan, library, module, tensor, rest, args, f"rank {self.rank}: tap '{name}'")
            # A complex output's real view: its gradient is the complex tensor's, which the view never sees.
            self._write(name, tensor, (plain + rest, plain, numbered + rest, numbered),
                        watch=not inputs and not complex_view(tensor), inferred=inferred)

    @staticmethod
    def _inferred(plan, library, module, tensor, rest, args, where):
        """(attrs, what says so) of a module output no layout pattern matches."""
        said = library.layout(module, tensor, rest) if library is not None else None
        if said is not None:
            return said
        attrs = plan.layout(module, tensor, args, where) if plan is not None else None
        return (attrs, "from the DTensor plan") if attrs else ({}, None)

    def _add_hooks(self, model, keep):
        """A forward hook on every selected module (and a pre-hook with
        inputs=True) that a compiled graph keeps (compiled.py); keep: a
        compiled model's, left in place (empty) when the capture closes."""
        hand = getattr(self, "hand", None)
        for path, module in model.named_modules():
            if not path and hand is not None and hand.stage is not None:
                continue  # a stage's root is a part of the model, and no whole model has it
            path = path or ROOT_NAME
            if not self._selected(path):
                continue
            if compiled.never_runs(module):  # a ModuleList: no forward to hook
                continue
            name = self._renamed(path)
            self._selected_paths.add(name)

            def record(m, pairs, args, name=name):
                self._record(name, pairs, module=m, args=args)

            def record_inputs(m, pairs, args, name=name):
                self._record(name, pairs, inputs=True)
            for pre, fn in ((False, record), (True, record_inputs))[:2 if self.inputs else 1]:
                slot, handle = compiled.hook(module, fn, _flatten, pre=pre, keep=keep)
                self._slots.append(slot)
                if handle is not None:
                    self._handles.append(handle)
