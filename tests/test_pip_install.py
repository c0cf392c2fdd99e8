"""`pip install .` as a user with an environment of their own does it
(pyproject.toml, scikit-build-core): a fresh venv with only the framework,
the checkout installed into it, then an example run from outside the
checkout with no PYTHONPATH and no /usr/local/bin on PATH, so that the
package, its CPU kernel and the `diffcheck` executable all come from the
venv. Clean: exit 0 and PASS; with its fault: exit 1.

    Python 3.11 + torch 2.13.0 (".[torch]"): examples/tp_block.py
    Python 3.12 + jax (".[jax]"):             examples/jax_reshard.py

Nightly (each install builds the executable: minutes on 2 cores). The build
trees are kept in <checkout>/build-pip/, so a second run rebuilds only what
changed; DIFFCHECK_PIP_KEEP=DIR keeps the venvs there.
"""
import glob
import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_of(version):
    """An interpreter of `version` ("3.11"): on PATH, Debian's, or pyenv's."""
    candidates = [f"/usr/bin/python{version}"]
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    candidates.append(shutil.which(f"python{version}"))
    for c in candidates:
        # pyenv's shims answer for every version but run only the selected one
        if c and "/shims/" not in c and os.access(c, os.X_OK):
            return c
    raise AssertionError(f"no Python {version} on this machine (PATH, /usr/bin, ~/.pyenv): the test needs one")


def user_env():
    """A user's shell: no PYTHONPATH, no diffcheck of the build tree or of /usr/local."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DIFFCHECK_"))}
    env["PATH"] = "/usr/bin:/bin"
    return env


class PipInstall(unittest.TestCase):
    def install(self, version, extra):
        keep = os.environ.get("DIFFCHECK_PIP_KEEP")
        base = keep or tempfile.mkdtemp(prefix="diffcheck_pip_")
        if not keep:
            self.addCleanup(shutil.rmtree, base, True)
        venv = os.path.join(base, f"venv{version}{extra}")
        subprocess.run([python_of(version), "-m", "venv", "--clear", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        p = subprocess.run([py, "-m", "pip", "install", "-q", f"{ROOT}[{extra}]"], env=user_env(),
                           capture_output=True, text=True, timeout=3600)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        return py

    def run_example(self, py, script, *args):
        with tempfile.TemporaryDirectory() as cwd:
            p = subprocess.run([py, os.path.join(ROOT, "examples", script), *args, "--out", cwd], cwd=cwd,
                               env=user_env(), capture_output=True, text=True, timeout=900)
        return p.returncode, p.stdout + p.stderr

    def check_installed(self, py):
        # The kernel beside the package (diffcheck.kernels loads it; diffcheck.sketch's wrapper needs torch).
        probe = ("import os, importlib.util, diffcheck; from diffcheck.compare import find_executable; "
                 "print(diffcheck.__file__); "
                 "print(find_executable()); "
                 "lib = os.path.join(os.path.dirname(diffcheck.__file__), 'kernels', 'libdiffcheck_sketch_cpu.so'); "
                 "assert os.path.exists(lib), lib; print(lib)\n"
                 "if importlib.util.find_spec('torch'):\n"
                 "    from diffcheck.sketch import cpu_kernel; print(cpu_kernel.loaded_from())")
        p = subprocess.run([py, "-c", probe], cwd="/", env=user_env(), capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        venv = os.path.dirname(os.path.dirname(py))
        for line in p.stdout.split():
            self.assertTrue(line.startswith(venv), f"{line} is not from the venv {venv}")

    def check_example(self, version, extra, script, *args):
        """The venv made and checked; the example clean (exit 0, PASS) and with --bug (exit 1)."""
        py = self.install(version, extra)
        self.check_installed(py)
        code, out = self.run_example(py, script, *args)
        self.assertEqual(code, 0, out)
        self.assertIn("PASS", out)
        code, out = self.run_example(py, script, *args, "--bug")
        self.assertEqual(code, 1, out)

    def test_torch_311(self):
        self.check_example("3.11", "torch", "tp_block.py", "-n", "2")

    def test_jax_312(self):
        self.check_example("3.12", "jax", "jax_reshard.py", "--mesh", "dp=2,fsdp=1,sp=2,tp=2")


if __name__ == "__main__":
    unittest.main()
