"""diffcheck.torch on a model parallelized by torch's own DTensor plan
(examples/dtensor_block.py: parallelize_module, ColwiseParallel and
RowwiseParallel), captured with no `layouts=`, on gloo ranks: clean runs pass
with the layouts the plan implies (column-parallel outputs "-,-,tp", the
attention core's by its input, row-parallel ones replicated), with torch's
default use_local_output=True and with DTensor outputs; RowwiseParallel with
its all-reduce skipped is found at attn.out, whole and sketched. FSDP2 and
tp together (examples/fsdp_tp_train.py): a training step passes, and
FSDP2's gradient average lost is found at the first parameter gradient.
transformers' own plan on a small Llama (examples/llama_tp.py) passes clean,
and its RowwiseParallel with the reduction skipped is found at the first
row-parallel layer, o_proj.
Default run: 2 ranks, float32, the clean runs with plain outputs (the DTensor
outputs, sketched, in the fault's run, every tap before it passing); the
Llama with its fault only (its layouts, and every tap before o_proj passing).
Nightly (DIFFCHECK_E2E_FULL=1): 2 and 4 ranks, float32 and bfloat16, each output mode;
the Llama clean and also training."""
import os
import re
import subprocess
import unittest
import sys

from e2e import E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "dtensor_block.py")
TRAIN = os.path.join(HERE, "..", "examples", "fsdp_tp_train.py")
LLAMA = os.path.join(HERE, "..", "examples", "llama_tp.py")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"
LAYOUTS = {"attn.q": "-,-,tp", "attn.core": "-,-,tp", "attn.out": "replicated", "mlp.fc1": "-,-,tp",
           "mlp.act": "-,-,tp", "mlp.fc2": "replicated", "model": "replicated"}


