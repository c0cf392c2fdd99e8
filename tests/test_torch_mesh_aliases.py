"""DeviceMesh dimensions that are several of the capture's axes flattened
(python/diffcheck/torch/mesh_aliases.py): torchtitan's FSDP2 mesh `fsdp`
over dp_shard x cp is "dp*cp" on the capture's mesh "dp=2,cp=2". Before,
a DTensor on it was refused (its axis not in the mesh) and no mesh a user
could name took it. No ranks: meshes and DTensors stood in for."""
import types
import unittest

import torch

from diffcheck.torch.mesh_aliases import axes_along, flattened_aliases, with_aliases


def dtensor(names, grid):
    """A stand-in DTensor (duck-typed as diffcheck reads one) on a DeviceMesh of `names` over `grid`."""
    mesh = types.SimpleNamespace(mesh_dim_names=names, mesh=torch.tensor(grid))
    return types.SimpleNamespace(to_local=lambda: None, placements=(), device_mesh=mesh)


class Aliases(unittest.TestCase):
    def test_the_axes_that_enumerate_a_line_of_ranks_in_order(self):
        sizes = {"dp": 2, "cp": 2}
        self.assertEqual(axes_along([0, 1, 2, 3], sizes, 0), "dp*cp")
        self.assertEqual(axes_along([0, 1], sizes, 1), "cp")
        self.assertEqual(axes_along([1, 3], sizes, 3), "dp")
        self.assertEqual(axes_along([0, 2, 1, 3], sizes, 0), "cp*dp")  # cp the major one
        self.assertIsNone(axes_along([0, 3], sizes, 0))  # no axis goes from 0 to 3

    def test_a_flattened_dimension_is_named_by_the_capture_axes_it_spans(self):
        model = types.SimpleNamespace(parameters=lambda: [dtensor(("fsdp",), [0, 1, 2, 3]),
                                                          dtensor(("tp",), [2, 3])])
        self.assertEqual(flattened_aliases(model, {"dp": 2, "cp": 2}, 2), {"fsdp": "dp*cp", "tp": "cp"})
        self.assertEqual(flattened_aliases(model, {"fsdp": 4}, 2), {})  # fsdp named already; tp spans no axis
        attrs = {"spec": "fsdp,-", "partial": None}
        self.assertEqual(with_aliases(attrs, {"fsdp": "dp*cp"}), {"spec": "dp*cp,-", "partial": None})
        self.assertEqual(with_aliases({"spec": "-,tp", "partial": "fsdp"}, {"fsdp": "dp*cp"}),
                         {"spec": "-,tp", "partial": "dp*cp"})


if __name__ == "__main__":
    unittest.main()
