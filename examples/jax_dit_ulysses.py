#!/usr/bin/env python3
"""A Wan/FLUX-style DiT block in Flax NNX with Ulysses sequence parallelism,
checked by diffcheck.jax: tokens split over `sp`, samples over `dp`; the
attention's all-to-all (shard_map + lax.all_to_all) turns the sequence split
into a head split and back. ULYSSES_ATTENTION_CHUNKS=c (the environment, as
MaxDiffusion PR #428) runs it as c head-group passes, numerically the same.

    python3 examples/jax_dit_ulysses.py --mesh dp=2,sp=4 [--bug] [--dtype bfloat16] [--train] [SETTINGS...]

SETTINGS are words a flag bisect passes: `--xla_...=...` go to XLA_FLAGS,
`NAME=VALUE` to the environment. --bug reassembles the head groups in the
wrong order, which only the chunked path has: diffcheck names `attn` (the
first tap after the reassembly), and `diffcheck bisect --flags
ULYSSES_ATTENTION_CHUNKS=2,... -- python3 examples/jax_dit_ulysses.py --bug
{flags}` names the setting. --train checks an optax SGD step too (its
parameters' gradients and updated values). Every submodule's output is a
tap under its path; no layout is written. Exit 1 on a divergence.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _jax_devices import apply_settings, mesh_devices, mesh_of, use_cpu_devices  # noqa: E402

ARGV = apply_settings(sys.argv[1:])
use_cpu_devices(mesh_devices(ARGV, 8))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402  # diffcheck

B, S, D, HEADS = 2, 64, 64, 8
SEQ, HEAD_SPLIT = P("dp", "sp", None, None), P("dp", None, "sp", None)


def all_to_all(x, seq_to_heads):
    """[B, S, H, Dh]: the sequence split over sp becomes a head split (or back)."""
    split, concat = (2, 1) if seq_to_heads else (1, 2)
    return jax.shard_map(lambda t: jax.lax.all_to_all(t, "sp", split, concat, tiled=True),
                         in_specs=SEQ if seq_to_heads else HEAD_SPLIT,
                         out_specs=HEAD_SPLIT if seq_to_heads else SEQ)(x)


class UlyssesAttention(nnx.Module):
    """softmax(q k^T / sqrt(Dh)) v over all tokens, each device its heads."""

    def __init__(self, bug):
        self.bug = bug

    def __call__(self, q, k, v):
        chunks = int(os.environ.get("ULYSSES_ATTENTION_CHUNKS", "1"))
        per = q.shape[2] // chunks
        outs = []
        for g in range(chunks):
            qg, kg, vg = (all_to_all(t[:, :, g * per:(g + 1) * per], True) for t in (q, k, v))
            w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", qg, kg) / qg.shape[-1] ** 0.5, axis=-1)
            outs.append(jnp.einsum("bhqk,bkhd->bqhd", w, vg))
        if self.bug and chunks > 1:  # the bug: the groups' local heads joined, then one all-to-all back,
            return jax.shard_map(  # which interleaves the groups' heads across the sp ranks
                lambda *gs: jax.lax.all_to_all(jnp.concatenate(gs, axis=2), "sp", 1, 2, tiled=True),
                in_specs=(HEAD_SPLIT,) * chunks, out_specs=SEQ)(*outs)
        return jnp.concatenate([all_to_all(o, False) for o in outs], axis=2)


class DiTBlock(nnx.Module):
    """adaLN-modulated attention and MLP, as a DiT block."""

    def __init__(self, rngs, bug=False):
        self.ada = nnx.Linear(D, 6 * D, rngs=rngs)
        self.norm1 = nnx.LayerNorm(D, use_scale=False, use_bias=False, rngs=rngs)
        self.qkv = nnx.Linear(D, 3 * D, rngs=rngs)
        self.attn = UlyssesAttention(bug)
        self.proj = nnx.Linear(D, D, rngs=rngs)
        self.norm2 = nnx.LayerNorm(D, use_scale=False, use_bias=False, rngs=rngs)
        self.fc1 = nnx.Linear(D, 4 * D, rngs=rngs)
        self.fc2 = nnx.Linear(4 * D, D, rngs=rngs)

    def __call__(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(self.ada(c)[:, None, :], 6, axis=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = (t.reshape(*t.shape[:2], HEADS, D // HEADS) for t in jnp.split(self.qkv(h), 3, axis=-1))
        a = self.attn(q, k, v)
        x = x + gate1 * self.proj(a.reshape(x.shape))
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.fc2(jax.nn.gelu(self.fc1(h)))


def train_step(model, x, c, target):
    """One SGD step on the mean squared error; returns the loss."""
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x, c) - target) ** 2))(model)
    dcj.tap("param_grad", nnx.state(grads, nnx.Param))  # diffcheck
    optimizer.update(model, grads)
    dcj.tap("param", nnx.state(model, nnx.Param))  # diffcheck
    return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mesh", default="dp=2,sp=4", help="the mesh over dp and sp (default dp=2,sp=4)")
    ap.add_argument("--bug", action="store_true", help="reassemble the head groups out of order")
    ap.add_argument("--train", action="store_true", help="check an optax SGD step, not the forward")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the run's dtype")
    ap.add_argument("--reference-cache", metavar="DIR",
                    help="read the one-device runs from DIR when made before for this program and these inputs "
                         "(under other XLA flags: a flag bisect's baseline makes them), else keep them there")
    ap.add_argument("--sketch", action="store_true",
                    help="capture each device's sketches, not whole tensors (docs/jax.md, \"Sketch mode\")")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "diffcheck-jax-dit"),
                    help="directory of the activation files")
    args = ap.parse_args(ARGV)
    mesh = mesh_of(args.mesh, ("dp", "sp"))
    chunks = int(os.environ.get("ULYSSES_ATTENTION_CHUNKS", "1"))
    if HEADS % (mesh.shape["sp"] * chunks) or B % mesh.shape["dp"] or S % mesh.shape["sp"]:
        ap.error(f"--mesh {args.mesh} with ULYSSES_ATTENTION_CHUNKS={chunks}: each head group ({HEADS} heads / "
                 f"{chunks}) must split over sp, {B} samples over dp and {S} tokens over sp")
    dtype = getattr(jnp, args.dtype)
    rng = np.random.default_rng(0)  # weights and inputs drawn by NumPy: the same under any XLA flags
    put = lambda a, spec: jax.device_put(jnp.asarray(a, jnp.float32).astype(dtype), NamedSharding(mesh, spec))  # noqa: E731,E501
    with jax.set_mesh(mesh):
        model = nnx.eval_shape(lambda: DiTBlock(nnx.Rngs(1), bug=args.bug))  # shapes only: NumPy fills them
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda w: put(rng.standard_normal(w.shape) / w.shape[0] ** 0.5, P()), params))
        x = put(rng.standard_normal((B, S, D)), P("dp", "sp", None))
        c = put(rng.standard_normal((B, D)), P("dp", None))
        target = put(rng.standard_normal((B, S, D)), P("dp", "sp"))
    step = (lambda m, x, c, t: train_step(m, x, c, t)) if args.train else None
    return dcj.verdict(model, x, c, *((target,) if args.train else ()), reference_cache=args.reference_cache, out=os.path.join(args.out, "run"), mesh=mesh, step=step, backward=args.train, sketch=args.sketch)  # noqa: E501  # diffcheck


if __name__ == "__main__":
    sys.exit(main())
