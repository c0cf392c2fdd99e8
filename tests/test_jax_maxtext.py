"""MaxText's own decoder under diffcheck.jax (examples/jax_maxtext.py, in the
MaxText environment: Python 3.12, jax 0.12, maxtext 0.2.5, made by
scripts/maxtext_env.sh): no layouts, every layer's submodules tapped inside
MaxText's jax.checkpoint, the references built by MaxText on their one-device
mesh. By default the clean forward in float32 and a tensor-parallel reduction
left out; bfloat16, the training step, another mesh and the other faults
nightly."""
import os
import subprocess
import unittest

from e2e import E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "jax_maxtext.py")
PYTHON = os.environ.get("DIFFCHECK_MAXTEXT_PYTHON", os.path.join(HERE, "..", ".venv-maxtext", "bin", "python"))
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


class MaxText(E2ETest):
    def run_example(self, *args):
        self.assertTrue(os.path.exists(PYTHON), f"no MaxText environment at {PYTHON}: bash scripts/maxtext_env.sh")
        out = self.path("-".join(("maxtext",) + args).replace("--", ""))
        p = subprocess.run([PYTHON, EXAMPLE, "--out", out, *args], capture_output=True, text=True, timeout=900,
                           cwd=self.path(""), env=dict(os.environ, DIFFCHECK_EXE=os.environ.get("DIFFCHECK_EXE", "")))
        self.assertIn(p.returncode, (0, 1), p.stdout[-2000:] + p.stderr[-3000:])
        return p

    def test_clean_forward_with_every_layer_tapped(self):
        p = self.expect_clean(42)
        rows = {line.split()[1]: line.split()[2] for line in p.stdout.splitlines() if line[:3].strip().isdigit()}
        # inside MaxText's jax.checkpoint of each decoder layer, laid out from the shardings
        self.assertEqual(rows["decoder.layers_1.self_attention.query"], "fsdp,-,tensor,-")
        self.assertEqual(rows["decoder.layers_1.mlp.wo"], "fsdp,-,tensor")
        self.assertIn("ref float32", p.stdout)  # MaxText refuses float64: said on each tap

    def test_a_tensor_parallel_reduction_left_out(self):
        p = self.expect_found("decoder.layers_0.self_attention.out", "--bug", "tp_reduction_dropped")
        self.assertIn("replicas DIFFER across tensor", p.stdout)

    @unittest.skipUnless(FULL, "nightly: bfloat16, the training step, another mesh and the other faults")
    def test_every_dtype_step_mesh_and_fault(self):
        self.expect_clean(42, "--dtype", "bfloat16")
        # the training step with backward=True: 41 gradients of module outputs, those inside MaxText's
        # jax.checkpoint of each layer included (remat_gradients.py; before, named as not taken)
        p = self.expect_clean(125, "--train")
        self.assertRegex(p.stdout, r"grad/decoder\.layers_1\.self_attention\.query\s")
        self.expect_clean(125, "--train", "--dtype", "bfloat16")
        self.expect_clean(42, "--fsdp", "2", "--tensor", "4")
        self.expect_found("decoder.layers_0.self_attention.rotary_embedding@1", "--bug", "heads_split_wrong")
        self.expect_found("param_grad/decoder.layers_0.mlp.wo.kernel", "--train", "--bug", "fsdp_grad_unreduced")


if __name__ == "__main__":
    unittest.main()
