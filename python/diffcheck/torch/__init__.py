"""Capture a PyTorch model's module outputs as diffcheck taps.

    import diffcheck.torch as dct

    # every rank of the sharded run: <out>.rank<R>.h5
    with dct.capture(model, out="dumps/tp", mesh="tp=4",
                     layouts={"*.fc1": "-,-,tp", "*.fc2.matmul": (None, "tp")}):
        y = model(x)

    # one process, the unsharded model: <out>.h5 with /reference/<same names>
    with dct.capture(ref_model, out="dumps/ref", reference=True):
        ref_model(x)

    dct.compare("dumps/tp", reference="dumps/ref.h5")    # the JSON report; Divergence on a failure

Tap names are module paths (`blocks.0.attn`, the root module is `model`);
tuple, list and dict outputs are flattened (`blocks.0.attn/0`,
`blocks.0.attn/hidden`); a module called again is numbered in execution order
(`embed`, `embed@1`, ...), and `dct.step(t)` puts later taps under `step<t>/`
(the numbering starts again), which `diffcheck compare` reports step by step.
Layouts map glob patterns on tap names (without `step<t>/` and `@k`) to a
`spec`, a `(spec, partial)` pair or a dict of tap attributes; a tap no pattern
matches is replicated. See docs/torch.md.
"""
# The public names: a capture and what reaches it (session.py), the references
# beside it (reference_runs.py), the live replica check (diffcheck/watch), and
# the report (diffcheck/compare.py).
from diffcheck.compare import DiffcheckError, Divergence, InputError, compare, verdict  # noqa: F401
from diffcheck.dump import RankDump, ReferenceDump  # noqa: F401
from diffcheck.torch.session import (  # noqa: F401
    ONE_DEVICE_SUFFIX, Capture, capture, compiled_original, grads, params, rank_and_world, step, tap, unhook)
from diffcheck.torch.reference_runs import references, to_dtype  # noqa: F401  # dct.references(make, out, dtype=...)
from diffcheck.watch import (  # noqa: F401  # dct.watch(model, opt, mesh=...)
    RankUnresponsive, ReplicasDiffer, TransientFault, WatchError, watch)
