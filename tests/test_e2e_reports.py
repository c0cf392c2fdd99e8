"""Reports for CI systems: --junit on a run and on compare, parsed with
Debian's python3-junitparser as a CI dashboard would, and the per-rank
statistics of the JSON report."""
import unittest
import xml.etree.ElementTree as ET

from junitparser import Failure, JUnitXml

from e2e import CHROMIUM, E2ETest


class JUnitReports(E2ETest):
    def junit(self, name):
        path = self.path(name)
        self.assertValidJUnit(path)
        root = ET.parse(path).getroot()
        self.assertEqual(root.tag, "testsuites")  # some consumers need this root
        return JUnitXml.fromfile(path)

    def test_faulted_run_one_case_per_tap_and_the_first_divergence(self):
        res = self.mpirun(4, "--scenario", "flux_tp", "--mesh", "dp=1,tp=4", "--inject",
                          "proj_out_contiguous", "--junit", self.path("run.xml"))
        self.assertExit(res, 1)
        xml = self.junit("run.xml")
        suites = list(xml)
        self.assertEqual(len(suites), 1)
        suite = suites[0]
        self.assertIn("flux_tp", suite.name)
        self.assertIn("inject=proj_out_contiguous", suite.name)
        taps = [t["name"] for t in res.report["taps"]]
        cases = list(suite)
        self.assertEqual([c.name for c in cases], taps)
        failing = {t["name"] for t in res.report["taps"] if not t["pass"]}
        self.assertEqual({c.name for c in cases if c.result and isinstance(c.result[0], Failure)}, failing)
        self.assertEqual(suite.failures, len(failing))
        self.assertEqual(suite.errors, 0)
        first = res.report["first_divergence"]["tap"]
        self.assertEqual(first, "proj_out/weight")
        case = next(c for c in cases if c.name == first)
        self.assertIn("first divergence", case.result[0].message)
        self.assertIn("First divergence: tap 'proj_out/weight'", case.result[0].text)
        self.assertIn("reference DISAGREES", case.result[0].text)
        self.assertGreater(suite.time, 0)
        self.assertTrue(all(c.classname == "diffcheck.flux_tp" for c in cases))

    def test_clean_run_and_compare_of_its_file_pass(self):
        res = self.mpirun(4, "--scenario", "timestep_broadcast", "--junit", self.path("run.xml"))
        self.assertExit(res, 0)
        suite = list(self.junit("run.xml"))[0]
        self.assertEqual((suite.failures, suite.errors), (0, 0))
        self.assertEqual(suite.tests, len(res.report["taps"]))
        cmp = self.diffcheck("compare", self.path("run.h5"), "--junit", self.path("cmp.xml"))
        self.assertExit(cmp, 0)
        again = list(self.junit("cmp.xml"))[0]
        self.assertEqual([c.name for c in again], [c.name for c in suite])
        self.assertTrue(again.name.startswith("compare "))


@unittest.skipUnless(CHROMIUM, "chromium is not installed (scripts/setup.sh installs it)")
class HtmlReports(E2ETest):
    def test_faulted_run_page_shows_the_first_divergence_and_every_cell(self):
        page = self.path("run.html")
        res = self.mpirun(4, "--scenario", "flux_tp", "--mesh", "dp=2,tp=2", "--inject", "proj_out_contiguous",
                          "--html", page)
        self.assertExit(res, 1)
        dom, errors, _ = self.browse(page)
        self.assertEqual(errors, [])
        first = dom.find(id="first-divergence")
        self.assertEqual(len(first), 1)
        self.assertIn("First divergence: tap 'proj_out/weight'", first[0][2])
        taps = [t["name"] for t in res.report["taps"]]
        cells = dom.find("rect", **{"class": "cell"})
        self.assertEqual(len(cells), len(taps) * 4)  # every tap x rank
        self.assertEqual([c[1]["data-tap"] for c in cells[::4]], taps)
        # The failing taps' cells are red, the others not; the first divergent row is marked.
        failing = {t["name"] for t in res.report["taps"] if not t["pass"]}
        for c in cells:
            self.assertEqual("fail" in c[1]["class"].split(), c[1]["data-tap"] in failing, c[1])
        rows = dom.find("tr", **{"class": "first"})
        self.assertEqual([r[1]["data-tap"] for r in rows], ["proj_out/weight"])
        # Hovering shows the numbers: each cell has a tooltip naming tap, rank and err/tol.
        self.assertIn("err/tol", dom.find("title")[-1][2] if dom.find("title") else "")

    def test_replica_mismatch_and_nan_get_their_own_colours(self):
        page = self.path("ts.html")
        res = self.mpirun(4, "--scenario", "timestep_broadcast", "--inject", "timestep_temp_broadcast",
                          "--html", page)
        self.assertExit(res, 1)
        dom, errors, _ = self.browse(page)
        self.assertEqual(errors, [])
        first_tap = res.report["first_divergence"]["tap"]
        row = [c for c in dom.find("rect", **{"class": "cell"}) if c[1]["data-tap"] == first_tap]
        self.assertEqual([("replica" in c[1]["class"].split()) for c in row], [False, True, True, True])

    def test_clean_compare_page(self):
        res = self.mpirun(2, "--scenario", "timestep_broadcast")
        self.assertExit(res, 0)
        page = self.path("cmp.html")
        self.assertExit(self.diffcheck("compare", self.path("run.h5"), "--html", page), 0)
        dom, errors, _ = self.browse(page)
        self.assertEqual(errors, [])
        self.assertEqual(len(dom.find(id="all-pass")), 1)
        self.assertEqual(dom.find(id="first-divergence"), [])
        self.assertEqual(dom.find("rect", **{"class": "fail"}), [])


