"""DeepSpeed-Ulysses read as it describes itself (examples/deepspeed_ulysses.py,
deepspeed's own DistributedAttention over gloo): no layouts, its output split
along the sequence and its local attention's along the heads (from its
scatter_idx, gather_idx and process group), the rest of the block along the
sequence. Clean forward and training step, and the swapped all-to-all
indices named at the local attention as a shape finding, by default; 4 ranks,
bfloat16 and the rolled key heads nightly."""
import os
import unittest

from e2e import E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "deepspeed_ulysses.py")
USP = os.path.join(HERE, "..", "examples", "yunchang_usp.py")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


class Ulysses(E2ETest):
    def run_example(self, *args):
        return super().run_example(EXAMPLE, *args)[0]

    def test_clean_forward_and_training_step_with_no_layouts(self):
        p = self.expect_clean(6)
        rows = {line.split()[1]: line.split()[2] for line in p.stdout.splitlines() if line[:3].strip().isdigit()}
        self.assertEqual(rows["attn"], "-,sp,-,-")  # gather_idx 1: the sequence
        self.assertEqual(rows["attn.local_attn"], "-,-,sp,-")  # scatter_idx 2: the heads
        self.assertEqual(rows["qkv"], "-,sp,-")  # the rest of the block: the sequence, as its input
        self.expect_clean(24, "--train")

    def test_swapped_indices_are_a_shape_finding_at_the_local_attention(self):
        p = self.run_example("--bug", "swapped_indices")
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("First divergence: tap 'attn.local_attn'", p.stdout)
        self.assertIn("SHAPE differs: the tap's global shape [2,8,8,8]", p.stdout)

    @unittest.skipUnless(FULL, "nightly: 4 ranks, bfloat16, the rolled key heads")
    def test_more_meshes_and_the_rolled_key_heads(self):
        self.expect_clean(24, "-n", "4", "--train")
        self.expect_clean(24, "--dtype", "bfloat16", "--train")
        p = self.run_example("--bug", "kv_heads_rolled")
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("First divergence: tap 'attn.local_attn'", p.stdout)


class YunchangUsp(E2ETest):
    """yunchang 0.6.4's LongContextAttention (examples/yunchang_usp.py, forward: its CPU kernel has no
    backward): no layouts, the sequence split over its ring and Ulysses groups."""

    def test_ulysses_clean_and_swapped_indices(self):
        p, _ = self.run_example(USP, "-n", "4")
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("PASS: all 5 taps pass", p.stdout)
        self.assertRegex(p.stdout, r"2  attn +-,ulysses,-,- ")
        if not FULL:
            return
        p, _ = self.run_example(USP, "-n", "4", "--bug", "swapped_indices")
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("First divergence: tap 'attn'", p.stdout)
        self.assertIn("dimensions 1, 2 hold the same sizes in another order (swapped)", p.stdout)

    @unittest.skipUnless(FULL, "nightly: the ring on yunchang's CPU kernel")
    def test_the_ring_on_the_cpu_kernel_is_found_wrong(self):
        """yunchang's torch-math kernel returns a zero log-sum-exp, so its ring merge is wrong: found at attn,
        over both axes, with nothing injected."""
        p, _ = self.run_example(USP, "-n", "4", "--ring", "2")
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("First divergence: tap 'attn' (#2), layout -,ring*ulysses,-,-", p.stdout)


if __name__ == "__main__":
    unittest.main()
