"""A sharded capture in sketch mode: on CPU devices the function runs jitted
with its taps as outputs and each device's piece is sketched on the host by
the C kernel (host_sketch.py); elsewhere (or with DIFFCHECK_SKETCH_KERNEL=off)
the function is jitted with each sketchable tap replaced by its devices'
sketches, counts and hashes (sketch.py). The rest (small, 1-D, integer taps)
leave whole as in a full capture.

On the host path each call from the second on hands the previous call's tap
outputs back to XLA as donated buffers (`_donating`): the taps are written
into memory already mapped, where fresh outputs of some hundred MiB are
new mappings whose every page faults on first write (at 4096 tokens in
scripts/studies/jax_tap_outputs.py, 170k faults a call: most of the 1.14-1.19x
the taps as outputs cost there, 1.03-1.05x with them donated). The price: the taps' buffers stay allocated
between calls (up to KEEP_BYTES; above, fresh outputs as before), and the
function is compiled a second time, for its donating form, at its second
call with the same argument shapes."""
import concurrent.futures

import numpy as np

import jax

from diffcheck.jax import host_sketch
from diffcheck.jax import sketch as jax_sketch
from diffcheck.jax.layouts import spec_strings


KEEP_BYTES = 2 << 30  # the most tap memory kept between calls for donation


class _NewTaps(Exception):
    """The trace made taps whose shardings are not known yet."""


