#!/usr/bin/env python3
"""Make tests/fixtures/flux_pipeline_small.h5: a tiny FLUX-style denoising
pipeline computed by PyTorch in float64 (three flow-match Euler steps with
classifier-free guidance over a two-block single-stream transformer), written
in diffcheck's activation format for the C++ test (tests/test_pipeline.cpp).

Written independently of diffcheck's kernels, after diffusers'
FlowMatchEulerDiscreteScheduler (dynamic shifting, calculate_shift),
Timesteps/TimestepEmbedding, FluxSingleTransformerBlock, AdaLayerNormContinuous
and the CFG combine of its pipelines. Weights are float32 values (the C++
side takes them through its float generator hook). Runs in the torch environment (scripts/torch_env.sh):

    .venv/bin/python scripts/make_pipeline_fixture.py tests/fixtures/flux_pipeline_small.h5
"""
import math
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from flux_rope_torch import apply_rope, flux_rope_tables

torch.manual_seed(0)
DT = torch.float64
d, H, D, M = 32, 4, 8, 64
TXT, IMG_H, IMG_W, C = 4, 2, 4, 8
I = IMG_H * IMG_W
AXES = (2, 2, 4)
FREQ, BLOCKS, STEPS, G = 16, 2, 3, 3.0
EPS = 1e-6


def rnd(*shape, scale=1.0):  # float32-representable values
    return ((torch.rand(*shape, dtype=DT) * 2 - 1) * scale).float().double()


w = {}
def lin(name, out, inp):
    w[name + ".w"] = rnd(out, inp, scale=inp ** -0.5)
    w[name + ".b"] = rnd(out, scale=inp ** -0.5)


lin("img_in", d, C)
lin("txt_in", d, d)
lin("time.l1", d, FREQ)
lin("time.l2", d, d)
lin("pooled", d, d)
lin("norm_out", 2 * d, d)
lin("proj", C, d)
for k in range(BLOCKS):
    p = f"block{k}."
    lin(p + "adaln", 3 * d, d)
    for name in ("q", "k", "v"):
        lin(p + name, d, d)
    lin(p + "mlp", M, d)
    w[p + "norm_q.w"] = rnd(D, scale=0.25)  # the gain is 1 + this, formed in float32
    w[p + "norm_k.w"] = rnd(D, scale=0.25)
    w[p + "proj_out.w"] = rnd(d, d + M, scale=(d + M) ** -0.5)
    w[p + "proj_out.b"] = rnd(d, scale=(d + M) ** -0.5)
inputs = {"noise": rnd(I, C), "prompt": rnd(TXT, d), "empty_prompt": rnd(TXT, d),
          "pooled_prompt": rnd(d), "pooled_empty": rnd(d)}

# Schedule: FlowMatchEulerDiscreteScheduler.set_timesteps with dynamic shifting.
mu = I * (1.15 - 0.5) / (4096 - 256) + (0.5 - 256 * (1.15 - 0.5) / (4096 - 256))
hat = torch.linspace(1.0, 1.0 / STEPS, STEPS, dtype=DT)
sigmas = math.exp(mu) / (math.exp(mu) + (1 / hat - 1))
sigmas = torch.cat([sigmas, torch.zeros(1, dtype=DT)])

cos, sin = flux_rope_tables(TXT, IMG_H, IMG_W, AXES)


def rope(x):  # [H, N, D]
    return apply_rope(x, cos, sin)


def rms(x, gain):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1 + gain.float()).double()


def linear(x, name):
    return F.linear(x, w[name + ".w"], w[name + ".b"])


def temb_of(t, pooled):
    half = FREQ // 2
    f = torch.exp(-math.log(10000) * torch.arange(half, dtype=DT) / half)
    s = torch.cat([torch.cos(t * f), torch.sin(t * f)])[None]
    return linear(F.silu(linear(s, "time.l1")), "time.l2") + linear(pooled[None], "pooled")


def block(h, temb, p):
    n = h.shape[0]
    shift, scale, gate = linear(F.silu(temb), p + "adaln").chunk(3, dim=1)
    nx = F.layer_norm(h, (d,), eps=EPS) * (1 + scale) + shift
    mlp = F.gelu(linear(nx, p + "mlp"), approximate="tanh")
    q, k, v = (linear(nx, p + x).view(n, H, D).transpose(0, 1) for x in ("q", "k", "v"))
    q, k = rope(rms(q, w[p + "norm_q.w"])), rope(rms(k, w[p + "norm_k.w"]))
    attn = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, dim=-1) @ v
    attn = attn.transpose(0, 1).reshape(n, d)
    return gate * linear(torch.cat([attn, mlp], dim=-1), p + "proj_out") + h


def velocity(x, txt, temb):
    h = torch.cat([linear(txt, "txt_in"), linear(x, "img_in")])
    for k in range(BLOCKS):
        h = block(h, temb, f"block{k}.")
    scale, shift = linear(F.silu(temb), "norm_out").chunk(2, dim=1)
    return linear(F.layer_norm(h[TXT:], (d,), eps=EPS) * (1 + scale) + shift, "proj")


out = {"sigmas": sigmas}
x = inputs["noise"]
for t in range(STEPS):
    ts = 1000 * sigmas[t]
    vc = velocity(x, inputs["prompt"], temb_of(ts, inputs["pooled_prompt"]))
    vu = velocity(x, inputs["empty_prompt"], temb_of(ts, inputs["pooled_empty"]))
    v = vu + G * (vc - vu)
    x = x + (sigmas[t + 1] - sigmas[t]) * v
    out.update({f"step{t}/v_cond": vc, f"step{t}/v_uncond": vu, f"step{t}/v": v, f"step{t}/latents_out": x})

with h5py.File(sys.argv[1], "w", track_order=True) as f:
    f.attrs.update({"diffcheck_schema": 1, "mesh": "tp=1", "world_size": 1,
                    "producer": "scripts/make_pipeline_fixture.py (torch %s)" % torch.__version__})
    f.attrs["sizes"] = (f"d={d} H={H} D={D} M={M} txt={TXT} img={IMG_H}x{IMG_W} C={C} axes={AXES} freq={FREQ} "
                        f"blocks={BLOCKS} steps={STEPS} g={G}")
    for name, t in {**w, **inputs, **{"out/" + k: v for k, v in out.items()}}.items():
        f.create_dataset(f"taps/{name}", data=t.numpy()[None].astype(np.float64))
