#!/usr/bin/env python3
"""JAX issue #40034's pattern, checked by diffcheck.jax: a matmul whose
contraction is sharded over dp, fsdp and sp gives an unreduced result
(`out_sharding=P(None, "tp", unreduced={"dp", "fsdp", "sp"})`), which is
resharded to rows over fsdp*sp, columns over tp, replicated over dp.

    python3 examples/jax_reshard.py --mesh dp=2,fsdp=2,sp=1,tp=2 [--bug] [--dtype bfloat16]

In the real bug XLA's partitioner left the all-reduce out at some device
counts only; jax 0.10.2 on the CPU does it right. --bug puts the fault in by
hand where the dp axis has size 2, as the bug report saw it: the reduction
over dp is left out (each dp replica keeps its own partial sum). diffcheck
finds it at `result`, with the dp replicas disagreeing; on meshes with
another dp the run passes. No layout is written: each tap's comes from its
sharding. The lines diffcheck adds end in `# diffcheck`; exit 1 when it
finds a divergence.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _jax_devices import mesh_devices, mesh_of, use_cpu_devices  # noqa: E402

AXES = ("dp", "fsdp", "sp", "tp")
use_cpu_devices(mesh_devices(sys.argv, 8))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402  # diffcheck

CONTRACTED = ("dp", "fsdp", "sp")


def reduction_left_out_over_dp(a, b):
    """The result as the buggy partitioner made it: summed over fsdp and sp
    only, each dp replica holding its own partial sum (shard_map's out_specs
    say dp-replicated; check_vma=False lets the lie through, as XLA did)."""
    def local(a, b):
        part = jax.lax.psum(a @ b, ("fsdp", "sp"))
        rows = part.shape[0] // (jax.lax.axis_size("fsdp") * jax.lax.axis_size("sp"))
        block = jax.lax.axis_index("fsdp") * jax.lax.axis_size("sp") + jax.lax.axis_index("sp")
        return jax.lax.dynamic_slice_in_dim(part, block * rows, rows, 0)
    return jax.shard_map(local, in_specs=(P(None, CONTRACTED), P(CONTRACTED, "tp")),
                         out_specs=P(("fsdp", "sp"), "tp"), check_vma=False)(a, b)


def reduced_by_hand(a, b):
    """The same result with its reductions written out, as hand-sharded code
    does: each device's partial product, a reduce-scatter over (fsdp, sp) and
    an all-reduce over dp, each in the run's dtype (--shard-map)."""
    def local(a, b):
        part = jax.lax.psum_scatter(a @ b, ("fsdp", "sp"), scatter_dimension=0, tiled=True)
        return jax.lax.psum(part, "dp")
    return jax.shard_map(local, in_specs=(P(None, CONTRACTED), P(CONTRACTED, "tp")),
                         out_specs=P(("fsdp", "sp"), "tp"))(a, b)


def make_forward(bug, by_hand=False):
    def forward(a, b, w):
        partial = dcj.tap("partial", jnp.einsum("mk,kn->mn", a, b, out_sharding=P(None, "tp", unreduced=set(CONTRACTED))))  # noqa: E501  # diffcheck
        if bug and jax.sharding.get_abstract_mesh().shape["dp"] == 2:
            result = reduction_left_out_over_dp(a, b)
        elif by_hand:
            result = reduced_by_hand(a, b)
        else:
            result = jax.sharding.reshard(partial, P(("fsdp", "sp"), "tp"))
        result = dcj.tap("result", result)  # diffcheck
        hidden = dcj.tap("activated", jax.nn.gelu(result))  # diffcheck
        return jnp.einsum("mn,nd->md", hidden, w, out_sharding=P(("fsdp", "sp"), None))
    return forward


def inputs(mesh, dtype, seed, m=64, k=256, n=128):
    """Drawn by NumPy, not on the devices: the same under any XLA flags."""
    rng = np.random.default_rng(seed)
    put = lambda x, spec: jax.device_put(jnp.asarray(x, jnp.float32).astype(dtype), NamedSharding(mesh, spec))  # noqa: E731,E501
    return (put(rng.standard_normal((m, k)), P(None, CONTRACTED)),
            put(rng.standard_normal((k, n)) / k ** 0.5, P(CONTRACTED, "tp")),
            put(rng.standard_normal((n, 32)) / n ** 0.5, P("tp", None)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mesh", default="dp=2,fsdp=2,sp=1,tp=2",
                    help=f"the mesh over the axes {','.join(AXES)} (missing ones size 1; default dp=2,fsdp=2,sp=1,tp=2)")
    ap.add_argument("--bug", action="store_true", help="leave the reduction over dp out where dp has size 2")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the run's dtype")
    ap.add_argument("--reference-cache", metavar="DIR",
                    help="read the one-device runs from DIR when made before for this program and these inputs "
                         "(under other XLA flags: a flag bisect's baseline makes them), else keep them there")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "diffcheck-jax-reshard"),
                    help="directory of the activation files")
    ap.add_argument("--no-reference", action="store_true",
                    help="capture the sharded run only, for `diffcheck compare RUN --against OTHER_RUN`")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    ap.add_argument("--shard-map", action="store_true",
                    help="reduce by hand in a shard_map (psum_scatter over fsdp, sp; psum over dp) instead of reshard")
    ap.add_argument("--sketch", action="store_true",
                    help="capture each device's sketches, not whole tensors (docs/jax.md, \"Sketch mode\")")
    args = ap.parse_args()
    mesh = mesh_of(args.mesh, AXES)
    a, b, w = inputs(mesh, getattr(jnp, args.dtype), args.seed)
    out = os.path.join(args.out, "run")
    if args.no_reference:
        with dcj.capture(jax.jit(make_forward(args.bug, args.shard_map)), out, mesh) as run:  # diffcheck
            run(a, b, w)
        print(f"captured {out} on {args.mesh} with no reference: diffcheck compare {out} --against OTHER_RUN")
        return 0
    return dcj.verdict(jax.jit(make_forward(args.bug, args.shard_map)), a, b, w, reference_cache=args.reference_cache, out=out, mesh=mesh, sketch=args.sketch)  # noqa: E501  # diffcheck


if __name__ == "__main__":
    sys.exit(main())
