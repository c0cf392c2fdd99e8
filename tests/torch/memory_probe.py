#!/usr/bin/env python3
"""Peak memory of a forward whose activations total 2 GiB, with and without
`diffcheck.torch.capture` (tests/test_e2e_torch.py compares the two).

    memory_probe.py plain|capture OUT [--taps N] [--tap-mib M] [--backward] [--sketch]

--backward: a training step's worth, forward and backward of the output's
sum (captured with backward=True: every output's gradient and the one
parameter's gradient written too)
--sketch: the activations as [tokens, 1024] and the capture in sketch mode
(no whole tap should be copied: the peak stays near the uninstrumented one)
prints {"peak_mib": ..., "tap_mib": ..., "taps": ...} (peak: ru_maxrss)
"""
import argparse
import json
import resource

import torch
import torch.nn as nn


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.s = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x * 1.0001 * self.s  # a new tensor per module (autograd keeps each input for the gradient of s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["plain", "capture"])
    ap.add_argument("out")
    ap.add_argument("--taps", type=int, default=64)
    ap.add_argument("--tap-mib", type=int, default=32)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--sketch", action="store_true")
    a = ap.parse_args()
    model = nn.Sequential(*[Scale() for _ in range(a.taps - 1)])  # + the root's output: `taps` taps
    x = torch.ones(a.tap_mib * 2 ** 20 // 4)
    if a.sketch:
        x = x.reshape(-1, 1024)
    if a.backward:
        if a.mode == "capture":
            import diffcheck.torch as dct
            with dct.capture(model, out=a.out, backward=True):
                model(x).sum().backward()
                dct.grads()
        else:
            model(x).sum().backward()
    with torch.no_grad():
        if a.backward:
            pass
        elif a.mode == "capture":
            import diffcheck.torch as dct
            with dct.capture(model, out=a.out, sketch=a.sketch):
                model(x)
        else:
            model(x)
    print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "tap_mib": a.tap_mib, "taps": a.taps}))


if __name__ == "__main__":
    main()
