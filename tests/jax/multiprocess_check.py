"""diffcheck.jax in a multi-process job (jax.distributed over gloo on the CPU):
each process holds 2 of the mesh's 4 devices and writes their rank files;
process 0 runs the references on the gathered inputs and the compare.

    python3 multiprocess_check.py PROCESS_ID NUM_PROCESSES PORT OUT [--bug]

--bug: process 1's devices (dp rank 1) compute h scaled by 1.01. Exit 0 when the check passes, 1 when it finds a
divergence (process 0 prints the report), 2 on an error."""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402


def main():
    process_id, processes, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    bug = "--bug" in sys.argv[5:]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=processes, process_id=process_id)
    mesh = jax.make_mesh((2, 2), ("dp", "tp"))
    rng = np.random.default_rng(0)  # the same inputs on every process
    x_all, w_all = rng.normal(size=(8, 16)).astype(np.float32), rng.normal(size=(16, 32)).astype(np.float32)
    x = jax.make_array_from_callback(x_all.shape, NamedSharding(mesh, P("dp", None)), lambda i: x_all[i])
    w = jax.make_array_from_callback(w_all.shape, NamedSharding(mesh, P(None, "tp")), lambda i: w_all[i])

    # The fault: process 1 (dp rank 1's devices) traces the program with its values scaled; the
    # references run on process 0, which traces it right.
    scale = 1.01 if bug and jax.process_index() == 1 else 1.0

    def block(x, w):
        h = dcj.tap("h", jnp.tanh(x @ w) * scale)
        return dcj.tap("y", h.sum(axis=1))

    try:
        report = dcj.check(jax.jit(block), x, w, out=out, mesh=mesh)
    except dcj.Divergence as e:
        print(e.report["console"] if isinstance(getattr(e, "report", None), dict) else e)
        return 1
    if report is not None:
        print(report["console"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
