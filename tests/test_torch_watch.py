"""dct.watch: the bits hash finds one flipped bit in float32, bfloat16 and
float16 and two swapped elements; replica groups from layouts and from DTensor
placements; examples/watch_train.py clean and with its faults, each named at
the first check after it with its ranks and tensor (a flipped bit under data
parallelism and under FSDP2 x tensor parallelism at 4 gloo ranks, a skipped
all-reduce, a flaky matmul found by the rerun check at 2; nightly: 1,000
clean steps of dp, tp, fsdp_tp and hsdp in float32 and bfloat16)."""
import os
import re
import subprocess
import sys
import time
import types
import unittest
from unittest import mock

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import diffcheck.torch as dct  # noqa: E402
from diffcheck import watch  # noqa: E402
from diffcheck.sketch import cpu_kernel as sketch_cpu  # noqa: E402
from diffcheck.watch import batches  # noqa: E402
from diffcheck.watch import hashing as watch_hash  # noqa: E402
from diffcheck.dump.layouts import placement_attrs  # noqa: E402
from diffcheck.watch import replica_groups  # noqa: E402
from diffcheck.watch.hashing import bits_hash  # noqa: E402

from e2e import E2ETest  # noqa: E402

EXAMPLE = os.path.join(HERE, "..", "examples", "watch_train.py")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"
_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def both_cpu_hashes():
    """XXH3 (the kernel library) and zlib's CRC-32 (where it is not loaded): (name, context) pairs."""
    import contextlib
    return (("xxh3", contextlib.nullcontext()), ("crc32", sketch_cpu.torch_ops_only()))


class BitsHash(unittest.TestCase):
    def test_one_flipped_bit_is_found_in_every_dtype(self):
        for algorithm, within in both_cpu_hashes():
            with within:
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    for bit in (0, 9, 14):  # a low mantissa bit, a higher one, an exponent bit (float16's)
                        with self.subTest(algorithm=algorithm, dtype=dtype, bit=bit):
                            x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(dtype)
                            y = x.clone()
                            y.view(_INT[dtype])[321] ^= 1 << bit
                            self.assertFalse(torch.equal(bits_hash(x), bits_hash(y)))
                            self.assertTrue(torch.equal(bits_hash(x), bits_hash(x.clone())))

    def test_the_algorithm_travels_with_the_hash(self):
        x = torch.randn(100)
        self.assertIsNotNone(sketch_cpu.bytes_hash_function(), "the kernel library is built beside the package")
        self.assertEqual(int(bits_hash(x)[2]), watch_hash.XXH3)
        with sketch_cpu.torch_ops_only():
            self.assertEqual(int(bits_hash(x)[2]), watch_hash.CRC32)
        self.assertEqual(int(watch_hash.device_sums(x).numel()), 2)

    def test_hashes_made_two_ways_are_refused_not_reported(self):
        """A rank without the kernel library hashes with the CRC: its hashes never equal the others'."""
        me = types.SimpleNamespace(rank=0)
        same = {0: (5, 9, watch_hash.XXH3, 1), 1: (6, 9, watch_hash.XXH3, 1), 2: (0, 0, 0, 0)}  # rank 2: no gradient
        watch.Watch._same_algorithm(me, "param", "w", same)  # apart, but comparable: not refused
        with self.assertRaisesRegex(ValueError, r"param/w were hashed in different ways \(rank 0: XXH3 .*; rank 1: "
                                                r"zlib's CRC-32 .*same diffcheck installation"):
            watch.Watch._same_algorithm(me, "param", "w", {0: (5, 9, watch_hash.XXH3, 1), 1: (5, 9, watch_hash.CRC32, 1)})

    def test_two_swapped_elements_are_found(self):
        for algorithm, within in both_cpu_hashes():
            with within, self.subTest(algorithm=algorithm):
                x = torch.arange(10, dtype=torch.float32)
                y = x.clone()
                y[2], y[7] = x[7], x[2]
                self.assertFalse(torch.equal(bits_hash(x), bits_hash(y)))

    def test_the_accelerator_sums_find_a_flip_and_a_swap(self):
        """The device hash (two integer sums), on the CPU: what a GPU computes."""
        x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        flipped, swapped = x.clone(), x.clone()
        flipped.view(torch.int16)[5] ^= 1
        swapped[2], swapped[7] = x[7], x[2]
        h, f, s = (watch_hash.device_sums(t) for t in (x, flipped, swapped))
        self.assertNotEqual(h[0], f[0])
        self.assertEqual(h[0], s[0])  # the plain sum cannot see a swap
        self.assertNotEqual(h[1], s[1])

    def test_negative_zero_is_not_zero(self):  # bits, not values
        self.assertFalse(torch.equal(bits_hash(torch.zeros(4)), bits_hash(-torch.zeros(4))))


