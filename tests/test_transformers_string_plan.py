"""transformers 5.15's string tensor-parallel plans on plain tensors
(examples/transformers_string_plan.py, a small Qwen3 at tp=2 over gloo, with
transformers 5.15.1 from scripts/transformers_515.sh first on PYTHONPATH):
no layouts, each module's layout read from transformers' own
tensor-parallel layer (python/diffcheck/torch/transformers_plan.py). By
default a clean training step and RowwiseParallel's reduction left out; the
forward, bfloat16 and 4 ranks nightly."""
import os
import unittest

from e2e import E2ETest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "transformers_string_plan.py")
FOLDER = os.environ.get("DIFFCHECK_TRANSFORMERS_515", os.path.join(HERE, "..", ".transformers-5.15"))
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


class TransformersPlanUnit(unittest.TestCase):
    """transformers_plan.py on stand-ins named as transformers' layers (no transformers, no process group):
    a packed column-parallel layer's weight and output are left out and named, a gathered one is whole."""

    @staticmethod
    def planned(kind, **attrs):
        import torch
        import torch.nn as nn
        base = type("TensorParallelLayer", (), {"__module__": "transformers.integrations.tensor_parallel"})
        layer = type(kind, (base,), {"__module__": base.__module__, "_prepare_output_fn": lambda s, m, o, d: o})()
        for k, v in attrs.items():
            setattr(layer, k, v)
        module = nn.Linear(3, 4)
        mesh = type("DeviceMesh", (), {"mesh": None, "get_group": lambda self: None})()
        output_fn = layer._prepare_output_fn
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, mesh))
        return module, torch.zeros(2, 4)

    def layouts(self, module):
        from diffcheck.torch.transformers_plan import TransformersLayouts
        plan = TransformersLayouts(module, {"tp": 2}, 0, lambda group, sizes, rank, where: "tp")
        self.assertTrue(plan.active)
        return plan

    def test_packed_column_parallel_is_left_out_and_named(self):
        module, out = self.planned("PackedColwiseParallel")
        plan = self.layouts(module)
        attrs, said = plan.layout(module, out, "")
        self.assertIn("no layout describes", attrs["_untapped"])
        self.assertIn("PackedColwiseParallel", said)
        self.assertIn("packed block split on its own", plan.parameter(module.weight)[1])

    def test_column_parallel_split_or_gathered(self):
        module, out = self.planned("ColwiseParallel", gather_output=False)
        plan = self.layouts(module)
        self.assertEqual(plan.layout(module, out, "")[0], {"spec": "-,tp"})
        self.assertEqual(plan.parameter(module.weight), ({"spec": "tp,-"}, None))
        self.assertEqual(plan.parameter(module.bias), ({"spec": "tp"}, None))
        module, out = self.planned("ColwiseParallel", gather_output=True)
        self.assertEqual(self.layouts(module).layout(module, out, "")[0], {})


class TransformersStringPlans(E2ETest):
    def setUp(self):
        super().setUp()
        self.assertTrue(os.path.exists(os.path.join(FOLDER, ".complete")),
                        f"no transformers 5.15 at {FOLDER}: bash scripts/transformers_515.sh")
        self._pythonpath = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([FOLDER] + ([self._pythonpath] if self._pythonpath else []))

    def tearDown(self):
        if self._pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self._pythonpath
        super().tearDown()

    def run_example(self, *args):
        return super().run_example(EXAMPLE, *args)[0]

    def test_training_step_with_no_layouts(self):
        import diffcheck
        p, out = super().run_example(EXAMPLE, "--train")
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("PASS: all 124 taps pass", p.stdout)
        report = diffcheck.compare(f"{out}/tp", reference=f"{out}/ref.h5", check=False)
        rows = {t["name"]: t["layout"] for t in report["taps"]}
        self.assertEqual(rows["model.layers.0.self_attn.q_proj"], "-,-,tp")  # "colwise"
        self.assertEqual(rows["model.layers.0.self_attn.q_norm"], "-,-,tp,-")  # its view as heads
        self.assertEqual(rows["model.layers.0.mlp.down_proj"], "replicated")  # "rowwise": all-reduced
        self.assertEqual(rows["param/model.layers.0.self_attn.q_proj.weight"], "tp,-")
        self.assertEqual(rows["param/model.layers.0.self_attn.o_proj.weight"], "-,tp")
        self.assertEqual(rows["param_grad/model.layers.0.self_attn.q_norm.weight"], "replicated")

    def test_a_row_parallel_reduction_left_out_is_found_at_its_tap(self):
        self.expect_found("model.layers.0.self_attn.o_proj", "--bug", "missing_allreduce")

    @unittest.skipUnless(FULL, "nightly: the forward, bfloat16, 4 ranks")
    def test_every_dtype_and_mesh(self):
        self.expect_clean(37)
        self.expect_clean(124, "--train", "--dtype", "bfloat16")
        self.expect_clean(124, "-n", "4", "--train")
        self.expect_found("model.layers.0.self_attn.o_proj", "-n", "4", "--bug", "missing_allreduce")


if __name__ == "__main__":
    unittest.main()
