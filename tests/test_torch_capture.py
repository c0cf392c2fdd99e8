"""diffcheck.torch in one process: tap names, order and values, hooks gone
after the block (also after an exception), nested modules, repeated calls
and steps, containers, bfloat16, layouts and their errors, include/exclude,
inputs, reference mode and rename; diffcheck.compare's verdicts as Python
values and exceptions. Runs against the source tree (PYTHONPATH=python/)."""
import contextlib
import gc
import os
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torch.nn as nn

import diffcheck
import diffcheck.torch as dct


class Pair(nn.Module):
    """Returns a tuple and a dict: outputs are flattened with suffixes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y, {"twice": 2 * y, "none": None}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.pair = Pair()
        self.shared = nn.Linear(4, 4)

    def forward(self, x):
        h = self.inner(x)
        a, _ = self.pair(h)
        return self.shared(self.shared(a))  # one module called twice


def hook_count(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def taps(path):
    """{name: (values, attrs)} of a rank file's taps, in `order`."""
    out = {}
    with h5py.File(path) as f:
        f["taps"].visititems(lambda n, o: out.__setitem__(n, (o[()], dict(o.attrs)))
                             if isinstance(o, h5py.Dataset) else None)
    return dict(sorted(out.items(), key=lambda kv: kv[1][1]["order"]))


