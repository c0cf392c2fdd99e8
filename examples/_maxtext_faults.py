"""The faults examples/jax_maxtext.py injects into MaxText's own layers (not
diffcheck's business). Each is switched on for one module instance by a
static attribute, which survives nnx.split / nnx.merge, so the references'
model (built clean by the example's `build`) never has it:

- tp_reduction_dropped: layer 0's attention output projection keeps each
  tensor rank's partial sum over its heads (the all-reduce over tensor left
  out), though the value is laid out as replicated over tensor;
- heads_split_wrong: layer 0's key heads are laid over the tensor ranks in
  round-robin order while the query's are contiguous (a head split written
  two ways);
- fsdp_grad_unreduced: layer 0's MLP output kernel gets each fsdp rank's
  own share of its gradient (the reduction over fsdp left out)."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

BUG_ATTRIBUTE = "_example_bug"
BUGS = ("tp_reduction_dropped", "heads_split_wrong", "fsdp_grad_unreduced")
_RUN_MESH = []  # the run's mesh, for a module that keeps none


def inject(model, bug):
    """Marks the module the fault lives in and patches its class to honour the mark."""
    from maxtext.layers import attentions, linears
    layer = model.decoder.layers_0
    where = {"tp_reduction_dropped": layer.self_attention.out, "heads_split_wrong": layer.self_attention,
             "fsdp_grad_unreduced": layer.mlp.wo}[bug]
    object.__setattr__(where, BUG_ATTRIBUTE, bug)
    _RUN_MESH[:] = [model.mesh]
    _patch(attentions.Attention, "kv_projection", _kv_projection)
    _patch(linears.DenseGeneral, "__call__", _dense_call)


def _patch(cls, name, make):
    if not getattr(getattr(cls, name), "_example_patched", False):
        wrapped = make(getattr(cls, name))
        wrapped._example_patched = True
        setattr(cls, name, wrapped)


def _kv_projection(original):
    def kv_projection(self, inputs_kv, proj_name, *args, **kwargs):
        out = original(self, inputs_kv, proj_name, *args, **kwargs)
        if getattr(self, BUG_ATTRIBUTE, None) != "heads_split_wrong" or proj_name != "key":
            return out
        heads = out.shape[2]  # [batch, sequence, heads, head_dim]
        round_robin = [h for start in range(2) for h in range(start, heads, 2)]
        return out[:, :, jnp.array(round_robin), :]
    return kv_projection


def _dense_call(original):
    def __call__(self, inputs, *args, **kwargs):
        bug = getattr(self, BUG_ATTRIBUTE, None)
        if bug is None:
            return original(self, inputs, *args, **kwargs)
        kernel = jnp.asarray(self.kernel[...], self.dtype)
        inputs, mesh = jnp.asarray(inputs, self.dtype), self.mesh or _RUN_MESH[0]
        if bug == "tp_reduction_dropped":  # the attention's output projection: [b, s, heads, d] x [heads, d, embed]
            def partial_sum(x, k):  # this tensor rank's heads only, and no psum over tensor
                return jnp.einsum("bshd,hde->bse", x, k)
            return jax.shard_map(partial_sum, mesh=mesh, in_specs=(P("fsdp", None, "tensor", None),
                                                                   P("tensor", None, None)),
                                 out_specs=P("fsdp", None, None), check_vma=False)(inputs, kernel)
        return _matmul_with_unreduced_grad(mesh, inputs, kernel)  # the MLP's output: [mlp, embed]
    return __call__


def _matmul_with_unreduced_grad(mesh, x, kernel):
    @jax.custom_vjp
    def matmul(x, kernel):
        return jnp.einsum("bsm,me->bse", x, kernel)

    def forward(x, kernel):
        return matmul(x, kernel), (x, kernel)

    def backward(saved, dy):
        x, kernel = saved

        def local(x, dy):  # this fsdp rank's samples' share of the kernel's gradient, not summed over fsdp
            return jnp.einsum("bsm,bse->me", x, dy)
        dk = jax.shard_map(local, mesh=mesh, in_specs=(P("fsdp", None, None), P("fsdp", None, None)),
                           out_specs=P(None, None), check_vma=False)(x, dy)
        return jnp.einsum("bse,me->bsm", dy, kernel), dk
    matmul.defvjp(forward, backward)
    return matmul(x, kernel)
