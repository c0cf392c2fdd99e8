"""Every header of the C++ tree compiles on its own: a translation unit that
includes it and nothing else passes the compiler's syntax check. The unity
builds the suite makes hide a missing #include (another file of the same
batch brings it in); a header that needs its includer's includes fails
here, naming the header and the compiler's first error.

The compiler and its flags come from the build (tests/CMakeLists.txt:
DIFFCHECK_CXX, DIFFCHECK_HEADER_FLAGS), so MPI's and HDF5's include
directories are those the build uses."""
import concurrent.futures
import os
import pathlib
import shlex
import subprocess
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "reference", "scenarios")


def headers():
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.h"))


def compiles_alone(cxx, flags, header, tmp, root=ROOT):
    """None when the header (under `root`, the include directory) compiles
    alone, else the compiler's first error lines."""
    name = header.relative_to(root).as_posix()
    unit = pathlib.Path(tmp) / (name.replace("/", "__") + ".cpp")
    unit.write_text(f'#include "{name}"\n')
    p = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", f"-I{root}", *flags, str(unit)],
                       capture_output=True, text=True)
    if p.returncode == 0:
        return None
    errors = [line for line in p.stderr.splitlines() if "error" in line]
    return "\n".join(errors[:3]) or p.stderr[-500:]


class HeadersStandAlone(unittest.TestCase):
    def test_every_header_compiles_on_its_own(self):
        cxx = os.environ.get("DIFFCHECK_CXX", "c++")
        flags = shlex.split(os.environ.get("DIFFCHECK_HEADER_FLAGS", ""))
        found = headers()
        self.assertGreater(len(found), 50)
        with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            results = list(pool.map(lambda h: (h, compiles_alone(cxx, flags, h, tmp)), found))
        failed = {str(h.relative_to(ROOT)): err for h, err in results if err}
        self.assertEqual(failed, {}, "\n\n".join(f"{h}:\n{e}" for h, e in failed.items()))

    def test_the_check_can_fail(self):
        with tempfile.TemporaryDirectory() as tmp:
            header = pathlib.Path(tmp) / "probe.h"  # uses std::string without <string>
            header.write_text("#pragma once\ninline std::string probe() { return {}; }\n")
            self.assertIsNotNone(compiles_alone(os.environ.get("DIFFCHECK_CXX", "c++"), [], header, tmp, root=tmp))
            header.write_text("#pragma once\n#include <string>\ninline std::string probe() { return {}; }\n")
            self.assertIsNone(compiles_alone(os.environ.get("DIFFCHECK_CXX", "c++"), [], header, tmp, root=tmp))


if __name__ == "__main__":
    unittest.main()
