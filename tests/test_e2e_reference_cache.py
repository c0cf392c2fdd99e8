"""The reference cache (--reference-cache) and the run's profile (--profile),
end to end: a hit gives the same report as a miss, also for a run with a
fault; a changed seed, dtype, mesh, flag or executable misses; a damaged entry
is recomputed with a warning, never trusted; two runs of one key at once leave
a good entry; 'off' makes none. The profile counts the sharded block's GEMM
work exactly."""
import glob
import json
import os
import subprocess
import unittest

from e2e import EXE, MPIEXEC, TIMEOUT, E2ETest

# The report apart from what may differ between a hit and a miss.
VOLATILE = ("timings", "reference_source", "profile")


def stable(report):
    return {k: v for k, v in report.items() if k not in VOLATILE}


class ReferenceCache(E2ETest):
    def setUp(self):
        super().setUp()
        self.cache = self.path("cache")

    def run4(self, *args, cache=None, mesh="tp=4"):
        return self.mpirun(4, "--scenario", "flux_tp", "--mesh", mesh,
                           "--reference-cache", cache or self.cache, *args)

    def test_hit_gives_the_report_of_a_miss_also_with_a_fault(self):
        miss = self.run4()
        self.assertExit(miss, 0)
        self.assertIn("reference: computed (not in the cache), stored in the cache", miss.out)
        self.assertEqual(len(glob.glob(os.path.join(self.cache, "*", "rank*.ref"))), 4)
        hit = self.run4()
        self.assertExit(hit, 0)
        self.assertIn("reference: from the cache", hit.out)
        self.assertIn("from the cache", hit.report["reference_source"])
        self.assertEqual(stable(hit.report), stable(miss.report))
        # The key leaves the fault out: a faulty run takes the clean run's
        # references and is caught exactly as without the cache.
        faulty = self.run4("--inject", "proj_out_bias_every_rank")
        self.assertExit(faulty, 1)
        self.assertIn("reference: from the cache", faulty.out)
        self.assertFirstDivergence(faulty, "proj_out/partial", ["reference"])
        uncached = self.run4("--inject", "proj_out_bias_every_rank", cache="off")
        self.assertExit(uncached, 1)
        self.assertNotIn("reference:", uncached.out)
        self.assertEqual(stable(faulty.report), stable(uncached.report))

    def test_pipeline_hit_gives_the_report_of_a_miss(self):
        # The forced mode starts every step from the reference's latents,
        # kept in the entry: a hit skips the float64 loop and must give the
        # same report, with a fault too, and with the decode after the loop.
        def pipeline(*args, cache=None):
            return self.mpirun(4, "--scenario", "flux_pipeline", "--size", "tiny", "--mesh", "cfg=2,ring=2",
                               "--reference-cache", cache or self.cache, *args)
        for extra in ([], ["--flag", "vae_decode=true"], ["--reference-mode", "free"]):
            with self.subTest(extra=extra):
                miss = pipeline(*extra)
                self.assertExit(miss, 0)
                self.assertIn("reference: computed (not in the cache), stored in the cache", miss.out)
                hit = pipeline(*extra)
                self.assertExit(hit, 0)
                self.assertIn("reference: from the cache", hit.out)
                self.assertEqual(stable(hit.report), stable(miss.report))
        faulty = pipeline("--inject", "text_kv_rotated", "--fault-scale", "0.5")
        self.assertExit(faulty, 1)
        self.assertIn("reference: from the cache", faulty.out)
        uncached = pipeline("--inject", "text_kv_rotated", "--fault-scale", "0.5", cache="off")
        self.assertExit(uncached, 1)
        self.assertEqual(stable(faulty.report), stable(uncached.report))
        # Step caching: the reference follows the sharded run's decisions,
        # so nothing is cached.
        entries = len(os.listdir(self.cache))
        stepcache = pipeline("--flag", "cache_threshold=0.3")
        self.assertExit(stepcache, 0)
        self.assertNotIn("reference: from the cache", stepcache.out)
        self.assertEqual(len(os.listdir(self.cache)), entries)

    def test_what_the_reference_depends_on_misses(self):
        self.assertExit(self.run4(), 0)
        for change in (["--seed", "7"], ["--dtype", "bfloat16"], ["--mesh", "dp=2,tp=2"],
                       ["--flag", "async_allreduce=true"]):
            with self.subTest(change=change):
                res = self.run4(mesh=change[1]) if change[0] == "--mesh" else self.run4(*change)
                self.assertExit(res, 0)
                self.assertIn("reference: computed (not in the cache)", res.out)
        # Every one made an entry of its own.
        self.assertEqual(len(os.listdir(self.cache)), 5)

    def test_another_executable_misses(self):
        self.assertExit(self.run4(), 0)
        # The same program without its build id: the key falls back to a hash
        # of the executable's bytes, which no entry was made with.
        other = self.path("diffcheck_other")
        subprocess.run(["objcopy", "--remove-section", ".note.gnu.build-id", EXE, other], check=True)
        res = self.run_cmd([MPIEXEC, "-n", "4", other, "--scenario", "flux_tp", "--mesh", "tp=4",
                            "--reference-cache", self.cache, "--out", self.path("o.h5")])
        self.assertExit(res, 0)
        self.assertIn("reference: computed (not in the cache)", res.out)
        self.assertEqual(len(os.listdir(self.cache)), 2)

    def test_damaged_entry_is_recomputed_with_a_warning(self):
        self.assertExit(self.run4(), 0)
        [entry] = glob.glob(os.path.join(self.cache, "*"))
        for damage in ("flip", "truncate"):
            with self.subTest(damage=damage):
                victim = os.path.join(entry, "rank2.ref")
                with open(victim, "r+b") as f:
                    if damage == "truncate":
                        f.truncate(os.path.getsize(victim) // 2)
                    else:
                        f.seek(os.path.getsize(victim) - 100)
                        b = f.read(1)
                        f.seek(os.path.getsize(victim) - 100)
                        f.write(bytes([b[0] ^ 1]))
                res = self.run4()
                self.assertExit(res, 0)
                self.assertIn("rank 2: reference cache entry", res.err)
                self.assertIn("computing the references again", res.err)
                self.assertIn("entry damaged on rank 2", res.out)
                again = self.run4()
                self.assertIn("reference: from the cache", again.out)

    def test_two_runs_of_one_key_at_once(self):
        procs = [subprocess.Popen([MPIEXEC, "-n", "4", EXE, "--scenario", "flux_tp", "--mesh", "tp=4",
                                   "--reference-cache", self.cache, "--out", self.path(f"c{i}.h5")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            self.assertEqual(p.returncode, 0, out + err)
        self.assertEqual(glob.glob(os.path.join(self.cache, "*", "*.tmp.*")), [])
        res = self.run4()
        self.assertExit(res, 0)
        self.assertIn("reference: from the cache", res.out)

    def test_off_makes_no_cache(self):
        res = self.run4(cache="off")
        self.assertExit(res, 0)
        self.assertNotIn("reference:", res.out)
        self.assertFalse(os.path.exists(self.cache))

    def test_default_is_results_cache_of_the_working_directory(self):
        env = {k: v for k, v in os.environ.items() if k != "DIFFCHECK_REFERENCE_CACHE"}
        proc = subprocess.run([MPIEXEC, "-n", "2", EXE, "--scenario", "unreduced_reshard"], cwd=self.dir,
                              env=env, capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(os.path.join(self.dir, "results", "cache"), proc.stdout)
        self.assertTrue(glob.glob(os.path.join(self.dir, "results", "cache", "*", "rank1.ref")))


    def test_calibration_floors_are_cached_too(self):
        env = dict(os.environ, DIFFCHECK_LOG="info")
        outs = []
        for i in range(2):
            proc = subprocess.run([EXE, "calibrate", "--scenario", "unreduced_reshard", "--runs", "2",
                                   "--reference-cache", self.cache, "-o", self.path(f"tol{i}.json")],
                                  env=env, capture_output=True, text=True, timeout=TIMEOUT)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            outs.append(proc.stderr)
        self.assertNotIn("noise floors read from the reference cache", outs[0])
        self.assertIn("noise floors read from the reference cache", outs[1])
        floors = [json.load(open(self.path(f"tol{i}.json")))["taps"] for i in range(2)]
        self.assertEqual(floors[0], floors[1])
        # Other runs, another entry.
        proc = subprocess.run([EXE, "calibrate", "--scenario", "unreduced_reshard", "--runs", "3",
                               "--reference-cache", self.cache, "-o", self.path("tol3.json")],
                              env=env, capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn("noise floors read from the reference cache", proc.stderr)


class Profile(E2ETest):
    def test_profile_counts_the_sharded_gemms_exactly(self):
        res = self.mpirun(4, "--scenario", "flux_tp", "--mesh", "tp=4", "--reference-cache", "off", "--profile")
        self.assertExit(res, 0)
        for word in ("Profile (4 ranks", "sharded", "references", "write", "check", "GEMM peak"):
            self.assertIn(word, res.out)
        p = res.report["profile"]
        # flux_tp's default size per tp rank (tp = 4): d = 256, mlp = 1024, 256
        # tokens, 4 of the 16 heads of 16: adaLN, q/k/v, mlp, attention, proj_out.
        d, m, n, tp, hd, heads = 256, 1024, 256, 4, 16, 16
        per_rank = (2 * 1 * 3 * d * d + 3 * 2 * n * (d // tp) * d + 2 * n * (m // tp) * d
                    + (heads // tp) * 2 * (2 * n * n * hd) + 2 * n * d * (d // tp + m // tp))
        self.assertAlmostEqual(p["sharded_gflop"], 4 * per_rank / 1e9, places=9)
        self.assertGreater(p["references_gflop"], 0)
        self.assertGreater(p["peak_float32_gflops"], 0)
        self.assertGreater(p["peak_float64_gflops"], 0)
        self.assertGreater(p["sharded_peak_fraction"], 0)
        self.assertGreater(p["write_mb_per_s"], 0)


if __name__ == "__main__":
    unittest.main()
