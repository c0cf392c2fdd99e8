"""diffcheck's Python side: write activation files (`diffcheck.dump`), capture
a PyTorch model's module outputs into them (`diffcheck.torch`, needs torch),
and run `diffcheck compare` on them (`diffcheck.compare`).

    import diffcheck.torch as dct
    with dct.capture(model, out="dumps/tp", mesh="tp=4", layouts={"*.fc1": "-,-,tp"}):
        model(x)
"""
__version__ = "0.25.0"

from diffcheck.compare import DiffcheckError, Divergence, InputError, compare, verdict  # noqa: E402,F401
from diffcheck.dump import RankDump, ReferenceDump  # noqa: E402,F401
