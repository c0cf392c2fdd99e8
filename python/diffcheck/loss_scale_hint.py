"""A hint in the report when every failing tap is an output gradient off by
one factor: the loss was scaled by another convention than the capture was
told. With data parallelism each rank's output gradients are D times the
global batch's under a per-rank mean loss ("local_mean", which the capture
divides out) and equal to them under a loss divided by the global count
("global"): the wrong word makes every `grad/` tap D or 1/D times its
reference, while the forward taps and the parameters pass. diffusers-style
reports of such a run read as a bug in the model; this says what it is.

Read from the JSON report alone (each failing tap's worst element and its
reference): the factor must be the same on every failing gradient to within
2% and not 1."""
import re

_GRAD = re.compile(r"^(step\d+/)?grad/")


def loss_scale_hint(report):
    """The hint's line, or None."""
    failing = [t for t in report.get("taps", []) if t.get("verdict") == "fail"]
    if not failing or not all(_GRAD.match(t["name"]) for t in failing):
        return None
    ratios = []
    for t in failing:
        ref = t.get("reference", {})
        value, expected = ref.get("worst_value"), ref.get("worst_reference")
        if not isinstance(value, (int, float)) or not isinstance(expected, (int, float)) or expected == 0:
            return None
        ratios.append(value / expected)
    k = sorted(ratios)[len(ratios) // 2]
    if k <= 0 or abs(k - 1) < 0.05 or any(abs(r / k - 1) > 0.02 for r in ratios):
        return None
    said = "its data-parallel degree" if k > 1 else "1 over its data-parallel degree"
    return (f"hint: every failing tap ({len(failing)}) is an output gradient, each {k:.4g}x its reference, and "
            f"every other tap passes: a loss scaled by another convention than the capture was told. If {k:.4g} is "
            f"{said}, capture with loss_scale=\"{'local_mean' if k > 1 else 'global'}\" (each rank's mean "
            "loss over its own samples is \"local_mean\"; a loss divided by the global count is \"global\")")
