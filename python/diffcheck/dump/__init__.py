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
no file under that name (an earlier file of that name goes when the dump starts).
"""
import os

import h5py
import numpy as np

from diffcheck.dump import hdf5_writes

SCHEMA_VERSION = 1
SKETCH_KIND = "rademacher1"  # docs/FORMAT.md, "Sketch taps" (here: writing one needs no torch)


def sketch_token_dim(ndim, global_tokens, rows):
    """The token dimension (from the end) every diffcheck writer sketches a
    tap of `ndim` dimensions over: -2 where the GLOBAL tensor holds more
    tokens there than the sketch has rows (k + 1), else -3 where that one
    does (attention's [..., sequence, heads, head_dim] with few heads:
    FORMAT.md's `sketch_dim`); None: the tap is written whole.
    global_tokens(dim): the global tensor's length along dim. Decided on
    global lengths, so that every rank and the reference agree."""
    for dim in (-2, -3)[:max(ndim - 1, 0)]:
        if global_tokens(dim) > rows + 1:
            return dim
    return None


def to_numpy(x):
    """Returns (array, logical dtype or None). A CPU torch tensor or a numpy
    array that is already contiguous is not copied."""
    logical = None
    mod = type(x).__module__
    if mod.startswith("torch"):
        # torch's own dtypes by name: the format layer never imports torch
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if str(t.dtype) == "torch.bfloat16":
            logical = "bfloat16"
            t = t.float()
        elif str(t.dtype) == "torch.bool":
            t = t.byte()
        return t.contiguous().numpy(), logical
    # A jax array is brought to the host first and widened there: a jax astype
    # would be a computation on its device, which jax refuses beside a
    # context mesh (jax.set_mesh) of other devices; ml_dtypes' bfloat16 casts exactly.
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


class _AtomicH5:
    """An HDF5 file written as PATH.tmp and renamed to PATH when it closed
    cleanly (all data and metadata written); otherwise removed."""

    def __init__(self, path, root_attrs, own_attrs):
        """own_attrs: the root attributes the file's kind sets (after the user's)."""
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._tmp = path + ".tmp"
        # An earlier file of this name goes now: a dump that fails leaves no
        # file under its name, not even an earlier run's; and one that closes
        # is renamed to a free name (renaming over an existing file makes ext4,
        # auto_da_alloc, write the new one's data out before the rename
        # returns: 50-100 ms for a few hundred MiB). Here, not on a thread: a
        # thread taking the interpreter lock back mid-forward stalls the
        # forward's own Python, and where the ranks fill the cores, moving
        # the removal's work (under 2 ms for a sketch file) gains nothing.
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        self.f = h5py.File(self._tmp, "w", track_order=True)
        attrs = {"diffcheck_schema": SCHEMA_VERSION}
        attrs.update((k, v) for k, v in root_attrs.items() if v is not None)  # scenario, flags, dtype, seed, producer
        attrs.setdefault("producer", "diffcheck.dump")
        hdf5_writes.set_attrs(self.f["/"], {**attrs, **own_attrs})

    def _dataset(self, path, data, dtype=None, attrs=None):
        """The dataset at `path` holding `data` (as `dtype`), with scalar attributes `attrs`."""
        data = np.asarray(data, dtype=dtype)
        try:
            hdf5_writes.write_dataset(self.f, path, data, attrs or {})
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

    def set_root_attrs(self, **attrs):
        """Sets root attributes of the open file (learnt while writing: the run's dtype)."""
        for name in attrs:
            if name in self.f.attrs:  # set_attrs creates, never rewrites
                del self.f.attrs[name]
        hdf5_writes.set_attrs(self.f["/"], attrs)

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


class RankDump(_AtomicH5):
    """One rank's file, `<prefix>.rank<R>.h5`: this rank's piece of each tap."""

    def __init__(self, prefix, mesh, rank, world_size=None, **root_attrs):
        n = mesh_size(mesh)
        if world_size is not None and world_size != n:
            raise ValueError(f"mesh '{mesh}' has {n} ranks but the world size is {world_size}")
        super().__init__(f"{prefix}.rank{rank}.h5", root_attrs, {"mesh": mesh, "world_size": n, "rank": rank})
        self.f.create_group("taps", track_order=True)
        self._order = 0

    def tap(self, name, x, spec=None, partial=None, reduction_depth=None, atol=None, rtol=None, dtype=None,
            rounding_steps=None, order=None, stage=None, microbatches=None, streams=None, block_order=None):
        """Writes this rank's piece `x` of tap `name` (returns its h5py Dataset).
        `dtype`: the logical dtype when `x` holds another one's values (a
        bfloat16 tensor already turned into float32); found by itself otherwise.
        `order`: the tap's place in execution order when taps are written in
        another order (default: the order of writing). `stage`: a pipeline
        stage's tap, "pp=1" (only that stage's ranks write it); `microbatches`:
        x's first dimension holds this many microbatches laid together in
        order (docs/FORMAT.md, "Pipeline stages and microbatches"); `streams`:
        "text:8,image:32", the split dimension holds these streams one after
        another, each split over the spec's ranks (docs/FORMAT.md, "Streams"); `block_order`: "1:0,3,1,2",
        along dimension 1 the ranks of spec block i hold global block i's entry (docs/FORMAT.md)."""
        self.write_tap(name, x, spec=spec, partial=partial, reduction_depth=reduction_depth, atol=atol, rtol=rtol,
                       dtype=dtype, rounding_steps=rounding_steps, order=order, stage=stage, microbatches=microbatches,
                       streams=streams, block_order=block_order)
        return self.f[f"taps/{name}"]

    def write_tap(self, name, x, spec=None, partial=None, reduction_depth=None, atol=None, rtol=None, dtype=None,
                  rounding_steps=None, order=None, more=None, stage=None, microbatches=None, pipeline_stage=None,
                  reduced=None, streams=None, block_order=None):
        """tap() without opening the dataset again (a capture's way); `more`: further scalar attributes;
        `pipeline_stage`: a schedule's stage index where one rank holds several; `reduced`: the axes the
        value was summed over in its dtype before the capture; `streams`: the streams its split dimension holds
        (docs/FORMAT.md); `block_order`: the global block each spec block holds (docs/FORMAT.md)."""
        a, logical = to_numpy(x)
        logical = dtype or logical
        attrs = {"spec": spec or None, "partial": partial or None,
                 "order": self._order if order is None else int(order), "dtype": logical or None,
                 "reduction_depth": None if reduction_depth is None else int(reduction_depth),
                 "rounding_steps": None if rounding_steps is None else int(rounding_steps),
                 "atol": None if atol is None else float(atol), "rtol": None if rtol is None else float(rtol),
                 "stage": stage or None, "microbatches": None if microbatches is None else int(microbatches),
                 "pipeline_stage": None if pipeline_stage is None else int(pipeline_stage), "reduced": reduced or None,
                 "streams": streams or None, "block_order": block_order or None}
        self._dataset(f"taps/{name}", a, attrs={**{k: v for k, v in attrs.items() if v is not None}, **(more or {})})
        self._order += 1

    def sketch(self, name, values, *, tokens, seed, nan, inf, bits_hash, dtype, spec=None, partial=None,
               shared=None, dim=-2, **attrs):
        """A sketch tap (docs/FORMAT.md, "Sketch taps"): `values` is this
        piece's sketch [lead..., k+1, width...], `tokens` the piece's own token
        count, nan/inf its exact counts, bits_hash 16 hex digits of its bits;
        spec, partial and the other attributes describe the sketched tensor;
        `shared`: the replica axes whose ranks each sketched a share of the
        tokens (their sketches add up, docs/FORMAT.md); `dim`: the token
        dimension, from the end (-3: [..., sequence, heads, head_dim])."""
        more = _sketch_attrs(seed, tokens, dim, nan_count=int(nan), inf_count=int(inf), bits_hash=str(bits_hash),
                             **({"sketch_shared": shared} if shared else {}))
        self.write_tap(name, values, spec=spec, partial=partial, dtype=dtype, more=more, **attrs)


def _sketch_attrs(seed, tokens, dim=-2, **more):
    """The sketch attributes; `sketch_dim` only where it is not the default -2."""
    attrs = {"sketch": SKETCH_KIND, "sketch_seed": int(seed), "sketch_tokens": int(tokens), **more}
    if dim != -2:
        attrs["sketch_dim"] = int(dim)
    return attrs


class ReferenceDump(_AtomicH5):
    """A reference file (`diffcheck compare PREFIX --reference FILE`): global
    tensors under /reference, world_size 1, no mesh."""

    def __init__(self, path, **root_attrs):
        super().__init__(path, root_attrs, {"world_size": 1})

    def reference_sketch(self, name, values, *, tokens, seed, dim=-2):
        """The sketch of a tap's global reference tensor ([lead..., k+1,
        width...], float64), computed with the run's seed over `tokens` global
        tokens (diffcheck.sketch) along dimension `dim` (from the end)."""
        self._dataset(f"reference/{name}", values, dtype=np.float64, attrs=_sketch_attrs(seed, tokens, dim))
