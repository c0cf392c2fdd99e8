#!/usr/bin/env python3
"""The tensor-parallel block of tp_block.py checked in two passes, as a run
at real size is checked on a GPU (docs/torch.md, "Sketch mode"):

  1. every tap as a sketch (a few rows per tap, computed where the tensor is):
     the three checks, the first divergence named, next to nothing written;
  2. only if that found a divergence: the same run again, capturing whole only
     the taps the report names (`only=report`), for the element-level report.

    mpirun -n 4 python3 examples/tp_block_sketch.py [--bug]
    python3 examples/tp_block_sketch.py -n 4 [--bug]

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_block  # noqa: E402
from _launch import launch  # noqa: E402

import diffcheck.torch as dct  # noqa: E402  # diffcheck


def one_pass(rank, world, args, **mode):
    """The run, its reference and its one-device yardstick, captured in `mode`; rank 0 compares."""
    w, x = tp_block.full_weights()
    block = tp_block.Block(w, world, rank, args.bug).float()
    with dct.capture(block, out=f"{args.out}/tp", mesh=f"tp={world}", layouts=tp_block.LAYOUTS, **mode):  # diffcheck
        block(x.float())  # diffcheck
    dist.barrier()  # every rank file written
    report = None
    if rank == 0:
        dct.references(lambda dt: (tp_block.Block(w).to(dt), (x.to(dt),)), f"{args.out}/ref", dtype=torch.float32, **mode)  # noqa: E501  # diffcheck
        report = dct.compare(f"{args.out}/tp", reference=f"{args.out}/ref.h5", check=False)  # diffcheck
    shared = [report]
    dist.broadcast_object_list(shared, src=0)  # every rank learns the verdict
    return shared[0]


def work(rank, world, args):
    report = one_pass(rank, world, args, sketch=True)  # diffcheck
    if rank == 0:
        print("pass 1, sketches:\n" + report["console"], end="")
    if not report["pass"]:
        whole = one_pass(rank, world, args, only=report)  # diffcheck
        if rank == 0:
            print("\npass 2, the first divergence whole:\n" + whole["console"], end="")
    if rank == 0:
        with open(os.path.join(args.out, "verdict"), "w") as f:
            f.write("pass" if report["pass"] else "fail")


def after(args):
    with open(os.path.join(args.out, "verdict")) as f:
        return 0 if f.read() == "pass" else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=4, help="processes to start when not under mpirun (default 4)")
    ap.add_argument("--bug", action="store_true", help="add the row-parallel bias on every rank (tp_block.py --bug)")
    ap.add_argument("--out", default="dumps/tp_block_sketch", help="directory of the activation files")
    launch(work, after, ap.parse_args(), ap.parse_known_args()[0].n)
