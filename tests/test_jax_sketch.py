"""diffcheck.jax's sketch mode (capture(..., sketch=True)): the signs are
FORMAT.md's, each rank's file holds its piece's sketch, NaN and Inf are
counted on their rank, and the two ways of making the sketches agree: on
the host by the C kernel (host_sketch.py, CPU devices) and in the XLA
program (sketch.py, accelerators; here its CPU twin)."""
import contextlib
import os
import tempfile
import unittest
from unittest import mock

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import h5py  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402
from diffcheck.jax import host_sketch  # noqa: E402
from diffcheck.jax.sketch import signs  # noqa: E402
from diffcheck.kernels import library  # noqa: E402


def _read(path):
    """{tap name: (attributes, values)} of a rank file."""
    out = {}
    with h5py.File(path) as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = (dict(obj.attrs), obj[()])
        f["taps"].visititems(visit)
    return out


def _paths():
    """(name, context) of each way of sketching: the host's kernel, the XLA program."""
    return (("host", contextlib.nullcontext()), ("program", library.without()))


def _capture(fn, args, mesh, tmp, name, **kw):
    with dcj.capture(jax.jit(fn), os.path.join(tmp, name), mesh, **kw) as run:
        run(*args)
    on_host = run.sketches.on_host
    return on_host, [_read(os.path.join(tmp, f"{name}.rank{r}.h5")) for r in range(mesh.size)]


