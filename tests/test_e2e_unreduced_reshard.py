"""unreduced_reshard and sweep-mesh: every factorization of 16 ranks passes
clean; with the fault exactly the meshes with dp == 2 fail, and the report says
the replicas differ across dp and by how much."""
import json
import os
import unittest

from junitparser import Failure, JUnitXml

from e2e import CHROMIUM, E2ETest


FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


# The dp = 2 meshes of the default run (all ten, of which the size allows
# nine, nightly): every axis split; fsdp, sp and tp each the largest it can be.
DP2_QUICK = ["dp=2,fsdp=2,sp=2,tp=2", "dp=2,fsdp=4,sp=2,tp=1", "dp=2,fsdp=1,sp=8,tp=1", "dp=2,fsdp=1,sp=1,tp=8"]


def dp_of(mesh):
    return int(dict(p.split("=") for p in mesh.split(","))["dp"])


class UnreducedReshard(E2ETest):
    def sweep(self, *extra):
        js = self.path("sweep.json")
        res = self.diffcheck("sweep-mesh", "--scenario", "unreduced_reshard", "-n", "16",
                             "--timeout", "300", "--json", js, "--junit", self.path("sweep.xml"),
                             "--html", self.path("sweep.html"), *extra)
        with open(js) as f:
            return res, json.load(f)

    def test_clean_every_mesh_passes(self):
        if FULL:
            res, table = self.sweep()
            self.assertEqual(len(table["rows"]) + len(table["skipped"]), 35)  # C(7,3) ordered factorizations
            self.assertGreaterEqual(len(table["rows"]), 30)
        else:  # some meshes the fault breaks (the others pass in the fault's sweep); every one nightly
            res, table = self.sweep(*[a for m in DP2_QUICK for a in ("--mesh", m)])
            self.assertEqual(len(table["rows"]), len(DP2_QUICK))
        self.assertExit(res, 0)
        for row in table["rows"]:
            self.assertEqual(row["verdict"], "PASS", row)

    def test_fault_fails_exactly_where_dp_is_2(self):
        # Every mesh nightly; by default some dp = 2 meshes and four others
        # (dp = 1, 4, 8 and the one the size does not allow).
        meshes = [] if FULL else DP2_QUICK + ["dp=1,fsdp=2,sp=2,tp=4", "dp=4,fsdp=1,sp=1,tp=4",
                                              "dp=8,fsdp=1,sp=1,tp=2", "dp=16,fsdp=1,sp=1,tp=1"]
        res, table = self.sweep("--inject", "skip_unreduced_allreduce", *[a for m in meshes for a in ("--mesh", m)])
        self.assertExit(res, 1)
        self.assertEqual(len(table["rows"]) + len(table["skipped"]), 35 if FULL else len(DP2_QUICK) + 4)
        self.assertTrue(any(dp_of(r["mesh"]) != 2 for r in table["rows"]))
        for row in table["rows"]:
            with self.subTest(mesh=row["mesh"]):
                if dp_of(row["mesh"]) == 2:
                    self.assertEqual(row["verdict"], "FAIL")
                    self.assertEqual(row["first_divergence"], "result")
                    self.assertIn("replicas differ across dp (max diff", row["detail"])
                else:
                    self.assertEqual(row["verdict"], "PASS")
        # JUnit: one case per mesh (skipped ones too), the dp=2 meshes failing.
        self.assertValidJUnit(self.path("sweep.xml"))
        suite = list(JUnitXml.fromfile(self.path("sweep.xml")))[0]
        self.assertEqual(suite.tests, len(table["rows"]) + len(table["skipped"]))
        self.assertEqual(suite.skipped, len(table["skipped"]))
        failing = {c.name for c in suite if c.result and isinstance(c.result[0], Failure)}
        self.assertEqual(failing, {r["mesh"] for r in table["rows"] if dp_of(r["mesh"]) == 2})
        case = next(c for c in suite if c.name in failing)
        self.assertIn("first divergent tap 'result'", case.result[0].message)
        # HTML: the mesh x tap heatmap, in a real browser: exactly the dp=2 rows
        # carry a failing (replica) cell, marked as their first divergence.
        if CHROMIUM:
            dom, errors, _ = self.browse(self.path("sweep.html"))
            self.assertEqual(errors, [])
            firsts = dom.find("rect", **{"class": "first"})
            self.assertEqual({c[1]["data-mesh"] for c in firsts}, failing)
            self.assertTrue(all(c[1]["data-tap"] == "result" and "replica" in c[1]["class"].split() for c in firsts))
            meshes = {c[1]["data-mesh"] for c in dom.find("rect", **{"class": "cell"})}
            self.assertEqual(meshes, {r["mesh"] for r in table["rows"]})
        self.assertIn(f"{9 if FULL else len(DP2_QUICK)} fail", res.out)

    def test_single_run_reports_dp_replicas_differ(self):
        res = self.mpirun(16, "--scenario", "unreduced_reshard", "--inject", "skip_unreduced_allreduce")
        self.assertExit(res, 1)
        fd = self.assertFirstDivergence(res, "result", ["reference", "replica"])
        worst = res.report["taps"][2]["replica"]["worst"]
        self.assertEqual(worst["axes"], ["dp"])  # every differing rank is across dp only
        self.assertEqual(worst["other"] - worst["leader"], 8)
        self.assertIn("replicas DIFFER across dp", fd["summary"])

    def test_other_rank_counts(self):
        for n in (1, 2, 4, 8):
            with self.subTest(ranks=n):
                self.assertExit(self.mpirun(n, "--scenario", "unreduced_reshard"), 0)

    def test_mesh_the_size_does_not_allow(self):
        res = self.mpirun(16, "--scenario", "unreduced_reshard", "--mesh", "dp=16,fsdp=1,sp=1,tp=1",
                          json=False)
        self.assertExit(res, 2)
        self.assertIn("does not split 16 ways", res.err)


if __name__ == "__main__":
    unittest.main()
