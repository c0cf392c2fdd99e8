"""The CPU twins of diffcheck.torch's device paths (no GPU in the suite):
- whole taps through host staging (staging.py, what a CUDA model uses): the
  same values as the direct path, taken when the hook ran (a later in-place
  change does not reach the file), never more buffers than its slots;
- scripts/bench/gpu_sketch_bench.py at its tiny size on the CPU.
(torch.compile'd models, for real: test_torch_compile.py.)
Runs against the source tree (PYTHONPATH=python/)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torch.nn as nn

import diffcheck.torch as dct
from diffcheck.torch import session, staging


class InPlace(nn.Module):
    """Returns a tensor it then changes in place (as an in-place all-reduce would)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x):
        y = self.inner(x)
        kept = y.clone()
        y.mul_(0)  # after inner's hook: the tap must hold the value before this
        return kept + y


def read_taps(path):
    with h5py.File(path) as f:
        return {n: f["taps"][n][()] for n in f["taps"]}


class DeviceTwinTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()
        session._CPU_TWIN_OF_DEVICE_COPIES = False

    def test_host_staging_writes_what_the_hook_saw(self):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(10)], InPlace())
        x = torch.randn(4, 8)
        with torch.no_grad(), dct.capture(model, out=os.path.join(self.dir, "direct")):
            model(x)
        made = []
        original = staging.HostStaging.__init__

        def spy(self, *a, **k):
            original(self, *a, **k)
            made.append(self)
        staging.HostStaging.__init__ = spy
        try:
            session._CPU_TWIN_OF_DEVICE_COPIES = True
            with torch.no_grad(), dct.capture(model, out=os.path.join(self.dir, "staged")):
                model(x)
        finally:
            staging.HostStaging.__init__ = original
        direct, staged = (read_taps(os.path.join(self.dir, f"{n}.rank0.h5")) for n in ("direct", "staged"))
        self.assertEqual(sorted(direct), sorted(staged))
        for name in direct:
            np.testing.assert_array_equal(direct[name], staged[name], err_msg=name)
        self.assertFalse(np.all(staged["10.inner"] == 0))  # taken before the in-place change
        pool = made[0]
        self.assertLessEqual(pool.peak_in_use, pool.slots)
        self.assertLessEqual(pool.buffers, pool.slots)
        self.assertFalse(pool.pinned)

    def test_gpu_script_runs_its_cpu_twin(self):
        """scripts/bench/gpu_sketch_bench.py (what a lent GPU runs) at its tiny size on the CPU: its
        figures written, and its sketch files compare clean against its sketched reference."""
        out = os.path.join(self.dir, "gsb")
        script = os.path.join(os.path.dirname(__file__), "..", "scripts", "bench", "gpu_sketch_bench.py")
        p = subprocess.run([sys.executable, script, "--device", "cpu", "--tiny", "--rounds", "1", "--no-compile",
                            "--out", out], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "gpu_sketch_bench.json")) as f:
            figures = json.load(f)
        for key in ("sketch", "whole4", "disk_bytes_per_s"):
            self.assertIn(key, figures)
        report = dct.compare(os.path.join(out, "sketch"), reference=os.path.join(out, "ref.h5"))
        self.assertEqual(len(report["taps"]), 21)


if __name__ == "__main__":
    unittest.main()
