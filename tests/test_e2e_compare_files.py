"""`diffcheck compare` on files written by h5py (the public contract), and on
every kind of bad input: each must exit 2 with a message naming the file, tap
or attribute, never crash or hang."""
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import h5py
import numpy as np

from e2e import EXE, SCRIPTS, TIMEOUT, E2ETest

sys.path.insert(0, SCRIPTS)
from diffcheck_dump import RankDump  # noqa: E402

MESH = "dp=2,tp=2"


def global_q():
    return np.arange(2 * 8, dtype=np.float64).reshape(2, 8) / 7.0


def write_rank_files(prefix, corrupt=None):
    """dp=2,tp=2; tap 'q' split on tp along dim 1, tap 'y' partial over tp."""
    g = global_q()
    for r in range(4):
        dp, tp = divmod(r, 2)
        with RankDump(prefix, MESH, r, scenario="h5py_test") as d:
            q = g[:, tp * 4:(tp + 1) * 4].astype(np.float32).copy()
            if corrupt == "nan" and r == 3:
                q[1, 2] = np.nan
            if corrupt == "replica" and r == 2:
                q[0, 1] += 1e-3
            if corrupt == "both_blocks":  # each tp block wrong, the second the worse
                q[0, 0] += 1e-3 if tp == 0 else 1e-2
            d.tap("block/q", q, spec="-,tp")
            y = (g.sum(axis=0) / 2).astype(np.float32)  # two partials sum to g.sum(0)
            if corrupt == "reference" and tp == 1:
                y = y * 1.5
            d.tap("block/y", y, partial="tp", reduction_depth=2)
            if corrupt == "unreferenced":  # a tied weight's second name, say: no reference tap of that name
                d.tap("head.weight", q, spec="-,tp")
            if r == 0:
                d.reference("block/q", g)
                d.reference("block/y", g.sum(axis=0))


