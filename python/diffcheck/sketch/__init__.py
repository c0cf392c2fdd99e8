"""Linear sketches of taps: a small summary of a tensor, computed where the
tensor is (in torch ops on a GPU; on the CPU by the fused kernel of
sketch/cpu_kernel.py where it is built, else in torch ops), from which `diffcheck
compare` makes the three checks without the tensor (docs/FORMAT.md, "Sketch
taps").

A tensor is read as [lead..., tokens, width] (its last two dimensions; a
vector is one token of `width`). Its sketch is

    S[lead..., i, w] = sum_t R[i, t] X[lead..., t, w]     i < k
    S[lead..., k, w] = sum_t X[lead..., t, w]              (the column sums)

with R[i, t] = +1 or -1 from a hash of (seed, i, global token t): the same
function on every rank, in the reference and in the C++ comparator, so the
sketch is linear in the GLOBAL tensor. The pieces of a sharded tensor then
add up (token shards, partial sums) or sit side by side (lead and width
shards) to the global tensor's sketch, which is compared with the
reference's: ||R (x - ref)|| / ||R ref|| estimates the rel L2 error, and the
last row gives the column means exactly.

Beside the sketch each piece has exact NaN/Inf counts and a 64-bit hash of
its bits (replicas must agree bitwise). Nothing here synchronises with the
device: every result stays a device tensor until `Pending.flush()` brings
them all home in one copy.
"""
import math
import weakref

import numpy as np
import torch

from diffcheck.sketch import cpu_kernel as sketch_cpu
from diffcheck.dump import SKETCH_KIND

KIND = SKETCH_KIND
DEFAULT_ROWS = 8
_MASK32 = 0xFFFFFFFF
_SIGN_CACHE_LIMIT = 64
# Elements of a tap widened to the sketch's dtype at a time: bounds the
# temporary (8 MiB of float64 on the CPU, where it also stays in cache; 64 MiB
# of float32 on a device, where each slab is a kernel launch).
_WIDEN_ELEMENTS_CPU, _WIDEN_ELEMENTS = 1 << 20, 1 << 24
_SIGN_CHUNK = 1 << 14  # tokens whose signs are made at a time
# Sign rows and hash weights, kept across captures (a capture per forward
# would otherwise make them again each time); bounded, per device.
_SIGN_ROWS, _HASH_WEIGHTS = {}, {}


def _mul32(h, c):
    """(h * c) mod 2^32 for an int64 tensor h in [0, 2^32) and c < 2^32,
    without an int64 product that could overflow."""
    lo, hi = h & 0xFFFF, h >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _MASK32


def _fmix32(h):
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def signs(seed, k, first_token, tokens, device="cpu"):
    """R[i, t] for rows i < k and global tokens first_token..+tokens, as int64
    +1/-1: bit 0 of fmix32((seed*0x9E3779B1 + i*0x85EBCA77 + t*0xC2B2AE3D)
    mod 2^32) set means -1. docs/FORMAT.md spells it out for other writers."""
    t = torch.arange(first_token, first_token + tokens, dtype=torch.int64, device=device) & _MASK32
    base = torch.tensor([(seed * 0x9E3779B1 + i * 0x85EBCA77) & _MASK32 for i in range(k)], dtype=torch.int64,
                        device=device)
    h = (base[:, None] + _mul32(t, 0xC2B2AE3D)[None, :]) & _MASK32
    return 1 - 2 * (_fmix32(h) & 1)


def accumulator(dtype):
    """What a tap of `dtype` is sketched in: float64 for float32 and float64
    taps, float32 for 16-bit ones. A float32 sketch rounds each entry by
    about u32 sqrt(tokens) rms(x), against the sqrt(tokens) rms(x - ref) it
    measures: a float32 tap whose error is 1e-7 or less (many are) would be
    estimated several times too high (measured on the examples: 87% of taps
    within 25% with float32 sketches, 99.4% with float64). 16-bit taps'
    errors are far above it."""
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def as_matrix_shape(shape):
    """(lead, tokens, width) of a tap's shape: a scalar is 1 x 1, a vector one token."""
    if len(shape) == 0:
        return (), 1, 1
    if len(shape) == 1:
        return (), 1, shape[0]
    return tuple(shape[:-2]), shape[-2], shape[-1]


def sketchable(tensor, k, global_tokens):
    """Worth sketching: floating point, and more tokens in the GLOBAL tensor
    than the sketch has rows (else the tensor itself is as small, and exact).
    Decided on the global count so that every rank and the reference agree."""
    return tensor.is_floating_point() and tensor.dim() >= 2 and global_tokens > k + 1


