#!/usr/bin/env python3
"""Do a capture's extra outputs change a JAX program? Runs a medium
transformer block (attention over tokens x width in 8 heads, then a GELU
MLP of 4x width; heads and hidden units over tp=8 CPU devices; 8 taps),
jitted, with and without diffcheck.jax taps as outputs, and reports:
  - whether the result is bitwise the same (XLA may fuse differently when an
    intermediate must also be written out);
  - the time per call of the plain jitted function and of the jitted
    function with its taps as outputs (paired, median of --repeats), and of
    the whole capture (taps written to rank files), against the forward
    run just before it, and the sketch capture (sketch=True), against the
    forward in blocks of --block calls in turn (kept apart from the whole
    capture, whose writes would slow the calls after it), with the size of
    each capture's files per call;
  - the same with its taps written into the last call's tap buffers
    (donated, as the sketch capture's host path does from its second call:
    fresh outputs of some hundred MiB page-fault on every call).
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
from diffcheck.jax import taps as jax_taps  # noqa: E402


HEADS = 8


def block(x, w1, w2):
    """Attention over the tokens (q = k = v = x split into heads, each device
    its heads: the width split over tp) and a tensor-parallel MLP: 8 taps."""
    t, d = x.shape
    q = dcj.tap("heads", jax.sharding.reshard(x.reshape(t, HEADS, d // HEADS), P(None, "tp", None)))
    s = dcj.tap("scores", jnp.einsum("qhd,khd->hqk", q, q) / (d // HEADS) ** 0.5)
    o = dcj.tap("attn", jnp.einsum("hqk,khd->qhd", jax.nn.softmax(s, axis=-1), q))
    x = dcj.tap("residual", x + jax.sharding.reshard(o, P(None, None, None)).reshape(t, d))
    h = dcj.tap("up", x @ w1)
    a = dcj.tap("act", jax.nn.gelu(h))
    y = dcj.tap("down", jnp.einsum("tf,fd->td", a, w2, out_sharding=P(None, None)))
    return dcj.tap("out", x + y)


def with_tap_outputs(*args):
    c = jax_taps.Collector(["*"], [])
    with jax_taps.collecting(c):
        out = block(*args)
    return out, c.outputs()


def into_spent(spent, *args):
    """with_tap_outputs, its taps written into the donated `spent` (the last call's taps)."""
    return with_tap_outputs(*args)


def settled(out):
    """The sketch run's outputs, waited for: its arrays ready, its host sketches done."""
    result, taps = out
    jax.block_until_ready(result)
    for _, kind, value, _ in taps:
        if kind == "sketch":
            [row.result() for row in value if hasattr(row, "result")]
        else:
            jax.block_until_ready(value)


def block_inputs(tokens, width):
    """(mesh tp=8, (x, w1, w2)): the block's input, replicated, and its MLP's weights split over tp."""
    mesh = jax.make_mesh((8,), ("tp",))
    k = jax.random.split(jax.random.key(0), 3)
    d = width
    x = jax.device_put(jax.random.normal(k[0], (tokens, d)), NamedSharding(mesh, P()))
    w1 = jax.device_put(jax.random.normal(k[1], (d, 4 * d)) / d ** 0.5, NamedSharding(mesh, P(None, "tp")))
    w2 = jax.device_put(jax.random.normal(k[2], (4 * d, d)) / (4 * d) ** 0.5, NamedSharding(mesh, P("tp", None)))
    return mesh, (x, w1, w2)


def per_call(fn, calls, cpu=None):
    """Seconds per call of `calls` calls of fn in a row; with a list `cpu`,
    the process's CPU seconds per call (every thread's) appended to it."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    if cpu is not None:
        cpu.append((time.process_time() - c0) / calls)
    return (time.perf_counter() - t0) / calls


def timed(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return times


def sketch_blocks(plain, run_sketched, sketched, args_of_call, args):
    """Paired apart from the whole capture, whose hundreds of MiB written would
    be in the caches' way of the calls after it (a sketch capture's own loop
    writes a few MiB a call): blocks of --block calls of the forward, the
    sketch capture and its sketches alone, in turn. Returns the ratios of the
    capture's wall time, of its CPU time (every thread's: beside the wall's,
    it tells work added from waiting added) and of the sketches alone."""
    sketch_ratios, cpu_ratios, program_ratios = [], [], []
    for _ in range(args.repeats):
        cpu = []
        forward = per_call(lambda: jax.block_until_ready(plain(*args_of_call)), args.block, cpu)
        sketch_ratios.append(per_call(lambda: run_sketched(*args_of_call), args.block, cpu) / forward)
        cpu_ratios.append(cpu[1] / cpu[0])
        program_ratios.append(per_call(lambda: settled(sketched.sketches.run(args_of_call, {})), args.block)
                              / forward)
    return sketch_ratios, cpu_ratios, program_ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--block", type=int, default=3, help="calls in a row per timed block of the sketch capture")
    args = ap.parse_args()
    t, d = args.tokens, args.width
    mesh, (x, w1, w2) = block_inputs(t, d)
    with jax.set_mesh(mesh):
        plain, tapped = jax.jit(block), jax.jit(with_tap_outputs)
        donating = jax.jit(into_spent, donate_argnums=0, keep_unused=True)
        spent = {"taps": tapped(x, w1, w2)[1]}

        def into_last(*a):
            out, spent["taps"] = donating(spent["taps"], *a)
            return out
        same = np.array_equal(np.asarray(plain(x, w1, w2)), np.asarray(tapped(x, w1, w2)[0]))
        same = same and np.array_equal(np.asarray(plain(x, w1, w2)), np.asarray(into_last(x, w1, w2)))
        rows = []
        for _ in range(args.repeats):
            a = statistics.median(timed(plain, (x, w1, w2), 3))
            b = statistics.median(timed(tapped, (x, w1, w2), 3))
            c = statistics.median(timed(into_last, (x, w1, w2), 3))
            rows.append((a, b, c))
    with tempfile.TemporaryDirectory() as tmp:
        full = dcj.capture(jax.jit(block), os.path.join(tmp, "run"), mesh, derive_depths=False)
        sketched = dcj.capture(jax.jit(block), os.path.join(tmp, "sketch"), mesh, derive_depths=False, sketch=True)
        with full as run, sketched as run_sketched, jax.set_mesh(mesh):
            for _ in range(2):  # compiles (the sketch capture's second call, its donating form)
                run(x, w1, w2)
                run_sketched(x, w1, w2)
            whole = []
            for _ in range(args.repeats):  # paired: the forward, then the whole capture
                t0 = time.perf_counter()
                jax.block_until_ready(plain(x, w1, w2))
                t1 = time.perf_counter()
                run(x, w1, w2)
                whole.append((time.perf_counter() - t1) / (t1 - t0))
            sketch_ratios, cpu_ratios, program_ratios = sketch_blocks(plain, run_sketched, sketched, (x, w1, w2),
                                                                      args)
            calls = 2 + 2 * args.repeats * args.block
        sizes = {name: sum(os.path.getsize(os.path.join(tmp, f"{name}.rank{r}.h5")) for r in range(8)) / calls
                 for name in ("run", "sketch")}
    a = statistics.median(r[0] for r in rows)
    b = statistics.median(r[1] for r in rows)
    c = statistics.median(r[2] for r in rows)
    ratios = sorted(r[1] / r[0] for r in rows)
    into = sorted(r[2] / r[0] for r in rows)
    print(f"jax {jax.__version__}, {t} tokens x {d}, tp=8 CPU devices")
    print(f"result with taps as outputs (fresh or into the last call's) bitwise equal to without: {same}")
    print(f"jitted forward {a * 1e3:.1f} ms; with its 8 taps as outputs {b * 1e3:.1f} ms "
          f"(ratio median {statistics.median(ratios):.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}); "
          f"written into the last call's {c * 1e3:.1f} ms ({statistics.median(into):.3f}, {into[0]:.3f}-{into[-1]:.3f})")
    whole.sort()
    sketch_ratios.sort()
    print(f"whole capture per call (taps copied to the host and written, 8 rank files): "
          f"{statistics.median(whole):.2f}x the forward (range {whole[0]:.2f}-{whole[-1]:.2f}), "
          f"{sizes['run'] / 2 ** 20:.1f} MiB of files a call")
    where = "on the host, C kernel" if sketched.sketches.on_host else "in the XLA program"
    print(f"sketch capture per call (sketches made {where}, 8 rank files): "
          f"{statistics.median(sketch_ratios):.3f}x the forward (range {sketch_ratios[0]:.3f}-{sketch_ratios[-1]:.3f}), "
          f"{sizes['sketch'] / 2 ** 20:.2f} MiB of files a call")
    cpu_ratios.sort()
    print(f"  its CPU time (every thread's) against the forward's: {statistics.median(cpu_ratios):.3f}x "
          f"(range {cpu_ratios[0]:.3f}-{cpu_ratios[-1]:.3f})")
    program_ratios.sort()
    print(f"  of which the sketches alone (the forward, its taps sketched, no file written): "
          f"{statistics.median(program_ratios):.3f}x the forward (range {program_ratios[0]:.3f}-{program_ratios[-1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
