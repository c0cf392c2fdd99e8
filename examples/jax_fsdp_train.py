#!/usr/bin/env python3
"""An optax training step on FSDP-sharded parameters, checked by diffcheck.jax.

    python3 examples/jax_fsdp_train.py --mesh dp=2,fsdp=2 [--bug] [--dtype bfloat16] [SETTINGS...]

An MLP's weights are split over `fsdp` (rows); the batch over dp and fsdp.
The gradients are computed per device in a shard_map: weights all-gathered
over fsdp, local gradients reduce-scattered over fsdp and summed over dp,
then Adam updates each device's rows. The mesh's axes are Auto (XLA places
what the shard_map does not), so this is also the GSPMD style of sharding.
--bug leaves the sum over dp out: each dp replica steps with its own half of
the batch's gradient. diffcheck names `param_grad/w1` (the dp replicas
DIFFER), and the parameters after the step. SETTINGS: `--xla_...` words go
to XLA_FLAGS (for `diffcheck bisect ... {flags}`). Exit 1 on a divergence.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _jax_devices import apply_settings, mesh_devices, use_cpu_devices  # noqa: E402

ARGV = apply_settings(sys.argv[1:])
use_cpu_devices(mesh_devices(ARGV, 4))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402  # diffcheck

BATCH, D, F = 32, 64, 256
ROWS = {"w1": P("fsdp", None), "w2": P("fsdp", None)}
DATA = P(("dp", "fsdp"), None)


def forward(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def loss_fn(params, x, y):
    return jnp.mean((forward(params, x) - y) ** 2)


def make_step(bug, optimizer):
    def local_grads(params, x, y):
        whole = {k: jax.lax.all_gather(w, "fsdp", axis=0, tiled=True) for k, w in params.items()}
        loss, g = jax.value_and_grad(loss_fn)(whole, x, y)
        n = jax.lax.axis_size("dp") * jax.lax.axis_size("fsdp")
        g = {k: jax.lax.psum_scatter(v, "fsdp", scatter_dimension=0, tiled=True) / n for k, v in g.items()}
        if not bug:
            g = jax.lax.psum(g, "dp")  # --bug: left out
        return jax.lax.pmean(loss, ("dp", "fsdp")), g

    def step(params, opt_state, x, y):
        dcj.tap("out", forward(params, x))  # diffcheck
        loss, grads = jax.shard_map(local_grads, in_specs=(ROWS, DATA, DATA), out_specs=(P(), ROWS),
                                    check_vma=False)(params, x, y)
        dcj.tap("param_grad", grads)  # diffcheck
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = dcj.tap("param", optax.apply_updates(params, updates))  # diffcheck
        return params, opt_state, loss
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mesh", default="dp=2,fsdp=2", help="dp=A,fsdp=B (default dp=2,fsdp=2)")
    ap.add_argument("--bug", action="store_true", help="leave the gradients' sum over dp out")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the run's dtype")
    ap.add_argument("--sketch", action="store_true",
                    help="capture each device's sketches, not whole tensors (docs/jax.md, \"Sketch mode\")")
    ap.add_argument("--reference-cache", metavar="DIR",
                    help="read the one-device runs from DIR when made before for this program and these inputs "
                         "(under other XLA flags: a flag bisect's baseline makes them), else keep them there")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "diffcheck-jax-fsdp"),
                    help="directory of the activation files")
    args = ap.parse_args(ARGV)
    sizes = dict(part.split("=") for part in args.mesh.split(","))
    dp, fsdp = int(sizes.get("dp", 1)), int(sizes.get("fsdp", 1))
    mesh = jax.make_mesh((dp, fsdp), ("dp", "fsdp"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[:dp * fsdp])
    dtype = getattr(jnp, args.dtype)
    rng = np.random.default_rng(0)  # NumPy's draws: the same under any XLA flags
    put = lambda a, spec: jax.device_put(jnp.asarray(a, jnp.float32).astype(dtype), NamedSharding(mesh, spec))  # noqa: E731,E501
    params = {"w1": put(rng.standard_normal((D, F)) / D ** 0.5, ROWS["w1"]),
              "w2": put(rng.standard_normal((F, D)) / F ** 0.5, ROWS["w2"])}
    x, y = put(rng.standard_normal((BATCH, D)), DATA), put(rng.standard_normal((BATCH, D)), DATA)
    optimizer = optax.adam(1e-2)
    opt_state = jax.jit(optimizer.init)(params)
    return dcj.verdict(jax.jit(make_step(args.bug, optimizer)), params, opt_state, x, y, reference_cache=args.reference_cache, out=os.path.join(args.out, "run"), mesh=mesh, sketch=args.sketch)  # noqa: E501  # diffcheck


if __name__ == "__main__":
    sys.exit(main())
