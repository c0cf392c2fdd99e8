#!/usr/bin/env python3
"""Interrupts diffcheck runs at random moments and checks that nothing is left.

Each trial starts `mpirun -n N diffcheck --scenario S --out DIR/x.h5`, sends
SIGINT (a Ctrl-C at the terminal reaches mpirun alone: OpenMPI puts the ranks
in process groups of their own) or SIGTERM (a batch scheduler's time limit) to
mpirun at a random moment of the run, and then requires:
  - mpirun ends within --limit seconds (else: HUNG; its process tree is shown,
    then killed);
  - no process of the trial is left;
  - nothing is left in DIR but a complete run file (x.h5 when the run ended
    before the signal): no x.h5.tmp, no x.h5.watch;
  - no new entry in /dev/shm, no OpenMPI session directory left (unless
    mpirun itself crashed: OpenMPI 4.1's, counted apart);
  - rank 0's STOPPED line at most once, and once whenever the run had not
    reached its verdict.

As root the trials run in a private mount namespace with a /dev/shm of their
own (so a concurrent test's shared memory is not mistaken for a leftover);
otherwise (or with --no-namespace) /dev/shm is the machine's: run it alone.
OpenMPI's session directories go under the trial's directory
(orte_tmpdir_base), where what is left is seen.

    python3 scripts/studies/interrupt_stress.py --exe build/diffcheck -n 1,4,16 --trials 200
prints one line per trial and a summary; exit 0 when every trial was clean.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/: child_process
from child_process import live_processes  # noqa: E402


def mpi_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_execute_quiet="1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def enter_private_shm():
    """Re-runs this script in a mount namespace with a private /dev/shm."""
    if os.environ.get("DIFFCHECK_STRESS_NS") == "1":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", "/dev/shm"], check=True)
        return True
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    env = dict(os.environ, DIFFCHECK_STRESS_NS="1")
    cmd = ["unshare", "--mount", "--propagation", "private", sys.executable] + sys.argv
    # Our own SIGINT/SIGTERM go to the child, which cleans up and exits.
    proc = subprocess.Popen(cmd, env=env)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda sig, _: proc.send_signal(sig))
    sys.exit(proc.wait())


def descendants(pid):
    """Every live descendant of pid (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except OSError:
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def processes_naming(token):
    """Live (not zombie) processes other than this one whose command line contains token."""
    return [(p, cmd.strip()) for p, cmd in live_processes() if token in cmd and p != os.getpid()]


def describe_tree(pid):
    lines = []
    for p in [pid] + descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            with open(f"/proc/{p}/wchan") as f:
                wchan = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat.rsplit(")", 1)[1].split()[0]
        lines.append(f"    pid {p} {name} state {state} waiting in {wchan or '-'}")
    return "\n".join(lines)


def listing(path):
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def end_leftover_ranks(out):
    """Ranks outliving mpirun (those naming `out`): given a moment (they are
    being killed), then killed. Returns those that were still there."""
    deadline = time.monotonic() + 5
    left_procs = processes_naming(out)
    while left_procs and time.monotonic() < deadline:
        time.sleep(0.1)
        left_procs = processes_naming(out)
    for p, _ in left_procs:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return left_procs


def problems_of(args, hung, left_procs, left_files, new_shm, sessions, mpirun_crashed, stopped, ranks_running,
                verdict_out):
    """What one trial left behind or said wrongly, in words."""
    problems = []
    if hung:
        problems.append("mpirun did not end within {} s:\n{}".format(args.limit, hung))
    if left_procs:
        problems.append("processes left: " + "; ".join(f"{p} {c[:80]}" for p, c in left_procs))
    if left_files:
        problems.append("files left in the output directory: " + ", ".join(left_files))
    if new_shm:
        problems.append("new in /dev/shm: " + ", ".join(new_shm))
    # OpenMPI 4.1's mpirun now and then crashes (SIGSEGV in
    # PMIx_server_finalize) when a signal reaches it early in a job, a bare MPI
    # program too; its session directory is then its own leftover, not ours.
    if sessions and not mpirun_crashed:
        problems.append("OpenMPI session directories left: " + ", ".join(sessions))
    if stopped > 1:
        problems.append(f"STOPPED printed {stopped} times")
    if ranks_running and stopped == 0 and not verdict_out:
        problems.append("no STOPPED line and no verdict")
    return problems


def clean_up(session_base, out_dir, new_shm):
    for p in (session_base, out_dir):
        shutil.rmtree(p, ignore_errors=True)
    for name in new_shm:
        try:
            os.remove(os.path.join("/dev/shm", name))
        except OSError:
            pass


def run_once(args, n, work, delay, sig, env):
    out_dir = os.path.join(work, "out")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "x.h5")
    shm_before = listing("/dev/shm")
    session_base = os.path.join(work, "ompi")
    os.makedirs(session_base, exist_ok=True)
    env = dict(env, OMPI_MCA_orte_tmpdir_base=session_base)
    cmd = [args.mpirun, "-n", str(n), args.exe, "--scenario", args.scenario, "--out", out] + args.extra
    log = open(os.path.join(work, "log.txt"), "w+")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=delay)
        sent = None  # the run ended first
        ranks_running = False
    except subprocess.TimeoutExpired:
        # Whether the ranks were running (exec'd) when the signal left: before
        # that there is nobody to print a line.
        ranks_running = any(p != proc.pid for p, _ in processes_naming(out))
        os.kill(proc.pid, sig)
        sent = time.monotonic()
    hung = False
    try:
        proc.wait(timeout=args.limit)
    except subprocess.TimeoutExpired:
        hung = describe_tree(proc.pid)
        for p in descendants(proc.pid) + [proc.pid]:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
    ended = time.monotonic()
    left_procs = end_leftover_ranks(out)
    log.seek(0)
    text = log.read()
    log.close()
    left_files = sorted(x for x in listing(out_dir) if x != "x.h5")
    whole = "x.h5" in listing(out_dir)
    new_shm = sorted(listing("/dev/shm") - shm_before)
    sessions = sorted(listing(session_base))
    stopped = text.count("STOPPED")
    verdict_out = any(s in text for s in ("PASS:", "FAIL:", "First divergence", "CRASH", "HANG:"))
    mpirun_crashed = proc.returncode in (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT)
    problems = problems_of(args, hung, left_procs, left_files, new_shm, sessions, mpirun_crashed, stopped,
                           ranks_running, verdict_out)
    clean_up(session_base, out_dir, new_shm)
    return {
        "ranks": n, "signal": signal.Signals(sig).name, "delay_s": round(delay, 3),
        "signalled": sent is not None, "exit": proc.returncode,
        "end_s": round(ended - (sent or ended), 3), "run_s": round(ended - t0, 3),
        "ranks_running": ranks_running, "stopped_lines": stopped, "mpirun_crashed": mpirun_crashed, "whole_file": whole, "problems": problems,
        "output_tail": text.strip().splitlines()[-3:] if problems else [],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exe", default=shutil.which("diffcheck") or "diffcheck")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("-n", default="1,4,16", help="rank counts, comma-separated (taken in turn)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--signals", default="INT,TERM")
    ap.add_argument("--scenario", default="dit_ulysses")
    ap.add_argument("--limit", type=float, default=10.0, help="seconds mpirun may take to end after the signal")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write every trial's record here")
    ap.add_argument("--no-namespace", action="store_true", help="use the machine's /dev/shm even as root")
    ap.add_argument("extra", nargs="*", help="more diffcheck arguments (after --)")
    args = ap.parse_args()
    args.private = False if args.no_namespace else enter_private_shm()
    rng = random.Random(args.seed)
    ranks = [int(x) for x in args.n.split(",")]
    sigs = [getattr(signal, "SIG" + s.strip().upper().removeprefix("SIG")) for s in args.signals.split(",")]
    env = mpi_env()
    work = tempfile.mkdtemp(prefix="diffcheck-stress-")
    stop = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda sig, _: stop.append(sig))
    records = []
    try:
        # One clean run per rank count says how long a run takes: the signals
        # land uniformly over [0, 1.1 x that].
        length = {}
        for n in ranks:
            t0 = time.monotonic()
            r = run_once(args, n, work, 1e9, signal.SIGTERM, env)
            length[n] = time.monotonic() - t0
            print(f"clean run at {n} ranks: {length[n]:.2f} s, exit {r['exit']}"
                  + ("" if not r["problems"] else "; " + "; ".join(r["problems"])), flush=True)
        for i in range(args.trials):
            if stop:
                print("interrupted: stopping", flush=True)
                break
            n = ranks[i % len(ranks)]
            sig = sigs[(i // len(ranks)) % len(sigs)]
            delay = rng.uniform(0.0, 1.1 * length[n])
            r = run_once(args, n, work, delay, sig, env)
            records.append(r)
            status = "ok" if not r["problems"] else "PROBLEM: " + " | ".join(r["problems"])
            if r["mpirun_crashed"]:
                status += " (mpirun itself crashed: OpenMPI's, its session directory removed by this script)"
            print(f"[{i + 1}/{args.trials}] n={n} {r['signal']} at {r['delay_s']:.2f} s: exit {r['exit']}, "
                  f"ended {r['end_s']:.2f} s after, STOPPED x{r['stopped_lines']} {status}", flush=True)
            for line in r["output_tail"]:
                print("      | " + line)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r for r in records if r["problems"]]
    signalled = [r for r in records if r["signalled"]]
    slowest = max((r["end_s"] for r in signalled), default=0.0)
    crashed = sum(r["mpirun_crashed"] for r in records)
    print(f"interrupt_stress: {len(records)} trials ({len(signalled)} signalled before the end), "
          f"{len(bad)} with problems; slowest end after the signal {slowest:.2f} s; "
          f"mpirun itself crashed (OpenMPI) in {crashed}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trials": records, "problems": len(bad)}, f, indent=1)
    return 1 if bad or stop else 0


if __name__ == "__main__":
    sys.exit(main())
