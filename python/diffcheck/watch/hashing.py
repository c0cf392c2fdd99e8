"""dct.watch's hash of a tensor's bits (diffcheck/watch/__init__.py): on a CPU XXH3
from the diffcheck kernel library (zlib's CRC-32 without it), on an
accelerator two integer sums computed there. Each hash carries the algorithm
that made it: hashes made two ways are never compared."""
import struct
import zlib

import numpy as np
import torch

from diffcheck.sketch import cpu_kernel as sketch_cpu
from diffcheck.watch.rerun import _INT_OF

_MIX = 0x9E3779B1

# How a rank hashed a tensor: its hashes compare only with hashes made the same way.
CRC32, XXH3, SUMS = 1, 2, 3
ALGORITHMS = {CRC32: "zlib's CRC-32 (the diffcheck kernel library not found)", XXH3: "XXH3 (the diffcheck kernel library)",
              SUMS: "integer sums on an accelerator"}


def bits_hash(tensor):
    """Three int64 numbers of a tensor's bits, on its device: two of the hash
    and the algorithm that made them. On a CPU XXH3's 64-bit hash of its bytes
    (python/kernels/sketch_cpu.c; zlib's CRC-32 where that library is not
    loaded) and its size; on an accelerator two sums of its bytes read as
    integers of its element width: the plain sum and the sum weighted by a
    position mix. Either way one changed element changes the hash, and two
    swapped elements do. (0, 0, algorithm) for an empty tensor."""
    t = tensor.detach().contiguous()
    if t.device.type != "cpu":
        return torch.cat((device_sums(t), torch.tensor([SUMS], dtype=torch.int64, device=t.device)))
    return torch.tensor(_cpu_hash(t), dtype=torch.int64)


def _cpu_hash(t):
    """bits_hash of a contiguous CPU tensor, as three ints."""
    if t.numel() == 0:
        return [0, 0, _cpu_algorithm()]
    xxh3 = sketch_cpu.bytes_hash_function()
    if xxh3 is not None:  # memory speed: ~3x the CRC, which is the check's cost at every=1
        h = xxh3(t.data_ptr(), t.numel() * t.element_size())
        return [h - (1 << 64) if h >= 1 << 63 else h, t.numel(), XXH3]
    bits = t.view(_INT_OF[t.element_size()]).reshape(-1)  # zlib's CRC-32: 5-10x torch's integer sums on a CPU
    return [zlib.crc32(memoryview(bits.numpy()).cast("B")), t.numel(), CRC32]


def hash_row(t, sums):
    """[hash, hash, algorithm, 1] of a CPU tensor as ints; of an accelerator's
    (or any, with sums), its two sums as a tensor there (the caller brings
    them over together)."""
    t = t.detach().contiguous()
    if sums or t.device.type != "cpu":
        return device_sums(t)
    return _cpu_hash(t) + [1]


def _cpu_algorithm():
    return XXH3 if sketch_cpu.bytes_hash_function() is not None else CRC32


def device_sums(t):
    """The accelerator's hash (bits_hash), on any device."""
    bits = t.detach().contiguous().view(_INT_OF[t.element_size()]).reshape(-1)
    # Sums accumulated in int64 (no widened copy); the product wraps in the
    # element width, the same on every device.
    weighted = bits * _weights(bits.numel(), bits.device, bits.dtype)
    return torch.stack((bits.sum(dtype=torch.int64), weighted.sum(dtype=torch.int64)))


_WEIGHTS = {}


def _weights(n, device, dtype):
    """Odd multipliers mixed from the position, in the bits' own integer type (cached per size)."""
    key = (n, str(device), dtype)
    w = _WEIGHTS.get(key)
    if w is None:
        bits = torch.iinfo(dtype).bits
        w = ((torch.arange(n, dtype=torch.int64, device=device) * _MIX) % (1 << (bits - 1)) | 1).to(dtype)
        _WEIGHTS[key] = w
    return w


class CheckRows:
    """The rows of every check of a watch, planned once: `count` tensors' rows
    and a last row the caller fills. CPU tensors are hashed in one call to the
    kernel library (diffcheck_watch_rows: at every=1 one call per tensor was
    most of a small model's check); an accelerator's, a strided one's, or all
    with `sums` or no library, one by one (hash_row).

    Each check gets a table of its own, the next of a block of TABLES, which
    it keeps until its batch is exchanged (release): the batch keeps the
    tables themselves, not copies (a NumPy copy was ~5 us of a small model's
    check in its training loop, where every first touch misses the caches)."""

    TABLES = 64

    def __init__(self, count, sums):
        self.count = count
        # Each tensor's pointer, bytes and elements, and one more row with -1 elements: the library zeroes
        # the last row (the caller's) in the same call. Packed by one struct call: three NumPy assignments
        # from lists were ~13 us of a 30-tensor check inside a training loop (cold caches), 10% of it.
        self.meta = np.zeros(3 * (count + 1), dtype=np.int64)
        self._pack = struct.Struct(f"{count + 1}Q{2 * (count + 1)}q").pack_into
        self.sums = sums
        self.fused = None if sums else sketch_cpu.watch_rows_function()
        # the arrays' addresses, taken once (numpy makes an object for each .ctypes)
        base = self.meta.ctypes.data
        self._addresses = (base, base + 8 * (count + 1), base + 16 * (count + 1))
        self._tables, self._used = [], 0

    def _next_table(self):
        """(a table [count + 1, 4] no kept check holds, its address)."""
        if self._used == len(self._tables):  # a new block: the kept checks' tables keep the old one alive
            block = np.zeros((self.TABLES, self.count + 1, 4), dtype=np.int64)
            stride, base = block.strides[0], block.ctypes.data
            self._tables = [(block[k], base + k * stride) for k in range(self.TABLES)]
            self._used = 0
        self._used += 1
        return self._tables[self._used - 1]

    def release(self):
        """The kept checks' tables were exchanged (copied into the batch's): they may be filled again."""
        self._used = 0

    def fill(self, tensors):
        """(rows, on_device): rows this check's int64 array [count + 1, 4]
        (the last row zeros, the caller's; its own until release(): a NumPy
        array, since a torch tensor's item assignment costs ~20 us a check);
        on_device [(index, the accelerator's two sums there)], which the
        caller brings over at once."""
        table, address = self._next_table()
        singles, on_device = [], []
        pointers, sizes, counts = [], [], []  # packed into the plan's array at once
        fused = self.fused is not None
        for i, t in enumerate(tensors):
            if t is not None and fused and t.is_cpu and t.is_contiguous():
                n = t.numel()
                pointers.append(t.data_ptr())
                sizes.append(n * t.element_size())
                counts.append(n)
            else:  # no row from the library (-1 elements): absent, or hashed below
                pointers.append(0)
                sizes.append(0)
                counts.append(-1)
                if t is not None:
                    singles.append((i, t))
        if fused:
            self._pack(self.meta, 0, *pointers, 0, *sizes, 0, *counts, -1)
            pointers, sizes, counts = self._addresses
            self.fused(pointers, sizes, counts, self.count + 1, address)
        else:
            table[:] = 0
        for i, t in singles:
            row = hash_row(t, self.sums)
            if isinstance(row, torch.Tensor):
                on_device.append((i, row))
            else:
                table[i] = row
        return table, on_device
