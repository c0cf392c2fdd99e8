"""compare --noise-floor on a user's own PyTorch program (tests/torch/tp_mlp.py):
its float32 single-process dump sets each tap's floor against the float64
reference, and the tensor-parallel gloo dump is judged by it: clean passes,
a bfloat16 all-reduce (the bug) fails at the tap after it, and the report
says the tolerances came from the noise floor. The same dump written beside
the reference as REF.one_device (where dct.capture(..., one_device=True) puts
it) is found without naming it; one of another dtype or shape is refused,
naming both. Skipped without torch, except under ctest (which runs it in the torch environment)."""
import os
import shutil
import subprocess
import sys
import unittest

import h5py
import numpy as np

from e2e import E2ETest

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch", "tp_mlp.py")
try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@unittest.skipUnless(HAVE_TORCH or os.environ.get("DIFFCHECK_REQUIRE_TORCH"),
                     "torch is not installed (bash scripts/torch_env.sh)")
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

    def test_one_device_run_beside_the_reference_is_found_and_checked(self):
        self.dump("reference", self.path("ref"))
        self.dump("sharded", self.path("tp"), "-n", "2", "--bug")
        ref = self.path("ref.rank0.h5")
        # Without a one-device run: the derived rule, and the report says how to measure.
        res = self.diffcheck("compare", self.path("tp"), "--reference", ref, json=True)
        self.assertIn("tolerances: derived", res.out)
        self.assertIn("one_device=True", res.report["tolerance_note"])
        self.dump("single", self.path("ref.one_device"))
        res = self.diffcheck("compare", self.path("tp"), "--reference", ref, json=True)
        self.assertExit(res, 1)
        self.assertIn(f"tolerances: measured, the one-device run {self.path('ref.one_device')}.rank0.h5 found "
                      "beside the reference", res.out)
        taps = {t["name"]: t["reference"] for t in res.report["taps"]}
        self.assertEqual({r["tolerance_source"] for r in taps.values()}, {"noise floor"})
        self.assertEqual(res.report["first_divergence"]["tap"], "y", msg=str(res))
        off = self.diffcheck("compare", self.path("tp"), "--reference", ref, "--noise-floor", "off", json=True)
        self.assertEqual({t["reference"]["tolerance_source"] for t in off.report["taps"]}, {"derived"})
        self.assertNotIn("tolerance_note", off.report)
        # A yardstick of another dtype, or of another shape, is refused naming both.
        floor = self.path("ref.one_device.rank0.h5")
        shutil.copy(floor, self.path("good.h5"))
        with h5py.File(floor, "r+") as f:
            f["taps/fc1"].attrs["dtype"] = "bfloat16"  # its values bfloat16's, stored as float32
        res = self.diffcheck("compare", self.path("tp"), "--reference", ref)
        self.assertExit(res, 2)
        self.assertIn(f"tap 'fc1': the run {self.path('tp')} is float32 but the noise floor "
                      f"{self.path('ref.one_device')} is bfloat16", res.err)
        shutil.copy(self.path("good.h5"), floor)
        for path, dtype in ((floor, "float16"), (self.path("tp.rank0.h5"), "float32"),
                            (self.path("tp.rank1.h5"), "float32")):
            with h5py.File(path, "r+") as f:
                f.attrs["dtype"] = dtype  # the files' own word for their dtype
        res = self.diffcheck("compare", self.path("tp"), "--reference", ref)
        self.assertExit(res, 2)
        self.assertIn(f"noise floor {self.path('ref.one_device')} is float16 but the run {self.path('tp')} is "
                      "float32", res.err)
        shutil.copy(self.path("good.h5"), floor)
        with h5py.File(floor, "r+") as f:
            attrs = dict(f["taps/fc1"].attrs)
            data = f["taps/fc1"][()]
            del f["taps/fc1"]
            ds = f.create_dataset("taps/fc1", data=np.concatenate([data, data], axis=-1))
            ds.attrs.update(attrs)
        res = self.diffcheck("compare", self.path("tp"), "--reference", ref)
        self.assertExit(res, 2)
        self.assertIn(f"noise floor {self.path('ref.one_device')}: {ref}:/reference/fc1: reference shape [64,384] "
                      "does not match the tap's global shape [64,768]", res.err)


if __name__ == "__main__":
    unittest.main()
