"""Write activation files that `diffcheck compare` reads (format version 1,
docs/FORMAT.md), from PyTorch, JAX or NumPy, with h5py.

Per-rank files, one per process:

    from diffcheck.dump import RankDump
    with RankDump("out/step3", mesh="dp=2,tp=4", rank=rank) as d:   # -> out/step3.rank<R>.h5
        d.tap("block0/q", q_local, spec="-,-,tp,-")                    # this rank's piece
        d.tap("block0/partial_out", y_partial, partial="tp", reduction_depth=3072)
        if rank == 0:
            d.reference("block0/q", q_full)                          # global tensor, optional

then: diffcheck compare out/step3

A separate reference file (`diffcheck compare PREFIX --reference FILE`):

    with ReferenceDump("out/ref.h5") as r:
        r.reference("block0/q", q_full)

Tensors may be numpy arrays, torch tensors (moved to CPU; bfloat16 is stored
as float32 with the same values and tagged dtype="bfloat16") or jax arrays.
Taps are numbered in the order they are written (the `order` attribute).
A file gets its name only when it closed whole: an error while dumping leaves
no file under that name.
"""
import os

import h5py
import numpy as np

SCHEMA_VERSION = 1


def to_numpy(x):
    """Returns (array, logical dtype or None). A CPU torch tensor or a numpy
    array that is already contiguous is not copied."""
    logical = None
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            logical = "bfloat16"
            t = t.float()
        elif t.dtype == torch.bool:
            t = t.to(torch.uint8)
        return t.contiguous().numpy(), logical
    if "jax" in mod or "jaxlib" in mod:
        if str(x.dtype) == "bfloat16":
            logical = "bfloat16"
            x = x.astype("float32")
        return np.asarray(x), logical
    a = np.asarray(x)
    if a.dtype.name == "bfloat16":
        logical = "bfloat16"
        a = a.astype(np.float32)
    elif a.dtype == np.bool_:
        a = a.astype(np.uint8)
    return a, logical


def mesh_sizes(mesh):
    """{axis: size} of a mesh string such as "dp=2,tp=4", in its order;
    ValueError naming the mesh when it is not one."""
    sizes = {}
    try:
        for part in mesh.split(","):
            name, size = part.split("=")
            if not name.strip() or int(size) < 1:
                raise ValueError
            sizes[name.strip()] = int(size)
    except ValueError:
        raise ValueError(f"mesh '{mesh}' is not a list of name=size axes such as 'dp=2,tp=4'") from None
    return sizes


def mesh_size(mesh):
    """The number of ranks of a mesh string."""
    n = 1
    for size in mesh_sizes(mesh).values():
        n *= size
    return n


def mesh_axes(mesh):
    return [part.split("=")[0].strip() for part in mesh.split(",")]


_SCALAR = None
_TYPES = {}


def _set_attrs(ds, attrs):
    """Writes scalar attributes exactly as h5py's `ds.attrs[k] = v` would
    (variable-length UTF-8 strings, int64, float64), through the low-level
    API: a tap has a dozen attributes, and h5py's high-level path costs some
    45 us each (a sketch tap's writing was mostly that). `ds` is a dataset
    just made, without any of these attributes: they are created, never
    rewritten."""
    global _SCALAR
    if _SCALAR is None:
        _SCALAR = h5py.h5s.create(h5py.h5s.SCALAR)
        text = h5py.string_dtype("utf-8")  # the file's type is h5py's logical one, memory's its object type
        _TYPES.update({str: (h5py.h5t.py_create(text, logical=True), text, h5py.h5t.py_create(text)),
                       int: (h5py.h5t.py_create(np.dtype(np.int64)), np.int64, None),
                       float: (h5py.h5t.py_create(np.dtype(np.float64)), np.float64, None)})
    for name, value in attrs.items():
        kind = bool if isinstance(value, (bool, np.bool_)) else int if isinstance(value, (int, np.integer)) \
            else float if isinstance(value, (float, np.floating)) else str if isinstance(value, str) else None
        if kind in (None, bool):
            ds.attrs[name] = value  # anything else: h5py's own way
            continue
        tid, dtype, memory = _TYPES[kind]
        h5py.h5a.create(ds.id, name.encode(), tid, _SCALAR).write(np.asarray(value, dtype=dtype), mtype=memory)


