"""torchtitan as its users run it (examples/torchtitan_llama.py): its llama3
debug model parallelized by its own parallelize_llama (partial_dtensor
backend, FSDP2's mixed precision, its loss over the global token count), no
layouts. By default a clean TP+SP training step and a reduction left out,
and its context parallelism (head-tail balanced) clean and with the keys'
gather left out; FSDP2 x TP with each data rank its own samples, its
pipeline (1F1B), CP's training step, 4 ranks and contiguous shares, bfloat16
and the other faults nightly."""
import os
import unittest

from e2e import E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "torchtitan_llama.py")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


class Torchtitan(E2ETest):
    def run_example(self, *args):
        return super().run_example(EXAMPLE, *args)[0]

    def test_tensor_and_sequence_parallel_training_step_with_no_layouts(self):
        p = self.expect_clean(106, "--train")
        rows = {line.split()[1]: line.split()[2] for line in p.stdout.splitlines() if line[:3].strip().isdigit()}
        self.assertEqual(rows["layers.0.attention_norm"], "-,tp,-")  # the sequence-parallel region
        self.assertEqual(rows["layers.0.attention.qkv_linear.wqkv"], "-,-,tp")  # column-parallel
        self.assertEqual(rows["lm_head"], "-,-,tp")  # loss parallel: logits split on the vocabulary

    def test_a_reduction_left_out_is_found_at_its_tap(self):
        self.expect_found("layers.0.attention.wo", "--bug", "wo_unreduced")

    def test_context_parallelism_head_tail_balanced_with_no_layouts(self):
        """Each rank holds the sequence's chunks r and 2n-1-r: every activation is two streams, the head in
        rank order and the tail reversed (docs/FORMAT.md, `streams`), read from torchtitan's wrappers and the
        positions; the layer whose attention keeps its own keys is found there."""
        p = self.expect_clean(72, "--parallel", "cp")
        self.assertRegex(p.stdout, r"layers\.0\.attention\.inner_attention\[tail\]\s+-,fsdp,-,- \(dim 1 reversed\)")
        self.expect_found("layers.0.attention.inner_attention[head]", "--parallel", "cp", "--bug", "keys_not_gathered")

    @unittest.skipUnless(FULL, "nightly: context parallelism's training step, 4 ranks, contiguous shares")
    def test_context_parallelism_everywhere(self):
        self.expect_clean(178, "--parallel", "cp", "--train")
        self.expect_clean(178, "--parallel", "cp", "--train", "--dtype", "bfloat16")
        self.expect_clean(36, "--parallel", "cp", "--balance", "none")
        self.expect_clean(72, "-n", "4", "--parallel", "cp")
        self.expect_found("layers.0.attention.inner_attention[head]", "--parallel", "cp", "--train", "--bug",
                          "keys_not_gathered")
        # FSDP2 over dp_shard x cp: its flattened mesh read as dp*cp (mesh_aliases.py), each data index its samples
        p = self.expect_clean(178, "-n", "4", "--parallel", "fsdp_cp", "--train")
        self.assertRegex(p.stdout, r"mesh dp=2,cp=2")
        self.assertRegex(p.stdout, r"layers\.0\.attention\.wo\[tail\]\s+dp,cp,- \(dim 1 reversed\)")
        self.expect_found("layers.0.attention.inner_attention[head]", "-n", "4", "--parallel", "fsdp_cp", "--bug",
                          "keys_not_gathered")
        # CP x TP+SP: the sequence-parallel regions hold a tp share of a cp share, in a block order
        p = self.expect_clean(148, "-n", "4", "--parallel", "cp_tp", "--train")
        self.assertRegex(p.stdout, r"layers\.0\.attention_norm\s+-,fsdp\*tp,- \(blocks 0,3,1,2\)")
        self.assertNotIn("not tapped", p.stdout)
        self.expect_found("layers.0.attention.inner_attention[head]", "-n", "4", "--parallel", "cp_tp", "--bug",
                          "keys_not_gathered")

    @unittest.skipUnless(FULL, "nightly: FSDP2 x TP at 4 ranks, bfloat16, the other faults")
    def test_every_mesh_dtype_and_fault(self):
        self.expect_clean(36)
        self.expect_clean(106, "--train", "--dtype", "bfloat16")
        self.expect_clean(106, "-n", "4", "--parallel", "fsdp_tp", "--train")
        self.expect_clean(106, "-n", "4", "--parallel", "fsdp_tp", "--train", "--dtype", "bfloat16")
        self.expect_found("layers.0.attention.rope/0", "--bug", "rope_shift")
        p = self.expect_found("tok_embeddings", "-n", "4", "--parallel", "fsdp_tp", "--train", "--bug",
                              "wrong_samples")
        self.assertIn("rank(s) 2-3", p.stdout)  # the ranks of the last data index

    @unittest.skipUnless(FULL, "nightly: torchtitan's pipeline (pipeline_llm, 1F1B)")
    def test_its_pipeline(self):
        self.expect_clean(104, "--parallel", "pp", "--train")
        self.expect_clean(104, "--parallel", "pp", "--train", "--dtype", "bfloat16")
        self.expect_found("layers.1.attention.rope/0", "--parallel", "pp", "--train", "--bug", "rope_shift")


if __name__ == "__main__":
    unittest.main()
