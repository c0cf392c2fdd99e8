#!/usr/bin/env python3
"""Write activation files that `diffcheck compare` reads (format version 1,
docs/FORMAT.md), from PyTorch, JAX or NumPy, with h5py.

Per-rank files, one per process:

    from diffcheck_dump import RankDump
    with RankDump("out/step3", mesh="dp=2,tp=4", rank=rank) as d:   # -> out/step3.rank<R>.h5
        d.tap("block0/q", q_local, spec="-,-,tp,-")                    # this rank's piece
        d.tap("block0/partial_out", y_partial, partial="tp", reduction_depth=3072)
        if rank == 0:
            d.reference("block0/q", q_full)                          # global tensor, optional

then: diffcheck compare out/step3

Tensors may be numpy arrays, torch tensors (moved to CPU; bfloat16 is stored
as float32 with the same values and tagged dtype="bfloat16") or jax arrays.
Taps are numbered in the order they are written (the `order` attribute).
"""
import os

import h5py
import numpy as np

SCHEMA_VERSION = 1


def _to_numpy(x):
    """Returns (array, logical dtype or None)."""
    logical = None
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch
        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            logical = "bfloat16"
            t = t.float()
        return t.numpy(), logical
    if "jax" in mod or "jaxlib" in mod:
        if str(x.dtype) == "bfloat16":
            logical = "bfloat16"
            x = x.astype("float32")
        return np.asarray(x), logical
    a = np.asarray(x)
    if a.dtype.name == "bfloat16":
        logical = "bfloat16"
        a = a.astype(np.float32)
    return a, logical


def _mesh_size(mesh):
    n = 1
    for part in mesh.split(","):
        n *= int(part.split("=")[1])
    return n


class RankDump:
    def __init__(self, prefix, mesh, rank, world_size=None, **root_attrs):
        self.path = f"{prefix}.rank{rank}.h5"
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._tmp = self.path + ".tmp"
        self.f = h5py.File(self._tmp, "w", track_order=True)
        self.f.attrs["diffcheck_schema"] = SCHEMA_VERSION
        self.f.attrs["mesh"] = mesh
        self.f.attrs["world_size"] = world_size if world_size is not None else _mesh_size(mesh)
        self.f.attrs["rank"] = rank
        for k, v in root_attrs.items():  # scenario, flags, dtype, seed, producer
            self.f.attrs[k] = v
        self.f.attrs.setdefault("producer", "diffcheck_dump.py")
        self.f.create_group("taps", track_order=True)
        self._order = 0

    def tap(self, name, x, spec=None, partial=None, reduction_depth=None, atol=None, rtol=None):
        a, logical = _to_numpy(x)
        ds = self.f["taps"].create_dataset(name, data=a)
        if spec:
            ds.attrs["spec"] = spec
        if partial:
            ds.attrs["partial"] = partial
        ds.attrs["order"] = self._order
        self._order += 1
        if logical:
            ds.attrs["dtype"] = logical
        if reduction_depth is not None:
            ds.attrs["reduction_depth"] = int(reduction_depth)
        if atol is not None:
            ds.attrs["atol"] = float(atol)
        if rtol is not None:
            ds.attrs["rtol"] = float(rtol)

    def reference(self, name, x):
        a, _ = _to_numpy(x)
        self.f.create_dataset(f"reference/{name}", data=a.astype(np.float64))

    def close(self):
        """Closes the file and gives it its name: only a file that closed
        cleanly (all data and metadata written) is renamed; otherwise the
        partial file is removed and the error raised."""
        if self.f:
            f, self.f = self.f, None
            try:
                f.close()
            except BaseException:
                self._discard()
                raise
            os.replace(self._tmp, self.path)  # whole or absent

    def abandon(self):
        """Drops a file that is not complete (an error while dumping)."""
        if self.f:
            f, self.f = self.f, None
            try:
                f.close()
            finally:
                self._discard()

    def _discard(self):
        try:
            os.remove(self._tmp)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abandon()  # never a partial file under the real name
