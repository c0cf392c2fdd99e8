"""Pipeline parallelism: taps owned by one stage (the `stage` attribute) and
microbatches laid together (`microbatches`), in files written with h5py;
dct.capture of a pipelining schedule in one process (a stand-in schedule:
set-up calls ignored, microbatches in order whatever order they ran in); and
examples/pp_train.py over gloo, clean and with each pipeline fault found at
its first tap with its stage and microbatch (1F1B at 2 ranks by default;
every schedule, bfloat16, 4 ranks, pp x dp and run against run nightly)."""
import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

from e2e import EXE, MPIEXEC, E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "pp_train.py")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


def write_rank(path, mesh, world, rank, taps, references=None):
    """taps: {name: (array, attrs)}."""
    with h5py.File(path, "w") as f:
        f.attrs.update({"diffcheck_schema": 1, "mesh": mesh, "world_size": world, "rank": rank})
        f.create_group("taps")
        for name, (values, attrs) in taps.items():
            d = f.create_dataset(f"taps/{name}", data=values)
            d.attrs.update(attrs)
        for name, values in (references or {}).items():
            f.create_dataset(f"reference/{name}", data=values)


class StageFiles(E2ETest):
    """A pp=2 x dp=2 job: stage 0 (ranks 0, 1) holds `a`, stage 1 (ranks 2, 3) holds `b`, each split over dp
    and made of 4 microbatches of 2 rows."""

    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        self.a, self.b = rng.standard_normal((16, 8)), rng.standard_normal((16, 8))

    def job(self, name="job", fault=None, drop=None, stage_of=None):
        prefix = self.path(name)
        for r in range(4):
            pp, dp = divmod(r, 2)
            tap, values = ("a", self.a) if pp == 0 else ("b", self.b)
            piece = values[dp * 8:(dp + 1) * 8].astype(np.float32)
            if fault and fault[0] == r:
                piece = piece.copy()
                piece[fault[1]] += 1.0
            attrs = {"spec": "dp", "stage": (stage_of or {}).get(r, f"pp={pp}"), "microbatches": 4, "order": pp}
            taps = {} if drop == r else {tap: (piece, attrs)}
            write_rank(f"{prefix}.rank{r}.h5", "pp=2,dp=2", 4, r, taps,
                       {"a": self.a, "b": self.b} if r == 0 else None)
        return prefix

    def test_clean_stages_pass(self):
        res = self.diffcheck("compare", self.job(), json=True)
        self.assertExit(res, 0)
        taps = {t["name"]: t for t in res.report["taps"]}
        self.assertEqual(taps["b"]["stage"], "pp=1")
        self.assertEqual(taps["b"]["microbatches"], 4)
        self.assertEqual(taps["b"]["global_shape"], [16, 8])

    def test_a_wrong_piece_is_named_with_its_stage_and_microbatch(self):
        # rank 3 (pp 1, dp 1), local row 5: microbatch 2, global row 13
        res = self.diffcheck("compare", self.job(fault=(3, (5, 1))))
        self.assertExit(res, 1)
        self.assertIn("First divergence: tap 'b'", res.out)
        self.assertIn("worst at global index [13,1] (microbatch 2 of 4) on rank(s) 3 (stage pp=1)", res.out)
        self.assertIn("wrong in microbatch 2 of 4 (stage pp=1)", res.out)

    def test_replicas_are_compared_within_the_stage_only(self):
        prefix = self.path("rep")
        for r in range(4):
            pp, dp = divmod(r, 2)
            piece = (self.a if pp == 0 else self.b)[:8].astype(np.float32).copy()
            if r == 3:
                piece[1, 2] += 1e-3  # rank 3's replica of stage 1's tap differs from rank 2's
            write_rank(f"{prefix}.rank{r}.h5", "pp=2,dp=2", 4, r,
                       {"ab"[pp]: (piece, {"stage": f"pp={pp}", "microbatches": 4})})
        res = self.diffcheck("compare", prefix)
        self.assertExit(res, 1)
        self.assertIn("replicas DIFFER across dp: ranks 3 disagree", res.out)
        self.assertIn("at local index [1,2] (microbatch 0 of 4)", res.out)

    def test_a_tap_missing_within_its_stage_is_refused(self):
        res = self.diffcheck("compare", self.job(drop=3))
        self.assertExit(res, 2)
        self.assertIn("job.rank3.h5: tap 'b': missing (rank 2 has it, and stage pp=1 includes rank 3)", res.err)

    def test_a_rank_off_the_stage_holding_its_tap_is_refused(self):
        res = self.diffcheck("compare", self.job(stage_of={3: "pp=0"}))
        self.assertExit(res, 2)
        self.assertIn("attribute 'stage'", res.err)

    def test_bad_stage_and_microbatch_attributes_are_refused(self):
        for attrs, needle in (({"stage": "pp=2"}, "axis 'pp' has 2 coordinates"),
                              ({"stage": "tp=0"}, "names axis 'tp' which is not in mesh"),
                              ({"stage": "pp"}, "is not <mesh axis>=<coordinate>"),
                              ({"stage": "pp=-1"}, "is not a coordinate"),
                              ({"stage": "pp=0", "spec": "pp"}, "appears more than once"),
                              ({"microbatches": 3}, "'microbatches' is 3")):
            with self.subTest(attrs=attrs):
                prefix = self.path(f"bad{len(attrs)}{attrs.get('stage', '')}{attrs.get('microbatches', '')}")
                for r in range(2):
                    write_rank(f"{prefix}.rank{r}.h5", "pp=2", 2, r, {"t": (np.ones((8, 2), "f4"), attrs)})
                res = self.diffcheck("compare", prefix)
                self.assertExit(res, 2)
                self.assertIn(needle, res.err)

    def test_a_whole_batch_run_is_compared_with_a_pipeline_run(self):
        """Run against run: the pp=2 x dp=2 job against one rank that holds both taps whole."""
        one = self.path("one")
        write_rank(f"{one}.rank0.h5", "dp=1", 1, 0, {"a": (self.a.astype(np.float32), {}),
                                                    "b": (self.b.astype(np.float32), {})})
        res = self.diffcheck("compare", self.job(), "--against", f"{one}.rank0.h5")
        self.assertExit(res, 0)
        res = self.diffcheck("compare", self.job("bad", fault=(1, (0, 0))), "--against", f"{one}.rank0.h5")
        self.assertExit(res, 1)
        self.assertIn("tap 'a'", res.out)


