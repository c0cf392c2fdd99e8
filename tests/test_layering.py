"""The include direction of harness/ subsystems (see harness/CMakeLists.txt).

The CMake link checks catch a call into a higher layer; this catches an
include against the direction that calls nothing (a type, an inline helper),
and scenarios or reference reaching into subsystems they must not use.
"""
import pathlib
import re
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# What each folder may include besides itself. Transitive: a layer may use
# everything below it.
ALLOWED = {
    "harness/core": set(),
    "harness/capture": {"harness/core"},
    "harness/check": {"harness/capture", "harness/core"},
    "harness/report": {"harness/check", "harness/capture", "harness/core"},
    "harness/search": {"harness/report", "harness/check", "harness/capture", "harness/core"},
    "harness/run": {"harness/report", "harness/check", "harness/capture", "harness/core"},
    "harness/cli": {"harness/search", "harness/run", "harness/report", "harness/check", "harness/capture",
                    "harness/core", "reference"},
    "reference": {"harness/core"},
    # Scenarios may use what run stands on (e.g. a derived tolerance for a tap).
    "scenarios": {"harness/run", "harness/report", "harness/check", "harness/capture", "harness/core", "reference"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:harness/[a-z_]+|reference|scenarios)/[^"]+)"', re.M)
MPI_OR_HDF5 = re.compile(r'^\s*#\s*include\s+<(mpi\.h|hdf5\.h|H5[^>]*)>', re.M)


def folder_of(include):
    parts = include.split("/")
    return "/".join(parts[:2]) if parts[0] == "harness" else parts[0]


def violations(folder, text):
    """(include, reason) pairs of `text`, a file in `folder`, that break the rules."""
    out = []
    for inc in INCLUDE.findall(text):
        target = folder_of(inc)
        if target != folder and target not in ALLOWED[folder]:
            out.append((inc, f"{folder} may not include {target}"))
    for inc in MPI_OR_HDF5.findall(text):
        owner = "harness/core" if inc == "mpi.h" else "harness/capture"
        if folder != owner:
            out.append((inc, f"only {owner} includes <{inc}>"))
    return out


class Layering(unittest.TestCase):
    def test_rule_catches_upward_and_sideways_includes(self):
        # The checker itself must be able to fail.
        self.assertTrue(violations("harness/check", '#include "harness/run/scenario.h"\n'))
        self.assertTrue(violations("harness/search", '#include "harness/run/scenario.h"\n'))
        self.assertTrue(violations("harness/core", '#include "harness/capture/store.h"\n'))
        self.assertTrue(violations("scenarios", '#include <mpi.h>\n'))
        self.assertTrue(violations("harness/check", '#include <hdf5.h>\n'))
        self.assertFalse(violations("harness/check", '#include "harness/core/tensor.h"\n'))

    def test_tree_follows_the_direction(self):
        found = []
        for folder in ALLOWED:
            files = [p for p in (ROOT / folder).rglob("*") if p.suffix in (".h", ".cpp")]
            self.assertTrue(files, folder)
            for path in files:
                for inc, why in violations(folder, path.read_text()):
                    found.append(f"{path.relative_to(ROOT)}: {inc}: {why}")
        self.assertEqual(found, [])

    def test_every_harness_folder_is_known(self):
        folders = {f"harness/{p.name}" for p in (ROOT / "harness").iterdir()
                   if p.is_dir() and p.name != "layering"}
        self.assertEqual(folders - set(ALLOWED), set())


if __name__ == "__main__":
    unittest.main()
