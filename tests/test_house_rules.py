"""The house rules of shared/DESIGN.md that a machine can hold the tree to:
no source file over 400 lines and no function over 80, in the folders a
newcomer reads (harness/, reference/, scenarios/, python/, scripts/); and
no unused import, undefined name or unused local in the Python of those
folders, examples/ and tests/ (pyflakes). Functions are measured by lizard
(a maintained analyser of C++ and Python; both in the torch environment,
scripts/torch_env.sh): its length runs from a function's first line to its
last, comments and blank lines included."""
import pathlib
import unittest

import lizard
import pyflakes.api
import pyflakes.messages
import pyflakes.reporter

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "reference", "scenarios", "python", "scripts")
SOURCE = {".cpp", ".h", ".py", ".sh"}
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
# Modules whose imports are their public names (diffcheck.compare, dct.compare ...).
RE_EXPORTERS = {"python/diffcheck/__init__.py", "python/diffcheck/torch/session.py", "scripts/diffcheck_dump.py"}


def sources():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SOURCE and path.is_file():
                yield path


def long_files(paths, limit=MAX_FILE_LINES):
    """(path, lines) of each file over `limit` lines."""
    out = []
    for path in paths:
        n = len(path.read_text(errors="replace").splitlines())
        if n > limit:
            out.append((path, n))
    return out


def long_functions(paths, limit=MAX_FUNCTION_LINES):
    """(path, function, first line, length) of each function over `limit` lines."""
    out = []
    for path in paths:
        if path.suffix == ".sh":
            continue
        for f in lizard.analyze_file(str(path)).function_list:
            if f.length > limit:
                out.append((path, f.name, f.start_line, f.length))
    return out


def python_sources():
    for folder in FOLDERS + ("examples", "tests"):
        yield from (p for p in sorted((ROOT / folder).rglob("*.py")) if p.is_file())


def flakes(paths):
    """pyflakes' findings in `paths`, as text, but the imports a re-exporting
    module makes and those on a line marked `# noqa` (as flake8 reads it)."""
    found = []
    lines = {}

    def marked(path, lineno):
        if path not in lines:
            lines[path] = path.read_text(errors="replace").splitlines()
        return 0 < lineno <= len(lines[path]) and "# noqa" in lines[path][lineno - 1]

    class Collect(pyflakes.reporter.Reporter):
        def __init__(self):
            super().__init__(None, None)

        def flake(self, message):
            path = pathlib.Path(message.filename)
            rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
            if marked(path, message.lineno):
                return
            if not (rel in RE_EXPORTERS and isinstance(message, pyflakes.messages.UnusedImport)):
                found.append(f"{rel}:{message.lineno}: {message.message % message.message_args}")

        def syntaxError(self, filename, msg, lineno, offset, text):
            found.append(f"{filename}:{lineno}: {msg}")

        def unexpectedError(self, filename, msg):
            found.append(f"{filename}: {msg}")
    reporter = Collect()
    for path in paths:
        pyflakes.api.checkPath(str(path), reporter)
    return found


class HouseRules(unittest.TestCase):
    def test_the_rules_can_fail(self):
        # The checkers themselves must see a long file and a long function.
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            cpp = pathlib.Path(d) / "long.cpp"
            cpp.write_text("int f() {\n" + "  int x = 0;\n" * 90 + "  return 0;\n}\n" + "// filler\n" * 320)
            py = pathlib.Path(d) / "short.py"
            py.write_text("def g():\n    return 1\n")
            self.assertEqual([p for p, _ in long_files([cpp, py])], [cpp])
            self.assertEqual([(p, name) for p, name, _, _ in long_functions([cpp, py])], [(cpp, "f")])
            sloppy = pathlib.Path(d) / "sloppy.py"
            sloppy.write_text("import os\n\n\ndef h():\n    x = 1\n    return undefined_name\n")
            self.assertEqual([f.split(": ", 1)[1] for f in flakes([sloppy, py])],
                             ["'os' imported but unused", "local variable 'x' is assigned to but never used",
                              "undefined name 'undefined_name'"])

    def test_no_file_over_400_lines(self):
        found = long_files(sources())
        self.assertFalse(found, "files over {} lines (split them along their concerns): {}".format(
            MAX_FILE_LINES, ", ".join(f"{p.relative_to(ROOT)} ({n})" for p, n in found)))

    def test_no_function_over_80_lines(self):
        found = long_functions(sources())
        self.assertFalse(found, "functions over {} lines (split them into named steps): {}".format(
            MAX_FUNCTION_LINES, ", ".join(f"{p.relative_to(ROOT)}:{line} {name} ({n})" for p, name, line, n in found)))


    def test_no_unused_import_or_undefined_name(self):
        found = flakes(python_sources())
        self.assertFalse(found, "pyflakes: " + "; ".join(found))


if __name__ == "__main__":
    unittest.main()
