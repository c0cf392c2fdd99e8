"""Which tokens a rank holds under torchtitan's context parallelism, read
from the positions its model is called with (python/diffcheck/torch/
torchtitan_plan.py): contiguous shares, torch's head-tail balancing, and
anything else refused by name. No model, no ranks."""
import unittest

import torch

from diffcheck.torch.torchtitan_plan import TitanContextParallel


def reader(index, degree=2):
    r = object.__new__(TitanContextParallel)
    r.rank, r.axis, r.degree, r.index, r.streams = index, "cp", degree, index, "stale"
    return r


class SequenceParallelRegions(unittest.TestCase):
    def test_a_tp_share_of_the_cp_share_is_told_from_another_split(self):
        r = reader(0)
        r.axis_sizes = {"cp": 2, "tp": 2}
        self.assertTrue(r.within_sequence_parallel({"spec": "-,tp,-"}, (4, 64, 256), 128))  # SP: 64 of 128 tokens
        self.assertFalse(r.within_sequence_parallel({"spec": "-,tp,-,-"}, (4, 8, 128, 16), 128))  # heads on tp
        self.assertFalse(r.within_sequence_parallel({"spec": "-,cp,-"}, (4, 128, 256), 128))
        self.assertFalse(r.within_sequence_parallel({}, (4, 128, 256), 128))

    def test_the_shares_are_laid_out_over_cp_then_tp_in_the_order_of_their_chunks(self):
        r = reader(0)
        r.axis_sizes, r.streams = {"cp": 2, "tp": 2}, "head:128,tail:128:reversed"
        # rank (c, t) holds the t-th half of [chunk c, chunk 3 - c] of 4: chunks 0, 3, 1, 2
        self.assertEqual(r.sequence_parallel_attrs({"spec": "-,tp,-"}), {"spec": "-,cp*tp,-",
                                                                           "block_order": "1:0,3,1,2"})
        r.axis_sizes = {"cp": 2, "tp": 4}  # quarters: [chunk c's halves, chunk 3 - c's halves] of 8 blocks
        self.assertEqual(r.sequence_parallel_attrs({"spec": "-,tp,-"})["block_order"], "1:0,1,6,7,2,3,4,5")
        r.axis_sizes = {"cp": 2, "tp": 3}
        self.assertIsNone(r.sequence_parallel_attrs({"spec": "-,tp,-"}))  # a third straddles head and tail
        r.streams = None  # contiguous shares: in rank order
        self.assertEqual(r.sequence_parallel_attrs({"spec": "-,tp,-"}), {"spec": "-,cp*tp,-"})


class InnerAttention(unittest.TestCase):
    def test_an_inner_attention_returning_heads_first_is_split_at_its_tokens(self):
        """torchtitan 0.3.0's inner attention returns [batch, tokens, heads, dim] (the sequence rule's
        dimension 1); one that returns [batch, heads, tokens, dim] is split at dimension 2 instead."""
        from diffcheck.torch.library_plans import LibraryLayouts
        inner = torch.nn.Identity()
        plans = LibraryLayouts(torch.nn.Linear(2, 2), {"cp": 2}, 0)
        titan = reader(0)
        titan.active, titan.inner, titan.said = True, {id(inner)}, "from torchtitan"
        titan.streams = "head:8,tail:8:reversed"
        plans.titan, plans.local_length = titan, 8
        attrs, _ = plans.layout(inner, torch.zeros(2, 4, 8, 16), "")
        self.assertEqual(attrs, {"spec": "-,-,cp,-", "streams": "head:8,tail:8:reversed"})
        self.assertIsNone(plans.layout(inner, torch.zeros(2, 8, 4, 16), ""))  # tokens at 1: the sequence rule's


class Positions(unittest.TestCase):
    def test_contiguous_shares_are_a_plain_split(self):
        for index in range(2):
            r = reader(index)
            r.learn((None, torch.arange(4 * index, 4 * index + 4).repeat(3, 1)), {}, 4)
            self.assertIsNone(r.streams)

    def test_head_tail_shares_are_two_streams_the_tail_reversed(self):
        # 16 tokens over 2 ranks in chunks of 4: rank 0 holds 0-3 and 12-15, rank 1 4-11
        for index, held in ((0, [0, 1, 2, 3, 12, 13, 14, 15]), (1, [4, 5, 6, 7, 8, 9, 10, 11])):
            r = reader(index)
            r.learn((), {"positions": torch.tensor([held, held])}, 8)
            self.assertEqual(r.streams, "head:8,tail:8:reversed")
        r = reader(2, degree=4)  # 32 tokens over 4 ranks in chunks of 4: chunks 2 and 5
        r.learn((), {"positions": torch.tensor([[8, 9, 10, 11, 20, 21, 22, 23]])}, 8)
        self.assertEqual(r.streams, "head:16,tail:16:reversed")

    def test_other_positions_are_refused_by_name(self):
        for held in ([0, 2, 4, 6, 8, 10, 12, 14], [0, 1, 2, 3, 0, 1, 2, 3], [4, 5, 6, 7, 0, 1, 2, 3]):
            with self.subTest(held=held):
                with self.assertRaisesRegex(ValueError, "rank 0: torchtitan's context parallelism over 'cp'.*"
                                                        "neither its contiguous share.*give the taps layouts"):
                    reader(0).learn((), {"positions": torch.tensor([held])}, 8)
        with self.assertRaisesRegex(ValueError, "samples hold different positions"):
            reader(0).learn((), {"positions": torch.tensor([[0, 1, 2, 3], [0, 1, 0, 1]])}, 4)
        with self.assertRaisesRegex(ValueError, "called without positions"):
            reader(0).learn((torch.zeros(1, 8),), {}, 8)


if __name__ == "__main__":
    unittest.main()
