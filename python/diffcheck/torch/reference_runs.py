"""`dct.references(make, out, ...)`: the two one-process runs a sharded
capture is compared with, in one call. On rank 0 (the others return at
once), the unsharded model is built twice and stepped under a capture each:

- in float64 (`reference=True`): `<out>.h5`, what the run should compute;
- in the run's dtype (`one_device=True`): `<out>.one_device.rank0.h5` beside
  it, the yardstick each tap's error is held to (a measured noise floor).

`make(dtype)` builds what a run needs: `(model, inputs)`, the model whole
and on one device in `dtype` (the same weights each call: build it from
saved weights or a seeded generator), `inputs` a tuple (positional) or a
dict (keywords). `step(model, inputs)` runs it (default: the model called
with them, under `torch.no_grad()` unless backward=True); with
`optimizer=` (a function of the model that makes its optimizer),
`step(model, inputs, optimizer=opt)`. Every other keyword (include=,
exclude=, backward=, sketch=, rename=, ...) goes to both captures as it
goes to the sharded one.

    dct.references(lambda dt: (Block(w).to(dt), (x.to(dt),)), "dumps/ref", dtype=torch.bfloat16)"""
import torch

from diffcheck.torch.session import capture, rank_and_world

_NOT_FOR_REFERENCES = ("mesh", "layouts", "reference", "one_device", "rank", "world_size")


def references(make, out, *, dtype, step=None, optimizer=None, one_device=True, **capture_kwargs):
    """Makes the float64 reference and (one_device=True) the yardstick in
    `dtype` on rank 0; a no-op on the other ranks. Returns the reference
    file's path on rank 0, else None."""
    given = sorted(k for k in capture_kwargs if k in _NOT_FOR_REFERENCES)
    if given:
        raise TypeError(f"references(): {', '.join(given)} {'is' if len(given) == 1 else 'are'} the sharded "
                        "capture's (the references run one whole model on one process)")
    if not callable(make):
        raise TypeError(f"references(): make is a {type(make).__name__}: give a function of the dtype that "
                        "returns (model, inputs)")
    if rank_and_world()[0] != 0:
        return None
    runs = [(torch.float64, {"reference": True})] + ([(dtype, {"one_device": True})] if one_device else [])
    for run_dtype, mode in runs:
        built = make(run_dtype)
        if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[1], (tuple, dict))):
            raise TypeError(f"references(): make({run_dtype}) returned a {type(built).__name__}: return "
                            "(model, inputs), inputs a tuple or a dict")
        model, inputs = built
        opt = optimizer(model) if optimizer is not None else None
        with capture(model, out, optimizer=opt, **mode, **capture_kwargs):
            _step(step, model, inputs, opt, capture_kwargs.get("backward", False))
    return out[:-3] + ".h5" if out.endswith(".h5") else out + ".h5"


def _step(step, model, inputs, opt, backward):
    if step is None:
        with torch.set_grad_enabled(bool(backward)):
            return model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    return step(model, inputs) if opt is None else step(model, inputs, optimizer=opt)
