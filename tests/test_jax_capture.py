"""diffcheck.jax in one process with 8 CPU devices: layouts read from
shardings, taps of jitted and eager functions, NNX module names, and the
errors a capture must give rather than a wrong file."""
import os
import tempfile
import unittest
import warnings

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import h5py  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402
from diffcheck.jax.layouts import LayoutError, array_layout, block_index, spec_strings  # noqa: E402
from diffcheck.jax.taps import TapError  # noqa: E402

AXES = ["dp", "fsdp", "tp"]


class SpecToLayout(unittest.TestCase):
    def test_entries(self):
        self.assertEqual(spec_strings(P(), 3, AXES, "t"), ("", ""))
        self.assertEqual(spec_strings(P(None, "tp"), 3, AXES, "t"), ("-,tp,-", ""))
        self.assertEqual(spec_strings(P(("dp", "fsdp"), None, "tp"), 3, AXES, "t"), ("dp*fsdp,-,tp", ""))
        self.assertEqual(spec_strings(P(None, "tp", unreduced={"fsdp", "dp"}), 2, AXES, "t"), ("-,tp", "dp*fsdp"))
        self.assertEqual(spec_strings(P(unreduced={"tp"}), 2, AXES, "t"), ("", "tp"))

    def test_what_is_not_a_layout(self):
        with self.assertRaisesRegex(LayoutError, "tap 'x'.*not an axis of the mesh"):
            spec_strings(P("sp"), 1, AXES, "tap 'x'")
        with self.assertRaisesRegex(LayoutError, "3 entries for 2 dimensions"):
            spec_strings(P("dp", None, None), 2, AXES, "tap 'x'")
        with self.assertRaisesRegex(LayoutError, "not a mesh axis or None"):
            spec_strings(P(P.UNCONSTRAINED), 1, AXES, "tap 'x'")

    def test_block_index_is_the_mixed_radix_of_the_coordinates(self):
        sizes = {"dp": 2, "fsdp": 2, "tp": 2}
        # rank 6 = (dp 1, fsdp 1, tp 0): dp*fsdp block 3, tp block 0
        self.assertEqual(block_index("dp*fsdp,tp", 6, sizes), [3, 0])
        self.assertEqual(block_index("-,fsdp*dp", 6, sizes), [0, 3])
        self.assertEqual(block_index("tp,-", 5, sizes), [1, 0])


