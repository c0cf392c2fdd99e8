"""`diffcheck compare` under mpirun, and with tiny memory budgets, gives the
serial report: same stdout, exit status and JSON; errors are agreed and said once."""
import unittest

import h5py
import numpy as np

from e2e import EXE, MPIEXEC, E2ETest


class CompareInParallel(E2ETest):
    def compare(self, source, *args, n=None, name="r.json"):
        cmd = [EXE, "compare", source, "--json", self.path(name), *args]
        if n:
            cmd = [MPIEXEC, "-n", str(n), *cmd]
        res = self.run_cmd(cmd, name)
        return res

    def assertSameReport(self, a, b):
        self.assertEqual(a.code, b.code, msg=f"{a}\n{b}")
        self.assertEqual(a.out, b.out)
        self.assertEqual(a.report, b.report)

    def test_sixteen_rank_run_file_on_three_processes(self):
        run = self.mpirun(16, "--scenario", "flux_tp", "--inject", "proj_out_contiguous")
        self.assertExit(run, 1)
        serial = self.compare(self.path("run.h5"), name="serial.json")
        self.assertExit(serial, 1)
        self.assertEqual(serial.report["first_divergence"]["tap"], "proj_out/weight")
        for n in (2, 3):
            self.assertSameReport(self.compare(self.path("run.h5"), n=n, name=f"p{n}.json"), serial)
        tiny = self.compare(self.path("run.h5"), "--memory-budget", "1M", name="tiny.json")
        self.assertSameReport(tiny, serial)
        tiny3 = self.compare(self.path("run.h5"), "--memory-budget", "1M", n=3, name="tiny3.json")
        self.assertSameReport(tiny3, serial)

    def test_chunk_boundaries_in_a_large_tap(self):
        # 2 ranks (dp=2, replicas), 100,003 elements each: with a 1 MiB budget
        # the chunks are 8,192 elements, so 8,191 | 8,192 is a boundary.
        n = 100003
        ref = np.linspace(-1, 1, n, dtype=np.float32)
        prefix = self.path("big")
        for r in range(2):
            x = ref.copy()
            if r == 1:
                x[8192] = np.nan          # first NaN at the first element of a chunk
                x[8191] += 0.25           # replica difference at the last element of one
            x[16384] += 3.0               # worst reference error, both ranks
            with h5py.File(f"{prefix}.rank{r}.h5", "w") as f:
                f.attrs.update({"diffcheck_schema": 1, "mesh": "dp=2", "world_size": 2, "rank": r})
                d = f.create_dataset("taps/x", data=x)
                d.attrs["atol"], d.attrs["rtol"] = 1e-6, 0.0
                if r == 0:
                    f.create_dataset("reference/x", data=ref.astype(np.float64))
        default = self.compare(prefix, name="default.json")
        self.assertExit(default, 1)
        tap = default.report["taps"][0]
        self.assertEqual(tap["nonfinite"]["first_nan"], {"rank": 1, "index": [8192]})
        self.assertEqual(tap["replica"]["worst"]["index"], [8192])  # NaN beats 0.25
        self.assertEqual(tap["replica"]["differing_ranks"], [1])
        self.assertEqual(tap["reference"]["worst_index"], [16384])
        self.assertEqual(tap["reference"]["n_fail"], 1)
        for budget in ("1M", "3M", "64M"):
            for procs in (None, 3):
                with self.subTest(budget=budget, procs=procs):
                    self.assertSameReport(
                        self.compare(prefix, "--memory-budget", budget, n=procs, name="b.json"), default)

    def test_error_is_agreed_and_said_once(self):
        res = self.run_cmd([MPIEXEC, "-n", "3", EXE, "compare", self.path("missing.h5")])
        self.assertExit(res, 2)
        self.assertEqual(res.err.count("no such file"), 1, msg=str(res))

    def test_bad_budget_is_a_usage_error(self):
        res = self.diffcheck("compare", self.path("x.h5"), "--memory-budget", "lots")
        self.assertExit(res, 2)
        self.assertIn("--memory-budget", res.err + res.out)


if __name__ == "__main__":
    unittest.main()
