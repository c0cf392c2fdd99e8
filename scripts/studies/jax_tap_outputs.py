#!/usr/bin/env python3
"""Do a capture's extra outputs change a JAX program? Runs a medium MLP block
(tokens x width, GELU, 4x hidden, tensor parallel over 8 CPU devices),
jitted, with and without diffcheck.jax taps as outputs, and reports:
  - whether the result is bitwise the same (XLA may fuse differently when an
    intermediate must also be written out);
  - the time per call of the plain jitted function and of the jitted
    function with its taps as outputs (paired, median of --repeats), and of
    the whole capture (taps written to rank files).
    .venv/bin/python scripts/studies/jax_tap_outputs.py [--tokens 2048 --width 1024]"""
import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402
from diffcheck import jax_taps  # noqa: E402


def block(x, w1, w2):
    h = dcj.tap("up", x @ w1)
    a = dcj.tap("act", jax.nn.gelu(h))
    y = dcj.tap("down", jnp.einsum("tf,fd->td", a, w2, out_sharding=P(None, None)))
    return dcj.tap("out", x + y)


def with_tap_outputs(*args):
    c = jax_taps.Collector(["*"], [])
    with jax_taps.collecting(c):
        out = block(*args)
    return out, c.outputs()


def timed(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    mesh = jax.make_mesh((8,), ("tp",))
    k = jax.random.split(jax.random.key(0), 3)
    t, d = args.tokens, args.width
    x = jax.device_put(jax.random.normal(k[0], (t, d)), NamedSharding(mesh, P()))
    w1 = jax.device_put(jax.random.normal(k[1], (d, 4 * d)) / d ** 0.5, NamedSharding(mesh, P(None, "tp")))
    w2 = jax.device_put(jax.random.normal(k[2], (4 * d, d)) / (4 * d) ** 0.5, NamedSharding(mesh, P("tp", None)))
    with jax.set_mesh(mesh):
        plain, tapped = jax.jit(block), jax.jit(with_tap_outputs)
        same = np.array_equal(np.asarray(plain(x, w1, w2)), np.asarray(tapped(x, w1, w2)[0]))
        rows = []
        for _ in range(args.repeats):
            a = statistics.median(timed(plain, (x, w1, w2), 3))
            b = statistics.median(timed(tapped, (x, w1, w2), 3))
            rows.append((a, b))
    with tempfile.TemporaryDirectory() as tmp:
        with dcj.capture(jax.jit(block), os.path.join(tmp, "run"), mesh, derive_depths=False) as run:
            run(x, w1, w2)  # compiles
            whole = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                run(x, w1, w2)
                whole.append(time.perf_counter() - t0)
    a = statistics.median(r[0] for r in rows)
    b = statistics.median(r[1] for r in rows)
    ratios = sorted(r[1] / r[0] for r in rows)
    print(f"jax {jax.__version__}, {t} tokens x {d}, tp=8 CPU devices")
    print(f"result with taps as outputs bitwise equal to without: {same}")
    print(f"jitted forward {a * 1e3:.1f} ms; with its 4 taps as outputs {b * 1e3:.1f} ms "
          f"(ratio median {statistics.median(ratios):.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f})")
    print(f"whole capture per call (taps copied to the host and written, 8 rank files): "
          f"{statistics.median(whole) * 1e3:.1f} ms = {statistics.median(whole) / a:.2f}x the forward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
