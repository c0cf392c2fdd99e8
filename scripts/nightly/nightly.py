#!/usr/bin/python3
"""The nightly regression matrix (run through scripts/nightly.sh).

Every scenario x every mesh of N ranks its size allows x float32/bfloat16 x
every combination of its flags' matrix values must PASS; every fault, armed
with the flags it needs, must fail at its documented first tap on the meshes
where it takes effect and pass on the others (`diffcheck list` documents both).
Each cell is one `diffcheck sweep-mesh --mesh M` (a child mpirun with a time
limit; a crash or hang is a cell, not the end of the night).

Writes OUT/<date>/: summary.json, junit.xml, index.html (the matrix as a
heatmap; failing cells link their run report) and cells/ (each cell's run
report, JSON and HTML). The drift table compares the largest err/tol per
scenario/tap/dtype of the clean cells with the previous night's summary
(changes above 2x flagged) and lists new failures first.

Resumable: a killed night re-run with the same --date skips finished cells.
Exit 0: every cell as expected; 1: a false positive, a missed fault, a fault
caught at another tap, a crash or a time-out; 2: the matrix could not be run.

For testing the nightly itself, DIFFCHECK_NIGHTLY_INJECT="scenario:fault[,...]"
injects that fault into the scenario's clean cells: a regression it must catch.
"""
import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))  # scripts/nightly/: the night's modules
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # and scripts/: child_process
from child_process import run_ended_gracefully, stop_on_sigterm_like_ctrl_c  # noqa: E402
from nightly_report import (cell_id, fmt_num, json_load_numbers, json_safe, outcome, write_atomic,  # noqa: E402
                            write_index, write_junit)
from nightly_plan import flag_text, injected_regressions, plan, run_json, slug  # noqa: E402
from nightly_drift import cell_key, drift, find_previous, tap_ratios  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))



def parse_args():
    p = argparse.ArgumentParser(
        prog="nightly.sh", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Environment: DIFFCHECK_NIGHTLY_INJECT=scenario:fault[,...] injects a fault into the clean "
               "cells of a scenario (to test that the nightly catches a regression).")
    p.add_argument("--quick", action="store_true",
                   help="the trimmed matrix for CI: float32, each scenario's default mesh, flags all default and "
                        "all at their last matrix value, every fault")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "nightly"),
                   help="directory of the nights (default results/nightly)")
    p.add_argument("--date", default=datetime.date.today().isoformat(),
                   help="the night's name (default today); re-running a night resumes it")
    p.add_argument("--previous", help="summary.json (or its night directory) to compare with; default: the "
                                      "latest earlier night under --out")
    p.add_argument("--scenario", action="append", help="only this scenario (repeatable)")
    p.add_argument("-n", type=int, default=16, help="ranks per run (default 16)")
    p.add_argument("--timeout", type=float, default=300, help="time limit per cell, seconds (default 300)")
    p.add_argument("--diffcheck", help="the diffcheck executable (default: $DIFFCHECK_EXE, build/diffcheck, PATH)")
    p.add_argument("--tolerance", choices=["derived", "calibrated"], default="derived",
                   help="the cells' tolerances: the derived rule (default), or calibrated: one `diffcheck calibrate` "
                        "per scenario, dtype and flag variant on --calibration-seed, its file used by every mesh "
                        "and fault of that variant (docs/tolerances.md)")
    p.add_argument("--calibration-seed", type=int, default=1, help="seed of the calibrations (runs use 1234)")
    return p.parse_args()


def find_diffcheck(given):
    for c in (given, os.environ.get("DIFFCHECK_EXE"), os.path.join(ROOT, "build", "diffcheck"),
              shutil.which("diffcheck")):
        if c and os.access(c, os.X_OK):
            return os.path.abspath(c)
    sys.exit("nightly: no diffcheck executable (build it, or give --diffcheck PATH)")


# ---------------------------------------------------------------- one cell

