"""Sketch mode on a pipeline schedule: each microbatch's piece of a tap is
sketched when the module makes it, and the step's sketch is the pieces'
sketches put together (pipeline.py holds them). The whole capture copies
every microbatch into its rows of the step's tap and reads that again at
the step's end: in sketch mode that copy and the second read of memory long
out of cache were half of what the capture cost (scripts/studies/
pp_capture_cost.py). The sketch is linear (docs/FORMAT.md, "Sketch taps"):

- a tap whose microbatch dimension is its token dimension (2-D, [rows,
  width]): microbatch m's rows are the step's tokens from the rows before
  it, so its sketch is taken over those global tokens, and the pieces'
  sketches add up;
- a tap with more dimensions ([batch, tokens, width]): the microbatches lie
  side by side along a lead dimension, and so do their sketches.

A tap whose second-to-last dimension is too short is sketched over its
third-to-last, as SketchTaps.offer does ([..., sequence, heads, head_dim]:
FORMAT.md's `sketch_dim` -3); where that is its first, its rows are its
tokens as for a 2-D tap.

The NaN and Inf counts add up; the bits hash of the step's piece is the
pieces' hashes weighted by their microbatch (replicas of one run hash alike).
A gradient divided by the schedule's scale is sketched, then divided."""
import torch

from diffcheck.dump import sketch_token_dim
from diffcheck.dump.layouts import block_index, global_length, replica_axes, spec_entry
from diffcheck.torch.capture_writing import logical_dtype
from diffcheck.torch.data_axes import with_data_axes


class HeldSketch:
    """One tap's step, microbatch by microbatch; made by start()."""

    def __init__(self, sketches, attrs, first, share, shared, hashed, tokens, dim=-2):
        """tokens: a piece's token count where its tokens are not its rows
        (None: they are); dim: the token dimension, from the end."""
        self.sketches, self.attrs = sketches, attrs
        self.first, self.share, self.shared, self.hashed = first, share, shared, hashed
        self.dim = dim
        self.by_rows, self.tokens = tokens is None, tokens
        self.parts = {}  # microbatch -> (its first row, its rows, summary)
        self.next_row, self.expected, self.in_order = 0, 0, True
        self.rows = None
        self.logical = None

    def add(self, mb, value, scale):
        """Microbatch mb's piece (its rows of the step's tap), sketched now."""
        rows = value.shape[0]
        if self.rows is None:
            self.rows, self.logical = rows, logical_dtype(value)
        if mb != self.expected:
            self.in_order = False
        start = self.next_row if self.in_order else mb * self.rows
        self.next_row, self.expected = start + rows, mb + 1
        if self.by_rows:  # its tokens are the step's rows start..start+rows-1
            lo, hi = self.share or (0, None)
            a = min(max(lo - start, 0), rows)
            b = rows if hi is None else min(max(hi - start, 0), rows)
            summary = self.sketches.sketcher.summarize(value, self.first + start, (a, max(a, b)), self.hashed,
                                                       self.dim)
        else:
            summary = self.sketches.sketcher.summarize(value, self.first, self.share, self.hashed, self.dim)
        s, nan, inf, h = summary
        if scale != 1:
            s = s / scale
        self.parts[mb] = (start, rows, (s, nan, inf, h))

    def summary(self, name, rank):
        """The step's (sketch, nan, inf, hash) and its token count."""
        order = sorted(self.parts)
        if not self.in_order and len({self.parts[m][1] for m in order}) > 1:
            raise RuntimeError(f"rank {rank}: tap '{name}': its microbatches came out of order with unequal rows "
                               f"({[self.parts[m][1] for m in order]}), so their rows in the step cannot be told "
                               "in sketch mode: give the schedule a batch its microbatches divide evenly")
        pieces = [self.parts[m][2] for m in order]
        if self.by_rows:
            s = pieces[0][0].clone()
            for p in pieces[1:]:
                s += p[0]
            tokens = sum(self.parts[m][1] for m in order)
        else:
            s = torch.cat([p[0] for p in pieces])
            tokens = self.tokens
        nan = sum(p[1] for p in pieces)
        inf = sum(p[2] for p in pieces)
        h = None
        if self.hashed:
            h = sum(p[3] * (2 * i + 1) for i, p in enumerate(pieces))
        return (s, nan, inf, h), tokens


def start(sketches, capture, attrs, value, microbatches, stage):
    """A HeldSketch for a tap of pipeline stage `stage` ("pp=1") whose first
    microbatch piece is `value` (rows along dimension 0), or None where it is not sketched (the copy path then):
    its layout, its first global token and its replicas' share as
    SketchTaps.offer would find them for the step's whole tap."""
    if value.dim() < 2 or not value.is_floating_point() or getattr(value, "_diffcheck_complex", False):
        return None
    c = capture
    shape = (value.shape[0] * microbatches, *value.shape[1:])
    if c.data_axes:
        attrs = with_data_axes(attrs, shape, c.data_axes, shape[0])
    spec = attrs.get("spec")
    dim = sketch_token_dim(len(shape), lambda d: global_length(shape, spec, d, c.axis_sizes), sketches.rows)
    if dim is None:
        return None
    entry, tokens = spec_entry(spec, dim, len(shape)), shape[dim]
    first = block_index(entry, c.rank, c.axis_sizes) * tokens
    share, shared = None, None
    replicas = replica_axes({**attrs, "stage": stage}, c.axis_sizes)  # the stage's axis holds other taps
    if replicas:  # the replicas split the sketching of the tokens, as offer() does
        j, n = block_index("*".join(replicas), c.rank, c.axis_sizes), 1
        for axis in replicas:
            n *= c.axis_sizes[axis]
        share, shared = (j * tokens // n, (j + 1) * tokens // n), "*".join(replicas)
    # (a piece of more dimensions has the step's token dimension: the same share in every microbatch)
    by_rows = len(shape) + dim == 0  # its tokens are its rows, the microbatches' dimension
    return HeldSketch(sketches, attrs, first, share, shared, bool(replicas), None if by_rows else tokens, dim)
