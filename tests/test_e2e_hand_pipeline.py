"""Pipelines written by hand (examples/pp_handwritten.py: dist.send/recv
between two stages, a GPipe loop over 4 microbatches, an output head tied to
the token embedding): `stage=` and `microbatches=` on the capture, a fault of
stage 0 named at stage 0's tap (compare orders the stages' taps as the data
flows, though each rank numbers its own from 0), a fault in microbatch 2
named there, a position embedding with no batch dimension written once and
its microbatches' copies checked, and the tied weight's copies each
compared with the reference under its own name. Clean and three faults by
default; the rest and bfloat16 nightly."""
import os
import unittest

import h5py

from e2e import E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "pp_handwritten.py")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"
TAPS = 212  # 2 steps: 26 module outputs, their 26 gradients, 27 parameters' gradients and values (head tied)


class HandWrittenPipeline(E2ETest):
    def run_example(self, *args):
        return super().run_example(EXAMPLE, *args)

    def first_divergence(self, p):
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("First divergence"))
        return line, p.stdout.split(line, 1)[1].split("\n\n")[0]

    def test_clean(self):
        p, out = self.run_example()
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn(f"PASS: all {TAPS} taps pass", p.stdout)
        with h5py.File(f"{out}/pp.rank0.h5") as f:
            self.assertNotIn("model", f["taps/step0"])  # a stage's root is no part of the whole model's names
            tok, pos = f["taps/step0/tok_emb"], f["taps/step0/pos_emb"]
            self.assertEqual((tok.attrs["stage"], tok.attrs["microbatches"], tok.shape), ("pp=0", 4, (8, 8, 32)))
            self.assertNotIn("microbatches", pos.attrs)  # [T, D]: no batch dimension, written once
            self.assertEqual(pos.shape, (8, 32))
        with h5py.File(f"{out}/pp.rank1.h5") as f:
            self.assertEqual(f["taps/step0/param/head.weight"].attrs["stage"], "pp=1")
        with h5py.File(f"{out}/ref.h5") as f:  # the tied parameter under both its names
            self.assertIn("head.weight", f["reference/step0/param"])
            self.assertIn("tok_emb.weight", f["reference/step0/param"])

    def test_a_stage_0_fault_is_named_at_stage_0(self):
        """Each rank numbered its taps from 0: ordered by `order` alone, stage 1's first tap came first."""
        line, _ = self.first_divergence(self.run_example("--bug", "residual_twice")[0])
        self.assertIn("tap 'step0/blocks.1' ", line)
        self.assertIn("stage pp=0", line)

    def test_a_fault_in_microbatch_2_names_microbatch_2(self):
        line, detail = self.first_divergence(self.run_example("--bug", "stale_send")[0])
        self.assertIn("tap 'step0/blocks.2.ln' ", line)
        self.assertIn("wrong in microbatch 2 of 4 (stage pp=1)", detail)

    def test_microbatch_copies_of_a_tap_without_batch_dimension(self):
        line, detail = self.first_divergence(self.run_example("--bug", "positions_shifted")[0])
        self.assertIn("tap 'step0/pos_emb' ", line)
        self.assertIn("microbatches DIFFER: the tap has no batch dimension", detail)
        self.assertIn("the copies of rank 0: microbatches 3 are not microbatch 0's", detail)

    def test_the_tied_weights_gradients_not_reduced(self):
        line, _ = self.first_divergence(self.run_example("--bug", "tied_allreduce_skipped")[0])
        self.assertIn("tap 'step0/param_grad/tok_emb.weight' ", line)

    @unittest.skipUnless(FULL, "nightly: the last stage's copy not updated, and bfloat16")
    def test_the_last_stages_copy_not_updated(self):
        line, _ = self.first_divergence(self.run_example("--bug", "head_not_updated")[0])
        self.assertIn("tap 'step0/param/head.weight' ", line)
        self.assertIn("stage pp=1", line)

    @unittest.skipUnless(FULL, "nightly: bfloat16")
    def test_bfloat16_clean(self):
        p, _ = self.run_example("--dtype", "bfloat16")
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn(f"PASS: all {TAPS} taps pass", p.stdout)


if __name__ == "__main__":
    unittest.main()