def calibration(exe, cell, night, args):
    """The tolerance file of the cell's scenario, dtype, size and flags, made
    once per night (`diffcheck calibrate` on the calibration seed)."""
    d = os.path.join(night, "calibration")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, slug(f"{cell['scenario']} {cell['dtype']} {cell.get('size') or 'default'} "
                                f"{flag_text(cell['flags'])}") + ".json")
    if not os.path.exists(path):
        cmd = [exe, "calibrate", "--scenario", cell["scenario"], "--dtype", cell["dtype"], "-n", "2",
               "--seed", str(args.calibration_seed), "-o", path]
        if cell.get("size"):
            cmd += ["--size", cell["size"]]
        for f in cell["flags"]:
            cmd += ["--flag", f]
        res = run_ended_gracefully(cmd)
        if res.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    return path


# Seconds without progress after which a cell's run is a HANG (DIFFCHECK_TIMEOUT overrides).
CELL_WATCHDOG_S = 20


def run_cell(exe, cell, night, args, regressions):
    cell["tolerance"] = args.tolerance
    d = os.path.join(night, cell["dir"])
    os.makedirs(d, exist_ok=True)
    sweep_json = os.path.join(d, cell["stem"] + ".sweep.json")
    cmd = [exe, "sweep-mesh", "--scenario", cell["scenario"], "-n", str(args.n), "--mesh", cell["mesh"],
           "--dtype", cell["dtype"], "--timeout", str(args.timeout), "--reports", d, "--json", sweep_json]
    for f in cell["flags"]:
        cmd += ["--flag", f]
    if cell.get("size"):
        cmd += ["--size", cell["size"]]
    if args.tolerance == "calibrated":
        try:
            cmd += ["--tolerances", calibration(exe, cell, night, args)]
        except RuntimeError as err:
            cell.update(verdict="ERROR", first_tap="-", expected="PASS" if cell["kind"] == "clean" else "?",
                        ok=False, detail=str(err), seconds=0.0)
            return cell
    fault = cell["fault"]
    if cell["kind"] == "clean" and cell["scenario"] in regressions:
        fault = regressions[cell["scenario"]]
        cell["injected_for_testing"] = fault
    if fault:
        cmd += ["--inject", fault]
    t0 = time.monotonic()
    try:
        # Interrupted, the night ends its running sweep gracefully: no trial's
        # run file, watch directory or shared memory stays behind.
        # A cell whose ranks hang (a fault that splits their paths) is a finding
        # the run's watchdog names after CELL_WATCHDOG_S without progress. A
        # healthy cell makes progress many times a second and ends within 6 s
        # (the slowest of a full night on 2 cores: 5.6 s); the 22 hanging cells
        # of a night cost 22 x the limit (60 s made them 23 of the night's minutes).
        res = run_ended_gracefully(cmd, env=dict(os.environ, DIFFCHECK_TIMEOUT=os.environ.get("DIFFCHECK_TIMEOUT",
                                                                                             str(CELL_WATCHDOG_S))))
    except OSError as err:  # e.g. the executable being rebuilt under us
        res = subprocess.CompletedProcess(cmd, 127, "", f"cannot start {exe}: {err}")
    cell["seconds"] = round(time.monotonic() - t0, 2)
    row = None
    try:
        with open(sweep_json) as f:
            row = json.load(f)["rows"][0]
    except (OSError, ValueError, IndexError, KeyError):
        pass
    if row is None:
        cell.update(verdict="ERROR", first_tap="-", expected="PASS" if cell["kind"] == "clean" else "?",
                    ok=False, detail=(res.stderr.strip().splitlines() or [f"sweep-mesh exited {res.returncode}"])[-1])
        return cell
    cell["verdict"] = row["verdict"]
    cell["first_tap"] = row["first_divergence"]
    cell["detail"] = row["detail"]
    cell["run_seconds"] = row["seconds"]
    if cell["kind"] == "fault":
        cell["expected"] = row["expected"]
        cell["ok"] = bool(row["as_expected"])
    else:
        cell["expected"] = "PASS"
        cell["ok"] = row["verdict"] == "PASS"
    report = os.path.join(d, cell["stem"])
    if os.path.exists(report + ".html"):
        cell["report"] = os.path.relpath(report + ".html", night)
    cell["taps"] = tap_ratios(report + ".json")
    finite = [v for v in cell["taps"].values() if v is not None]
    cell["worst_ratio"] = max(finite, key=lambda v: (math.isnan(v), v)) if finite else None
    return cell


