"""Plain DistributedDataParallel at 2 ranks, each rank its own samples: the
data axis read from DDP's process group (no data-parallel word), the
reference on the global batch, a training step clean; a rank that trains on
the other's samples (a loader's sharding bug) named at the first tap; the
gradient's average over the ranks lost on one rank named at the first
parameter gradient, its replicas apart; averaged twice on every rank, named
there against the reference, its replicas agreeing. FSDP2 with its gradients summed
(torchtitan's convention) read as loss_scale="global". (FSDP2 x TP with distinct samples: tests/test_e2e_torch_dtensor.py.)"""
import os
import unittest

import torch
import torch.multiprocessing as mp
import torch.nn as nn

import diffcheck.torch as dct
from e2e import E2ETest

GLOBAL_BATCH, D = 4, 8


def make(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, D)).to(dtype)
    x = torch.randn(GLOBAL_BATCH, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    return model, x


def step(model, x, opt):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _summed(bucket, world):
    """DDP's all-reduce of a gradient bucket, its division by the world size left out (one rank's bug)."""
    import torch.distributed as dist
    work = dist.all_reduce(bucket.buffer() / world, async_op=True)  # the others divide; their sum is right
    return work.get_future().then(lambda f: f.value()[0] * world)


def _averaged_twice(bucket, world):
    """DDP's all-reduce of a gradient bucket divided by the world size twice (every rank's bug)."""
    import torch.distributed as dist
    work = dist.all_reduce(bucket.buffer() / world, async_op=True)
    return work.get_future().then(lambda f: f.value()[0] / world)


def _ddp_rank(rank, world, init, out, bug, dtype=torch.float32):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model, x = make(dtype)
    ddp = DistributedDataParallel(model)
    share = GLOBAL_BATCH // world
    index = 0 if bug == "wrong_samples" and rank == world - 1 else rank  # the bug: another rank's share
    local = x[index * share:(index + 1) * share]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    if bug == "unaveraged_on_one_rank" and rank == world - 1:  # the bug: this rank's average over dp lost
        ddp.register_comm_hook(None, lambda _, bucket: _summed(bucket, world))
    if bug == "averaged_twice":  # the bug: every rank divides the summed gradient by dp twice
        ddp.register_comm_hook(None, lambda _, bucket: _averaged_twice(bucket, world))
    told = "global" if bug == "loss_scale_misnamed" else "local_mean"  # the slip: a mean loss said to be global
    with dct.capture(ddp, out=f"{out}/run", mesh=f"dp={world}", backward=True, optimizer=opt, loss_scale=told):
        step(ddp, local, opt)
    if rank == 0:
        dct.references(lambda dt: (make(dt)[0], (x.to(dt),)), f"{out}/ref", dtype=dtype, backward=True,
                       optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       step=lambda m, inputs, optimizer: step(m, *inputs, optimizer))
    dist.barrier()
    dist.destroy_process_group()


def _fsdp_summing_rank(rank, world, init, out):
    """FSDP2 as torchtitan runs it: its division turned off (the data ranks' gradients summed) and each rank's
    loss its samples' sum over the global batch's count; the capture is told nothing of the convention."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model, x = make(torch.float32)
    fully_shard(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",)))
    model.set_gradient_divide_factor(1.0)
    model.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    share = GLOBAL_BATCH // world
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def global_step(m, batch, optimizer):
        optimizer.zero_grad()
        (m(batch).square().sum() / (GLOBAL_BATCH * D)).backward()
        optimizer.step()
    with dct.capture(model, out=f"{out}/run", mesh=f"fsdp={world}", backward=True, optimizer=opt):
        global_step(model, x[rank * share:(rank + 1) * share], opt)
    if rank == 0:
        dct.references(lambda dt: (make(dt)[0], (x.to(dt),)), f"{out}/ref", dtype=torch.float32, backward=True,
                       optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       step=lambda m, inputs, optimizer: global_step(m, *inputs, optimizer))
    dist.barrier()
    dist.destroy_process_group()


class FullyShardedSummingGradients(E2ETest):
    def test_the_global_convention_is_read_from_fsdp2(self):
        """Before, the capture took "local_mean" and every output gradient failed at 0.5x its reference."""
        out = self.path("fsdp_sum")
        os.makedirs(out)
        mp.spawn(_fsdp_summing_rank, args=(2, "file://" + os.path.join(out, "rdv"), out), nprocs=2)
        report = dct.compare(f"{out}/run", reference=f"{out}/ref.h5", check=False)
        self.assertTrue(report["pass"], report["console"])
        self.assertIn("loss scale: global (read from FSDP2: its gradients summed", report["console"])


class DistributedDataParallelSamples(E2ETest):
    def run_ddp(self, bug=None, world=2, dtype=torch.float32):
        out = self.path(f"{bug or 'clean'}{world}{str(dtype)[6:]}")
        os.makedirs(out)
        mp.spawn(_ddp_rank, args=(world, "file://" + os.path.join(out, "rdv"), out, bug, dtype), nprocs=world)
        return dct.compare(f"{out}/run", reference=f"{out}/ref.h5", check=False)

    def test_clean_and_each_fault(self):
        report = self.run_ddp()
        self.assertTrue(report["pass"], report["console"])
        self.assertEqual(report["unchecked_taps"], [], report["console"])
        layouts = {t["name"]: t["layout"] for t in report["taps"]}
        self.assertEqual((layouts["0"], layouts["grad/model"], layouts["param_grad/0.weight"]),
                         ("dp,-", "dp,-", "replicated"), report["console"])
        report = self.run_ddp("wrong_samples")
        self.assertEqual(report["first_divergence"]["tap"], "0", report["console"])
        self.assertEqual(report["taps"][0]["reference"]["failing_ranks"], [1], report["console"])
        report = self.run_ddp("unaveraged_on_one_rank")
        self.assertEqual(report["first_divergence"]["tap"], "param_grad/0.weight", report["console"])
        self.assertIn("replica", report["first_divergence"]["checks"], report["console"])
        report = self.run_ddp("averaged_twice")  # replicas agree, on 1/dp of the reference
        self.assertEqual(report["first_divergence"]["tap"], "param_grad/0.weight", report["console"])
        self.assertEqual(report["first_divergence"]["checks"], ["reference"], report["console"])

    def test_a_misnamed_loss_scale_is_named_as_such(self):
        """A per-rank mean loss captured as loss_scale="global": every output gradient is 2x its reference,
        every forward tap and parameter passes, and the report says what that is."""
        report = self.run_ddp("loss_scale_misnamed")
        self.assertFalse(report["pass"])
        self.assertTrue(report["first_divergence"]["tap"].startswith("grad/"), report["console"])
        self.assertIn("each 2x its reference", report["console"])
        self.assertIn('If 2 is its data-parallel degree, capture with loss_scale="local_mean"', report["console"])
        self.assertIn("a loss scaled by another convention than the capture was told", report["hints"][0])

    @unittest.skipUnless(os.environ.get("DIFFCHECK_E2E_FULL") == "1", "nightly: bfloat16")
    def test_bfloat16(self):
        report = self.run_ddp(dtype=torch.bfloat16)
        self.assertTrue(report["pass"], report["console"])
        report = self.run_ddp("wrong_samples", dtype=torch.bfloat16)
        self.assertEqual(report["first_divergence"]["tap"], "0", report["console"])

    @unittest.skipUnless(os.environ.get("DIFFCHECK_E2E_FULL") == "1", "nightly: 4 ranks")
    def test_four_ranks(self):
        report = self.run_ddp(world=4)
        self.assertTrue(report["pass"], report["console"])
        report = self.run_ddp("wrong_samples", world=4)
        self.assertEqual(report["first_divergence"]["tap"], "0", report["console"])
        self.assertEqual(report["taps"][0]["reference"]["failing_ranks"], [3], report["console"])


if __name__ == "__main__":
    unittest.main()
