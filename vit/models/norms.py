"""The normalisation layers a config's `norm_layer` names: LayerNorm and RMSNorm.

Both run in float32 whatever the compute dtype, and return float32 (the caller casts to the
compute dtype where a matmul follows). Parameters: LayerNorm `{scale, bias}`, RMSNorm `{scale}`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vit.models.config import ViTConfig


class RMSNorm(nnx.Module):
    """timm's `RmsNorm`: `x * rsqrt(mean(x^2) + eps) * scale`, no centring and no bias."""

    def __init__(self, dim: int, epsilon: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.epsilon = epsilon

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(mean_square + self.epsilon) * self.scale[...]


def make_norm(dim: int, cfg: ViTConfig, rngs: nnx.Rngs) -> nnx.Module:
    """The config's `norm_layer` over `dim` features, with `layer_norm_eps`."""
    if cfg.norm_layer == "rmsnorm":
        return RMSNorm(dim, cfg.layer_norm_eps)
    return nnx.LayerNorm(dim, epsilon=cfg.layer_norm_eps, dtype=jnp.float32, rngs=rngs)
