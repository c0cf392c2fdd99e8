"""The nightly's drift: what changed since the previous night (new failures,
fixed cells, and each clean tap's worst err/tol against the last night's,
flagged past DRIFT_FACTOR), and the per-tap margins it is computed from.
Used by scripts/nightly.py; its report is drawn by nightly_report.py."""
import json
import math
import os
import sys

from nightly_report import outcome

DRIFT_FACTOR = 2.0
# err/tol below this is "bitwise or nearly": its changes are not drift.
DRIFT_FLOOR = 1e-6


def ratio(v):
    if isinstance(v, str):
        return float(v)  # "nan", "inf"
    return float(v) if v is not None else None


def tap_ratios(report_path):
    """tap -> worst err/tol of one run report (taps with a reference): its
    margin, the larger of the element-wise and the norm-wise ratio where a
    calibrated tolerance has both."""
    try:
        with open(report_path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return {}
    out = {}
    for t in rep.get("taps", []):
        ref = t.get("reference", {})
        if ref.get("present") and "worst_ratio" in ref:
            out[t["name"]] = ratio(ref.get("margin", ref["worst_ratio"]))
    return out


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