class InTempDir(unittest.TestCase):
    """A test with a directory of its own (self.dir, self.out(name)) and an input self.x."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        self.x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))

    def tearDown(self):
        self._tmp.cleanup()

    def out(self, name="run"):
        return os.path.join(self.dir, name)


class CaptureTest(InTempDir):
    def test_names_order_values_and_calls(self):
        net = Net()
        with dct.capture(net, out=self.out()) as c:
            y = net(self.x)
        got = taps(c.path)
        self.assertEqual(list(got), ["inner.0", "inner.1", "inner", "pair.lin", "pair/0", "pair/1/twice",
                                     "shared", "shared@1", "model"])
        self.assertEqual([a["order"] for _, a in got.values()], list(range(9)))
        with torch.no_grad():
            h = net.inner(self.x)
            np.testing.assert_array_equal(got["inner"][0], h.numpy())
            np.testing.assert_array_equal(got["shared"][0], net.shared(net.pair.lin(h)).numpy())
        np.testing.assert_array_equal(got["model"][0], y.detach().numpy())
        self.assertFalse(any("spec" in a for _, a in got.values()), "unmatched taps are replicated")
        with h5py.File(c.path) as f:
            self.assertEqual(dict(f.attrs)["mesh"], "dp=1")
            self.assertEqual(f.attrs["world_size"], 1)
            self.assertEqual(f.attrs["dtype"], "float32")
            self.assertTrue(f.attrs["producer"].startswith("diffcheck.torch"))

    def test_steps_restart_numbering_and_manual_taps(self):
        net = Net()
        with dct.capture(net, out=self.out(), include=["shared"]) as c:
            for t in range(2):
                dct.step(t)
                net(self.x)
                dct.tap("latents", self.x, spec="-,dp")
        self.assertEqual(list(taps(c.path)), ["step0/shared", "step0/shared@1", "step0/latents",
                                              "step1/shared", "step1/shared@1", "step1/latents"])
        self.assertEqual(taps(c.path)["step1/latents"][1]["spec"], "-,dp")
        dct.tap("outside", self.x)  # no capture open: nothing, no error

    def test_hooks_gone_after_block_and_after_exception(self):
        net = Net()
        before = hook_count(net)
        with dct.capture(net, out=self.out("a"), inputs=True):
            self.assertGreater(hook_count(net), before)
            net(self.x)
        self.assertEqual(hook_count(net), before)

        class Boom(Exception):
            pass
        with self.assertRaises(Boom):
            with dct.capture(net, out=self.out("b")) as c:
                net(self.x)
                raise Boom()
        self.assertEqual(hook_count(net), before)
        self.assertEqual(os.listdir(self.dir), ["a.rank0.h5"], "no file, not even a partial one, after an error")
        # An error inside a hook (a layout that does not fit) also removes them.
        with self.assertRaises(ValueError):
            with dct.capture(net, out=self.out("c"), layouts={"inner.0": "-,-,dp"}):
                net(self.x)
        self.assertEqual(hook_count(net), before)
        self.assertFalse(os.path.exists(c.path))

    def test_bfloat16_module(self):
        lin = nn.Linear(4, 4).to(torch.bfloat16)
        with dct.capture(lin, out=self.out()) as c:
            y = lin(self.x.to(torch.bfloat16))
        values, attrs = taps(c.path)["model"]
        self.assertEqual(attrs["dtype"], "bfloat16")
        self.assertEqual(values.dtype, np.float32)
        np.testing.assert_array_equal(values, y.detach().float().numpy())
        with h5py.File(c.path) as f:
            self.assertEqual(f.attrs["dtype"], "bfloat16")

    def test_the_run_dtype_as_a_torch_dtype_or_a_string(self):
        # dct.references takes a torch dtype; dct.capture(dtype=...) takes one too (it crashed inside h5py).
        lin = nn.Linear(4, 4)
        for given in (torch.bfloat16, "bfloat16"):
            with dct.capture(lin, out=self.out(f"d{given}"), dtype=given) as c:
                lin(self.x)
            with h5py.File(c.path) as f:
                self.assertEqual(f.attrs["dtype"], "bfloat16")

    def test_layouts(self):
        net = Net()
        layouts = {"inner.*": "-,tp", "pair/1/*": ("-,tp", "dp"), "shared@1": {"spec": "tp,-", "reduction_depth": 8}}
        with dct.capture(net, out=self.out(), mesh="dp=1,tp=1", layouts=layouts) as c:
            net(self.x)
        got = {n: a for n, (_, a) in taps(c.path).items()}
        self.assertEqual(got["inner.0"]["spec"], "-,tp")
        self.assertNotIn("spec", got["inner"], "'inner.*' does not match 'inner'")
        self.assertEqual((got["pair/1/twice"]["spec"], got["pair/1/twice"]["partial"]), ("-,tp", "dp"))
        self.assertNotIn("spec", got["shared"])
        self.assertEqual((got["shared@1"]["spec"], got["shared@1"]["reduction_depth"]), ("tp,-", 8))

    def test_layout_errors_name_the_tap(self):
        net = Net()
        for layouts, words in (({"inner.0": "-,-,tp"}, "spec '-,-,tp' has 3 entries for 2 dimensions"),
                               ({"inner.0": "-,sp"}, "axis 'sp' is not in the mesh 'tp=1'"),
                               ({"inner.0": (None, "cfg")}, "axis 'cfg'")):
            with self.subTest(layouts=layouts):
                with self.assertRaises(ValueError) as e:
                    with dct.capture(net, out=self.out(), mesh="tp=1", layouts=layouts):
                        net(self.x)
                self.assertIn("tap 'inner.0'", str(e.exception))
                self.assertIn(words, str(e.exception))
        with self.assertRaisesRegex(ValueError, "unknown keys"):
            dct.capture(net, out=self.out(), layouts={"x": {"sepc": "-"}})

    def test_a_misspelled_keyword_is_a_type_error_naming_the_nearest(self):
        net = Net()
        for kwargs, words in (({"refrence": True}, "'refrence'; did you mean 'reference'?"),
                              ({"layout": {"inner.0": "-,-"}}, "'layout'; did you mean 'layouts'?"),
                              ({"incude": "inner*"}, "'incude'; did you mean 'include'?"),
                              ({"sede": 3}, "'sede'; did you mean 'seed'?"),
                              ({"backwards": True}, "'backwards'")):
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(TypeError) as e:
                    dct.capture(net, out=self.out(), **kwargs)
                self.assertIn(f"unexpected keyword argument {words}", str(e.exception))
                self.assertFalse(os.path.exists(self.out() + ".rank0.h5"))
        # The documented root attributes, and others as one explicit dict.
        with dct.capture(net, out=self.out(), scenario="mine", seed=3, flags="a=1",
                         attrs={"model": "net", "lr": 0.5}):
            net(self.x)
        with h5py.File(self.out() + ".rank0.h5") as f:
            got = {k: f.attrs[k] for k in ("scenario", "seed", "flags", "model", "lr")}
        self.assertEqual(got, {"scenario": "mine", "seed": 3, "flags": "a=1", "model": "net", "lr": 0.5})
        with self.assertRaisesRegex(TypeError, r"attrs\['table'\] is a dict: a root attribute is a string, "
                                               r"a number or a bool"):
            dct.capture(net, out=self.out(), attrs={"table": {"a": 1}})
        with self.assertRaisesRegex(TypeError, r"attrs\['mesh'\]: set by the capture itself"):
            dct.capture(net, out=self.out(), attrs={"mesh": "tp=2"})
        with self.assertRaisesRegex(TypeError, r"tap 'z': unexpected keyword argument 'rtl'; did you mean 'rtol'\?"):
            with dct.capture(net, out=self.out()):
                dct.tap("z", self.x, rtl=1e-3)

    def test_one_device_capture_is_written_beside_the_reference(self):
        net = Net()
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "1", "2"  # a launcher's: not this capture's
        self.addCleanup(os.environ.pop, "RANK")
        self.addCleanup(os.environ.pop, "WORLD_SIZE")
        with dct.capture(net, out=self.out("ref.h5"), one_device=True) as c:
            net(self.x)
            dct.tap("latents", self.x, spec="-,sp")  # the sharded run's layout: no axis here, none kept
        self.assertEqual(c.path, self.out("ref.one_device.rank0.h5"))
        with h5py.File(c.path) as f:
            self.assertEqual((f.attrs["mesh"], int(f.attrs["world_size"]), f.attrs["dtype"]),
                             ("dp=1", 1, "float32"))
        written = taps(c.path)
        self.assertIn("inner.0", written)
        self.assertNotIn("spec", written["latents"][1])
        for bad in ({"reference": True}, {"mesh": "tp=1"}, {"layouts": {"*": "-,-"}}, {"rank": 1},
                    {"world_size": 2}):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, "one_device=True"):
                dct.capture(net, out=self.out("ref"), one_device=True, **bad)

    def test_math_mode_is_recorded(self):
        net = Net()

        def recorded():
            with dct.capture(net, out=self.out()):
                net(self.x)
            with h5py.File(self.out() + ".rank0.h5") as f:
                return dict(kv.split("=") for kv in f.attrs["math"].split())

        tf32, precision = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
        self.addCleanup(setattr, torch.backends.cuda.matmul, "allow_tf32", tf32)
        self.addCleanup(torch.set_float32_matmul_precision, precision)
        torch.set_float32_matmul_precision("highest")
        strict = recorded()
        self.assertEqual((strict["float32_matmul_precision"], strict["tf32_matmul"], strict["autocast_cpu"],
                          strict["autocast_cuda"]), ("highest", "0", "off", "off"))
        torch.backends.cuda.matmul.allow_tf32 = True
        self.assertEqual(recorded()["tf32_matmul"], "1")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("high")  # what most training code sets: TF32 matmuls
        self.assertEqual({k: recorded()[k] for k in ("float32_matmul_precision", "tf32_matmul")},
                         {"float32_matmul_precision": "high", "tf32_matmul": "1"})
        with torch.autocast("cpu", dtype=torch.bfloat16):
            self.assertEqual(recorded()["autocast_cpu"], "bfloat16")

    def test_mesh_must_match_the_world(self):
        with self.assertRaisesRegex(ValueError, r"capture\(mesh=...\) is needed with 2 ranks"):
            dct.capture(Net(), out=self.out(), rank=0, world_size=2)
        with self.assertRaisesRegex(ValueError, "mesh 'tp=4' has 4 ranks but this run has 2"):
            dct.capture(Net(), out=self.out(), mesh="tp=4", rank=0, world_size=2)
        with self.assertRaisesRegex(ValueError, "not a list of name=size"):
            dct.capture(Net(), out=self.out(), mesh="tp4", rank=0, world_size=4)
        c = dct.capture(Net(), out=self.out(), mesh="cfg=2,sp=2", rank=3, world_size=4)
        self.assertTrue(c.path.endswith("run.rank3.h5"))

    def test_include_exclude_inputs(self):
        net = Net()
        with dct.capture(net, out=self.out(), include=["inner*", "pair"], exclude=["inner.1"], inputs=True) as c:
            net(self.x)
        self.assertEqual(list(taps(c.path)), ["inner:in/0", "inner.0:in/0", "inner.0", "inner", "pair:in/0",
                                              "pair/0", "pair/1/twice"])
        np.testing.assert_array_equal(taps(c.path)["inner:in/0"][0], self.x.numpy())

    def test_reference_mode_and_rename(self):
        class Wrapped(nn.Module):  # the reference keeps the block under another path
            def __init__(self):
                super().__init__()
                self.model = Net()

            def forward(self, x):
                return self.model(x)
        ref = Wrapped().double()
        with dct.capture(ref, out=self.out("ref"), reference=True, rename={"model": "", "model.pair": "pair2"},
                         exclude=["model"]) as c:
            ref(self.x.double())
            dct.tap("extra", self.x, spec="-,tp")  # a spec means nothing in a reference
        self.assertTrue(c.path.endswith("ref.h5"))
        with h5py.File(c.path) as f:
            self.assertEqual(f.attrs["world_size"], 1)
            self.assertNotIn("mesh", f.attrs)
            self.assertNotIn("taps", f)
            names = []
            f["reference"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            self.assertEqual(sorted(names), sorted(["inner.0", "inner.1", "inner", "pair2.lin", "pair2/0",
                                                    "pair2/1/twice", "shared", "shared@1", "extra"]))
            self.assertEqual(f["reference/shared"].dtype, np.float64)

    def test_values_as_they_were_when_the_module_returned(self):
        """Taps are written on a thread while the model goes on: a later in-place change
        (an all-reduce into the output, a residual add) must not reach the file."""
        class InPlace(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 256)

            def forward(self, x):
                y = self.lin(x)
                expected.append(y.detach().clone())
                with torch.no_grad():
                    for _ in range(50):
                        y.mul_(1.5)
                return y
        expected = []
        net = InPlace()
        with dct.capture(net, out=self.out(), include=["lin"]) as c:
            for _ in range(3):
                net(self.x)
        got = taps(c.path)
        for name, want in zip(("lin", "lin@1", "lin@2"), expected):
            np.testing.assert_array_equal(got[name][0], want.numpy())

    def test_name_clash_is_an_error_naming_the_tap(self):
        lin = nn.Linear(4, 4)
        with self.assertRaisesRegex(ValueError, "cannot write 'taps/a/b'.*a tap and a group"):
            with dct.capture(lin, out=self.out(), include=[]):
                dct.tap("a", self.x)
                dct.tap("a/b", self.x)


@unittest.skipUnless(os.environ.get("DIFFCHECK_EXE"), "needs DIFFCHECK_EXE (set by ctest)")
class CompareTest(unittest.TestCase):
    """dct.compare: the report on a pass, Divergence (an AssertionError) on a
    failure, InputError on a bad file, DiffcheckError without an executable."""

    def test_verdicts(self):
        with tempfile.TemporaryDirectory() as d:
            net = Net()
            with dct.capture(net, out=f"{d}/run"):
                net(torch.ones(2, 4))
            ref = Net().double()
            with dct.capture(ref, out=f"{d}/ref", reference=True):
                ref(torch.ones(2, 4, dtype=torch.float64))
            report = dct.compare(f"{d}/run", reference=f"{d}/ref.h5")
            self.assertTrue(report["pass"])
            self.assertIsNone(report["first_divergence"])
            self.assertIn("PASS", report["console"])

            with torch.no_grad():
                ref.pair.lin.bias += 1e-3  # the run now differs from pair.lin on
            with dct.capture(ref, out=f"{d}/ref", reference=True):
                ref(torch.ones(2, 4, dtype=torch.float64))
            with self.assertRaises(AssertionError) as e:
                dct.compare(f"{d}/run", reference=f"{d}/ref.h5")
            self.assertIsInstance(e.exception, diffcheck.Divergence)
            self.assertEqual(e.exception.first_divergence["tap"], "pair.lin")
            self.assertIn("pair.lin", str(e.exception))
            self.assertFalse(e.exception.report["pass"])
            report = dct.compare(f"{d}/run", reference=f"{d}/ref.h5", check=False)
            self.assertEqual(report["first_divergence"]["tap"], "pair.lin")

            with self.assertRaises(diffcheck.InputError) as e:
                dct.compare(f"{d}/missing")
            self.assertIn("missing", str(e.exception))
            with self.assertRaisesRegex(diffcheck.DiffcheckError, "executable was not found"):
                _without_exe(f"{d}/run")


class ReferencesInOneCall(unittest.TestCase):
    def test_reference_and_yardstick_then_the_verdict(self):
        built = []

        def make(dtype):
            built.append(dtype)
            return Net().to(dtype), (torch.ones(2, 4, dtype=dtype),)
        with tempfile.TemporaryDirectory() as d:
            net = Net()
            with dct.capture(net, out=f"{d}/run"):
                net(torch.ones(2, 4))
            self.assertEqual(dct.references(make, f"{d}/ref", dtype=torch.float32), f"{d}/ref.h5")
            self.assertEqual(built, [torch.float64, torch.float32])
            self.assertEqual(sorted(os.listdir(d)), ["ref.h5", "ref.one_device.rank0.h5", "run.rank0.h5"])
            self.assertEqual(set(taps(f"{d}/ref.one_device.rank0.h5")), set(taps(f"{d}/run.rank0.h5")))
            self.assertEqual(dct.verdict(f"{d}/run", reference=f"{d}/ref.h5"), 0)
            with self.assertRaisesRegex(TypeError, "mesh, rank are the sharded capture's"):
                dct.references(make, f"{d}/ref", dtype=torch.float32, mesh="tp=2", rank=0)
            with self.assertRaisesRegex(TypeError, "return \\(model, inputs\\)"):
                dct.references(lambda dt: Net(), f"{d}/ref", dtype=torch.float32)
            os.environ.update(RANK="1", WORLD_SIZE="2")
            try:  # another rank: nothing built, nothing written
                self.assertIsNone(dct.references(make, f"{d}/other", dtype=torch.float32))
            finally:
                del os.environ["RANK"], os.environ["WORLD_SIZE"]
            self.assertEqual(len(built), 2)


class NoReferenceCycle(unittest.TestCase):
    def test_a_capture_leaves_nothing_for_the_garbage_collector(self):
        """A capture's objects go when it does: none wait for a GC pass (a
        cycle Capture <-> CompiledCounts and a ctypes array type per dataset
        left 14 per capture of this model before)."""
        net, x = Net(), torch.ones(2, 4)
        with tempfile.TemporaryDirectory() as d:
            with dct.capture(net, out=f"{d}/warm"):
                net(x)
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for i in range(3):
                    with dct.capture(net, out=f"{d}/run{i}"):
                        net(x)
                gc.collect()
                kept = [type(o).__name__ for o in gc.garbage]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
        self.assertEqual(kept, [])


class Rotary(nn.Module):
    """A rotary table as DiT and LLM code builds it: complex64, torch.polar."""

    def forward(self, positions):
        freqs = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=positions.dtype) / 8))
        angles = torch.outer(positions, freqs)
        return torch.polar(torch.ones_like(angles), angles)


class Rope(nn.Module):
    def __init__(self):
        super().__init__()
        self.rope = Rotary()

    def forward(self, x, positions):
        table = self.rope(positions)
        return torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * table).flatten(-2)


class ComplexOutputs(unittest.TestCase):
    """A complex output is captured as its real view and marked; a rotary
    table at local positions on one sequence-parallel rank is found there."""

    def capture(self, d, local_positions_on_rank1):
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
        for rank in (0, 1):  # sp=2: each rank holds 4 of the 8 positions
            start = 0 if rank == 1 and local_positions_on_rank1 else 4 * rank
            model = Rope()
            with dct.capture(model, out=f"{d}/run", mesh="sp=2", rank=rank, world_size=2,
                             layouts={"*": "sp,-"}):
                model(x[4 * rank:4 * rank + 4], torch.arange(start, start + 4, dtype=torch.float32))
        ref = Rope()
        with dct.capture(ref, out=f"{d}/ref", reference=True):
            ref(x.double(), torch.arange(8, dtype=torch.float64))

    def test_the_real_view_is_written_marked(self):
        with tempfile.TemporaryDirectory() as d:
            self.capture(d, False)
            got = taps(f"{d}/run.rank1.h5")
            values, attrs = got["rope"]
            self.assertEqual((values.shape, attrs["complex"], attrs["spec"]), ((4, 4, 2), 1, "sp,-"))
            angles = np.outer(np.arange(4, 8), 1.0 / (10000 ** (np.arange(0, 8, 2) / 8)))
            np.testing.assert_allclose(values, np.stack([np.cos(angles), np.sin(angles)], -1), rtol=1e-5, atol=1e-6)
            self.assertNotIn("complex", got["model"][1])
            report = dct.compare(f"{d}/run", reference=f"{d}/ref.h5")
            self.assertRegex(report["console"], r"rope\s+sp,- complex")

    def test_local_positions_on_one_rank_are_found_at_the_table(self):
        with tempfile.TemporaryDirectory() as d:
            self.capture(d, True)
            with self.assertRaises(diffcheck.Divergence) as e:
                dct.compare(f"{d}/run", reference=f"{d}/ref.h5")
            self.assertEqual(e.exception.first_divergence["tap"], "rope")


class CachedRope(nn.Module):
    """torchtitan's way: the rotary table a complex buffer (freqs_cis), made once."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        angles = torch.outer(torch.arange(4.0), 1.0 / (10000 ** (torch.arange(0, 8, 2) / 8)))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):
        xc = torch.view_as_complex(self.lin(x).reshape(*x.shape[:-1], -1, 2).float())
        return torch.view_as_real(xc * self.freqs_cis).flatten(-2).to(x.dtype)