class CheckRowsInOneCall(unittest.TestCase):
    """A check's rows from the kernel library's one call are each tensor's row
    hashed alone: contiguous, strided, empty, absent and 16-bit tensors mixed."""

    def test_the_fused_rows_are_the_single_rows(self):
        if sketch_cpu.watch_rows_function() is None:
            self.skipTest("the kernel library is not built here")
        g = torch.Generator().manual_seed(0)
        tensors = [torch.randn(7, 5, generator=g), torch.randn(6, 4, generator=g).t(), None,
                   torch.empty(0), torch.randn(33, generator=g).to(torch.bfloat16), torch.randn(3, 3).double()]
        plan = watch_hash.CheckRows(len(tensors), sums=False)
        rows, on_device = plan.fill(tensors)
        self.assertEqual(on_device, [])
        want = [watch_hash.hash_row(t, False) if t is not None else [0, 0, 0, 0] for t in tensors] + [[0, 0, 0, 0]]
        self.assertEqual(rows.tolist(), want)
        tensors[0][3, 1] += 1e-6  # a changed element changes its row alone
        again = plan.fill(tensors)[0].tolist()
        self.assertNotEqual(again[0], want[0])
        self.assertEqual(again[1:], want[1:])
        # A kept check's rows stay its own until the batch is exchanged (release), across blocks of tables
        later = [plan.fill(tensors)[0] for _ in range(plan.TABLES + 3)]
        self.assertEqual(rows.tolist(), want)
        self.assertEqual(len({r.ctypes.data for r in later} | {rows.ctypes.data}), len(later) + 1)
        plan.release()
        refilled = plan.fill(tensors[:1] + [None] * 5)[0]
        self.assertIn(refilled.ctypes.data, {r.ctypes.data for r in later})  # filled again after release
        self.assertEqual(refilled.tolist(), [again[0]] + [[0, 0, 0, 0]] * 6)


class RerunDifference(unittest.TestCase):
    def test_first_differing_bits(self):
        from diffcheck.watch.rerun import first_difference
        a = torch.tensor([1.0, 0.0, 3.0])
        self.assertIsNone(first_difference((a, {"x": a}), (a.clone(), {"x": a.clone()})))
        self.assertEqual(first_difference(a, torch.tensor([1.0, -0.0, 3.5])), (1, 0.0, -0.0))
        nan = torch.tensor([float("nan")])
        self.assertIsNone(first_difference(nan, nan.clone()))  # the same NaN bits are the same


