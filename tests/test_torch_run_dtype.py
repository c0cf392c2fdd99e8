"""The run's dtype is its taps' (issue 71): under mixed precision (FSDP2's
policy, a model that casts its float32 parameters down to compute) the rank
file's root `dtype` is what the activations were computed in, so the
one-device yardstick made in that dtype pairs with it, with no word from
the user; `capture(dtype=...)` still says it outright."""
import os
import tempfile
import unittest

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F

import diffcheck.torch as dct


class CastsDown(nn.Module):
    """float32 parameters, every product computed in bfloat16 (as FSDP2's
    MixedPrecisionPolicy(param_dtype=torch.bfloat16) runs a model)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        for lin in (self.a, self.b):
            x = F.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16())
        return x


class RunDtypeFromTaps(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))

    def tearDown(self):
        self._tmp.cleanup()

    def root_dtype(self, **kwargs):
        model = CastsDown()
        with dct.capture(model, out=os.path.join(self._tmp.name, "run"), **kwargs) as c:
            model(self.x)
        with h5py.File(c.path) as f:
            return f.attrs["dtype"]

    def test_mixed_precision_run_is_its_taps_dtype(self):
        self.assertEqual(self.root_dtype(), "bfloat16")

    def test_a_dtype_given_is_kept(self):
        self.assertEqual(self.root_dtype(dtype=torch.float32), "float32")

    def test_a_plain_model_keeps_its_parameters_dtype(self):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        with dct.capture(model, out=os.path.join(self._tmp.name, "plain")) as c:
            model(self.x)
        with h5py.File(c.path) as f:
            self.assertEqual(f.attrs["dtype"], "float32")


@unittest.skipUnless(os.environ.get("DIFFCHECK_EXE"), "needs the diffcheck executable (DIFFCHECK_EXE)")
class MixedPrecisionTrainingStep(unittest.TestCase):
    """A training step of CastsDown: its parameters and their gradients are
    float32 (stored wider than the compute dtype, as FSDP2's mixed precision
    keeps them), the yardstick's bfloat16. Compare held them as another
    computation's and stopped (exit 2); the floor of the compute dtype holds
    them now, and a clean step passes."""

    def test_clean_step_passes_against_the_compute_dtype_yardstick(self):
        with tempfile.TemporaryDirectory() as d:
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
            torch.manual_seed(0)
            model = CastsDown()
            weights = {k: v.clone() for k, v in model.state_dict().items()}

            def step(m, inputs, optimizer):
                optimizer.zero_grad()
                m(*inputs).float().square().mean().backward()
                optimizer.step()

            def sgd(m):
                return torch.optim.SGD(m.parameters(), lr=0.1)
            opt = sgd(model)
            with dct.capture(model, out=os.path.join(d, "run"), backward=True, optimizer=opt):
                step(model, (x,), opt)

            def make(dt):
                m = CastsDown()
                m.load_state_dict(weights)
                return m.to(dt), (x.to(dt),)
            dct.references(make, os.path.join(d, "ref"), dtype=torch.bfloat16, step=step, optimizer=sgd,
                           backward=True)
            report = dct.compare(os.path.join(d, "run"), reference=os.path.join(d, "ref.h5"), check=False)
            self.assertTrue(report["pass"], report.get("console", report))
            self.assertIn("param_grad/a.weight", [t["name"] for t in report["taps"]])


if __name__ == "__main__":
    unittest.main()
