"""scripts/nightly.sh --quick end to end: the clean matrix passes (every clean
cell PASS, every fault caught at its documented first tap); a regression
injected through DIFFCHECK_NIGHTLY_INJECT fails with the right cell named and
the drift table showing it first; an interrupted night ends with one line
and resumes with the command it prints; the JUnit and the
index page are valid. Plus the drift rules on made-up nights.

The nights here cover three scenarios (a tolerance fault, a replica mismatch,
a crash expected); every scenario with DIFFCHECK_E2E_FULL=1 (the nightly
variant, e2e_nightly_quick_full). Each scenario's own e2e test checks that
its faults are caught at their first taps; this one checks the night's
machinery."""
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from junitparser import Failure, JUnitXml

from e2e import CHROMIUM, EXE, SCRIPTS, E2ETest

NIGHTLY = os.path.join(SCRIPTS, "nightly.sh")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"
SCENARIOS = None if FULL else ("timestep_broadcast", "flux_tp", "usp_attention")


def load_nightly_module():
    spec = importlib.util.spec_from_file_location("nightly", os.path.join(SCRIPTS, "nightly", "nightly.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def night(out, date, *args, env=None):
    if "--scenario" not in args and SCENARIOS:
        args += tuple(a for s in SCENARIOS for a in ("--scenario", s))
    return subprocess.run(["bash", NIGHTLY, "--quick", "--out", out, "--date", date, "--diffcheck", EXE, *args],
                          capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, **(env or {})))


def summary(out, date):
    with open(os.path.join(out, date, "summary.json")) as f:
        return json.load(f)


class QuickNight(E2ETest):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="diffcheck_nightly_")
        cls.clean = night(cls.root, "2026-01-01", env={"DIFFCHECK_NIGHTLY_INJECT": ""})
        cls.listing = [s for s in json.loads(subprocess.run([EXE, "list", "--json"], capture_output=True,
                                                            text=True).stdout)
                       if SCENARIOS is None or s["name"] in SCENARIOS]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def test_clean_matrix_passes_and_every_fault_is_caught_at_its_tap(self):
        self.assertEqual(self.clean.returncode, 0, self.clean.stdout + self.clean.stderr)
        s = summary(self.root, "2026-01-01")
        cells = s["cells"]
        self.assertEqual(s["cells_ok"], len(cells))
        # Every scenario has a clean cell and a cell per fault, each with its expectation met.
        for scen in self.listing:
            mine = [c for c in cells if c["scenario"] == scen["name"]]
            self.assertTrue(any(c["kind"] == "clean" and c["verdict"] == "PASS" for c in mine), scen["name"])
            for f in scen["faults"]:
                (cell,) = [c for c in mine if c["fault"] == f["name"]]
                self.assertTrue(cell["ok"], cell)
                if cell["expected"] == "CRASHED":  # e.g. usp_attention's lse_layout on most meshes
                    self.assertEqual(cell["verdict"], "CRASHED", cell)
                    self.assertIn("CRASH on ", cell["detail"])
                    continue
                if f["may_hang"] and cell["verdict"] in ("HANG", "DESYNC"):  # ranks took different paths
                    continue
                self.assertEqual(cell["verdict"], "FAIL", cell)
                self.assertEqual(cell["first_tap"], f["first_tap"], cell)
                self.assertTrue(os.path.exists(os.path.join(self.root, "2026-01-01", cell["report"])))
        self.assertIn(f"{len(cells)} of {len(cells)} cells as expected", self.clean.stdout)
        self.assertIn("No previous night", open(os.path.join(self.root, "2026-01-01", "index.html")).read())

    def test_junit_is_valid_one_case_per_cell(self):
        path = os.path.join(self.root, "2026-01-01", "junit.xml")
        self.assertValidJUnit(path)
        xml = JUnitXml.fromfile(path)
        cases = [c for suite in xml for c in suite]
        self.assertEqual(len(cases), len(summary(self.root, "2026-01-01")["cells"]))
        self.assertFalse(any(c.result for c in cases))

    def test_an_interrupted_night_ends_with_one_line_and_resumes(self):
        out = tempfile.mkdtemp(prefix="diffcheck_nightly_stop_")
        self.addCleanup(shutil.rmtree, out, True)
        shutil.copytree(os.path.join(self.root, "2026-01-01"), os.path.join(out, "2026-01-01"))
        s = summary(out, "2026-01-01")
        os.remove(os.path.join(out, "2026-01-01", "summary.json"))
        for c in s["cells"][-3:]:  # three cells left to run: a SIGTERM after the first
            os.remove(os.path.join(out, "2026-01-01", c["dir"], c["stem"] + ".cell.json"))
        args = ["bash", NIGHTLY, "--quick", "--out", out, "--date", "2026-01-01", "--diffcheck", EXE]
        args += [a for sc in SCENARIOS or () for a in ("--scenario", sc)]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=dict(os.environ, DIFFCHECK_NIGHTLY_INJECT=""))
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        for line in proc.stdout:  # bash execs python: proc is the night itself
            if line.startswith("[1/3]"):
                proc.terminate()  # as a batch system's time limit does
                break
        stdout, stderr = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 143, stdout + stderr)  # 128 + SIGTERM
        self.assertNotIn("Traceback", stderr)
        n = len(s["cells"])
        last = stderr.strip().splitlines()[-1]
        partial = os.path.join(out, "2026-01-01", "summary.partial.json")
        self.assertIn(f"interrupted (SIGTERM): {n - 2} of {n} cells done; partial summary: {partial}; resume: ",
                      last)
        self.assertFalse(os.path.exists(os.path.join(out, "2026-01-01", "summary.json")))
        with open(partial) as f:
            p = json.load(f)
        self.assertEqual((p["cells_done"], p["cells_total"], p["interrupted"]), (n - 2, n, True))
        # The printed command goes on with the two cells left, and the finished
        # summary replaces the partial one.
        again = subprocess.run(last.split("resume: ", 1)[1], shell=True, capture_output=True, text=True,
                               timeout=1800, stdin=subprocess.DEVNULL, env=dict(os.environ, DIFFCHECK_NIGHTLY_INJECT=""))
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertIn(f"{n - 2} already done, 2 to run", again.stdout)
        self.assertEqual(summary(out, "2026-01-01")["cells_ok"], n)
        self.assertFalse(os.path.exists(partial))

    def night_injected(self, what, scenario, fault):
        """(the output folder, the run) of a second night after the first one's, `scenario` with `fault`."""
        out = tempfile.mkdtemp(prefix=f"diffcheck_nightly_{what}_")
        self.addCleanup(shutil.rmtree, out, True)
        shutil.copytree(os.path.join(self.root, "2026-01-01"), os.path.join(out, "2026-01-01"))
        return out, night(out, "2026-01-02", "--scenario", scenario,
                          env={"DIFFCHECK_NIGHTLY_INJECT": f"{scenario}:{fault}"})

    def test_injected_regression_fails_with_the_cell_named_and_drift_shown_first(self):
        out, res = self.night_injected("bad", "flux_tp", "proj_out_contiguous")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("NOT AS EXPECTED: false positive: flux_tp/float32/defaults/dp=4,tp=4: expected PASS, "
                      "got FAIL at 'proj_out/weight'", res.stdout)
        s = summary(out, "2026-01-02")
        self.assertEqual(s["previous"], os.path.join("..", "2026-01-01", "summary.json"))
        drift = s["drift"]
        # New failures first, then the flagged err/tol jumps of the taps it broke.
        self.assertEqual(drift[0]["kind"], "new failure")
        self.assertIn("defaults @ dp=4,tp=4", drift[0]["what"])
        first_change = next(r for r in drift if r["kind"] == "err/tol")
        self.assertTrue(first_change["flagged"])
        flagged = {r["tap"] for r in drift if r["kind"] == "err/tol" and r["flagged"]}
        self.assertIn("proj_out/weight", flagged)
        self.assertIn("out", flagged)
        self.assertNotIn("attn/q", flagged)  # taps before the fault did not move
        # The failing cell's JUnit case and its report.
        xml = JUnitXml.fromfile(os.path.join(out, "2026-01-02", "junit.xml"))
        failing = [c.name for suite in xml for c in suite if c.result and isinstance(c.result[0], Failure)]
        self.assertIn("defaults @ dp=4,tp=4", failing)
        bad = next(c for c in s["cells"] if not c["ok"])
        report = os.path.join(out, "2026-01-02", bad["report"])
        self.assertIn("proj_out/weight", open(report).read())

    @unittest.skipUnless(CHROMIUM, "chromium is not installed (scripts/setup.sh installs it)")
    def test_index_page_in_a_browser(self):
        out, res = self.night_injected("html", "timestep_broadcast", "timestep_temp_broadcast")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        page = os.path.join(out, "2026-01-02", "index.html")
        dom, errors, shot = self.browse(page)
        self.assertEqual(errors, [])
        self.assertIn("FAIL", dom.find(id="verdict")[0][2])
        bad = dom.find("td", **{"class": "bad"})
        self.assertEqual(len(bad), 2)  # the two clean cells of timestep_broadcast
        for td in bad:
            self.assertIn("false positive", td[1]["title"])
        links = [e[1]["href"] for e in dom.find("a") if e[1].get("href", "").endswith(".html")]
        self.assertTrue(links)
        for href in links:
            self.assertTrue(os.path.exists(os.path.join(out, "2026-01-02", href)), href)
        rows = dom.find("tr", **{"class": "newfail"})
        self.assertEqual(len(rows), 2)
        # The clean night's page too: all cells as expected, none outlined.
        dom, errors, _ = self.browse(os.path.join(out, "2026-01-01", "index.html"))
        self.assertEqual(errors, [])
        self.assertEqual(dom.find("td", **{"class": "bad"}), [])
        faults = sum(len(s["faults"]) for s in self.listing)
        self.assertGreaterEqual(len(dom.find("td", **{"class": "caught"})), faults)  # a crash counts as caught


