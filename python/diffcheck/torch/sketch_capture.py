"""The sketch mode of a capture (`dct.capture(..., sketch=True)`): each tap
whose tensor is worth it becomes a sketch tap (diffcheck/sketch/__init__.py), computed
in the hook on the tensor's device and written when the step ends (dct.step)
or the capture closes: a device's summaries come home in one copy (no
synchronisation in a hook), and the writes of a step go to the writer thread
together rather than one per hook, between the forward's collectives (a
write that holds the interpreter lock while a rank's peers wait in an
all-reduce costs every rank); those of the last step are written by the
closing thread itself, once the writer thread is done. CPU summaries are written sooner if those held
pass CPU_HELD_BYTES. A tap too small to sketch (a vector, a scalar, fewer
tokens than the sketch has rows, an integer tensor) is written whole as
before: it costs no more.
"""
import functools

from diffcheck import sketch
from diffcheck.dump import sketch_token_dim
from diffcheck.dump.layouts import block_index, global_length, replica_axes, spec_entry

CPU_HELD_BYTES = 64 << 20  # CPU summaries held until the step ends, at most


class SketchTaps:
    def __init__(self, capture, rows, seed):
        self.capture = capture
        self.sketcher = sketch.Sketcher(rows, seed)
        self.pending = sketch.Pending()

    @property
    def rows(self):
        return self.sketcher.k

    def offer(self, name, tensor, attrs, logical):
        """Takes tap `name` as a sketch (True), or leaves it to be written whole."""
        if tensor.dim() < 2:
            return False
        c = self.capture
        sharded = not (c.reference_mode or c.one_device)
        dim, entry = self._token_dim(tensor, attrs.get("spec") if sharded else None)
        if dim is None:
            return False
        first, share, shared, replicas = 0, None, None, []
        if sharded:
            first = block_index(entry, c.rank, c.axis_sizes) * tensor.shape[dim]
            replicas = replica_axes(attrs, c.axis_sizes)
            if replicas:  # the replicas split the sketching of the tokens (each still hashes its whole piece)
                j, n = block_index("*".join(replicas), c.rank, c.axis_sizes), 1
                for axis in replicas:
                    n *= c.axis_sizes[axis]
                tokens = tensor.shape[dim]
                share, shared = (j * tokens // n, (j + 1) * tokens // n), "*".join(replicas)
        # A hash only where a replica will compare it (every rank of the tap agrees on that).
        hashed = sharded and bool(replicas)
        summary = self.sketcher.summarize(tensor, first, share, hashed, dim)
        self.add(name, summary, attrs, logical, tensor.shape[dim], shared, dim)
        return True

    def _token_dim(self, tensor, spec):
        """(token dimension from the end, its spec entry) of a tap's piece
        under `spec` (dump.sketch_token_dim's rule); (None, None): the tap is
        written whole."""
        if not tensor.is_floating_point():
            return None, None
        dim = sketch_token_dim(tensor.dim(), lambda d: global_length(tensor.shape, spec, d, self.capture.axis_sizes),
                               self.sketcher.k)
        return (None, None) if dim is None else (dim, spec_entry(spec, dim, tensor.dim()))

    def add(self, name, summary, attrs, logical, tokens, shared, dim=-2):
        """A summary to write (a pipeline's microbatches put together: pipeline_sketch.py)."""
        self.pending.add(name, summary, (attrs, logical, tokens, shared, dim))
        if self.pending.cpu_bytes > CPU_HELD_BYTES:
            self.pending.flush(self._emit)

    def flush(self, inline=False):
        """Every pending summary home and onto the writer thread (inline:
        written here, the capture's close); the step's summaries are not
        reused after."""
        self.pending.flush(functools.partial(self._emit, inline=inline))
        self.sketcher.forget()

    def _emit(self, name, values, nan, inf, bits_hash, extra, inline=False):
        c = self.capture
        seed = self.sketcher.seed
        attrs, logical, tokens, shared, dim = extra
        if c.reference_mode:
            def store():
                c._writer.reference_sketch(name, values, tokens=tokens, seed=seed, dim=dim)
        else:
            def store():
                c._writer.sketch(name, values, tokens=tokens, seed=seed, nan=nan, inf=inf, bits_hash=bits_hash,
                                 dtype=logical, shared=shared, dim=dim, **attrs)
        if inline:
            c._guarded(name, store)
        else:
            c._thread.submit_small(lambda: c._guarded(name, store))
