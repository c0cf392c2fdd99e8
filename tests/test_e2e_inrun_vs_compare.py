"""A run whose file is written with MPI-IO checks its taps in its ranks'
memory (each block on its owner, only partial sums, differing replicas and
reference boxes moving); a later `diffcheck compare` reads the written file.
(A small gathered file is checked by rank 0 from the file itself, which is
what compare does: every other end-to-end test runs that way.) Both must give the same report:
same verdicts, first divergence, statistics and per-rank numbers, for every
scenario, clean and with a fault (with the flags it needs; every fault in the
nightly variant), at 16 ranks (1, 2, 4 and 16 in the nightly variant),
float32 and bfloat16."""
import json
import os
import subprocess
import unittest

from e2e import E2ETest, EXE, MPIEXEC

RANKS = [int(n) for n in os.environ.get("DIFFCHECK_INRUN_RANKS", "16").split(",")]
# The nightly variant (several rank counts) checks every fault of every scenario;
# the default run one per scenario: the first that leaves a file to compare
# (neither a crash nor a possible hang). The check code a fault reaches does
# not depend on which fault it is, only on what the taps show (NaN, replicas
# that differ, values past tolerance), and the scenarios' faults cover those.
ALL_FAULTS = len(RANKS) > 1


def faults_to_check(scenario):
    if ALL_FAULTS:
        return scenario["faults"]
    return [next(f for f in scenario["faults"] if not f["crashes_when"] and not f["may_hang"])]


def scenarios():
    out = subprocess.run([EXE, "list", "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def strip(report):
    """What a run adds to its report: its phase times, where its references came from."""
    report = dict(report)
    for k in ("timings", "reference_source", "profile"):
        report.pop(k, None)
    return report


class InRunMatchesCompare(E2ETest):
    def check(self, n, scenario, fault=None, flags=(), dtype="float32", size=None):
        args = ["--scenario", scenario, "--dtype", dtype, "--store", "mpiio"]  # checked in memory
        if size:
            args += ["--size", size]
        if fault:
            args += ["--inject", fault]
        for f in flags:
            args += ["--flag", f]
        for name in ("run.h5", "report.json", "cmp.json"):
            if os.path.exists(self.path(name)):
                os.remove(self.path(name))
        run = self.mpirun(n, *args)
        self.assertIn(run.code, (0, 1), msg=str(run))
        # A crash (lse_layout) or, ranks having taken different paths, a hang or
        # desync (per_rank_cache_decision): findings that leave no file to compare.
        if any(w in run.out + run.err for w in ("CRASH", "HANG: ", "DESYNC: ")):
            self.assertFalse(os.path.exists(self.path("run.h5")), msg=str(run))
            return run
        cmp = self.run_cmd([EXE, "compare", self.path("run.h5"), "--json", self.path("cmp.json")], "cmp.json")
        self.assertEqual(cmp.code, run.code, msg=f"{scenario} {fault} n={n}\nrun: {run}\ncompare: {cmp}")
        self.assertEqual(strip(run.report), strip(cmp.report), msg=f"{scenario} {fault} n={n} {dtype}")
        self.assertEqual(run.out.split("\n\n", 1)[-1], cmp.out.split("\n\n", 1)[-1])
        return run

    def test_every_scenario_and_fault(self):
        caught = 0
        for s in scenarios():
            for n in RANKS:
                # A pipeline's "tiny" size: the same code paths in a few steps.
                size = "tiny" if "tiny" in s["sizes"] else None
                with self.subTest(scenario=s["name"], n=n, fault=None):
                    self.assertEqual(self.check(n, s["name"], size=size).code, 0)
                for f in faults_to_check(s):
                    with self.subTest(scenario=s["name"], n=n, fault=f["name"]):
                        res = self.check(n, s["name"], f["name"], f["needs_flags"], size=size)
                        caught += res.code == 1
        self.assertGreater(caught, 0)  # faults were armed, not only clean runs

    def test_gathered_file_equals_mpiio_file(self):
        """--store gather (rank 0 writes, the rows come over MPI in pieces)
        writes the file --store mpiio writes, value for value, also in pieces
        of at most 1000 elements (slices split along the first dimension);
        so does --store pwrite (every rank at its offsets, O_DIRECT), also
        when the taps' part is begun beside the references (their bytes above
        the gather limit: DIFFCHECK_GATHER_MAX_MIB=0)."""
        files = {}
        for store, piece in (("mpiio", None), ("gather", None), ("gather", "1000"), ("pwrite", None),
                             ("pwrite", "begun")):
            env = dict(os.environ)
            if piece == "begun":
                env.update(DIFFCHECK_GATHER_MAX_MIB="0", DIFFCHECK_LOG="info")
            elif piece:
                env.update(DIFFCHECK_GATHER_ELEMENTS=piece)
            out = self.path(f"{store}{piece}.h5")
            res = subprocess.run([MPIEXEC, "-n", "16", EXE, "--scenario", "flux_tp", "--inject",
                                  "proj_out_contiguous", "--store", store, "--out", out], capture_output=True,
                                 text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
            self.assertEqual(res.returncode, 1, res.stderr)
            self.assertEqual("begun: the taps'" in res.stderr, piece == "begun", res.stderr[-3000:])
            files[(store, piece)] = out
        for key, out in files.items():
            diff = subprocess.run(["h5diff", files[("mpiio", None)], out], capture_output=True, text=True)
            self.assertEqual(diff.returncode, 0, f"{key}: {diff.stdout[-2000:]}")

    def test_bfloat16_and_lse_square(self):
        self.check(16, "flux_tp", "proj_out_contiguous", dtype="bfloat16")
        self.check(4, "usp_attention", "lse_layout", size="lse_square")
        self.check(16, "dit_ulysses", "a2a_read_before_wait", ["async_a2a=true", "overlap=true"], dtype="bfloat16")


if __name__ == "__main__":
    unittest.main()