class ComplexBuffersInReferences(unittest.TestCase):
    """model.to(dtype), as the docs showed, turned freqs_cis real (torch only warns): the reference and the
    yardstick broke alike, and a clean run failed at the rotary tap (err/tol 69 on torchtitan's llama3)."""

    def test_a_make_that_drops_imaginary_parts_is_refused_and_to_dtype_keeps_them(self):
        def make(cast):
            return lambda dt: (cast(CachedRope(), dt), (torch.ones(4, 8, dtype=dt),))
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, r"cast a complex tensor to a real dtype.*dct\.to_dtype"):
                dct.references(make(lambda m, dt: m.to(dt)), f"{d}/bad", dtype=torch.float32)
            self.assertEqual(dct.references(make(dct.to_dtype), f"{d}/good", dtype=torch.float32), f"{d}/good.h5")
        model = dct.to_dtype(CachedRope(), torch.float64)
        self.assertEqual((model.freqs_cis.dtype, model.lin.weight.dtype), (torch.complex128, torch.float64))
        self.assertEqual(dct.to_dtype(CachedRope(), torch.bfloat16).freqs_cis.dtype, torch.complex64)


def _without_exe(prefix):
    saved, path = os.environ.pop("DIFFCHECK_EXE"), os.environ["PATH"]
    os.environ["PATH"] = ""
    try:
        dct.compare(prefix)
    finally:
        os.environ["DIFFCHECK_EXE"], os.environ["PATH"] = saved, path