class MlpPipelineScenario(E2ETest):
    """The C++ side: `diffcheck --scenario mlp_pp`, its fault over the pipeline meshes, and a pp = 2 run
    against a pp = 1 run of the same batch with no reference."""

    def test_sweep_mesh_over_pp(self):
        res = self.run_cmd([EXE, "sweep-mesh", "--scenario", "mlp_pp", "-n", "8", "--inject",
                            "microbatches_swapped"])
        self.assertExit(res, 1)
        for row in ("| pp=1,dp=8 |", "| pp=2,dp=4 |", "| pp=4,dp=2 |", "| pp=8,dp=1 |"):
            self.assertIn(row, res.out)
        self.assertIn("FAIL at 'layers.1.fc1' |", res.out)  # pp=8: stage 1 is block 1
        self.assertIn("every mesh as documented", res.out)

    def test_wrong_microbatches_named_in_run(self):
        res = self.mpirun(4, "--scenario", "mlp_pp", "--inject", "microbatches_swapped")
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "layers.2.fc1")
        self.assertIn("wrong in microbatches 1, 2 of 4 (stage pp=1)", res.out)
        tap = next(t for t in res.report["taps"] if t["name"] == "layers.2.fc1")
        self.assertEqual((tap["stage"], tap["microbatches"], tap["wrong_microbatches"]), ("pp=1", 4, [1, 2]))

    def test_pp2_against_pp1_without_reference(self):
        runs = {}
        for mesh, fault in (("pp=2,dp=1", None), ("pp=1,dp=2", None), ("pp=2,dp=1", "microbatches_swapped")):
            out = self.path(f"{mesh}-{fault}.h5")
            args = [MPIEXEC, "-n", "2", EXE, "--scenario", "mlp_pp", "--mesh", mesh, "--no-reference", "--out", out]
            res = self.run_cmd(args + (["--inject", fault] if fault else []))
            self.assertIn(res.code, (0, 1), str(res))
            runs[(mesh, fault)] = out
        clean = self.diffcheck("compare", runs[("pp=2,dp=1", None)], "--against", runs[("pp=1,dp=2", None)])
        self.assertExit(clean, 0)
        wrong = self.diffcheck("compare", runs[("pp=2,dp=1", "microbatches_swapped")], "--against",
                               runs[("pp=1,dp=2", None)])
        self.assertExit(wrong, 1)
        self.assertIn("tap 'layers.4.fc1'", wrong.out)


