"""The attention block the sequence-parallel library examples share
(deepspeed_ulysses.py, yunchang_usp.py): a pre-norm attention on
[batch, sequence, model] activations whose attention module the library
provides, its weights and inputs drawn the same in every process."""
import torch
import torch.nn as nn
import torch.nn.functional as F

B, S, D, HEADS = 2, 16, 32, 4
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class SdpaAttention(nn.Module):
    """Attention over [b, s, heads, d] (the libraries' layout), with torch's SDPA."""

    def forward(self, q, k, v, *ignored):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


class Block(nn.Module):
    """x + proj(attn(q, k, v, *attn_args)); roll_keys: a rank's key heads rolled by one (a fault)."""

    def __init__(self, attn, attn_args=()):
        super().__init__()
        self.norm, self.qkv, self.attn, self.proj = nn.LayerNorm(D), nn.Linear(D, 3 * D), attn, nn.Linear(D, D)
        self.attn_args, self.roll_keys = tuple(attn_args), False

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, HEADS, D // HEADS).unbind(2)
        if self.roll_keys:
            k = k.roll(1, dims=2)
        return x + self.proj(self.attn(q, k, v, *self.attn_args).reshape(b, s, D))


def weights(block):
    torch.manual_seed(0)
    for p in block.parameters():
        with torch.no_grad():
            p.copy_(torch.randn_like(p) * 0.2)
    return block


def data():
    return torch.randn(B, S, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
