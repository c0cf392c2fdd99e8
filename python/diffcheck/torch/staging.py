"""Whole taps of device tensors (CUDA) copied home without stopping the
forward: each is copied asynchronously into one of a bounded set of host
buffers (pinned, so the copy is a DMA the GPU does on its own), and the
writer thread waits for that copy, not the forward. The forward waits only
when every buffer holds a tap not yet written.

The CPU twin (what the suite tests, no GPU there): the same pool and the
same handing over, with unpinned buffers and a copy that is done when
`copy_` returns.
"""
import threading

import torch

DEFAULT_SLOTS = 4  # buffers in flight; each as large as the largest tap it held


class _DoneEvent:
    """What a CPU copy records: it is complete already."""

    def synchronize(self):
        pass


class HostStaging:
    def __init__(self, slots=DEFAULT_SLOTS, pinned=None):
        self.slots = slots
        self.pinned = torch.cuda.is_available() if pinned is None else pinned
        self._free = []           # buffers not in use
        self._made = 0
        self._lock = threading.Lock()
        self._available = threading.Semaphore(slots)
        self.peak_in_use = 0      # for tests: never above `slots`
        self._in_use = 0

    def copy(self, tensor):
        """(host tensor, done event, buffer) for a device tensor: the copy is
        queued on the tensor's stream; wait on `done` before reading it, give
        the buffer back with release() after."""
        self._available.acquire()  # the only place the forward can wait
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            self._in_use += 1
            self.peak_in_use = max(self.peak_in_use, self._in_use)
            fitting = [b for b in self._free if b.numel() >= nbytes]
            if fitting:
                buf = min(fitting, key=lambda b: b.numel())
                self._free.remove(buf)
            else:
                if self._free:  # too small: replaced, so the pool stays at `slots` buffers
                    self._free.pop()
                    self._made -= 1
                buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pinned)
                self._made += 1
        host = buf[:nbytes].view(tensor.dtype).view(tensor.shape) if nbytes else \
            torch.empty(tensor.shape, dtype=tensor.dtype)
        host.copy_(tensor.detach(), non_blocking=tensor.device.type == "cuda")
        if tensor.device.type == "cuda":
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(tensor.device))
        else:
            done = _DoneEvent()
        return host, done, buf

    def release(self, buf):
        with self._lock:
            self._free.append(buf)
            self._in_use -= 1
        self._available.release()

    @property
    def buffers(self):
        return self._made
