#!/usr/bin/env python3
"""A CFG-parallel denoising loop with sequence parallelism, checked step by step.

    mpirun -n 4 python3 examples/cfg_denoise.py [--bug]          # mesh cfg=2,sp=2
    python3 examples/cfg_denoise.py -n 2 [--bug]                 # mesh cfg=2, torch.multiprocessing

cfg rank 0 computes the unconditional branch, cfg rank 1 the conditional one,
each over its sp share of the image tokens (the attention all-gathers K and V
over sp). After the model the two predictions are all-gathered over cfg,
combined with the guidance scale, and every rank takes the Euler step on its
tokens. The reference is the single-device way (as in diffusers): one
process, float64, both branches as one batch [uncond; cond]; the same in
float32, captured beside it, is each tap's yardstick (the error a correct
float32 run has), which diffcheck compare finds there.

--bug: each step's timestep is broadcast from rank 0 into a temporary
(`dist.broadcast(t.clone(), 0)`, the bug of timestep_broadcast in diffcheck's
seeds): the other ranks keep the first step's timestep. Step 0 is right;
diffcheck names `step1/time_embed`, on ranks 1 and up.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import launch, require_dtype  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck

B, S, C, D, T, HEADS, BLOCKS, STEPS, GUIDANCE = 1, 16, 8, 32, 4, 4, 2, 4, 4.0  # --tokens, --dim change S and D
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

SEED = 0  # --seed: of the weights, the noise and the prompts


def set_size(args, world=1):
    """The model's size from the command line (every process: spawned ones import this file afresh)."""
    global S, D, SEED
    SEED = args.seed
    sp = max(world // 2, 1)
    if args.tokens % sp or args.dim % HEADS:
        raise SystemExit(f"cfg_denoise: --tokens must be a multiple of the sp ranks ({sp}), --dim of {HEADS}")
    S, D = args.tokens, args.dim
LAYOUTS = {"time_embed*": "cfg,-", "*.mod": "cfg,-", "text_in": "cfg,-,-", "*.add_[kv]": "cfg,-,-", "*": "cfg,sp,-"}  # diffcheck


class Groups:
    """The process groups of mesh cfg x sp (sp changes fastest); None at one rank."""

    def __init__(self, rank, world, cfg):
        sp = world // cfg
        self.world, self.cfg, self.sp = world, cfg, sp
        self.cfg_rank, self.sp_rank = rank // sp, rank % sp
        self.sp_group = self.cfg_group = None
        if world > 1:
            for c in range(cfg):  # every rank creates every group, in the same order
                g = dist.new_group([c * sp + s for s in range(sp)])
                if c == self.cfg_rank:
                    self.sp_group = g
            for s in range(sp):
                g = dist.new_group([c * sp + s for c in range(cfg)])
                if s == self.sp_rank:
                    self.cfg_group = g


def gather(x, group, n, dim):
    """gloo (torch 1.13) moves no bfloat16: such pieces travel as float32, exactly."""
    if n == 1:
        return x
    wide = x.float() if x.dtype == torch.bfloat16 else x
    parts = [torch.empty_like(wide) for _ in range(n)]
    dist.all_gather(parts, wide.contiguous(), group=group)
    return torch.cat(parts, dim).to(x.dtype)


def broadcast_timestep(t, bug):
    """Rank 0's t to every rank, in place; --bug: into a temporary, t unchanged."""
    wide = t.to(torch.float32, copy=True)  # gloo moves no bfloat16
    dist.broadcast(wide, src=0)
    if not bug:
        t.copy_(wide)


class TimeEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(64, D), nn.SiLU(), nn.Linear(D, D))

    def forward(self, t):
        freqs = torch.exp(-math.log(10000) * torch.arange(32, dtype=t.dtype) / 32)
        angles = t[:, None] * freqs[None]
        return self.mlp(torch.cat([angles.cos(), angles.sin()], -1))


