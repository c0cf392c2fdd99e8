"""How the examples start their processes (not diffcheck's business): under
`torchrun --nproc-per-node N example.py` or `mpirun -n N python3 example.py`,
each process is one torch.distributed rank over gloo (the launcher's world
size, not `-n`); run plainly, `-n N` processes are started with
torch.multiprocessing (forked: see start_method()). Either way `work(rank, world, args)` runs on every rank
and `after(args)` once when all are done (on rank 0, or in the parent); its
return value is the exit status."""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank, world, init, work, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        work(rank, world, args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def parser(doc, out, n=2, dtypes=None, sketch=True, train=False):
    """The command line every example shares: -n, --out, and where the
    example has them --dtype (of `dtypes`), --sketch and --train; the
    example adds its own (--bug first)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=n, help=f"processes to start when no launcher did (default {n})")
    if train:
        ap.add_argument("--train", action="store_true", help="a training step (backward=True) instead of a forward")
    ap.add_argument("--out", default=out, help=f"directory of the activation files (default {out})")
    if sketch:
        ap.add_argument("--sketch", action="store_true", help="capture sketches, not whole tensors (docs/torch.md, "
                                                              "'Sketch mode')")
    if dtypes:
        ap.add_argument("--dtype", choices=sorted(dtypes), default="float32", help="the run's dtype (default float32)")
    return ap


def require_dtype(ap, name, dtype):
    """argparse error when this torch cannot compute `dtype` here (torch 1.13
    has no float16 matmul, softmax or GELU on the CPU)."""
    try:
        torch.ones(2, 2, dtype=dtype) @ torch.ones(2, 2, dtype=dtype)
    except RuntimeError as e:
        ap.error(f"--dtype {name}: torch {torch.__version__} cannot compute it on the CPU ({e})")


def launched():
    """(rank, world size, init method) of a process a launcher started, or None.
    torchrun (and any launcher of torch's env:// rendezvous) sets RANK,
    WORLD_SIZE and MASTER_ADDR; mpirun its own variables."""
    env = os.environ
    if all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return int(env["RANK"]), int(env["WORLD_SIZE"]), "env://"
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", 0)))
        world = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", 1)))
        if "MASTER_ADDR" in env:
            return rank, world, "env://"
        # one host: a rendezvous file named after the MPI job
        job = env.get("PMIX_NAMESPACE", env.get("OMPI_MCA_ess_base_jobid", "job"))
        return rank, world, "file://" + os.path.join(tempfile.gettempdir(), f"diffcheck-example-{job}")
    return None


def start_method():
    """How -n N starts its processes: forked from this one, which has imported
    torch already (half an example's start on 2 cores: each spawned process
    imports torch again), unless forking is not safe: CUDA initialized here,
    or no fork on this platform. DIFFCHECK_EXAMPLE_START=spawn|fork|forkserver
    chooses."""
    chosen = os.environ.get("DIFFCHECK_EXAMPLE_START")
    if chosen:
        return chosen
    if "fork" not in mp.get_all_start_methods() or (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return "spawn"
    return "fork"


def launch(work, after, args, n):
    started = launched()
    if started is not None:
        rank, world, init = started
        _rank(rank, world, init, work, args)
        if rank == 0:
            if init.startswith("file://"):
                try:
                    os.remove(init[len("file://"):])
                except FileNotFoundError:
                    pass
            sys.exit(after(args))
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank, args=(n, "file://" + os.path.join(tmp, "rendezvous"), work, args), nprocs=n,
                           start_method=start_method())
    sys.exit(after(args))
