#!/usr/bin/env python3
"""The tensor-parallel block of examples/tp_block.py on three meshes, with no
reference: each run is captured alone (`--no-reference`: no float64 model,
as for a model that fits on no single device), and the three are compared
with each other. A correct block gives the same activations on every mesh,
within the sum of two runs' rounding; a bug that shows on one mesh only makes
that run leave the consensus, and diffcheck names it and the tap.

    python3 examples/tp_block_meshes.py [--bug-on 4] [--meshes 1 2 4] [--sketch] [--dtype bfloat16]

--bug-on TP puts tp_block's bug (the row-parallel bias added on every rank)
in the run at tp = TP only (0: no bug): it leaves the consensus at attn.out.
A bug that shows on every mesh alike cannot be seen this way; one that shows
differently on every mesh splits the runs with no consensus, and the report
says so rather than guess. Exit 1 when the runs disagree.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import diffcheck  # noqa: E402  # diffcheck


def capture(args, tp):
    """One run of tp_block.py on `tp` ranks, with no reference; its rank-file prefix."""
    out = os.path.join(args.out, f"tp{tp}")
    cmd = [sys.executable, os.path.join(HERE, "tp_block.py"), "-n", str(tp), "--out", out, "--no-reference",
           "--dtype", args.dtype] + (["--sketch"] if args.sketch else []) + (["--bug"] if tp == args.bug_on else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(out, "tp")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshes", type=int, nargs="+", default=[1, 2, 4], help="tp sizes, one run each (default 1 2 4)")
    ap.add_argument("--bug-on", type=int, default=4, help="the tp size whose run has the bug (0: none; default 4)")
    ap.add_argument("--out", default="dumps/tp_block_meshes", help="directory of the runs' files")
    ap.add_argument("--sketch", action="store_true", help="capture sketches, not whole tensors")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()
    if len(args.meshes) < 2:
        ap.error("--meshes: at least two runs to compare")
    runs = [capture(args, tp) for tp in args.meshes]
    report = diffcheck.compare(runs[0], against=runs[1:], check=False)  # diffcheck
    print(report["console"], end="")  # diffcheck
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
