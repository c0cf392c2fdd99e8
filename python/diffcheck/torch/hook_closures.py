"""What a hook closes over: how the plan readers (dtensor_plan.py,
transformers_plan.py) find the parallel style behind a module's hook."""


def closure_values(fn):
    """The values `fn`'s closure cells hold, then the object it is bound to (if any)."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            pass
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        yield owner
