"""diffusers' own context parallelism, checked by diffcheck.torch
(examples/flux_ulysses.py): a small FluxTransformer2DModel with
`enable_parallelism(ContextParallelConfig(ulysses_degree=N))` on gloo ranks,
against the unsharded model in float64 with the one-device yardstick. A clean
forward passes; diffusers' Ulysses attention with the keys' all-to-all skipped
is found at the first attention's output projection, every tap before it
passing. Nightly (DIFFCHECK_E2E_FULL=1): 4 ranks, bfloat16 and the training
step (backward=True), clean and with the fault. Ring attention cannot run on
the CPU (diffusers' native backend returns no LSE): docs/torch.md."""
import os
import re
import subprocess
import sys

from e2e import E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "flux_ulysses.py")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"
FIRST = "transformer_blocks.0.attn.to_out.0"


class DiffusersUlyssesE2E(E2ETest):
    def example(self, n, *args):
        out = self.path(f"flux-{n}-{'-'.join(a.strip('-') for a in args)}")
        p = subprocess.run([sys.executable, EXAMPLE, "-n", str(n), "--out", out, *args],
                           capture_output=True, text=True, timeout=600)
        self.assertIn(p.returncode, (0, 1), p.stderr[-3000:])
        return p

    def configurations(self):
        if not FULL:
            return [(2, ())]
        return [(n, (*train, "--dtype", d)) for n in (2, 4) for d in ("float32", "bfloat16")
                for train in ((), ("--train",))]

    def test_clean_runs_pass_and_the_skipped_all_to_all_is_found(self):
        for n, args in self.configurations():
            with self.subTest(ranks=n, args=args):
                p = self.example(n, *args)
                self.assertEqual(p.returncode, 0, p.stdout[-3000:])
                self.assertRegex(p.stdout, r"PASS: all \d+ taps pass")
                self.assertRegex(p.stdout, r"transformer_blocks\.0\.attn\.to_q\s+-,sp,-")
                p = self.example(n, *args, "--bug", "key_all_to_all_skipped")
                self.assertEqual(p.returncode, 1, p.stdout[-3000:])
                first = re.search(r"First divergence: tap '([^']+)'", p.stdout)
                self.assertEqual(first and first.group(1), FIRST, p.stdout[-3000:])
