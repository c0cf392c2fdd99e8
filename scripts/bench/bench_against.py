"""Run against run against run against reference, paired: two flux_tp runs
of one size on two meshes of one dp size (tp=4 and tp=2), then, alternating
K times, `diffcheck compare A` (A against the float64 reference in its run
file) and `diffcheck compare A --against B` (no reference: B laid out
globally). Prints both medians and the median of the paired ratios, and the
peak RSS of each (from wait4).

    /usr/bin/python3 scripts/bench/bench_against.py --exe build/diffcheck [--size default|flux1-dev] [-k 7]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1")


def timed(cmd):
    """(seconds, peak RSS MiB) of one run; its exit status must be 0."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)}: exit {os.waitstatus_to_exitcode(status)}: {p.stderr.read().decode()[-500:]}")
    return seconds, usage.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=shutil.which("diffcheck") or "build/diffcheck")
    ap.add_argument("--size", default="default")
    ap.add_argument("-k", type=int, default=7, help="paired rounds")
    ap.add_argument("--dir", help="where the two run files go (default: a temporary directory)")
    a = ap.parse_args()
    work = a.dir or tempfile.mkdtemp(prefix="diffcheck_bench_against_")
    runs = {}
    for name, mesh in (("a", "dp=1,tp=4"), ("b", "dp=1,tp=2")):
        runs[name] = os.path.join(work, f"{name}.h5")
        n = 4 if name == "a" else 2
        subprocess.run(["mpirun", "-n", str(n), a.exe, "--scenario", "flux_tp", "--size", a.size, "--mesh", mesh,
                        "--out", runs[name], "--reference-cache", "off"], env=ENV, check=True,
                       stdout=subprocess.DEVNULL)
    ref_cmd = [a.exe, "compare", runs["a"]]
    against_cmd = [a.exe, "compare", runs["a"], "--against", runs["b"]]
    rows = []
    for k in range(a.k):  # alternating order
        pair = (timed(ref_cmd), timed(against_cmd)) if k % 2 == 0 else tuple(reversed((timed(against_cmd),
                                                                                      timed(ref_cmd))))
        rows.append(pair)
    ref_s = [r[0][0] for r in rows]
    against_s = [r[1][0] for r in rows]
    print(f"flux_tp --size {a.size}: A on dp=1,tp=4, B on dp=1,tp=2; {a.k} paired rounds")
    print(f"  compare A (against its reference): median {statistics.median(ref_s):.3f} s, "
          f"peak RSS {max(r[0][1] for r in rows):.0f} MiB")
    print(f"  compare A --against B:             median {statistics.median(against_s):.3f} s, "
          f"peak RSS {max(r[1][1] for r in rows):.0f} MiB")
    ratios = [b / r for r, b in zip(ref_s, against_s)]
    print(f"  ratio against-run / against-reference: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
