#!/usr/bin/python3
"""What a night of scripts/nightly.py leaves for people and dashboards: the
JUnit file (one test case per cell), index.html (the matrix as a heatmap,
the drift table, links to each failing cell's run report), and the JSON
helpers its summary is written and read back with."""
import html
import math
import os

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
