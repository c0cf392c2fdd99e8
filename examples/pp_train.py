#!/usr/bin/env python3
"""Two training steps of a pipeline-parallel MLP stack (torch.distributed.pipelining), checked by diffcheck.

    python3 examples/pp_train.py -n 2 [--schedule gpipe|1f1b|interleaved|zbv] [--dp 2] [--bug ...]
    torchrun --nproc-per-node 2 examples/pp_train.py [...]

Eight residual blocks (LayerNorm, fc1, GELU, fc2) split into stages over the
`pp` ranks: each stage's module is the whole model with the other stages'
blocks deleted, so its modules keep their names (torchtitan's way). The
schedule runs 4 microbatches per step; `interleaved` (Interleaved1F1B) and
`zbv` (ZBVZeroBubble, a zero-bubble schedule) give each rank two stages.
With --dp 2 the mesh is pp x dp: each dp replica runs its own pipeline on its
half of the batch, its loss the mean over its own samples, and the gradients
are averaged over dp before SGD steps; diffcheck is told the data axis in one
word (`data_axes=("dp",)`): each tap's batch split over dp, the reference on
the whole batch.

diffcheck taps, on each rank, the modules of its own stages: every
microbatch's call of a module is laid together under one name, forward and
backward, and the parameters around the step; the reference is the whole
model in float64 on the whole batch, in one process, and the same in the
run's dtype beside it (each tap's yardstick).

--bug microbatches_swapped   stage 0 holds microbatch 1's activations back and
    sends them after 2's, so stage 1 takes 2's for 1 and 1's for 2: found at
    stage 1's first tap, microbatch 1.
--bug send_buffer_reused     stage 0 sends every microbatch from one buffer
    and sends each a microbatch late, when the buffer already holds the next
    one: found at stage 1's first tap, microbatch 0.
--bug grad_dropped           the gradient stage 1 sends back for microbatch 2
    arrives as zeros: found at stage 0's last block's gradient, microbatch 2.
--bug loss_scale             the loss is divided by the stage count instead of
    the microbatch count (and the schedule scales nothing): found at the
    gradient of the last block's output.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleZBVZeroBubble)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, D, FFN, LAYERS, MICROBATCHES, STEPS, LR = 16, 32, 64, 8, 4, 2, 0.5
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zbv": ScheduleZBVZeroBubble}
BUGS = ("microbatches_swapped", "send_buffer_reused", "grad_dropped", "loss_scale")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2 = nn.LayerNorm(D), nn.Linear(D, FFN), nn.GELU(), nn.Linear(FFN, D)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


def whole_model(dtype):
    torch.manual_seed(0)
    return Stack().double().to(dtype)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, D, generator=g, dtype=torch.float64), torch.randn(B, D, generator=g, dtype=torch.float64)


def stage_ids(schedule, pp, coordinate):
    """This rank's stages: one, or two for the interleaved (round robin) and V-shaped (zbv) schedules."""
    if schedule == "interleaved":
        return [coordinate, coordinate + pp]
    if schedule == "zbv":
        return [coordinate, 2 * pp - 1 - coordinate]
    return [coordinate]


def stage_module(model, stage, n_stages):
    """The whole model with the other stages' blocks deleted."""
    m = copy.deepcopy(model)
    per = LAYERS // n_stages
    for k in list(m.layers.keys()):
        if not stage * per <= int(k) < (stage + 1) * per:
            del m.layers[k]
    return m


def inject(stages, bug):
    """The pipeline bugs, on the sending or receiving side of one stage."""
    by_index = {s.stage_index: s for s in stages}
    if bug == "grad_dropped" and 0 in by_index:
        s, inner = by_index[0], by_index[0]._retrieve_recv_grads
        s._retrieve_recv_grads = lambda k: tuple(torch.zeros_like(g) for g in inner(k)) if k == 2 else inner(k)
    if bug == "microbatches_swapped" and 0 in by_index:  # microbatch 1's send waits for 2's, which goes first
        send_in_order(by_index[0], lambda k: {1: [], 2: [2, 1]}.get(k, [k]))
    if bug == "send_buffer_reused" and 0 in by_index:  # each send a microbatch late, from the one buffer
        last = MICROBATCHES - 1
        send_in_order(by_index[0], lambda k: [] if k == 0 else [k - 1] + ([k] if k == last else []), buffer=True)


