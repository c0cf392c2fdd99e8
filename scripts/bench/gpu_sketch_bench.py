#!/usr/bin/env python3
"""Issue 44's GPU figures, as one short script for a lent GPU machine (it has
torch with CUDA and h5py, no diffcheck build): a model of four FLUX.1
single-stream blocks at full width (D 3072, 24 heads, MLP 12288, 4096 + 512
tokens, bfloat16, scaled_dot_product_attention), timed

  plain         the forward alone
  sketch        dct.capture(..., sketch=True) of every module output
  whole4        dct.capture of the 4 block outputs, whole (host staging)
  compiled      torch.compile'd forward, and in sketch mode

each as the median of --rounds paired forwards (CUDA events), and the disk's
write speed (dd-like, for whole4's yardstick: bytes / speed + forward). The
sketch files of one forward and of the same model run in float64 on the
device (the reference) go under --out, to be compared at home with
`diffcheck compare`. Results: <out>/gpu_sketch_bench.json.

    python3 scripts/bench/gpu_sketch_bench.py --out $OUT            # on the GPU machine
    python3 scripts/bench/gpu_sketch_bench.py --device cpu --tiny   # the CPU twin (tests the script)
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import diffcheck.torch as dct  # noqa: E402


class SingleStreamBlock(nn.Module):
    """FLUX.1's single-stream block: one fused projection to q, k, v and the
    MLP's input, attention and the MLP side by side, one output projection."""

    def __init__(self, d, heads, mlp):
        super().__init__()
        self.heads, self.mlp = heads, mlp
        self.norm = nn.LayerNorm(d, elementwise_affine=False)
        self.linear1 = nn.Linear(d, 3 * d + mlp)
        self.act = nn.GELU(approximate="tanh")
        self.linear2 = nn.Linear(d + mlp, d)

    def forward(self, x):
        b, n, d = x.shape
        h = self.linear1(self.norm(x))
        qkv, m = h[..., :3 * d], h[..., 3 * d:]
        q, k, v = qkv.view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        sdpa = getattr(F, "scaled_dot_product_attention", None)
        if sdpa is not None:
            a = sdpa(q, k, v)
        else:  # torch 1.13 (the CPU twin here)
            a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        a = a.transpose(1, 2).reshape(b, n, d)
        return x + self.linear2(torch.cat([a, self.act(m)], -1))


class Model(nn.Module):
    def __init__(self, d, heads, mlp, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(SingleStreamBlock(d, heads, mlp) for _ in range(blocks))

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


def timer(device):
    if device == "cuda":
        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def run(fn):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return run


def disk_speed(path, mib=512):
    block = os.urandom(1 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    os.remove(path)
    return mib * (1 << 20) / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu_sketch_bench"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="D 64, 4 heads, MLP 256, 64 + 16 tokens (the CPU twin)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    d, heads, mlp, tokens = (64, 4, 256, 80) if a.tiny else (3072, 24, 12288, 4608)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Model(d, heads, mlp, 4).to(a.device, dtype).eval()
    x = torch.randn(1, tokens, d, device=a.device, dtype=dtype)
    run = timer(a.device)
    results = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__,
               "dtype": str(dtype), "size": [d, heads, mlp, tokens]}

    def forward(m, **capture):
        """m's forward, captured with `capture` (none: plain)."""
        def fn():
            with torch.no_grad():
                if not capture:
                    return m(x)
                with dct.capture(m, **capture):
                    m(x)
        return fn

    plain, sketch = forward(model), forward(model, out=f"{a.out}/sketch", sketch=True)
    whole4 = forward(model, out=f"{a.out}/whole4", include="blocks.[0-9]")

    def paired(fn, base):
        fn(), base()  # warm-up
        rows = [(run(base), run(fn)) for _ in range(a.rounds)]
        return {"base_ms": statistics.median(r[0] for r in rows) * 1e3, "ms": statistics.median(r[1] for r in rows) * 1e3,
                "ratio": statistics.median(r[1] / r[0] for r in rows)}

    results["sketch"] = paired(sketch, plain)
    results["whole4"] = paired(whole4, plain)
    results["whole4"]["bytes"] = os.path.getsize(f"{a.out}/whole4.rank0.h5")
    speed = disk_speed(os.path.join(a.out, "disk_probe"))
    results["disk_bytes_per_s"] = speed
    results["whole4"]["yardstick_ms"] = results["whole4"]["bytes"] / speed * 1e3 + results["whole4"]["base_ms"]
    results["whole4"]["over_yardstick"] = results["whole4"]["ms"] / results["whole4"]["yardstick_ms"]
    if not a.no_compile and hasattr(torch, "compile"):
        compiled = torch.compile(model)
        plain_c, sketch_c = forward(compiled), forward(compiled, out=f"{a.out}/sketch_compiled", sketch=True)
        try:
            results["compiled"] = paired(sketch_c, plain_c)
        except RuntimeError as e:  # the capture refused: the graph hid module outputs
            results["compiled"] = {"refused": str(e)}
    # The reference of the same forward, in float64 on the device, as sketches, and one-device = the run itself.
    with torch.no_grad(), dct.capture(model.double(), out=f"{a.out}/ref", reference=True, sketch=True):
        model(x.double())
    with open(os.path.join(a.out, "gpu_sketch_bench.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
