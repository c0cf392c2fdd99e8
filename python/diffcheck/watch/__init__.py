"""`dct.watch(model, optimizer, mesh=...)`: a live check inside a running
training job that the ranks which must hold the same bits still do.

Every `every` optimizer steps, just before the step, each rank hashes (on the
tensor's device, one pass) every parameter, as this step's forward used it,
and its gradient (after the user's all-reduce); close() compares the
parameters after the last step once more. One all-gather of 32 bytes per
tensor and rank brings the hashes to every rank, and the ranks of each
replica group compare theirs. Replica groups are the ranks whose coordinates
differ only along a tensor's replica axes: the mesh axes its layout (a
`layouts=` pattern on `param/<name>`, as for dct.capture, or a DTensor's
placements) neither splits nor sums over. A data-parallel job gives
mesh="dp=4"; a tensor-parallel one with replicated norms its layouts.

When replicas disagree the report names the step, the tensor, the ranks
apart from their group (the odd one out where the group has 3 or more) and
their hosts; every rank writes its piece of each disagreeing tensor to
`<out>.rank<R>.h5` (a diffcheck file: `diffcheck compare <out>` gives the
first differing element), and rank 0 prints that comparison. Then, with
on_mismatch="stop" (the default), every rank raises ReplicasDiffer (an
uncaught one ends the job with exit status 1); with "warn" the job goes on
with a warning.

The rerun check (`rerun="<module path>"`, `rerun_every=M`, diffcheck/watch/rerun.py):
every M-th step that module's forward runs again on each rank with the same
inputs and random state; different bits are a transient fault of that rank's
device, reported (with the step, the module and the first differing element)
at the next check, as a TRANSIENT fault rather than a replica disagreement.

`exchange_every=N` (or "auto": N picked by the hub from measured times)
sends N checks' hashes together (diffcheck/watch/batches.py): each check is
still made at its step and a finding names that step, found up to N-1
checks later; the default, 1, exchanges every check at once.

It never hangs: each exchange waits at most `timeout` seconds and then names
the ranks that did not come (diffcheck/watch/exchange.py). It never lies: a
model with nothing replicated is refused when the watch starts, and so is a
`layouts=` pattern that matches no parameter, names an axis the mesh lacks or
has a spec of another rank; a parameter whose shape or layout changes between
steps is refused by name (its shape at the next exchange). `watch.groups`
shows the replica groups compared, `watch.findings` what was found (a list
of dicts: step, tensor, group, the ranks apart), `watch.check_seconds` and
`watch.last_check_seconds` the time the checks took on this rank. With
on_mismatch="warn" a finding that stays is reported again only when it
changes (diffcheck/watch/report.py).
"""
import fnmatch
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist

from diffcheck.dump import mesh_size, mesh_sizes
from diffcheck.dump.layouts import (check_layout, dtensor_layout, is_dtensor, layout_attrs, placement_attrs,
                                     rank_coords, replica_axes)
from diffcheck.watch.batches import Batches
from diffcheck.watch.exchange import Exchange
from diffcheck.watch.hashing import SUMS, CheckRows
from diffcheck.watch.errors import RankUnresponsive, ReplicasDiffer, TransientFault, WatchError  # noqa: F401
from diffcheck.watch.judge import Judging
from diffcheck.watch.report import WatchReports
from diffcheck.watch.rerun import Rerun



_PLAIN = (torch.Tensor, torch.nn.Parameter)  # exactly these types: a subclass (a DTensor) may hold a piece


def replica_groups(axis_sizes, attrs, world):
    """The groups of ranks (each sorted, size > 1) that must hold equal pieces
    of a tensor laid out as `attrs` ({"spec", "partial", "stage"}) on the mesh."""
    axes = replica_axes(attrs, axis_sizes)
    if not axes:
        return []
    groups = {}
    for r in range(world):
        c = rank_coords(r, axis_sizes)
        groups.setdefault(tuple(v for a, v in c.items() if a not in axes), []).append(r)
    return [g for g in groups.values() if len(g) > 1]


