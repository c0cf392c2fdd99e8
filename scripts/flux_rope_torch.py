"""FLUX's rotary embedding in PyTorch (float64), shared by the fixture makers
(make_flux_fixture.py, make_pipeline_fixture.py): written after diffusers'
FluxPosEmbed / apply_rotary_emb (use_real=True, repeat_interleave_real=True),
independently of diffcheck's kernels."""
import torch


def flux_rope_tables(txt, img_h, img_w, axes, dtype=torch.float64):
    """cos, sin [N, D]: text tokens at ids (0,0,0), image tokens at (0,row,col);
    per axis theta = 10000^(-2k/dim), each repeated twice."""
    ids = torch.tensor([(0, 0, 0)] * txt + [(0, r, c) for r in range(img_h) for c in range(img_w)], dtype=dtype)
    cos_parts, sin_parts = [], []
    for a, dim in enumerate(axes):
        freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
        ang = torch.outer(ids[:, a], freqs)
        cos_parts.append(ang.cos().repeat_interleave(2, dim=1))
        sin_parts.append(ang.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos_parts, 1), torch.cat(sin_parts, 1)


def apply_rope(x, cos, sin):
    """x [..., N, D]: x cos + rot(x) sin, rot pairing (x[2i], x[2i+1]) -> (-x[2i+1], x[2i])."""
    re, im = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    return x * cos + torch.stack([-im, re], dim=-1).flatten(-2) * sin