class ShardsToPieces(unittest.TestCase):
    def setUp(self):
        self.mesh = jax.make_mesh((2, 2, 2), tuple(AXES))
        self.x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)

    def test_each_device_holds_its_block(self):
        a = jax.device_put(self.x, NamedSharding(self.mesh, P(("dp", "fsdp"), "tp")))
        spec, partial, pieces = array_layout(a, self.mesh, "tap 'a'")
        self.assertEqual((spec, partial), ("dp*fsdp,tp", ""))
        self.assertEqual(sorted(pieces), list(range(8)))
        for rank, piece in pieces.items():
            rows, cols = block_index(spec, rank, dict(self.mesh.shape))
            np.testing.assert_array_equal(np.asarray(piece), self.x[rows * 2:rows * 2 + 2, cols * 3:cols * 3 + 3])

    def test_an_array_not_on_every_device_of_the_mesh_is_refused(self):
        a = jax.device_put(self.x, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        with self.assertRaisesRegex(LayoutError, "tap 'a': held by 1 of the mesh's 8 devices"):
            array_layout(a, self.mesh, "tap 'a'")

    def test_another_mesh_is_refused(self):
        other = jax.make_mesh((4, 2), ("dp", "tp"))
        a = jax.device_put(self.x, NamedSharding(other, P("dp")))
        with self.assertRaisesRegex(LayoutError, "tap 'a': sharded over the mesh dp=4,tp=2"):
            array_layout(a, self.mesh, "tap 'a'")


def _read(path):
    """{tap name: (attributes, values)} of a rank file, in its order; {name: values} of a reference file."""
    out = {}
    with h5py.File(path) as f:
        group = "taps" if "taps" in f else "reference"

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = (dict(obj.attrs), obj[()]) if group == "taps" else obj[()]
        f[group].visititems(visit)
    if group == "taps":
        return dict(sorted(out.items(), key=lambda kv: kv[1][0].get("order", 0)))
    return out


class Capture(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        k1, k2 = jax.random.split(jax.random.key(0))
        self.x = jax.device_put(jax.random.normal(k1, (8, 16)), NamedSharding(self.mesh, P("dp", None)))
        self.w = jax.device_put(jax.random.normal(k2, (16, 32)), NamedSharding(self.mesh, P(None, "tp")))

    def tearDown(self):
        self.tmp.cleanup()

    def out(self, name="run"):
        return os.path.join(self.tmp.name, name)

    def test_jitted_taps_with_their_layouts_and_depths(self):
        def f(x, w):
            h = dcj.tap("h", x @ w)
            return dcj.tap("y", jnp.tanh(h).sum(axis=1))
        with dcj.capture(jax.jit(f), self.out(), self.mesh) as run:
            y = run(self.x, self.w)
        np.testing.assert_allclose(np.asarray(y), np.tanh(np.asarray(self.x) @ np.asarray(self.w)).sum(1), rtol=1e-5)
        taps = _read(self.out() + ".rank5.h5")  # dp 1, tp 1
        self.assertEqual(list(taps), ["h", "y"])
        attrs, h = taps["h"]
        self.assertEqual((attrs["spec"], attrs["order"], attrs["reduction_depth"]), ("dp,tp", 0, 16))
        np.testing.assert_allclose(h, (np.asarray(self.x) @ np.asarray(self.w))[4:8, 8:16], rtol=1e-5)
        attrs, _ = taps["y"]
        self.assertEqual((attrs["spec"], attrs["reduction_depth"]), ("dp", 16 + 32))
        self.assertGreaterEqual(attrs["rounding_steps"], 3)

    def test_a_call_of_other_shapes_has_its_own_depths(self):
        """A later call with a longer contraction: its depth is its own (it was the first call's, a
        tolerance 512 times too tight), whole and in sketch mode."""
        w = jax.device_put(np.ones((16 * 512, 32), np.float32), NamedSharding(self.mesh, P(None, "tp")))
        x = jax.device_put(np.ones((8, 16 * 512), np.float32), NamedSharding(self.mesh, P("dp", None)))
        for sketch in (False, True):
            with self.subTest(sketch=sketch):
                with dcj.capture(jax.jit(lambda x, w: dcj.tap("h", x @ w)), self.out(f"s{sketch}"), self.mesh,
                                 sketch=sketch) as run:
                    run(self.x, self.w)
                    run(x, w)
                taps = _read(self.out(f"s{sketch}") + ".rank5.h5")
                self.assertEqual([taps[n][0]["reduction_depth"] for n in ("h", "step1/h")], [16, 16 * 512])

    def test_eager_function_and_pytree_taps(self):
        def f(x, w):
            dcj.tap("params", {"w": w, "b": [jnp.tanh(x)]})
            return x @ w
        with dcj.capture(f, self.out(), self.mesh, derive_depths=False) as run:
            run(self.x, self.w)
        self.assertEqual(sorted(_read(self.out() + ".rank0.h5")), ["params/b.0", "params/w"])

    def test_a_tap_inside_a_body_is_reported_not_dropped(self):
        def scanned(x, w):
            def body(c, _):
                return dcj.tap("carry", c * 2), None
            return jax.lax.scan(body, x, None, length=2)[0]

        # a checkpointed function made before the capture keeps the original jax.checkpoint
        made_before = jax.checkpoint(lambda y: dcj.tap("inner", y * 2))

        def remat(x, w):
            return made_before(x)
        for fn in (scanned, remat):
            with self.subTest(fn.__name__):
                with self.assertRaisesRegex(TapError, "'(carry|inner)' is inside a body JAX traces on its own.*unroll=True"):
                    with dcj.capture(jax.jit(fn), self.out(fn.__name__), self.mesh) as run:
                        run(self.x, self.w)
                self.assertFalse(os.path.exists(self.out(fn.__name__) + ".rank0.h5"))  # no partial file

    def test_taps_inside_jax_checkpoint_bodies(self):
        """MaxText's layers, flax's nn.remat: each layer's taps leave its checkpoint as extra outputs, the
        same values as without the checkpoint, under jax.grad too; with backward=True their gradients too
        (remat_gradients.py: the checkpoint's backward spelt out, each tap's gradient the cotangent of a zero
        added to it), as d/d(tap) of the loss says they are. Before, they were named as not taken."""
        def layer(h, w, scale):
            return dcj.tap("out", jnp.tanh(dcj.tap("pre", h @ w) * scale))

        def forward(remat):
            def f(x, w):
                wrapped = jax.checkpoint(layer, static_argnums=(2,)) if remat else layer
                return jnp.sum(wrapped(x, w, 0.5) ** 2)
            return f
        taps = {}
        for remat in (False, True):
            with dcj.capture(jax.jit(forward(remat)), self.out(f"f{remat}"), self.mesh) as run:
                run(self.x, self.w)
            taps[remat] = _read(self.out(f"f{remat}") + ".rank0.h5")
        self.assertEqual(list(taps[True]), ["pre", "out"])
        for name in ("pre", "out"):
            self.assertEqual(taps[True][name][0]["spec"], taps[False][name][0]["spec"])
            np.testing.assert_allclose(taps[True][name][1], taps[False][name][1], rtol=1e-6)

        def trained(x, w):
            return jax.grad(forward(True), argnums=1)(x, w)
        with dcj.capture(jax.jit(trained), self.out("grad"), self.mesh) as run:
            run(self.x, self.w)
        self.assertEqual(list(_read(self.out("grad") + ".rank0.h5")), ["pre", "out"])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "not tapped" warning now
            with dcj.capture(jax.jit(trained), self.out("backward"), self.mesh, backward=True) as run:
                run(self.x, self.w)
            with dcj.capture(jax.jit(trained), self.out("whole"), self.mesh, reference=True, backward=True) as run:
                run(self.x, self.w)
        self.assertEqual(sorted(_read(self.out("backward") + ".rank0.h5")), ["grad/out", "grad/pre", "out", "pre"])
        with h5py.File(self.out("backward") + ".rank0.h5") as f:
            self.assertNotIn("left_out", f.attrs)
        whole = _read(self.out("whole") + ".h5")  # the reference: whole values, float64
        out = whole["out"]
        np.testing.assert_allclose(whole["grad/out"], 2 * out, rtol=1e-12)  # d/d(out) sum(out^2)
        np.testing.assert_allclose(whole["grad/pre"], 2 * out * (1 - out ** 2) * 0.5, rtol=1e-10)

    def test_gradients_through_nested_checkpoints(self):
        """A checkpoint inside a checkpoint's body, backward=True: every tap's gradient, as d/d(tap) of the
        loss says; captured twice in one process (a checkpoint's cached trace held the first backward's
        perturbations once, and the second capture leaked them: UnexpectedTracerError)."""
        def inner(h):
            return dcj.tap("inner", jnp.sin(h))

        def outer(h, w):
            return dcj.tap("b", jax.checkpoint(inner)(dcj.tap("a", h @ w)) * 2)

        def step(x, w):
            return jax.grad(lambda w: jnp.sum(jax.checkpoint(outer)(x, w) ** 2))(w)
        for name, kind in (("nested_run", {}), ("nested_again", {}), ("nested_ref", {"reference": True})):
            with dcj.capture(jax.jit(step), self.out(name), self.mesh, backward=True, **kind) as run:
                run(self.x, self.w)
        whole = _read(self.out("nested_ref") + ".h5")
        self.assertEqual(sorted(whole), ["a", "b", "grad/a", "grad/b", "grad/inner", "inner"])
        np.testing.assert_allclose(whole["grad/b"], 2 * whole["b"], rtol=1e-12)
        np.testing.assert_allclose(whole["grad/inner"], 4 * whole["b"], rtol=1e-12)
        np.testing.assert_allclose(whole["grad/a"], 4 * whole["b"] * np.cos(whole["a"]), rtol=1e-10)

    def test_gradients_through_flax_linen_remat_layers(self):
        """Two nn.remat layers (MaxText's way), backward=True: every layer's output and its gradient."""
        import flax.linen as nn

        class Layer(nn.Module):
            @nn.compact
            def __call__(self, h, deterministic):
                h = nn.Dense(16, use_bias=False)(h)
                return dcj.tap(f"{self.name}/out", jnp.tanh(h) if deterministic else h)

        class Net(nn.Module):
            @nn.compact
            def __call__(self, h):
                for i in range(2):
                    h = nn.remat(Layer, static_argnums=(2,))(name=f"layer{i}")(h, True)
                return h
        net = Net()
        params = net.init(jax.random.key(1), jnp.ones((8, 16)))

        def step(params, x):
            return jax.grad(lambda p: jnp.sum(net.apply(p, x) ** 2))(params)
        with dcj.capture(jax.jit(step), self.out("linen_grad"), self.mesh, reference=True, backward=True) as run:
            run(params, self.x)
        whole = _read(self.out("linen_grad") + ".h5")
        self.assertEqual(sorted(whole), ["grad/layer0/out", "grad/layer1/out", "layer0/out", "layer1/out"])
        np.testing.assert_allclose(whole["grad/layer1/out"], 2 * whole["layer1/out"], rtol=1e-12)
        w1 = np.asarray(params["params"]["layer1"]["Dense_0"]["kernel"], np.float64)
        back = (whole["grad/layer1/out"] * (1 - whole["layer1/out"] ** 2)) @ w1.T  # through layer 1's tanh and Dense
        np.testing.assert_allclose(whole["grad/layer0/out"], back, rtol=1e-9, atol=1e-12)

    def test_taps_inside_flax_linen_remat(self):
        import flax.linen as nn

        class Layer(nn.Module):
            @nn.compact
            def __call__(self, h):
                return dcj.tap(f"{self.name}/out", jnp.tanh(nn.Dense(16, use_bias=False)(h)))

        class Net(nn.Module):
            @nn.compact
            def __call__(self, h):
                for i in range(2):
                    h = nn.remat(Layer)(name=f"layer{i}")(h)
                return h
        net = Net()
        params = net.init(jax.random.key(1), jnp.ones((8, 16)))
        with dcj.capture(jax.jit(net.apply), self.out("linen"), self.mesh) as run:
            run(params, self.x)
        self.assertEqual(list(_read(self.out("linen") + ".rank0.h5")), ["layer0/out", "layer1/out"])

    def test_backward_taps_the_gradients_of_taps(self):
        def step(x, w):
            def loss(w):
                h = dcj.tap("h", x @ w)
                return jnp.sum(jnp.tanh(h) ** 2)
            value, g = jax.value_and_grad(loss)(w)
            dcj.tap("param_grad", {"w": g})
            return value
        with dcj.capture(jax.jit(step), self.out(), self.mesh, backward=True) as run:
            run(self.x, self.w)
        taps = _read(self.out() + ".rank0.h5")  # dp 0, tp 0
        self.assertEqual(list(taps), ["h", "grad/h", "param_grad/w"])
        h = np.asarray(self.x, np.float64) @ np.asarray(self.w, np.float64)
        want = 2 * np.tanh(h) * (1 - np.tanh(h) ** 2)  # d/dh sum(tanh(h)^2)
        attrs, got = taps["grad/h"]
        self.assertEqual(attrs["spec"], "dp,tp")
        np.testing.assert_allclose(got, want[:4, :8], rtol=1e-4, atol=1e-6)
        with dcj.capture(jax.jit(step), self.out("plain"), self.mesh) as run:  # backward=False: no grad/ taps
            run(self.x, self.w)
        self.assertEqual(list(_read(self.out("plain") + ".rank0.h5")), ["h", "param_grad/w"])

    def test_unroll_takes_taps_from_inner_jits_and_scan_steps(self):
        inner = jax.jit(lambda v: dcj.tap("inner", v * 2))

        def f(x, w):
            def body(c, _):
                return dcj.tap("carry", c + 1), None
            return jax.lax.scan(body, inner(x), None, length=3)[0]
        with dcj.capture(jax.jit(f), self.out(), self.mesh, unroll=True) as run:
            y = run(self.x, self.w)
        taps = _read(self.out() + ".rank0.h5")
        self.assertEqual(list(taps), ["inner", "carry", "carry@1", "carry@2"])
        np.testing.assert_allclose(taps["carry@2"][1], np.asarray(y)[:4], rtol=1e-6)
        self.assertEqual(taps["carry@1"][0]["spec"], "dp,-")

    def test_reference_cache_is_keyed_by_program_and_inputs(self):
        def f(x, w):
            return dcj.tap("h", jnp.tanh(x @ w))
        cache = os.path.join(self.tmp.name, "cache")
        for x, made in ((self.x, 2), (self.x, 2), (self.x * 2, 4)):  # the same inputs: read, not made again
            report = dcj.check(jax.jit(f), x, self.w, out=self.out(), mesh=self.mesh, reference_cache=cache)
            self.assertTrue(report["pass"])
            self.assertEqual(len(os.listdir(cache)), made)
        with self.assertRaisesRegex(ValueError, "reference_cache=.*give reference=True, one_device=True"):
            dcj.check(jax.jit(f), self.x, self.w, out=self.out(), mesh=self.mesh, reference_cache=cache,
                      one_device=False)

    def test_a_name_used_twice_is_refused(self):
        def f(x, w):
            dcj.tap("h", x)
            return dcj.tap("h", x * 2)
        with self.assertRaisesRegex(TapError, "tap 'h' is made twice"):
            with dcj.capture(jax.jit(f), self.out(), self.mesh) as run:
                run(self.x, self.w)

    def test_no_mesh_is_refused(self):
        with self.assertRaisesRegex(ValueError, "no mesh: pass mesh="):
            dcj.capture(lambda x: x, self.out())

    def test_reference_and_one_device(self):
        def f(x, w):
            return dcj.tap("h", x @ w)
        with dcj.capture(jax.jit(f), self.out("ref"), self.mesh, reference=True) as ref:
            ref(self.x, self.w)
        with dcj.capture(jax.jit(f), self.out("ref"), self.mesh, one_device=True) as one:
            one(self.x, self.w)
        whole = _read(self.out("ref") + ".h5")["h"]
        self.assertEqual(whole.dtype, np.float64)
        np.testing.assert_allclose(whole, np.asarray(self.x, np.float64) @ np.asarray(self.w, np.float64))
        with h5py.File(self.out("ref") + ".one_device.rank0.h5") as f:
            self.assertEqual((f.attrs["mesh"], f["taps/h"].dtype), ("dp=1,tp=1", np.float32))
        self.assertFalse(jax.config.jax_enable_x64)  # the reference's float64 stays inside it


class ShardMapTaps(unittest.TestCase):
    """Taps inside a shard_map body: each device's block, with the layout the
    tap's spec= gives and partial sums where the value varies beyond it."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        self.x = jax.device_put(jnp.asarray(np.random.default_rng(0).normal(size=(8, 16)), jnp.float32),
                                NamedSharding(self.mesh, P("dp", "tp")))

    def tearDown(self):
        self.tmp.cleanup()

    def out(self, name="run"):
        return os.path.join(self.tmp.name, name)

    def row_sums(self, bug=False):
        def body(x):
            h = dcj.tap("h", jnp.tanh(x), spec=P("dp", "tp"))
            s = h.sum(axis=1)  # this device's columns only: a partial sum over tp
            if bug:  # one tp rank's partial sum doubled
                s = s * jnp.where(jax.lax.axis_index("tp") == 1, 2.0, 1.0)
            s = dcj.tap("s", s, spec=P("dp"))
            total = jax.lax.psum(s, "tp")
            return dcj.tap("total", jax.lax.psum(total.sum(), "dp"))  # the same everywhere: no spec
        # Made per trace, on the context's mesh (the references run it on a mesh of size 1).
        return jax.jit(lambda x: jax.shard_map(body, in_specs=P("dp", "tp"), out_specs=P())(x))

    def test_blocks_and_layouts_from_the_spec_and_the_varying_axes(self):
        with dcj.capture(self.row_sums(), self.out(), self.mesh) as run:
            run(self.x)
        taps = _read(self.out() + ".rank6.h5")  # dp 1, tp 2
        self.assertEqual(list(taps), ["h", "s", "total"])
        x = np.tanh(np.asarray(self.x))
        (h_attrs, h), (s_attrs, s), (t_attrs, _) = taps["h"], taps["s"], taps["total"]
        np.testing.assert_allclose(h, x[4:8, 8:12], rtol=1e-6)
        self.assertEqual((h_attrs["spec"], h_attrs.get("partial", "")), ("dp,tp", ""))
        np.testing.assert_allclose(s, x[4:8, 8:12].sum(1), rtol=1e-5)
        self.assertEqual((s_attrs["spec"], s_attrs["partial"]), ("dp", "tp"))
        self.assertEqual((t_attrs.get("spec", ""), t_attrs.get("partial", "")), ("", ""))

    def test_check_passes_clean_and_finds_a_partial_sum_gone_wrong(self):
        report = dcj.check(self.row_sums(), self.x, out=self.out("clean"), mesh=self.mesh)
        self.assertTrue(report["pass"])
        with self.assertRaises(dcj.Divergence) as caught:
            dcj.check(self.row_sums(bug=True), self.x, out=self.out("bug"), mesh=self.mesh)
        self.assertIn("First divergence: tap 's'", str(caught.exception))

    def test_a_varying_value_without_spec_is_refused(self):
        def body(x):
            return dcj.tap("h", x * 2)
        fn = jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp")))
        with self.assertRaisesRegex(TapError, "'h' is inside a shard_map body and varies over dp, tp: give its "
                                              "layout, dcj.tap\\(name, x, spec=P"):
            with dcj.capture(fn, self.out(), self.mesh) as run:
                run(self.x)

    def test_rematerialised_and_scanned_bodies(self):
        """jax.checkpoint runs its body again for the gradient (the same bits:
        kept once); a scan in the body hands a value per step (name@k)."""
        def body(x):
            def loss(v):
                inner = jax.checkpoint(lambda u: dcj.tap("inner", jnp.sin(u), spec=P("dp", "tp")))
                return jax.lax.psum(jnp.sum(inner(v) ** 2), ("dp", "tp"))
            g = jax.grad(loss)(x)

            def step(c, _):
                return dcj.tap("carry", c * 2, spec=P("dp", "tp")), None
            return jax.lax.scan(step, g, None, length=2)[0]
        fn = jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp")))
        with dcj.capture(fn, self.out(), self.mesh) as run:
            y = run(self.x)
        taps = _read(self.out() + ".rank0.h5")
        self.assertEqual(list(taps), ["inner", "carry", "carry@1"])
        np.testing.assert_allclose(taps["carry@1"][1], np.asarray(y)[:4, :4], rtol=1e-6)


class NnxModules(unittest.TestCase):
    def test_submodule_outputs_under_their_paths(self):
        from flax import nnx

        class Block(nnx.Module):
            def __init__(self, rngs):
                self.up = nnx.Linear(8, 16, rngs=rngs)
                self.down = nnx.Linear(16, 8, rngs=rngs)

            def __call__(self, x):
                return self.down(jax.nn.gelu(self.up(x))) + self.up(x)[:, :8]

        original = nnx.Linear.__call__
        mesh = jax.make_mesh((8,), ("dp",))
        x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("dp")))
        with tempfile.TemporaryDirectory() as tmp:
            with dcj.capture(Block(nnx.Rngs(0)), os.path.join(tmp, "m"), mesh) as run:
                run(x)
            self.assertEqual(list(_read(os.path.join(tmp, "m.rank3.h5"))), ["up", "down", "up@1", "model"])
        self.assertIs(nnx.Linear.__call__, original)  # the classes as they were

    def test_a_training_step_taps_the_forward_under_grad(self):
        import optax
        from flax import nnx

        class Mlp(nnx.Module):
            def __init__(self, rngs):
                self.fc1 = nnx.Linear(8, 16, rngs=rngs)
                self.fc2 = nnx.Linear(16, 8, rngs=rngs)

            def __call__(self, x):
                return self.fc2(jax.nn.relu(self.fc1(x)))

        def step(model, x):
            optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
            dcj.tap("param_grad", nnx.state(grads, nnx.Param))
            optimizer.update(model, grads)
            return loss

        mesh = jax.make_mesh((8,), ("dp",))
        x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("dp")))
        model = Mlp(nnx.Rngs(0))
        with tempfile.TemporaryDirectory() as tmp:
            with dcj.capture(model, os.path.join(tmp, "m"), mesh, step=step) as run:
                run(x)
            taps = _read(os.path.join(tmp, "m.rank0.h5"))
        self.assertEqual(list(taps), ["fc1", "fc2", "model", "param_grad/fc1.bias", "param_grad/fc1.kernel",
                                      "param_grad/fc2.bias", "param_grad/fc2.kernel"])
        self.assertEqual(taps["param_grad/fc1.kernel"][0].get("spec", ""), "")  # replicated over dp
        self.assertFalse(hasattr(model.fc1, "_diffcheck_tap_path"))  # the user's module as it was

    def test_a_model_holding_rngs_and_static_keywords_checks_clean(self):
        """MaxText's way: an NNX model that keeps its nnx.Rngs (the reference run moved its PRNG key
        through numpy and crashed), called with a Python bool and a string keyword (traced, they raised
        TracerBoolConversionError at `if enable_dropout:`)."""
        from flax import nnx

        class Decoder(nnx.Module):
            def __init__(self, rngs):
                self.fc = nnx.Linear(8, 8, rngs=rngs)
                self.drop = nnx.Dropout(0.5, rngs=rngs)
                self.rngs = rngs

            def __call__(self, x, enable_dropout=True, model_mode="train"):
                h = self.fc(x)
                if enable_dropout:
                    h = self.drop(h)
                return h if model_mode == "train" else -h

        mesh = jax.make_mesh((8,), ("dp",))
        x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("dp")))
        with tempfile.TemporaryDirectory() as tmp:
            report = dcj.check(Decoder(nnx.Rngs(0)), x, out=os.path.join(tmp, "m"), mesh=mesh,
                               kwargs={"enable_dropout": False, "model_mode": "train"})
        self.assertTrue(report["pass"], report["console"])
        self.assertEqual([t["name"] for t in report["taps"]], ["fc", "model"])

    def test_a_model_that_casts_to_its_own_dtype_is_said_and_not_failed(self):
        """MaxText casts each layer to its config dtype: the "float64 reference" is float32, equal bit for
        bit to the one-device run, whose noise floor was then 0 and failed the clean run (err/tol 2.44)."""
        import warnings

        def block(w, x):
            h = dcj.tap("h", jnp.tanh(x.astype(jnp.float32) @ w.astype(jnp.float32)))
            return h.sum(axis=-1)

        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        x = jax.device_put(jax.random.normal(jax.random.key(1), (8, 64)), NamedSharding(mesh, P("dp", None)))
        w = jax.device_put(jax.random.normal(jax.random.key(2), (64, 32)), NamedSharding(mesh, P(None, "tp")))
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            report = dcj.check(jax.jit(block), w, x, out=os.path.join(tmp, "m"), mesh=mesh)
        self.assertTrue(report["pass"], report["console"])
        self.assertTrue(any("reference taps are not float64 (h (float32)" in str(w.message) for w in said))
        self.assertIn("have a reference stored as float32, not float64 (h", report["console"])
        self.assertRegex(report["console"], r"derived d\d+, ref float32 +PASS")
        self.assertEqual(report["taps"][0]["reference"]["stored"], "float32")

    def test_a_float32_reference_of_a_bfloat16_run_measures_its_noise(self):
        """MaxText in bfloat16: its "float64 reference" is float32 (its config refuses float64), wider than
        the run, and its logits are cast up to float32. The float32 logits were held to the derived float32
        rule, as if the reference were no wider than the run, and failed the clean run (err/tol 745); they
        take the noise floor the bfloat16 one-device run measures against the float32 reference."""
        def block(w, x):
            d = jnp.float32 if x.dtype == jnp.float64 else x.dtype  # the model's own dtype, never float64
            h = dcj.tap("h", jnp.tanh(x.astype(d) @ w.astype(d)))
            logits = jnp.einsum("bf,df->bd", h, w.astype(d), out_sharding=P("dp", None))
            return dcj.tap("logits", logits.astype(jnp.float32))

        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        x = jax.device_put(jax.random.normal(jax.random.key(1), (8, 64)), NamedSharding(mesh, P("dp", None)))
        w = jax.device_put(jax.random.normal(jax.random.key(2), (64, 32)) / 8, NamedSharding(mesh, P(None, "tp")))
        import warnings
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            report = dcj.check(jax.jit(block), w.astype(jnp.bfloat16), x.astype(jnp.bfloat16),
                               out=os.path.join(tmp, "m"), mesh=mesh)
        self.assertTrue(report["pass"], report["console"])
        self.assertFalse([w for w in said if "not float64" in str(w.message)])  # wider than the run: not said
        self.assertRegex(report["console"], r"logits .* noise floor +PASS")
        self.assertNotIn("ref float32", report["console"])

    def test_a_model_that_owns_its_mesh_gets_its_references_from_build(self):
        """A module holding the sharded mesh (a shard_map(mesh=...), MaxText's models) cannot run on the
        references' one-device mesh: named with the fix; with build= it is built anew there, in float64 for
        the reference, and runs the run's weights (not drawn again: build's seed differs)."""
        from flax import nnx

        class Model(nnx.Module):
            def __init__(self, mesh, rngs, dtype=jnp.float32):
                self.lin = nnx.Linear(8, 8, rngs=rngs, dtype=dtype, param_dtype=dtype)
                self.act = jax.shard_map(jnp.tanh, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))

            def __call__(self, x):
                return self.act(self.lin(x))

        mesh = jax.make_mesh((8,), ("dp",))
        x = jax.device_put(jax.random.normal(jax.random.key(3), (8, 8)), NamedSharding(mesh, P("dp")))
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(ValueError, r"holds the sharded mesh .*build=lambda mesh, dtype"):
                dcj.check(Model(mesh, nnx.Rngs(0)), x, out=os.path.join(tmp, "a"), mesh=mesh)
            report = dcj.check(Model(mesh, nnx.Rngs(0)), x, out=os.path.join(tmp, "b"), mesh=mesh,
                               build=lambda mesh, dtype: Model(mesh, nnx.Rngs(7), dtype))
            with h5py.File(os.path.join(tmp, "b.reference.h5")) as f:
                self.assertEqual(f["reference/lin"].dtype, np.float64)
        self.assertTrue(report["pass"], report["console"])

    def test_the_yardstick_honours_a_global_x64(self):
        """A program with jax_enable_x64 on computes in float64; the yardstick ran with x64 off (float32) and
        compare blamed the user: "the one-device run must be captured in the run's dtype" (exit 2)."""
        import subprocess
        import sys
        program = "\n".join([
            "import os, tempfile, jax, jax.numpy as jnp",
            "jax.config.update('jax_enable_x64', True)",
            "from jax.sharding import NamedSharding, PartitionSpec as P",
            "import diffcheck.jax as dcj",
            "mesh = jax.make_mesh((4,), ('dp',))",
            "x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P('dp')))",
            "with tempfile.TemporaryDirectory() as d:",
            "    print(dcj.check(jax.jit(lambda x: dcj.tap('h', jnp.tanh(x))), x, out=d + '/m', mesh=mesh)['pass'])"])
        p = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "True"), p.stderr[-2000:])


if __name__ == "__main__":
    unittest.main()
