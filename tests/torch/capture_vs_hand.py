#!/usr/bin/env python3
"""One tensor-parallel MLP dumped twice per rank — by `diffcheck.torch.capture`
and by hand with `RankDump`, as users wrote it before — so that
tests/test_e2e_torch.py can check the two files hold the same taps.

    capture_vs_hand.py OUT -n N       N gloo processes (1, 2, 4): OUT/capture.rank<R>.h5,
                                      OUT/hand.rank<R>.h5, and OUT/ref.h5 (float64 reference)
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import diffcheck.torch as dct
from diffcheck.dump import RankDump

TOKENS, D, H = 8, 16, 32


def weights():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(TOKENS, D, generator=g, dtype=torch.float64),
            torch.randn(H, D, generator=g, dtype=torch.float64) / D ** 0.5,
            torch.randn(D, H, generator=g, dtype=torch.float64) / H ** 0.5,
            torch.randn(D, generator=g, dtype=torch.float64))


class RowParallel(nn.Module):
    def __init__(self, w, bias, tp):
        super().__init__()
        self.matmul = nn.Linear(w.shape[1], w.shape[0], bias=False)
        self.matmul.weight = nn.Parameter(w.clone())
        self.bias = nn.Parameter(bias.clone())
        self.tp = tp

    def forward(self, x):
        y = self.matmul(x)
        if self.tp > 1:
            dist.all_reduce(y)  # in place: the tap of `matmul` must hold the value before
        return y + self.bias


class MLP(nn.Module):
    def __init__(self, tp, rank):
        super().__init__()
        _, w1, w2, b2 = weights()
        cols = slice(rank * H // tp, (rank + 1) * H // tp)
        self.fc1 = nn.Linear(D, H // tp, bias=False)
        self.fc1.weight = nn.Parameter(w1[cols].clone())
        self.act = nn.GELU()
        self.fc2 = RowParallel(w2[:, cols], b2, tp)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


LAYOUTS = {"fc1": "-,tp", "act": "-,tp", "*.matmul": (None, "tp")}


def rank_main(rank, n, out, init):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    x = weights()[0].float()
    model = MLP(n, rank).float()
    with dct.capture(model, out=f"{out}/capture", mesh=f"tp={n}", layouts=LAYOUTS):
        model(x)
    with torch.no_grad(), RankDump(f"{out}/hand", mesh=f"tp={n}", rank=rank) as d:
        h = model.fc1(x)
        d.tap("fc1", h, spec="-,tp")
        a = model.act(h)
        d.tap("act", a, spec="-,tp")
        p = model.fc2.matmul(a)
        d.tap("fc2.matmul", p, partial="tp")
        y = p.clone()
        if n > 1:
            dist.all_reduce(y)
        y = y + model.fc2.bias
        d.tap("fc2", y)
        d.tap("model", y)
    if rank == 0:
        ref = MLP(1, 0).double()
        with dct.capture(ref, out=f"{out}/ref", reference=True):
            ref(weights()[0])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("-n", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(a.n, a.out, "file://" + os.path.join(tmp, "rendezvous")), nprocs=a.n)
    sys.exit(0)