class StandInSchedule:
    """What dct.capture reads of a torch.distributed.pipelining schedule, in one process: one stage whose
    module is called at set-up (shape inference) and then once per microbatch, in the order given."""

    class Stage:
        def __init__(self, submod, index, n):
            self.submod, self.stage_index, self.num_stages = submod, index, n

        def forward_one_chunk(self, k, x):
            return self.submod(x)

        def backward_one_chunk(self, k, loss=None):
            loss.backward()

        def backward_weight_one_chunk(self, k, last_backward=False):
            pass

    def __init__(self, submod, order, n_microbatches=4):
        self._stage = self.Stage(submod, 1, 2)
        self._n_microbatches, self.scale_grads, self.order = n_microbatches, True, order

    def step(self, x):
        import torch
        with torch.no_grad():
            self._stage.submod(x[:1])  # set-up: not a tap
        parts = x.chunk(self._n_microbatches)
        for k in self.order:
            out = self._stage.forward_one_chunk(k, parts[k])
            self._stage.backward_one_chunk(k, loss=(out ** 2).mean())


class StandInCapture(E2ETest):
    def test_microbatches_laid_together_in_order_and_set_up_ignored(self):
        import torch
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import diffcheck.torch as dct
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).double()
        x = torch.randn(8, 4, dtype=torch.float64)
        out = self.path("pp")
        schedule = StandInSchedule(model, order=[1, 0, 3, 2])
        with dct.capture(schedule, out, mesh="pp=2,dp=1", rank=1, world_size=2, backward=True):
            schedule.step(x)
        with h5py.File(f"{out}.rank1.h5") as f:
            self.assertEqual(sorted(f["taps"]), ["0", "1", "grad", "param_grad"])
            for name in ("0", "1", "grad/0", "grad/1"):
                self.assertEqual(f[f"taps/{name}"].attrs["stage"], "pp=1")
                self.assertEqual(f[f"taps/{name}"].attrs["microbatches"], 4)
            self.assertEqual(f["taps/param_grad/0.weight"].attrs["stage"], "pp=1")  # accumulated: no microbatches
            self.assertNotIn("microbatches", f["taps/param_grad/0.weight"].attrs)
            np.testing.assert_allclose(f["taps/1"][()], model(x).detach().numpy(), rtol=1e-15)
            # each microbatch's loss is its mean; the step's is their mean: gradients / 4
            xr = x.clone()
            y = model[0](xr)
            y.retain_grad()
            (model[1](y) ** 2).mean().backward()
            np.testing.assert_allclose(f["taps/grad/0"][()], y.grad.numpy(), rtol=1e-12)
            orders = [f[f"taps/{n}"].attrs["order"] for n in ("0", "1", "grad/1", "grad/0")]
            self.assertEqual(orders, sorted(orders))  # forward, then backward from the stage's last module

    def test_each_step_lays_its_own_microbatches(self):
        """A smaller last batch (8 rows, then 4: microbatches of 2, then 1): each step's taps are laid
        together from its own microbatches and split over dp (the first step's rows were kept)."""
        import torch
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import diffcheck.torch as dct
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).double()
        batches = [torch.randn(rows, 4, dtype=torch.float64) for rows in (8, 4)]
        schedule, out = StandInSchedule(model, order=[0, 1, 2, 3]), self.path("pp")
        with dct.capture(schedule, out, mesh="pp=2,dp=2", rank=2, world_size=4, data_axes="dp"):
            for x in batches:
                schedule.step(x)
        with h5py.File(f"{out}.rank2.h5") as f:
            for name, x in (("1", batches[0]), ("1@1", batches[1])):  # (the schedule's second step: @1)
                self.assertEqual(f[f"taps/{name}"].attrs.get("spec"), "dp,-")
                np.testing.assert_allclose(f[f"taps/{name}"][()], model(x).detach().numpy(), rtol=1e-12, atol=1e-15)

    def test_a_hand_pipelines_steps_lay_their_own_microbatches(self):
        """The same with stage= and microbatches= on a hand-written loop (hand_pipeline.py), dct.step per step."""
        import torch
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import diffcheck.torch as dct
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).double()
        batches = [torch.randn(rows, 4, dtype=torch.float64) for rows in (8, 4)]
        out = self.path("hand")
        with torch.no_grad(), dct.capture(model, out, mesh="pp=2,dp=2", rank=0, world_size=4, stage="pp=0",
                                          microbatches=2, data_axes="dp"):
            for t, x in enumerate(batches):
                dct.step(t)
                for mb in x.chunk(2):
                    model(mb)
        with h5py.File(f"{out}.rank0.h5") as f:
            for t, x in enumerate(batches):
                tap = f[f"taps/step{t}/1"]
                self.assertEqual((tap.attrs.get("spec"), tap.attrs.get("microbatches")), ("dp,-", 2))
                np.testing.assert_allclose(tap[()], model(x).detach().numpy(), rtol=1e-12, atol=1e-15)

    def test_a_microbatch_that_did_not_run_is_an_error(self):
        import torch
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import diffcheck.torch as dct
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))  # the stage's root is no tap: its modules are
        schedule = StandInSchedule(model, order=[0, 1, 3])
        with self.assertRaisesRegex(RuntimeError, r"microbatches \[0, 1, 3\] of it, not all 4 \(missing \[2\]\)"):
            with dct.capture(schedule, self.path("pp"), mesh="pp=2", rank=0, world_size=2):
                schedule.step(torch.randn(8, 4))
        self.assertFalse(os.path.exists(self.path("pp.rank0.h5")))