class _AtomicH5:
    """An HDF5 file written as PATH.tmp and renamed to PATH when it closed
    cleanly (all data and metadata written); otherwise removed."""

    def __init__(self, path, root_attrs):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._tmp = path + ".tmp"
        self.f = h5py.File(self._tmp, "w", track_order=True)
        self.f.attrs["diffcheck_schema"] = SCHEMA_VERSION
        for k, v in root_attrs.items():  # scenario, flags, dtype, seed, producer
            if v is not None:
                self.f.attrs[k] = v
        self.f.attrs.setdefault("producer", "diffcheck.dump")

    def _dataset(self, path, data, dtype=None):
        try:
            return self.f.create_dataset(path, data=data, dtype=dtype)
        except (ValueError, TypeError) as e:
            # h5py's "name already exists" / "unable to create group" say neither file nor tap.
            raise ValueError(f"{self.path}: cannot write '{path}' (shape {getattr(data, 'shape', '?')}): {e}. "
                             "Tap names must be unique, and a name cannot be both a tap and a group "
                             "of taps ('a' and 'a/b')") from None

    def reference(self, name, x):
        """The global tensor of tap `name` as computed by the reference,
        stored as float64 (float32 stays float32: its values are exact)."""
        a, _ = to_numpy(x)
        dtype = np.float32 if a.dtype == np.float32 else np.float64
        self._dataset(f"reference/{name}", a, dtype=dtype)

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
            # Whole or absent. The earlier file goes first: renaming over an
            # existing file makes ext4 (auto_da_alloc) write this one's data
            # out before the rename returns, 50-100 ms for a few hundred MiB,
            # where a rename to a free name costs nothing.
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            os.replace(self._tmp, self.path)

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


class RankDump(_AtomicH5):
    """One rank's file, `<prefix>.rank<R>.h5`: this rank's piece of each tap."""

    def __init__(self, prefix, mesh, rank, world_size=None, **root_attrs):
        n = mesh_size(mesh)
        if world_size is not None and world_size != n:
            raise ValueError(f"mesh '{mesh}' has {n} ranks but the world size is {world_size}")
        super().__init__(f"{prefix}.rank{rank}.h5", root_attrs)
        self.f.attrs["mesh"] = mesh
        self.f.attrs["world_size"] = n
        self.f.attrs["rank"] = rank
        self.f.create_group("taps", track_order=True)
        self._order = 0

    def tap(self, name, x, spec=None, partial=None, reduction_depth=None, atol=None, rtol=None, dtype=None,
            rounding_steps=None, order=None):
        """`dtype`: the logical dtype when `x` holds another one's values (a
        bfloat16 tensor already turned into float32); found by itself otherwise.
        `order`: the tap's place in execution order when taps are written in
        another order (default: the order of writing)."""
        a, logical = to_numpy(x)
        logical = dtype or logical
        ds = self._dataset(f"taps/{name}", a)
        attrs = {"spec": spec or None, "partial": partial or None,
                 "order": self._order if order is None else int(order), "dtype": logical or None,
                 "reduction_depth": None if reduction_depth is None else int(reduction_depth),
                 "rounding_steps": None if rounding_steps is None else int(rounding_steps),
                 "atol": None if atol is None else float(atol), "rtol": None if rtol is None else float(rtol)}
        self._order += 1
        _set_attrs(ds, {k: v for k, v in attrs.items() if v is not None})
        return ds

    def sketch(self, name, values, *, tokens, seed, nan, inf, bits_hash, dtype, spec=None, partial=None,
               shared=None, **attrs):
        """A sketch tap (docs/FORMAT.md, "Sketch taps"): `values` is this
        piece's sketch [lead..., k+1, width], `tokens` the piece's own token
        count, nan/inf its exact counts, bits_hash 16 hex digits of its bits;
        spec, partial and the other attributes describe the sketched tensor;
        `shared`: the replica axes whose ranks each sketched a share of the
        tokens (their sketches add up, docs/FORMAT.md)."""
        ds = self.tap(name, values, spec=spec, partial=partial, dtype=dtype, **attrs)
        _sketch_attrs(ds, seed, tokens, nan_count=int(nan), inf_count=int(inf), bits_hash=str(bits_hash),
                      **({"sketch_shared": shared} if shared else {}))


def _sketch_attrs(ds, seed, tokens, **more):
    from diffcheck.sketch import KIND
    _set_attrs(ds, {"sketch": KIND, "sketch_seed": int(seed), "sketch_tokens": int(tokens), **more})


class ReferenceDump(_AtomicH5):
    """A reference file (`diffcheck compare PREFIX --reference FILE`): global
    tensors under /reference, world_size 1, no mesh."""

    def __init__(self, path, **root_attrs):
        super().__init__(path, root_attrs)
        self.f.attrs["world_size"] = 1

    def reference_sketch(self, name, values, *, tokens, seed):
        """The sketch of a tap's global reference tensor ([lead..., k+1,
        width], float64), computed with the run's seed over `tokens` global
        tokens (diffcheck.sketch)."""
        ds = self._dataset(f"reference/{name}", values, dtype=np.float64)
        _sketch_attrs(ds, seed, tokens)