class SketchRun:
    def __init__(self, capture, rows, seed):
        if not (isinstance(rows, int) and 1 <= rows <= 256):
            raise ValueError(f"capture(sketch={rows!r}): give True or the sketch's rows, an int from 1 to 256")
        self.capture, self.k, self.seed = capture, rows, int(seed) & jax_sketch.MASK32
        self._shardings = {}  # tap key -> NamedSharding XLA gave it
        self._shared, self._hashed = {}, {}  # tap key -> replica axes sharing its tokens, whether hashed
        self._jit = jax.jit(self._traced)
        self._plain = jax.jit(capture._traced)  # the host path's: every tap an output
        # the same, writing its taps into the buffers of the last call's (donated)
        self._donating = jax.jit(self._traced_into, donate_argnums=0, keep_unused=True)
        self._kept = None  # (the arguments' signature, the last call's tap outputs) to donate
        self._reading = []  # the last call's sketch jobs, which read its tap outputs
        self._noted = None  # the arguments' signature whose taps' tokens and dtypes are noted
        self.signature = None  # the last call's
        self.on_host = host_sketch.available(capture.mesh)

    def _traced_into(self, spent, *args, **kwargs):
        """The function with its taps as outputs; `spent` (donated, unread): buffers XLA may write them into."""
        return self.capture._traced(*args, **kwargs)

    def _traced(self, *args, **kwargs):
        result, taps = self.capture._traced(*args, **kwargs)
        sketches, whole = {}, {}
        for key, x in taps.items():
            sharding = self._shardings.get(key)
            if sharding is None:
                raise _NewTaps(key)
            dim = jax_sketch.sketch_dim(x.shape, x.dtype, self.k)
            if dim is not None:
                sketches[key], self._shared[key], self._hashed[key] = jax_sketch.sketch_pieces(
                    x, sharding.spec, self.capture.mesh, self.k, self.seed, dim)
            else:
                whole[key] = x
        return result, sketches, whole

    def _learn_shardings(self, args, kwargs):
        """Compiles the function with its taps as outputs (not run) for the
        shardings XLA gives them: the pieces each device will sketch."""
        compiled = jax.jit(self.capture._traced).lower(*args, **kwargs).compile()
        out_info = compiled.output_shardings[1]
        self._shardings.update(out_info)

    def run(self, args, kwargs):
        """(result, [(name, kind, value, key)]) in tap order: kind "sketch" with
        [(device id, sketch, nan, inf, hash)] (or futures of them), or "whole" with the array."""
        signature, leaves = call_signature(args, kwargs)
        self.signature = signature  # (the capture's depths are kept per signature too)
        if signature != self._noted:  # each tap's global tokens and dtype, for these shapes
            self._note_shapes(args, kwargs)
            self._noted = signature
        with jax.set_mesh(self.capture.mesh):
            if self.on_host:
                return self._run_on_host(args, kwargs, signature, leaves)
            try:
                result, sketches, whole = self._jit(*args, **kwargs)
            except _NewTaps:
                self._learn_shardings(args, kwargs)
                result, sketches, whole = self._jit(*args, **kwargs)
        taps = [(key, "sketch", _per_device(v, self._hashed[key])) for key, v in sketches.items()]
        return result, _in_order(taps + [(key, "whole", v) for key, v in whole.items()])

    def _run_on_host(self, args, kwargs, signature, leaves):
        result, outputs = self._outputs(args, kwargs, signature, leaves)
        taps, pending = [], []
        for key, x in outputs.items():
            dim = jax_sketch.sketch_dim(x.shape, x.dtype, self.k)
            if dim is not None and host_sketch.takes(x.dtype):
                self._shardings[key] = x.sharding
                jobs, self._shared[key], self._hashed[key] = host_sketch.sketch_array(x, self.capture.mesh, self.k,
                                                                                      self.seed, dim)
                pending.append((key, jobs))
            else:
                taps.append((key, "whole", x))
        # futures: the files are written in tap order while later pieces are still sketched
        taps += [(key, "sketch", jobs) for key, jobs in pending]
        self._reading = [job for _, jobs in pending for job in jobs]
        return result, _in_order(taps)

    def _outputs(self, args, kwargs, signature, leaves):
        """(result, {tap key: output}) of one call, its taps written into the
        last call's tap buffers where this call's arguments have the same
        shapes, dtypes and shardings (`signature`; so its taps too); `leaves`
        the arguments' leaves."""
        kept, self._kept = self._kept, None
        concurrent.futures.wait(self._reading)  # (done by now, unless a write failed half-way)
        self._reading = []
        if kept is not None and kept[0] == signature:
            result, outputs = self._donating(kept[1], *args, **kwargs)
            fits = True  # (as the kept ones did: the same shapes)
        else:
            del kept  # (freed before the call allocates its own)
            result, outputs = self._plain(*args, **kwargs)
            fits = _bytes_on_devices(outputs) <= KEEP_BYTES
        # never an argument handed back as a tap (were XLA to forward it): donated, the caller's array would go
        arguments = {id(x) for x in leaves}
        if fits and not any(id(x) in arguments for x in outputs.values()):
            self._kept = (signature, outputs)
        return result, outputs

    def release(self):
        """The taps' buffers kept for the next call, freed (the capture's end)."""
        self._kept, self._reading = None, []

    def write(self, name, per_device, key, writer_of, named, depth, ranks):
        """Each rank's sketch of tap `name` to its file (per_device: its rows,
        or futures of them)."""
        per_device = [row.result() if hasattr(row, "result") else row for row in per_device]
        x_sharding = self._shardings[key]
        shape = per_device[0][1].shape
        mesh = self.capture.mesh
        ndim = len(shape) if len(shape) >= 2 else 2
        dim = self._dims[key]
        spec, partial = spec_strings(x_sharding.spec, ndim, list(mesh.shape), f"tap '{name}'")
        token_entry = (spec.split(",")[ndim + dim] if spec else "-")
        split = int(np.prod([mesh.shape[a] for a in token_entry.split("*")])) if token_entry != "-" else 1
        tokens = self._global_tokens[key] // split
        dtype = self._dtypes[key]
        steps = None if depth[1] is None else max(depth[1], 1)
        for device, s, n, i, h in per_device:
            writer_of(ranks[device]).sketch(named, s, tokens=tokens, seed=self.seed, nan=int(n), inf=int(i),
                                            bits_hash=h, dtype=dtype, spec=spec, partial=partial,
                                            shared=self._shared[key] or None, reduction_depth=depth[0] or None,
                                            rounding_steps=steps, dim=dim)

    def _note_shapes(self, args, kwargs):
        """Each tap's token dimension, global token count and dtype (from the traced shapes)."""
        with jax.set_mesh(self.capture.mesh):
            shapes = jax.eval_shape(self.capture._traced, *args, **kwargs)[1]
        self._dims = {k: jax_sketch.sketch_dim(v.shape, v.dtype, self.k) or -2 for k, v in shapes.items()}
        self._global_tokens = {k: (v.shape[self._dims[k]] if len(v.shape) >= 2 else 1) for k, v in shapes.items()}
        self._dtypes = {k: str(v.dtype) for k, v in shapes.items()}


def call_signature(args, kwargs):
    """(signature, leaves): what decides a call's taps' shapes, dtypes and
    shardings, the arguments' tree and each leaf's shape, dtype and sharding
    (or type); and the leaves themselves."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    return (tree, tuple((x.shape, x.dtype, x.sharding) if isinstance(x, jax.Array) else
                       (x.shape, x.dtype) if isinstance(x, np.ndarray) else type(x) for x in leaves)), leaves


def _bytes_on_devices(outputs):
    return sum(shard.data.nbytes for x in outputs.values() for shard in x.addressable_shards)


def _per_device(stacked, hashed):
    """[(device id, sketch, nan, inf, hash string)] of the XLA program's
    results stacked over the devices (row r on device r)."""
    sketch, nan, inf, hashes = stacked
    rows = []
    for arrays in zip(sketch.addressable_shards, nan.addressable_shards, inf.addressable_shards,
                      hashes.addressable_shards):
        s, n, i, h = (np.asarray(a.data)[0] for a in arrays)
        rows.append((arrays[0].device.id, s, n, i, jax_sketch.hash_string(h, hashed)))
    return rows


def _in_order(taps):
    taps.sort(key=lambda t: t[0])
    return [(key.split(":", 1)[1], kind, v, key) for key, kind, v in taps]