class ReplicaGroups(unittest.TestCase):
    SIZES = {"dp": 2, "tp": 2}

    def test_from_layouts(self):
        self.assertEqual(replica_groups(self.SIZES, {}, 4), [[0, 1, 2, 3]])
        self.assertEqual(replica_groups(self.SIZES, {"spec": "tp,-"}, 4), [[0, 2], [1, 3]])  # replicas over dp
        self.assertEqual(replica_groups(self.SIZES, {"spec": "dp,tp"}, 4), [])  # nothing to compare
        self.assertEqual(replica_groups(self.SIZES, {"partial": "tp"}, 4), [[0, 2], [1, 3]])

    def test_from_dtensor_placements(self):
        from torch.distributed.tensor import Replicate, Shard

        class Mesh:
            mesh_dim_names = ("dp", "tp")
        attrs = placement_attrs((Replicate(), Shard(0)), Mesh(), 2)
        self.assertEqual(replica_groups(self.SIZES, attrs, 4), [[0, 2], [1, 3]])
        attrs = placement_attrs((Replicate(), Replicate()), Mesh(), 2)
        self.assertEqual(replica_groups(self.SIZES, attrs, 4), [[0, 1, 2, 3]])


def _close_after_a_finding(rank, out):
    """A finding caught, then close(): its check after the last step must not overwrite the finding's
    pieces (it did: same prefix, the gradient's piece lost). (the finding's taps, whether the after-check
    wrote files of its own)"""
    import h5py
    import torch.nn as nn
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    w = watch.watch(m, opt, mesh="dp=2", out=f"{out}.w")
    for step in range(2):
        m(torch.ones(1, 4)).sum().backward()
        if step == 1 and rank == 1:  # the parameter and its gradient apart on rank 1
            m.weight.data[0, 0] += 1
            m.weight.grad[0, 0] += 1
        try:
            opt.step()
        except watch.ReplicasDiffer:
            pass
        opt.zero_grad()
    try:
        w.close()  # checks the parameters once more: still apart
    except watch.ReplicasDiffer:
        pass
    with h5py.File(f"{out}.w.step1.rank{rank}.h5") as f:
        kept = sorted(f"{kind}/{name}" for kind in f["taps"] for name in f["taps"][kind])
    return kept, os.path.exists(f"{out}.w.step1.after.rank{rank}.h5")


def _refusals(rank, world, init, out):
    """Each refusal's message, from rank `rank` of a 2-rank gloo job, into out.rank<R>."""
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    said = {}

    def refused(name, make):
        try:
            make()
            said[name] = "not refused"
        except ValueError as e:
            said[name] = str(e)
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    refused("nothing replicated", lambda: watch.watch(m, mesh="tp=2", layouts={"param/weight": "tp,-", "param/bias": "tp"}))
    for slip, layouts in (("matches nothing", {"weight": "-,-"}), ("unknown axis", {"param/weight": "mp,-"}),
                          ("wrong rank", {"param/weight": "dp"})):
        refused(slip, lambda: watch.watch(m, mesh="dp=2", layouts=layouts))
    w = watch.watch(m, mesh="dp=2")
    said["groups"] = w.groups
    w.check(grads=False)  # agrees
    m.bias.data = torch.zeros(5)  # the shape changes
    refused("shape", lambda: w.check(grads=False))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    d = nn.Linear(4, 4)
    d.weight = nn.Parameter(distribute_tensor(d.weight.detach(), mesh))  # Replicate
    w = watch.watch(d, mesh="dp=2")
    d.weight.grad = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])  # the gradient sharded: a new layout
    refused("layout", lambda: w.check(grads=True))
    refused("other parameters", lambda: watch.watch(nn.Linear(4, 4) if rank == 0 else nn.Linear(4, 4, bias=False),
                                                    mesh="dp=2"))
    refused("other schedule", lambda: watch.watch(m, mesh="dp=2", exchange_every=4 if rank == 0 else "auto"))
    said["kept"] = _close_after_a_finding(rank, out)
    with open(f"{out}.rank{rank}", "w") as f:
        f.write(repr(said))
    dist.destroy_process_group()


class Errors(unittest.TestCase):
    def test_a_stalled_rank_is_no_finding(self):
        # `except dct.ReplicasDiffer:` around a training loop must not swallow a rank that never came
        # (the job would hang at its next collective); one `except dct.WatchError:` catches both.
        self.assertFalse(issubclass(dct.RankUnresponsive, dct.ReplicasDiffer))
        for e in (dct.RankUnresponsive, dct.ReplicasDiffer, dct.TransientFault):
            self.assertTrue(issubclass(e, dct.WatchError), e)


