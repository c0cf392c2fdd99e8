"""vae_patch_decode end to end: the patch-parallel decode passes on (dp, ph,
pw) splits at 1-16 ranks in float32 and bfloat16 and under every flag
combination, its outputs bitwise equal across halo modes and overlap; each
fault is caught at its documented first tap exactly on the meshes where it
shows (sweep-mesh at 8 ranks for halo_wrong_peer and halo_corner_missing;
every fault at 8 and 16 ranks in both dtypes nightly), the first divergence
naming an element on a tile border; the HTML report draws the decoded image
three ways, not blank."""
import itertools
import json
import os
import re
import unittest

import h5py
import numpy as np

from e2e import CHROMIUM, E2ETest, EXE, png_values

FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"
SPLITS = [(1, "dp=1,ph=1,pw=1"), (2, "dp=1,ph=1,pw=2"), (4, "dp=2,ph=2,pw=1"), (8, "dp=2,ph=2,pw=2"),
          (8, "dp=1,ph=8,pw=1"), (16, "dp=1,ph=4,pw=4"), (16, "dp=4,ph=2,pw=2"), (16, "dp=1,ph=16,pw=1")]
QUICK_SPLITS = SPLITS[:4] + [SPLITS[5]]  # 1, 2, 4, 8 and 16 ranks; all of them nightly
SCENARIO = [s for s in json.loads(os.popen(f"{EXE} list --json").read()) if s["name"] == "vae_patch_decode"][0]
FAULTS = {f["name"]: f for f in SCENARIO["faults"]}
LATENT = 16  # the default size's latent height and width


def axes(mesh):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", mesh)}


def shows(fault, mesh):
    a = axes(mesh)
    tiles = a["ph"] * a["pw"]
    return {"halo_wrong_peer": a["dp"] > 1 and tiles > 1, "halo_dropped": tiles > 1,
            "halo_corner_missing": a["ph"] > 1 and a["pw"] > 1, "gn_local_stats": tiles > 1}[fault]


