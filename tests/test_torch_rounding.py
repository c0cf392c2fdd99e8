"""diffcheck.torch's rounding counts (python/diffcheck/torch/rounding.py): the
reduction depth each op type adds, rounding steps, the deepest input path,
a partial sum's global depth, a user's depth winning, the capture's own ops
not counted, derive_depths=False, and the mode gone after the block (also
after an exception). Runs against the source tree (PYTHONPATH=python/)."""
import os
import tempfile
import unittest

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F

import diffcheck.torch as dct
from diffcheck.torch import rounding


def counted(fn, *xs):
    """(depth, steps) of fn(*xs)'s result, the inputs made outside the mode (exact)."""
    with rounding.RoundingLedger():
        y = fn(*xs)
    return rounding.counts(y)


class OpDepthTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)

    def test_each_module_type_adds_its_reduction(self):
        x = torch.randn(2, 6, 37)
        img = torch.randn(1, 8, 9, 9)
        cases = {
            "Linear: in_features": (nn.Linear(37, 5), x, 37),
            "Conv2d: in_channels x kernel": (nn.Conv2d(8, 4, 3), img, 8 * 9),
            "Conv2d, groups: in_channels/groups x kernel": (nn.Conv2d(8, 4, 3, groups=2), img, 4 * 9),
            "Conv1d": (nn.Conv1d(37, 3, 5), x.transpose(1, 2).contiguous()[:1], 37 * 5),
            "LayerNorm: normalized size": (nn.LayerNorm(37), x, 37),
            "GroupNorm: a group's elements": (nn.GroupNorm(2, 8), img, 4 * 81),
            "Softmax over the last dim": (nn.Softmax(-1), x, 37),
            "Softmax over dim 1": (nn.Softmax(1), x, 6),
            "MultiheadAttention: projections, head size, keys": (
                lambda t: nn.MultiheadAttention(37 - 1, 4, batch_first=True)(t, t, t)[0], x[..., :36],
                2 * 36 + 9 + 6),
        }
        for what, (module, inp, depth) in cases.items():
            with self.subTest(what):
                self.assertEqual(counted(module, inp)[0], depth)

    def test_functional_attention_and_reductions(self):
        q, k = torch.randn(2, 4, 10, 8), torch.randn(2, 4, 12, 8)
        scores = lambda q, k: torch.softmax(q @ k.transpose(-1, -2), dim=-1)  # noqa: E731
        self.assertEqual(counted(scores, q, k), (8 + 12, 2))  # head size, then the keys
        self.assertEqual(counted(lambda t: t.sum(-1), q)[0], 8)
        self.assertEqual(counted(lambda t: t.mean(), q)[0], q.numel())
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
            self.assertEqual(counted(F.scaled_dot_product_attention, q, k, k), (8 + 12, 3))
            # By keyword, as diffusers' native attention backend calls it (an IndexError once).
            by_name = lambda q, k: F.scaled_dot_product_attention(query=q, key=k, value=k)  # noqa: E731
            self.assertEqual(counted(by_name, q, k), (8 + 12, 3))
        self.assertEqual(counted(lambda t: torch.softmax(input=t, dim=-1), q)[0], 8)
        self.assertEqual(counted(lambda t: torch.matmul(input=t, other=k.transpose(-1, -2)), q)[0], 8)

    def test_views_copies_and_exact_ops_do_not_round(self):
        x = torch.randn(4, 6)
        self.assertEqual(counted(lambda t: torch.relu(t.view(6, 4).transpose(0, 1).contiguous().clone()), x), (0, 0))
        self.assertEqual(counted(lambda t: t.double(), x), (0, 0))  # widening is exact
        self.assertEqual(counted(lambda t: t.bfloat16(), x), (0, 1))  # narrowing rounds
        self.assertEqual(counted(lambda t: F.gelu(t * 2 + 1), x), (0, 3))

    def test_a_result_takes_its_deepest_input(self):
        lin = nn.Linear(16, 16)
        x = torch.randn(3, 16)
        # a residual x + f(x) is as deep as f(x) plus the add's rounding, not the sum of both paths
        self.assertEqual(counted(lambda t: t + lin(t), x), (16, 2))
        # a chain adds up
        self.assertEqual(counted(lambda t: lin(lin(t)), x), (32, 2))
        # a branch that does not feed the result does not count
        def unrelated(t):
            lin(lin(lin(t)))
            return lin(t)
        self.assertEqual(counted(unrelated, x), (16, 1))


    def test_roundings_are_counted_in_the_results_own_dtype(self):
        """A float32 value computed from bfloat16 ones carries their roundings, each worth
        2^32 float32 ones (the square of the units' ratio): a float32 loss of bfloat16
        logits was held to float32 rounding (llama_tp's bfloat16 training step failed)."""
        lin = nn.Linear(16, 16).bfloat16()
        x = torch.randn(3, 16).bfloat16()
        depth, steps = counted(lambda t: lin(t).float().square().mean(), x)
        self.assertEqual(depth, 16 + 48)
        self.assertEqual(steps, 1 * 2.0 ** 32 + 2)  # the bfloat16 linear, then square and mean in float32
        # Narrowing the other way: the float32 history is all but lost in the bfloat16 rounding.
        depth, steps = counted(lambda t: (t * 3).bfloat16(), torch.randn(4))
        self.assertEqual(steps, 1 + 2.0 ** -32)


