"""Bad command lines under mpirun: each exits 2 with one clear message from
rank 0, never a hang or an abort trace."""
import os
import subprocess

from e2e import EXE, MPIEXEC, E2ETest


class CliErrors(E2ETest):
    def expect_usage_error(self, n, *args, needles=()):
        res = self.mpirun(n, *args, json=False)
        self.assertExit(res, 2)
        for needle in needles:
            self.assertIn(needle, res.err, msg=str(res))
        self.assertNotIn("MPI_ABORT", res.err)
        # Reported once (rank 0), not once per rank.
        self.assertLessEqual(res.err.count("error"), 1, msg=str(res))
        return res

    def mpmd(self, env_on_rank, n=4):
        """mpirun with DIFFCHECK_FLAGS=bogus=1 given to one rank only (MPMD)."""
        out = ["--scenario", "timestep_broadcast", "--out", self.path("run.h5")]
        parts = []
        for r in range(n):
            env = ["-x", "DIFFCHECK_FLAGS=bogus=1"] if r == env_on_rank else []
            parts += [":"] if parts else []
            parts += ["-n", "1", *env, EXE, *out]
        try:
            return self.run_cmd_timeout([MPIEXEC, *parts], 60)
        except subprocess.TimeoutExpired:
            self.fail("the job hung: ranks disagreed on their options")

    def run_cmd_timeout(self, args, timeout):
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return proc

    def test_o_is_short_for_out(self):
        # As for compare and calibrate; a run refused "-o" ("arguments were not expected").
        out = self.path("short.h5")
        res = self.run_cmd([EXE, "--scenario", "timestep_broadcast", "-o", out])
        self.assertExit(res, 0)
        self.assertTrue(os.path.exists(out), msg=str(res))

    def test_bad_gather_limit_is_a_usage_error(self):
        for bad in ("-5", "64M", "x"):
            with self.subTest(bad):
                res = self.run_cmd(["env", f"DIFFCHECK_GATHER_MAX_MIB={bad}", MPIEXEC, "-n", "2", EXE, "--scenario",
                                    "timestep_broadcast", "--out", self.path("g.h5")])
                self.assertExit(res, 2)
                self.assertIn("DIFFCHECK_GATHER_MAX_MIB", res.err)

    def test_mesh_naming_some_axes_means_size_1_for_the_others(self):
        # flux_tp has axes dp,tp: "tp=4" was refused ("needs exactly the axes dp and tp").
        for given, full in (("tp=4", "dp=1,tp=4"), ("dp=4", "dp=4,tp=1")):
            with self.subTest(given):
                res = self.mpirun(4, "--scenario", "flux_tp", "--mesh", given)
                self.assertExit(res, 0)
                self.assertEqual(res.report["mesh"], full)
        # An axis the scenario does not have is still an error naming it.
        res = self.mpirun(4, "--scenario", "flux_tp", "--mesh", "sp=4")
        self.assertExit(res, 2)
        self.assertIn("sp", res.err)

    def test_options_come_from_rank_0_for_every_rank(self):
        # Rank 0's environment holds for all: its bad flag ends every rank at once...
        res = self.mpmd(env_on_rank=0)
        self.assertEqual(res.returncode, 2, msg=res.stdout + res.stderr)
        self.assertEqual(res.stderr.count("unknown flag 'bogus'"), 1, msg=res.stderr)
        # ...and another rank's differing environment does not split the job.
        res = self.mpmd(env_on_rank=2)
        self.assertEqual(res.returncode, 0, msg=res.stdout + res.stderr)
        self.assertIn("PASS", res.stdout)

    def test_bad_mesh_string(self):
        self.expect_usage_error(2, "--scenario", "timestep_broadcast", "--mesh", "dp=two",
                                needles=["dp=two"])

    def test_mesh_does_not_fit_world(self):
        self.expect_usage_error(4, "--scenario", "timestep_broadcast", "--mesh", "dp=2,tp=4",
                                needles=["dp=2,tp=4", "8 ranks", "has 4"])

    def test_unknown_scenario(self):
        self.expect_usage_error(2, "--scenario", "nope", needles=["unknown scenario 'nope'",
                                                                 "timestep_broadcast"])

    def test_missing_scenario(self):
        self.expect_usage_error(2, needles=["--scenario"])

    def test_bad_scenario_options_name_what_is_known(self):
        for option, value, needles in (("--flag", "turbo=1", ["unknown flag 'turbo'", "async_bcast"]),
                                       ("--flag", "async_bcast=maybe", ["async_bcast"]),
                                       ("--inject", "gremlin", ["unknown fault 'gremlin'", "timestep_temp_broadcast"]),
                                       ("--dtype", "int8", ["int8"])):
            with self.subTest(option=option, value=value):
                self.expect_usage_error(2, "--scenario", "timestep_broadcast", option, value, needles=needles)

    def test_unknown_option(self):
        self.expect_usage_error(2, "--scenario", "timestep_broadcast", "--frobnicate")

    def test_unwritable_output_is_an_error(self):
        res = self.run_cmd(["mpirun", "-n", "2", __import__("e2e").EXE, "--scenario",
                            "timestep_broadcast", "--out", "/proc/diffcheck/x.h5"])
        self.assertExit(res, 2)
        self.assertIn("x.h5", res.err)

    def test_help_and_list(self):
        res = self.diffcheck("--help")
        self.assertExit(res, 0)
        self.assertIn("Exit status", res.out)
        res = self.diffcheck("list")
        self.assertExit(res, 0)
        self.assertIn("timestep_temp_broadcast", res.out)
        res = self.diffcheck("compare", "--help")
        self.assertExit(res, 0)


if __name__ == "__main__":
    import unittest
    unittest.main()
