"""The rounding counts (rounding.py) of a torch.compile'd model's taps.

The rounding ledger sees torch ops run eagerly; a compiled graph's ops are
not seen (and the ledger must not be traced into the graph). So before a
compiled model's forward, its eager module runs once on fake tensors
(torch's FakeTensorMode: shapes and dtypes, no data, no kernels, no side
effects on the real parameters) with the ledger on and the capture's hooks
noting each tap's counts instead of writing it. The compiled forward then
runs with the ledger off the mode stack, and each tap takes the counts its
name had in the fake forward. Done once per model and input signature
(shapes and dtypes of the tensors given to it), and kept for later captures.

Where the fake forward cannot run (a collective on fake tensors, an op with
no fake kernel), the taps have no counts: they are held as one rounding of
their dtype unless a one-device run is beside the reference, and a warning
says so.
"""
import warnings
import weakref

import torch

from diffcheck.torch import rounding


_known = weakref.WeakKeyDictionary()  # eager module -> {input signature: {tap name: counts}}


class CompiledCounts:
    @property
    def capture(self):
        return self._capture()

    def __init__(self, capture):
        # Weakly: the capture holds this object, and a strong link back made a
        # reference cycle that outlived every capture until the next GC pass.
        self._capture = weakref.ref(capture)
        self.counting = False  # the fake forward is running
        self._by_name = {}  # tap name without the step prefix -> (depth, steps, own), of the forward's shapes
        self._current = None  # the input signature _by_name is of
        self._failed = set()  # signatures whose fake forward failed (warned once)
        self._pause = None

    def attach(self, wrapper, eager, derive, ran):
        """Hooks on the compiled wrapper (they run eagerly, around the graph):
        the fake forward first where counts are derived, the ledger off the
        stack while the graph runs, and `ran()` after each forward."""
        def before(_module, args, kwargs):
            if derive:
                self._count(eager, args, kwargs)
                self._pause = rounding.paused()
                self._pause.__enter__()

        def after(*_):
            if self._pause is not None:
                pause, self._pause = self._pause, None
                pause.__exit__(None, None, None)
            ran()
        return [wrapper.register_forward_pre_hook(before, with_kwargs=True),
                wrapper.register_forward_hook(after, always_call=True)]

    def _count(self, eager, args, kwargs):
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        signature = tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else repr(t) for t in leaves)
        if signature == self._current:
            return
        # Each shape its own counts (a contraction over the tokens is as deep as they are many)
        self._current, self._by_name = signature, {}
        known = _known.setdefault(eager, {})
        if signature in known:
            self._by_name = dict(known[signature])
            return
        if signature in self._failed:
            return
        from torch._subclasses.fake_tensor import FakeTensorMode
        c = self.capture
        calls, self.counting = c._calls, True
        c._calls = {}
        self._noted = {}
        try:
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake_args, fake_kwargs = torch.utils._pytree.tree_map(
                    lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, (args, kwargs))
                eager(*fake_args, **fake_kwargs)
            known[signature] = self._noted
            self._by_name = dict(self._noted)
        except Exception as e:  # noqa: BLE001 - any failure only loses the counts
            self._failed.add(signature)
            warnings.warn(f"rank {c.rank}: diffcheck could not count the roundings of the compiled model on fake "
                          f"tensors ({type(e).__name__}: {e}); its taps are held as one rounding of their dtype. "
                          "Capture a one-device run beside the reference (one_device=True) for measured tolerances",
                          stacklevel=2)
        finally:
            self.counting = False
            c._calls = calls

    def note(self, name, pairs, inputs):
        """A tap of the fake forward: its counts under its name."""
        for rest, tensor in pairs:
            depth, steps = rounding.counts(tensor)
            self._noted[name + (":in" if inputs else "") + rest] = (depth, steps, rounding.own_depth(tensor))

    def of(self, name, tensor):
        """(depth, steps, own depth) of a tap: the ledger's, else the fake forward's."""
        depth, steps = rounding.counts(tensor)
        if depth or steps or not self._by_name:
            return depth, steps, rounding.own_depth(tensor)
        return self._by_name.get(name, (0, 0, 0))
