#!/usr/bin/env python3
"""Make tests/fixtures/ring_merge_small.h5: ring attention's log-sum-exp merge
computed by PyTorch in float64. One query block [heads, Sq, D] against three
key/value blocks of uneven lengths: each block's softmax output and LSE
(torch.logsumexp), the running merge in both forms (sigmoid, as yunchang and
flash-attn's ring code write it; max-subtracted exponentials), and exact
attention over all keys. LSEs are head-major [heads, Sq]. Written in
diffcheck's activation format.

    .venv/bin/python scripts/make_ring_merge_fixture.py tests/fixtures/ring_merge_small.h5
"""
import sys

import h5py
import torch
import torch.nn.functional as F

torch.manual_seed(7)
heads, sq, d = 2, 5, 8
lengths = (3, 6, 2)
q = torch.randn(heads, sq, d, dtype=torch.float64)
ks = [torch.randn(heads, n, d, dtype=torch.float64) * d ** -0.5 for n in lengths]
vs = [torch.randn(heads, n, d, dtype=torch.float64) for n in lengths]


def block(q, k, v):
    s = q @ k.transpose(-1, -2)
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


taps = {"q": q}
parts = []
for i, (k, v) in enumerate(zip(ks, vs)):
    taps[f"k{i}"], taps[f"v{i}"] = k, v
    o, l = block(q, k, v)
    taps[f"out{i}"], taps[f"lse{i}"] = o, l
    parts.append((o, l))
out, lse = parts[0]
for o, l in parts[1:]:  # sigmoid form
    out = out - torch.sigmoid(l - lse)[..., None] * (out - o)
    lse = lse - F.logsigmoid(lse - l)
taps["merged_sigmoid"], taps["lse_sigmoid"] = out, lse
out, lse = parts[0]
for o, l in parts[1:]:  # max-subtracted exponentials
    m = torch.maximum(lse, l)
    a, c = torch.exp(lse - m), torch.exp(l - m)
    out = (a[..., None] * out + c[..., None] * o) / (a + c)[..., None]
    lse = m + torch.log(a + c)
taps["merged_maxexp"], taps["lse_maxexp"] = out, lse
taps["exact"], taps["lse_exact"] = block(q, torch.cat(ks, dim=1), torch.cat(vs, dim=1))
with h5py.File(sys.argv[1], "w", track_order=True) as f:
    f.attrs.update({"diffcheck_schema": 1, "mesh": "sp=1", "world_size": 1,
                    "producer": "scripts/make_ring_merge_fixture.py (torch %s)" % torch.__version__})
    for name, t in taps.items():
        f.create_dataset(f"taps/{name}", data=t.numpy()[None])