class Row(nn.Module):
    """A row-parallel layer's partial sum (its matmul is tapped with partial=tp)."""

    def __init__(self):
        super().__init__()
        self.matmul = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return self.matmul(x)


class CaptureCountsTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def attrs(self, path):
        with h5py.File(path) as f:
            return {n: dict(f["taps"][n].attrs) for n in f["taps"]}

    def test_taps_carry_depth_and_steps(self):
        net = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
        x = torch.randn(2, 8)  # made outside: an exact input
        with dct.capture(net, out=os.path.join(self.dir, "run")):
            net(x)
        a = self.attrs(os.path.join(self.dir, "run.rank0.h5"))
        self.assertEqual([(a[n]["reduction_depth"], a[n]["rounding_steps"]) for n in ("0", "1", "2", "3")],
                         [(8, 1), (16, 2), (16, 3), (48, 4)])

    def test_a_partial_sum_has_its_global_depth_and_a_users_depth_wins(self):
        row = Row()
        with dct.capture(row, out=os.path.join(self.dir, "run"), mesh="tp=4", rank=1, world_size=4,
                         layouts={"matmul": (None, "tp"), "model": {"spec": None, "reduction_depth": 99}}):
            row(torch.randn(2, 8))
        a = self.attrs(os.path.join(self.dir, "run.rank1.h5"))
        self.assertEqual(a["matmul"]["reduction_depth"], 8 * 4)  # each of 4 ranks sums 8 terms
        self.assertEqual(a["model"]["reduction_depth"], 99)

    def test_the_capture_adds_nothing_of_its_own_and_can_be_told_not_to(self):
        net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        x = torch.randn(2, 8).bfloat16()
        net = net.bfloat16()
        with dct.capture(net, out=os.path.join(self.dir, "run")):  # bfloat16 taps are copied to float32 to write
            net(x)
        self.assertEqual(self.attrs(os.path.join(self.dir, "run.rank0.h5"))["1"]["rounding_steps"], 2)
        with dct.capture(net, out=os.path.join(self.dir, "off"), derive_depths=False):
            net(x)
        self.assertNotIn("reduction_depth", self.attrs(os.path.join(self.dir, "off.rank0.h5"))["1"])

    def test_reference_and_one_device_captures_are_not_counted(self):
        net = nn.Linear(8, 8).double()
        with dct.capture(net, out=os.path.join(self.dir, "ref"), reference=True) as c:
            self.assertIsNone(rounding.active())
            net(torch.randn(2, 8, dtype=torch.float64))
        self.assertFalse(c.derive_depths)

    def test_the_mode_is_gone_after_the_block_and_after_an_exception(self):
        net = nn.Linear(8, 8)
        with dct.capture(net, out=os.path.join(self.dir, "run")):
            self.assertIsNotNone(rounding.active())
        self.assertIsNone(rounding.active())
        with self.assertRaises(RuntimeError):
            with dct.capture(net, out=os.path.join(self.dir, "bad")):
                net(torch.randn(2, 3))  # wrong width
        self.assertIsNone(rounding.active())
        self.assertEqual(rounding.counts(net(torch.randn(2, 8))), (0, 0))  # not marked outside a capture


if __name__ == "__main__":
    unittest.main()
