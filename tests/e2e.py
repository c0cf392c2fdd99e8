"""Helpers for the end-to-end tests: run diffcheck (under mpirun or alone) and
look at its exit status, stdout, stderr and JSON report."""
import base64
import json
import os
import shutil
import subprocess
import struct
import sys
import tempfile
import time
import unittest
import zlib
from html.parser import HTMLParser

EXE = os.environ.get("DIFFCHECK_EXE", "diffcheck")
MPIEXEC = os.environ.get("DIFFCHECK_MPIEXEC", "mpirun")
SCRIPTS = os.environ.get("DIFFCHECK_SCRIPTS", os.path.join(os.path.dirname(__file__), "..", "scripts"))
TIMEOUT = 600


sys.path.insert(0, os.path.abspath(SCRIPTS))
from child_process import live_processes, run_ended_gracefully, stop_on_sigterm_like_ctrl_c  # noqa: E402,F401

# ctest ends a test that runs over its time with SIGTERM: as a Ctrl-C, it
# unwinds, the running command is ended gracefully and the temporary
# directories go with the interpreter (TemporaryDirectory's finalizer)
# instead of staying under /tmp.
stop_on_sigterm_like_ctrl_c()


CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--window-size=1400,1000"]


def png_values(uri):
    """The distinct byte values of a data: URI PNG's inflated image data (a
    blank image has a handful, a picture many)."""
    self_png = base64.b64decode(uri.split(",", 1)[1])
    assert self_png[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat = 8, b""
    while at < len(self_png):
        n, kind = struct.unpack(">I4s", self_png[at:at + 8])
        if kind == b"IDAT":
            idat += self_png[at + 8:at + 8 + n]
        at += 12 + n
    return len(set(zlib.decompress(idat)))


class Dom(HTMLParser):
    """The elements of a page after the browser ran it: (tag, attributes, text)."""
    def __init__(self, html):
        super().__init__()
        self.elements, self.stack = [], []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.elements.append([tag, dict(attrs), ""])
        if tag not in ("rect", "i", "meta", "br"):
            self.stack.append(self.elements[-1])

    def handle_endtag(self, tag):
        while self.stack and self.stack[-1][0] != tag:
            self.stack.pop()
        if self.stack:
            self.stack.pop()

    def handle_data(self, data):
        for e in self.stack:
            e[2] += data

    def find(self, tag=None, **attrs):
        return [e for e in self.elements if (tag is None or e[0] == tag)
                and all(k in e[1] and (v is None or v in e[1][k].split() or v == e[1][k]) for k, v in attrs.items())]



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
        self.started = time.monotonic()

    def tearDown(self):
        self.tmp.cleanup()
        # Where the suite's time goes (ctest keeps this in its log).
        sys.stderr.write(f"[{self.id()} took {time.monotonic() - self.started:.1f} s] ")

    def path(self, name):
        return os.path.join(self.dir, name)

    # An example's verdict, for tests whose run_example(*args) returns its finished process.
    def expect_clean(self, taps, *args):
        """The example's run with ARGS passes every one of its `taps` taps; its process."""
        p = self.run_example(*args)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn(f"PASS: all {taps} taps pass", p.stdout)
        return p

    def expect_found(self, tap, *args):
        """The example's run with ARGS fails first at `tap`; its process."""
        p = self.run_example(*args)
        self.assertEqual(p.returncode, 1, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn(f"First divergence: tap '{tap}'", p.stdout)
        return p

    def run_cmd(self, args, json_name=None):
        proc = run_ended_gracefully(args, TIMEOUT)
        return Result(proc, self.path(json_name) if json_name else None)

    def run_example(self, script, *args):
        """(the finished process, its --out) of `python3 script --out <tmp>/<args> ARGS`: an example that
        found nothing (0) or a divergence (1); any other exit fails the test with its stderr."""
        out = self.path("-".join((os.path.basename(script),) + args).replace("--", ""))
        p = subprocess.run([sys.executable, script, "--out", out, *args], capture_output=True, text=True,
                           timeout=600, cwd=self.dir)
        self.assertIn(p.returncode, (0, 1), p.stderr[-3000:])
        return p, out

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

    def browse(self, page):
        """Loads the page in headless Chromium: (DOM after load, console/JS errors, screenshot path)."""
        shot = page + ".png"
        env = dict(os.environ, HOME=self.dir)
        dom = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, "--enable-logging=stderr", "--v=0", "--dump-dom",
                              "file://" + page], capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(dom.returncode, 0, dom.stderr)
        errors = [l for l in dom.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
        shot_run = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, "--screenshot=" + shot, "file://" + page],
                                  capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(shot_run.returncode, 0, shot_run.stderr)
        with open(shot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(shot), 10_000)  # not a blank page
        return Dom(dom.stdout), errors, shot

    def assertValidJUnit(self, path):
        """The file validates against tests/fixtures/junit/junit.xsd (what Jenkins and
        GitLab read) and has a <testsuites> root (some consumers need it)."""
        xsd = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "junit", "junit.xsd")
        res = subprocess.run(["xmllint", "--noout", "--schema", xsd, path], capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stderr)
        with open(path) as f:
            self.assertIn("<testsuites ", f.read(2000))