class Sketcher:
    """Sketches pieces of tensors, with the process's cached sign rows (per
    seed, k, token range, device, accumulator) and hash weights (per row count)."""

    def __init__(self, k=DEFAULT_ROWS, seed=0):
        if not (isinstance(k, int) and 1 <= k <= 256):
            raise ValueError(f"sketch rows k={k!r}: give an int from 1 to 256 (8 is the default)")
        self.k, self.seed = k, int(seed) & _MASK32
        self._seen = {}  # this step's summaries, by tensor (summarize)

    def _sign_rows(self, first_token, tokens, device, dtype):
        key = (self.seed, self.k, first_token, tokens, str(device), dtype)
        r = _SIGN_ROWS.get(key)
        if r is None:
            if len(_SIGN_ROWS) >= _SIGN_CACHE_LIMIT:
                _SIGN_ROWS.clear()
            r = torch.empty(self.k + 1, tokens, dtype=dtype, device=device)
            for t0 in range(0, tokens, _SIGN_CHUNK):  # the hash's int64 temporaries stay small
                n = min(_SIGN_CHUNK, tokens - t0)
                r[:self.k, t0:t0 + n] = signs(self.seed, self.k, first_token + t0, n, device).to(dtype)
            r[self.k] = 1
            _SIGN_ROWS[key] = r
        return r

    @staticmethod
    def _hash_weights(n, device):
        """n odd int64 weights below 2^31 (any fixed choice: only replicas of
        one run compare hashes)."""
        key = (n, str(device))
        w = _HASH_WEIGHTS.get(key)
        if w is None:
            if len(_HASH_WEIGHTS) >= _SIGN_CACHE_LIMIT:
                _HASH_WEIGHTS.clear()
            i = torch.arange(n, dtype=torch.int64)
            w = ((_fmix32((i * 0x9E3779B1) & _MASK32) >> 1) | 1).to(device)
            _HASH_WEIGHTS[key] = w
        return w

    def summarize(self, tensor, first_token=0, share=None, hashed=True, dim=-2):
        """(sketch, nan, inf, hash) of a piece whose first token is global
        token `first_token`: device tensors, nothing synchronised. `share`:
        (lo, hi), sketch only the piece's tokens lo..hi-1 (its replicas
        sketch the rest); the counts and the hash are always the whole
        piece's; hashed=False: no hash (None), for a tap no replica compares.
        `dim`: the token dimension from the end (-3: [..., sequence, heads,
        head_dim], the sketch [..., k+1, heads, head_dim]). The same tensor
        offered again unchanged in this step (a module returning its
        submodule's output) reuses its summary."""
        x = tensor.detach()
        key = (id(tensor), first_token, share, hashed, dim)
        seen = self._seen.get(key)
        if seen is not None and seen[0]() is tensor and seen[1] == tensor._version:
            return seen[2]
        lead, tokens, width = as_matrix_shape(tuple(x.shape))
        widths = (width,)
        if dim != -2:  # the dimensions after the tokens one width, row-major
            lead, tokens, widths = tuple(x.shape[:dim]), x.shape[dim], tuple(x.shape[dim + 1:])
            width = math.prod(widths)
        x = x.reshape(-1, tokens, width)
        lo, hi = share or (0, tokens)
        acc = accumulator(x.dtype)
        r = self._sign_rows(first_token + lo, hi - lo, x.device, acc)
        # The fused CPU kernel (sketch/cpu_kernel.py) where it takes x: the same sums in one pass.
        sketch = sketch_cpu.sketch(x[:, lo:hi], r, self.k) if sketch_cpu.takes(x) else None
        if sketch is None:
            sketch = self._torch_sketch(x[:, lo:hi], r, acc)
        if hashed and sketch_cpu.takes_bits(x):  # the hash and the exact counts in one read
            nan, inf, bits = sketch_cpu.piece_bits(x)
        else:
            nan, inf = self._nonfinite(x, sketch if (lo, hi) == (0, tokens) else None)
            bits = self.bits_hash(x) if hashed else None
        sketch = sketch.reshape(*lead, self.k + 1, *widths)
        result = sketch, nan, inf, bits
        self._seen[key] = (weakref.ref(tensor), tensor._version, result)
        return result

    def _torch_sketch(self, x, r, acc):
        """The sketch [lead, k+1, width] of x [lead, tokens, width] in torch ops."""
        width = x.shape[-1]
        if x.dtype == acc:
            # One matrix product per lead index: torch's batched matmul with a
            # broadcast left operand is several times slower on the CPU.
            return torch.stack([torch.mm(r, x[i]) for i in range(x.shape[0])])
        # Widened a bounded slab of tokens at a time: no copy of the whole tap.
        step = max(1, (_WIDEN_ELEMENTS_CPU if x.device.type == "cpu" else _WIDEN_ELEMENTS) // max(width, 1))
        sketch = torch.zeros(x.shape[0], self.k + 1, width, dtype=acc, device=x.device)
        for i in range(x.shape[0]):
            for t0 in range(0, x.shape[1], step):
                sketch[i].addmm_(r[:, t0:t0 + step], x[i, t0:t0 + step].to(acc))
        return sketch

    def forget(self):
        """The step is over: no summary is reused across steps."""
        self._seen = {}

    def _nonfinite(self, x, sketch):
        """Exact NaN and Inf counts. A column whose sum is finite holds no NaN
        or Inf (they propagate through the sums), so on the CPU, where looking
        costs no synchronisation, the counting pass runs only when a column sum
        is not finite (or, for a share, the whole piece's sum); on a device it
        always runs (no host round trip)."""
        if x.device.type == "cpu":  # (NumPy looks at the column sums for a tenth of torch's per-call cost)
            finite = math.isfinite(float(x.sum())) if sketch is None else \
                bool(np.isfinite(sketch[..., self.k, :].numpy()).all())
            if finite:
                zero = torch.zeros((), dtype=torch.int64)
                return zero, zero
        return torch.isnan(x).sum(), torch.isinf(x).sum()

    def bits_hash(self, x):
        """A 64-bit function of the piece's bits: each row's bytes read as
        int64 words and summed (wrapping), the row sums weighted by odd
        numbers and summed. One read of the tensor, no int64 copy of it."""
        x = x.contiguous()
        lead, tokens, width = as_matrix_shape(tuple(x.shape))
        rows = max(x.numel() // max(width, 1), 1)
        row_bytes = width * x.element_size()
        if x.numel() and row_bytes % 8 == 0:
            words = x.reshape(rows, width).view(torch.int64)
        else:  # rows of an odd byte length: widen each element
            int_type = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[x.element_size()]
            bits = x.view(int_type) if x.is_floating_point() else x
            words = bits.reshape(rows, -1).to(torch.int64)
        per_row = words.sum(-1)
        return (per_row * self._hash_weights(rows, x.device)).sum()


def hex64(value):
    """The hash as the file keeps it: 16 hex digits; "-" for none (no replica compares it)."""
    return "-" if value is None else f"{int(value) & 0xFFFFFFFFFFFFFFFF:016x}"


def estimate_rel_l2(run_sketch, ref_sketch, k, tokens, seed):
    """The comparator's estimate of ||x - ref|| / ||ref|| (harness/check/
    sketch_check.cpp) from two global sketches [lead..., k+1, width] of
    tensors with `tokens` tokens, in NumPy: the column sums are taken out
    exactly, the centred part estimated from the k rows."""
    ss = signs(seed, k, 0, tokens).sum(1).double().numpy()

    def squared_norm(s):
        s = np.asarray(s, dtype=np.float64)
        c = s[..., k, :]
        centred = s[..., :k, :] - ss[:, None] * c[..., None, :] / tokens
        return (centred ** 2).sum() / k + (c ** 2).sum() / tokens
    return float(np.sqrt(squared_norm(np.asarray(run_sketch) - np.asarray(ref_sketch)) / squared_norm(ref_sketch)))


class Pending:
    """Summaries computed in hooks, kept on their device until flush(): then
    every device's results come home in one copy each, and `emit(name,
    sketch, nan, inf, hash, extra)` is called per summary in order."""

    def __init__(self, pack_cpu=False):
        """pack_cpu: pack CPU summaries as a device's are (the CPU twin of the
        one-copy path, for tests); by default they are home already."""
        self._items = []
        self._pack_cpu = pack_cpu
        self.cpu_bytes = 0  # what the CPU summaries held here take

    def add(self, name, summary, extra):
        self._items.append((name, summary, extra))
        if summary[0].device.type == "cpu":
            self.cpu_bytes += summary[0].numel() * summary[0].element_size()

    def flush(self, emit):
        items, self._items = self._items, []
        self.cpu_bytes = 0
        if not items:
            return
        by_device = {}
        for i, (_, (sketch, nan, inf, h), _) in enumerate(items):
            by_device.setdefault(str(sketch.device), []).append(i)
        home = [None] * len(items)
        for i in ([] if self._pack_cpu else by_device.pop("cpu", [])):  # home already: nothing to pack
            sketch, nan, inf, h = items[i][1]
            home[i] = (sketch, int(nan), int(inf), None if h is None else int(h))
        for indices in by_device.values():
            parts = []
            for i in indices:
                sketch, nan, inf, h = items[i][1]
                h = torch.zeros((), dtype=torch.int64, device=nan.device) if h is None else h
                ints = torch.stack([nan.to(torch.int64), inf.to(torch.int64), h.to(torch.int64)])
                parts += [ints.view(torch.float64), sketch.reshape(-1).to(torch.float64)]
            flat = torch.cat(parts).cpu()  # the one copy (and the one wait) per device
            at = 0
            for i in indices:
                sketch = items[i][1][0]
                nan, inf, h = flat[at:at + 3].view(torch.int64).tolist()
                h = None if items[i][1][3] is None else h
                at += 3
                values = flat[at:at + sketch.numel()].reshape(sketch.shape)
                at += sketch.numel()
                home[i] = (values.to(torch.float32) if sketch.dtype == torch.float32 else values, nan, inf, h)
        for (name, _, extra), (values, nan, inf, h) in zip(items, home):
            emit(name, values.numpy(), nan, inf, hex64(h), extra)
