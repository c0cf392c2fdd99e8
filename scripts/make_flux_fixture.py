#!/usr/bin/env python3
"""Make tests/fixtures/flux_block_small.h5: one FLUX.1 single-stream block
computed by PyTorch (float64), written in diffcheck's activation format so the
C++ test can read it with the same reader as everything else.

Written independently of diffcheck's kernels, after diffusers'
FluxSingleTransformerBlock / FluxAttnProcessor / apply_rotary_emb
(use_real=True, repeat_interleave_real=True). Runs in the torch environment (scripts/torch_env.sh):

    .venv/bin/python scripts/make_flux_fixture.py tests/fixtures/flux_block_small.h5
"""
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from flux_rope_torch import apply_rope, flux_rope_tables

torch.manual_seed(0)
DT = torch.float64
d, H, D, M = 32, 4, 8, 128
TXT, IMG_H, IMG_W = 4, 3, 4
AXES = (2, 2, 4)
N = TXT + IMG_H * IMG_W
EPS = 1e-6


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


w = {
    "adaln.w": rnd(3 * d, d, scale=d ** -0.5), "adaln.b": rnd(3 * d, scale=d ** -0.5),
    "q.w": rnd(d, d, scale=d ** -0.5), "q.b": rnd(d, scale=d ** -0.5),
    "k.w": rnd(d, d, scale=d ** -0.5), "k.b": rnd(d, scale=d ** -0.5),
    "v.w": rnd(d, d, scale=d ** -0.5), "v.b": rnd(d, scale=d ** -0.5),
    "mlp.w": rnd(M, d, scale=d ** -0.5), "mlp.b": rnd(M, scale=d ** -0.5),
    "norm_q.w": 1 + rnd(D, scale=0.25), "norm_k.w": 1 + rnd(D, scale=0.25),
    "proj_out.w": rnd(d, d + M, scale=(d + M) ** -0.5), "proj_out.b": rnd(d, scale=(d + M) ** -0.5),
}
h = rnd(N, d)
temb = rnd(1, d)

cos, sin = flux_rope_tables(TXT, IMG_H, IMG_W, AXES)


def rope(x):  # x [B, H, N, D]
    return apply_rope(x, cos, sin)


def rms(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


ada = F.linear(F.silu(temb), w["adaln.w"], w["adaln.b"])
shift, scale, gate = ada.chunk(3, dim=1)
nx = F.layer_norm(h, (d,), eps=EPS) * (1 + scale) + shift
mlp = F.gelu(F.linear(nx, w["mlp.w"], w["mlp.b"]), approximate="tanh")
q = F.linear(nx, w["q.w"], w["q.b"]).view(N, H, D).transpose(0, 1)[None]
k = F.linear(nx, w["k.w"], w["k.b"]).view(N, H, D).transpose(0, 1)[None]
v = F.linear(nx, w["v.w"], w["v.b"]).view(N, H, D).transpose(0, 1)[None]
q, k = rope(rms(q, w["norm_q.w"])), rope(rms(k, w["norm_k.w"]))
# torch 1.13 (Debian 12) has no F.scaled_dot_product_attention; this is its definition.
attn = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, dim=-1) @ v
attn = attn[0].transpose(0, 1).reshape(N, d)
y = F.linear(torch.cat([attn, mlp], dim=-1), w["proj_out.w"], w["proj_out.b"])
out = gate * y + h

with h5py.File(sys.argv[1], "w", track_order=True) as f:
    f.attrs.update({"diffcheck_schema": 1, "mesh": "tp=1", "world_size": 1,
                    "producer": "scripts/make_flux_fixture.py (torch %s)" % torch.__version__})
    f.attrs["sizes"] = f"d={d} H={H} D={D} M={M} txt={TXT} img={IMG_H}x{IMG_W} axes={AXES}"
    taps = {"hidden": h, "temb": temb, **w, "out/adaln": ada, "out/nx": nx, "out/mlp": mlp,
            "out/q": q[0].transpose(0, 1), "out/k": k[0].transpose(0, 1), "out/attn": attn,
            "out/y": y, "out/out": out}
    for name, t in taps.items():
        f.create_dataset(f"taps/{name}", data=t.numpy()[None].astype(np.float64))
