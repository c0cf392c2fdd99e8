#!/usr/bin/env python3
"""On a CUDA device: a rotary table (complex64, torch.polar) captured as its
real view over sp=2 (both ranks in one process), and dct.references making
the float64 reference and the one-device yardstick on the GPU; clean and with
rank 1's table at local positions. Files under $OUT/{clean,bug}; compare them
with `diffcheck compare DIR/run --reference DIR/ref.h5`."""
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import diffcheck.torch as dct  # noqa: E402


class Rotary(nn.Module):
    def forward(self, pos):
        freqs = 1.0 / (10000 ** (torch.arange(0, 64, 2, device=pos.device, dtype=pos.dtype) / 64))
        angles = torch.outer(pos, freqs)
        return torch.polar(torch.ones_like(angles), angles)


class Rope(nn.Module):
    def __init__(self):
        super().__init__()
        self.rope, self.lin = Rotary(), nn.Linear(64, 64)

    def forward(self, x, pos):
        table = self.rope(pos)
        rotated = torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * table).flatten(-2)
        return self.lin(rotated)


def main():
    out, dev = os.environ.get("OUT", "/tmp/gpu_out"), "cuda"
    torch.manual_seed(0)
    weights, x = Rope().state_dict(), torch.randn(256, 64)
    for case in ("clean", "bug"):
        t0 = time.perf_counter()
        for rank in (0, 1):
            model = Rope().to(dev)
            model.load_state_dict(weights)
            start = 0 if case == "bug" and rank == 1 else 128 * rank
            with dct.capture(model, out=f"{out}/{case}/run", mesh="sp=2", rank=rank, world_size=2,
                             layouts={"*": "sp,-"}):
                model(x[128 * rank:128 * rank + 128].to(dev),
                      torch.arange(start, start + 128, dtype=torch.float32, device=dev))

        def make(dt):
            model = Rope()
            model.load_state_dict(weights)
            return model.to(dev, dt), (x.to(dev, dt), torch.arange(256, dtype=dt, device=dev))
        dct.references(make, f"{out}/{case}/ref", dtype=torch.float32)
        print(f"{case}: captured in {time.perf_counter() - t0:.2f} s on {torch.cuda.get_device_name()}, "
              f"torch {torch.__version__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
