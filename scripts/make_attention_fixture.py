#!/usr/bin/env python3
"""Make tests/fixtures/attention_small.h5: softmax(q kᵀ) v computed by PyTorch in
float64 for [heads, N, D] inputs whose length is not a multiple of the flash
block sizes tested. Written in diffcheck's activation format.

    .venv/bin/python scripts/make_attention_fixture.py tests/fixtures/attention_small.h5
"""
import sys

import h5py
import torch

torch.manual_seed(1)
heads, nq, nk, d = 3, 37, 45, 8
q = torch.randn(heads, nq, d, dtype=torch.float64)
k = torch.randn(heads, nk, d, dtype=torch.float64) * d ** -0.5  # pre-scaled, as Ulysses passes it
v = torch.randn(heads, nk, d, dtype=torch.float64)
out = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
with h5py.File(sys.argv[1], "w", track_order=True) as f:
    f.attrs.update({"diffcheck_schema": 1, "mesh": "sp=1", "world_size": 1,
                    "producer": "scripts/make_attention_fixture.py (torch %s)" % torch.__version__})
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        f.create_dataset(f"taps/{name}", data=t.numpy()[None])
