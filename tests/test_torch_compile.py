"""diffcheck.torch on torch.compile'd models (backend inductor, on the CPU):
a FLUX-style stack of two blocks (a ModuleList, which never runs) captured
whole and as sketches gives every tap the eager model gives, under the eager
names and in the eager order, with values equal to the compiled forward's,
whether the model was compiled before the capture, compiled and run before
it, or compiled inside it; the capture's hooks neither break the graph nor
recompile per hook (Dynamo's counters), nor per capture; a module that never ran in the
compiled graph is named in a refusal that writes no file; backward=True on a
compiled model is refused; after the capture closes the model runs on with
its hooks kept, inert, until dct.unhook."""
import os
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torch._dynamo.utils as dynamo_utils
import torch.nn as nn
import torch.nn.functional as F

import diffcheck.torch as dct

D, HEADS, TOKENS = 32, 4, 24


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        q, k, v = (t.view(x.shape[0], x.shape[1], HEADS, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Stack(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.embed = nn.Linear(D, D)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.unused = nn.Linear(D, D) if unused else None

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return x


def read(path):
    with h5py.File(path) as f:
        taps = f["taps"]
        return {n: (taps[n][()], int(taps[n].attrs["order"]),
                    (taps[n].attrs.get("reduction_depth"), taps[n].attrs.get("rounding_steps"))) for n in taps}


class CompiledCaptureTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        torch.manual_seed(0)
        self.model = Stack()
        self.x = torch.randn(2, TOKENS, D)
        torch.compiler.reset()
        dynamo_utils.counters.clear()

    def tearDown(self):
        self._tmp.cleanup()

    def capture(self, model, name, run, **kw):
        with torch.no_grad(), dct.capture(model, out=os.path.join(self.dir, name), **kw):
            run()
        return read(os.path.join(self.dir, f"{name}.rank0.h5"))

    def test_every_eager_tap_whatever_the_order(self):
        eager = self.capture(self.model, "eager", lambda: self.model(self.x))
        self.assertEqual(len(eager), 22)  # every module but the ModuleList
        self.assertNotIn("blocks", eager)

        def before():
            return torch.compile(self.model, backend="inductor")

        def warmed():
            c = torch.compile(self.model, backend="inductor")
            with torch.no_grad():
                c(self.x)
            return c

        for order, make in (("compiled before", before), ("compiled and run before", warmed)):
            with self.subTest(order=order):
                c = make()
                with torch.no_grad():
                    want = c(self.x).numpy()
                got = self.capture(c, order.replace(" ", "_"), lambda: c(self.x))
                self.check_same_taps(eager, got, want)
                # The rounding counts of the derived tolerance, from the fake forward.
                self.assertEqual({n: v[2] for n, v in got.items()}, {n: v[2] for n, v in eager.items()})
                self.assertEqual(eager["blocks.1.mlp.2"][2], (672, 24))
        with self.subTest(order="compiled inside"):
            inside = {}

            def run():
                c = torch.compile(self.model, backend="inductor")
                inside["out"] = c(self.x).numpy()
            got = self.capture(self.model, "inside", run)
            self.check_same_taps(eager, got, inside["out"])
        self.assertEqual(dict(dynamo_utils.counters["graph_break"]), {}, "no graph break")

    def check_same_taps(self, eager, got, compiled_out):
        self.assertEqual(sorted(got), sorted(eager))
        self.assertEqual([n for n, _ in sorted(got.items(), key=lambda kv: kv[1][1])],
                         [n for n, _ in sorted(eager.items(), key=lambda kv: kv[1][1])], "the eager order")
        for name in eager:
            np.testing.assert_allclose(got[name][0], eager[name][0], rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_array_equal(got["model"][0], compiled_out, "the tap is the compiled graph's value")

    def test_no_recompile_per_hook_and_sketches(self):
        c = torch.compile(self.model, backend="inductor")
        with torch.no_grad(), dct.capture(c, out=os.path.join(self.dir, "s"), sketch=True):
            c(self.x)
            graphs = dynamo_utils.counters["stats"]["unique_graphs"]
            for t in range(3):
                dct.step(t)
                c(self.x)
            self.assertEqual(dynamo_utils.counters["stats"]["unique_graphs"], graphs, "no recompile")
        self.maxDiff = None
        self.assertEqual(dict(dynamo_utils.counters["graph_break"]), {})
        with h5py.File(os.path.join(self.dir, "s.rank0.h5")) as f:
            names = []
            f["taps"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            sketched = [n for n in names if f["taps"][n].attrs.get("sketch")]
        self.assertEqual(len([n for n in names if n.startswith("step2/")]), 22)
        self.assertGreaterEqual(len(sketched), 4 * 22 - 4, "every tap of each forward, sketched")
        with torch.no_grad():  # the capture closed: the compiled model runs on, writing nothing
            c(self.x)
        # A capture per forward (a training loop's): the graphs of the first serve the next ones.
        for i in range(2):
            got = self.capture(c, f"again{i}", lambda: c(self.x))
            self.assertEqual(len(got), 22)
            with torch.no_grad():
                np.testing.assert_array_equal(got["model"][0], c(self.x).numpy())
        self.assertEqual(dynamo_utils.counters["stats"]["unique_graphs"], graphs, "no recompile")

    def test_each_shape_keeps_its_own_rounding_counts(self):
        """Forwards of 24, 96, then 24 tokens: the attention's counts are its tokens', and the third
        forward's are the first's again (it kept the second's: the fake forward is run once per shape)."""
        c = torch.compile(self.model, backend="eager")  # the counts come from the eager model's fake forward
        long = torch.randn(2, 4 * TOKENS, D)
        with torch.no_grad(), dct.capture(c, out=os.path.join(self.dir, "shapes")):
            for t, x in enumerate((self.x, long, self.x)):
                dct.step(t)
                c(x)
        with h5py.File(os.path.join(self.dir, "shapes.rank0.h5")) as f:
            counts = [tuple(f["taps"][f"step{t}/blocks.0.attn"].attrs.get(a) for a in ("reduction_depth",
                                                                                     "rounding_steps"))
                      for t in range(3)]
        self.assertNotEqual(counts[0], counts[1])
        self.assertEqual(counts[2], counts[0])

    def test_another_instance_compiled_without_hooks_does_not_serve_the_captured_one(self):
        """Dynamo shares graphs between instances of one class: an uninstrumented copy run
        before and between the captures must not lend its hook-less graph to the captured model."""
        import copy
        plain = torch.compile(copy.deepcopy(self.model), backend="inductor")
        c = torch.compile(self.model, backend="inductor")
        for i in range(3):
            with torch.no_grad():
                plain(self.x)
            got = self.capture(c, f"copy{i}", lambda: c(self.x))
            self.assertEqual(len(got), 22)

    def test_a_module_that_never_ran_is_named_and_nothing_written(self):
        model = Stack(unused=True)
        c = torch.compile(model, backend="inductor")
        with self.assertRaisesRegex(RuntimeError, r"saw 22 of 23 module outputs.*\(unused\).*not written"):
            with torch.no_grad(), dct.capture(c, out=os.path.join(self.dir, "u")):
                c(self.x)
        self.assertEqual(os.listdir(self.dir), [])
        with torch.no_grad():  # the hooks kept on a compiled model do nothing between captures
            c(self.x)
        self.assertEqual(os.listdir(self.dir), [])
        self.assertEqual(sum(len(m._forward_hooks) for m in c.modules()), 23)
        dct.unhook(c)
        self.assertEqual(sum(len(m._forward_hooks) for m in c.modules()), 0)

    def test_backward_on_a_compiled_model_is_refused(self):
        c = torch.compile(self.model, backend="inductor")
        with self.assertRaisesRegex(ValueError, r"backward=True\) of a torch.compile'd model.*_orig_mod"):
            with dct.capture(c, out=os.path.join(self.dir, "b"), backward=True):
                pass


if __name__ == "__main__":
    unittest.main()
