"""Running diffcheck (or mpirun) as a child so that an interrupted parent
leaves nothing behind: the child is ended with SIGTERM first — mpirun then
ends its ranks, and each rank removes its partial files — and with SIGKILL
only when it has not gone `grace` seconds later. SIGTERM to the parent (a
batch scheduler, ctest's time limit) is taken as a Ctrl-C."""
import os
import signal
import subprocess


def _stop_like_ctrl_c(sig, frame):
    raise KeyboardInterrupt(f"signal {sig}")


def stop_on_sigterm_like_ctrl_c():
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)


def run_ended_gracefully(args, timeout=None, grace=10, **kwargs):
    """subprocess.run(args, capture_output=True, text=True, timeout=...), but
    the child runs in a session of its own (a Ctrl-C at the terminal reaches
    this process alone) and is ended gracefully when this one is interrupted
    or the time runs out."""
    # mpirun keeps this interpreter's SIGPIPE ignored (restore_signals=False): OpenMPI 4.1 can write a
    # late signal into its own closed signal pipe at the job's end, which at SIGPIPE's default kills
    # it after the job passed (tests/CMakeLists.txt, scripts/studies/mpi_teardown_loop.sh).
    if os.path.basename(str(args[0])) in ("mpirun", "mpiexec", "orterun"):
        kwargs.setdefault("restore_signals", False)
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL, start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


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
