#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/): small
valid activation files of both forms, every element type and attribute of the
format, and the text inputs of the parsers. The fuzzer mutates from these;
run again only to change the seeds (the corpus also holds what fuzzing added)."""
import os
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from diffcheck_dump import RankDump  # noqa: E402

READER = os.path.join(HERE, "corpus", "reader")
PARSERS = os.path.join(HERE, "corpus", "parsers")
rng = np.random.default_rng(7)


def run_file(name, world=2, mesh="tp=2", **opts):
    """The run-file form: each tap [world, *local]; replicated, split and partial taps."""
    with h5py.File(os.path.join(READER, name), "w", libver=opts.get("libver", "earliest")) as f:
        f.attrs["diffcheck_schema"] = 1
        f.attrs["mesh"] = mesh
        f.attrs["world_size"] = world
        f.attrs["scenario"] = "seed"
        f.attrs["flags"] = "async=false chunks=2"
        taps = f.create_group("taps")
        ref = f.create_group("reference")
        x = rng.standard_normal((4, 3))
        rep = taps.create_dataset("a/replicated", data=np.stack([x.astype(np.float32)] * world),
                                  **opts.get("ds", {}))
        rep.attrs["order"] = 0
        ref["a/replicated"] = x
        tp = 2  # the last axis of every seed mesh; other axes are replica axes
        y = rng.standard_normal((tp * 2, 3))
        split = taps.create_dataset("b/split", data=np.stack([y[2 * (r % tp):2 * (r % tp) + 2] for r in range(world)]).astype(np.float16))
        split.attrs["spec"] = "tp,-"
        split.attrs["order"] = 1
        split.attrs["atol"] = 1e-2
        split.attrs["rtol"] = 1e-2
        ref["b/split"] = y.astype(np.float32)
        parts = rng.standard_normal((tp, 3))
        part = taps.create_dataset("c/partial", data=np.stack([parts[r % tp] for r in range(world)]))
        part.attrs["partial"] = "tp"
        part.attrs["order"] = 2
        part.attrs["reduction_depth"] = 16
        ref["c/partial"] = parts.sum(axis=0)
        ints = taps.create_dataset("d/ints", data=np.arange(world * 5, dtype=np.int32).reshape(world, 5) % 5)
        ints.attrs["order"] = 3
        bf = taps.create_dataset("e/bf16", data=np.zeros((world, 0), np.float32))
        bf.attrs["dtype"] = "bfloat16"
        bf.attrs["order"] = 4
        ref["e/bf16"] = np.zeros((0,))


def rank_file(name):
    """The rank-file form with world size 1 (a whole set in one file)."""
    prefix = os.path.join(READER, name)
    with RankDump(prefix, mesh="sp=1", rank=0) as d:
        q = rng.standard_normal((2, 4)).astype(np.float32)
        d.tap("block0/q", q, spec="-,sp")
        d.tap("block0/out", q * 2, reduction_depth=8, atol=1e-6)
        d.reference("block0/q", q.astype(np.float64))
        d.reference("block0/out", q.astype(np.float64) * 2)
    os.rename(prefix + ".rank0.h5", prefix)


def sketch_file(name):
    """A one-rank set of sketch taps (docs/FORMAT.md, "Sketch taps"): one
    with a sketch reference, one with a whole reference, one sketched over
    dimension -3 (sketch_dim), one whole tap."""
    prefix = os.path.join(READER, name)
    with RankDump(prefix, mesh="sp=1", rank=0) as d:
        x = rng.standard_normal((2, 16, 3))
        for tap in ("s/sketched_ref", "s/whole_ref"):
            d.tap(tap, rng.standard_normal((2, 3, 3)), spec="-,sp,-")
            ds = d.f["taps"][tap]
            ds.attrs.update({"sketch": "rademacher1", "sketch_seed": 1, "sketch_tokens": 16, "nan_count": 0,
                             "inf_count": 0, "bits_hash": "00000000deadbeef", "dtype": "float32"})
        d.f.create_dataset("reference/s/sketched_ref", data=rng.standard_normal((2, 3, 3)))
        d.f["reference/s/sketched_ref"].attrs.update({"sketch": "rademacher1", "sketch_seed": 1, "sketch_tokens": 16})
        d.reference("s/whole_ref", x)
        d.tap("s/whole", x[0], spec="sp,-")
        # sketched over dimension -3 ([sequence, heads, head_dim], 2 rows), its reference whole
        d.tap("s/heads", rng.standard_normal((3, 2, 4)), spec="sp,-,-")
        d.f["taps/s/heads"].attrs.update({"sketch": "rademacher1", "sketch_seed": 1, "sketch_tokens": 16,
                                          "sketch_dim": -3, "nan_count": 0, "inf_count": 0, "bits_hash": "-"})
        d.reference("s/heads", rng.standard_normal((16, 2, 4)))
    os.rename(prefix + ".rank0.h5", prefix)


def main(only=None):
    if only == "sketch":  # the seed added with sketch taps, without rewriting the others
        sketch_file("sketch_rankfile.h5")
        return
    os.makedirs(READER, exist_ok=True)
    os.makedirs(PARSERS, exist_ok=True)
    run_file("run_contiguous.h5")
    run_file("run_chunked_gzip.h5", ds={"chunks": (1, 2, 3), "compression": "gzip", "shuffle": True})
    run_file("run_latest.h5", libver="latest")
    run_file("run_mesh3.h5", world=4, mesh="dp=2,tp=2")
    rank_file("rankfile.h5")
    sketch_file("sketch_rankfile.h5")
    # The parsers target: the first byte picks the parser (0 mesh, 1 layout, 2 flags).
    texts = {
        "mesh_simple": b"\x00dp=2,tp=4",
        "mesh_three": b"\x00dp=1,sp=4,tp=2",
        "mesh_one": b"\x00world=1",
        "layout_split": b"\x01dp,tp|",
        "layout_multi": b"\x01-,sp*tp,-|dp",
        "layout_partial": b"\x01|tp",
        "flags_list": b"\x02async,chunks=3 merge=maxexp",
        "flags_bool": b"\x02async=true",
    }
    for name, data in texts.items():
        with open(os.path.join(PARSERS, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(*sys.argv[1:2])
