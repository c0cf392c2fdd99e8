#!/usr/bin/env python3
"""A pipeline written by hand (dist.send/recv between two stages, a loop over
microbatches, as Megatron's p2p and many research codebases do it), with an
output head tied to the token embedding, checked by diffcheck.

    python3 examples/pp_handwritten.py [--bug ...] [--dtype bfloat16]
    torchrun --nproc-per-node 2 examples/pp_handwritten.py [...]

A nanoGPT-style model: token and position embeddings, 4 residual blocks, a
final LayerNorm and an output head that shares the token embedding's weight.
Stage 0 (rank 0) holds the embeddings and blocks 0-1; stage 1 (rank 1) blocks
2-3, the norm and the head, with its own copy of the tied weight. Each of 2
training steps runs 4 microbatches GPipe-style: stage 0 sends each
microbatch's activations, stage 1 sends their gradients back; then the two
copies of the tied weight have their gradients all-reduced (the embedding
group) and each stage's SGD steps.

diffcheck is told this rank's stage and the microbatch count: each module's
4 calls in a step are laid together as the whole batch; the position
embedding's output `[T, D]` has no batch dimension, so it is written once
(checked the same in every microbatch) and its gradient summed. The
reference is the whole model on the whole batch, where the head and the
embedding are one parameter, tapped under both names.

--bug residual_twice     stage 0's block 1 adds its residual twice: found at
    stage 0's tap blocks.1, though stage 1's taps come first on their rank.
--bug stale_send         stage 0 sends microbatch 1's activations again in
    place of microbatch 2's: found at stage 1's first tap, microbatch 2.
--bug positions_shifted  microbatch 3 takes positions 1..T (one off): the
    position embedding's copies differ across microbatches.
--bug tied_allreduce_skipped   the embedding group's all-reduce is left out:
    found at the first step's gradient of the tied weight.
--bug head_not_updated   stage 1's optimizer leaves the head's copy of the
    tied weight out: found at the first step's param/head.weight.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, parser  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, T, D, V, LAYERS, MICROBATCHES, STEPS, LR = 8, 8, 32, 64, 4, 4, 2, 0.5
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUGS = ("residual_twice", "stale_send", "positions_shifted", "tied_allreduce_skipped", "head_not_updated")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D)
        self.residual_twice = False

    def forward(self, x):
        y = self.fc2(self.act(self.fc1(self.ln(x))))
        return x + y + (x if self.residual_twice else 0)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)
        self.head.weight = self.tok_emb.weight  # tied

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.ln_f(x))


class FirstStage(nn.Module):
    """The embeddings and the first half of the blocks, under the whole model's names."""

    def __init__(self, whole):
        super().__init__()
        self.tok_emb, self.pos_emb = whole.tok_emb, whole.pos_emb
        self.blocks = nn.ModuleDict({k: b for k, b in whole.blocks.items() if int(k) < LAYERS // 2})
        self.shift = {}  # microbatch -> position offset (--bug positions_shifted)
        self.microbatch = 0

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb((torch.arange(T) + self.shift.get(self.microbatch, 0)).clamp_max(T - 1))
        for block in self.blocks.values():
            x = block(x)
        return x


class LastStage(nn.Module):
    """The second half of the blocks, the norm and the head (its own copy of the tied weight)."""

    def __init__(self, whole):
        super().__init__()
        self.blocks = nn.ModuleDict({k: b for k, b in whole.blocks.items() if int(k) >= LAYERS // 2})
        self.ln_f, self.head = whole.ln_f, whole.head

    def forward(self, x):
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.ln_f(x))


def whole_model(dtype):
    torch.manual_seed(0)
    return GPT().double().to(dtype)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


def run_first_stage(stage, tokens, bug):
    """Forward every microbatch and send it on, then take the gradients back in order."""
    outs, sent = [], {}
    for m, idx in enumerate(tokens.chunk(MICROBATCHES)):
        stage.microbatch = m
        y = stage(idx)
        sent[m] = y.detach().clone()
        dist.send(sent[1] if bug == "stale_send" and m == 2 else sent[m], 1)
        outs.append(y)
    for y in outs:
        g = torch.empty_like(y)
        dist.recv(g, 1)
        y.backward(g)


def run_last_stage(stage, targets, dtype):
    """Take each microbatch, its loss's share of the step's mean, and send its input's gradient back."""
    pending = []
    for tgt in targets.chunk(MICROBATCHES):
        x = torch.empty(B // MICROBATCHES, T, D, dtype=dtype)
        dist.recv(x, 0)
        x.requires_grad_()
        logits = stage(x)
        (F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten()) / MICROBATCHES).backward()
        pending.append((dist.isend(x.grad, 0), x))
    for request, _ in pending:
        request.wait()


def work(rank, world, args):
    if world != 2:
        raise SystemExit("pp_handwritten.py runs on 2 ranks (one per stage)")
    dtype = DTYPES[args.dtype]
    whole = whole_model(dtype)
    stage = FirstStage(whole) if rank == 0 else LastStage(whole)
    if args.bug == "residual_twice" and rank == 0:
        stage.blocks["1"].residual_twice = True
    if args.bug == "positions_shifted" and rank == 0:
        stage.shift = {3: 1}
    tied = stage.tok_emb.weight if rank == 0 else stage.head.weight
    params = [p for p in stage.parameters() if not (args.bug == "head_not_updated" and p is tied and rank == 1)]
    opt = torch.optim.SGD(params, lr=LR)
    tokens, targets = data()
    with dct.capture(stage, f"{args.out}/pp", mesh="pp=2", stage=f"pp={rank}", microbatches=MICROBATCHES, backward=True, optimizer=opt):  # noqa: E501  # diffcheck
        for i in range(STEPS):
            dct.step(i)  # diffcheck
            if rank == 0:
                run_first_stage(stage, tokens, args.bug)
            else:
                run_last_stage(stage, targets, dtype)
            if args.bug != "tied_allreduce_skipped":
                dist.all_reduce(tied.grad)  # the embedding group: the tied weight's two copies
            opt.step()
            opt.zero_grad()
    dct.references(lambda dt: (whole_model(dt), data()), f"{args.out}/ref", dtype=dtype, step=reference_steps, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=LR), backward=True)  # noqa: E501  # diffcheck


def reference_steps(model, data, optimizer):
    tokens, targets = data
    for i in range(STEPS):
        dct.step(i)  # diffcheck
        F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()


def after(args):
    return dct.verdict(f"{args.out}/pp", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = parser(__doc__, "dumps/pp_handwritten", dtypes=DTYPES, sketch=False)
    ap.add_argument("--bug", choices=BUGS, help="the pipeline bug to inject")
    a = ap.parse_args()
    launch(work, after, a, a.n)
