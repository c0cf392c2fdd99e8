"""Taps whose split dimension holds several streams (docs/FORMAT.md,
"Streams"): each rank holds [its share of the text, its share of the image],
as diffusers' single-stream blocks do under context parallelism. Compared
stream by stream against slices of the reference, with files written by
h5py."""
import sys

import numpy as np

from e2e import SCRIPTS, E2ETest

sys.path.insert(0, SCRIPTS)
from diffcheck_dump import RankDump  # noqa: E402

TEXT, IMAGE, WIDTH, RANKS = 4, 8, 3, 2


def joint():
    """The global tensor [1, text + image, width]: the text's rows first."""
    return (np.arange((TEXT + IMAGE) * WIDTH, dtype=np.float64).reshape(1, TEXT + IMAGE, WIDTH) + 1) / 7.0


def write(prefix, streams="text:4,image:8", fault=None, reference=None, spec="-,sp,-"):
    g = joint()
    t, i = TEXT // RANKS, IMAGE // RANKS
    for r in range(RANKS):
        piece = np.concatenate([g[:, r * t:(r + 1) * t], g[:, TEXT + r * i:TEXT + (r + 1) * i]], axis=1)
        piece = piece.astype(np.float32)
        if fault == "image" and r == 1:
            piece[0, t + 1, 0] += 0.5  # an image token of rank 1
        with RankDump(prefix, f"sp={RANKS}", r, scenario="streams_test") as d:
            d.tap("single.norm", piece, spec=spec, streams=streams)
            d.tap("after", g[:, :1].astype(np.float32))  # a plain tap beside it
            if r == 0:
                d.reference("single.norm", g if reference is None else reference)
                d.reference("after", g[:, :1])


def write_head_tail(prefix, streams):
    """torch's head-tail load balancing of a sequence of 16 over cp = 2, in chunks of 4: rank 0 holds
    tokens 0-3 and 12-15, rank 1 tokens 4-11; and the batch of 2 split over dp = 2 beside it."""
    g = (np.arange(2 * 16 * WIDTH, dtype=np.float64).reshape(2, 16, WIDTH) + 1) / 7.0
    for r in range(2 * RANKS):
        dp, cp = divmod(r, RANKS)
        piece = np.concatenate([g[dp:dp + 1, 4 * cp:4 * cp + 4], g[dp:dp + 1, 12 - 4 * cp:16 - 4 * cp]], axis=1)
        with RankDump(prefix, f"dp=2,cp={RANKS}", r, scenario="streams_test") as d:
            d.tap("h", piece.astype(np.float32), spec="dp,cp,-", streams=streams)
            if r == 0:
                d.reference("h", g)


def write_block_order(prefix, order):
    """Head-tail over cp = 2, each rank's two chunks split again over tp = 2 (sequence parallelism): 16
    tokens in 4 chunks of 4; rank (c, t) holds chunk c where t = 0, chunk 3 - c where t = 1."""
    g = (np.arange(16 * WIDTH, dtype=np.float64).reshape(1, 16, WIDTH) + 1) / 7.0
    for r in range(4):
        c, t = divmod(r, 2)
        chunk = c if t == 0 else 3 - c
        with RankDump(prefix, "cp=2,tp=2", r, scenario="streams_test") as d:
            tap = d.tap("sp", g[:, 4 * chunk:4 * chunk + 4].astype(np.float32), spec="-,cp*tp,-")
            if order is not None:
                tap.attrs["block_order"] = order
            if r == 0:
                d.reference("sp", g)


