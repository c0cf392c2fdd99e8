"""diffcheck.torch with backward=True in one process: gradient tap names and
their order (the autograd engine's) for a nested model with a module used
twice; parameter gradients before the optimizer step and parameters after
it, the step's wrapper gone afterwards; layouts of gradients (a partial sum's
gradient replicated) and of parameters (by glob, a partial given); hooks
removed and the optimizer restored after an exception in backward; a
hand-written update's gradients tapped at the close, or a warning; values
equal to autograd's. Runs against the source tree (PYTHONPATH=python/)."""
import os
import unittest

import h5py
import numpy as np
import torch
import torch.nn as nn

import diffcheck.torch as dct
from test_torch_capture import InTempDir, hook_count, taps  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.shared = nn.Linear(4, 4)

    def forward(self, x):
        return self.shared(self.shared(self.inner(x)))  # one module called twice


class Explodes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("backward failed")


class BackwardTest(InTempDir):
    def grads_and_params(self, **capture_kwargs):
        """The tap names of a backward with dct.grads() and dct.params() called by hand."""
        net = Net()
        with dct.capture(net, out=self.out(), backward=True, **capture_kwargs):
            net(self.x).sum().backward()
            dct.grads()
            dct.params()
        return list(taps(self.out() + ".rank0.h5"))

    def test_names_order_and_values(self):
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with dct.capture(net, out=self.out(), backward=True, optimizer=opt):
            dct.step(0)
            y = net(self.x)
            y.square().sum().backward()
            grads = {n: p.grad.clone() for n, p in net.named_parameters()}
            opt.step()
        self.assertNotIn("step", opt.__dict__)  # the wrapper is gone
        t = taps(self.out() + ".rank0.h5")
        names = [n for n in t]
        forward = ["inner.0", "inner.1", "inner", "shared", "shared@1", "model"]
        # The engine's order; a module returning its child's very tensor (model and shared@1, inner and
        # inner.1) gets the same gradient at once, after the child.
        backward = ["shared@1", "model", "shared", "inner.1", "inner", "inner.0"]
        params = [n for n, _ in net.named_parameters()]
        self.assertEqual(names, [f"step0/{n}" for n in forward] + [f"step0/grad/{n}" for n in backward]
                         + [f"step0/param_grad/{n}" for n in params] + [f"step0/param/{n}" for n in params])
        np.testing.assert_allclose(t["step0/grad/model"][0], 2 * y.detach().numpy(), rtol=1e-6)
        for n, p in net.named_parameters():
            np.testing.assert_array_equal(t[f"step0/param_grad/{n}"][0], grads[n].numpy())
            np.testing.assert_array_equal(t[f"step0/param/{n}"][0], p.detach().numpy())  # after the step

    def test_grads_and_params_without_an_optimizer(self):
        names = self.grads_and_params()
        self.assertIn("param_grad/shared.weight", names)
        self.assertIn("param/inner.0.bias", names)
        self.assertLess(names.index("param_grad/shared.weight"), names.index("param/inner.0.bias"))

    def test_hand_written_update_taps_the_gradients_at_the_close_or_says_so(self):
        net = Net()
        with dct.capture(net, out=self.out("kept"), backward=True):
            net(self.x).sum().backward()
            grads = {n: p.grad.clone() for n, p in net.named_parameters()}
            with torch.no_grad():
                for p in net.parameters():
                    p -= 0.1 * p.grad  # the update by hand; the gradients stay
        t = taps(self.out("kept") + ".rank0.h5")
        for n in grads:
            np.testing.assert_array_equal(t[f"param_grad/{n}"][0], grads[n].numpy())
        with self.assertWarnsRegex(UserWarning, r"rank 0: .*no parameter gradient was tapped: a backward ran, but no "
                                                r"parameter holds a gradient now.*dct.grads\(\)"):
            with dct.capture(net, out=self.out("cleared"), backward=True):
                net(self.x).sum().backward()
                with torch.no_grad():
                    for p in net.parameters():
                        p -= 0.1 * p.grad
                        p.grad = None
        self.assertFalse(any(n.startswith("param_grad/") for n in taps(self.out("cleared") + ".rank0.h5")))

    def test_an_exclude_glob_on_parameter_taps_leaves_them_out(self):
        """A weight whose layout no spec describes (diffusers' packed row-parallel projection) is
        left out by its tap names; module-path globs leave parameters alone, as before."""
        names = self.grads_and_params(exclude=["param*/shared.weight", "inner.1"])
        self.assertNotIn("param_grad/shared.weight", names)
        self.assertNotIn("param/shared.weight", names)
        self.assertNotIn("inner.1", names)
        self.assertIn("param_grad/shared.bias", names)
        self.assertIn("param/inner.0.weight", names)

    def test_no_backward_taps_unless_asked_and_no_optimizer_alone(self):
        net = Net()
        with dct.capture(net, out=self.out()):
            net(self.x).sum().backward()
        self.assertFalse(any(n.startswith(("grad/", "param")) for n in taps(self.out() + ".rank0.h5")))
        with self.assertRaisesRegex(ValueError, "backward=True"):
            dct.capture(net, out=self.out("x"), optimizer=torch.optim.SGD(net.parameters(), lr=1))

    def test_layouts_of_gradients_and_parameters(self):
        class Row(nn.Module):
            def __init__(self):
                super().__init__()
                self.matmul = nn.Linear(4, 6, bias=False)
                self.bias = nn.Parameter(torch.zeros(6))

            def forward(self, x):
                return self.matmul(x) + self.bias

        row = Row()
        layouts = {"matmul": (None, "tp"), "param*/matmul.weight": "-,tp", "param_grad/bias": (None, "tp"),
                   "model": "-,tp"}
        opt = torch.optim.SGD(row.parameters(), lr=0.1)
        with dct.capture(row, out=self.out(), mesh="tp=2", rank=0, world_size=2, layouts=layouts, backward=True,
                         optimizer=opt):
            row(self.x).sum().backward()
            opt.step()
        a = {n: v[1] for n, v in taps(self.out() + ".rank0.h5").items()}
        self.assertEqual(a["matmul"].get("partial"), "tp")
        self.assertNotIn("partial", a["grad/matmul"])  # a partial sum's gradient is the sum's: replicated
        self.assertNotIn("spec", a["grad/matmul"])
        self.assertEqual(a["grad/model"]["spec"], "-,tp")  # an output's gradient has its layout
        self.assertEqual(a["param_grad/matmul.weight"]["spec"], "-,tp")
        # A layout named for a parameter gradient keeps its depth: a sum over the 3 tokens and the forward's.
        for name in ("param_grad/matmul.weight", "param_grad/bias"):
            self.assertGreaterEqual(a[name].get("reduction_depth", 0), 3 + 4, name)
        self.assertEqual(a["param/matmul.weight"]["spec"], "-,tp")
        self.assertEqual(a["param_grad/bias"]["partial"], "tp")  # before its reduction, as the user says
        self.assertNotIn("spec", a["param/bias"])

    def test_a_grad_pattern_names_a_gradients_own_layout(self):
        # A replicated output each rank uses on its own tokens (sequence parallelism): its gradient
        # is a partial sum over those ranks, which only the user can say.
        net = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        layouts = {"param*": None, "grad/0": (None, "sp"), "0": None, "*": "sp,-"}
        with dct.capture(net, out=self.out(), mesh="sp=2", rank=0, world_size=2, layouts=layouts, backward=True):
            net(self.x[:2]).sum().backward()
        a = {n: v[1] for n, v in taps(self.out() + ".rank0.h5").items()}
        self.assertEqual(a["grad/0"].get("partial"), "sp")
        self.assertNotIn("spec", a["0"])
        self.assertEqual(a["grad/1"]["spec"], "sp,-")  # no grad/ pattern: the output's layout, not "*"'s

    def test_a_catch_all_layout_is_the_activations_not_the_parameters(self):
        # "*" meant for [tokens, width] activations gave a 1-D norm weight a 2-entry spec and stopped the
        # capture: a pattern is a parameter tap's only if it names it ("param...").
        net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with dct.capture(net, out=self.out(), mesh="sp=2", rank=0, world_size=2, layouts={"*": "sp,-"},
                         backward=True, optimizer=opt):
            net(self.x[:2]).sum().backward()
            opt.step()
        a = {n: v[1] for n, v in taps(self.out() + ".rank0.h5").items()}
        self.assertEqual(a["1"]["spec"], "sp,-")
        for name in ("param_grad/1.weight", "param/1.weight", "param/0.weight"):
            self.assertNotIn("spec", a[name], name)

    def test_a_layout_message_names_the_pattern_that_set_it(self):
        for layouts, message in (
                ({"param*/0.weight": "sp"}, r"tap 'param_grad/0.weight' \(shape \(4, 4\)\), layout 'param\*/0.weight': "
                                            r"spec 'sp' has 1 entries for 2 dimensions"),
                ({"*": "sp,-", "grad/1": "sp"}, r"tap 'grad/1' \(shape \(2, 4\)\), layout 'grad/1': spec 'sp' has 1 "),
                ({"1": "sp"}, r"tap '1' \(shape \(2, 4\)\), layout '1': spec 'sp' has 1 ")):
            with self.subTest(layouts=layouts):
                net = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
                with self.assertRaisesRegex(ValueError, message):
                    with dct.capture(net, out=self.out(), mesh="sp=2", rank=0, world_size=2, layouts=layouts,
                                     backward=True):
                        net(self.x[:2]).sum().backward()
                        dct.grads()

    def test_data_axes_split_the_batch_and_scale_the_output_gradients(self):
        # Each data-parallel rank its own samples: every tap whose dimension 0 is the local batch is split
        # over dp on top of its layout; parameters are not; the output gradients of a rank's mean loss are
        # dp times the global batch's, written divided by dp ("local_mean") or as they are ("global").
        for loss_scale, divisor in (("local_mean", 2), ("global", 1)):
            net = nn.Sequential(nn.Linear(4, 6), nn.Tanh())
            with dct.capture(net, out=self.out(loss_scale), mesh="dp=2,tp=1", rank=0, world_size=2, backward=True,
                             data_axes="dp", loss_scale=loss_scale, layouts={"0": "-,tp"}):
                y = net(self.x)
                y.retain_grad()
                y.square().mean().backward()
                dct.grads()
            t = taps(self.out(loss_scale) + ".rank0.h5")
            self.assertEqual((t["0"][1]["spec"], t["1"][1]["spec"], t["grad/1"][1]["spec"]), ("dp,tp", "dp,-", "dp,-"))
            self.assertNotIn("spec", t["param_grad/0.weight"][1])
            np.testing.assert_allclose(t["grad/1"][0], y.grad.numpy() / divisor, rtol=1e-6)
            with h5py.File(self.out(loss_scale) + ".rank0.h5") as f:
                self.assertTrue(f.attrs["loss_scale"].startswith(loss_scale))
        with self.assertRaisesRegex(ValueError, r"data_axes \['fsdp'\]: the mesh has no axis 'fsdp' \(dp\)"):
            dct.capture(nn.Linear(4, 4), out=self.out("x"), mesh="dp=2", rank=0, world_size=2, data_axes="fsdp")
        with self.assertRaisesRegex(ValueError, r"loss_scale='mean'"):
            dct.capture(nn.Linear(4, 4), out=self.out("x"), mesh="dp=2", rank=0, world_size=2, loss_scale="mean")

    def test_each_forward_has_its_own_local_batch(self):
        # A loader's last batch is smaller: its forward's taps are split over dp too (the first forward's
        # batch was taken for every forward, and the smaller one's taps read as replicas that differ).
        net = nn.Sequential(nn.Linear(4, 6), nn.Tanh())
        with torch.no_grad(), dct.capture(net, out=self.out("batches"), mesh="dp=2,tp=1", rank=0, world_size=2,
                                          data_axes="dp", layouts={"0": "-,tp"}):
            for i, rows in enumerate((4, 3)):
                dct.step(i)
                net(torch.randn(rows, 4))
        t = taps(self.out("batches") + ".rank0.h5")
        self.assertEqual([t[f"step{i}/{n}"][1].get("spec") for i in (0, 1) for n in ("0", "1")], ["dp,tp", "dp,-"] * 2)

    def test_hooks_gone_and_optimizer_restored_after_an_exception_in_backward(self):
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with self.assertRaisesRegex(RuntimeError, "backward failed"):
            with dct.capture(net, out=self.out(), backward=True, optimizer=opt):
                Explodes.apply(net(self.x)).sum().backward()
        self.assertEqual(hook_count(net), 0)
        self.assertNotIn("step", opt.__dict__)
        self.assertFalse(os.path.exists(self.out() + ".rank0.h5"))
        # A graph made inside the capture, run backward after it: nothing written, no error.
        with dct.capture(net, out=self.out("late"), backward=True):
            y = net(self.x)
        y.sum().backward()
        self.assertFalse(any(n.startswith("grad/") for n in taps(self.out("late") + ".rank0.h5")))

    def test_reference_mode_takes_the_same_names(self):
        net = Net().double()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with dct.capture(net, out=self.out("ref"), reference=True, backward=True, optimizer=opt):
            net(self.x.double()).sum().backward()
            opt.step()
        with h5py.File(self.out("ref") + ".h5") as f:
            self.assertIn("grad/shared@1", f["reference"])
            self.assertIn("param/shared.weight", f["reference"])


if __name__ == "__main__":
    unittest.main()