class VaePatchDecode(E2ETest):
    def run_mesh(self, n, mesh, *args):
        return self.mpirun(n, "--scenario", "vae_patch_decode", "--mesh", mesh, *args)

    def test_clean_on_every_split_and_dtype(self):
        for n, mesh in SPLITS if FULL else QUICK_SPLITS:
            for dtype in ("float32", "bfloat16") if FULL or n == 8 else ("float32",):
                with self.subTest(mesh=mesh, dtype=dtype):
                    res = self.run_mesh(n, mesh, "--dtype", dtype)
                    self.assertExit(res, 0)
                    names = [t["name"] for t in res.report["taps"]]
                    self.assertEqual(names[:3], ["latents", "conv_in", "res0/norm1/stats"])
                    self.assertEqual(names[-1], "image")
                    # The replicated statistics agree bitwise across each patch group.
                    stats = next(t for t in res.report["taps"] if t["name"] == "res0/norm1/stats")
                    self.assertEqual(stats["layout"], "dp,-,-")

    def test_every_flag_combination_passes_and_halo_modes_agree_bitwise(self):
        outs = {}
        for dtype in ("float32", "bfloat16") if FULL else ("float32",):
            for halo, gn, overlap in itertools.product(("p2p", "allgather"), ("sumsq", "welford"), (False, True)):
                with self.subTest(dtype=dtype, halo=halo, gn_stats=gn, overlap=overlap):
                    res = self.run_mesh(8, "dp=2,ph=2,pw=2", "--dtype", dtype, "--flag", f"halo={halo}",
                                        "--flag", f"gn_stats={gn}", "--flag", f"overlap={str(overlap).lower()}")
                    self.assertExit(res, 0)
                    with h5py.File(self.path("run.h5"), "r") as f:
                        outs[(dtype, halo, gn, overlap)] = {k: f["taps/" + k][...] for k in ("conv_in", "image")}
        for (dtype, halo, gn, overlap), taps in outs.items():
            for k, v in taps.items():  # the halo's way and the overlap change nothing, bit for bit
                self.assertTrue(np.array_equal(v, outs[(dtype, "p2p", gn, False)][k]), f"{dtype} {halo} {gn} {overlap} {k}")

    def sweep(self, fault, n, *extra):
        js = self.path(f"sweep_{fault}_{n}.json")
        res = self.diffcheck("sweep-mesh", "--scenario", "vae_patch_decode", "-n", str(n), "--inject", fault,
                             "--timeout", "120", "--json", js, *extra)
        with open(js) as f:
            return res, json.load(f)

    def test_faults_show_exactly_on_their_meshes(self):
        # sweep-mesh at 8 ranks for the two whose meshes are the point; every
        # fault at 8 and 16 ranks in both dtypes nightly.
        cases = [(f, n, d) for f in FAULTS for n in (8, 16) for d in ("float32", "bfloat16")] if FULL else \
            [("halo_wrong_peer", 8, "float32"), ("halo_corner_missing", 8, "float32")]
        for fault, n, dtype in cases:
            with self.subTest(fault=fault, ranks=n, dtype=dtype):
                res, table = self.sweep(fault, n, "--dtype", dtype)
                self.assertExit(res, 1)
                self.assertIn(f"fault {fault}: every mesh as documented", res.out)
                self.assertTrue(any(shows(fault, r["mesh"]) for r in table["rows"]))
                self.assertTrue(any(not shows(fault, r["mesh"]) for r in table["rows"]))
                for row in table["rows"]:
                    if shows(fault, row["mesh"]):
                        self.assertEqual((row["verdict"], row["first_divergence"]), ("FAIL", FAULTS[fault]["first_tap"]), row)
                    else:
                        self.assertEqual(row["verdict"], "PASS", row)
                # dp beyond the batch is refused, not run.
                self.assertTrue(all(axes(s["mesh"])["dp"] > 4 for s in table["skipped"]), table["skipped"])

    def test_first_divergence_is_on_a_tile_border(self):
        for fault, n, mesh in (("halo_dropped", 16, "dp=1,ph=4,pw=4"), ("halo_corner_missing", 16, "dp=1,ph=4,pw=4"),
                               ("gn_local_stats", 4, "dp=1,ph=2,pw=2"), ("halo_wrong_peer", 4, "dp=2,ph=1,pw=2")):
            with self.subTest(fault=fault):
                res = self.run_mesh(n, mesh, "--inject", fault)
                self.assertExit(res, 1)
                fd = self.assertFirstDivergence(res, FAULTS[fault]["first_tap"])
                if fault == "gn_local_stats":  # the statistics of a patch group's tiles differ
                    self.assertIn("replica", fd["checks"])
                    continue
                a = axes(mesh)
                h, w = LATENT // a["ph"], LATENT // a["pw"]
                i, j = [int(v) for v in re.search(r"worst at global index \[\d+,\d+,(\d+),(\d+)\]", fd["summary"]).groups()]
                on_row, on_col = i % h in (0, h - 1), j % w in (0, w - 1)
                if fault == "halo_corner_missing":
                    self.assertTrue(on_row and on_col, fd["summary"])  # a tile's corner pixel
                else:
                    self.assertTrue(on_row or on_col, fd["summary"])
        # Where a fault does not show, the run is clean: one tile, or one dp group.
        for fault, n, mesh in (("halo_dropped", 1, "dp=1,ph=1,pw=1"), ("halo_corner_missing", 4, "dp=1,ph=1,pw=4"),
                               ("halo_wrong_peer", 4, "dp=1,ph=2,pw=2"), ("gn_local_stats", 2, "dp=2,ph=1,pw=1")):
            with self.subTest(fault=fault, mesh=mesh):
                self.assertExit(self.run_mesh(n, mesh, "--inject", fault), 0)

    def test_html_draws_the_decoded_image_three_ways(self):
        page = self.path("report.html")
        res = self.run_mesh(4, "dp=1,ph=2,pw=2", "--inject", "halo_dropped", "--html", page)
        self.assertExit(res, 1)
        self.assertEqual([(i["tap"], i["height"], i["width"]) for i in res.report["images"]],
                         [("image", 64, 64)] * 4)
        self.assertTrue(all(not i["gate"]["pass"] for i in res.report["images"]))
        if not CHROMIUM:
            self.skipTest("chromium is not installed")
        dom, errors, _ = self.browse(page)
        self.assertEqual(errors, [])
        imgs = dom.find("img")
        self.assertEqual([i[1]["alt"].split(" ")[0] for i in imgs], ["reference", "this", "|difference|"] * 4)
        for i in imgs:
            self.assertTrue(i[1]["src"].startswith("data:image/png;base64,"))
            self.assertGreater(png_values(i[1]["src"]), 16, i[1]["alt"])  # not blank


if __name__ == "__main__":
    unittest.main()