class Streams(E2ETest):
    def compare(self, code, **kw):
        prefix = self.path("dump")
        write(prefix, **kw)
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, code)
        return res

    def test_each_stream_is_compared_with_its_slice_of_the_reference(self):
        res = self.compare(0)
        self.assertEqual([t["name"] for t in res.report["taps"]],
                         ["single.norm[text]", "single.norm[image]", "after"])
        self.assertTrue(all(t["pass"] for t in res.report["taps"]), res.report)

    def test_without_streams_the_same_pieces_do_not_match(self):
        # what the attribute is for: read as a plain split, rank 0 holds [text 0-1, image 0-3]
        # where the reference has rows 0-5, so the clean pieces are a finding
        res = self.compare(1, streams=None)
        self.assertFirstDivergence(res, "single.norm")

    def test_a_fault_in_one_stream_is_named_there(self):
        res = self.compare(1, fault="image")
        fd = self.assertFirstDivergence(res, "single.norm[image]")
        taps = {t["name"]: t for t in res.report["taps"]}
        self.assertTrue(taps["single.norm[text]"]["pass"])
        self.assertIn(1, fd.get("ranks", [1]))

    def test_a_reference_of_another_shape_is_a_shape_finding_at_the_whole_tap(self):
        res = self.compare(1, reference=joint()[:, :TEXT + IMAGE - 2])
        self.assertFirstDivergence(res, "single.norm")

    def test_streams_that_do_not_fit_the_piece_are_refused_by_name(self):
        for streams, needle in [("text:4,image:6", "no dimension the spec '-,sp,-' splits holds the streams"),
                                ("text:3,image:9", "in equal shares per block"),
                                ("text:4", "fewer than two"), ("text=4,image=8", "expected 'name:length"),
                                ("text:4,text:8", "twice"), ("text:-4,image:8", "not a length")]:
            with self.subTest(streams=streams):
                res = self.compare(2, streams=streams)
                self.assertIn("'streams'", res.err)
                self.assertIn(needle, res.err)
                self.assertIn("single.norm", res.err)
        res = self.compare(2, spec=None)
        self.assertIn("needs a spec that splits", res.err)

    def test_a_reversed_stream_places_rank_r_at_the_mirror_block(self):
        prefix = self.path("ht")
        write_head_tail(prefix, "head:8,tail:8:reversed")
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, 0)
        self.assertEqual([t["name"] for t in res.report["taps"]], ["h[head]", "h[tail]"])
        write_head_tail(prefix, "head:8,tail:8")  # the tail read in rank order: its blocks swapped
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, 1)
        self.assertFirstDivergence(res, "h[tail]")
        write_head_tail(prefix, "head:8,tail:8:backwards")
        self.assertIn("expected 'name:length", self.diffcheck("compare", prefix).err)

    def test_a_one_rank_run_is_split_alike_when_compared_against(self):
        """compare --against a one-rank run of the same model: its whole tap is read stream by stream too."""
        prefix, single = self.path("dump"), self.path("single")
        write(prefix, fault="image")
        with RankDump(single, "sp=1", 0, scenario="streams_test") as d:
            d.tap("single.norm", joint().astype(np.float32))
            d.tap("after", joint()[:, :1].astype(np.float32))
        for a, b in ((prefix, single), (single, prefix)):
            with self.subTest(run=a):
                res = self.diffcheck("compare", a, "--against", b, json=True)
                self.assertExit(res, 1)
                self.assertEqual(sorted(t["name"] for t in res.report["taps"]),
                                 ["after", "single.norm[image]", "single.norm[text]"])
                self.assertFirstDivergence(res, "single.norm[image]")

    def test_a_block_order_places_each_ranks_block(self):
        prefix = self.path("bo")
        write_block_order(prefix, "1:0,3,1,2")
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, 0)
        write_block_order(prefix, None)  # in rank order: ranks 1 and 3 hold each other's blocks
        res = self.diffcheck("compare", prefix, json=True)
        self.assertExit(res, 1)
        for order, needle in (("1:0,3,1", "not a permutation"), ("1:0,3,1,1", "not a permutation"),
                              ("0:0,1,2,3", "a dimension the spec '-,cp*tp,-' splits"), ("1:0,x,1,2", "not a block")):
            with self.subTest(order=order):
                write_block_order(prefix, order)
                res = self.diffcheck("compare", prefix)
                self.assertExit(res, 2)
                self.assertIn("attribute 'block_order'", res.err)
                self.assertIn(needle, res.err)
