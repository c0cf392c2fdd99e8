#!/usr/bin/env python3
"""MaxText's own decoder (maxtext 0.2.5, a tiny llama2-style config) on its own
mesh and logical-axis rules, checked by diffcheck.jax with no layouts.

    python3.12 examples/jax_maxtext.py [--fsdp 4 --tensor 2] [--dtype bfloat16] [--train] [--bug ...]

MaxText needs Python 3.12 (scripts/maxtext_env.sh makes its environment:
jax 0.12, flax 0.12.12, maxtext). The model is `maxtext.models.Transformer`
(2 decoder layers, embedding 64, 4 heads, MLP 128, vocabulary 256, 32
tokens), built by MaxText on `get_mesh_from_config`'s mesh (fsdp x tensor
CPU devices), each decoder layer under MaxText's jax.checkpoint: every
layer's submodules are tapped. With --train the step is MaxText's loss
(`trainers.pre_train.train.loss_fn`), its gradients (nnx.value_and_grad) and
an SGD update; the parameters' gradients and values are tapped, and
(backward=True) every module output's gradient, those inside the
checkpointed layers included.

The references are MaxText's model again, built by `build(mesh, dtype)` on
their one-device mesh and run on the run's weights. MaxText's config refuses
float64 (its dtype is one of bfloat16, float32, float16, float8), so the
"float64 reference" is float32: the report says so on each tap ("ref
float32") and holds them to the derived rule.

--bug tp_reduction_dropped   layer 0's attention output keeps each tensor
    rank's partial sum: found at decoder.layers_0.self_attention.out.
--bug heads_split_wrong      layer 0's key heads laid over the tensor ranks
    round-robin, the query's contiguous: found at
    decoder.layers_0.self_attention.key.
--bug fsdp_grad_unreduced    (--train) layer 0's MLP output kernel gets each
    fsdp rank's own share of its gradient: found at
    param_grad/decoder.layers_0.mlp.wo.kernel.

The lines diffcheck adds end in `# diffcheck`; exit 1 when it finds a divergence.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _jax_devices import use_cpu_devices  # noqa: E402


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsdp", type=int, default=4, help="MaxText's ici_fsdp_parallelism (default 4)")
    ap.add_argument("--tensor", type=int, default=2, help="MaxText's ici_tensor_parallelism (default 2)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--train", action="store_true", help="MaxText's loss, its gradients and an SGD step")
    ap.add_argument("--bug", choices=("tp_reduction_dropped", "heads_split_wrong", "fsdp_grad_unreduced"))
    ap.add_argument("--out", default="dumps/jax_maxtext", help="directory of the activation files")
    a = ap.parse_args()
    if a.bug == "fsdp_grad_unreduced" and not a.train:
        ap.error("--bug fsdp_grad_unreduced needs --train")
    if a.tensor not in (1, 2, 4) or a.fsdp not in (1, 2, 4, 8) or a.fsdp * a.tensor > 8:
        ap.error("--fsdp x --tensor: at most 8 devices, fsdp dividing the batch of 8, tensor the 4 heads")
    return a


ARGS = parse()
use_cpu_devices(ARGS.fsdp * ARGS.tensor)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from flax.linen import partitioning as nn_partitioning  # noqa: E402

try:
    import maxtext  # noqa: E402
except ImportError:
    print("examples/jax_maxtext.py needs MaxText 0.2.5, which needs Python 3.12: bash scripts/maxtext_env.sh, "
          "then .venv-maxtext/bin/python examples/jax_maxtext.py", file=sys.stderr)
    sys.exit(2)
from maxtext.configs import pyconfig  # noqa: E402
from maxtext.models import models  # noqa: E402
from maxtext.trainers.pre_train.train import loss_fn  # noqa: E402
from maxtext.utils import maxtext_utils  # noqa: E402

import diffcheck.jax as dcj  # noqa: E402  # diffcheck
from _maxtext_faults import inject  # noqa: E402

BATCH, LENGTH, VOCAB, LR = 8, 32, 256, 0.1


def config(dtype):
    base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
    return pyconfig.initialize([
        "jax_maxtext", base, "run_name=diffcheck", "hardware=cpu", "skip_jax_distributed_system=True",
        "decoder_block=llama2", "base_emb_dim=64", "base_num_query_heads=4", "base_num_kv_heads=4",
        "base_mlp_dim=128", "base_num_decoder_layers=2", "head_dim=16", f"vocab_size={VOCAB}",
        f"max_target_length={LENGTH}", "per_device_batch_size=1", "attention=dot_product", "scan_layers=False",
        "enable_checkpointing=False", f"ici_fsdp_parallelism={ARGS.fsdp}", f"ici_tensor_parallelism={ARGS.tensor}",
        f"dtype={dtype}", f"weight_dtype={dtype}"])


def transformer(cfg, mesh):
    with nn_partitioning.axis_rules(cfg.logical_axis_rules):
        return models.Transformer(cfg, mesh, quant=None, rngs=nnx.Rngs(params=0, dropout=1))


def build(mesh, dtype):
    """The references' model: MaxText's, on their mesh (float32 for float64, which MaxText refuses)."""
    return transformer(config("float32" if dtype == jnp.float64 else str(jnp.dtype(dtype))), mesh)


def batch():
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(0, VOCAB, (BATCH, LENGTH)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (BATCH, LENGTH))
    ones = jnp.ones((BATCH, LENGTH), jnp.int32)
    return {"inputs": tokens, "inputs_position": positions, "inputs_segmentation": ones,
            "targets": jnp.roll(tokens, -1, axis=1), "targets_segmentation": ones}


def forward(model, data):
    return model(data["inputs"], data["inputs_position"], enable_dropout=False)


def train_step(cfg):
    def step(model, data):
        def loss(m):
            return loss_fn(m, cfg, data, None, None, is_train=True)[0]
        value, grads = nnx.value_and_grad(loss)(model)
        dcj.tap("param_grad", grads)  # diffcheck
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda p, g: p - LR * g, params, grads))
        dcj.tap("param", nnx.state(model, nnx.Param))  # diffcheck
        return value
    return step


def main():
    cfg = config(ARGS.dtype)
    mesh = maxtext_utils.get_mesh_from_config(cfg)
    with jax.set_mesh(mesh), nn_partitioning.axis_rules(cfg.logical_axis_rules):
        model = transformer(cfg, mesh)
        if ARGS.bug:
            inject(model, ARGS.bug)
        step = train_step(cfg) if ARGS.train else forward
        return dcj.verdict(model, batch(), out=os.path.join(ARGS.out, "maxtext"), mesh=mesh, build=build, step=step, backward=ARGS.train)  # noqa: E501  # diffcheck


if __name__ == "__main__":
    sys.exit(main())
