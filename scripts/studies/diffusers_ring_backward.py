#!/usr/bin/env python3
"""diffusers' ring attention (TemplatedRingAttention on the `_native_flash`
backend, examples/_cpu_flash_attention.py's CPU kernel) against plain
attention in float64, forward and gradients, at ring degrees 2, 3 and 4,
as diffusers ships it and with examples/_diffusers_parallel.py's
mend_ring_backward(). The figures behind docs/torch.md's "A defect of
diffusers found": the key and value gradients are wrong beyond 2 ring ranks
and right after the mend. No diffcheck in it: the check of the finding.

    .venv/bin/python scripts/studies/diffusers_ring_backward.py [--ranks 2 3 4]

Prints the largest error of each of out, dQ, dK, dV over the ranks; exit 1
when a mended ring is wrong or a shipped ring of 3 or more ranks is right
(the defect gone: update docs/torch.md).
"""
import argparse
import warnings
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
TOLERANCE = 1e-5  # float32 attention of 8-32 keys against float64: errors of 1e-7 expected


def ring_errors(rank, world, init, mend, results):
    sys.path.insert(0, EXAMPLES)
    warnings.filterwarnings("ignore", category=FutureWarning)  # diffusers' deprecated collectives
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        import _cpu_flash_attention
        import _diffusers_parallel
        from diffusers import ContextParallelConfig
        from diffusers.models import attention_dispatch as ad
        from diffusers.models._modeling_parallel import ParallelConfig
        from torch.distributed.device_mesh import init_device_mesh
        _cpu_flash_attention.install()
        if mend:
            _diffusers_parallel.mend_ring_backward()
        torch.accelerator.device_count = lambda: 1  # the CPU build says 0
        config = ContextParallelConfig(ring_degree=world)
        config.setup(rank, world, torch.device("cpu"),
                     init_device_mesh("cpu", (world, 1), mesh_dim_names=("ring", "ulysses")))
        g = torch.Generator().manual_seed(0)
        batch, tokens, heads, head = 1, 8 * world, 2, 16
        q, k, v, grad_out = (torch.randn(batch, tokens, heads, head, generator=g, dtype=torch.float64)
                             for _ in range(4))
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in whole)).transpose(1, 2)
        ref.backward(grad_out)
        mine = slice(rank * 8, (rank + 1) * 8)  # this rank's tokens
        local = [t[:, mine].float().clone().requires_grad_() for t in (q, k, v)]
        out = ad._native_flash_attention(*local, _parallel_config=ParallelConfig(context_parallel_config=config))
        out.backward(grad_out[:, mine].float())
        errors = [(out.detach().double() - ref.detach()[:, mine]).abs().max().item()]
        errors += [(a.grad.double() - b.grad[:, mine]).abs().max().item() for a, b in zip(local, whole)]
        results[rank] = errors
    finally:
        dist.destroy_process_group()


def run(world, mend):
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(ring_errors, args=(world, "file://" + os.path.join(tmp, "rendezvous"), mend, results), nprocs=world)
        return [max(r[i] for r in results.values()) for i in range(4)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4], help="ring degrees (default 2 3 4)")
    args = ap.parse_args()
    print(f"{'ring':>4}  {'diffusers':<9}  {'out':>8}  {'dQ':>8}  {'dK':>8}  {'dV':>8}")
    surprises = 0
    for world in args.ranks:
        for mend in (False, True):
            errors = run(world, mend)
            wrong = max(errors) > TOLERANCE
            expected = world > 2 and not mend
            surprises += wrong != expected
            print(f"{world:>4}  {'mended' if mend else 'as ships':<9}  " + "  ".join(f"{e:8.1e}" for e in errors)
                  + ("  WRONG" if wrong else "") + ("" if wrong == expected else "  (unexpected)"))
    return 1 if surprises else 0


if __name__ == "__main__":
    sys.exit(main())
