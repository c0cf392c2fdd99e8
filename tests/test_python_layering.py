"""The Python package's layers (pyproject.toml's [tool.importlinter]), held
by import-linter as harness/'s are at link time:

    diffcheck.torch | diffcheck.jax   (independent: neither imports the other)
    diffcheck.watch
    diffcheck.sketch
    diffcheck.compare | diffcheck.dump  (import no framework)
    diffcheck.kernels  (the C library's loader: dump writes a dataset through it)

and no cycle among the modules of any subpackage. The contracts are also run
on a copy of the package with one arrow turned upward, which they must refuse:
a contract that passes anything would pass this too.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / "pyproject.toml"
# lint-imports, run by the interpreter of the test (its module has no __main__)
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(python_dir):
    """(exit status, output) of lint-imports on the package under `python_dir`."""
    env = dict(os.environ, PYTHONPATH=str(python_dir))
    p = subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo", str(CONFIG)],
                       cwd=python_dir, env=env, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def with_line(path, line):
    path.write_text(path.read_text() + "\n" + line + "\n")


class PythonLayers(unittest.TestCase):
    def test_the_package_keeps_its_contracts(self):
        rc, out = lint_imports(ROOT / "python")
        self.assertEqual(rc, 0, out)
        self.assertIn("5 kept, 0 broken", out)

    def test_an_arrow_against_the_layers_is_refused(self):
        # Each: (file, the import added, the contract it breaks).
        breaches = [
            ("dump/__init__.py", "import diffcheck.watch", "frameworks -> watch"),
            ("jax/layouts.py", "from diffcheck.torch import rounding", "diffcheck.jax imports no torch"),
            ("compare.py", "import torch", "the format and the report import no framework"),
            ("torch/rounding.py", "from diffcheck.torch import session", "no cycle"),
        ]
        for where, line, contract in breaches:
            with self.subTest(where=where), tempfile.TemporaryDirectory() as tmp:
                shutil.copytree(ROOT / "python" / "diffcheck", pathlib.Path(tmp) / "diffcheck",
                                ignore=shutil.ignore_patterns("__pycache__", "*.so"))
                with_line(pathlib.Path(tmp) / "diffcheck" / where, line)
                rc, out = lint_imports(tmp)
                self.assertNotEqual(rc, 0, out)
                self.assertRegex(out, rf"{contract}.*BROKEN", out)


if __name__ == "__main__":
    unittest.main()
