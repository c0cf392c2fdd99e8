"""Sketch mode on a pipeline schedule sketches each microbatch's piece when it
is made (python/diffcheck/torch/pipeline_sketch.py) instead of copying it into
the step's tap: the pieces' sketches put together are the step's sketch, as
the whole tap's would be, for 2-D taps (microbatches along the tokens),
taps with a lead dimension, a replica's share of the tokens, unequal
microbatches in order, a scaled gradient, NaN and Inf."""
import unittest
from types import SimpleNamespace

import torch

from diffcheck import sketch
from diffcheck.torch.pipeline_sketch import HeldSketch, start


def _capture(rank=0, sizes=None):
    return SimpleNamespace(rank=rank, axis_sizes=sizes or {"pp": 2}, data_axes=None)


def _sketches(k=4, seed=3):
    return SimpleNamespace(sketcher=sketch.Sketcher(k, seed), rows=k)


class PiecesPutTogether(unittest.TestCase):
    def whole(self, sketches, x, first=0, share=None, hashed=False, dim=-2):
        return sketches.sketcher.summarize(x, first, share, hashed, dim)

    def test_two_dimensional_taps_add_up_over_their_tokens(self):
        torch.manual_seed(0)
        sk = _sketches()
        pieces = [torch.randn(6, 5, dtype=torch.float64) for _ in range(4)]
        pieces[2][1, 3] = float("nan")
        pieces[3][0, 0] = float("inf")
        held = start(sk, _capture(), {}, pieces[0], 4, "pp=0")
        self.assertIsNotNone(held)
        for mb, p in enumerate(pieces):
            held.add(mb, p, scale=2)
        (s, nan, inf, _), tokens = held.summary("t", 0)
        want = self.whole(sk, torch.cat(pieces) / 2)[0]
        finite = torch.isfinite(want)
        torch.testing.assert_close(s[finite], want[finite], rtol=1e-12, atol=1e-12)
        self.assertEqual((int(nan), int(inf), tokens), (1, 1, 24))

    def test_a_replicas_share_and_unequal_microbatches(self):
        """tp replicas (tp=2) split the step's 22 tokens 11 and 11; microbatches of 6, 6, 5, 5 rows in order."""
        torch.manual_seed(1)
        sizes = {"pp": 2, "tp": 2}
        pieces = [torch.randn(r, 3, dtype=torch.float64) for r in (6, 6, 5, 5)]
        total = torch.cat(pieces)
        halves = []
        for rank in (0, 1):  # tp coordinate = rank (pp 0)
            sk = _sketches()
            held = start(sk, _capture(rank, sizes), {}, pieces[0], 4, "pp=0")
            self.assertEqual(held.shared, "tp")
            for mb, p in enumerate(pieces):
                held.add(mb, p, scale=1)
            (s, _, _, h), tokens = held.summary("t", rank)
            self.assertEqual(tokens, 22)
            halves.append((s, h))
        whole = self.whole(_sketches(), total)[0]
        torch.testing.assert_close(halves[0][0] + halves[1][0], whole, rtol=1e-12, atol=1e-12)
        self.assertEqual(int(halves[0][1]), int(halves[1][1]))  # replicas of equal bits hash alike

    def test_lead_dimensions_lie_side_by_side(self):
        torch.manual_seed(2)
        sk = _sketches()
        pieces = [torch.randn(2, 12, 4) for _ in range(3)]
        held = start(sk, _capture(), {"spec": "-,-,-"}, pieces[0], 3, "pp=1")
        for mb in (0, 2, 1):  # out of order, equal rows: placed by their microbatch
            held.add(mb, pieces[mb], scale=1)
        (s, nan, inf, h), tokens = held.summary("t", 0)
        torch.testing.assert_close(s, self.whole(sk, torch.cat(pieces))[0])
        self.assertEqual((tokens, h), (12, None))

    def test_attention_taps_are_sketched_over_their_sequence(self):
        """[batch, sequence, 4 heads, head_dim] (k=4: too few heads): over the sequence, the microbatches
        side by side along the batch; [rows, 4 heads, head_dim]: its rows are its tokens, the pieces add up."""
        torch.manual_seed(3)
        for shape, dim in (((2, 12, 4, 3), -3), ((6, 4, 3), -3)):
            with self.subTest(shape=shape):
                sk = _sketches()
                pieces = [torch.randn(*shape, dtype=torch.float64) for _ in range(3)]
                held = start(sk, _capture(), {}, pieces[0], 3, "pp=0")
                self.assertEqual(held.dim, dim)
                for mb, p in enumerate(pieces):
                    held.add(mb, p, scale=1)
                (s, _, _, _), tokens = held.summary("t", 0)
                want = self.whole(sk, torch.cat(pieces), dim=dim)[0]
                self.assertEqual(s.shape, want.shape)
                self.assertEqual(s.shape[len(shape) + dim], 5)  # k + 1 rows where the sequence was
                torch.testing.assert_close(s, want, rtol=1e-12, atol=1e-12)
                self.assertEqual(tokens, 12 if len(shape) == 4 else 18)

    def test_out_of_order_unequal_microbatches_are_refused_by_name(self):
        held = HeldSketch(_sketches(), {}, 0, None, None, False, None)
        held.add(1, torch.randn(6, 3), 1)
        held.add(0, torch.randn(5, 3), 1)
        with self.assertRaisesRegex(RuntimeError, "rank 0: tap 't': its microbatches came out of order"):
            held.summary("t", 0)

    def test_what_is_not_sketched_takes_the_copy_path(self):
        sk = _sketches()
        self.assertIsNone(start(sk, _capture(), {}, torch.randn(6), 4, "pp=0"))  # 1-D
        self.assertIsNone(start(sk, _capture(), {}, torch.ones(6, 3, dtype=torch.int64), 4, "pp=0"))
        self.assertIsNone(start(sk, _capture(), {}, torch.randn(1, 3), 4, "pp=0"))  # 4 tokens: too few for k=4


if __name__ == "__main__":
    unittest.main()
