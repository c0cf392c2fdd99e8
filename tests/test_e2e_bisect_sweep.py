"""diffcheck bisect and sweep end to end: a scenario's two-flag miscompile, an
external command under XLA_FLAGS, a hanging trial, an interrupted bisect that
resumes from its cache, a flaky command, and the correctness-gated leaderboard."""
import json
import os
import unittest

from junitparser import JUnitXml

from e2e import CHROMIUM, E2ETest

# Fails when both --xla_c and --xla_f are in XLA_FLAGS; hangs when --xla_h is
# there without --xla_a.
XLA_SCRIPT = r'''
f=" $XLA_FLAGS "
if [ -n "$COUNT" ]; then echo x >> "$COUNT"; fi
case "$f" in *" --xla_h "*) case "$f" in *" --xla_a "*) ;; *) sleep 60;; esac;; esac
case "$f" in *" --xla_c "*) case "$f" in *" --xla_f "*) exit 1;; esac;; esac
exit 0
'''


class BisectSweep(E2ETest):
    def script(self):
        p = self.path("job.sh")
        with open(p, "w") as f:
            f.write(XLA_SCRIPT)
        return p

    def bisect(self, *args):
        js = self.path("bisect.json")
        res = self.diffcheck("bisect", "--json", js, *args)
        report = json.load(open(js)) if os.path.exists(js) else None
        return res, report

    def test_scenario_miscompile_bisects_to_the_overlap_pair(self):
        res, rep = self.bisect("--scenario", "dit_ulysses", "-n", "4", "--inject", "a2a_read_before_wait",
                               "--flags", "async_a2a,overlap,fuse_qkv_a2a,ulysses_chunks=2,flash_block=32",
                               "--cache", "")
        self.assertExit(res, 1)
        self.assertEqual(rep["minimal"], ["async_a2a", "overlap"])

    def test_external_command_pair_in_xla_flags(self):
        flags = ",".join(f"--xla_{c}" for c in "abcdefgk")
        res, rep = self.bisect("--env", "XLA_FLAGS", "--flags", flags, "--cache", "",
                               "--junit", self.path("bisect.xml"), "--html", self.path("bisect.html"),
                               "--", "sh", self.script())
        self.assertExit(res, 1)
        self.assertEqual(rep["minimal"], ["--xla_c", "--xla_f"])
        # JUnit: one case per trial, in order; the failing trials are failures.
        self.assertValidJUnit(self.path("bisect.xml"))
        suite = list(JUnitXml.fromfile(self.path("bisect.xml")))[0]
        self.assertEqual(suite.tests, len(rep["trials"]))
        self.assertEqual(suite.failures, sum(t["outcome"] == "FAIL" for t in rep["trials"]))
        self.assertIn("found", suite.name)
        if CHROMIUM:  # the page: every trial a row, the minimal set named and its trial marked
            dom, errors, _ = self.browse(self.path("bisect.html"))
            self.assertEqual(errors, [])
            self.assertIn("{--xla_c, --xla_f}", dom.find(id="minimal")[0][2])
            self.assertEqual(len(dom.find("tr", **{"class": "pass"})) + len(dom.find("tr", **{"class": "fail"})),
                             len(rep["trials"]))
            self.assertGreaterEqual(len(dom.find("tr", **{"class": "first"})), 1)

    def test_placeholder_instead_of_environment(self):
        res, rep = self.bisect("--flags", "--xla_a,--xla_c,--xla_f", "--cache", "", "--",
                               "sh", "-c", 'XLA_FLAGS="$*" sh ' + self.script(), "_", "{flags}")
        self.assertExit(res, 1)
        self.assertEqual(rep["minimal"], ["--xla_c", "--xla_f"])

    def test_hanging_trial_is_killed_and_recorded(self):
        res, rep = self.bisect("--env", "XLA_FLAGS", "--flags", "--xla_a,--xla_c,--xla_h,--xla_f",
                               "--timeout", "2", "--cache", "", "--", "sh", self.script())
        self.assertExit(res, 1)
        self.assertEqual(rep["minimal"], ["--xla_c", "--xla_f"])
        self.assertIn("timed out", [t["outcome"] for t in rep["trials"]])

    def test_interrupted_bisect_resumes_from_cache(self):
        cache, count = self.path("cache.jsonl"), self.path("count")
        env_args = ["--env", "XLA_FLAGS", "--flags", ",".join(f"--xla_{c}" for c in "abcdefgk"),
                    "--cache", cache, "--", "sh", "-c", f"COUNT={count} sh {self.script()}"]
        res, rep = self.bisect("--max-trials", "4", *env_args)
        self.assertExit(res, 2)
        self.assertIn("INTERRUPTED", res.out)
        self.assertEqual(len(open(count).read().split()), 4)
        res, rep = self.bisect(*env_args)
        self.assertExit(res, 1)
        self.assertEqual(rep["minimal"], ["--xla_c", "--xla_f"])
        self.assertEqual(rep["cached"], 4)
        self.assertEqual(len(open(count).read().split()), 4 + rep["fresh"])
        res, rep = self.bisect(*env_args)  # everything cached now: no trial runs
        self.assertEqual(rep["fresh"], 0)

    def test_flaky_command_is_reported(self):
        count = self.path("n")
        flaky = ('n=$(cat %s 2>/dev/null || echo 0); n=$((n+1)); echo $n > %s; '
                 'case "$XLA_FLAGS" in *--xla_a*) exit $((n %% 2));; esac; exit 0' % (count, count))
        res, rep = self.bisect("--env", "XLA_FLAGS", "--flags", "--xla_a,--xla_b", "--repeat", "2",
                               "--cache", "", "--", "sh", "-c", flaky)
        self.assertExit(res, 2)
        self.assertEqual(rep["result"], "flaky")
        self.assertIn("FLAKY", res.out)

    def test_sweep_never_stars_a_wrong_profile(self):
        js = self.path("sweep.json")
        res = self.diffcheck("sweep", "--scenario", "dit_ulysses", "-n", "4", "--inject",
                             "a2a_read_before_wait", "--all-subsets", "--flags", "async_a2a,overlap",
                             "--warmup", "0", "--runs", "2", "--json", js)
        self.assertExit(res, 1)
        rows = {r["name"]: r for r in json.load(open(js))["profiles"]}
        self.assertEqual(set(rows), {"baseline", "async_a2a", "overlap", "async_a2a+overlap"})
        self.assertEqual(rows["async_a2a+overlap"]["verdict"], "FAIL")
        self.assertFalse(rows["async_a2a+overlap"]["best"])
        self.assertEqual(sum(r["best"] for r in rows.values()), 1)
        best = next(r for r in rows.values() if r["best"])
        self.assertEqual(best["verdict"], "pass")
        self.assertIn("★", res.out)
        # The sharded run's own time apart from references and checking; the
        # star goes to the correct profile with the smallest run time.
        self.assertIn("| run s | check s |", res.out)
        for r in rows.values():
            self.assertEqual(len(r["run_times"]), 2)
            self.assertGreater(r["run_median"], 0)
            self.assertLess(r["run_median"] + r["check_median"], r["median"])
        correct = [r for r in rows.values() if r["verdict"] == "pass"]
        self.assertEqual(best["run_median"], min(r["run_median"] for r in correct))

    def test_sweep_profiles_file_and_external_command(self):
        prof = self.path("profiles.txt")
        with open(prof, "w") as f:
            f.write("# name: flags\nbaseline:\nfast: --xla_c\nbroken: --xla_c --xla_f\n")
        res = self.diffcheck("sweep", "--profiles", prof, "--env", "XLA_FLAGS", "--warmup", "0",
                             "--runs", "1", "--junit", self.path("sweep.xml"), "--html", self.path("sweep.html"),
                             "--", "sh", self.script())
        self.assertExit(res, 1)
        self.assertIn("| broken | --xla_c --xla_f |", res.out)
        self.assertValidJUnit(self.path("sweep.xml"))
        suite = list(JUnitXml.fromfile(self.path("sweep.xml")))[0]
        self.assertEqual([c.name for c in suite], ["baseline (-)", "fast (--xla_c)", "broken (--xla_c --xla_f)"])
        self.assertEqual([bool(c.result) for c in suite], [False, False, True])
        if CHROMIUM:  # the leaderboard: the wrong profile struck through, never starred
            dom, errors, _ = self.browse(self.path("sweep.html"))
            self.assertEqual(errors, [])
            wrong = dom.find("tr", **{"class": "wrong"})
            self.assertEqual([r[1]["data-profile"] for r in wrong], ["broken"])
            self.assertNotIn("★", wrong[0][2])
            best = dom.find("tr", **{"class": "best"})
            self.assertEqual(len(best), 1)
            self.assertIn("★", best[0][2])
            self.assertEqual(len(dom.find("rect", **{"class": "bar"})), 3)
        self.assertIn("WRONG", res.out)
        self.assertNotIn("run s", res.out)  # an external command has only its wall time

    def test_bad_usage(self):
        self.assertExit(self.diffcheck("bisect", "--flags", "a"), 2)  # neither scenario nor command
        self.assertExit(self.diffcheck("bisect", "--flags", "a", "--", "true"), 2)  # no way to pass flags
        self.assertExit(self.diffcheck("sweep", "--env", "X", "--", "true"), 2)  # no profiles


if __name__ == "__main__":
    unittest.main()
