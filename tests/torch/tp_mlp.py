#!/usr/bin/env python3
"""A Megatron-style tensor-parallel MLP in PyTorch, dumped for `diffcheck
compare` with scripts/diffcheck_dump.py — the user's-own-program side of
the noise-floor test (tests/test_e2e_noise_floor_torch.py).

    tp_mlp.py reference OUT          float64, one process: OUT.rank0.h5 holds /reference/<tap>
    tp_mlp.py single OUT             float32, one process (the noise floor: one device, same dtype)
    tp_mlp.py sharded OUT -n N [--bug]
                                     float32 over N gloo processes: column-parallel fc1, row-parallel
                                     fc2 + all-reduce; --bug all-reduces the partial sums in bfloat16
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from diffcheck_dump import RankDump  # noqa: E402

TOKENS, D, H = 64, 96, 384


def weights(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(TOKENS, D, generator=g, dtype=torch.float64)
    w1 = torch.randn(H, D, generator=g, dtype=torch.float64) / D ** 0.5
    b1 = torch.randn(H, generator=g, dtype=torch.float64) * 0.1
    w2 = torch.randn(D, H, generator=g, dtype=torch.float64) / H ** 0.5
    b2 = torch.randn(D, generator=g, dtype=torch.float64) * 0.1
    return [t.to(dtype) for t in (x, w1, b1, w2, b2)]


def forward(x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(x @ w1.T + b1)
    partial = h @ w2.T
    return h, partial, partial + b2


def one_process(out, dtype, reference):
    x, w1, b1, w2, b2 = weights(dtype)
    h, _, y = forward(x, w1, b1, w2, b2)
    with RankDump(out, mesh="tp=1", rank=0) as d:
        for name, t in (("x", x), ("fc1", h), ("y", y)):
            if reference:
                d.reference(name, t)
            else:
                d.tap(name, t)


def shard(rank, n, out, bug, init):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    x, w1, b1, w2, b2 = weights(torch.float32)
    cols = slice(rank * H // n, (rank + 1) * H // n)
    h, partial, _ = forward(x, w1[cols], b1[cols], w2[:, cols], torch.zeros(D))
    y = partial.to(torch.bfloat16).float() if bug else partial.clone()
    dist.all_reduce(y)
    y = y + b2
    with RankDump(out, mesh=f"tp={n}", rank=rank) as d:
        d.tap("x", x)
        d.tap("fc1", h, spec="-,tp")
        d.tap("y", y)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["reference", "single", "sharded"])
    ap.add_argument("out")
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--bug", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.mode == "sharded":
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(shard, args=(a.n, a.out, a.bug, "file://" + os.path.join(tmp, "rendezvous")), nprocs=a.n)
    else:
        one_process(a.out, torch.float64 if a.mode == "reference" else torch.float32, a.mode == "reference")


if __name__ == "__main__":
    main()
