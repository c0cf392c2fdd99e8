"""Process faults of the code under test (--chaos) at 4 and 16 ranks: a crash
leaves one line naming the rank, signal, last collective and last tap; a hang
ends at the watchdog's limit with the collective each rank is in; a desynced
collective is named; a rank that works while the others wait is no hang. Each exits 1 in bounded time and leaves no rank behind;
a clean run leaves no watchdog files."""
import os
import shutil
import time

from e2e import EXE, MPIEXEC, E2ETest, live_processes

TIMEOUT = 5


def ranks_alive(out_path):
    """diffcheck processes of this test (their command line names its run file)."""
    return [cmd for _, cmd in live_processes()
            if out_path in cmd and "diffcheck" in cmd and not cmd.startswith(MPIEXEC)]


class Chaos(E2ETest):
    def chaos(self, n, fault, scenario="dit_ulysses"):
        t0 = time.monotonic()
        res = self.run_cmd([MPIEXEC, "-n", str(n), EXE, "--scenario", scenario, "--timeout", str(TIMEOUT),
                            "--chaos", fault, "--out", self.path("run.h5")])
        elapsed = time.monotonic() - t0
        self.assertExit(res, 1)
        self.assertLess(elapsed, TIMEOUT + 15, msg=str(res))
        time.sleep(0.5)
        self.assertEqual(ranks_alive(self.path("run.h5")), [])
        self.assertFalse(os.path.exists(self.path("run.h5")), "no run file from a failed run")
        return res

    def test_crash(self):
        for n in (4, 16):
            with self.subTest(n=n):
                res = self.chaos(n, f"crash@{n - 1}:after=attn/k")
                line = [l for l in res.err.splitlines() if "CRASH on rank" in l]
                self.assertEqual(len(line), 1, msg=str(res))
                self.assertIn(f"CRASH on rank {n - 1}: signal 11 (SIGSEGV)", line[0])
                self.assertIn("last tap 'attn/k'", line[0])
                self.assertIn("last collective #", line[0])

    def test_hang(self):
        for n in (4, 16):
            with self.subTest(n=n):
                res = self.chaos(n, "hang@1")
                self.assertIn("HANG: no progress for", res.err, msg=str(res))
                self.assertRegex(res.err, r"rank 1 never entered collective #\d+ \(\w+ on '\w+'\)")
                others = "0,2-3" if n == 4 else "0,2-15"
                self.assertIn(f"ranks {others} wait in collective #", res.err)
                self.assertEqual(res.err.count("HANG: no progress"), 1)

    def test_desync(self):
        for n in (4, 16):
            with self.subTest(n=n):
                res = self.chaos(n, "desync@2", scenario="timestep_broadcast")
                self.assertTrue("DESYNC" in res.err or "HANG" in res.err, msg=str(res))

    def test_a_rank_that_works_while_the_others_wait_is_no_hang(self):
        # Rank 0 works for 3 s as the check starts (progress, no collective),
        # as it does when it checks a large run file alone, while the others
        # wait for its verdict twice as long as --timeout: the run ends
        # normally. (The watchdog used to let any rank that waited that long
        # report a hang, the working one notwithstanding.)
        for n in (4, 16):
            with self.subTest(n=n):
                res = self.run_cmd([MPIEXEC, "-n", str(n), EXE, "--scenario", "timestep_broadcast", "--timeout",
                                    "1.5", "--chaos", "slow@0:during=check", "--out", self.path("run.h5")])
                self.assertExit(res, 0)
                self.assertNotIn("HANG", res.err)
                self.assertIn("--chaos: slow@0:during=check", res.err, msg="the slow rank was injected")

    def just_under_the_run_file(self, scenario):
        """KiB of whole pages just under the size of `scenario`'s run file at 2 ranks (--store mpiio): a
        disk that size (a private tmpfs: skipped without root and unshare) cannot hold it."""
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root and unshare for a private tmpfs")
        sized = self.mpirun(2, "--scenario", scenario, "--store", "mpiio", json=False)
        self.assertExit(sized, 0)
        return (os.path.getsize(self.path("run.h5")) - 1) // 4096 * 4

    def test_full_disk_is_an_error_and_leaves_no_file(self):
        # A small run file is gathered to rank 0 (--store auto); --store mpiio
        # and pwrite have every rank write. The file's size, learnt from a run elsewhere,
        # sets the disk's: 300 KiB fills it in the writes (the check for room
        # skipped: a disk another program fills meanwhile), a disk just under
        # the file is refused before writing — with MPI-IO that disk filled
        # inside HDF5's closing metadata writes, whose collectives then hung
        # (exit 1, HANG, after the 20 s watchdog).
        size_k = self.just_under_the_run_file("timestep_broadcast")
        for store, size, room_check in (("auto", "300k", False), ("mpiio", "300k", False), ("pwrite", "300k", False),
                                        ("mpiio", f"{size_k}k", True), ("auto", f"{size_k}k", True)):
            with self.subTest(store=store, size=size):
                full = self.path(f"full_{store}_{size}")
                os.mkdir(full)
                listing = self.path(f"listing_{store}_{size}")
                env = "" if room_check else "DIFFCHECK_NO_ROOM_CHECK=1 "
                script = (f"mount -t tmpfs -o size={size} tmpfs {full} && "
                          f"{env}{MPIEXEC} -n 2 {EXE} --scenario timestep_broadcast --timeout 20 --store {store} "
                          f"--out {full}/run.h5; code=$?; ls {full} > {listing}; umount {full}; exit $code")
                t0 = time.monotonic()
                res = self.run_cmd(["unshare", "-m", "sh", "-c", script])
                self.assertExit(res, 2)
                self.assertLess(time.monotonic() - t0, 20, msg="a write error must not hang the job")
                self.assertIn("nothing was written to", res.err)
                # The system's words, not HDF5's dump of descriptors and buffers.
                self.assertNotIn("file descriptor =", res.err)
                if room_check:
                    self.assertIn("no room for the run file", res.err)
                if store != "mpiio" or room_check:
                    # Every rank agreed on the error: one message, a clean
                    # end, no rank stopped by the launcher. (A failed MPI-IO
                    # write ends the job from the rank that saw it, since
                    # the others may be inside the same collective: each
                    # rank that saw one says so, and one still writing may
                    # be stopped by the launcher.)
                    self.assertNotIn("STOPPED", res.err)
                    self.assertEqual(res.err.count("nothing was written to"), 1, res.err)
                with open(listing) as f:
                    names = f.read().split()
                # Nothing left behind: no file, no temporary, no watchdog directory.
                self.assertEqual(names, [], names)

    def test_no_room_counts_the_taps_unless_begun(self):
        # flux_tp says when its taps are recorded; with the gather limit at 0
        # its taps are "large", but --store mpiio writes nothing beside the
        # reference: the check for room must still count them (it once took
        # them for written already, and a disk just under the file went
        # unrefused into MPI-IO's writes).
        size_k = self.just_under_the_run_file("flux_tp")
        full = self.path("full")
        os.mkdir(full)
        script = (f"mount -t tmpfs -o size={size_k}k tmpfs {full} && DIFFCHECK_GATHER_MAX_MIB=0 "
                  f"{MPIEXEC} -x DIFFCHECK_GATHER_MAX_MIB -n 2 {EXE} --scenario flux_tp --timeout 20 --store mpiio "
                  f"--out {full}/run.h5; code=$?; umount {full}; exit $code")
        res = self.run_cmd(["unshare", "-m", "sh", "-c", script])
        self.assertExit(res, 2)
        self.assertIn("no room for the run file", res.err)

    def test_bad_chaos_is_a_usage_error(self):
        res = self.run_cmd([MPIEXEC, "-n", "2", EXE, "--scenario", "timestep_broadcast", "--chaos", "crash@7",
                            "--out", self.path("run.h5")])
        self.assertExit(res, 2)
        self.assertIn("--chaos", res.err)

    def test_clean_run_leaves_no_watchdog_files(self):
        res = self.mpirun(4, "--scenario", "timestep_broadcast", json=False)
        self.assertExit(res, 0)
        self.assertEqual(sorted(os.listdir(self.dir)), ["run.h5"])


if __name__ == "__main__":
    import unittest
    unittest.main()
