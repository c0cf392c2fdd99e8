"""Taps inside a shard_map body. A body is traced on its own, so its values
cannot leave the compiled program as outputs of the captured function; each
device hands its block to the host instead (jax.debug.callback, with the
device's coordinates from lax.axis_index), one host call per tap and device.

The layout of such a block is the tap's `spec=` (a PartitionSpec over the
global value, as a shard_map's out_specs would give it); the mesh axes the
value varies over (JAX's varying manual axes) that the spec does not split
are partial sums, as an output before its psum; the rest are replica axes.

A body that runs again for the gradient (jax.checkpoint inside the body)
hands the same bits twice: the second is dropped. A body that runs per step
(lax.scan inside it) hands a new value each step: step k's is `name@k`."""
import functools
import threading

import numpy as np

import jax
from jax import lax

from diffcheck.jax.layouts import LayoutError, spec_strings


class HostedTap:
    """A tap made inside a shard_map body (known at trace time)."""

    def __init__(self, index, name, spec, varying, axes):
        self.index, self.name, self.spec, self.varying, self.axes = index, name, spec, varying, axes


def manual_axes():
    """The mesh axes a shard_map body being traced now is manual over (empty outside one)."""
    mesh = jax.sharding.get_abstract_mesh()
    return tuple(getattr(mesh, "manual_axes", ()) or ())


def _varying(x):
    """The manual axes x varies over (JAX's check_vma typing), or None when JAX does not say."""
    axis_type = getattr(jax.typeof(x), "manual_axis_type", None)
    varying = getattr(axis_type, "varying", None)
    return None if varying is None else frozenset(varying)


class HostSink:
    """The taps made inside shard_map bodies by one capture, and the blocks
    each call of the compiled function hands over."""

    def __init__(self):
        self.taps = {}  # name -> HostedTap, registered when the function is traced
        self._blocks, self._lock = {}, threading.Lock()

    def emit(self, index, name, x, spec, error):
        """Inside a shard_map body being traced: each device's block of x
        goes to the host when the program runs. error: the TapError class."""
        mesh = jax.sharding.get_abstract_mesh()
        axes, manual = tuple(mesh.axis_names), set(manual_axes())
        if manual != set(axes):
            raise error(f"tap '{name}' is inside a shard_map body manual over {sorted(manual)} only, not every "
                        f"mesh axis ({', '.join(axes)}): its layout over the others cannot be known; tap it "
                        "outside the body")
        varying = _varying(x)
        if spec is None and varying:
            raise error(f"tap '{name}' is inside a shard_map body and varies over {', '.join(sorted(varying))}: "
                        "give its layout, dcj.tap(name, x, spec=P(...)) with the mesh axes each dimension of the "
                        "global value is split over (as out_specs would say); the axes it varies over that the "
                        "spec leaves out are taken as partial sums")
        self.taps[name] = HostedTap(index, name, spec, varying, axes)
        jax.debug.callback(functools.partial(self._receive, name), x, *[lax.axis_index(a) for a in axes])

    def _receive(self, name, x, *coords):
        block = np.array(x)
        key = tuple(int(c) for c in coords)
        with self._lock:
            calls = self._blocks.setdefault(name, {}).setdefault(key, [])
            if any(c.dtype == block.dtype and c.tobytes() == block.tobytes() for c in calls):
                return  # the body run again for the gradient (rematerialised): the same value
            calls.append(block)

    def take(self):
        """{name: {coords: [block of each distinct call]}} of the call that
        just ran (waits for its host calls), and forgets them."""
        jax.effects_barrier()
        with self._lock:
            blocks, self._blocks = self._blocks, {}
        return blocks


def layout(tap, ndim, mesh):
    """(spec, partial) strings of a hosted tap's blocks on `mesh`."""
    where = f"tap '{tap.name}'"
    spec, partial = spec_strings(tap.spec if tap.spec is not None else jax.sharding.PartitionSpec(), ndim,
                                 list(mesh.shape), where)
    split = {a for entry in spec.split(",") if spec for a in entry.split("*") if a != "-"}
    if tap.varying is not None:
        constant = split - tap.varying
        if constant:
            raise LayoutError(f"{where}: its spec splits it over {', '.join(sorted(constant))}, which it does not "
                              "vary over inside the shard_map body (each device holds the same value there)")
        sizes = dict(mesh.shape)  # a sum over one piece is the value: no partial axis of size 1
        partial_axes = sorted(a for a in tap.varying - split if sizes.get(a, 1) > 1)
        partial = "*".join(sorted(set(partial.split("*") if partial else []) | set(partial_axes)))
    return spec, partial


class HostedBlocks:
    """One call's blocks of a hosted tap: {rank: block}."""

    def __init__(self, tap, by_rank):
        self.tap, self.by_rank = tap, by_rank

    def layout(self, mesh):
        """(spec, partial, {rank: block}), as jax_layouts.array_layout gives them."""
        ndim = next(iter(self.by_rank.values())).ndim
        return (*layout(self.tap, ndim, mesh), self.by_rank)

    def whole(self):
        """The value on a mesh of one device."""
        if len(self.by_rank) != 1:
            raise LayoutError(f"tap '{self.tap.name}': {len(self.by_rank)} blocks where one device ran the body")
        return next(iter(self.by_rank.values()))


def pieces(tap, blocks, mesh, ranks_of_this_process):
    """[(k, {rank: block})] per distinct call k of a hosted tap, for this process's ranks."""
    sizes = [int(s) for s in mesh.shape.values()]
    by_call = {}
    for coords, calls in blocks.items():
        rank = int(np.ravel_multi_index(coords, sizes)) if sizes else 0
        for k, block in enumerate(calls):
            by_call.setdefault(k, {})[rank] = block
    for k, got in by_call.items():
        missing = sorted(set(ranks_of_this_process) - set(got))
        if missing:
            name = tap.name if k == 0 else f"{tap.name}@{k}"
            raise LayoutError(f"tap '{name}': no block from rank {missing[0]} (its shard_map body handed "
                              f"{len(got)} of {len(ranks_of_this_process)} devices' blocks)")
    return sorted(by_call.items())
