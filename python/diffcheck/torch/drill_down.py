"""The second pass of a sketch-mode check: `dct.capture(..., only=report)`
writes whole tensors for the taps around the first divergence the report
names, and nothing else, so that `diffcheck compare` gives its element-level
report (worst index, ranks, replica values) for them.

`only` is a report (the dict `dct.compare` returns, or the Divergence it
raises), a tap name, or an iterable of tap names (with their `step<t>/`
prefix). From a report: the first divergent tap and the tap just before it in
order (often the input it went wrong on: both, whole, show where it began).
"""

import re

BEFORE = 1  # taps before the first divergence that a report's drill-down also takes
# A report's name of one stream of a tap (docs/FORMAT.md, `streams`): "x[text]" is written as "x".
_STREAM = re.compile(r"\[[^\[\]/]+\]$")


def drill_down_taps(only):
    """The set of full tap names a capture with `only=` writes."""
    report = getattr(only, "report", only)
    if isinstance(report, dict):
        first = report.get("first_divergence")
        if not first:
            raise ValueError("capture(only=report): the report has no divergence to drill into "
                             "(report['pass'] is True)")
        names = [t["name"] for t in report.get("taps", [])]
        at = first.get("order", names.index(first["tap"]) if first["tap"] in names else 0)
        around = names[max(0, at - BEFORE):at + 1] if names else []
        return {_STREAM.sub("", name) for name in set(around) | {first["tap"]}}
    if isinstance(only, str):
        return {only}
    names = set(only)
    if not all(isinstance(n, str) for n in names):
        raise TypeError("capture(only=...): give a report, a Divergence, a tap name or tap names")
    return names