class CompareRankFiles(E2ETest):
    def compare_corrupted(self, corrupt):
        """The rank files with their fault, compared: exit 1 and the report."""
        prefix = self.path("dump")
        write_rank_files(prefix, corrupt=corrupt)
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, 1)
        return res

    def test_clean_rank_files_pass(self):
        prefix = self.path("dump")
        write_rank_files(prefix)
        for source in (prefix, prefix + ".rank2.h5"):
            res = self.diffcheck("compare", source, json=True)
            self.assertExit(res, 0)
            self.assertTrue(res.report["pass"])
            self.assertEqual([t["name"] for t in res.report["taps"]], ["block/q", "block/y"])

    def test_a_tap_with_no_reference_is_unchecked_never_a_pass(self):
        prefix = self.path("dump")
        write_rank_files(prefix, corrupt="unreferenced")
        junit, page = self.path("report.xml"), self.path("report.html")
        res = self.diffcheck("compare", prefix, "--junit", junit, "--html", page, json=True)
        self.assertExit(res, 0)  # the checks that ran pass; the run has no failure
        row = next(line for line in res.out.splitlines() if "head.weight" in line)
        self.assertIn("UNCHECKED (no reference)", row)
        self.assertNotIn("PASS", row)
        self.assertIn("PASS: 2 taps pass; 1 not checked against the reference (no reference tap): head.weight",
                      res.out)
        self.assertNotIn("all 3 taps pass", res.out)
        tap = next(t for t in res.report["taps"] if t["name"] == "head.weight")
        self.assertEqual((tap["pass"], tap["verdict"]), (False, "unchecked"))
        self.assertEqual(tap["reference"], {"present": False, "pass": False, "unchecked": True})
        self.assertTrue(tap["replica"]["pass"])  # its other checks still ran
        self.assertEqual(res.report["unchecked_taps"], ["head.weight"])
        self.assertTrue(res.report["pass"])
        with open(junit) as f:
            xml = f.read()
        self.assertIn('skipped="1"', xml)
        self.assertIn("head.weight&apos; was not checked against the reference", xml)
        with open(page) as f:
            html = f.read()
        self.assertIn('<tr class="unchecked" data-tap="head.weight">', html)
        self.assertIn("PASS, 1 unchecked", html)
        # --require-reference: the same tap is a failure, and the first divergence.
        res = self.diffcheck("compare", prefix, "--require-reference", json=True)
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "head.weight", ["no reference"])
        self.assertIn("FAIL: 1 of 3 taps fail.", res.out)
        # A real failure beside it: both said, the unchecked tap not counted as failing.
        write_rank_files(prefix, corrupt="unreferenced")
        with h5py.File(prefix + ".rank0.h5", "r+") as f:
            f["taps/block/q"][0, 0] += 1.0
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, 1)
        self.assertIn("1 not checked against the reference (no reference tap): head.weight", res.out)

    def test_long_tap_names_are_never_cut_into_one_name(self):
        # Two MaxText taps that share their first 40 characters each keep a name of their own.
        prefix = self.path("dump")
        names = ["decoder.layers_1.self_attention.rotary_query", "decoder.layers_1.self_attention.rotary_key"]
        for r in range(2):
            with RankDump(prefix, "dp=2", r) as d:
                for n in names:
                    d.tap(n, np.ones(4, np.float32))
        res = self.diffcheck("compare", prefix)
        self.assertExit(res, 0)
        for n in names:
            self.assertIn(f" {n} ", res.out)

    def test_nan_is_first_divergence_with_rank_and_index(self):
        res = self.compare_corrupted("nan")
        self.assertFirstDivergence(res, "block/q")
        nf = res.report["taps"][0]["nonfinite"]
        self.assertEqual(nf["nan"], 1)
        self.assertEqual(nf["first_nan"], {"rank": 3, "index": [1, 2]})

    def test_replica_mismatch(self):
        res = self.compare_corrupted("replica")
        self.assertFirstDivergence(res, "block/q", ["replica"])
        self.assertEqual(res.report["taps"][0]["replica"]["differing_ranks"], [2])

    def test_every_wrong_rank_is_named_not_only_the_worst(self):
        res = self.compare_corrupted("both_blocks")
        ref = res.report["taps"][0]["reference"]
        self.assertEqual((ref["worst_ranks"], ref["failing_ranks"]), ([1], [0, 1, 2, 3]))
        self.assertIn("elements outside the tolerance on rank(s) 0-3, not only the worst's", res.out)

    def test_reference_mismatch_on_partial_sum(self):
        res = self.compare_corrupted("reference")
        self.assertFirstDivergence(res, "block/y", ["reference"])
        self.assertIn("reference DISAGREES", res.out)

    def test_separate_reference_file(self):
        prefix = self.path("dump")
        g = global_q()
        for r in range(4):
            with RankDump(prefix, MESH, r) as d:
                d.tap("q", g[:, (r % 2) * 4:(r % 2 + 1) * 4].astype(np.float32), spec="-,tp")
        ref = self.path("ref.h5")
        with h5py.File(ref, "w") as f:
            f.attrs["diffcheck_schema"] = 1
            f.attrs["world_size"] = 1
            f.create_dataset("reference/q", data=g * 2)
        self.assertExit(self.diffcheck("compare", prefix), 0)  # no reference: only NaN/replica
        res = self.diffcheck("compare", prefix, "--reference", ref, json=True)
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "q", ["reference"])

    def test_run_file_written_by_h5py(self):
        path = self.path("run.h5")
        g = global_q()
        with h5py.File(path, "w") as f:
            f.attrs.update({"diffcheck_schema": 1, "mesh": "tp=2", "world_size": 2})
            f.create_dataset("taps/q", data=np.stack([g[:, :4], g[:, 4:]]).astype(np.float16))
            f["taps/q"].attrs["spec"] = "-,tp"
            f.create_dataset("reference/q", data=g)
        res = self.diffcheck("compare", path, json=True)
        self.assertExit(res, 0)
        self.assertEqual(res.report["taps"][0]["dtype"], "float16")


