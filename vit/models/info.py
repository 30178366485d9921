"""Size and cost of a model: parameters (from abstract shapes) and multiply-adds per image.

MACs are counted as timm and fvcore report them: every matmul's multiply-adds, attention's two
token-by-token products included; norms, softmax, activations and additions are not counted.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx

from vit.models.config import ViTConfig
from vit.models.vit import create_model


def count_params(config: ViTConfig) -> int:
    """Parameter count without allocating any weights."""
    abstract = nnx.eval_shape(lambda: create_model(config))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    return int(sum(np.prod(leaf.shape) for leaf in leaves))


def count_macs(config: ViTConfig) -> int:
    """Multiply-adds for one image at the config's image size."""
    c = config
    patches = c.grid[0] * c.grid[1]
    n, d = c.num_tokens, c.width
    macs = patches * c.patch_size[0] * c.patch_size[1] * c.in_channels * d
    per_block = n * d * 3 * d + 2 * n * n * d + n * d * d + 2 * n * d * c.mlp_dim
    macs += c.depth * per_block
    if c.classifier == "map":
        macs += d * d + n * d * 2 * d + 2 * n * d + d * d + 2 * d * c.mlp_dim
    head_in = d
    if c.representation_size:
        macs += d * c.representation_size
        head_in = c.representation_size
    return macs + head_in * c.num_classes


def model_info(name: str | ViTConfig, **overrides: Any) -> dict[str, Any]:
    """Parameters, GMACs, tokens and a one-line summary for a variant name or config."""
    cfg = name if isinstance(name, ViTConfig) else None
    if cfg is None:
        from vit.models.config import variant_config

        cfg = variant_config(name, **overrides)
    elif overrides:
        cfg = cfg.replace(**overrides)
    params = count_params(cfg)
    gmacs = count_macs(cfg) / 1e9
    summary = (
        f"ViT width {cfg.width}, depth {cfg.depth}, {cfg.num_heads} heads, patch "
        f"{cfg.patch_size[0]}x{cfg.patch_size[1]}, {cfg.image_size[0]}x{cfg.image_size[1]} px, "
        f"{cfg.classifier} classifier, {cfg.num_classes} classes"
    )
    return {
        "name": name if isinstance(name, str) else None,
        "params": params,
        "gmacs": round(gmacs, 3),
        "tokens": cfg.num_tokens,
        "grid": list(cfg.grid),
        "summary": summary,
        "config": cfg.to_dict(),
    }
