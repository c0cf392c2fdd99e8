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
import html
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from child_process import run_ended_gracefully, stop_on_sigterm_like_ctrl_c  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = ("float32", "bfloat16")
DRIFT_FACTOR = 2.0
# err/tol below this is "bitwise or nearly": its changes are not drift.
DRIFT_FLOOR = 1e-6


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
    return p.parse_args()


def find_diffcheck(given):
    for c in (given, os.environ.get("DIFFCHECK_EXE"), os.path.join(ROOT, "build", "diffcheck"),
              shutil.which("diffcheck")):
        if c and os.access(c, os.X_OK):
            return os.path.abspath(c)
    sys.exit("nightly: no diffcheck executable (build it, or give --diffcheck PATH)")


def run_json(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")
    return json.loads(res.stdout)


def slug(text):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text.replace("=", "")) or "defaults"


def flag_text(flags):
    return " ".join(flags) if flags else "defaults"


# ---------------------------------------------------------------- the matrix

def variants(scenario, quick):
    """(kind, label, flags, fault) of one scenario: clean flag combinations, then faults."""
    specs = scenario["flags"]
    if quick:
        combos = [[], [f"{f['name']}={f['matrix_values'][-1]}" for f in specs
                       if f["matrix_values"][-1] != f["default"]]]
        combos = [c for i, c in enumerate(combos) if c not in combos[:i]]
    else:
        combos = []
        for values in itertools.product(*[f["matrix_values"] for f in specs]):
            combos.append([f"{f['name']}={v}" for f, v in zip(specs, values) if v != f["default"]])
    out = [("clean", flag_text(c), c, "") for c in combos]
    for f in scenario["faults"]:
        out.append(("fault", f"inject {f['name']}" + (f" + {' '.join(f['needs_flags'])}" if f["needs_flags"] else ""),
                    list(f["needs_flags"]), f["name"]))
    return out


def meshes(exe, scenario, n, quick, tmp):
    if quick:
        return [scenario["default_mesh"][str(n)]] if str(n) in scenario["default_mesh"] else []
    path = os.path.join(tmp, f"{scenario['name']}.plan.json")
    size = ["--size", matrix_size(scenario)] if matrix_size(scenario) else []
    res = subprocess.run([exe, "sweep-mesh", "--scenario", scenario["name"], "-n", str(n), "--dry-run",
                          "--json", path, *size], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"sweep-mesh --dry-run of {scenario['name']}: {res.stderr.strip()}")
    with open(path) as f:
        return [r["mesh"] for r in json.load(f)["rows"]]


def matrix_size(scenario):
    """The size preset the matrix runs: a pipeline's "tiny" (the matrix is about
    meshes, flags and faults; its own tests run the default size), else the default."""
    return "tiny" if "tiny" in scenario.get("sizes", []) else None


def plan(exe, scenarios, args, night):
    cells = []
    tmp = os.path.join(night, "plan")
    os.makedirs(tmp, exist_ok=True)
    for s in scenarios:
        ms = meshes(exe, s, args.n, args.quick, tmp)
        for dtype in (DTYPES[:1] if args.quick else DTYPES):
            for kind, label, flags, fault in variants(s, args.quick):
                vdir = os.path.join("cells", s["name"], dtype, slug(label))
                for m in ms:
                    cells.append({"scenario": s["name"], "dtype": dtype, "kind": kind, "variant": label,
                                  "flags": flags, "fault": fault, "mesh": m, "size": matrix_size(s),
                                  "dir": vdir, "stem": slug(m)})
    shutil.rmtree(tmp, ignore_errors=True)
    return cells


def injected_regressions():
    """DIFFCHECK_NIGHTLY_INJECT: scenario -> fault, for testing the nightly."""
    out = {}
    for item in os.environ.get("DIFFCHECK_NIGHTLY_INJECT", "").replace(" ", ",").split(","):
        if item:
            s, _, f = item.partition(":")
            if not f:
                sys.exit(f"nightly: DIFFCHECK_NIGHTLY_INJECT entries are scenario:fault, not '{item}'")
            out[s] = f
    return out


