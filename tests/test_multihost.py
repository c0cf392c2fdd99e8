"""diffcheck across hosts: hosts h1..hN made of Linux namespaces on this machine
(tests/multihost/rig.sh: own network, hostname, IPC + /dev/shm and /tmp per
host; one shared directory), OpenMPI reaching them through an rsh agent.

Quick set (the default suite): the rig really separates hosts; flux_tp and
timestep_broadcast at 16 ranks over 2 hosts give the single-host report, with
the output directory node-local (run file gathered to rank 0's host, whole)
and shared (MPI-IO); --store mpiio on node-local storage is refused; a
sweep-mesh across hosts; a killed host ends the run in bounded time with
nothing left running; dct.watch names the host of the rank gone wrong. DIFFCHECK_MULTIHOST_FULL=1 (ctest -L multihost) adds
every scenario clean and faulted over 2 and 4 hosts, the whole sweep-mesh and
a bisect across hosts.

Skipped, with the reason, where namespaces cannot be made (not root)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from e2e import EXE, live_processes

HERE = os.path.dirname(os.path.abspath(__file__))
RIG = os.path.join(HERE, "multihost", "rig.sh")
FULL = os.environ.get("DIFFCHECK_MULTIHOST_FULL") == "1"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_orte_execute_quiet": "1",
           "OPENBLAS_NUM_THREADS": "1"}


def rig_unavailable():
    if os.geteuid() != 0:
        return "needs root to make network, UTS, IPC and mount namespaces"
    probe = subprocess.run(["ip", "netns", "add", f"dcprobe{os.getpid()}"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"dcprobe{os.getpid()}"], capture_output=True)
    return None


class Rig:
    """N hosts; torn down on exit, on failure and on SIGTERM/SIGINT."""
    def __init__(self, n):
        self.dir = f"/run/diffcheck-rig-{os.getpid()}-{n}"
        self.n = n
        subprocess.run(["bash", RIG, "down", self.dir], capture_output=True)
        # The checkout and the executable stay visible on every host (a shared
        # home), whatever else of /tmp each host has of its own.
        keep = [os.path.dirname(HERE), os.path.dirname(os.path.realpath(shutil.which(EXE) or EXE))]
        up = subprocess.run(["bash", RIG, "up", self.dir, str(n), *keep], capture_output=True, text=True)
        if up.returncode != 0:
            self.down()
            raise RuntimeError(f"rig up failed: {up.stderr}")
        self.env = dict(MPI_ENV)
        with open(os.path.join(self.dir, "mca.env")) as f:
            for line in f:
                if line.startswith("export "):
                    k, v = line[len("export "):].strip().split("=", 1)
                    self.env[k] = v
        self.shared = os.path.join(self.dir, "shared")

    def hosts(self, per_host):
        return ",".join(f"h{i}:{per_host}" for i in range(1, self.n + 1))

    def run(self, host, args, timeout=600):
        """Runs args on `host` (a login node), the rig's MPI settings in its environment."""
        env_args = [f"{k}={v}" for k, v in self.env.items()]
        t0 = time.monotonic()
        p = subprocess.run(["bash", RIG, "exec", self.dir, host, "env", *env_args, *args],
                           capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        p.seconds = time.monotonic() - t0
        return p

    def down(self):
        subprocess.run(["bash", RIG, "down", self.dir], capture_output=True)


def strip(report):
    report = dict(report)
    for k in ("timings", "source", "reference_source", "profile"):
        report.pop(k, None)
    return report


class MultiHost(unittest.TestCase):
    rigs = {}

    @classmethod
    def setUpClass(cls):
        why = rig_unavailable()
        if why:
            raise unittest.SkipTest(f"multihost rig: {why}")
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(sig, frame):
            cls.tearDownClass()
            signal.signal(sig, previous[sig])
            os.kill(os.getpid(), sig)
        for s in previous:
            signal.signal(s, on_signal)
        cls.rigs[2] = Rig(2)
        if FULL:
            cls.rigs[4] = Rig(4)

    @classmethod
    def tearDownClass(cls):
        for rig in cls.rigs.values():
            rig.down()
        cls.rigs = {}

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="diffcheck_mh_")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def single_host(self, args):
        """The same run on this machine alone, its JSON report."""
        json_path = os.path.join(self.dir, "one.json")
        p = subprocess.run(["mpirun", "-n", "16", EXE, *args, "--out", os.path.join(self.dir, "one.h5"),
                            "--json", json_path], capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                           timeout=600, stdin=subprocess.DEVNULL)
        self.assertIn(p.returncode, (0, 1), p.stderr)
        with open(json_path) as f:
            return p.returncode, json.load(f)

    def across(self, rig, args, out_dir, per_host=None):
        """mpirun from h1 over every host; the report JSON read back on h1 (or shared)."""
        per_host = per_host or 16 // rig.n
        out = os.path.join(out_dir, "run.h5")
        js = os.path.join(out_dir, "report.json")
        p = rig.run("h1", ["mpirun", "--host", rig.hosts(per_host), "-n", "16", EXE, *args, "--out", out,
                           "--json", js])
        cat = rig.run("h1", ["cat", js])
        report = json.loads(cat.stdout) if cat.returncode == 0 else None
        return p, report, out

    def check_matches(self, rig, args, out_dir):
        code, one = self.single_host(args)
        p, report, out = self.across(rig, args, out_dir)
        self.assertEqual(p.returncode, code, p.stdout + p.stderr)
        self.assertIsNotNone(report, p.stdout + p.stderr)
        self.assertEqual(strip(report), strip(one), f"{args} across {rig.n} hosts")
        # The run file is whole where rank 0 wrote it: compare gives the same report.
        cmp_json = os.path.join(out_dir, "cmp.json")
        c = rig.run("h1", [EXE, "compare", out, "--json", cmp_json])
        self.assertEqual(c.returncode, code, c.stdout + c.stderr)
        self.assertEqual(strip(json.loads(rig.run("h1", ["cat", cmp_json]).stdout)), strip(one))
        return p

    def test_rig_separates_hosts(self):
        rig = self.rigs[2]
        p = rig.run("h1", ["mpirun", "--host", rig.hosts(2), "-n", "4", "hostname"])
        self.assertEqual(sorted(p.stdout.split()), ["h1", "h1", "h2", "h2"], p.stderr)
        # Shared memory does not span hosts: with only the shared-memory
        # transport, ranks on two hosts cannot reach each other; on one they can.
        only_shm = ["mpirun", "--mca", "btl", "self,vader", "-n", "2", EXE, "--scenario", "timestep_broadcast",
                    "--out", "/tmp/shm/run.h5"]
        one = rig.run("h1", only_shm[:1] + ["--host", "h1:2"] + only_shm[1:], timeout=120)
        self.assertEqual(one.returncode, 0, one.stdout + one.stderr)
        two = rig.run("h1", only_shm[:1] + ["--host", "h1:1,h2:1"] + only_shm[1:], timeout=120)
        self.assertNotEqual(two.returncode, 0, two.stdout + two.stderr)
        # Each host has its own /tmp and /dev/shm.
        rig.run("h1", ["sh", "-c", "echo h1 > /tmp/mine; echo h1 > /dev/shm/mine"])
        self.assertNotEqual(rig.run("h2", ["cat", "/tmp/mine"]).returncode, 0)
        self.assertNotEqual(rig.run("h2", ["cat", "/dev/shm/mine"]).returncode, 0)

    def test_node_local_output_is_gathered_whole(self):
        rig = self.rigs[2]
        for fault in ([], ["--inject", "proj_out_contiguous"]):
            self.check_matches(rig, ["--scenario", "flux_tp", *fault], "/tmp/mh_local")
        self.assertIn("NOT shared by all ranks: run file written by rank 0", self.log_line(rig))
        # Nothing of the run file on the other host; no watch directory left on either.
        self.assertNotEqual(rig.run("h2", ["test", "-e", "/tmp/mh_local/run.h5"]).returncode, 0)
        for h in ("h1", "h2"):
            self.assertNotEqual(rig.run(h, ["test", "-e", "/tmp/mh_local/run.h5.watch"]).returncode, 0, h)

    def log_line(self, rig):
        p = rig.run("h1", ["env", "DIFFCHECK_LOG=info", "mpirun", "--host", rig.hosts(1), "-n", "2", EXE,
                           "--scenario", "timestep_broadcast", "--out", "/tmp/mh_log/run.h5"])
        return p.stderr

    def test_shared_output_uses_mpiio(self):
        rig = self.rigs[2]
        out_dir = os.path.join(rig.shared, "mh_shared")
        self.check_matches(rig, ["--scenario", "timestep_broadcast", "--inject", "timestep_temp_broadcast",
                                 "--store", "mpiio"], out_dir)
        log = ["mpirun", "--host", rig.hosts(8), "-n", "16", EXE, "--scenario", "timestep_broadcast",
               "--out", os.path.join(out_dir, "log.h5")]
        # --store auto: MPI-IO for a run file above DIFFCHECK_GATHER_MAX_MIB, rank 0 for a small one.
        p = rig.run("h1", ["env", "DIFFCHECK_LOG=info", "DIFFCHECK_GATHER_MAX_MIB=0", *log])
        self.assertIn("shared by all ranks: run file written with MPI-IO", p.stderr)
        p = rig.run("h1", ["env", "DIFFCHECK_LOG=info", *log])
        self.assertIn("shared by all ranks: run file written by rank 0", p.stderr)
        self.assertIn("at most DIFFCHECK_GATHER_MAX_MIB: gathered", p.stderr)
        # --store pwrite (each rank at its offsets, through its own page
        # cache for a page's shared ends) is for one host only.
        p = rig.run("h1", [*log, "--store", "pwrite"])
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("--store pwrite needs every rank on one host", p.stdout + p.stderr)

    def test_mpiio_on_node_local_storage_is_refused(self):
        rig = self.rigs[2]
        p = rig.run("h1", ["mpirun", "--host", rig.hosts(8), "-n", "16", EXE, "--scenario", "flux_tp",
                           "--store", "mpiio", "--out", "/tmp/mh_refused/run.h5"], timeout=120)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("not shared by all ranks", p.stdout + p.stderr)
        self.assertNotEqual(rig.run("h1", ["test", "-e", "/tmp/mh_refused/run.h5"]).returncode, 0)

    def test_sweep_mesh_across_hosts(self):
        rig = self.rigs[2]
        meshes = [] if FULL else ["--mesh", "dp=2,fsdp=2,sp=2,tp=2", "--mesh", "dp=4,fsdp=1,sp=2,tp=2"]
        p = rig.run("h1", [EXE, "sweep-mesh", "--scenario", "unreduced_reshard", "-n", "16", "--inject",
                           "skip_unreduced_allreduce", "--launcher", f"mpirun --host {rig.hosts(8)} -n {{n}}",
                           "--json", "/tmp/mh_sweep.json", *meshes])
        self.assertIn("every mesh as documented", p.stdout, p.stdout + p.stderr)
        rows = json.loads(rig.run("h1", ["cat", "/tmp/mh_sweep.json"]).stdout)["rows"]
        ran = [r for r in rows if r["verdict"] in ("PASS", "FAIL")]
        self.assertTrue(ran)
        for r in ran:  # only dp = 2 fails
            self.assertEqual(r["verdict"] == "FAIL", r["mesh"].startswith("dp=2,"), r)

    @unittest.skipUnless(FULL, "DIFFCHECK_MULTIHOST_FULL=1 (ctest -L multihost)")
    def test_bisect_across_hosts(self):
        rig = self.rigs[2]
        p = rig.run("h1", [EXE, "bisect", "--scenario", "dit_ulysses", "-n", "4", "--inject", "a2a_read_before_wait",
                           "--flags", "async_a2a,overlap,fuse_qkv_a2a", "--launcher",
                           f"mpirun --host {rig.hosts(2)} -n {{n}}", "--json", "/tmp/mh_bisect.json"])
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        result = json.loads(rig.run("h1", ["cat", "/tmp/mh_bisect.json"]).stdout)
        self.assertEqual(sorted(result["minimal"]), ["async_a2a", "overlap"], p.stdout)

    def test_killed_host(self):
        """All of h2's processes killed mid-run: the run ends in bounded time;
        mpirun names the lost host, rank 0 the ranks each host ran; nothing is
        left running on h1. The exit status is mpirun's own for a lost daemon
        (205 in OpenMPI 4.1): it ends the job before any rank can choose one."""
        rig = self.rigs[2]
        env = dict(rig.env, OMPI_MCA_orte_execute_quiet="0")  # mpirun's own words about the lost daemon
        cmd = ["bash", RIG, "exec", rig.dir, "h1", "env", *[f"{k}={v}" for k, v in env.items()],
               "mpirun", "--host", rig.hosts(8), "-n", "16", EXE, "--scenario", "flux_tp",
               "--chaos", "hang@3", "--timeout", "300", "--out", "/tmp/mh_kill/run.h5"]
        log = open(os.path.join(self.dir, "kill.log"), "w+")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
        # Wait until the run is under way (rank 3 hangs after its first tap, the
        # others wait for it), then kill every process of h2 (its holder stays).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with open(log.name) as f:
                if "--chaos: hang@3" in f.read():
                    break
            time.sleep(0.5)
        time.sleep(2)
        t0 = time.monotonic()
        for pid, cmdline in self.host_pids(rig, "h2"):
            if "sleep infinity" not in cmdline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            self.fail("the run did not end within 120 s of the host's death")
        with open(log.name) as f:
            out, err = f.read(), ""
        log.close()
        ended = time.monotonic() - t0
        self.assertLess(ended, 60)
        self.assertNotEqual(proc.returncode, 0, out + err)
        self.assertRegex(out + err, r"Remote daemon: .* on node h2")
        self.assertIn("STOPPED by the launcher", out + err)
        self.assertIn("ranks by host: h1: 0-7; h2: 8-15", out + err)
        time.sleep(1)
        left = [p for p in self.host_pids(rig, "h1") if "diffcheck" in p[1] or "mpirun" in p[1] or "orted" in p[1]]
        self.assertEqual(left, [], left)

    def host_pids(self, rig, host):
        with open(os.path.join(rig.dir, "netns")) as f:
            ns = f.read().split()[int(host[1:]) - 1]
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        cmds = dict(live_processes())
        return [(int(p), cmds.get(int(p), "")) for p in pids if int(p) in cmds]

    def test_watch_names_the_host(self):
        """dct.watch over 2 hosts (examples/watch_train.py, 2 gloo ranks each,
        torch's env:// rendezvous at h1): one bit flipped on rank 3 is named
        with its host, h2; the pieces are compared from the shared directory.
        Nightly: a gradient all-reduce across the hosts left out by one group."""
        try:
            import torch  # noqa: F401  # the ranks run this interpreter
        except ImportError:
            self.skipTest("no torch in this interpreter (scripts/torch_env.sh)")
        rig = self.rigs[2]
        bugs = ["bit_flip"] + (["allreduce_skipped"] if FULL else [])
        for bug in bugs:
            with self.subTest(bug=bug):
                out = os.path.join(rig.shared, f"mh_watch_{bug}")
                ranks = []
                for r in range(4):
                    env = dict(PYTHONPATH=os.path.join(os.path.dirname(HERE), "python"), RANK=str(r), WORLD_SIZE="4",
                               MASTER_ADDR="h1", MASTER_PORT="29611", GLOO_SOCKET_IFNAME="eth0",
                               DIFFCHECK_EXE=os.path.realpath(shutil.which(EXE) or EXE))
                    cmd = ["bash", RIG, "exec", rig.dir, f"h{1 + r // 2}", "env",
                           *[f"{k}={v}" for k, v in env.items()], sys.executable,
                           os.path.join(os.path.dirname(HERE), "examples", "watch_train.py"), "--bug", bug,
                           "--out", out]
                    ranks.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                  stdin=subprocess.DEVNULL))
                try:
                    logs = [p.communicate(timeout=300)[0] for p in ranks]
                finally:
                    for p in ranks:
                        p.kill()
                self.assertEqual(ranks[0].returncode, 1, "\n".join(logs))
                if bug == "bit_flip":
                    self.assertIn("param/1.weight: rank 3 (h2) is the odd one out in replica group [0, 1, 2, 3]",
                                  logs[0])
                    self.assertIn("between rank 0 and rank 3 at local index [0,7]", logs[0])
                else:  # within each host the all-reduce ran; across them ranks 1 and 3 each kept their host's sum
                    self.assertIn("param_grad/0.weight: rank 1 (h1), rank 3 (h2) are the odd ones out", logs[0])

    @unittest.skipUnless(FULL, "DIFFCHECK_MULTIHOST_FULL=1 (ctest -L multihost)")
    def test_every_scenario_over_2_and_4_hosts(self):
        listing = json.loads(subprocess.run([EXE, "list", "--json"], capture_output=True, text=True).stdout)
        for n in (2, 4):
            for s in listing:
                for fault in [None] + s["faults"]:
                    args = ["--scenario", s["name"]]
                    if fault:
                        args += ["--inject", fault["name"]]
                        for f in fault["needs_flags"]:
                            args += ["--flag", f]
                    with self.subTest(hosts=n, args=args):
                        if fault and fault["name"] == "lse_layout":
                            p, _, _ = self.across(self.rigs[n], args, "/tmp/mh_all")
                            self.assertEqual(p.returncode, 1, p.stderr)
                            self.assertIn("CRASH", p.stdout + p.stderr)
                            continue
                        self.check_matches(self.rigs[n], args, "/tmp/mh_all")


if __name__ == "__main__":
    unittest.main()
