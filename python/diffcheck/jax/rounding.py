"""Rounding depths read from a JAX program (its jaxpr), for the tolerance
diffcheck derives from the dtype when no one-device run is there
(docs/tolerances.md): per output, `reduction_depth`, the terms summed along
its deepest path (a dot_general's contraction size, a reduction's size, a
psum's group), and `rounding_steps`, the ops that rounded it on the way.

Data movement (reshape, transpose, slices, gathers, collectives that only
move data, sharding changes) neither sums nor rounds. Bodies (jit, shard_map,
checkpoint, custom_jvp/vjp, cond) are walked with their inputs' depths; a
scan's body as many times as it runs (up to 64) and a while loop's once."""
import math

# Primitives that move or relabel values without arithmetic.
_MOVES = {"reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice", "dynamic_slice",
          "dynamic_update_slice", "concatenate", "pad", "gather", "select_n", "rev", "copy", "copy_p",
          "all_to_all", "all_gather", "ppermute", "pbroadcast", "sharding_constraint", "reshard", "device_put",
          "convert_element_type", "stop_gradient", "iota", "squeeze", "split", "mesh_cast", "pvary",
          "optimization_barrier", "reduce_precision", "axis_index", "unreduced_psum", "preduced"}
_COLLECTIVE_SUMS = {"psum", "psum2", "psum_invariant", "reduce_scatter", "psum_scatter", "unreduced_psum_scatter"}
_REDUCTIONS = {"reduce_sum", "cumsum", "reduce_max", "reduce_min", "argmax", "argmin", "cumlogsumexp",
               "reduce_prod", "cumprod", "cummax", "cummin"}
_SUM_REDUCTIONS = {"reduce_sum", "cumsum", "reduce_prod", "cumprod", "cumlogsumexp"}
_SCAN_ITERATIONS_WALKED = 64


def _depth_of(env, v):
    from jax._src import core
    if isinstance(v, core.Literal):
        return (0, 0)
    return env.get(v, (0, 0))


def _axis_group_size(params, axis_sizes):
    axes = params.get("axes", params.get("axis_name", ()))
    axes = axes if isinstance(axes, (tuple, list)) else (axes,)
    return math.prod(axis_sizes.get(a, 1) for a in axes if isinstance(a, str))


def _sub_jaxprs(params):
    from jax._src import core
    for v in params.values():
        for j in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(j, core.Jaxpr):
                yield j
            elif isinstance(getattr(j, "jaxpr", None), core.Jaxpr) and hasattr(j, "consts"):
                yield j.jaxpr  # a ClosedJaxpr (jax 0.12 keeps its class elsewhere than core)


def _walk(jaxpr, in_depths, axis_sizes):
    env = dict(zip(jaxpr.invars, in_depths))
    for v in jaxpr.constvars:
        env[v] = (0, 0)
    for eqn in jaxpr.eqns:
        ins = [_depth_of(env, v) for v in eqn.invars]
        deepest = max(ins, default=(0, 0))
        name = eqn.primitive.name
        subs = list(_sub_jaxprs(eqn.params))
        if name == "scan" and subs:
            outs = _scan(subs[0], ins, eqn.params, axis_sizes)
        elif subs:
            outs = None
            for sub in subs:  # a cond's branches: the deepest of them
                got = _walk(sub, _fit(ins, len(sub.invars)), axis_sizes)
                outs = got if outs is None else [max(a, b) for a, b in zip(outs, got)]
            outs = _fit(outs, len(eqn.outvars))
        elif name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            k = math.prod(eqn.invars[0].aval.shape[d] for d in lc)
            outs = [(deepest[0] + k, deepest[1] + 1)] * len(eqn.outvars)
        elif name in _REDUCTIONS:
            axes = eqn.params.get("axes", (eqn.params.get("axis", 0),))
            k = math.prod(eqn.invars[0].aval.shape[d] for d in axes) if name in _SUM_REDUCTIONS else 0
            outs = [(deepest[0] + k, deepest[1] + (1 if k else 0))] * len(eqn.outvars)
        elif name in _COLLECTIVE_SUMS:
            k = _axis_group_size(eqn.params, axis_sizes)
            outs = [(d[0] + k, d[1] + 1) for d in ins] if len(ins) == len(eqn.outvars) else \
                [(deepest[0] + k, deepest[1] + 1)] * len(eqn.outvars)
        elif name in _MOVES:
            outs = [deepest] * len(eqn.outvars)
        else:  # elementwise arithmetic: one rounding
            outs = [(deepest[0], deepest[1] + 1)] * len(eqn.outvars)
        for v, d in zip(eqn.outvars, outs):
            env[v] = d
    return [_depth_of(env, v) for v in jaxpr.outvars]


def _fit(depths, n):
    depths = list(depths)
    return (depths + [max(depths, default=(0, 0))] * n)[:n]


def _scan(body, ins, params, axis_sizes):
    n_consts, n_carry = params.get("num_consts", 0), params.get("num_carry", 0)
    consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
    ys = None
    for _ in range(min(int(params.get("length", 1)), _SCAN_ITERATIONS_WALKED)):
        outs = _walk(body, consts + carry + xs, axis_sizes)
        carry, step_ys = outs[:n_carry], outs[n_carry:]
        ys = step_ys if ys is None else [max(a, b) for a, b in zip(ys, step_ys)]
    return carry + (ys or [])


def output_depths(closed_jaxpr, axis_sizes):
    """[(reduction_depth, rounding_steps)] of each output of a traced program;
    `axis_sizes`: {mesh axis: size} for its collectives' groups."""
    jaxpr = closed_jaxpr.jaxpr
    return _walk(jaxpr, [(0, 0)] * len(jaxpr.invars), dict(axis_sizes))