class DriftRules(unittest.TestCase):
    """The drift table on made-up nights: no MPI."""
    @classmethod
    def setUpClass(cls):
        cls.n = load_nightly_module()

    def cell(self, ok=True, taps=None, mesh="dp=1,tp=4", kind="clean", verdict="PASS"):
        return {"scenario": "s", "dtype": "float32", "variant": "defaults", "mesh": mesh, "kind": kind,
                "ok": ok, "verdict": verdict, "expected": "PASS", "first_tap": "-", "taps": taps or {}}

    def test_a_change_above_2x_is_flagged_and_below_is_not(self):
        prev = {"cells": [self.cell(taps={"a": 0.1, "b": 0.1, "c": 0.1})]}
        rows = self.n.drift([self.cell(taps={"a": 0.21, "b": 0.19, "c": 0.04})], prev)
        flags = {r["tap"]: r["flagged"] for r in rows}
        self.assertEqual(flags, {"a": True, "b": False, "c": True})
        self.assertEqual(rows[0]["tap"], "c")  # 2.5x down before 2.1x up
        self.assertLess(rows[0]["factor"], 0)

    def test_new_failures_come_first_and_fixed_cells_are_listed(self):
        prev = {"cells": [self.cell(taps={"a": 0.1}), self.cell(ok=False, mesh="dp=2,tp=2", verdict="FAIL")]}
        now = [self.cell(taps={"a": 0.1}, mesh="dp=2,tp=2"),
               self.cell(ok=False, verdict="FAIL", taps={"a": 50.0})]
        rows = self.n.drift(now, prev)
        self.assertEqual([r["kind"] for r in rows[:2]], ["new failure", "fixed"])
        self.assertEqual(rows[0]["now"], "false positive")

    def test_tiny_ratios_and_nan(self):
        prev = {"cells": [self.cell(taps={"z": 0.0, "n": 0.1})]}
        rows = self.n.drift([self.cell(taps={"z": 1e-9, "n": float("nan")})], prev)
        flags = {r["tap"]: r["flagged"] for r in rows}
        self.assertEqual(flags, {"z": False, "n": True})

    def test_no_previous_night_no_drift_rows(self):
        self.assertEqual(self.n.drift([self.cell(taps={"a": 1.0})], None), [])


if __name__ == "__main__":
    unittest.main()