def _detached(p):
    return p.detach()


def _grad(p):
    return p.grad


class Watch(Judging, WatchReports):
    def __init__(self, model, optimizer=None, *, mesh, every=1, layouts=None, out="dumps/watch",
                 on_mismatch="stop", timeout=300.0, grads=True, group=None, rerun=None, rerun_every=10,
                 exchange_every=1):
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("watch(): torch.distributed is not initialized: the watch compares ranks")
        if on_mismatch not in ("stop", "warn"):
            raise ValueError(f"watch(on_mismatch={on_mismatch!r}): 'stop' or 'warn'")
        if int(every) < 1:
            raise ValueError(f"watch(every={every}): a check every 1 or more steps")
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if mesh_size(mesh) != self.world:
            raise ValueError(f"rank {self.rank}: watch(mesh='{mesh}') has {mesh_size(mesh)} ranks, the job {self.world}")
        self.model, self.optimizer, self.mesh, self.every = model, optimizer, mesh, int(every)
        self._batches = Batches(exchange_every)  # checks exchanged several at a time (watch/batches.py)
        self.axis_sizes = mesh_sizes(mesh)
        self.out, self.on_mismatch, self.timeout, self.grads, self.group = out, on_mismatch, timeout, grads, group
        self.layouts = [(p, layout_attrs(v, ())) for p, v in (layouts or {}).items()]
        self.params = list(model.named_parameters())
        self.steps, self.checks, self.findings = 0, 0, []
        # the time the checks took on this rank, all of them and the last (hashes, exchange, any report)
        self.check_seconds, self.last_check_seconds = 0.0, 0.0
        self._check_layouts()
        self._layout = {name: self._layout_of(name, p) for name, p in self.params}
        self._placements = {name: p.placements for name, p in self.params if is_dtensor(p)}  # as the watch started
        self._plan = [(name, p, p.shape) for name, p in self.params]  # each parameter and its shape as it started
        self._seen = {}  # parameter -> the placements object last found to be the watch's layout (a gradient's)
        self._groups = {name: replica_groups(self.axis_sizes, self._layout[name], self.world) for name, _ in self.params}
        self.replicated = [name for name, _ in self.params if self._groups[name]]  # the parameters compared
        # {parameter: its replica groups}, as the watch compares them (and their gradients)
        self.groups = {name: self._groups[name] for name in self.replicated}
        if not self.replicated:
            raise ValueError(f"rank {self.rank}: watch(): no parameter of the model has replicas on mesh '{mesh}' "
                             "(every one is split or summed over every axis): there is nothing to compare")
        everyone = [None] * self.world
        schedule = {"every": self.every, "exchange_every": exchange_every}
        dist.all_gather_object(everyone, (socket.gethostname(), [name for name, _ in self.params], schedule),
                               group=group)
        hosts = [host for host, _, _ in everyone]
        self.hosts = hosts
        apart = next((r for r, (_, _, theirs) in enumerate(everyone) if theirs != everyone[0][2]), None)
        if apart is not None:  # the ranks would meet at different checks: a wait until the timeout, then blame
            raise ValueError(f"rank {self.rank}: watch(): rank {apart} checks on another schedule than rank 0 "
                             f"({everyone[apart][2]} against {everyone[0][2]}): every rank must give the same "
                             "every= and exchange_every=")
        other = next((r for r, (_, names, _) in enumerate(everyone) if names != everyone[0][1]), None)
        if other is not None:  # a pipeline's stages, say: the rows of the hashes would not line up
            raise ValueError(f"rank {self.rank}: watch(): rank {other}'s model has other parameters than rank 0's "
                             f"({len(everyone[other][1])} against {len(everyone[0][1])}): the ranks watched together "
                             "must hold the same model (give group= the ranks of one pipeline stage)")
        self.exchange = Exchange(group, self.rank, self.world, hosts, timeout)
        self._placed = {}  # (placements, device mesh, dimensions) -> layout attrs
        # DIFFCHECK_WATCH_HASH=sums: the accelerator's hash on every device (its CPU twin, which the suite runs)
        self._sums = os.environ.get("DIFFCHECK_WATCH_HASH", "") == "sums"
        # Each check's rows, planned once: every parameter, then (with grads) every gradient.
        self._names = [("param", name, _detached) for name, _ in self.params] + \
            [("param_grad", name, _grad) for name, _ in self.params]
        self._rows = {True: CheckRows(2 * len(self.params), self._sums),
                      False: CheckRows(len(self.params), self._sums)}
        # The hub's comparison, planned once: each row's and rank's group leader (itself where it has no
        # replica), so that a check compares the whole table at once.
        leaders = np.tile(np.arange(self.world), (len(self.params), 1))
        for i, (name, _) in enumerate(self.params):
            for g in self._groups[name]:
                leaders[i, g] = g[0]
        self._leaders = np.concatenate([leaders, leaders])
        self._step_was = None
        self.rerun = Rerun(self, rerun, rerun_every) if rerun is not None else None
        if optimizer is not None:
            self._wrap(optimizer)

    # -- the optimizer --------------------------------------------------------

    def _wrap(self, opt):
        """Before every `every`-th step: the parameters as this step's forward
        used them, and their gradients (reduced by then), in one exchange."""
        self._step_was = opt.__dict__.get("step")
        inner = opt.step

        def step(*args, **kwargs):
            if (self.steps + 1) % self.every == 0:
                self.check(grads=self.grads, batched=True)
            out = inner(*args, **kwargs)
            self.steps += 1
            return out
        opt.step = step

    def close(self, check=True):
        """Unwraps the optimizer; check=True (collective): the checks not yet
        exchanged are, and the parameters after the last step are compared
        once more. check=False (an error on the way out) drops the checks not
        exchanged: the other ranks may never come to an exchange."""
        if check and self.optimizer is not None and self.steps:
            self.check(grads=False, after=True)
        elif check and self._batches.kept:
            self._timed(self._exchange_kept, False)
        self._batches.kept = []
        for plan in self._rows.values():
            plan.release()
        opt = self.optimizer
        if opt is not None and "step" in opt.__dict__:
            if self._step_was is None:
                del opt.step
            else:
                opt.step = self._step_was
        self.optimizer = None
        if self.rerun is not None:
            self.rerun.remove()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(check=exc_type is None)
        return False

    # -- the check ------------------------------------------------------------

    def _check_layouts(self):
        """Each layouts= pattern refused at the start where it would mislead: one that matches no
        parameter (its parameters would count as replicated: a false alarm at the first check), an
        axis the mesh lacks, a spec with another number of entries than the parameter has dimensions."""
        taps = [(f"param/{name}", p) for name, p in self.params]
        for pattern, attrs in self.layouts:
            matched = [(tap, p) for tap, p in taps if fnmatch.fnmatchcase(tap, pattern)]
            if not matched:
                raise ValueError(f"rank {self.rank}: watch(layouts=): pattern '{pattern}' matches no parameter (the "
                                 f"patterns name parameter taps: {', '.join(t for t, _ in taps[:3])}"
                                 f"{', ...' if len(taps) > 3 else ''})")
            for tap, p in matched:
                if not is_dtensor(p):  # a DTensor's placements say its layout
                    check_layout(f"rank {self.rank}: watch(layouts=): {tap} (shape {tuple(p.shape)}), layout "
                                 f"'{pattern}'", attrs, p.dim(), set(self.axis_sizes), self.mesh)

    def _layout_of(self, name, p):
        local = dtensor_layout(p, list(self.axis_sizes))
        if local is not None:
            return local[1]
        for pattern, attrs in self.layouts:
            if fnmatch.fnmatchcase(f"param/{name}", pattern):
                return dict(attrs)
        return {}

    def check(self, grads=True, after=False, batched=False):
        """One comparison across the replica groups of every parameter (and,
        with grads, every gradient); collective. batched (the optimizer's
        checks): the rows are kept and exchanged with the batch's last
        (watch/batches.py); otherwise at once, with any kept before."""
        self._timed(self._check, grads, after, batched)

    def _timed(self, work, *args):
        start = time.perf_counter()
        try:
            work(*args)
        finally:
            self.last_check_seconds = time.perf_counter() - start
            self.check_seconds += self.last_check_seconds

    def _check(self, grads, after, batched):
        self.checks += 1
        # The parameter itself, not p.detach(): a DTensor's detach is a dispatched op (~30 us each)
        tensors = [self._local(name, p) for name, p, _ in self._plan]
        if grads:
            tensors += [self._local(name, p.grad) for name, p, _ in self._plan]
        mine, on_device = self._rows[grads].fill(tensors)
        if on_device:
            for (i, _), h in zip(on_device, torch.stack([h for _, h in on_device]).cpu().tolist()):
                mine[i] = h + [SUMS, 1]
        transient = self.rerun.take() if self.rerun is not None else ()
        if transient:  # the last row (zeros from fill otherwise: a NumPy item assignment is ~7 us in the loop)
            mine[-1, 0] = len(transient)
        kept = self._batches.kept
        if kept and len(kept[0][0]) != len(mine):  # (a check without gradients among those with): not one table
            self._exchange_kept(False)
        if self._batches.keep(mine, self.steps, transient) or not batched or after:
            self._exchange_kept(after)

    def _check_shapes(self):
        """Every parameter refused by name if its shape changed since the watch started. Once an
        exchange, not at every check (15 shapes were ~10 us of a small model's check in its loop):
        a batch's checks are refused at its exchange, where a finding of theirs would be reported."""
        for name, p, shape in self._plan:
            if p.shape != shape:
                raise ValueError(f"rank {self.rank}: watch(): parameter '{name}' changed shape from "
                                 f"{tuple(shape)} to {tuple(p.shape)} since the watch started")

    def _local(self, name, t):
        """This rank's piece of t (a DTensor's local tensor), refused if its
        layout is not the one the watch started with."""
        if type(t) in _PLAIN:  # its own piece (the lookups below fail on it: two raised AttributeErrors)
            return t
        local = getattr(t, "_local_tensor", None)  # to_local() is an autograd function: 10x the time
        if not isinstance(local, torch.Tensor):
            if t is None or not is_dtensor(t):
                return t
            local = t.to_local()
        now = t.placements
        # The placements as the watch started, or the object a gradient had last time (torch caches it,
        # so at every=1 the check of some 30 tensors stops here, without building a layout)
        if now is self._placements.get(name) or now is self._seen.get(name):
            return local
        if now == self._placements.get(name):
            self._seen[name] = now
            return local
        try:
            key = (t.placements, id(t.device_mesh), t.dim())
            attrs = self._placed.get(key)
        except TypeError:  # a placement that cannot be a key
            key, attrs = None, None
        if attrs is None:
            attrs = placement_attrs(t.placements, t.device_mesh, t.dim(), list(self.axis_sizes))
            if key is not None:
                self._placed[key] = attrs
        if attrs != self._layout[name]:
            raise ValueError(f"rank {self.rank}: watch(): parameter '{name}' is now laid out as "
                             f"{attrs}, not {self._layout[name]} as when the watch started")
        self._seen[name] = now
        return local


def watch(model, optimizer=None, *, mesh, every=1, **kwargs):
    """Checks, every `every` optimizer steps, that replicas of every parameter
    and its gradient hold the same bits (see diffcheck/watch/__init__.py)."""
    return Watch(model, optimizer, mesh=mesh, every=every, **kwargs)