def write_summary(args, night, cells, done, version, regressions, wall, previous_path, partial=False):
    """The night's summary.json (summary.partial.json for an interrupted run,
    which the next night does not take for a finished one)."""
    order = {cell_key(c): i for i, c in enumerate(cells)}
    finished = sorted(done, key=lambda c: order.get(cell_key(c), 0))
    previous = None
    if previous_path:
        with open(previous_path) as f:
            previous = json_load_numbers(json.load(f))
    summary = {"date": args.date, "quick": args.quick, "ranks": args.n, "diffcheck_version": version,
               "tolerance": args.tolerance,
               "previous": os.path.relpath(previous_path, night) if previous_path else None,
               "injected_for_testing": ", ".join(f"{k}:{v}" for k, v in regressions.items()) or None,
               "wall_seconds_this_run": round(wall, 1),
               "cell_seconds": round(sum(c["seconds"] for c in finished), 1),
               "cells_total": len(cells), "cells_done": len(finished),
               "cells_ok": sum(c["ok"] for c in finished),
               "cells": finished}
    if partial:
        summary["interrupted"] = True
    summary["drift"] = drift(finished, previous)
    name = "summary.partial.json" if partial else "summary.json"
    write_atomic(os.path.join(night, name), json.dumps(json_safe(summary), indent=1))
    if not partial:
        try:
            os.remove(os.path.join(night, "summary.partial.json"))
        except FileNotFoundError:
            pass
    return finished, summary


def resume_command(args):
    """The command line that goes on with this night: the same arguments, with its --date."""
    argv = sys.argv[1:]
    if not any(a == "--date" or a.startswith("--date=") for a in argv):
        argv += ["--date", args.date]
    script = os.path.join(os.path.dirname(HERE), "nightly.sh")
    return " ".join(["bash", shlex.quote(script), *(shlex.quote(a) for a in argv)])


def signal_of(stop):
    """SIGTERM for the KeyboardInterrupt that stop_on_sigterm_like_ctrl_c raises, else SIGINT."""
    return signal.SIGTERM if str(stop) == f"signal {int(signal.SIGTERM)}" else signal.SIGINT


def interrupted(stop, args, night, cells, done, version, regressions, wall):
    """One line for an interrupted night; exit 128 + the signal, as a shell reports it."""
    sig = signal_of(stop)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the summary short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_summary(args, night, cells, done, version, regressions, wall,
                             find_previous(args.out, args.date, args.previous), partial=True)
        where = os.path.join(night, "summary.partial.json")
    except (OSError, ValueError) as err:
        where = f"not written ({err})"
    print(f"\nnightly {args.date}: interrupted ({signal.Signals(sig).name}): {len(done)} of {len(cells)} cells "
          f"done; partial summary: {where}; resume: {resume_command(args)}", file=sys.stderr, flush=True)
    return 128 + int(sig)


def select_scenarios(exe, args):
    """The scenarios `diffcheck list` gives, or those --scenario names; None
    (after saying why) when diffcheck cannot list them or a name is unknown."""
    try:
        scenarios = run_json([exe, "list", "--json"])
    except (RuntimeError, ValueError) as err:
        print(f"nightly: {err}", file=sys.stderr)
        return None
    if args.scenario:
        known = {s["name"] for s in scenarios}
        for name in args.scenario:
            if name not in known:
                print(f"nightly: unknown scenario '{name}'; known: {', '.join(sorted(known))}", file=sys.stderr)
                return None
        scenarios = [s for s in scenarios if s["name"] in args.scenario]
    return scenarios


def split_done(cells, night, regressions, args):
    """(done, todo): a finished cell keeps its record beside its report, and a
    re-run skips it (unless it was run with another injected regression)."""
    done, todo = [], []
    for c in cells:
        rec = os.path.join(night, c["dir"], c["stem"] + ".cell.json")
        try:
            with open(rec) as f:
                old = json_load_numbers(json.load(f))
            if (old.get("injected_for_testing") == (regressions.get(c["scenario"]) if c["kind"] == "clean" else None)
                    and old.get("tolerance", "derived") == args.tolerance):
                done.append(old)
                continue
        except (OSError, ValueError):
            pass
        todo.append(c)
    return done, todo


