"""Forward hooks that a torch.compile'd graph keeps.

Dynamo inlines a module's forward hooks into the graph it compiles. A hook
that does Python work (numbering taps, writing files) breaks the graph, and
the hook is compiled again for every module it closes over (a guard on each
closure's tap name) until Dynamo's cache limit gives up. So while Dynamo
traces, a capture's hook only hands the module's output tensors to one
custom op, `diffcheck::tap`, with the hook's slot number: one node in the
graph, no break, no recompile per hook. The op's implementation runs when
the compiled graph does, with the real tensors, and calls what the capture
put in the slot (the eager hook's work: diffcheck/torch/session.py's `_record`).
Run eagerly, the hook calls the slot directly.

On a compiled model (a torch.compile wrapper given to capture()) the hooks
stay after the capture closes, doing nothing until the next capture fills
their slots: Dynamo then guards on the hooks a module has (first_capture),
so hooks removed and added again would recompile the model after and within
every capture. With them kept, a capture per step compiles once. Their cost
between captures: one call of the op per hooked module and forward, which
finds its slot empty. `diffcheck.torch.unhook(model)` removes them.

The op "mutates" a one-element token: that keeps every tap in the graph
(an op with no outputs and no mutations would be removed as dead code) and
in execution order (each depends on the one before through the token).
"""
import itertools
import weakref

import torch

_SEPARATOR = "\x1f"  # between the output's flattened name suffixes
_slots = {}  # slot -> record(module, pairs, args) of the capture using it, while it is open
_next_slot = itertools.count()
_kept = weakref.WeakKeyDictionary()  # module -> {(pre, depth): (slot, handle)}: hooks of compiled models
_reset_for = weakref.WeakSet()  # compiled wrappers whose graphs were made afresh under a capture
_TOKEN = None
_OP = None


def _op():
    """torch.ops.diffcheck.tap, defined on first use."""
    global _OP, _TOKEN
    if _OP is None:
        @torch.library.custom_op("diffcheck::tap", mutates_args=("token",))
        def tap(token: torch.Tensor, tensors: list[torch.Tensor], slot: int, suffixes: str) -> None:
            record = _slots.get(slot)
            if record is not None:  # between captures: nothing
                record(None, list(zip(suffixes.split(_SEPARATOR), tensors)), ())

        @tap.register_fake
        def _(token, tensors, slot, suffixes):
            return None
        _TOKEN = torch.zeros(1)
        _OP = torch.ops.diffcheck.tap
    return _OP


def _make_hook(slot, flatten, pre):
    def tap(module, args, value):
        if torch.compiler.is_compiling():
            _traced(slot, flatten(value, ""))
        else:
            record = _slots.get(slot)
            if record is not None:
                record(module, list(flatten(value, "")), args)
    if pre:  # a forward pre-hook: the inputs
        return lambda module, args: tap(module, args, args)
    return lambda module, args, output: tap(module, args, output)


def hook(module, record, flatten, pre=False, keep=False):
    """Hooks `module` (pre=True: a forward pre-hook, of its inputs) so that
    `record(module, pairs, args)` gets the (suffix, tensor) pairs
    `flatten(value, "")` gives, eagerly or from a compiled graph. Returns
    (slot, handle to remove at the capture's end, or None where the hook is
    kept: keep=True, a compiled model's)."""
    _op()
    kept = _kept.setdefault(module, {}) if keep else {}
    for depth in itertools.count():  # nested captures of one module: one hook each
        slot, handle = kept.get((pre, depth), (None, None))
        if slot is None:
            slot = next(_next_slot)
            handle = (module.register_forward_pre_hook if pre else module.register_forward_hook)(
                _make_hook(slot, flatten, pre))
            if keep:
                kept[(pre, depth)] = (slot, handle)
        if slot not in _slots:
            break
    _slots[slot] = record
    return slot, None if keep else handle


def _traced(slot, pairs):
    pairs = list(pairs)
    if pairs:
        _OP(_TOKEN, [t for _, t in pairs], slot, _SEPARATOR.join(s for s, _ in pairs))


def release(slots):
    """The capture closed: its hooks (kept ones too) do nothing."""
    for slot in slots:
        _slots.pop(slot, None)


def unhook(model):
    """Removes the hooks kept on a compiled model's modules (outside a
    capture of it; its graphs recompile on the next call)."""
    for module in model.modules():
        for slot, handle in _kept.pop(module, {}).values():
            _slots.pop(slot, None)
            handle.remove()
    forget(model)


def first_capture(wrapper):
    """The first capture of this compiled wrapper throws Dynamo's graphs away
    (torch.compiler.reset: every compiled model of the process recompiles on
    its next call); later ones reuse the graphs it made. From then on Dynamo
    guards on hooks (torch._dynamo.config.skip_nnmodule_hook_guards =
    False, for the rest of the process): by default it does not, and a
    graph compiled for a module without hooks (another instance of the same
    class: Dynamo shares graphs between them) would serve the hooked one."""
    if wrapper not in _reset_for:
        import torch._dynamo
        torch._dynamo.config.skip_nnmodule_hook_guards = False
        torch.compiler.reset()
        _reset_for.add(wrapper)


def forget(wrapper):
    """Its graphs missed hooks: the next capture of it starts afresh."""
    _reset_for.discard(wrapper)


def never_runs(module):
    """A container whose forward is nn.Module's unimplemented one
    (ModuleList, ModuleDict): its hooks can never fire, compiled or not."""
    return type(module).forward is torch.nn.Module.forward