class Attention(nn.Module):
    """This rank's image tokens attend to the text and to every image token (K, V gathered over sp)."""

    def __init__(self, groups):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.add_k, self.add_v = nn.Linear(D, D), nn.Linear(D, D)  # the text's keys and values
        self.groups = groups

    def forward(self, x, text):
        g = self.groups
        k = torch.cat([self.add_k(text), gather(self.k(x), g.sp_group, g.sp, 1)], 1)
        v = torch.cat([self.add_v(text), gather(self.v(x), g.sp_group, g.sp, 1)], 1)

        def heads(t):
            return t.view(t.shape[0], t.shape[1], HEADS, -1).transpose(1, 2)
        o = F.softmax(heads(self.q(x)) @ heads(k).transpose(-1, -2) / (D // HEADS) ** 0.5, -1) @ heads(v)
        return self.o(o.transpose(1, 2).reshape(x.shape))


class Block(nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.mod = nn.Linear(D, 2 * D)  # adaLN: shift and scale from the timestep
        self.norm = nn.LayerNorm(D, elementwise_affine=False)
        self.attn = Attention(groups)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, text, temb):
        shift, scale = self.mod(F.silu(temb))[:, None].chunk(2, -1)
        x = x + self.attn(self.norm(x) * (1 + scale) + shift, text)
        return x + self.mlp(self.norm(x))


class Denoiser(nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.x_in, self.text_in, self.time_embed = nn.Linear(C, D), nn.Linear(D, D), TimeEmbed()
        self.blocks = nn.ModuleList(Block(groups) for _ in range(BLOCKS))
        self.out = nn.Linear(D, C)

    def forward(self, x, text, t):
        temb, text, x = self.time_embed(t), self.text_in(text), self.x_in(x)
        for block in self.blocks:
            x = block(x, text, temb)
        return self.out(x)


def inputs():
    """Weights, the noise, the negative and the positive prompt embeddings (float64)."""
    torch.manual_seed(SEED)
    model = Denoiser(Groups(0, 1, 1)).double()
    g = torch.Generator().manual_seed(SEED + 1)
    noise, prompts = torch.randn(B, S, C, generator=g, dtype=torch.float64), \
        torch.randn(2, B, T, D, generator=g, dtype=torch.float64)
    return model.state_dict(), noise, prompts


SIGMAS = [1.0 - i / STEPS for i in range(STEPS + 1)]


def denoise(model, x, text, rank, g, bug=False):
    """The sampling loop. With cfg > 1 each cfg rank runs one branch and the
    predictions are gathered; at cfg = 1 the batch holds both branches."""
    t = torch.full((1,), SIGMAS[0], dtype=x.dtype)  # every rank starts from the first timestep
    for i in range(STEPS):
        dct.step(i)  # diffcheck
        if rank == 0:
            t = torch.full((1,), SIGMAS[i], dtype=x.dtype)  # rank 0 owns the scheduler
        if g.world > 1:
            broadcast_timestep(t, bug)  # --bug: into a temporary
        pred = model(x if g.cfg > 1 else torch.cat([x, x]), text, t.expand(text.shape[0]))
        if g.cfg > 1:
            pred = gather(pred, g.cfg_group, g.cfg, 0)
        uncond, cond = pred.chunk(2)
        x = x + (SIGMAS[i + 1] - SIGMAS[i]) * (uncond + GUIDANCE * (cond - uncond))
        dct.tap("latents", x, spec="-,sp,-")  # diffcheck
    return x


def work(rank, world, args):
    """Every rank: its branch and tokens of every step in --dtype; rank 0 also the reference and the one-device run."""
    set_size(args, world)
    dtype = DTYPES[args.dtype]
    g = Groups(rank, world, 2 if world > 1 else 1)
    weights, noise, prompts = inputs()
    model = Denoiser(g)
    model.load_state_dict(weights)
    model.to(dtype)
    tokens = slice(g.sp_rank * S // g.sp, (g.sp_rank + 1) * S // g.sp)
    text = prompts[g.cfg_rank] if g.cfg > 1 else prompts.reshape(2 * B, T, D)
    with dct.capture(model, out=f"{args.out}/cfg", mesh=f"cfg={g.cfg},sp={g.sp}", layouts=LAYOUTS, sketch=args.sketch):  # diffcheck
        denoise(model, noise[:, tokens].to(dtype), text.to(dtype), rank, g, args.bug)  # diffcheck
    if not args.no_reference:  # rank 0: the unsharded model in float64, and in --dtype (each tap's yardstick)
        single = Groups(0, 1, 1)

        def unsharded(dt):
            model = Denoiser(single)
            model.load_state_dict(weights)
            return model.to(dt), (noise.to(dt), prompts.reshape(2 * B, T, D).to(dt))
        dct.references(unsharded, f"{args.out}/ref", dtype=dtype, step=lambda m, xt: denoise(m, *xt, 0, single), sketch=args.sketch)  # noqa: E501  # diffcheck


def after(args):
    if args.no_reference:  # compared with other runs (docs/torch.md, "Without a reference")
        print(f"captured {args.out}/cfg with no reference: diffcheck compare {args.out}/cfg --against OTHER_RUN")
        return 0
    return dct.verdict(f"{args.out}/cfg", reference=f"{args.out}/ref.h5")  # diffcheck


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=4, help="processes to start when not under mpirun: 1, 2 or an even "
                    "number (cfg=2, sp=n/2; default 4)")
    ap.add_argument("--bug", action="store_true", help="broadcast each step's timestep into a temporary")
    ap.add_argument("--out", default="dumps/cfg_denoise", help="directory of the activation files")
    ap.add_argument("--sketch", action="store_true", help="capture sketches, not whole tensors (docs/torch.md, 'Sketch mode')")
    ap.add_argument("--no-reference", action="store_true",
                    help="capture the sharded run only, for `diffcheck compare RUN --against OTHER_RUN`")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    ap.add_argument("--tokens", type=int, default=S, help=f"image tokens (default {S})")
    ap.add_argument("--dim", type=int, default=D, help=f"model width D (default {D}); the MLP is 4 D")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="the run's dtype (default float32)")
    a = ap.parse_args()
    require_dtype(ap, a.dtype, DTYPES[a.dtype])
    set_size(a)
    launch(work, after, a, a.n)