class WarnMode(unittest.TestCase):
    def test_a_finding_that_stays_is_reported_once_and_again_when_it_changes(self):
        from diffcheck.watch.report import WatchReports

        def finding(step, classes, tensor="param/w", group=(0, 1, 2)):
            return {"step": step, "tensor": tensor, "group": list(group), "classes": classes}
        w = WatchReports()
        first = finding(6, [[0, 1], [2]])
        self.assertEqual(w._changed([first]), [first])
        self.assertEqual(w._changed([finding(7, [[0, 1], [2]])]), [])  # the same split: not again
        self.assertEqual(first["last_step"], 7)
        other = finding(8, [[0, 1], [2]], tensor="param_grad/w")
        self.assertEqual(w._changed([finding(8, [[0, 1], [2]]), other]), [other])  # a new tensor apart
        changed = finding(9, [[0], [1], [2]])
        self.assertEqual(w._changed([changed]), [changed])  # the split changed: reported again


class Refusals(unittest.TestCase):
    """It never lies: nothing to compare, ranks with other parameters (pipeline stages), a shape or a
    layout changed since the watch started."""

    def test_refused_by_name(self):
        import ast
        import tempfile
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "said")
            mp.spawn(_refusals, args=(2, "file://" + os.path.join(tmp, "rdv"), out), nprocs=2)
            said = []
            for r in range(2):
                with open(f"{out}.rank{r}") as f:
                    said.append(ast.literal_eval(f.read()))
        for r in range(2):
            self.assertEqual(said[r]["kept"], (["param/weight", "param_grad/weight"], True))
            self.assertEqual(said[r]["groups"], {"weight": [[0, 1]], "bias": [[0, 1]]})
            self.assertEqual(said[r]["matches nothing"], f"rank {r}: watch(layouts=): pattern 'weight' matches no "
                                                         "parameter (the patterns name parameter taps: param/weight, "
                                                         "param/bias)")
            self.assertEqual(said[r]["unknown axis"], f"rank {r}: watch(layouts=): param/weight (shape (4, 4)), "
                                                      "layout 'param/weight': axis 'mp' is not in the mesh 'dp=2'")
            self.assertEqual(said[r]["wrong rank"], f"rank {r}: watch(layouts=): param/weight (shape (4, 4)), layout "
                                                    "'param/weight': spec 'dp' has 1 entries for 2 dimensions")
            self.assertRegex(said[r]["nothing replicated"], rf"rank {r}: watch\(\): no parameter of the model has "
                                                            r"replicas on mesh 'tp=2'.*nothing to compare")
            self.assertEqual(said[r]["shape"], f"rank {r}: watch(): parameter 'bias' changed shape from (4,) to (5,) "
                                               "since the watch started")
            self.assertEqual(said[r]["other parameters"], f"rank {r}: watch(): rank 1's model has other parameters "
                                                          "than rank 0's (1 against 2): the ranks watched together "
                                                          "must hold the same model (give group= the ranks of one "
                                                          "pipeline stage)")
            self.assertEqual(said[r]["other schedule"], f"rank {r}: watch(): rank 1 checks on another schedule "
                                                        "than rank 0 ({'every': 1, 'exchange_every': 'auto'} against "
                                                        "{'every': 1, 'exchange_every': 4}): every rank must give "
                                                        "the same every= and exchange_every=")
            self.assertEqual(said[r]["layout"], f"rank {r}: watch(): parameter 'weight' is now laid out as "
                                                "{'spec': 'dp,-'}, not {'spec': None} as when the watch started")


