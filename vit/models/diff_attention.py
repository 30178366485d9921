"""Differential attention (timm's `DiffAttention`, Differential Transformer): each head's query
and key split in halves give two softmax maps; the second, scaled by a learned lambda, is
taken from the first before the values are mixed:

    out = (softmax(q1 k1^T) - lambda softmax(q2 k2^T)) v,  then  sub_norm(out) (1 - lambda_init)

with `lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init` and
`lambda_init = 0.8 - 0.6 exp(-0.3 depth)` for the block at `depth`. Parameters, on the module
that attends (timm's names): `lambda_q1`, `lambda_k1`, `lambda_q2`, `lambda_k2` (`[head_dim /
2]`) and `sub_norm` (an RMSNorm over head_dim, eps 1e-5). Runs the XLA reference path.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from vit.models.norms import RMSNorm
from vit.ops.attention import reference_attention

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def lambda_init(depth: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def add_parameters(module: nnx.Module, head_dim: int, depth: int, rngs: nnx.Rngs) -> None:
    """Gives `module` the lambdas and the sub-norm of differential attention."""
    init = nnx.initializers.normal(0.1)
    for name in LAMBDAS:
        setattr(module, name, nnx.Param(init(rngs.params(), (head_dim // 2,), jnp.float32)))
    module.sub_norm = RMSNorm(head_dim, 1e-5)
    module.lambda_init = lambda_init(depth)


def attend(module: nnx.Module, q: jax.Array, k: jax.Array, v: jax.Array, layout: str,
           q_norm=None, k_norm=None, rng: jax.Array | None = None,
           rate: float = 0.0) -> jax.Array:
    """Differential attention of full-width `q`, `k`, `v` (`layout` "bshd" or "bhsd") with
    `module`'s parameters (`add_parameters`); the output in v's dtype and layout."""
    q1, q2 = jnp.split(q, 2, axis=-1)
    k1, k2 = jnp.split(k, 2, axis=-1)
    if q_norm is not None:
        q1, q2 = q_norm(q1).astype(v.dtype), q_norm(q2).astype(v.dtype)
        k1, k2 = k_norm(k1).astype(v.dtype), k_norm(k2).astype(v.dtype)
    lq1, lk1, lq2, lk2 = (getattr(module, name)[...] for name in LAMBDAS)
    lam = jnp.exp(jnp.sum(lq1 * lk1)) - jnp.exp(jnp.sum(lq2 * lk2)) + module.lambda_init
    maps = []
    for i, (qi, ki) in enumerate(((q1, k1), (q2, k2))):
        key = jax.random.fold_in(rng, i) if rng is not None else None
        maps.append(reference_attention(qi, ki, v, layout=layout, dropout_rng=key,
                                        dropout_rate=rate if key is not None else 0.0))
    out = maps[0].astype(jnp.float32) - lam * maps[1].astype(jnp.float32)
    return (module.sub_norm(out) * (1 - module.lambda_init)).astype(v.dtype)