class CompareBadInput(E2ETest):
    def good_run_file(self, path, **overrides):
        attrs = {"diffcheck_schema": 1, "mesh": "tp=2", "world_size": 2}
        attrs.update(overrides)
        with h5py.File(path, "w") as f:
            for k, v in attrs.items():
                if v is not None:
                    f.attrs[k] = v
            f.create_dataset("taps/q", data=np.zeros((2, 3), np.float32))
            f["taps/q"].attrs["spec"] = "tp"
        return path

    def expect_error(self, source, *needles, extra=()):
        res = self.diffcheck("compare", source, *extra)
        self.assertExit(res, 2)
        self.assertNotIn("Traceback", res.err)
        self.assertNotIn("terminate called", res.err)
        for n in needles:
            self.assertIn(n, res.err, msg=str(res))
        return res

    def test_missing_file(self):
        self.expect_error(self.path("nope.h5"), "nope.h5")

    def test_not_hdf5(self):
        p = self.path("text.h5")
        with open(p, "w") as f:
            f.write("hello\n")
        self.expect_error(p, "text.h5", "not an HDF5 file")

    def test_truncated(self):
        p = self.good_run_file(self.path("full.h5"))
        data = open(p, "rb").read()
        t = self.path("trunc.h5")
        with open(t, "wb") as f:
            f.write(data[: len(data) // 2])
        res = self.diffcheck("compare", t)
        self.assertExit(res, 2)
        self.assertIn("trunc.h5", res.err)

    def test_missing_required_attribute(self):
        for attr in ("diffcheck_schema", "mesh", "world_size"):
            with self.subTest(attr=attr):
                p = self.good_run_file(self.path(f"no_{attr}.h5"), **{attr: None})
                self.expect_error(p, f"no_{attr}.h5", f"'{attr}'")

    def test_wrong_typed_attribute(self):
        p = self.good_run_file(self.path("typed.h5"), world_size="two")
        self.expect_error(p, "typed.h5", "'world_size'", "integer")
        p = self.good_run_file(self.path("schema.h5"), diffcheck_schema=2)
        self.expect_error(p, "'diffcheck_schema'", "version 1")

    def test_bad_mesh_attribute(self):
        p = self.good_run_file(self.path("mesh.h5"), mesh="tp=x")
        self.expect_error(p, "mesh.h5", "'mesh'")
        p = self.good_run_file(self.path("world.h5"), mesh="tp=4")
        self.expect_error(p, "world.h5", "world_size")

    def test_spec_unknown_axis_or_too_many_dims(self):
        for spec, needle in (("sp", "'sp'"), ("tp,-,-", "3 entries")):
            with self.subTest(spec=spec):
                p = self.good_run_file(self.path("spec.h5"))
                with h5py.File(p, "a") as f:
                    f["taps/q"].attrs["spec"] = spec
                self.expect_error(p, "spec.h5", "tap 'q'", needle)

    def test_shape_does_not_match_mesh(self):
        p = self.path("shape.h5")
        with h5py.File(p, "w") as f:
            f.attrs.update({"diffcheck_schema": 1, "mesh": "tp=2", "world_size": 2})
            f.create_dataset("taps/q", data=np.zeros((3, 3), np.float32))
        self.expect_error(p, "shape.h5", "tap 'q'", "world_size=2")

    def test_reference_shape_mismatch_is_a_finding_at_that_tap(self):
        # A fault that changes a shape (an all-to-all's dimensions swapped, a gather left out) is a FAIL at
        # its tap, in order, with the table printed and every other tap checked; not an input error.
        p = self.good_run_file(self.path("ref.h5"))
        with h5py.File(p, "a") as f:
            f.create_dataset("reference/q", data=np.zeros((5,)))
        res = self.diffcheck("compare", p, json=True)
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "q", ["shape"])
        self.assertRegex(res.out, r"q .*FAIL \(shape\)")
        self.assertIn("SHAPE differs: the tap's global shape [6]", res.out)
        self.assertIn("against the reference's [5]: dimension 0 differs in size", res.out)
        tap = res.report["taps"][0]
        self.assertEqual(tap["reference"]["shape"], {"reference": [5], "global": [6]})
        page = self.path("shape.html")  # its heatmap cells painted failing, not "no reference"
        self.assertExit(self.diffcheck("compare", p, "--html", page), 1)
        with open(page) as f:
            cells = re.findall(r'<rect class="cell ([^"]*)" data-tap="q"', f.read())
        self.assertEqual(len(cells), 2)
        self.assertNotIn("noref", " ".join(cells))

    def test_every_shape_finding_is_listed_at_once_and_a_permutation_named(self):
        prefix = self.path("dump")
        write_rank_files(prefix)
        with h5py.File(prefix + ".rank0.h5", "r+") as f:
            g = f["reference/block/q"][()]
            del f["reference/block/q"]
            f.create_dataset("reference/block/q", data=g.T.copy())   # [8,2] against the tap's [2,8]
            y = f["reference/block/y"][()]
            del f["reference/block/y"]
            f.create_dataset("reference/block/y", data=np.concatenate([y, y]))
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, 1)
        self.assertIn("FAIL: 2 of 2 taps fail.", res.out)
        self.assertEqual([t["failed_checks"] for t in res.report["taps"]], [["shape"], ["shape"]])
        self.assertIn("dimensions 0, 1 hold the same sizes in another order (swapped)", res.out)

    def test_stale_rank_files_of_a_larger_mesh_are_named(self):
        prefix = self.path("dump")
        write_rank_files(prefix)
        for r in (4, 5):  # an earlier run at 8 ranks under the same prefix
            shutil.copy(prefix + ".rank0.h5", f"{prefix}.rank{r}.h5")
        self.expect_error(prefix, "2 rank file(s) beyond this run's 4 ranks (mesh dp=2,tp=2)", "dump.rank4.h5",
                          "dump.rank5.h5")

    def test_missing_rank_file(self):
        prefix = self.path("dump")
        write_rank_files(prefix)
        os.remove(prefix + ".rank3.h5")
        self.expect_error(prefix, "dump.rank3.h5", "missing")

    def test_rank_file_with_wrong_rank_attribute(self):
        prefix = self.path("dump")
        write_rank_files(prefix)
        with h5py.File(prefix + ".rank1.h5", "a") as f:
            f.attrs["rank"] = 2
        self.expect_error(prefix, "dump.rank1.h5", "'rank'")

    def test_no_taps(self):
        p = self.path("empty.h5")
        with h5py.File(p, "w") as f:
            f.attrs.update({"diffcheck_schema": 1, "mesh": "tp=2", "world_size": 2})
        self.expect_error(p, "empty.h5", "no tap datasets")

    def test_unsupported_element_type(self):
        p = self.path("str.h5")
        with h5py.File(p, "w") as f:
            f.attrs.update({"diffcheck_schema": 1, "mesh": "tp=1", "world_size": 1})
            f.create_dataset("taps/s", data=np.array([b"ab", b"cd"]).reshape(1, 2))
        self.expect_error(p, "str.h5", "tap 's'", "element type")