class ExchangeBatches(unittest.TestCase):
    def test_the_hubs_batch_size(self):
        self.assertEqual(batches.planned_size(0.0005, 0.015, 1000), 34)  # 0.5 ms a 15 ms step: within 0.1%
        self.assertEqual(batches.planned_size(0.0005, 0.5, 1000), 1)
        self.assertEqual(batches.planned_size(0.0005, 0.0001, 1000), batches.MAX_CHECKS)
        self.assertEqual(batches.planned_size(0.01, 0.5, 1000), 4)  # at most 2 s of steps
        self.assertEqual(batches.planned_size(0.01, 0.001, batches.MAX_KEPT_BYTES // 3), 3)
        for bad in (0, -1, "4", 2.0, True):
            with self.assertRaisesRegex(ValueError, r"exchange_every=.*'auto' or a number of checks"):
                batches.parse(bad)

    def test_auto_plans_its_second_batch_from_the_first_step(self):
        """The time from the watch's start to its first exchange stands for the first interval (never
        shorter than a step), and that exchange's time so far for an exchange's: the first exchange plans
        the second batch. The second batch's measure replaces the interval, not smoothed into it; an
        exchange timed whole stands from then on."""
        now = [100.0]
        with mock.patch.object(batches.time, "perf_counter", lambda: now[0]):
            b = batches.Batches("auto")
            rows = np.zeros((3, 4), dtype=np.int64)
            now[0] += 0.04  # the set-up and the first step
            self.assertTrue(b.keep(rows, 0, ()))
            b.take()
            # the first exchange, its rows in after 1.25 ms: within 0.1% of 40 ms steps (at most 2 s: 50)
            self.assertEqual(b.next_size(96, 0.00125), 32)
            b.timed(0.00125)
            b.size = 32
            for step in range(1, 33):
                now[0] += 0.02
                self.assertEqual(b.keep(rows, step, ()), step == 32)
            self.assertEqual(b.take()[1], list(range(1, 33)))
            self.assertEqual(b.next_size(96, 0.5), 63)  # the 20 ms steps alone (smoothed with the first: 37)


class WatchedTraining(E2ETest):
    def run_example(self, *args, n=4, env=None):
        out = self.path("-".join(("w", str(n)) + args).replace("--", ""))
        p = subprocess.run([sys.executable, EXAMPLE, "-n", str(n), "--out", out, *args], capture_output=True,
                           text=True, timeout=600, cwd=self.path(""), env=dict(os.environ, **(env or {})))
        return p, out

    @unittest.skipUnless(FULL, "nightly: a clean run at 2 ranks (the faulted runs pass their first checks)")
    def test_clean(self):
        p, _ = self.run_example(n=2)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertIn("20 steps", p.stdout)
        self.assertIn("21 checks of 6 parameters with replicas", p.stdout)
        self.assertNotIn("DIFFER", p.stdout)

    def test_a_flipped_bit(self):
        p, out = self.run_example("--bug", "bit_flip")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertIn("replicas DIFFER before step 6's optimizer step: 1 tensor(s)", p.stdout)
        self.assertRegex(p.stdout, r"param/1.weight: rank 3 \(\S+\) is the odd one out in replica group \[0, 1, 2, 3\]")
        self.assertIn("    first differing element: local index [0,7], rank 0: ", p.stdout)
        self.assertIn("rank 0 and rank 3 at local index [0,7]", p.stdout)  # the compare of the pieces
        self.assertTrue(os.path.exists(f"{out}/watch.step6.rank3.h5"))

    @unittest.skipUnless(FULL, "nightly: the skipped all-reduce (the suite's time)")
    def test_a_skipped_allreduce(self):
        p, _ = self.run_example("--bug", "allreduce_skipped")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertIn("replicas DIFFER before step 3's optimizer step: 6 tensor(s)", p.stdout)
        # ranks 1 and 3 each hold their own half's sum: both apart from the majority {0, 2}
        self.assertRegex(p.stdout, r"param_grad/0.weight: rank 1 \(\S+\), rank 3 \(\S+\) are the odd ones out")
        self.assertNotIn("param/", p.stdout.split("replicas DIFFER", 1)[1].split("the pieces")[0])

    def test_a_flaky_device_is_named_by_the_rerun_check(self):
        p, _ = self.run_example("--bug", "flaky_matmul", n=2)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertIn("TRANSIENT fault (the rerun check)", p.stdout)
        self.assertRegex(p.stdout, r"rank 1 \(\S+\), step (4|9|14|19): module '1' gave other bits when run again "
                                   r"on the same inputs \(first at flat index 11: ")
        self.assertNotIn("replicas DIFFER", p.stdout)  # the all-reduce averaged the wrong element away

    def test_a_rank_that_stops_answering_is_named_within_the_timeout(self):
        t0 = time.monotonic()
        p, _ = self.run_example("--bug", "stalled_rank", "--timeout", "5", n=2)
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertLess(time.monotonic() - t0, 100)  # not the stalled rank's 120 s
        self.assertIn("diffcheck watch: rank 0 waited 5 s at the check before step 4's optimizer step", p.stderr)
        self.assertRegex(p.stderr, r"rank 1 \(\S+\) did not come to it \(it has not reached that step\)")

    def test_warn_mode_reports_a_finding_that_stays_once(self):
        p, out = self.run_example("--bug", "bit_flip", "--on-mismatch", "warn", "--steps", "10", n=2)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertEqual(p.stdout.count("diffcheck watch: replicas DIFFER"), 1, p.stdout)
        self.assertIn("1 finding(s) reported: param/1.weight at steps 6-10", p.stdout)  # 10: the check after
        self.assertEqual(sorted(f for f in os.listdir(out) if f.startswith("watch.")),
                         ["watch.step6.rank0.h5", "watch.step6.rank1.h5"])

    def test_checks_exchanged_four_at_a_time_name_the_step_that_differs(self):
        """exchange_every=4: the checks before steps 4-7 travel together, before step 7's; the flip made at
        step 6 is named at step 6, its pieces are those of step 7 and the report says so."""
        p, out = self.run_example("--bug", "bit_flip", "--exchange-every", "4", n=2)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertIn("replicas DIFFER before step 6's optimizer step (found at the exchange before step 7's "
                      "optimizer step, 4 checks exchanged at once: the pieces below are as they are then): "
                      "1 tensor(s)", p.stdout)
        self.assertIn("    first differing element: local index [0,7], rank 0: ", p.stdout)
        self.assertEqual(sorted(f for f in os.listdir(out) if f.startswith("watch.")),
                         ["watch.step7.rank0.h5", "watch.step7.rank1.h5"])

    def test_auto_exchange_finds_the_flip_at_its_step(self):
        """exchange_every="auto" on steps of a few ms: the hub batches many checks (found later), the
        step is still the flip's; a clean run of it passes."""
        p, _ = self.run_example("--bug", "bit_flip", "--exchange-every", "auto", n=2)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertRegex(p.stdout, r"replicas DIFFER before step 6's optimizer step \(found at the exchange before "
                                   r"step (\d+)'s optimizer step, (\d+) checks exchanged at once")
        later, batch = map(int, re.search(r"before step (\d+)'s optimizer step, (\d+) checks", p.stdout).groups())
        self.assertGreater(later, 6)
        self.assertGreater(batch, 1)
        p, _ = self.run_example("--exchange-every", "auto", n=2)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertIn("21 checks of 6 parameters with replicas", p.stdout)
        self.assertNotIn("DIFFER", p.stdout)

    @unittest.skipUnless(FULL, "nightly: a check every 4 steps")
    def test_every_fourth_step(self):
        p, _ = self.run_example("--bug", "bit_flip", "--every", "4", n=2)  # checks before steps 3, 7, ...
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertIn("replicas DIFFER before step 7's optimizer step", p.stdout)
        self.assertRegex(p.stdout, r"param/1.weight: replica group \[0, 1\] holds 2 values with no majority: "
                                   r"rank 0 \(\S+\) against rank 1 \(\S+\)")

    def test_a_flipped_bit_under_fsdp2_and_tensor_parallelism(self):
        """The groups come from the DTensor placements: FSDP2's shards of a LayerNorm replicated over tp.
        Hashed as an accelerator hashes (DIFFCHECK_WATCH_HASH=sums: the GPU path's CPU twin)."""
        p, out = self.run_example("--parallel", "fsdp_tp", "--bug", "bit_flip", env={"DIFFCHECK_WATCH_HASH": "sums"})
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertIn("replicas DIFFER before step 6's optimizer step: 1 tensor(s)", p.stdout)
        self.assertRegex(p.stdout, r"param/ln1.weight: replica group \[2, 3\] holds 2 values with no majority: "
                                   r"rank 2 \(\S+\) against rank 3 \(\S+\)")
        self.assertRegex(p.stdout, r"first differing element: local index \[7\], rank 2: \S+, rank 3: ")
        self.assertIn("between rank 2 and rank 3 at local index [7]", p.stdout)

    def test_one_gradient_apart_in_every_replica_group_at_once(self):
        """HSDP at 4 ranks: mlp.fc1.weight's gradient left unaveraged over dp by the second dp replica, on
        both fsdp shards: replica groups [0, 2] and [1, 3] both differ in one tensor. Reported with both
        groups named and the piece written once (it crashed: the tap's name written twice)."""
        p, out = self.run_example("--parallel", "hsdp", "--bug", "dp_grad_unreduced", "--steps", "3")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
        self.assertNotIn("name already exists", p.stderr)
        self.assertIn("replicas DIFFER before step 2's optimizer step: 1 tensor(s) in 2 replica groups", p.stdout)
        for group, a, b in (("0, 2", 0, 2), ("1, 3", 1, 3)):
            self.assertRegex(p.stdout, rf"param_grad/mlp.fc1.weight: replica group \[{group}\] holds 2 values with "
                                       rf"no majority: rank {a} \(\S+\) against rank {b} \(\S+\)")
        for r in range(4):
            with h5py.File(os.path.join(out, f"watch.step2.rank{r}.h5")) as f:
                self.assertEqual(list(f["taps/param_grad"]), ["mlp.fc1.weight"])

    @unittest.skipUnless(FULL, "nightly: a flipped bit under tp (2 ranks) and hsdp (4 ranks)")
    def test_a_flipped_bit_under_tp_and_hsdp(self):
        no_majority = r"replica group \[{}\] holds 2 values with no majority: rank {} \(\S+\) against rank {}"
        for parallel, n, expected in (("tp", 2, r"param/ln1.weight: " + no_majority.format("0, 1", 0, 1)),
                                      ("hsdp", 4, r"param/mlp.fc1.weight: " + no_majority.format("1, 3", 1, 3))):
            with self.subTest(parallel=parallel):
                p, _ = self.run_example("--parallel", parallel, "--bug", "bit_flip", n=n)
                self.assertEqual(p.returncode, 1, p.stdout + p.stderr[-3000:])
                self.assertIn("replicas DIFFER before step 6's optimizer step: 1 tensor(s)", p.stdout)
                self.assertRegex(p.stdout, expected)

    @unittest.skipUnless(FULL, "nightly: 1,000 clean steps of every --parallel in float32 and bfloat16")
    def test_no_false_alarm_in_1000_steps(self):
        replicated = {"dp": 6, "tp": 6, "fsdp_tp": 6, "hsdp": 15}
        for parallel in ("dp", "tp", "fsdp_tp", "hsdp"):
            for dtype in ("float32", "bfloat16"):
                with self.subTest(parallel=parallel, dtype=dtype):
                    p, _ = self.run_example("--steps", "1000", "--dtype", dtype, "--parallel", parallel)
                    self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
                    self.assertIn("1000 steps", p.stdout)
                    self.assertIn(f"1001 checks of {replicated[parallel]} parameters with replicas", p.stdout)


if __name__ == "__main__":
    unittest.main()
