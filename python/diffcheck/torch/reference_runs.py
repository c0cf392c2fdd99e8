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

    dct.references(lambda dt: (dct.to_dtype(Block(w), dt), (x.to(dt),)), "dumps/ref", dtype=torch.bfloat16)

`model.to(dtype)` turns a complex buffer real (torchtitan's RoPE `freqs_cis`),
dropping its imaginary part with only a warning, and the reference and the
yardstick break alike: a clean run then fails at the rotary tap.
`to_dtype(model, dtype)` casts floating parameters and buffers to `dtype` and
complex ones to the complex dtype of its width; a `make` whose model loses
imaginary parts is refused by name."""
import warnings

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
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            built = make(run_dtype)
        _refuse_lost_imaginary_parts(said, run_dtype)
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


_COMPLEX_OF = {torch.float64: torch.complex128, torch.float32: torch.complex64, torch.bfloat16: torch.complex64,
               torch.float16: torch.complex64}


def to_dtype(model, dtype):
    """`model` with its floating parameters and buffers in `dtype` and its
    complex ones in the complex dtype of that width (complex64 for the 16-bit
    floats, which have no complex of their own in most ops): what
    `model.to(dtype)` does, less the imaginary parts it drops."""
    complex_dtype = _COMPLEX_OF.get(dtype, torch.complex128)

    def cast(t):
        if t.is_complex():
            return t.to(complex_dtype)
        return t.to(dtype) if t.is_floating_point() else t
    return model._apply(cast)


def _refuse_lost_imaginary_parts(said, dtype):
    """A make() whose model.to(dtype) turned a complex buffer real: refused, never a silently wrong reference."""
    for w in said:
        if "discards the imaginary part" in str(w.message):
            raise ValueError(f"references(): make({dtype}) cast a complex tensor to a real dtype, dropping its "
                             "imaginary part (model.to(dtype) does that to a complex buffer, a RoPE table's "
                             "freqs_cis): the reference and the yardstick would both be wrong. Build the model with "
                             "dct.to_dtype(model, dtype), which keeps complex tensors complex")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
