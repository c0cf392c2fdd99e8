"""Interrupted runs leave nothing behind. SIGINT (Ctrl-C) and SIGTERM (a batch
scheduler) to mpirun while the ranks run the scenario, write the run file or
check it — rank 0 held there by --chaos hang@0 while the others wait in a
collective — at 1, 4 and 16 ranks (each phase, rank count and signal once by
default; every combination with DIFFCHECK_E2E_FULL=1): mpirun ends within
10 s with the documented status, rank 0's STOPPED line is printed once and names the phase, and no
FILE.tmp, watch directory, /dev/shm entry, OpenMPI session directory or
process is left; a run file of an earlier complete run is untouched. The same
after a crash (--chaos crash@3) and a hang ended by the watchdog; a run
without mpirun exits 130/143; an interrupted sweep-mesh leaves no trial's
files. A quick set of scripts/studies/interrupt_stress.py (random moments) too.

As root, the module runs in a mount namespace of its own with a private
/dev/shm, so that what other tests running beside it put there is not taken
for a leftover."""
import hashlib
import os
import signal
import subprocess
import sys
import time
import unittest

NS_FLAG = "DIFFCHECK_INTERRUPT_NS"
if os.geteuid() == 0 and os.environ.get(NS_FLAG) != "1":
    os.environ[NS_FLAG] = "1"
    again = ["-m", "unittest"] + sys.argv[1:] if "unittest" in sys.argv[0] else sys.argv
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable] + again)
if os.environ.get(NS_FLAG) == "1":
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", "/dev/shm"], check=True)

from e2e import EXE, MPIEXEC, SCRIPTS, E2ETest, live_processes  # noqa: E402

FULL = os.environ.get("DIFFCHECK_E2E_FULL") == "1"
MPIRUN_STATUS = 1  # what OpenMPI 4.1's mpirun returns for a job it ended on SIGINT/SIGTERM
PHASE_WORDS = {"scenario": "while running the scenario", "write": "while writing the run file",
               "check": "while checking the taps"}