if __name__ == "__main__":
    import unittest
    unittest.main()


class LibrariesLoaded(E2ETest):
    """What the loader maps: OpenBLAS only when a GEMM is wanted (compare does
    none; loading it was 1.4-1.9 ms of every start), not the libcurl chain of
    the shared libhdf5 (HDF5 is linked from its static archive: 7 ms of a
    10 ms start), and never a library from the directory diffcheck runs in."""

    def loader_log(self, *args):
        env = dict(os.environ, LD_DEBUG="libs")
        p = subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT, cwd=self.dir)
        return p.returncode, p.stderr

    def test_compare_does_not_load_openblas_and_a_run_does(self):
        prefix = self.path("dump")
        write_rank_files(prefix)
        code, log = self.loader_log("compare", prefix)
        self.assertEqual(code, 0, log[-2000:])
        self.assertIn("libmpi", log)  # the log is the loader's
        self.assertNotIn("libopenblas", log)
        self.assertNotIn("libcurl", log)
        code, log = self.loader_log("--scenario", "timestep_broadcast", "--out", self.path("run.h5"))
        self.assertEqual(code, 0, log[-2000:])
        self.assertIn("libopenblas", log)

    def test_no_library_is_searched_for_in_the_working_directory(self):
        code, log = self.loader_log("--version")
        self.assertEqual(code, 0, log[-2000:])
        tried = [line.split("file=", 1)[1].split()[0] for line in log.splitlines() if "trying file=" in line]
        self.assertEqual([f for f in tried if not f.startswith("/")], [])
        # The RUNPATH itself: no empty (current directory) or relative entry.
        dyn = subprocess.run(["readelf", "-d", EXE if os.path.isabs(EXE) else shutil.which(EXE)],
                             capture_output=True, text=True).stdout
        for line in dyn.splitlines():
            if "RUNPATH" in line or "RPATH" in line:
                entries = line.split("[", 1)[1].rstrip("]").split(":")
                self.assertEqual([e for e in entries if not e.startswith("/")], [], line)

    def test_a_rank_re_executed_for_huge_pages_keeps_its_name(self):
        """A run of a model size re-executes itself with glibc's huge-page
        tunable (core/memory.h). Through /proc/self/exe every rank was named
        "exe", so `ps`, `top` and `pgrep diffcheck`, the way to find a hung
        rank, did not find it."""
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                self.skipTest("transparent huge pages are off: no re-execution")
        env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
        # Asked for: by default a VM that reports free pages to its host gets none.
        env["DIFFCHECK_HUGEPAGES"] = "1"
        p = subprocess.Popen([EXE, "--scenario", "flux_tp", "--size", "flux1-dev", "--mesh", "tp=1",
                              "--reference-cache", "off", "--out", self.path("run.h5")],
                             env=env, cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            re_executed, name = False, None
            for _ in range(200):  # until the new image is in place: up to 10 s
                try:
                    with open(f"/proc/{p.pid}/environ", "rb") as f:
                        re_executed = b"glibc.malloc.hugetlb=1" in f.read()
                    with open(f"/proc/{p.pid}/comm") as f:
                        name = f.read().strip()
                except OSError:
                    break
                if re_executed:
                    break
                time.sleep(0.05)
            self.assertTrue(re_executed, "the run did not re-execute itself with the huge-page tunable")
            self.assertEqual(name, os.path.basename(EXE))
        finally:
            p.kill()
            p.wait()


class LargeDatasets(E2ETest):
    """Datasets of 1 MiB or more are scanned where they lie in a mapping of
    the file (h5_data.cpp) when a chunk is one run of them, and read with
    pread otherwise (a column block of a reference): the verdict, counts,
    worst element and norms must be those numpy computes, in both ways and
    at both widths of the reference."""

    def write(self, path, world, taps):
        with h5py.File(path, "w") as f:
            f.attrs.update({"diffcheck_schema": 1, "mesh": f"tp={world}", "world_size": world})
            for name, (rows, spec, ref) in taps.items():
                f.create_dataset(f"taps/{name}", data=rows)  # contiguous: h5py's default
                f[f"taps/{name}"].attrs["spec"] = spec
                f.create_dataset(f"reference/{name}", data=ref)

    def check(self, tap, got, ref, worst):
        err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        r = tap["reference"]
        self.assertEqual(r["n_total"], got.size)
        self.assertEqual(r["n_fail"], int((err > r["atol"] + r["rtol"] * np.abs(ref.astype(np.float64))).sum()))
        self.assertEqual(r["worst_index"], list(worst))
        self.assertEqual(r["max_abs"], err.max())
        self.assertAlmostEqual(r["rel_l2"], np.linalg.norm(err) / np.linalg.norm(ref.astype(np.float64)), delta=1e-15)
        self.assertEqual(r["worst_value"], float(got[worst]))

    def test_a_large_pair_is_judged_as_numpy_judges_it(self):
        rng = np.random.default_rng(3)
        g = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
        for ref_dtype in (np.float32, np.float64):
            with self.subTest(reference=np.dtype(ref_dtype).name):
                x = g.copy()
                x[300, 17] += 1.0
                x[511, 1023] += 0.5
                y = g.copy()
                y[5, 700] += 1.0
                path = self.path(f"big_{np.dtype(ref_dtype).name}.h5")
                # One rank: x is one piece whose chunks and reference are whole rows.
                self.write(path, 1, {"x": (x[None], "", g.astype(ref_dtype))})
                res = self.diffcheck("compare", path, json=True)
                self.assertExit(res, 1)
                self.check(res.report["taps"][0], x, g.astype(ref_dtype), (300, 17))
                # Two ranks, y split by columns: its rows are runs, the reference's boxes are not.
                path2 = self.path(f"split_{np.dtype(ref_dtype).name}.h5")
                self.write(path2, 2, {"y": (np.stack([y[:, :512], y[:, 512:]]), "-,tp", g.astype(ref_dtype))})
                res = self.diffcheck("compare", path2, json=True)
                self.assertExit(res, 1)
                self.check(res.report["taps"][0], y, g.astype(ref_dtype), (5, 700))

    def test_a_file_that_ends_inside_a_large_dataset_is_an_input_error(self):
        """A mapping of bytes the file does not hold faults (SIGBUS) when read:
        such a dataset is read with pread, whose error names the file. HDF5
        refuses a file shorter than its superblock says, so the superblock's
        end-of-file address is cut too (a damaged or hostile file)."""
        g = np.ones((512, 1024), np.float32)
        path = self.path("cut.h5")
        self.write(path, 1, {"x": (g[None], "", g)})
        with h5py.File(path, "r") as f:
            start = min(f["taps/x"].id.get_offset(), f["reference/x"].id.get_offset())
        cut = start + g.nbytes // 2  # inside the data, past all of HDF5's metadata
        with open(path, "r+b") as f:
            head = f.read(48)
            self.assertEqual(head[8], 0)  # superblock version 0: end-of-file address at byte 40
            self.assertEqual(struct.unpack("<Q", head[40:48])[0], os.path.getsize(path))
            f.truncate(cut)
            f.seek(40)
            f.write(struct.pack("<Q", cut))
        # Tolerances given: no pass over the reference for its RMS (that pass
        # reads with pread), so the scan is the first to read the values.
        res = self.diffcheck("compare", path, "--atol", "1e-5", "--rtol", "0")
        self.assertExit(res, 2)
        self.assertIn("cut.h5", res.err)
        self.assertIn("the file ends early", res.err)
