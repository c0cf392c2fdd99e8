"""The diffusers context-parallel plan reader's layouts of taps the plan does
not name (python/diffcheck/torch/diffusers_plan.py), on the rules alone: no
model, no ranks. FLUX.2's rotary tables ([tokens, features], from position
ids [batch, tokens, 4] split on dimension 1) needed a layout line before."""
import unittest

from diffcheck.torch.diffusers_plan import DiffusersContextParallel


def reader(lengths, whole=(), keyed=None):
    """A reader that learnt these splits' local lengths ({dimension: {lengths}}), the split inputs' names
    ({dimension: {name: local length}}) and inputs' whole lengths."""
    r = object.__new__(DiffusersContextParallel)
    r.rank, r.axis, r.degree = 0, "sp", 2
    r.lengths, r.whole_lengths = {d: set(v) for d, v in lengths.items()}, set(whole)
    r.keyed = keyed or {d: {} for d in lengths}
    r.after_gather, r.whole_gradients = False, set()
    return r


class Layouts(unittest.TestCase):
    def test_a_tokens_first_table_is_split_on_its_tokens(self):
        r = reader({1: {20, 6}})  # 40 image and 12 text ids over 2 ranks
        self.assertEqual(r.attrs("pos_embed/0", {}, (20, 16))["spec"], "sp,-")
        self.assertEqual(r.attrs("pos_embed@1/1", {}, (6, 16))["spec"], "sp,-")
        self.assertEqual(r.attrs("blocks.0.attn", {}, (1, 20, 64))["spec"], "-,sp,-")  # as before

    def test_what_is_not_such_a_table_stays_whole(self):
        r = reader({1: {20}}, whole=(20,))  # an input the plan leaves whole has that length too: not told
        self.assertNotIn("spec", r.attrs("pos_embed/0", {}, (20, 16)))
        r = reader({1: {20}})
        self.assertNotIn("spec", r.attrs("time_embed", {}, (2, 16)))  # [batch, features]
        self.assertEqual(r.attrs("param/x.weight", {}, (20, 16)), {})  # parameters keep their own

    def test_a_ranks_text_beside_its_image_is_split_stream_by_stream(self):
        """FLUX's single-stream blocks and rotary tables: each rank's [its text, its image]. Before, such
        taps were left out (named in a warning); now each stream is compared (docs/FORMAT.md, `streams`)."""
        flux = {1: {"encoder_hidden_states": 4, "hidden_states": 16}, 0: {"txt_ids": 4, "img_ids": 16}}
        r = reader({1: {4, 16}, 0: {4, 16}}, keyed=flux)  # 8 text and 32 image tokens over 2 ranks
        joint = {"spec": "-,sp,-", "streams": "text:8,image:32"}
        self.assertEqual(r.attrs("single_transformer_blocks.0.attn", {}, (1, 20, 64)), joint)
        self.assertEqual(r.attrs("step0/grad/single_transformer_blocks.0.attn", {}, (1, 20, 64)), joint)
        self.assertEqual(r.attrs("pos_embed/0", {}, (20, 24)), {"spec": "sp,-", "streams": "text:8,image:32"})
        self.assertEqual(r.attrs("transformer_blocks.0.attn/0", {}, (1, 16, 64))["spec"], "-,sp,-")  # one stream
        self.assertEqual(r.attrs("x", {}, (1, 20, 64), ), joint)
        flux2 = {1: {"encoder_hidden_states": 4, "hidden_states": 16, "txt_ids": 4, "img_ids": 16}}
        self.assertEqual(reader({1: {4, 16}}, keyed=flux2).attrs("pos_embed/0", {}, (20, 24)),
                         {"spec": "sp,-", "streams": "text:8,image:32"})  # a tokens-first table of both
        same = reader({1: {8}}, keyed={1: {"encoder_hidden_states": 8, "hidden_states": 8}})
        self.assertEqual(same.attrs("x", {}, (1, 16, 64)), {"spec": "-,sp,-", "streams": "text:16,image:16"})
        self.assertEqual(r.attrs("x", {"spec": "-,-,-"}, (1, 20, 64), )["spec"], "-,sp,-")
        self.assertNotIn("streams", r.attrs("x", {}, (1, 21, 64)))  # no sum of the two: replicated

    def test_in_sketch_mode_a_tap_of_streams_is_left_out_and_named(self):
        """Its reference is one sketch of the whole tensor, which no stream's slice of it can be told from."""
        import torch
        from diffcheck.torch.library_plans import LibraryLayouts
        plans = LibraryLayouts(torch.nn.Linear(2, 2), {"sp": 2}, 0)
        self.assertFalse(plans.sketch_leaves_out("x", {"spec": "-,sp,-"}))
        self.assertTrue(plans.sketch_leaves_out("pos_embed/0", {"spec": "sp,-", "streams": "text:8,image:32"}))
        self.assertRegex(plans.untapped(), r"1 tap\(s\) were not tapped: in sketch mode: .*several streams.*: pos_embed/0")

    def test_a_replicated_parameters_gradient_is_said_summed_over_the_ranks(self):
        """Each rank's gradient covers its own tokens; the step sums them over sp in their dtype before the
        optimizer reads them: `reduced` (the comparator widens for those roundings; FLUX.2's bfloat16
        parameter gradients failed the column-mean check at 1.22x and 1.36x without it)."""
        import torch
        r = reader({1: {20}})
        p = torch.nn.Parameter(torch.zeros(20, 16))
        self.assertEqual(r.parameter("param_grad/x.weight", p), {"reduced": "sp"})
        self.assertEqual(r.parameter("step1/param_grad/x.weight", p), {"reduced": "sp"})
        self.assertIsNone(r.parameter("param/x.weight", p))  # the values: the same on every rank, as they are


if __name__ == "__main__":
    unittest.main()
