"""diffcheck/torch/dtensor_plan.py on this torch, in one process (a one-rank gloo
group): the output placements each of torch's parallel styles declares are
read from its hook (a torch that stores them elsewhere fails here, not
silently in a user's capture); a plain output takes the declared layout over
what to_local saw; a module keeps the layout of an input of its shape; an
output whose input is sharded and whose shape differs is refused, naming the
tap; DTensor.to_local is put back when the capture closes."""
import os
import tempfile
import unittest

import h5py
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

import diffcheck.torch as dct
from diffcheck.torch.dtensor_plan import UnknownLayout, _declared_output, _dtensor_types
from diffcheck.dump.layouts import placement_attrs


def setUpModule():
    global MESH
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    MESH = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))


def tearDownModule():
    dist.destroy_process_group()


class Sum(nn.Module):
    """Not elementwise: its output's layout cannot follow its input's."""

    def forward(self, x):
        return x.sum(-1)


class Net(nn.Module):
    def __init__(self, tail=None):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up, self.act, self.down = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)
        self.tail = tail or nn.Identity()

    def forward(self, x):
        return self.tail(self.down(self.act(self.up(self.norm(x)))))


class PlanTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def capture(self, net, **kw):
        out = os.path.join(self.dir, "p")
        with torch.no_grad(), dct.capture(net, out=out, mesh="tp=1", **kw):
            net(torch.randn(2, 3, 8))
        with h5py.File(out + ".rank0.h5") as f:
            return {name: (f["taps"][name].attrs.get("spec"), f["taps"][name].attrs.get("partial"))
                    for name in f["taps"]}

    def test_declared_outputs_of_torchs_styles(self):
        types = _dtensor_types()
        cases = {"up": (ColwiseParallel(), (Shard(-1),)), "down": (RowwiseParallel(), (Replicate(),)),
                 "norm": (SequenceParallel(), None),
                 "act": (PrepareModuleOutput(output_layouts=Shard(-1), desired_output_layouts=Replicate()),
                         (Replicate(),))}
        net = Net()
        parallelize_module(net, MESH, {name: style for name, (style, _) in cases.items()})
        for name, (_, want) in cases.items():
            with self.subTest(style=name):
                self.assertEqual(_declared_output(getattr(net, name), types), want)
        self.assertEqual(_declared_output(Net().up, types), None)

    def test_layouts_from_the_plan(self):
        net = Net()
        parallelize_module(net, MESH, {"up": ColwiseParallel(), "down": RowwiseParallel(output_layouts=Shard(1))})
        taps = self.capture(net)
        self.assertEqual(taps["up"], ("-,-,tp", None))
        self.assertEqual(taps["act"], ("-,-,tp", None), "an elementwise module keeps its input's layout")
        self.assertEqual(taps["down"], ("-,tp,-", None), "RowwiseParallel's declared Shard(1)")
        self.assertEqual(taps["model"], ("-,tp,-", None))
        self.assertIsNone(taps["norm"][0], "a module before the plan is replicated")
        self.assertIs(DTensor.to_local.__name__, "to_local")
        self.assertFalse(hasattr(DTensor.to_local, "__wrapped__"), "to_local put back")

    def test_declared_over_observed(self):
        """A RowwiseParallel whose reduction is skipped hands on a Partial DTensor's
        local part: the tap is held to the declared Replicate, not to what it got."""
        original = RowwiseParallel.__dict__["_prepare_output_fn"]  # the staticmethod itself
        RowwiseParallel._prepare_output_fn = staticmethod(
            lambda layouts, use_local_output, mod, outputs, mesh: outputs.to_local())
        try:
            net = Net()
            parallelize_module(net, MESH, {"up": ColwiseParallel(), "down": RowwiseParallel()})
            self.assertEqual(self.capture(net)["down"], (None, None))
        finally:
            RowwiseParallel._prepare_output_fn = original

    def test_a_per_head_norm_after_a_column_parallel_projection(self):
        """Qwen3's q_norm: the projection's output viewed as (heads, head width), normed per
        head: the heads carry the projection's sharded axis."""
        class Heads(nn.Module):
            def __init__(self):
                super().__init__()
                self.q_proj, self.q_norm = nn.Linear(8, 16), nn.LayerNorm(4)

            def forward(self, x):
                return self.q_norm(self.q_proj(x).view(*x.shape[:-1], -1, 4))
        net = Heads()
        parallelize_module(net, MESH, {"q_proj": ColwiseParallel()})
        taps = self.capture(net)
        self.assertEqual(taps["q_proj"], ("-,-,tp", None))
        self.assertEqual(taps["q_norm"], ("-,-,tp,-", None))
        # Under autograd DTensor.to_local hands out a view of its local tensor, which is then
        # the heads view's base (a training step: the layout found there too).
        out = os.path.join(self.dir, "grad")
        with dct.capture(net, out=out, mesh="tp=1", backward=True):
            net(torch.randn(2, 3, 8)).sum().backward()
        with h5py.File(out + ".rank0.h5") as f:
            self.assertEqual(f["taps/q_norm"].attrs.get("spec"), "-,-,tp,-")

    def test_unknown_layout_is_refused_naming_the_tap(self):
        net = Net(tail=Sum())
        parallelize_module(net, MESH, {"up": ColwiseParallel()})
        net.down = nn.Identity()  # the sharded activation reaches Sum
        with self.assertRaisesRegex(UnknownLayout, r"rank 0: tap 'tail': its input is laid out spec '-,-,tp'.*"
                                                   r"give it a layout"):
            self.capture(net)
        self.assertEqual(self.capture(net, layouts={"tail": "-,-"})["tail"], ("-,-", None), "a layout settles it")

    def test_fsdp2_over_tp_placements(self):
        """fully_shard over a tensor-parallel parameter: (_StridedShard(0, sf=tp), Shard(0)) on (dp, tp)
        is tp-major on dimension 0 (each tp shard split over dp)."""
        from types import SimpleNamespace
        from torch.distributed.tensor.placement_types import _StridedShard
        mesh = SimpleNamespace(mesh_dim_names=("dp", "tp"))
        self.assertEqual(placement_attrs((_StridedShard(0, split_factor=2), Shard(0)), mesh, 2), {"spec": "tp*dp,-"})
        self.assertEqual(placement_attrs((Shard(0), Shard(0)), mesh, 2), {"spec": "dp*tp,-"})
        self.assertEqual(placement_attrs((Shard(0), Shard(1)), mesh, 2), {"spec": "dp,tp"})

    def test_the_dtensor_meshs_axes_are_checked_when_the_capture_starts(self):
        # torchtitan names its axes ('fsdp', 'tp'): a capture that says 'dp=1' is refused at once, naming
        # the parameter and the spelling, not after a whole forward and backward at the optimizer step.
        net = Net()
        parallelize_module(net, MESH, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        with self.assertRaisesRegex(ValueError, r"parameter 'up.weight' is a DTensor on the mesh \(tp=1\) but the "
                                                r"capture's mesh 'dp=1' has no axis 'tp'.*mesh=\"tp=1\""):
            dct.capture(net, out=os.path.join(self.dir, "q"), mesh="dp=1")
        self.assertIn("up", self.capture(net))  # the right name passes

    def test_the_mesh_is_read_from_the_dtensors_when_not_given(self):
        # Before, a capture with no mesh= took 'dp=1' at one rank (then refused: no axis 'tp') and refused
        # any other world size; the DTensors' named DeviceMesh says it.
        net = Net()
        parallelize_module(net, MESH, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        out = os.path.join(self.dir, "m")
        with torch.no_grad(), dct.capture(net, out=out):
            net(torch.randn(2, 3, 8))
        with h5py.File(out + ".rank0.h5") as f:
            self.assertEqual(f.attrs["mesh"], "tp=1")

    def test_a_schedules_mesh_is_its_stages_group_then_the_dtensors(self):
        """A pipeline schedule with no mesh=: pp from its stages' group size, outermost, then the stages'
        DeviceMesh where the two span the world (torchtitan's pp=2,fsdp=1 needed mesh= before)."""
        from types import SimpleNamespace
        from diffcheck.torch.pipeline import StageModules, mesh_of_schedule
        plain = Net()
        tp = Net()
        parallelize_module(tp, MESH, {"up": ColwiseParallel(), "down": RowwiseParallel()})

        def schedule(net, pp):
            return SimpleNamespace(_n_microbatches=4, _stage=SimpleNamespace(group_size=pp, submod=net))
        cases = [(plain, 2, 2, "pp=2"), (plain, 2, 4, None), (tp, 2, 2, "pp=2,tp=1"), (tp, 2, 4, None),
                 (tp, 1, 1, "pp=1,tp=1")]
        for net, pp, world, want in cases:
            with self.subTest(dtensors=net is tp, pp=pp, world=world):
                stages = StageModules([net])
                self.assertEqual(mesh_of_schedule(schedule(net, pp), stages, world, "pp"), want)

    def test_a_model_without_a_plan_is_untouched(self):
        original = DTensor.to_local
        taps = self.capture(Net())
        self.assertIs(DTensor.to_local, original)
        self.assertTrue(all(spec is None for spec, _ in taps.values()))


if __name__ == "__main__":
    unittest.main()