class Signs(unittest.TestCase):
    def test_signs_are_format_mds(self):
        got = np.asarray(signs(0, 3, jnp.uint32(0), 8))
        want = ["+-+++---", "--+--+--", "---+--++"]  # docs/FORMAT.md, "Sketch taps"
        self.assertEqual(["".join("+" if v > 0 else "-" for v in row) for row in got], want)
        far = np.asarray(signs(7, 2, jnp.uint32(1000), 4))  # a later token range and another seed

        def fmix32(h):
            for shift, mul in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
                h = ((h ^ (h >> shift)) * mul) & 0xFFFFFFFF
            return h ^ (h >> 16)
        # FORMAT.md's formula in plain integers (no torch: the jax 0.12 environment has none)
        want = [[1 - 2 * (fmix32((7 * 0x9E3779B1 + i * 0x85EBCA77 + t * 0xC2B2AE3D) & 0xFFFFFFFF) & 1)
                 for t in range(1000, 1004)] for i in range(2)]
        np.testing.assert_array_equal(far, np.array(want))

    def test_the_hosts_patterns_are_the_signs(self):
        """The kernel's pattern bytes (bit b of group g: row 4g+b is -1), from tokens that wrap 2^32."""
        k, first, tokens = 6, 2 ** 32 - 3, 11
        r = np.asarray(signs(9, k, jnp.uint32(first), tokens))
        patterns = host_sketch.sign_patterns(9, k, first, tokens)
        self.assertEqual(patterns.shape, (2, tokens))
        bits = np.array([[(patterns[i // 4, t] >> (i % 4)) & 1 for t in range(tokens)] for i in range(k)])
        np.testing.assert_array_equal(bits, (r < 0).astype(int))
        self.assertTrue((patterns[1] >> 2 == 0).all())  # rows 6 and 7 do not exist

    def test_patterns_are_kept_read_only_within_their_bound(self):
        """Asked again, the same (read-only) patterns; the kept bytes never pass the bound, oldest dropped."""
        first = host_sketch.sign_patterns(5, 8, 100, 64)
        self.assertIs(host_sketch.sign_patterns(5, 8, 100, 64), first)
        self.assertFalse(first.flags.writeable)
        kept = host_sketch._Kept()
        with mock.patch.object(host_sketch, "PATTERN_CACHE_BYTES", 3 * first.nbytes):
            for start in range(5):
                kept.put(("k", start), first.copy())
        self.assertEqual(kept.bytes, 3 * first.nbytes)
        self.assertEqual(list(kept.arrays), [("k", 2), ("k", 3), ("k", 4)])


class Pieces(unittest.TestCase):
    def setUp(self):
        if os.environ.get(library.ENV):
            self.assertIsNotNone(library.loaded_from(), os.environ[library.ENV])

    def test_each_rank_holds_its_pieces_sketch(self):
        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        x = jax.device_put(jax.random.normal(jax.random.key(1), (32, 24)), NamedSharding(mesh, P("tp", None)))

        def f(x):
            dcj.tap("vec", jnp.sum(x, axis=0))  # 1-D: whole
            return dcj.tap("y", x * 2)
        for path, context in _paths():
            with self.subTest(path=path), context, tempfile.TemporaryDirectory() as tmp:
                on_host, files = _capture(f, (x,), mesh, tmp, "s", sketch=3, sketch_seed=5)
                self.assertEqual(on_host, path == "host" and library.loaded_from() is not None)
                attrs, sketch = files[6]["y"]  # dp 1, tp 2: tokens 16-23
                self.assertEqual((attrs["sketch_tokens"], attrs["sketch_seed"], attrs["spec"], attrs["nan_count"]),
                                 (8, 5, "tp,-", 0))
                # dp is a replica axis: its 2 ranks share the piece's 8 tokens, rank 6 (dp 1) sketching 20-23
                self.assertEqual(attrs["sketch_shared"], "dp")
                r = np.concatenate([np.asarray(signs(5, 3, jnp.uint32(20), 4)), np.ones((1, 4))]).astype(np.float64)
                piece = np.asarray(x, np.float64)[20:24] * 2
                np.testing.assert_allclose(sketch, r @ piece, rtol=1e-6)
                self.assertNotIn("sketch", files[6]["vec"][0])
                self.assertRegex(attrs["bits_hash"], "^[0-9a-f]{16}$" if on_host else "^[0-9a-f]{8}$")
                self.assertEqual(attrs["bits_hash"], files[2]["y"][0]["bits_hash"])  # its dp replica

    def test_nan_and_inf_are_counted_on_their_rank(self):
        mesh = jax.make_mesh((8,), ("sp",))
        for dtype in ("float32", "bfloat16", "float16"):
            x = jnp.ones((64, 16), dtype).at[41, 3].set(jnp.nan).at[9, 0].set(jnp.inf).at[10, 1].set(-jnp.inf)
            x = jax.device_put(x, NamedSharding(mesh, P("sp", None)))
            for path, context in _paths():
                with self.subTest(dtype=dtype, path=path), context, tempfile.TemporaryDirectory() as tmp:
                    _, files = _capture(lambda x: dcj.tap("x", x + 0), (x,), mesh, tmp, "n", sketch=True)
                    counts = [(f["x"][0]["nan_count"], f["x"][0]["inf_count"]) for f in files]
                # token 41 is rank 5's, tokens 9 and 10 rank 1's (8 tokens each)
                self.assertEqual(counts, [(0, 0), (0, 2), (0, 0), (0, 0), (0, 0), (1, 0), (0, 0), (0, 0)])

    def test_the_kernels_counts_and_hash_across_its_lanes_and_chunks(self):
        """diffcheck_piece_check reads a piece in 256 KiB chunks, its maxima in 32 lanes: NaN and Inf
        placed in a first lane, a last lane, the remainder past the lanes and a later chunk are each
        counted exactly, and the hash is XXH3's of the whole piece at once, for every element width."""
        from diffcheck.sketch import cpu_kernel
        xxh3 = cpu_kernel.bytes_hash_function()
        self.assertIsNotNone(xxh3, "the kernel library is built beside the package")
        for dtype in ("float32", "float64", "float16"):
            for n in (1, 31, 32, 33, 65535 + 3, 200003):
                with self.subTest(dtype=dtype, n=n):
                    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
                    places = sorted({0, n - 1, (n // 32) * 32 if n % 32 else n - 1, n // 2, min(n - 1, 70000)})
                    for i, at in enumerate(places):
                        x[at] = np.nan if i % 2 == 0 else -np.inf
                    nan, inf, words = host_sketch._check(x, library.KINDS[dtype], True)
                    self.assertEqual((nan, inf), (int(np.isnan(x).sum()), int(np.isinf(x).sum())))
                    self.assertEqual(words, f"{xxh3(x.ctypes.data, x.nbytes):016x}")
                    self.assertEqual(host_sketch._check(x, library.KINDS[dtype], False), (nan, inf, "-"))

    def test_the_host_and_the_program_agree(self):
        """Every kind of piece: replicated (its tokens shared, hashed), split along tokens, along width,
        with lead dimensions, a partial sum over an unreduced axis, 16-bit dtypes, subnormals; each rank's
        sketch, counts, shares and layout the same both ways."""
        mesh = jax.make_mesh((2, 2, 2), ("dp", "sp", "tp"))
        keys = jax.random.split(jax.random.key(3), 3)
        x = jax.device_put(jax.random.normal(keys[0], (64, 32)), NamedSharding(mesh, P(("dp", "sp"), None)))
        w = jax.device_put(jax.random.normal(keys[1], (32, 48)), NamedSharding(mesh, P("dp", "tp")))

        def f(x, w):
            rep = dcj.tap("rep", jax.sharding.reshard(jnp.tanh(x), P()))
            dcj.tap("tokens", x * 3)
            dcj.tap("lead", jax.sharding.reshard(jnp.stack([x, -x, x * x]), P(None, "sp", "tp")))
            lhs = jax.sharding.reshard(rep, P(None, "dp"))  # contracted over dp on both sides: a partial sum
            dcj.tap("partial", jnp.einsum("tk,kn->tn", lhs, w, out_sharding=P(None, "tp", unreduced={"dp"})))
            dcj.tap("half", (x * 0.5).astype(jnp.bfloat16))
            dcj.tap("f16", (x * 1e-6).astype(jnp.float16))  # subnormal halves among them
            return rep
        results = {}
        for path, context in _paths():
            with context, tempfile.TemporaryDirectory() as tmp:
                results[path] = _capture(f, (x, w), mesh, tmp, "a", sketch=True, sketch_seed=11)
        if not results["host"][0]:
            self.skipTest("no CPU sketch kernel built (DIFFCHECK_SKETCH_KERNEL): only the program runs")
        same = ("sketch_tokens", "sketch_seed", "spec", "partial", "sketch_shared", "nan_count", "inf_count", "dtype")
        for rank, (host, program) in enumerate(zip(results["host"][1], results["program"][1])):
            self.assertEqual(sorted(host), sorted(program))
            for name in ("rep", "tokens", "lead", "partial", "half", "f16"):
                with self.subTest(rank=rank, tap=name):
                    (a, s), (b, t) = host[name], program[name]
                    self.assertIn("sketch", a)
                    self.assertEqual({k: a.get(k) for k in same}, {k: b.get(k) for k in same})
                    # 16-bit taps: the program sums in float32, the host in float64
                    scale = np.abs(t).max() * (1e-6 if name in ("half", "f16") else 1e-12)
                    np.testing.assert_allclose(s, t, rtol=1e-6, atol=scale)
        self.assertEqual(results["host"][1][0]["rep"][0]["sketch_shared"], "dp*sp*tp")
        self.assertEqual(results["host"][1][0]["partial"][0]["partial"], "dp")

    def test_replicas_that_differ_hash_apart(self):
        """A value said to be replicated whose dp replicas differ in one bit: their hashes differ, the
        tp replicas' agree (the comparator names the replicas from them)."""
        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        x = jax.device_put(jnp.ones((32, 16)), NamedSharding(mesh, P()))

        def f(x):
            odd = jax.shard_map(lambda b: b + jax.lax.axis_index("dp") * 2.0 ** -20, mesh=mesh, in_specs=P(),
                                out_specs=P(), check_vma=False)(x)
            return dcj.tap("y", odd)
        with tempfile.TemporaryDirectory() as tmp:
            _, files = _capture(f, (x,), mesh, tmp, "d", sketch=True)
        hashes = [f["y"][0]["bits_hash"] for f in files]
        self.assertEqual(len(set(hashes[:4])), 1, hashes)  # dp 0
        self.assertEqual(len(set(hashes[4:])), 1, hashes)  # dp 1
        self.assertNotEqual(hashes[0], hashes[4])


    def test_a_call_of_other_shapes_has_its_own_token_count(self):
        """sketch_tokens is the piece's own token count at each call: it was the first call's at every
        later one, and compare then judged a clean call of other shapes FAIL (shape)."""
        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        calls = [jax.device_put(np.ones((t, 24), np.float32), NamedSharding(mesh, P("tp", None))) for t in (32, 16)]
        for path, context in _paths():
            with self.subTest(path=path), context, tempfile.TemporaryDirectory() as tmp:
                with dcj.capture(jax.jit(lambda x: dcj.tap("y", x * 2)), os.path.join(tmp, "s"), mesh,
                                 sketch=True) as run:
                    for x in calls:
                        run(x)
                f = _read(os.path.join(tmp, "s.rank0.h5"))
                self.assertEqual((f["y"][0]["sketch_tokens"], f["step1/y"][0]["sketch_tokens"]), (8, 4))

    def test_later_calls_write_their_taps_into_the_last_calls_buffers(self):
        """From the second call with the same argument shapes the host path donates the last call's tap
        outputs (sketch_run.py): they are used up, the sketches are those of the values, and the function's
        own results are left alone; a call of other shapes gets fresh outputs, and donates from the next."""
        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        x = jax.device_put(jax.random.normal(jax.random.key(2), (32, 24)), NamedSharding(mesh, P("tp", None)))
        x2 = jax.device_put(np.asarray(x)[:16], NamedSharding(mesh, P("tp", None)))

        def f(x, c):
            dcj.tap("x", x)  # an argument as a tap: never donated
            return dcj.tap("y", x * c) + 1, dcj.tap("z", x - c)  # (a result that is a tap: its own buffer)
        with tempfile.TemporaryDirectory() as tmp:
            with dcj.capture(jax.jit(f), os.path.join(tmp, "d"), mesh, sketch=True) as run:
                if not run.sketches.on_host:
                    self.skipTest("no CPU sketch kernel built (DIFFCHECK_SKETCH_KERNEL): no host path")
                results, kept = [], []
                for arg, c in ((x, 1.0), (x, 2.0), (x, 4.0), (x2, 8.0), (x2, 16.0)):
                    results.append(run(arg, c))
                    kept.append(next(iter(run.sketches._kept[1].values())))
                used_up = [a.is_deleted() for a in kept]
            self.assertIsNone(run.sketches._kept)  # freed with the capture
            files = [_read(os.path.join(tmp, f"d.rank{r}.h5")) for r in range(mesh.size)]
        self.assertFalse(x.is_deleted() or x2.is_deleted())
        # call 1 donated call 0's, 2 call 1's; call 3 (other shapes) nothing, so call 2's are left; 4 donated 3's
        self.assertEqual(used_up, [True, True, False, True, False])
        for arg, c, r in zip((x, x, x, x2, x2), (1, 2, 4, 8, 16), results):
            np.testing.assert_array_equal(np.asarray(r[0]), np.asarray(arg) * c + 1)
            np.testing.assert_array_equal(np.asarray(r[1]), np.asarray(arg) - c)
        for f in files:
            first, second = f["y"][1], f["step3/y"][1]
            for name, scale in (("step1/y", 2), ("step2/y", 4)):  # powers of two: the sums scale exactly
                np.testing.assert_array_equal(f[name][1], first * scale)
            np.testing.assert_array_equal(f["step4/y"][1], second * 2)
            self.assertEqual(f["step4/y"][0]["sketch_tokens"], 4)  # 16 tokens over tp=4 (it said 8, the first call's)

    def test_attention_taps_are_sketched_over_their_sequence(self):
        """A tap [sequence, heads, head_dim] with fewer heads than the sketch has rows: sketched over the
        sequence (sketch_dim -3), its heads and head_dim one width, both ways alike; it was written whole."""
        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        x = jax.device_put(jax.random.normal(jax.random.key(4), (32, 4, 6)), NamedSharding(mesh, P(None, "tp")))
        for path, context in _paths():
            with self.subTest(path=path), context, tempfile.TemporaryDirectory() as tmp:
                _, files = _capture(lambda x: dcj.tap("attn", x * 2), (x,), mesh, tmp, "h", sketch=3, sketch_seed=5)
                attrs, sketch = files[6]["attn"]  # dp 1, tp 2: head 2; dp replicas share the 32 tokens
                self.assertEqual((attrs["sketch_dim"], attrs["sketch_tokens"], attrs["spec"], attrs["sketch_shared"]),
                                 (-3, 32, "-,tp,-", "dp"))
                self.assertEqual(sketch.shape, (4, 1, 6))
                r = np.concatenate([np.asarray(signs(5, 3, jnp.uint32(16), 16)), np.ones((1, 16))])
                piece = np.asarray(x, np.float64)[16:, 2:3] * 2
                np.testing.assert_allclose(sketch, (r @ piece.reshape(16, 6)).reshape(4, 1, 6), rtol=1e-6)
                self.assertNotIn("sketch_dim", files[6].get("y", ({},))[0])

    def test_an_attention_tap_checks_clean_and_finds_a_head_gone_wrong(self):
        """dcj.check in sketch mode of a [sequence, heads, head_dim] tap: the comparator sketches the whole
        reference along the sequence too; clean PASS, one device's heads off by 1% FAIL at that tap."""
        mesh = jax.make_mesh((8,), ("tp",))
        x = jax.device_put(jax.random.normal(jax.random.key(5), (64, 8, 16)), NamedSharding(mesh, P(None, "tp")))

        def block(x, bug=False):
            def heads(q):  # each device its head; the fault: device 3's off by 1%
                s = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, q) / 4.0, axis=-1)
                o = jnp.einsum("hqk,khd->qhd", s, q)
                return o * (1 + 0.01 * (jax.lax.axis_index("tp") == 3)) if bug else o
            o = jax.shard_map(heads, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"))(x)
            return dcj.tap("out", dcj.tap("attn", o).sum(-1))
        for bug in (False, True):
            with self.subTest(bug=bug), tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "c")
                if not bug:
                    report = dcj.check(jax.jit(block), x, out=out, mesh=mesh, sketch=True)
                    self.assertTrue(report["pass"], report)
                    self.assertEqual(_read(out + ".rank3.h5")["attn"][0]["sketch_dim"], -3)
                else:
                    with self.assertRaises(dcj.Divergence) as caught:
                        dcj.check(jax.jit(lambda x: block(x, bug=True)), x, out=out, mesh=mesh, sketch=True)
                    report = caught.exception.report
                    self.assertEqual(report["first_divergence"]["tap"], "attn")
                attn = next(t for t in report["taps"] if t["name"] == "attn")
                self.assertTrue(attn["reference"]["estimated"], attn)  # judged from the sketches


if __name__ == "__main__":
    unittest.main()