class DTensorPlanE2E(E2ETest):
    def example(self, n, *args, script=EXAMPLE):
        out = self.path(f"{os.path.basename(script)}-{n}-{'-'.join(a.strip('-') for a in args)}")
        p = subprocess.run([sys.executable, script, "-n", str(n), "--out", out, *args],
                           capture_output=True, text=True, timeout=600)
        self.assertIn(p.returncode, (0, 1), p.stderr[-3000:])
        return p

    def layouts(self, stdout):
        """{tap: layout} from the report's rows."""
        rows = re.findall(r"^\s+\d+\s+(\S+)\s+(\S+)\s", stdout, re.M)
        return dict(rows)

    def configurations(self):
        ranks = (2, 4) if FULL else (2,)
        dtypes = ("float32", "bfloat16") if FULL else ("float32",)
        modes = ((), ("--dtensor-output",))
        return [(n, (*mode, "--dtype", d)) for n in ranks for d in dtypes for mode in modes]

    def test_clean_runs_pass_with_the_plans_layouts(self):
        # By default the plain outputs; DTensor outputs, sketched, in the fault's run below.
        configurations = self.configurations() if FULL else [(2, ())]
        for n, args in configurations:
            with self.subTest(ranks=n, args=args):
                p = self.example(n, *args)
                self.assertEqual(p.returncode, 0, p.stdout[-3000:])
                self.assertIn("PASS: all 13 taps pass", p.stdout)
                seen = self.layouts(p.stdout)
                self.assertEqual({t: seen.get(t) for t in LAYOUTS}, LAYOUTS, p.stdout)

    def test_skipped_allreduce_found_at_the_first_row_parallel_layer(self):
        for n, args in self.configurations() if FULL else [(2, ("--dtensor-output", "--sketch"))]:
            with self.subTest(ranks=n, args=args):
                p = self.example(n, *args, "--bug", "missing_allreduce")
                self.assertEqual(p.returncode, 1, p.stdout[-3000:])
                self.assertRegex(p.stdout, r"First divergence: tap 'attn\.out' \(#5\), layout replicated")

    def test_fsdp2_and_tp_training_step(self):
        """examples/fsdp_tp_train.py, dp=2 x tp=2, each dp rank its own samples: clean passes,
        whole and sketched, the batch split over dp (read from FSDP2's mesh) on top of the plan's
        tp layouts, with the placements of FSDP2 over tp; FSDP2's average lost is found at the first
        parameter gradient, every forward tap and output gradient passing; a loader that gives the
        second dp index the first's samples is found at the first tap, on that index's ranks."""
        for args in [()] + ([("--sketch",), ("--dtype", "bfloat16"), ("--sketch", "--dtype", "bfloat16")] if FULL else []):
            with self.subTest(args=args):
                p = self.example(4, *args, script=TRAIN)
                self.assertEqual(p.returncode, 0, p.stdout[-3000:])
                self.assertIn("PASS: all 56 taps pass", p.stdout)
                seen = self.layouts(p.stdout)
                self.assertEqual((seen["param_grad/attn.q.weight"], seen["param/mlp.fc2.weight"]), ("tp*dp,-", "dp,tp"))
                self.assertEqual((seen["ln1"], seen["attn.q"], seen["grad/attn.q"]), ("dp,-,-", "dp,-,tp", "dp,-,tp"))
            with self.subTest(args=args, bug="wrong_samples"):
                p = self.example(4, *args, "--bug", "wrong_samples", script=TRAIN)
                self.assertEqual(p.returncode, 1, p.stdout[-3000:])
                self.assertRegex(p.stdout, r"First divergence: tap 'ln1' \(#0\), layout dp,-,-")
                if "--sketch" not in args:
                    self.assertRegex(p.stdout, r"worst at global index \[[23],.* on rank\(s\) 2")
                    self.assertIn("elements outside the tolerance on rank(s) 2-3", p.stdout)
            with self.subTest(args=args, bug="sum_not_mean"):
                p = self.example(4, *args, "--bug", "sum_not_mean", script=TRAIN)
                self.assertEqual(p.returncode, 1, p.stdout[-3000:])
                self.assertRegex(p.stdout, r"First divergence: tap 'param_grad/ln1\.weight' \(#26\)")
                failed = re.findall(r"^\s+\d+\s+(\S+)\s.*FAIL", p.stdout, re.M)
                self.assertTrue(failed and all(n.startswith("param") for n in failed), failed)

    def test_fsdp2_alone_and_hsdp_each_rank_its_own_samples(self):
        """examples/fsdp_tp_train.py --parallel fsdp (dp=4) and hsdp (dp=2 x fsdp=2): every rank its own
        sample, both axes of HSDP read from FSDP2's mesh as data axes (the batch split over dp*fsdp), clean
        passes; a loader that gives the last data rank the first's sample is named at the first tap on that
        rank. Nightly: FSDP2's average lost, and bfloat16."""
        p = self.example(4, "--parallel", "hsdp", script=TRAIN)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:])
        self.assertIn("PASS: all 56 taps pass", p.stdout)
        self.assertEqual(self.layouts(p.stdout)["ln1"], "dp*fsdp,-,-")
        p = self.example(4, "--parallel", "hsdp", "--bug", "wrong_samples", script=TRAIN)
        self.assertEqual(p.returncode, 1, p.stdout[-3000:])
        self.assertRegex(p.stdout, r"First divergence: tap 'ln1' \(#0\), layout dp\*fsdp,-,-")
        self.assertRegex(p.stdout, r"worst at global index \[3,.* on rank\(s\) 3")
        if not FULL:
            return
        for args in (("--parallel", "fsdp"), ("--parallel", "fsdp", "--dtype", "bfloat16"),
                     ("--parallel", "hsdp", "--dtype", "bfloat16")):
            with self.subTest(args=args):
                p = self.example(4, *args, script=TRAIN)
                self.assertEqual(p.returncode, 0, p.stdout[-3000:])
                self.assertIn("PASS: all 56 taps pass", p.stdout)
        p = self.example(4, "--parallel", "fsdp", "--bug", "sum_not_mean", script=TRAIN)
        self.assertEqual(p.returncode, 1, p.stdout[-3000:])
        self.assertRegex(p.stdout, r"First divergence: tap 'param_grad/ln1\.weight' \(#26\)")

    @unittest.skipUnless(FULL, "nightly: run against run across data-parallel degrees")
    def test_dp2_against_dp1_on_the_same_global_batch(self):
        """fsdp_tp_train at dp=2 (each dp rank its share) against dp=1 (the whole batch on each rank), no
        reference: the pieces laid together are the same global tensors; the loader fault leaves at ln1."""
        def run(n, *args):
            out = self.path(f"against-{n}-{'-'.join(args)}")
            p = subprocess.run([sys.executable, TRAIN, "-n", str(n), "--out", out, *args], capture_output=True,
                               text=True, timeout=600)
            self.assertIn(p.returncode, (0, 1), p.stderr[-3000:])
            return f"{out}/run"
        one, two, wrong = run(2), run(4), run(4, "--bug", "wrong_samples")
        self.assertExit(self.diffcheck("compare", two, "--against", one), 0)
        res = self.diffcheck("compare", wrong, "--against", one)
        self.assertExit(res, 1)
        self.assertIn("First divergence: tap 'ln1'", res.out)

    def test_transformers_llama_on_its_own_plan(self):
        """examples/llama_tp.py: transformers' tp_plan="auto" on 2 ranks, no layouts=: the
        column-parallel projections' taps are sharded, the rest replicated, and a forward
        passes against the float64 reference. Nightly: 2 and 4 ranks (8 heads, 4 of keys and
        values), float32 and bfloat16, forward and training step, and sketched."""
        runs = []  # by default, the fault's run below shows the plan's layouts and every tap before it passing
        if FULL:
            runs = [(n, (*train, "--dtype", d)) for n in (2, 4) for d in ("float32", "bfloat16")
                    for train in ((), ("--train",))] + [(2, ("--sketch",))]
        for n, args in runs:
            with self.subTest(ranks=n, args=args):
                p = self.example(n, *args, script=LLAMA)
                self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-2000:])
                self.assertRegex(p.stdout, r"PASS: all \d+ taps pass")
                seen = self.layouts(p.stdout)
                self.assertEqual((seen["model.layers.0.self_attn.q_proj"], seen["model.layers.0.mlp.up_proj"],
                                  seen["model.layers.0.mlp.down_proj"]), ("-,-,tp", "-,-,tp", "replicated"))

    def test_transformers_rowwise_without_its_reduction_is_found(self):
        """examples/llama_tp.py --bug missing_allreduce: transformers' RowwiseParallel hands its
        partial sums on as reduced: the first row-parallel layer is named, its replicas
        differing; every tap before it passes. Nightly also 4 ranks and the training step."""
        for n, args in [(2, ())] + ([(2, ("--train",)), (4, ()), (4, ("--train",))] if FULL else []):
            with self.subTest(ranks=n, args=args):
                p = self.example(n, "--bug", "missing_allreduce", *args, script=LLAMA)
                self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-2000:])
                first = re.search(r"First divergence: tap '([^']+)'", p.stdout)
                self.assertEqual(first and first.group(1), "model.layers.0.self_attn.o_proj", p.stdout[-3000:])
                self.assertIn("replicas DIFFER", p.stdout)
                seen = self.layouts(p.stdout)
                self.assertEqual((seen["model.layers.0.self_attn.q_proj"], seen["model.layers.0.mlp.up_proj"],
                                  seen["model.layers.0.mlp.down_proj"]), ("-,-,tp", "-,-,tp", "replicated"))
                passed = re.findall(r"^\s+\d+\s+(\S+)\s.*PASS", p.stdout, re.M)
                self.assertIn("model.layers.0.self_attn.q_proj", passed)
