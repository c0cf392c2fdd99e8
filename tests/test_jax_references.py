"""diffcheck.jax's references of a function that reads the sharded run from
outside its arguments (python/diffcheck/jax/closed_over.py): a weight closed
over, a mesh global given to shard_map(mesh=) and to NamedSharding, on
Explicit mesh axes (jax.make_mesh's default) and Auto ones. Before, the
references failed in JAX ("context mesh ... should match the aval mesh") or
kept a closed-over weight float32 in the float64 reference."""
import os
import tempfile
import unittest

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import h5py  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402

EXPLICIT = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Explicit,) * 2)
AUTO = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
MESH = EXPLICIT  # read as a global by summed_by_hand
W_GLOBAL = {}


def summed_by_hand(x, drop=False):
    """x @ W_GLOBAL["w"] with its contraction split over tp and summed in a shard_map
    given the global MESH (drop: the sum left out)."""
    def body(a, b):
        partial = a @ b
        return partial if drop else jax.lax.psum(partial, "tp")
    y = jax.shard_map(body, mesh=MESH, in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp", None),
                      check_vma=False)(x, W_GLOBAL["w"])
    y = jax.lax.with_sharding_constraint(y, NamedSharding(MESH, P("dp", None)))
    return dcj.tap("y", y)


def _matmul(given, drop=False):
    """x @ w with its contraction split over tp and summed: a shard_map made once, before any capture."""
    def body(a, b):
        return a @ b if drop else jax.lax.psum(a @ b, "tp")
    return jax.shard_map(body, in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp", None), check_vma=False,
                         **({"mesh": EXPLICIT} if given else {}))


MADE_BEFORE = {(given, drop): _matmul(given, drop) for given in (False, True) for drop in (False, True)}


def _reference(path, name):
    with h5py.File(path) as f:
        return f["reference"][name][()]


class ClosedOver(unittest.TestCase):
    def test_a_closed_over_weight_on_explicit_axes(self):
        """The weight in a closure cell: the references run (they were refused), the reference
        computes with the weight widened (w * w exact in float64), and the cell holds it again after."""
        for mesh in (EXPLICIT, AUTO):
            w = jax.device_put(jax.random.normal(jax.random.key(0), (16, 32)), NamedSharding(mesh, P(None, "tp")))
            x = jax.device_put(jax.random.normal(jax.random.key(1), (8, 16)), NamedSharding(mesh, P("dp", None)))
            params = {"w": w, "scale": 3}

            def f(x):
                dcj.tap("ww", params["w"] * params["w"])
                h = dcj.tap("h", jnp.tanh(x @ params["w"]))
                return dcj.tap("y", h.sum(-1))
            with self.subTest(axes=str(mesh.axis_types[0])), tempfile.TemporaryDirectory() as d:
                report = dcj.check(jax.jit(f), x, out=os.path.join(d, "c"), mesh=mesh)
                self.assertTrue(report["pass"], report)
                ww = _reference(os.path.join(d, "c.reference.h5"), "ww")
                self.assertEqual(ww.dtype, np.float64)
                exact = np.asarray(w, np.float64) ** 2
                np.testing.assert_array_equal(ww, exact)  # the float32 square would round
                self.assertFalse(np.array_equal(np.asarray(w * w, np.float64), exact))
            self.assertIs(params["w"], w)

    def test_a_global_mesh_in_shard_map_and_named_sharding(self):
        """shard_map(mesh=MESH) and NamedSharding(MESH, ...) with MESH a module global, the weight a
        global dict's: clean PASS; the tp sum left out FAILs at the tap; the globals are back after."""
        global MESH
        for mesh in (EXPLICIT, AUTO):
            MESH = mesh
            W_GLOBAL["w"] = jax.device_put(jax.random.normal(jax.random.key(2), (32, 24)),
                                           NamedSharding(mesh, P("tp", None)))
            x = jax.device_put(jax.random.normal(jax.random.key(3), (16, 32)), NamedSharding(mesh, P("dp", "tp")))
            with self.subTest(axes=str(mesh.axis_types[0])), tempfile.TemporaryDirectory() as d:
                report = dcj.check(jax.jit(summed_by_hand), x, out=os.path.join(d, "g"), mesh=mesh)
                self.assertTrue(report["pass"], report)
                with self.assertRaises(dcj.Divergence) as caught:
                    dcj.check(jax.jit(lambda x: summed_by_hand(x, drop=True)), x, out=os.path.join(d, "b"),
                              mesh=mesh)
                self.assertEqual(caught.exception.report["first_divergence"]["tap"], "y")
            self.assertIs(MESH, mesh)
            self.assertEqual(W_GLOBAL["w"].sharding, NamedSharding(mesh, P("tp", None)))
        MESH = EXPLICIT


    def test_a_shard_map_made_before_the_capture(self):
        """jax.shard_map made once at import: with mesh= (the sharded mesh in its closure), and without
        (JAX keeps the first context mesh it is called under in its closure, so the references ran on the
        sharded one: "The context mesh ... should match the mesh passed to shard_map"). Each checked twice
        (the cell is put back after the references); the sum left out is found."""
        x = jax.device_put(jax.random.normal(jax.random.key(4), (8, 16)), NamedSharding(EXPLICIT, P("dp", "tp")))
        w = jax.device_put(jax.random.normal(jax.random.key(5), (16, 8)), NamedSharding(EXPLICIT, P("tp", None)))
        for given in (False, True):
            def f(x, w, given=given):
                return dcj.tap("y", MADE_BEFORE[(given, False)](x, w) * 2)

            def bad(x, w, given=given):
                return dcj.tap("y", MADE_BEFORE[(given, True)](x, w) * 2)
            with self.subTest(mesh_given=given), tempfile.TemporaryDirectory() as d:
                for name in ("a", "b"):
                    report = dcj.check(jax.jit(f), x, w, out=os.path.join(d, name), mesh=EXPLICIT)
                    self.assertTrue(report["pass"], report)
                with self.assertRaises(dcj.Divergence) as caught:
                    dcj.check(jax.jit(bad), x, w, out=os.path.join(d, "bad"), mesh=EXPLICIT)
                self.assertEqual(caught.exception.report["first_divergence"]["tap"], "y")


if __name__ == "__main__":
    unittest.main()
