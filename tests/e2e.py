"""Helpers for the end-to-end tests: run diffcheck (under mpirun or alone) and
look at its exit status, stdout, stderr and JSON report."""
import json
import os
import subprocess
import tempfile
import unittest

EXE = os.environ.get("DIFFCHECK_EXE", "diffcheck")
MPIEXEC = os.environ.get("DIFFCHECK_MPIEXEC", "mpirun")
SCRIPTS = os.environ.get("DIFFCHECK_SCRIPTS", os.path.join(os.path.dirname(__file__), "..", "scripts"))
TIMEOUT = 600


def live_processes():
    """(pid, command line) of every process that is not a zombie."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append((int(pid), cmd))
    return out


class Result:
    def __init__(self, proc, json_path=None):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.report = None
        if json_path and os.path.exists(json_path):
            with open(json_path) as f:
                self.report = json.load(f)

    def __str__(self):
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


class E2ETest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="diffcheck_e2e_")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def run_cmd(self, args, json_name=None):
        proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
        return Result(proc, self.path(json_name) if json_name else None)

    def mpirun(self, n, *args, json=True):
        """mpirun -n N diffcheck ARGS --out <tmp> --json <tmp>."""
        extra = ["--out", self.path("run.h5")]
        if json:
            extra += ["--json", self.path("report.json")]
        return self.run_cmd([MPIEXEC, "-n", str(n), EXE, *args, *extra],
                            "report.json" if json else None)

    def diffcheck(self, *args, json=False):
        extra = ["--json", self.path("report.json")] if json else []
        return self.run_cmd([EXE, *args, *extra], "report.json" if json else None)

    def assertExit(self, res, code):
        self.assertEqual(res.code, code, msg=str(res))

    def assertFirstDivergence(self, res, tap, checks=None):
        self.assertIsNotNone(res.report, msg=str(res))
        fd = res.report["first_divergence"]
        self.assertIsNotNone(fd, msg=str(res))
        self.assertEqual(fd["tap"], tap, msg=str(res))
        if checks is not None:
            self.assertEqual(sorted(fd["checks"]), sorted(checks), msg=str(res))
        return fd