def print_outcome(args, night, cells, summary, wall):
    """The night's last lines: counts, flagged drift, cells not as expected.
    Returns those cells."""
    bad = [c for c in cells if not c["ok"]]
    flagged = [r for r in summary["drift"] if r["flagged"]]
    print(f"\nnightly {args.date}: {len(cells) - len(bad)} of {len(cells)} cells as expected; "
          f"{len(flagged)} drift rows flagged; {wall:.0f} s this run, {summary['cell_seconds']:.0f} s of cells")
    for r in flagged[:20]:
        extra = f" ({fmt_num(r['before'])} -> {fmt_num(r['now'])})" if r["kind"] == "err/tol" else ""
        print(f"  drift: {r['kind']}: {r['scenario']} {r['dtype']} {r['what']}{extra}")
    for c in bad:
        print(f"  NOT AS EXPECTED: {outcome(c)}: {cell_id(c)}: expected {c['expected']}, got {c['verdict']}"
              f"{' at ' + repr(c['first_tap']) if c['first_tap'] not in ('-', '') else ''}"
              f"{' -> ' + os.path.join(night, c['report']) if c.get('report') else ''}")
    print(f"report: {os.path.join(night, 'index.html')}")
    return bad


def main():
    stop_on_sigterm_like_ctrl_c()  # a batch time limit ends the night as a Ctrl-C does
    args = parse_args()
    exe = find_diffcheck(args.diffcheck)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    scenarios = select_scenarios(exe, args)
    if scenarios is None:
        return 2
    regressions = injected_regressions()
    night = os.path.join(args.out, args.date)
    os.makedirs(night, exist_ok=True)
    previous_path = find_previous(args.out, args.date, args.previous)
    try:
        cells = plan(exe, scenarios, args, night)
    except RuntimeError as err:
        print(f"nightly: {err}", file=sys.stderr)
        return 2

    done, todo = split_done(cells, night, regressions, args)
    print(f"nightly {args.date}: {len(cells)} cells ({len(scenarios)} scenarios, {args.n} ranks"
          f"{', quick' if args.quick else ''}); {len(done)} already done, {len(todo)} to run -> {night}", flush=True)
    if regressions:
        print(f"nightly: injecting {regressions} into clean cells (DIFFCHECK_NIGHTLY_INJECT)", flush=True)
    t0 = time.monotonic()
    try:
        for i, c in enumerate(todo, 1):
            run_cell(exe, c, night, args, regressions)
            write_atomic(os.path.join(night, c["dir"], c["stem"] + ".cell.json"), json.dumps(json_safe(c), indent=1))
            done.append(c)
            elapsed = time.monotonic() - t0
            eta = elapsed / i * (len(todo) - i)
            print(f"[{i}/{len(todo)}] {c['scenario']} {c['dtype']} {c['variant']} @ {c['mesh']}: "
                  f"{outcome(c).upper() if not c['ok'] else outcome(c)} ({c['verdict']}, {c['seconds']:.1f} s)"
                  f"  ~{eta / 60:.0f} min left", flush=True)
    except KeyboardInterrupt as stop:
        # A Ctrl-C or a batch system's SIGTERM: the running cell was ended
        # gracefully (run_ended_gracefully); what is finished is kept, and one
        # line says where it stands and how to go on, instead of a traceback.
        return interrupted(stop, args, night, cells, done, version, regressions, time.monotonic() - t0)
    wall = time.monotonic() - t0

    cells, summary = write_summary(args, night, cells, done, version, regressions, wall, previous_path)
    write_junit(os.path.join(night, "junit.xml"), cells, args.date)
    write_index(os.path.join(night, "index.html"), summary)

    bad = print_outcome(args, night, cells, summary, wall)
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stop:  # before the first cell: nothing to keep
        print(f"nightly: interrupted ({signal_of(stop).name}) while planning the matrix; no cell ran",
              file=sys.stderr)
        sys.exit(128 + int(signal_of(stop)))
