"""diffcheck.jax end to end: the JAX examples at 4 and 8 CPU devices in one
process, float32 and bfloat16, clean (every tap passes) and with their
faults (found at their first tap, by `diffcheck compare`). Run against run:
the mesh with the fault is the odd one out. DIFFCHECK_E2E_FULL=1 (nightly):
every mesh of the sweep in both dtypes."""
import itertools
import os
import subprocess
import sys
import tempfile
import unittest

from e2e import EXE

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


def run_example(script, *args, timeout=300):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args], capture_output=True,
                       text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr


class ReshardExample(unittest.TestCase):
    def expect(self, mesh, dtype, bug, first=None):
        with tempfile.TemporaryDirectory() as tmp:
            code, out = run_example("jax_reshard.py", "--mesh", mesh, "--dtype", dtype, "--out", tmp,
                                    *(["--bug"] if bug else []))
        where = f"{mesh} {dtype}{' --bug' if bug else ''}:\n{out}"
        if first is None:
            self.assertEqual(code, 0, where)
            self.assertIn("PASS: all 3 taps pass", out, where)
        else:
            self.assertEqual(code, 1, where)
            self.assertIn(f"First divergence: tap '{first}'", out, where)
            self.assertIn("replicas DIFFER across dp", out, where)

    def test_clean_and_faulty_at_4_and_8_devices(self):
        cases = [("dp=2,tp=2", "float32"), ("dp=2,fsdp=2,tp=2", "bfloat16")]
        if FULL:
            meshes = ["dp=2,tp=2", "dp=1,fsdp=2,tp=2", "dp=2,sp=2", "dp=2,fsdp=2,tp=2", "dp=1,fsdp=2,sp=2,tp=2",
                      "dp=4,tp=2", "dp=2,fsdp=2,sp=2", "dp=8"]
            cases = list(itertools.product(meshes, ("float32", "bfloat16")))
        for mesh, dtype in cases:
            dp2 = "dp=2" in mesh.split(",")
            with self.subTest(mesh=mesh, dtype=dtype):
                self.expect(mesh, dtype, bug=False)
                self.expect(mesh, dtype, bug=True, first="result" if dp2 else None)

    def test_the_fault_shows_where_dp_is_2_only(self):
        self.expect("dp=4,tp=2", "float32", bug=True)  # injected, but not on this mesh

    def test_run_against_run_names_the_odd_mesh(self):
        with tempfile.TemporaryDirectory() as tmp:
            runs = []
            for mesh in ("dp=1,fsdp=2,tp=2", "dp=2,tp=2", "dp=4"):
                d = os.path.join(tmp, mesh.replace(",", "_").replace("=", ""))
                code, out = run_example("jax_reshard.py", "--mesh", mesh, "--bug", "--no-reference", "--out", d)
                self.assertEqual(code, 0, out)
                runs.append(os.path.join(d, "run"))
            p = subprocess.run([EXE, "compare", runs[0], "--against", runs[1], "--against", runs[2]],
                               capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"Odd one out: \S*dp2_tp2/run")
        self.assertIn("result", p.stdout)


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
        cases = [("dp=2,sp=2", "float32"), ("dp=2,sp=4", "bfloat16")]
        if FULL:
            cases = list(itertools.product(("dp=2,sp=2", "dp=1,sp=4", "dp=2,sp=4", "dp=1,sp=8"),
                                           ("float32", "bfloat16")))
        for mesh, dtype in cases:
            with self.subTest(mesh=mesh, dtype=dtype):
                out = self.expect("--mesh", mesh, "--dtype", dtype, "ULYSSES_ATTENTION_CHUNKS=2")
                for module in ("norm1", "qkv", "attn", "proj", "fc1", "fc2", "model"):
                    self.assertRegex(out, rf"\n\s+\d+\s+{module}\s")  # every submodule, by its path
                self.expect("--mesh", mesh, "--dtype", dtype, "--bug")  # one pass: no fault to find
                self.expect("--mesh", mesh, "--dtype", dtype, "--bug", "ULYSSES_ATTENTION_CHUNKS=2", first="attn")

    def test_training_step(self):
        cases = [("dp=2,sp=2", "float32", False)]
        if FULL:
            cases = list(itertools.product(("dp=2,sp=2", "dp=2,sp=4"), ("float32", "bfloat16"), (False, True)))
        for mesh, dtype, bug in cases:
            with self.subTest(mesh=mesh, dtype=dtype, bug=bug):
                extra = ["--bug", "ULYSSES_ATTENTION_CHUNKS=2"] if bug else []
                out = self.expect("--train", "--mesh", mesh, "--dtype", dtype, *extra, first="attn" if bug else None)
                self.assertIn("param_grad/qkv.kernel", out)
                self.assertIn("param/fc2.bias", out)

    def test_bisect_names_the_setting(self):
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([EXE, "bisect", "--flags=ULYSSES_ATTENTION_CHUNKS=2,--xla_cpu_enable_fast_min_max=true,"
                                "--xla_cpu_ftz=true", "--cache", "", "--work-dir", tmp, "--",
                                sys.executable, os.path.join(ROOT, "examples", "jax_dit_ulysses.py"), "--bug",
                                "--mesh", "dp=1,sp=4", "--out", tmp, "{flags}"],
                               capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"[Mm]inimal.*ULYSSES_ATTENTION_CHUNKS=2")
        self.assertNotRegex(p.stdout.split("inimal", 1)[1], r"xla_cpu_ftz")


class FsdpTrainExample(unittest.TestCase):
    """An optax Adam step on FSDP-sharded weights (Auto mesh axes), the
    gradients' sum over dp left out by --bug."""

    def test_clean_and_the_dp_sum_left_out(self):
        cases = [("dp=2,fsdp=2", "float32"), ("dp=2,fsdp=4", "bfloat16")]
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
