"""diffcheck.jax end to end on models: a Flax NNX DiT block with Ulysses
attention (examples/jax_dit_ulysses.py; forward, an optax step, the
head-chunked path's fault and the bisect that names its setting) and an
optax step on FSDP-sharded weights (examples/jax_fsdp_train.py). Default: one
mesh and dtype each; DIFFCHECK_E2E_FULL=1 (nightly): 4 and 8 devices, both
dtypes, forward and training."""
import itertools
import os
import subprocess
import sys
import tempfile
import unittest

from e2e import EXE
from test_e2e_jax import FULL, ROOT, run_example


class DitUlyssesExample(unittest.TestCase):
    """A Flax NNX DiT block with Ulysses attention; the head-chunked path
    (ULYSSES_ATTENTION_CHUNKS, as MaxDiffusion PR #428) and its fault."""

    def expect(self, *args, first=None):
        with tempfile.TemporaryDirectory() as tmp:
            code, out = run_example("jax_dit_ulysses.py", "--out", tmp, *args)
        if first is None:
            self.assertEqual(code, 0, out)
            self.assertRegex(out, r"PASS: all \d+ taps pass")
        else:
            self.assertEqual(code, 1, out)
            self.assertIn(f"First divergence: tap '{first}'", out)
        return out

    def test_forward_clean_and_chunked_fault(self):
        cases = [("dp=2,sp=4", "bfloat16")]
        if FULL:
            cases = list(itertools.product(("dp=2,sp=2", "dp=1,sp=4", "dp=2,sp=4", "dp=1,sp=2"),  # 2 samples: dp <= 2
                                           ("float32", "bfloat16")))
        for mesh, dtype in cases:
            with self.subTest(mesh=mesh, dtype=dtype):
                out = self.expect("--mesh", mesh, "--dtype", dtype, "ULYSSES_ATTENTION_CHUNKS=2")
                for module in ("norm1", "qkv", "attn", "proj", "fc1", "fc2", "model"):
                    self.assertRegex(out, rf"\n\s+\d+\s+{module}\s")  # every submodule, by its path
                if FULL:
                    self.expect("--mesh", mesh, "--dtype", dtype, "--bug")  # one pass: no fault to find
                    # sketch mode: attn [batch, sequence, 8 heads, head_dim] sketched over its sequence
                    self.expect("--mesh", mesh, "--dtype", dtype, "--sketch", "ULYSSES_ATTENTION_CHUNKS=2")
                    self.expect("--mesh", mesh, "--dtype", dtype, "--sketch", "--bug", "ULYSSES_ATTENTION_CHUNKS=2",
                                first="attn")
                self.expect("--mesh", mesh, "--dtype", dtype, "--bug", "ULYSSES_ATTENTION_CHUNKS=2", first="attn")

    def test_training_step(self):
        cases = [("dp=2,sp=2", "float32", False)]  # its fault is the forward's, shown above
        if FULL:
            cases = list(itertools.product(("dp=2,sp=2", "dp=2,sp=4"), ("float32", "bfloat16"), (False, True)))
        for mesh, dtype, bug in cases:
            with self.subTest(mesh=mesh, dtype=dtype, bug=bug):
                extra = ["--bug", "ULYSSES_ATTENTION_CHUNKS=2"] if bug else []
                out = self.expect("--train", "--mesh", mesh, "--dtype", dtype, *extra, first="attn" if bug else None)
                self.assertIn("param_grad/qkv.kernel", out)
                self.assertIn("param/fc2.bias", out)
                self.assertIn("grad/attn", out)  # backward=True: the gradients of the module taps

    def test_a_mesh_the_chunks_cannot_split_is_refused(self):
        code, out = run_example("jax_dit_ulysses.py", "--mesh", "dp=1,sp=8", "ULYSSES_ATTENTION_CHUNKS=2")
        self.assertEqual(code, 2, out)
        self.assertIn("each head group (8 heads / 2) must split over sp", out)

    @unittest.skipUnless(FULL, "nightly (about 40 s: 4 trials); the bisect of a command is tested by e2e_bisect_sweep")
    def test_bisect_names_the_setting(self):
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([EXE, "bisect", "--flags=--xla_cpu_enable_fast_min_max=true,ULYSSES_ATTENTION_CHUNKS=2",
                                "--cache", "", "--work-dir", tmp, "--",
                                sys.executable, os.path.join(ROOT, "examples", "jax_dit_ulysses.py"), "--bug",
                                "--mesh", "dp=1,sp=2", "--out", tmp, "{flags}"],
                               capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"[Mm]inimal.*ULYSSES_ATTENTION_CHUNKS=2")
        self.assertNotRegex(p.stdout.split("inimal", 1)[1], r"xla_cpu")


class FsdpTrainExample(unittest.TestCase):
    """An optax Adam step on FSDP-sharded weights (Auto mesh axes), the
    gradients' sum over dp left out by --bug."""

    def test_clean_and_the_dp_sum_left_out(self):
        cases = [("dp=2,fsdp=2", "float32")]
        if FULL:
            cases = list(itertools.product(("dp=2,fsdp=2", "dp=1,fsdp=4", "dp=4,fsdp=2", "dp=2,fsdp=4"),
                                           ("float32", "bfloat16")))
        for mesh, dtype in cases:
            with self.subTest(mesh=mesh, dtype=dtype):
                with tempfile.TemporaryDirectory() as tmp:
                    code, out = run_example("jax_fsdp_train.py", "--mesh", mesh, "--dtype", dtype, "--out", tmp)
                    self.assertEqual(code, 0, out)
                    self.assertIn("PASS: all 5 taps pass", out)
                    code, out = run_example("jax_fsdp_train.py", "--mesh", mesh, "--dtype", dtype, "--out", tmp,
                                            "--bug")
                if mesh.startswith("dp=1"):
                    self.assertEqual(code, 0, out)  # no dp replicas: nothing was left out
                    continue
                self.assertEqual(code, 1, out)
                self.assertIn("First divergence: tap 'param_grad/w1'", out)
                self.assertIn("replicas DIFFER across dp", out)


class ExampleLines(unittest.TestCase):
    def test_at_most_twelve_lines_and_no_layout_by_hand(self):
        for script in ("jax_reshard", "jax_dit_ulysses", "jax_fsdp_train"):
            with open(os.path.join(ROOT, "examples", f"{script}.py")) as f:
                lines = f.readlines()
            ours = [line for line in lines if line.rstrip().endswith("# diffcheck")]
            with self.subTest(script=script):
                self.assertLessEqual(len(ours), 12)
                self.assertTrue(all(line.rstrip().endswith("# diffcheck") for line in lines if "dcj." in line),
                                "every line using diffcheck is counted")
                self.assertFalse([line for line in ours if "spec=" in line or "partial=" in line or "layouts" in line])


if __name__ == "__main__":
    unittest.main()