CHAOS = {"scenario": "hang@0:after=attn/q", "write": "hang@0:during=write", "check": "hang@0:during=check"}


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Interrupt(E2ETest):
    def setUp(self):
        super().setUp()
        self.sessions = self.path("ompi-sessions")
        os.makedirs(self.sessions)
        self.env = dict(os.environ, OMPI_MCA_orte_tmpdir_base=self.sessions)
        self.out = self.path("out/run.h5")
        self.shm_before = set(os.listdir("/dev/shm"))

    def tearDown(self):
        if getattr(self, "log", None):
            self.log.close()
        super().tearDown()

    def start(self, cmd):
        if getattr(self, "log", None):
            self.log.close()
        self.log = open(self.path("log.txt"), "w+")
        return subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env, start_new_session=True)

    def output(self):
        self.log.flush()
        with open(self.path("log.txt")) as f:
            return f.read()

    def wait_for(self, text, proc, limit=120):
        t0 = time.monotonic()
        while text not in self.output():
            self.assertIsNone(proc.poll(), msg=f"ended before '{text}':\n{self.output()}")
            self.assertLess(time.monotonic() - t0, limit, msg=f"no '{text}' in:\n{self.output()}")
            time.sleep(0.05)

    def end_within(self, proc, limit=10):
        try:
            return proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.fail(f"did not end within {limit} s of the signal:\n{self.output()}")

    def assertNothingLeft(self, keep=(), sessions=True):
        out_dir = os.path.dirname(self.out)
        left = sorted(set(os.listdir(out_dir)) - set(keep)) if os.path.isdir(out_dir) else []
        self.assertEqual(left, [], msg=self.output())
        self.assertEqual(sorted(set(os.listdir("/dev/shm")) - self.shm_before), [], msg=self.output())
        if sessions:
            left = [os.path.join(r, f) for r, ds, fs in os.walk(self.sessions) for f in ds + fs]
            self.assertEqual(left, [], msg="OpenMPI session directory left:\n" + self.output())
        deadline = time.monotonic() + 5
        while True:
            procs = [cmd for _, cmd in live_processes() if self.out in cmd]
            if not procs or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(procs, [], msg=self.output())

    def interrupt(self, n, phase, sig, keep=()):
        os.makedirs(os.path.dirname(self.out), exist_ok=True)
        if phase == "check":  # the run file was written whole before the check began
            keep = ["run.h5"]
        proc = self.start([MPIEXEC, "-n", str(n), EXE, "--scenario", "dit_ulysses", "--timeout", "0",
                           "--chaos", CHAOS[phase], "--out", self.out])
        self.wait_for("--chaos:", proc)
        time.sleep(0.5)  # the other ranks reach the collective rank 0 is missing from
        if phase == "write":
            self.assertTrue(os.path.exists(self.out + ".tmp"), msg="the write had begun")
        proc.send_signal(sig)
        code = self.end_within(proc)
        text = self.output()
        self.assertEqual(code, MPIRUN_STATUS, msg=text)
        lines = [l for l in text.splitlines() if "STOPPED" in l]
        self.assertEqual(len(lines), 1, msg=text)
        self.assertIn("[rank 0]", lines[0])
        self.assertIn(PHASE_WORDS[phase], lines[0])
        self.assertIn("partial files removed, exit 143", lines[0])  # mpirun passes SIGINT on as SIGTERM
        self.assertNothingLeft(keep)

    def test_phases(self):
        cases = [(n, phase, sig) for n in (1, 4, 16) for phase in ("scenario", "write", "check")
                 for sig in (signal.SIGINT, signal.SIGTERM)]
        if not FULL:  # every phase, rank count and signal once (the suite's minutes are few)
            cases = [(16, "write", signal.SIGTERM), (4, "scenario", signal.SIGINT), (4, "check", signal.SIGTERM),
                     (1, "write", signal.SIGINT)]
        for n, phase, sig in cases:
            with self.subTest(n=n, phase=phase, signal=sig.name):
                self.out = self.path(f"{n}-{phase}-{sig.name}/run.h5")
                self.interrupt(n, phase, sig)

    def test_earlier_run_file_untouched(self):
        os.makedirs(os.path.dirname(self.out))
        res = self.run_cmd([MPIEXEC, "-n", "4", EXE, "--scenario", "dit_ulysses", "--out", self.out])
        self.assertExit(res, 0)
        before = digest(self.out)
        self.interrupt(4, "write", signal.SIGINT, keep=["run.h5"])
        self.assertEqual(digest(self.out), before)

    def test_without_mpirun(self):
        for sig, code, words in ((signal.SIGINT, 130, "STOPPED by SIGINT (Ctrl-C) while checking the taps"),
                                 (signal.SIGTERM, 143, "STOPPED by the launcher (SIGTERM) while checking")):
            with self.subTest(signal=sig.name):
                self.out = self.path(f"alone-{sig.name}/run.h5")
                os.makedirs(os.path.dirname(self.out), exist_ok=True)
                proc = self.start([EXE, "--scenario", "dit_ulysses", "--timeout", "0", "--chaos",
                                   "hang@0:during=check", "--out", self.out])
                self.wait_for("--chaos:", proc)
                proc.send_signal(sig)
                self.assertEqual(self.end_within(proc), code, msg=self.output())
                self.assertEqual(self.output().count("STOPPED"), 1, msg=self.output())
                self.assertIn(words, self.output())
                # Without mpirun OpenMPI's singleton start-up leaves session
                # directories of its own (a clean run too): not looked at.
                self.assertNothingLeft(keep=["run.h5"], sessions=False)

    def test_crash_and_hang_leave_nothing(self):
        for n, chaos, extra in ((4, "crash@3", []), (16 if FULL else 8, "hang@5", ["--timeout", "5"])):
            with self.subTest(chaos=chaos):
                self.out = self.path(f"{chaos}/run.h5")
                os.makedirs(os.path.dirname(self.out), exist_ok=True)
                proc = self.start([MPIEXEC, "-n", str(n), EXE, "--scenario", "dit_ulysses", "--chaos", chaos,
                                   "--out", self.out, *extra])
                self.assertNotEqual(self.end_within(proc, 60), 0, msg=self.output())
                self.assertIn("CRASH on rank 3" if chaos.startswith("crash") else "HANG:", self.output())
                self.assertNothingLeft()

    def test_interrupted_sweep_mesh_leaves_no_trial_files(self):
        work = self.path("work")
        os.makedirs(work)
        proc = self.start([EXE, "sweep-mesh", "--scenario", "dit_ulysses", "-n", "16", "--work-dir", work,
                           "--timeout", "60"])
        # A trial is under way once its ranks are past MPI's start-up (their
        # watch directory exists): a signal while mpirun is still launching
        # now and then crashes mpirun itself (OpenMPI 4.1's, see
        # interrupt_stress.py), leaving its session directory.
        t0 = time.monotonic()
        while not any(d.endswith(".watch") for _, ds, _ in os.walk(work) for d in ds):
            self.assertIsNone(proc.poll(), msg=self.output())
            self.assertLess(time.monotonic() - t0, 60)
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        self.assertEqual(self.end_within(proc, 20), 2, msg=self.output())
        self.assertIn("sweep-mesh: INTERRUPTED after", self.output())
        self.assertEqual(os.listdir(work), [], msg="the scratch directory and every trial file go")
        self.out = os.path.join(work, "x")  # no trial process, /dev/shm entry or session left
        self.assertNothingLeft()

    def test_random_moments(self):
        ranks, trials = ("1,4,16", "200") if FULL else ("4", "3")
        res = self.run_cmd([sys.executable, os.path.join(SCRIPTS, "studies", "interrupt_stress.py"), "--exe", EXE,
                            "--mpirun", MPIEXEC, "-n", ranks, "--trials", trials, "--no-namespace"])
        self.assertExit(res, 0)
        self.assertIn("0 with problems", res.out)


if __name__ == "__main__":
    unittest.main()