class PipelineExample(E2ETest):
    def run_example(self, n, *args):
        out = self.path("-".join(("pp", str(n)) + args).replace("--", ""))
        p = subprocess.run([sys.executable, EXAMPLE, "-n", str(n), "--out", out, *args], capture_output=True,
                           text=True, timeout=600, cwd=self.path(""))
        self.assertIn(p.returncode, (0, 1), p.stderr[-3000:])
        return p, out

    def expect_clean(self, n, *args):
        p, out = self.run_example(n, *args)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("PASS: all 352 taps pass", p.stdout)
        return out

    def expect_fault(self, n, bug, first, stage, microbatch, *args):
        p, _ = self.run_example(n, "--bug", bug, *args)
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("First divergence"))
        self.assertIn(f"tap '{first}'", line)
        self.assertIn(f"stage pp={stage}", line)
        detail = p.stdout.split(line, 1)[1]
        self.assertRegex(detail, rf"\(microbatch [{microbatch[0]}-{microbatch[-1]}] of 4\) on rank\(s\) [0-9, -]+ "
                                 rf"\(stage pp={stage}\)")
        wrong = "microbatch" + ("es " if len(microbatch) > 1 else " ") + ", ".join(microbatch)
        self.assertIn(f"wrong in {wrong} of 4 (stage pp={stage})", detail.split("\n\n")[0])

    @staticmethod
    def faults(schedule="1f1b"):
        """(bug, first tap, stage, the wrong microbatches' digits) at 2 ranks: 8 blocks over 2 stages, or over 4 (two per
        rank: round robin for interleaved, a V for zbv, whose last stage is on rank 0)."""
        per = 2 if schedule in ("interleaved", "zbv") else 4
        last_on = 0 if schedule == "zbv" else 1
        return (("microbatches_swapped", f"step0/layers.{per}.ln", 1, "12"),
                ("send_buffer_reused", f"step0/layers.{per}.ln", 1, "012"),
                ("grad_dropped", f"step0/grad/layers.{per - 1}", 0, "2"),
                ("loss_scale", "step0/grad/layers.7", last_on, "0123"))

    def test_1f1b_clean_and_its_faults(self):
        self.expect_clean(2)
        faults = self.faults()
        for bug, first, stage, microbatch in faults if FULL else faults[:1]:  # the suite's time: 3 nightly
            with self.subTest(bug=bug):
                self.expect_fault(2, bug, first, stage, microbatch)

    def test_sketch_mode_each_microbatch_sketched_as_made(self):
        """--sketch: the microbatches' pieces sketched when made (pipeline_sketch.py), not laid together: the
        same verdict and first divergence as whole capture."""
        p = self.expect_clean_sketched()
        self.assertIn("(sketch)", p.stdout)
        p, _ = self.run_example(2, "--sketch", "--bug", "grad_dropped")
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("First divergence: tap 'step0/grad/layers.3'", p.stdout)

    def expect_clean_sketched(self):
        p, _ = self.run_example(2, "--sketch")
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("PASS: all 352 taps pass", p.stdout)
        return p

    @unittest.skipUnless(FULL, "nightly: every schedule, bfloat16, 4 ranks and pp x dp")
    def test_every_schedule(self):
        for schedule in ("gpipe", "1f1b", "interleaved", "zbv"):
            for n, dtype in ((2, "float32"), (2, "bfloat16"), (4, "float32")):
                with self.subTest(schedule=schedule, ranks=n, dtype=dtype):
                    self.expect_clean(n, "--schedule", schedule, "--dtype", dtype)
            for bug, first, stage, microbatch in self.faults(schedule):
                with self.subTest(schedule=schedule, bug=bug):
                    self.expect_fault(2, bug, first, stage, microbatch, "--schedule", schedule)
        self.expect_clean(4, "--dp", "2")
        self.expect_fault(4, "microbatches_swapped", "step0/layers.4.ln", 1, "12", "--dp", "2")

    @unittest.skipUnless(FULL, "nightly: run against run")
    def test_pp2_against_pp1(self):
        two, one = self.expect_clean(2), self.expect_clean(1)
        res = self.diffcheck("compare", f"{two}/pp", "--against", f"{one}/pp")
        self.assertExit(res, 0)


if __name__ == "__main__":
    unittest.main()
