"""The rerun check of dct.watch (`rerun=module path, rerun_every=M`): on
every M-th step one module's forward is run a second time on the same rank,
with the same inputs and the same random state, right after the first, and
the two outputs are compared bit for bit. Code is deterministic on one device
with the same inputs; a difference is the device computing wrong some of the
time (a transient fault), which no replica comparison sees once an
all-reduce has averaged it away. A rank's findings travel with the watch's
next exchange, so every rank learns of them at the same check."""
import torch

_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _tensors(v)


def first_difference(a, b):
    """(flat index, a's value, b's value) of the first element whose bits differ, or None."""
    for x, y in zip(_tensors(a), _tensors(b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return (0, float("nan"), float("nan"))
        bx, by = (t.detach().contiguous().view(_INT_OF[t.element_size()]).reshape(-1) for t in (x, y))
        apart = (bx != by).nonzero()
        if apart.numel():
            i = int(apart[0])
            return (i, float(x.reshape(-1)[i]), float(y.reshape(-1)[i]))
    return None


class Rerun:
    def __init__(self, watch, path, every):
        modules = dict(watch.model.named_modules())
        if path not in modules:
            raise ValueError(f"rank {watch.rank}: watch(rerun='{path}'): the model has no module of that path "
                             f"(some: {', '.join(list(modules)[1:6])})")
        if int(every) < 1:
            raise ValueError(f"watch(rerun_every={every}): a rerun every 1 or more steps")
        self.watch, self.path, self.every, self.module = watch, path, int(every), modules[path]
        self.findings = []  # this rank's, since the last exchange
        self._rng, self._busy = None, False
        self._handles = [self.module.register_forward_pre_hook(self._before),
                         self.module.register_forward_hook(self._after, with_kwargs=True)]

    def _due(self):
        return not self._busy and (self.watch.steps + 1) % self.every == 0

    def _before(self, module, args):
        if self._due():
            self._rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)

    def _after(self, module, args, kwargs, output):
        if not self._due() or self._rng is None:
            return
        after = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
        self._busy = True
        try:
            torch.set_rng_state(self._rng[0])
            if self._rng[1] is not None:
                torch.cuda.set_rng_state_all(self._rng[1])
            with torch.no_grad():
                again = module(*args, **kwargs)
        finally:
            self._busy = False
            torch.set_rng_state(after[0])
            if after[1] is not None:
                torch.cuda.set_rng_state_all(after[1])
            self._rng = None
        d = first_difference(output, again)
        if d is not None:
            self.findings.append({"step": self.watch.steps, "module": self.path, "index": d[0], "first": d[1],
                                  "again": d[2]})

    def take(self):
        found, self.findings = self.findings, []
        return found

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
