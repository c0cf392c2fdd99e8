"""The run's math in the derived rule, through diffcheck compare: a model
whose matmuls round their inputs to TF32 (emulated on the CPU: float32 with
its last 13 mantissa bits rounded away, what an Ampere tensor core does) is
checked with no one-device run. When its file says TF32 (root attribute
`math`, as diffcheck.torch writes it on a GPU with TF32 on) it passes and each
tap's yardstick names TF32; when the file says strict float32 it fails, and
the failing tap's paragraph says the error is the size TF32 gives. A
one-device run in other math than the run is refused, naming both.
Skipped without torch, except under ctest (which runs it in the torch environment)."""
import os
import unittest

import h5py

from e2e import E2ETest

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import diffcheck.torch as dct
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

STRICT = ("device=cuda float32_matmul_precision=highest tf32_matmul=0 tf32_cudnn=0 autocast_cpu=off "
          "autocast_cuda=off")
TF32 = STRICT.replace("tf32_matmul=0", "tf32_matmul=1")


def to_tf32(x):
    """float32 -> the nearest value with TF32's 10-bit mantissa (ties away), still float32."""
    if x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


class Tf32Linear(nn.Linear):
    def forward(self, x):
        return F.linear(to_tf32(x), to_tf32(self.weight), self.bias)


def model(dtype):
    torch.manual_seed(0)
    return nn.Sequential(Tf32Linear(256, 512), nn.GELU(), Tf32Linear(512, 256)).to(dtype)


@unittest.skipUnless(HAVE_TORCH or os.environ.get("DIFFCHECK_REQUIRE_TORCH"),
                     "torch is not installed (bash scripts/torch_env.sh)")
class TorchMath(E2ETest):
    def capture(self, math, out):
        x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        m = model(torch.float32)
        with dct.capture(m, out=self.path(out), attrs={"math": math}):
            m(x.float())
        if not os.path.exists(self.path("ref.h5")):
            ref = model(torch.float64)
            with dct.capture(ref, out=self.path("ref"), reference=True):
                ref(x)

    def compare(self, run):
        return self.diffcheck("compare", self.path(run), "--reference", self.path("ref.h5"), json=True)

    def test_a_tf32_run_is_held_to_tf32_and_a_strict_one_is_told(self):
        self.capture(TF32, "tf32")
        res = self.compare("tf32")
        self.assertExit(res, 0)
        yardsticks = {t["name"]: t["reference"]["yardstick"] for t in res.report["taps"]}
        self.assertTrue(all(y.endswith("TF32 matmuls") for y in yardsticks.values()), yardsticks)
        self.assertRegex(yardsticks["2"], r"^float32, depth 768, \d+ roundings, TF32 matmuls$")
        self.assertIn("derived d768 TF32", res.out)
        html = self.diffcheck("compare", self.path("tf32"), "--reference", self.path("ref.h5"), "--html",
                              self.path("report.html"))
        self.assertExit(html, 0)
        with open(self.path("report.html")) as f:
            page = f.read()
        self.assertIn("derived d768 TF32", page)  # each tap's yardstick, in its row
        self.assertIn('<p id="tolerance-note">tolerances: derived', page)

        self.capture(STRICT, "strict")  # the same values, said to be strict float32
        res = self.compare("strict")
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "0")
        self.assertIn("an error of the size TF32 matmuls give", res.out)
        self.assertIn("record it in the root attribute `math`", res.out)

    def test_a_one_device_run_in_other_math_is_refused_naming_both(self):
        self.capture(TF32, "tf32")
        self.capture(STRICT, "ref.one_device")  # beside the reference: found by itself
        res = self.compare("tf32")
        self.assertExit(res, 2)
        self.assertIn(f"noise floor {self.path('ref.one_device')} was computed with math '{STRICT}' but the run "
                      f"{self.path('tf32')} with '{TF32}'", res.err)
        with h5py.File(self.path("ref.one_device.rank0.h5"), "r+") as f:
            f.attrs["math"] = TF32
        self.assertExit(self.compare("tf32"), 0)


if __name__ == "__main__":
    unittest.main()
