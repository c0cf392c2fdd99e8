"""timestep_broadcast at 1, 2, 4 and 16 ranks: clean runs pass, the injected
temporary-broadcast fault is caught at the schedule tap."""
import unittest

from e2e import E2ETest


class TimestepBroadcast(E2ETest):
    def test_clean_passes(self):
        for n in (1, 2, 4, 16):
            for dtype in ("float32", "bfloat16"):
                with self.subTest(ranks=n, dtype=dtype):
                    res = self.mpirun(n, "--scenario", "timestep_broadcast", "--dtype", dtype)
                    self.assertExit(res, 0)
                    self.assertIn("PASS: all 86 taps pass", res.out)
                    self.assertTrue(res.report["pass"])

    def test_async_broadcast_passes(self):
        res = self.mpirun(4, "--scenario", "timestep_broadcast", "--flag", "async_bcast=true")
        self.assertExit(res, 0)
        self.assertIn("async_bcast=true", res.out)

    def test_fault_caught_at_schedule(self):
        for n in (2, 4, 16):
            with self.subTest(ranks=n):
                res = self.mpirun(n, "--scenario", "timestep_broadcast",
                                  "--inject", "timestep_temp_broadcast")
                self.assertExit(res, 1)
                self.assertFirstDivergence(res, "schedule/timesteps", ["replica"])
                rep = res.report["taps"][0]["replica"]
                self.assertEqual(rep["differing_ranks"], list(range(1, n)))
                self.assertEqual(rep["worst"]["leader"], 0)
                self.assertEqual(rep["worst"]["leader_value"], 1000.0)  # t at step 0
                self.assertEqual(rep["worst"]["other_value"], 0.0)
                self.assertIn(f"ranks 1-{n - 1} disagree" if n > 2 else "ranks 1 disagree", res.out)

    def test_fault_caught_with_async_broadcast_and_bf16(self):
        res = self.mpirun(4, "--scenario", "timestep_broadcast", "--dtype", "bfloat16",
                          "--flag", "async_bcast=1", "--inject", "timestep_temp_broadcast")
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "schedule/timesteps", ["replica"])

    def test_fault_is_invisible_on_one_rank(self):
        # With one rank there is nobody to broadcast to: the bug cannot exist,
        # and the run must say so rather than invent a failure.
        res = self.mpirun(1, "--scenario", "timestep_broadcast", "--inject", "timestep_temp_broadcast")
        self.assertExit(res, 0)

    def test_flags_from_environment(self):
        import os
        import subprocess
        from e2e import EXE, MPIEXEC
        env = dict(os.environ, DIFFCHECK_FLAGS="async_bcast=true")
        proc = subprocess.run([MPIEXEC, "-n", "2", EXE, "--scenario", "timestep_broadcast",
                               "--out", self.path("x.h5")], capture_output=True, text=True, env=env,
                              timeout=300, stdin=subprocess.DEVNULL)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("async_bcast=true", proc.stdout)

    def test_run_file_is_comparable_later(self):
        res = self.mpirun(4, "--scenario", "timestep_broadcast", "--inject", "timestep_temp_broadcast")
        self.assertExit(res, 1)
        again = self.diffcheck("compare", self.path("run.h5"), json=True)
        self.assertExit(again, 1)
        self.assertFirstDivergence(again, "schedule/timesteps", ["replica"])


if __name__ == "__main__":
    unittest.main()
