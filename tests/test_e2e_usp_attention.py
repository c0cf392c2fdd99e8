"""usp_attention end to end: clean runs pass at 1-16 ranks over several
(ring, sp) splits in float32 and bfloat16, and under every flag combination;
outputs are bitwise equal across ulysses_chunks and kv_transfer; each fault is
caught at its first tap (lse_layout as a crash on every rank, or silently
wrong at --size lse_square); lse_offset's output error grows with the ring
degree and is nil at ring = 1; bisect finds ring_overlap for ring_kv_reuse."""
import itertools
import os
import json
import re
import time
import unittest

import h5py
import numpy as np

from e2e import E2ETest

MESHES = [(1, "dp=1,ring=1,sp=1"), (2, "dp=1,ring=2,sp=1"), (2, "dp=1,ring=1,sp=2"), (4, "dp=1,ring=2,sp=2"),
          (8, "dp=2,ring=2,sp=2"), (8, "dp=1,ring=8,sp=1"), (16, "dp=1,ring=4,sp=4"), (16, "dp=2,ring=8,sp=1")]


def flags(**kv):
    out = []
    for k, v in kv.items():
        out += ["--flag", f"{k}={str(v).lower()}"]
    return out


FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


class UspAttention(E2ETest):
    def tap(self, name):
        with h5py.File(self.path("run.h5"), "r") as f:
            return f["taps/" + name][...]

    def test_clean_on_every_split_and_dtype(self):
        # float32 on every split; bfloat16 on every split nightly, on the
        # default 16-rank mesh by default.
        for n, mesh in MESHES:
            for dtype in ("float32", "bfloat16") if FULL or mesh == "dp=1,ring=4,sp=4" else ("float32",):
                with self.subTest(mesh=mesh, dtype=dtype):
                    res = self.mpirun(n, "--scenario", "usp_attention", "--mesh", mesh, "--dtype", dtype)
                    self.assertExit(res, 0)
                    ring = int(re.search(r"ring=(\d+)", mesh).group(1))
                    names = [t["name"] for t in res.report["taps"]]
                    self.assertIn(f"ring/chunk0/step{ring - 1}/lse", names)
                    self.assertNotIn(f"ring/chunk0/step{ring}/lse", names)

    def test_every_flag_combination_and_bitwise_agreement(self):
        outs = {}
        combos = list(itertools.product((False, True), ("p2p", "allgather"), (1, 2), (False, True),
                                        ("sigmoid", "maxexp")))
        if not FULL:  # each flag alone, none and all, per merge (all 32 with DIFFCHECK_E2E_FULL=1)
            combos = [c for c in combos
                      if sum((c[0], c[1] == "allgather", c[2] == 2, c[3])) in (0, 4)
                      or (c[4] == "sigmoid" and sum((c[0], c[1] == "allgather", c[2] == 2, c[3])) == 1)]
        for overlap, transfer, chunks, async_a2a, merge in combos:
            with self.subTest(overlap=overlap, transfer=transfer, chunks=chunks, async_a2a=async_a2a, merge=merge):
                res = self.mpirun(8, "--scenario", "usp_attention", "--mesh", "dp=1,ring=4,sp=2",
                                  *flags(ring_overlap=overlap, kv_transfer=transfer, ulysses_chunks=chunks,
                                         async_a2a=async_a2a, merge=merge))
                self.assertExit(res, 0)
                outs[(overlap, transfer, chunks, async_a2a, merge)] = self.tap("attn/out")
        for (overlap, transfer, chunks, async_a2a, merge), out in outs.items():
            # Bitwise the same whatever the chunking and the K/V transfer (and overlap, async).
            self.assertTrue(np.array_equal(out, outs[(False, "p2p", 1, False, merge)]),
                            f"{overlap} {transfer} {chunks} {async_a2a} {merge}")

    def test_lse_offset_first_tap_is_the_first_lse(self):
        for dtype in ("float32", "bfloat16"):
            with self.subTest(dtype=dtype):
                res = self.mpirun(16, "--scenario", "usp_attention", "--dtype", dtype, "--inject", "lse_offset")
                self.assertExit(res, 1)
                self.assertFirstDivergence(res, "ring/chunk0/step0/lse", ["reference"])
                taps = {t["name"]: t for t in res.report["taps"]}
                self.assertTrue(taps["ring/chunk0/step0/out"]["pass"])  # one block: its output is right
                self.assertFalse(taps["ring/chunk0/step1/out"]["pass"])  # merges are not

    def test_lse_offset_output_error_grows_with_the_ring(self):
        # Every mesh nightly; by default the ring degrees at dp = 1.
        quick = [] if FULL else [a for r, sp, dp in ((1, 16, 1), (2, 8, 1), (4, 4, 1), (8, 2, 1), (16, 1, 1))
                                 for a in ("--mesh", f"dp={dp},ring={r},sp={sp}")]
        res = self.diffcheck("sweep-mesh", "--scenario", "usp_attention", "-n", "16", "--inject", "lse_offset",
                             "--show-tap", "attn/out", "--json", self.path("sweep.json"), *quick)
        self.assertExit(res, 1)
        self.assertIn("every mesh as documented", res.out)
        with open(self.path("sweep.json")) as f:
            rows = json.load(f)["rows"]
        err = {}
        for r in rows:
            self.assertEqual(r["first_divergence"], "ring/chunk0/step0/lse", r)
            sizes = dict(kv.split("=") for kv in r["mesh"].split(","))
            err[(int(sizes["dp"]), int(sizes["ring"]))] = r["err_over_tol"]["attn/out"]
        self.assertEqual(len(rows), 15 if FULL else 5)
        for dp in (1, 2, 4, 8, 16) if FULL else (1,):
            self.assertLess(err[(dp, 1)], 1.0)  # ring = 1: only the LSE shows the offset
        self.assertLess(err[(1, 2)], err[(1, 4)])
        self.assertLess(err[(1, 4)], err[(1, 8)])
        self.assertLess(err[(1, 8)], err[(1, 16)])
        self.assertGreater(err[(1, 2)], 10)

    def test_ring_kv_reuse_needs_overlap(self):
        res = self.mpirun(16, "--scenario", "usp_attention", "--inject", "ring_kv_reuse")
        self.assertExit(res, 0)
        for dtype in ("float32", "bfloat16") if FULL else ("float32",):
            res = self.mpirun(16, "--scenario", "usp_attention", "--dtype", dtype, *flags(ring_overlap=True),
                              "--inject", "ring_kv_reuse")
            self.assertExit(res, 1)
            self.assertFirstDivergence(res, "ring/chunk0/step0/out", ["reference"])
            self.assertEqual(res.report["taps"][-1]["nonfinite"]["nan"], 0)

    def test_lse_layout_is_a_crash_on_every_rank(self):
        t0 = time.monotonic()
        res = self.mpirun(16, "--scenario", "usp_attention", "--inject", "lse_layout", json=False)
        self.assertLess(time.monotonic() - t0, 120)
        self.assertExit(res, 1)
        # Every rank hits it at the same step: one report, a clean end.
        self.assertEqual(res.err.count("CRASH on every rank: ring attention merge (step 0)"), 1, res.err)
        self.assertIn("the kernel's LSE has shape [4,64] where the merge reads [Sq, heads] = [64, 4]", res.err)

    def test_lse_layout_is_silent_when_the_block_is_square(self):
        res = self.mpirun(16, "--scenario", "usp_attention", "--size", "lse_square", "--inject", "lse_layout")
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "ring/chunk0/step0/lse", ["reference"])
        self.assertEqual(res.report["taps"][-1]["nonfinite"]["nan"], 0)
        clean = self.mpirun(16, "--scenario", "usp_attention", "--size", "lse_square")
        self.assertExit(clean, 0)

    def test_bisect_finds_ring_overlap(self):
        res = self.diffcheck("bisect", "--scenario", "usp_attention", "-n", "8", "--inject", "ring_kv_reuse",
                             "--cache", "", "--flags", "async_a2a,ring_overlap,merge=maxexp,ulysses_chunks=2")
        self.assertExit(res, 1)
        self.assertIn("1-minimal failing set: {ring_overlap}", res.out)


if __name__ == "__main__":
    unittest.main()