class PerRankStatistics(E2ETest):
    def test_every_rank_has_its_numbers_and_the_faulty_block_stands_out(self):
        # timestep_temp_broadcast: ranks other than 0 hold a stale timestep.
        res = self.mpirun(4, "--scenario", "timestep_broadcast", "--inject", "timestep_temp_broadcast")
        self.assertExit(res, 1)
        first = res.report["first_divergence"]["tap"]
        tap = next(t for t in res.report["taps"] if t["name"] == first)
        ranks = tap["ranks"]
        for key in ("nonfinite", "replica_diff"):
            self.assertEqual(len(ranks[key]), 4, msg=key)
        bad = [r for r in range(4) if ranks["replica_diff"][r] != 0]
        self.assertEqual(bad, tap["replica"]["differing_ranks"])
        self.assertEqual(bad, [1, 2, 3])
        self.assertEqual(ranks["replica_diff"][1], 1000.0)  # |t at step 0 - stale 0|
        self.assertEqual(ranks["nonfinite"], [0, 0, 0, 0])

    def test_a_ranks_cell_is_its_own_block_not_the_whole_tensors(self):
        """Only rank 1's half is wrong: rank 0's err/tol is its own (it was raised to the whole tensor's rel L2
        ratio, painting rank 0 red), rank 1's carries its own rel L2 too, and the page marks the tap failing."""
        import h5py
        import numpy as np
        rng = np.random.default_rng(0)
        whole = rng.standard_normal((8, 16))
        prefix = self.path("halves")
        for r in range(2):
            piece = whole[r * 4:(r + 1) * 4].astype(np.float32)
            if r == 1:
                piece = piece * np.float32(1 + 1e-5)  # every element a little off: the rel L2 fails
            with h5py.File(f"{prefix}.rank{r}.h5", "w") as f:
                f.attrs.update({"diffcheck_schema": 1, "mesh": "tp=2", "world_size": 2, "rank": r})
                f.create_dataset("taps/x", data=piece).attrs.update({"spec": "tp,-", "order": 0, "rounding_steps": 1,
                                                                      "reduction_depth": 16})  # a rel L2 limit
                if r == 0:
                    f.create_dataset("reference/x", data=whole)
        page = self.path("halves.html")
        res = self.diffcheck("compare", prefix, "--html", page, json=True)
        self.assertExit(res, 1)
        tap = res.report["taps"][0]
        own = tap["ranks"]["err_over_tol"]
        self.assertLess(own[0], 0.1)  # its float32 rounding only
        self.assertGreater(own[1], 1)
        self.assertEqual(tap["failed_checks"], ["reference"])
        if CHROMIUM:
            dom, errors, _ = self.browse(page)
            self.assertEqual(errors, [])
            cells = [c for c in dom.find("rect", **{"class": "cell"}) if c[1]["data-tap"] == "x"]
            self.assertEqual([("fail" in c[1]["class"].split()) for c in cells], [False, True])

if __name__ == "__main__":
    import unittest
    unittest.main()
