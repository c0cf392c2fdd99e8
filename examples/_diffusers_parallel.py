"""What the diffusers examples share (flux_context_parallel.py,
wan_context_parallel.py; flux_tensor_parallel.py takes the dtypes and the
step), none of it diffcheck's: the command line, diffusers' context
parallelism switched on, a step, and the faults monkeypatched into diffusers'
attention.

Attention backends on the CPU: Ulysses alone runs on diffusers' `native`
backend. Ring attention merges blocks of keys by their log-sum-exp (LSE),
which `native` does not return, so with a ring the model runs on
`_native_flash`, whose kernel torch's CPU build has under another name
(_cpu_flash_attention.py registers it). diffusers asks torch.accelerator for
a device count, 0 on the CPU build; the examples say 1."""
import argparse
import itertools
import os

import torch

import _cpu_flash_attention

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def break_ulysses():
    """Every fourth all-to-all of diffusers' Ulysses attention (q, k, v, out: the keys') not made."""
    from diffusers.models import attention_dispatch as ad
    original, calls = ad._all_to_all_single, itertools.count()
    ad._all_to_all_single = lambda x, group: x if next(calls) % 4 == 1 else original(x, group)


def break_ring():
    """Every ring block after the first made to dominate the merge (its LSE raised by 1e4), so
    diffusers' merge keeps the last block's output alone; finite, so the training step still runs."""
    from diffusers.models import attention_dispatch as ad
    original = ad._native_flash_attention_forward_op

    def last_block_wins(ctx, *args, _save_ctx=True, **kwargs):
        out, lse = original(ctx, *args, _save_ctx=_save_ctx, **kwargs)
        return (out, lse) if _save_ctx else (out, lse + 1e4)  # _save_ctx: the ring's first block
    ad._native_flash_attention_forward_op = last_block_wins


def mend_ring_backward():
    """diffusers' ring attention backward (0.42.1), mended: gradients of the keys and values come out
    wrong beyond 2 ring ranks, silently (found by these examples, docs/torch.md). At step i rank r adds
    its gradients for the key/value chunk of rank r+i to an accumulator and hands it to rank r+1, whose
    step i+1 works on chunk r+i+2: the same chunk only when there are 2 ranks. Handed to rank r-1 (in
    the loop and in the final hop home), each accumulator follows its chunk."""
    from diffusers.models import attention_dispatch as ad
    funcol = ad.funcol

    class BackwardsRing:
        def __getattr__(self, name):
            return getattr(funcol, name)

        @staticmethod
        def permute_tensor(tensor, src_dst, group):  # diffusers' ring backward is its only caller
            return funcol.permute_tensor(tensor, [(r - 1) % len(src_dst) for r in range(len(src_dst))], group)
    ad.funcol = BackwardsRing()


# fault: (what breaks, the attention it needs: "ulysses" or "ring")
FAULTS = {"key_all_to_all_skipped": (break_ulysses, "ulysses"), "ring_merge_skipped": (break_ring, "ring")}


def parallelize(model, world, ring, bug=None, mend=False):
    """diffusers' ContextParallelConfig on `model` (ring x Ulysses = the ranks), with the fault in;
    mend: with diffusers' ring backward mended."""
    from diffusers import ContextParallelConfig
    from diffusers.utils import logging
    logging.set_verbosity_error()
    if bug:
        FAULTS[bug][0]()
    if mend:
        mend_ring_backward()
    torch.accelerator.device_count = lambda: 1  # the CPU build says 0 (see above)
    if ring > 1:
        _cpu_flash_attention.install()
        model.set_attention_backend("_native_flash")
    model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world // ring, ring_degree=ring))


def step(model, inputs, optimizer=None, sharded=False):
    """A forward, or with an optimizer a training step on the output's mean square."""
    opt = optimizer
    if opt is None:
        with torch.no_grad():
            return model(**inputs)
    model(**inputs)[0].square().mean().backward()
    if sharded:  # each rank's parameter gradients cover its own tokens: summed, as DDP or FSDP would
        for p in model.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
    opt.step()


def arguments(doc, out):
    """The examples' command line, checked against the ranks it will run on."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2, help="processes to start when not under mpirun (default 2)")
    ap.add_argument("--ring", type=int, default=1, metavar="R",
                    help="ring degree (default 1); the Ulysses degree is the rest: ranks / R")
    ap.add_argument("--train", action="store_true", help="a training step (backward=True) instead of a forward")
    ap.add_argument("--bug", choices=sorted(FAULTS), help="break diffusers' Ulysses or ring attention (see above)")
    ap.add_argument("--mend-ring-backward", action="store_true",
                    help="mend diffusers' ring attention backward, whose key and value gradients are wrong "
                         "beyond 2 ring ranks (docs/torch.md)")
    ap.add_argument("--out", default=out, help=f"directory of the activation files (default {out})")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="the run's dtype (default float32)")
    a = ap.parse_args()
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", a.n)))
    if a.ring < 1 or world % a.ring:
        ap.error(f"--ring {a.ring}: must divide the {world} ranks")
    needs = a.bug and FAULTS[a.bug][1]
    if (needs == "ring" and a.ring == 1) or (needs == "ulysses" and a.ring == world):
        ap.error(f"--bug {a.bug}: no {needs} attention runs here (ring {a.ring} of {world} ranks)")
    return a
