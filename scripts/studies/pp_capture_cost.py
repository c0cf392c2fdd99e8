#!/usr/bin/env python3
"""What a capture costs on a pipeline training step (issue 62's target: sketch
mode within 1.15x of the step without it), on 2 gloo ranks (pp=2, 1F1B, 4
microbatches), an 8-block MLP stack of width --width, --rows rows per step.

Paired: each round times --steps steps without a capture, as many under
dct.capture(schedule, sketch=True), one under a whole capture and one under a
capture that taps nothing (its fixed cost: hooks, files, the schedule's
wrappers) and one that sketches the forward's module outputs alone (no
gradients, no parameters), in an order that rotates; the median of --rounds ratios per mode
is printed (rank 0). One step a round (the default) leaves each ratio to one
~0.8 s step's noise (a capture of nothing has read 0.91x): --steps 3 averages it.

    PYTHONPATH=python .venv/bin/python scripts/studies/pp_capture_cost.py [--rounds 7] [--steps 3]
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import diffcheck.torch as dct


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


def rank_main(rank, world, init, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    layers = nn.ModuleDict({str(i): Block(args.width) for i in range(8)})
    model = nn.Module()
    model.layers = layers
    stage_mod = copy.deepcopy(model)
    for k in list(stage_mod.layers.keys()):
        if not rank * 4 <= int(k) < (rank + 1) * 4:
            del stage_mod.layers[k]
    stage_mod.forward = lambda x, m=stage_mod: _run(m, x)
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda o, t: ((o - t) ** 2).mean())
    opt = torch.optim.SGD(stage_mod.parameters(), lr=1e-3)
    x, y = torch.randn(args.rows, args.width), torch.randn(args.rows, args.width)

    def step():
        schedule.step(x) if rank == 0 else schedule.step(target=y, losses=[])
        opt.step()
        opt.zero_grad()

    def timed(mode, i):
        dist.barrier()
        t0 = time.perf_counter()
        for s in range(args.steps):  # each step its own capture and files, as a job that captures every step
            if mode == "plain":
                step()
                continue
            only = {"include": ["-"], "exclude": ["param*"]} if mode == "fixed" else {}  # open, close, no taps
            train = {} if mode == "forward" else {"backward": True, "optimizer": opt}  # forward: module outputs only
            with dct.capture(schedule, os.path.join(out, f"{mode}{i}_{s}"), mesh=f"pp={world}", derive_depths=False,
                             sketch=mode in ("sketch", "fixed", "forward"), **train, **only):
                step()
        dist.barrier()
        return time.perf_counter() - t0

    modes = ["plain", "sketch", "whole", "fixed", "forward"]
    for m in modes:  # warm-up
        timed(m, -1)
    ratios = {"sketch": [], "whole": [], "fixed": [], "forward": []}
    for i in range(args.rounds):
        order = modes[i % 5:] + modes[:i % 5]
        t = {m: timed(m, i) for m in order}
        for m in ratios:
            ratios[m].append(t[m] / t["plain"])
        if rank == 0:
            print(f"round {i}: plain {t['plain'] * 1e3 / args.steps:.1f} ms a step, sketch {t['sketch'] / t['plain']:.3f}x, "
                  f"whole {t['whole'] / t['plain']:.3f}x, a capture of nothing {t['fixed'] / t['plain']:.3f}x, "
                  f"sketches of the forward's taps alone {t['forward'] / t['plain']:.3f}x",
                  flush=True)
    if rank == 0:
        for m, r in ratios.items():
            print(f"{m}: median {statistics.median(r):.3f}x of the step without a capture ({args.rounds} rounds)")
    dist.destroy_process_group()


def _run(m, x):
    for block in m.layers.values():
        x = block(x)
    return x


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=1, help="steps a mode is timed over in a round (default 1)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rows", type=int, default=1024)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(2, "file://" + os.path.join(tmp, "rdv"), a, tmp), nprocs=2)
    sys.exit(0)
