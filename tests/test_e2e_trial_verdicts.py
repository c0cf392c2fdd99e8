"""Trials are judged honestly: a full set (or baseline) that errs, crashes or
hangs is named as such and bisect exits 2 instead of "nothing to bisect";
--fail-on makes a crash or hang the failure to hunt; a timed-out or
interrupted trial leaves no process behind, also MPI ranks that ignore
SIGTERM; errors and time-outs are not cached; the cache key covers the
environment."""
import json
import os
import signal
import subprocess
import time

from e2e import EXE, MPIEXEC, E2ETest, live_processes


def alive(marker):
    """Processes whose command line starts with `marker`."""
    return [(pid, cmd) for pid, cmd in live_processes() if cmd.startswith(marker)]


class TrialVerdicts(E2ETest):
    def bisect(self, *args):
        js = self.path("bisect.json")
        if os.path.exists(js):
            os.remove(js)
        res = self.diffcheck("bisect", "--json", js, *args)
        if not os.path.exists(js):
            return res, None
        with open(js) as f:
            return res, json.load(f)

    def test_full_set_with_an_unknown_flag_is_an_error_not_a_pass(self):
        res, rep = self.bisect("--scenario", "timestep_broadcast", "-n", "2", "--flags", "bogus_flag,async_bcast",
                               "--cache", "")
        self.assertExit(res, 2)
        self.assertEqual(rep["result"], "full_set_not_failing")
        self.assertEqual(rep["full_set"], "error")
        self.assertIn("the full set ended in an error", res.out)
        self.assertIn("unknown flag 'bogus_flag'", res.out)
        self.assertNotIn("passes", res.out)

    def test_full_set_that_times_out(self):
        res, rep = self.bisect("--env", "X", "--flags", "a,b", "--timeout", "1", "--cache", "", "--",
                               "sh", "-c", 'test -z "$X" || sleep 30')
        self.assertExit(res, 2)
        self.assertEqual(rep["full_set"], "timed out")
        self.assertIn("the full set timed out in 1 of 1 runs", res.out)
        self.assertIn("--fail-on", res.out)

    def test_fail_on_timeout_hunts_the_hang(self):
        res, rep = self.bisect("--env", "X", "--flags", "a,b,c", "--timeout", "1", "--fail-on", "timeout",
                               "--cache", "", "--", "sh", "-c", 'case "$X" in *b*) sleep 30;; esac')
        self.assertExit(res, 1)
        self.assertEqual(rep["minimal"], ["b"])

    def test_crashes_are_crashes(self):
        # A signal, a shell's 128+signal exit (mpirun's when a rank segfaults)
        # and mpirun's own words about a rank killed by a signal.
        for cmd in ('test -z "$X" || kill -SEGV $$', 'test -z "$X" || exit 139',
                    'test -z "$X" || { echo "mpirun noticed that process rank 1 with PID 7 on node h exited on '
                    'signal 6 (Aborted)."; exit 1; }'):
            with self.subTest(cmd=cmd):
                res, rep = self.bisect("--env", "X", "--flags", "a,b", "--repeat", "2", "--cache", "", "--",
                                       "sh", "-c", cmd)
                self.assertExit(res, 2)
                self.assertEqual(rep["full_set"], "crashed")
                self.assertIn("the full set crashed in 2 of 2 runs", res.out)
        res, rep = self.bisect("--env", "X", "--flags", "a,b", "--fail-on", "crash", "--cache", "", "--",
                               "sh", "-c", 'case "$X" in *a*) kill -SEGV $$;; esac')
        self.assertExit(res, 1)
        self.assertEqual(rep["minimal"], ["a"])

    def test_a_segfaulting_rank_under_mpirun(self):
        res, rep = self.bisect("--env", "X", "--flags", "a,b", "--cache", "", "--",
                               MPIEXEC, "-n", "2", "sh", "-c", 'test -z "$X" || test "$OMPI_COMM_WORLD_RANK" = 0 || kill -SEGV $$')
        self.assertExit(res, 2)
        self.assertEqual(rep["full_set"], "crashed")

    def test_missing_program_is_an_error(self):
        res, rep = self.bisect("--env", "X", "--flags", "a,b", "--cache", "", "--", "/nonexistent/prog")
        self.assertExit(res, 2)
        self.assertEqual(rep["baseline"], "error")
        self.assertIn("command not found", res.out)

    def test_timed_out_mpi_ranks_that_ignore_sigterm_are_ended(self):
        marker = f"sleep 3{os.getpid() % 1000:03d}"
        res, rep = self.bisect("--env", "X", "--flags", "a,b", "--timeout", "2", "--cache", "", "--",
                               MPIEXEC, "-n", "2", "sh", "-c", f'trap "" TERM; test -z "$X" || {marker}')
        self.assertExit(res, 2)
        self.assertEqual(rep["full_set"], "timed out")
        time.sleep(0.5)
        self.assertEqual(alive(marker), [])

    def test_sigint_ends_the_trial_and_exits_2(self):
        marker = f"sleep 4{os.getpid() % 1000:03d}"
        proc = subprocess.Popen([EXE, "bisect", "--env", "X", "--flags", "a,b", "--cache", self.path("c.jsonl"),
                                 "--", MPIEXEC, "-n", "2", "sh", "-c", f'trap "" TERM INT; test -z "$X" || {marker}'],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not alive(marker) and time.time() < deadline:
            time.sleep(0.1)
        self.assertTrue(alive(marker), "the trial never started")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 2, msg=out + err)
        self.assertIn("INTERRUPTED", out)
        self.assertIn("| 1 | {} | pass |", out)  # the trials so far are shown
        time.sleep(0.5)
        self.assertEqual(alive(marker), [])
        self.assertFalse(os.path.exists(f"/tmp/diffcheck_bisect_{proc.pid}"))
        # Only the finished baseline is in the cache: the interrupted trial reruns.
        with open(self.path("c.jsonl")) as f:
            lines = f.read().split("\n")
        self.assertEqual(len([l for l in lines if l.strip()]), 1)

    def test_sigint_ends_a_sweep(self):
        marker = f"sleep 5{os.getpid() % 1000:03d}"
        proc = subprocess.Popen([EXE, "sweep", "--all-subsets", "--flags", "a,b", "--env", "X", "--warmup", "0",
                                 "--", "sh", "-c", marker], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not alive(marker) and time.time() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 2, msg=out + err)
        self.assertIn("INTERRUPTED", out)
        self.assertNotIn("★", out)
        time.sleep(0.3)
        self.assertEqual(alive(marker), [])

    def test_cache_skips_errors_and_follows_the_environment(self):
        cache = self.path("cache.jsonl")
        args = ["--env", "X", "--flags", "a,b", "--cache", cache, "--", "sh", "-c", 'test -z "$X" || exit 1']
        res, rep = self.bisect(*args)
        self.assertExit(res, 1)
        res, rep = self.bisect(*args)
        self.assertEqual(rep["fresh"], 0)
        env = dict(os.environ, DIFFCHECK_TEST_KNOB="1")
        proc = subprocess.run([EXE, "bisect", "--json", self.path("b2.json"), *args], env=env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        self.assertEqual(proc.returncode, 1, msg=proc.stdout + proc.stderr)
        with open(self.path("b2.json")) as f:
            self.assertGreater(json.load(f)["fresh"], 0)
        err_args = ["--env", "X", "--flags", "a,b", "--cache", cache, "--", "/nonexistent/prog"]
        self.bisect(*err_args)
        res, rep = self.bisect(*err_args)
        self.assertEqual(rep["fresh"], 1)  # the error was not cached


if __name__ == "__main__":
    import unittest
    unittest.main()
