"""diffcheck.jax end to end, seed #40034's pattern (examples/jax_reshard.py)
at 4 and 8 CPU devices in one process, float32 and bfloat16, clean (every
tap passes) and with its fault (found at its first tap, on the meshes with
dp=2 only); sweep-mesh over the program, with and without a reference (the
faulty mesh is the odd one out); a job of 2 processes (jax.distributed), each
writing its own devices' files, clean and with a fault on one process's
devices. The models: test_e2e_jax_models.py.
DIFFCHECK_E2E_FULL=1 (nightly): more meshes in both dtypes."""
import atexit
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from e2e import EXE

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"


# One persistent compilation cache for the examples' runs: the clean and the
# faulty run of an example compile the same one-device programs.
COMPILATION_CACHE = tempfile.mkdtemp(prefix="diffcheck-jax-compilation-")
atexit.register(shutil.rmtree, COMPILATION_CACHE, True)
os.environ.update(JAX_COMPILATION_CACHE_DIR=COMPILATION_CACHE, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")  # the sweeps' runs inherit it


def run_example(script, *args, timeout=300):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args], capture_output=True,
                       text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr


class ReshardExample(unittest.TestCase):
    def expect(self, mesh, dtype, bug, first=None):
        with tempfile.TemporaryDirectory() as tmp:
            code, out = run_example("jax_reshard.py", "--mesh", mesh, "--dtype", dtype, "--out", tmp,
                                    *(["--bug"] if bug else []))
        where = f"{mesh} {dtype}{' --bug' if bug else ''}:\n{out}"
        if first is None:
            self.assertEqual(code, 0, where)
            self.assertIn("PASS: all 3 taps pass", out, where)
        else:
            self.assertEqual(code, 1, where)
            self.assertIn(f"First divergence: tap '{first}'", out, where)
            self.assertIn("replicas DIFFER across dp", out, where)

    def test_clean_and_faulty_at_4_and_8_devices(self):
        cases = [("dp=2,tp=2", "float32")]  # 8 devices and bfloat16: the DiT's default case, and nightly here
        if FULL:
            meshes = ["dp=2,tp=2", "dp=1,fsdp=2,tp=2", "dp=2,sp=2", "dp=2,fsdp=2,tp=2", "dp=1,fsdp=2,sp=2,tp=2",
                      "dp=4,tp=2", "dp=2,fsdp=2,sp=2", "dp=8"]
            cases = list(itertools.product(meshes, ("float32", "bfloat16")))
        for mesh, dtype in cases:
            dp2 = "dp=2" in mesh.split(",")
            with self.subTest(mesh=mesh, dtype=dtype):
                self.expect(mesh, dtype, bug=False)
                self.expect(mesh, dtype, bug=True, first="result" if dp2 else None)

    @unittest.skipUnless(FULL, "nightly; sketch mode's unit tests are in test_jax_capture")
    def test_sketch_mode(self):
        with tempfile.TemporaryDirectory() as tmp:
            code, out = run_example("jax_reshard.py", "--mesh", "dp=2,tp=2", "--sketch", "--out", tmp)
            self.assertEqual(code, 0, out)
            self.assertEqual(out.count("(sketch)"), 3, out)
            code, out = run_example("jax_reshard.py", "--mesh", "dp=2,tp=2", "--sketch", "--bug", "--out", tmp)
        self.assertEqual(code, 1, out)
        self.assertIn("First divergence: tap 'result'", out)
        self.assertIn("replicas DIFFER across dp: the bits of", out)

    def sweep(self, *args, devices=4):
        return subprocess.run([EXE, "sweep-mesh", "--devices", str(devices), "--axes", "dp,tp", *args, "--",
                               sys.executable, os.path.join(ROOT, "examples", "jax_reshard.py"), "--bug",
                               "--mesh", "{mesh}", "--out", "{out}"], capture_output=True, text=True, timeout=600)

    @unittest.skipUnless(FULL, "nightly (3 runs); by default the sweep without a reference below")
    def test_sweep_mesh_names_the_meshes_with_dp_2(self):
        p = self.sweep()
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("jax_reshard.py on 4 devices", p.stdout)
        self.assertRegex(p.stdout, r"\| dp=2,tp=2 \| [\d.]+ \| FAIL \| result \|")
        for mesh in ("dp=1,tp=4", "dp=4,tp=1"):
            self.assertRegex(p.stdout, rf"\| {mesh} \| [\d.]+ \| PASS \|")

    def test_sweep_without_a_reference_names_the_odd_mesh(self):
        p = subprocess.run([EXE, "sweep-mesh", "--devices", "4", "--axes", "dp,tp", "--no-reference", "--",
                            sys.executable, os.path.join(ROOT, "examples", "jax_reshard.py"), "--bug",
                            "--no-reference", "--mesh", "{mesh}", "--out", "{out}"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"\| dp=2,tp=2 \| [\d.]+ \| FAIL \| result \|.*LEAVES the consensus")
        self.assertEqual(p.stdout.count("in the consensus"), 2, p.stdout)

    def test_sweep_of_a_command_refuses_what_it_cannot_run(self):
        for args, message in ((["--devices", "4", "--", "true"], "needs its mesh axes"),
                              (["--devices", "4", "--axes", "dp", "--", "true"], "must receive the mesh"),
                              (["--devices", "4", "--axes", "dp", "--scenario", "flux_tp", "--", "x", "{mesh}"],
                               "not both"),
                              (["--devices", "4", "--axes", "d-p", "--", "x", "{mesh}"], "not an axis name")):
            with self.subTest(args=args):
                p = subprocess.run([EXE, "sweep-mesh", *args], capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertIn(message, p.stderr)



def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


class MultiProcess(unittest.TestCase):
    """jax.distributed over 2 processes of 2 CPU devices each (tests/jax/multiprocess_check.py):
    each writes its own devices' rank files, process 0 the references and the verdict."""

    def job(self, out, *args):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        port = str(free_port())
        script = os.path.join(ROOT, "tests", "jax", "multiprocess_check.py")
        procs = [subprocess.Popen([sys.executable, script, str(i), "2", port, out, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env) for i in range(2)]
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        return [p.returncode for p in procs], outputs

    def test_each_process_writes_its_devices_and_a_fault_on_one_is_found(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "run")
            codes, outputs = self.job(out)
            self.assertEqual(codes, [0, 0], "\n".join(outputs))
            self.assertIn("PASS: all 2 taps pass", outputs[0])
            self.assertEqual(sorted(f for f in os.listdir(tmp) if ".rank" in f and "reference" not in f),
                             [f"run.rank{r}.h5" for r in range(4)])
            codes, outputs = self.job(out, "--bug")
            self.assertEqual(codes[0], 1, outputs[0])
            self.assertIn("First divergence: tap 'h'", outputs[0])
            os.remove(out + ".rank3.h5")  # a process's devices missing: an input error, never a verdict
            p = subprocess.run([EXE, "compare", out, "--reference", out + ".reference.h5"], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn("run.rank3.h5", p.stderr)

if __name__ == "__main__":
    unittest.main()