class WriterTest(unittest.TestCase):
    def test_a_dead_writer_thread_raises_instead_of_hanging(self):
        """Found while sweeping seeds: a writer thread that died left the next submit waiting forever."""
        import threading
        from diffcheck.dump.writer import BackgroundWriter
        w = BackgroundWriter()
        w._jobs.put(None)  # the thread ends as if it had died
        w._thread.join()
        w.submit(lambda: (lambda: None))  # takes the one slot; nothing will free it
        outcome = []

        def second():
            try:
                w.submit(lambda: (lambda: None))
                outcome.append("returned")
            except RuntimeError as e:
                outcome.append(str(e))
        t = threading.Thread(target=second, daemon=True)
        t.start()
        t.join(timeout=10)
        self.assertFalse(t.is_alive(), "submit hung")
        self.assertIn("writer thread has ended", outcome[0])


class DumpWritesAsH5pyDoes(unittest.TestCase):
    """diffcheck.dump writes datasets and attributes through HDF5's C
    functions or h5py's low-level API (h5py's high-level calls cost a sketch
    capture most of its writing, diffcheck/dump/hdf5_writes.py): either way, the
    file must read back exactly as h5py's own calls write it."""

    ARRAYS = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3), "f64": np.linspace(0, 1, 5),
              "f16": np.ones((2, 2), np.float16), "i64": np.arange(4), "u8": np.ones(3, np.uint8),
              "empty": np.zeros((0, 4), np.float32), "scalar": np.array(2.5),
              "strided": np.arange(12.0).reshape(3, 4)[:, ::2], "big_endian": np.arange(3, dtype=">f4"),
              "nested/deep/grüße": np.ones(2, np.float32)}
    TAP_ATTRS = {"spec": "-,tp", "order": 3, "reduction_depth": np.int64(7), "atol": 1e-3, "text": "ünï"}
    ROOT_ATTRS = {"flag": True, "counts": np.arange(3), "seed": 5, "producer": "x"}

    MODES = ("one call", "per call", "low level")  # kernels/h5_dataset.c; h5_direct's calls; h5py's low-level API

    def written(self, path, mode):
        from diffcheck.dump import h5_direct
        from diffcheck.dump import hdf5_writes
        from diffcheck.kernels import library
        saved = dict(h5_direct._state)
        if mode == "low level":
            h5_direct._state.update(lib=None, tried=True)
        try:
            with contextlib.ExitStack() as stack:
                if mode != "one call":
                    stack.enter_context(library.without())
                self.assertEqual(h5_direct.available(), mode != "low level")
                self.assertEqual(h5_direct.one_call() is not None, mode == "one call")
                with h5py.File(path, "w", track_order=True) as f:
                    for name, a in self.ARRAYS.items():
                        hdf5_writes.write_dataset(f, name, a, self.TAP_ATTRS)
                    hdf5_writes.set_attrs(f["/"], self.ROOT_ATTRS)
                    with self.assertRaisesRegex(ValueError, "name already exists"):
                        hdf5_writes.write_dataset(f, "f32", self.ARRAYS["f32"], {})
                    if mode != "low level":  # an attribute HDF5 refuses (no name): named, the dataset kept
                        with self.assertRaisesRegex(ValueError, "attribute '' = 1 could not be written"):
                            hdf5_writes.write_dataset(f, "refused", self.ARRAYS["f32"], {"spec": "-,tp", "": 1})
                        self.assertEqual(dict(f["refused"].attrs), {"spec": "-,tp"})
                        del f["refused"]
        finally:
            h5_direct._state.update(saved)

    def test_datasets_and_attributes_match_h5pys_high_level_calls(self):
        with tempfile.TemporaryDirectory() as d:
            high = os.path.join(d, "high.h5")
            with h5py.File(high, "w", track_order=True) as f:
                for name, a in self.ARRAYS.items():
                    f.create_dataset(name, data=a).attrs.update(self.TAP_ATTRS)
                f.attrs.update(self.ROOT_ATTRS)
            from diffcheck.kernels import library
            for mode in self.MODES:
                if mode == "one call" and library.get("diffcheck_h5_write_dataset") is None:
                    self.assertIsNone(os.environ.get(library.ENV), "the kernel given predates kernels/h5_dataset.c")
                    continue  # no kernel built: the two other ways
                path = os.path.join(d, f"{mode.replace(' ', '_')}.h5")
                self.written(path, mode)
                with h5py.File(path, "r") as a, h5py.File(high, "r") as b:
                    objects, other = [], []
                    a.visit(objects.append)
                    b.visit(other.append)
                    self.assertEqual(objects, other)
                    for name in objects + ["/"]:
                        x, y = a[name], b[name]
                        self.assertEqual(type(x), type(y), name)
                        self.assertEqual(list(x.attrs), list(y.attrs), name)
                        for k in y.attrs:
                            self.assertEqual(x.attrs.get_id(k).get_type(), y.attrs.get_id(k).get_type(), (name, k))
                            np.testing.assert_array_equal(x.attrs[k], y.attrs[k])
                        if isinstance(y, h5py.Dataset):
                            self.assertEqual((x.shape, x.dtype), (y.shape, y.dtype), name)
                            self.assertEqual(x.id.get_type(), y.id.get_type(), name)
                            self.assertEqual(x.id.get_create_plist().get_layout(), y.id.get_create_plist().get_layout())
                            np.testing.assert_array_equal(x[()], y[()])
                            np.testing.assert_array_equal(x[()], self.ARRAYS[name])
                    # The same names; a non-ASCII one is marked UTF-8 (h5py's create_dataset marks it ASCII).
                    group = a["nested/deep"]  # held: a link proxy does not hold its group
                    self.assertEqual(group.id.links.get_info("grüße".encode()).cset, h5py.h5t.CSET_UTF8)

if __name__ == "__main__":
    unittest.main()