def send_in_order(stage, plan, buffer=False):
    """Stage's activation sends: plan(k) says which microbatches' go when microbatch k's would (the
    receiver takes them in that order); buffer=True: all from one buffer, which holds the latest output."""
    sends, one = stage.get_fwd_send_ops, {}

    def ops(k):
        if buffer:
            latest = stage.fwd_cache[k][0][0]
            buf = one.setdefault("buffer", torch.empty_like(latest))
            with torch.no_grad():
                buf.copy_(latest)
        out = []
        for j in plan(k):
            kept = stage.fwd_cache[j]
            if buffer:
                stage.fwd_cache[j] = ((one["buffer"],), kept[1])
            try:
                out += sends(j)
            finally:
                stage.fwd_cache[j] = kept
        return out
    stage.get_fwd_send_ops = ops


def work(rank, world, args):
    dtype = DTYPES[args.dtype]
    dp = args.dp
    pp = world // dp
    pp_coordinate, dp_coordinate = rank // dp, rank % dp
    # Every rank makes every group, in the same order (torch.distributed's rule).
    pp_groups = [dist.new_group([s * dp + d for s in range(pp)]) for d in range(dp)] if dp > 1 else [None]
    dp_groups = [dist.new_group([s * dp + d for d in range(dp)]) for s in range(pp)] if dp > 1 else []
    pp_group = pp_groups[dp_coordinate]
    model = whole_model(dtype)
    ids = stage_ids(args.schedule, pp, pp_coordinate)
    n_stages = pp * len(ids)
    stages = [PipelineStage(stage_module(model, i, n_stages), i, n_stages, torch.device("cpu"), group=pp_group)
              for i in ids]
    inject(stages, args.bug)
    params = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.SGD(params, lr=LR)

    def loss_fn(out, target):
        # The mean over this replica's own samples (its gradients are averaged over dp).
        loss = ((out.float() - target.float()) ** 2).mean()
        return loss / pp if args.bug == "loss_scale" else loss  # the bug: stages, not microbatches
    cls = SCHEDULES[args.schedule]
    schedule = cls(stages[0] if len(stages) == 1 else stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn,
                   scale_grads=args.bug != "loss_scale")
    x, target = data()
    mine = slice(dp_coordinate * B // dp, (dp_coordinate + 1) * B // dp)
    x, target = x[mine].to(dtype), target[mine].to(dtype)
    mesh = f"pp={pp},dp={dp}" if dp > 1 else f"pp={pp}"  # diffcheck
    with dct.capture(schedule, f"{args.out}/pp", mesh=mesh, data_axes=("dp",) if dp > 1 else None, backward=True, optimizer=opt, sketch=args.sketch):  # noqa: E501  # diffcheck
        for i in range(STEPS):
            dct.step(i)  # diffcheck
            first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
            schedule.step(*((x,) if first else ()), **({"target": target} if last else {}))
            for g in dp_groups[pp_coordinate:pp_coordinate + 1]:
                for p in params:
                    dist.all_reduce(p.grad, group=g)
                    p.grad /= dp
            opt.step()
            opt.zero_grad()
    dct.references(lambda dt: (whole_model(dt), data()), f"{args.out}/ref", dtype=dtype, step=reference_steps, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=LR), backward=True, sketch=args.sketch)  # noqa: E501  # diffcheck


def reference_steps(model, xt, optimizer):
    x, target = (t.to(next(model.parameters()).dtype) for t in xt)
    for i in range(STEPS):
        dct.step(i)  # diffcheck
        ((model(x) - target) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def after(args):
    return dct.verdict(f"{args.out}/pp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/pp_train", dtypes=DTYPES)
    ap.add_argument("--bug", choices=BUGS, help="the pipeline bug to inject")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b", help="the pipeline schedule "
                    "(default 1f1b)")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline (default 1)")
    a = ap.parse_args()
    launch(work, after, a, a.n)