# ---------------------------------------------------------------- one cell

def ratio(v):
    if isinstance(v, str):
        return float(v)  # "nan", "inf"
    return float(v) if v is not None else None


def tap_ratios(report_path):
    """tap -> worst err/tol of one run report (taps with a reference)."""
    try:
        with open(report_path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return {}
    out = {}
    for t in rep.get("taps", []):
        ref = t.get("reference", {})
        if ref.get("present") and "worst_ratio" in ref:
            out[t["name"]] = ratio(ref["worst_ratio"])
    return out


def run_cell(exe, cell, night, args, regressions):
    d = os.path.join(night, cell["dir"])
    os.makedirs(d, exist_ok=True)
    sweep_json = os.path.join(d, cell["stem"] + ".sweep.json")
    cmd = [exe, "sweep-mesh", "--scenario", cell["scenario"], "-n", str(args.n), "--mesh", cell["mesh"],
           "--dtype", cell["dtype"], "--timeout", str(args.timeout), "--reports", d, "--json", sweep_json]
    for f in cell["flags"]:
        cmd += ["--flag", f]
    if cell.get("size"):
        cmd += ["--size", cell["size"]]
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
        # the run's watchdog names; a healthy cell makes progress every few seconds.
        res = run_ended_gracefully(cmd, env=dict(os.environ, DIFFCHECK_TIMEOUT=os.environ.get("DIFFCHECK_TIMEOUT", "60")))
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


def outcome(cell):
    """A short word for what the cell shows."""
    if cell["ok"]:
        return "caught" if cell["verdict"] in ("FAIL", "CRASHED") else "pass"
    if cell["verdict"] in ("CRASHED", "TIMED OUT", "ERROR", "INTERRUPTED"):
        return "broken"
    if cell["expected"] == "PASS":
        return "false positive"
    if cell["verdict"] == "PASS":
        return "missed"
    return "wrong tap"


# ---------------------------------------------------------------- drift

def worst_by_tap(cells):
    """(scenario, tap, dtype) -> largest err/tol over the clean cells."""
    out = {}
    for c in cells:
        if c["kind"] != "clean":  # a fault's cells are meant to be far off
            continue
        for tap, v in c.get("taps", {}).items():
            if v is None:
                continue
            k = (c["scenario"], tap, c["dtype"])
            old = out.get(k)
            out[k] = v if old is None or math.isnan(v) or (not math.isnan(old) and v > old) else old
    return out


def cell_key(c):
    return (c["scenario"], c["dtype"], c["variant"], c["mesh"])


def drift(cells, previous):
    """New failures first, then err/tol changes (flagged above DRIFT_FACTOR)."""
    rows = []
    prev_cells = {cell_key(c): c for c in previous.get("cells", [])} if previous else {}
    for c in cells:
        if not c["ok"]:
            before = prev_cells.get(cell_key(c))
            if before is None or before["ok"]:
                rows.append({"kind": "new failure", "scenario": c["scenario"], "dtype": c["dtype"],
                             "what": f"{c['variant']} @ {c['mesh']}: {outcome(c)} ({c['verdict']}"
                                     f"{' at ' + repr(c['first_tap']) if c['first_tap'] not in ('-', '') else ''})",
                             "before": "ok" if before else "not run", "now": outcome(c), "flagged": True,
                             "report": c.get("report")})
    for c in cells:
        before = prev_cells.get(cell_key(c))
        if c["ok"] and before is not None and not before["ok"]:
            rows.append({"kind": "fixed", "scenario": c["scenario"], "dtype": c["dtype"],
                         "what": f"{c['variant']} @ {c['mesh']}", "before": outcome(before), "now": "ok",
                         "flagged": False})
    if previous:
        now, then = worst_by_tap(cells), worst_by_tap(previous.get("cells", []))
        changes = []
        for k in sorted(now):  # taps not run tonight (another --scenario) are not drift
            a, b = then.get(k), now.get(k)
            if a is None or b is None:
                factor = None
                flagged = False
            elif math.isnan(a) or math.isnan(b):
                factor = float("nan")
                flagged = math.isnan(a) != math.isnan(b)
            else:
                lo, hi = max(min(a, b), DRIFT_FLOOR), max(a, b, DRIFT_FLOOR)
                factor = hi / lo if b >= a else -(hi / lo)
                flagged = hi / lo > DRIFT_FACTOR
            changes.append({"kind": "err/tol", "scenario": k[0], "tap": k[1], "dtype": k[2], "what": k[1],
                            "before": a, "now": b, "factor": factor, "flagged": flagged})
        changes.sort(key=lambda r: (not r["flagged"], -abs(r["factor"]) if r["factor"] and not math.isnan(r["factor"]) else 0))
        rows += changes
    return rows


def find_previous(out_dir, date, given):
    if given:
        path = os.path.join(given, "summary.json") if os.path.isdir(given) else given
        return path if os.path.exists(path) else sys.exit(f"nightly: --previous {given}: no summary.json")
    earlier = sorted(d for d in os.listdir(out_dir) if d < date and
                     os.path.exists(os.path.join(out_dir, d, "summary.json"))) if os.path.isdir(out_dir) else []
    return os.path.join(out_dir, earlier[-1], "summary.json") if earlier else None


# ---------------------------------------------------------------- reports

def write_junit(path, cells, date):
    from xml.sax.saxutils import escape, quoteattr
    by = {}
    for c in cells:
        by.setdefault(c["scenario"], []).append(c)
    out = ['<?xml version="1.0" encoding="UTF-8"?>']
    tot = len(cells)
    fails = sum(1 for c in cells if not c["ok"] and outcome(c) != "broken")
    errs = sum(1 for c in cells if outcome(c) == "broken")
    out.append(f'<testsuites name={quoteattr("diffcheck nightly " + date)} tests="{tot}" failures="{fails}" '
               f'errors="{errs}" time="{sum(c["seconds"] for c in cells):.2f}">')
    for i, (s, cs) in enumerate(sorted(by.items())):
        f = sum(1 for c in cs if not c["ok"] and outcome(c) != "broken")
        e = sum(1 for c in cs if outcome(c) == "broken")
        out.append(f'  <testsuite name={quoteattr("nightly " + s)} id="{i}" package="diffcheck.nightly" '
                   f'hostname="localhost" timestamp="{date}T00:00:00" tests="{len(cs)}" failures="{f}" '
                   f'errors="{e}" skipped="0" time="{sum(c["seconds"] for c in cs):.2f}">')
        out.append("    <properties/>")
        for c in cs:
            name = f"{c['variant']} @ {c['mesh']}"
            out.append(f'    <testcase classname={quoteattr("diffcheck.nightly." + s + "." + c["dtype"])} '
                       f'name={quoteattr(name)} time="{c["seconds"]:.2f}">')
            if not c["ok"]:
                tag = "error" if outcome(c) == "broken" else "failure"
                msg = (f"{outcome(c)}: expected {c['expected']}, got {c['verdict']}"
                       f"{' at ' + repr(c['first_tap']) if c['first_tap'] not in ('-', '') else ''}"
                       f"{': ' + c['detail'] if c.get('detail') else ''}")
                out.append(f'      <{tag} message={quoteattr(msg)} type={quoteattr(outcome(c))}>'
                           f'{escape(msg)}</{tag}>')
            out.append("    </testcase>")
        out.append("    <system-out/>\n    <system-err/>\n  </testsuite>")
    out.append("</testsuites>")
    write_atomic(path, "\n".join(out) + "\n")


COLOURS = {"caught": "#1565c0", "false positive": "#c62828", "missed": "#880e4f", "wrong tap": "#ef6c00",
           "broken": "#757575"}


def pass_colour(r):
    """The run reports' scale for err/tol <= 1: pale (1e-4 and below) to green (1)."""
    if r is None:
        return "#e0e0e0"
    f = min(max((math.log10(max(r, 1e-12)) + 4) / 4, 0.0), 1.0)
    return f"rgb({int(232 - 130 * f)},{int(245 - 70 * f)},{int(233 - 150 * f)})"


def fmt_num(v):
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return f"{v:.3g}"


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:18px 0 6px}
.meta{color:#555;margin-bottom:8px} .badge{padding:2px 8px;border-radius:4px;color:#fff;font-weight:600}
.pass{background:#2e7d32} .fail{background:#c62828}
table{border-collapse:collapse;margin-bottom:8px} td,th{border:1px solid #ddd;padding:2px 6px;font-size:12px}
th{background:#f5f5f5;text-align:left} td.cell{width:22px;height:16px;padding:0}
td.cell a{display:block;width:100%;height:100%} td.bad{outline:3px solid #000;outline-offset:-3px}
.legend span{margin-right:12px;font-size:12px} .legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:middle;border:1px solid #aaa} tr.flagged td{background:#fff3e0}
tr.newfail td{background:#ffebee;font-weight:600} details{margin:6px 0}"""


def write_index(path, summary):
    cells = summary["cells"]
    bad = [c for c in cells if not c["ok"]]
    e = html.escape
    s = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>diffcheck nightly "
         f"{e(summary['date'])}</title><style>{CSS}</style></head><body>"]
    s.append(f"<h1>diffcheck nightly {e(summary['date'])} <span id=\"verdict\" class=\"badge "
             f"{'fail' if bad else 'pass'}\">{'FAIL' if bad else 'PASS'}</span></h1>")
    s.append(f"<div class=\"meta\">{len(cells)} cells ({summary['ranks']} ranks each"
             f"{', quick matrix' if summary['quick'] else ''}): {sum(c['ok'] for c in cells)} as expected, "
             f"{len(bad)} not &middot; cell time {summary['cell_seconds']:.0f} s &middot; "
             f"{e(summary['diffcheck_version'])}"
             f"{' &middot; compared with ' + e(summary['previous']) if summary.get('previous') else ''}"
             f"{' &middot; <b>regression injected for testing: ' + e(summary['injected_for_testing']) + '</b>' if summary.get('injected_for_testing') else ''}</div>")
    if bad:
        s.append("<h2>Not as expected</h2><ul id=\"bad\">")
        for c in bad:
            link = f" &middot; <a href=\"{e(c['report'])}\">report</a>" if c.get("report") else ""
            s.append(f"<li class=\"bad-cell\" data-cell=\"{e(cell_id(c))}\"><b>{e(outcome(c))}</b>: "
                     f"{e(c['scenario'])} {e(c['dtype'])} {e(c['variant'])} @ {e(c['mesh'])} &mdash; expected "
                     f"{e(c['expected'])}, got {e(c['verdict'])}"
                     f"{' at ' + e(repr(c['first_tap'])) if c['first_tap'] not in ('-', '') else ''}{link}</li>")
        s.append("</ul>")
    s.append("<h2>Drift since the previous night</h2>")
    s.append(drift_html(summary))
    s.append("<h2>The matrix</h2><div class=\"legend\">"
             "<span><i style=\"background:rgb(232,245,233)\"></i>pass, err/tol &#8804; 1e-4</span>"
             "<span><i style=\"background:rgb(102,175,83)\"></i>pass, err/tol 1</span>"
             "<span><i style=\"background:#1565c0\"></i>fault caught at its tap</span>"
             "<span><i style=\"background:#c62828\"></i>false positive</span>"
             "<span><i style=\"background:#880e4f\"></i>fault missed</span>"
             "<span><i style=\"background:#ef6c00\"></i>caught at another tap</span>"
             "<span><i style=\"background:#757575\"></i>crash, time-out, error</span>"
             "<span>outlined: not as expected (click for the run report)</span></div>")
    by = {}
    for c in cells:
        by.setdefault(c["scenario"], []).append(c)
    for scen, cs in sorted(by.items()):
        ms = list(dict.fromkeys(c["mesh"] for c in cs))
        rows = list(dict.fromkeys((c["dtype"], c["kind"], c["variant"]) for c in cs))
        at = {(c["dtype"], c["kind"], c["variant"], c["mesh"]): c for c in cs}
        s.append(f"<h2 id=\"{e(scen)}\">{e(scen)}</h2><table class=\"matrix\" data-scenario=\"{e(scen)}\">"
                 "<tr><th>dtype</th><th>variant</th>" + "".join(f"<th>{e(m)}</th>" for m in ms) + "</tr>")
        for r in rows:
            s.append(f"<tr><td>{e(r[0])}</td><td>{e(r[2])}</td>")
            for m in ms:
                c = at.get(r + (m,))
                if c is None:
                    s.append("<td></td>")
                    continue
                o = outcome(c)
                colour = pass_colour(c.get("worst_ratio")) if o == "pass" else COLOURS[o]
                tip = (f"{c['scenario']} {c['dtype']} {c['variant']} @ {c['mesh']}\n{o}: expected {c['expected']}, "
                       f"got {c['verdict']}" + (f" at '{c['first_tap']}'" if c["first_tap"] not in ("-", "") else "")
                       + f"\nworst err/tol {fmt_num(c.get('worst_ratio'))}\n{c['seconds']:.1f} s")
                inner = f"<a href=\"{e(c['report'])}\"></a>" if c.get("report") and (o != "pass") else ""
                s.append(f"<td class=\"cell {o.replace(' ', '-')}{' bad' if not c['ok'] else ''}\" "
                         f"data-cell=\"{e(cell_id(c))}\" style=\"background:{colour}\" title=\"{e(tip)}\">{inner}</td>")
            s.append("</tr>")
        s.append("</table>")
    s.append("</body></html>\n")
    write_atomic(path, "".join(s))


def cell_id(c):
    return f"{c['scenario']}/{c['dtype']}/{c['variant']}/{c['mesh']}"


def drift_html(summary):
    e = html.escape
    rows = summary["drift"]
    if not summary.get("previous"):
        return "<p id=\"drift\">No previous night to compare with.</p>"
    head = ("<table id=\"drift\"><tr><th>change</th><th>scenario</th><th>dtype</th><th>what</th><th>before</th>"
            "<th>now</th><th>factor</th></tr>")
    def row(r):
        cls = "newfail" if r["kind"] == "new failure" else "flagged" if r["flagged"] else ""
        factor = r.get("factor")
        ftxt = "-" if factor is None else fmt_num(factor) + "x" if not math.isnan(factor) else "NaN"
        what = e(r["what"]) + (f" &middot; <a href=\"{e(r['report'])}\">report</a>" if r.get("report") else "")
        return (f"<tr class=\"{cls}\"><td>{e(r['kind'])}</td><td>{e(r['scenario'])}</td><td>{e(r['dtype'])}</td>"
                f"<td>{what}</td><td>{e(fmt_num(r['before']) if not isinstance(r['before'], str) else r['before'])}</td>"
                f"<td>{e(fmt_num(r['now']) if not isinstance(r['now'], str) else r['now'])}</td><td>{ftxt}</td></tr>")
    top = [r for r in rows if r["flagged"] or r["kind"] != "err/tol"]
    rest = [r for r in rows if not (r["flagged"] or r["kind"] != "err/tol")]
    out = head + "".join(row(r) for r in top)
    if not top:
        out += "<tr><td colspan=\"7\">nothing changed by more than 2x, no new failures</td></tr>"
    out += "</table>"
    if rest:
        out += (f"<details><summary>{len(rest)} taps within 2x of the previous night</summary><table>"
                + "".join(row(r) for r in rest) + "</table></details>")
    return out


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def json_safe(v):
    """NaN/Inf as strings, as the run reports write them."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_safe(x) for x in v]
    return v


def json_load_numbers(v):
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    if isinstance(v, dict):
        return {k: json_load_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_load_numbers(x) for x in v]
    return v


# ---------------------------------------------------------------- main

def main():
    stop_on_sigterm_like_ctrl_c()  # a batch time limit ends the night as a Ctrl-C does
    args = parse_args()
    exe = find_diffcheck(args.diffcheck)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        scenarios = run_json([exe, "list", "--json"])
    except (RuntimeError, ValueError) as err:
        print(f"nightly: {err}", file=sys.stderr)
        return 2
    if args.scenario:
        known = {s["name"] for s in scenarios}
        for name in args.scenario:
            if name not in known:
                print(f"nightly: unknown scenario '{name}'; known: {', '.join(sorted(known))}", file=sys.stderr)
                return 2
        scenarios = [s for s in scenarios if s["name"] in args.scenario]
    regressions = injected_regressions()
    night = os.path.join(args.out, args.date)
    os.makedirs(night, exist_ok=True)
    previous_path = find_previous(args.out, args.date, args.previous)
    try:
        cells = plan(exe, scenarios, args, night)
    except RuntimeError as err:
        print(f"nightly: {err}", file=sys.stderr)
        return 2

    # A finished cell keeps its record beside its report: a re-run skips it
    # (unless it was run with another injected regression).
    done, todo = [], []
    for c in cells:
        rec = os.path.join(night, c["dir"], c["stem"] + ".cell.json")
        try:
            with open(rec) as f:
                old = json_load_numbers(json.load(f))
            if old.get("injected_for_testing") == (regressions.get(c["scenario"]) if c["kind"] == "clean" else None):
                done.append(old)
                continue
        except (OSError, ValueError):
            pass
        todo.append(c)
    print(f"nightly {args.date}: {len(cells)} cells ({len(scenarios)} scenarios, {args.n} ranks"
          f"{', quick' if args.quick else ''}); {len(done)} already done, {len(todo)} to run -> {night}", flush=True)
    if regressions:
        print(f"nightly: injecting {regressions} into clean cells (DIFFCHECK_NIGHTLY_INJECT)", flush=True)
    t0 = time.monotonic()
    for i, c in enumerate(todo, 1):
        run_cell(exe, c, night, args, regressions)
        write_atomic(os.path.join(night, c["dir"], c["stem"] + ".cell.json"), json.dumps(json_safe(c), indent=1))
        done.append(c)
        elapsed = time.monotonic() - t0
        eta = elapsed / i * (len(todo) - i)
        print(f"[{i}/{len(todo)}] {c['scenario']} {c['dtype']} {c['variant']} @ {c['mesh']}: "
              f"{outcome(c).upper() if not c['ok'] else outcome(c)} ({c['verdict']}, {c['seconds']:.1f} s)"
              f"  ~{eta / 60:.0f} min left", flush=True)
    wall = time.monotonic() - t0

    order = {cell_key(c): i for i, c in enumerate(cells)}
    cells = sorted(done, key=lambda c: order.get(cell_key(c), 0))
    previous = None
    if previous_path:
        with open(previous_path) as f:
            previous = json_load_numbers(json.load(f))
    summary = {"date": args.date, "quick": args.quick, "ranks": args.n, "diffcheck_version": version,
               "previous": os.path.relpath(previous_path, night) if previous_path else None,
               "injected_for_testing": ", ".join(f"{k}:{v}" for k, v in regressions.items()) or None,
               "wall_seconds_this_run": round(wall, 1),
               "cell_seconds": round(sum(c["seconds"] for c in cells), 1),
               "cells_total": len(cells), "cells_ok": sum(c["ok"] for c in cells),
               "cells": cells}
    summary["drift"] = drift(cells, previous)
    write_atomic(os.path.join(night, "summary.json"), json.dumps(json_safe(summary), indent=1))
    write_junit(os.path.join(night, "junit.xml"), cells, args.date)
    write_index(os.path.join(night, "index.html"), summary)

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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
