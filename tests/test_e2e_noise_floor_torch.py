"""compare --noise-floor on a user's own PyTorch program (tests/torch/tp_mlp.py):
its float32 single-process dump sets each tap's floor against the float64
reference, and the tensor-parallel gloo dump is judged by it: clean passes,
a bfloat16 all-reduce (the bug) fails at the tap after it, and the report
says the tolerances came from the noise floor. Skipped without python3-torch."""
import os
import subprocess
import sys
import unittest

from e2e import E2ETest

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch", "tp_mlp.py")
try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@unittest.skipUnless(HAVE_TORCH, "python3-torch is not installed")
class NoiseFloorTorch(E2ETest):
    def dump(self, *args):
        p = subprocess.run([sys.executable, PROGRAM, *args], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_floor_from_single_device_dump(self):
        self.dump("reference", self.path("ref"))
        self.dump("single", self.path("floor"))
        for bug in (False, True):
            self.dump("sharded", self.path("tp"), "-n", "2", *(["--bug"] if bug else []))
            res = self.diffcheck("compare", self.path("tp"), "--reference", self.path("ref.rank0.h5"),
                                 "--noise-floor", self.path("floor"), json=True)
            with self.subTest(bug=bug):
                self.assertExit(res, 1 if bug else 0)
                taps = {t["name"]: t["reference"] for t in res.report["taps"]}
                self.assertEqual({r["tolerance_source"] for r in taps.values()}, {"noise floor"})
                self.assertGreater(float(taps["fc1"]["noise_floor"]["element"]), 0)
                if bug:
                    self.assertEqual(res.report["first_divergence"]["tap"], "y", msg=str(res))
                else:
                    self.assertLess(max(float(r["margin"]) for r in taps.values()), 1)
        # Without a floor the same files are judged by the derived rule, said so.
        derived = self.diffcheck("compare", self.path("tp"), "--reference", self.path("ref.rank0.h5"), json=True)
        self.assertIn(derived.code, (0, 1))
        self.assertEqual({t["reference"]["tolerance_source"] for t in derived.report["taps"]}, {"derived"})
        # One source of tolerances at a time.
        res = self.diffcheck("compare", self.path("tp"), "--reference", self.path("ref.rank0.h5"),
                             "--noise-floor", self.path("floor"), "--tolerances", self.path("x.json"))
        self.assertExit(res, 2)


if __name__ == "__main__":
    unittest.main()
